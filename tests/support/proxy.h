/*
 * A TCP proxy for one test program, in a thread of its own: it listens on a
 * free loopback port and relays every connection to 127.0.0.1:<upstream>.
 * Client-to-server bytes pass at once; server-to-client bytes pass, wait, or
 * vanish as the test says, so that a reply can arrive after the client's
 * timeout (the late-reply fault) without stopping the server itself.
 *
 * The mode is read when bytes arrive from the server: bytes already held
 * keep the delay they arrived with, and bytes leave in the order they came.
 * A connection closed by either side is closed on the other; bytes still
 * held for a client that closed are thrown away and counted, which is how a
 * test proves that a late reply was never delivered.
 */
#ifndef HIRATE_TEST_PROXY_H
#define HIRATE_TEST_PROXY_H

#include <stdint.h>

typedef struct proxy proxy;

enum proxy_mode {
    PROXY_PASS,   /* relay server bytes at once */
    PROXY_DELAY,  /* hold each piece of server bytes delay_ms, then relay it */
    PROXY_DROP,   /* discard server bytes (a server that reads and never answers) */
    PROXY_TRICKLE /* relay server bytes one at a time, delay_ms apart */
};

typedef struct proxy_stats {
    uint64_t accepted;        /* client connections accepted */
    uint64_t open;            /* connection pairs open now */
    uint64_t to_server;       /* bytes relayed client -> server */
    uint64_t to_client;       /* bytes relayed server -> client */
    uint64_t dropped;         /* server bytes discarded by PROXY_DROP */
    uint64_t undelivered;     /* server bytes held when their client closed */
    uint64_t client_closes;   /* pairs ended by the client */
    uint64_t server_closes;   /* pairs ended by the server */
} proxy_stats;

/* Starts the proxy thread. Returns 0, or -1 with a message on stderr. */
int proxy_start(proxy **out, int upstream_port);
/* The loopback port clients connect to, and "redis://127.0.0.1:<port>". */
int proxy_port(const proxy *p);
const char *proxy_url(const proxy *p);
/* Sets the mode (and, for PROXY_DELAY and PROXY_TRICKLE, the delay) for bytes
 * arriving from now on. */
void proxy_set(proxy *p, int mode, int delay_ms);
/* Connections accepted from now on go to 127.0.0.1:<upstream_port> (a DNS
 * name or a load balancer that now points at another server); open ones stay
 * where they are. */
void proxy_set_upstream(proxy *p, int upstream_port);
void proxy_get_stats(proxy *p, proxy_stats *out);
/* Closes every connection, stops the thread and frees the proxy. NULL is ignored. */
void proxy_stop(proxy *p);

#endif
