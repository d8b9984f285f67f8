/*
 * The handshake op of hirate_io.h (hirate_handshake_start/request/feed/fail/
 * probe_tls/result) fed the input as the server's reply bytes, as a binding
 * feeds what it reads when it opens a connection.
 *
 * Input: one byte of settings (which URL: with user, password and db, a
 * password only, none, or rediss:// with all three; which I/O failure ends
 * the bytes; whether the first connection fails before its request is sent,
 * as a connect or a TLS handshake does), two bytes that split the rest into
 * the first connection's reply and the probe connection's, then the bytes.
 * No connection is made.
 * Each handshake is fed three ways: all at once, a byte at a time, and in
 * pieces drawn from a PRNG seeded by the input; when the bytes run out before
 * the op is done, the I/O "fails" with the chosen code, and a probe, when the
 * core asks for one, gets the second part the same way. Whatever the bytes:
 *   - no crash, no leak, no large allocation (run.sh passes -malloc_limit_mb);
 *   - feed never takes more than it is given, and the op ends;
 *   - at most one probe, whose request is not empty;
 *   - the result is 0 or a code the header documents, with a message when it
 *     is an error, and never the password;
 *   - the three ways agree on the result and the probe (unless a way ended
 *     before all the bytes were fed: then the caller would have closed the
 *     connection on the bytes left over, which the whole way saw);
 *   - right after a failed handshake, a new one is refused with the same
 *     code (the backoff), or let through.
 */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "hirate_io.h"

enum { WHOLE, BYTE, SPLIT };

static const char *const urls[] = {
    "redis://rl:s3cr3t-canary@127.0.0.1:1/3",
    "redis://:s3cr3t-canary@127.0.0.1:1",
    "redis://127.0.0.1:1",
    "rediss://rl:s3cr3t-canary@localhost:1/2",
};

static const int fail_codes[] = {HIRATE_EIO, HIRATE_ETIMEDOUT, HIRATE_ECONNECT, HIRATE_ETLS,
                                 HIRATE_ECLOSED, HIRATE_EIO, HIRATE_EIO, HIRATE_ETIMEDOUT};

typedef struct outcome {
    int last;        /* the last state (negative: from hirate_handshake_fail) */
    int probes, probe_tls;
    int leftover;    /* the op ended with bytes not fed */
    int rc;
} outcome;

static int allowed_result(int rc)
{
    switch (rc) {
    case 0: case HIRATE_ECONNECT: case HIRATE_ETIMEDOUT: case HIRATE_EIO: case HIRATE_EPROTO:
    case HIRATE_ESERVER: case HIRATE_EAUTH: case HIRATE_ENOPERM: case HIRATE_EREPLY:
    case HIRATE_ETLS: case HIRATE_EREFUSED: case HIRATE_ENOTREDIS: case HIRATE_ECLOSED:
        return 1;
    default:
        return 0;
    }
}

static void note(outcome *o, int state)
{
    o->last = state;
}

/* Feeds data (in the mode's pieces) until the op leaves HIRATE_IO_MORE; when
 * the bytes run out first, fails it with code. Returns the new state. */
static int feed_all(hirate_handshake *hs, const uint8_t *data, size_t size, int mode,
                    uint64_t *seed, int code, outcome *o)
{
    size_t off = 0, avail = mode == WHOLE ? size : 0;
    for (int rounds = 0;; rounds++) {
        FUZZ_CHECK(rounds <= (int)size + 2);   /* each round takes a byte, or ends */
        size_t used = (size_t)-1;
        int st = hirate_handshake_feed(hs, (const char *)data + off, avail - off, &used);
        FUZZ_CHECK(used <= avail - off);
        off += used;
        note(o, st);
        if (st != HIRATE_IO_MORE) {
            FUZZ_CHECK(st == HIRATE_IO_DONE || st == HIRATE_IO_PROBE);
            o->leftover |= off < size;
            return st;
        }
        if (avail == size) {
            st = hirate_handshake_fail(hs, code, "fuzz: the connection ended");
            FUZZ_CHECK(st == HIRATE_IO_DONE || st == HIRATE_IO_PROBE);
            note(o, -st);
            return st;
        }
        size_t piece = mode == BYTE ? 1 : fuzz_piece(seed);
        avail = size - avail < piece ? size : avail + piece;
    }
}

/* The password's words in a message, unless the server sent them itself
 * (a message quotes the server). */
static int leaks(const char *msg, const uint8_t *data, size_t size)
{
    static const char *const words[] = {"s3cr3t", "canary"};
    for (int i = 0; i < 2; i++)
        if (strstr(msg, words[i]) && !memmem(data, size, words[i], strlen(words[i])))
            return 1;
    return 0;
}

static void run(const char *url, const uint8_t *first, size_t nfirst, const uint8_t *second,
                size_t nsecond, int code, int early, int mode, uint64_t seed, outcome *o)
{
    hirate_options opt;
    hirate_options_init(&opt);
    opt.url = url;
    opt.capacity = 10;
    opt.rate = 1;
    opt.max_keys = 16;   /* small tables: a limiter a run, made fast */
    opt.deny_cache_keys = 16;
    /* A CA directory is looked in only when a certificate is checked: no
     * trust store is loaded for a limiter that never connects. */
    if (strncmp(url, "rediss:", 7) == 0) opt.tls_ca_dir = "/";
    hirate_limiter *lim = NULL;
    FUZZ_CHECK_EQ(hirate_limiter_new(&lim, &opt, NULL, 0), 0);
    memset(o, 0, sizeof *o);

    char err[HIRATE_ERRMSG_SIZE];
    hirate_handshake *hs = NULL;
    FUZZ_CHECK_EQ(hirate_handshake_start(lim, &hs, err, sizeof err), 0);
    FUZZ_CHECK(hs != NULL);
    size_t len = 0;
    const char *req;
    int st;
    if (early) {
        /* The connect or the TLS handshake failed: nothing was sent. */
        st = hirate_handshake_fail(hs, code, "fuzz: could not open the connection");
        FUZZ_CHECK(st == HIRATE_IO_DONE || st == HIRATE_IO_PROBE);
        note(o, -st);
    } else {
        req = hirate_handshake_request(hs, &len);
        FUZZ_CHECK(req != NULL && len > 0 && len <= HIRATE_IO_REPLY_MAX);
        /* Every handshake proves the server is Redis with a PING. */
        FUZZ_CHECK(memmem(req, len, "PING", 4) != NULL);
        st = feed_all(hs, first, nfirst, mode, &seed, code, o);
    }
    if (st == HIRATE_IO_PROBE) {
        o->probes++;
        o->probe_tls = hirate_handshake_probe_tls(hs);
        FUZZ_CHECK(o->probe_tls == 0 || o->probe_tls == 1);
        req = hirate_handshake_request(hs, &len);
        FUZZ_CHECK(req != NULL && len > 0);
        /* The probe's connection ends as the first did; no second probe. */
        st = feed_all(hs, second, nsecond, mode, &seed, code, o);
        FUZZ_CHECK_EQ(st, HIRATE_IO_DONE);
    }
    FUZZ_CHECK_EQ(st, HIRATE_IO_DONE);

    memset(err, 0, sizeof err);
    o->rc = hirate_handshake_result(hs, err, sizeof err);
    FUZZ_CHECK(allowed_result(o->rc));
    FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL);
    FUZZ_CHECK(!leaks(err, first, nfirst + nsecond));
    /* ECLOSED is the caller's own giving up, which it knows the reason of. */
    if (o->rc < 0 && o->rc != HIRATE_ECLOSED) FUZZ_CHECK(err[0] != '\0');
    hirate_handshake_free(hs);

    /* Right after a failure the backoff refuses a new handshake with the
     * failure's own code (or, if the machine was slow, lets one through). */
    if (o->rc < 0 && o->rc != HIRATE_ECLOSED) {
        hirate_handshake *again = NULL;
        int rc2 = hirate_handshake_start(lim, &again, err, sizeof err);
        FUZZ_CHECK(rc2 == 0 || rc2 == o->rc);
        FUZZ_CHECK(!leaks(err, first, nfirst + nsecond));
        if (rc2 == 0) hirate_handshake_free(again);
        else FUZZ_CHECK(again == NULL && err[0] != '\0');
    }
    hirate_limiter_free(lim);
}

static void compare(const outcome *a, const outcome *b)
{
    if (a->leftover || b->leftover)
        return;
    FUZZ_CHECK_EQ(a->rc, b->rc);
    FUZZ_CHECK_EQ(a->probes, b->probes);
    FUZZ_CHECK_EQ(a->probe_tls, b->probe_tls);
    /* How the op ended agrees; how many MOREs it took depends on the pieces. */
    FUZZ_CHECK_EQ(a->last, b->last);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_reader in = {data, size};
    uint8_t settings = fuzz_u8(&in);
    uint16_t cut = (uint16_t)(fuzz_u8(&in) | fuzz_u8(&in) << 8);
    const char *url = urls[settings & 3];
    int code = fail_codes[(settings >> 2) & 7];
    int early = (settings >> 5) & 1;
    size_t nfirst = in.left ? cut % (in.left + 1) : 0;
    const uint8_t *first = in.p, *second = in.p + nfirst;
    size_t nsecond = in.left - nfirst;
    uint64_t seed = fuzz_seed(data, size);

    static outcome o[3];
    for (int m = WHOLE; m <= SPLIT; m++)
        run(url, first, nfirst, second, nsecond, code, early, m, seed, &o[m]);
    compare(&o[WHOLE], &o[BYTE]);
    compare(&o[WHOLE], &o[SPLIT]);
    return 0;
}
