/*
 * The RESP reply decoder: hirate_proto_parse(), then what each reply means
 * for a script call (hirate_proto_decision() and hirate_proto_outcome()).
 *
 * The input is what a server sent: any bytes, possibly several pipelined
 * replies. They are decoded three ways, as a reader would meet them:
 *   whole       every byte at once;
 *   byte        one more byte after every "incomplete";
 *   split       pieces of sizes drawn from a PRNG seeded by the input, each
 *               attempt on an exact-size heap copy so that ASan sees a read
 *               one byte past what has arrived.
 * All three must find the same replies, the same error at the same place,
 * and give every reply the same meaning: a decoder whose answer depends on
 * how the bytes were cut by the network would make decisions depend on it.
 * Every outcome must also be one the limiter knows how to handle.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "hirate.h"
#include "proto.h"

#define MAX_REPLIES 64
#define CAPACITY 10

enum { WHOLE, BYTE, SPLIT };

/* A reply element with its text as an offset into the stream. */
typedef struct elem {
    char type;
    long off;
    size_t len;
    int64_t integer;
} elem;

typedef struct parsed {
    long r;                 /* bytes taken */
    elem top;
    size_t nelem;
    elem e[HIRATE_REPLY_MAX_ELEMS];
    int rc, drop, class_rc; /* outcome, its drop flag, and decision()'s rc */
    hirate_decision d;
    hirate_bucket st;
    char err[HIRATE_ERRMSG_SIZE];
} parsed;

typedef struct result {
    size_t n;
    parsed p[MAX_REPLIES];
    long end;               /* 0: the rest is incomplete; HIRATE_EPROTO; 1: stopped at MAX_REPLIES */
    const char *why;
    size_t consumed;
} result;

static result results[3];

static elem snap(const hirate_reply_elem *x, const char *base, size_t start)
{
    elem e = {x->type, x->str ? (long)(x->str - base) + (long)start : -1, x->len, x->integer};
    return e;
}

static int elem_eq(const elem *a, const elem *b)
{
    return a->type == b->type && a->off == b->off && a->len == b->len &&
           a->integer == b->integer;
}

/* What the limiter needs of a decoded reply, for the call rl:k at cost. */
static void meaning(parsed *p, const hirate_reply *rep, int64_t cost, int after_eval)
{
    static const char prefix[] = "rl:";
    static const char args[] = "$2\r\n10\r\n$1\r\n1\r\n";
    static const hirate_bucket_cfg cfg[2] = {{CAPACITY, CAPACITY, 1.0, 1e6},
                                             {CAPACITY, CAPACITY, 1.0, 1e6}};
    hirate_call c = {prefix, 3, "k", 1, args, sizeof args - 1, 1, cost, 1, -1};
    const char *why = NULL;
    hirate_decision d2, per[2], whole;
    hirate_bucket st2, st3[2];

    memset(&p->d, 0, sizeof p->d);
    memset(&p->st, 0, sizeof p->st);
    p->drop = 0;
    p->err[0] = '\0';
    p->class_rc = hirate_proto_decision(rep, &c, cfg, &d2, NULL, &st2, &why);
    p->rc = hirate_proto_outcome(rep, &c, cfg, after_eval, &p->d, NULL, &p->st, &p->drop, p->err,
                                 sizeof p->err);

    /* The same reply read as a call of two bands: a whole that is the
     * bands' own, or an error, never anything in between. */
    hirate_call c2 = c;
    c2.nbands = 2;
    const char *why2 = NULL;
    int rc2 = hirate_proto_decision(rep, &c2, cfg, &whole, per, st3, &why2);
    FUZZ_CHECK(rc2 != HIRATE_EPROTO || why2 != NULL);
    if (rc2 == 0) {
        FUZZ_CHECK(rep->nelem == 13);
        FUZZ_CHECK(whole.allowed == (per[0].allowed && per[1].allowed));
        FUZZ_CHECK(whole.remaining == (per[0].remaining < per[1].remaining ? per[0].remaining
                                                                           : per[1].remaining));
        FUZZ_CHECK(whole.band == 0 || whole.band == 1);
        FUZZ_CHECK(whole.limit == CAPACITY && per[1].band == 1);
        FUZZ_CHECK(!whole.allowed || whole.retry_after_us == 0);
    }

    /* Only codes the limiter knows: a decision, NOSCRIPT (send again with
     * the code), NOFUNC (send again by EVALSHA), an outage for the policy,
     * or a configuration error. */
    FUZZ_CHECK(p->rc == 0 || p->rc == HIRATE_PROTO_NOSCRIPT || p->rc == HIRATE_PROTO_NOFUNC ||
               p->rc == HIRATE_EPROTO ||
               p->rc == HIRATE_ESERVER || p->rc == HIRATE_EAUTH || p->rc == HIRATE_ENOPERM ||
               p->rc == HIRATE_EREPLY || p->rc == HIRATE_EREFUSED);
    FUZZ_CHECK(p->rc != HIRATE_PROTO_NOSCRIPT || (!after_eval && rep->top.type == '-'));
    FUZZ_CHECK(p->rc != HIRATE_PROTO_NOFUNC || rep->top.type == '-');
    if (p->class_rc == HIRATE_EPROTO)
        FUZZ_CHECK(why != NULL);
    if (p->rc < 0)
        FUZZ_CHECK(p->err[0] != '\0');
    if (p->rc == HIRATE_EPROTO) {
        FUZZ_CHECK(p->drop == 1);
        FUZZ_CHECK(strncmp(p->err, "malformed reply from Redis: ", 28) == 0);
    }
    if (rep->top.type == '-') {
        FUZZ_CHECK(p->rc != 0);
        /* The server's words, whole when they fit in the message, else up to
         * a word and "...", printable bytes only: a hostile error can flood
         * no log and move no terminal. */
        if (p->rc != HIRATE_PROTO_NOSCRIPT && p->rc != HIRATE_PROTO_NOFUNC) {
            /* A cluster's redirection names the URL to use first. */
            static const char plain[] = "Redis replied: ";
            static const char cluster[] = "the server is a Redis Cluster node (use a "
                                          "redis+cluster:// URL); it replied: ";
            size_t n = strlen(p->err), pre = sizeof plain - 1;
            if (strncmp(p->err, cluster, sizeof cluster - 1) == 0)
                pre = sizeof cluster - 1;
            else
                FUZZ_CHECK(strncmp(p->err, plain, pre) == 0);
            FUZZ_CHECK(n < sizeof p->err);
            for (size_t i = 0; i < n; i++)
                FUZZ_CHECK(p->err[i] >= 0x20 && p->err[i] < 0x7f);
            if (n - pre < rep->top.len)
                FUZZ_CHECK(n >= pre + 3 && strcmp(p->err + n - 3, "...") == 0);
            else
                FUZZ_CHECK_EQ(n - pre, rep->top.len);
        }
    }
    if (p->rc == 0) {
        FUZZ_CHECK(p->class_rc == 0);
        FUZZ_CHECK(rep->top.type == '*' && rep->nelem == 8);
        FUZZ_CHECK(p->d.source == HIRATE_SOURCE_REDIS && p->d.error == 0);
        FUZZ_CHECK(p->d.allowed == 0 || p->d.allowed == 1);
        FUZZ_CHECK(p->d.limit == CAPACITY);
        FUZZ_CHECK(p->d.remaining >= 0 && p->d.remaining <= CAPACITY);
        FUZZ_CHECK(p->d.retry_after_us >= 0);
        FUZZ_CHECK(!p->d.allowed || p->d.retry_after_us == 0);
        FUZZ_CHECK(p->d.reset_after_us >= 0 && p->d.time_us >= 0);
        FUZZ_CHECK(isnan(p->st.tokens) || (isfinite(p->st.tokens) && p->st.tokens >= 0));
        /* The level is read exactly when a caller can use it. */
        FUZZ_CHECK(isnan(p->st.tokens) == (p->d.allowed && p->d.remaining >= cost));
        /* The echoed key is ours, whole. */
        FUZZ_CHECK(rep->elem[7].len == 4 && memcmp(rep->elem[7].str, "rl:k", 4) == 0);
    }
}

static void decode(const uint8_t *data, size_t size, int mode, uint64_t seed, int64_t cost,
                   int after_eval, result *res)
{
    size_t start = 0, avail = mode == WHOLE ? size : 0;
    res->n = 0;
    res->why = NULL;
    for (;;) {
        if (res->n == MAX_REPLIES) {
            res->end = 1;
            break;
        }
        size_t have = avail - start;
        char *copy = NULL;
        const char *buf = (const char *)data + start;
        if (mode == SPLIT) {
            copy = malloc(have ? have : 1);
            FUZZ_CHECK(copy != NULL);
            if (have)
                memcpy(copy, buf, have);
            buf = copy;
        }
        hirate_reply rep;
        long r = hirate_proto_parse(buf, have, &rep);
        if (r > 0) {
            FUZZ_CHECK((size_t)r <= have);
            parsed *p = &res->p[res->n++];
            p->r = r;
            p->top = snap(&rep.top, buf, start);
            p->nelem = rep.nelem;
            FUZZ_CHECK(rep.nelem <= HIRATE_REPLY_MAX_ELEMS);
            FUZZ_CHECK(rep.nelem == 0 || rep.top.type == '*');
            for (size_t i = 0; i < rep.nelem; i++) {
                p->e[i] = snap(&rep.elem[i], buf, start);
                /* No element claims more than the limit. */
                FUZZ_CHECK(rep.elem[i].len <= HIRATE_PROTO_MAX_REPLY);
            }
            FUZZ_CHECK(rep.top.len <= HIRATE_PROTO_MAX_REPLY);
            meaning(p, &rep, cost, after_eval);
            start += (size_t)r;
            free(copy);
            continue;
        }
        free(copy);
        if (r < 0) {
            FUZZ_CHECK(r == HIRATE_EPROTO);
            FUZZ_CHECK(rep.why != NULL);
            res->end = r;
            res->why = rep.why;
            break;
        }
        if (avail == size) {
            res->end = 0;
            break;
        }
        size_t piece = mode == BYTE ? 1 : fuzz_piece(&seed);
        avail = size - avail < piece ? size : avail + piece;
    }
    res->consumed = start;
}

static int same_bucket(const hirate_bucket *a, const hirate_bucket *b)
{
    return a->ts == b->ts && (isnan(a->tokens) ? isnan(b->tokens) : a->tokens == b->tokens);
}

static void compare(const result *a, const result *b)
{
    FUZZ_CHECK_EQ(a->n, b->n);
    FUZZ_CHECK_EQ(a->end, b->end);
    FUZZ_CHECK_EQ(a->consumed, b->consumed);
    FUZZ_CHECK((a->why == NULL) == (b->why == NULL));
    if (a->why)
        FUZZ_CHECK(strcmp(a->why, b->why) == 0);
    for (size_t i = 0; i < a->n; i++) {
        const parsed *x = &a->p[i], *y = &b->p[i];
        FUZZ_CHECK_EQ(x->r, y->r);
        FUZZ_CHECK(elem_eq(&x->top, &y->top));
        FUZZ_CHECK_EQ(x->nelem, y->nelem);
        for (size_t k = 0; k < x->nelem; k++)
            FUZZ_CHECK(elem_eq(&x->e[k], &y->e[k]));
        FUZZ_CHECK_EQ(x->rc, y->rc);
        FUZZ_CHECK_EQ(x->class_rc, y->class_rc);
        FUZZ_CHECK_EQ(x->drop, y->drop);
        FUZZ_CHECK(memcmp(&x->d, &y->d, sizeof x->d) == 0);
        FUZZ_CHECK(same_bucket(&x->st, &y->st));
        FUZZ_CHECK(strcmp(x->err, y->err) == 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t seed = fuzz_seed(data, size);
    int64_t cost = (int64_t)(seed >> 16) % (CAPACITY + 2);   /* 0 .. capacity + 1 */
    int after_eval = (int)(seed >> 8) & 1;

    decode(data, size, WHOLE, seed, cost, after_eval, &results[WHOLE]);
    decode(data, size, BYTE, seed, cost, after_eval, &results[BYTE]);
    decode(data, size, SPLIT, seed, cost, after_eval, &results[SPLIT]);
    compare(&results[WHOLE], &results[BYTE]);
    compare(&results[WHOLE], &results[SPLIT]);

    /* The classifiers read any bytes as an error message. */
    int cls = hirate_proto_error_class((const char *)data, size);
    FUZZ_CHECK(cls == HIRATE_PROTO_NOSCRIPT || cls == HIRATE_PROTO_NOFUNC ||
               cls == HIRATE_PROTO_MOVED ||
               cls == HIRATE_PROTO_ASK || cls == HIRATE_ESERVER || cls == HIRATE_EAUTH ||
               cls == HIRATE_ENOPERM || cls == HIRATE_EREPLY || cls == HIRATE_EREFUSED);
    if (hirate_proto_error_drops_connection((const char *)data, size))
        FUZZ_CHECK(cls == HIRATE_ESERVER);
    return 0;
}
