/* The Redis backend: connection pool, handshake, one round trip per call. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "errors.h"
#include "memory.h"
#include "redis.h"

/* Reconnection backoff after a failed connect: doubles from the first to the
 * last, each wait jittered by ±25% so that processes do not connect in step. */
#define BACKOFF_FIRST_MS 10
#define BACKOFF_LAST_MS 1000

typedef struct conn {
    redisContext *ctx;      /* opened the socket; not used for I/O afterwards */
    int fd;
    int timeo_changed;      /* SO_RCVTIMEO shortened for the rest of a call */
    int reads;              /* recv() calls in this round trip */
    struct conn *next;      /* in the idle list */
    size_t rstart, rlen;    /* unread replies are rbuf[rstart, rlen) */
    char rbuf[HIRATE_PROTO_MAX_REPLY];
} conn;

struct hirate_redis {
    hirate_redis_cfg cfg;
    pthread_mutex_t lock;
    pthread_cond_t freed;       /* a connection went back to the pool */
    conn **all;                 /* cfg.pool_size slots, NULL when free */
    conn *idle;
    int open;                   /* connections open or being opened */
    int waiting;                /* threads waiting for a connection */
    int failing;                /* the last connect failed */
    int backoff_ms;
    int64_t next_connect_us;
    uint64_t jitter_state;
    int connect_rc;             /* and its code, given again during the backoff */
    char connect_err[160];
    hirate_redis_stats stats;   /* updated with relaxed atomics */
};

#define STAT_INC(r, field) __atomic_fetch_add(&(r)->stats.field, 1, __ATOMIC_RELAXED)

static struct timeval ms_to_tv(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

/* "127.0.0.1:6379" or the socket path, for messages (never the password). */
static void describe_server(const hirate_url *u, char *buf, size_t len)
{
    if (u->is_unix)
        snprintf(buf, len, "%s", u->path);
    else if (strchr(u->host, ':'))
        snprintf(buf, len, "[%s]:%d", u->host, u->port);
    else
        snprintf(buf, len, "%s:%d", u->host, u->port);
}

/* ---- one connection -------------------------------------------------------- */

static void conn_close(conn *c)
{
    redisFree(c->ctx);   /* close(2) only: nothing is sent */
    free(c);
}

/* Did a hiredis command fail by running out of time? hiredis 1.x says so
 * with REDIS_ERR_TIMEOUT; 0.14 reports an I/O error with errno EAGAIN. */
static int hiredis_timed_out(const redisContext *ctx)
{
#ifdef REDIS_ERR_TIMEOUT
    if (ctx->err == REDIS_ERR_TIMEOUT)
        return 1;
#endif
    return ctx->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* AUTH and SELECT through hiredis, before hirate takes over the socket. */
static int handshake(hirate_redis *r, redisContext *ctx, char *err, size_t errlen)
{
    const hirate_url *u = &r->cfg.url;
    const char *argv[3];
    size_t lens[3];
    char db[16];
    redisReply *rep;
    int argc;

    if ((argc = hirate_url_auth_argv(u, argv, lens)) > 0) {
        rep = redisCommandArgv(ctx, argc, argv, lens);
        if (!rep)
            return hirate__fail(err, errlen, hiredis_timed_out(ctx) ? HIRATE_ETIMEDOUT : HIRATE_EIO,
                                "AUTH: %s", ctx->errstr);
        if (rep->type == REDIS_REPLY_ERROR) {
            int rc = hirate__fail(err, errlen, HIRATE_EAUTH, "AUTH refused: %.100s", rep->str);
            freeReplyObject(rep);
            return rc;
        }
        freeReplyObject(rep);
    }
    if ((argc = hirate_url_select_argv(u, db, argv, lens)) > 0) {
        rep = redisCommandArgv(ctx, argc, argv, lens);
        if (!rep)
            return hirate__fail(err, errlen, hiredis_timed_out(ctx) ? HIRATE_ETIMEDOUT : HIRATE_EIO,
                                "SELECT: %s", ctx->errstr);
        if (rep->type == REDIS_REPLY_ERROR) {
            int rc = hirate_proto_error_class(rep->str, rep->len);
            rc = hirate__fail(err, errlen, rc < 0 ? rc : HIRATE_EREPLY,
                              "SELECT %d refused: %.100s", u->db, rep->str);
            freeReplyObject(rep);
            return rc;
        }
        freeReplyObject(rep);
    }
    return 0;
}

static int conn_open(hirate_redis *r, conn **out, char *err, size_t errlen)
{
    const hirate_url *u = &r->cfg.url;
    char where[300];
    struct timeval ctv = ms_to_tv(r->cfg.connect_timeout_ms);

    STAT_INC(r, connects);
    describe_server(u, where, sizeof where);
    redisContext *ctx = u->is_unix ? redisConnectUnixWithTimeout(u->path, ctv)
                                   : redisConnectWithTimeout(u->host, u->port, ctv);
    if (!ctx)
        return hirate__fail(err, errlen, HIRATE_ENOMEM, "connect to %s: out of memory", where);
    if (ctx->err) {
        int rc = hirate__fail(err, errlen, HIRATE_ECONNECT, "connect to %s: %s", where, ctx->errstr);
        redisFree(ctx);
        return rc;
    }
    if (!u->is_unix)
        redisEnableKeepAlive(ctx);
    int rc = redisSetTimeout(ctx, ms_to_tv(r->cfg.timeout_ms)) == REDIS_OK
             ? handshake(r, ctx, err, errlen)
             : hirate__fail(err, errlen, HIRATE_EIO, "connect to %s: %s", where, ctx->errstr);
    if (rc < 0) {
        redisFree(ctx);
        return rc;
    }
    conn *c = calloc(1, sizeof *c);
    if (!c) {
        redisFree(ctx);
        return hirate__fail(err, errlen, HIRATE_ENOMEM, "connect to %s: out of memory", where);
    }
    c->ctx = ctx;
    c->fd = ctx->fd;
    *out = c;
    return 0;
}

static int conn_send(hirate_redis *r, conn *c, const char *buf, size_t len, char *err, size_t errlen)
{
    while (len) {
        /* MSG_NOSIGNAL: a peer that closed must not SIGPIPE the process. */
        ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return hirate__fail(err, errlen, HIRATE_ETIMEDOUT,
                                "sending to Redis took over %d ms", r->cfg.timeout_ms);
        } else {
            return hirate__fail(err, errlen, HIRATE_EIO, "send to Redis: %s",
                                n < 0 ? strerror(errno) : "nothing written");
        }
    }
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
        /* What is left of a reply goes to the front, so that the buffer has
         * room for the rest (and all of it when every byte was used). */
        memmove(c->rbuf, c->rbuf + c->rstart, c->rlen - c->rstart);
        c->rlen -= c->rstart;
        c->rstart = 0;
        if (c->rlen == sizeof c->rbuf)
            return hirate__fail(err, errlen, HIRATE_EPROTO,
                                "malformed reply from Redis: longer than %zu bytes",
                                sizeof c->rbuf);
        /* After the first read of a round trip, wait only for what is left
         * of its deadline, so that neither a trickle of bytes nor one of
         * whole replies (in a batch) can stretch the call. */
        if (c->reads++) {
            int64_t left = deadline - hirate_monotonic_us();
            if (left <= 0)
                return hirate__fail(err, errlen, HIRATE_ETIMEDOUT,
                                    "no whole reply from Redis within %d ms", r->cfg.timeout_ms);
            struct timeval tv = {(time_t)(left / 1000000), (suseconds_t)(left % 1000000)};
            setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            c->timeo_changed = 1;
        }
        ssize_t n = recv(c->fd, c->rbuf + c->rlen, sizeof c->rbuf - c->rlen, 0);
        if (n > 0)
            c->rlen += (size_t)n;
        else if (n == 0)
            return hirate__fail(err, errlen, HIRATE_EIO, "Redis closed the connection");
        else if (errno == EAGAIN || errno == EWOULDBLOCK)
            return hirate__fail(err, errlen, HIRATE_ETIMEDOUT, "no reply from Redis within %d ms",
                                r->cfg.timeout_ms);
        else if (errno != EINTR)
            return hirate__fail(err, errlen, HIRATE_EIO, "receive from Redis: %s", strerror(errno));
    }
}

/* Starts a round trip: the deadline, the full receive timeout again. */
static int64_t begin_roundtrip(hirate_redis *r, conn *c)
{
    if (c->timeo_changed) {
        struct timeval tv = ms_to_tv(r->cfg.timeout_ms);
        setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        c->timeo_changed = 0;
    }
    c->reads = 0;
    return hirate_monotonic_us() + (int64_t)r->cfg.timeout_ms * 1000;
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
    r->cfg = *cfg;
    r->all = calloc((size_t)cfg->pool_size, sizeof *r->all);
    if (!r->all) {
        free(r);
        return NULL;
    }
    pthread_mutex_init(&r->lock, NULL);
    init_cond(&r->freed);
    r->jitter_state = (uint64_t)(uintptr_t)r ^ (uint64_t)hirate_monotonic_us();
    return r;
}

static void close_all(hirate_redis *r)
{
    for (int i = 0; i < r->cfg.pool_size; i++) {
        if (r->all[i]) {
            conn_close(r->all[i]);
            r->all[i] = NULL;
        }
    }
    r->idle = NULL;
    r->open = 0;
}

void hirate_redis_free(hirate_redis *r)
{
    if (!r)
        return;
    close_all(r);
    pthread_cond_destroy(&r->freed);
    pthread_mutex_destroy(&r->lock);
    free(r->all);
    /* The password lived in cfg.url: do not leave it in freed memory. */
    memset(&r->cfg, 0, sizeof r->cfg);
    free(r);
}

static int jittered(hirate_redis *r, int ms)
{
    uint64_t x = r->jitter_state;   /* xorshift64, under the lock */
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    r->jitter_state = x;
    return ms * 3 / 4 + (int)(x % (uint64_t)(ms / 2 + 1));
}

/* Closes a connection of the pool for good; under the lock. */
static void forget(hirate_redis *r, conn *c)
{
    for (int i = 0; i < r->cfg.pool_size; i++) {
        if (r->all[i] == c) {
            r->all[i] = NULL;
            break;
        }
    }
    r->open--;
    STAT_INC(r, dropped);
    conn_close(c);
}

/* Has the server closed this idle connection (its `timeout`, CLIENT KILL, a
 * restart), or sent bytes nobody asked for? A server's close reaches us as
 * end-of-file (or a reset) that a peek sees without blocking. Then no call
 * can be sent on it; one found before sending provably did not run. */
static int conn_gone(const conn *c)
{
    char byte;
    ssize_t n = recv(c->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Takes an idle connection, opens a new one while the pool has room and no
 * backoff is running, or waits for one to be released. */
static int acquire(hirate_redis *r, conn **out, char *err, size_t errlen)
{
    struct timespec until = {0, 0};   /* set before the first wait */

    pthread_mutex_lock(&r->lock);
    for (;;) {
        if (r->idle) {
            conn *c = r->idle;
            r->idle = c->next;
            if (conn_gone(c)) {
                /* Closed while idle: nothing of this call was sent on it,
                 * so another connection may carry it. */
                forget(r, c);
                continue;
            }
            *out = c;
            pthread_mutex_unlock(&r->lock);
            return 0;
        }
        if (r->open < r->cfg.pool_size) {
            int64_t now = hirate_monotonic_us();
            if (r->failing && now < r->next_connect_us) {
                /* The same code as the failure itself: a wrong password
                 * stays a configuration error, not an outage. */
                int rc = hirate__fail(err, errlen, r->connect_rc,
                                      "not reconnecting for %lld ms after: %s",
                                      (long long)((r->next_connect_us - now + 999) / 1000),
                                      r->connect_err);
                pthread_mutex_unlock(&r->lock);
                return rc;
            }
            if (r->failing) {
                /* Only this caller probes; the others keep failing fast. */
                r->backoff_ms = r->backoff_ms ? r->backoff_ms * 2 : BACKOFF_FIRST_MS;
                if (r->backoff_ms > BACKOFF_LAST_MS)
                    r->backoff_ms = BACKOFF_LAST_MS;
                r->next_connect_us = now + (int64_t)jittered(r, r->backoff_ms) * 1000;
            }
            r->open++;
            pthread_mutex_unlock(&r->lock);

            conn *c = NULL;
            int rc = conn_open(r, &c, err, errlen);

            pthread_mutex_lock(&r->lock);
            if (rc < 0) {
                r->open--;
                if (!r->failing) {
                    r->failing = 1;
                    r->backoff_ms = BACKOFF_FIRST_MS;
                    r->next_connect_us = hirate_monotonic_us() +
                                         (int64_t)jittered(r, r->backoff_ms) * 1000;
                }
                r->connect_rc = rc;
                snprintf(r->connect_err, sizeof r->connect_err, "%s", err ? err : "");
            } else {
                r->failing = 0;
                r->backoff_ms = 0;
                for (int i = 0; i < r->cfg.pool_size; i++) {
                    if (!r->all[i]) {
                        r->all[i] = c;
                        break;
                    }
                }
                *out = c;
            }
            pthread_mutex_unlock(&r->lock);
            return rc;
        }
        if (until.tv_sec == 0) {
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_sec += r->cfg.timeout_ms / 1000;
            until.tv_nsec += (long)(r->cfg.timeout_ms % 1000) * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
        }
        r->waiting++;
        int timed_out = pthread_cond_timedwait(&r->freed, &r->lock, &until) == ETIMEDOUT;
        r->waiting--;
        if (timed_out) {
            pthread_mutex_unlock(&r->lock);
            return hirate__fail(err, errlen, HIRATE_ETIMEDOUT,
                                "all %d Redis connections stayed busy for %d ms",
                                r->cfg.pool_size, r->cfg.timeout_ms);
        }
    }
}

/* Returns a healthy connection to the pool, or closes a failed one. */
static void release(hirate_redis *r, conn *c, int healthy)
{
    pthread_mutex_lock(&r->lock);
    if (healthy) {
        c->next = r->idle;
        r->idle = c;
    } else {
        forget(r, c);
    }
    if (r->waiting)
        pthread_cond_signal(&r->freed);
    pthread_mutex_unlock(&r->lock);
}

/* One pipeline: the calls whose rcs[i] is `select` (all of them when select
 * is 0), the first as EVAL when eval_first, answered in order. Each answered
 * call gets its rc; an I/O error, which leaves the stream's state unknown, is
 * every unanswered call's rc and the return value. */
static int pipeline(hirate_redis *r, conn *c, const hirate_call *calls, size_t n, int select,
                    int eval_first, int64_t capacity, hirate_decision *ds, hirate_bucket *states,
                    int *rcs, int *healthy, char *err, size_t errlen)
{
    char stackbuf[2048];
    size_t total = hirate_proto_batch_bound(calls, n, rcs, select, eval_first);
    char *buf = total <= sizeof stackbuf ? stackbuf : malloc(total);
    if (!buf) {
        int rc = hirate__fail(err, errlen, HIRATE_ENOMEM, "out of memory for %zu calls", n);
        for (size_t i = 0; i < n; i++)
            if (!select || rcs[i] == select)
                rcs[i] = rc;
        return 0;   /* nothing was sent: the connection is fine */
    }
    size_t len = hirate_proto_encode_batch(buf, total, calls, n, rcs, select, eval_first);
    /* Which calls this round trip carries (all, or those whose rc is
     * select), so that a failure of its stream reaches them and no other.
     * Without memory for the map, every call takes the failure. */
    unsigned char smallmap[64], *carried = NULL;
    if (select) {
        carried = n <= sizeof smallmap ? smallmap : malloc(n);
        for (size_t i = 0; carried && i < n; i++)
            carried[i] = rcs[i] == select;
    }
    int64_t deadline = begin_roundtrip(r, c);
    int io = conn_send(r, c, buf, len, err, errlen);
    if (buf != stackbuf)
        free(buf);

    int sent_eval = 0, drop = 0;
    for (size_t i = 0; i < n; i++) {
        if (select && rcs[i] != select)
            continue;
        if (eval_first && !sent_eval++)
            STAT_INC(r, eval);
        else
            STAT_INC(r, evalsha);
        hirate_reply rep;
        if (io == 0)
            io = conn_read(r, c, deadline, &rep, err, errlen);
        rcs[i] = io < 0 ? io
                        : hirate_proto_outcome(&rep, &calls[i], capacity,
                                               select == HIRATE_PROTO_NOSCRIPT, &ds[i],
                                               &states[i], &drop, err, errlen);
    }
    if (io == 0 && (io = end_roundtrip(c, err, errlen)) < 0)
        for (size_t i = 0; i < n; i++)
            if (!select || !carried || carried[i])
                rcs[i] = io;   /* out of step: none of this stream's replies can be trusted */
    if (carried != smallmap)
        free(carried);
    if (io < 0 || drop)
        *healthy = 0;
    return io;
}

int hirate_redis_decide_many(hirate_redis *r, const hirate_call *calls, size_t n,
                             int64_t capacity, hirate_decision *ds, hirate_bucket *states,
                             int *rcs, char *err, size_t errlen)
{
    conn *c;
    int healthy = 1;
    int rc = acquire(r, &c, err, errlen);
    if (rc == 0) {
        rc = pipeline(r, c, calls, n, 0, 0, capacity, ds, states, rcs, &healthy, err, errlen);
        /* NOSCRIPT: the server does not know the script (restart, SCRIPT
         * FLUSH, failover), so those calls provably did not run. Send them
         * again, the first as EVAL; it caches the script for the rest. */
        int again = 0;
        for (size_t i = 0; rc == 0 && i < n; i++)
            again |= rcs[i] == HIRATE_PROTO_NOSCRIPT;
        if (again)
            rc = pipeline(r, c, calls, n, HIRATE_PROTO_NOSCRIPT, 1, capacity, ds, states, rcs,
                          &healthy, err, errlen);
        release(r, c, healthy);
    } else {
        for (size_t i = 0; i < n; i++)
            rcs[i] = rc;   /* no connection: nothing was sent */
    }
    /* A round trip that broke gave its failure to the calls it had not
     * answered; the calls answered keep their answers, and those that met
     * NOSCRIPT, never sent again, get the failure too. */
    for (size_t i = 0; rc < 0 && i < n; i++)
        if (rcs[i] == HIRATE_PROTO_NOSCRIPT)
            rcs[i] = rc;
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
    int rc = acquire(r, &c, err, errlen);
    if (rc < 0)
        return rc;
    int64_t deadline = begin_roundtrip(r, c);
    rc = conn_send(r, c, req, len, err, errlen);
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

void hirate_redis_stats_get(hirate_redis *r, hirate_redis_stats *out)
{
    out->connects = __atomic_load_n(&r->stats.connects, __ATOMIC_RELAXED);
    out->evalsha = __atomic_load_n(&r->stats.evalsha, __ATOMIC_RELAXED);
    out->eval = __atomic_load_n(&r->stats.eval, __ATOMIC_RELAXED);
    out->dropped = __atomic_load_n(&r->stats.dropped, __ATOMIC_RELAXED);
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
    /* The sockets belong to the parent: close our copies without a word
     * (no QUIT, no shutdown()), and start the pool afresh. */
    close_all(r);
    r->waiting = 0;
    r->failing = 0;
    r->backoff_ms = 0;
    pthread_mutex_unlock(&r->lock);
    pthread_cond_destroy(&r->freed);
    init_cond(&r->freed);
}

const hirate_url *hirate_redis_url(const hirate_redis *r)
{
    return &r->cfg.url;
}

int hirate_redis_timeouts(const hirate_redis *r, int *timeout_ms)
{
    *timeout_ms = r->cfg.timeout_ms;
    return r->cfg.connect_timeout_ms;
}
