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

typedef struct hirate_link {
    hirate_url url;
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
/* A cluster node's link: seed's settings (credentials, timeouts, TLS, its
 * TLS context) to host:port. The name checked is the option's, else host.
 * 0, or HIRATE_ENOMEM. */
int hirate_link_clone(hirate_link *k, const hirate_link *seed, const char *host, int port);
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
