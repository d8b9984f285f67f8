/*
 * hirate: a distributed token-bucket rate limiter.
 *
 * One decision is one atomic call in Redis (FCALL of a function library where
 * the server has Redis Functions, else EVALSHA of the same script; the code is
 * loaded only when the server says it lacks it), or, without a Redis URL, one
 * lookup in a sharded in-memory table.
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
 *
 * Compatibility (docs/c.md, "ABI and SOVERSION"): a program built against an
 * older hirate.h of the same SOVERSION runs with a newer library unchanged.
 * hirate_options grows at its end and carries the size the program knew,
 * set by hirate_options_init; hirate_stats is filled up to the size given.
 * The other structs (hirate_decision, hirate_item, hirate_band, hirate_limit,
 * hirate_check_node) keep their layout: what a later release adds comes
 * through new functions.
 */
#ifndef HIRATE_H
#define HIRATE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HIRATE_VERSION_MAJOR 0
#define HIRATE_VERSION_MINOR 2
#define HIRATE_VERSION_PATCH 0
#define HIRATE_VERSION_STRING "0.2.0"
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
    X(ECLOSED,   -18, "limiter is closed")                                      \
    X(ETLS,      -19, "TLS handshake or certificate check failed")              \
    X(EREFUSED,  -20, "Redis refused the connection")                           \
    X(ENOTREDIS, -21, "the server does not speak the Redis protocol")
/* The most negative code is -HIRATE_ERRNO_MAX. */
#define HIRATE_ERRNO_MAX 21

enum hirate_errno {
#define HIRATE_ERRNO_ENUM_(name, code, msg) HIRATE_##name = (code),
    HIRATE_ERRNO_MAP(HIRATE_ERRNO_ENUM_)
#undef HIRATE_ERRNO_ENUM_
    HIRATE_OK = 0
};

/* "invalid rate" for HIRATE_ERATE; "unknown error" for anything else. */
HIRATE_EXPORT const char *hirate_strerror(int code);
/* "ERATE" for HIRATE_ERATE, "OK" for 0, "UNKNOWN" for anything else: the
 * name every front end shows (Python's Error.name, Lua's third result, the
 * hirate tool's error=). */
HIRATE_EXPORT const char *hirate_err_name(int code);

/* The message of a capacity (HIRATE_ECAPACITY) or a cost (HIRATE_ECOST)
 * out of range, as every front end says it, for a value shown as its
 * language shows it, those an int64_t cannot hold among them ("1.5",
 * "2**70"): "<what> must be a whole number from 1 to 2^53-1, got <shown>"
 * (from 0 for a cost), what naming the value ("item 2: cost"; NULL:
 * "capacity" or "cost"). Returns code; HIRATE_EINVAL for another code or
 * no shown. */
HIRATE_EXPORT int hirate_range_errmsg(int code, const char *what, const char *shown, char *err,
                                      size_t errlen);
/* Whether a decision takes cost (a whole number from 0 to HIRATE_EXACT_MAX):
 * 0, or HIRATE_ECOST with hirate_range_errmsg's message in err (what as
 * there). */
HIRATE_EXPORT int hirate_check_cost(int64_t cost, const char *what, char *err, size_t errlen);
/* Whether a decision takes a key of keylen bytes (1 to HIRATE_KEY_MAX): 0,
 * or HIRATE_EKEY with the message every front end shows in err ("key is
 * empty", "item 2: key is 600 bytes; the most is 512"; what NULL: "key"). */
HIRATE_EXPORT int hirate_check_key(size_t keylen, const char *what, char *err, size_t errlen);

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

/* A decision. With several bands (see hirate_band) it is the whole's: the
 * cost passed every band, or was refused and spent in none; `band` names the
 * band whose capacity is `limit`: when refused, the refusing band that waits
 * longest; when allowed, the band left with the fewest tokens (the first of
 * equals). remaining is the least any band has left, retry_after_us the
 * longest wait of a refusing band, reset_after_us the longest until a band is
 * full. With one band, band is 0 and every figure is that bucket's. */
typedef struct hirate_decision {
    int allowed;            /* 1: the cost was spent; 0: refused, nothing spent */
    int source;             /* a hirate_source */
    int error;              /* 0, or the HIRATE_E* failure behind a policy decision */
    int band;               /* the band behind limit (0 with one band) */
    int64_t limit;          /* the capacity */
    int64_t remaining;      /* whole tokens left after this decision */
    int64_t retry_after_us; /* 0 when allowed; else until this cost can pass,
                               or HIRATE_NEVER when cost > capacity */
    int64_t reset_after_us; /* until the bucket is full again */
    int64_t time_us;        /* when it was decided: Redis' clock (µs since the
                               epoch) or this process' monotonic clock */
} hirate_decision;

/* Events worth a line in a log, each said once when it happens, never once
 * per call: HIRATE_LOG_WARNING (a Redis node failed and its breaker opened:
 * the failure policy decides until it answers again, said once per outage
 * with the failure, not at each failed probe; Redis Functions refused by a
 * server, so it gets EVALSHA from then on), HIRATE_LOG_INFO (a node answers
 * again after an outage, and how long it was gone; a Sentinel service's
 * master found, or moved). Called from whichever thread learnt it, with no lock of
 * the limiter held; it must not call the limiter. msg never holds a
 * password. */
#define HIRATE_LOG_WARNING 1
#define HIRATE_LOG_INFO 2
typedef void (*hirate_log_fn)(void *arg, int level, const char *msg);

/* What a limiter does when Redis fails (cannot connect, times out, breaks the
 * connection, sends garbage, or answers OOM, BUSY, READONLY, LOADING,
 * MASTERDOWN, CLUSTERDOWN, TRYAGAIN, MISCONF, NOREPLICAS). Configuration errors (a wrong password,
 * a missing ACL permission, a rejected script, a failed TLS check or a TLS/plain
 * mismatch, a server that is not Redis, maxclients or protected mode) are
 * returned, never hidden, and never open the breaker. */
typedef enum hirate_on_error {
    HIRATE_ON_ERROR_LOCAL = 0, /* decide from an in-memory bucket (default) */
    HIRATE_ON_ERROR_OPEN,      /* allow */
    HIRATE_ON_ERROR_CLOSED     /* refuse */
} hirate_on_error;

/* "local", "open", "closed"; and back (-1 for any other name). */
HIRATE_EXPORT const char *hirate_on_error_name(int on_error);
HIRATE_EXPORT int hirate_on_error_from_name(const char *name);

/* Several limits on one key ("bands"), e.g. 10 per second and 1,000 per
 * day. One decision spends the cost in every band or in none, atomically:
 * in Redis one key holds every band and one script call decides them all;
 * in memory one bucket entry holds them under one lock. Bands are stored by
 * position (docs/semantics.md, "Several limits"): a limiter whose bands
 * change reads an existing key's band i as its band i, capped at its new
 * capacity, as a single bucket reads a changed capacity; bands the key lacks
 * are full. */
#define HIRATE_BANDS_MAX 16
#define HIRATE_BAND_NAME_MAX 64
typedef struct hirate_band {
    int64_t capacity;       /* 1..2^53-1 */
    double rate;            /* tokens per second, > 0 */
    const char *name;       /* for headers and messages: 1..HIRATE_BAND_NAME_MAX
                               printable ASCII bytes, distinct within a limiter
                               (copied); NULL: "<capacity>-per-<w>s", w being
                               hirate_refill_seconds(capacity, rate) */
} hirate_band;

/* Whole seconds an empty bucket of capacity takes to fill at rate, rounded
 * up (the "w" of a RateLimit-Policy header), computed as reset_after_us is;
 * 0 for a capacity or rate that no limiter accepts. */
HIRATE_EXPORT int64_t hirate_refill_seconds(int64_t capacity, double rate);

typedef struct hirate_options {
    size_t size;            /* sizeof(hirate_options) as the program was built:
                               set by hirate_options_init, never by hand */
    const char *url;        /* redis://[user:password@]host[:port][/db],
                               rediss://... (TLS) or unix:///path[?db=N];
                               a Redis Cluster: redis+cluster://[user:password@]
                               host:port[,host:port...] (seeds; any node of the
                               cluster, a replica too), rediss+cluster://...;
                               NULL: in-memory (default) */
    /* The limit: capacity and rate (one band), or bands, or limits; exactly
     * one of the three. */
    int64_t capacity;       /* bucket size, 1..2^53-1 */
    double rate;            /* tokens added per second, > 0 */
    const hirate_band *bands; /* several limits: bands[0 .. nbands), copied; */
    size_t nbands;          /* 1..HIRATE_BANDS_MAX (0: not set) */
    const char *limits;     /* or as text: "10/second; 1000/day" (the grammar
                               of hirate_limits_parse), one band a limit */
    const char *prefix;     /* prepended to every key; default "rl:" */
    int connect_timeout_ms; /* default 250 */
    int timeout_ms;         /* per command; default 100 */
    int pool_size;          /* Redis connections at most (per node of a
                               cluster); default 16 */
    size_t max_keys;        /* in-memory buckets at most; default 1,000,000 */
    int on_error;           /* a hirate_on_error; default HIRATE_ON_ERROR_LOCAL */
    int instances;          /* with LOCAL: capacity and rate are divided by this,
                               so N processes together stay near the limit; 1 */
    int backoff_min_ms;     /* after a failure, Redis is left alone this long, */
    int backoff_max_ms;     /* doubling up to this; defaults 100 and 5000 */
    int deny_cache;         /* 1: remember refusals (default); 0: off */
    size_t deny_cache_keys; /* refusals remembered at most; default 65,536 */
    int deny_cache_max_ms;  /* a refusal is foretold from one reply for at most
                               this long, then Redis is asked again, so that a
                               reset made by another process is seen within
                               it; 1..86,400,000, default 1000 */
    /* TLS, for rediss:// URLs (each string is copied; NULL: not set). */
    const char *tls_ca_file;     /* PEM file of trusted CAs; default: the system's */
    const char *tls_ca_dir;      /* directory of trusted CAs (c_rehash layout) */
    const char *tls_cert_file;   /* client certificate, PEM (mutual TLS) */
    const char *tls_key_file;    /* its private key, PEM */
    const char *tls_server_name; /* SNI and the name checked; default the URL's host */
    int tls_verify;              /* 1: verify chain and name (default); 0: do not
                                    (anyone on the path can then read and change
                                    every call) */
    /* Redis Sentinel, for redis+sentinel:// URLs (copied; NULL: not set). */
    const char *sentinel_username;  /* the sentinels' ACL user */
    const char *sentinel_password;  /* the sentinels' password; NULL: they need none */
    int functions;          /* 1: FCALL where the server has Redis Functions
                               (default); 0: EVALSHA always */
    hirate_log_fn log;      /* events for a log (see hirate_log_fn), or NULL */
    void *log_arg;          /* given to log */
    int shared;             /* 1: the in-memory buckets (no URL, or the LOCAL
                               fallback's) are shared with every process
                               forked after the limiter is made, e.g. nginx's
                               workers when it is made in the master: one
                               table of max_keys buckets in shared memory,
                               mapped whole at once (address space: about
                               max_keys * (536 + 16 * bands) bytes, memory as
                               keys arrive), each decision atomic across the
                               processes, a process that dies mid-decision
                               never blocking the others; 0: this process'
                               own table (default) */
} hirate_options;

/* Fills *opts with the defaults and opts->size; capacity and rate stay 0
 * (the limit must be set). A macro, so that the size is the program's own:
 * a library newer than the header writes only the fields the program knows,
 * and gives the others their defaults. */
#define hirate_options_init(opts) hirate_options_init_size((opts), sizeof *(opts))
/* hirate_options_init's function: size is sizeof *opts. */
HIRATE_EXPORT void hirate_options_init_size(hirate_options *opts, size_t size);

/* A duration as people write it: a number and a unit, "250us", "100ms",
 * "0.25s", "2m", "1h" (us, ms, s, m, h; spaces allowed, case ignored), or a
 * number alone, which is seconds ("0.25" is 250 ms), as every duration is
 * in Python and Lua. *us gets it in whole microseconds, rounded to the
 * nearest. 0, or HIRATE_EOPTION with a message that quotes the text. */
HIRATE_EXPORT int hirate_duration_parse(const char *text, int64_t *us, char *err, size_t errlen);

/* Sets the duration option name ("timeout", "connect_timeout",
 * "deny_cache_max": the fields without their "_ms") from text, as
 * hirate_duration_parse reads it, or from a number of seconds; rounded to
 * the nearest millisecond. The option's range is checked here, and worded in
 * the unit the caller used ("timeout must be from 1ms to 60s, got 0ms",
 * "timeout must be from 0.001 to 60 seconds, got 0"). 0, HIRATE_EOPTION, or
 * HIRATE_EINVAL for another name. */
HIRATE_EXPORT int hirate_options_set_duration(hirate_options *opts, const char *name,
                                              const char *text, char *err, size_t errlen);
HIRATE_EXPORT int hirate_options_set_seconds(hirate_options *opts, const char *name,
                                             double seconds, char *err, size_t errlen);

/* Sets max_keys to n, checked as hirate_limiter_new checks it (1 to
 * 4,000,000,000), for a front end whose integers may be negative or wider
 * than size_t: "max_keys must be from 1 to 4000000000, got -1". 0, or
 * HIRATE_EOPTION with the message in err. */
HIRATE_EXPORT int hirate_options_set_max_keys(hirate_options *opts, long long n, char *err,
                                              size_t errlen);

/* Sets on_error from its name ("local", "open" or "closed"), as Python, Lua
 * and the tool take it: 0, or HIRATE_EOPTION with the message
 * 'on_error must be "local", "open" or "closed", got "sometimes"' in err
 * (HIRATE_EINVAL without opts or name). */
HIRATE_EXPORT int hirate_options_set_on_error(hirate_options *opts, const char *name, char *err,
                                              size_t errlen);

typedef struct hirate_limiter hirate_limiter;

/* Validates the options and makes a limiter. It does not connect: the first
 * decision does, so a limiter can be made while Redis is down. Every string
 * and array of the options is copied (or parsed) here: none need outlive the
 * call. On failure *out is NULL and, when errbuf is not NULL, errbuf holds a
 * message naming the problem (the password is never part of it); options
 * that hirate_options_init did not fill are HIRATE_EOPTION. */
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

/* hirate_allow and hirate_peek that also give each band's own figures:
 * bands[i] for band i, i below nbands and the limiter's band count. Band i's
 * `allowed` says whether it held the cost; its limit, remaining,
 * retry_after_us and reset_after_us are its own bucket's after the decision
 * (a band that held the cost of a refused call keeps it, and reports its own
 * reset time); source, error and time_us are the whole's. */
HIRATE_EXPORT int hirate_allow_bands(hirate_limiter *lim, const void *key, size_t keylen,
                                     int64_t cost, hirate_decision *out, hirate_decision *bands,
                                     size_t nbands);
HIRATE_EXPORT int hirate_peek_bands(hirate_limiter *lim, const void *key, size_t keylen,
                                    int64_t cost, hirate_decision *out, hirate_decision *bands,
                                    size_t nbands);

/* Gives tokens back to key's bucket, e.g. for a request whose work failed
 * after hirate_allow spent its cost: every band gets tokens back, each
 * capped at its capacity (a bucket never holds more; a key never seen is
 * full and stays so). tokens is checked as a cost is (0..2^53-1, else
 * HIRATE_ECOST); 0 gives nothing and reports the bucket. *out is the bucket
 * after the refund (allowed 1, retry_after_us 0). The deny cache forgets
 * the key, so a refusal foretold before the refund is not served after it.
 * When Redis fails, on_error local gives the tokens to the local fallback
 * bucket (out->source local, out->error the failure); under open or closed
 * there is no bucket to give them to, and the failure's own code is
 * returned (HIRATE_ECONNECT, HIRATE_ETIMEDOUT...): the tokens were not given
 * back (docs/semantics.md, "Refunds"). A refund is not counted among
 * hirate_stats' decisions or peeks. */
HIRATE_EXPORT int hirate_refund(hirate_limiter *lim, const void *key, size_t keylen,
                                int64_t tokens, hirate_decision *out);
/* hirate_refund with each band's bucket after it in bands[0 .. nbands), as
 * hirate_allow_bands gives them. */
HIRATE_EXPORT int hirate_refund_bands(hirate_limiter *lim, const void *key, size_t keylen,
                                      int64_t tokens, hirate_decision *out,
                                      hirate_decision *bands, size_t nbands);

/* The limiter's bands: how many (1 for capacity and rate), and band i's
 * capacity, rate and name (the limiter's own copy: valid while it lives).
 * hirate_limiter_band returns 0, or HIRATE_EINVAL for no such band. */
HIRATE_EXPORT size_t hirate_limiter_nbands(const hirate_limiter *lim);
HIRATE_EXPORT int hirate_limiter_band(const hirate_limiter *lim, size_t i, hirate_band *out);

/* Forgets key's bucket (every band of it): it is full again. */
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
 * are decided in order, each as hirate_allow would decide it alone (the
 * whole's figures, for a limiter of several bands). Returns
 * 0 when every item has its rc, or HIRATE_EINVAL for a NULL limiter or a
 * NULL items with n > 0. */
HIRATE_EXPORT int hirate_allow_many(hirate_limiter *lim, hirate_item *items, size_t n);

/* hirate_allow_many that also gives each item's band figures (as
 * hirate_allow_bands does) in bands[i * B .. i * B + B), B being
 * hirate_limiter_nbands(lim), for each item whose rc is 0. */
HIRATE_EXPORT int hirate_allow_many_bands(hirate_limiter *lim, hirate_item *items, size_t n,
                                          hirate_decision *bands);

/* hirate_allow_many_bands (bands NULL: without them) that also writes each
 * failed item's own message, e.g. "key is empty", into msgs + i * msglen (at
 * most msglen bytes, NUL included; HIRATE_ERRMSG_SIZE holds any), and "" for
 * each item whose rc is 0. msgs NULL: none. */
HIRATE_EXPORT int hirate_allow_many_msgs(hirate_limiter *lim, hirate_item *items, size_t n,
                                         hirate_decision *bands, char *msgs, size_t msglen);

/* The message of the calling thread's last error on this limiter, e.g. "key
 * is empty" or "connect to 127.0.0.1:6379: Connection refused", copied into
 * buf: read it right after the call that failed, in the same thread. Each
 * thread has its own, so threads sharing a limiter never read each other's;
 * "" when this thread's last error was on another limiter (or it met none).
 * A later call that succeeds leaves it as it was. For a batch it is the last
 * failed item's (hirate_allow_many_msgs gives each item's). Returns buf. */
HIRATE_EXPORT const char *hirate_limiter_errmsg(hirate_limiter *lim, char *buf, size_t len);

/* The code and message hirate_allow would give for this key and cost before
 * deciding anything (HIRATE_EKEY, HIRATE_ECOST, HIRATE_ERANGE, HIRATE_EINVAL
 * for a NULL key), or 0; with no limiter, e.g. to refuse a whole batch before
 * any item of it is spent. */
HIRATE_EXPORT int hirate_validate(const void *key, size_t keylen, int64_t cost, char *err,
                                  size_t errlen);

/* A limit as people write it: "100/minute", "100 per minute", "10/5s",
 * "1000/day burst 50" (docs/semantics.md, "Limit strings"). N per window is
 * a bucket of N tokens (or the burst given) refilled at N per window. */
#define HIRATE_LIMITS_MAX HIRATE_BANDS_MAX
typedef struct hirate_limit {
    int64_t capacity;       /* the bucket: N, or the burst */
    double rate;            /* tokens per second: N / window_s */
    int64_t count;          /* N */
    int64_t window_s;       /* the window, in seconds */
} hirate_limit;

/* Parses one or more limits separated by ';' or ',' into out[0 .. *n), at
 * most max (and HIRATE_LIMITS_MAX). 0, or HIRATE_EOPTION with a message in
 * err that quotes the limit and names the part that is wrong. */
HIRATE_EXPORT int hirate_limits_parse(const char *text, hirate_limit *out, size_t max, size_t *n,
                                      char *err, size_t errlen);

/* A limiter's metrics since it was made, counted in the core on every path
 * (the blocking client, the io layer's ops, the memory backend), without a
 * lock and without a cache line that every thread writes: each thread adds
 * to a stripe of its own, and hirate_stats_get sums the stripes, so each
 * figure is exact once the calls it counts have returned. */
#define HIRATE_LATENCY_BUCKETS 14
typedef struct hirate_stats {
    uint64_t decisions[6];  /* decisions of calls that spend (hirate_allow,
                               _many, _bands, ops with spend) by source:
                               decisions[HIRATE_SOURCE_REDIS] .. [HIRATE_SOURCE_
                               FAIL_CLOSED]; decisions[0] stays 0 */
    uint64_t refused;       /* of those, the refused */
    uint64_t peeks;         /* decisions of peeks, any source */
    uint64_t errors[HIRATE_ERRNO_MAX + 1]; /* failures met, by code
                               (errors[-HIRATE_ETIMEDOUT]), one a call or a
                               batch's item: those returned (bad input, a
                               misconfiguration) and the outages a policy
                               answered for */
    uint64_t breaker_opens; /* times a node's breaker opened (an outage began) */
    uint64_t breaker_closes;/* times it closed again (a probe succeeded) */
    uint64_t connects;      /* connections opened (attempts: a refused one too) */
    uint64_t conns_dropped; /* connections closed after an error (one whose
                               handshake failed once it connected, too) */
    uint64_t latency[HIRATE_LATENCY_BUCKETS]; /* Redis round trips by how long
                               they took: latency[i] counts those above bound
                               i-1 and at most bound i (hirate_latency_bounds),
                               the last those above every bound; not cumulative */
    uint64_t latency_sum_us;/* the time of every round trip counted there */
} hirate_stats;

/* Fills out (size: sizeof *out, so that a program built against an older,
 * shorter hirate_stats keeps working). 0, or HIRATE_EINVAL. */
HIRATE_EXPORT int hirate_stats_get(hirate_limiter *lim, hirate_stats *out, size_t size);

/* The HIRATE_LATENCY_BUCKETS - 1 upper bounds of the latency buckets, in µs:
 * 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000,
 * 500000, 1000000. *n (when not NULL) is their number. */
HIRATE_EXPORT const int64_t *hirate_latency_bounds(size_t *n);

/* The HTTP response of a request's limits: the RateLimit and RateLimit-Policy
 * headers (the IETF httpapi rate-limit headers draft, Structured Field
 * lists), the legacy X-RateLimit-* headers, Retry-After, the status and the
 * refusal's text, from each limit's decision. Every web integration (Flask,
 * ASGI, Django, OpenResty) writes them with this, so that they agree
 * (docs/semantics.md, "Response headers"):
 *
 *   RateLimit-Policy  "<name>";q=<capacity>;w=<hirate_refill_seconds>, one
 *                     item per limit, in order, whoever decided
 *   RateLimit         "<name>";r=<remaining>;t=<seconds>, one item per limit
 *                     whose figures are a bucket's (source redis, local or
 *                     cache); a limit decided by on_error "open" or "closed"
 *                     has no bucket behind its figures and no item (no
 *                     header at all when no limit has one). t is until the
 *                     bucket is full for a limit that held the cost (a band
 *                     of a refused call too: it spent nothing and reports its
 *                     own reset time), until the same cost could pass for a
 *                     limit that refused; no t when it never can
 *   X-RateLimit-Limit, -Remaining, -Reset (HIRATE_HEADERS_LEGACY)
 *                     one limit's q, r and t: when refused, the refusing
 *                     limit that waits longest; when allowed, the one with
 *                     the fewest tokens left (of equals, the longest t, then
 *                     the first); only limits with figures, so a response
 *                     whose limit has none has none of the three
 *   Retry-After       a refusal's longest wait, when it can ever pass
 *
 * Seconds are rounded up, so that a client that waits that long is never
 * early. */
typedef struct hirate_response_limit {
    const char *name;       /* the policy's name: 1..HIRATE_BAND_NAME_MAX
                               printable ASCII bytes (a band's rule) */
    int64_t capacity;       /* q */
    double rate;            /* w is hirate_refill_seconds(capacity, rate) */
    const hirate_decision *decision; /* this limit's own (a band's for a band:
                               hirate_allow_bands) */
} hirate_response_limit;

#define HIRATE_HEADERS_RATELIMIT 1  /* RateLimit-Policy and RateLimit */
#define HIRATE_HEADERS_LEGACY 2     /* X-RateLimit-Limit, -Remaining, -Reset */

typedef struct hirate_response {
    int allowed;            /* every limit passed */
    int status;             /* 200; 429 when refused; 503 when every refusal
                               was on_error "closed" while Redis failed (the
                               client did nothing wrong) */
    int64_t retry_after_s;  /* refused: whole seconds until it could pass,
                               rounded up, or -1 when it never can; 0 when
                               allowed */
    /* Header values, NUL-terminated in the caller's buffer; NULL: not sent. */
    const char *ratelimit_policy;
    const char *ratelimit;
    const char *x_ratelimit_limit;
    const char *x_ratelimit_remaining;
    const char *x_ratelimit_reset;
    const char *retry_after;
    /* The refusal, for a body (NULL when allowed): its problem type URI and
     * title (RFC 9457 problem details, the draft's problem types) and text,
     * e.g. "Too many requests; retry in 2 seconds.", which names the limits
     * that refused when there are several ("Too many requests (burst);
     * ..."). */
    const char *problem_type;
    const char *title;
    const char *detail;
} hirate_response;

/* Room enough in buf for a response of n limits. */
#define HIRATE_RESPONSE_SIZE(n) (256 + 480 * (size_t)(n))

/* Writes the response of limits[0 .. n) (n >= 1) with the headers that flags
 * ask for (Retry-After always goes with a refusal that can pass) into *out,
 * its strings into buf. 0; HIRATE_EINVAL for a NULL argument or n of 0,
 * HIRATE_EOPTION for a bad name (a band's rule), HIRATE_ERANGE when len is
 * below HIRATE_RESPONSE_SIZE(n); a message in err, when not NULL. */
HIRATE_EXPORT int hirate_response_format(const hirate_response_limit *limits, size_t n,
                                         int flags, hirate_response *out, char *buf,
                                         size_t len, char *err, size_t errlen);

/* A health check, e.g. for a readiness probe: what one node said. */
#define HIRATE_CHECK_ADDR_MAX 300
typedef struct hirate_check_node {
    char addr[HIRATE_CHECK_ADDR_MAX]; /* "host:port", or the socket's path */
    int rc;                 /* 0: decisions can go to it; else the HIRATE_E*
                               code a decision would meet there (ECONNECT,
                               ETIMEDOUT, EAUTH, ESERVER for a replica...) */
    char role[16];          /* ROLE's first word ("master", "slave"), or ""
                               when it did not answer (or ROLE is denied) */
    int functions;          /* 1: the node runs decisions as FCALL (checked
                               with FUNCTION LIST), 0: as EVALSHA (SCRIPT
                               EXISTS); -1: unknown (no answer) */
    int loaded;             /* 1: hirate's library (or script) is loaded there;
                               0: not yet (the next decision loads it, so the
                               node is still healthy); -1: unknown */
    int64_t latency_us;     /* the round trip of its request, from its send
                               (the connection open, its handshake done) to
                               its last reply; -1 when it did not answer */
    char message[HIRATE_ERRMSG_SIZE]; /* rc's message ("" when rc is 0); never
                               a password */
} hirate_check_node;

/* One round trip to every node decisions go to: the server, each master of
 * a cluster (its slot map asked for first when none is known), the master
 * the sentinels name (asked of them first when none is known). Each gets
 * ROLE and FUNCTION LIST LIBRARYNAME <library> (or SCRIPT EXISTS <sha>),
 * over a connection of the limiter's pool or a new one, within timeout_ms:
 * the breaker does not stop it (it is how an operator asks whether Redis is
 * back), the reconnect backoff does (the node then reports the failure that
 * began it), and hirate_stats does not count it (it is not a decision). nodes[0 .. min(*n, max)) get the nodes,
 * *n their number. Returns 0 when every node is healthy (rc 0), else the
 * first failing node's rc; HIRATE_EINVAL for a NULL limiter, or nodes NULL
 * with max > 0. A limiter without Redis has no node: *n = 0, 0. */
HIRATE_EXPORT int hirate_check(hirate_limiter *lim, hirate_check_node *nodes, size_t max,
                               size_t *n);

/* Client identity: which client an HTTP request comes from, and the bucket
 * key of a client, the same in every language (docs/semantics.md, "Client
 * addresses and keys").
 *
 * Without trusted proxies or proxy hops the client is the socket peer. The
 * header proxies add (X-Forwarded-For, or Forwarded, RFC 7239) is believed
 * only when the peer is a proxy of ours: with trusted proxies ("10.0.0.0/8",
 * "::1", and "unix" for a peer on a Unix socket) it is walked from the
 * right, skipping trusted addresses, and the first other address is the
 * client; with proxy_hops = n the client is the n-th address from the right
 * (the peer must also be trusted when proxies are listed too). A hop that is
 * not an address ends the walk at the nearest address to its right; a
 * request with fewer hops than proxy_hops has its peer as the client.
 * IPv4-mapped IPv6 addresses are IPv4; addresses are written as RFC 5952
 * says; an IPv6 client is keyed by its network of ipv6_subnet bits. */
typedef struct hirate_client_ip hirate_client_ip;

/* Longest address text these functions write, NUL included
 * ("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255/128" fits). */
#define HIRATE_CLIENT_TEXT_MAX 64

/* The ipv6_subnet of a front end whose user gave none: a /64 is what one
 * host (or one home, one customer) gets, so it is one client. */
#define HIRATE_IPV6_SUBNET_DEFAULT 64

/* What hirate_client_ip_resolve and hirate_client_ip_key found. */
enum hirate_client_kind {
    HIRATE_CLIENT_NONE = 0,    /* no client: no peer, and nothing to believe */
    HIRATE_CLIENT_ADDRESS = 1, /* out holds the address (or network) text */
    HIRATE_CLIENT_AS_GIVEN = 2 /* not an address: the text given, as it is */
};

/* Compiles the options: trusted[0 .. ntrusted) (addresses, networks or
 * "unix"; spaces around them ignored), proxy_hops (a whole number from 0 to
 * 64), header ("X-Forwarded-For" or "Forwarded", any case; NULL: the first)
 * and ipv6_subnet (a prefix length from 1 to 128; HIRATE_IPV6_SUBNET_DEFAULT
 * when the user gave none). The numbers
 * are doubles so that a message names what a caller gave ("got 1.5"). 0, or
 * HIRATE_EOPTION with a message naming the bad option or entry, or
 * HIRATE_ENOMEM; *out is NULL on failure. */
HIRATE_EXPORT int hirate_client_ip_new(hirate_client_ip **out, const char *const *trusted,
                                       size_t ntrusted, double proxy_hops, const char *header,
                                       double ipv6_subnet, char *err, size_t errlen);
HIRATE_EXPORT void hirate_client_ip_free(hirate_client_ip *c);
/* The header the options read, "X-Forwarded-For" or "Forwarded"; for c
 * NULL, the one they read when none is given ("X-Forwarded-For"). */
HIRATE_EXPORT const char *hirate_client_ip_header(const hirate_client_ip *c);
/* 1 when the header can change the answer (proxies or hops are set): a
 * caller need not read it otherwise. */
HIRATE_EXPORT int hirate_client_ip_uses_header(const hirate_client_ip *c);
HIRATE_EXPORT int hirate_client_ip_proxy_hops(const hirate_client_ip *c);
HIRATE_EXPORT int hirate_client_ip_ipv6_subnet(const hirate_client_ip *c);

/* The client of a request from its socket peer (peer[0 .. peer_len), NULL
 * or empty for a Unix socket) and the header's field values in the order
 * they came (values[i][0 .. lens[i]), n of them; none: 0). Returns a
 * hirate_client_kind: ADDRESS with the text in out (NUL-terminated; cap at
 * least HIRATE_CLIENT_TEXT_MAX), AS_GIVEN for the peer itself (it is not an
 * address: its text is the client), NONE; or HIRATE_ENOMEM, HIRATE_EINVAL. */
HIRATE_EXPORT int hirate_client_ip_resolve(const hirate_client_ip *c, const char *peer,
                                           size_t peer_len, const char *const *values,
                                           const size_t *lens, size_t n, char *out,
                                           size_t cap);

/* The key of an address for buckets: an IPv6 address by its network
 * ("2001:db8::/64"), another address in its canonical text (ADDRESS, in
 * out as for resolve); AS_GIVEN for text that is not an address; NONE for
 * NULL. */
HIRATE_EXPORT int hirate_client_ip_key(const hirate_client_ip *c, const char *address,
                                       size_t len, char *out, size_t cap);

/* Identities: what a bucket key says whose it is. An address's is
 * "ip:<its key>" ("ip:unknown" for none), a key function's value's is
 * "k:<value>", so no value can name an address's bucket. */
enum hirate_ident_kind { HIRATE_IDENT_ADDRESS = 0, HIRATE_IDENT_KEY = 1 };

/* The identity of value[0 .. len) of kind (a hirate_ident_kind; for an
 * ADDRESS, the key hirate_client_ip_key gave, or NULL) into out: *outlen
 * is its length, written (and NUL-terminated) when out has room for both,
 * so a caller can size a buffer and call again. 0 or HIRATE_EINVAL. */
HIRATE_EXPORT int hirate_ident(int kind, const void *value, size_t len, char *out, size_t cap,
                               size_t *outlen);

/* The bucket key of an identity: "{<ident>}|<scope>|<head>", or "{<ident>}"
 * when scope is NULL (head is then ignored). The identity in braces is a
 * Redis Cluster hash tag, so every bucket of one client is on one node. An
 * identity that would make the key longer than HIRATE_KEY_MAX becomes "#"
 * and its SHA-256 in hex (64 digits), which no identity spells. *outlen
 * and out as for hirate_ident. 0 or HIRATE_EINVAL. */
HIRATE_EXPORT int hirate_bucket_key(const void *ident, size_t ident_len, const char *scope,
                                    size_t scope_len, const char *head, size_t head_len,
                                    char *out, size_t cap, size_t *outlen);

/* The Redis script and its SHA1 (40 hex digits), e.g. to SCRIPT LOAD it. */
HIRATE_EXPORT const char *hirate_script_source(size_t *len);
HIRATE_EXPORT const char *hirate_script_sha1(void);
/* The same script as a Redis Functions library ("#!lua name=hirate_<sha>"
 * around the script's very source), e.g. to FUNCTION LOAD it, and the name
 * of its one function, for FCALL. The name follows the script: a library of
 * another hirate version has another name and is left alone. */
HIRATE_EXPORT const char *hirate_function_library(size_t *len);
HIRATE_EXPORT const char *hirate_function_name(void);

HIRATE_EXPORT const char *hirate_version(void);

#ifdef __cplusplus
}
#endif
#endif /* HIRATE_H */
