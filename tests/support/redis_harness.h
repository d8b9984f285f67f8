/*
 * A throwaway redis-server for one test program: a free loopback port, a
 * private temporary directory, no persistence. Never assumes a server runs.
 */
#ifndef HIRATE_REDIS_HARNESS_H
#define HIRATE_REDIS_HARNESS_H

#include <sys/types.h>

#include <hiredis/hiredis.h>

typedef struct rh_server {
    pid_t pid;          /* 0 when not running */
    int port;
    char dir[256];      /* working directory (removed by rh_stop) */
    char unixsock[300]; /* path of its unix socket */
    char url[128];      /* "redis://127.0.0.1:<port>" */
    const char *extra;  /* extra "--name value" arguments, or NULL */
} rh_server;

/* Starts redis-server on a free loopback port (and a unix socket) and waits
 * until it answers PING. Returns 0, or -1 with a message on stderr. */
int rh_start(rh_server *s);
/* Starts it again on the same port after rh_kill (same dir, same socket). */
int rh_restart(rh_server *s);
/* SIGKILL and reap; the dir stays for rh_restart. */
void rh_kill(rh_server *s);
/* SIGSTOP / SIGCONT. */
void rh_pause(rh_server *s);
void rh_resume(rh_server *s);
/* Stops it (SIGKILL if needed), reaps it and removes its directory. */
void rh_stop(rh_server *s);
/* One command on a fresh connection (argv style, like redisCommand's format);
 * the caller frees the reply with freeReplyObject. NULL if unreachable. */
redisReply *rh_command(rh_server *s, const char *fmt, ...);
/* Arms a watchdog: if the program is still running after `seconds`, it
 * prints "<program>: FAILED, timed out", kills the server, removes its
 * directory and exits with status 2, so a hang fails instead of stalling CI.
 * Call it after rh_start (it uses SIGALRM). */
void rh_watchdog(const rh_server *s, const char *program, unsigned seconds);
/* An integer field of INFO, e.g. rh_info_int(s, "total_connections_received"); -1 if absent. */
long long rh_info_int(rh_server *s, const char *field);

#endif
