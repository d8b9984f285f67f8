/*
 * What hirate's own tests, benchmarks and bindings may use beyond hirate.h.
 * These symbols are in the static library only (the shared one hides them),
 * and none of them is for production use.
 */
#ifndef HIRATE_INTERNAL_H
#define HIRATE_INTERNAL_H

#include "hirate.h"

#ifdef __cplusplus
extern "C" {
#endif

/* hirate_allow (spend = 1) or hirate_peek (spend = 0) at an injected time in
 * microseconds: the memory backend's clock, or the script's ARGV[5] in Redis.
 * It exists for the shared test vectors, which state time explicitly. */
int hirate__decide_at(hirate_limiter *lim, const void *key, size_t keylen, int64_t cost,
                      int spend, int64_t now_us, hirate_decision *out);

/* Counters since the limiter was made, for tests and benchmarks. */
typedef struct hirate_stats {
    uint64_t connects;        /* connection attempts */
    uint64_t evalsha;         /* EVALSHA calls sent */
    uint64_t eval;            /* EVAL calls sent (after NOSCRIPT) */
    uint64_t conns_dropped;   /* connections closed after an error */
    uint64_t cache_hits;      /* refusals answered by the deny cache */
    uint64_t policy;          /* decisions made by the failure policy */
    uint64_t breaker_opens;   /* times a failure opened the breaker */
    size_t memory_keys;       /* buckets held by the memory backend */
    size_t local_keys;        /* buckets held by the local fallback */
    size_t cache_keys;        /* refusals held by the deny cache */
} hirate_stats;

void hirate__stats(hirate_limiter *lim, hirate_stats *out);

/* ---- Deciding without I/O ---------------------------------------------------
 * For bindings that do their network I/O themselves (asyncio, OpenResty
 * cosockets), with the very bytes, reply checks, breaker, deny cache and
 * failure policy of hirate_allow_many():
 *
 *   hirate_op *op;
 *   if (hirate__op_start(lim, items, n, 1, -1, &op) == 1) {   // 0: all decided
 *       send hirate__op_request(op)
 *       loop: read bytes; switch (hirate__op_feed(op, bytes, len, &used)):
 *             HIRATE_OP_MORE: keep the unused bytes, read more;
 *             HIRATE_OP_SEND: send hirate__op_request(op) (EVAL after NOSCRIPT);
 *             HIRATE_OP_DONE: every item has its rc and decision
 *       on a timeout or a broken connection instead: hirate__op_fail(op, HIRATE_ETIMEDOUT)
 *       close the connection if hirate__op_drop(op), or if bytes are left over
 *   }
 *   hirate__op_free(op);
 *
 * A new connection must first send hirate__handshake()'s bytes and read that
 * many replies (each +OK; an error is HIRATE_EAUTH or a wrong database). */
enum { HIRATE_OP_MORE = 1, HIRATE_OP_SEND, HIRATE_OP_DONE };

typedef struct hirate_op hirate_op;

/* Decides what needs no Redis. Returns 0 when every item is decided (*op is
 * NULL), 1 when *op has a request to send, or HIRATE_EINVAL (no URL). */
int hirate__op_start(hirate_limiter *lim, hirate_item *items, size_t n, int spend,
                     int64_t now_us, hirate_op **op);
const char *hirate__op_request(const hirate_op *op, size_t *len);
/* Reads replies from buf; *used is how many bytes they took. */
int hirate__op_feed(hirate_op *op, const char *buf, size_t len, size_t *used);
/* The I/O failed with code: the policy decides every call still waiting.
 * HIRATE_ECLOSED instead says the caller gave up (a cancelled task): the
 * calls still waiting get HIRATE_ECLOSED, no policy decides them, and the
 * breaker learns nothing (a probe given up lets the next call probe). */
void hirate__op_fail(hirate_op *op, int code);
/* True when the connection must be closed, not reused. */
int hirate__op_drop(const hirate_op *op);
void hirate__op_free(hirate_op *op);

typedef struct hirate_endpoint {
    int is_unix;
    char host[256];
    int port;
    char path[108];
    int connect_timeout_ms;
    int timeout_ms;
} hirate_endpoint;

/* Where the limiter's Redis is. HIRATE_EINVAL without a URL. */
int hirate__endpoint(hirate_limiter *lim, hirate_endpoint *out);
/* AUTH and SELECT for a new connection, as the URL asks: returns the length
 * (0: nothing to send) and writes it only when it fits in cap; *replies is
 * how many replies to read. */
size_t hirate__handshake(hirate_limiter *lim, char *buf, size_t cap, int *replies);

/* The part of hirate_reset() that needs no I/O: checks the key, then forgets
 * it in the deny cache and the local buckets. A binding that does its own
 * I/O calls it first, then sends "DEL <prefix><key>" as hirate_reset() does
 * (an integer reply is success). */
int hirate__reset_local(hirate_limiter *lim, const void *key, size_t keylen);

#ifdef __cplusplus
}
#endif
#endif
