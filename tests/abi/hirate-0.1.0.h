/*
 * hirate: a distributed token-bucket rate limiter.
 *
 * One decision is one atomic script call in Redis (EVALSHA, EVAL only after
 * NOSCRIPT), or, without a Redis URL, one lookup in a sharded in-memory table.
 * A limiter may be shared by any number of threads and survives fork().
 *
 *     hirate_options o;
 *     hirate_options_init(&o);
 *     o.capacity = 10;          // burst: at most 10 tokens in the bucket
 *     o.rate = 2.0;             // refill: 2 tokens per second
 *     o.url = getenv("REDIS_URL");   // NULL: in-memory
 *
 *     hirate_limiter *lim;
 *     char why[HIRATE_ERRMSG_SIZE];
 *     if (hirate_limiter_new(&lim, &o, why, sizeof why) < 0) { puts(why); exit(1); }
 *
 *     hirate_decision d;
 *     int rc = hirate_allow(lim, "alice", 5, 1, &d);
 *     if (rc < 0)          ... an error: hirate_strerror(rc), hirate_limiter_errmsg()
 *     else if (d.allowed)  ... serve the request
 *     else                 ... refuse it, retry in d.retry_after_us microseconds
 *
 *     hirate_limiter_free(lim);
 *
 * Every function that can fail returns 0 or a negative HIRATE_E* code. A
 * refusal is not an error: it is a decision with allowed == 0.
 */
#ifndef HIRATE_H
#define HIRATE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HIRATE_VERSION_MAJOR 0
#define HIRATE_VERSION_MINOR 1
#define HIRATE_VERSION_PATCH 0
#define HIRATE_VERSION_STRING "0.1.0"
#define HIRATE_VERSION_NUM \
    (HIRATE_VERSION_MAJOR * 10000 + HIRATE_VERSION_MINOR * 100 + HIRATE_VERSION_PATCH)

#if defined(_WIN32)
#  define HIRATE_EXPORT
#elif defined(__GNUC__)
#  define HIRATE_EXPORT __attribute__((visibility("default")))
#else
#  define HIRATE_EXPORT
#endif

/* Limits. A key is any byte string of 1..HIRATE_KEY_MAX bytes (NUL included);
 * the prefix is a C string of at most HIRATE_PREFIX_MAX bytes. */
#define HIRATE_KEY_MAX 512
#define HIRATE_PREFIX_MAX 64
/* Capacity, cost and every time in microseconds stay below 2^53, the range in
 * which a double (and so the Lua inside Redis) holds whole numbers exactly. */
#define HIRATE_EXACT_MAX 9007199254740991LL
/* retry_after_us when the cost exceeds the capacity: it will never pass. */
#define HIRATE_NEVER INT64_MAX
/* Enough room for any message from hirate_limiter_errmsg() or _new(). */
#define HIRATE_ERRMSG_SIZE 256

/* Error codes: one list, from which hirate_strerror() and hirate_err_name()
 * are generated, so names, numbers and messages cannot drift apart. */
#define HIRATE_ERRNO_MAP(X)                                                     \
    X(EINVAL,    -1,  "invalid argument")                                       \
    X(ECAPACITY, -2,  "invalid capacity")                                       \
    X(ERATE,     -3,  "invalid rate")                                           \
    X(ECOST,     -4,  "invalid cost")                                           \
    X(EKEY,      -5,  "invalid key")                                            \
    X(ERANGE,    -6,  "value too large for exact arithmetic")                   \
    X(EURL,      -7,  "invalid Redis URL")                                      \
    X(EOPTION,   -8,  "invalid option")                                         \
    X(ENOMEM,    -9,  "out of memory")                                          \
    X(ECONNECT,  -10, "cannot connect to Redis")                                \
    X(ETIMEDOUT, -11, "Redis did not answer in time")                           \
    X(EIO,       -12, "I/O error on the Redis connection")                      \
    X(EPROTO,    -13, "malformed reply from Redis")                             \
    X(ESERVER,   -14, "Redis cannot serve the request now")                     \
    X(EAUTH,     -15, "Redis authentication failed")                            \
    X(ENOPERM,   -16, "Redis user lacks a permission")                          \
    X(EREPLY,    -17, "Redis answered with an error")                           \
    X(ECLOSED,   -18, "limiter is closed")

enum hirate_errno {
#define HIRATE_ERRNO_ENUM_(name, code, msg) HIRATE_##name = (code),
    HIRATE_ERRNO_MAP(HIRATE_ERRNO_ENUM_)
#undef HIRATE_ERRNO_ENUM_
    HIRATE_OK = 0
};

/* "invalid rate" for HIRATE_ERATE; "unknown error" for anything else. */
HIRATE_EXPORT const char *hirate_strerror(int code);
/* "HIRATE_ERATE" for HIRATE_ERATE; "HIRATE_UNKNOWN" for anything else. */
HIRATE_EXPORT const char *hirate_err_name(int code);

/* Who made a decision. */
typedef enum hirate_source {
    HIRATE_SOURCE_REDIS = 1,   /* the script in Redis */
    HIRATE_SOURCE_LOCAL,       /* the in-memory bucket of this process */
    HIRATE_SOURCE_CACHE,       /* a remembered refusal, no round trip */
    HIRATE_SOURCE_FAIL_OPEN,   /* Redis failed; the policy allows */
    HIRATE_SOURCE_FAIL_CLOSED  /* Redis failed; the policy refuses */
} hirate_source;

/* "redis", "local", "cache", "fail_open", "fail_closed"; "unknown". */
HIRATE_EXPORT const char *hirate_source_name(int source);

typedef struct hirate_decision {
    int allowed;            /* 1: the cost was spent; 0: refused, nothing spent */
    int source;             /* a hirate_source */
    int error;              /* 0, or the HIRATE_E* failure behind a policy decision */
    int64_t limit;          /* the capacity */
    int64_t remaining;      /* whole tokens left after this decision */
    int64_t retry_after_us; /* 0 when allowed; else until this cost can pass,
                               or HIRATE_NEVER when cost > capacity */
    int64_t reset_after_us; /* until the bucket is full again */
    int64_t time_us;        /* when it was decided: Redis' clock (µs since the
                               epoch) or this process' monotonic clock */
} hirate_decision;

/* What a limiter does when Redis fails (cannot connect, times out, breaks the
 * connection, sends garbage, or answers OOM, BUSY, READONLY, LOADING,
 * MASTERDOWN, CLUSTERDOWN, TRYAGAIN, MISCONF, NOREPLICAS). Configuration errors (a wrong password,
 * a missing ACL permission, a rejected script) are returned, never hidden. */
typedef enum hirate_on_error {
    HIRATE_ON_ERROR_LOCAL = 0, /* decide from an in-memory bucket (default) */
    HIRATE_ON_ERROR_OPEN,      /* allow */
    HIRATE_ON_ERROR_CLOSED     /* refuse */
} hirate_on_error;

/* "local", "open", "closed"; and back (-1 for any other name). */
HIRATE_EXPORT const char *hirate_on_error_name(int on_error);
HIRATE_EXPORT int hirate_on_error_from_name(const char *name);

typedef struct hirate_options {
    const char *url;        /* redis://[user:password@]host[:port][/db] or
                               unix:///path[?db=N]; NULL: in-memory (default) */
    int64_t capacity;       /* bucket size, 1..2^53-1 (required) */
    double rate;            /* tokens added per second, > 0 (required) */
    const char *prefix;     /* prepended to every key; default "rl:" */
    int connect_timeout_ms; /* default 250 */
    int timeout_ms;         /* per command; default 100 */
    int pool_size;          /* Redis connections at most; default 16 */
    size_t max_keys;        /* in-memory buckets at most; default 1,000,000 */
    int on_error;           /* a hirate_on_error; default HIRATE_ON_ERROR_LOCAL */
    int instances;          /* with LOCAL: capacity and rate are divided by this,
                               so N processes together stay near the limit; 1 */
    int backoff_min_ms;     /* after a failure, Redis is left alone this long, */
    int backoff_max_ms;     /* doubling up to this; defaults 100 and 5000 */
    int deny_cache;         /* 1: remember refusals (default); 0: off */
    size_t deny_cache_keys; /* refusals remembered at most; default 65,536 */
} hirate_options;

/* Fills *opts with the defaults; capacity and rate stay 0 (must be set). */
HIRATE_EXPORT void hirate_options_init(hirate_options *opts);

typedef struct hirate_limiter hirate_limiter;

/* Validates the options and makes a limiter. It does not connect: the first
 * decision does, so a limiter can be made while Redis is down. On failure
 * *out is NULL and, when errbuf is not NULL, errbuf holds a message naming
 * the problem (the password is never part of it). */
HIRATE_EXPORT int hirate_limiter_new(hirate_limiter **out, const hirate_options *opts,
                                     char *errbuf, size_t errlen);

/* Closes every connection and frees the limiter. NULL is ignored. No other
 * thread may use the limiter during or after this call. */
HIRATE_EXPORT void hirate_limiter_free(hirate_limiter *lim);

/* Spends cost tokens from key's bucket if it holds that many. cost 0 spends
 * nothing and reports the bucket as it is. When Redis fails, the on_error
 * policy decides: the call still returns 0, out->source says who decided and
 * out->error names the failure. A refusal is out->allowed == 0, not an error;
 * errors are bad arguments and configuration errors (HIRATE_EAUTH,
 * HIRATE_ENOPERM, HIRATE_EREPLY). */
HIRATE_EXPORT int hirate_allow(hirate_limiter *lim, const void *key, size_t keylen,
                               int64_t cost, hirate_decision *out);

/* What hirate_allow(key, cost) would decide now, without spending anything. */
HIRATE_EXPORT int hirate_peek(hirate_limiter *lim, const void *key, size_t keylen,
                              int64_t cost, hirate_decision *out);

/* Forgets key's bucket: it is full again. */
HIRATE_EXPORT int hirate_reset(hirate_limiter *lim, const void *key, size_t keylen);

/* One (key, cost) of a batch, and its outcome. */
typedef struct hirate_item {
    const void *key;        /* in */
    size_t keylen;          /* in */
    int64_t cost;           /* in */
    int rc;                 /* out: 0, or this item's HIRATE_E* code */
    hirate_decision decision; /* out, when rc is 0 */
} hirate_item;

/* hirate_allow for every item, in one pipelined round trip to Redis. Items
 * are decided in order, each as hirate_allow would decide it alone. Returns
 * 0 when every item has its rc, or HIRATE_EINVAL for a NULL limiter or a
 * NULL items with n > 0. */
HIRATE_EXPORT int hirate_allow_many(hirate_limiter *lim, hirate_item *items, size_t n);

/* The message of the last error on this limiter, e.g. "key is empty" or
 * "connect to 127.0.0.1:6379: Connection refused", copied into buf. With
 * threads sharing a limiter it is the last error any of them met; the code
 * each call returns is always that call's own. Returns buf. */
HIRATE_EXPORT const char *hirate_limiter_errmsg(hirate_limiter *lim, char *buf, size_t len);

/* The Redis script and its SHA1 (40 hex digits), e.g. to SCRIPT LOAD it. */
HIRATE_EXPORT const char *hirate_script_source(size_t *len);
HIRATE_EXPORT const char *hirate_script_sha1(void);

HIRATE_EXPORT const char *hirate_version(void);

#ifdef __cplusplus
}
#endif
#endif /* HIRATE_H */
