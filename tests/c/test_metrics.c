/*
 * Metrics, the log of an outage, and the deny cache's bound: the exact
 * figures of hirate_stats_get after a scripted sequence against a real
 * redis-server (decisions by source, refusals, peeks, errors by code, one
 * breaker opening and closing around a kill and a restart, connections, the
 * round trips in the latency histogram); one warning and one info line for
 * that outage however many calls met it; a reset by another limiter seen
 * within deny_cache_max_ms; and threads whose counts all arrive.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "hirate.h"
#include "redis_harness.h"

static rh_server S;

/* ---- the log ------------------------------------------------------------------- */

#define LOG_MAX 16
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static int nlogged, loglevel[LOG_MAX];
static char logged[LOG_MAX][HIRATE_ERRMSG_SIZE * 2];

static void keep_log(void *arg, int level, const char *msg)
{
    (void)arg;
    pthread_mutex_lock(&log_lock);
    if (nlogged < LOG_MAX) {
        loglevel[nlogged] = level;
        snprintf(logged[nlogged], sizeof logged[0], "%s", msg);
    }
    nlogged++;
    pthread_mutex_unlock(&log_lock);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static hirate_limiter *make(const char *url, int on_error, int deny_cache, int deny_max_ms)
{
    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.capacity = 10;
    o.rate = 0.001;
    o.prefix = "m:";
    o.on_error = on_error;
    o.deny_cache = deny_cache;
    if (deny_max_ms)
        o.deny_cache_max_ms = deny_max_ms;
    o.backoff_min_ms = 50;
    o.backoff_max_ms = 50;
    o.timeout_ms = 1000;
    o.connect_timeout_ms = 1000;
    o.pool_size = 1;
    o.log = keep_log;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE];
    int rc = hirate_limiter_new(&lim, &o, why, sizeof why);
    if (rc)
        fprintf(stderr, "  hirate_limiter_new: %s\n", why);
    CHECK_EQ_I64(rc, 0);
    return lim;
}

static hirate_stats stats(hirate_limiter *lim)
{
    hirate_stats st;
    memset(&st, 0xff, sizeof st);
    CHECK_EQ_I64(hirate_stats_get(lim, &st, sizeof st), 0);
    return st;
}

static uint64_t round_trips(const hirate_stats *st)
{
    uint64_t n = 0;
    for (int i = 0; i < HIRATE_LATENCY_BUCKETS; i++)
        n += st->latency[i];
    return n;
}

static uint64_t errors(const hirate_stats *st)
{
    uint64_t n = 0;
    for (int i = 0; i <= HIRATE_ERRNO_MAX; i++)
        n += st->errors[i];
    return n;
}

/* The function library in the server, so that no call pays for loading it
 * and every decision below is one round trip. */
static void load_library(void)
{
    size_t len;
    const char *lib = hirate_function_library(&len);
    redisReply *r = rh_command(&S, "FUNCTION LOAD REPLACE %b", lib, len);
    CHECK(r && r->type == REDIS_REPLY_STRING);
    freeReplyObject(r);
}

/* ---- the tests ------------------------------------------------------------------- */

static void test_the_bounds_are_the_documented_ones(void)
{
    size_t n;
    const int64_t *b = hirate_latency_bounds(&n);
    static const int64_t want[] = {100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000,
                                   100000, 250000, 500000, 1000000};
    CHECK_EQ_I64(n, HIRATE_LATENCY_BUCKETS - 1);
    for (size_t i = 0; i < n && i < sizeof want / sizeof *want; i++)
        CHECK_EQ_I64(b[i], want[i]);
    CHECK(hirate_latency_bounds(NULL) == b);
    hirate_stats st;
    CHECK_EQ_I64(hirate_stats_get(NULL, &st, sizeof st), HIRATE_EINVAL);
}

static void test_memory_counts_every_decision(void)
{
    hirate_limiter *lim = make(NULL, HIRATE_ON_ERROR_LOCAL, 1, 0);
    if (!lim) return;
    hirate_decision d;
    for (int i = 0; i < 12; i++)
        hirate_allow(lim, "k", 1, 1, &d);   /* 10 pass, 2 refused */
    hirate_peek(lim, "k", 1, 1, &d);
    CHECK_EQ_I64(hirate_allow(lim, "", 0, 1, &d), HIRATE_EKEY);
    CHECK_EQ_I64(hirate_allow(lim, "k", 1, -1, &d), HIRATE_ECOST);
    hirate_item items[3] = {{"a", 1, 1, 0, {0}}, {"b", 1, 11, 0, {0}}, {"", 0, 1, 0, {0}}};
    CHECK_EQ_I64(hirate_allow_many(lim, items, 3), 0);
    CHECK_EQ_I64(hirate_reset(lim, "", 0), HIRATE_EKEY);

    hirate_stats st = stats(lim);
    CHECK_EQ_I64(st.decisions[HIRATE_SOURCE_LOCAL], 14);
    CHECK_EQ_I64(st.decisions[0] + st.decisions[HIRATE_SOURCE_REDIS] +
                     st.decisions[HIRATE_SOURCE_CACHE] + st.decisions[HIRATE_SOURCE_FAIL_OPEN] +
                     st.decisions[HIRATE_SOURCE_FAIL_CLOSED], 0);
    CHECK_EQ_I64(st.refused, 3);
    CHECK_EQ_I64(st.peeks, 1);
    CHECK_EQ_I64(st.errors[-HIRATE_EKEY], 3);
    CHECK_EQ_I64(st.errors[-HIRATE_ECOST], 1);
    CHECK_EQ_I64(errors(&st), 4);
    CHECK_EQ_I64(round_trips(&st), 0);
    CHECK_EQ_I64(st.connects + st.conns_dropped + st.breaker_opens + st.breaker_closes, 0);

    /* A shorter struct (an older program's) gets its part only. */
    hirate_stats part;
    memset(&part, 0xab, sizeof part);
    CHECK_EQ_I64(hirate_stats_get(lim, &part, sizeof part.decisions), 0);
    CHECK_EQ_I64(part.decisions[HIRATE_SOURCE_LOCAL], 14);
    CHECK_EQ_I64(part.refused, (int64_t)0xabababababababab);
    hirate_limiter_free(lim);
}

static void test_a_sequence_against_redis_and_an_outage(void)
{
    load_library();
    pthread_mutex_lock(&log_lock);
    nlogged = 0;
    pthread_mutex_unlock(&log_lock);
    hirate_limiter *lim = make(S.url, HIRATE_ON_ERROR_CLOSED, 0, 0);
    if (!lim) return;
    hirate_decision d;
    for (int i = 0; i < 15; i++)
        CHECK_EQ_I64(hirate_allow(lim, "seq", 3, 1, &d), 0);   /* 10 pass, 5 refused */
    CHECK_EQ_I64(hirate_peek(lim, "seq", 3, 1, &d), 0);
    hirate_stats st = stats(lim);
    CHECK_EQ_I64(st.decisions[HIRATE_SOURCE_REDIS], 15);
    CHECK_EQ_I64(st.refused, 5);
    CHECK_EQ_I64(st.peeks, 1);
    CHECK_EQ_I64(errors(&st), 0);
    CHECK_EQ_I64(round_trips(&st), 16);
    CHECK(st.latency_sum_us > 0);
    CHECK_EQ_I64(st.connects, 1);
    CHECK_EQ_I64(st.conns_dropped, 0);
    CHECK_EQ_I64(st.breaker_opens, 0);

    /* The server dies: the first call meets it, the next is answered by
     * the open breaker; both by the policy, with the same failure. */
    rh_kill(&S);
    CHECK_EQ_I64(hirate_allow(lim, "seq", 3, 1, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_FAIL_CLOSED);
    int code = d.error;
    CHECK(code == HIRATE_EIO || code == HIRATE_ECONNECT);
    CHECK_EQ_I64(hirate_allow(lim, "seq", 3, 1, &d), 0);
    CHECK_EQ_I64(d.error, code);
    st = stats(lim);
    CHECK_EQ_I64(st.decisions[HIRATE_SOURCE_FAIL_CLOSED], 2);
    CHECK_EQ_I64(st.refused, 7);
    CHECK_EQ_I64(st.errors[-code], 2);
    CHECK_EQ_I64(errors(&st), 2);
    CHECK_EQ_I64(st.breaker_opens, 1);
    CHECK_EQ_I64(st.breaker_closes, 0);
    CHECK_EQ_I64(round_trips(&st), 16);   /* a failed one is not a round trip */

    /* Back, with its library: the next call after the backoff probes, and
     * the breaker closes. */
    CHECK_EQ_I64(rh_restart(&S), 0);
    load_library();
    sleep_ms(120);
    CHECK_EQ_I64(hirate_allow(lim, "after", 5, 1, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    st = stats(lim);
    CHECK_EQ_I64(st.breaker_opens, 1);
    CHECK_EQ_I64(st.breaker_closes, 1);
    CHECK_EQ_I64(st.decisions[HIRATE_SOURCE_REDIS], 16);
    CHECK_EQ_I64(round_trips(&st), 17);
    /* the first, the one refused while it was down (when the dead one was
     * seen before a call was sent on it), the one after */
    CHECK_EQ_I64(st.connects, 2 + (code == HIRATE_ECONNECT));

    /* One warning and one info line for the whole outage. */
    char head[96];
    pthread_mutex_lock(&log_lock);
    CHECK_EQ_I64(nlogged, 2);
    snprintf(head, sizeof head, "Redis at 127.0.0.1:%d failed (", S.port);
    CHECK_EQ_I64(loglevel[0], HIRATE_LOG_WARNING);
    CHECK(strncmp(logged[0], head, strlen(head)) == 0);
    const char *tail = "): the 'closed' policy decides until it answers again";
    CHECK(strlen(logged[0]) > strlen(tail) &&
          strcmp(logged[0] + strlen(logged[0]) - strlen(tail), tail) == 0);
    snprintf(head, sizeof head, "Redis at 127.0.0.1:%d answers again, after ", S.port);
    CHECK_EQ_I64(loglevel[1], HIRATE_LOG_INFO);
    CHECK(strncmp(logged[1], head, strlen(head)) == 0);
    CHECK(strcmp(logged[1] + strlen(logged[1]) - 2, " s") == 0);
    if (nlogged != 2)
        for (int i = 0; i < nlogged && i < LOG_MAX; i++)
            fprintf(stderr, "  log [%d] %s\n", loglevel[i], logged[i]);
    pthread_mutex_unlock(&log_lock);
    hirate_limiter_free(lim);
}

/* A refusal another process's reset undid is foretold no longer than
 * deny_cache_max_ms: here two limiters, two deny caches, one Redis. */
static void test_a_reset_elsewhere_is_seen_within_the_bound(void)
{
    hirate_limiter *a = make(S.url, HIRATE_ON_ERROR_CLOSED, 1, 200);
    hirate_limiter *b = make(S.url, HIRATE_ON_ERROR_CLOSED, 1, 200);
    if (!a || !b) return;
    hirate_decision d;
    for (int i = 0; i < 10; i++)
        hirate_allow(a, "shared", 6, 1, &d);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.remaining, 0);      /* learnt: the next is refused here */
    CHECK_EQ_I64(hirate_allow(a, "shared", 6, 1, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_CACHE);
    CHECK_EQ_I64(d.allowed, 0);

    CHECK_EQ_I64(hirate_reset(b, "shared", 6), 0);
    CHECK_EQ_I64(hirate_allow(a, "shared", 6, 1, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_CACHE);   /* a has not heard of it */
    CHECK_EQ_I64(d.allowed, 0);
    sleep_ms(300);                                  /* past the bound */
    CHECK_EQ_I64(hirate_allow(a, "shared", 6, 1, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.remaining, 9);

    hirate_options o;
    hirate_options_init(&o);
    CHECK_EQ_I64(o.deny_cache_max_ms, 1000);
    o.capacity = 1;
    o.rate = 1;
    o.url = S.url;
    o.deny_cache_max_ms = 0;
    hirate_limiter *bad;
    char why[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_limiter_new(&bad, &o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "deny_cache_max_ms must be from 1 to 86400000, got 0");
    hirate_limiter_free(a);
    hirate_limiter_free(b);
}

typedef struct worker {
    hirate_limiter *lim;
    int id;
} worker;

static void *spend(void *arg)
{
    worker *w = arg;
    char key[16];
    hirate_decision d;
    for (int i = 0; i < 20000; i++) {
        snprintf(key, sizeof key, "t%d-%d", w->id, i % 64);
        hirate_allow(w->lim, key, strlen(key), i % 50 == 0 ? 0 : 1, &d);
    }
    return NULL;
}

static void test_every_threads_counts_arrive(void)
{
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = 1000000;
    o.rate = 1;
    hirate_limiter *lim;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, NULL, 0), 0);
    pthread_t t[8];
    worker w[8];
    for (int i = 0; i < 8; i++) {
        w[i] = (worker){lim, i};
        pthread_create(&t[i], NULL, spend, &w[i]);
    }
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    hirate_stats st = stats(lim);
    CHECK_EQ_I64(st.decisions[HIRATE_SOURCE_LOCAL], 160000);
    CHECK_EQ_I64(st.refused, 0);
    hirate_limiter_free(lim);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_the_bounds_are_the_documented_ones();
    test_memory_counts_every_decision();
    test_every_threads_counts_arrive();
    if (rh_start(&S) != 0) {
        CHECK(!"redis-server must start (is it installed and on PATH?)");
        return check_summary("test_metrics");
    }
    rh_watchdog(&S, "test_metrics", 60);
    test_a_sequence_against_redis_and_an_outage();
    test_a_reset_elsewhere_is_seen_within_the_bound();
    rh_stop(&S);
    return check_summary("test_metrics");
}
