/*
 * The shared test vectors, run by the C library: every case of
 * tests/vectors/token_bucket.json against the memory backend (its own and the
 * one shared with forked processes, hirate_options.shared), then against
 * the real script in a throwaway redis-server (time injected as ARGV[5]).
 * Every field of every decision is compared exactly; a failure names the
 * backend, the case id, the step and the field.
 *
 * A case of several bands ({"bands": [...]}: hirate_options.bands) is decided
 * by hirate_decide_at_bands, and its `band` and every band's own figures are
 * compared too. A "reconfigure" step frees the limiter and makes a new one of
 * the step's config with the same prefix, over the keys already stored; the
 * cases holding one are redis_only: the memory backend skips them (and says
 * how many), every Redis path runs them.
 *
 *     test_vectors [path/to/token_bucket.json]
 *
 * Without an argument the file is $HIRATE_SOURCE_DIR/tests/vectors/token_bucket.json.
 * The Redis half runs twice more than the memory one: with Redis Functions
 * (FCALL, the default where the server has them: no EVALSHA may be sent) and
 * with functions = 0 (EVALSHA: no FCALL may be sent), so that both paths
 * give every value of every vector.
 * With HIRATE_TEST_TLS=1 the server is reached over TLS (rediss://, the
 * harness' test CA), so that the script's answers are the same through it.
 * A redis-server that cannot start is a failure, not a skip.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "check.h"
#include "hirate.h"
#include "hirate_io.h"
#include "redis_harness.h"

#define EXACT_POW_53 9007199254740992.0   /* 2^53: every vector number is within ±2^53 */
#define KEY_TIMES_MAX 8192                 /* the schema's bound on {"repeat", "times"} */

typedef struct backend {
    const char *name;   /* "memory", "redis" or "redis+cache", for messages */
    const char *url;    /* NULL: the memory backend */
    int source;         /* the source every decision must carry */
    int deny_cache;     /* 1: refusals may come from the deny cache instead */
    const char *prefix; /* key prefix before the case id: "vec:", "ve:" or "vc:" */
    int no_functions;   /* 1: functions = 0, EVALSHA always */
    int shared;         /* 1: the memory backend shared with forked processes */
} backend;

/* The CA of the TLS server, when the run is over TLS (HIRATE_TEST_TLS). */
static const char *g_tls_ca;

/* Refusals the deny cache answered, in place of Redis, with equal values. */
static int g_cache_hits;

/* Of one run_all: redis_only cases skipped (memory), cases of several bands
 * run, decisions whose bands were compared, reconfigure steps run. */
static int g_skipped, g_multi_cases, g_band_steps, g_reconfigures;

/* The file's redis_only cases. */
static int g_redis_only;

/* The script calls of one run_all, summed over its limiters' counters. */
static uint64_t g_fcall, g_evalsha, g_eval;

/* Where we are, so that each failure names it. */
typedef struct where {
    const backend *b;
    const char *case_id;
    int step;           /* -1 while making the limiter */
} where;

static void failf(const where *w, const char *fmt, ...)
{
    va_list ap;
    check_failed_++;
    if (w->step < 0)
        fprintf(stderr, "FAIL [%s] case %s, config: ", w->b->name, w->case_id);
    else
        fprintf(stderr, "FAIL [%s] case %s, step %d: ", w->b->name, w->case_id, w->step);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static void expect_i64(const where *w, const char *field, int64_t want, int64_t got)
{
    if (want == got) {
        check_passed_++;
        return;
    }
    char a[32], b[32];
    if (want == HIRATE_NEVER) snprintf(a, sizeof a, "never");
    else snprintf(a, sizeof a, "%" PRId64, want);
    if (got == HIRATE_NEVER) snprintf(b, sizeof b, "never");
    else snprintf(b, sizeof b, "%" PRId64, got);
    failf(w, "%s: expected %s, got %s", field, a, b);
}

static void expect_str(const where *w, const char *field, const char *want, const char *got)
{
    if (got && strcmp(want, got) == 0) {
        check_passed_++;
        return;
    }
    failf(w, "%s: expected %s, got %s", field, want, got ? got : "(null)");
}

/* The vectors name errors as C does, HIRATE_ECOST; hirate_err_name says ECOST. */
static const char *c_name(int rc)
{
    static char buf[2][40];
    static int turn;
    turn = !turn;
    snprintf(buf[turn], sizeof buf[turn], "HIRATE_%s", hirate_err_name(rc));
    return buf[turn];
}

/* ------------------------------------------------------------------ JSON */

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)size + 1)) != NULL) {
        if (fread(buf, 1, (size_t)size, f) == (size_t)size) {
            buf[size] = '\0';
        } else {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}

static const cJSON *field(const cJSON *obj, const char *name)
{
    return cJSON_GetObjectItemCaseSensitive(obj, name);
}

/* A whole JSON number within ±2^53 (a double holds those exactly; cJSON's
 * valueint would saturate at INT_MAX, so read valuedouble). */
static int get_i64(const cJSON *j, int64_t *out)
{
    if (!cJSON_IsNumber(j))
        return -1;
    double v = j->valuedouble;
    if (!isfinite(v) || floor(v) != v || fabs(v) > EXACT_POW_53)
        return -1;
    *out = (int64_t)v;
    return 0;
}

/* A rate: a number, or "nan", "inf", "-inf" (JSON has no non-finite numbers). */
static int get_rate(const cJSON *j, double *out)
{
    if (cJSON_IsNumber(j)) {
        *out = j->valuedouble;
        return 0;
    }
    if (!cJSON_IsString(j))
        return -1;
    if (strcmp(j->valuestring, "nan") == 0) *out = NAN;
    else if (strcmp(j->valuestring, "inf") == 0) *out = INFINITY;
    else if (strcmp(j->valuestring, "-inf") == 0) *out = -INFINITY;
    else return -1;
    return 0;
}

/* A limiter config: {"capacity", "rate"} (*nbands = 0) or {"bands": [{"capacity", "rate",
 * "name"?}, ...]} into bands[0 .. *nbands) (names point into the JSON). */
typedef struct config {
    int64_t capacity;
    double rate;
    hirate_band bands[HIRATE_BANDS_MAX];
    size_t nbands;      /* 0: capacity and rate */
} config;

static int get_config(const cJSON *j, config *out)
{
    memset(out, 0, sizeof *out);
    if (!cJSON_IsObject(j))
        return -1;
    const cJSON *list = field(j, "bands"), *b;
    if (!list)
        return get_i64(field(j, "capacity"), &out->capacity) < 0 ||
               get_rate(field(j, "rate"), &out->rate) < 0 ? -1 : 0;
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) < 1 ||
        cJSON_GetArraySize(list) > HIRATE_BANDS_MAX)
        return -1;
    cJSON_ArrayForEach(b, list) {
        hirate_band *band = &out->bands[out->nbands++];
        const cJSON *name = field(b, "name");
        if (get_i64(field(b, "capacity"), &band->capacity) < 0 ||
            get_rate(field(b, "rate"), &band->rate) < 0 || (name && !cJSON_IsString(name)))
            return -1;
        band->name = name ? name->valuestring : NULL;
    }
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* A key in one of its three spellings: "string" (its UTF-8 bytes),
 * {"repeat": s, "times": n}, {"hex": "..."}. *out is malloc'd (never NULL
 * on success, even for the empty key). */
static int get_key(const cJSON *j, unsigned char **out, size_t *len)
{
    if (cJSON_IsString(j)) {
        *len = strlen(j->valuestring);
        *out = malloc(*len + 1);
        if (!*out)
            return -1;
        memcpy(*out, j->valuestring, *len + 1);
        return 0;
    }
    if (!cJSON_IsObject(j))
        return -1;
    const cJSON *hex = field(j, "hex"), *rep = field(j, "repeat"), *times = field(j, "times");
    if (cJSON_IsString(hex) && !rep && !times) {
        size_t n = strlen(hex->valuestring);
        if (n % 2)
            return -1;
        unsigned char *p = malloc(n / 2 + 1);
        if (!p)
            return -1;
        for (size_t i = 0; i < n / 2; i++) {
            int hi = hexval(hex->valuestring[2 * i]), lo = hexval(hex->valuestring[2 * i + 1]);
            if (hi < 0 || lo < 0) {
                free(p);
                return -1;
            }
            p[i] = (unsigned char)(hi << 4 | lo);
        }
        *out = p;
        *len = n / 2;
        return 0;
    }
    int64_t t;
    if (cJSON_IsString(rep) && !hex && get_i64(times, &t) == 0 && t >= 1 && t <= KEY_TIMES_MAX) {
        size_t unit = strlen(rep->valuestring);
        if (unit == 0)
            return -1;
        unsigned char *p = malloc(unit * (size_t)t + 1);
        if (!p)
            return -1;
        for (int64_t i = 0; i < t; i++)
            memcpy(p + (size_t)i * unit, rep->valuestring, unit);
        *out = p;
        *len = unit * (size_t)t;
        return 0;
    }
    return -1;
}

/* --------------------------------------------------------------- running */

static int g_steps_run;

/* A case's limiter, and what it was made with. */
typedef struct running {
    hirate_limiter *lim;
    size_t nbands;      /* of the config in effect: 0 for capacity and rate */
} running;

/* Compares the five figures of a decision with an "expect" (or one band's)
 * object; `what` prefixes the field names ("" or "bands[i]."). */
static void compare_figures(const where *w, const char *what, const cJSON *expect,
                            const hirate_decision *d)
{
    const cJSON *allowed = field(expect, "allowed"), *retry = field(expect, "retry_after_us");
    int64_t remaining, reset, limit, retry_us;
    char name[48];

    if (!cJSON_IsBool(allowed) || get_i64(field(expect, "remaining"), &remaining) < 0 ||
        get_i64(field(expect, "reset_after_us"), &reset) < 0 ||
        get_i64(field(expect, "limit"), &limit) < 0) {
        failf(w, "malformed %sexpect object in the vector file", what);
        return;
    }
    if (cJSON_IsString(retry) && strcmp(retry->valuestring, "never") == 0) {
        retry_us = HIRATE_NEVER;
    } else if (get_i64(retry, &retry_us) < 0) {
        failf(w, "malformed %sretry_after_us in the vector file", what);
        return;
    }
#define FIGURE(f, want, got) \
    (snprintf(name, sizeof name, "%s%s", what, f), expect_i64(w, name, want, got))
    FIGURE("allowed", cJSON_IsTrue(allowed) ? 1 : 0, d->allowed);
    FIGURE("remaining", remaining, d->remaining);
    FIGURE("retry_after_us", retry_us, d->retry_after_us);
    FIGURE("reset_after_us", reset, d->reset_after_us);
    FIGURE("limit", limit, d->limit);
#undef FIGURE
}

/* Compares one decision with its "expect" object, and each band's with
 * expect.bands (bands NULL: a one-bucket config, whose band is 0). */
static void compare(const where *w, const cJSON *expect, const hirate_decision *d, int64_t t_us,
                    const hirate_decision *bands, size_t nbands)
{
    compare_figures(w, "", expect, d);
    expect_i64(w, "time_us", t_us, d->time_us);   /* the injected clock decided */
    if (d->source == HIRATE_SOURCE_CACHE && w->b->deny_cache && !d->allowed) g_cache_hits++;
    if (d->source == w->b->source || (d->source == HIRATE_SOURCE_CACHE && w->b->deny_cache &&
                                      !d->allowed)) check_passed_++;
    else failf(w, "source: expected %s, got %s (%d)", hirate_source_name(w->b->source),
               hirate_source_name(d->source), d->source);
    if (d->error == 0) check_passed_++;
    else failf(w, "error: expected 0, got %s (%d)", hirate_err_name(d->error), d->error);

    if (!bands) {
        expect_i64(w, "band", 0, d->band);
        return;
    }
    int64_t band;
    const cJSON *list = field(expect, "bands"), *e;
    if (get_i64(field(expect, "band"), &band) < 0 || !cJSON_IsArray(list) ||
        (size_t)cJSON_GetArraySize(list) != nbands) {
        failf(w, "malformed band or bands in the vector file (%zu bands configured)", nbands);
        return;
    }
    expect_i64(w, "band", band, d->band);
    size_t i = 0;
    cJSON_ArrayForEach(e, list) {
        char what[32];
        snprintf(what, sizeof what, "bands[%zu].", i);
        compare_figures(w, what, e, &bands[i]);
        /* source, error and time_us are the whole's */
        if (bands[i].source == d->source && bands[i].error == d->error &&
            bands[i].time_us == d->time_us) check_passed_++;
        else failf(w, "%s source/error/time_us: expected the whole's %s/%d/%" PRId64
                   ", got %s/%d/%" PRId64, what, hirate_source_name(d->source), d->error,
                   d->time_us, hirate_source_name(bands[i].source), bands[i].error,
                   bands[i].time_us);
        i++;
    }
    g_band_steps++;
}

static void run_step(where *w, running *run, const cJSON *step)
{
    const cJSON *op = field(step, "op"), *jcost = field(step, "cost");
    const cJSON *expect = field(step, "expect"), *expect_error = field(step, "expect_error");
    int64_t t_us, cost = 1;
    unsigned char *key = NULL;
    size_t keylen = 0;
    hirate_limiter *lim = run->lim;

    if (!cJSON_IsString(op) || get_i64(field(step, "t_us"), &t_us) < 0 ||
        (jcost && get_i64(jcost, &cost) < 0) || get_key(field(step, "key"), &key, &keylen) < 0) {
        failf(w, "malformed step in the vector file");
        free(key);
        return;
    }
    g_steps_run++;

    if (strcmp(op->valuestring, "reset") == 0) {
        int rc = hirate_reset(lim, key, keylen);
        if (rc == 0) check_passed_++;
        else failf(w, "reset: expected 0, got %s", hirate_err_name(rc));
        free(key);
        return;
    }
    int spend;
    if (strcmp(op->valuestring, "allow") == 0) spend = 1;
    else if (strcmp(op->valuestring, "peek") == 0) spend = 0;
    else if (strcmp(op->valuestring, "refund") == 0) spend = HIRATE_OP_REFUND;
    else {
        failf(w, "unknown op \"%s\" in the vector file", op->valuestring);
        free(key);
        return;
    }

    /* A field the library forgets cannot match by luck. */
    hirate_decision d, bands[HIRATE_BANDS_MAX];
    memset(&d, 0xa5, sizeof d);
    memset(bands, 0xa5, sizeof bands);
    int rc;
    if (run->nbands)
        rc = hirate_decide_at_bands(lim, key, keylen, cost, spend, t_us, &d, bands, run->nbands);
    else
        rc = hirate_decide_at(lim, key, keylen, cost, spend, t_us, &d);
    free(key);

    if (cJSON_IsString(expect_error)) {
        expect_str(w, "return code", expect_error->valuestring, c_name(rc));
        if (rc < 0) {
            char msg[HIRATE_ERRMSG_SIZE] = "";
            hirate_limiter_errmsg(lim, msg, sizeof msg);
            if (msg[0]) check_passed_++;
            else failf(w, "%s returned without a message in hirate_limiter_errmsg",
                       hirate_err_name(rc));
        }
        return;
    }
    if (!cJSON_IsObject(expect)) {
        failf(w, "step has neither expect nor expect_error in the vector file");
        return;
    }
    if (rc != 0) {
        char msg[HIRATE_ERRMSG_SIZE] = "";
        hirate_limiter_errmsg(lim, msg, sizeof msg);
        failf(w, "return code: expected 0, got %s (%s)", hirate_err_name(rc), msg);
        return;
    }
    check_passed_++;
    compare(w, expect, &d, t_us, run->nbands ? bands : NULL, run->nbands);
}

/* Adds a limiter's script calls to the run's, and frees it. */
static void done_with(hirate_limiter *lim)
{
    hirate_counters cnt;
    hirate_counters_get(lim, &cnt);
    g_fcall += cnt.fcall;
    g_evalsha += cnt.evalsha;
    g_eval += cnt.eval;
    hirate_limiter_free(lim);
}

/* Makes the limiter of a config for backend b. 0, or the code of
 * hirate_limiter_new (failures other than the one a case expects are its
 * caller's to report). The limiter's bands must be the config's. */
static int make_limiter(const where *w, const char *prefix, const config *cfg, running *run,
                        char *why, size_t whylen)
{
    const backend *b = w->b;
    hirate_options o;
    hirate_options_init(&o);
    o.url = b->url;
    if (cfg->nbands) {
        o.bands = cfg->bands;
        o.nbands = cfg->nbands;
    } else {
        o.capacity = cfg->capacity;
        o.rate = cfg->rate;
    }
    o.prefix = prefix;
    o.connect_timeout_ms = 5000;   /* a slow CI machine must not turn into a fallback */
    o.timeout_ms = 5000;
    o.deny_cache = b->deny_cache;
    if (b->no_functions) o.functions = 0;
    o.shared = b->shared;
    if (b->url) o.tls_ca_file = g_tls_ca;

    hirate_limiter *lim = (hirate_limiter *)&o;   /* must become NULL on failure */
    int rc = hirate_limiter_new(&lim, &o, why, whylen);
    run->lim = lim;
    run->nbands = cfg->nbands;
    if (rc != 0)
        return rc;
    /* The limiter holds the config's bands (one for capacity and rate). */
    size_t n = cfg->nbands ? cfg->nbands : 1;
    expect_i64(w, "hirate_limiter_nbands", (int64_t)n, (int64_t)hirate_limiter_nbands(lim));
    for (size_t i = 0; i < n; i++) {
        hirate_band got;
        memset(&got, 0, sizeof got);
        int brc = hirate_limiter_band(lim, i, &got);
        const hirate_band *want = cfg->nbands ? &cfg->bands[i] : NULL;
        int64_t cap = want ? want->capacity : cfg->capacity;
        double rate = want ? want->rate : cfg->rate;
        if (brc == 0 && got.capacity == cap && got.rate == rate && got.name && got.name[0] &&
            (!want || !want->name || strcmp(want->name, got.name) == 0)) {
            check_passed_++;
        } else {
            failf(w, "hirate_limiter_band(%zu): rc %d, capacity %" PRId64 ", rate %.17g, name %s;"
                  " the config says %" PRId64 ", %.17g, %s", i, brc, got.capacity, got.rate,
                  got.name ? got.name : "(null)", cap, rate,
                  want && want->name ? want->name : "(default)");
        }
    }
    return 0;
}

static void run_case(const backend *b, const cJSON *c)
{
    const cJSON *id = field(c, "id");
    where w = {b, "?", -1};
    config cfg;

    if (cJSON_IsString(id))
        w.case_id = id->valuestring;
    if (!cJSON_IsString(id) || get_config(field(c, "config"), &cfg) < 0) {
        failf(&w, "malformed case in the vector file");
        return;
    }
    /* A memory backend's bands cannot change under it: skipped, and counted. */
    if (cJSON_IsTrue(field(c, "redis_only")) && !b->url) {
        g_skipped++;
        return;
    }
    if (cfg.nbands)
        g_multi_cases++;

    char prefix[HIRATE_PREFIX_MAX + 1];
    int n = snprintf(prefix, sizeof prefix, "%s%s:", b->prefix, w.case_id);
    if (n < 0 || (size_t)n >= sizeof prefix) {
        failf(&w, "id too long for a key prefix of %d bytes", HIRATE_PREFIX_MAX);
        return;
    }

    char why[HIRATE_ERRMSG_SIZE] = "";
    running run;
    int rc = make_limiter(&w, prefix, &cfg, &run, why, sizeof why);

    const cJSON *config_error = field(c, "config_error");
    if (cJSON_IsString(config_error)) {
        expect_str(&w, "hirate_limiter_new", config_error->valuestring, c_name(rc));
        if (rc < 0) {
            if (run.lim == NULL) check_passed_++;
            else failf(&w, "hirate_limiter_new failed but left *out non-NULL");
            if (why[0]) check_passed_++;
            else failf(&w, "hirate_limiter_new failed without a message in errbuf");
            /* A band's bad number is named by its index. */
            if (!cfg.nbands || strncmp(why, "bands[", 6) == 0) check_passed_++;
            else failf(&w, "the message does not start with \"bands[i]: \": %s", why);
        }
        if (rc == 0)
            hirate_limiter_free(run.lim);
        return;
    }
    if (rc != 0) {
        failf(&w, "hirate_limiter_new: expected 0, got %s (%s)", hirate_err_name(rc), why);
        return;
    }
    check_passed_++;

    const cJSON *steps = field(c, "steps"), *step;
    if (!cJSON_IsArray(steps) || cJSON_GetArraySize(steps) == 0)
        failf(&w, "case has neither steps nor config_error in the vector file");
    w.step = 0;
    cJSON_ArrayForEach(step, steps) {
        const cJSON *op = field(step, "op");
        if (cJSON_IsString(op) && strcmp(op->valuestring, "reconfigure") == 0) {
            /* A new limiter of the step's config, the same prefix: the keys stay. */
            config next;
            if (get_config(field(step, "config"), &next) < 0) {
                failf(&w, "malformed reconfigure step in the vector file");
                break;
            }
            done_with(run.lim);
            why[0] = '\0';
            rc = make_limiter(&w, prefix, &next, &run, why, sizeof why);
            if (rc != 0) {
                failf(&w, "reconfigure: hirate_limiter_new: expected 0, got %s (%s)",
                      hirate_err_name(rc), why);
                return;
            }
            check_passed_++;
            g_steps_run++;
            g_reconfigures++;
        } else {
            run_step(&w, &run, step);
        }
        w.step++;
    }
    done_with(run.lim);
}

static void run_all(const backend *b, const cJSON *cases)
{
    const cJSON *c;
    int before = check_failed_;
    g_steps_run = 0;
    g_fcall = g_evalsha = g_eval = 0;
    g_skipped = g_multi_cases = g_band_steps = g_reconfigures = 0;
    cJSON_ArrayForEach(c, cases)
        run_case(b, c);
    printf("%s: %d cases (%d skipped: redis_only), %d steps, %d failures (%llu FCALL, "
           "%llu EVALSHA, %llu EVAL); %d cases of bands, %d decisions with bands, "
           "%d reconfigures\n",
           b->name, cJSON_GetArraySize(cases) - g_skipped, g_skipped, g_steps_run,
           check_failed_ - before, (unsigned long long)g_fcall, (unsigned long long)g_evalsha,
           (unsigned long long)g_eval, g_multi_cases, g_band_steps, g_reconfigures);
    /* Every path compares bands; only the memory one skips, and only redis_only cases. */
    if (g_multi_cases > 0 && g_band_steps > 0) check_passed_++;
    else {
        check_failed_++;
        fprintf(stderr, "FAIL [%s] no decision of several bands was compared\n", b->name);
    }
    if (b->url ? g_skipped == 0 && g_reconfigures > 0 : g_skipped == g_redis_only &&
                                                          g_reconfigures == 0) check_passed_++;
    else {
        check_failed_++;
        fprintf(stderr, "FAIL [%s] %d redis_only cases skipped, %d reconfigures run (file: %d"
                " redis_only cases)\n", b->name, g_skipped, g_reconfigures, g_redis_only);
    }
    if (g_steps_run > 0) check_passed_++;
    else {
        check_failed_++;
        fprintf(stderr, "FAIL [%s] no step ran\n", b->name);
    }
}

/* What the vectors left in Redis: keys only under the "vec:", "ve:" and "vc:" prefixes the
 * runner chose, and each with a TTL (the script's only write is SET ... PX). */
static void check_redis_keys(rh_server *s)
{
    redisReply *r = rh_command(s, "KEYS *");
    if (!r || r->type != REDIS_REPLY_ARRAY) {
        check_failed_++;
        fprintf(stderr, "FAIL [redis] KEYS * did not answer with an array\n");
        if (r)
            freeReplyObject(r);
        return;
    }
    CHECK(r->elements > 0);   /* the spends of the vectors were stored in this server */
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *k = r->element[i];
        if (k->type != REDIS_REPLY_STRING || k->len < 4 ||
            (memcmp(k->str, "vec:", 4) != 0 && memcmp(k->str, "ve:", 3) != 0 &&
             memcmp(k->str, "vc:", 3) != 0)) {
            check_failed_++;
            fprintf(stderr, "FAIL [redis] key without the limiter's prefix: %.*s\n",
                    k->type == REDIS_REPLY_STRING ? (int)k->len : 0, k->str ? k->str : "");
            continue;
        }
        redisReply *ttl = rh_command(s, "PTTL %b", k->str, (size_t)k->len);
        if (ttl && ttl->type == REDIS_REPLY_INTEGER && ttl->integer > 0) {
            check_passed_++;
        } else {
            check_failed_++;
            fprintf(stderr, "FAIL [redis] key %.*s has no TTL (PTTL %lld)\n", (int)k->len,
                    k->str, ttl && ttl->type == REDIS_REPLY_INTEGER ? ttl->integer : -99);
        }
        if (ttl)
            freeReplyObject(ttl);
    }
    freeReplyObject(r);
}

int main(int argc, char **argv)
{
    char path[4096];
    if (argc > 1) {
        snprintf(path, sizeof path, "%s", argv[1]);
    } else {
        const char *src = getenv("HIRATE_SOURCE_DIR");
        if (!src) {
            fprintf(stderr, "usage: test_vectors [token_bucket.json] (or set HIRATE_SOURCE_DIR)\n");
            return 2;
        }
        snprintf(path, sizeof path, "%s/tests/vectors/token_bucket.json", src);
    }

    char *text = slurp(path);
    if (!text) {
        perror(path);
        return 1;
    }
    cJSON *doc = cJSON_Parse(text);
    free(text);
    if (!doc) {
        fprintf(stderr, "%s: not JSON (near: %.40s)\n", path, cJSON_GetErrorPtr());
        return 1;
    }
    int64_t version = 0;
    const cJSON *cases = field(doc, "cases");
    CHECK(get_i64(field(doc, "version"), &version) == 0 && version == 1);
    CHECK(cJSON_IsArray(cases) && cJSON_GetArraySize(cases) > 0);
    if (version != 1 || !cJSON_IsArray(cases)) {
        cJSON_Delete(doc);
        return check_summary("test_vectors");
    }

    const cJSON *c;
    cJSON_ArrayForEach(c, cases)
        g_redis_only += cJSON_IsTrue(field(c, "redis_only"));
    CHECK(g_redis_only > 0);

    static const backend memory = {"memory", NULL, HIRATE_SOURCE_LOCAL, 0, "vec:", 0, 0};
    run_all(&memory, cases);
    /* The table shared by forked processes decides as the process' own. */
    static const backend shared = {"shared", NULL, HIRATE_SOURCE_LOCAL, 0, "vec:", 0, 1};
    run_all(&shared, cases);

    rh_server s;
    memset(&s, 0, sizeof s);
    const char *tls = getenv("HIRATE_TEST_TLS");
    s.tls = tls && strcmp(tls, "1") == 0;
    if (rh_start(&s) == 0) {
        if (s.tls) g_tls_ca = s.ca_file;
        check_passed_++;
        rh_watchdog(&s, "test_vectors", 120);
        /* The script itself, then the same with the deny cache, which must
         * give every value Redis gives while answering refusals itself. */
        const backend redis = {s.tls ? "rediss" : "redis", s.url, HIRATE_SOURCE_REDIS, 0,
                               "vec:", 0, 0};
        const backend evalsha = {s.tls ? "rediss+evalsha" : "redis+evalsha", s.url,
                                 HIRATE_SOURCE_REDIS, 0, "ve:", 1, 0};
        const backend cached = {s.tls ? "rediss+cache" : "redis+cache", s.url,
                                HIRATE_SOURCE_REDIS, 1, "vc:", 0, 0};
        /* Redis 7 has Functions: the script goes by FCALL alone. */
        run_all(&redis, cases);
        CHECK(g_fcall > 0);
        CHECK_EQ_I64(g_evalsha, 0);
        CHECK_EQ_I64(g_eval, 0);
        /* functions = 0: by EVALSHA alone (EVAL once per limiter at most,
         * after the server's NOSCRIPT). */
        run_all(&evalsha, cases);
        CHECK(g_evalsha > 0);
        CHECK_EQ_I64(g_fcall, 0);
        CHECK_EQ_I64(g_cache_hits, 0);
        run_all(&cached, cases);
        CHECK(g_cache_hits > 20);
        printf("deny cache: %d refusals answered without Redis, all equal to Redis' own\n",
               g_cache_hits);
        check_redis_keys(&s);
        rh_stop(&s);
    } else {
        check_failed_++;
        fprintf(stderr, "FAIL [redis] redis-server did not start: the Redis half did not run\n");
    }

    cJSON_Delete(doc);
    return check_summary("test_vectors");
}
