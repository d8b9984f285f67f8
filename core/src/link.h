/*
 * The link to one Redis server: its URL, timeouts and TLS settings, the
 * OpenSSL context of the blocking client, and the reconnect backoff that
 * every front end obeys (hirate_handshake_start asks it).
 *
 * Backoff rule: after a connection (or its handshake) failed, no new one is
 * tried for a backoff that doubles from BACKOFF_FIRST_MS to BACKOFF_LAST_MS,
 * each wait jittered by +-25%; when it has run out, exactly one caller tries
 * while the others fail at once with the failure's own code and words.
 */
#ifndef HIRATE_LINK_H
#define HIRATE_LINK_H

#include <pthread.h>
#include <stdint.h>

#include "hirate_io.h"
#include "tls.h"
#include "url.h"

/* What a link's server is to the limiter, which decides its handshake. */
enum {
    HIRATE_LINK_REDIS = 0,  /* a Redis to decide on: AUTH and SELECT of the URL, PING */
    HIRATE_LINK_SENTINEL,   /* a sentinel: the sentinels' AUTH, PING */
    HIRATE_LINK_MASTER      /* the master a sentinel named: as REDIS, but ROLE for
                               PING, and a replica is refused */
};

typedef struct hirate_link {
    hirate_url url;         /* the credentials and db are the data nodes' */
    int role;               /* a HIRATE_LINK_* */
    char *sentinel_user, *sentinel_password;   /* a Sentinel URL's sentinels' */
    int functions;          /* 1: FCALL; 0: EVALSHA (the option, or the server
                               refused Redis Functions) (atomic) */
    hirate_log_fn log;      /* the limiter's log, and its argument */
    void *log_arg;
    int connect_timeout_ms, timeout_ms;
    int tls_verify;
    char *tls_ca_file, *tls_ca_dir, *tls_cert_file, *tls_key_file, *tls_server_name;
    hirate_tls_ctx *tls;        /* the blocking client's context; NULL when plain */
    int tls_borrowed;           /* tls is a cluster seed's, freed with it */
    int server_name_given;      /* tls_server_name came from the options */

    int started;                /* hirate_link_start was called */
    pthread_mutex_t lock;       /* the backoff: */
    int failing;                /* the last attempt failed ... */
    int code;                   /* ... with this code */
    int backoff_ms;
    int64_t next_try_us;
    uint64_t jitter;
    char why[200];              /* ... and these words */
    uint64_t connects;          /* handshakes begun (atomic) */
} hirate_link;

/* Parses the URL, copies and checks the TLS options (a TLS option without
 * rediss:// is HIRATE_EOPTION), and makes the TLS context (a file that
 * cannot be read is HIRATE_ETLS naming it). */
int hirate_link_init(hirate_link *k, const hirate_options *o, char *err, size_t errlen);
/* Another node's link: seed's settings (credentials, timeouts, TLS, its TLS
 * context, the log) to host:port, in role. The name checked is the
 * option's, else host. 0, or HIRATE_ENOMEM. */
int hirate_link_clone(hirate_link *k, const hirate_link *seed, const char *host, int port,
                      int role);
/* The server refused Redis Functions (rc and msg its reply's class and
 * words): EVALSHA from now on, said once in the log. */
void hirate_link_no_functions(hirate_link *k, const char *msg, size_t len);
/* A line for the log, when there is one. */
void hirate_link_log(const hirate_link *k, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Readies the backoff, once the link is where it will stay. */
void hirate_link_start(hirate_link *k);
void hirate_link_destroy(hirate_link *k);
void hirate_link_endpoint(const hirate_link *k, hirate_endpoint *out);

/* hirate_handshake_start for the link. */
int hirate_link_handshake(hirate_link *k, hirate_handshake **out, char *err, size_t errlen);
/* A handshake's outcome, for the backoff: 0 (connected), HIRATE_ECLOSED
 * (given up: nothing learnt), or the failure with its words. */
void hirate_link_outcome(hirate_link *k, int rc, const char *why);

/* fork(): prepare takes the backoff lock; both sides release it after. */
void hirate_link_fork_prepare(hirate_link *k);
void hirate_link_fork_release(hirate_link *k, int child);

#endif
