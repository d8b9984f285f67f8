/*
 * The no-I/O op API (hirate_op_start/feed/fail) fed the input as the
 * server's reply bytes, as asyncio or OpenResty would feed what they read.
 *
 * Two batches on limiters with a URL (no connection is made): one call "a"
 * under the local policy, and two calls "a", "b" under a policy chosen by
 * the input. Each is fed three ways: all bytes at once, one byte at a time,
 * and in pieces drawn from a PRNG seeded by the input; when the bytes run
 * out before the op is done, the connection "closes" (hirate_op_fail with
 * HIRATE_EIO). Whatever the bytes:
 *   - no crash, no leak, no large allocation (run.sh passes -malloc_limit_mb);
 *   - the op ends, every item has an rc the API documents, and a decision
 *     with the right source, limit and ranges;
 *   - a malformed reply closes the connection;
 *   - the three ways agree on every rc and decision (times the breaker
 *     jitters aside), on the connection and on what the deny cache learnt.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "hirate_io.h"

#define CAPACITY 10
#define NOW_US 5000000000LL   /* injected, so that every decision is repeatable */

enum { WHOLE, BYTE, SPLIT };

typedef struct outcome {
    hirate_item items[2];
    int drop;
    hirate_counters st;
} outcome;

static hirate_limiter *make(int on_error, int functions)
{
    hirate_options o;
    hirate_options_init(&o);
    o.functions = functions;
    o.url = "redis://127.0.0.1:1";
    o.prefix = "rl:";
    o.capacity = CAPACITY;
    o.rate = 1;
    o.on_error = on_error;
    o.max_keys = 16;
    o.deny_cache_keys = 16;
    hirate_limiter *lim = NULL;
    FUZZ_CHECK_EQ(hirate_limiter_new(&lim, &o, NULL, 0), 0);
    return lim;
}

static void check_item(const hirate_item *it, int on_error)
{
    /* Outages are the policy's to answer; configuration errors are returned. */
    if (!(it->rc == 0 || it->rc == HIRATE_EAUTH || it->rc == HIRATE_ENOPERM ||
          it->rc == HIRATE_EREPLY || it->rc == HIRATE_EREFUSED))
        fprintf(stderr, "item rc %s\n", hirate_err_name(it->rc));
    FUZZ_CHECK(it->rc == 0 || it->rc == HIRATE_EAUTH || it->rc == HIRATE_ENOPERM ||
               it->rc == HIRATE_EREPLY || it->rc == HIRATE_EREFUSED);
    if (it->rc != 0)
        return;
    const hirate_decision *d = &it->decision;
    static const int policy_source[] = {HIRATE_SOURCE_LOCAL, HIRATE_SOURCE_FAIL_OPEN,
                                        HIRATE_SOURCE_FAIL_CLOSED};
    FUZZ_CHECK(d->source == HIRATE_SOURCE_REDIS || d->source == policy_source[on_error]);
    if (d->source == HIRATE_SOURCE_REDIS) {
        FUZZ_CHECK_EQ(d->error, 0);
    } else {
        FUZZ_CHECK(d->error == HIRATE_EIO || d->error == HIRATE_EPROTO ||
                   d->error == HIRATE_ESERVER);
    }
    FUZZ_CHECK_EQ(d->limit, CAPACITY);
    FUZZ_CHECK(d->allowed == 0 || d->allowed == 1);
    FUZZ_CHECK(d->remaining >= 0 && d->remaining <= CAPACITY);
    FUZZ_CHECK(d->retry_after_us >= 0 && d->reset_after_us >= 0);
    FUZZ_CHECK(!d->allowed || d->retry_after_us == 0);
    if (d->source != HIRATE_SOURCE_REDIS)
        FUZZ_CHECK_EQ(d->time_us, NOW_US);
}

/* A request sent again: with the code, or by EVALSHA after Redis Functions
 * were refused. */
static int resent_as_it_may_be(const char *req, size_t len, int functions)
{
    static const char eval[] = "*9\r\n$4\r\nEVAL\r\n";
    static const char evalsha[] = "*9\r\n$7\r\nEVALSHA\r\n";
    static const char load[] = "*3\r\n$8\r\nFUNCTION\r\n$4\r\nLOAD\r\n";
#define STARTS(s) (len > sizeof s - 1 && memcmp(req, s, sizeof s - 1) == 0)
    return STARTS(eval) || (functions && (STARTS(load) || STARTS(evalsha)));
#undef STARTS
}

static void run(const uint8_t *data, size_t size, int mode, uint64_t seed, size_t n,
                int on_error, int functions, outcome *out)
{
    hirate_limiter *lim = make(on_error, functions);
    memset(out->items, 0, sizeof out->items);
    out->items[0] = (hirate_item){"a", 1, 1, 0, {0}};
    out->items[1] = (hirate_item){"b", 1, 3, 0, {0}};
    hirate_op *op = NULL;
    FUZZ_CHECK_EQ(hirate_op_start(lim, out->items, n, 1, NOW_US, &op), 1);
    size_t len;
    FUZZ_CHECK(hirate_op_request(op, &len) != NULL && len > 0);

    size_t off = 0, avail = mode == WHOLE ? size : 0;
    int sends = 1;
    for (;;) {
        size_t used = (size_t)-1;
        int r = hirate_op_feed(op, (const char *)data + off, avail - off, &used);
        FUZZ_CHECK(used <= avail - off);
        off += used;
        if (r == HIRATE_IO_DONE)
            break;
        if (r == HIRATE_IO_SEND) {
            /* By EVALSHA: only after NOSCRIPT, and only once, the calls
             * again, the first as EVAL. By FCALL: after "Function not
             * found" with FUNCTION LOAD first, after a refusal by EVALSHA,
             * and then EVAL: each step at most once. */
            ++sends;
            FUZZ_CHECK(sends <= (functions ? 4 : 2));
            const char *req = hirate_op_request(op, &len);
            FUZZ_CHECK(resent_as_it_may_be(req, len, functions));
            continue;
        }
        FUZZ_CHECK_EQ(r, HIRATE_IO_MORE);
        FUZZ_CHECK(used == 0 || avail - off < avail);
        if (avail == size) {
            /* The server closed the connection mid-reply. */
            hirate_op_fail(op, HIRATE_EIO, NULL);
            break;
        }
        size_t piece = mode == BYTE ? 1 : fuzz_piece(&seed);
        avail = size - avail < piece ? size : avail + piece;
    }
    out->drop = hirate_op_drop(op);
    hirate_op_free(op);
    for (size_t i = 0; i < n; i++)
        check_item(&out->items[i], on_error);
    hirate_counters_get(lim, &out->st);
    hirate_limiter_free(lim);
}

static void compare(const outcome *a, const outcome *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const hirate_item *x = &a->items[i], *y = &b->items[i];
        FUZZ_CHECK_EQ(x->rc, y->rc);
        if (x->rc)
            continue;
        hirate_decision dx = x->decision, dy = y->decision;
        FUZZ_CHECK_EQ(dx.source, dy.source);
        if (dx.source == HIRATE_SOURCE_FAIL_OPEN || dx.source == HIRATE_SOURCE_FAIL_CLOSED) {
            /* The time until the breaker's probe is jittered per limiter. */
            dx.retry_after_us = dy.retry_after_us = 0;
            dx.reset_after_us = dy.reset_after_us = 0;
        }
        FUZZ_CHECK(memcmp(&dx, &dy, sizeof dx) == 0);
    }
    FUZZ_CHECK_EQ(a->drop, b->drop);
    FUZZ_CHECK_EQ(a->st.cache_keys, b->st.cache_keys);
    FUZZ_CHECK_EQ(a->st.local_keys, b->st.local_keys);
    FUZZ_CHECK_EQ(a->st.policy, b->st.policy);
    FUZZ_CHECK_EQ(a->st.breaker_opens, b->st.breaker_opens);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static outcome o[3];
    uint64_t seed = fuzz_seed(data, size);
    int functions = (int)((seed >> 40) & 1);   /* FCALL or EVALSHA first */
    /* One call under the local policy. */
    for (int m = WHOLE; m <= SPLIT; m++)
        run(data, size, m, seed, 1, HIRATE_ON_ERROR_LOCAL, functions, &o[m]);
    compare(&o[WHOLE], &o[BYTE], 1);
    compare(&o[WHOLE], &o[SPLIT], 1);
    /* Two calls under a policy of the input's choosing. */
    int policy = (int)((seed >> 32) % 3);
    for (int m = WHOLE; m <= SPLIT; m++)
        run(data, size, m, seed, 2, policy, functions, &o[m]);
    compare(&o[WHOLE], &o[BYTE], 2);
    compare(&o[WHOLE], &o[SPLIT], 2);
    return 0;
}
