/*
 * The public API's validation: which options hirate_limiter_new refuses,
 * with which code and a message naming the option (never the password);
 * which calls are refused and what hirate_limiter_errmsg says then; and that
 * the embedded script is lua/token_bucket.lua byte for byte with the right
 * SHA1.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "hirate.h"
#include "hirate_io.h"

#define CANARY "s3cr3t-canary"
#define EXACT HIRATE_EXACT_MAX

/* ---- options ---------------------------------------------------------------------- */

typedef enum field {
    F_NONE, F_CAPACITY, F_RATE, F_CAP_AND_RATE, F_CONNECT_TIMEOUT, F_TIMEOUT, F_POOL,
    F_MAX_KEYS, F_PREFIX, F_URL
} field;

typedef struct option_case {
    const char *rule;
    field f;
    int64_t i;          /* capacity, timeouts, pool_size, max_keys */
    double rate;
    const char *s;      /* prefix or url */
    int rc;
    const char *mention;   /* a word the message must contain */
} option_case;

static char prefix64[HIRATE_PREFIX_MAX + 1], prefix65[HIRATE_PREFIX_MAX + 2];

static const option_case option_cases[] = {
    {"the defaults with capacity and rate are fine", F_NONE, 0, 0, NULL, 0, NULL},
    {"capacity 0", F_CAPACITY, 0, 0, NULL, HIRATE_ECAPACITY, "capacity"},
    {"capacity -1", F_CAPACITY, -1, 0, NULL, HIRATE_ECAPACITY, "capacity"},
    {"capacity 2^53", F_CAPACITY, EXACT + 1, 0, NULL, HIRATE_ECAPACITY, "capacity"},
    {"capacity 2^53-1 needs a fast rate: at 1e9/s it is fine", F_CAP_AND_RATE, EXACT, 1e9, NULL, 0,
     NULL},
    {"rate 0", F_RATE, 0, 0, NULL, HIRATE_ERATE, "rate"},
    {"rate -1", F_RATE, 0, -1, NULL, HIRATE_ERATE, "rate"},
    {"rate NaN", F_RATE, 0, NAN, NULL, HIRATE_ERATE, "rate"},
    {"rate +inf", F_RATE, 0, INFINITY, NULL, HIRATE_ERATE, "rate"},
    {"rate -inf", F_RATE, 0, -INFINITY, NULL, HIRATE_ERATE, "rate"},
    {"a bucket that takes over 2^53 us to refill", F_CAP_AND_RATE, 1000000000, 0.1, NULL,
     HIRATE_ERANGE, "2^53"},
    {"connect_timeout_ms 0", F_CONNECT_TIMEOUT, 0, 0, NULL, HIRATE_EOPTION, "connect_timeout_ms"},
    {"connect_timeout_ms -1", F_CONNECT_TIMEOUT, -1, 0, NULL, HIRATE_EOPTION, "connect_timeout_ms"},
    {"connect_timeout_ms 60001", F_CONNECT_TIMEOUT, 60001, 0, NULL, HIRATE_EOPTION,
     "connect_timeout_ms"},
    {"connect_timeout_ms 1", F_CONNECT_TIMEOUT, 1, 0, NULL, 0, NULL},
    {"connect_timeout_ms 60000", F_CONNECT_TIMEOUT, 60000, 0, NULL, 0, NULL},
    {"timeout_ms 0", F_TIMEOUT, 0, 0, NULL, HIRATE_EOPTION, "timeout_ms"},
    {"timeout_ms 60001", F_TIMEOUT, 60001, 0, NULL, HIRATE_EOPTION, "timeout_ms"},
    {"timeout_ms 60000", F_TIMEOUT, 60000, 0, NULL, 0, NULL},
    {"pool_size 0", F_POOL, 0, 0, NULL, HIRATE_EOPTION, "pool_size"},
    {"pool_size 1025", F_POOL, 1025, 0, NULL, HIRATE_EOPTION, "pool_size"},
    {"pool_size 1", F_POOL, 1, 0, NULL, 0, NULL},
    {"pool_size 1024", F_POOL, 1024, 0, NULL, 0, NULL},
    {"max_keys 0", F_MAX_KEYS, 0, 0, NULL, HIRATE_EOPTION, "max_keys"},
    {"max_keys past four billion", F_MAX_KEYS, 4000000001LL, 0, NULL, HIRATE_EOPTION, "max_keys"},
    {"max_keys SIZE_MAX", F_MAX_KEYS, -1 /* SIZE_MAX */, 0, NULL, HIRATE_EOPTION, "max_keys"},
    {"max_keys 1", F_MAX_KEYS, 1, 0, NULL, 0, NULL},
    {"a prefix of 65 bytes", F_PREFIX, 0, 0, prefix65, HIRATE_EOPTION, "prefix"},
    {"a prefix of 64 bytes", F_PREFIX, 0, 0, prefix64, 0, NULL},
    {"an empty prefix", F_PREFIX, 0, 0, "", 0, NULL},
    {"no prefix at all", F_PREFIX, 0, 0, NULL, 0, NULL},
    {"a URL that is not one", F_URL, 0, 0, "localhost:6379", HIRATE_EURL, "URL"},
    {"an empty URL", F_URL, 0, 0, "", HIRATE_EURL, "URL"},
    {"http is not Redis", F_URL, 0, 0, "http://h:6379", HIRATE_EURL, "URL"},
    {"a URL without a host", F_URL, 0, 0, "redis://", HIRATE_EURL, "host"},
    {"rediss:// keeps the rules of redis://", F_URL, 0, 0, "rediss://h:99999", HIRATE_EURL,
     "port"},
    {"a port past 65535", F_URL, 0, 0, "redis://h:99999", HIRATE_EURL, "port"},
    {"a valid URL is accepted without connecting", F_URL, 0, 0, "redis://127.0.0.1:1", 0, NULL},
    {"a unix socket URL is accepted without connecting", F_URL, 0, 0, "unix:///nonexistent/r.sock",
     0, NULL},
};

static hirate_options options_for(const option_case *c)
{
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = 10;
    o.rate = 1;
    switch (c->f) {
    case F_NONE: break;
    case F_CAPACITY: o.capacity = c->i; break;
    case F_RATE: o.rate = c->rate; break;
    case F_CAP_AND_RATE: o.capacity = c->i; o.rate = c->rate; break;
    case F_CONNECT_TIMEOUT: o.connect_timeout_ms = (int)c->i; break;
    case F_TIMEOUT: o.timeout_ms = (int)c->i; break;
    case F_POOL: o.pool_size = (int)c->i; break;
    case F_MAX_KEYS: o.max_keys = c->i < 0 ? SIZE_MAX : (size_t)c->i; break;
    case F_PREFIX: o.prefix = c->s; break;
    case F_URL: o.url = c->s; break;
    }
    return o;
}

static void options_are_checked_one_by_one(void)
{
    for (size_t i = 0; i < sizeof option_cases / sizeof option_cases[0]; i++) {
        const option_case *c = &option_cases[i];
        hirate_options o = options_for(c);
        hirate_limiter *lim = (hirate_limiter *)&o;   /* not NULL: it must be cleared */
        char err[HIRATE_ERRMSG_SIZE];
        memset(err, 'x', sizeof err);
        int rc = hirate_limiter_new(&lim, &o, err, sizeof err);
        if (rc != c->rc)
            fprintf(stderr, "case: %s: %d %s\n", c->rule, rc, err);
        CHECK_EQ_I64(rc, c->rc);
        CHECK(memchr(err, '\0', sizeof err) != NULL);
        if (c->rc == 0) {
            CHECK(lim != NULL && lim != (hirate_limiter *)&o);
            CHECK_EQ_STR(err, "");
            hirate_limiter_free(lim);
        } else {
            CHECK(lim == NULL);
            if (!strstr(err, c->mention))
                fprintf(stderr, "case: %s: \"%s\" does not say \"%s\"\n", c->rule, err, c->mention);
            CHECK(strstr(err, c->mention) != NULL);
            /* the same without a message buffer */
            lim = (hirate_limiter *)&o;
            CHECK_EQ_I64(hirate_limiter_new(&lim, &o, NULL, 0), c->rc);
            CHECK(lim == NULL);
        }
    }
}

static void the_defaults_are_documented_ones(void)
{
    hirate_options o;
    memset(&o, 0x5A, sizeof o);
    hirate_options_init(&o);
    CHECK(o.url == NULL);
    CHECK_EQ_I64(o.capacity, 0);
    CHECK(o.rate == 0);
    CHECK_EQ_STR(o.prefix, "rl:");
    CHECK_EQ_I64(o.connect_timeout_ms, 250);
    CHECK_EQ_I64(o.timeout_ms, 100);
    CHECK_EQ_I64(o.pool_size, 16);
    CHECK_EQ_I64(o.max_keys, 1000000);
    /* capacity and rate must be set */
    hirate_limiter *lim;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, NULL, 0), HIRATE_ECAPACITY);
    o.capacity = 1;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, NULL, 0), HIRATE_ERATE);
}

/* hirate_options_set_on_error: the names, and one message for any other,
 * the name shown escaped (the words of Python, Lua and the tool). */
static void on_error_is_set_by_name(void)
{
    static const struct { const char *name; int rc, policy; const char *msg; } cases[] = {
        {"local", 0, HIRATE_ON_ERROR_LOCAL, ""},
        {"open", 0, HIRATE_ON_ERROR_OPEN, ""},
        {"closed", 0, HIRATE_ON_ERROR_CLOSED, ""},
        {"sometimes", HIRATE_EOPTION, HIRATE_ON_ERROR_OPEN,
         "on_error must be \"local\", \"open\" or \"closed\", got \"sometimes\""},
        {"Open", HIRATE_EOPTION, HIRATE_ON_ERROR_OPEN,
         "on_error must be \"local\", \"open\" or \"closed\", got \"Open\""},
        {"a\"b\r\n", HIRATE_EOPTION, HIRATE_ON_ERROR_OPEN,
         "on_error must be \"local\", \"open\" or \"closed\", got \"a\\\"b\\x0d\\x0a\""},
        {"", HIRATE_EOPTION, HIRATE_ON_ERROR_OPEN,
         "on_error must be \"local\", \"open\" or \"closed\", got \"\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hirate_options o;
        hirate_options_init(&o);
        o.on_error = HIRATE_ON_ERROR_OPEN;
        char err[HIRATE_ERRMSG_SIZE] = "x";
        CHECK_EQ_I64(hirate_options_set_on_error(&o, cases[i].name, err, sizeof err),
                     cases[i].rc);
        if (cases[i].rc < 0)
            CHECK_EQ_STR(err, cases[i].msg);
        CHECK_EQ_I64(o.on_error, cases[i].policy);   /* a refused name changes nothing */
    }
    hirate_options o;
    hirate_options_init(&o);
    char err[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_options_set_on_error(NULL, "local", err, sizeof err), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_options_set_on_error(&o, NULL, err, sizeof err), HIRATE_EINVAL);
    CHECK_EQ_I64(o.on_error, HIRATE_ON_ERROR_LOCAL);
}

/* hirate_options_set_max_keys takes what a host's integer holds, negative
 * or past size_t's range, and words it as hirate_limiter_new does. */
static void max_keys_is_set_with_the_range_of_new(void)
{
    static const struct { long long n; int rc; const char *msg; size_t keys; } cases[] = {
        {1, 0, "", 1},
        {4000000000LL, 0, "", 4000000000u},
        {0, HIRATE_EOPTION, "max_keys must be from 1 to 4000000000, got 0", 1000000},
        {-1, HIRATE_EOPTION, "max_keys must be from 1 to 4000000000, got -1", 1000000},
        {4000000001LL, HIRATE_EOPTION, "max_keys must be from 1 to 4000000000, got 4000000001",
         1000000},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hirate_options o;
        hirate_options_init(&o);
        char err[HIRATE_ERRMSG_SIZE] = "";
        CHECK_EQ_I64(hirate_options_set_max_keys(&o, cases[i].n, err, sizeof err), cases[i].rc);
        CHECK_EQ_STR(err, cases[i].msg);
        CHECK_EQ_I64(o.max_keys, cases[i].keys);
    }
    /* new says the same of the C field, past the range as one more than its top. */
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = 1;
    o.rate = 1;
    o.max_keys = SIZE_MAX;
    hirate_limiter *lim;
    char err[HIRATE_ERRMSG_SIZE] = "";
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, err, sizeof err), HIRATE_EOPTION);
    CHECK_EQ_STR(err, "max_keys must be from 1 to 4000000000, got 4000000001");
    CHECK_EQ_I64(hirate_options_set_max_keys(NULL, 1, err, sizeof err), HIRATE_EINVAL);
}

static void null_arguments_to_new_are_einval(void)
{
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = 10;
    o.rate = 1;
    hirate_limiter *lim = (hirate_limiter *)&o;
    char err[HIRATE_ERRMSG_SIZE] = "";
    CHECK_EQ_I64(hirate_limiter_new(NULL, &o, err, sizeof err), HIRATE_EINVAL);
    CHECK(strlen(err) > 0);
    err[0] = '\0';
    CHECK_EQ_I64(hirate_limiter_new(&lim, NULL, err, sizeof err), HIRATE_EINVAL);
    CHECK(strlen(err) > 0);
    CHECK_EQ_I64(hirate_limiter_new(NULL, NULL, NULL, 0), HIRATE_EINVAL);
}

static void a_short_message_buffer_is_cut_and_terminated(void)
{
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = 0;
    o.rate = 1;
    hirate_limiter *lim;
    char err[9];
    memset(err, 'x', sizeof err);
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, err, 8), HIRATE_ECAPACITY);
    CHECK_EQ_STR(err, "capacit");
    CHECK_EQ_I64(err[8], 'x');
}

/* The password is never part of a message: not when the URL is refused, not
 * when a connection to it fails. */
static const char *const canary_urls[] = {
    "redis://u:" CANARY "@host:99999",
    "redis://u:" CANARY "@",
    "redis://u:" CANARY "@[::1",
    "redis://:" CANARY "@h/notadb",
    "redis://u:" CANARY "%zz@h",
    "redis://u:" CANARY "@h?x=1",
    "unix://u:" CANARY "@relative/path",
    "unix://u:" CANARY "@/tmp/r.sock?db=x",
};

static void the_password_never_appears_in_a_message(void)
{
    for (size_t i = 0; i < sizeof canary_urls / sizeof canary_urls[0]; i++) {
        hirate_options o;
        hirate_options_init(&o);
        o.capacity = 10;
        o.rate = 1;
        o.url = canary_urls[i];
        hirate_limiter *lim;
        char err[HIRATE_ERRMSG_SIZE] = "";
        CHECK_EQ_I64(hirate_limiter_new(&lim, &o, err, sizeof err), HIRATE_EURL);
        if (strstr(err, "s3cr3t"))
            fprintf(stderr, "%s gave \"%s\"\n", canary_urls[i], err);
        CHECK(strstr(err, "s3cr3t") == NULL);
        CHECK(strlen(err) > 0);
    }

    /* a good URL whose server is not there (port 1 refuses at once): the
     * local policy decides, and the failure is named */
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = 10;
    o.rate = 1;
    o.url = "redis://u:" CANARY "@127.0.0.1:1";
    hirate_limiter *lim;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, NULL, 0), 0);
    hirate_decision d;
    int rc = hirate_allow(lim, "k", 1, 1, &d);
    CHECK_EQ_I64(rc, 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_LOCAL);
    CHECK_EQ_I64(d.error, HIRATE_ECONNECT);
    char msg[HIRATE_ERRMSG_SIZE];
    hirate_limiter_errmsg(lim, msg, sizeof msg);
    CHECK(strstr(msg, "s3cr3t") == NULL);
    CHECK(strstr(msg, "127.0.0.1") != NULL);
    hirate_limiter_free(lim);
}

/* ---- calls ------------------------------------------------------------------------------ */

static char key512[512], key513[513];

typedef enum call_kind { ALLOW, PEEK, RESET, DECIDE_AT } call_kind;

typedef struct call_case {
    const char *rule;
    const void *key;
    size_t keylen;
    int64_t cost;
    int64_t now;          /* DECIDE_AT only */
    int null_out;
    int rc;
    const char *mention;  /* for errors: a word hirate_limiter_errmsg must contain */
} call_case;

static const call_case call_cases[] = {
    {"a good call", "alice", 5, 1, 0, 0, 0, NULL},
    {"an empty key", "alice", 0, 1, 0, 0, HIRATE_EKEY, "key"},
    {"a key of 513 bytes", key513, 513, 1, 0, 0, HIRATE_EKEY, "key"},
    {"a key of 512 bytes is fine", key512, 512, 1, 0, 0, 0, NULL},
    {"a one-byte key is fine", "a", 1, 1, 0, 0, 0, NULL},
    {"a key of one NUL byte is fine", "\0", 1, 1, 0, 0, 0, NULL},
    {"a NULL key with a length", NULL, 5, 1, 0, 0, HIRATE_EINVAL, "key"},
    {"a NULL key without a length is empty", NULL, 0, 1, 0, 0, HIRATE_EKEY, "key"},
    {"cost -1", "alice", 5, -1, 0, 0, HIRATE_ECOST, "cost"},
    {"cost INT64_MIN", "alice", 5, INT64_MIN, 0, 0, HIRATE_ECOST, "cost"},
    {"cost 2^53", "alice", 5, EXACT + 1, 0, 0, HIRATE_ECOST, "cost"},
    {"cost INT64_MAX", "alice", 5, INT64_MAX, 0, 0, HIRATE_ECOST, "cost"},
    {"cost 2^53-1 is valid (and never passes)", "alice", 5, EXACT, 0, 0, 0, NULL},
    {"cost 0 is valid", "alice", 5, 0, 0, 0, 0, NULL},
    {"no place for the decision", "alice", 5, 1, 0, 1, HIRATE_EINVAL, "decision"},
    {"a negative injected time", "alice", 5, 1, -1, 0, HIRATE_EINVAL, "time"},
};

static int run(hirate_limiter *lim, call_kind kind, const call_case *c, hirate_decision *d)
{
    hirate_decision *out = c->null_out ? NULL : d;
    switch (kind) {
    case ALLOW: return hirate_allow(lim, c->key, c->keylen, c->cost, out);
    case PEEK: return hirate_peek(lim, c->key, c->keylen, c->cost, out);
    case RESET: return hirate_reset(lim, c->key, c->keylen);
    case DECIDE_AT: return hirate_decide_at(lim, c->key, c->keylen, c->cost, 1, c->now, out);
    }
    return 1;
}

static void calls_are_checked_one_by_one(void)
{
    static const char *const kinds[] = {"allow", "peek", "reset", "decide_at"};
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = 10;
    o.rate = 1;
    hirate_limiter *lim;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, NULL, 0), 0);
    for (int kind = ALLOW; kind <= DECIDE_AT; kind++) {
        for (size_t i = 0; i < sizeof call_cases / sizeof call_cases[0]; i++) {
            const call_case *c = &call_cases[i];
            /* reset has no cost, no decision and no time */
            if (kind == RESET && (c->cost != 1 || c->null_out || c->now != 0))
                continue;
            if (kind != DECIDE_AT && c->now != 0)
                continue;
            /* a message left by an earlier call must not pass for this one's:
             * leave one that does not contain the word this case looks for */
            int cost_case = c->mention && strcmp(c->mention, "cost") == 0;
            const char *before = cost_case ? "key is empty" : "cost must be a whole number from 0 "
                                                              "to 2^53-1, got -1";
            hirate_decision scratch;
            CHECK_EQ_I64(hirate_allow(lim, "x", cost_case ? 0 : 1, cost_case ? 1 : -1, &scratch),
                         cost_case ? HIRATE_EKEY : HIRATE_ECOST);
            hirate_decision d;
            int rc = run(lim, (call_kind)kind, c, &d);
            char msg[HIRATE_ERRMSG_SIZE];
            hirate_limiter_errmsg(lim, msg, sizeof msg);
            if (rc != c->rc)
                fprintf(stderr, "case: %s: %s gave %d (%s)\n", c->rule, kinds[kind], rc, msg);
            CHECK_EQ_I64(rc, c->rc);
            if (c->rc != 0) {
                if (!strstr(msg, c->mention))
                    fprintf(stderr, "case: %s: %s: \"%s\" does not say \"%s\"\n", c->rule,
                            kinds[kind], msg, c->mention);
                CHECK(strstr(msg, c->mention) != NULL);
            } else {
                CHECK_EQ_STR(msg, before);   /* a success leaves the last error as it was */
            }
        }
    }
    hirate_limiter_free(lim);
}

static void a_refused_call_leaves_the_bucket_alone(void)
{
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = 10;
    o.rate = 1;
    hirate_limiter *lim;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, NULL, 0), 0);
    hirate_decision d;
    CHECK_EQ_I64(hirate_decide_at(lim, "alice", 5, -1, 1, 0, &d), HIRATE_ECOST);
    CHECK_EQ_I64(hirate_decide_at(lim, "alice", 5, 1, 1, 0, NULL), HIRATE_EINVAL);
    hirate_counters st;
    hirate_counters_get(lim, &st);
    CHECK_EQ_I64(st.memory_keys, 0);
    CHECK_EQ_I64(hirate_decide_at(lim, "alice", 5, 0, 0, 0, &d), 0);
    CHECK_EQ_I64(d.remaining, 10);
    hirate_limiter_free(lim);
}

static void a_null_limiter_is_einval(void)
{
    hirate_decision d;
    CHECK_EQ_I64(hirate_allow(NULL, "k", 1, 1, &d), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_peek(NULL, "k", 1, 1, &d), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_reset(NULL, "k", 1), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_decide_at(NULL, "k", 1, 1, 1, 0, &d), HIRATE_EINVAL);
    char msg[32];
    CHECK_EQ_STR(hirate_limiter_errmsg(NULL, msg, sizeof msg), "no limiter");
    hirate_limiter_free(NULL);   /* ignored */
}

static void errmsg_fits_the_buffer_it_is_given(void)
{
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = 10;
    o.rate = 1;
    hirate_limiter *lim;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, NULL, 0), 0);
    char msg[16];
    CHECK_EQ_STR(hirate_limiter_errmsg(lim, msg, sizeof msg), "");   /* no error yet */
    hirate_decision d;
    CHECK_EQ_I64(hirate_allow(lim, "", 0, 1, &d), HIRATE_EKEY);
    CHECK_EQ_STR(hirate_limiter_errmsg(lim, msg, sizeof msg), "key is empty");
    memset(msg, 'x', sizeof msg);
    CHECK(hirate_limiter_errmsg(lim, msg, 4) == msg);
    CHECK_EQ_STR(msg, "key");
    CHECK_EQ_I64(msg[4], 'x');
    CHECK(hirate_limiter_errmsg(lim, NULL, 0) == NULL);
    hirate_limiter_free(lim);
}

/* ---- the script and its SHA1 ------------------------------------------------------------- */

/* SHA-1 (FIPS 180-4), small and slow, enough to check a few kilobytes. */
typedef struct sha1 {
    uint32_t h[5];
    unsigned char block[64];
    size_t used;
    uint64_t bytes;
} sha1;

static uint32_t rol(uint32_t x, int n)
{
    return (x << n) | (x >> (32 - n));
}

static void sha1_block(sha1 *s, const unsigned char *p)
{
    uint32_t w[80], a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 80; i++)
        w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    for (int i = 0; i < 80; i++) {
        uint32_t f, k;
        if (i < 20) { f = (b & c) | (~b & d); k = 0x5A827999; }
        else if (i < 40) { f = b ^ c ^ d; k = 0x6ED9EBA1; }
        else if (i < 60) { f = (b & c) | (b & d) | (c & d); k = 0x8F1BBCDC; }
        else { f = b ^ c ^ d; k = 0xCA62C1D6; }
        uint32_t t = rol(a, 5) + f + e + k + w[i];
        e = d; d = c; c = rol(b, 30); b = a; a = t;
    }
    s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d; s->h[4] += e;
}

static void sha1_init(sha1 *s)
{
    static const uint32_t h0[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
    memcpy(s->h, h0, sizeof h0);
    s->used = 0;
    s->bytes = 0;
}

static void sha1_update(sha1 *s, const void *data, size_t n)
{
    const unsigned char *p = data;
    s->bytes += n;
    while (n--) {
        s->block[s->used++] = *p++;
        if (s->used == 64) {
            sha1_block(s, s->block);
            s->used = 0;
        }
    }
}

static void sha1_hex(sha1 *s, char out[41])
{
    uint64_t bits = s->bytes * 8;
    unsigned char pad = 0x80, zero = 0, len[8];
    sha1_update(s, &pad, 1);
    while (s->used != 56)
        sha1_update(s, &zero, 1);
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(bits >> (56 - 8 * i));
    sha1_update(s, len, 8);
    for (int i = 0; i < 5; i++)
        snprintf(out + 8 * i, 9, "%08x", s->h[i]);
}

static void sha1_of(const void *data, size_t n, char out[41])
{
    sha1 s;
    sha1_init(&s);
    sha1_update(&s, data, n);
    sha1_hex(&s, out);
}

static void the_test_sha1_is_sha1(void)
{
    char hex[41];
    sha1_of("", 0, hex);
    CHECK_EQ_STR(hex, "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    sha1_of("abc", 3, hex);
    CHECK_EQ_STR(hex, "a9993e364706816aba3e25717850c26c9cd0d89d");
    sha1_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56, hex);
    CHECK_EQ_STR(hex, "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
    char a[1000];   /* a million times 'a', fed in pieces */
    memset(a, 'a', sizeof a);
    sha1 s;
    sha1_init(&s);
    for (int i = 0; i < 1000; i++)
        sha1_update(&s, a, sizeof a);
    sha1_hex(&s, hex);
    CHECK_EQ_STR(hex, "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
}

static void the_script_sha1_is_40_lowercase_hex_of_the_script(void)
{
    const char *sha = hirate_script_sha1();
    CHECK_EQ_I64(strlen(sha), 40);
    CHECK_EQ_I64(strspn(sha, "0123456789abcdef"), 40);
    size_t len = 0;
    const char *src = hirate_script_source(&len);
    char hex[41];
    sha1_of(src, len, hex);
    CHECK_EQ_STR(sha, hex);
}

static void the_script_is_the_file_byte_for_byte(void)
{
    const char *dir = getenv("HIRATE_SOURCE_DIR");
    CHECK(dir != NULL);
    if (!dir)
        return;
    char path[4096];
    snprintf(path, sizeof path, "%s/lua/token_bucket.lua", dir);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f)
        return;
    static char file[1 << 16];
    size_t n = fread(file, 1, sizeof file, f);
    CHECK(feof(f));
    fclose(f);

    size_t len = 0;
    const char *src = hirate_script_source(&len);
    CHECK_EQ_I64(len, n);
    CHECK(len == n && memcmp(src, file, n) == 0);
    CHECK(n > 1000);
    /* a C string as well, and the length is optional */
    CHECK_EQ_I64(strlen(src), len);
    CHECK(hirate_script_source(NULL) == src);
}

/* The options carry the size the program was built with (docs/c.md, "ABI and
 * SOVERSION"): an older program's shorter struct is written no further than
 * its size, a newer one's is refused only when it sets a field this library
 * lacks, and options that hirate_options_init did not fill are refused. */
static void options_carry_their_size(void)
{
    hirate_options o;
    hirate_options_init(&o);
    CHECK_EQ_I64(o.size, sizeof o);

    unsigned char room[sizeof o + 16];
    memset(room, 0x5A, sizeof room);
    hirate_options_init_size((hirate_options *)(void *)room, offsetof(hirate_options, log));
    CHECK_EQ_I64(((hirate_options *)(void *)room)->size, offsetof(hirate_options, log));
    CHECK_EQ_I64(room[offsetof(hirate_options, log)], 0x5A);   /* nothing past its size */

    char why[HIRATE_ERRMSG_SIZE];
    hirate_limiter *lim = NULL;
    memset(&o, 0, sizeof o);
    o.capacity = 1;
    o.rate = 1;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "options: size is 0, not one that hirate_options_init sets "
                      "(call it before setting any field)");

    /* A newer program's struct: 16 more bytes, zero (unused), then one set. */
    struct { hirate_options o; unsigned char more[16]; } big;
    memset(&big, 0x5A, sizeof big);
    hirate_options_init_size(&big.o, sizeof big);
    CHECK_EQ_I64(big.o.size, sizeof big);
    CHECK_EQ_I64(big.more[15], 0);
    big.o.capacity = 2;
    big.o.rate = 1;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &big.o, why, sizeof why), 0);
    hirate_decision d;
    CHECK_EQ_I64(hirate_allow(lim, "k", 1, 1, &d), 0);
    CHECK_EQ_I64(d.remaining, 1);
    hirate_limiter_free(lim);
    big.more[3] = 1;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &big.o, why, sizeof why), HIRATE_EOPTION);
    char want[HIRATE_ERRMSG_SIZE];
    snprintf(want, sizeof want, "options: byte %zu is set, a field this library (hirate %s, "
             "options of %zu bytes) does not know", sizeof o + 3, HIRATE_VERSION_STRING, sizeof o);
    CHECK_EQ_STR(why, want);
}

int main(void)
{
    memset(prefix64, 'p', HIRATE_PREFIX_MAX);
    memset(prefix65, 'p', HIRATE_PREFIX_MAX + 1);
    memset(key512, 'k', sizeof key512);
    memset(key513, 'k', sizeof key513);

    options_are_checked_one_by_one();
    the_defaults_are_documented_ones();
    options_carry_their_size();
    max_keys_is_set_with_the_range_of_new();
    on_error_is_set_by_name();
    null_arguments_to_new_are_einval();
    a_short_message_buffer_is_cut_and_terminated();
    the_password_never_appears_in_a_message();

    calls_are_checked_one_by_one();
    a_refused_call_leaves_the_bucket_alone();
    a_null_limiter_is_einval();
    errmsg_fits_the_buffer_it_is_given();

    the_test_sha1_is_sha1();
    the_script_sha1_is_40_lowercase_hex_of_the_script();
    the_script_is_the_file_byte_for_byte();
    return check_summary("test_limiter");
}
