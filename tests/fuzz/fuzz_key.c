/*
 * Keys, prefixes and costs: what hirate_allow(), hirate_peek() and
 * hirate_reset() accept on a memory limiter, and what hirate_op_start()
 * accepts and builds on a limiter with a URL (no connection is made: the op
 * API only builds the request).
 *
 * Input: flags, a prefix length and prefix bytes, a cost, then the key (the
 * rest of the input, so empty, ordinary and over-long keys all occur). The
 * rules come from hirate.h: a key is 1..HIRATE_KEY_MAX bytes of anything
 * (NUL included), a prefix at most HIRATE_PREFIX_MAX bytes, a cost 0..2^53-1;
 * each refusal has its own code and a message that names the problem. A key
 * that is accepted reaches Redis as exactly prefix + key, byte for byte.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "hirate_io.h"

#define CAPACITY 100

/* The code the documented rules give, in the documented order. */
static int expected_rc(const void *key, size_t keylen, int64_t cost)
{
    if (keylen == 0 || keylen > HIRATE_KEY_MAX)
        return HIRATE_EKEY;
    if (!key)
        return HIRATE_EINVAL;
    if (cost < 0 || cost > HIRATE_EXACT_MAX)
        return HIRATE_ECOST;
    return 0;
}

/* The message of a refusal names what was wrong. */
static void check_message(hirate_limiter *lim, int rc, size_t keylen, int64_t cost)
{
    char msg[HIRATE_ERRMSG_SIZE], want[HIRATE_ERRMSG_SIZE];
    hirate_limiter_errmsg(lim, msg, sizeof msg);
    if (rc == HIRATE_EKEY && keylen == 0)
        snprintf(want, sizeof want, "key is empty");
    else if (rc == HIRATE_EKEY)
        snprintf(want, sizeof want, "key is %zu bytes; the most is %d", keylen, HIRATE_KEY_MAX);
    else if (rc == HIRATE_EINVAL)
        snprintf(want, sizeof want, "key is NULL");
    else
        snprintf(want, sizeof want, "cost must be a whole number from 0 to 2^53-1, got %" PRId64,
                 cost);
    if (strcmp(msg, want) != 0) {
        fprintf(stderr, "message \"%s\", want \"%s\"\n", msg, want);
        FUZZ_CHECK(!"the message names the problem");
    }
}

static hirate_limiter *make(const char *url, const char *prefix, int *rc)
{
    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.prefix = prefix;
    o.capacity = CAPACITY;
    o.rate = 1;
    o.max_keys = 64;
    o.deny_cache_keys = 64;
    o.on_error = HIRATE_ON_ERROR_CLOSED;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE] = "";
    *rc = hirate_limiter_new(&lim, &o, why, sizeof why);
    size_t plen = strlen(prefix);
    if (plen > HIRATE_PREFIX_MAX) {
        char want[HIRATE_ERRMSG_SIZE];
        snprintf(want, sizeof want, "prefix is %zu bytes; the most is %d", plen,
                 HIRATE_PREFIX_MAX);
        FUZZ_CHECK_EQ(*rc, HIRATE_EOPTION);
        FUZZ_CHECK(lim == NULL && strcmp(why, want) == 0);
    } else {
        FUZZ_CHECK_EQ(*rc, 0);
    }
    return lim;
}

/* On a memory limiter: allow (or peek), then reset. */
static void in_memory(const char *prefix, const void *key, size_t keylen, int64_t cost, int peek)
{
    int rc;
    hirate_limiter *lim = make(NULL, prefix, &rc);
    if (!lim)
        return;
    int want = expected_rc(key, keylen, cost);
    hirate_decision d;
    rc = peek ? hirate_peek(lim, key, keylen, cost, &d) : hirate_allow(lim, key, keylen, cost, &d);
    FUZZ_CHECK_EQ(rc, want);
    if (rc < 0) {
        check_message(lim, rc, keylen, cost);
    } else {
        /* A key nobody used has a full bucket. */
        int fits = cost <= CAPACITY;
        FUZZ_CHECK_EQ(d.source, HIRATE_SOURCE_LOCAL);
        FUZZ_CHECK_EQ(d.allowed, fits);
        FUZZ_CHECK_EQ(d.limit, CAPACITY);
        FUZZ_CHECK_EQ(d.remaining, fits && !peek ? CAPACITY - cost : CAPACITY);
        FUZZ_CHECK_EQ(d.retry_after_us, fits ? 0 : HIRATE_NEVER);
        hirate_counters st;
        hirate_counters_get(lim, &st);
        FUZZ_CHECK_EQ(st.memory_keys, fits && !peek && cost > 0);
    }
    int reset_want = expected_rc(key, keylen, 0);
    FUZZ_CHECK_EQ(hirate_reset(lim, key, keylen), reset_want);
    if (reset_want == 0) {
        hirate_counters st;
        hirate_counters_get(lim, &st);
        FUZZ_CHECK_EQ(st.memory_keys, 0);
    }
    hirate_limiter_free(lim);
}

/* A command as the server reads it: "*<argc>\r\n" then argc bulk strings.
 * Written here rather than borrowed from proto.c, whose reply parser takes at
 * most 8 elements: the request is checked by code that did not build it.
 * Returns the bytes it takes, or 0 when they are not such a command. */
typedef struct command {
    int argc;
    const char *argv[16];
    size_t lens[16];
} command;

static size_t read_number(const char *p, size_t left, size_t *out)
{
    size_t i = 0, v = 0;
    while (i < left && p[i] >= '0' && p[i] <= '9' && i < 12)
        v = v * 10 + (size_t)(p[i++] - '0');
    if (i == 0 || i + 2 > left || p[i] != '\r' || p[i + 1] != '\n')
        return 0;
    *out = v;
    return i + 2;
}

static size_t read_command(const char *buf, size_t len, command *c)
{
    size_t pos = 0, n, argc;
    if (len < 1 || buf[0] != '*' || !(n = read_number(buf + 1, len - 1, &argc)) || argc > 16)
        return 0;
    pos = 1 + n;
    c->argc = (int)argc;
    for (size_t i = 0; i < argc; i++) {
        size_t blen;
        if (pos >= len || buf[pos] != '$' || !(n = read_number(buf + pos + 1, len - pos - 1, &blen)))
            return 0;
        pos += 1 + n;
        if (len - pos < blen + 2 || buf[pos + blen] != '\r' || buf[pos + blen + 1] != '\n')
            return 0;
        c->argv[i] = buf + pos;
        c->lens[i] = blen;
        pos += blen + 2;
    }
    return pos;
}

static int arg_is(const command *c, int i, const void *want, size_t len)
{
    return c->lens[i] == len && memcmp(c->argv[i], want, len) == 0;
}

/* On a limiter with a URL: the item is checked, and the request holds
 * prefix + key and the cost exactly; then a timeout lets the policy decide. */
static void on_the_op_path(const char *prefix, const void *key, size_t keylen, int64_t cost,
                           int64_t now_us)
{
    int rc;
    hirate_limiter *lim = make("redis://127.0.0.1:1", prefix, &rc);
    if (!lim)
        return;
    /* The fuzzed item between two good ones: a bad item must not shift the
     * others' calls. */
    hirate_item items[3] = {{"a", 1, 1, 0, {0}}, {key, keylen, cost, 0, {0}}, {"z", 1, 2, 0, {0}}};
    hirate_op *op = NULL;
    int want = expected_rc(key, keylen, cost);
    FUZZ_CHECK_EQ(hirate_op_start(lim, items, 3, 1, now_us, &op), 1);
    FUZZ_CHECK(op != NULL);
    FUZZ_CHECK_EQ(items[1].rc, want == 0 ? 1 : want);
    if (want < 0)
        check_message(lim, want, keylen, cost);

    size_t len, pos = 0, plen = strlen(prefix);
    const char *req = hirate_op_request(op, &len);
    for (int i = 0; i < 3; i++) {
        if (items[i].rc != 1)
            continue;
        command c;
        size_t r = read_command(req + pos, len - pos, &c);
        FUZZ_CHECK(r > 0);
        FUZZ_CHECK_EQ(c.argc, now_us >= 0 ? 9 : 8);
        FUZZ_CHECK(arg_is(&c, 0, "FCALL", 5));   /* the default: Redis Functions */
        FUZZ_CHECK(arg_is(&c, 1, hirate_function_name(), 23));
        FUZZ_CHECK(arg_is(&c, 2, "1", 1));
        FUZZ_CHECK(c.lens[3] == plen + items[i].keylen);
        FUZZ_CHECK(memcmp(c.argv[3], prefix, plen) == 0);
        FUZZ_CHECK(memcmp(c.argv[3] + plen, items[i].key, items[i].keylen) == 0);
        char num[32];
        int n = snprintf(num, sizeof num, "%" PRId64, items[i].cost);
        FUZZ_CHECK(arg_is(&c, 6, num, (size_t)n));
        FUZZ_CHECK(arg_is(&c, 4, "100", 3) && arg_is(&c, 5, "1", 1));   /* capacity, rate */
        FUZZ_CHECK(arg_is(&c, 7, "1", 1));
        if (now_us >= 0) {
            n = snprintf(num, sizeof num, "%" PRId64, now_us);
            FUZZ_CHECK(arg_is(&c, 8, num, (size_t)n));
        }
        pos += r;
    }
    FUZZ_CHECK_EQ(pos, len);   /* nothing but the calls */

    hirate_op_fail(op, HIRATE_ETIMEDOUT, NULL);
    FUZZ_CHECK_EQ(hirate_op_drop(op), 1);
    hirate_op_free(op);
    for (int i = 0; i < 3; i++) {
        if (i == 1 && want < 0) {
            FUZZ_CHECK_EQ(items[i].rc, want);
            continue;
        }
        FUZZ_CHECK_EQ(items[i].rc, 0);
        FUZZ_CHECK_EQ(items[i].decision.source, HIRATE_SOURCE_FAIL_CLOSED);
        FUZZ_CHECK_EQ(items[i].decision.error, HIRATE_ETIMEDOUT);
        FUZZ_CHECK_EQ(items[i].decision.allowed, items[i].cost == 0);
    }
    hirate_limiter_free(lim);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_reader in = {data, size};
    uint8_t flags = fuzz_u8(&in);
    size_t plen = fuzz_u8(&in);
    char prefix[256];
    fuzz_take(&in, prefix, plen);
    prefix[plen] = '\0';   /* a NUL inside ends it earlier, as in C */
    int64_t cost = (int64_t)fuzz_u64(&in);
    if (flags & 4)
        cost = (int64_t)((uint64_t)cost % (CAPACITY + 2));   /* mostly valid costs */
    int64_t now_us = flags & 8 ? (int64_t)(fuzz_u64(&in) >> 11) : -1;

    /* The key: the rest, on the heap at its exact size so that a read past
     * its end is caught; NULL when the flags say so. */
    size_t keylen = in.left;
    unsigned char *key = malloc(keylen ? keylen : 1);
    memcpy(key, in.p, keylen);
    const void *k = flags & 1 ? NULL : key;

    in_memory(prefix, k, keylen, cost, flags & 2);
    on_the_op_path(prefix, k, keylen, cost, now_us);
    free(key);
    return 0;
}
