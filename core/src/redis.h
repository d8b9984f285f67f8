/*
 * The Redis backend of the blocking client: a bounded pool of connections
 * shared by all threads. Each connection is hirate's own (transport.c: TCP
 * or a unix socket, TLS), opened through the link's handshake op, which
 * sends AUTH/SELECT/PING and judges the replies; calls go through proto.c
 * with no allocation per call.
 *
 * Rules it keeps: a connection that met any error is closed, never reused; a
 * call is sent twice only when it provably did not run (NOSCRIPT or
 * "Function not found": the code goes first; Redis Functions refused: by
 * EVALSHA); a timeout is an unknown
 * outcome and is never retried; new connections after a failure wait out
 * the link's backoff; each place in the pool keeps its TLS session for the
 * next connection in that place, never shared; after fork() the child
 * closes the inherited connections without sending a byte. Calls that find
 * every connection busy ride the next round trip together (redis.c's top
 * comment).
 */
#ifndef HIRATE_REDIS_H
#define HIRATE_REDIS_H

#include <stddef.h>
#include <stdint.h>

#include "metrics.h"
#include "proto.h"
#include "url.h"

typedef struct hirate_redis hirate_redis;

struct hirate_link;

typedef struct hirate_redis_cfg {
    struct hirate_link *link;   /* the URL, timeouts, TLS and the backoff; outlives the pool */
    int pool_size;
} hirate_redis_cfg;

hirate_redis *hirate_redis_new(const hirate_redis_cfg *cfg);
void hirate_redis_free(hirate_redis *r);

/* Script calls in one pipelined round trip (n == 1 for a single decision),
 * of a limiter whose bands are cfg[0 .. calls[i].nbands), the same for
 * every call. Each call i gets rcs[i]: 0 with ds[i], and per[] and
 * states[] from i * nbands (each band's decision and bucket as stored)
 * filled, or a HIRATE_E* code. Returns 0 when the round trip completed, or
 * the error that broke it (then every unanswered call has it too). The
 * message of the last error goes to err; with msgs (HIRATE_ERRMSG_SIZE bytes
 * a call), each failed call's own goes to msgs + i * HIRATE_ERRMSG_SIZE (its
 * reply's words, or the round trip's failure), "" for the others. */
int hirate_redis_decide_many(hirate_redis *r, const hirate_call *calls, size_t n,
                             const hirate_bucket_cfg *cfg, hirate_decision *ds,
                             hirate_decision *per, hirate_bucket *states, int *rcs, char *msgs,
                             char *err, size_t errlen);

/* DEL of prefix + key. */
int hirate_redis_reset(hirate_redis *r, const char *prefix, size_t prefixlen, const void *key,
                       size_t keylen, char *err, size_t errlen);

/* A connection of the pool lent to an op's leg (a cluster's calls): lease
 * one (an idle one, a new one while there is room, else the next given
 * back, within the timeout), send a leg's bytes, read until the op has its
 * replies, saying how many bytes it took, and give it back (closed when not
 * healthy, or when bytes are left over). */
typedef struct conn hirate_redis_conn;
int hirate_redis_lease(hirate_redis *r, hirate_redis_conn **c, char *err, size_t errlen);
int hirate_redis_send(hirate_redis *r, hirate_redis_conn *c, const char *buf, size_t len,
                      int64_t deadline, char *err, size_t errlen);
/* Reads more: [*data, *data + *len) are then every unread byte. */
int hirate_redis_read(hirate_redis *r, hirate_redis_conn *c, int64_t deadline, const char **data,
                      size_t *len, char *err, size_t errlen);
void hirate_redis_consumed(hirate_redis_conn *c, size_t used);
void hirate_redis_unlease(hirate_redis *r, hirate_redis_conn *c, int healthy);

/* The pool's counters (connection attempts are the link's). */
typedef struct hirate_redis_stats {
    uint64_t evalsha, eval, fcall, function_loads, dropped;
    hirate_latency latency;     /* the blocking client's round trips that completed */
} hirate_redis_stats;

void hirate_redis_stats_get(hirate_redis *r, hirate_redis_stats *out);

/* fork(): prepare takes the pool lock, parent releases it, child releases it
 * and closes every inherited connection. */
void hirate_redis_fork_prepare(hirate_redis *r);
void hirate_redis_fork_parent(hirate_redis *r);
void hirate_redis_fork_child(hirate_redis *r);

#endif
