/*
 * The limiter: checks every input, routes a decision to Redis or to memory,
 * and keeps the message of the last error.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "breaker.h"
#include "bucket.h"
#include "errors.h"
#include "fork.h"
#include "handshake.h"
#include "hirate_io.h"
#include "link.h"
#include "memory.h"
#include "redis.h"
#include "script.h"

struct hirate_limiter {
    hirate_fork_node fork;      /* first: the fork hooks get this pointer */
    hirate_bucket_cfg cfg;
    hirate_bucket_cfg local_cfg;/* the LOCAL fallback's share of the limit */
    char prefix[HIRATE_PREFIX_MAX + 1];
    size_t prefixlen;
    char args[96];              /* capacity and rate as RESP bulk strings */
    size_t argslen;
    int on_error;
    hirate_link link;           /* with a URL: where Redis is, and the backoff */
    hirate_redis *redis;        /* NULL: in-memory */
    hirate_memory *memory;      /* the buckets without a URL; with one, the
                                   LOCAL fallback's (NULL for OPEN, CLOSED) */
    hirate_memory *cache;       /* refusals foretold from Redis' replies */
    hirate_breaker breaker;
    uint64_t reset_epoch;       /* bumped by every reset (atomic) */
    int64_t offset_min[2];      /* least (Redis time - send time) seen in this
                                   window and the last one (atomic) */
    int64_t offset_window;      /* when this window began (atomic) */
    uint64_t cache_hits, policy;/* counters (atomic) */
    pthread_mutex_t errlock;
    char errmsg[HIRATE_ERRMSG_SIZE];
};

void hirate_options_init(hirate_options *o)
{
    memset(o, 0, sizeof *o);
    o->prefix = "rl:";
    o->connect_timeout_ms = 250;
    o->timeout_ms = 100;
    o->pool_size = 16;
    o->max_keys = 1000000;
    o->on_error = HIRATE_ON_ERROR_LOCAL;
    o->instances = 1;
    o->backoff_min_ms = 100;
    o->backoff_max_ms = 5000;
    o->deny_cache = 1;
    o->deny_cache_keys = 65536;
    o->tls_verify = 1;
}

static const char *const on_error_names[] = {"local", "open", "closed"};

const char *hirate_on_error_name(int on_error)
{
    return on_error >= 0 && on_error <= HIRATE_ON_ERROR_CLOSED ? on_error_names[on_error]
                                                                : "unknown";
}

int hirate_on_error_from_name(const char *name)
{
    for (int i = 0; name && i <= HIRATE_ON_ERROR_CLOSED; i++)
        if (strcmp(name, on_error_names[i]) == 0)
            return i;
    return -1;
}

/* ---- fork hooks: hold every lock across fork(), reset the pool in the child */

static void fork_prepare(hirate_fork_node *n)
{
    hirate_limiter *l = (hirate_limiter *)n;
    pthread_mutex_lock(&l->errlock);
    pthread_mutex_lock(&l->breaker.lock);
    if (l->redis) {
        hirate_link_fork_prepare(&l->link);
        hirate_redis_fork_prepare(l->redis);
    }
    if (l->memory)
        hirate_memory_lock_all(l->memory);
    if (l->cache)
        hirate_memory_lock_all(l->cache);
}

/* After fork(): both sides release the locks; the child also drops the
 * connections it inherited. */
static void fork_release(hirate_fork_node *n, int child)
{
    hirate_limiter *l = (hirate_limiter *)n;
    if (l->cache)
        hirate_memory_unlock_all(l->cache);
    if (l->memory)
        hirate_memory_unlock_all(l->memory);
    if (l->redis && child)
        hirate_redis_fork_child(l->redis);
    else if (l->redis)
        hirate_redis_fork_parent(l->redis);
    if (l->redis)
        hirate_link_fork_release(&l->link, child);
    pthread_mutex_unlock(&l->breaker.lock);
    pthread_mutex_unlock(&l->errlock);
}

static void fork_parent(hirate_fork_node *n)
{
    fork_release(n, 0);
}

static void fork_child(hirate_fork_node *n)
{
    fork_release(n, 1);
}

/* ---- construction ------------------------------------------------------------ */

static int check_range(const char *what, long long v, long long lo, long long hi,
                       char *err, size_t errlen)
{
    if (v < lo || v > hi)
        return hirate__fail(err, errlen, HIRATE_EOPTION, "%s must be from %lld to %lld, got %lld",
                            what, lo, hi, v);
    return 0;
}

static int check_options(const hirate_options *o, hirate_bucket_cfg *cfg, char *err, size_t errlen)
{
    int rc;
    if ((rc = hirate_bucket_cfg_init(cfg, o->capacity, o->rate, err, errlen)) < 0 ||
        (rc = check_range("connect_timeout_ms", o->connect_timeout_ms, 1, 60000, err, errlen)) < 0 ||
        (rc = check_range("timeout_ms", o->timeout_ms, 1, 60000, err, errlen)) < 0 ||
        (rc = check_range("pool_size", o->pool_size, 1, 1024, err, errlen)) < 0 ||
        (rc = check_range("max_keys", (long long)(o->max_keys > 4000000000u ? 4000000001u : o->max_keys),
                          1, 4000000000LL, err, errlen)) < 0)
        return rc;
    if (o->on_error < HIRATE_ON_ERROR_LOCAL || o->on_error > HIRATE_ON_ERROR_CLOSED)
        return hirate__fail(err, errlen, HIRATE_EOPTION,
                            "on_error must be HIRATE_ON_ERROR_LOCAL, _OPEN or _CLOSED, got %d",
                            o->on_error);
    if ((rc = check_range("instances", o->instances, 1, 100000, err, errlen)) < 0 ||
        (rc = check_range("backoff_min_ms", o->backoff_min_ms, 1, 60000, err, errlen)) < 0 ||
        (rc = check_range("backoff_max_ms", o->backoff_max_ms, o->backoff_min_ms, 600000,
                          err, errlen)) < 0 ||
        (rc = check_range("deny_cache", o->deny_cache, 0, 1, err, errlen)) < 0 ||
        (o->deny_cache &&
         (rc = check_range("deny_cache_keys",
                           (long long)(o->deny_cache_keys > 4000000000u ? 4000000001u
                                                                       : o->deny_cache_keys),
                           1, 4000000000LL, err, errlen)) < 0))
        return rc;
    if (o->prefix && strlen(o->prefix) > HIRATE_PREFIX_MAX)
        return hirate__fail(err, errlen, HIRATE_EOPTION, "prefix is %zu bytes; the most is %d",
                            strlen(o->prefix), HIRATE_PREFIX_MAX);
    return 0;
}

int hirate_limiter_new(hirate_limiter **out, const hirate_options *o, char *err, size_t errlen)
{
    hirate_bucket_cfg cfg, local_cfg;
    hirate_redis_cfg rcfg;
    hirate_link link;
    int rc;

    if (err && errlen)
        err[0] = '\0';
    if (!out || !o)
        return hirate__fail(err, errlen, HIRATE_EINVAL, "hirate_limiter_new needs out and opts");
    *out = NULL;
    if ((rc = check_options(o, &cfg, err, errlen)) < 0)
        return rc;
    local_cfg = cfg;
    if (o->url) {
        if ((rc = hirate_link_init(&link, o, err, errlen)) < 0)
            return rc;
        memset(&rcfg, 0, sizeof rcfg);
        rcfg.pool_size = o->pool_size;
        /* N instances falling back at once share the limit N ways. */
        int64_t share = o->capacity / o->instances;
        if (o->on_error == HIRATE_ON_ERROR_LOCAL && o->instances > 1 &&
            hirate_bucket_cfg_init(&local_cfg, share > 0 ? share : 1, o->rate / o->instances,
                                   err, errlen) < 0) {
            hirate_link_destroy(&link);
            return hirate__fail(err, errlen, HIRATE_ERANGE,
                                "the local share of the limit (capacity %lld, rate %g over %d "
                                "instances) takes over 2^53 us to refill",
                                (long long)(share > 0 ? share : 1), o->rate / o->instances,
                                o->instances);
        }
    }

    hirate_limiter *l = calloc(1, sizeof *l);
    if (!l) {
        if (o->url)
            hirate_link_destroy(&link);
        return hirate__fail(err, errlen, HIRATE_ENOMEM, "out of memory");
    }
    l->cfg = cfg;
    l->local_cfg = local_cfg;
    l->offset_min[0] = l->offset_min[1] = INT64_MAX;
    l->on_error = o->on_error;
    if (o->prefix) {
        l->prefixlen = strlen(o->prefix);
        memcpy(l->prefix, o->prefix, l->prefixlen);
    }
    l->argslen = hirate_proto_encode_limits(l->args, sizeof l->args, cfg.capacity, cfg.rate);
    pthread_mutex_init(&l->errlock, NULL);
    hirate_breaker_init(&l->breaker, o->backoff_min_ms, o->backoff_max_ms);
    int ok = 1;
    if (o->url) {
        l->link = link;
        memset(&link, 0, sizeof link);   /* the password: one copy is enough */
        hirate_link_start(&l->link);
        rcfg.link = &l->link;
        ok = (l->redis = hirate_redis_new(&rcfg)) != NULL;
        if (ok && o->deny_cache)
            ok = (l->cache = hirate_memory_new(o->deny_cache_keys)) != NULL;
    }
    if (ok && (!o->url || o->on_error == HIRATE_ON_ERROR_LOCAL))
        ok = (l->memory = hirate_memory_new(o->max_keys)) != NULL;
    if (!ok) {
        hirate_limiter_free(l);
        return hirate__fail(err, errlen, HIRATE_ENOMEM, "out of memory");
    }
    l->fork.prepare = fork_prepare;
    l->fork.parent = fork_parent;
    l->fork.child = fork_child;
    hirate_fork_register(&l->fork);
    *out = l;
    return 0;
}

void hirate_limiter_free(hirate_limiter *l)
{
    if (!l)
        return;
    if (l->fork.next)
        hirate_fork_unregister(&l->fork);
    hirate_redis_free(l->redis);
    if (l->link.started)
        hirate_link_destroy(&l->link);
    hirate_memory_free(l->memory);
    hirate_memory_free(l->cache);
    hirate_breaker_destroy(&l->breaker);
    pthread_mutex_destroy(&l->errlock);
    free(l);
}

/* ---- decisions ------------------------------------------------------------------ */

static int remember(hirate_limiter *l, int rc, const char *msg)
{
    pthread_mutex_lock(&l->errlock);
    snprintf(l->errmsg, sizeof l->errmsg, "%s", msg);
    pthread_mutex_unlock(&l->errlock);
    return rc;
}

static int check_key(const void *key, size_t keylen, char *err, size_t errlen)
{
    if (keylen == 0)
        return hirate__fail(err, errlen, HIRATE_EKEY, "key is empty");
    if (keylen > HIRATE_KEY_MAX)
        return hirate__fail(err, errlen, HIRATE_EKEY, "key is %zu bytes; the most is %d",
                            keylen, HIRATE_KEY_MAX);
    if (!key)
        return hirate__fail(err, errlen, HIRATE_EINVAL, "key is NULL");
    return 0;
}

/* Failures that the policy answers for; anything else is returned. */
static int is_outage(int rc)
{
    return rc == HIRATE_ECONNECT || rc == HIRATE_ETIMEDOUT || rc == HIRATE_EIO ||
           rc == HIRATE_EPROTO || rc == HIRATE_ESERVER;
}

/* The failure policy decides item in Redis' place; wait_us is the time until
 * the breaker lets a call through again. */
static void apply_policy(hirate_limiter *l, hirate_item *it, int spend, int64_t now, int error,
                         int64_t wait_us)
{
    hirate_decision *d = &it->decision;
    __atomic_fetch_add(&l->policy, 1, __ATOMIC_RELAXED);
    it->rc = 0;
    if (l->on_error == HIRATE_ON_ERROR_LOCAL) {
        it->rc = hirate_memory_decide(l->memory, &l->local_cfg, it->key, it->keylen, now,
                                      it->cost, spend, d);
    } else {
        int never = it->cost > l->cfg.capacity;
        int open = l->on_error == HIRATE_ON_ERROR_OPEN;
        int64_t back = wait_us > 0 ? wait_us : 1;   /* until Redis is asked again */
        /* Open: as if the bucket were full. Closed: nothing passes but a
         * cost of 0 (which spends nothing), until Redis can be asked again. */
        d->allowed = !never && (open || it->cost == 0);
        d->source = open ? HIRATE_SOURCE_FAIL_OPEN : HIRATE_SOURCE_FAIL_CLOSED;
        d->limit = l->cfg.capacity;
        d->remaining = open && !never ? l->cfg.capacity - it->cost : 0;
        d->retry_after_us = never ? HIRATE_NEVER : d->allowed ? 0 : back;
        d->reset_after_us = open ? 0 : back;
        d->time_us = now;
    }
    d->error = error;
}

/* How far Redis' clock is ahead of ours, at most. A call sent at our time
 * `sent` ran at Redis time S, later: S - sent bounds the offset from above,
 * and so does the least such difference seen, which is the tightest. Windows
 * of OFFSET_WINDOW_US let old observations go, so that a drift or a step of
 * either clock is forgotten within two windows. */
#define OFFSET_WINDOW_US 10000000

static int64_t redis_ahead(hirate_limiter *l, int64_t observed, int64_t now)
{
    int64_t began = __atomic_load_n(&l->offset_window, __ATOMIC_RELAXED);
    if (now - began >= OFFSET_WINDOW_US &&
        __atomic_compare_exchange_n(&l->offset_window, &began, now, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED)) {
        int64_t last = __atomic_exchange_n(&l->offset_min[0], INT64_MAX, __ATOMIC_RELAXED);
        __atomic_store_n(&l->offset_min[1], last, __ATOMIC_RELAXED);
    }
    int64_t cur = __atomic_load_n(&l->offset_min[0], __ATOMIC_RELAXED);
    while (observed < cur &&
           !__atomic_compare_exchange_n(&l->offset_min[0], &cur, observed, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    int64_t best = observed < cur ? observed : cur;
    int64_t last = __atomic_load_n(&l->offset_min[1], __ATOMIC_RELAXED);
    return last < best ? last : best;
}

/* Remembers, from a Redis decision, a bucket that would refuse the same cost
 * now: the stored state moved from Redis' clock to ours by the most Redis
 * can be ahead, which can only overstate the tokens. */
static void learn(hirate_limiter *l, const hirate_item *it, const hirate_bucket *state,
                  int64_t sent, int known, uint64_t epoch)
{
    int64_t ahead = redis_ahead(l, it->decision.time_us - sent, sent);
    hirate_bucket local = {state->tokens, state->ts - ahead};
    /* tokens is NAN when the reply showed the bucket kept the cost. */
    if (!isnan(local.tokens) && hirate_bucket_level(&l->cfg, &local, sent) < (double)it->cost) {
        /* A reset since the call was sent makes its reply stale. */
        if (__atomic_load_n(&l->reset_epoch, __ATOMIC_ACQUIRE) == epoch)
            hirate_memory_put(l->cache, &l->cfg, it->key, it->keylen, &local, sent);
    } else if (known) {
        hirate_memory_reset(l->cache, it->key, it->keylen);
    }
}

/* The code and message for a bad key or cost, kept out of the hot path. */
static int input_error(const void *key, size_t keylen, int64_t cost, char *err, size_t errlen)
{
    int rc = check_key(key, keylen, err, errlen);
    return rc < 0 ? rc : hirate_bucket_check_cost(cost, err, errlen);
}

__attribute__((noinline, cold)) static int bad_input(hirate_limiter *l, const void *key,
                                                     size_t keylen, int64_t cost)
{
    char err[HIRATE_ERRMSG_SIZE];
    return remember(l, input_error(key, keylen, cost, err, sizeof err), err);
}

/* Checks a key and a cost: 0, or the code with its message remembered. */
static inline int check_input(hirate_limiter *l, const void *key, size_t keylen, int64_t cost)
{
    if (key && keylen - 1 < HIRATE_KEY_MAX && cost >= 0 && cost <= HIRATE_EXACT_MAX)
        return 0;
    return bad_input(l, key, keylen, cost);
}

/* A decision of the in-memory backend (no URL). */
static int decide_in_memory(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                            int spend, int64_t now, hirate_decision *out)
{
    int rc = check_input(l, key, keylen, cost);
    if (rc < 0)
        return rc;
    rc = hirate_memory_decide(l->memory, &l->cfg, key, keylen, now, cost, spend, out);
    return rc < 0 ? remember(l, rc, "out of memory for a new bucket") : 0;
}

/* A batch on its way through the limiter, in three steps:
 *   batch_begin   decides what needs no Redis: bad input, the memory
 *                 backend, the deny cache, and the policy while the breaker
 *                 keeps Redis alone; leaves the rest as calls (b->m of them);
 *   (the I/O)     someone sends the calls and fills rcs, ds and states:
 *                 redis.c in hirate_allow_many, or a binding's own sockets;
 *   batch_settle  tells the breaker, teaches the deny cache, and lets the
 *                 policy answer the calls that met a failure. */
typedef struct batch {
    hirate_limiter *l;
    hirate_item *items;
    size_t n;               /* items */
    int keep_msgs;          /* keep each failed item's message (an op) */
    char **msgs;            /* and those messages, or NULL */
    int spend;
    int64_t now_us;         /* injected time, or < 0 */
    int64_t now;            /* the decision clock: injected or monotonic */
    size_t m;               /* calls for Redis */
    int verdict;            /* the breaker's */
    uint64_t epoch;         /* resets seen when the calls were made */
    size_t *index;          /* item index of each call */
    hirate_call *calls;
    hirate_decision *ds;
    hirate_bucket *states;
    int *rcs;
    unsigned char *known;   /* the deny cache held the key */
    struct {                /* room for a single call: no allocation */
        size_t index;
        hirate_call call;
        hirate_decision d;
        hirate_bucket state;
        int rc;
        unsigned char known;
    } one;
} batch;

static int batch_alloc(batch *b, size_t n)
{
    if (n <= 1) {
        b->index = &b->one.index;
        b->calls = &b->one.call;
        b->ds = &b->one.d;
        b->states = &b->one.state;
        b->rcs = &b->one.rc;
        b->known = &b->one.known;
        return 0;
    }
    /* One block, largest alignment first. */
    char *m = malloc(n * (sizeof(hirate_call) + sizeof(hirate_decision) + sizeof(hirate_bucket) +
                          sizeof(size_t) + sizeof(int) + 1));
    if (!m)
        return HIRATE_ENOMEM;
    b->calls = (hirate_call *)m;
    b->ds = (hirate_decision *)(b->calls + n);
    b->states = (hirate_bucket *)(b->ds + n);
    b->index = (size_t *)(b->states + n);
    b->rcs = (int *)(b->index + n);
    b->known = (unsigned char *)(b->rcs + n);
    return 0;
}

static void batch_free(batch *b)
{
    if (b->calls != &b->one.call)
        free(b->calls);
    for (size_t i = 0; b->msgs && i < b->n; i++)
        free(b->msgs[i]);
    free(b->msgs);
}

/* Keeps item i's message, for hirate_op_errmsg (only an op keeps them). */
static void batch_note(batch *b, size_t i, const char *msg)
{
    if (!b->keep_msgs || (!b->msgs && !(b->msgs = calloc(b->n, sizeof *b->msgs))))
        return;
    free(b->msgs[i]);
    b->msgs[i] = strdup(msg);
}

/* Returns the number of calls left for Redis (0: every item is decided). */
static size_t batch_begin(batch *b, hirate_limiter *l, hirate_item *items, size_t n, int spend,
                          int64_t now_us)
{
    b->l = l;
    b->items = items;
    b->n = n;
    b->msgs = NULL;
    b->spend = spend;
    b->now_us = now_us;
    b->now = now_us >= 0 ? now_us : hirate_monotonic_us();
    b->m = 0;
    b->calls = NULL;

    size_t npending = 0;
    for (size_t i = 0; i < n; i++) {
        hirate_item *it = &items[i];
        if (!l->redis) {
            it->rc = decide_in_memory(l, it->key, it->keylen, it->cost, spend, b->now,
                                      &it->decision);
        } else if ((it->rc = check_input(l, it->key, it->keylen, it->cost)) == 0) {
            it->rc = 1;   /* for Redis */
            npending++;
        } else if (b->keep_msgs) {
            char err[HIRATE_ERRMSG_SIZE];
            input_error(it->key, it->keylen, it->cost, err, sizeof err);
            batch_note(b, i, err);
        }
    }
    if (!npending)
        return 0;
    if (batch_alloc(b, npending) < 0) {
        for (size_t i = 0; i < n; i++) {
            if (items[i].rc == 1) {
                items[i].rc = remember(l, HIRATE_ENOMEM, "out of memory for a batch");
                batch_note(b, i, "out of memory for a batch");
            }
        }
        return 0;
    }

    for (size_t i = 0; i < n; i++) {
        hirate_item *it = &items[i];
        if (it->rc != 1)
            continue;
        int known = 0;
        if (l->cache && it->cost > 0 && it->cost <= l->cfg.capacity) {
            known = hirate_memory_lookup(l->cache, &l->cfg, it->key, it->keylen, b->now,
                                         it->cost, &it->decision);
            if (known && !it->decision.allowed) {
                it->decision.source = HIRATE_SOURCE_CACHE;
                it->rc = 0;
                __atomic_fetch_add(&l->cache_hits, 1, __ATOMIC_RELAXED);
                continue;
            }
        }
        b->index[b->m] = i;
        b->known[b->m] = (unsigned char)known;
        b->calls[b->m] = (hirate_call){l->prefix, l->prefixlen, it->key, it->keylen, l->args,
                                       l->argslen, it->cost, spend, now_us};
        b->m++;
    }
    if (!b->m)
        return 0;

    int error = 0;
    int64_t wait_us = 0;
    /* The breaker keeps real time, even when a test injects the time. */
    int64_t mono = now_us >= 0 ? hirate_monotonic_us() : b->now;
    b->verdict = hirate_breaker_enter(&l->breaker, mono, &error, &wait_us);
    if (b->verdict == HIRATE_BREAKER_SKIP) {
        for (size_t j = 0; j < b->m; j++)
            apply_policy(l, &items[b->index[j]], spend, b->now, error, wait_us);
        b->m = 0;
        return 0;
    }
    b->epoch = __atomic_load_n(&l->reset_epoch, __ATOMIC_ACQUIRE);
    return b->m;
}

/* After the calls were answered (rcs, ds, states); err holds the message of
 * the last error. */
static void batch_settle(batch *b, const char *err)
{
    hirate_limiter *l = b->l;
    int outage = 0, answered = 0;
    int64_t wait_us = 0;
    for (size_t j = 0; j < b->m; j++) {
        if (is_outage(b->rcs[j]))
            outage = b->rcs[j];
        answered |= b->rcs[j] != HIRATE_ECLOSED;
    }
    if (!outage && !answered) {
        /* Abandoned before Redis answered anything: nothing was learnt. */
        hirate_breaker_release(&l->breaker, b->verdict == HIRATE_BREAKER_PROBE);
    } else if (outage) {
        remember(l, outage, err);
        /* The backoff runs from when the failure was known, not from when
         * the call began (a timeout is as long as a backoff). */
        wait_us = hirate_breaker_failure(&l->breaker, b->verdict == HIRATE_BREAKER_PROBE, outage,
                                         hirate_monotonic_us());
    } else {
        hirate_breaker_success(&l->breaker, b->verdict == HIRATE_BREAKER_PROBE);
    }
    for (size_t j = 0; j < b->m; j++) {
        hirate_item *it = &b->items[b->index[j]];
        it->rc = b->rcs[j];
        if (it->rc == 0) {
            it->decision = b->ds[j];
            if (l->cache && it->cost > 0 && it->cost <= l->cfg.capacity)
                learn(l, it, &b->states[j], b->now, b->known[j], b->epoch);
        } else if (is_outage(it->rc)) {
            apply_policy(l, it, b->spend, b->now, it->rc, wait_us);
        } else {
            remember(l, it->rc, err);
            if (!b->msgs || !b->msgs[b->index[j]])
                batch_note(b, b->index[j], err);
        }
    }
}

/* Decides items in order: each gets its rc and, when 0, its decision. */
static void decide_items(hirate_limiter *l, hirate_item *items, size_t n, int spend,
                         int64_t now_us)
{
    batch b;
    b.keep_msgs = 0;
    b.msgs = NULL;
    if (batch_begin(&b, l, items, n, spend, now_us)) {
        char err[HIRATE_ERRMSG_SIZE];
        hirate_redis_decide_many(l->redis, b.calls, b.m, l->cfg.capacity, b.ds, b.states, b.rcs,
                                 err, sizeof err);
        batch_settle(&b, err);
    }
    batch_free(&b);
}

static int decide(hirate_limiter *l, const void *key, size_t keylen, int64_t cost, int spend,
                  int64_t now_us, hirate_decision *out)
{
    if (!l)
        return HIRATE_EINVAL;
    if (!out)
        return remember(l, HIRATE_EINVAL, "the decision pointer is NULL");
    if (!l->redis)   /* the in-memory hot path: no batch bookkeeping */
        return decide_in_memory(l, key, keylen, cost, spend, now_us, out);
    hirate_item it = {key, keylen, cost, 0, {0}};
    decide_items(l, &it, 1, spend, now_us);
    if (it.rc == 0)
        *out = it.decision;
    return it.rc;
}

int hirate_allow(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                 hirate_decision *out)
{
    return decide(l, key, keylen, cost, 1, -1, out);
}

int hirate_peek(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                hirate_decision *out)
{
    return decide(l, key, keylen, cost, 0, -1, out);
}

int hirate_allow_many(hirate_limiter *l, hirate_item *items, size_t n)
{
    if (!l || (!items && n))
        return HIRATE_EINVAL;
    if (n)
        decide_items(l, items, n, 1, -1);
    return 0;
}

int hirate_decide_at(hirate_limiter *l, const void *key, size_t keylen, int64_t cost, int spend,
                     int64_t now_us, hirate_decision *out)
{
    if (l && now_us < 0)
        return remember(l, HIRATE_EINVAL, "the injected time must not be negative");
    return decide(l, key, keylen, cost, spend, now_us, out);
}

/* The part of a reset that needs no I/O: checks the key, then forgets it in
 * the deny cache and the local buckets. */
static int reset_local(hirate_limiter *l, const void *key, size_t keylen, char *err, size_t errlen)
{
    int rc;
    if ((rc = check_key(key, keylen, err, errlen)) < 0)
        return remember(l, rc, err);
    if (l->cache) {
        __atomic_fetch_add(&l->reset_epoch, 1, __ATOMIC_ACQ_REL);
        hirate_memory_reset(l->cache, key, keylen);
    }
    if (l->memory)
        hirate_memory_reset(l->memory, key, keylen);
    return 0;
}

int hirate_reset(hirate_limiter *l, const void *key, size_t keylen)
{
    char err[HIRATE_ERRMSG_SIZE];
    if (!l)
        return HIRATE_EINVAL;
    int rc = reset_local(l, key, keylen, err, sizeof err);
    if (rc == 0 && l->redis) {
        rc = hirate_redis_reset(l->redis, l->prefix, l->prefixlen, key, keylen, err, sizeof err);
        return rc < 0 ? remember(l, rc, err) : 0;
    }
    return rc;
}

const char *hirate_limiter_errmsg(hirate_limiter *l, char *buf, size_t len)
{
    if (!buf || !len)
        return buf;
    if (!l) {
        snprintf(buf, len, "%s", "no limiter");
        return buf;
    }
    pthread_mutex_lock(&l->errlock);
    snprintf(buf, len, "%s", l->errmsg);
    pthread_mutex_unlock(&l->errlock);
    return buf;
}

void hirate_counters_get(hirate_limiter *l, hirate_counters *out)
{
    memset(out, 0, sizeof *out);
    if (!l)
        return;
    if (l->redis) {
        hirate_redis_stats rs;
        hirate_redis_stats_get(l->redis, &rs);
        out->connects = __atomic_load_n(&l->link.connects, __ATOMIC_RELAXED);
        out->evalsha = rs.evalsha;
        out->eval = rs.eval;
        out->conns_dropped = rs.dropped;
        if (l->memory)
            out->local_keys = hirate_memory_count(l->memory);
    } else {
        out->memory_keys = hirate_memory_count(l->memory);
    }
    if (l->cache)
        out->cache_keys = hirate_memory_count(l->cache);
    out->cache_hits = __atomic_load_n(&l->cache_hits, __ATOMIC_RELAXED);
    out->policy = __atomic_load_n(&l->policy, __ATOMIC_RELAXED);
    pthread_mutex_lock(&l->breaker.lock);
    out->breaker_opens = l->breaker.opens;
    pthread_mutex_unlock(&l->breaker.lock);
}

const char *hirate_script_source(size_t *len)
{
    if (len)
        *len = hirate__script_len;
    return hirate__script;
}

const char *hirate_script_sha1(void)
{
    return hirate__script_sha1;
}

const char *hirate_version(void)
{
    return HIRATE_VERSION_STRING;
}

/* ---- deciding without I/O (hirate_io.h) ----------------------------------------- */

enum { OP_DECIDE, OP_RESET };

struct hirate_op {
    int kind;
    batch b;            /* OP_DECIDE */
    int pass;           /* 1: every call as EVALSHA; 2: after NOSCRIPT, again */
    size_t next;        /* the next call whose reply is due */
    int drop;           /* the connection must not be used again */
    int rc;             /* OP_RESET: the outcome */
    int done;
    char *req;
    size_t reqlen;
    char err[HIRATE_ERRMSG_SIZE];
};

/* Encodes this pass's request: every call, or those that met NOSCRIPT with
 * the first as EVAL. */
static int op_encode(hirate_op *op)
{
    int select = op->pass == 2 ? HIRATE_PROTO_NOSCRIPT : 0;
    size_t cap = hirate_proto_batch_bound(op->b.calls, op->b.m, op->b.rcs, select, op->pass == 2);
    free(op->req);
    op->req = malloc(cap);
    if (!op->req)
        return HIRATE_ENOMEM;
    op->reqlen = hirate_proto_encode_batch(op->req, cap, op->b.calls, op->b.m, op->b.rcs, select,
                                           op->pass == 2);
    op->next = 0;
    return 0;
}

/* The next call of this pass still waiting for its reply, or m. */
static size_t op_due(const hirate_op *op)
{
    size_t j = op->next;
    while (op->pass == 2 && j < op->b.m && op->b.rcs[j] != HIRATE_PROTO_NOSCRIPT)
        j++;
    return j;
}

int hirate_op_start(hirate_limiter *l, hirate_item *items, size_t n, int spend, int64_t now_us,
                    hirate_op **out)
{
    *out = NULL;
    if (!l || (!items && n) || !l->redis)
        return HIRATE_EINVAL;
    hirate_op *op = calloc(1, sizeof *op);
    if (!op)
        return HIRATE_ENOMEM;
    op->kind = OP_DECIDE;
    op->b.keep_msgs = 1;
    if (!batch_begin(&op->b, l, items, n, spend, now_us)) {
        hirate_op_free(op);   /* decided without Redis */
        return 0;
    }
    op->pass = 1;
    if (op_encode(op) < 0) {
        hirate_op_fail(op, HIRATE_ENOMEM, "out of memory for a request");
        hirate_op_free(op);
        return 0;
    }
    *out = op;
    return 1;
}

int hirate_op_start_reset(hirate_limiter *l, const void *key, size_t keylen, hirate_op **out)
{
    *out = NULL;
    if (!l || !l->redis)
        return HIRATE_EINVAL;
    hirate_op *op = calloc(1, sizeof *op);
    if (!op)
        return HIRATE_ENOMEM;
    op->kind = OP_RESET;
    int rc = reset_local(l, key, keylen, op->err, sizeof op->err);
    if (rc < 0) {
        free(op);
        return rc;
    }
    char full[HIRATE_PREFIX_MAX + HIRATE_KEY_MAX];
    memcpy(full, l->prefix, l->prefixlen);
    memcpy(full + l->prefixlen, key, keylen);
    const char *argv[2] = {"DEL", full};
    size_t lens[2] = {3, l->prefixlen + keylen};
    op->reqlen = hirate_proto_encode_argv(NULL, 0, 2, argv, lens);
    if (!(op->req = malloc(op->reqlen))) {
        free(op);
        return HIRATE_ENOMEM;
    }
    hirate_proto_encode_argv(op->req, op->reqlen, 2, argv, lens);
    op->b.l = l;
    *out = op;
    return 1;
}

const char *hirate_op_request(const hirate_op *op, size_t *len)
{
    *len = op->reqlen;
    return op->req;
}

/* Every call still waiting for this pass's reply gets rc. */
static void op_answer_rest(hirate_op *op, int rc)
{
    for (size_t j = op_due(op); j < op->b.m; op->next = j + 1, j = op_due(op))
        op->b.rcs[j] = rc;
}

/* A reset's one reply: an integer is success. */
static int op_feed_reset(hirate_op *op, const char *buf, size_t len, size_t *used)
{
    hirate_reply rep;
    long r = hirate_proto_parse(buf, len, &rep);
    if (r == 0 && len <= HIRATE_PROTO_MAX_REPLY)
        return HIRATE_IO_MORE;
    op->done = 1;
    if (r <= 0 || r > HIRATE_PROTO_MAX_REPLY) {
        op->drop = 1;
        op->rc = hirate__fail(op->err, sizeof op->err, HIRATE_EPROTO,
                              "malformed reply from Redis: %s",
                              r < 0 ? rep.why : "longer than the longest reply");
        return HIRATE_IO_DONE;
    }
    *used = (size_t)r;
    if (rep.top.type == ':') {
        op->rc = 0;
    } else if (rep.top.type == '-') {
        op->rc = hirate_proto_error_reply(&rep, &op->drop, op->err, sizeof op->err);
    } else {
        op->drop = 1;
        op->rc = hirate__fail(op->err, sizeof op->err, HIRATE_EPROTO,
                              "malformed reply from Redis: DEL gave no integer");
    }
    if (op->rc < 0)
        remember(op->b.l, op->rc, op->err);
    return HIRATE_IO_DONE;
}

int hirate_op_feed(hirate_op *op, const char *buf, size_t len, size_t *used)
{
    *used = 0;
    if (op->done)
        return HIRATE_IO_DONE;
    if (op->kind == OP_RESET)
        return op_feed_reset(op, buf, len, used);
    for (;;) {
        size_t j = op_due(op);
        if (j == op->b.m) {
            int again = 0;
            for (size_t k = 0; op->pass == 1 && k < op->b.m; k++)
                again |= op->b.rcs[k] == HIRATE_PROTO_NOSCRIPT;
            if (again) {
                /* The calls that met NOSCRIPT provably did not run. */
                op->pass = 2;
                if (op_encode(op) == 0)
                    return HIRATE_IO_SEND;
                hirate_op_fail(op, HIRATE_ENOMEM, "out of memory for a request");
                return HIRATE_IO_DONE;
            }
            op->done = 1;
            batch_settle(&op->b, op->err);
            return HIRATE_IO_DONE;
        }
        hirate_reply rep;
        long r = hirate_proto_parse(buf + *used, len - *used, &rep);
        if (r == 0 && len - *used <= HIRATE_PROTO_MAX_REPLY)
            return HIRATE_IO_MORE;
        /* A reply over HIRATE_PROTO_MAX_REPLY bytes is refused even when it
         * arrives whole: in pieces it would have been, and so it is by the
         * C client, whose buffer holds no more. */
        if (r <= 0 || r > HIRATE_PROTO_MAX_REPLY) {
            hirate__fail(op->err, sizeof op->err, HIRATE_EPROTO, "malformed reply from Redis: %s",
                         r < 0 ? rep.why : "longer than the longest reply");
            hirate_op_fail(op, HIRATE_EPROTO, NULL);
            return HIRATE_IO_DONE;
        }
        op->b.rcs[j] = hirate_proto_outcome(&rep, &op->b.calls[j], op->b.l->cfg.capacity,
                                            op->pass == 2, &op->b.ds[j], &op->b.states[j],
                                            &op->drop, op->err, sizeof op->err);
        if (op->b.rcs[j] < 0)
            batch_note(&op->b, op->b.index[j], op->err);   /* its own words */
        *used += (size_t)r;
        op->next = j + 1;
    }
}

void hirate_op_fail(hirate_op *op, int code, const char *why)
{
    if (op->done)
        return;
    if (why && *why)
        hirate__fail(op->err, sizeof op->err, code, "%s", why);
    else if (!op->err[0] || code != HIRATE_EPROTO)
        hirate__fail(op->err, sizeof op->err, code, "%s", hirate_strerror(code));
    op->drop = 1;
    op->done = 1;
    if (op->kind == OP_RESET) {
        op->rc = code;
        if (code != HIRATE_ECLOSED)
            remember(op->b.l, code, op->err);
        return;
    }
    op_answer_rest(op, code);
    /* Calls that met NOSCRIPT in the first pass were waiting to be sent
     * again; they will not be, so the failure is theirs too. */
    for (size_t j = 0; j < op->b.m; j++)
        if (op->b.rcs[j] == HIRATE_PROTO_NOSCRIPT)
            op->b.rcs[j] = code;
    batch_settle(&op->b, op->err);
}

int hirate_op_drop(const hirate_op *op)
{
    return op->drop;
}

const char *hirate_op_errmsg(const hirate_op *op, size_t i)
{
    if (!op)
        return NULL;
    if (op->kind == OP_RESET)
        return i == 0 && op->rc < 0 ? op->err : NULL;
    if (i >= op->b.n || op->b.items[i].rc >= 0)
        return NULL;
    if (op->b.msgs && op->b.msgs[i])
        return op->b.msgs[i];
    return hirate_strerror(op->b.items[i].rc);
}

int hirate_op_result(const hirate_op *op)
{
    return op->kind == OP_RESET ? op->rc : 0;
}

void hirate_op_free(hirate_op *op)
{
    if (!op)
        return;
    if (op->kind == OP_DECIDE)
        batch_free(&op->b);
    free(op->req);
    free(op);
}

int hirate_endpoint_get(hirate_limiter *l, hirate_endpoint *out)
{
    if (!l || !l->redis || !out)
        return HIRATE_EINVAL;
    hirate_link_endpoint(&l->link, out);
    return 0;
}

int hirate_handshake_start(hirate_limiter *l, hirate_handshake **out, char *err, size_t errlen)
{
    if (!out)
        return HIRATE_EINVAL;
    *out = NULL;
    if (!l || !l->redis)
        return hirate__fail(err, errlen, HIRATE_EINVAL, "the limiter has no Redis URL");
    return hirate_link_handshake(&l->link, out, err, errlen);
}
