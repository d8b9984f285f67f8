/*
 * Option and number validation: hirate_limiter_new() with every field of
 * hirate_options decoded from the input (capacity and rate as raw bits too,
 * so NaN, infinities, subnormals and 2^53 neighbours all occur; the TLS
 * options with plain and rediss:// URLs, files that exist and that do not),
 * then, on an accepted memory limiter, decisions at injected times and costs.
 *
 * The oracle is the rule list of hirate.h and docs/semantics.md, written out
 * again here: the code of every refusal must be the one the rules give, in
 * their order, with a message that names the option. Every decision must
 * keep the bucket's invariants and be exact: a refused cost passes after
 * retry_after_us and not a microsecond sooner, and the bucket is full after
 * reset_after_us and not sooner.
 */
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "hirate_io.h"

#define STEPS_MAX 16

static const int interesting_ints[] = {0, 1, -1, 2, 100, 1024, 1025, 60000, 60001, 100000,
                                       100001, 600000, 600001, INT_MAX, INT_MIN};
static const uint64_t interesting_sizes[] = {0, 1, 2, 16, 1000, 4000000000u, 4000000001u,
                                             UINT32_MAX, (uint64_t)1 << 32, SIZE_MAX};

static int64_t take_capacity(fuzz_reader *in)
{
    uint8_t sel = fuzz_u8(in);
    switch (sel & 3) {
    case 0: return (int64_t)fuzz_u64(in);
    case 1: return fuzz_u8(in);
    case 2: return HIRATE_EXACT_MAX - 2 + fuzz_u8(in) % 5;   /* 2^53 - 3 .. 2^53 + 1 */
    default: return 10;
    }
}

static double take_rate(fuzz_reader *in, int64_t capacity)
{
    static const double special[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, DBL_MIN,
                                     DBL_TRUE_MIN, DBL_MAX, 1e-300, 1e300, 1e6, 0.1, -1};
    uint8_t sel = fuzz_u8(in);
    switch (sel & 3) {
    case 0: {
        uint64_t bits = fuzz_u64(in);
        double r;
        memcpy(&r, &bits, sizeof r);
        return r;
    }
    case 1: return (double)fuzz_u8(in) / (double)(1 + fuzz_u8(in));
    case 2: return special[fuzz_u8(in) % (sizeof special / sizeof *special)];
    default: {
        /* Around the slowest rate that refills within 2^53 us. */
        double edge = (double)capacity * 1000000.0 / (double)HIRATE_EXACT_MAX;
        int steps = (int)(fuzz_u8(in) % 7) - 3;
        for (; steps > 0; steps--) edge = nextafter(edge, INFINITY);
        for (; steps < 0; steps++) edge = nextafter(edge, 0);
        return edge;
    }
    }
}

static int take_int(fuzz_reader *in)
{
    uint8_t sel = fuzz_u8(in);
    if (sel & 1)
        return (int)fuzz_u32(in);
    return interesting_ints[(sel >> 1) % (sizeof interesting_ints / sizeof *interesting_ints)];
}

static size_t take_size(fuzz_reader *in)
{
    uint8_t sel = fuzz_u8(in);
    if (sel & 1)
        return (size_t)fuzz_u64(in);
    return (size_t)interesting_sizes[(sel >> 1) % (sizeof interesting_sizes /
                                                   sizeof *interesting_sizes)];
}

/* ---- the rules, written out again ----------------------------------------------- */

typedef struct verdict {
    int rc;
    const char *names;   /* what the message must mention */
} verdict;

static int bucket_rc(int64_t capacity, double rate)
{
    if (capacity < 1 || capacity > HIRATE_EXACT_MAX)
        return HIRATE_ECAPACITY;
    if (isnan(rate) || rate <= 0 || isinf(rate))
        return HIRATE_ERATE;
    if ((double)capacity * 1e6 / rate > 9007199254740991.0)
        return HIRATE_ERANGE;
    return 0;
}

static int out_of(long long v, long long lo, long long hi)
{
    return v < lo || v > hi;
}

/* The TLS options: how a file that cannot be read, and an empty string, are
 * named. */
static const char *const tls_names[] = {"tls_ca_file", "tls_ca_dir", "tls_cert_file",
                                        "tls_key_file", "tls_server_name"};

static const char *tls_value(const hirate_options *o, int i)
{
    const char *v[] = {o->tls_ca_file, o->tls_ca_dir, o->tls_cert_file, o->tls_key_file,
                       o->tls_server_name};
    return v[i];
}

/* What a readable path is: a file for the files, a directory for the dir. */
static int unreadable(const char *path)
{
    return path && strncmp(path, "/nonexistent", 12) == 0;
}

static verdict tls_rules(const hirate_options *o, int is_tls)
{
    if (o->tls_verify != 0 && o->tls_verify != 1) return (verdict){HIRATE_EOPTION, "tls_verify"};
    if (!is_tls) {
        for (int i = 0; i < 5; i++)
            if (tls_value(o, i)) return (verdict){HIRATE_EOPTION, tls_names[i]};
        if (!o->tls_verify) return (verdict){HIRATE_EOPTION, "tls_verify"};
    }
    if ((o->tls_cert_file == NULL) != (o->tls_key_file == NULL))
        return (verdict){HIRATE_EOPTION, "tls_cert_file and tls_key_file"};
    for (int i = 0; i < 5; i++)
        if (tls_value(o, i) && !tls_value(o, i)[0]) return (verdict){HIRATE_EOPTION, tls_names[i]};
    for (int i = 0; i < 4; i++)
        if (unreadable(tls_value(o, i))) return (verdict){HIRATE_ETLS, tls_names[i]};
    return (verdict){0, NULL};
}

static verdict rules(const hirate_options *o, int url_ok, int is_tls)
{
    int rc = bucket_rc(o->capacity, o->rate);
    if (rc == HIRATE_ECAPACITY) return (verdict){rc, "capacity"};
    if (rc == HIRATE_ERATE) return (verdict){rc, "rate"};
    if (rc == HIRATE_ERANGE) return (verdict){rc, "2^53"};
    if (out_of(o->connect_timeout_ms, 1, 60000)) return (verdict){HIRATE_EOPTION, "connect_timeout_ms"};
    if (out_of(o->timeout_ms, 1, 60000)) return (verdict){HIRATE_EOPTION, "timeout_ms"};
    if (out_of(o->pool_size, 1, 1024)) return (verdict){HIRATE_EOPTION, "pool_size"};
    if (o->max_keys < 1 || o->max_keys > 4000000000u) return (verdict){HIRATE_EOPTION, "max_keys"};
    if (out_of(o->on_error, 0, 2)) return (verdict){HIRATE_EOPTION, "on_error"};
    if (out_of(o->instances, 1, 100000)) return (verdict){HIRATE_EOPTION, "instances"};
    if (out_of(o->backoff_min_ms, 1, 60000)) return (verdict){HIRATE_EOPTION, "backoff_min_ms"};
    if (out_of(o->backoff_max_ms, o->backoff_min_ms, 600000))
        return (verdict){HIRATE_EOPTION, "backoff_max_ms"};
    if (out_of(o->deny_cache, 0, 1)) return (verdict){HIRATE_EOPTION, "deny_cache"};
    if (o->deny_cache && (o->deny_cache_keys < 1 || o->deny_cache_keys > 4000000000u))
        return (verdict){HIRATE_EOPTION, "deny_cache_keys"};
    if (o->prefix && strlen(o->prefix) > HIRATE_PREFIX_MAX) return (verdict){HIRATE_EOPTION, "prefix"};
    if (o->url && !url_ok) return (verdict){HIRATE_EURL, "Redis URL"};
    if (o->url) {
        verdict t = tls_rules(o, is_tls);
        if (t.rc) return t;
    }
    if (o->url && o->on_error == HIRATE_ON_ERROR_LOCAL && o->instances > 1) {
        int64_t share = o->capacity / o->instances;
        if (bucket_rc(share > 0 ? share : 1, o->rate / o->instances) < 0)
            return (verdict){HIRATE_ERANGE, "local share"};
    }
    return (verdict){0, NULL};
}

/* ---- decisions on an accepted memory limiter ------------------------------------- */

static void check_decision(const hirate_decision *d, int64_t capacity, int64_t cost, int64_t t)
{
    FUZZ_CHECK_EQ(d->source, HIRATE_SOURCE_LOCAL);
    FUZZ_CHECK_EQ(d->error, 0);
    FUZZ_CHECK_EQ(d->limit, capacity);
    FUZZ_CHECK_EQ(d->time_us, t);
    FUZZ_CHECK(d->allowed == 0 || d->allowed == 1);
    FUZZ_CHECK(d->remaining >= 0 && d->remaining <= capacity);
    FUZZ_CHECK(d->reset_after_us >= 0);
    if (cost > capacity)
        FUZZ_CHECK(!d->allowed && d->retry_after_us == HIRATE_NEVER);
    else if (d->allowed)
        FUZZ_CHECK_EQ(d->retry_after_us, 0);
    else
        FUZZ_CHECK(d->retry_after_us > 0 && d->retry_after_us != HIRATE_NEVER);
}

/* Peeks at `at`: whether cost would pass then. */
static int passes_at(hirate_limiter *lim, int64_t at, int64_t cost)
{
    hirate_decision d;
    FUZZ_CHECK_EQ(hirate_decide_at(lim, "k", 1, cost, 0, at, &d), 0);
    return d.allowed;
}

static void decide(hirate_limiter *lim, int64_t capacity, fuzz_reader *in)
{
    int64_t t = (int64_t)(fuzz_u64(in) >> 12);   /* 0 .. 2^52 */
    for (int i = 0; i < STEPS_MAX && in->left; i++) {
        uint8_t sel = fuzz_u8(in);
        int64_t dt = (int64_t)fuzz_u64(in);
        int64_t cost = (int64_t)fuzz_u64(in);
        if (sel & 1)
            dt = (int64_t)((uint64_t)dt % 2000001) - 500000;   /* -0.5 s .. 1.5 s */
        if (sel & 2)
            cost = (int64_t)((uint64_t)cost % ((uint64_t)capacity + 2));
        /* Times stay in 0 .. 2^53 - 1, the range hirate.h promises. */
        if (dt > 0 && t > HIRATE_EXACT_MAX - dt) t = HIRATE_EXACT_MAX;
        else if (dt < 0 && (dt == INT64_MIN || t < -dt)) t = 0;
        else t += dt;
        if (sel & 4) {
            FUZZ_CHECK_EQ(hirate_reset(lim, "k", 1), 0);
            continue;
        }
        int spend = !(sel & 8);
        hirate_decision d;
        int rc = hirate_decide_at(lim, "k", 1, cost, spend, t, &d);
        if (cost < 0 || cost > HIRATE_EXACT_MAX) {
            FUZZ_CHECK_EQ(rc, HIRATE_ECOST);
            continue;
        }
        FUZZ_CHECK_EQ(rc, 0);
        check_decision(&d, capacity, cost, t);
        if (!d.allowed && cost <= capacity && d.retry_after_us <= HIRATE_EXACT_MAX - t) {
            FUZZ_CHECK(passes_at(lim, t + d.retry_after_us, cost));
            FUZZ_CHECK(!passes_at(lim, t + d.retry_after_us - 1, cost));
        }
        if (d.reset_after_us > 0 && d.reset_after_us <= HIRATE_EXACT_MAX - t) {
            FUZZ_CHECK(passes_at(lim, t + d.reset_after_us, capacity));
            FUZZ_CHECK(!passes_at(lim, t + d.reset_after_us - 1, capacity));
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_reader in = {data, size};
    hirate_options o;
    hirate_options_init(&o);
    uint16_t present = (uint16_t)(fuzz_u8(&in) | fuzz_u8(&in) << 8);   /* which fields to set */
    o.capacity = take_capacity(&in);
    o.rate = take_rate(&in, o.capacity);
    if (present & 1) o.connect_timeout_ms = take_int(&in);
    if (present & 2) o.timeout_ms = take_int(&in);
    if (present & 4) o.pool_size = take_int(&in);
    if (present & 8) o.max_keys = take_size(&in);
    if (present & 16) o.on_error = take_int(&in);
    if (present & 32) o.instances = take_int(&in);
    if (present & 64) o.backoff_min_ms = take_int(&in);
    if (present & 128) o.backoff_max_ms = take_int(&in);
    if (present & 256) o.deny_cache = take_int(&in);
    if (present & 512) o.deny_cache_keys = take_size(&in);
    char prefix[128];
    if (present & 1024) {
        size_t n = fuzz_u8(&in) % sizeof prefix;
        fuzz_take(&in, prefix, n);
        prefix[n] = '\0';
        o.prefix = prefix;
    }
    if (present & 2048)
        o.prefix = NULL;   /* no prefix at all */
    /* A URL, with a password that no message may show. */
    static const char *const urls[] = {"redis://:s3cr3t-canary@127.0.0.1:1/3",
                                       "redis://rl:s3cr3t-canary@[::1]:99999",
                                       "unix://:s3cr3t-canary@/run/r.sock?db=1",
                                       "rediss://rl:s3cr3t-canary@localhost:1/2"};
    int url_ok = 1, is_tls = 0;
    if (present & 4096) {
        int which = fuzz_u8(&in) % 4;
        o.url = urls[which];
        url_ok = which != 1;
        is_tls = which == 3;
    }
    /* The TLS options: which are set (a bit each, then tls_verify from the
     * input), and to what: a file that serves (make_certs.sh's, in
     * $HIRATE_FUZZ_CERTS: run.sh makes them), one that does not exist, or
     * the empty string. */
    if (present & 8192) {
        uint8_t which = fuzz_u8(&in), kind = fuzz_u8(&in);
        static char paths[3][4200];
        static const char *exists[5];
        if (!exists[0]) {
            const char *certs = getenv("HIRATE_FUZZ_CERTS");
            if (!certs) {
                fprintf(stderr, "fuzz_options: set HIRATE_FUZZ_CERTS to a directory of "
                                "tests/support/make_certs.sh (run.sh does)\n");
                abort();
            }
            snprintf(paths[0], sizeof paths[0], "%s/ca.crt", certs);
            snprintf(paths[1], sizeof paths[1], "%s/client.crt", certs);
            snprintf(paths[2], sizeof paths[2], "%s/client.key", certs);
            exists[0] = paths[0];
            exists[1] = certs;
            exists[2] = paths[1];
            exists[3] = paths[2];
            exists[4] = "localhost";
        }
        static const char *const missing[] = {"/nonexistent/ca.pem", "/nonexistent/ca.d",
                                              "/nonexistent/client.crt",
                                              "/nonexistent/client.key", "wrong.invalid"};
        const char **fields[] = {&o.tls_ca_file, &o.tls_ca_dir, &o.tls_cert_file,
                                 &o.tls_key_file, &o.tls_server_name};
        for (int i = 0; i < 5; i++) {
            if (!(which >> i & 1)) continue;
            int k = (kind >> (2 * (i % 4))) & 3;
            *fields[i] = k == 1 ? missing[i] : k == 2 ? "" : exists[i];
        }
        if (which & 32) o.tls_verify = take_int(&in);
    }

    verdict want = rules(&o, url_ok, is_tls);
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE] = "";
    int rc = hirate_limiter_new(&lim, &o, why, sizeof why);
    if (rc != want.rc) {
        fprintf(stderr, "rc %s, the rules say %s (%s): %s\n", hirate_err_name(rc),
                hirate_err_name(want.rc), want.names ? want.names : "-", why);
        FUZZ_CHECK(!"hirate_limiter_new follows the rules");
    }
    FUZZ_CHECK(strstr(why, "s3cr3t") == NULL);
    if (rc < 0) {
        FUZZ_CHECK(lim == NULL);
        if (!strstr(why, want.names)) {
            fprintf(stderr, "message \"%s\" does not name %s\n", why, want.names);
            FUZZ_CHECK(!"the message names the option");
        }
        return 0;
    }
    FUZZ_CHECK(lim != NULL);
    if (!o.url)
        decide(lim, o.capacity, &in);
    hirate_limiter_free(lim);
    return 0;
}
