/*
 * What the fault tests (test_faults.c, test_faults_mock.c) share: making a
 * limiter, timing a call, and the one check of a failure-policy decision, so
 * that every fault is held to the same reading of docs/semantics.md.
 */
#ifndef HIRATE_TEST_FAULTS_H
#define HIRATE_TEST_FAULTS_H

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "test_time.h"
#include "hirate.h"
#include "hirate_io.h"

#define CANARY "s3cr3t-canary"
#define MS 1000LL
#define SECOND 1000000LL

/* Scheduling slack on top of a timeout: the machine is shared, and the ASan
 * build is several times slower. A hang would exceed it by seconds. */
enum { SLACK_MS = 250 };

typedef struct fcfg {
    const char *url;
    const char *prefix;     /* NULL: the default */
    int64_t capacity;       /* 0: 10 */
    int on_error;
    int timeout_ms, connect_timeout_ms;  /* 0: 1000 each: only faults that are
                                             timeouts get short ones, so that a
                                             loaded machine fails no other call */
    int backoff_min_ms, backoff_max_ms;  /* 0: 20 and 200 */
    int pool_size;          /* 0: the default */
    int deny_cache;         /* 0: off, so that every decision asks the server */
} fcfg;

/* rate 0.001/s: a token takes 1000 s to come back, so within a test every
 * whole-token value is exact. */
#define FAULT_RATE 0.001

static inline hirate_limiter *fault_limiter(fcfg c)
{
    hirate_options o;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE] = "";
    hirate_options_init(&o);
    o.functions = 0;   /* the EVALSHA path; test_sentinel.c has FCALL's */
    o.url = c.url;
    o.capacity = c.capacity ? c.capacity : 10;
    o.rate = FAULT_RATE;
    if (c.prefix) o.prefix = c.prefix;
    o.on_error = c.on_error;
    o.timeout_ms = c.timeout_ms ? c.timeout_ms : 1000;
    o.connect_timeout_ms = c.connect_timeout_ms ? c.connect_timeout_ms : 1000;
    o.backoff_min_ms = c.backoff_min_ms ? c.backoff_min_ms : 20;
    o.backoff_max_ms = c.backoff_max_ms ? c.backoff_max_ms : 200;
    if (c.pool_size) o.pool_size = c.pool_size;
    o.deny_cache = c.deny_cache;
    int rc = hirate_limiter_new(&lim, &o, why, sizeof why);
    if (rc != 0) fprintf(stderr, "  hirate_limiter_new: %s (%s)\n", hirate_err_name(rc), why);
    CHECK_EQ_I64(rc, 0);
    return lim;
}

/* The longest a call may take: both timeouts (a probe may connect and then
 * wait for its reply) and the slack. */
static inline int64_t fault_bound_us(fcfg c)
{
    int t = c.timeout_ms ? c.timeout_ms : 1000;
    int ct = c.connect_timeout_ms ? c.connect_timeout_ms : 1000;
    return (int64_t)(t + ct + SLACK_MS) * MS;
}

static inline hirate_counters fault_stats(hirate_limiter *lim)
{
    hirate_counters st;
    memset(&st, 0, sizeof st);
    hirate_counters_get(lim, &st);
    return st;
}

/* One timed call: the rc, the decision (zeroed first) and *took_us. */
static inline int timed_allow(hirate_limiter *lim, const char *key, int64_t cost,
                              hirate_decision *d, int64_t *took_us)
{
    memset(d, 0, sizeof *d);
    int64_t t0 = mono_us();
    int rc = hirate_allow(lim, key, strlen(key), cost, d);
    *took_us = mono_us() - t0;
    return rc;
}

static inline const char *fault_errmsg(hirate_limiter *lim)
{
    static char buf[HIRATE_ERRMSG_SIZE];
    return hirate_limiter_errmsg(lim, buf, sizeof buf);
}

/* The limiter's message names the problem and never the password. */
static inline int errmsg_is_clean(hirate_limiter *lim)
{
    const char *m = fault_errmsg(lim);
    if (strstr(m, "s3cr3t") || strstr(m, "canary")) {
        fprintf(stderr, "  the password leaked: \"%s\"\n", m);
        return 0;
    }
    return m[0] != '\0';
}

/* What one limiter's failure policy must answer for one key during a fault
 * (docs/semantics.md, "When Redis fails"). */
typedef struct fexpect {
    int policy;
    int64_t capacity;
    int64_t local_left;     /* LOCAL: whole tokens left in the key's fallback bucket */
    int64_t max_wait_us;    /* CLOSED: the longest wait the breaker can name */
} fexpect;

static inline fexpect fault_expect(fcfg c)
{
    int64_t cap = c.capacity ? c.capacity : 10;
    int max_ms = c.backoff_max_ms ? c.backoff_max_ms : 200;
    return (fexpect){c.on_error, cap, cap, (int64_t)max_ms * MS * 5 / 4};
}

/* 1 when (rc, d) is the policy's decision for cost naming `error`, else 0
 * with the first difference printed after `what`. */
static inline int policy_decided(fexpect *e, int rc, const hirate_decision *d, int64_t cost,
                                 int error, const char *what)
{
    char bad[160] = "";
#define WANT_(cond, ...) \
    do { if (!bad[0] && !(cond)) snprintf(bad, sizeof bad, __VA_ARGS__); } while (0)
    WANT_(rc == 0, "rc %s", hirate_err_name(rc));
    if (rc == 0) {
        int never = cost > e->capacity;
        WANT_(d->error == error, "error %s, not %s", hirate_err_name(d->error),
              hirate_err_name(error));
        WANT_(d->limit == e->capacity, "limit %" PRId64, d->limit);
        if (e->policy == HIRATE_ON_ERROR_LOCAL) {
            int allowed = cost <= e->local_left;
            WANT_(d->source == HIRATE_SOURCE_LOCAL, "source %s", hirate_source_name(d->source));
            WANT_(d->allowed == allowed, "allowed %d", d->allowed);
            if (allowed && d->allowed) e->local_left -= cost;
            WANT_(d->remaining == e->local_left, "remaining %" PRId64 ", not %" PRId64,
                  d->remaining, e->local_left);
            if (never)
                WANT_(d->retry_after_us == HIRATE_NEVER, "retry %" PRId64, d->retry_after_us);
            else if (allowed)
                WANT_(d->retry_after_us == 0, "retry %" PRId64, d->retry_after_us);
            else   /* about (cost - left) tokens at FAULT_RATE, less a minute of refill */
                WANT_(d->retry_after_us > (double)(cost - e->local_left) / FAULT_RATE * 1e6 - 60e6,
                      "retry %" PRId64, d->retry_after_us);
        } else if (e->policy == HIRATE_ON_ERROR_OPEN) {
            WANT_(d->source == HIRATE_SOURCE_FAIL_OPEN, "source %s", hirate_source_name(d->source));
            WANT_(d->allowed == !never, "allowed %d", d->allowed);
            WANT_(d->remaining == (never ? 0 : e->capacity - cost), "remaining %" PRId64,
                  d->remaining);
            WANT_(d->retry_after_us == (never ? HIRATE_NEVER : 0), "retry %" PRId64,
                  d->retry_after_us);
            WANT_(d->reset_after_us == 0, "reset %" PRId64, d->reset_after_us);
        } else {
            WANT_(d->source == HIRATE_SOURCE_FAIL_CLOSED, "source %s",
                  hirate_source_name(d->source));
            WANT_(d->allowed == (cost == 0), "allowed %d", d->allowed);
            WANT_(d->remaining == 0, "remaining %" PRId64, d->remaining);
            /* Come back when the breaker lets a call through to Redis. */
            WANT_(d->reset_after_us >= 1 && d->reset_after_us <= e->max_wait_us,
                  "reset %" PRId64, d->reset_after_us);
            if (never)
                WANT_(d->retry_after_us == HIRATE_NEVER, "retry %" PRId64, d->retry_after_us);
            else if (cost == 0)
                WANT_(d->retry_after_us == 0, "retry %" PRId64, d->retry_after_us);
            else
                WANT_(d->retry_after_us == d->reset_after_us, "retry %" PRId64 " != reset %" PRId64,
                      d->retry_after_us, d->reset_after_us);
        }
    }
#undef WANT_
    if (bad[0])
        fprintf(stderr, "  %s, on_error %s, cost %" PRId64 ": %s\n", what,
                hirate_on_error_name(e->policy), cost, bad);
    return !bad[0];
}

/* A decision Redis (or the mock playing it) made. */
static inline int redis_decided(int rc, const hirate_decision *d, int allowed, int64_t remaining,
                                const char *what)
{
    int ok = rc == 0 && d->source == HIRATE_SOURCE_REDIS && d->error == 0 &&
             d->allowed == allowed && d->remaining == remaining;
    if (!ok)
        fprintf(stderr, "  %s: rc %s, source %s, error %s, allowed %d, remaining %" PRId64
                " (wanted redis, allowed %d, remaining %" PRId64 ")\n", what, hirate_err_name(rc),
                hirate_source_name(d->source), hirate_err_name(d->error), d->allowed,
                d->remaining, allowed, remaining);
    return ok;
}

/* Peeks at `key` (cost 0, spends nothing) every 5 ms until Redis decides
 * again, for at most deadline_ms. The time it took in ms, or -1. */
static inline double wait_for_redis(hirate_limiter *lim, const char *key, int deadline_ms)
{
    int64_t t0 = mono_us();
    while (mono_us() - t0 < deadline_ms * MS) {
        hirate_decision d;
        memset(&d, 0, sizeof d);
        if (hirate_peek(lim, key, strlen(key), 0, &d) == 0 && d.source == HIRATE_SOURCE_REDIS)
            return (double)(mono_us() - t0) / MS;
        sleep_ms(5);
    }
    return -1;
}

#define ON_ERROR_EACH(p) for (int p = HIRATE_ON_ERROR_LOCAL; p <= HIRATE_ON_ERROR_CLOSED; p++)

#endif
