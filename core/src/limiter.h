/*
 * The limiter's private parts, shared by the files that make it up:
 *   limiter.c       its life (options, construction, fork hooks, free) and
 *                   what it says of itself (bands, counters, stats, nodes)
 *   decide.c        decisions: input, memory, batches, the failure policy,
 *                   the deny cache, resets, the thread's last error
 *   op.c            the op state machine of hirate_io.h (rounds and legs)
 *   check.c         the health check (hirate_check), an op of its own kind
 *   blocking.c      the blocking client that runs an op on the nodes' pools
 * Nothing here is exported (the visibility preset hides it).
 */
#ifndef HIRATE_LIMITER_H
#define HIRATE_LIMITER_H

#include <stddef.h>
#include <stdint.h>

#include "breaker.h"
#include "bucket.h"
#include "cluster.h"
#include "fork.h"
#include "hirate_io.h"
#include "link.h"
#include "memory.h"
#include "metrics.h"
#include "redis.h"
#include "shm.h"

struct hirate_limiter {
    hirate_fork_node fork;      /* first: the fork hooks get this pointer */
    hirate_counts counts[HIRATE_METRICS_STRIPES];  /* decisions and errors */
    hirate_latency op_latency;  /* the round trips of ops' legs */
    int64_t deny_cache_max_us;  /* a remembered refusal is trusted this long */
    size_t nbands;              /* 1..HIRATE_BANDS_MAX */
    int64_t cap_min;            /* the least capacity: a cost above it never passes */
    hirate_bucket_cfg cfg[HIRATE_BANDS_MAX];
    hirate_bucket_cfg local_cfg[HIRATE_BANDS_MAX];/* the LOCAL fallback's share */
    char prefix[HIRATE_PREFIX_MAX + 1];
    size_t prefixlen;
    char args[HIRATE_BANDS_MAX * 64];/* each band's capacity and rate as RESP bulk strings */
    size_t argslen;
    char names[HIRATE_BANDS_MAX][HIRATE_BAND_NAME_MAX + 1];
    int on_error;
    hirate_node node0;          /* with a URL: where Redis is (a cluster's
                                   first seed), its backoff, breaker and pool;
                                   node0.redis NULL: in-memory */
    hirate_cluster *cluster;    /* a Redis Cluster's nodes and map, or NULL */
    hirate_memory *memory;      /* the buckets without a URL; with one, the
                                   LOCAL fallback's (NULL for OPEN, CLOSED) */
    hirate_shm *shm;            /* with shared: the table in place of memory,
                                   shared with the processes forked since */
    hirate_memory *cache;       /* refusals foretold from Redis' replies */
    uint64_t reset_epoch;       /* bumped by every reset (atomic) */
    int64_t offset_min[2];      /* least (Redis time - send time) seen in this
                                   window and the last one (atomic) */
    int64_t offset_window;      /* when this window began (atomic) */
    uint64_t cache_hits, policy;/* counters (atomic) */
    uint64_t op_evalsha, op_eval, op_fcall, op_loads;/* sent by ops (atomic) */
    uint64_t serial;            /* this limiter's number, for last_error */
};

/* Node id of the limiter: node 0 is its own, a cluster's others are in its
 * table. NULL for a number never given. */
static inline hirate_node *node_of(hirate_limiter *l, int id)
{
    if (l->cluster)
        return hirate_cluster_node(l->cluster, id);
    return id == 0 && l->node0.redis ? &l->node0 : NULL;
}

/* Failures that the policy answers for; anything else is returned. */
static inline int is_outage(int rc)
{
    return rc == HIRATE_ECONNECT || rc == HIRATE_ETIMEDOUT || rc == HIRATE_EIO ||
           rc == HIRATE_EPROTO || rc == HIRATE_ESERVER;
}

/* The thread's last error is now msg, met on l (hirate_limiter_errmsg): returns rc. */
int hirate__remember(hirate_limiter *l, int rc, const char *msg);

/* A batch on its way through the limiter, in three steps:
 *   hirate__batch_begin  decides what needs no Redis: bad input, the memory
 *                 backend, the deny cache, and the policy while the breaker
 *                 keeps Redis alone; leaves the rest as calls (b->m of them);
 *   (the I/O)     someone sends the calls and fills rcs, ds and states:
 *                 redis.c in hirate_allow_many, or an op's legs (op.c);
 *   settling      hirate__breaker_outcome tells the breaker, and
 *                 hirate__settle_call teaches the deny cache and lets the
 *                 policy answer the calls that met a failure (decide.c's
 *                 batch_settle after one Redis, op.c's leg_settle per leg). */
typedef struct batch {
    hirate_limiter *l;
    hirate_item *items;
    size_t n;               /* items */
    int keep_msgs;          /* keep each failed item's message (an op) */
    char **msgs;            /* and those messages, or NULL */
    char *out_msgs;         /* or write them here, out_len bytes an item
                               (hirate_allow_many_msgs), or NULL */
    size_t out_len;
    char *call_msgs;        /* with out_msgs: each call's own message from
                               the blocking client (HIRATE_ERRMSG_SIZE a call) */
    int spend;
    int64_t now_us;         /* injected time, or < 0 */
    int64_t now;            /* the decision clock: injected or monotonic */
    size_t m;               /* calls for Redis */
    uint64_t epoch;         /* resets seen when the calls were made */
    hirate_decision *per;   /* each item's bands, nbands an item, or NULL */
    int own_per;            /* per is the batch's own (freed with it) */
    size_t *index;          /* item index of each call */
    hirate_call *calls;
    hirate_decision *ds;
    hirate_decision *cper;  /* each call's bands (nbands a call), or NULL for
                               one band: ds says it all */
    hirate_bucket *states;  /* each call's buckets, nbands a call */
    int *rcs;
    unsigned char *known;   /* the deny cache held the key */
    struct {                /* room for a single call: no allocation */
        size_t index;
        hirate_call call;
        hirate_decision d;
        hirate_decision per[HIRATE_BANDS_MAX];
        hirate_bucket state[HIRATE_BANDS_MAX];
        int rc;
        unsigned char known;
    } one;
} batch;

/* Counts the outcome of every item of a finished batch. */
static inline void count_items(hirate_limiter *l, const hirate_item *items, size_t n,
                               int spend)
{
    for (size_t i = 0; i < n; i++) {
        if (items[i].rc == 0)
            hirate_count_decision(l->counts, &items[i].decision, spend);
        else
            hirate_count_error(l->counts, items[i].rc);
    }
}

/* A call's rcs[] between the rounds of an op: still to send, or its item
 * already has its answer. (Codes are negative, NOSCRIPT, MOVED and ASK
 * small positive numbers.) */
#define CALL_PENDING 100
#define CALL_SETTLED 101

/* Returns the number of calls left for Redis (0: every item is decided). */
size_t hirate__batch_begin(batch *b, hirate_limiter *l, hirate_item *items, size_t n, int spend,
                           int64_t now_us, hirate_decision *per);
void hirate__batch_free(batch *b);
/* Keeps item i's message, for hirate_op_errmsg (only an op keeps them). */
void hirate__batch_note(batch *b, size_t i, const char *msg);
/* Asks node's breaker about calls sel[0..k) (all m calls when sel is NULL):
 * its verdict, after which SKIP has let the policy decide them. */
int hirate__breaker_enter(batch *b, hirate_node *node, const size_t *sel, size_t k);
/* Tells node's breaker what calls sel[0..k) met; returns the time until it
 * lets calls through again, for the policy. */
int64_t hirate__breaker_outcome(batch *b, hirate_node *node, int verdict, const size_t *sel,
                                size_t k, const char *err);
/* Call j's answer (its rcs[j]) becomes its item's. */
void hirate__settle_call(batch *b, size_t j, int64_t wait_us, const char *err);
/* A reset's part that needs no I/O: the key checked, and forgotten here. */
int hirate__reset_local(hirate_limiter *l, const void *key, size_t keylen, char *err,
                        size_t errlen);

/* Runs op's rounds on the nodes' pools until it is done (blocking.c). */
void hirate__op_run(hirate_limiter *l, hirate_op *op);

#endif
