/*
 * A throwaway redis-server for one test program: a free loopback port, a
 * private temporary directory, no persistence. Never assumes a server runs.
 *
 * With `tls` set it listens on a TLS port as well, with the certificates of
 * tests/support/make_certs.sh; the plain port stays, so that rh_command and
 * rh_info_int (hiredis 0.14 has no TLS) work on every server alike.
 */
#ifndef HIRATE_REDIS_HARNESS_H
#define HIRATE_REDIS_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>

typedef struct rh_server {
    pid_t pid;          /* 0 when not running */
    int port;
    char dir[256];      /* working directory (removed by rh_stop) */
    char unixsock[300]; /* path of its unix socket */
    char url[128];      /* "redis://127.0.0.1:<port>"; with tls "rediss://localhost:<tls_port>" */
    const char *extra;  /* extra "--name value" arguments, or NULL */

    /* TLS, set before rh_start (all zero: a plain server, as before). */
    int tls;                /* 1: also a TLS port, and url is rediss:// */
    int tls_auth_clients;   /* 1: the TLS port requires a client certificate (mutual TLS) */
    const char *tls_cert;   /* the server's certificate, by make_certs.sh's name:
                               NULL or "server", "wronghost", "expired", "selfsigned" */
    const char *certs_dir;  /* make_certs.sh's directory, shared by the program's
                               servers (rh_certs_new); NULL: one inside dir */
    /* Set by rh_start. */
    int tls_port;           /* 0 without tls */
    char plain_url[128];    /* "redis://127.0.0.1:<port>", with or without tls */
    char certs[300];        /* the certificates' directory (tls only) */
    char ca_file[320];      /* <certs>/ca.crt (tls only) */
} rh_server;

/* Makes a temporary directory holding make_certs.sh's certificates, for the
 * servers of one program to share (making them takes a second or two). Its
 * path goes into out. 0, or -1 with a message on stderr. */
int rh_certs_new(char *out, size_t cap);
/* Runs make_certs.sh into dir (it does nothing when they are there). */
int rh_certs_make(const char *dir);
/* Removes a directory of rh_certs_new. */
void rh_certs_remove(const char *dir);
/* "<certs>/<name>" of a started TLS server, in out. */
const char *rh_cert_path(const rh_server *s, const char *name, char *out, size_t cap);

/* Starts redis-server on a free loopback port (and a unix socket; with tls a
 * second free port for TLS, making the certificates first when needed) and
 * waits until it answers PING. Returns 0, or -1 with a message on stderr. */
int rh_start(rh_server *s);
/* Starts it again on the same port(s) after rh_kill (same dir, same socket). */
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

/* How many error replies of this code the server gave (INFO errorstats,
 * e.g. rh_error_count(s, "NOSCRIPT")); 0 if none. */
long long rh_error_count(rh_server *s, const char *code);

#endif
