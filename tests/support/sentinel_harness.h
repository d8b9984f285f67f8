/*
 * A throwaway Redis Sentinel group for one C test program.
 *
 * The group is built and driven by tests/support/redis_sentinel.py, run as a
 * child (`redis_sentinel.py start`), so the rules of building one live in one
 * place for every language. The child prints the group as one JSON line and
 * then answers commands on its stdin with one JSON line each; these functions
 * are that channel. Closing its stdin (sh_stop, or this program's exit,
 * however it exits) stops every node and removes the group's files; every
 * node dies with the child.
 *
 * Calls are serialised by a lock, so threads may share a group, but a call
 * blocks while the child works (sh_wait_switch for seconds).
 */
#ifndef HIRATE_SENTINEL_HARNESS_H
#define HIRATE_SENTINEL_HARNESS_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>

#define SH_NODES_MAX 8
#define SH_ACL_MAX 4

typedef struct sh_node {
    int port;
    pid_t pid;
} sh_node;

/* What to start (sh_start with NULL: 1 replica, 3 sentinels, no
 * passwords, plain). */
typedef struct sh_config {
    int replicas;                   /* as many (0: a master alone) */
    int sentinels;                  /* 0: 3 */
    const char *tls_dir;            /* make_certs.sh's directory (made when missing):
                                       TLS-only ports; NULL: plain */
    const char *password;           /* the data nodes' requirepass, or NULL */
    const char *sentinel_password;  /* the sentinels' requirepass, or NULL */
    const char *acl[SH_ACL_MAX];    /* ACL SETUSER rules on every data node, e.g.
                                       "nofn on >pw ~* +@all -function"; NULL ends */
    int down_after_ms;              /* 0: 1000 */
} sh_config;

typedef struct sh_group {
    /* Set by sh_start. */
    pid_t pid;              /* redis_sentinel.py; 0 when not running */
    FILE *to, *from;        /* its stdin and stdout */
    char url[1024];         /* "redis+sentinel://127.0.0.1:S1,.../mymaster" (no password) */
    char service[64];       /* "mymaster" */
    char dir[512];          /* the nodes' directories */
    int tls;
    char password[128];     /* the config's, "" when none */
    char sentinel_password[128];
    sh_node master;         /* as of the start, then of sh_master and sh_wait_switch */
    int nreplicas;
    sh_node replicas[SH_NODES_MAX];   /* as of the start */
    int nsentinels;
    sh_node sentinels[SH_NODES_MAX];
    pthread_mutex_t lock;
} sh_group;

/* Starts a group as cfg says (NULL: the defaults). Returns 0 once every
 * sentinel sees the master, its replicas and the other sentinels, or -1 with
 * a message on stderr. */
int sh_start(sh_group *g, const sh_config *cfg);
/* Stops the group (closing the channel) and waits for it. */
void sh_stop(sh_group *g);

/* The current master, asked of the servers (ROLE), into *out and g->master. 0 or -1. */
int sh_master(sh_group *g, sh_node *out);
/* SENTINEL FAILOVER on a sentinel (asked again while none can start one
 * yet); the old master into *old. 0 or -1. */
int sh_failover(sh_group *g, sh_node *old);
/* SIGKILL of the master; it into *old. 0 or -1. */
int sh_kill_master(sh_group *g, sh_node *old);
/* SIGKILL of any node of the group, a sentinel too. 0 or -1. */
int sh_kill(sh_group *g, int port);
/* Until every live sentinel names one master other than old_port and it says
 * ROLE master: it into *out (and g->master), and into *seen_us the
 * CLOCK_MONOTONIC time in microseconds when that was first seen. 0, or -1
 * after timeout_s. */
int sh_wait_switch(sh_group *g, int old_port, double timeout_s, sh_node *out, int64_t *seen_us);
/* Waits as sh_start does. 0 or -1. */
int sh_settle(sh_group *g, double timeout_s);
/* redis-cli PORT ARGS (ARGS: words split at spaces) through the child, with
 * the node's password and TLS; its stdout, malloc'ed (the caller frees it),
 * or NULL. */
char *sh_cli(sh_group *g, int port, const char *args);

/* One command on a fresh hiredis connection to 127.0.0.1:port, after AUTH
 * with the group's password for that node (the sentinels' own for a
 * sentinel); plain groups only (this hiredis has no TLS). The caller frees
 * the reply with freeReplyObject; NULL if unreachable. */
redisReply *sh_command(sh_group *g, int port, const char *fmt, ...);

/* 1 if port is one of the group's sentinels. */
int sh_is_sentinel(const sh_group *g, int port);

/* Arms a watchdog: if the program still runs after `seconds`, it prints
 * "<program>: FAILED, timed out ...", has every group of sh_start stopped and
 * exits with status 2, so a hang fails instead of stalling (SIGALRM). */
void sh_watchdog(const char *program, unsigned seconds);

#endif
