/*
 * The limiter's life: its options read and checked, the limiter made with
 * its buckets, deny cache and nodes, the fork hooks that keep it safe across
 * fork(), and its end; and what it says of itself: its bands, counters,
 * stats, nodes' endpoints and handshakes, the script and the version.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "duration.h"
#include "options.h"
#include "errors.h"
#include "limiter.h"
#include "name.h"
#include "script.h"

static uint64_t serials;        /* the last serial number given (atomic) */

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

static size_t local_count(hirate_limiter *l)
{
    return l->shm ? hirate_shm_count(l->shm) : hirate_memory_count(l->memory);
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
