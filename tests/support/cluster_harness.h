/*
 * A throwaway Redis Cluster for one C test program.
 *
 * The cluster is built and driven by tests/support/redis_cluster.py, run as
 * a child (`redis_cluster.py start`), so the rules of building one live in
 * one place for every language. The child prints the cluster as one JSON
 * line and then answers commands on its stdin, one line each ("ok ..." or
 * "err ..."); these functions are that channel. Closing its stdin (ch_stop,
 * or this program's exit, however it exits) stops every node and removes the
 * cluster's files; every node dies with the child.
 *
 * Calls are serialised by a lock, so threads may share a cluster, but a call
 * blocks while the child works (ch_wait_failover for seconds).
 */
#ifndef HIRATE_CLUSTER_HARNESS_H
#define HIRATE_CLUSTER_HARNESS_H

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#define CH_NODES_MAX 32
#define CH_RANGES_MAX 64

typedef struct ch_node {
    int port;
    pid_t pid;
    int master;             /* 1: a master (a failed one keeps the flag, without slots);
                               0: a replica */
    int alive;              /* 0 after ch_kill */
    int paused;             /* 1 between ch_pause and ch_resume */
    char id[48];
    char master_id[48];     /* a replica's master; "" for a master */
    int nranges;
    int ranges[CH_RANGES_MAX][2];   /* [lo, hi] slot ranges a master owns */
} ch_node;

typedef struct ch_cluster {
    /* Set by ch_start. */
    pid_t pid;              /* redis_cluster.py; 0 when not running */
    FILE *to, *from;        /* its stdin and stdout */
    char url[1024];         /* "redis+cluster://127.0.0.1:P,..." or "rediss+cluster://localhost:P,..." */
    char dir[512];          /* the nodes' directories */
    int tls;
    int n;
    ch_node nodes[CH_NODES_MAX];    /* as of the last ch_refresh (ch_start and the
                                       calls that change roles refresh it) */
    pthread_mutex_t lock;
} ch_cluster;

/* Starts `masters` masters with `replicas` replicas each (masters >= 3, as
 * redis-cli --cluster create wants); tls_dir: make_certs.sh's directory (made
 * when missing), the nodes then listen for TLS only; NULL: plain. Returns 0
 * once every node agrees on the slots, or -1 with a message on stderr. */
int ch_start(ch_cluster *c, int masters, int replicas, const char *tls_dir);
/* Stops the cluster (closing the channel) and waits for it. */
void ch_stop(ch_cluster *c);
/* Reloads c->nodes from CLUSTER NODES. 0 or -1. */
int ch_refresh(ch_cluster *c);

/* The master owning slot, the node on port, a live replica of master m
 * (NULL when there is none), all as of the last refresh. */
ch_node *ch_master_of(ch_cluster *c, int slot);
ch_node *ch_node_by_port(ch_cluster *c, int port);
ch_node *ch_replica_of(ch_cluster *c, const ch_node *m);
/* 1 if master m owns slot. */
int ch_owns(const ch_node *m, int slot);

/* SIGKILL, SIGSTOP, SIGCONT of one node (by the child, which knows it then). */
int ch_kill(ch_cluster *c, const ch_node *n);
int ch_pause(ch_cluster *c, const ch_node *n);
int ch_resume(ch_cluster *c, const ch_node *n);

/* Redis' own CLUSTER KEYSLOT of a key; -1 on failure. */
int ch_keyslot(ch_cluster *c, const void *key, size_t len);
/* The same for n keys at once (one pipeline): out[i]. 0 or -1. */
int ch_keyslots(ch_cluster *c, size_t n, const void *const *keys, const size_t *lens, int *out);
/* For each key, the port of the live master holding it (EXISTS), 0 when none
 * does: out[i]. 0 or -1. */
int ch_where(ch_cluster *c, size_t n, const void *const *keys, const size_t *lens, int *out);

/* Moves slot from master src to master dst with its keys (IMPORTING,
 * MIGRATING, MIGRATE, SETSLOT NODE on every master); then refreshes. 0 or -1.
 * The steps alone, for a slot caught mid-migration: */
int ch_migrate_slot(ch_cluster *c, int slot, const ch_node *src, const ch_node *dst);
int ch_migrate_begin(ch_cluster *c, int slot, const ch_node *src, const ch_node *dst);
/* MIGRATEs up to count keys (count < 0: all); returns how many, or -1. */
int ch_migrate_keys(ch_cluster *c, int slot, const ch_node *src, const ch_node *dst, int count);
int ch_migrate_finish(ch_cluster *c, int slot, const ch_node *dst);

/* Waits until a replica of `old` (a master, as of the last refresh) owns
 * all old's slots and every live node says cluster_state:ok; refreshes and
 * returns the new master, or NULL after timeout_s. */
ch_node *ch_wait_failover(ch_cluster *c, const ch_node *old, double timeout_s);

/* Waits as ch_start does: every live node says cluster_state:ok, all agree
 * on the slots' owners, every live replica's link is up. 0 or -1. */
int ch_settle(ch_cluster *c, double timeout_s);
/* CONFIG SET name value on every live node. 0 or -1. */
int ch_config_set(ch_cluster *c, const char *name, const char *value);
/* The sum of rejected_calls (a MOVED or ASK answer is one) and of calls of
 * every command over INFO commandstats of the live nodes; CONFIG RESETSTAT
 * on all of them with ch_reset_stats. 0 or -1. */
int ch_stats(ch_cluster *c, long long *calls, long long *rejected);
int ch_reset_stats(ch_cluster *c);

/* "redis+cluster://127.0.0.1:<port>" (or rediss+cluster://localhost:...) of
 * one node alone, in out. */
const char *ch_node_url(const ch_cluster *c, const ch_node *n, char *out, size_t cap);

/* Arms a watchdog: if the program still runs after `seconds`, it prints
 * "<program>: FAILED, timed out ...", has every cluster of ch_start stopped
 * and exits with status 2, so a hang fails instead of stalling (SIGALRM). */
void ch_watchdog(const char *program, unsigned seconds);

#endif
