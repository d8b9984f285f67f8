/* Nodes and a Redis Cluster's slot map (cluster.h says the rules). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "errors.h"
#include "memory.h"

int hirate_node_init(hirate_node *n, const hirate_link *seed, const char *host, int port,
                     int role, int pool_size, int backoff_min_ms, int backoff_max_ms)
{
    memset(n, 0, sizeof *n);
    if (hirate_link_clone(&n->link, seed, host, port, role) < 0)
        return HIRATE_ENOMEM;
    hirate_link_start(&n->link);
    hirate_redis_cfg rc = {&n->link, pool_size};
    if (!(n->redis = hirate_redis_new(&rc))) {
        hirate_link_destroy(&n->link);
        return HIRATE_ENOMEM;
    }
    hirate_breaker_init(&n->breaker, backoff_min_ms, backoff_max_ms);
    return 0;
}

void hirate_node_destroy(hirate_node *n)
{
    hirate_redis_free(n->redis);
    hirate_breaker_destroy(&n->breaker);
    hirate_link_destroy(&n->link);
}

static int find_role(hirate_cluster *c, const char *host, int port, int role);

int hirate_cluster_init(hirate_cluster *c, hirate_node *n0, int pool_size, int backoff_min_ms,
                        int backoff_max_ms)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    c->nodes[0] = n0;
    c->nnodes = 1;
    c->pool_size = pool_size;
    c->backoff_min_ms = backoff_min_ms;
    c->backoff_max_ms = backoff_max_ms;
    c->rng = ((uint64_t)(uintptr_t)c * 0x9e3779b97f4a7c15ull) ^ (uint64_t)hirate_monotonic_us();
    c->rng |= 1;
    c->stale = 1;   /* no map yet */
    c->sentinel = n0->link.role == HIRATE_LINK_SENTINEL;
    c->master = c->announced = -1;
    const char *p = n0->link.url.seeds;
    char host[256];
    int port;
    while (hirate_url_next_seed(&n0->link.url, &p, host, &port))
        if (find_role(c, host, port, n0->link.role) < 0)
            return HIRATE_ENOMEM;
    c->nsentinels = c->sentinel ? c->nnodes : 0;
    return 0;
}

void hirate_cluster_destroy(hirate_cluster *c)
{
    for (int i = 1; i < c->nnodes; i++) {
        hirate_node_destroy(c->nodes[i]);
        free(c->nodes[i]);
    }
    pthread_mutex_destroy(&c->lock);
}

hirate_node *hirate_cluster_node(hirate_cluster *c, int id)
{
    return id >= 0 && id < __atomic_load_n(&c->nnodes, __ATOMIC_ACQUIRE) ? c->nodes[id] : NULL;
}

int hirate_cluster_count(hirate_cluster *c)
{
    return __atomic_load_n(&c->nnodes, __ATOMIC_ACQUIRE);
}

static int same_node(const hirate_node *n, const char *host, int port)
{
    return n->link.url.port == port && strcmp(n->link.url.host, host) == 0;
}

int hirate_cluster_find(hirate_cluster *c, const char *host, int port)
{
    return find_role(c, host, port, c->sentinel ? HIRATE_LINK_MASTER : HIRATE_LINK_REDIS);
}

static int find_role(hirate_cluster *c, const char *host, int port, int role)
{
    int count = hirate_cluster_count(c);
    for (int i = 0; i < count; i++)
        if (same_node(c->nodes[i], host, port))
            return i;
    pthread_mutex_lock(&c->lock);
    int id = -1;
    for (int i = count; i < c->nnodes; i++)   /* added meanwhile? */
        if (same_node(c->nodes[i], host, port))
            id = i;
    if (id < 0 && c->nnodes < HIRATE_IO_NODES_MAX) {
        hirate_node *n = malloc(sizeof *n);
        if (n && hirate_node_init(n, &c->nodes[0]->link, host, port, role, c->pool_size,
                                  c->backoff_min_ms, c->backoff_max_ms) == 0) {
            n->id = id = c->nnodes;
            c->nodes[id] = n;
            __atomic_store_n(&c->nnodes, id + 1, __ATOMIC_RELEASE);
        } else {
            free(n);
        }
    }
    pthread_mutex_unlock(&c->lock);
    return id;
}

/* A node that calls may go to: its breaker is not open, and its link is not
 * waiting out a backoff. */
static int healthy(hirate_node *n)
{
    return __atomic_load_n(&n->breaker.state, __ATOMIC_RELAXED) == 0 &&
           !__atomic_load_n(&n->link.failing, __ATOMIC_RELAXED);
}

int hirate_cluster_route(hirate_cluster *c, unsigned slot)
{
    if (c->sentinel)
        return __atomic_load_n(&c->master, __ATOMIC_ACQUIRE);
    int owner = __atomic_load_n(&c->owner[slot], __ATOMIC_RELAXED);
    if (owner)
        return owner - 1;
    int count = hirate_cluster_count(c);
    for (int i = 0; i < count; i++)
        if (healthy(c->nodes[i]))
            return i;
    return 0;
}

void hirate_cluster_moved(hirate_cluster *c, unsigned slot, int node)
{
    __atomic_store_n(&c->owner[slot], (uint16_t)(node + 1), __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->moved, 1, __ATOMIC_RELAXED);
    hirate_cluster_stale(c);
}

void hirate_cluster_stale(hirate_cluster *c)
{
    if (!__atomic_load_n(&c->stale, __ATOMIC_RELAXED))
        __atomic_store_n(&c->stale, 1, __ATOMIC_RELAXED);
}

void hirate_cluster_master_lost(hirate_cluster *c, int node)
{
    int was = node;
    __atomic_compare_exchange_n(&c->master, &was, -1, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
    hirate_cluster_stale(c);
}

static uint64_t next_random(hirate_cluster *c)
{
    uint64_t x = c->rng;   /* xorshift64, under the lock */
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return c->rng = x;
}

/* The sentinel to ask, under the lock: the one whose turn it is, unless it
 * fails while another does not. */
static int sentinel_to_ask(hirate_cluster *c)
{
    for (int k = 0; k < c->nsentinels; k++) {
        int i = (c->turn + k) % c->nsentinels;
        if (healthy(c->nodes[i]))
            return c->turn = i;
    }
    return c->turn;   /* none is healthy: someone must look */
}

static int sentinel_refresh_begin(hirate_cluster *c, int64_t now_us)
{
    int unknown = __atomic_load_n(&c->master, __ATOMIC_ACQUIRE) < 0;
    int stale = __atomic_load_n(&c->stale, __ATOMIC_RELAXED);
    int64_t every = stale ? HIRATE_CLUSTER_REFRESH_MS * 1000 : HIRATE_SENTINEL_POLL_MS * 1000;
    /* The common case: one load each, and the clock the op read anyway. */
    if (!unknown && now_us - __atomic_load_n(&c->last_refresh_us, __ATOMIC_RELAXED) < every)
        return -1;
    pthread_mutex_lock(&c->lock);
    int node = -1;
    /* Without a master every op asks: its calls cannot go anywhere else. */
    if (unknown || (!c->refreshing && now_us - c->last_refresh_us >= every)) {
        node = sentinel_to_ask(c);
        c->refreshing += 1;
        __atomic_store_n(&c->last_refresh_us, now_us, __ATOMIC_RELAXED);
        __atomic_fetch_add(&c->refreshes, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&c->lock);
    return node;
}

int hirate_cluster_refresh_begin(hirate_cluster *c, int64_t now_us, int prefer)
{
    if (c->sentinel)
        return sentinel_refresh_begin(c, now_us);
    if (!__atomic_load_n(&c->stale, __ATOMIC_RELAXED))
        return -1;   /* the common case: one load */
    pthread_mutex_lock(&c->lock);
    int node = -1;
    if (!c->refreshing && now_us - c->last_refresh_us >= HIRATE_CLUSTER_REFRESH_MS * 1000) {
        if (prefer >= 0 && prefer < c->nnodes && healthy(c->nodes[prefer])) {
            node = prefer;
        } else {
            int ok[HIRATE_IO_NODES_MAX], n = 0;
            for (int i = 0; i < c->nnodes; i++)
                if (healthy(c->nodes[i]))
                    ok[n++] = i;
            uint64_t x = next_random(c);
            /* With no healthy node, any: someone must look. */
            node = n ? ok[x % (uint64_t)n] : (int)(x % (uint64_t)c->nnodes);
        }
        c->refreshing = 1;
        __atomic_store_n(&c->last_refresh_us, now_us, __ATOMIC_RELAXED);
        __atomic_fetch_add(&c->refreshes, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&c->lock);
    return node;
}

typedef struct apply_ctx {
    hirate_cluster *c;
    uint16_t *owner;
    int full;       /* the node table ran out */
} apply_ctx;

static int apply_range(void *ctx, unsigned lo, unsigned hi, const char *host, int port)
{
    apply_ctx *a = ctx;
    int id = hirate_cluster_find(a->c, host, port);
    if (id < 0) {
        a->full = 1;
        return 0;
    }
    for (unsigned s = lo; s <= hi; s++)
        a->owner[s] = (uint16_t)(id + 1);
    return 0;
}

/* A sentinel's answer: [host, port] of the master, nil when it knows no
 * master of that name. */
static int sentinel_refresh_end(hirate_cluster *c, int from, const hirate_rnode *reply, char *err,
                                size_t errlen)
{
    hirate_node *self = hirate_cluster_node(c, from);
    hirate_endpoint ep;
    hirate_link_endpoint(&self->link, &ep);
    const char *service = self->link.url.service;
    int rc = 0, id = -1;
    long port = 0;
    char *end = NULL;
    if (!reply) {
        rc = HIRATE_EIO;
    } else if (reply->type == '-') {
        char prefix[400];
        snprintf(prefix, sizeof prefix, "SENTINEL GET-MASTER-ADDR-BY-NAME to %s: Redis replied: ",
                 ep.where);
        rc = hirate__fail_quoting(err, errlen, HIRATE_EREPLY, prefix, reply->str, reply->len);
    } else if (reply->type == 0) {
        rc = hirate__fail(err, errlen, HIRATE_EREPLY, "sentinel %s knows no master named '%s'",
                          ep.where, service);
    } else if (reply->type != '*' || reply->len != 2 || reply->elem[0]->type != '$' ||
               reply->elem[1]->type != '$' || !reply->elem[0]->len ||
               reply->elem[0]->len >= 256 ||
               (port = strtol(reply->elem[1]->str, &end, 10)) < 1 || port > 65535 || *end) {
        rc = hirate__fail(err, errlen, HIRATE_EPROTO,
                          "malformed reply from Redis: sentinel %s did not answer [host, port]",
                          ep.where);
    } else if ((id = hirate_cluster_find(c, reply->elem[0]->str, (int)port)) < 0) {
        rc = hirate__fail(err, errlen, HIRATE_ESERVER, "more than %d masters of '%s'",
                          HIRATE_IO_NODES_MAX - c->nsentinels, service);
    }
    pthread_mutex_lock(&c->lock);
    c->refreshing -= 1;
    int before = c->announced;
    if (rc == 0) {
        __atomic_store_n(&c->stale, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&c->master, id, __ATOMIC_RELEASE);
        c->turn = from;   /* it answered: ask it first next time */
        /* Decided under the lock, so that two ops that learnt the same news
         * do not both tell it. */
        if (id != c->announced) {
            c->announced = id;
            __atomic_fetch_add(&c->master_changes, 1, __ATOMIC_RELAXED);
        } else {
            before = id;
        }
    } else if (c->nsentinels) {
        c->turn = (from + 1) % c->nsentinels;   /* the next one, next time */
    }
    pthread_mutex_unlock(&c->lock);
    if (rc == 0 && before != id) {
        hirate_endpoint now;
        hirate_link_endpoint(&c->nodes[id]->link, &now);
        if (before < 0) {
            hirate_link_log(&self->link, HIRATE_LOG_INFO, "sentinel: the master of '%s' is %s",
                            service, now.where);
        } else {
            hirate_endpoint old;
            hirate_link_endpoint(&c->nodes[before]->link, &old);
            hirate_link_log(&self->link, HIRATE_LOG_INFO,
                            "sentinel: the master of '%s' moved from %s to %s", service,
                            old.where, now.where);
        }
    }
    return rc;
}

int hirate_cluster_refresh_end(hirate_cluster *c, int from, const hirate_rnode *reply, char *err,
                               size_t errlen)
{
    if (c->sentinel)
        return sentinel_refresh_end(c, from, reply, err, errlen);
    int rc = 0;
    uint16_t *owner = reply ? calloc(HIRATE_SLOTS, sizeof *owner) : NULL;
    if (reply && owner) {
        const char *why = NULL;
        apply_ctx a = {c, owner, 0};
        hirate_node *self = hirate_cluster_node(c, from);
        int parsed = hirate_cluster_parse_slots(reply, self ? self->link.url.host : "",
                                                apply_range, &a, &why);
        if (parsed == HIRATE_EREPLY) {
            rc = hirate__fail_quoting(err, errlen, HIRATE_EREPLY, "CLUSTER SLOTS: Redis replied: ",
                                      reply->str, reply->len);
        } else if (parsed < 0) {
            rc = hirate__fail(err, errlen, HIRATE_EPROTO,
                              "malformed reply from Redis: CLUSTER SLOTS: %s", why);
        } else {
            /* Slot by slot: a call routed meanwhile sees the old owner or
             * the new one, and either is right or answers MOVED. */
            for (unsigned s = 0; s < HIRATE_SLOTS; s++)
                __atomic_store_n(&c->owner[s], owner[s], __ATOMIC_RELAXED);
        }
    }
    free(owner);
    pthread_mutex_lock(&c->lock);
    c->refreshing = 0;
    if (!reply && !c->have_map)
        c->last_refresh_us = INT64_MIN / 2;   /* no map at all: ask another node now */
    if (reply && rc == 0) {
        c->have_map = 1;
        __atomic_store_n(&c->stale, 0, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* ---- parsers ------------------------------------------------------------------ */

static int read_uint(const char *s, size_t n, unsigned long max, unsigned long *out)
{
    unsigned long v = 0;
    if (n == 0 || n > 10)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (unsigned long)(s[i] - '0');
    }
    if (v > max)
        return -1;
    *out = v;
    return 0;
}

int hirate_redirect_parse(const char *msg, size_t len, int *ask, unsigned *slot, char host[256],
                          int *port)
{
    size_t i;
    if (len > 6 && memcmp(msg, "MOVED ", 6) == 0) {
        *ask = 0;
        i = 6;
    } else if (len > 4 && memcmp(msg, "ASK ", 4) == 0) {
        *ask = 1;
        i = 4;
    } else {
        return 0;
    }
    const char *sp = memchr(msg + i, ' ', len - i);
    unsigned long v;
    if (!sp || read_uint(msg + i, (size_t)(sp - msg - i), HIRATE_SLOTS - 1, &v) < 0)
        return 0;
    *slot = (unsigned)v;
    const char *ep = sp + 1, *end = msg + len;
    const char *colon = NULL;
    for (const char *q = ep; q < end; q++)   /* the last ':' (an IPv6 host has more) */
        if (*q == ':')
            colon = q;
    if (!colon || read_uint(colon + 1, (size_t)(end - colon - 1), 65535, &v) < 0 || v == 0)
        return 0;
    size_t hl = (size_t)(colon - ep);
    if (hl >= 2 && ep[0] == '[' && ep[hl - 1] == ']') {
        ep++;
        hl -= 2;
    }
    if (hl >= 256 || memchr(ep, '\0', hl) || memchr(ep, ' ', hl))
        return 0;
    memcpy(host, ep, hl);
    host[hl] = '\0';
    *port = (int)v;
    return 1;
}

/* A node of a range: [host, port, ...]. */
static int node_fields(const hirate_rnode *n, const char **host, int *port)
{
    if (n->type != '*' || n->len < 2 || n->elem[0]->type != '$' || n->elem[1]->type != ':' ||
        n->elem[1]->integer < 0 || n->elem[1]->integer > 65535)
        return -1;
    *host = n->elem[0]->str;
    *port = (int)n->elem[1]->integer;
    return 0;
}

int hirate_cluster_parse_slots(const hirate_rnode *reply, const char *self, hirate_slots_fn fn,
                               void *ctx, const char **why)
{
    if (reply->type == '-') {
        *why = "an error reply";   /* the caller quotes it */
        return HIRATE_EREPLY;
    }
    if (reply->type != '*') {
        *why = "not an array";
        return HIRATE_EPROTO;
    }
    for (size_t i = 0; i < reply->len; i++) {
        const hirate_rnode *r = reply->elem[i];
        const char *host;
        int port;
        if (r->type != '*' || r->len < 3 || r->elem[0]->type != ':' || r->elem[1]->type != ':' ||
            r->elem[0]->integer < 0 || r->elem[1]->integer >= HIRATE_SLOTS ||
            r->elem[0]->integer > r->elem[1]->integer || node_fields(r->elem[2], &host, &port) < 0) {
            *why = "a slot range is not [first, last, [host, port, ...], ...]";
            return HIRATE_EPROTO;
        }
        /* An empty or unknown endpoint is the node that replied. */
        if (!host[0] || strcmp(host, "?") == 0)
            host = self;
        if (port == 0)
            continue;   /* a master without a port to reach it: not routable */
        int rc = fn(ctx, (unsigned)r->elem[0]->integer, (unsigned)r->elem[1]->integer, host, port);
        if (rc < 0)
            return rc;
    }
    return 0;
}

void hirate_cluster_fork_prepare(hirate_cluster *c)
{
    pthread_mutex_lock(&c->lock);
    for (int i = 1; i < c->nnodes; i++) {
        pthread_mutex_lock(&c->nodes[i]->breaker.lock);
        hirate_link_fork_prepare(&c->nodes[i]->link);
        hirate_redis_fork_prepare(c->nodes[i]->redis);
    }
}

void hirate_cluster_fork_release(hirate_cluster *c, int child)
{
    for (int i = 1; i < c->nnodes; i++) {
        if (child)
            hirate_redis_fork_child(c->nodes[i]->redis);
        else
            hirate_redis_fork_parent(c->nodes[i]->redis);
        hirate_link_fork_release(&c->nodes[i]->link, child);
        pthread_mutex_unlock(&c->nodes[i]->breaker.lock);
    }
    if (child)
        c->refreshing = 0;   /* the op that carried it is in the parent */
    pthread_mutex_unlock(&c->lock);
}
