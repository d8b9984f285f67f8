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
#include "cluster.h"
#include "duration.h"
#include "options.h"
#include "errors.h"
#include "name.h"
#include "fork.h"
#include "handshake.h"
#include "hirate_io.h"
#include "link.h"
#include "memory.h"
#include "metrics.h"
#include "redis.h"
#include "script.h"
#include "shm.h"

struct hirate_limiter {
    hirate_fork_node fork;      /* first: the fork hooks get this pointer */
    hirate_counts counts[HIRATE_METRICS_STRIPES];  /* decisions and errors */
    hirate_latency op_latency;  /* the round trips of ops' legs */
    int64_t deny_cache_max_us;  /* a remembered refusal is trusted this long */
    size_t nbands;              /* 1..HIRATE_BANDS_MAX */
    int64_t cap_min;            /* the least capacity: a cost above it never passes */
    hirate_bucket_cfg cfg[HIRATE_BANDS_MAX];
    hirate_bucket_cfg local_cfg[HIRATE_BANDS_MAX];/* the LOCAL fallback's share */
    char prefix[HIRATE_PREFIX_MAX + 1];
    size_t prefixlen;
    char args[HIRATE_BANDS_MAX * 64];/* each band's capacity and rate as RESP bulk strings */
    size_t argslen;
    char names[HIRATE_BANDS_MAX][HIRATE_BAND_NAME_MAX + 1];
    int on_error;
    hirate_node node0;          /* with a URL: where Redis is (a cluster's
                                   first seed), its backoff, breaker and pool;
                                   node0.redis NULL: in-memory */
    hirate_cluster *cluster;    /* a Redis Cluster's nodes and map, or NULL */
    hirate_memory *memory;      /* the buckets without a URL; with one, the
                                   LOCAL fallback's (NULL for OPEN, CLOSED) */
    hirate_shm *shm;            /* with shared: the table in place of memory,
                                   shared with the processes forked since */
    hirate_memory *cache;       /* refusals foretold from Redis' replies */
    uint64_t reset_epoch;       /* bumped by every reset (atomic) */
    int64_t offset_min[2];      /* least (Redis time - send time) seen in this
                                   window and the last one (atomic) */
    int64_t offset_window;      /* when this window began (atomic) */
    uint64_t cache_hits, policy;/* counters (atomic) */
    uint64_t op_evalsha, op_eval, op_fcall, op_loads;/* sent by ops (atomic) */
    uint64_t serial;            /* this limiter's number, for last_error */
};

/* The calling thread's last error (hirate_limiter_errmsg): its message, and
 * the serial number of the limiter it met it on (an address may be reused by
 * a limiter made after another is freed; a number is not). Per thread, so
 * threads sharing a limiter each read their own. */
static _Thread_local struct {
    uint64_t serial;
    char msg[HIRATE_ERRMSG_SIZE];
} last_error;
static uint64_t serials;        /* the last serial number given (atomic) */

/* Node id of the limiter: node 0 is its own, a cluster's others are in its
 * table. NULL for a number never given. */
static hirate_node *node_of(hirate_limiter *l, int id)
{
    if (l->cluster)
        return hirate_cluster_node(l->cluster, id);
    return id == 0 && l->node0.redis ? &l->node0 : NULL;
}

/* The defaults, in a struct of this library's size. */
static void options_defaults(hirate_options *o)
{
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
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
    o->deny_cache_max_ms = 1000;
    o->tls_verify = 1;
    o->functions = 1;
}

/* A program built against an older hirate.h has a shorter hirate_options (its
 * size says how long): it gets the fields it knows, and never a byte more. A
 * newer program's longer struct gets ours and zeros after them. */
void hirate_options_init_size(hirate_options *o, size_t size)
{
    if (!o || size < sizeof o->size)
        return;
    hirate_options d;
    options_defaults(&d);
    if (size > sizeof d)
        memset((char *)o + sizeof d, 0, size - sizeof d);
    d.size = size;
    memcpy(o, &d, size < sizeof d ? size : sizeof d);
}

/* The end of the first hirate_options that carried its size (0.2's): no
 * hirate_options_init of this SOVERSION sets a smaller one. */
#define OPTIONS_SIZE_MIN (offsetof(hirate_options, log_arg) + sizeof(void *))
#define OPTIONS_SIZE_MAX 65536

/* The caller's options as this library's: the fields an older program lacks
 * keep their defaults; a newer program's fields past ours must be zero
 * (unused), since this library cannot honour them. */
static int options_read(hirate_options *o, const hirate_options *in, char *err, size_t errlen)
{
    size_t size = in->size;
    if (size < OPTIONS_SIZE_MIN || size > OPTIONS_SIZE_MAX)
        return hirate__fail(err, errlen, HIRATE_EOPTION,
                            "options: size is %zu, not one that hirate_options_init sets "
                            "(call it before setting any field)", size);
    options_defaults(o);
    memcpy(o, in, size < sizeof *o ? size : sizeof *o);
    for (size_t i = sizeof *o; i < size; i++)
        if (((const unsigned char *)in)[i] != 0)
            return hirate__fail(err, errlen, HIRATE_EOPTION,
                                "options: byte %zu is set, a field this library (hirate %s, "
                                "options of %zu bytes) does not know",
                                i, HIRATE_VERSION_STRING, sizeof *o);
    o->size = sizeof *o;
    return 0;
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
    pthread_mutex_lock(&l->node0.breaker.lock);
    if (l->node0.redis) {
        hirate_link_fork_prepare(&l->node0.link);
        hirate_redis_fork_prepare(l->node0.redis);
    }
    if (l->cluster)
        hirate_cluster_fork_prepare(l->cluster);
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
    if (l->cluster)
        hirate_cluster_fork_release(l->cluster, child);
    if (l->cache)
        hirate_memory_unlock_all(l->cache);
    if (l->memory)
        hirate_memory_unlock_all(l->memory);
    if (l->node0.redis && child)
        hirate_redis_fork_child(l->node0.redis);
    else if (l->node0.redis)
        hirate_redis_fork_parent(l->node0.redis);
    if (l->node0.redis)
        hirate_link_fork_release(&l->node0.link, child);
    pthread_mutex_unlock(&l->node0.breaker.lock);
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

/* A band's name: 1..HIRATE_BAND_NAME_MAX printable ASCII bytes, or NULL
 * for "<capacity>-per-<w>s". */
static int band_name(const char *name, const hirate_bucket_cfg *cfg, char *out, const char *what,
                     char *err, size_t errlen)
{
    if (!name) {
        snprintf(out, HIRATE_BAND_NAME_MAX + 1, "%lld-per-%llds", (long long)cfg->capacity,
                 (long long)hirate_refill_seconds(cfg->capacity, cfg->rate));
        return 0;
    }
    int rc = hirate__name_check(name, what, err, errlen);
    if (rc < 0)
        return rc;
    memcpy(out, name, strlen(name) + 1);
    return 0;
}

/* The limit: capacity and rate, bands, or limits (exactly one), into the
 * limiter's bands. */
static int check_limit(const hirate_options *o, hirate_limiter *l, char *err, size_t errlen)
{
    int given = (o->capacity != 0 || o->rate != 0) + (o->bands != NULL || o->nbands != 0) +
                (o->limits != NULL);
    if (given > 1)
        return hirate__fail(err, errlen, HIRATE_EOPTION,
                            "set the limit once: capacity and rate, bands, or limits");
    char why[HIRATE_ERRMSG_SIZE], what[32];
    int rc;
    if (o->limits) {
        hirate_limit lim[HIRATE_BANDS_MAX];
        size_t n;
        if ((rc = hirate_limits_parse(o->limits, lim, HIRATE_BANDS_MAX, &n, err, errlen)) < 0)
            return rc;
        for (size_t i = 0; i < n; i++) {
            if ((rc = hirate_bucket_cfg_init(&l->cfg[i], lim[i].capacity, lim[i].rate, err,
                                             errlen)) < 0)
                return rc;
            band_name(NULL, &l->cfg[i], l->names[i], NULL, NULL, 0);
        }
        l->nbands = n;
    } else if (o->bands || o->nbands) {
        if (!o->bands || o->nbands == 0 || o->nbands > HIRATE_BANDS_MAX)
            return hirate__fail(err, errlen, HIRATE_EOPTION,
                                "bands must be 1 to %d bands, got %zu%s", HIRATE_BANDS_MAX,
                                o->nbands, o->bands ? "" : " and no array");
        for (size_t i = 0; i < o->nbands; i++) {
            snprintf(what, sizeof what, "bands[%zu]", i);
            if ((rc = hirate_bucket_cfg_init(&l->cfg[i], o->bands[i].capacity, o->bands[i].rate,
                                             why, sizeof why)) < 0)
                return hirate__fail(err, errlen, rc, "%s: %s", what, why);
            if ((rc = band_name(o->bands[i].name, &l->cfg[i], l->names[i], what, err,
                                errlen)) < 0)
                return rc;
            for (size_t k = 0; k < i; k++)
                if (strcmp(l->names[k], l->names[i]) == 0)
                    return hirate__fail(err, errlen, HIRATE_EOPTION,
                                        "%s: bands[%zu] has the same name, '%s'", what, k,
                                        l->names[i]);
        }
        l->nbands = o->nbands;
    } else {
        if ((rc = hirate_bucket_cfg_init(&l->cfg[0], o->capacity, o->rate, err, errlen)) < 0)
            return rc;
        band_name(NULL, &l->cfg[0], l->names[0], NULL, NULL, 0);
        l->nbands = 1;
    }
    /* Limits and their default names: two limits of the same numbers. */
    for (size_t i = 1; o->limits && i < l->nbands; i++)
        for (size_t k = 0; k < i; k++)
            if (strcmp(l->names[k], l->names[i]) == 0)
                return hirate__fail(err, errlen, HIRATE_EOPTION,
                                    "limits: two limits are the same (%s)", l->names[i]);
    l->cap_min = l->cfg[0].capacity;
    for (size_t i = 1; i < l->nbands; i++)
        if (l->cfg[i].capacity < l->cap_min)
            l->cap_min = l->cfg[i].capacity;
    return 0;
}

static int check_options(const hirate_options *o, hirate_limiter *l, char *err, size_t errlen)
{
    int rc;
    if ((rc = check_limit(o, l, err, errlen)) < 0 ||
        (rc = hirate__duration_check(o, "connect_timeout", err, errlen)) < 0 ||
        (rc = hirate__duration_check(o, "timeout", err, errlen)) < 0 ||
        (rc = check_range("pool_size", o->pool_size, 1, 1024, err, errlen)) < 0 ||
        (rc = hirate__max_keys_check(o->max_keys, err, errlen)) < 0)
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
        (rc = check_range("shared", o->shared, 0, 1, err, errlen)) < 0 ||
        (o->deny_cache &&
         (rc = check_range("deny_cache_keys",
                           (long long)(o->deny_cache_keys > 4000000000u ? 4000000001u
                                                                       : o->deny_cache_keys),
                           1, 4000000000LL, err, errlen)) < 0) ||
        (o->deny_cache && (rc = hirate__duration_check(o, "deny_cache_max", err, errlen)) < 0))
        return rc;
    if (o->shared && o->url && o->on_error != HIRATE_ON_ERROR_LOCAL)
        return hirate__fail(err, errlen, HIRATE_EOPTION,
                            "shared: a limiter with a URL keeps in-memory buckets only for "
                            "on_error = local; with on_error = %s it has none to share",
                            hirate_on_error_name(o->on_error));
    if (o->prefix && strlen(o->prefix) > HIRATE_PREFIX_MAX)
        return hirate__fail(err, errlen, HIRATE_EOPTION, "prefix is %zu bytes; the most is %d",
                            strlen(o->prefix), HIRATE_PREFIX_MAX);
    return 0;
}

/* Weak, with a hidden alias: the shared library's hirate_limiter_new@@HIRATE_0.2
 * is compat_0_1.c's, which calls the alias, next to 0.1's; the static
 * library and the bindings take this definition as it is. */
__attribute__((weak)) int hirate_limiter_new(hirate_limiter **out, const hirate_options *opts,
                                             char *err, size_t errlen)
{
    hirate_redis_cfg rcfg;
    hirate_link link;
    hirate_options own;
    const hirate_options *o = &own;
    int rc;

    if (err && errlen)
        err[0] = '\0';
    if (!out || !opts)
        return hirate__fail(err, errlen, HIRATE_EINVAL, "hirate_limiter_new needs out and opts");
    *out = NULL;
    if ((rc = options_read(&own, opts, err, errlen)) < 0)
        return rc;
    /* Aligned for the counts' stripes, a cache line each. */
    hirate_limiter *l = aligned_alloc(_Alignof(hirate_limiter),
                                      (sizeof *l + _Alignof(hirate_limiter) - 1) /
                                          _Alignof(hirate_limiter) * _Alignof(hirate_limiter));
    if (!l)
        return hirate__fail(err, errlen, HIRATE_ENOMEM, "out of memory");
    memset(l, 0, sizeof *l);
    if ((rc = check_options(o, l, err, errlen)) < 0) {
        free(l);
        return rc;
    }
    memcpy(l->local_cfg, l->cfg, sizeof l->cfg);
    if (o->url) {
        if ((rc = hirate_link_init(&link, o, err, errlen)) < 0) {
            free(l);
            return rc;
        }
        memset(&rcfg, 0, sizeof rcfg);
        rcfg.pool_size = o->pool_size;
        /* N instances falling back at once share each band N ways. */
        for (size_t i = 0; o->on_error == HIRATE_ON_ERROR_LOCAL && o->instances > 1 &&
                           i < l->nbands; i++) {
            int64_t share = l->cfg[i].capacity / o->instances;
            double rate = l->cfg[i].rate / o->instances;
            if (hirate_bucket_cfg_init(&l->local_cfg[i], share > 0 ? share : 1, rate, err,
                                       errlen) < 0) {
                hirate_link_destroy(&link);
                free(l);
                return hirate__fail(err, errlen, HIRATE_ERANGE,
                                    "the local share of the limit (capacity %lld, rate %g over %d "
                                    "instances) takes over 2^53 us to refill",
                                    (long long)(share > 0 ? share : 1), rate, o->instances);
            }
        }
    }

    l->offset_min[0] = l->offset_min[1] = INT64_MAX;
    l->deny_cache_max_us = (int64_t)o->deny_cache_max_ms * 1000;
    l->on_error = o->on_error;
    if (o->prefix) {
        l->prefixlen = strlen(o->prefix);
        memcpy(l->prefix, o->prefix, l->prefixlen);
    }
    for (size_t i = 0; i < l->nbands; i++)
        l->argslen += hirate_proto_encode_limits(l->args + l->argslen,
                                                 sizeof l->args - l->argslen, l->cfg[i].capacity,
                                                 l->cfg[i].rate);
    l->serial = __atomic_add_fetch(&serials, 1, __ATOMIC_RELAXED);
    hirate_breaker_init(&l->node0.breaker, o->backoff_min_ms, o->backoff_max_ms);
    int ok = 1;
    if (o->url) {
        l->node0.link = link;
        memset(&link, 0, sizeof link);   /* the password: one copy is enough */
        hirate_link_start(&l->node0.link);
        rcfg.link = &l->node0.link;
        ok = (l->node0.redis = hirate_redis_new(&rcfg)) != NULL;
        if (ok && (l->node0.link.url.cluster || l->node0.link.url.sentinel)) {
            ok = (l->cluster = malloc(sizeof *l->cluster)) != NULL &&
                 hirate_cluster_init(l->cluster, &l->node0, o->pool_size, o->backoff_min_ms,
                                     o->backoff_max_ms) == 0;
            if (!ok && l->cluster) {
                hirate_cluster_destroy(l->cluster);
                free(l->cluster);
                l->cluster = NULL;
            }
        }
        if (ok && o->deny_cache)
            ok = (l->cache = hirate_memory_new(o->deny_cache_keys, l->nbands, 1)) != NULL;
    }
    if (ok && (!o->url || o->on_error == HIRATE_ON_ERROR_LOCAL)) {
        if (o->shared && !(l->shm = hirate_shm_new(o->max_keys, l->nbands))) {
            hirate_limiter_free(l);
            return hirate__fail(err, errlen, HIRATE_ENOMEM,
                                "cannot map a shared table of %zu keys; lower max_keys",
                                o->max_keys);
        }
        if (!o->shared)
            ok = (l->memory = hirate_memory_new(o->max_keys, l->nbands, 0)) != NULL;
    }
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
extern __typeof(hirate_limiter_new) hirate__limiter_new
    __attribute__((alias("hirate_limiter_new"), visibility("hidden")));

void hirate_limiter_free(hirate_limiter *l)
{
    if (!l)
        return;
    if (l->fork.next)
        hirate_fork_unregister(&l->fork);
    if (l->cluster) {
        hirate_cluster_destroy(l->cluster);
        free(l->cluster);
    }
    hirate_redis_free(l->node0.redis);
    if (l->node0.link.started)
        hirate_link_destroy(&l->node0.link);
    hirate_memory_free(l->memory);
    hirate_shm_free(l->shm);
    hirate_memory_free(l->cache);
    hirate_breaker_destroy(&l->node0.breaker);
    free(l);
}

/* ---- decisions ------------------------------------------------------------------ */

/* The local buckets (no URL, or the LOCAL fallback's): this process' own
 * table, or the one shared with the processes forked since. */
static int local_decide(hirate_limiter *l, const hirate_bucket_cfg *cfg, const void *key,
                        size_t keylen, int64_t now, int64_t cost, int spend, hirate_decision *d,
                        hirate_decision *per)
{
    if (l->shm) {
        hirate_shm_decide(l->shm, cfg, key, keylen, now, cost, spend, d, per);
        return 0;
    }
    return hirate_memory_decide(l->memory, cfg, key, keylen, now, cost, spend, d, per);
}

static size_t local_count(hirate_limiter *l)
{
    return l->shm ? hirate_shm_count(l->shm) : hirate_memory_count(l->memory);
}

static int remember(hirate_limiter *l, int rc, const char *msg)
{
    last_error.serial = l->serial;
    snprintf(last_error.msg, sizeof last_error.msg, "%s", msg);
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
static void apply_policy(hirate_limiter *l, hirate_item *it, hirate_decision *per, int spend,
                         int64_t now, int error, int64_t wait_us)
{
    hirate_decision *d = &it->decision;
    size_t n = l->nbands;
    __atomic_fetch_add(&l->policy, 1, __ATOMIC_RELAXED);
    it->rc = 0;
    if (spend == HIRATE_OP_REFUND && l->on_error != HIRATE_ON_ERROR_LOCAL) {
        /* Open and closed keep no bucket to give the tokens to: saying they
         * were given back would hide that they were not. */
        char msg[HIRATE_ERRMSG_SIZE];
        snprintf(msg, sizeof msg, "the refund was not made: Redis failed (%s) and on_error is '%s'",
                 hirate_strerror(error), hirate_on_error_name(l->on_error));
        it->rc = remember(l, error, msg);
        return;
    }
    if (l->on_error == HIRATE_ON_ERROR_LOCAL) {
        it->rc = local_decide(l, l->local_cfg, it->key, it->keylen, now, it->cost, spend, d,
                              per);
    } else {
        hirate_decision own[HIRATE_BANDS_MAX], *bd = n == 1 ? d : per ? per : own;
        int open = l->on_error == HIRATE_ON_ERROR_OPEN;
        int pass = it->cost <= l->cap_min && (open || it->cost == 0);
        int64_t back = wait_us > 0 ? wait_us : 1;   /* until Redis is asked again */
        /* Open: as if every bucket were full. Closed: nothing passes but a
         * cost of 0 (which spends nothing), until Redis can be asked again. */
        for (size_t i = 0; i < n; i++) {
            int64_t capacity = l->cfg[i].capacity;
            int never = it->cost > capacity;
            bd[i].allowed = !never && (open || it->cost == 0);
            bd[i].source = open ? HIRATE_SOURCE_FAIL_OPEN : HIRATE_SOURCE_FAIL_CLOSED;
            bd[i].band = (int)i;
            bd[i].limit = capacity;
            bd[i].remaining = open && !never ? capacity - (pass ? it->cost : 0) : 0;
            bd[i].retry_after_us = never ? HIRATE_NEVER : bd[i].allowed ? 0 : back;
            bd[i].reset_after_us = open ? 0 : back;
            bd[i].time_us = now;
        }
        if (n > 1)
            hirate_bands_combine(bd, n, d);
        else if (per)
            per[0] = *d;
    }
    d->error = error;
    for (size_t i = 0; per && i < n; i++)
        per[i].error = error;
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
static inline __attribute__((always_inline)) void
learn_n(hirate_limiter *l, const hirate_item *it, const hirate_bucket *state, int64_t sent,
        int known, uint64_t epoch, size_t n)
{
    int64_t ahead = redis_ahead(l, it->decision.time_us - sent, sent);
    hirate_bucket local[HIRATE_BANDS_MAX];
    int short_of_cost = 0;
    for (size_t i = 0; i < n; i++) {
        local[i] = (hirate_bucket){state[i].tokens, state[i].ts - ahead};
        /* tokens is NAN when the reply showed every band kept the cost. */
        short_of_cost |= !isnan(local[i].tokens) &&
                         hirate_bucket_level(&l->cfg[i], &local[i], sent) < (double)it->cost;
    }
    if (short_of_cost) {
        /* A reset since the call was sent makes its reply stale. */
        if (__atomic_load_n(&l->reset_epoch, __ATOMIC_ACQUIRE) == epoch)
            hirate_memory_put(l->cache, l->cfg, it->key, it->keylen, local, sent);
    } else if (known) {
        hirate_memory_reset(l->cache, it->key, it->keylen);
    }
}

static __attribute__((noinline)) void learn_bands(hirate_limiter *l, const hirate_item *it,
                                                  const hirate_bucket *state, int64_t sent,
                                                  int known, uint64_t epoch)
{
    learn_n(l, it, state, sent, known, epoch, l->nbands);
}

/* One band, the common case, inlined with its loop unrolled away. */
static inline void learn(hirate_limiter *l, const hirate_item *it, const hirate_bucket *state,
                         int64_t sent, int known, uint64_t epoch)
{
    if (__builtin_expect(l->nbands == 1, 1))
        learn_n(l, it, state, sent, known, epoch, 1);
    else
        learn_bands(l, it, state, sent, known, epoch);
}

/* The code and message for a bad key or cost, kept out of the hot path. */
static int input_error(const void *key, size_t keylen, int64_t cost, int spend, char *err,
                       size_t errlen)
{
    int rc = check_key(key, keylen, err, errlen);
    if (rc < 0)
        return rc;
    if (spend == HIRATE_OP_REFUND && (cost < 0 || cost > HIRATE_EXACT_MAX))
        return hirate__fail(err, errlen, HIRATE_ECOST,
                            "refund cost must be a whole number of tokens from 0 to 2^53-1, got %lld",
                            (long long)cost);
    return hirate_bucket_check_cost(cost, err, errlen);
}

__attribute__((noinline, cold)) static int bad_input(hirate_limiter *l, const void *key,
                                                     size_t keylen, int64_t cost, int spend)
{
    char err[HIRATE_ERRMSG_SIZE];
    return remember(l, input_error(key, keylen, cost, spend, err, sizeof err), err);
}

/* Checks a key and a cost: 0, or the code with its message remembered. */
static inline int check_input(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                              int spend)
{
    if (key && keylen - 1 < HIRATE_KEY_MAX && cost >= 0 && cost <= HIRATE_EXACT_MAX)
        return 0;
    return bad_input(l, key, keylen, cost, spend);
}

/* A decision of the in-memory backend (no URL). */
static int decide_in_memory(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                            int spend, int64_t now, hirate_decision *out, hirate_decision *per)
{
    int rc = check_input(l, key, keylen, cost, spend);
    if (rc < 0)
        return rc;
    rc = local_decide(l, l->cfg, key, keylen, now, cost, spend, out, per);
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
    char *out_msgs;         /* or write them here, out_len bytes an item
                               (hirate_allow_many_msgs), or NULL */
    size_t out_len;
    char *call_msgs;        /* with out_msgs: each call's own message from
                               the blocking client (HIRATE_ERRMSG_SIZE a call) */
    int spend;
    int64_t now_us;         /* injected time, or < 0 */
    int64_t now;            /* the decision clock: injected or monotonic */
    size_t m;               /* calls for Redis */
    uint64_t epoch;         /* resets seen when the calls were made */
    hirate_decision *per;   /* each item's bands, nbands an item, or NULL */
    int own_per;            /* per is the batch's own (freed with it) */
    size_t *index;          /* item index of each call */
    hirate_call *calls;
    hirate_decision *ds;
    hirate_decision *cper;  /* each call's bands (nbands a call), or NULL for
                               one band: ds says it all */
    hirate_bucket *states;  /* each call's buckets, nbands a call */
    int *rcs;
    unsigned char *known;   /* the deny cache held the key */
    struct {                /* room for a single call: no allocation */
        size_t index;
        hirate_call call;
        hirate_decision d;
        hirate_decision per[HIRATE_BANDS_MAX];
        hirate_bucket state[HIRATE_BANDS_MAX];
        int rc;
        unsigned char known;
    } one;
} batch;

/* Counts the outcome of every item of a finished batch. */
static inline void count_items(hirate_limiter *l, const hirate_item *items, size_t n,
                               int spend)
{
    for (size_t i = 0; i < n; i++) {
        if (items[i].rc == 0)
            hirate_count_decision(l->counts, &items[i].decision, spend);
        else
            hirate_count_error(l->counts, items[i].rc);
    }
}

/* Item i's band figures in the batch's caller's memory, or NULL. */
static inline hirate_decision *item_bands(const batch *b, size_t i)
{
    return b->per ? b->per + i * b->l->nbands : NULL;
}

static int batch_alloc(batch *b, size_t n)
{
    size_t nb = b->l->nbands, nper = nb > 1 ? nb : 0;
    if (n <= 1) {
        b->index = &b->one.index;
        b->calls = &b->one.call;
        b->ds = &b->one.d;
        b->cper = nper ? b->one.per : NULL;
        b->states = b->one.state;
        b->rcs = &b->one.rc;
        b->known = &b->one.known;
        return 0;
    }
    /* One block, largest alignment first. */
    char *m = malloc(n * (sizeof(hirate_call) + (1 + nper) * sizeof(hirate_decision) +
                          nb * sizeof(hirate_bucket) + sizeof(size_t) + sizeof(int) + 1));
    if (!m)
        return HIRATE_ENOMEM;
    b->calls = (hirate_call *)m;
    b->ds = (hirate_decision *)(b->calls + n);
    b->cper = nper ? b->ds + n : NULL;
    b->states = (hirate_bucket *)(b->ds + n * (1 + nper));
    b->index = (size_t *)(b->states + n * nb);
    b->rcs = (int *)(b->index + n);
    b->known = (unsigned char *)(b->rcs + n);
    return 0;
}

static void batch_free(batch *b)
{
    if (b->calls && b->calls != &b->one.call)
        free(b->calls);
    if (b->own_per)
        free(b->per);
    for (size_t i = 0; b->msgs && i < b->n; i++)
        free(b->msgs[i]);
    free(b->msgs);
}

/* Keeps item i's message, for hirate_op_errmsg (only an op keeps them). */
static void batch_note(batch *b, size_t i, const char *msg)
{
    if (b->out_msgs)
        snprintf(b->out_msgs + i * b->out_len, b->out_len, "%s", msg);
    if (!b->keep_msgs || (!b->msgs && !(b->msgs = calloc(b->n, sizeof *b->msgs))))
        return;
    free(b->msgs[i]);
    b->msgs[i] = strdup(msg);
}

/* A refund makes any refusal foretold for key stale: forget it, and let no
 * reply of a call made before now teach it again (the reset epoch). Done
 * when the refund is sent and again when its reply comes, so that a call
 * that ran in Redis before the refund cannot leave its refusal behind. */
static void forget_refusal(hirate_limiter *l, const void *key, size_t keylen)
{
    if (!l->cache)
        return;
    __atomic_fetch_add(&l->reset_epoch, 1, __ATOMIC_ACQ_REL);
    hirate_memory_reset(l->cache, key, keylen);
}

/* Returns the number of calls left for Redis (0: every item is decided). */
static size_t batch_begin(batch *b, hirate_limiter *l, hirate_item *items, size_t n, int spend,
                          int64_t now_us, hirate_decision *per)
{
    b->l = l;
    b->per = per;
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
        if (!l->node0.redis) {
            it->rc = decide_in_memory(l, it->key, it->keylen, it->cost, spend, b->now,
                                      &it->decision, item_bands(b, i));
            if (it->rc < 0 && b->out_msgs)
                batch_note(b, i, last_error.msg);   /* what decide_in_memory said */
        } else if ((it->rc = check_input(l, it->key, it->keylen, it->cost, spend)) == 0) {
            it->rc = 1;   /* for Redis */
            npending++;
        } else if (b->keep_msgs || b->out_msgs) {
            char err[HIRATE_ERRMSG_SIZE];
            input_error(it->key, it->keylen, it->cost, spend, err, sizeof err);
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
        if (spend == HIRATE_OP_REFUND) {
            forget_refusal(l, it->key, it->keylen);
        } else if (l->cache && it->cost > 0 && it->cost <= l->cap_min) {
            hirate_decision *bd = item_bands(b, i);
            known = hirate_memory_lookup(l->cache, l->cfg, it->key, it->keylen, b->now,
                                         b->now - l->deny_cache_max_us, it->cost,
                                         &it->decision, bd);
            if (known && !it->decision.allowed) {
                it->decision.source = HIRATE_SOURCE_CACHE;
                for (size_t k = 0; bd && k < l->nbands; k++)
                    bd[k].source = HIRATE_SOURCE_CACHE;
                it->rc = 0;
                __atomic_fetch_add(&l->cache_hits, 1, __ATOMIC_RELAXED);
                continue;
            }
        }
        b->index[b->m] = i;
        b->known[b->m] = (unsigned char)known;
        b->calls[b->m] = (hirate_call){l->prefix, l->prefixlen, it->key, it->keylen, l->args,
                                       l->argslen, (int)l->nbands, it->cost, spend, now_us};
        b->m++;
    }
    b->epoch = __atomic_load_n(&l->reset_epoch, __ATOMIC_ACQUIRE);
    return b->m;
}

/* A call's rcs[] between the rounds of an op: still to send, or its item
 * already has its answer. (Codes are negative, NOSCRIPT, MOVED and ASK
 * small positive numbers.) */
#define CALL_PENDING 100
#define CALL_SETTLED 101

/* The breaker keeps real time, even when a test injects the time. */
static int64_t breaker_now(const batch *b)
{
    return b->now_us >= 0 ? hirate_monotonic_us() : b->now;
}

/* Asks node's breaker about calls sel[0..k) (all m calls when sel is NULL):
 * its verdict, after which SKIP has let the policy decide them. */
static int breaker_enter(batch *b, hirate_node *node, const size_t *sel, size_t k)
{
    int error = 0;
    int64_t wait_us = 0;
    int verdict = hirate_breaker_enter(&node->breaker, breaker_now(b), &error, &wait_us);
    if (verdict == HIRATE_BREAKER_SKIP) {
        for (size_t i = 0; i < k; i++) {
            size_t j = sel ? sel[i] : i;
            b->rcs[j] = CALL_SETTLED;
            apply_policy(b->l, &b->items[b->index[j]], item_bands(b, b->index[j]), b->spend,
                         b->now, error, wait_us);
            if (b->items[b->index[j]].rc < 0)   /* a refund the policy cannot make */
                batch_note(b, b->index[j], last_error.msg);
        }
    }
    return verdict;
}

/* Tells node's breaker what calls sel[0..k) (all m when sel is NULL) met,
 * from their rcs; returns the time until it lets calls through again, for
 * the policy. err holds the message of the last error. */
static int64_t breaker_outcome(batch *b, hirate_node *node, int verdict, const size_t *sel,
                               size_t k, const char *err)
{
    hirate_limiter *l = b->l;
    int outage = 0, answered = 0;
    for (size_t i = 0; i < k; i++) {
        int rc = b->rcs[sel ? sel[i] : i];
        if (is_outage(rc))
            outage = rc;
        answered |= rc != HIRATE_ECLOSED;
    }
    int probe = verdict == HIRATE_BREAKER_PROBE;
    if (!outage && !answered) {
        /* Abandoned before Redis answered anything: nothing was learnt. */
        hirate_breaker_release(&node->breaker, probe);
        return 0;
    }
    if (!outage) {
        /* Only a probe can close the breaker: the clock is read for it alone. */
        int64_t gone = probe ? hirate_breaker_success(&node->breaker, 1, hirate_monotonic_us())
                             : -1;
        if (gone >= 0) {
            hirate_endpoint ep;
            hirate_link_endpoint(&node->link, &ep);
            hirate_link_log(&l->node0.link, HIRATE_LOG_INFO, "Redis at %s answers again, after %.1f s",
                            ep.where, (double)gone / 1e6);
        }
        return 0;
    }
    remember(l, outage, err);
    /* The backoff runs from when the failure was known, not from when the
     * call began (a timeout is as long as a backoff). */
    int opened;
    int64_t wait_us = hirate_breaker_failure(&node->breaker, probe, outage, hirate_monotonic_us(),
                                             &opened);
    if (opened) {
        hirate_endpoint ep;
        hirate_link_endpoint(&node->link, &ep);
        hirate_link_log(&l->node0.link, HIRATE_LOG_WARNING,
                        "Redis at %s failed (%s): the '%s' policy decides until it answers again",
                        ep.where, err && *err ? err : hirate_strerror(outage),
                        hirate_on_error_name(l->on_error));
    }
    return wait_us;
}

/* Call j's answer (its rcs[j]) becomes its item's: a decision that teaches
 * the deny cache, the policy's for an outage, or the error with its words. */
static void settle_call(batch *b, size_t j, int64_t wait_us, const char *err)
{
    hirate_limiter *l = b->l;
    hirate_item *it = &b->items[b->index[j]];
    hirate_decision *bd = item_bands(b, b->index[j]);
    size_t nb = l->nbands;
    it->rc = b->rcs[j];
    if (it->rc == 0) {
        it->decision = b->ds[j];
        if (bd)
            memcpy(bd, nb > 1 ? b->cper + j * nb : &b->ds[j], nb * sizeof *bd);
        if (b->spend == HIRATE_OP_REFUND)
            forget_refusal(l, it->key, it->keylen);
        else if (l->cache && it->cost > 0 && it->cost <= l->cap_min)
            learn(l, it, &b->states[j * nb], b->now, b->known[j], b->epoch);
    } else if (is_outage(it->rc)) {
        apply_policy(l, it, bd, b->spend, b->now, it->rc, wait_us);
        if (it->rc < 0)
            batch_note(b, b->index[j], last_error.msg);
    } else {
        if (b->call_msgs && b->call_msgs[j * HIRATE_ERRMSG_SIZE])
            err = b->call_msgs + j * HIRATE_ERRMSG_SIZE;   /* its own words */
        remember(l, it->rc, err);
        if (!b->msgs || !b->msgs[b->index[j]])
            batch_note(b, b->index[j], err);
    }
}

/* After the blocking client answered every call of a single Redis. */
static void batch_settle(batch *b, int verdict, const char *err)
{
    int64_t wait_us = breaker_outcome(b, &b->l->node0, verdict, NULL, b->m, err);
    for (size_t j = 0; j < b->m; j++)
        settle_call(b, j, wait_us, err);
}

static void run_blocking(hirate_limiter *l, hirate_op *op);

/* Decides items in order: each gets its rc and, when 0, its decision; with
 * msgs, each failed item its message in msgs[i * msglen ..). */
static void decide_items(hirate_limiter *l, hirate_item *items, size_t n, int spend,
                         int64_t now_us, hirate_decision *per, char *msgs, size_t msglen)
{
    for (size_t i = 0; msgs && i < n; i++)
        msgs[i * msglen] = '\0';
    if (l->cluster) {
        hirate_op *op;
        int rc = hirate_op_start_bands(l, items, n, spend, now_us, per, &op);
        if (rc == 1)
            run_blocking(l, op);
        for (size_t i = 0; msgs && i < n; i++)
            if (items[i].rc < 0) {
                const char *m = op ? hirate_op_errmsg(op, i) : NULL;
                snprintf(msgs + i * msglen, msglen, "%s",
                         m && *m ? m : rc < 0 ? "out of memory for a batch"
                                              : hirate_strerror(items[i].rc));
            }
        hirate_op_free(op);
        return;
    }
    batch b;
    b.keep_msgs = 0;
    b.msgs = NULL;
    b.out_msgs = msgs;
    b.out_len = msglen;
    b.call_msgs = NULL;
    b.own_per = 0;
    b.calls = NULL;
    if (batch_begin(&b, l, items, n, spend, now_us, per)) {
        int verdict = breaker_enter(&b, &l->node0, NULL, b.m);
        if (verdict != HIRATE_BREAKER_SKIP) {
            char err[HIRATE_ERRMSG_SIZE];
            /* Without memory for them, items share the round trip's message. */
            if (msgs)
                b.call_msgs = malloc(b.m * HIRATE_ERRMSG_SIZE);
            hirate_redis_decide_many(l->node0.redis, b.calls, b.m, l->cfg, b.ds, b.cper,
                                     b.states, b.rcs, b.call_msgs, err, sizeof err);
            batch_settle(&b, verdict, err);
            free(b.call_msgs);
        }
    }
    count_items(l, items, n, spend);
    batch_free(&b);
}

/* A decision whose bands the caller wants in bands[0 .. nbands): they go
 * there when it has room for all, else through room of ours; with one band
 * they are the decision. */
static __attribute__((noinline)) int decide_bands(hirate_limiter *l, const void *key,
                                                  size_t keylen, int64_t cost, int spend,
                                                  int64_t now_us, hirate_decision *out,
                                                  hirate_decision *bands, size_t nbands)
{
    hirate_decision room[HIRATE_BANDS_MAX];
    hirate_decision *per = l->nbands == 1 ? NULL : nbands >= l->nbands ? bands : room;
    int rc;
    if (!l->node0.redis) {
        rc = decide_in_memory(l, key, keylen, cost, spend, now_us, out, per);
        if (rc == 0)
            hirate_count_decision(l->counts, out, spend);
        else
            hirate_count_error(l->counts, rc);
    } else {
        hirate_item it = {key, keylen, cost, 0, {0}};
        decide_items(l, &it, 1, spend, now_us, per, NULL, 0);
        if ((rc = it.rc) == 0)
            *out = it.decision;
    }
    if (rc == 0 && nbands) {
        if (l->nbands == 1)
            bands[0] = *out;
        else if (per == room)
            memcpy(bands, room, nbands * sizeof *bands);
    }
    return rc;
}

static inline __attribute__((always_inline)) int
decide(hirate_limiter *l, const void *key, size_t keylen, int64_t cost, int spend,
       int64_t now_us, hirate_decision *out, hirate_decision *bands, size_t nbands)
{
    if (!l)
        return HIRATE_EINVAL;
    if (!out)
        return remember(l, HIRATE_EINVAL, "the decision pointer is NULL");
    if (bands)
        return decide_bands(l, key, keylen, cost, spend, now_us, out, bands, nbands);
    if (!l->node0.redis) {   /* the in-memory hot path: no batch bookkeeping */
        int rc = decide_in_memory(l, key, keylen, cost, spend, now_us, out, NULL);
        if (__builtin_expect(rc == 0, 1))
            hirate_count_decision(l->counts, out, spend);
        else
            hirate_count_error(l->counts, rc);
        return rc;
    }
    hirate_item it = {key, keylen, cost, 0, {0}};
    decide_items(l, &it, 1, spend, now_us, NULL, NULL, 0);
    if (it.rc == 0)
        *out = it.decision;
    return it.rc;
}

int hirate_allow(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                 hirate_decision *out)
{
    return decide(l, key, keylen, cost, 1, -1, out, NULL, 0);
}

int hirate_peek(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                hirate_decision *out)
{
    return decide(l, key, keylen, cost, 0, -1, out, NULL, 0);
}

int hirate_allow_bands(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                       hirate_decision *out, hirate_decision *bands, size_t nbands)
{
    return decide(l, key, keylen, cost, 1, -1, out, bands, nbands);
}

int hirate_peek_bands(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                      hirate_decision *out, hirate_decision *bands, size_t nbands)
{
    return decide(l, key, keylen, cost, 0, -1, out, bands, nbands);
}

int hirate_refund(hirate_limiter *l, const void *key, size_t keylen, int64_t tokens,
                  hirate_decision *out)
{
    return decide(l, key, keylen, tokens, HIRATE_OP_REFUND, -1, out, NULL, 0);
}

int hirate_refund_bands(hirate_limiter *l, const void *key, size_t keylen, int64_t tokens,
                        hirate_decision *out, hirate_decision *bands, size_t nbands)
{
    return decide(l, key, keylen, tokens, HIRATE_OP_REFUND, -1, out, bands, nbands);
}

int hirate_allow_many(hirate_limiter *l, hirate_item *items, size_t n)
{
    if (!l || (!items && n))
        return HIRATE_EINVAL;
    if (n)
        decide_items(l, items, n, 1, -1, NULL, NULL, 0);
    return 0;
}

int hirate_allow_many_bands(hirate_limiter *l, hirate_item *items, size_t n,
                            hirate_decision *bands)
{
    if (!l || (!items && n) || (!bands && n))
        return HIRATE_EINVAL;
    if (n)
        decide_items(l, items, n, 1, -1, bands, NULL, 0);
    return 0;
}

int hirate_allow_many_msgs(hirate_limiter *l, hirate_item *items, size_t n,
                           hirate_decision *bands, char *msgs, size_t msglen)
{
    if (!l || (!items && n) || (msgs && !msglen))
        return HIRATE_EINVAL;
    if (n)
        decide_items(l, items, n, 1, -1, bands, msgs, msgs ? msglen : 0);
    return 0;
}

int hirate_validate(const void *key, size_t keylen, int64_t cost, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    return input_error(key, keylen, cost, HIRATE_OP_SPEND, err, errlen);
}

int hirate_decide_at_bands(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                           int spend, int64_t now_us, hirate_decision *out,
                           hirate_decision *bands, size_t nbands)
{
    if (l && now_us < 0)
        return remember(l, HIRATE_EINVAL, "the injected time must not be negative");
    return decide(l, key, keylen, cost, spend, now_us, out, bands, nbands);
}

int hirate_decide_at(hirate_limiter *l, const void *key, size_t keylen, int64_t cost, int spend,
                     int64_t now_us, hirate_decision *out)
{
    return hirate_decide_at_bands(l, key, keylen, cost, spend, now_us, out, NULL, 0);
}

size_t hirate_limiter_nbands(const hirate_limiter *l)
{
    return l ? l->nbands : 0;
}

int hirate_limiter_band(const hirate_limiter *l, size_t i, hirate_band *out)
{
    if (!l || !out || i >= l->nbands)
        return HIRATE_EINVAL;
    out->capacity = l->cfg[i].capacity;
    out->rate = l->cfg[i].rate;
    out->name = l->names[i];
    return 0;
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
    if (l->shm)
        hirate_shm_reset(l->shm, key, keylen);
    return 0;
}

static int reset_key(hirate_limiter *l, const void *key, size_t keylen)
{
    char err[HIRATE_ERRMSG_SIZE];
    if (l->cluster) {   /* the op forgets it locally, then asks its node */
        hirate_op *op;
        int rc = hirate_op_start_reset(l, key, keylen, &op);
        if (rc == 1) {
            run_blocking(l, op);
            rc = hirate_op_result(op);
        }
        hirate_op_free(op);
        return rc;
    }
    int rc = reset_local(l, key, keylen, err, sizeof err);
    if (rc == 0 && l->node0.redis) {
        rc = hirate_redis_reset(l->node0.redis, l->prefix, l->prefixlen, key, keylen, err, sizeof err);
        return rc < 0 ? remember(l, rc, err) : 0;
    }
    return rc;
}

int hirate_reset(hirate_limiter *l, const void *key, size_t keylen)
{
    if (!l)
        return HIRATE_EINVAL;
    int rc = reset_key(l, key, keylen);
    if (rc < 0 && !l->cluster)   /* a cluster's op counted its own */
        hirate_count_error(l->counts, rc);
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
    snprintf(buf, len, "%s", last_error.serial == l->serial ? last_error.msg : "");
    return buf;
}

void hirate_counters_get(hirate_limiter *l, hirate_counters *out)
{
    memset(out, 0, sizeof *out);
    if (!l)
        return;
    if (l->node0.redis) {
        for (int i = 0; node_of(l, i); i++) {
            hirate_node *nd = node_of(l, i);
            hirate_redis_stats rs;
            hirate_redis_stats_get(nd->redis, &rs);
            out->connects += __atomic_load_n(&nd->link.connects, __ATOMIC_RELAXED);
            out->evalsha += rs.evalsha;
            out->eval += rs.eval;
            out->fcall += rs.fcall;
            out->function_loads += rs.function_loads;
            out->conns_dropped += rs.dropped;
            pthread_mutex_lock(&nd->breaker.lock);
            out->breaker_opens += nd->breaker.opens;
            pthread_mutex_unlock(&nd->breaker.lock);
        }
        out->evalsha += __atomic_load_n(&l->op_evalsha, __ATOMIC_RELAXED);
        out->eval += __atomic_load_n(&l->op_eval, __ATOMIC_RELAXED);
        out->fcall += __atomic_load_n(&l->op_fcall, __ATOMIC_RELAXED);
        out->function_loads += __atomic_load_n(&l->op_loads, __ATOMIC_RELAXED);
        if (l->cluster) {
            uint64_t asked = __atomic_load_n(&l->cluster->refreshes, __ATOMIC_RELAXED);
            out->nodes = (size_t)hirate_cluster_count(l->cluster);
            *(l->cluster->sentinel ? &out->sentinel_queries : &out->map_refreshes) = asked;
            out->moved = __atomic_load_n(&l->cluster->moved, __ATOMIC_RELAXED);
            out->asked = __atomic_load_n(&l->cluster->asked, __ATOMIC_RELAXED);
            out->master_changes = __atomic_load_n(&l->cluster->master_changes, __ATOMIC_RELAXED);
        }
        if (l->memory || l->shm)
            out->local_keys = local_count(l);
    } else {
        out->memory_keys = local_count(l);
    }
    if (l->cache)
        out->cache_keys = hirate_memory_count(l->cache);
    out->cache_hits = __atomic_load_n(&l->cache_hits, __ATOMIC_RELAXED);
    out->policy = __atomic_load_n(&l->policy, __ATOMIC_RELAXED);
    if (!l->node0.redis)
        out->breaker_opens = l->node0.breaker.opens;
}

int hirate_stats_get(hirate_limiter *l, hirate_stats *out, size_t size)
{
    if (!l || !out || size == 0)
        return HIRATE_EINVAL;
    hirate_stats st;
    memset(&st, 0, sizeof st);
    hirate_counts_sum(l->counts, &st);
    hirate_latency_sum(&l->op_latency, &st);
    for (int i = 0; l->node0.redis && node_of(l, i); i++) {
        hirate_node *nd = node_of(l, i);
        hirate_redis_stats rs;
        hirate_redis_stats_get(nd->redis, &rs);
        st.connects += __atomic_load_n(&nd->link.connects, __ATOMIC_RELAXED);
        st.conns_dropped += rs.dropped;
        hirate_latency_sum(&rs.latency, &st);
        pthread_mutex_lock(&nd->breaker.lock);
        st.breaker_opens += nd->breaker.opens;
        st.breaker_closes += nd->breaker.closes;
        pthread_mutex_unlock(&nd->breaker.lock);
    }
    memcpy(out, &st, size < sizeof st ? size : sizeof st);
    return 0;
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

const char *hirate_function_library(size_t *len)
{
    if (len)
        *len = hirate__library_len;
    return hirate__library;
}

const char *hirate_function_name(void)
{
    return hirate__function_name;
}

const char *hirate_version(void)
{
    return HIRATE_VERSION_STRING;
}

/* ---- deciding without I/O (hirate_io.h) ----------------------------------------- */

/*
 * An op goes to Redis in rounds of legs, one leg per node (hirate_io.h). Its
 * calls wait as CALL_PENDING until a round sends them; a reply settles a
 * call (a decision, an error, or the policy's answer to an outage), or sends
 * it again in the next round when it provably did not run:
 *   NOSCRIPT  to the same node, as EVAL (once: NOSCRIPT after EVAL is an
 *             error);
 *   MOVED     to the slot's new master, which the map learns;
 *   ASK       to the node named, after ASKING, leaving the map alone;
 *   "Function not found"  to the same node, after FUNCTION LOAD;
 *   NOFUNC    (Redis Functions refused) to the same node, by EVALSHA;
 *   READONLY  from a Sentinel service's master: to the master the
 *             sentinels name now;
 * each call follows at most HIRATE_CLUSTER_REDIRECTS_MAX redirections (and
 * waits as many rounds for a master). A leg's end tells its node's breaker
 * what its calls met, so one dead shard opens its own breaker only. A
 * cluster's map refresh rides in a leg of the round (after its calls) or in
 * a leg of its own; a Sentinel service's question always has its own, to a
 * sentinel.
 */

enum { OP_DECIDE, OP_RESET, OP_CHECK };
enum { LEG_BUSY, LEG_DONE, LEG_FAILED };

/* A call's state for its next send. */
#define SEND_EVAL 1         /* with the code (EVAL, or after FUNCTION LOAD):
                               the node lacked it */
#define SEND_ASKING 2       /* after ASKING: the node is importing its slot */
#define SEND_KEEP_NODE 4    /* to node[j] (NOSCRIPT, ASK), not to its slot's master */
#define SENT_EVAL 8         /* it was sent with the code: NOSCRIPT now is an
                               error (unless the load was refused) */
#define GROUPED 16          /* (while a round is made: in a leg already) */

typedef struct leg {
    int node;
    int verdict;            /* the node's breaker, for the leg's calls */
    size_t first, count;    /* its calls: op->order[first .. first + count) */
    size_t next;            /* the next of them whose reply is due */
    int ok_due;             /* ASKING's +OK comes before that reply */
    int fcall;              /* its calls go by FCALL, not EVALSHA */
    int load;               /* FUNCTION LOAD goes first; its reply is due */
    int loaded;             /* and the library is there */
    int load_rc;            /* or why the server could not take it now */
    int load_readonly;      /* (READONLY: a demoted master) */
    int reset;              /* it carries the reset's DEL */
    int check;              /* it carries a check: op->checks[check - 1] */
    int fl, se;             /* the check's FUNCTION LIST and SCRIPT EXISTS:
                               CHECK_* */
    char *load_err;         /* load_rc's words (heap; set only with it) */
    int map;                /* CLUSTER SLOTS follows the calls (or, to a
                               sentinel, GET-MASTER-ADDR-BY-NAME) */
    hirate_rreader *rr;     /* which reads the map's reply */
    int state;
    int drop;
    char *req;
    size_t reqlen;
    int64_t started;        /* when its request was made (the round trip's start) */
} leg;

struct hirate_op {
    int kind;
    hirate_limiter *l;
    batch b;                /* OP_DECIDE */
    int *node;              /* per call: where it goes next */
    unsigned char *flags;   /* SEND_* and SENT_EVAL */
    unsigned char *redirects;
    size_t *order;          /* the calls of the round, leg by leg */
    leg *legs;
    size_t nlegs, cap_legs;
    int drop;               /* some leg's connection must be closed */
    int done;
    int rc;                 /* OP_RESET: the outcome */
    /* OP_RESET: one DEL, with its own redirections */
    char full[HIRATE_PREFIX_MAX + HIRATE_KEY_MAX];
    size_t fulllen;
    int reset_node, reset_flags, reset_redirects, reset_pending;
    /* OP_CHECK: a node's answers, once the nodes are known */
    hirate_check_node *checks;
    size_t nchecks;
    int check_sent;         /* the checks' round was made */
    int check_rounds;       /* rounds spent finding the nodes */
    int check_asked;        /* the node asked for them last, or -1 */
    int route_rc;           /* why the sentinels named no master, or 0 */
    char route_err[HIRATE_ERRMSG_SIZE];
    char err[HIRATE_ERRMSG_SIZE];
};

/* The limiter's Redis Cluster, or NULL (a single Redis, or Sentinel). */
static hirate_cluster *slots_of(const hirate_limiter *l)
{
    return l->cluster && !l->cluster->sentinel ? l->cluster : NULL;
}

/* The limiter's Sentinel service (its node table), or NULL. */
static hirate_cluster *sentinel_of(const hirate_limiter *l)
{
    return l->cluster && l->cluster->sentinel ? l->cluster : NULL;
}

static hirate_call *op_call(hirate_op *op, size_t j)
{
    return &op->b.calls[j];
}

static unsigned call_slot(const hirate_call *c)
{
    return hirate_keyslot2(c->prefix, c->prefixlen, c->key, c->keylen);
}

static void leg_clear(leg *g)
{
    hirate_rreader_free(g->rr);
    free(g->req);
    free(g->load_err);
    memset(g, 0, sizeof *g);
}

static void legs_clear(hirate_op *op)
{
    /* A refresh never answered (the op was dropped, or a request could not
     * be made) is given back, or no other op would ever ask again. */
    for (size_t i = 0; i < op->nlegs; i++)
        if (op->legs[i].map)
            hirate_cluster_refresh_end(op->l->cluster, op->legs[i].node, NULL, NULL, 0);
    for (size_t i = 0; i < op->nlegs; i++)
        leg_clear(&op->legs[i]);
    op->nlegs = 0;
}

/* A new leg to node (legs are kept in an array big enough for every node). */
static leg *leg_add(hirate_op *op, int node)
{
    if (op->nlegs == op->cap_legs) {
        size_t cap = op->cap_legs ? op->cap_legs * 2 : 4;
        leg *g = realloc(op->legs, cap * sizeof *g);
        if (!g)
            return NULL;
        op->legs = g;
        op->cap_legs = cap;
    }
    leg *g = &op->legs[op->nlegs++];
    memset(g, 0, sizeof *g);
    g->node = node;
    g->verdict = HIRATE_BREAKER_PASS;
    g->started = hirate_monotonic_us();
    return g;
}

static const char asking_cmd[] = "*1\r\n$6\r\nASKING\r\n";
static const char slots_cmd[] = "*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n";

/* The map's request: CLUSTER SLOTS, or a sentinel's question. Its length;
 * written only when it fits. */
static size_t encode_map(const hirate_limiter *l, char *buf, size_t cap)
{
    if (!sentinel_of(l)) {
        if (cap >= sizeof slots_cmd - 1)
            memcpy(buf, slots_cmd, sizeof slots_cmd - 1);
        return sizeof slots_cmd - 1;
    }
    const char *service = l->node0.link.url.service;
    const char *argv[3] = {"SENTINEL", "GET-MASTER-ADDR-BY-NAME", service};
    size_t lens[3] = {8, 23, strlen(service)};
    return hirate_proto_encode_argv(buf, cap, 3, argv, lens);
}

/* A leg's bytes: FUNCTION LOAD when a call needs the code and the node takes
 * functions; each call (after ASKING when asked; by FCALL, or by EVALSHA
 * with the first that needs the code as EVAL); then the map's request when
 * it carries the refresh. */
static int leg_encode(hirate_op *op, leg *g)
{
    hirate_limiter *l = op->l;
    hirate_node *nd = node_of(l, g->node);
    g->fcall = __atomic_load_n(&nd->link.functions, __ATOMIC_RELAXED);
    size_t cap = encode_map(l, NULL, 0);
    for (size_t i = 0; i < g->count; i++) {
        size_t j = op->order[g->first + i];
        g->load |= g->fcall && (op->flags[j] & SEND_EVAL);
        cap += hirate_proto_call_bound(op_call(op, j), HIRATE_FORM_EVAL) + sizeof asking_cmd;
    }
    if (g->load)
        cap += hirate_proto_encode_load(NULL, 0);
    if (g->reset)
        cap += sizeof asking_cmd + op->fulllen + 32;
    if (!(g->req = malloc(cap)))
        return HIRATE_ENOMEM;
    size_t len = 0;
    int eval_sent = 0;
    if (g->reset) {
        const char *argv[2] = {"DEL", op->full};
        size_t lens[2] = {3, op->fulllen};
        if (op->reset_flags & SEND_ASKING) {
            memcpy(g->req, asking_cmd, sizeof asking_cmd - 1);
            len += sizeof asking_cmd - 1;
        }
        len += hirate_proto_encode_argv(g->req + len, cap - len, 2, argv, lens);
    }
    if (g->load) {
        /* First, and not between ASKING and its call. */
        len += hirate_proto_encode_load(g->req + len, cap - len);
        __atomic_fetch_add(&l->op_loads, 1, __ATOMIC_RELAXED);
    }
    for (size_t i = 0; i < g->count; i++) {
        size_t j = op->order[g->first + i];
        if (op->flags[j] & SEND_ASKING) {
            memcpy(g->req + len, asking_cmd, sizeof asking_cmd - 1);
            len += sizeof asking_cmd - 1;
        }
        /* One EVAL loads the script for the calls after it. */
        int form = g->fcall ? HIRATE_FORM_FCALL
                   : (op->flags[j] & SEND_EVAL) && !eval_sent ? HIRATE_FORM_EVAL
                                                              : HIRATE_FORM_EVALSHA;
        eval_sent |= form == HIRATE_FORM_EVAL;
        if (op->flags[j] & SEND_EVAL)
            op->flags[j] |= SENT_EVAL;
        __atomic_fetch_add(form == HIRATE_FORM_FCALL  ? &l->op_fcall
                           : form == HIRATE_FORM_EVAL ? &l->op_eval
                                                      : &l->op_evalsha,
                           1, __ATOMIC_RELAXED);
        len += hirate_proto_encode_call(g->req + len, cap - len, op_call(op, j), form);
    }
    if (g->map) {
        len += encode_map(l, g->req + len, cap - len);
        int sentinel = sentinel_of(l) != NULL;
        /* A sentinel's answer is one short address. */
        if (!(g->rr = sentinel ? hirate_rreader_new(HIRATE_IO_REPLY_MAX, 2, 256)
                               : hirate_rreader_new(HIRATE_CLUSTER_MAP_BYTES,
                                                    HIRATE_CLUSTER_MAP_ELEMS,
                                                    HIRATE_CLUSTER_MAP_STR)))
            return HIRATE_ENOMEM;
    }
    g->reqlen = len;
    return 0;
}

/* Where pending call j goes now. */
static int call_node(hirate_op *op, size_t j)
{
    if (!op->l->cluster)
        return 0;   /* a single Redis */
    if (op->flags[j] & SEND_KEEP_NODE)
        return op->node[j];
    return hirate_cluster_route(op->l->cluster, call_slot(op_call(op, j)));
}

static void op_finish(hirate_op *op);
static void leg_settle(hirate_op *op, leg *g);

/* The refresh this op's round carries, if one is due: a leg to the node
 * asked (the one of a call's leg when it is that node). */
static void add_refresh(hirate_op *op)
{
    hirate_cluster *c = op->l->cluster;
    int node = hirate_cluster_refresh_begin(c, hirate_monotonic_us(),
                                            op->nlegs ? op->legs[0].node : -1);
    if (node < 0)
        return;
    leg *g = NULL;
    for (size_t i = 0; i < op->nlegs && !g; i++)
        if (op->legs[i].node == node)
            g = &op->legs[i];
    /* A leg of its own when no call goes there: even when every call met
     * an open breaker, or the map would never learn of the replica that
     * took over. */
    if (!g)
        g = leg_add(op, node);
    if (g)
        g->map = 1;
    else
        hirate_cluster_refresh_end(c, node, NULL, NULL, 0);
}

static int round_asks(const hirate_op *op)
{
    for (size_t i = 0; i < op->nlegs; i++)
        if (op->legs[i].map)
            return 1;
    return 0;
}

/* Why a call that waited for a master cannot wait longer: what the
 * sentinels said, or that they said nothing in time. */
static int no_master(hirate_op *op, char *err, size_t errlen)
{
    if (op->route_rc)
        return hirate__fail(err, errlen, op->route_rc, "%s", op->route_err);
    return hirate__fail(err, errlen, HIRATE_ESERVER, "no sentinel named the master of '%s'",
                        op->l->node0.link.url.service);
}

/* May a call (or the reset) that has waited this many rounds for a master
 * wait one more? Not when the sentinels answered with a misconfiguration. */
static int can_wait(const hirate_op *op, int waited)
{
    return waited < HIRATE_CLUSTER_REDIRECTS_MAX && !(op->route_rc && !is_outage(op->route_rc));
}

/* A call (or the reset) with no master to go to waits for the sentinels'
 * answer in this round, unless there is none coming, or it may not wait. */
static int may_wait(hirate_op *op, int *waited)
{
    if (!round_asks(op) || !can_wait(op, *waited))
        return 0;
    ++*waited;
    return 1;
}

/* Makes the next round's legs from the pending calls: 1 when there is one
 * to send, 0 when none is left (every call settled, perhaps by a breaker). */
static int check_round(hirate_op *op);

static int op_round(hirate_op *op)
{
    hirate_limiter *l = op->l;
    if (op->kind == OP_CHECK)
        return check_round(op);
    /* With nothing left to send, the last round's legs stay readable. */
    int pending = op->kind == OP_RESET && op->reset_pending;
    for (size_t j = 0; op->kind == OP_DECIDE && j < op->b.m && !pending; j++)
        pending = op->b.rcs[j] == CALL_PENDING;
    if (!pending)
        return 0;
    legs_clear(op);
    if (op->kind == OP_RESET) {
        if (l->cluster && !(op->reset_flags & SEND_KEEP_NODE))
            op->reset_node = hirate_cluster_route(l->cluster, hirate_keyslot(op->full, op->fulllen));
        leg *g = NULL;
        if (op->reset_node >= 0 && (g = leg_add(op, op->reset_node)))
            g->reset = 1;
        else if (op->reset_node < 0 && can_wait(op, op->reset_redirects))
            add_refresh(op);   /* no master known yet: ask for one */
        if (op->reset_node < 0 && !may_wait(op, &op->reset_redirects)) {
            op->rc = no_master(op, op->err, sizeof op->err);
            remember(l, op->rc, op->err);
            op->reset_pending = 0;
            legs_clear(op);
            return 0;
        }
        for (size_t i = 0; i < op->nlegs; i++) {
            if (leg_encode(op, &op->legs[i]) < 0) {
                op->rc = hirate__fail(op->err, sizeof op->err, HIRATE_ENOMEM,
                                      "out of memory for a request");
                op->reset_pending = 0;
                legs_clear(op);
                return 0;
            }
        }
        if (!op->nlegs) {
            op->rc = hirate__fail(op->err, sizeof op->err, HIRATE_ENOMEM,
                                  "out of memory for a request");
            op->reset_pending = 0;
            return 0;
        }
        return 1;
    }
    /* Group the pending calls by node, in order within each. */
    size_t k = 0;
    int unrouted = 0;
    for (size_t j = 0; j < op->b.m; j++) {
        if (op->b.rcs[j] == CALL_PENDING) {
            op->node[j] = call_node(op, j);
            unrouted |= op->node[j] < 0;
        }
    }
    for (size_t j = 0; j < op->b.m; j++) {
        if (op->b.rcs[j] != CALL_PENDING || op->node[j] < 0 || (op->flags[j] & GROUPED))
            continue;
        int node = op->node[j];
        size_t first = k;
        for (size_t i = j; i < op->b.m; i++) {
            if (op->b.rcs[i] == CALL_PENDING && op->node[i] == node) {
                op->order[k++] = i;
                op->flags[i] |= GROUPED;
            }
        }
        hirate_node *nd = node_of(l, node);
        int verdict = breaker_enter(&op->b, nd, op->order + first, k - first);
        if (verdict == HIRATE_BREAKER_SKIP) {
            k = first;   /* the policy answered them */
            if (l->cluster)
                hirate_cluster_stale(l->cluster);
            continue;
        }
        leg *g = leg_add(op, node);
        if (!g) {
            for (size_t i = first; i < k; i++)
                op->b.rcs[op->order[i]] = HIRATE_ENOMEM;
            hirate_breaker_release(&nd->breaker, verdict == HIRATE_BREAKER_PROBE);
            k = first;
            continue;
        }
        g->verdict = verdict;
        g->first = first;
        g->count = k - first;
    }
    for (size_t j = 0; j < op->b.m; j++)
        op->flags[j] &= ~GROUPED;
    /* Without a master, the question is for the calls that may still wait
     * for its answer: with none, it is not asked. */
    int waiting = !unrouted;
    for (size_t j = 0; !waiting && j < op->b.m; j++)
        waiting = op->b.rcs[j] == CALL_PENDING && op->node[j] < 0 && can_wait(op, op->redirects[j]);
    if (l->cluster && waiting)
        add_refresh(op);
    /* Calls with no master to go to wait for the answer in this round. */
    for (size_t j = 0; unrouted && j < op->b.m; j++) {
        int waited = op->redirects[j];
        if (op->b.rcs[j] != CALL_PENDING || op->node[j] >= 0)
            continue;
        if (may_wait(op, &waited)) {
            op->redirects[j] = (unsigned char)waited;
            continue;
        }
        op->b.rcs[j] = no_master(op, op->err, sizeof op->err);
        if (is_outage(op->b.rcs[j]))   /* the policy decides: its cause is the last error */
            remember(op->l, op->b.rcs[j], op->err);
        settle_call(&op->b, j, 0, op->err);
        op->b.rcs[j] = CALL_SETTLED;
    }
    for (size_t i = 0; i < op->nlegs; i++) {
        if (leg_encode(op, &op->legs[i]) < 0) {
            hirate__fail(op->err, sizeof op->err, HIRATE_ENOMEM, "out of memory for a request");
            hirate_op_leg_fail(op, i, HIRATE_ENOMEM, NULL);
        }
    }
    for (size_t i = 0; i < op->nlegs; i++)
        if (op->legs[i].state == LEG_BUSY)
            return 1;
    /* Every leg failed before it was sent (no memory): settled already. */
    legs_clear(op);
    for (size_t j = 0; j < op->b.m; j++)
        if (op->b.rcs[j] == CALL_PENDING)
            op->b.rcs[j] = HIRATE_ENOMEM;
    return 0;
}

static int op_new(hirate_limiter *l, int kind, hirate_op **out)
{
    hirate_op *op = calloc(1, sizeof *op);
    if (!op)
        return HIRATE_ENOMEM;
    op->kind = kind;
    op->l = l;
    op->b.l = l;
    *out = op;
    return 0;
}

int hirate_op_start(hirate_limiter *l, hirate_item *items, size_t n, int spend, int64_t now_us,
                    hirate_op **out)
{
    return hirate_op_start_bands(l, items, n, spend, now_us, NULL, out);
}

int hirate_op_start_bands(hirate_limiter *l, hirate_item *items, size_t n, int spend,
                          int64_t now_us, hirate_decision *bands, hirate_op **out)
{
    *out = NULL;
    if (!l || (!items && n) || !l->node0.redis)
        return HIRATE_EINVAL;
    hirate_op *op;
    if (op_new(l, OP_DECIDE, &op) < 0)
        return HIRATE_ENOMEM;
    op->b.keep_msgs = 1;
    /* Without the caller's room, the op keeps the bands for hirate_op_bands. */
    if (!bands && l->nbands > 1 && n) {
        if (!(bands = malloc(n * l->nbands * sizeof *bands))) {
            hirate_op_free(op);
            return HIRATE_ENOMEM;
        }
        op->b.own_per = 1;
    }
    if (!batch_begin(&op->b, l, items, n, spend, now_us, bands)) {
        count_items(l, items, n, spend);
        hirate_op_free(op);   /* decided without Redis */
        return 0;
    }
    size_t m = op->b.m;
    op->node = malloc(m * sizeof *op->node);
    op->order = malloc(m * sizeof *op->order);
    op->flags = calloc(m, 2);
    if (!op->node || !op->order || !op->flags) {
        for (size_t j = 0; j < m; j++)
            op->b.rcs[j] = HIRATE_ENOMEM;
        hirate__fail(op->err, sizeof op->err, HIRATE_ENOMEM, "out of memory for a request");
        op_finish(op);
        hirate_op_free(op);
        return 0;
    }
    op->redirects = op->flags + m;
    for (size_t j = 0; j < m; j++)
        op->b.rcs[j] = CALL_PENDING;
    if (!op_round(op)) {
        op_finish(op);
        hirate_op_free(op);
        return 0;
    }
    *out = op;
    return 1;
}

int hirate_op_start_reset(hirate_limiter *l, const void *key, size_t keylen, hirate_op **out)
{
    *out = NULL;
    if (!l || !l->node0.redis)
        return HIRATE_EINVAL;
    hirate_op *op;
    if (op_new(l, OP_RESET, &op) < 0)
        return HIRATE_ENOMEM;
    int rc = reset_local(l, key, keylen, op->err, sizeof op->err);
    if (rc < 0) {
        free(op);
        return rc;
    }
    memcpy(op->full, l->prefix, l->prefixlen);
    memcpy(op->full + l->prefixlen, key, keylen);
    op->fulllen = l->prefixlen + keylen;
    op->reset_pending = 1;
    if (l->cluster)
        op->reset_node = hirate_cluster_route(l->cluster, hirate_keyslot(op->full, op->fulllen));
    if (!op_round(op)) {
        rc = op->rc;
        hirate_op_free(op);
        return rc < 0 ? rc : HIRATE_ENOMEM;
    }
    *out = op;
    return 1;
}

size_t hirate_op_legs(const hirate_op *op)
{
    return op && !op->done ? op->nlegs : 0;
}

static leg *leg_at(const hirate_op *op, size_t i)
{
    return op && !op->done && i < op->nlegs ? &op->legs[i] : NULL;
}

/* The last round's legs stay readable once the op is done. */
static leg *leg_kept(const hirate_op *op, size_t i)
{
    return op && i < op->nlegs ? &op->legs[i] : NULL;
}

int hirate_op_leg_node(const hirate_op *op, size_t i)
{
    leg *g = leg_at(op, i);
    return g ? g->node : -1;
}

const char *hirate_op_leg_request(const hirate_op *op, size_t i, size_t *len)
{
    leg *g = leg_kept(op, i);
    *len = g ? g->reqlen : 0;
    return g ? g->req : NULL;
}

int hirate_op_leg_drop(const hirate_op *op, size_t i)
{
    leg *g = leg_kept(op, i);
    return g ? g->drop : op ? op->drop : 0;
}

const char *hirate_op_request(const hirate_op *op, size_t *len)
{
    return hirate_op_leg_request(op, 0, len);
}

int hirate_op_drop(const hirate_op *op)
{
    return op->drop;
}

/* A redirection of call j (or of the reset when j is (size_t)-1), from the
 * node of leg g: 1 when it will be sent again, 0 when it cannot be (its rc
 * set with the message). */
static int follow(hirate_op *op, leg *g, size_t j, const hirate_reply *rep)
{
    hirate_cluster *c = op->l->cluster;
    int ask;
    unsigned slot;
    char host[256];
    int port, *redirects, *flags, *node;
    int rdummy, fdummy, ndummy;
    if (j == (size_t)-1) {
        redirects = &op->reset_redirects;
        flags = &op->reset_flags;
        node = &op->reset_node;
    } else {
        rdummy = op->redirects[j];
        fdummy = op->flags[j];
        ndummy = op->node[j];
        redirects = &rdummy;
        flags = &fdummy;
        node = &ndummy;
    }
    int rc = 0;
    if (!hirate_redirect_parse(rep->top.str, rep->top.len, &ask, &slot, host, &port)) {
        rc = hirate__fail_quoting(op->err, sizeof op->err, HIRATE_EPROTO,
                                  "malformed reply from Redis: a redirection without a slot "
                                  "and an address: ", rep->top.str, rep->top.len);
        g->drop = 1;
    } else if (++*redirects > HIRATE_CLUSTER_REDIRECTS_MAX) {
        rc = hirate__fail(op->err, sizeof op->err, HIRATE_ESERVER,
                          "slot %u moved %d times during one call (last: %s:%d)", slot,
                          HIRATE_CLUSTER_REDIRECTS_MAX, host, port);
    } else {
        hirate_node *from = node_of(op->l, g->node);
        int id = hirate_cluster_find(c, host[0] ? host : from->link.url.host, port);
        if (id < 0) {
            rc = hirate__fail(op->err, sizeof op->err, HIRATE_ESERVER,
                              "the cluster has more than %d nodes", HIRATE_IO_NODES_MAX);
        } else if (ask) {
            __atomic_fetch_add(&c->asked, 1, __ATOMIC_RELAXED);
            *node = id;
            *flags = (*flags & ~SEND_EVAL & ~SENT_EVAL) | SEND_ASKING | SEND_KEEP_NODE;
        } else {
            hirate_cluster_moved(c, slot, id);
            *flags &= ~(SEND_EVAL | SENT_EVAL | SEND_ASKING | SEND_KEEP_NODE);
        }
    }
    if (j != (size_t)-1) {
        op->redirects[j] = (unsigned char)(*redirects > 255 ? 255 : *redirects);
        op->flags[j] = (unsigned char)*flags;
        op->node[j] = *node;
    }
    return rc;
}

/* The DEL's one reply: an integer is success. */
static int feed_reset(hirate_op *op, leg *g, const hirate_reply *rep)
{
    op->reset_pending = 0;
    if (rep->top.type == ':')
        return op->rc = 0;
    if (rep->top.type == '-' && slots_of(op->l)) {
        int cls = hirate_proto_error_class(rep->top.str, rep->top.len);
        if (cls == HIRATE_PROTO_MOVED || cls == HIRATE_PROTO_ASK) {
            if ((op->rc = follow(op, g, (size_t)-1, rep)) == 0) {
                op->reset_pending = 1;
                if (cls == HIRATE_PROTO_MOVED)
                    op->reset_flags = 0;
                return 0;
            }
            remember(op->l, op->rc, op->err);
            return op->rc;
        }
    }
    if (rep->top.type == '-' && sentinel_of(op->l) &&
        hirate_proto_error_readonly(rep->top.str, rep->top.len) &&
        op->reset_redirects++ < HIRATE_CLUSTER_REDIRECTS_MAX) {
        /* A demoted master: to the one the sentinels name now. */
        hirate_cluster_master_lost(op->l->cluster, g->node);
        g->drop = 1;
        op->reset_pending = 1;
        op->reset_flags = 0;
        return 0;
    }
    op->reset_flags = 0;
    if (rep->top.type == '-')
        op->rc = hirate_proto_error_reply(rep, &g->drop, op->err, sizeof op->err);
    else
        op->rc = hirate__fail(op->err, sizeof op->err, HIRATE_EPROTO,
                              "malformed reply from Redis: DEL gave no integer");
    if (op->rc == HIRATE_EPROTO)
        g->drop = 1;
    remember(op->l, op->rc, op->err);
    return op->rc;
}

/* FUNCTION LOAD met an outage (READONLY, OOM, LOADING, ...): nothing is
 * learnt of Redis Functions; the calls that needed the library meet it. */
static void load_failed(hirate_op *op, leg *g, const hirate_reply *rep)
{
    char err[HIRATE_ERRMSG_SIZE];
    g->load_rc = hirate_proto_error_reply(rep, &g->drop, err, sizeof err);
    free(g->load_err);
    g->load_err = strdup(err);
    g->load_readonly = hirate_proto_error_readonly(rep->top.str, rep->top.len);
    if (g->load_readonly && sentinel_of(op->l))
        hirate_cluster_master_lost(op->l->cluster, g->node);
}

/* Call j goes again to the node of leg g, with its flags: it did not run. */
static void again_here(hirate_op *op, const leg *g, size_t j, int set, int clear)
{
    op->b.rcs[j] = CALL_PENDING;
    op->flags[j] = (unsigned char)((op->flags[j] & ~clear) | set | SEND_KEEP_NODE);
    op->node[j] = g->node;
}

/* Call j's reply: settled, or pending again for the next round. */
static void feed_call(hirate_op *op, leg *g, size_t j, const hirate_reply *rep)
{
    hirate_limiter *l = op->l;
    int *rc = &op->b.rcs[j];
    int ask = op->flags[j] & SEND_ASKING;
    op->flags[j] &= ~SEND_ASKING;   /* one ASKING, one call */
    if (ask)
        op->flags[j] &= ~SEND_KEEP_NODE;
    if (rep->top.type == '-' && slots_of(l)) {
        int cls = hirate_proto_error_class(rep->top.str, rep->top.len);
        if (cls == HIRATE_PROTO_MOVED || cls == HIRATE_PROTO_ASK) {
            *rc = follow(op, g, j, rep);
            if (*rc == 0)
                *rc = CALL_PENDING;   /* it did not run: again, elsewhere */
            else
                batch_note(&op->b, op->b.index[j], op->err);
            return;
        }
        if (cls == HIRATE_ESERVER)   /* CLUSTERDOWN, TRYAGAIN: the map may be behind */
            hirate_cluster_stale(l->cluster);
    }
    if (rep->top.type == '-' && sentinel_of(l) &&
        hirate_proto_error_readonly(rep->top.str, rep->top.len) &&
        op->redirects[j] < HIRATE_CLUSTER_REDIRECTS_MAX) {
        /* A master demoted by a failover refused the write before the
         * script ran: to the master the sentinels name now. */
        hirate_cluster_master_lost(l->cluster, g->node);
        g->drop = 1;
        op->redirects[j]++;
        *rc = CALL_PENDING;
        op->flags[j] &= ~(SEND_KEEP_NODE | SEND_EVAL | SENT_EVAL);
        return;
    }
    int missing = g->fcall && (op->flags[j] & SENT_EVAL) && !g->loaded;
    if (missing && g->load_readonly && rep->top.type == '-' && sentinel_of(l) &&
        op->redirects[j] < HIRATE_CLUSTER_REDIRECTS_MAX) {
        /* FUNCTION LOAD met READONLY, so this FCALL found nothing to run:
         * to the master the sentinels name now, as after READONLY. */
        op->redirects[j]++;
        *rc = CALL_PENDING;
        op->flags[j] &= ~(SEND_KEEP_NODE | SEND_EVAL | SENT_EVAL);
        return;
    }
    /* The code went with it, unless the library was refused. */
    int with_code = (op->flags[j] & SENT_EVAL) && (!g->fcall || g->loaded);
    size_t nb = l->nbands;
    *rc = hirate_proto_outcome(rep, op_call(op, j), l->cfg, with_code, &op->b.ds[j],
                               op->b.cper ? op->b.cper + j * nb : NULL, &op->b.states[j * nb],
                               &g->drop, op->err, sizeof op->err);
    if (*rc == HIRATE_PROTO_NOSCRIPT && missing && g->load_rc) {
        /* Its FUNCTION LOAD met an outage: so does the call. */
        *rc = hirate__fail(op->err, sizeof op->err, g->load_rc, "%s",
                           g->load_err ? g->load_err : hirate_strerror(g->load_rc));
        batch_note(&op->b, op->b.index[j], op->err);
        return;
    }
    if (*rc == HIRATE_PROTO_NOSCRIPT && missing)
        *rc = HIRATE_PROTO_NOFUNC;   /* its FUNCTION LOAD was refused */
    if (*rc == HIRATE_PROTO_NOFUNC && g->fcall) {
        /* FCALL or FUNCTION refused (an older Redis, an ACL, a proxy): the
         * call did not run. By EVALSHA from now on. */
        hirate_link_no_functions(&node_of(l, g->node)->link, rep->top.str, rep->top.len);
        again_here(op, g, j, 0, SEND_EVAL | SENT_EVAL);
    } else if (*rc == HIRATE_PROTO_NOFUNC) {
        *rc = hirate_proto_error_reply(rep, &g->drop, op->err, sizeof op->err);
        batch_note(&op->b, op->b.index[j], op->err);
    } else if (*rc == HIRATE_PROTO_NOSCRIPT) {
        /* The node does not know the script (a restart, SCRIPT FLUSH, a
         * promoted replica): the call did not run. With the code, there. */
        again_here(op, g, j, SEND_EVAL, 0);
    } else if (*rc < 0) {
        batch_note(&op->b, op->b.index[j], op->err);   /* its own words */
    }
}

/* The map's reply, taken as it comes (it may be long): 1 when it is whole. */
static int feed_map(hirate_op *op, leg *g, const char *buf, size_t len, size_t *used)
{
    const char *why = NULL;
    hirate_rnode *map = NULL;
    *used = len;
    int got = hirate_rreader_feed(g->rr, buf, len, &why) < 0 ? -1
                                                             : hirate_rreader_next(g->rr, &map, &why);
    if (got == 0)
        return 0;
    int rc;
    char err[HIRATE_ERRMSG_SIZE];
    if (got > 0)   /* bytes after it are the next replies on the connection */
        *used = len - hirate_rreader_pending(g->rr);
    if (got < 0) {
        /* Not RESP, or too long: the stream is lost. */
        g->drop = 1;
        hirate_cluster_refresh_end(op->l->cluster, g->node, NULL, NULL, 0);
        rc = hirate__fail(err, sizeof err, HIRATE_EPROTO, "malformed reply from Redis: %s", why);
    } else {
        /* A cluster's error reply (a node not in cluster mode, or one that
         * cannot say now) teaches nothing: another node is asked later, and
         * the calls' own replies say the rest. A sentinel's is what the
         * calls waiting for a master get. */
        rc = hirate_cluster_refresh_end(op->l->cluster, g->node, map, err, sizeof err);
        if (rc == HIRATE_EPROTO)
            g->drop = 1;
    }
    if (rc < 0 && (sentinel_of(op->l) || op->kind == OP_CHECK)) {
        op->route_rc = rc;
        snprintf(op->route_err, sizeof op->route_err, "%s", err);
    }
    hirate_rnode_free(map);
    g->map = 0;
    return 1;
}

/* ---- the health check (hirate_check) ---------------------------------------------- */

/* What a check learnt of the library or script on its node. */
enum { CHECK_UNKNOWN, CHECK_ABSENT, CHECK_LOADED, CHECK_NOFUNC };
#define CHECK_REPLIES 3     /* ROLE, FUNCTION LIST, SCRIPT EXISTS */

/* The nodes decisions go to now: the server; a cluster's masters (the
 * nodes its map names for some slot); a Sentinel service's master. */
static size_t check_targets(hirate_limiter *l, int *out)
{
    hirate_cluster *c = l->cluster;
    if (!c) {
        out[0] = 0;
        return 1;
    }
    if (c->sentinel) {
        int m = hirate_cluster_route(c, 0);
        out[0] = m;
        return m >= 0;
    }
    if (!__atomic_load_n(&c->have_map, __ATOMIC_ACQUIRE))
        return 0;
    unsigned char seen[HIRATE_IO_NODES_MAX] = {0};
    for (unsigned s = 0; s < HIRATE_SLOTS; s++) {
        int owner = __atomic_load_n(&c->owner[s], __ATOMIC_RELAXED);
        if (owner)
            seen[owner - 1] = 1;
    }
    size_t n = 0;
    for (int i = 0; i < HIRATE_IO_NODES_MAX; i++)
        if (seen[i])
            out[n++] = i;
    return n;
}

static void check_init(hirate_op *op, hirate_check_node *cn, int node)
{
    hirate_endpoint ep;
    memset(cn, 0, sizeof *cn);
    hirate_link_endpoint(&node_of(op->l, node)->link, &ep);
    snprintf(cn->addr, sizeof cn->addr, "%s", ep.where);
    cn->functions = cn->loaded = -1;
    cn->latency_us = -1;
}

static void check_fail(hirate_check_node *cn, int code, const char *why)
{
    cn->rc = hirate__fail(cn->message, sizeof cn->message, code, "%s",
                          why && *why ? why : hirate_strerror(code));
}

/* The nodes could not be found: one entry, for the node asked last (or the
 * limiter's first), with what stopped it. */
static void check_unfound(hirate_op *op)
{
    hirate_check_node *cn = calloc(1, sizeof *cn);
    if (!cn) {
        op->rc = HIRATE_ENOMEM;
        return;
    }
    check_init(op, cn, op->check_asked >= 0 ? op->check_asked : 0);
    if (op->route_rc)
        check_fail(cn, op->route_rc, op->route_err);
    else if (sentinel_of(op->l))
        cn->rc = no_master(op, cn->message, sizeof cn->message);
    else
        check_fail(cn, HIRATE_ESERVER, "the cluster's slot map is not known yet");
    op->checks = cn;
    op->nchecks = 1;
}

static int check_encode(leg *g)
{
    const char *argv[4] = {"FUNCTION", "LIST", "LIBRARYNAME", hirate__function_name};
    size_t lens[4] = {8, 4, 11, strlen(hirate__function_name)};
    const char *sargv[3] = {"SCRIPT", "EXISTS", hirate__script_sha1};
    size_t slens[3] = {6, 6, 40};
    static const char role_cmd[] = "*1\r\n$4\r\nROLE\r\n";
    size_t cap = sizeof role_cmd - 1 + hirate_proto_encode_argv(NULL, 0, 4, argv, lens) +
                 hirate_proto_encode_argv(NULL, 0, 3, sargv, slens);
    if (!(g->req = malloc(cap)) ||
        !(g->rr = hirate_rreader_new(64u << 10, 1024, HIRATE_IO_REPLY_MAX)))
        return HIRATE_ENOMEM;
    memcpy(g->req, role_cmd, sizeof role_cmd - 1);
    size_t len = sizeof role_cmd - 1;
    len += hirate_proto_encode_argv(g->req + len, cap - len, 4, argv, lens);
    len += hirate_proto_encode_argv(g->req + len, cap - len, 3, sargv, slens);
    g->reqlen = len;
    return 0;
}

/* The checks' round: the nodes, or a round to find them first. */
static int check_round(hirate_op *op)
{
    hirate_limiter *l = op->l;
    if (op->check_sent || op->rc)
        return 0;
    legs_clear(op);
    int nodes[HIRATE_IO_NODES_MAX];
    size_t n = check_targets(l, nodes);
    if (!n) {
        if (op->check_rounds++ < HIRATE_CLUSTER_REDIRECTS_MAX)
            add_refresh(op);
        if (op->nlegs && leg_encode(op, &op->legs[0]) == 0) {
            op->check_asked = op->legs[0].node;
            return 1;
        }
        legs_clear(op);
        check_unfound(op);
        return 0;
    }
    if (!(op->checks = calloc(n, sizeof *op->checks))) {
        op->rc = HIRATE_ENOMEM;
        return 0;
    }
    op->nchecks = n;
    op->check_sent = 1;
    for (size_t k = 0; k < n; k++) {
        check_init(op, &op->checks[k], nodes[k]);
        leg *g = leg_add(op, nodes[k]);
        if (!g || check_encode(g) < 0) {
            check_fail(&op->checks[k], HIRATE_ENOMEM, "out of memory for a request");
            if (g)
                g->state = LEG_FAILED;
            continue;
        }
        g->check = (int)k + 1;
    }
    for (size_t i = 0; i < op->nlegs; i++)
        if (op->legs[i].state == LEG_BUSY)
            return 1;
    return 0;
}

/* One of the check's replies, in the order sent. */
static void check_reply(hirate_op *op, leg *g, const hirate_rnode *r)
{
    hirate_check_node *cn = &op->checks[g->check - 1];
    size_t k = g->next++;
    if (r->type == '-') {
        int cls = hirate_proto_error_class(r->str, r->len);
        int denied = strncmp(r->str, "NOPERM", 6) == 0;
        if (cls == HIRATE_ESERVER || cls == HIRATE_EAUTH || cls == HIRATE_EREFUSED) {
            if (hirate_proto_error_drops_connection(r->str, r->len))
                g->drop = 1;
            if (!cn->rc)
                cn->rc = hirate__fail_quoting(cn->message, sizeof cn->message, cls,
                                              "Redis replied: ", r->str, r->len);
        } else if (k == 1) {
            g->fl = denied ? CHECK_UNKNOWN : cls == HIRATE_PROTO_NOFUNC ? CHECK_NOFUNC
                                                                        : CHECK_UNKNOWN;
        }
        return;   /* ROLE refused (an ACL), say: Redis still answered */
    }
    if (k == 0) {
        if (r->type == '*' && r->len && (r->elem[0]->type == '$' || r->elem[0]->type == '+'))
            snprintf(cn->role, sizeof cn->role, "%s", r->elem[0]->str);
    } else if (k == 1) {
        if (r->type == '*')
            g->fl = r->len ? CHECK_LOADED : CHECK_ABSENT;
    } else if (r->type == '*' && r->len == 1 && r->elem[0]->type == ':') {
        g->se = r->elem[0]->integer ? CHECK_LOADED : CHECK_ABSENT;
    }
}

/* The node's entry from the replies: what a decision would meet there. */
static void check_judge(hirate_op *op, leg *g, int64_t took_us)
{
    hirate_check_node *cn = &op->checks[g->check - 1];
    hirate_node *nd = node_of(op->l, g->node);
    cn->latency_us = took_us;
    /* FCALL, unless the option or the server said no (FUNCTION LIST is
     * unknown to a Redis before 7; an ACL that denies it hides the truth). */
    int fcall = __atomic_load_n(&nd->link.functions, __ATOMIC_RELAXED) && g->fl != CHECK_NOFUNC;
    int seen = fcall ? g->fl : g->se;
    cn->functions = fcall;
    cn->loaded = seen == CHECK_LOADED ? 1 : seen == CHECK_ABSENT ? 0 : -1;
    if (!cn->rc && cn->role[0] && strcmp(cn->role, "master") != 0) {
        cn->rc = hirate__fail(cn->message, sizeof cn->message, HIRATE_ESERVER,
                              "Redis at %s is not a master (ROLE: %s): it cannot take decisions",
                              cn->addr, cn->role);
        if (sentinel_of(op->l))
            hirate_cluster_master_lost(op->l->cluster, g->node);
        else if (op->l->cluster)
            hirate_cluster_stale(op->l->cluster);
    }
}

static int feed_check(hirate_op *op, size_t i, leg *g, const char *buf, size_t len, size_t *used)
{
    const char *why = NULL;
    *used = len;
    if (hirate_rreader_feed(g->rr, buf, len, &why) < 0)
        goto malformed;
    while (g->next < CHECK_REPLIES) {
        hirate_rnode *r = NULL;
        int got = hirate_rreader_next(g->rr, &r, &why);
        if (got < 0)
            goto malformed;
        if (got == 0)
            return HIRATE_IO_MORE;
        check_reply(op, g, r);
        hirate_rnode_free(r);
    }
    *used = len - hirate_rreader_pending(g->rr);   /* the rest: the next replies */
    check_judge(op, g, hirate_monotonic_us() - g->started);
    g->state = LEG_DONE;
    op->drop |= g->drop;
    return HIRATE_IO_DONE;
malformed: {
        char err[HIRATE_ERRMSG_SIZE];
        hirate__fail(err, sizeof err, HIRATE_EPROTO, "malformed reply from Redis: %s", why);
        hirate_op_leg_fail(op, i, HIRATE_EPROTO, err);
        return HIRATE_IO_DONE;
    }
}

int hirate_op_leg_feed(hirate_op *op, size_t i, const char *buf, size_t len, size_t *used)
{
    *used = 0;
    leg *g = leg_at(op, i);
    if (!g || g->state != LEG_BUSY)
        return HIRATE_IO_DONE;
    if (g->check)
        return feed_check(op, i, g, buf, len, used);
    size_t calls = g->reset ? 1 : g->count;
    while (g->next < calls || g->load) {
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
            hirate_op_leg_fail(op, i, HIRATE_EPROTO, NULL);
            return HIRATE_IO_DONE;
        }
        *used += (size_t)r;
        if (g->load) {
            /* FUNCTION LOAD's reply comes first. A refusal turns Redis
             * Functions off for the node; the calls' own replies ("Function
             * not found") then send them again by EVALSHA. */
            g->load = 0;
            int lo = hirate_proto_load_outcome(&rep);
            g->loaded = lo == 0;
            if (lo == HIRATE_PROTO_NOFUNC)
                hirate_link_no_functions(&node_of(op->l, g->node)->link, rep.top.str,
                                         rep.top.len);
            else if (lo == HIRATE_ESERVER)
                load_failed(op, g, &rep);
            continue;
        }
        size_t j = g->reset ? 0 : op->order[g->first + g->next];
        int asked = g->reset ? (op->reset_flags & SEND_ASKING) : (op->flags[j] & SEND_ASKING);
        if (asked && !g->ok_due) {
            g->ok_due = 1;   /* this was ASKING's reply */
            if (rep.top.type != '+') {
                hirate__fail(op->err, sizeof op->err, HIRATE_EPROTO,
                             "malformed reply from Redis: ASKING was not answered +OK");
                hirate_op_leg_fail(op, i, HIRATE_EPROTO, NULL);
                return HIRATE_IO_DONE;
            }
            continue;
        }
        g->ok_due = 0;
        if (g->reset) {
            op->reset_flags &= ~SEND_ASKING;
            feed_reset(op, g, &rep);
        } else {
            feed_call(op, g, j, &rep);
        }
        g->next++;
    }
    if (g->map) {
        size_t took;
        int whole = feed_map(op, g, buf + *used, len - *used, &took);
        *used += took;
        if (!whole)
            return HIRATE_IO_MORE;
    }
    leg_settle(op, g);
    g->state = LEG_DONE;
    op->drop |= g->drop;
    if (op->kind != OP_CHECK)   /* a check is not a decision's round trip */
        hirate_latency_add(&op->l->op_latency, hirate_monotonic_us() - g->started);
    return HIRATE_IO_DONE;
}

/* A leg's end: its node's breaker learns what its calls met, and each call
 * that has its answer gives it to its item. */
/* Call j of leg g, which could not connect (so nothing was sent), went to
 * g's node on a guess: no map named that node for its slot (a seed, before
 * the map is known). Then it may go to another node, a bounded number of
 * times: the node now fails, and the next guess is another one. */
static int unrouted(hirate_op *op, const leg *g, size_t j)
{
    hirate_cluster *c = slots_of(op->l);
    if (!c || (op->flags[j] & SEND_KEEP_NODE) || op->redirects[j] >= HIRATE_CLUSTER_REDIRECTS_MAX)
        return 0;
    unsigned slot = call_slot(op_call(op, j));
    if (__atomic_load_n(&c->owner[slot], __ATOMIC_RELAXED) == g->node + 1)
        return 0;
    op->redirects[j]++;
    return 1;
}

static void leg_settle(hirate_op *op, leg *g)
{
    if (op->kind == OP_RESET || !g->count)
        return;
    hirate_node *nd = node_of(op->l, g->node);
    size_t *sel = op->order + g->first;
    /* Calls that go again (NOSCRIPT, MOVED, ASK) reached a live server. */
    int64_t wait_us = breaker_outcome(&op->b, nd, g->verdict, sel, g->count, op->err);
    for (size_t i = 0; i < g->count; i++) {
        size_t j = sel[i];
        if (op->b.rcs[j] == HIRATE_ECONNECT && unrouted(op, g, j))
            op->b.rcs[j] = CALL_PENDING;
        if (op->b.rcs[j] == CALL_PENDING || op->b.rcs[j] == CALL_SETTLED)
            continue;
        if (is_outage(op->b.rcs[j]) && op->l->cluster)
            hirate_cluster_stale(op->l->cluster);
        settle_call(&op->b, j, wait_us, op->err);
        op->b.rcs[j] = CALL_SETTLED;
    }
}

void hirate_op_leg_fail(hirate_op *op, size_t i, int code, const char *why)
{
    leg *g = leg_at(op, i);
    if (!g || g->state != LEG_BUSY)
        return;
    hirate_cluster *sentinel = sentinel_of(op->l);
    if (g->check) {
        check_fail(&op->checks[g->check - 1], code, why && *why ? why : NULL);
    } else if ((sentinel || op->kind == OP_CHECK) && g->map) {
        /* A sentinel's question failed: for the calls waiting on it, and
         * for nobody else. The next round asks the next sentinel. */
        op->route_rc = code;
        hirate__fail(op->route_err, sizeof op->route_err, code, "%s",
                     why && *why ? why : hirate_strerror(code));
    } else if (why && *why) {
        hirate__fail(op->err, sizeof op->err, code, "%s", why);
    } else if (!op->err[0] || code != HIRATE_EPROTO) {
        hirate__fail(op->err, sizeof op->err, code, "%s", hirate_strerror(code));
    }
    g->drop = 1;
    op->drop = 1;
    g->state = LEG_FAILED;
    if (g->reset) {
        op->reset_pending = 0;
        op->rc = code;
        if (code != HIRATE_ECLOSED)
            remember(op->l, code, op->err);
    }
    /* Every call not yet answered may have run: the failure is theirs. */
    for (size_t k = g->next; op->kind == OP_DECIDE && k < g->count; k++)
        op->b.rcs[op->order[g->first + k]] = code;
    if (g->map)
        hirate_cluster_refresh_end(op->l->cluster, g->node, NULL, NULL, 0);
    g->map = 0;
    if (sentinel && code != HIRATE_ECLOSED && g->node >= sentinel->nsentinels)
        hirate_cluster_master_lost(sentinel, g->node);   /* ask where it is now */
    else if (op->l->cluster && code != HIRATE_ECLOSED)
        hirate_cluster_stale(op->l->cluster);   /* a failover? ask another node */
    leg_settle(op, g);
}

/* Every item has its answer: calls never sent get the op's last failure. */
static void op_finish(hirate_op *op)
{
    if (op->done)
        return;
    op->done = 1;
    if (op->kind == OP_CHECK) {
        for (size_t i = 0; i < op->nchecks && !op->rc; i++)
            op->rc = op->checks[i].rc;
        return;   /* changes no metric: it is not a decision */
    }
    if (op->kind != OP_DECIDE) {
        hirate_count_error(op->l->counts, op->rc);
        return;
    }
    for (size_t j = 0; j < op->b.m; j++) {
        if (op->b.rcs[j] == CALL_SETTLED)
            continue;
        if (op->b.rcs[j] == CALL_PENDING)
            op->b.rcs[j] = HIRATE_ECLOSED;
        settle_call(&op->b, j, 0, op->err);
        op->b.rcs[j] = CALL_SETTLED;
    }
    count_items(op->l, op->b.items, op->b.n, op->b.spend);
}

int hirate_op_next(hirate_op *op)
{
    if (!op || op->done)
        return HIRATE_IO_DONE;
    for (size_t i = 0; i < op->nlegs; i++)
        if (op->legs[i].state == LEG_BUSY)
            hirate_op_leg_fail(op, i, HIRATE_ECLOSED, "the caller left a leg unfinished");
    if (op_round(op))
        return HIRATE_IO_SEND;
    op_finish(op);
    return HIRATE_IO_DONE;
}

int hirate_op_feed(hirate_op *op, const char *buf, size_t len, size_t *used)
{
    *used = 0;
    if (op->done)
        return HIRATE_IO_DONE;
    int state = hirate_op_leg_feed(op, 0, buf, len, used);
    return state == HIRATE_IO_MORE ? state : hirate_op_next(op);
}

void hirate_op_fail(hirate_op *op, int code, const char *why)
{
    if (op->done)
        return;
    for (size_t i = 0; i < op->nlegs; i++)
        hirate_op_leg_fail(op, i, code, why);
    /* Calls that were to go again (after NOSCRIPT or a redirection) will
     * not be sent: the failure is theirs too. */
    for (size_t j = 0; op->kind == OP_DECIDE && j < op->b.m; j++)
        if (op->b.rcs[j] == CALL_PENDING)
            op->b.rcs[j] = code;
    if (op->kind == OP_RESET && op->reset_pending) {
        op->rc = code;
        op->reset_pending = 0;
    }
    op_finish(op);
}

const char *hirate_op_errmsg(const hirate_op *op, size_t i)
{
    if (!op)
        return NULL;
    if (op->kind == OP_RESET)
        return i == 0 && op->rc < 0 ? op->err : NULL;
    if (op->kind == OP_CHECK)
        return i < op->nchecks && op->checks[i].rc < 0 ? op->checks[i].message : NULL;
    if (i >= op->b.n || op->b.items[i].rc >= 0)
        return NULL;
    if (op->b.msgs && op->b.msgs[i])
        return op->b.msgs[i];
    return hirate_strerror(op->b.items[i].rc);
}

int hirate_op_bands(const hirate_op *op, size_t i, hirate_decision *bands, size_t nbands)
{
    if (!op || op->kind != OP_DECIDE || i >= op->b.n || op->b.items[i].rc != 0 ||
        (!bands && nbands))
        return HIRATE_EINVAL;
    size_t nb = op->l->nbands, k = nbands < nb ? nbands : nb;
    if (nb == 1 && k)
        bands[0] = op->b.items[i].decision;
    else if (k)
        memcpy(bands, op->b.per + i * nb, k * sizeof *bands);
    return (int)k;
}

int hirate_op_result(const hirate_op *op)
{
    return op->kind == OP_DECIDE ? 0 : op->rc;
}

void hirate_op_free(hirate_op *op)
{
    if (!op)
        return;
    legs_clear(op);
    free(op->legs);
    if (op->kind == OP_DECIDE)
        batch_free(&op->b);
    free(op->node);
    free(op->order);
    free(op->flags);
    free(op->checks);
    free(op);
}

/* ---- the blocking client over a cluster's nodes ------------------------------------ */

/* Runs op's rounds on the nodes' pools: every leg's request is sent first, so
 * that the nodes work at once, then each leg's replies are read. */
static void run_blocking(hirate_limiter *l, hirate_op *op)
{
    int64_t deadline = hirate_monotonic_us() + (int64_t)l->node0.link.timeout_ms * 1000;
    do {
        size_t n = hirate_op_legs(op);
        hirate_redis_conn *one, **conns = n == 1 ? &one : calloc(n, sizeof *conns);
        if (!conns) {
            hirate_op_fail(op, HIRATE_ENOMEM, "out of memory for a round");
            return;
        }
        for (size_t i = 0; i < n; i++) {
            char err[HIRATE_ERRMSG_SIZE];
            size_t len;
            hirate_node *nd = node_of(l, hirate_op_leg_node(op, i));
            const char *req = hirate_op_leg_request(op, i, &len);
            conns[i] = NULL;
            int rc = hirate_redis_lease(nd->redis, &conns[i], err, sizeof err);
            if (rc == 0 && (rc = hirate_redis_send(nd->redis, conns[i], req, len, deadline, err,
                                                   sizeof err)) < 0) {
                hirate_redis_unlease(nd->redis, conns[i], 0);
                conns[i] = NULL;
            }
            if (rc < 0)
                hirate_op_leg_fail(op, i, rc, err);
        }
        for (size_t i = 0; i < n; i++) {
            hirate_node *nd = node_of(l, hirate_op_leg_node(op, i));
            char err[HIRATE_ERRMSG_SIZE];
            int state = HIRATE_IO_MORE;
            while (conns[i] && state == HIRATE_IO_MORE) {
                const char *data;
                size_t len, used;
                int rc = hirate_redis_read(nd->redis, conns[i], deadline, &data, &len, err,
                                           sizeof err);
                if (rc < 0) {
                    hirate_op_leg_fail(op, i, rc, err);
                    break;
                }
                state = hirate_op_leg_feed(op, i, data, len, &used);
                hirate_redis_consumed(conns[i], used);
            }
            if (conns[i])
                hirate_redis_unlease(nd->redis, conns[i], !hirate_op_leg_drop(op, i));
        }
        if (conns != &one)
            free(conns);
    } while (hirate_op_next(op) == HIRATE_IO_SEND);
}

int hirate_op_start_check(hirate_limiter *l, hirate_op **out)
{
    *out = NULL;
    if (!l || !l->node0.redis)
        return HIRATE_EINVAL;
    hirate_op *op;
    if (op_new(l, OP_CHECK, &op) < 0)
        return HIRATE_ENOMEM;
    op->check_asked = -1;
    if (!op_round(op)) {
        op_finish(op);   /* no node to ask: done, its one entry says why */
        if (!op->nchecks) {
            hirate_op_free(op);
            return HIRATE_ENOMEM;
        }
    }
    *out = op;
    return 1;
}

int hirate_op_check(const hirate_op *op, hirate_check_node *nodes, size_t max, size_t *n)
{
    if (!op || op->kind != OP_CHECK || (!nodes && max))
        return HIRATE_EINVAL;
    for (size_t i = 0; i < op->nchecks && i < max; i++)
        nodes[i] = op->checks[i];
    if (n)
        *n = op->nchecks;
    return hirate_op_result(op);
}

int hirate_check(hirate_limiter *l, hirate_check_node *nodes, size_t max, size_t *n)
{
    if (n)
        *n = 0;
    if (!l || (!nodes && max))
        return HIRATE_EINVAL;
    if (!l->node0.redis)
        return 0;
    hirate_op *op;
    int rc = hirate_op_start_check(l, &op);
    if (rc < 0)
        return rc;
    if (!op->done)
        run_blocking(l, op);
    rc = hirate_op_check(op, nodes, max, n);
    hirate_op_free(op);
    return rc;
}

/* ---- endpoints and handshakes of nodes --------------------------------------------- */

int hirate_node_endpoint(hirate_limiter *l, int node, hirate_endpoint *out)
{
    hirate_node *nd = l && out ? node_of(l, node) : NULL;
    if (!nd)
        return HIRATE_EINVAL;
    hirate_link_endpoint(&nd->link, out);
    return 0;
}

int hirate_endpoint_get(hirate_limiter *l, hirate_endpoint *out)
{
    return hirate_node_endpoint(l, 0, out);
}

int hirate_is_cluster(hirate_limiter *l)
{
    return l && l->cluster && !l->cluster->sentinel;
}

int hirate_is_sentinel(hirate_limiter *l)
{
    return l && l->cluster && l->cluster->sentinel;
}

int hirate_node_handshake_start(hirate_limiter *l, int node, hirate_handshake **out, char *err,
                                size_t errlen)
{
    if (!out)
        return HIRATE_EINVAL;
    *out = NULL;
    if (!l || !l->node0.redis)
        return hirate__fail(err, errlen, HIRATE_EINVAL, "the limiter has no Redis URL");
    hirate_node *nd = node_of(l, node);
    if (!nd)
        return hirate__fail(err, errlen, HIRATE_EINVAL, "the limiter has no node %d", node);
    return hirate_link_handshake(&nd->link, out, err, errlen);
}

int hirate_handshake_start(hirate_limiter *l, hirate_handshake **out, char *err, size_t errlen)
{
    return hirate_node_handshake_start(l, 0, out, err, errlen);
}
