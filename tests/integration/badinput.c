/*
 * The bad-input sweep through the public C API (hirate.h), table-driven:
 *
 *   1. options: every number at its edges and beyond (0, negative, NaN,
 *      +-inf, 1e308, 2^53, INT64/INT extremes), prefixes and URLs that are
 *      too long (1 MiB) or malformed; each is refused with its own code and
 *      exactly the message docs/semantics.md promises, or accepted when the
 *      rules accept it (a rate of 1e308 is a finite rate above 0);
 *   2. calls: keys that are NULL, empty, 513 bytes and 1 MiB long; costs
 *      below 0 and at 2^53 and beyond; each refused by allow, peek, reset and
 *      allow_many alike, on a memory and a Redis limiter, with the code and
 *      message, and nothing spent;
 *   3. keys that are valid although they look dangerous (keys are bytes):
 *      NUL, CRLF with a RESP command after it, cluster hash tags {...},
 *      printf directives, non-UTF-8 bytes, 512 bytes of 0xff. Each has a
 *      bucket of its own in memory and in Redis, where it is stored byte for
 *      byte under the prefix, and no two of them collide.
 *
 * C's types leave out what the other languages must check at run time (a
 * cost or a timeout cannot be NaN or a string here); tests/python/
 * test_badinput.py, tests/lua/badinput_spec.lua and test_cli_badinput.py
 * sweep those.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "hirate_io.h"
#include "redis_harness.h"

#define MIB (1024 * 1024)

static rh_server S;
static char *mib;            /* 1 MiB of 'k', NUL-terminated */

/* ---- 1. options ------------------------------------------------------------------ */

enum field {
    F_CAPACITY, F_RATE, F_TIMEOUT, F_CONNECT_TIMEOUT, F_POOL, F_MAX_KEYS, F_INSTANCES,
    F_ON_ERROR, F_PREFIX, F_URL, F_DENY_CACHE, F_NULL_OPTS, F_NULL_OUT
};

/* s == BIG: 1 MiB of text (after "redis://" for a URL). */
static const char BIG[] = "1 MiB";

typedef struct opt_case {
    const char *what;
    enum field field;
    int64_t i;
    double d;
    const char *s;
    int rc;                 /* 0: accepted */
    const char *message;    /* exactly, when refused */
} opt_case;

static const opt_case opt_cases[] = {
    {"capacity 0", F_CAPACITY, 0, 0, NULL, HIRATE_ECAPACITY,
     "capacity must be a whole number from 1 to 2^53-1, got 0"},
    {"capacity -1", F_CAPACITY, -1, 0, NULL, HIRATE_ECAPACITY,
     "capacity must be a whole number from 1 to 2^53-1, got -1"},
    {"capacity 2^53", F_CAPACITY, 9007199254740992LL, 0, NULL, HIRATE_ECAPACITY,
     "capacity must be a whole number from 1 to 2^53-1, got 9007199254740992"},
    {"capacity INT64_MAX", F_CAPACITY, INT64_MAX, 0, NULL, HIRATE_ECAPACITY,
     "capacity must be a whole number from 1 to 2^53-1, got 9223372036854775807"},
    {"capacity INT64_MIN", F_CAPACITY, INT64_MIN, 0, NULL, HIRATE_ECAPACITY,
     "capacity must be a whole number from 1 to 2^53-1, got -9223372036854775808"},
    {"capacity 2^53-1 at a rate that refills it in time", F_CAPACITY, HIRATE_EXACT_MAX, 1e9,
     NULL, 0, NULL},
    {"capacity 2^53-1 at 1 token/s: over 2^53 us to refill", F_CAPACITY, HIRATE_EXACT_MAX, 1,
     NULL, HIRATE_ERANGE,
     "capacity 9007199254740991 at rate 1 takes over 2^53 us to refill; raise the rate or "
     "lower the capacity"},
    {"rate 0", F_RATE, 0, 0.0, NULL, HIRATE_ERATE,
     "rate must be a finite number of tokens per second above 0, got 0"},
    {"rate -0", F_RATE, 0, -0.0, NULL, HIRATE_ERATE,
     "rate must be a finite number of tokens per second above 0, got -0"},
    {"rate -1", F_RATE, 0, -1.0, NULL, HIRATE_ERATE,
     "rate must be a finite number of tokens per second above 0, got -1"},
    {"rate NaN", F_RATE, 0, NAN, NULL, HIRATE_ERATE,
     "rate must be a finite number of tokens per second above 0, got nan"},
    {"rate +inf", F_RATE, 0, INFINITY, NULL, HIRATE_ERATE,
     "rate must be a finite number of tokens per second above 0, got inf"},
    {"rate -inf", F_RATE, 0, -INFINITY, NULL, HIRATE_ERATE,
     "rate must be a finite number of tokens per second above 0, got -inf"},
    {"rate -1e308", F_RATE, 0, -1e308, NULL, HIRATE_ERATE,
     "rate must be a finite number of tokens per second above 0, got -1e+308"},
    {"rate 1e308 (finite, above 0)", F_RATE, 0, 1e308, NULL, 0, NULL},
    {"rate 2^53", F_RATE, 0, 9007199254740992.0, NULL, 0, NULL},
    {"rate 1e-308: over 2^53 us to refill", F_RATE, 0, 1e-308, NULL, HIRATE_ERANGE,
     "capacity 10 at rate 1e-308 takes over 2^53 us to refill; raise the rate or lower the "
     "capacity"},
    {"rate 5e-324 (the least double)", F_RATE, 0, 5e-324, NULL, HIRATE_ERANGE,
     "capacity 10 at rate 4.94066e-324 takes over 2^53 us to refill; raise the rate or lower "
     "the capacity"},
    {"timeout_ms 0", F_TIMEOUT, 0, 0, NULL, HIRATE_EOPTION,
     "timeout_ms must be from 1 to 60000, got 0"},
    {"timeout_ms -1", F_TIMEOUT, -1, 0, NULL, HIRATE_EOPTION,
     "timeout_ms must be from 1 to 60000, got -1"},
    {"timeout_ms INT_MAX", F_TIMEOUT, INT_MAX, 0, NULL, HIRATE_EOPTION,
     "timeout_ms must be from 1 to 60000, got 2147483647"},
    {"timeout_ms INT_MIN", F_TIMEOUT, INT_MIN, 0, NULL, HIRATE_EOPTION,
     "timeout_ms must be from 1 to 60000, got -2147483648"},
    {"connect_timeout_ms 0", F_CONNECT_TIMEOUT, 0, 0, NULL, HIRATE_EOPTION,
     "connect_timeout_ms must be from 1 to 60000, got 0"},
    {"connect_timeout_ms INT_MAX", F_CONNECT_TIMEOUT, INT_MAX, 0, NULL, HIRATE_EOPTION,
     "connect_timeout_ms must be from 1 to 60000, got 2147483647"},
    {"pool_size 0", F_POOL, 0, 0, NULL, HIRATE_EOPTION, "pool_size must be from 1 to 1024, got 0"},
    {"pool_size -1", F_POOL, -1, 0, NULL, HIRATE_EOPTION,
     "pool_size must be from 1 to 1024, got -1"},
    {"max_keys 0", F_MAX_KEYS, 0, 0, NULL, HIRATE_EOPTION,
     "max_keys must be from 1 to 4000000000, got 0"},
    {"instances 0", F_INSTANCES, 0, 0, NULL, HIRATE_EOPTION,
     "instances must be from 1 to 100000, got 0"},
    {"instances -1", F_INSTANCES, -1, 0, NULL, HIRATE_EOPTION,
     "instances must be from 1 to 100000, got -1"},
    {"on_error 3", F_ON_ERROR, 3, 0, NULL, HIRATE_EOPTION,
     "on_error must be HIRATE_ON_ERROR_LOCAL, _OPEN or _CLOSED, got 3"},
    {"on_error -1", F_ON_ERROR, -1, 0, NULL, HIRATE_EOPTION,
     "on_error must be HIRATE_ON_ERROR_LOCAL, _OPEN or _CLOSED, got -1"},
    {"deny_cache 2", F_DENY_CACHE, 2, 0, NULL, HIRATE_EOPTION,
     "deny_cache must be from 0 to 1, got 2"},
    {"a prefix of 1 MiB", F_PREFIX, 0, 0, BIG, HIRATE_EOPTION,
     "prefix is 1048576 bytes; the most is 64"},
    {"a prefix with CRLF and braces", F_PREFIX, 0, 0, "{rl}\r\n:", 0, NULL},
    {"an empty URL", F_URL, 0, 0, "", HIRATE_EURL, "invalid Redis URL: it is empty"},
    {"a URL of 1 MiB", F_URL, 0, 0, BIG, HIRATE_EURL, "invalid Redis URL: the host is too long"},
    {"a URL with CRLF in the port", F_URL, 0, 0, "redis://127.0.0.1:63\r\n79", HIRATE_EURL,
     "invalid Redis URL: the port must be a number from 1 to 65535"},
    {"a URL with port 0", F_URL, 0, 0, "redis://127.0.0.1:0", HIRATE_EURL,
     "invalid Redis URL: the port must be a number from 1 to 65535"},
    {"a URL with port 2^53", F_URL, 0, 0, "redis://127.0.0.1:9007199254740992", HIRATE_EURL,
     "invalid Redis URL: the port must be a number from 1 to 65535"},
    {"a URL with a NaN port", F_URL, 0, 0, "redis://127.0.0.1:nan", HIRATE_EURL,
     "invalid Redis URL: the port must be a number from 1 to 65535"},
    {"a URL with a negative database", F_URL, 0, 0, "redis://127.0.0.1/-1", HIRATE_EURL,
     "invalid Redis URL: the database must be a number from 0 up"},
    {"a URL of another scheme", F_URL, 0, 0, "http://127.0.0.1", HIRATE_EURL,
     "invalid Redis URL: it must start with redis://, rediss://, unix://, redis+cluster://, "
     "rediss+cluster://, redis+sentinel:// or rediss+sentinel://"},
    {"no options at all", F_NULL_OPTS, 0, 0, NULL, HIRATE_EINVAL,
     "hirate_limiter_new needs out and opts"},
    {"nowhere to put the limiter", F_NULL_OUT, 0, 0, NULL, HIRATE_EINVAL,
     "hirate_limiter_new needs out and opts"},
};

static void test_options(void)
{
    for (size_t i = 0; i < sizeof opt_cases / sizeof opt_cases[0]; i++) {
        const opt_case *c = &opt_cases[i];
        hirate_options o;
        hirate_options_init(&o);
        o.capacity = 10;
        o.rate = 1;
        char *big = NULL;
        const char *s = c->s;
        if (s == BIG) {
            big = malloc(MIB + 9);
            strcpy(big, c->field == F_URL ? "redis://" : "");
            strcat(big, mib);
            s = big;
        }
        switch (c->field) {
        case F_CAPACITY: o.capacity = c->i; if (c->d) o.rate = c->d; break;
        case F_RATE: o.rate = c->d; break;
        case F_TIMEOUT: o.timeout_ms = (int)c->i; break;
        case F_CONNECT_TIMEOUT: o.connect_timeout_ms = (int)c->i; break;
        case F_POOL: o.pool_size = (int)c->i; break;
        case F_MAX_KEYS: o.max_keys = (size_t)c->i; break;
        case F_INSTANCES: o.instances = (int)c->i; break;
        case F_ON_ERROR: o.on_error = (int)c->i; break;
        case F_DENY_CACHE: o.deny_cache = (int)c->i; break;
        case F_PREFIX: o.prefix = s; break;
        case F_URL: o.url = s; break;
        case F_NULL_OPTS: case F_NULL_OUT: break;
        }
        char why[HIRATE_ERRMSG_SIZE] = "untouched";
        hirate_limiter *lim = (hirate_limiter *)&o;   /* must be set to NULL on failure */
        int rc = c->field == F_NULL_OPTS ? hirate_limiter_new(&lim, NULL, why, sizeof why)
               : c->field == F_NULL_OUT  ? hirate_limiter_new(NULL, &o, why, sizeof why)
                                         : hirate_limiter_new(&lim, &o, why, sizeof why);
        if (rc != c->rc)
            fprintf(stderr, "options, %s:\n", c->what);
        CHECK_EQ_I64(rc, c->rc);
        if (c->rc < 0) {
            if (strcmp(why, c->message) != 0)
                fprintf(stderr, "options, %s:\n", c->what);
            CHECK_EQ_STR(why, c->message);
            if (c->field != F_NULL_OUT)
                CHECK(c->field == F_NULL_OPTS || lim == NULL);
        } else {
            CHECK_EQ_STR(why, "");
            hirate_limiter_free(lim);
        }
        free(big);
    }
}

/* Rates of 1e308 and 2^53 are valid: a drained bucket is full again in a
 * microsecond. Injected times keep the arithmetic exact. */
static void test_extreme_valid_rates(void)
{
    const double rates[] = {1e308, 9007199254740992.0};
    for (size_t i = 0; i < 2; i++) {
        hirate_options o;
        hirate_options_init(&o);
        o.capacity = 5;
        o.rate = rates[i];
        hirate_limiter *lim;
        CHECK_EQ_I64(hirate_limiter_new(&lim, &o, NULL, 0), 0);
        hirate_decision d;
        CHECK_EQ_I64(hirate_decide_at(lim, "k", 1, 5, 1, 1000, &d), 0);
        CHECK(d.allowed && d.remaining == 0);
        CHECK_EQ_I64(hirate_decide_at(lim, "k", 1, 1, 1, 1000, &d), 0);
        CHECK(!d.allowed);
        CHECK_EQ_I64(d.retry_after_us, 1);
        CHECK_EQ_I64(d.reset_after_us, 1);
        CHECK_EQ_I64(hirate_decide_at(lim, "k", 1, 5, 1, 1001, &d), 0);
        CHECK(d.allowed && d.remaining == 0);
        hirate_limiter_free(lim);
    }
}

/* ---- 2. bad calls ------------------------------------------------------------------ */

enum op { ALLOW, PEEK, RESET, MANY };
static const char *op_name[] = {"allow", "peek", "reset", "allow_many"};

/* key == BIG: the 1 MiB key. */
typedef struct call_case {
    const char *what;
    const void *key;
    size_t keylen;
    int64_t cost;
    int rc;
    const char *message;
    int resets;             /* reset refuses it too (the key is bad, not the cost) */
} call_case;

static const call_case call_cases[] = {
    {"a NULL key", NULL, 1, 1, HIRATE_EINVAL, "key is NULL", 1},
    {"an empty key", "", 0, 1, HIRATE_EKEY, "key is empty", 1},
    {"an empty key that points at bytes", "abc", 0, 1, HIRATE_EKEY, "key is empty", 1},
    {"a key of 513 bytes", NULL, 513, 1, HIRATE_EKEY, "key is 513 bytes; the most is 512", 1},
    {"a key of 1 MiB", BIG, MIB, 1, HIRATE_EKEY, "key is 1048576 bytes; the most is 512", 1},
    {"a key length of SIZE_MAX", "k", SIZE_MAX, 1, HIRATE_EKEY,
     "key is 18446744073709551615 bytes; the most is 512", 1},
    {"cost -1", "k", 1, -1, HIRATE_ECOST, "cost must be a whole number from 0 to 2^53-1, got -1",
     0},
    {"cost INT64_MIN", "k", 1, INT64_MIN, HIRATE_ECOST,
     "cost must be a whole number from 0 to 2^53-1, got -9223372036854775808", 0},
    {"cost 2^53", "k", 1, 9007199254740992LL, HIRATE_ECOST,
     "cost must be a whole number from 0 to 2^53-1, got 9007199254740992", 0},
    {"cost INT64_MAX", "k", 1, INT64_MAX, HIRATE_ECOST,
     "cost must be a whole number from 0 to 2^53-1, got 9223372036854775807", 0},
};

static void expect_message(hirate_limiter *lim, const char *want, const char *where)
{
    char got[HIRATE_ERRMSG_SIZE];
    hirate_limiter_errmsg(lim, got, sizeof got);
    if (strcmp(got, want) != 0)
        fprintf(stderr, "%s:\n", where);
    CHECK_EQ_STR(got, want);
}

static void test_bad_calls(hirate_limiter *lim, const char *backend)
{
    static char k513[513];
    memset(k513, 'k', sizeof k513);
    for (size_t i = 0; i < sizeof call_cases / sizeof call_cases[0]; i++) {
        const call_case *c = &call_cases[i];
        const void *key = c->key == BIG ? mib : c->keylen == 513 ? k513 : c->key;
        for (int op = ALLOW; op <= MANY; op++) {
            char where[160];
            snprintf(where, sizeof where, "%s: %s with %s", backend, op_name[op], c->what);
            hirate_decision d;
            int rc;
            if (op == RESET && !c->resets)
                continue;
            if (op == ALLOW) {
                rc = hirate_allow(lim, key, c->keylen, c->cost, &d);
            } else if (op == PEEK) {
                rc = hirate_peek(lim, key, c->keylen, c->cost, &d);
            } else if (op == RESET) {
                rc = hirate_reset(lim, key, c->keylen);
            } else {
                /* The bad item between two good ones: it alone fails. */
                hirate_item items[3] = {{"good", 4, 1, 0, {0}}, {key, c->keylen, c->cost, 0, {0}},
                                        {"good", 4, 1, 0, {0}}};
                CHECK_EQ_I64(hirate_allow_many(lim, items, 3), 0);
                CHECK_EQ_I64(items[0].rc, 0);
                CHECK_EQ_I64(items[2].rc, 0);
                CHECK(items[0].decision.allowed && items[2].decision.allowed);
                rc = items[1].rc;
                CHECK_EQ_I64(hirate_reset(lim, "good", 4), 0);
            }
            if (rc != c->rc)
                fprintf(stderr, "%s:\n", where);
            CHECK_EQ_I64(rc, c->rc);
            expect_message(lim, c->message, where);
            /* Nothing was spent: "k" (the key of the bad costs) is full. */
            CHECK_EQ_I64(hirate_peek(lim, "k", 1, 0, &d), 0);
            CHECK_EQ_I64(d.remaining, 5);
        }
    }

    /* Not errors: a cost of 0 passes and spends nothing; a cost above the
     * capacity never passes, and says so. */
    hirate_decision d;
    CHECK_EQ_I64(hirate_allow(lim, "k", 1, 0, &d), 0);
    CHECK(d.allowed && d.remaining == 5 && d.retry_after_us == 0);
    CHECK_EQ_I64(hirate_allow(lim, "k", 1, HIRATE_EXACT_MAX, &d), 0);
    CHECK(!d.allowed && d.remaining == 5 && d.retry_after_us == HIRATE_NEVER);

    /* The API's own pointers. */
    CHECK_EQ_I64(hirate_allow(NULL, "k", 1, 1, &d), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_peek(NULL, "k", 1, 1, &d), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_reset(NULL, "k", 1), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_allow(lim, "k", 1, 1, NULL), HIRATE_EINVAL);
    expect_message(lim, "the decision pointer is NULL", "allow with no decision");
    CHECK_EQ_I64(hirate_allow_many(lim, NULL, 1), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_allow_many(lim, NULL, 0), 0);
    CHECK_EQ_I64(hirate_allow_many(NULL, NULL, 0), HIRATE_EINVAL);
    char buf[8] = "x";
    CHECK_EQ_STR(hirate_limiter_errmsg(NULL, buf, sizeof buf), "no limi");   /* cut to fit */
    CHECK(hirate_limiter_errmsg(lim, NULL, 10) == NULL);
}

/* ---- 3. valid keys that look dangerous ------------------------------------------------ */

typedef struct odd_key {
    const char *what;
    const char *bytes;
    size_t len;
} odd_key;

static char ff512[512];

static const odd_key odd_keys[] = {
    {"NUL inside", "a\0b", 3},
    {"NUL inside, another byte after it", "a\0c", 3},
    {"the bytes before that NUL", "a", 1},
    {"NUL first", "\0a", 2},
    {"a lone NUL", "\0", 1},
    {"CRLF", "a\r\nb", 4},
    {"a RESP command after CRLF", "x\r\n*1\r\n$8\r\nFLUSHALL\r\n", 22},
    {"a cluster hash tag", "{user1}:a", 9},
    {"the same hash tag, another key", "{user1}:b", 9},
    {"empty braces", "{}", 2},
    {"an unclosed brace", "{a", 2},
    {"printf directives", "%s%n%p%b", 8},
    {"bytes that are not UTF-8", "\xff\xfe\xfd", 3},
    {"a lone UTF-8 continuation byte", "\x80", 1},
    {"an overlong NUL", "\xc0\x80", 2},
    {"512 bytes of 0xff", ff512, 512},
};
#define N_ODD (sizeof odd_keys / sizeof odd_keys[0])

static void test_odd_keys(hirate_limiter *lim, const char *backend, const char *prefix)
{
    hirate_decision d;
    /* Each key spends from a bucket of its own: one token, then the next key. */
    for (size_t i = 0; i < N_ODD; i++) {
        CHECK_EQ_I64(hirate_allow(lim, odd_keys[i].bytes, odd_keys[i].len, 1, &d), 0);
        if (d.remaining != 4)
            fprintf(stderr, "%s: %s\n", backend, odd_keys[i].what);
        CHECK(d.allowed && d.remaining == 4);
    }
    /* No two share a bucket: each still has exactly 4. */
    for (size_t i = 0; i < N_ODD; i++) {
        CHECK_EQ_I64(hirate_peek(lim, odd_keys[i].bytes, odd_keys[i].len, 1, &d), 0);
        if (d.remaining != 4)
            fprintf(stderr, "%s: %s collides\n", backend, odd_keys[i].what);
        CHECK_EQ_I64(d.remaining, 4);
    }
    if (!prefix)
        return;

    /* In Redis: exactly these keys, each stored byte for byte after the
     * prefix, with a TTL; the command after the CRLF never ran. */
    size_t plen = strlen(prefix);
    for (size_t i = 0; i < N_ODD; i++) {
        char full[HIRATE_PREFIX_MAX + HIRATE_KEY_MAX];
        memcpy(full, prefix, plen);
        memcpy(full + plen, odd_keys[i].bytes, odd_keys[i].len);
        redisReply *r = rh_command(&S, "PTTL %b", full, plen + odd_keys[i].len);
        CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer > 0);
        if (!r || r->type != REDIS_REPLY_INTEGER || r->integer <= 0)
            fprintf(stderr, "%s: %s is not stored under its own bytes\n", backend,
                    odd_keys[i].what);
        if (r) freeReplyObject(r);
    }
    redisReply *r = rh_command(&S, "DBSIZE");
    CHECK(r && r->type == REDIS_REPLY_INTEGER);
    if (r) {
        CHECK_EQ_I64(r->integer, (int64_t)N_ODD);
        freeReplyObject(r);
    }
    /* A reset finds the very same bytes. */
    CHECK_EQ_I64(hirate_reset(lim, "a\0b", 3), 0);
    r = rh_command(&S, "EXISTS %b", "{rl}\r\n:a\0b", (size_t)10);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 0);
    if (r) freeReplyObject(r);
    r = rh_command(&S, "EXISTS %b", "{rl}\r\n:a\0c", (size_t)10);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    if (r) freeReplyObject(r);
}

static hirate_limiter *make(const char *url, const char *prefix)
{
    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.prefix = prefix;
    o.capacity = 5;
    o.rate = 0.001;   /* nothing refills while the test runs */
    o.timeout_ms = 5000;
    o.connect_timeout_ms = 5000;
    o.on_error = HIRATE_ON_ERROR_CLOSED;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE];
    if (hirate_limiter_new(&lim, &o, why, sizeof why) < 0)
        fprintf(stderr, "hirate_limiter_new: %s\n", why);
    return lim;
}

int main(void)
{
    mib = malloc(MIB + 1);
    memset(mib, 'k', MIB);
    mib[MIB] = '\0';
    memset(ff512, 0xff, sizeof ff512);

    test_options();
    test_extreme_valid_rates();

    hirate_limiter *mem = make(NULL, NULL);
    CHECK(mem != NULL);
    if (mem) {
        test_bad_calls(mem, "memory");
        test_odd_keys(mem, "memory", NULL);
        hirate_limiter_free(mem);
    }

    if (rh_start(&S) < 0) {
        CHECK(!"redis-server started");
        return check_summary("badinput");
    }
    rh_watchdog(&S, "badinput", 120);
    hirate_limiter *red = make(S.url, "{rl}\r\n:");
    CHECK(red != NULL);
    if (red) {
        test_bad_calls(red, "redis");
        redisReply *r = rh_command(&S, "FLUSHALL");
        if (r) freeReplyObject(r);
        test_odd_keys(red, "redis", "{rl}\r\n:");
        hirate_decision d;
        /* Every one of those decisions came from Redis itself. */
        CHECK_EQ_I64(hirate_peek(red, "{}", 2, 1, &d), 0);
        CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
        CHECK_EQ_I64(d.error, 0);
        hirate_limiter_free(red);
    }
    rh_stop(&S);
    free(mib);
    return check_summary("badinput");
}
