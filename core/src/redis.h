/*
 * The Redis backend: a bounded pool of connections shared by all threads.
 * hiredis opens each connection (timeouts, keepalive, unix sockets) and runs
 * the AUTH/SELECT handshake; after that hirate owns the socket and speaks
 * through proto.c, with no allocation per call.
 *
 * Rules it keeps: a connection that met any error is closed, never reused; a
 * call is sent twice only after NOSCRIPT (as EVAL); a timeout is an unknown
 * outcome and is never retried; new connections after a failure wait out an
 * exponential backoff; after fork() the child closes the inherited sockets
 * without sending a byte.
 */
#ifndef HIRATE_REDIS_H
#define HIRATE_REDIS_H

#include <stddef.h>
#include <stdint.h>

#include "proto.h"
#include "url.h"

typedef struct hirate_redis hirate_redis;

struct hirate_link;

typedef struct hirate_redis_cfg {
    struct hirate_link *link;   /* the URL, timeouts, TLS and the backoff */
    hirate_url url;
    int connect_timeout_ms;
    int timeout_ms;
    int pool_size;
} hirate_redis_cfg;

hirate_redis *hirate_redis_new(const hirate_redis_cfg *cfg);
void hirate_redis_free(hirate_redis *r);

/* Script calls in one pipelined round trip (n == 1 for a single decision).
 * Each call i gets rcs[i]: 0 with ds[i] and states[i] (the bucket as stored)
 * filled, or a HIRATE_E* code. Returns 0 when the round trip completed, or
 * the error that broke it (then every unanswered call has it too). The
 * message of the last error goes to err. */
int hirate_redis_decide_many(hirate_redis *r, const hirate_call *calls, size_t n,
                             int64_t capacity, hirate_decision *ds, hirate_bucket *states,
                             int *rcs, char *err, size_t errlen);

/* DEL of prefix + key. */
int hirate_redis_reset(hirate_redis *r, const char *prefix, size_t prefixlen, const void *key,
                       size_t keylen, char *err, size_t errlen);

typedef struct hirate_redis_stats {
    uint64_t connects, evalsha, eval, dropped;
} hirate_redis_stats;

void hirate_redis_stats_get(hirate_redis *r, hirate_redis_stats *out);

/* For bindings with sockets of their own: where to connect, and the
 * timeouts (returns the connect timeout, *timeout_ms the command timeout). */
const hirate_url *hirate_redis_url(const hirate_redis *r);
int hirate_redis_timeouts(const hirate_redis *r, int *timeout_ms);

/* fork(): prepare takes the pool lock, parent releases it, child releases it
 * and closes every inherited connection. */
void hirate_redis_fork_prepare(hirate_redis *r);
void hirate_redis_fork_parent(hirate_redis *r);
void hirate_redis_fork_child(hirate_redis *r);

#endif
