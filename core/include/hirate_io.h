/*
 * hirate_io.h: the limiter without I/O, for code that moves the bytes itself
 * (an event loop, nginx cosockets, a program with its own sockets).
 *
 * The core keeps every rule about talking to Redis: where to connect and with
 * which timeouts and TLS settings, which bytes open a connection and what its
 * replies mean, when a new connection may be tried (the reconnect backoff),
 * the bytes of every call and what each reply means, the circuit breaker, the
 * deny cache and the failure policy. The caller only connects, writes the
 * bytes it is given and feeds back the bytes it reads, and says when its I/O
 * failed. hirate's own blocking client (hirate_allow) is built on the same
 * functions, so every front end decides alike.
 *
 * A connection's life:
 *
 *   hirate_endpoint ep;  hirate_endpoint_get(lim, &ep);    where, timeouts, TLS
 *
 *   hirate_handshake *hs;
 *   if (hirate_handshake_start(lim, &hs, err, sizeof err) < 0)
 *       ... no new connection now (the backoff after a failure): fail the
 *           calls that needed one with hirate_op_fail(op, rc, err)
 *   connect to ep (TLS when ep.tls), within ep.connect_timeout_ms;
 *       on failure: state = hirate_handshake_fail(hs, HIRATE_ECONNECT, why)
 *   send hirate_handshake_request(hs); read; state = hirate_handshake_feed(...)
 *       (a timeout or a broken connection: hirate_handshake_fail(hs, code, why))
 *   state HIRATE_IO_PROBE: the first connection failed in a way that a TLS
 *       mismatch explains. Open a second connection to the same address with
 *       the other transport (TLS without verification when
 *       hirate_handshake_probe_tls(hs), else plain) within
 *       ep.probe_timeout_ms, send hirate_handshake_request(hs) on it and feed
 *       its reply as before; then close it.
 *   state HIRATE_IO_DONE: rc = hirate_handshake_result(hs, err, sizeof err):
 *       0, the first connection is ready for calls; else close it, and rc is
 *       the reason (an outage code, or a misconfiguration such as
 *       HIRATE_EAUTH or HIRATE_ETLS, which no policy hides)
 *   hirate_handshake_free(hs)
 *
 * A decision's (or a batch's) round trip:
 *
 *   hirate_op *op;
 *   if (hirate_op_start(lim, items, n, 1, -1, &op) == 1) {    0: all decided
 *       send hirate_op_request(op) on a ready connection
 *       loop: read; switch (hirate_op_feed(op, bytes, len, &used)):
 *             HIRATE_IO_MORE: keep the unused bytes, read more;
 *             HIRATE_IO_SEND: send hirate_op_request(op) (EVAL after NOSCRIPT);
 *             HIRATE_IO_DONE: every item has its rc and decision
 *       on a timeout or a broken connection: hirate_op_fail(op, code, why)
 *       close the connection if hirate_op_drop(op), or if bytes are left over
 *   }
 *   hirate_op_free(op);
 *
 * Codes given to _fail: HIRATE_ECONNECT (could not connect), HIRATE_ETIMEDOUT,
 * HIRATE_EIO (closed, reset, any other I/O error), HIRATE_ETLS (the TLS
 * library refused the peer: a certificate, a name, a protocol), or
 * HIRATE_ECLOSED (the caller gave up, e.g. a cancelled task: nothing is
 * learnt about Redis). `why` is the I/O library's words, or NULL.
 *
 * Nodes. Every Redis the limiter talks to is a node, named by a small
 * number that stays the same for the limiter's life: node 0 is the URL's
 * (a cluster's first seed); a Redis Cluster's other seeds and the nodes its
 * map names get the next numbers, up to HIRATE_IO_NODES_MAX. Each node has
 * its own endpoint, handshake, reconnect backoff and circuit breaker; keep
 * connections per node (hirate_node_endpoint(lim, node, ...) says where,
 * hirate_node_handshake_start(lim, node, ...) opens them). The functions
 * without "node" are node 0's.
 *
 * Legs and rounds. An op goes to Redis in rounds. A round has legs, at most
 * one per node: the request to send to that node, and its replies to feed
 * back. For a single Redis every round has one leg on node 0, and the
 * leg-less functions above (hirate_op_request, _feed, _drop) are leg 0's; a
 * cluster's op may have several legs, which may run at once, each on a
 * ready connection of its own node:
 *
 *   rc = hirate_op_start(lim, items, n, 1, -1, &op);   (1: there is a round)
 *   do {
 *       for leg in 0 .. hirate_op_legs(op) - 1:
 *           node = hirate_op_leg_node(op, leg); take a connection to node;
 *           send hirate_op_leg_request(op, leg, &len)
 *           read; hirate_op_leg_feed(op, leg, buf, len, &used) until
 *               HIRATE_IO_DONE (HIRATE_IO_MORE: keep the unused bytes, read more);
 *           on a timeout or a broken connection: hirate_op_leg_fail(op, leg, code, why)
 *           give the connection back, or close it if hirate_op_leg_drop(op, leg)
 *   } while (hirate_op_next(op) == HIRATE_IO_SEND);
 *
 * hirate_op_next is called once every leg of the round is done or failed:
 * HIRATE_IO_SEND starts a new round with new legs (the calls that provably
 * did not run: after NOSCRIPT, MOVED or ASK), HIRATE_IO_DONE means every item
 * has its rc and decision. All rounds of an op share one deadline: the
 * endpoint's timeout_ms from the first send. A leg may also carry the
 * cluster's map request; the core reads its reply (which may be longer than
 * HIRATE_IO_REPLY_MAX: it takes the bytes as they come, so the caller still
 * never buffers more than that) and routes the next rounds by it.
 *
 * A Sentinel URL's nodes are its sentinels (node 0 is the first) and the
 * masters they name. The core asks a sentinel where the master is (in a leg
 * of its own: the calls wait a round for it when no master is known yet, and
 * ride beside it when one is) and follows a failover: it asks again when
 * the master fails, answers READONLY, or a new connection's ROLE says it is
 * no longer the master, and every HIRATE_SENTINEL_POLL_MS while all is well.
 * A binding does nothing more for it than for a cluster: connect to the node
 * named, with that node's handshake (the sentinels' own credentials, ROLE
 * for a master), and run the legs.
 *
 * Every function here is safe to call from any thread for different objects;
 * one handshake or op is used by one thread at a time.
 */
#ifndef HIRATE_IO_H
#define HIRATE_IO_H

#include "hirate.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The states of a handshake or an op. */
enum { HIRATE_IO_MORE = 1, HIRATE_IO_SEND, HIRATE_IO_DONE, HIRATE_IO_PROBE };

/* What a batch's op (and hirate_decide_at) does with each item's cost: look
 * (hirate_peek), spend it when it passes (hirate_allow), or give it back
 * (hirate_refund: the deny cache forgets the key, the failure policy is a
 * refund's, see hirate_refund). */
enum { HIRATE_OP_PEEK = 0, HIRATE_OP_SPEND = 1, HIRATE_OP_REFUND = 2 };

/* The longest reply that a call or a handshake accepts, in bytes: a reader
 * never needs to buffer more than this for one reply. */
#define HIRATE_IO_REPLY_MAX 4096

/* The most nodes a limiter knows (seeds and the nodes of a cluster's map,
 * or sentinels and the masters they named). */
#define HIRATE_IO_NODES_MAX 256

/* How often a Sentinel service's master address is asked while all is well
 * (a failover is noticed sooner when the master fails or refuses a write). */
#define HIRATE_SENTINEL_POLL_MS 500

/* ---- where to connect -------------------------------------------------------- */

typedef struct hirate_endpoint {
    int is_unix;                /* 1: path is a unix socket (never TLS) */
    char host[256];             /* TCP host name or address, IPv6 without brackets */
    int port;
    char path[108];
    char where[300];            /* "host:port", "[v6]:port" or the path, for messages */
    int connect_timeout_ms;     /* TCP connect and TLS handshake together */
    int timeout_ms;             /* each reply, from the moment its request is sent */
    int probe_timeout_ms;       /* the mismatch probe of HIRATE_IO_PROBE */
    int tls;                    /* 1: TLS (rediss://) */
    int tls_verify;             /* 1: verify the certificate chain and the name */
    /* TLS settings (NULL when not set); they point into the limiter and
     * stay valid while it lives. */
    const char *tls_ca_file;    /* PEM bundle; NULL: the system's trust store */
    const char *tls_ca_dir;     /* hashed directory of CAs */
    const char *tls_cert_file;  /* client certificate (mutual TLS) */
    const char *tls_key_file;   /* and its key */
    const char *tls_server_name;/* SNI and the name verified; never NULL with
                                   tls: the option, or the URL's host */
} hirate_endpoint;

/* Fills *out. HIRATE_EINVAL for a limiter without a URL. */
HIRATE_EXPORT int hirate_endpoint_get(hirate_limiter *lim, hirate_endpoint *out);
/* The same for any node the core named (an op's leg); HIRATE_EINVAL for a
 * number it never gave. A node's endpoint never changes. */
HIRATE_EXPORT int hirate_node_endpoint(hirate_limiter *lim, int node, hirate_endpoint *out);
/* 1 for a Redis Cluster URL (redis+cluster://, rediss+cluster://), else 0. */
HIRATE_EXPORT int hirate_is_cluster(hirate_limiter *lim);
/* 1 for a Sentinel URL (redis+sentinel://, rediss+sentinel://), else 0. */
HIRATE_EXPORT int hirate_is_sentinel(hirate_limiter *lim);

/* ---- opening a connection ------------------------------------------------------ */

typedef struct hirate_handshake hirate_handshake;

/* May a new connection be opened now? 0 with *out: yes, go on as above. A
 * negative code: not now; err says why ("not reconnecting for 40 ms after:
 * connect to 127.0.0.1:6379: Connection refused"), and the code is the
 * failure's own, so a wrong password stays HIRATE_EAUTH during the backoff.
 * Only one caller at a time is let through after a failure. */
HIRATE_EXPORT int hirate_handshake_start(hirate_limiter *lim, hirate_handshake **out, char *err,
                                         size_t errlen);
/* hirate_handshake_start for a node's connection (its own backoff). */
HIRATE_EXPORT int hirate_node_handshake_start(hirate_limiter *lim, int node,
                                              hirate_handshake **out, char *err, size_t errlen);
/* The bytes to send now (AUTH, SELECT and a PING that proves the server is
 * Redis; during a probe, the probe's bytes). */
HIRATE_EXPORT const char *hirate_handshake_request(const hirate_handshake *hs, size_t *len);
/* Reads replies from buf: HIRATE_IO_MORE (read more; *used bytes were
 * taken), or HIRATE_IO_DONE. */
HIRATE_EXPORT int hirate_handshake_feed(hirate_handshake *hs, const char *buf, size_t len,
                                        size_t *used);
/* The I/O failed (see above): HIRATE_IO_PROBE or HIRATE_IO_DONE. */
HIRATE_EXPORT int hirate_handshake_fail(hirate_handshake *hs, int code, const char *why);
/* During HIRATE_IO_PROBE: 1 when the probe connection is TLS (without
 * verification), 0 when it is plain. */
HIRATE_EXPORT int hirate_handshake_probe_tls(const hirate_handshake *hs);
/* After HIRATE_IO_DONE: 0, or the code with its message in err. */
HIRATE_EXPORT int hirate_handshake_result(hirate_handshake *hs, char *err, size_t errlen);
/* Frees hs; one freed before its result teaches the backoff nothing. */
HIRATE_EXPORT void hirate_handshake_free(hirate_handshake *hs);

/* ---- calls --------------------------------------------------------------------- */

typedef struct hirate_op hirate_op;

/* Decides what needs no Redis (bad items, the deny cache, the policy while
 * the breaker is open); spend is a HIRATE_OP_* (1 and 0 as before). Returns 0 when every item is decided (*op is NULL),
 * 1 when *op has a request to send, or HIRATE_EINVAL (no URL, NULL items). */
HIRATE_EXPORT int hirate_op_start(hirate_limiter *lim, hirate_item *items, size_t n, int spend,
                                  int64_t now_us, hirate_op **op);
/* The same, and each item's band figures (as hirate_allow_bands gives them)
 * written to bands[i * B .. i * B + B), B = hirate_limiter_nbands(lim), as
 * the item is decided: at once, or by the op (bands must then outlive it).
 * bands NULL: as hirate_op_start. */
HIRATE_EXPORT int hirate_op_start_bands(hirate_limiter *lim, hirate_item *items, size_t n,
                                        int spend, int64_t now_us, hirate_decision *bands,
                                        hirate_op **op);
/* hirate_reset() as an op: checks the key (its HIRATE_EKEY is returned at
 * once), forgets it in the deny cache and the local buckets, and returns 1
 * with *op holding the DEL to send. hirate_op_result() gives its outcome. */
HIRATE_EXPORT int hirate_op_start_reset(hirate_limiter *lim, const void *key, size_t keylen,
                                        hirate_op **op);
/* hirate_check() as an op: 1 with *op holding its legs (one a node, after
 * a round of discovery when the nodes are not known), or HIRATE_EINVAL for a
 * limiter without Redis. After DONE, hirate_op_check() gives the nodes;
 * hirate_op_result() is what hirate_check() returns. */
HIRATE_EXPORT int hirate_op_start_check(hirate_limiter *lim, hirate_op **op);
/* A check op's nodes, as hirate_check() fills them. */
HIRATE_EXPORT int hirate_op_check(const hirate_op *op, hirate_check_node *nodes, size_t max,
                                  size_t *n);
HIRATE_EXPORT const char *hirate_op_request(const hirate_op *op, size_t *len);
/* Reads replies from buf; *used is how many bytes they took. */
HIRATE_EXPORT int hirate_op_feed(hirate_op *op, const char *buf, size_t len, size_t *used);
/* The I/O failed with code (see above); why may be NULL. The policy decides
 * every outage; HIRATE_ECLOSED settles the op without blaming Redis. */
HIRATE_EXPORT void hirate_op_fail(hirate_op *op, int code, const char *why);
/* True when the connection must be closed, not reused. */
HIRATE_EXPORT int hirate_op_drop(const hirate_op *op);

/* The legs of the op's current round (see the top comment): how many, the
 * node each goes to, its request, its replies, its failure, whether its
 * connection must be closed. leg_feed returns HIRATE_IO_MORE or
 * HIRATE_IO_DONE (that leg has all its replies). hirate_op_fail fails every
 * leg not yet done, and ends the op. Take a leg's request when it is sent,
 * on a connection already open: a check's latency_us runs from then. */
HIRATE_EXPORT size_t hirate_op_legs(const hirate_op *op);
HIRATE_EXPORT int hirate_op_leg_node(const hirate_op *op, size_t leg);
HIRATE_EXPORT const char *hirate_op_leg_request(const hirate_op *op, size_t leg, size_t *len);
HIRATE_EXPORT int hirate_op_leg_feed(hirate_op *op, size_t leg, const char *buf, size_t len,
                                     size_t *used);
HIRATE_EXPORT void hirate_op_leg_fail(hirate_op *op, size_t leg, int code, const char *why);
HIRATE_EXPORT int hirate_op_leg_drop(const hirate_op *op, size_t leg);
/* After every leg of the round is done or failed: HIRATE_IO_SEND (a new
 * round; its legs are there) or HIRATE_IO_DONE. */
HIRATE_EXPORT int hirate_op_next(hirate_op *op);
/* After DONE or a failure: item i's message when its rc is negative (else
 * NULL). For a reset op, i is 0. */
HIRATE_EXPORT const char *hirate_op_errmsg(const hirate_op *op, size_t i);
/* After DONE: item i's band figures (as hirate_allow_bands gives them) in
 * bands[0 .. min(nbands, the limiter's band count)); returns how many, or
 * HIRATE_EINVAL when item i has no decision (its rc is not 0, or no item i).
 * Items decided without Redis (hirate_op_start returned 0: no op) have
 * theirs only through hirate_op_start_bands. */
HIRATE_EXPORT int hirate_op_bands(const hirate_op *op, size_t i, hirate_decision *bands,
                                  size_t nbands);
/* A reset op's outcome: 0 or its code. A batch's: 0. */
HIRATE_EXPORT int hirate_op_result(const hirate_op *op);
HIRATE_EXPORT void hirate_op_free(hirate_op *op);

/* ---- for tests and benchmarks -------------------------------------------------- */

/* hirate_allow (spend 1), hirate_peek (spend 0) or hirate_refund (spend
 * HIRATE_OP_REFUND, cost the tokens) at an injected time in
 * microseconds: the memory backend's clock, or the script's time in Redis.
 * The shared test vectors state time explicitly; production never does. */
HIRATE_EXPORT int hirate_decide_at(hirate_limiter *lim, const void *key, size_t keylen,
                                   int64_t cost, int spend, int64_t now_us,
                                   hirate_decision *out);
/* The same, with each band's figures as hirate_allow_bands gives them. */
HIRATE_EXPORT int hirate_decide_at_bands(hirate_limiter *lim, const void *key, size_t keylen,
                                         int64_t cost, int spend, int64_t now_us,
                                         hirate_decision *out, hirate_decision *bands,
                                         size_t nbands);

/* Counters since the limiter was made. */
typedef struct hirate_counters {
    uint64_t connects;        /* connection attempts (the blocking client and
                                 handshakes started through this header) */
    uint64_t evalsha;         /* EVALSHA calls sent */
    uint64_t eval;            /* EVAL calls sent (after NOSCRIPT) */
    uint64_t conns_dropped;   /* its connections closed after an error */
    uint64_t cache_hits;      /* refusals answered by the deny cache */
    uint64_t policy;          /* decisions made by the failure policy */
    uint64_t breaker_opens;   /* times a failure opened the breaker */
    size_t memory_keys;       /* buckets held by the memory backend */
    size_t local_keys;        /* buckets held by the local fallback */
    size_t cache_keys;        /* refusals held by the deny cache */
    /* A Redis Cluster's (0 otherwise): */
    size_t nodes;             /* nodes known: seeds and the map's */
    uint64_t map_refreshes;   /* CLUSTER SLOTS requests made */
    uint64_t moved;           /* MOVED replies followed */
    uint64_t asked;           /* ASK replies followed */
    /* Redis Functions: */
    uint64_t fcall;           /* FCALL calls sent */
    uint64_t function_loads;  /* FUNCTION LOAD requests sent */
    /* A Sentinel service's (0 otherwise): */
    uint64_t sentinel_queries;/* SENTINEL GET-MASTER-ADDR-BY-NAME requests made */
    uint64_t master_changes;  /* times the master was found at a new address */
} hirate_counters;

HIRATE_EXPORT void hirate_counters_get(hirate_limiter *lim, hirate_counters *out);

#ifdef __cplusplus
}
#endif
#endif /* HIRATE_IO_H */
