/*
 * Several limits on one key ("bands"): the three ways to state a limit and
 * their errors, all or nothing in memory and in Redis (the same figures from
 * both), the key's format, one script call a decision, the deny cache and
 * the failure policies per band, bands changed on keys that already exist,
 * and 100 threads on one key. The shared vectors (test_vectors) hold the
 * arithmetic's cases; this program holds the API's.
 *
 * The limits are "3/second; 5/minute" unless a test says otherwise: band 0
 * is 3 tokens at 3 a second, band 1 is 5 tokens at 5 a minute.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "hirate.h"
#include "hirate_io.h"
#include "memory.h"
#include "redis_harness.h"

#define LIMITS "3/second; 5/minute"
#define T0 1000000000000LL   /* an injected time, µs */

static rh_server S;

static hirate_limiter *make_with(const char *url, const char *limits, int on_error,
                                 int instances)
{
    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.limits = limits;
    o.prefix = "bands:";
    o.on_error = on_error;
    o.instances = instances;
    o.connect_timeout_ms = 1000;
    o.timeout_ms = 1000;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE];
    int rc = hirate_limiter_new(&lim, &o, why, sizeof why);
    if (rc != 0)
        fprintf(stderr, "  hirate_limiter_new: %s\n", why);
    CHECK_EQ_I64(rc, 0);
    return lim;
}

static hirate_limiter *make(const char *url)
{
    return make_with(url, LIMITS, HIRATE_ON_ERROR_LOCAL, 1);
}

/* hirate_limiter_new's code and message for o. */
static int new_error(const hirate_options *o, char *why, size_t len)
{
    hirate_limiter *lim = NULL;
    int rc = hirate_limiter_new(&lim, o, why, len);
    hirate_limiter_free(lim);
    return rc;
}

typedef struct fig {
    int allowed;
    int64_t limit, remaining, retry, reset;
} fig;

static void check_fig(const hirate_decision *d, fig f)
{
    CHECK_EQ_I64(d->allowed, f.allowed);
    CHECK_EQ_I64(d->limit, f.limit);
    CHECK_EQ_I64(d->remaining, f.remaining);
    CHECK_EQ_I64(d->retry_after_us, f.retry);
    CHECK_EQ_I64(d->reset_after_us, f.reset);
}

static long long cmdstat_calls(const char *cmd)
{
    redisReply *r = rh_command(&S, "INFO commandstats");
    long long v = 0;
    char head[64];
    snprintf(head, sizeof head, "cmdstat_%s:calls=", cmd);
    const char *p = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, head) : NULL;
    if (p)
        v = strtoll(p + strlen(head), NULL, 10);
    freeReplyObject(r);
    return v;
}

static void get_key(const char *key, char *out, size_t len)
{
    redisReply *r = rh_command(&S, "GET bands:%s", key);
    snprintf(out, len, "%s", r && r->type == REDIS_REPLY_STRING ? r->str : "(nil)");
    freeReplyObject(r);
}

/* ---- the limit, stated three ways ------------------------------------------- */

static void test_each_way_of_stating_the_limit_names_its_bands(void)
{
    hirate_options o;
    hirate_band band;
    hirate_limiter *lim;
    char why[HIRATE_ERRMSG_SIZE];

    hirate_options_init(&o);
    o.capacity = 10;
    o.rate = 1;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, why, sizeof why), 0);
    CHECK_EQ_I64(hirate_limiter_nbands(lim), 1);
    CHECK_EQ_I64(hirate_limiter_band(lim, 0, &band), 0);
    CHECK_EQ_I64(band.capacity, 10);
    CHECK(band.rate == 1.0);
    CHECK_EQ_STR(band.name, "10-per-10s");
    CHECK_EQ_I64(hirate_limiter_band(lim, 1, &band), HIRATE_EINVAL);
    hirate_limiter_free(lim);

    hirate_options_init(&o);
    o.limits = "10/second; 1000/day burst 50";
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, why, sizeof why), 0);
    CHECK_EQ_I64(hirate_limiter_nbands(lim), 2);
    hirate_limiter_band(lim, 0, &band);
    CHECK_EQ_I64(band.capacity, 10);
    CHECK(band.rate == 10.0);
    CHECK_EQ_STR(band.name, "10-per-1s");
    hirate_limiter_band(lim, 1, &band);
    CHECK_EQ_I64(band.capacity, 50);
    CHECK(band.rate == 1000.0 / 86400.0);
    CHECK_EQ_STR(band.name, "50-per-4320s");
    hirate_limiter_free(lim);

    /* The bands are copied, names too: the caller's memory may go. */
    char name[16];
    strcpy(name, "burst");
    hirate_band bands[2] = {{5, 5.0, name}, {100, 100.0 / 3600, NULL}};
    hirate_options_init(&o);
    o.bands = bands;
    o.nbands = 2;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, why, sizeof why), 0);
    strcpy(name, "changed");
    bands[0].capacity = 7;
    hirate_limiter_band(lim, 0, &band);
    CHECK_EQ_STR(band.name, "burst");
    CHECK_EQ_I64(band.capacity, 5);
    hirate_limiter_band(lim, 1, &band);
    CHECK_EQ_STR(band.name, "100-per-3600s");
    hirate_limiter_free(lim);
    CHECK_EQ_I64(hirate_limiter_nbands(NULL), 0);
}

static void test_refill_seconds_is_the_window_rounded_up(void)
{
    CHECK_EQ_I64(hirate_refill_seconds(10, 1.0), 10);
    CHECK_EQ_I64(hirate_refill_seconds(3, 3.0), 1);
    CHECK_EQ_I64(hirate_refill_seconds(5, 5.0 / 60), 60);
    CHECK_EQ_I64(hirate_refill_seconds(1, 3.0), 1);        /* 333,334 µs */
    CHECK_EQ_I64(hirate_refill_seconds(7, 2.0), 4);        /* 3.5 s */
    CHECK_EQ_I64(hirate_refill_seconds(0, 1.0), 0);        /* no limiter takes it */
    CHECK_EQ_I64(hirate_refill_seconds(1, 0.0), 0);
}

static void test_a_bad_limit_names_what_is_wrong(void)
{
    hirate_options o;
    char why[HIRATE_ERRMSG_SIZE];
    hirate_band good = {10, 1.0, NULL};

    hirate_options_init(&o);
    o.capacity = 10;
    o.rate = 1;
    o.limits = "10/second";
    CHECK_EQ_I64(new_error(&o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "set the limit once: capacity and rate, bands, or limits");
    o.limits = NULL;
    o.bands = &good;
    o.nbands = 1;
    CHECK_EQ_I64(new_error(&o, why, sizeof why), HIRATE_EOPTION);

    hirate_options_init(&o);
    CHECK_EQ_I64(new_error(&o, why, sizeof why), HIRATE_ECAPACITY);   /* no limit at all */

    hirate_band bad_capacity[2] = {{10, 1.0, NULL}, {0, 1.0, NULL}};
    o.bands = bad_capacity;
    o.nbands = 2;
    CHECK_EQ_I64(new_error(&o, why, sizeof why), HIRATE_ECAPACITY);
    CHECK_EQ_STR(why, "bands[1]: capacity must be a whole number from 1 to 2^53-1, got 0");

    hirate_band bad_rate[1] = {{10, -1.0, NULL}};
    o.bands = bad_rate;
    o.nbands = 1;
    CHECK_EQ_I64(new_error(&o, why, sizeof why), HIRATE_ERATE);
    CHECK_EQ_STR(why, "bands[0]: rate must be a finite number of tokens per second above 0, "
                      "got -1");

    hirate_band same[2] = {{10, 1.0, "api"}, {100, 0.1, "api"}};
    o.bands = same;
    o.nbands = 2;
    CHECK_EQ_I64(new_error(&o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "bands[1]: bands[0] has the same name, 'api'");

    hirate_band unnamed_same[2] = {{10, 1.0, NULL}, {10, 1.0, NULL}};
    o.bands = unnamed_same;
    CHECK_EQ_I64(new_error(&o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "bands[1]: bands[0] has the same name, '10-per-10s'");

    hirate_band empty_name[1] = {{10, 1.0, ""}};
    o.bands = empty_name;
    o.nbands = 1;
    CHECK_EQ_I64(new_error(&o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "bands[0]: a band's name must be 1 to 64 bytes, got 0");

    hirate_band control[1] = {{10, 1.0, "a\nb"}};
    o.bands = control;
    CHECK_EQ_I64(new_error(&o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "bands[0]: a band's name must be printable ASCII (it is sent in headers)");

    hirate_band many[HIRATE_BANDS_MAX + 1];
    for (int i = 0; i <= HIRATE_BANDS_MAX; i++)
        many[i] = (hirate_band){i + 1, 1.0, NULL};
    o.bands = many;
    o.nbands = HIRATE_BANDS_MAX + 1;
    CHECK_EQ_I64(new_error(&o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "bands must be 1 to 16 bands, got 17");
    o.nbands = HIRATE_BANDS_MAX;
    CHECK_EQ_I64(new_error(&o, why, sizeof why), 0);
    o.nbands = 0;
    CHECK_EQ_I64(new_error(&o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "bands must be 1 to 16 bands, got 0");
    o.bands = NULL;
    o.nbands = 2;
    CHECK_EQ_I64(new_error(&o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "bands must be 1 to 16 bands, got 2 and no array");

    hirate_options_init(&o);
    o.limits = "10/fortnight";
    CHECK_EQ_I64(new_error(&o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "limit '10/fortnight': unknown unit 'fortnight' (second, minute, hour or day)");
    o.limits = "10/second; 10/second";
    CHECK_EQ_I64(new_error(&o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "limits: two limits are the same (10-per-1s)");

    /* LOCAL shares each band over the instances: a share that cannot
     * refill in range is named. */
    hirate_options_init(&o);
    o.url = "redis://127.0.0.1:1";
    o.limits = "10/second; 1/7days";
    o.instances = 100000;
    CHECK_EQ_I64(new_error(&o, why, sizeof why), HIRATE_ERANGE);
    CHECK_EQ_STR(why, "the local share of the limit (capacity 1, rate 1.65344e-11 over 100000 "
                      "instances) takes over 2^53 us to refill");
}

/* ---- all or nothing ------------------------------------------------------------ */

/* One step of the sequence both backends run, and what it must give. */
typedef struct step {
    int64_t dt_us;          /* after T0 */
    int64_t cost;
    int spend;
    fig whole;
    int band;
    fig b0, b1;
} step;

static const step SEQUENCE[] = {
    /* three pass: band 0 drains, band 1 keeps 2 */
    {0, 1, 1, {1, 3, 2, 0, 12000000}, 0, {1, 3, 2, 0, 333334}, {1, 5, 4, 0, 12000000}},
    {0, 1, 1, {1, 3, 1, 0, 24000000}, 0, {1, 3, 1, 0, 666667}, {1, 5, 3, 0, 24000000}},
    {0, 1, 1, {1, 3, 0, 0, 36000000}, 0, {1, 3, 0, 0, 1000000}, {1, 5, 2, 0, 36000000}},
    /* band 0 refuses; band 1 held the cost and keeps it */
    {0, 1, 1, {0, 3, 0, 333334, 36000000}, 0, {0, 3, 0, 333334, 1000000},
     {1, 5, 2, 0, 36000000}},
    /* a second later band 0 is full again; band 1 now runs out */
    {1000000, 1, 1, {1, 5, 1, 0, 47000000}, 1, {1, 3, 2, 0, 333334}, {1, 5, 1, 0, 47000000}},
    {1000000, 1, 1, {1, 5, 0, 0, 59000000}, 1, {1, 3, 1, 0, 666667}, {1, 5, 0, 0, 59000000}},
    {1000000, 1, 1, {0, 5, 0, 11000000, 59000000}, 1, {1, 3, 1, 0, 666667},
     {0, 5, 0, 11000000, 59000000}},
    /* a cost above band 0's capacity never passes, whatever band 1 says */
    {1000000, 4, 0, {0, 3, 0, HIRATE_NEVER, 59000000}, 0, {0, 3, 1, HIRATE_NEVER, 666667},
     {0, 5, 0, 47000000, 59000000}},
    /* a peek of what passes spends nothing */
    {1000000, 0, 0, {1, 5, 0, 0, 59000000}, 1, {1, 3, 1, 0, 666667}, {1, 5, 0, 0, 59000000}},
};

static void run_sequence(hirate_limiter *lim, const char *key, int redis)
{
    for (size_t i = 0; i < sizeof SEQUENCE / sizeof *SEQUENCE; i++) {
        const step *s = &SEQUENCE[i];
        hirate_decision whole, per[2];
        int rc = hirate_decide_at_bands(lim, key, strlen(key), s->cost, s->spend, T0 + s->dt_us,
                                        &whole, per, 2);
        CHECK_EQ_I64(rc, 0);
        check_fig(&whole, s->whole);
        CHECK_EQ_I64(whole.band, s->band);
        check_fig(&per[0], s->b0);
        check_fig(&per[1], s->b1);
        CHECK_EQ_I64(per[0].band, 0);
        CHECK_EQ_I64(per[1].band, 1);
        CHECK_EQ_I64(whole.time_us, T0 + s->dt_us);
        CHECK_EQ_I64(per[1].time_us, T0 + s->dt_us);
        if (redis)
            CHECK(whole.source == HIRATE_SOURCE_REDIS || whole.source == HIRATE_SOURCE_CACHE);
        else
            CHECK_EQ_I64(whole.source, HIRATE_SOURCE_LOCAL);
        CHECK_EQ_I64(per[0].source, whole.source);
    }
}

static void test_memory_spends_in_every_band_or_in_none(void)
{
    hirate_limiter *lim = make(NULL);
    if (!lim) return;
    run_sequence(lim, "seq", 0);

    /* A buffer for fewer bands gets the first; NULL gets none. */
    hirate_decision whole, one;
    CHECK_EQ_I64(hirate_decide_at_bands(lim, "seq", 3, 0, 0, T0 + 1000000, &whole, &one, 1), 0);
    check_fig(&one, (fig){1, 3, 1, 0, 666667});
    CHECK_EQ_I64(hirate_decide_at_bands(lim, "seq", 3, 0, 0, T0 + 1000000, &whole, NULL, 2), 0);
    check_fig(&whole, (fig){1, 5, 0, 0, 59000000});
    /* hirate_allow gives the whole's figures alone. */
    CHECK_EQ_I64(hirate_reset(lim, "seq", 3), 0);
    CHECK_EQ_I64(hirate_allow(lim, "seq", 3, 1, &whole), 0);
    check_fig(&whole, (fig){1, 3, 2, 0, 12000000});
    hirate_limiter_free(lim);
}

static void test_redis_gives_the_memory_backends_figures(void)
{
    hirate_limiter *lim = make(S.url);
    if (!lim) return;
    long long calls0 = cmdstat_calls("fcall");
    run_sequence(lim, "seq", 1);
    long long calls = cmdstat_calls("fcall") - calls0;
    /* One script call a decision (the first FCALL found no library and went
     * again), minus those the deny cache answered. */
    CHECK(calls >= 7 && calls <= 10);

    char state[128];
    get_key("seq", state, sizeof state);
    /* Both bands as their last spend at T0+1s left them: band 0 at 1, band
     * 1 at 2 + 5/60 - 2 (the refill of that second, less two spends). */
    CHECK_EQ_STR(state, "1 1000001000000 0.083333333333333481 1000001000000");
    redisReply *r = rh_command(&S, "PTTL bands:seq");
    /* the longest refill (band 1, 59 s) and a minute for the injected clock */
    CHECK(r && r->integer > 118000 && r->integer <= 119000);
    freeReplyObject(r);
    hirate_limiter_free(lim);
}

static void test_one_band_stores_a_single_buckets_format(void)
{
    hirate_options o;
    hirate_options_init(&o);
    o.url = S.url;
    o.prefix = "bands:";
    o.capacity = 3;
    o.rate = 3;
    hirate_limiter *lim;
    char why[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, why, sizeof why), 0);
    hirate_decision d, per[4];
    CHECK_EQ_I64(hirate_decide_at_bands(lim, "one", 3, 1, 1, T0, &d, per, 4), 0);
    check_fig(&d, (fig){1, 3, 2, 0, 333334});
    check_fig(&per[0], (fig){1, 3, 2, 0, 333334});
    char state[128];
    get_key("one", state, sizeof state);
    CHECK_EQ_STR(state, "2 1000000000000");
    hirate_limiter_free(lim);
}

/* A batch gives each item's bands, in memory and in Redis alike; a bad item
 * gets its code and leaves the others theirs. */
static void batch(const char *url)
{
    hirate_limiter *lim = make(url);
    if (!lim) return;
    hirate_item items[3] = {{"b1", 2, 1, 0, {0}}, {"", 0, 1, 0, {0}}, {"b1", 2, 3, 0, {0}}};
    hirate_decision bands[3 * 2];
    CHECK_EQ_I64(hirate_allow_many_bands(lim, items, 3, bands), 0);
    CHECK_EQ_I64(items[0].rc, 0);
    CHECK_EQ_I64(items[1].rc, HIRATE_EKEY);
    CHECK_EQ_I64(items[2].rc, 0);
    check_fig(&bands[0], (fig){1, 3, 2, 0, 333334});
    check_fig(&bands[1], (fig){1, 5, 4, 0, 12000000});
    /* 3 more: band 0 holds 2, band 1 holds 4 */
    CHECK_EQ_I64(items[2].decision.allowed, 0);
    CHECK_EQ_I64(items[2].decision.band, 0);
    CHECK_EQ_I64(bands[4].allowed, 0);
    CHECK_EQ_I64(bands[4].remaining, 2);
    CHECK_EQ_I64(bands[5].allowed, 1);
    CHECK_EQ_I64(bands[5].remaining, 4);
    CHECK_EQ_I64(hirate_allow_many_bands(lim, items, 3, NULL), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_allow_many_bands(lim, NULL, 0, NULL), 0);
    hirate_limiter_free(lim);
}

static void test_a_batch_gives_every_items_bands(void)
{
    batch(NULL);
    batch(S.url);
}

/* ---- bands that change on keys that exist ------------------------------------- */

static void test_changed_bands_read_the_stored_bands_by_position(void)
{
    char state[128];
    hirate_decision d, per[3];

    /* A one-band key: "3/second" spent 2. */
    hirate_limiter *one = make_with(S.url, "3/second", HIRATE_ON_ERROR_LOCAL, 1);
    if (!one) return;
    CHECK_EQ_I64(hirate_decide_at(one, "moved", 5, 2, 1, T0, &d), 0);
    get_key("moved", state, sizeof state);
    CHECK_EQ_STR(state, "1 1000000000000");

    /* Two bands read it as band 0 (1 left) and a full band 1. */
    hirate_limiter *two = make(S.url);
    if (!two) return;
    CHECK_EQ_I64(hirate_decide_at_bands(two, "moved", 5, 1, 1, T0, &d, per, 2), 0);
    check_fig(&per[0], (fig){1, 3, 0, 0, 1000000});
    check_fig(&per[1], (fig){1, 5, 4, 0, 12000000});
    get_key("moved", state, sizeof state);
    CHECK_EQ_STR(state, "0 1000000000000 4 1000000000000");

    /* A raised band 0 (6/second) keeps its level and refills at its new rate. */
    hirate_limiter *raised = make_with(S.url, "6/second; 5/minute", HIRATE_ON_ERROR_LOCAL, 1);
    CHECK_EQ_I64(hirate_decide_at_bands(raised, "moved", 5, 0, 0, T0 + 500000, &d, per, 2), 0);
    check_fig(&per[0], (fig){1, 6, 3, 0, 500000});
    check_fig(&per[1], (fig){1, 5, 4, 0, 11500000});

    /* A lowered band 1 (2/minute) is capped at once. */
    hirate_limiter *lowered = make_with(S.url, "3/second; 2/minute", HIRATE_ON_ERROR_LOCAL, 1);
    CHECK_EQ_I64(hirate_decide_at_bands(lowered, "moved", 5, 0, 0, T0, &d, per, 2), 0);
    check_fig(&per[1], (fig){1, 2, 2, 0, 0});

    /* A third band at the end starts full; back to one band, the others
     * are dropped at its first write. */
    hirate_limiter *three = make_with(S.url, "3/second; 5/minute; 7/hour",
                                      HIRATE_ON_ERROR_LOCAL, 1);
    CHECK_EQ_I64(hirate_decide_at_bands(three, "moved", 5, 0, 0, T0, &d, per, 3), 0);
    check_fig(&per[2], (fig){1, 7, 7, 0, 0});
    CHECK_EQ_I64(hirate_decide_at(one, "moved", 5, 0, 0, T0 + 1000000, &d), 0);
    check_fig(&d, (fig){1, 3, 3, 0, 0});
    get_key("moved", state, sizeof state);
    CHECK_EQ_STR(state, "0 1000000000000 4 1000000000000");   /* a peek writes nothing */
    CHECK_EQ_I64(hirate_decide_at(one, "moved", 5, 1, 1, T0 + 1000000, &d), 0);
    get_key("moved", state, sizeof state);
    CHECK_EQ_STR(state, "2 1000001000000");

    /* A state no hirate wrote is an error, never read as a bucket. */
    redisReply *r = rh_command(&S, "SET bands:bad %s", "1 1000000000000 x");
    freeReplyObject(r);
    int rc = hirate_decide_at_bands(two, "bad", 3, 1, 1, T0, &d, per, 2);
    CHECK_EQ_I64(rc, HIRATE_EREPLY);
    char msg[HIRATE_ERRMSG_SIZE];
    CHECK(strstr(hirate_limiter_errmsg(two, msg, sizeof msg), "bucket state is corrupt") != NULL);

    hirate_limiter_free(one);
    hirate_limiter_free(two);
    hirate_limiter_free(raised);
    hirate_limiter_free(lowered);
    hirate_limiter_free(three);
}

/* ---- the deny cache and the policies ------------------------------------------- */

static void test_the_deny_cache_remembers_every_band(void)
{
    hirate_limiter *lim = make(S.url);
    if (!lim) return;
    hirate_decision d, per[2];
    /* The third call leaves band 0 without the cost: from then on the
     * refusal is foretold, with every band's figures. */
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_I64(hirate_allow_bands(lim, "cached", 6, 1, &d, per, 2), 0);
        CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    }
    long long calls0 = cmdstat_calls("fcall");
    CHECK_EQ_I64(hirate_allow_bands(lim, "cached", 6, 1, &d, per, 2), 0);
    CHECK_EQ_I64(cmdstat_calls("fcall"), calls0);   /* no round trip */
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_CACHE);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK_EQ_I64(d.band, 0);
    CHECK_EQ_I64(per[0].source, HIRATE_SOURCE_CACHE);
    CHECK_EQ_I64(per[0].allowed, 0);
    CHECK_EQ_I64(per[1].allowed, 1);
    CHECK_EQ_I64(per[1].limit, 5);
    CHECK_EQ_I64(per[1].remaining, 2);
    CHECK(per[0].retry_after_us > 0 && per[0].retry_after_us <= 333334);

    /* The io layer: an item the cache decides has its bands at once. */
    hirate_item it = {"cached", 6, 1, 0, {0}};
    hirate_decision bands[2];
    memset(bands, 0, sizeof bands);
    hirate_op *op;
    CHECK_EQ_I64(hirate_op_start_bands(lim, &it, 1, 1, -1, bands, &op), 0);
    CHECK(op == NULL);
    CHECK_EQ_I64(it.decision.source, HIRATE_SOURCE_CACHE);
    CHECK_EQ_I64(bands[1].remaining, 2);
    CHECK_EQ_I64(bands[1].limit, 5);
    hirate_limiter_free(lim);
}

/* A URL on a port nobody listens on. */
static void dead_url(char *buf, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    int port = 1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &alen) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    snprintf(buf, len, "redis://127.0.0.1:%d", port);
}

static void test_the_policies_answer_for_every_band(void)
{
    char url[64];
    dead_url(url, sizeof url);
    hirate_decision d, per[2];

    hirate_limiter *open = make_with(url, LIMITS, HIRATE_ON_ERROR_OPEN, 1);
    if (!open) return;
    CHECK_EQ_I64(hirate_allow_bands(open, "p", 1, 1, &d, per, 2), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_FAIL_OPEN);
    CHECK(d.error != 0);
    check_fig(&d, (fig){1, 3, 2, 0, 0});
    CHECK_EQ_I64(d.band, 0);
    check_fig(&per[0], (fig){1, 3, 2, 0, 0});
    check_fig(&per[1], (fig){1, 5, 4, 0, 0});
    CHECK_EQ_I64(per[1].error, d.error);
    /* Above band 0's capacity: never, and band 1 spends nothing. */
    CHECK_EQ_I64(hirate_allow_bands(open, "p", 1, 4, &d, per, 2), 0);
    check_fig(&d, (fig){0, 3, 0, HIRATE_NEVER, 0});
    check_fig(&per[0], (fig){0, 3, 0, HIRATE_NEVER, 0});
    check_fig(&per[1], (fig){1, 5, 5, 0, 0});
    hirate_limiter_free(open);

    hirate_limiter *closed = make_with(url, LIMITS, HIRATE_ON_ERROR_CLOSED, 1);
    CHECK_EQ_I64(hirate_allow_bands(closed, "p", 1, 1, &d, per, 2), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_FAIL_CLOSED);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK_EQ_I64(d.band, 0);
    CHECK_EQ_I64(d.limit, 3);
    CHECK(d.retry_after_us > 0 && d.retry_after_us == d.reset_after_us);
    CHECK_EQ_I64(per[1].allowed, 0);
    CHECK_EQ_I64(per[1].retry_after_us, d.retry_after_us);
    hirate_limiter_free(closed);

    /* LOCAL, 2 instances: each band's share, 1 token at 1.5/s and 2 at 1/24 a second. */
    hirate_limiter *local = make_with(url, LIMITS, HIRATE_ON_ERROR_LOCAL, 2);
    CHECK_EQ_I64(hirate_allow_bands(local, "p", 1, 1, &d, per, 2), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_LOCAL);
    check_fig(&per[0], (fig){1, 1, 0, 0, 666667});
    check_fig(&per[1], (fig){1, 2, 1, 0, 24000000});
    CHECK_EQ_I64(d.band, 0);
    CHECK_EQ_I64(d.remaining, 0);
    CHECK_EQ_I64(per[0].error, d.error);
    hirate_limiter_free(local);
}

/* ---- 100 threads ----------------------------------------------------------------- */

typedef struct shared {
    hirate_limiter *lim;
    int allowed, refused, errors;
    pthread_mutex_t lock;
} shared;

static void *one_call(void *arg)
{
    shared *s = arg;
    hirate_decision d;
    int rc = hirate_allow(s->lim, "crowd", 5, 1, &d);
    pthread_mutex_lock(&s->lock);
    if (rc != 0)
        s->errors++;
    else if (d.allowed)
        s->allowed++;
    else
        s->refused++;
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* 20 an hour and 7 a day (refills too slow to show in a run): 7 pass, and
 * no refused call spends from the hourly band (read back from the key). */
static void crowd(const char *url)
{
    shared s = {make_with(url, "20/hour; 7/day", HIRATE_ON_ERROR_CLOSED, 1), 0, 0, 0,
                PTHREAD_MUTEX_INITIALIZER};
    if (!s.lim) return;
    pthread_t t[100];
    for (int i = 0; i < 100; i++)
        pthread_create(&t[i], NULL, one_call, &s);
    for (int i = 0; i < 100; i++)
        pthread_join(t[i], NULL);
    CHECK_EQ_I64(s.allowed, 7);
    CHECK_EQ_I64(s.refused, 93);
    CHECK_EQ_I64(s.errors, 0);
    hirate_decision d, per[2];
    CHECK_EQ_I64(hirate_peek_bands(s.lim, "crowd", 5, 1, &d, per, 2), 0);
    CHECK_EQ_I64(per[1].remaining, 0);
    CHECK_EQ_I64(per[0].remaining, 13);   /* 20 - 7 */
    if (url) {
        char state[128];
        double burst = -1, day = -1;
        get_key("crowd", state, sizeof state);
        CHECK_EQ_I64(sscanf(state, "%lf %*d %lf %*d", &burst, &day), 2);
        CHECK(burst >= 13 && burst < 13.01);   /* spent 7 times, never by a refusal */
        CHECK(day >= 0 && day < 0.01);
    }
    hirate_limiter_free(s.lim);
}

static void test_100_threads_on_two_bands_get_the_smaller_budget(void)
{
    crowd(NULL);
    crowd(S.url);
}

/* ---- the memory table ------------------------------------------------------------ */

static void test_a_full_table_forgets_a_key_whose_every_band_refilled(void)
{
    hirate_bucket_cfg cfg[2];
    CHECK_EQ_I64(hirate_bucket_cfg_init(&cfg[0], 10, 10.0, NULL, 0), 0);
    CHECK_EQ_I64(hirate_bucket_cfg_init(&cfg[1], 100, 0.001, NULL, 0), 0);
    hirate_memory *m = hirate_memory_new(16, 2, 0);
    hirate_decision d, per[2];
    char key[16];
    /* 16 keys at t=0, each spending 1 in both bands. */
    for (int i = 0; i < 16; i++) {
        int n = snprintf(key, sizeof key, "k%d", i);
        CHECK_EQ_I64(hirate_memory_decide(m, cfg, key, (size_t)n, 0, 1, 1, &d, per), 0);
    }
    /* A second on, every band 0 is full, band 1 is not: none is forgotten
     * for free; the newcomer evicts one, and the others keep both bands. */
    CHECK_EQ_I64(hirate_memory_decide(m, cfg, "new", 3, 1000000, 1, 1, &d, per), 0);
    CHECK_EQ_I64(hirate_memory_count(m), 16);
    int kept = 0;
    for (int i = 0; i < 16; i++) {
        int n = snprintf(key, sizeof key, "k%d", i);
        if (hirate_memory_lookup(m, cfg, key, (size_t)n, 1000000, 0, 1, &d, per)) {
            kept++;
            CHECK_EQ_I64(per[0].remaining, 10);
            CHECK_EQ_I64(per[1].remaining, 99);
        }
    }
    CHECK_EQ_I64(kept, 15);
    CHECK_EQ_I64(hirate_memory_lookup(m, cfg, "new", 3, 1000000, 0, 0, &d, per), 1);
    CHECK_EQ_I64(per[1].remaining, 99);
    hirate_memory_free(m);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_each_way_of_stating_the_limit_names_its_bands();
    test_refill_seconds_is_the_window_rounded_up();
    test_a_bad_limit_names_what_is_wrong();
    test_memory_spends_in_every_band_or_in_none();
    test_a_full_table_forgets_a_key_whose_every_band_refilled();
    if (rh_start(&S) != 0) {
        CHECK(!"redis-server must start (is it installed and on PATH?)");
        return check_summary("test_bands");
    }
    rh_watchdog(&S, "test_bands", 60);
    test_redis_gives_the_memory_backends_figures();
    test_one_band_stores_a_single_buckets_format();
    test_a_batch_gives_every_items_bands();
    test_changed_bands_read_the_stored_bands_by_position();
    test_the_deny_cache_remembers_every_band();
    test_the_policies_answer_for_every_band();
    test_100_threads_on_two_bands_get_the_smaller_budget();
    rh_stop(&S);
    return check_summary("test_bands");
}
