/*
 * Nodes, and a Redis Cluster's map of slots to masters.
 *
 * Every Redis a limiter talks to is a node: its link (where, TLS, the
 * reconnect backoff), its circuit breaker, and the blocking client's pool of
 * connections to it. A single Redis is node 0 and nothing more. A cluster
 * adds the URL's other seeds and every node its map names, in a table that
 * only grows (HIRATE_IO_NODES_MAX at most), so that a node's number stays
 * valid for the limiter's life and can be read without a lock.
 *
 * The map: each slot's master, learnt from CLUSTER SLOTS, changed by MOVED.
 * It is refreshed when it is known to be out of date (a MOVED, a node that
 * failed or whose breaker is open, CLUSTERDOWN, TRYAGAIN), at most once per
 * HIRATE_CLUSTER_REFRESH_MS, by one op at a time, from a node whose breaker
 * is closed (chosen at random among them, so that a node that hangs is not
 * asked again and again). A slot with no known master goes to the first
 * healthy node, whose MOVED then teaches the map.
 *
 * A Sentinel URL uses the same table: its sentinels first (node 0 is the
 * first), then each master they name. "The map" is then the one address of
 * the service's master, asked with SENTINEL GET-MASTER-ADDR-BY-NAME of the
 * sentinels in turn (the one that answered last first, skipping those that
 * fail while another is healthy):
 *   - while no master is known (the start, or the known one was lost: it
 *     failed, answered READONLY, or ROLE said it is a replica), every op
 *     that needs one asks, and its calls wait a round for the answer;
 *   - while one is known but stale (its node failed), one op at a time
 *     asks, at most once per HIRATE_CLUSTER_REFRESH_MS;
 *   - while all is well, one op asks every HIRATE_SENTINEL_POLL_MS, so that
 *     a switch is seen even before the old master is demoted.
 * A new address is logged, and counted in master_changes.
 */
#ifndef HIRATE_CLUSTER_H
#define HIRATE_CLUSTER_H

#include <pthread.h>
#include <stdint.h>

#include "breaker.h"
#include "link.h"
#include "redis.h"
#include "reply.h"
#include "slot.h"

#define HIRATE_CLUSTER_REFRESH_MS 100
/* Redirections followed for one call before it gives up (an outage: the
 * cluster is moving the slot faster than the call can follow). */
#define HIRATE_CLUSTER_REDIRECTS_MAX 5
/* Bounds of a CLUSTER SLOTS reply: 16384 ranges of a master and replicas. */
#define HIRATE_CLUSTER_MAP_BYTES (8u << 20)
#define HIRATE_CLUSTER_MAP_ELEMS 16384
#define HIRATE_CLUSTER_MAP_STR 512

typedef struct hirate_node {
    hirate_link link;
    hirate_breaker breaker;
    hirate_redis *redis;        /* the blocking client's pool of connections */
    int id;
} hirate_node;

typedef struct hirate_cluster {
    pthread_mutex_t lock;       /* adding nodes; the refresh's state */
    int sentinel;               /* 1: a Sentinel service's table, not a cluster's */
    int nsentinels;             /* nodes [0, nsentinels) are the sentinels */
    int master;                 /* the service's master node, -1 unknown (atomic) */
    int turn;                   /* the sentinel to ask next */
    int announced;              /* the master last logged, -1 none */
    hirate_node *nodes[HIRATE_IO_NODES_MAX];   /* [0] is the limiter's own */
    int nnodes;                 /* published with a release store */
    uint16_t owner[HIRATE_SLOTS];/* a slot's master: node number + 1; 0 unknown (atomic) */
    int have_map;               /* a CLUSTER SLOTS reply was applied */
    int stale;                  /* the map is known to be out of date (atomic) */
    int refreshing;             /* ops that carry a refresh */
    int64_t last_refresh_us;    /* (atomic) */
    uint64_t rng;
    int pool_size, backoff_min_ms, backoff_max_ms;
    uint64_t refreshes, moved, asked;   /* counters (atomic) */
    uint64_t master_changes;
} hirate_cluster;

/* A cluster whose node 0 is n0 (the first seed, already made), with the
 * URL's other seeds added. 0, or HIRATE_ENOMEM. */
int hirate_cluster_init(hirate_cluster *c, hirate_node *n0, int pool_size, int backoff_min_ms,
                        int backoff_max_ms);
void hirate_cluster_destroy(hirate_cluster *c);

/* Makes a node: a copy of the seed's link to host:port in role, a breaker,
 * a pool. */
int hirate_node_init(hirate_node *n, const hirate_link *seed, const char *host, int port,
                     int role, int pool_size, int backoff_min_ms, int backoff_max_ms);
void hirate_node_destroy(hirate_node *n);

/* Node number id, or NULL. Lock-free. */
hirate_node *hirate_cluster_node(hirate_cluster *c, int id);
int hirate_cluster_count(hirate_cluster *c);
/* The number of host:port's node, made when it is new; -1 when the table is
 * full or memory ran out. */
int hirate_cluster_find(hirate_cluster *c, const char *host, int port);

/* The node that serves slot now (for a Sentinel service: its master, or -1
 * while none is known). */
int hirate_cluster_route(hirate_cluster *c, unsigned slot);
/* A Sentinel service's master node failed, answered READONLY, or is no
 * longer the master: forget it, so that the next op asks the sentinels. */
void hirate_cluster_master_lost(hirate_cluster *c, int node);
/* A MOVED: slot is served by node from now on, and the map is out of date. */
void hirate_cluster_moved(hirate_cluster *c, unsigned slot, int node);
void hirate_cluster_stale(hirate_cluster *c);

/* Should this op carry a refresh? The node to ask (prefer, when its breaker
 * is closed and it is not failing), or -1. A yes must be followed by
 * hirate_cluster_refresh_end. */
int hirate_cluster_refresh_begin(hirate_cluster *c, int64_t now_us, int prefer);
/* The refresh's reply from node `from` (NULL: it failed; then, while no map
 * is known at all, another node may be asked at once). 0, HIRATE_EREPLY for
 * an error reply (a node not in cluster mode; a sentinel that knows no such
 * master or is no sentinel at all), or HIRATE_EPROTO when the reply is not a
 * map (an address); err says which. */
int hirate_cluster_refresh_end(hirate_cluster *c, int from, const hirate_rnode *reply, char *err,
                               size_t errlen);

/* Reads "MOVED <slot> <host>:<port>" or "ASK ..." (host may be empty: the
 * node that replied). 1 with the fields, 0 when msg is neither or malformed. */
int hirate_redirect_parse(const char *msg, size_t len, int *ask, unsigned *slot, char host[256],
                          int *port);

/* Every (lo, hi, master host, port) range of a CLUSTER SLOTS reply, to fn.
 * 0, HIRATE_EREPLY for an error reply, or HIRATE_EPROTO with *why when the
 * reply is not a map. A master host
 * that is empty or "?" is `self` (the node that replied). */
typedef int (*hirate_slots_fn)(void *ctx, unsigned lo, unsigned hi, const char *host, int port);
int hirate_cluster_parse_slots(const hirate_rnode *reply, const char *self, hirate_slots_fn fn,
                               void *ctx, const char **why);

/* fork(): the child keeps the map, drops every node's connections. */
void hirate_cluster_fork_prepare(hirate_cluster *c);
void hirate_cluster_fork_release(hirate_cluster *c, int child);

#endif
