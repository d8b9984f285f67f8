/*
 * What a limiter does when Redis fails, and what spares Redis when it works,
 * against a real redis-server started by the harness:
 *
 *   (a) each failure policy (local, open, closed) for each outage (server
 *       killed, stopped with SIGSTOP, out of memory): exact decisions, every
 *       call bounded by the timeout, a handful of connections for a burst of
 *       10,000 decisions, and Redis again soon after it recovers;
 *   (b) the local policy shares the limit between `instances`;
 *   (c) the circuit breaker: microseconds per decision while it is open, one
 *       probe per backoff, the backoff counted from the failure;
 *   (d) configuration errors are returned under every policy and never trip
 *       the breaker;
 *   (e) the deny cache: one Redis call per refill for a hammered key, the very
 *       decisions Redis would give, cleared by reset, bounded, and off when off;
 *   (f) batches: the decisions of single calls, per-item errors, one round
 *       trip, NOSCRIPT inside a batch, and the policy for a batch in an outage.
 *
 * Times are measured on CLOCK_MONOTONIC. Bounds that depend on the machine
 * (scheduling) are loose and say why; every value that is deterministic is
 * compared exactly.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "test_time.h"
#include "hirate.h"
#include "hirate_io.h"
#include "redis_harness.h"

#define CANARY "s3cr3t-canary"
#define MS 1000LL
#define SECOND 1000000LL

/* Options every outage test uses: short timeouts and backoffs keep the whole
 * program well under a minute, and a 20 ms first backoff lets the breaker
 * probe a few times (20, 40, 80 ms ... apart) during a burst of decisions. */
enum { TIMEOUT_MS = 100, CONNECT_MS = 100, BACKOFF_MIN_MS = 20, BACKOFF_MAX_MS = 400 };
/* Scheduling slack on top of a timeout, for a shared (or sanitized) machine. */
enum { SLACK_MS = 150 };
/* The longest the breaker waits: its backoff + 25% jitter. */
#define MAX_WAIT_US ((int64_t)BACKOFF_MAX_MS * MS * 5 / 4)

static rh_server S;   /* the shared server; (a) and (c) kill, stop and starve it */

/* ---- helpers ----------------------------------------------------------------- */

typedef struct cfg {
    int64_t capacity;
    double rate;
    const char *url;        /* NULL: the shared server */
    const char *prefix;     /* NULL: the default */
    int on_error;           /* a hirate_on_error (0 is LOCAL, the default) */
    int instances;          /* 0: the default */
    int timeout_ms, connect_timeout_ms, backoff_min_ms, backoff_max_ms, pool_size;
    int no_deny_cache;      /* 1: deny_cache = 0 */
    size_t deny_cache_keys; /* 0: the default */
} cfg;

static hirate_limiter *make(cfg c)
{
    hirate_options o;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE] = "";
    hirate_options_init(&o);
    o.functions = 0;   /* the EVALSHA path; test_sentinel.c has FCALL's */
    o.url = c.url ? c.url : S.url;
    o.capacity = c.capacity;
    o.rate = c.rate;
    if (c.prefix) o.prefix = c.prefix;
    o.on_error = c.on_error;
    if (c.instances) o.instances = c.instances;
    if (c.timeout_ms) o.timeout_ms = c.timeout_ms;
    if (c.connect_timeout_ms) o.connect_timeout_ms = c.connect_timeout_ms;
    if (c.backoff_min_ms) o.backoff_min_ms = c.backoff_min_ms;
    if (c.backoff_max_ms) o.backoff_max_ms = c.backoff_max_ms;
    if (c.pool_size) o.pool_size = c.pool_size;
    if (c.no_deny_cache) o.deny_cache = 0;
    if (c.deny_cache_keys) o.deny_cache_keys = c.deny_cache_keys;
    int rc = hirate_limiter_new(&lim, &o, why, sizeof why);
    if (rc != 0) fprintf(stderr, "  hirate_limiter_new: %s (%s)\n", hirate_err_name(rc), why);
    CHECK_EQ_I64(rc, 0);
    return lim;
}

/* The options of the outage tests, with a policy and a prefix. */
static cfg outage_cfg(int on_error, const char *prefix)
{
    return (cfg){.capacity = 10, .rate = 0.001, .prefix = prefix, .on_error = on_error,
                 .timeout_ms = TIMEOUT_MS, .connect_timeout_ms = CONNECT_MS,
                 .backoff_min_ms = BACKOFF_MIN_MS, .backoff_max_ms = BACKOFF_MAX_MS};
}

static hirate_counters stats(hirate_limiter *lim)
{
    hirate_counters st;
    memset(&st, 0, sizeof st);
    hirate_counters_get(lim, &st);
    return st;
}

static int allow_s(hirate_limiter *lim, const char *key, int64_t cost, hirate_decision *d)
{
    return hirate_allow(lim, key, strlen(key), cost, d);
}

static int reply_is(redisReply *r, const char *status)
{
    int ok = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, status) == 0;
    if (!ok && r && r->str) fprintf(stderr, "  reply: %s\n", r->str);
    if (r) freeReplyObject(r);
    return ok;
}

/* A loopback URL where nothing listens: every connect is refused at once,
 * as after a crash. (The port was free a moment ago.) */
static void refused_url(char *buf, size_t len)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &alen) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    snprintf(buf, len, "redis://127.0.0.1:%d", port);
}

/* `field` (e.g. "calls") of `cmd`'s line in INFO commandstats; 0 if absent. */
static long long cmdstat(const char *cmd, const char *field)
{
    redisReply *r = rh_command(&S, "INFO commandstats");
    long long v = 0;
    char head[64], key[64];
    snprintf(head, sizeof head, "cmdstat_%s:", cmd);
    snprintf(key, sizeof key, "%s=", field);
    const char *line = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, head) : NULL;
    if (line) {
        const char *eol = strchr(line, '\r');
        for (const char *p = line + strlen(head); p && (!eol || p < eol); p = strchr(p, ',')) {
            if (*p == ',') p++;
            if (strncmp(p, key, strlen(key)) == 0) {
                v = strtoll(p + strlen(key), NULL, 10);
                break;
            }
        }
    }
    if (r) freeReplyObject(r);
    return v;
}

static void load_script(void)
{
    size_t len;
    const char *src = hirate_script_source(&len);
    redisReply *r = rh_command(&S, "SCRIPT LOAD %b", src, len);
    CHECK(r && r->type == REDIS_REPLY_STRING && strcmp(r->str, hirate_script_sha1()) == 0);
    if (r) freeReplyObject(r);
}

/* Peeks at a key nobody uses every 10 ms until Redis decides it again, for at
 * most deadline_ms. Returns the time it took in ms, or -1. */
static double wait_for_redis(hirate_limiter *lim, const char *key, int deadline_ms)
{
    int64_t t0 = mono_us();
    while (mono_us() - t0 < deadline_ms * MS) {
        hirate_decision d = {0};
        memset(&d, 0, sizeof d);
        if (allow_s(lim, key, 0, &d) == 0 && d.source == HIRATE_SOURCE_REDIS)
            return (double)(mono_us() - t0) / MS;
        sleep_ms(10);
    }
    return -1;
}

/* ---- the decisions a policy must give ------------------------------------------- */

/* What one limiter's policy must answer during an outage. For LOCAL it tracks
 * the fallback bucket of one key (rate 0.001/s: under 0.06 tokens refill in a
 * minute, so whole-token values are exact). */
typedef struct expect {
    int policy;
    int64_t capacity;       /* the limiter's */
    int64_t local_cap;      /* LOCAL: the fallback bucket's (capacity / instances) */
    double local_rate;
    int64_t local_left;     /* LOCAL: whole tokens left in the tracked bucket */
    int errors[2];          /* the failures that may be named (0 = none) */
} expect;

/* 1 when d is what e's policy answers for cost, else 0 with the first
 * difference printed (once per `quiet` flag, so a burst does not flood). */
static int policy_ok(expect *e, int rc, const hirate_decision *d, int64_t cost, const char *what,
                     int *printed)
{
    char bad[200] = "";
#define WANT(cond, ...) do { if (!bad[0] && !(cond)) snprintf(bad, sizeof bad, __VA_ARGS__); } while (0)
    WANT(rc == 0, "rc %s", hirate_err_name(rc));
    if (rc == 0) {
        WANT(d->error != 0 && (d->error == e->errors[0] || d->error == e->errors[1]),
             "error %s", hirate_err_name(d->error));
        if (e->policy == HIRATE_ON_ERROR_LOCAL) {
            int allowed = cost <= e->local_left;
            WANT(d->source == HIRATE_SOURCE_LOCAL, "source %s", hirate_source_name(d->source));
            WANT(d->allowed == allowed, "allowed %d", d->allowed);
            if (allowed) e->local_left -= cost;
            WANT(d->limit == e->local_cap, "limit %" PRId64, d->limit);
            WANT(d->remaining == e->local_left, "remaining %" PRId64 " (want %" PRId64 ")",
                 d->remaining, e->local_left);
            /* Until the tokens exist, less what refilled meanwhile (under a
             * minute's worth); +1 us for the rounding up. */
            double per_token = 1e6 / e->local_rate;
            double retry = (double)(cost - e->local_left) * per_token;
            double reset = (double)(e->local_cap - e->local_left) * per_token;
            if (cost > e->local_cap)
                WANT(d->retry_after_us == HIRATE_NEVER, "retry %" PRId64, d->retry_after_us);
            else if (allowed)
                WANT(d->retry_after_us == 0, "retry %" PRId64, d->retry_after_us);
            else
                WANT(d->retry_after_us <= retry + 1 && d->retry_after_us > retry - 60e6,
                     "retry %" PRId64 " (want about %.0f)", d->retry_after_us, retry);
            WANT(d->reset_after_us <= reset + 1 && d->reset_after_us > reset - 60e6,
                 "reset %" PRId64 " (want about %.0f)", d->reset_after_us, reset);
        } else if (e->policy == HIRATE_ON_ERROR_OPEN) {
            int never = cost > e->capacity;
            WANT(d->source == HIRATE_SOURCE_FAIL_OPEN, "source %s", hirate_source_name(d->source));
            WANT(d->allowed == !never, "allowed %d", d->allowed);
            WANT(d->limit == e->capacity, "limit %" PRId64, d->limit);
            WANT(d->remaining == (never ? 0 : e->capacity - cost), "remaining %" PRId64,
                 d->remaining);
            WANT(d->retry_after_us == (never ? HIRATE_NEVER : 0), "retry %" PRId64,
                 d->retry_after_us);
            WANT(d->reset_after_us == 0, "reset %" PRId64, d->reset_after_us);
        } else {
            int never = cost > e->capacity;
            WANT(d->source == HIRATE_SOURCE_FAIL_CLOSED, "source %s",
                 hirate_source_name(d->source));
            /* Nothing passes but a cost of 0, which spends nothing. */
            WANT(d->allowed == (cost == 0), "allowed %d", d->allowed);
            WANT(d->limit == e->capacity, "limit %" PRId64, d->limit);
            WANT(d->remaining == 0, "remaining %" PRId64, d->remaining);
            if (never)
                WANT(d->retry_after_us == HIRATE_NEVER, "retry %" PRId64, d->retry_after_us);
            else if (cost == 0)
                WANT(d->retry_after_us == 0, "retry %" PRId64, d->retry_after_us);
            else
                WANT(d->retry_after_us >= 1 && d->retry_after_us <= MAX_WAIT_US,
                     "retry %" PRId64, d->retry_after_us);
            /* Come back when Redis may answer: reset_after is that wait, and
             * so is retry_after unless the cost can never pass. */
            WANT(d->reset_after_us >= 1 && d->reset_after_us <= MAX_WAIT_US,
                 "reset %" PRId64, d->reset_after_us);
            if (!never && cost > 0)
                WANT(d->reset_after_us == d->retry_after_us,
                     "reset %" PRId64 " != retry %" PRId64, d->reset_after_us,
                     d->retry_after_us);
        }
    }
#undef WANT
    if (bad[0] && !*printed) {
        *printed = 1;
        fprintf(stderr, "  %s, policy %s, cost %" PRId64 ": %s\n", what,
                hirate_on_error_name(e->policy), cost, bad);
    }
    return !bad[0];
}

/* ---- (a) each policy for each outage ----------------------------------------------- */

enum outage { KILLED, STOPPED, OOM };
static const char *const outage_names[] = {"killed", "stopped", "oom"};

static void begin_outage(int o)
{
    if (o == KILLED) rh_kill(&S);
    if (o == STOPPED) rh_pause(&S);
    if (o == OOM) CHECK(reply_is(rh_command(&S, "CONFIG SET maxmemory 1"), "OK"));
}

static void end_outage(int o)
{
    if (o == KILLED) CHECK_EQ_I64(rh_restart(&S), 0);
    if (o == STOPPED) rh_resume(&S);
    if (o == OOM) CHECK(reply_is(rh_command(&S, "CONFIG SET maxmemory 0"), "OK"));
}

/* Connections the server has accepted (the one that asks included). */
static long long server_connections(void)
{
    return rh_info_int(&S, "total_connections_received");
}

static void policy_decides_during_an_outage(int policy, int o)
{
    enum { BURST = 10000 };
    char prefix[64], what[96];
    snprintf(prefix, sizeof prefix, "pol:%s:%s:", hirate_on_error_name(policy), outage_names[o]);
    snprintf(what, sizeof what, "%s server, on_error %s", outage_names[o],
             hirate_on_error_name(policy));
    hirate_limiter *lim = make(outage_cfg(policy, prefix));
    hirate_decision d = {0};
    if (!lim) return;
    load_script();
    /* A pooled connection to break. */
    CHECK_EQ_I64(allow_s(lim, "warm", 1, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);

    expect e = {policy, 10, 10, 0.001, 10, {0, 0}};
    if (o == KILLED) { e.errors[0] = HIRATE_EIO; e.errors[1] = HIRATE_ECONNECT; }
    if (o == STOPPED) e.errors[0] = HIRATE_ETIMEDOUT;
    if (o == OOM) e.errors[0] = HIRATE_ESERVER;   /* only a write meets OOM: "k" is fresh */

    hirate_counters st0 = stats(lim);
    long long conns0 = o == KILLED ? 0 : server_connections();
    int printed = 0;
    begin_outage(o);

    /* The first call goes to Redis and fails (after the whole timeout when
     * the server is stopped); the policy answers. */
    memset(&d, 0, sizeof d);
    int64_t t0 = mono_us();
    int rc = allow_s(lim, "k", 1, &d);
    double dt = (double)(mono_us() - t0) / MS;
    printf("  %s: first call %.1f ms, %s, error %s\n", what, dt, hirate_source_name(d.source),
           hirate_err_name(d.error));
    CHECK(policy_ok(&e, rc, &d, 1, what, &printed));
    /* The pooled connection is found closed before the call goes out on it,
     * and a new one is refused. */
    if (o == KILLED) CHECK_EQ_I64(d.error, HIRATE_ECONNECT);
    if (o == STOPPED) CHECK(dt >= TIMEOUT_MS * 0.8);
    CHECK(dt <= TIMEOUT_MS + SLACK_MS);
    hirate_counters st1 = stats(lim);
    CHECK_EQ_I64(st1.breaker_opens, 1);

    /* A cost above the capacity: never, whatever the policy. */
    rc = allow_s(lim, "k", 11, &d);
    CHECK(policy_ok(&e, rc, &d, 11, what, &printed));

    /* A burst: every decision by the policy, each bounded by the timeout. */
    int bad = 0, allowed = 0, sent_calls = 0;
    double worst = 0;
    int64_t b0 = mono_us();
    int n = 0;   /* a deadline, so that a limiter without a breaker fails here, not hangs */
    for (; n < BURST && mono_us() - b0 < 5 * SECOND; n++) {
        hirate_counters sa = stats(lim);
        int64_t c0 = mono_us();
        rc = allow_s(lim, "k", 1, &d);
        double cdt = (double)(mono_us() - c0) / MS;
        hirate_counters sb = stats(lim);
        sent_calls += (int)(sb.evalsha + sb.eval - sa.evalsha - sa.eval);
        if (cdt > worst) worst = cdt;
        bad += !policy_ok(&e, rc, &d, 1, what, &printed);
        allowed += rc == 0 && d.allowed;
    }
    double burst_ms = (double)(mono_us() - b0) / MS;
    hirate_counters st2 = stats(lim);
    long long conns = (long long)(st2.connects - st0.connects);

    end_outage(o);
    /* Not counting the INFO that asks, nor the CONFIG SETs of an OOM. */
    long long server_conns =
        o == KILLED ? -1 : server_connections() - conns0 - 1 - (o == OOM ? 2 : 0);
    printf("  %s: %d decisions in %.1f ms, slowest %.1f ms, %d sent to Redis, "
           "%lld connection attempts (server saw %lld)\n",
           what, n, burst_ms, worst, sent_calls, conns, server_conns);
    CHECK_EQ_I64(n, BURST);
    CHECK_EQ_I64(bad, 0);
    CHECK(worst <= TIMEOUT_MS + SLACK_MS);
    CHECK(conns <= 5);
    if (o != KILLED) CHECK(server_conns >= 0 && server_conns <= 5);
    /* The breaker's probes are the only calls that reach Redis. */
    CHECK(sent_calls <= 5);
    CHECK_EQ_I64(st2.policy - st0.policy, n + 2);
    if (policy == HIRATE_ON_ERROR_LOCAL) CHECK_EQ_I64(allowed, 9);    /* 10 with the first */
    if (policy == HIRATE_ON_ERROR_OPEN) CHECK_EQ_I64(allowed, n);
    if (policy == HIRATE_ON_ERROR_CLOSED) CHECK_EQ_I64(allowed, 0);

    /* Recovery: the next probe, at most 1.25 x 400 ms after the last failure
     * (which was before the recovery), finds Redis. */
    hirate_counters st3 = stats(lim);
    double back = wait_for_redis(lim, "probe", 2000);
    printf("  %s: Redis decides again %.1f ms after the recovery\n", what, back);
    CHECK(back >= 0 && back <= MAX_WAIT_US / MS + SLACK_MS);
    rc = allow_s(lim, "after", 1, &d);
    CHECK_EQ_I64(rc, 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(d.error, 0);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.remaining, 9);
    hirate_counters st4 = stats(lim);
    /* A restarted server forgot the script: one EVAL, then EVALSHA again. */
    CHECK_EQ_I64(st4.eval - st3.eval, o == KILLED ? 1 : 0);
    hirate_limiter_free(lim);
}

static void test_each_policy_decides_each_outage_and_redis_returns(void)
{
    static const int policies[] = {HIRATE_ON_ERROR_LOCAL, HIRATE_ON_ERROR_OPEN,
                                   HIRATE_ON_ERROR_CLOSED};
    for (int o = KILLED; o <= OOM; o++)
        for (int p = 0; p < 3; p++)
            policy_decides_during_an_outage(policies[p], o);
}

/* ---- (b) the local policy shares the limit between instances ------------------------ */

static void test_local_policy_divides_capacity_and_rate_by_instances(void)
{
    static const struct { int instances; int64_t share; } cases[] = {
        {1, 100}, {3, 33}, {4, 25}, {200, 1},   /* rounded down, at least 1 */
    };
    char url[64];
    refused_url(url, sizeof url);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        hirate_limiter *lim = make((cfg){.capacity = 100, .rate = 0.001, .url = url,
                                         .instances = cases[c].instances});
        if (!lim) continue;
        expect e = {HIRATE_ON_ERROR_LOCAL, 100, cases[c].share, 0.001 / cases[c].instances,
                    cases[c].share, {HIRATE_ECONNECT, 0}};
        int bad = 0, allowed = 0, printed = 0;
        char what[64];
        snprintf(what, sizeof what, "refused connection, instances %d", cases[c].instances);
        for (int i = 0; i < 150; i++) {
            hirate_decision d = {0};
            int rc = allow_s(lim, "shared", 1, &d);
            bad += !policy_ok(&e, rc, &d, 1, what, &printed);
            allowed += rc == 0 && d.allowed;
        }
        CHECK_EQ_I64(bad, 0);
        CHECK_EQ_I64(allowed, cases[c].share);
        hirate_limiter_free(lim);
    }
}

/* ---- (c) the circuit breaker ---------------------------------------------------------- */

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Without a breaker every call to a stopped server would wait its 100 ms
 * timeout; with it, only the probes (one per backoff) do. */
static void test_breaker_open_decides_in_microseconds(void)
{
    enum { N = 10000 };
    static int64_t took[N];   /* ns */
    hirate_limiter *lim = make(outage_cfg(HIRATE_ON_ERROR_LOCAL, "brk-fast:"));
    hirate_decision d = {0};
    if (!lim) return;
    CHECK_EQ_I64(allow_s(lim, "warm", 1, &d), 0);
    rh_pause(&S);
    int n = 0;
    int64_t end = mono_us() + 3 * SECOND;   /* without a breaker: ~30 calls, not 10,000 */
    for (; n < N && mono_us() < end; n++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", n % 100);
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int rc = allow_s(lim, key, 1, &d);
        clock_gettime(CLOCK_MONOTONIC, &b);
        took[n] = (int64_t)(b.tv_sec - a.tv_sec) * 1000000000 + (b.tv_nsec - a.tv_nsec);
        if (rc != 0 || d.source != HIRATE_SOURCE_LOCAL) took[n] = INT64_MAX / 2;
    }
    rh_resume(&S);
    CHECK_EQ_I64(n, N);
    qsort(took, (size_t)n, sizeof took[0], cmp_i64);
    double median = n ? took[n / 2] / 1e3 : -1, p99 = n ? took[n * 99 / 100] / 1e3 : -1;
    printf("  breaker open (SIGSTOP, local policy): %d decisions, median %.2f us, p99 %.2f us,"
           " max %.0f us\n", n, median, p99, n ? took[n - 1] / 1e3 : -1);
    CHECK(p99 < 2000);   /* loose: the machine is shared; expect a few us */
    CHECK(wait_for_redis(lim, "probe", 2000) >= 0);
    hirate_limiter_free(lim);
}

typedef struct hammer {
    hirate_limiter *lim;
    int64_t until_us;
    pthread_barrier_t *barrier;
    int calls, bad;
    int policy_error;       /* the failure the decisions must name */
} hammer;

static void *hammer_main(void *arg)
{
    hammer *h = arg;
    pthread_barrier_wait(h->barrier);
    while (mono_us() < h->until_us) {
        hirate_decision d = {0};
        int rc = allow_s(h->lim, "hammered", 1, &d);
        h->bad += rc != 0 || d.source != HIRATE_SOURCE_FAIL_CLOSED || d.error != h->policy_error;
        h->calls++;
    }
    return NULL;
}

/* 8 threads hammer for ~1 s with backoff_min = backoff_max = 200 ms. Returns
 * the connection attempts from the failure that opened the breaker on; *t_ms
 * is the time since that failure, *sent the script calls sent meanwhile. */
static uint64_t hammer_for_a_second(hirate_limiter *lim, int error, double *t_ms, uint64_t *sent)
{
    enum { THREADS = 8 };
    hammer h[THREADS];
    pthread_t t[THREADS];
    pthread_barrier_t barrier;
    hirate_decision d = {0};
    /* One failure opens the breaker before the threads start: calls already
     * under way when it opens may all reach Redis, which is not what this
     * counts. */
    hirate_counters st0 = stats(lim);
    int64_t opened = mono_us();
    int rc = allow_s(lim, "hammered", 1, &d);
    CHECK_EQ_I64(rc, 0);
    CHECK_EQ_I64(d.error, error);
    CHECK_EQ_I64(stats(lim).breaker_opens, 1);
    pthread_barrier_init(&barrier, NULL, THREADS);
    int64_t until = opened + SECOND;
    int calls = 0, bad = 0;
    for (int i = 0; i < THREADS; i++) {
        h[i] = (hammer){lim, until, &barrier, 0, 0, error};
        if (pthread_create(&t[i], NULL, hammer_main, &h[i]) != 0) abort();
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        calls += h[i].calls;
        bad += h[i].bad;
    }
    pthread_barrier_destroy(&barrier);
    *t_ms = (double)(mono_us() - opened) / MS;
    CHECK_EQ_I64(bad, 0);
    CHECK(calls > 1000);
    hirate_counters st1 = stats(lim);
    *sent = st1.evalsha + st1.eval - st0.evalsha - st0.eval;
    return st1.connects - st0.connects;
}

typedef struct after {
    hirate_limiter *lim;
    pthread_barrier_t *barrier;
    int not_redis;
} after;

static void *after_main(void *arg)
{
    after *a = arg;
    pthread_barrier_wait(a->barrier);
    for (int i = 0; i < 200; i++) {
        hirate_decision d = {0};
        a->not_redis += allow_s(a->lim, "after", 0, &d) != 0 || d.source != HIRATE_SOURCE_REDIS;
    }
    return NULL;
}

/* Decisions that 8 threads at once did not get from Redis (0 once the
 * breaker has closed again). */
static int not_from_redis_under_threads(hirate_limiter *lim)
{
    enum { THREADS = 8 };
    after a[THREADS];
    pthread_t t[THREADS];
    pthread_barrier_t barrier;
    int sum = 0;
    pthread_barrier_init(&barrier, NULL, THREADS);
    for (int i = 0; i < THREADS; i++) {
        a[i] = (after){lim, &barrier, 0};
        if (pthread_create(&t[i], NULL, after_main, &a[i]) != 0) abort();
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        sum += a[i].not_redis;
    }
    pthread_barrier_destroy(&barrier);
    return sum;
}

/*
 * One probe per backoff. With backoff_min = backoff_max = 200 ms and ±25%
 * jitter, a probe is let through no sooner than 150 ms after the call that
 * failed before it started, and no later than 250 ms (plus scheduling) once
 * 8 threads keep asking. Over T ms from the failure that opened the breaker
 * (1 connection attempt), at most floor(T / 150) probes follow: at most
 * 1 + floor(T / 150) attempts, 7 for T = 1 s. At least 3 probes start by
 * T = 1 s even with ~80 ms of scheduling delay each, and redis.c's own
 * reconnect backoff (10, 20, 40 ms after the 1st, 2nd, 3rd failed connect) is
 * shorter than 150 ms, so each of them connects: at least 4 attempts; 3 is
 * asserted. Several probes at once, or none at all, fall outside.
 */
static void test_breaker_lets_one_probe_through_per_backoff(void)
{
    char url[64];
    refused_url(url, sizeof url);
    cfg c = outage_cfg(HIRATE_ON_ERROR_CLOSED, "brk-probe:");
    c.url = url;
    c.backoff_min_ms = c.backoff_max_ms = 200;
    hirate_limiter *lim = make(c);
    if (!lim) return;
    double t_ms;
    uint64_t sent;
    uint64_t conns = hammer_for_a_second(lim, HIRATE_ECONNECT, &t_ms, &sent);
    uint64_t most = 1 + (uint64_t)(t_ms / 150);
    printf("  refused connection, 8 threads for %.0f ms: %" PRIu64
           " connection attempts (allowed 3..%" PRIu64 ")\n", t_ms, conns, most);
    CHECK(conns >= 3 && conns <= most);
    CHECK_EQ_I64(sent, 0);   /* nothing ever connected */
    hirate_limiter_free(lim);

    /* A stopped server: connects succeed (the kernel accepts), so redis.c's
     * reconnect backoff never applies and the breaker alone keeps the
     * threads away. Each probe reconnects and waits its 100 ms timeout; the
     * same bounds hold (a probe also lasts 100 ms, which only spaces them
     * further: at least floor(1000 / 350) = 2 probes). Without the breaker,
     * 8 threads would each time out every 100 ms: ~80 attempts. */
    c.url = NULL;
    c.prefix = "brk-probe-stop:";
    lim = make(c);
    if (!lim) return;
    rh_pause(&S);
    conns = hammer_for_a_second(lim, HIRATE_ETIMEDOUT, &t_ms, &sent);
    rh_resume(&S);
    most = 1 + (uint64_t)(t_ms / 150);
    printf("  stopped server, 8 threads for %.0f ms: %" PRIu64 " connection attempts, %" PRIu64
           " calls sent (allowed 3..%" PRIu64 ")\n", t_ms, conns, sent, most);
    CHECK(conns >= 3 && conns <= most);
    /* Each probe reconnects, and the new connection's handshake (its PING)
     * times out: no call is ever sent to a server that cannot answer. */
    CHECK_EQ_I64(sent, 0);
    CHECK(wait_for_redis(lim, "probe", 2000) >= 0);
    /* Closed again: threads at once all reach Redis, none meets the policy. */
    CHECK_EQ_I64(not_from_redis_under_threads(lim), 0);
    hirate_limiter_free(lim);
}

/* The backoff starts when the failure is known, not when the failing call
 * started: a call that waited out a 150 ms timeout is followed by at least
 * 75 ms (100 ms - 25%) of decisions that leave Redis alone. */
static void test_breaker_backoff_starts_when_the_failure_is_known(void)
{
    cfg c = outage_cfg(HIRATE_ON_ERROR_CLOSED, "brk-after:");
    c.timeout_ms = 150;
    c.backoff_min_ms = c.backoff_max_ms = 100;
    hirate_limiter *lim = make(c);
    hirate_decision d = {0};
    if (!lim) return;
    CHECK_EQ_I64(allow_s(lim, "warm", 1, &d), 0);
    rh_pause(&S);
    int64_t t0 = mono_us();
    int rc = allow_s(lim, "k", 1, &d);
    int64_t first_ms = (mono_us() - t0) / MS;
    int64_t retry = d.retry_after_us;
    hirate_counters sa = stats(lim);
    t0 = mono_us();
    int rc2 = allow_s(lim, "k", 1, &d);
    int64_t second_ms = (mono_us() - t0) / MS;
    hirate_counters sb = stats(lim);
    rh_resume(&S);
    printf("  timeout 150 ms, backoff 100 ms: first call %" PRId64 " ms (retry_after %" PRId64
           " us), the next %" PRId64 " ms, %" PRIu64 " sent\n", first_ms, retry, second_ms,
           sb.evalsha - sa.evalsha);
    CHECK_EQ_I64(rc, 0);
    CHECK(first_ms >= 120);
    /* The closed policy's retry_after is the rest of the backoff, 75..125 ms. */
    CHECK(retry >= 75 * MS - 5 * MS && retry <= 125 * MS);
    CHECK_EQ_I64(rc2, 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_FAIL_CLOSED);
    CHECK_EQ_I64(sb.evalsha - sa.evalsha, 0);   /* the second call was not a probe */
    CHECK(second_ms < 50);
    CHECK(wait_for_redis(lim, "probe", 2000) >= 0);
    hirate_limiter_free(lim);
}

/* Each failed probe doubles the backoff, from backoff_min_ms up to
 * backoff_max_ms, each wait jittered by ±25%. The closed policy's
 * retry_after_us shows it: it counts down, and jumps up at every failure. */
static void test_breaker_backoff_doubles_up_to_the_maximum(void)
{
    static const int want_ms[] = {50, 100, 200, 400, 400};
    enum { WANT = sizeof want_ms / sizeof want_ms[0] };
    char url[64];
    refused_url(url, sizeof url);
    cfg c = outage_cfg(HIRATE_ON_ERROR_CLOSED, NULL);
    c.url = url;
    c.backoff_min_ms = 50;
    c.backoff_max_ms = 400;
    hirate_limiter *lim = make(c);
    if (!lim) return;
    int64_t waits[16], last = 0;
    int n = 0, bad = 0;
    int64_t t0 = mono_us();
    while (n < WANT && mono_us() - t0 < 3 * SECOND) {
        hirate_decision d = {0};
        int rc = allow_s(lim, "k", 1, &d);
        bad += rc != 0 || d.source != HIRATE_SOURCE_FAIL_CLOSED || d.error != HIRATE_ECONNECT;
        if (rc == 0 && d.retry_after_us > last) waits[n++] = d.retry_after_us;   /* a failure */
        last = d.retry_after_us;
        sleep_ms(2);
    }
    printf("  backoff 50..400 ms: waits after each failure");
    for (int i = 0; i < n; i++) printf(" %.1f", (double)waits[i] / MS);
    printf(" ms\n");
    CHECK_EQ_I64(bad, 0);
    CHECK_EQ_I64(n, WANT);
    for (int i = 0; i < n && i < WANT; i++) {
        if (waits[i] < want_ms[i] * MS * 3 / 4 - 3 * MS || waits[i] > want_ms[i] * MS * 5 / 4)
            fprintf(stderr, "  failure %d: waited %" PRId64 " us, not %d ms +-25%%\n", i,
                    waits[i], want_ms[i]);
        /* -3 ms: the call that reports it may start a little after the failure */
        CHECK(waits[i] >= want_ms[i] * MS * 3 / 4 - 3 * MS && waits[i] <= want_ms[i] * MS * 5 / 4);
    }
    CHECK_EQ_I64(stats(lim).breaker_opens, 1);   /* opened once, stayed open */
    hirate_limiter_free(lim);
}

/* ---- (d) configuration errors are returned, not hidden ---------------------------------- */

static void test_configuration_errors_are_returned_under_every_policy(void)
{
    static const int policies[] = {HIRATE_ON_ERROR_LOCAL, HIRATE_ON_ERROR_OPEN,
                                   HIRATE_ON_ERROR_CLOSED};
    CHECK(reply_is(rh_command(&S, "ACL SETUSER pol-ok on >%s ~* &* +@all", CANARY), "OK"));
    CHECK(reply_is(rh_command(&S, "ACL SETUSER pol-noeval on >%s ~* &* +@all -evalsha -eval",
                              CANARY), "OK"));
    CHECK(reply_is(rh_command(&S, "ACL SETUSER pol-otherkeys on >%s ~other:* &* +@all",
                              CANARY), "OK"));
    static const struct { const char *rule, *user, *pass; int rc; } cases[] = {
        {"the right password works", "pol-ok", CANARY, 0},
        {"a wrong password is EAUTH", "pol-ok", "wrong-" CANARY, HIRATE_EAUTH},
        {"a user who may not run scripts is ENOPERM", "pol-noeval", CANARY, HIRATE_ENOPERM},
        {"a user who may not touch the keys is ENOPERM", "pol-otherkeys", CANARY, HIRATE_ENOPERM},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int p = 0; p < 3; p++) {
            char url[256], key[32];
            snprintf(url, sizeof url, "redis://%s:%s@127.0.0.1:%d", cases[c].user, cases[c].pass,
                     S.port);
            cfg o = outage_cfg(policies[p], NULL);
            o.url = url;
            hirate_limiter *lim = make(o);
            if (!lim) continue;
            int bad = 0;
            for (int i = 0; i < 5; i++) {   /* again and again: never the policy */
                hirate_decision d = {0};
                snprintf(key, sizeof key, "cfg-%d", i);
                int rc = allow_s(lim, key, 1, &d);
                if (rc != cases[c].rc || (rc == 0 && d.source != HIRATE_SOURCE_REDIS)) {
                    if (!bad)
                        fprintf(stderr, "  %s, on_error %s: call %d gave %s (%s)\n",
                                cases[c].rule, hirate_on_error_name(policies[p]), i,
                                hirate_err_name(rc), hirate_source_name(d.source));
                    bad++;
                }
            }
            /* A batch: each item gets the error. */
            hirate_item items[3] = {{"cfg-a", 5, 1, 0, {0}}, {"cfg-b", 5, 1, 0, {0}},
                                    {"cfg-a", 5, 1, 0, {0}}};
            CHECK_EQ_I64(hirate_allow_many(lim, items, 3), 0);
            for (int i = 0; i < 3; i++) bad += items[i].rc != cases[c].rc;
            CHECK_EQ_I64(bad, 0);
            hirate_counters st = stats(lim);
            CHECK_EQ_I64(st.breaker_opens, 0);
            CHECK_EQ_I64(st.policy, 0);
            char msg[HIRATE_ERRMSG_SIZE];
            hirate_limiter_errmsg(lim, msg, sizeof msg);
            CHECK(strstr(msg, "s3cr3t") == NULL);
            hirate_limiter_free(lim);
        }
    }
}

/* ---- (e) the deny cache --------------------------------------------------------------------- */

/* capacity 5, rate 10/s, as fast as one thread can ask for ~1 s: Redis sees
 * the first burst, then the call that takes each refilled token (100 ms
 * apart); the cache refuses the rest with Redis' own numbers.
 *
 * The cache places a reply's state on our clock by the least (Redis time -
 * send time) it has seen, the tightest bound on how far Redis' clock is
 * ahead. Until that bound has settled (the first replies), a call may still
 * go to Redis a latency too early and be refused by microseconds: a couple
 * at most, then exactly one Redis call per refill. */
static void test_deny_cache_spares_redis_all_but_one_call_per_refill(void)
{
    enum { CAPACITY = 5 };
    const double rate = 10;
    hirate_limiter *lim = make((cfg){.capacity = CAPACITY, .rate = rate, .prefix = "dc-hammer:"});
    if (!lim) return;
    load_script();
    hirate_counters st0 = stats(lim);
    long long calls = 0, allowed = 0, cached = 0, redis_refused = 0, bad = 0;
    int64_t t0 = mono_us();
    while (mono_us() - t0 < SECOND) {
        hirate_decision d = {0};
        int rc = allow_s(lim, "hot", 1, &d);
        calls++;
        allowed += rc == 0 && d.allowed;
        cached += rc == 0 && d.source == HIRATE_SOURCE_CACHE;
        redis_refused += rc == 0 && d.source == HIRATE_SOURCE_REDIS && !d.allowed;
        /* A cached answer is a refusal that says when to come back. */
        bad += rc != 0 || (d.source == HIRATE_SOURCE_CACHE &&
                           (d.allowed || d.remaining != 0 || d.retry_after_us < 1 ||
                            d.retry_after_us > 100 * MS || d.limit != CAPACITY));
    }
    double secs = (double)(mono_us() - t0) / SECOND;
    hirate_counters st1 = stats(lim);
    uint64_t redis_calls = st1.evalsha + st1.eval - st0.evalsha - st0.eval;
    printf("  deny cache, capacity 5 at 10/s for %.2f s: %lld calls, %lld allowed, %lld from "
           "the cache, %" PRIu64 " to Redis (%lld of them refused)\n", secs, calls, allowed,
           cached, redis_calls, redis_refused);
    CHECK_EQ_I64(bad, 0);
    /* Every allowed call, and hardly any refusal. */
    CHECK_EQ_I64(redis_calls, allowed + redis_refused);
    CHECK(redis_refused <= 2);
    CHECK((double)redis_calls <= CAPACITY + secs * rate + 3);
    CHECK_EQ_I64(redis_calls + (uint64_t)cached, calls);
    CHECK_EQ_I64(st1.cache_hits - st0.cache_hits, cached);
    /* Safe, and not stingier than Redis: about one per refill got through. */
    CHECK(allowed <= CAPACITY + secs * rate + 1);
    CHECK(allowed >= CAPACITY + (long long)(secs * rate) - 1);
    hirate_limiter_free(lim);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(uint64_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng % n;
}

/* The same random calls at the same injected times against two limiters, one
 * with the deny cache and one without (separate prefixes, so separate
 * buckets): every field agrees, only the source may say cache instead of
 * redis. Time sometimes jumps to exactly the moment a refusal named, or one
 * microsecond before it, where a cache that is off by one would show. */
static void test_deny_cache_gives_exactly_the_decisions_redis_gives(void)
{
    enum { STEPS = 4000, KEYS = 3 };
    hirate_limiter *on = make((cfg){.capacity = 5, .rate = 2, .prefix = "dc-eq-on:"});
    hirate_limiter *off = make((cfg){.capacity = 5, .rate = 2, .prefix = "dc-eq-off:",
                                     .no_deny_cache = 1});
    if (!on || !off) {
        hirate_limiter_free(on);
        hirate_limiter_free(off);
        return;
    }
    load_script();
    static const char *const keys[KEYS] = {"a", "b", "c"};
    int64_t t = 1700000000 * SECOND;
    int64_t retry_at[KEYS] = {0};
    int bad = 0, cached = 0, redis = 0, edges = 0, allowed_at_edge = 0, refused = 0;
    for (int i = 0; i < STEPS; i++) {
        int k = (int)rnd(KEYS);
        uint64_t op = rnd(100);
        if (op < 22) {                              /* time passes */
            uint64_t how = rnd(4);
            if (how == 0 && retry_at[k] > t) { t = retry_at[k]; edges++; }
            else if (how == 1 && retry_at[k] > t + 1) { t = retry_at[k] - 1; edges++; }
            else t += (int64_t)rnd(300000);
            continue;
        }
        if (op < 25) {                              /* reset */
            int ra = hirate_reset(on, keys[k], 1), rb = hirate_reset(off, keys[k], 1);
            bad += ra != 0 || rb != 0;
            retry_at[k] = 0;
            continue;
        }
        int spend = op < 80;
        int64_t cost = 1 + (int64_t)rnd(3);
        hirate_decision a, b;
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        int ra = hirate_decide_at(on, keys[k], 1, cost, spend, t, &a);
        int rb = hirate_decide_at(off, keys[k], 1, cost, spend, t, &b);
        int same = ra == 0 && rb == 0 && a.allowed == b.allowed && a.remaining == b.remaining &&
                   a.limit == b.limit && a.retry_after_us == b.retry_after_us &&
                   a.reset_after_us == b.reset_after_us && a.time_us == b.time_us &&
                   a.error == 0 && b.error == 0 && b.source == HIRATE_SOURCE_REDIS &&
                   (a.source == HIRATE_SOURCE_REDIS ||
                    (a.source == HIRATE_SOURCE_CACHE && !a.allowed));
        if (!same && bad++ < 5)
            fprintf(stderr, "  step %d t=%" PRId64 " %s(%s, %" PRId64 "): on %s/%s a=%d r=%" PRId64
                    " retry=%" PRId64 " reset=%" PRId64 " t=%" PRId64 "; off %s/%s a=%d r=%" PRId64
                    " retry=%" PRId64 " reset=%" PRId64 " t=%" PRId64 "\n", i, t,
                    spend ? "allow" : "peek", keys[k], cost, hirate_err_name(ra),
                    hirate_source_name(a.source), a.allowed, a.remaining, a.retry_after_us,
                    a.reset_after_us, a.time_us, hirate_err_name(rb),
                    hirate_source_name(b.source), b.allowed, b.remaining, b.retry_after_us,
                    b.reset_after_us, b.time_us);
        cached += a.source == HIRATE_SOURCE_CACHE;
        redis += a.source == HIRATE_SOURCE_REDIS;
        if (t == retry_at[k]) allowed_at_edge += b.allowed;
        if (rb == 0 && !b.allowed) {
            refused++;
            if (b.retry_after_us != HIRATE_NEVER) retry_at[k] = t + b.retry_after_us;
        }
    }
    hirate_counters sa = stats(on), sb = stats(off);
    printf("  deny cache equivalence: %d steps, %d refusals, %d answered by the cache, %d by "
           "Redis, %d jumps to a retry moment (%d allowed there)\n",
           STEPS, refused, cached, redis, edges, allowed_at_edge);
    CHECK_EQ_I64(bad, 0);
    CHECK(cached >= 200);           /* the comparison did cover the cache */
    CHECK(allowed_at_edge >= 20);   /* and the moments where it must let go */
    CHECK_EQ_I64(sa.cache_hits, cached);
    CHECK_EQ_I64(sb.cache_hits, 0);
    CHECK_EQ_I64(sb.cache_keys, 0);
    CHECK_EQ_I64(sa.evalsha + sa.eval, redis);
    hirate_limiter_free(on);
    hirate_limiter_free(off);
}

static void test_reset_clears_the_deny_cache(void)
{
    hirate_limiter *lim = make((cfg){.capacity = 2, .rate = 0.001, .prefix = "dc-reset:"});
    hirate_decision d = {0};
    if (!lim) return;
    CHECK_EQ_I64(allow_s(lim, "r", 2, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(d.remaining, 0);
    CHECK_EQ_I64(allow_s(lim, "r", 1, &d), 0);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_CACHE);   /* the reply above proved it */
    CHECK_EQ_I64(stats(lim).cache_keys, 1);
    CHECK_EQ_I64(hirate_reset(lim, "r", 1), 0);
    CHECK_EQ_I64(stats(lim).cache_keys, 0);
    CHECK_EQ_I64(allow_s(lim, "r", 1, &d), 0);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(d.remaining, 1);
    hirate_limiter_free(lim);
}

static long long exists(const char *key)
{
    redisReply *r = rh_command(&S, "EXISTS %s", key);
    long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r) freeReplyObject(r);
    return n;
}

/* A refund gives tokens back in Redis, capped at the capacity, and makes the
 * deny cache forget the key: the refusal it foretold is not served after. */
static void test_refund_gives_back_and_clears_the_deny_cache(void)
{
    hirate_limiter *lim = make((cfg){.capacity = 3, .rate = 0.001, .prefix = "rf:"});
    hirate_decision d = {0};
    char msg[HIRATE_ERRMSG_SIZE];
    if (!lim) return;
    CHECK_EQ_I64(exists("rf:fresh"), 0);
    CHECK_EQ_I64(hirate_refund(lim, "fresh", 5, 2, &d), 0);   /* full, and stays so */
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(d.remaining, 3);
    CHECK_EQ_I64(d.reset_after_us, 0);
    CHECK_EQ_I64(exists("rf:fresh"), 0);                      /* nothing written */

    CHECK_EQ_I64(allow_s(lim, "r", 3, &d), 0);
    CHECK_EQ_I64(d.remaining, 0);
    CHECK_EQ_I64(allow_s(lim, "r", 1, &d), 0);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_CACHE);
    CHECK_EQ_I64(stats(lim).cache_keys, 1);
    uint64_t hits = stats(lim).cache_hits;

    CHECK_EQ_I64(hirate_refund(lim, "r", 1, 2, &d), 0);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(d.remaining, 2);
    CHECK_EQ_I64(d.retry_after_us, 0);
    CHECK_EQ_I64(stats(lim).cache_keys, 0);
    CHECK_EQ_I64(allow_s(lim, "r", 1, &d), 0);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(d.remaining, 1);
    CHECK_EQ_I64(allow_s(lim, "r", 1, &d), 0);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.remaining, 0);
    CHECK_EQ_I64(allow_s(lim, "r", 1, &d), 0);
    CHECK_EQ_I64(d.allowed, 0);
    /* Foretold again, from the reply of the allow that emptied it. */
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_CACHE);
    CHECK_EQ_I64(stats(lim).cache_hits, hits + 1);

    /* Capped: every band full again, and the key is gone (a missing key is
     * a full bucket), written by one DEL. */
    CHECK_EQ_I64(exists("rf:r"), 1);
    hirate_decision bands[1];
    CHECK_EQ_I64(hirate_refund_bands(lim, "r", 1, 100, &d, bands, 1), 0);
    CHECK_EQ_I64(d.remaining, 3);
    CHECK_EQ_I64(bands[0].remaining, 3);
    CHECK_EQ_I64(d.reset_after_us, 0);
    CHECK_EQ_I64(exists("rf:r"), 0);

    /* A bad count: HIRATE_ECOST, with the core's words. */
    CHECK_EQ_I64(hirate_refund(lim, "r", 1, -1, &d), HIRATE_ECOST);
    CHECK_EQ_STR(hirate_limiter_errmsg(lim, msg, sizeof msg),
                 "refund cost must be a whole number of tokens from 0 to 2^53-1, got -1");
    CHECK_EQ_I64(hirate_refund(lim, "", 0, 1, &d), HIRATE_EKEY);
    hirate_limiter_free(lim);
}

/* Redis down: on_error local gives the tokens to the local bucket; open and
 * closed have none, and return the failure's code. */
static void test_refund_in_an_outage_follows_the_policy(void)
{
    char url[64], msg[HIRATE_ERRMSG_SIZE];
    refused_url(url, sizeof url);
    hirate_decision d = {0};
    cfg c = outage_cfg(HIRATE_ON_ERROR_LOCAL, "rf-out:");
    c.url = url;
    hirate_limiter *lim = make(c);
    if (!lim) return;
    CHECK_EQ_I64(allow_s(lim, "k", 4, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_LOCAL);
    CHECK_EQ_I64(d.remaining, 6);
    CHECK_EQ_I64(hirate_refund(lim, "k", 1, 3, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_LOCAL);
    CHECK_EQ_I64(d.error, HIRATE_ECONNECT);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.remaining, 9);
    CHECK_EQ_I64(hirate_refund(lim, "k", 1, 3, &d), 0);   /* the breaker is open now */
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_LOCAL);
    CHECK_EQ_I64(d.remaining, 10);
    hirate_limiter_free(lim);

    for (int policy = HIRATE_ON_ERROR_OPEN; policy <= HIRATE_ON_ERROR_CLOSED; policy++) {
        c = outage_cfg(policy, "rf-out:");
        c.url = url;
        lim = make(c);
        if (!lim) return;
        for (int i = 0; i < 2; i++) {   /* a failed call, then the open breaker */
            memset(&d, 0, sizeof d);
            CHECK_EQ_I64(hirate_refund(lim, "k", 1, 1, &d), HIRATE_ECONNECT);
            hirate_limiter_errmsg(lim, msg, sizeof msg);
            char want[128];
            snprintf(want, sizeof want,
                     "the refund was not made: Redis failed (cannot connect to Redis) and "
                     "on_error is '%s'", hirate_on_error_name(policy));
            CHECK_EQ_STR(msg, want);
        }
        hirate_limiter_free(lim);
    }
}

/* 10,000 drained keys, each refused once, against a cache of 100 keys. */
static void test_deny_cache_holds_at_most_deny_cache_keys(void)
{
    enum { KEYS = 10000, PER_BATCH = 250 };
    static char names[KEYS][8];
    static hirate_item items[2 * PER_BATCH];
    /* A batch of 500 calls must end within its timeout as a whole: give a
     * loaded machine time for it. */
    hirate_limiter *lim = make((cfg){.capacity = 1, .rate = 0.001, .prefix = "dc-bound:",
                                     .deny_cache_keys = 100, .timeout_ms = 5000});
    if (!lim) return;
    int bad = 0;
    size_t most = 0;
    for (int k0 = 0; k0 < KEYS; k0 += PER_BATCH) {
        /* Each key twice: drained by the first, refused by the second. */
        for (int j = 0; j < PER_BATCH; j++) {
            snprintf(names[k0 + j], sizeof names[0], "%d", k0 + j);
            for (int twice = 0; twice < 2; twice++)
                items[2 * j + twice] = (hirate_item){names[k0 + j], strlen(names[k0 + j]), 1, 0,
                                                     {0}};
        }
        CHECK_EQ_I64(hirate_allow_many(lim, items, 2 * PER_BATCH), 0);
        for (int j = 0; j < 2 * PER_BATCH; j++)
            bad += items[j].rc != 0 || items[j].decision.allowed != (j % 2 == 0);
        size_t now = stats(lim).cache_keys;
        if (now > most) most = now;
    }
    /* The latest refusals are still known: one at a time, the cache answers. */
    for (int k = KEYS - 50; k < KEYS; k++) {
        hirate_decision d = {0};
        bad += allow_s(lim, names[k], 1, &d) != 0 || d.allowed;
    }
    hirate_counters st = stats(lim);
    if (st.cache_keys > most) most = st.cache_keys;
    printf("  deny cache of 100 keys after %d refused keys: at most %zu held, %" PRIu64
           " of the last 50 keys answered by it\n", KEYS, most, st.cache_hits);
    CHECK_EQ_I64(bad, 0);
    CHECK(most >= 50 && most <= 100);
    CHECK(st.cache_hits >= 25);
    hirate_limiter_free(lim);
}

static void test_without_the_deny_cache_every_decision_is_redis(void)
{
    hirate_limiter *lim = make((cfg){.capacity = 5, .rate = 10, .prefix = "dc-off:",
                                     .no_deny_cache = 1});
    if (!lim) return;
    load_script();
    int bad = 0, refused = 0;
    for (int i = 0; i < 2000; i++) {
        hirate_decision d = {0};
        int rc = allow_s(lim, "hot", 1, &d);
        bad += rc != 0 || d.source != HIRATE_SOURCE_REDIS;
        refused += rc == 0 && !d.allowed;
    }
    hirate_item items[4] = {{"hot", 3, 1, 0, {0}}, {"hot", 3, 1, 0, {0}},
                            {"cold", 4, 5, 0, {0}}, {"cold", 4, 1, 0, {0}}};
    CHECK_EQ_I64(hirate_allow_many(lim, items, 4), 0);
    for (int i = 0; i < 4; i++) bad += items[i].rc != 0 || items[i].decision.source != HIRATE_SOURCE_REDIS;
    hirate_counters st = stats(lim);
    CHECK_EQ_I64(bad, 0);
    CHECK(refused > 1000);   /* there was plenty to cache */
    CHECK_EQ_I64(st.cache_hits, 0);
    CHECK_EQ_I64(st.cache_keys, 0);
    CHECK_EQ_I64(st.evalsha + st.eval, 2004);
    hirate_limiter_free(lim);
}

/* ---- (f) batches ---------------------------------------------------------------------------- */

typedef struct bcase {
    const char *key;
    size_t keylen;
    int64_t cost;
} bcase;

/* capacity 5: a mix of keys and costs, an empty key, a negative cost, a cost
 * above the capacity, cost 0, refusals after a key runs dry. */
static const bcase batch_cases[] = {
    {"a", 1, 2}, {"b", 1, 1}, {"a", 1, 2}, {"c", 1, 5}, {"a", 1, 1}, {"", 0, 1},
    {"b", 1, 6}, {"a", 1, 1}, {"c", 1, 0}, {"b", 1, 4}, {"b", 1, 1}, {"d\0x", 3, -1},
    {"c", 1, 1}, {"d\0x", 3, 3},
};
enum { NB = sizeof batch_cases / sizeof batch_cases[0], NB_VALID = NB - 2 };

static void fill_items(hirate_item *items)
{
    for (int i = 0; i < NB; i++)
        items[i] = (hirate_item){batch_cases[i].key, batch_cases[i].keylen, batch_cases[i].cost,
                                 12345, {0}};
}

/* |a - b| <= tol, or both HIRATE_NEVER. */
static int close_to(int64_t a, int64_t b, int64_t tol)
{
    if (a == HIRATE_NEVER || b == HIRATE_NEVER) return a == b;
    return a - b <= tol && b - a <= tol;
}

/* items (from a batch on one limiter) against the same calls made one at a
 * time on another limiter without a deny cache; rate 0.001/s, so time moves
 * retry/reset by the wall time between them and nothing else. */
static int compare_with_single_calls(hirate_limiter *single, const hirate_item *items,
                                     int64_t started_us, int *from_cache)
{
    /* The tolerance: all the calls since started_us, when the first batch
     * (from which the deny cache learnt) began: a cached answer is Redis'
     * answer from the moment that call was sent. */
    int bad = 0;
    *from_cache = 0;
    for (int i = 0; i < NB; i++) {
        hirate_decision d = {0};
        memset(&d, 0, sizeof d);
        int rc = hirate_allow(single, items[i].key, items[i].keylen, items[i].cost, &d);
        int64_t tol = mono_us() - started_us + 2;
        const hirate_decision *b = &items[i].decision;
        int same = items[i].rc == rc;
        if (same && rc == 0)
            same = b->allowed == d.allowed && b->remaining == d.remaining &&
                   b->limit == d.limit && b->error == 0 && d.error == 0 &&
                   close_to(b->retry_after_us, d.retry_after_us, tol) &&
                   close_to(b->reset_after_us, d.reset_after_us, tol) &&
                   d.source == HIRATE_SOURCE_REDIS &&
                   (b->source == HIRATE_SOURCE_REDIS ||
                    (b->source == HIRATE_SOURCE_CACHE && !b->allowed));
        *from_cache += rc == 0 && b->source == HIRATE_SOURCE_CACHE;
        if (!same && bad++ < 5)
            fprintf(stderr, "  item %d (cost %" PRId64 "): batch %s %s a=%d r=%" PRId64
                    " retry=%" PRId64 " reset=%" PRId64 "; single %s %s a=%d r=%" PRId64
                    " retry=%" PRId64 " reset=%" PRId64 "\n", i, items[i].cost,
                    hirate_err_name(items[i].rc), hirate_source_name(b->source), b->allowed,
                    b->remaining, b->retry_after_us, b->reset_after_us, hirate_err_name(rc),
                    hirate_source_name(d.source), d.allowed, d.remaining, d.retry_after_us,
                    d.reset_after_us);
    }
    return bad;
}

static void test_a_batch_decides_as_single_calls_in_one_round_trip(void)
{
    hirate_item items[NB];
    hirate_limiter *batch = make((cfg){.capacity = 5, .rate = 0.001, .prefix = "batch-many:"});
    hirate_limiter *single = make((cfg){.capacity = 5, .rate = 0.001, .prefix = "batch-one:",
                                        .no_deny_cache = 1});
    if (!batch || !single) {
        hirate_limiter_free(batch);
        hirate_limiter_free(single);
        return;
    }
    load_script();
    hirate_decision d = {0};
    CHECK_EQ_I64(allow_s(batch, "warm", 1, &d), 0);   /* connected before counting */
    CHECK_EQ_I64(allow_s(single, "warm", 1, &d), 0);

    int64_t t0 = mono_us();
    for (int round = 0; round < 2; round++) {
        fill_items(items);
        hirate_counters s0 = stats(batch);
        long long reads0 = rh_info_int(&S, "total_reads_processed");
        CHECK_EQ_I64(hirate_allow_many(batch, items, NB), 0);
        long long reads1 = rh_info_int(&S, "total_reads_processed");
        hirate_counters s1 = stats(batch);

        CHECK_EQ_I64(items[5].rc, HIRATE_EKEY);    /* the empty key fails alone */
        CHECK_EQ_I64(items[11].rc, HIRATE_ECOST);  /* so does the negative cost */
        int decided = 0;
        for (int i = 0; i < NB; i++) decided += items[i].rc == 0;
        CHECK_EQ_I64(decided, NB_VALID);
        if (round == 0) {   /* exact values of the first round, fresh buckets */
            static const int want_allowed[NB] = {1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1};
            static const int64_t want_remaining[NB] = {3, 4, 1, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 2};
            for (int i = 0; i < NB; i++) {
                if (items[i].rc != 0) continue;
                CHECK_EQ_I64(items[i].decision.allowed, want_allowed[i]);
                CHECK_EQ_I64(items[i].decision.remaining, want_remaining[i]);
                CHECK_EQ_I64(items[i].decision.source, HIRATE_SOURCE_REDIS);
            }
            CHECK_EQ_I64(items[6].decision.retry_after_us, HIRATE_NEVER);
        }
        int from_cache = 0;
        long long reads2 = rh_info_int(&S, "total_reads_processed");
        CHECK_EQ_I64(compare_with_single_calls(single, items, t0, &from_cache), 0);
        long long reads3 = rh_info_int(&S, "total_reads_processed");
        /* Every valid item the cache did not answer was one EVALSHA... */
        CHECK_EQ_I64(s1.evalsha - s0.evalsha, NB_VALID - from_cache);
        CHECK_EQ_I64(s1.eval, s0.eval);
        CHECK_EQ_I64(s1.cache_hits - s0.cache_hits, from_cache);
        /* ...and all of them reached the server in one read (each INFO adds
         * its own read and its connection's close: at most 2), while the
         * single calls needed one read each. */
        printf("  batch of %d, round %d: %d from the cache, server reads %lld for the batch, "
               "%lld for the single calls\n", NB, round, from_cache, reads1 - reads0,
               reads3 - reads2);
        CHECK(reads1 - reads0 >= 2 && reads1 - reads0 <= 3);
        CHECK(reads3 - reads2 >= NB_VALID);
        /* The first round cannot use the cache: every lookup precedes the
         * round trip. In the second, every item the first left short is
         * known: a x4, b x3 (not cost 6 > capacity), c x2 (not cost 0), d. */
        CHECK_EQ_I64(from_cache, round == 0 ? 0 : 10);
    }
    /* Nothing, or nothing to read from. */
    CHECK_EQ_I64(hirate_allow_many(batch, NULL, 0), 0);
    CHECK_EQ_I64(hirate_allow_many(batch, NULL, 1), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_allow_many(NULL, items, 1), HIRATE_EINVAL);
    hirate_limiter_free(batch);
    hirate_limiter_free(single);
}

/* After SCRIPT FLUSH every EVALSHA of the pipeline meets NOSCRIPT, none of
 * them ran; they are sent again, the first as EVAL, and each runs once. */
static void test_noscript_in_a_batch_costs_one_eval(void)
{
    enum { N = 10 };
    hirate_item items[N];
    hirate_limiter *lim = make((cfg){.capacity = 20, .rate = 0.001, .prefix = "batch-noscript:",
                                     .no_deny_cache = 1});
    if (!lim) return;
    hirate_decision d = {0};
    CHECK_EQ_I64(allow_s(lim, "warm", 1, &d), 0);
    CHECK(reply_is(rh_command(&S, "SCRIPT FLUSH"), "OK"));
    long long eval0 = cmdstat("eval", "calls"), evalsha0 = cmdstat("evalsha", "calls");
    hirate_counters s0 = stats(lim);
    for (int i = 0; i < N; i++) items[i] = (hirate_item){"ns", 2, 1, 12345, {0}};
    CHECK_EQ_I64(hirate_allow_many(lim, items, N), 0);
    hirate_counters s1 = stats(lim);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_I64(items[i].rc, 0);
        CHECK_EQ_I64(items[i].decision.allowed, 1);
        CHECK_EQ_I64(items[i].decision.source, HIRATE_SOURCE_REDIS);
        CHECK_EQ_I64(items[i].decision.remaining, 19 - i);   /* each ran exactly once */
    }
    CHECK_EQ_I64(s1.eval - s0.eval, 1);
    CHECK_EQ_I64(s1.evalsha - s0.evalsha, N + N - 1);
    CHECK_EQ_I64(s1.conns_dropped, s0.conns_dropped);
    /* The server agrees (its counters include the failed NOSCRIPT calls). */
    CHECK_EQ_I64(cmdstat("eval", "calls") - eval0, 1);
    CHECK_EQ_I64(cmdstat("evalsha", "calls") - evalsha0, N + N - 1);
    CHECK_EQ_I64(allow_s(lim, "ns", 1, &d), 0);
    CHECK_EQ_I64(d.remaining, 9);
    CHECK_EQ_I64(stats(lim).eval, s1.eval);
    hirate_limiter_free(lim);
}

static void test_a_batch_in_an_outage_is_decided_by_the_policy(void)
{
    static const int policies[] = {HIRATE_ON_ERROR_LOCAL, HIRATE_ON_ERROR_OPEN,
                                   HIRATE_ON_ERROR_CLOSED};
    char url[64];
    refused_url(url, sizeof url);
    for (int p = 0; p < 3; p++) {
        cfg c = outage_cfg(policies[p], NULL);
        c.url = url;
        c.capacity = 5;
        hirate_limiter *lim = make(c);
        if (!lim) continue;
        expect e = {policies[p], 5, 5, 0.001, 5, {HIRATE_ECONNECT, 0}};
        int bad = 0, printed = 0;
        /* Twice: the first batch meets the failure, the second the open breaker. */
        for (int round = 0; round < 2; round++) {
            hirate_item items[NB];
            fill_items(items);
            for (int i = 0; i < NB; i++) items[i].key = "x", items[i].keylen = 1;
            items[5].keylen = 0;   /* still one invalid key */
            CHECK_EQ_I64(hirate_allow_many(lim, items, NB), 0);
            for (int i = 0; i < NB; i++) {
                if (i == 5) { bad += items[i].rc != HIRATE_EKEY; continue; }
                if (i == 11) { bad += items[i].rc != HIRATE_ECOST; continue; }
                bad += !policy_ok(&e, items[i].rc, &items[i].decision, items[i].cost,
                                  "batch on a refused connection", &printed);
            }
        }
        hirate_counters st = stats(lim);
        CHECK_EQ_I64(bad, 0);
        CHECK_EQ_I64(st.policy, 2 * NB_VALID);
        CHECK_EQ_I64(st.breaker_opens, 1);
        CHECK_EQ_I64(st.connects, 1);   /* the second batch did not try */
        hirate_limiter_free(lim);
    }
}

/* ---- main ------------------------------------------------------------------------------------ */

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (rh_start(&S) != 0) {
        CHECK(!"redis-server must start (is it installed and on PATH?)");
        return check_summary("test_policy");
    }
    printf("redis-server pid %d on port %d, dir %s\n", (int)S.pid, S.port, S.dir);
    rh_watchdog(&S, "test_policy", 120);

    test_each_policy_decides_each_outage_and_redis_returns();
    test_local_policy_divides_capacity_and_rate_by_instances();
    test_breaker_open_decides_in_microseconds();
    test_breaker_lets_one_probe_through_per_backoff();
    test_breaker_backoff_starts_when_the_failure_is_known();
    test_breaker_backoff_doubles_up_to_the_maximum();
    test_configuration_errors_are_returned_under_every_policy();
    test_deny_cache_spares_redis_all_but_one_call_per_refill();
    test_deny_cache_gives_exactly_the_decisions_redis_gives();
    test_reset_clears_the_deny_cache();
    test_refund_gives_back_and_clears_the_deny_cache();
    test_refund_in_an_outage_follows_the_policy();
    test_deny_cache_holds_at_most_deny_cache_keys();
    test_without_the_deny_cache_every_decision_is_redis();
    test_a_batch_decides_as_single_calls_in_one_round_trip();
    test_noscript_in_a_batch_costs_one_eval();
    test_a_batch_in_an_outage_is_decided_by_the_policy();

    rh_stop(&S);
    return check_summary("test_policy");
}
