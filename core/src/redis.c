/*
 * The Redis backend: connection pool, handshake, and requests pipelined by
 * the threads that share a connection.
 *
 * A call takes an idle connection, or opens one when none is idle, and makes
 * its own round trip: a lone caller does nothing else (one look at the
 * queue's head, under the pool lock it takes anyway, and the bookkeeping of
 * its turn). A decision that finds no connection idle while RIDE_OPEN are
 * open does not open one of its own, nor wait for one to come free: its
 * request goes on the wire of one in use, behind the requests already there
 * (a `turn` on its caller's stack, linked at the connection's tail).
 *
 * Turns. The requests on a connection's wire are a queue of turns, in the
 * order their bytes were sent, and the first reads. A turn's bytes are
 * encoded and linked under the pool lock, so that bytes and turns are in
 * one order; one thread at a time writes (`sending`): a turn that finds
 * nobody writing writes its bytes itself, while others read; one that
 * finds a writer leaves its bytes in the connection's `out`, which the
 * writer sends after its own (a lone caller's write ends with one compare-
 * and-swap when nothing came). A turn that finds another waiting already
 * behind the reader leaves its bytes too, for the reader to send when it
 * lets go (flush()):
 * one write and one read by the server for many calls where the wire is
 * deep, a write at once where it is not. The first turn reads its replies into its own
 * places, as in one thread's batch, leaves the bytes after them (later
 * turns' replies) in the buffer, and hands the connection to the next turn
 * by its semaphore. So no thread waits for another's round trip to end
 * before its request goes out, and proto.c's check of each reply's echoed
 * key still guards every reply.
 *
 * What stays as it was:
 *  - each call's own timeout from its start: a turn waiting behind others
 *    waits until its own deadline; if its replies have not come by then, it
 *    breaks the stream (shutdown(), which ends the reads of the turn ahead)
 *    and returns ETIMEDOUT: its reply is in doubt, and so is every one
 *    after it;
 *  - no call sent twice unless it provably did not run: after NOSCRIPT (or
 *    "Function not found") with the code first, after a refusal of Redis
 *    Functions by EVALSHA, in the same way as one thread's batch
 *    (round_trip()); a turn goes again at the tail, and without the code
 *    when a turn behind whose requests it went has sent it since (one EVAL
 *    a connection after SCRIPT FLUSH);
 *  - a failure of the stream (a timeout, a broken or out-of-step stream, a
 *    write that failed) closes that connection only, and every turn on it
 *    gets the failure: their calls may have run. A reply that says the
 *    connection must go (READONLY, LOADING) lets the turns behind read
 *    theirs, and the last closes it;
 *  - the deny cache and the breaker: decide.c sees each caller's calls
 *    answered as if its own round trip had answered them;
 *  - fork(): the pool lock is held across it; the child closes its copies of
 *    the connections quietly and forgets their turns and the queue (their
 *    threads are not there), as it forgets the idle list;
 *  - the pool bound: no connection is opened for a turn.
 *
 * Over TLS one SSL object must not be written by one thread while another
 * reads it: there a decision that finds no connection idle queues (a
 * `rider`, with its own semaphore) and rides the next round trip. When a
 * connection comes free, the first queued call is handed it and leads;
 * before it unlocks, the leader takes the other queued calls (up to
 * RIDE_CALLS_MAX), sends its calls and theirs in one write, reads the replies
 * in order into their places, and posts each one's semaphore with no lock
 * held. A queued call whose time runs out leaves the queue with "no
 * connection came free" (nothing was sent), and a call with less than
 * RIDE_LEFT_MIN left is not taken. Plain connections use the queue only
 * while none is open yet to go behind (the first ones being opened).
 */
#define _GNU_SOURCE /* sem_clockwait: a rider's wait on the monotonic clock */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "errors.h"
#include "link.h"
#include "memory.h"
#include "redis.h"
#include "transport.h"

/* A thread's requests on the wire of a connection, in the order they were
 * sent: the first reads its replies while the others wait their turn. */
typedef struct turn {
    struct turn *next;      /* atomic: the requests sent after these */
    size_t n;               /* calls */
    int64_t deadline;       /* its own: from its start */
    int state;              /* atomic: T_WAIT, T_READ (its replies are next), T_FAILED */
    int rc;                 /* with T_FAILED: the failure of the stream, its words in err */
    uint64_t seq;           /* the place of its last request on the wire */
    int io;                 /* the outcome of writing that request */
    int fcall;              /* how that request was encoded */
    uint8_t sends;          /* pipelines sent (again() sends a few more) */
    uint8_t queued;         /* its first request went out when it was appended */
    uint8_t owed;           /* it was put behind another turn: a post is owed it */
    uint8_t sem_ready;
    char *err;
    size_t errlen;
    sem_t wake;             /* posted once for each change to T_READ or T_FAILED */
} turn;

enum { T_WAIT, T_READ, T_FAILED };

typedef struct conn {
    hirate_sock sock;
    int slot;               /* its place in the pool, and so its TLS session */
    int reads;              /* reads in this round trip */
    struct conn *next;      /* in the idle list */
    /* Pipelining (under the pool lock but `sending`): the turns whose
     * requests are on the wire, the one reading first. */
    turn *head, *tail;
    size_t calls;           /* calls on the wire */
    uint64_t seq;           /* requests put on the wire, counted */
    uint64_t load_seq;      /* atomic: the place of the last that had the code first */
    int broken;             /* the stream failed: no more turns; the last out closes it */
    int sending;            /* atomic: 0, 1 (a thread writes), 2 (and bytes wait in out),
                               3 (bytes wait in out for the reader to write) */
    char *out;              /* bytes of later turns, for the thread that writes */
    size_t outlen, outcap;
    size_t rstart, rlen;    /* unread replies are rbuf[rstart, rlen) */
    char rbuf[HIRATE_PROTO_MAX_REPLY];
} conn;

/* A place in the pool. The TLS session stays with the place across
 * reconnects, offered only by the connection that holds it: never shared
 * between threads. */
typedef struct slot {
    conn *c;
    int taken;          /* c is open or being opened */
    void *session;      /* SSL_SESSION * to resume, or NULL */
} slot;

struct hirate_redis {
    hirate_link *link;
    int pool_size;
    int timeout_ms;
    pthread_mutex_t lock;
    pthread_cond_t freed;       /* a connection went back to the pool */
    slot *slots;                /* cfg.pool_size */
    conn *idle;
    int open;                   /* connections open or being opened */
    int waiting;                /* resets waiting for a connection */
    struct rider *qhead, *qtail;   /* calls waiting to ride the next round trip */
    hirate_redis_stats stats;   /* updated with relaxed atomics */
};

#define STAT_INC(r, field) __atomic_fetch_add(&(r)->stats.field, 1, __ATOMIC_RELAXED)

/* A decision opens a connection only while fewer than this many are open
 * (or being opened), and never more than pool_size; past that, finding none
 * idle, it goes behind the turns on one of them (over TLS: it rides the next
 * round trip). Measured on one loopback redis-server (bench_threads, 100,000
 * keys; 2 cores, a round trip of 55 µs), side by side: with pipelining 1, 2
 * and 4 made the same decisions a second within the noise at 8 and 50
 * threads, each 1.4-1.5 times what riding made at 8 threads; 4 keeps a call
 * from waiting behind one slow reply more than 1 would. For riding, 4 made
 * 1.7 times what 1 made with 8 threads and 1.6 times with 50; 8 no more
 * than 4. Resets and leases still use the whole pool. */
#define RIDE_OPEN 4
/* A round trip carries at most this many calls of other threads... */
#define RIDE_CALLS_MAX 256
/* ... and only those with this much of their own time left (µs; an eighth
 * of the timeout when that is less): a call about to time out had better do
 * it in the queue, where nothing was sent. */
#define RIDE_LEFT_MIN 2000

enum { QUEUED, RIDING, LEAD, DONE };

/* A call waiting in the queue (on its caller's stack). */
typedef struct rider {
    const hirate_call *calls;
    size_t n;
    hirate_decision *ds;
    hirate_decision *per;       /* each call's bands, nbands a call */
    hirate_bucket *states;      /* likewise */
    int *rcs;
    char *msgs;                 /* each call's message, or NULL (see decide_many) */
    char *err;
    size_t errlen;
    int64_t deadline;           /* its own: from its start */
    int state;                  /* QUEUED, RIDING (sent by a leader), LEAD
                                   (given conn c: it leads the next round
                                   trip; c NULL: try to open one), DONE */
    int ret;                    /* with DONE: what decide_many returns */
    conn *c;
    struct rider *next;         /* in the queue, then among a leader's riders */
    struct rider *riders;       /* a leader's: the calls it carries */
    sem_t wake;                 /* posted once for each change to LEAD or DONE */
    turn t;                     /* its turn on the connection it writes on */
} rider;

/* A rider's state is read without the lock once it is posted: the writes
 * before a change (a leader's replies, ret) come before the change. */
static inline void set_state(rider *w, int state)
{
    __atomic_store_n(&w->state, state, __ATOMIC_RELEASE);
}

static inline int get_state(rider *w)
{
    return __atomic_load_n(&w->state, __ATOMIC_ACQUIRE);
}

/* ---- one connection -------------------------------------------------------- */

/* quiet: after fork(), not a byte sent and the parent's TLS state left alone. */
static void conn_close(hirate_redis *r, conn *c, int quiet)
{
    hirate_sock_close(&c->sock, quiet, quiet ? NULL : &r->slots[c->slot].session);
    free(c->out);
    free(c);
}

/* One exchange of the handshake on s: its request, then replies until the
 * op is done with them or wants something else. The deadline runs from the
 * sending. Bytes after the handshake's replies are kept in buf[*len]. */
static int exchange(hirate_handshake *hs, hirate_sock *s, int64_t deadline, char *buf, size_t cap,
                    size_t *len)
{
    char why[HIRATE_ERRMSG_SIZE];
    size_t reqlen, used;
    const char *req = hirate_handshake_request(hs, &reqlen);
    int rc = hirate_sock_send(s, req, reqlen, deadline, why, sizeof why);
    if (rc < 0)
        return hirate_handshake_fail(hs, rc, why);
    *len = 0;
    for (;;) {
        long n = *len == cap ? HIRATE_EIO
                             : hirate_sock_recv(s, buf + *len, cap - *len, deadline, why, sizeof why);
        if (n < 0) {
            if (*len == cap)
                snprintf(why, sizeof why, "a handshake reply over %zu bytes", cap);
            return hirate_handshake_fail(hs, (int)n, why);
        }
        *len += (size_t)n;
        int state = hirate_handshake_feed(hs, buf, *len, &used);
        memmove(buf, buf + used, *len - used);
        *len -= used;
        if (state != HIRATE_IO_MORE)
            return state;
    }
}

/* The mismatch probe: the other transport, to the same address, within the
 * probe's own timeout; whatever it learns, its connection is closed. */
static int probe(hirate_handshake *hs, const hirate_endpoint *ep, char *buf, size_t cap)
{
    char why[HIRATE_ERRMSG_SIZE];
    int tls = hirate_handshake_probe_tls(hs);
    int64_t deadline = hirate_monotonic_us() + (int64_t)ep->probe_timeout_ms * 1000;
    hirate_sock s;
    size_t len;
    int rc = hirate_sock_connect(&s, ep, tls ? hirate_tls_probe_ctx() : NULL,
                                 tls ? HIRATE_SOCK_TLS_NOVERIFY : HIRATE_SOCK_PLAIN, NULL, deadline,
                                 why, sizeof why);
    if (rc < 0)
        return hirate_handshake_fail(hs, rc, why);
    int state = exchange(hs, &s, deadline, buf, cap, &len);
    hirate_sock_close(&s, 1, NULL);
    return state;
}

/* Opens a connection for the pool's place i: the link says whether one may
 * be tried now (the backoff), the handshake op what to send and what the
 * replies mean. */
static int conn_open(hirate_redis *r, int i, conn **out, char *err, size_t errlen)
{
    hirate_link *k = r->link;
    hirate_handshake *hs;
    hirate_endpoint ep;
    char why[HIRATE_ERRMSG_SIZE];
    size_t left = 0;
    int rc = hirate_link_handshake(k, &hs, err, errlen);
    if (rc < 0)
        return rc;   /* not now: fail fast with the last failure's code */
    conn *c = calloc(1, sizeof *c);
    if (!c) {
        hirate_handshake_free(hs);
        return hirate__fail(err, errlen, HIRATE_ENOMEM, "connect to Redis: out of memory");
    }
    c->slot = i;
    hirate_link_endpoint(k, &ep);
    int state;
    rc = hirate_sock_connect(&c->sock, &ep, k->tls, ep.tls ? HIRATE_SOCK_TLS : HIRATE_SOCK_PLAIN,
                             &r->slots[i].session,
                             hirate_monotonic_us() + (int64_t)ep.connect_timeout_ms * 1000, why,
                             sizeof why);
    int connected = rc >= 0;
    if (rc < 0)
        state = hirate_handshake_fail(hs, rc, why);
    else
        state = exchange(hs, &c->sock, hirate_monotonic_us() + (int64_t)ep.timeout_ms * 1000,
                         c->rbuf, sizeof c->rbuf, &left);
    if (state == HIRATE_IO_PROBE)
        state = probe(hs, &ep, c->rbuf, sizeof c->rbuf);
    if (state == HIRATE_IO_PROBE)   /* one probe answers the question */
        state = hirate_handshake_fail(hs, HIRATE_EIO, "the probe found nothing");
    rc = hirate_handshake_result(hs, err, errlen);
    hirate_handshake_free(hs);
    if (rc == 0 && left)
        rc = hirate__fail(err, errlen, HIRATE_EPROTO,
                          "malformed reply from Redis: bytes after the handshake's replies");
    if (rc < 0) {
        if (connected)   /* open, then given up: a handshake that failed */
            STAT_INC(r, dropped);
        conn_close(r, c, 0);
        return rc;
    }
    c->rstart = c->rlen = 0;
    *out = c;
    return 0;
}

static int conn_send(hirate_redis *r, conn *c, const char *buf, size_t len, int64_t deadline,
                     char *err, size_t errlen)
{
    int rc = hirate_sock_send(&c->sock, buf, len, deadline, err, errlen);
    if (rc == HIRATE_ETIMEDOUT)
        hirate__fail(err, errlen, rc, "sending to Redis took over %d ms", r->timeout_ms);
    return rc;
}

/* Reads more of the stream into c->rbuf, by deadline. */
static int conn_fill(hirate_redis *r, conn *c, int64_t deadline, char *err, size_t errlen)
{
    /* What is left of a reply goes to the front, so that the buffer has
     * room for the rest (and all of it when every byte was used). At the
     * first read of a round trip there is nothing to move. */
    if (c->rstart) {
        memmove(c->rbuf, c->rbuf + c->rstart, c->rlen - c->rstart);
        c->rlen -= c->rstart;
        c->rstart = 0;
    }
    if (c->rlen == sizeof c->rbuf)
        return hirate__fail(err, errlen, HIRATE_EPROTO,
                            "malformed reply from Redis: longer than %zu bytes", sizeof c->rbuf);
    /* Every wait is for what is left of the round trip's deadline, so that
     * neither a trickle of bytes nor one of whole replies (in a batch) can
     * stretch the call. */
    long n = hirate_sock_recv(&c->sock, c->rbuf + c->rlen, sizeof c->rbuf - c->rlen, deadline,
                              err, errlen);
    if (n == HIRATE_ETIMEDOUT)
        return hirate__fail(err, errlen, HIRATE_ETIMEDOUT, "no %sreply from Redis within %d ms",
                            c->reads ? "whole " : "", r->timeout_ms);
    if (n < 0)
        return (int)n;
    c->reads++;
    c->rlen += (size_t)n;
    return 0;
}

/* Reads the next reply of the stream by deadline. The reply points into
 * c->rbuf and stays valid until the next read. */
static int conn_read(hirate_redis *r, conn *c, int64_t deadline, hirate_reply *rep,
                     char *err, size_t errlen)
{
    for (;;) {
        if (c->rlen > c->rstart) {
            long used = hirate_proto_parse(c->rbuf + c->rstart, c->rlen - c->rstart, rep);
            if (used > 0) {
                c->rstart += (size_t)used;
                return 0;
            }
            if (used < 0)
                return hirate__fail(err, errlen, HIRATE_EPROTO, "malformed reply from Redis: %s",
                                    rep->why);
        }
        int rc = conn_fill(r, c, deadline, err, errlen);
        if (rc < 0)
            return rc;
    }
}

/* Starts a round trip: its deadline. */
static int64_t begin_roundtrip(hirate_redis *r, conn *c)
{
    c->reads = 0;
    return hirate_monotonic_us() + (int64_t)r->timeout_ms * 1000;
}

/* Ends a round trip: a byte nobody asked for means the stream is out of
 * step, which this connection can never recover from. */
static int end_roundtrip(conn *c, char *err, size_t errlen)
{
    int extra = c->rstart != c->rlen;
    c->rstart = c->rlen = 0;
    return extra ? hirate__fail(err, errlen, HIRATE_EPROTO,
                                "malformed reply from Redis: bytes after the reply")
                 : 0;
}

/* ---- the pool ---------------------------------------------------------------- */

/* Waits are timed on the monotonic clock, immune to clock steps. */
static void init_cond(pthread_cond_t *cond)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
}

hirate_redis *hirate_redis_new(const hirate_redis_cfg *cfg)
{
    hirate_redis *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->link = cfg->link;
    r->pool_size = cfg->pool_size;
    r->timeout_ms = cfg->link->timeout_ms;
    r->slots = calloc((size_t)cfg->pool_size, sizeof *r->slots);
    if (!r->slots) {
        free(r);
        return NULL;
    }
    pthread_mutex_init(&r->lock, NULL);
    init_cond(&r->freed);
    return r;
}

/* Closes every connection (quietly after fork()) and forgets the sessions. */
static void close_all(hirate_redis *r, int quiet)
{
    for (int i = 0; i < r->pool_size; i++) {
        slot *sl = &r->slots[i];
        if (sl->c)
            conn_close(r, sl->c, quiet);
        /* In a child the sessions are copies of the parent's: resuming them
         * from two processes would make them one client to the server. */
        hirate_sock_session_free(sl->session);
        memset(sl, 0, sizeof *sl);
    }
    r->idle = NULL;
    r->open = 0;
}

void hirate_redis_free(hirate_redis *r)
{
    if (!r)
        return;
    close_all(r, 0);
    pthread_cond_destroy(&r->freed);
    pthread_mutex_destroy(&r->lock);
    free(r->slots);
    free(r);
}

/* Closes a connection of the pool for good; under the lock. */
static void forget(hirate_redis *r, conn *c)
{
    slot *sl = &r->slots[c->slot];
    sl->c = NULL;
    sl->taken = 0;
    r->open--;
    STAT_INC(r, dropped);
    conn_close(r, c, 0);
}

/* ---- turns on one connection: requests pipelined behind those in flight ------------ */

static inline void turn_set(turn *t, int state)
{
    __atomic_store_n(&t->state, state, __ATOMIC_RELEASE);
}

static inline int turn_get(turn *t)
{
    return __atomic_load_n(&t->state, __ATOMIC_ACQUIRE);
}

static inline turn *turn_next(turn *t)
{
    return __atomic_load_n(&t->next, __ATOMIC_ACQUIRE);
}

/* A connection taken whole (idle, new, or handed on): t is its one turn, it
 * reads first, and its thread writes (under the lock). */
static inline void own(conn *c, turn *t)
{
    __atomic_store_n(&t->next, NULL, __ATOMIC_RELAXED);
    t->state = T_READ;
    c->head = c->tail = t;
    c->calls = t->n;
    t->seq = ++c->seq;
    __atomic_store_n(&c->sending, 1, __ATOMIC_RELAXED);
}

/* The stream of c cannot be trusted (under the lock): no more turns, and
 * the reader's wait ends now; the last out closes it. */
static void break_conn(conn *c)
{
    if (!c->broken) {
        c->broken = 1;
        shutdown(c->sock.fd, SHUT_RDWR);
    }
}

/* Room in c->out for len more bytes (under the lock). */
static int reserve(conn *c, size_t len)
{
    if (c->outlen + len <= c->outcap)
        return 0;
    size_t cap = c->outcap ? c->outcap : 1024;
    while (cap < c->outlen + len)
        cap *= 2;
    char *p = realloc(c->out, cap);
    if (!p)
        return HIRATE_ENOMEM;
    c->out = p;
    c->outcap = cap;
    return 0;
}

/* A turn's request, just linked at the tail (under the lock, room
 * reserved): 1 when nobody writes on c, and its thread must; else 0, its
 * bytes left in c->out for the thread that writes, or (defer, or bytes
 * deferred already, which must go first) for the reader to write when it
 * lets go (flush()). */
static int submit(conn *c, const char *buf, size_t len, int defer)
{
    int seen = 1;
    if (!__atomic_compare_exchange_n(&c->sending, &seen, 2, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED) &&
        seen == 0) {
        if (!defer) {
            __atomic_store_n(&c->sending, 1, __ATOMIC_RELAXED);
            return 1;
        }
        __atomic_store_n(&c->sending, 3, __ATOMIC_RELAXED);
    }
    memcpy(c->out + c->outlen, buf, len);
    c->outlen += len;
    return 0;
}

static void drop(hirate_redis *r, conn *c);
static int wait_sem(sem_t *sem, int64_t deadline);

/* The thread that writes on c: its own bytes, then those that later turns
 * left in c->out meanwhile, until none are left. `alone`: its turn reads
 * first, so that nobody else closes c (the common case: one compare-and-
 * swap when nothing came meanwhile). Returns its own bytes' outcome; a
 * failure to write later ones breaks the stream, and their turns learn it
 * from the reads. */
static __attribute__((noinline)) int write_later(hirate_redis *r, conn *c, int rc,
                                                 int64_t deadline)
{
    char why[HIRATE_ERRMSG_SIZE];
    int later = 0;
    pthread_mutex_lock(&r->lock);
    while (rc == 0 && later == 0 && c->outlen) {
        char *p = c->out;
        size_t plen = c->outlen, pcap = c->outcap;
        c->out = NULL;
        c->outlen = c->outcap = 0;
        __atomic_store_n(&c->sending, 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&r->lock);
        later = conn_send(r, c, p, plen, deadline, why, sizeof why);
        pthread_mutex_lock(&r->lock);
        if (!c->out) {   /* the buffer again, for the next bytes */
            c->out = p;
            c->outcap = pcap;
        } else {
            free(p);
        }
    }
    if (rc < 0 || later < 0) {
        break_conn(c);
        c->outlen = 0;
    }
    __atomic_store_n(&c->sending, 0, __ATOMIC_RELAXED);
    if (c->broken && !c->head)   /* the reader failed meanwhile and left c to us */
        drop(r, c);
    pthread_mutex_unlock(&r->lock);
    return rc;
}

static inline __attribute__((always_inline)) int
write_turns(hirate_redis *r, conn *c, const char *buf, size_t len, int64_t deadline, int alone,
            char *err, size_t errlen)
{
    int rc = len ? conn_send(r, c, buf, len, deadline, err, errlen) : 0, one = 1;
    if (__builtin_expect(rc == 0 && alone, 1) &&
        __atomic_compare_exchange_n(&c->sending, &one, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return 0;
    return write_later(r, c, rc, deadline);
}

/* Waits until t's replies are next on c (0) or its stream failed (t->rc,
 * its words in t->err). A turn whose own time runs out first breaks the
 * stream (its reply is in doubt, and so is every one after it) and waits for
 * the reader to let it go: ETIMEDOUT. */
static int await_turn(hirate_redis *r, conn *c, turn *t)
{
    t->owed = 0;   /* the state can change before the post comes: wait for it */
    if (wait_sem(&t->wake, t->deadline) != 0) {
        pthread_mutex_lock(&r->lock);
        if (turn_get(t) == T_WAIT)
            break_conn(c);
        pthread_mutex_unlock(&r->lock);
        wait_sem(&t->wake, 0);   /* the post that lets it go (or came as it timed out) */
        return hirate__fail(t->err, t->errlen, HIRATE_ETIMEDOUT, "no reply from Redis within %d ms",
                            r->timeout_ms);
    }
    return turn_get(t) == T_FAILED ? t->rc : 0;
}

/* Another pipeline of t's (again()): behind the turns sent since its last,
 * whose replies come before its own. Returns 1 when t's thread writes, 0
 * when its bytes wait in c->out, < 0 when nothing could be sent. */
static int requeue(hirate_redis *r, conn *c, turn *t, const char *buf, size_t len, int load)
{
    turn *next = NULL;
    int rc;
    pthread_mutex_lock(&r->lock);
    if (c->broken) {
        rc = hirate__fail(t->err, t->errlen, HIRATE_EIO, "the connection to Redis was dropped");
    } else if ((rc = reserve(c, len)) < 0) {
        hirate__fail(t->err, t->errlen, rc, "out of memory for a pipeline");
    } else {
        next = turn_next(t);
        if (next) {   /* the next reads, and t goes to the tail */
            c->head = next;
            turn_set(next, T_READ);
            __atomic_store_n(&t->next, NULL, __ATOMIC_RELAXED);
            __atomic_store_n(&c->tail->next, t, __ATOMIC_RELEASE);
            c->tail = t;
            if (!t->sem_ready) {
                sem_init(&t->wake, 0, 0);
                t->sem_ready = 1;
            }
            turn_set(t, T_WAIT);
            t->owed = 1;
        }
        t->seq = ++c->seq;
        if (load)
            __atomic_store_n(&c->load_seq, t->seq, __ATOMIC_RELAXED);
        rc = submit(c, buf, len, 0);
    }
    pthread_mutex_unlock(&r->lock);
    if (next)
        sem_post(&next->wake);
    return rc;
}

/* ---- the queue of riders (under the lock) ------------------------------------ */

static void queue_remove(hirate_redis *r, rider *w)
{
    rider **pp = &r->qhead, *prev = NULL;
    while (*pp && *pp != w) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp)
        return;
    *pp = w->next;
    if (r->qtail == w)
        r->qtail = prev;
}

/* A healthy connection that is free: a reset waiting for one gets it (they
 * are rare, and must not starve behind a stream of riders), else the first
 * queued call, which leads the next round trip, else the idle list. */
static inline __attribute__((always_inline)) void hand_on(hirate_redis *r, conn *c)
{
    rider *w = r->waiting ? NULL : r->qhead;
    if (w) {
        queue_remove(r, w);
        set_state(w, LEAD);
        w->c = c;
        sem_post(&w->wake);
        return;
    }
    c->next = r->idle;
    r->idle = c;
    if (r->waiting)
        pthread_cond_signal(&r->freed);
}

/* A connection was dropped: every queued call tries to open one (the link's
 * backoff lets one through and fails the others fast, as it would have
 * failed them had they not queued). */
static void wake_all_to_open(hirate_redis *r)
{
    for (rider *w = r->qhead, *next; w; w = next) {
        next = w->next;
        set_state(w, LEAD);
        w->c = NULL;
        sem_post(&w->wake);
    }
    r->qhead = r->qtail = NULL;
}

/* The leader of a round trip takes the queued calls that still have time,
 * up to RIDE_CALLS_MAX calls, in the order they came. */
static int64_t left_min(const hirate_redis *r)
{
    int64_t eighth = (int64_t)r->timeout_ms * 1000 / 8;
    return eighth < RIDE_LEFT_MIN ? eighth : RIDE_LEFT_MIN;
}

static void collect(hirate_redis *r, rider *me)
{
    int64_t now = hirate_monotonic_us(), min = left_min(r);
    size_t calls = 0;
    rider **tail = &me->riders;
    for (rider *w = r->qhead, *next; w && calls < RIDE_CALLS_MAX; w = next) {
        next = w->next;
        if (w->deadline - now < min || calls + w->n > RIDE_CALLS_MAX)
            continue;
        queue_remove(r, w);
        set_state(w, RIDING);
        w->next = NULL;
        *tail = w;
        tail = &w->next;
        calls += w->n;
    }
}

static void timespec_at(struct timespec *ts, int64_t us)
{
    ts->tv_sec = (time_t)(us / 1000000);
    ts->tv_nsec = (long)(us % 1000000) * 1000L;
}

/* Waits for a post of sem, by deadline (0: no limit): 0, or ETIMEDOUT. */
static int wait_sem(sem_t *sem, int64_t deadline)
{
    for (;;) {
        int rc;
        if (!deadline) {
            rc = sem_wait(sem);
        } else {
            struct timespec until;
            timespec_at(&until, deadline);
            rc = sem_clockwait(sem, CLOCK_MONOTONIC, &until);
        }
        if (rc == 0)
            return 0;
        if (errno == ETIMEDOUT)
            return ETIMEDOUT;
    }
}

/* Waits in the queue, without the lock, until a leader has answered the
 * call (1, returned unlocked), gives it a connection to lead with (0, *out),
 * or its time is up (< 0). 2: try again to take or open a connection. Called
 * and (but for 1) returns under the lock. */
static int ride(hirate_redis *r, rider *me, conn **out, char *err, size_t errlen)
{
    set_state(me, QUEUED);
    me->next = NULL;
    if (r->qtail)
        r->qtail->next = me;
    else
        r->qhead = me;
    r->qtail = me;
    pthread_mutex_unlock(&r->lock);
    if (wait_sem(&me->wake, me->deadline) != 0) {
        pthread_mutex_lock(&r->lock);
        if (get_state(me) == QUEUED) {   /* nothing was sent */
            queue_remove(r, me);
            goto busy;
        }
        /* Taken by a leader, whose round trip ends by the earliest deadline
         * of the calls it carries, or just given a connection: the post is
         * coming. */
        pthread_mutex_unlock(&r->lock);
        wait_sem(&me->wake, 0);
    }
    /* Posted: DONE (the leader's writes come before its post) or LEAD. */
    if (get_state(me) == DONE)
        return 1;
    pthread_mutex_lock(&r->lock);
    if (!me->c && hirate_monotonic_us() < me->deadline)
        return 2;   /* a connection was dropped: try to open one */
    if (me->c && hirate_monotonic_us() < me->deadline - left_min(r) / 2) {
        *out = me->c;
        return 0;
    }
    if (me->c)
        hand_on(r, me->c);   /* too late to send anything: pass it on */
busy:
    return hirate__fail(err, errlen, HIRATE_ETIMEDOUT,
                        "no Redis connection came free within %d ms", r->timeout_ms);
}

/* The connection whose requests a decision's go behind, when none is idle
 * and no more may be opened: one of plain TCP with turns on the wire and a
 * stream still good, the fewest calls on it (under the lock). Over TLS one
 * SSL object cannot be written by one thread while another reads it: those
 * calls ride the next round trip instead. */
static conn *appendable(hirate_redis *r)
{
    conn *best = NULL;
    for (int i = 0, seen = 0; i < r->pool_size && seen < r->open; i++) {
        conn *c = r->slots[i].c;
        seen += r->slots[i].taken;
        if (c && c->head && !c->broken && !c->sock.ssl && (!best || c->calls < best->calls))
            best = c;
    }
    return best;
}

/* Takes an idle connection, opens a new one while the pool has room (when
 * the link's backoff lets it), or waits: a reset (me NULL) for a connection
 * to be released, a decision in the queue of riders, which it may leave
 * answered (1). A decision that gets a connection with calls queued carries
 * them (me->riders). */
static int acquire(hirate_redis *r, conn **out, rider *me, char *err, size_t errlen)
{
    struct timespec until = {0, 0};   /* set before the first wait */

    pthread_mutex_lock(&r->lock);
    for (;;) {
        if (r->idle) {
            conn *c = r->idle;
            r->idle = c->next;
            /* Has the server closed this idle connection (its `timeout`,
             * CLIENT KILL, a restart), or sent bytes nobody asked for?
             * Then nothing of this call was sent on it, so another
             * connection may carry it. */
            if (hirate_sock_gone(&c->sock)) {
                forget(r, c);
                continue;
            }
            if (me) {
                if (__builtin_expect(r->qhead != NULL, 0))
                    collect(r, me);
                own(c, &me->t);
            }
            *out = c;
            pthread_mutex_unlock(&r->lock);
            return 0;
        }
        if (r->open < (me && RIDE_OPEN < r->pool_size ? RIDE_OPEN : r->pool_size)) {
            int i = 0;
            while (r->slots[i].taken)
                i++;
            r->slots[i].taken = 1;
            r->open++;
            pthread_mutex_unlock(&r->lock);

            conn *c = NULL;
            int rc = conn_open(r, i, &c, err, errlen);

            pthread_mutex_lock(&r->lock);
            if (rc < 0) {
                r->slots[i].taken = 0;
                r->open--;
                if (r->qhead)   /* room again: let a queued call try */
                    wake_all_to_open(r);
            } else {
                r->slots[i].c = c;
                if (me && r->qhead)
                    collect(r, me);
                if (me)
                    own(c, &me->t);
                *out = c;
            }
            pthread_mutex_unlock(&r->lock);
            return rc;
        }
        if (me) {
            if (!me->deadline) {
                me->deadline = hirate_monotonic_us() + (int64_t)r->timeout_ms * 1000;
                sem_init(&me->wake, 0, 0);
            }
            conn *c = appendable(r);
            if (c) {
                *out = c;
                return 3;   /* with the lock held */
            }
            int rc = ride(r, me, out, err, errlen);
            if (rc == 1)
                return 1;   /* answered, and unlocked */
            if (rc == 2)
                continue;
            if (rc == 0) {
                if (r->qhead)
                    collect(r, me);
                own(*out, &me->t);
            }
            pthread_mutex_unlock(&r->lock);
            return rc;
        }
        if (until.tv_sec == 0) {
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_sec += r->timeout_ms / 1000;
            until.tv_nsec += (long)(r->timeout_ms % 1000) * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
        }
        r->waiting++;
        int timed_out = pthread_cond_timedwait(&r->freed, &r->lock, &until) == ETIMEDOUT;
        r->waiting--;
        if (timed_out && r->idle && r->qhead) {
            /* kept idle for this reset, which gave up: a queued call leads */
            conn *c = r->idle;
            r->idle = c->next;
            hand_on(r, c);
        }
        if (timed_out) {
            pthread_mutex_unlock(&r->lock);
            return hirate__fail(err, errlen, HIRATE_ETIMEDOUT,
                                "all %d Redis connections stayed busy for %d ms",
                                r->pool_size, r->timeout_ms);
        }
    }
}

/* Closes a failed connection, and lets the queued calls and resets try
 * again (under the lock). */
static void drop(hirate_redis *r, conn *c)
{
    forget(r, c);
    if (r->qhead)
        wake_all_to_open(r);
    if (r->waiting)
        pthread_cond_signal(&r->freed);
}

/* Returns a healthy connection to the pool, or closes a failed one (a
 * reset's or a lease's: no turns). */
static void release(hirate_redis *r, conn *c, int healthy)
{
    pthread_mutex_lock(&r->lock);
    if (healthy)
        hand_on(r, c);
    else
        drop(r, c);
    pthread_mutex_unlock(&r->lock);
}

/* The end of t's turn, its replies read (or its stream failed: io < 0, in
 * the words of why). The next turn reads; when the stream failed, every turn
 * behind gets the failure (whether their calls ran is in doubt too); a
 * connection with no turns left goes back to the pool, or is closed once
 * nobody writes on it. */
static __attribute__((noinline)) void release_rest(hirate_redis *r, conn *c, turn *t,
                                                  int healthy, int io, const char *why)
{
    turn *next = turn_next(t), *failed = NULL;
    if (turn_get(t) == T_FAILED) {   /* let go already; c may be gone */
        pthread_mutex_unlock(&r->lock);
        return;
    }
    c->calls -= t->n < c->calls ? t->n : c->calls;
    if (__builtin_expect(next != NULL, 0)) {
        if (io < 0) {
            break_conn(c);
            failed = next;
            next = NULL;
        } else {
            if (!healthy)   /* the turns behind read their replies; the last closes it */
                c->broken = 1;
            c->head = next;
            turn_set(next, T_READ);
            if (r->qhead && !c->broken)   /* room on the wire: queued calls go behind */
                wake_all_to_open(r);
        }
    }
    if (!next) {
        c->head = c->tail = NULL;
        c->calls = 0;
        int writing = __atomic_load_n(&c->sending, __ATOMIC_RELAXED);
        if (writing == 3) {   /* bytes left for this reader: nobody is to read their replies */
            c->outlen = 0;
            writing = 0;
            __atomic_store_n(&c->sending, 0, __ATOMIC_RELAXED);
        }
        if (healthy && !c->broken)
            hand_on(r, c);
        else if (!writing)
            drop(r, c);
        /* else the thread writing on it closes it when done */
        /* Let go under the lock, so that none of them, timing out, looks
         * at c again; each is posted with no lock held. */
        for (turn *w = failed; w; w = turn_next(w)) {
            w->rc = io;
            hirate__fail(w->err, w->errlen, io, "%s", why);
            turn_set(w, T_FAILED);
        }
    }
    pthread_mutex_unlock(&r->lock);
    if (next) {
        sem_post(&next->wake);
        return;
    }
    for (turn *w = failed, *wn; w; w = wn) {
        wn = turn_next(w);   /* w may be gone once it is posted */
        sem_post(&w->wake);
    }
}

/* The bytes that turns left for the reader (submit()'s defer): written by
 * the reader as it lets go. */
static __attribute__((noinline)) void flush(hirate_redis *r, conn *c)
{
    pthread_mutex_lock(&r->lock);
    int deferred = __atomic_load_n(&c->sending, __ATOMIC_RELAXED) == 3;
    if (deferred)
        __atomic_store_n(&c->sending, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&r->lock);
    if (deferred)
        write_later(r, c, 0, hirate_monotonic_us() + (int64_t)r->timeout_ms * 1000);
}

static inline __attribute__((always_inline)) void release_turn(hirate_redis *r, conn *c, turn *t,
                                                                int healthy, int io,
                                                                const char *why)
{
    if (__builtin_expect(turn_get(t) == T_READ &&
                         __atomic_load_n(&c->sending, __ATOMIC_RELAXED) == 3, 0))
        flush(r, c);
    pthread_mutex_lock(&r->lock);
    if (__builtin_expect(!turn_next(t) && healthy && t->state == T_READ && !c->broken, 1)) {
        c->head = c->tail = NULL;   /* the common case: nobody went behind it */
        c->calls = 0;
        hand_on(r, c);
        pthread_mutex_unlock(&r->lock);
        return;
    }
    release_rest(r, c, t, healthy, io, why);   /* unlocks */
}

/* A call that did not run (rc NOSCRIPT or NOFUNC), sent by FCALL when fcall:
 * NOFUNC turns Redis Functions off for the server; NOSCRIPT after a refused
 * FUNCTION LOAD is NOFUNC too (by EVALSHA next). By EVALSHA, NOFUNC is just
 * an error reply. */
static __attribute__((noinline, cold)) int
not_run(hirate_redis *r, const hirate_reply *rep, int rc, int fcall, int refused, int *drop,
        char *err, size_t errlen)
{
    if (rc == HIRATE_PROTO_NOFUNC && fcall)
        hirate_link_no_functions(r->link, rep->top.str, rep->top.len);
    else if (rc == HIRATE_PROTO_NOFUNC)
        return hirate_proto_error_reply(rep, drop, err, errlen);
    else if (fcall && refused)
        return HIRATE_PROTO_NOFUNC;
    return rc;
}

/* One pipeline: the calls whose rcs[i] is `select` (all of them when select
 * is 0), by FCALL when fcall (else EVALSHA), with the code first when load
 * (FUNCTION LOAD before them, or the first as EVAL), answered in order. Each
 * answered call gets its rc; an I/O error, which leaves the stream's state
 * unknown, is every unanswered call's rc and the return value. */
static int pipeline(hirate_redis *r, conn *c, turn *t, const hirate_call *calls, size_t n,
                    int select, int fcall, int load, const hirate_bucket_cfg *cfg,
                    hirate_decision *ds, hirate_decision *per, hirate_bucket *states, int *rcs,
                    char *msgs, int *healthy, int64_t deadline, char *err, size_t errlen)
{
    /* Which calls this round trip carries (all, or those whose rc is
     * select), so that a failure of its stream reaches them and no other.
     * Without memory for the map, every call takes the failure. */
    unsigned char smallmap[64], *carried = NULL;
    if (select) {
        carried = n <= sizeof smallmap ? smallmap : malloc(n);
        for (size_t i = 0; carried && i < n; i++)
            carried[i] = rcs[i] == select;
    }
    int64_t started;
    int io;
    if (t->queued) {   /* its request went out as it was appended (append()) */
        t->queued = 0;
        io = t->io;
        started = deadline - (int64_t)r->timeout_ms * 1000;
    } else {
        if (deadline) {
            started = hirate_monotonic_us();
        } else {
            deadline = begin_roundtrip(r, c);
            started = deadline - (int64_t)r->timeout_ms * 1000;
        }
        t->deadline = deadline;
        char stackbuf[2048];
        size_t total = hirate_proto_batch_bound(calls, n, rcs, select, fcall, load);
        char *buf = total <= sizeof stackbuf ? stackbuf : malloc(total);
        if (!buf) {
            int rc = hirate__fail(err, errlen, HIRATE_ENOMEM, "out of memory for %zu calls", n);
            for (size_t i = 0; i < n; i++)
                if (!select || rcs[i] == select)
                    rcs[i] = rc;
            if (!t->sends++)   /* own(): it was to write first; the later turns' bytes go */
                write_turns(r, c, NULL, 0, deadline, 1, err, errlen);
            if (carried && carried != smallmap)
                free(carried);
            return 0;   /* nothing was sent: the connection is fine */
        }
        size_t len = hirate_proto_encode_batch(buf, total, calls, n, rcs, select, fcall, load);
        if (__builtin_expect(!t->sends++, 1)) {   /* own(): it writes first */
            io = write_turns(r, c, buf, len, deadline, 1, err, errlen);
        } else {
            /* The turns behind hand on by requeue() must find their bytes
             * sent, as release_turn() leaves them. */
            if (__atomic_load_n(&c->sending, __ATOMIC_RELAXED) == 3)
                flush(r, c);
            io = requeue(r, c, t, buf, len, load);
            if (io > 0)
                io = write_turns(r, c, buf, len, deadline, turn_get(t) == T_READ, err, errlen);
        }
        if (buf != stackbuf)
            free(buf);
    }
    /* Its replies come after those of the turns ahead of it. */
    if (__builtin_expect(t->owed, 0)) {
        int w = await_turn(r, c, t);
        if (io == 0)
            io = w;
    }
    if (io == 0)
        c->reads = 0;

    int sent_eval = 0, drop = 0, loaded = load, load_rc = 0;
    hirate_reply rep;
    char load_err[HIRATE_ERRMSG_SIZE];
    if (fcall && load) {
        STAT_INC(r, function_loads);
        if (io == 0)
            io = conn_read(r, c, deadline, &rep, err, errlen);
        int lo = io == 0 ? hirate_proto_load_outcome(&rep) : 0;
        if (lo == HIRATE_PROTO_NOFUNC) {
            hirate_link_no_functions(r->link, rep.top.str, rep.top.len);
            loaded = 0;   /* "Function not found" now means: go by EVALSHA */
        } else if (lo == HIRATE_ESERVER) {
            /* The server cannot take it now (READONLY, OOM, ...): the calls
             * that needed it meet that outage. */
            loaded = 0;
            load_rc = hirate_proto_error_reply(&rep, &drop, load_err, sizeof load_err);
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (select && rcs[i] != select)
            continue;
        if (fcall)
            STAT_INC(r, fcall);
        else if (load && !sent_eval++)
            STAT_INC(r, eval);
        else
            STAT_INC(r, evalsha);
        if (io == 0)
            io = conn_read(r, c, deadline, &rep, err, errlen);
        rcs[i] = io < 0 ? io
                        : hirate_proto_outcome(&rep, &calls[i], cfg, loaded, &ds[i],
                                               per ? per + i * (size_t)calls[i].nbands : NULL,
                                               states + i * (size_t)calls[i].nbands, &drop,
                                               err, errlen);
        if (rcs[i] == HIRATE_PROTO_NOSCRIPT && load_rc)
            rcs[i] = hirate__fail(err, errlen, load_rc, "%s", load_err);
        else if (rcs[i] > 0)   /* it did not run: how it goes again */
            rcs[i] = not_run(r, &rep, rcs[i], fcall, load && !loaded, &drop, err, errlen);
        if (rcs[i] < 0 && io == 0 && msgs)   /* its reply's own words */
            snprintf(msgs + i * HIRATE_ERRMSG_SIZE, HIRATE_ERRMSG_SIZE, "%s", err);
    }
    /* A byte nobody asked for is out of step, unless turns went behind. */
    if (io == 0 && !turn_next(t) && (io = end_roundtrip(c, err, errlen)) < 0)
        for (size_t i = 0; i < n; i++)
            if (!select || !carried || carried[i])
                rcs[i] = io;   /* out of step: none of this stream's replies can be trusted */
    if (io == 0)
        hirate_latency_add(&r->stats.latency, hirate_monotonic_us() - started);
    if (carried && carried != smallmap)
        free(carried);
    if (io < 0 || drop)
        *healthy = 0;
    return io;
}

/* The calls that provably did not run, again, as long as one of them is
 * left: after NOSCRIPT with the code first (FUNCTION LOAD, or EVAL) unless
 * another turn on the connection has just sent it, after NOFUNC by EVALSHA.
 * Each step is taken at most once, so there are at most four more
 * pipelines, and only on a server that has just started, lost the code or
 * refused Redis Functions. */
static __attribute__((noinline, cold)) int
again(hirate_redis *r, conn *c, turn *t, const hirate_call *calls, size_t n, int fcall, const hirate_bucket_cfg *cfg,
      hirate_decision *ds, hirate_decision *per, hirate_bucket *states, int *rcs, char *msgs,
      int *healthy, int64_t deadline, char *err, size_t errlen)
{
    int rc = 0, reloaded = 0;
    for (int pass = 0; rc == 0 && pass < 4; pass++) {
        int noscript = 0, nofunc = 0;
        for (size_t i = 0; i < n; i++) {
            noscript |= rcs[i] == HIRATE_PROTO_NOSCRIPT;
            nofunc |= rcs[i] == HIRATE_PROTO_NOFUNC;
        }
        if (nofunc) {
            /* EVALSHA for every call that did not run, NOSCRIPT ones too. */
            for (size_t i = 0; i < n; i++)
                if (rcs[i] == HIRATE_PROTO_NOSCRIPT)
                    rcs[i] = HIRATE_PROTO_NOFUNC;
            fcall = 0;
            rc = pipeline(r, c, t, calls, n, HIRATE_PROTO_NOFUNC, 0, 0, cfg, ds, per, states, rcs,
                          msgs, healthy, deadline, err, errlen);
        } else if (noscript) {
            /* The code first, unless a turn behind whose requests these
             * went has sent it since: on one connection it runs before the
             * calls sent after it, so that one NOSCRIPT costs one EVAL (or
             * FUNCTION LOAD) a connection. */
            int load = __atomic_load_n(&c->load_seq, __ATOMIC_RELAXED) <= t->seq || reloaded++;
            rc = pipeline(r, c, t, calls, n, HIRATE_PROTO_NOSCRIPT, fcall, load, cfg, ds, per,
                          states, rcs, msgs, healthy, deadline, err, errlen);
        } else {
            break;
        }
    }
    /* A round trip that broke gave its failure to the calls it had not
     * answered; the calls answered keep their answers, and those that were
     * to go again, never sent, get the failure too. */
    for (size_t i = 0; i < n; i++) {
        if (rcs[i] == HIRATE_PROTO_NOSCRIPT || rcs[i] == HIRATE_PROTO_NOFUNC)
            rcs[i] = rc < 0 ? rc
                            : hirate__fail(err, errlen, HIRATE_EREPLY,
                                           "Redis kept refusing the script");
    }
    return rc;
}

/* The calls of one thread on a connection: one pipeline, by FCALL or
 * EVALSHA as the server takes, then again() for those that did not run.
 * deadline 0: each pipeline's own timeout from its sending. */
static inline __attribute__((always_inline)) int
round_trip(hirate_redis *r, conn *c, turn *t, const hirate_call *calls, size_t n,
                      const hirate_bucket_cfg *cfg, hirate_decision *ds, hirate_decision *per, hirate_bucket *states, int *rcs,
                      char *msgs, int *healthy, int64_t deadline, char *err, size_t errlen)
{
    int fcall = t->queued ? t->fcall : __atomic_load_n(&r->link->functions, __ATOMIC_RELAXED);
    int rc = pipeline(r, c, t, calls, n, 0, fcall, 0, cfg, ds, per, states, rcs, msgs, healthy,
                      deadline, err, errlen);
    /* An answer is 0 or a negative code; only NOSCRIPT and NOFUNC, the
     * calls that did not run, are positive. */
    int more = 0;
    for (size_t i = 0; i < n; i++)
        more |= rcs[i] > 0;
    if (more && rc == 0)
        return again(r, c, t, calls, n, fcall, cfg, ds, per, states, rcs, msgs, healthy, deadline,
                     err, errlen);
    /* The stream broke: those that were to go again get the failure too. */
    for (size_t i = 0; more && i < n; i++)
        if (rcs[i] > 0)
            rcs[i] = rc;
    return rc;
}

/* A leader's round trip with riders: its calls and theirs in one pipeline,
 * by the earliest of their deadlines (a timeout then fails them all: the
 * connection's replies are in doubt, and so is whether each call ran). Each
 * rider gets its replies and, when one of its calls failed, the message. */
static int carry(hirate_redis *r, conn *c, rider *me, const hirate_bucket_cfg *cfg, int *healthy)
{
    size_t total = me->n;
    int64_t deadline = me->deadline ? me->deadline
                                    : hirate_monotonic_us() + (int64_t)r->timeout_ms * 1000;
    for (rider *w = me->riders; w; w = w->next) {
        total += w->n;
        if (w->deadline < deadline)
            deadline = w->deadline;
    }
    /* Every call of one pool has its limiter's bands; each call's bands go
     * beside its decision when there is more than one. */
    size_t nb = (size_t)me->calls[0].nbands;
    hirate_call *calls = malloc(total * sizeof *calls);
    hirate_decision *ds = malloc(total * sizeof *ds);
    hirate_decision *per = me->per ? malloc(total * nb * sizeof *per) : NULL;
    hirate_bucket *states = malloc(total * nb * sizeof *states);
    int *rcs = malloc(total * sizeof *rcs);
    char *msgs = calloc(total, HIRATE_ERRMSG_SIZE);
    int rc;
    if (!calls || !ds || (me->per && !per) || !states || !rcs || !msgs) {
        /* Nothing sent: each carries its own calls, one after the other. */
        rc = round_trip(r, c, &me->t, me->calls, me->n, cfg, me->ds, me->per, me->states, me->rcs,
                        me->msgs, healthy, deadline, me->err, me->errlen);
        for (rider *w = me->riders; w; w = w->next) {
            if (*healthy) {
                w->ret = round_trip(r, c, &me->t, w->calls, w->n, cfg, w->ds, w->per, w->states, w->rcs,
                                    w->msgs, healthy, deadline, w->err, w->errlen);
                continue;
            }
            w->ret = rc < 0 ? rc : HIRATE_EIO;
            for (size_t i = 0; i < w->n; i++)
                w->rcs[i] = w->ret;   /* not sent: the connection failed before */
            hirate__fail(w->err, w->errlen, w->ret, "%s", me->err);
        }
    } else {
        size_t k = 0;
        memcpy(calls, me->calls, me->n * sizeof *calls);
        k = me->n;
        for (rider *w = me->riders; w; w = w->next) {
            memcpy(calls + k, w->calls, w->n * sizeof *calls);
            k += w->n;
        }
        rc = round_trip(r, c, &me->t, calls, total, cfg, ds, per, states, rcs, msgs, healthy, deadline,
                        me->err, me->errlen);
        memcpy(me->ds, ds, me->n * sizeof *ds);
        if (me->msgs)
            memcpy(me->msgs, msgs, me->n * HIRATE_ERRMSG_SIZE);
        if (per)
            memcpy(me->per, per, me->n * nb * sizeof *per);
        memcpy(me->states, states, me->n * nb * sizeof *states);
        memcpy(me->rcs, rcs, me->n * sizeof *rcs);
        k = me->n;
        for (rider *w = me->riders; w; w = w->next) {
            int failed = 0;
            memcpy(w->ds, ds + k, w->n * sizeof *ds);
            if (per)
                memcpy(w->per, per + k * nb, w->n * nb * sizeof *per);
            memcpy(w->states, states + k * nb, w->n * nb * sizeof *states);
            memcpy(w->rcs, rcs + k, w->n * sizeof *rcs);
            if (w->msgs)
                memcpy(w->msgs, msgs + k * HIRATE_ERRMSG_SIZE, w->n * HIRATE_ERRMSG_SIZE);
            /* Its message: its last failed call's own, else the round
             * trip's failure; never another thread's call's. */
            const char *own = NULL;
            for (size_t i = 0; i < w->n; i++) {
                failed |= w->rcs[i] < 0;
                if (w->rcs[i] < 0 && msgs[(k + i) * HIRATE_ERRMSG_SIZE])
                    own = msgs + (k + i) * HIRATE_ERRMSG_SIZE;
            }
            if (failed && w->errlen)
                snprintf(w->err, w->errlen, "%s", own ? own : me->err);
            w->ret = rc;
            k += w->n;
        }
    }
    free(calls);
    free(ds);
    free(per);
    free(states);
    free(rcs);
    free(msgs);
    return rc;
}

static inline void turn_init(turn *t, size_t n, char *err, size_t errlen)
{
    t->n = n;
    t->sends = 0;
    t->queued = 0;
    t->owed = 0;
    t->sem_ready = 0;
    t->err = err;
    t->errlen = errlen;
}

/* A decision's calls go behind the turns on c's wire (called with the pool
 * lock held, which it lets go): encoded and linked under the lock, so that
 * the bytes go out in the order of the turns; written by this thread when
 * nobody writes on c, else by the one who does. 0 (its turn waits, and
 * pipeline() reads its replies), or < 0 when nothing was sent. */
static int append(hirate_redis *r, conn *c, rider *me, char *err, size_t errlen)
{
    turn *t = &me->t;
    int fcall = __atomic_load_n(&r->link->functions, __ATOMIC_RELAXED);
    char stackbuf[2048];
    size_t total = hirate_proto_batch_bound(me->calls, me->n, me->rcs, 0, fcall, 0);
    char *buf = total <= sizeof stackbuf ? stackbuf : malloc(total);
    if (!buf || reserve(c, total) < 0) {
        pthread_mutex_unlock(&r->lock);
        if (buf != stackbuf)
            free(buf);
        return hirate__fail(err, errlen, HIRATE_ENOMEM, "out of memory for %zu calls", me->n);
    }
    size_t len = hirate_proto_encode_batch(buf, total, me->calls, me->n, me->rcs, 0, fcall, 0);
    t->fcall = fcall;
    t->queued = 1;
    t->sends = 1;
    t->deadline = me->deadline;
    t->state = T_WAIT;
    t->owed = 1;
    sem_init(&t->wake, 0, 0);
    t->sem_ready = 1;
    t->next = NULL;
    __atomic_store_n(&c->tail->next, t, __ATOMIC_RELEASE);
    c->tail = t;
    c->calls += me->n;
    t->seq = ++c->seq;
    /* Another turn waits already behind the reader (t is linked): the
     * reader will write this one's bytes with any others' when it lets go,
     * in one write, instead of a write each (and the server reads them in
     * one read). */
    turn *waiting = turn_next(c->head);
    int writes = submit(c, buf, len, waiting && turn_next(waiting));
    pthread_mutex_unlock(&r->lock);
    t->io = writes ? write_turns(r, c, buf, len, t->deadline, 0, err, errlen) : 0;
    if (buf != stackbuf)
        free(buf);
    return 0;
}

/* Everything but a lone caller's path: a call that may ride or lead. */
static __attribute__((noinline)) int decide_shared(hirate_redis *r, const hirate_call *calls,
                                                   size_t n, const hirate_bucket_cfg *cfg,
                                                   hirate_decision *ds, hirate_decision *per, hirate_bucket *states,
                                                   int *rcs, char *msgs, char *err, size_t errlen)
{
    conn *c;
    int healthy = 1;
    rider me;
    me.calls = calls;
    me.n = n;
    me.ds = ds;
    me.per = per;
    me.states = states;
    me.rcs = rcs;
    me.msgs = msgs;
    me.err = err;
    me.errlen = errlen;
    me.deadline = 0;
    me.riders = NULL;
    turn_init(&me.t, n, err, errlen);
    int rc = acquire(r, &c, &me, err, errlen);
    if (rc == 3)   /* behind the turns on c's wire */
        rc = append(r, c, &me, err, errlen);
    if (rc == 0 && !me.riders) {
        rc = round_trip(r, c, &me.t, calls, n, cfg, ds, per, states, rcs, msgs, &healthy,
                        me.deadline, err, errlen);
        release_turn(r, c, &me.t, healthy, rc, err);
    } else if (rc == 0) {
        rc = carry(r, c, &me, cfg, &healthy);
        /* The riders left the queue: they are the leader's alone, and each
         * is woken with no lock held, so that it does not wake into one. */
        for (rider *w = me.riders, *next; w; w = next) {
            next = w->next;   /* w may be gone once it is posted */
            set_state(w, DONE);   /* its replies, ret and message before it */
            sem_post(&w->wake);
        }
        release_turn(r, c, &me.t, healthy, rc, err);
    } else if (rc == 1) {
        rc = me.ret;   /* a leader carried the calls and filled everything */
    } else {
        for (size_t i = 0; i < n; i++)
            rcs[i] = rc;   /* no connection: nothing was sent */
    }
    if (me.deadline)
        sem_destroy(&me.wake);
    if (me.t.sem_ready)
        sem_destroy(&me.t.wake);
    return rc;
}

/* The calls that failed with no words of their own (a broken round trip,
 * no connection, no memory) get the round trip's failure. */
static void fill_msgs(const int *rcs, size_t n, char *msgs, const char *err)
{
    for (size_t i = 0; msgs && i < n; i++)
        if (rcs[i] < 0 && !msgs[i * HIRATE_ERRMSG_SIZE])
            snprintf(msgs + i * HIRATE_ERRMSG_SIZE, HIRATE_ERRMSG_SIZE, "%s", err);
}

int hirate_redis_decide_many(hirate_redis *r, const hirate_call *calls, size_t n,
                             const hirate_bucket_cfg *cfg, hirate_decision *ds, hirate_decision *per, hirate_bucket *states,
                             int *rcs, char *msgs, char *err, size_t errlen)
{
    for (size_t i = 0; msgs && i < n; i++)
        msgs[i * HIRATE_ERRMSG_SIZE] = '\0';
    /* The lone caller's path: an idle connection and nobody queued. */
    pthread_mutex_lock(&r->lock);
    conn *c = r->idle;
    int rc;
    if (__builtin_expect(!c || r->qhead != NULL || hirate_sock_gone(&c->sock), 0)) {
        pthread_mutex_unlock(&r->lock);
        rc = decide_shared(r, calls, n, cfg, ds, per, states, rcs, msgs, err, errlen);
    } else {
        r->idle = c->next;
        turn t;
        turn_init(&t, n, err, errlen);
        own(c, &t);
        pthread_mutex_unlock(&r->lock);
        int healthy = 1;
        rc = round_trip(r, c, &t, calls, n, cfg, ds, per, states, rcs, msgs, &healthy, 0, err,
                        errlen);
        release_turn(r, c, &t, healthy, rc, err);
        if (__builtin_expect(t.sem_ready, 0))
            sem_destroy(&t.wake);
    }
    fill_msgs(rcs, n, msgs, err);
    return rc;
}

int hirate_redis_reset(hirate_redis *r, const char *prefix, size_t prefixlen, const void *key,
                       size_t keylen, char *err, size_t errlen)
{
    char full[HIRATE_PREFIX_MAX + HIRATE_KEY_MAX];
    char req[64 + sizeof full];
    memcpy(full, prefix, prefixlen);
    memcpy(full + prefixlen, key, keylen);
    const char *argv[2] = {"DEL", full};
    size_t lens[2] = {3, prefixlen + keylen};
    size_t len = hirate_proto_encode_argv(req, sizeof req, 2, argv, lens);
    hirate_reply rep;
    conn *c;
    int healthy = 1;

    rep.top.type = 0;
    int rc = acquire(r, &c, NULL, err, errlen);
    if (rc < 0)
        return rc;
    int64_t deadline = begin_roundtrip(r, c);
    rc = conn_send(r, c, req, len, deadline, err, errlen);
    if (rc == 0)
        rc = conn_read(r, c, deadline, &rep, err, errlen);
    int drop = 0;
    if (rc == 0 && rep.top.type == '-')
        rc = hirate_proto_error_reply(&rep, &drop, err, errlen);
    else if (rc == 0 && rep.top.type != ':')
        rc = hirate__fail(err, errlen, HIRATE_EPROTO, "malformed reply from Redis: DEL gave no integer");
    if (rc == 0 || rep.top.type == '-') {
        int io = end_roundtrip(c, err, errlen);
        rc = io < 0 ? io : rc;
    }
    if (drop || rc == HIRATE_EPROTO || rc == HIRATE_EIO || rc == HIRATE_ETIMEDOUT)
        healthy = 0;
    release(r, c, healthy);
    return rc;
}

/* ---- connections lent to an op's legs (a cluster's blocking client) ----------- */

int hirate_redis_lease(hirate_redis *r, hirate_redis_conn **c, char *err, size_t errlen)
{
    int rc = acquire(r, c, NULL, err, errlen);
    if (rc == 0)
        begin_roundtrip(r, *c);
    return rc;
}

int hirate_redis_send(hirate_redis *r, hirate_redis_conn *c, const char *buf, size_t len,
                      int64_t deadline, char *err, size_t errlen)
{
    return conn_send(r, c, buf, len, deadline, err, errlen);
}

int hirate_redis_read(hirate_redis *r, hirate_redis_conn *c, int64_t deadline, const char **data,
                      size_t *len, char *err, size_t errlen)
{
    int rc = conn_fill(r, c, deadline, err, errlen);
    *data = c->rbuf;
    *len = c->rlen;
    return rc;
}

void hirate_redis_consumed(hirate_redis_conn *c, size_t used)
{
    c->rstart += used;
}

void hirate_redis_unlease(hirate_redis *r, hirate_redis_conn *c, int healthy)
{
    /* A byte nobody asked for: the stream is out of step. */
    if (c->rstart != c->rlen)
        healthy = 0;
    c->rstart = c->rlen = 0;
    release(r, c, healthy);
}

void hirate_redis_stats_get(hirate_redis *r, hirate_redis_stats *out)
{
    out->evalsha = __atomic_load_n(&r->stats.evalsha, __ATOMIC_RELAXED);
    out->eval = __atomic_load_n(&r->stats.eval, __ATOMIC_RELAXED);
    out->fcall = __atomic_load_n(&r->stats.fcall, __ATOMIC_RELAXED);
    out->function_loads = __atomic_load_n(&r->stats.function_loads, __ATOMIC_RELAXED);
    out->dropped = __atomic_load_n(&r->stats.dropped, __ATOMIC_RELAXED);
    for (int i = 0; i < HIRATE_LATENCY_BUCKETS; i++)
        out->latency.n[i] = __atomic_load_n(&r->stats.latency.n[i], __ATOMIC_RELAXED);
    out->latency.sum_us = __atomic_load_n(&r->stats.latency.sum_us, __ATOMIC_RELAXED);
}

void hirate_redis_fork_prepare(hirate_redis *r)
{
    pthread_mutex_lock(&r->lock);
}

void hirate_redis_fork_parent(hirate_redis *r)
{
    pthread_mutex_unlock(&r->lock);
}

void hirate_redis_fork_child(hirate_redis *r)
{
    /* The sockets and their TLS state belong to the parent: close our
     * copies without a word (no QUIT, no close_notify, no shutdown()), and
     * start the pool afresh. */
    close_all(r, 1);
    r->waiting = 0;
    r->qhead = r->qtail = NULL;   /* their threads are not in this process */
    pthread_mutex_unlock(&r->lock);
    pthread_cond_destroy(&r->freed);
    init_cond(&r->freed);
}
