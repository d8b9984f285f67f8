/*
 * The limiter: checks every input, routes a decision to Redis or to memory,
 * and keeps the message of the last error.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "errors.h"
#include "fork.h"
#include "hirate_internal.h"
#include "memory.h"
#include "redis.h"
#include "script.h"

struct hirate_limiter {
    hirate_fork_node fork;      /* first: the fork hooks get this pointer */
    hirate_bucket_cfg cfg;
    char prefix[HIRATE_PREFIX_MAX + 1];
    size_t prefixlen;
    char args[96];              /* capacity and rate as RESP bulk strings */
    size_t argslen;
    hirate_redis *redis;        /* NULL: in-memory */
    hirate_memory *memory;
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
}

/* ---- fork hooks: hold every lock across fork(), reset the pool in the child */

static void fork_prepare(hirate_fork_node *n)
{
    hirate_limiter *l = (hirate_limiter *)n;
    pthread_mutex_lock(&l->errlock);
    if (l->redis)
        hirate_redis_fork_prepare(l->redis);
    if (l->memory)
        hirate_memory_lock_all(l->memory);
}

static void fork_parent(hirate_fork_node *n)
{
    hirate_limiter *l = (hirate_limiter *)n;
    if (l->memory)
        hirate_memory_unlock_all(l->memory);
    if (l->redis)
        hirate_redis_fork_parent(l->redis);
    pthread_mutex_unlock(&l->errlock);
}

static void fork_child(hirate_fork_node *n)
{
    hirate_limiter *l = (hirate_limiter *)n;
    if (l->memory)
        hirate_memory_unlock_all(l->memory);
    if (l->redis)
        hirate_redis_fork_child(l->redis);
    pthread_mutex_unlock(&l->errlock);
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
    if (o->prefix && strlen(o->prefix) > HIRATE_PREFIX_MAX)
        return hirate__fail(err, errlen, HIRATE_EOPTION, "prefix is %zu bytes; the most is %d",
                            strlen(o->prefix), HIRATE_PREFIX_MAX);
    return 0;
}

int hirate_limiter_new(hirate_limiter **out, const hirate_options *o, char *err, size_t errlen)
{
    hirate_bucket_cfg cfg;
    hirate_redis_cfg rcfg;
    int rc;

    if (err && errlen)
        err[0] = '\0';
    if (!out || !o)
        return hirate__fail(err, errlen, HIRATE_EINVAL, "hirate_limiter_new needs out and opts");
    *out = NULL;
    if ((rc = check_options(o, &cfg, err, errlen)) < 0)
        return rc;
    if (o->url) {
        memset(&rcfg, 0, sizeof rcfg);
        if ((rc = hirate_url_parse(o->url, &rcfg.url, err, errlen)) < 0)
            return rc;
        rcfg.connect_timeout_ms = o->connect_timeout_ms;
        rcfg.timeout_ms = o->timeout_ms;
        rcfg.pool_size = o->pool_size;
    }

    hirate_limiter *l = calloc(1, sizeof *l);
    if (!l)
        return hirate__fail(err, errlen, HIRATE_ENOMEM, "out of memory");
    l->cfg = cfg;
    if (o->prefix) {
        l->prefixlen = strlen(o->prefix);
        memcpy(l->prefix, o->prefix, l->prefixlen);
    }
    l->argslen = hirate_proto_encode_limits(l->args, sizeof l->args, cfg.capacity, cfg.rate);
    pthread_mutex_init(&l->errlock, NULL);
    if (o->url) {
        l->redis = hirate_redis_new(&rcfg);
        memset(&rcfg, 0, sizeof rcfg);   /* the password: one copy is enough */
    } else {
        l->memory = hirate_memory_new(o->max_keys);
    }
    if (!l->redis && !l->memory) {
        pthread_mutex_destroy(&l->errlock);
        free(l);
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
    hirate_fork_unregister(&l->fork);
    hirate_redis_free(l->redis);
    hirate_memory_free(l->memory);
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

static int decide(hirate_limiter *l, const void *key, size_t keylen, int64_t cost, int spend,
                  int64_t now_us, hirate_decision *out)
{
    char err[HIRATE_ERRMSG_SIZE];
    int rc;

    if (!l)
        return HIRATE_EINVAL;
    if (!out)
        return remember(l, HIRATE_EINVAL, "the decision pointer is NULL");
    if ((rc = check_key(key, keylen, err, sizeof err)) < 0 ||
        (rc = hirate_bucket_check_cost(cost, err, sizeof err)) < 0)
        return remember(l, rc, err);

    if (l->redis) {
        hirate_call call = {l->prefix, l->prefixlen, key, keylen, l->args, l->argslen,
                            cost, spend, now_us};
        hirate_bucket state;
        rc = hirate_redis_decide(l->redis, &call, l->cfg.capacity, out, &state, err, sizeof err);
    } else {
        int64_t now = now_us >= 0 ? now_us : hirate_monotonic_us();
        rc = hirate_memory_decide(l->memory, &l->cfg, key, keylen, now, cost, spend, out);
        if (rc < 0)
            hirate__fail(err, sizeof err, rc, "out of memory for a new bucket");
    }
    return rc < 0 ? remember(l, rc, err) : 0;
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

int hirate__decide_at(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                      int spend, int64_t now_us, hirate_decision *out)
{
    if (l && now_us < 0)
        return remember(l, HIRATE_EINVAL, "the injected time must not be negative");
    return decide(l, key, keylen, cost, spend, now_us, out);
}

int hirate_reset(hirate_limiter *l, const void *key, size_t keylen)
{
    char err[HIRATE_ERRMSG_SIZE];
    int rc;

    if (!l)
        return HIRATE_EINVAL;
    if ((rc = check_key(key, keylen, err, sizeof err)) < 0)
        return remember(l, rc, err);
    if (l->redis) {
        rc = hirate_redis_reset(l->redis, l->prefix, l->prefixlen, key, keylen, err, sizeof err);
        return rc < 0 ? remember(l, rc, err) : 0;
    }
    hirate_memory_reset(l->memory, key, keylen);
    return 0;
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

void hirate__stats(hirate_limiter *l, hirate_stats *out)
{
    memset(out, 0, sizeof *out);
    if (l->redis) {
        hirate_redis_stats rs;
        hirate_redis_stats_get(l->redis, &rs);
        out->connects = rs.connects;
        out->evalsha = rs.evalsha;
        out->eval = rs.eval;
        out->conns_dropped = rs.dropped;
    }
    if (l->memory)
        out->memory_keys = hirate_memory_count(l->memory);
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
