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

#ifdef __cplusplus
}
#endif
#endif
