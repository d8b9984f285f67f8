/*
 * The deny cache: Redis calls per 1,000 decisions for one key hammered far
 * beyond its rate, with the cache on and off.
 *
 *   bench_denycache --url redis://HOST:PORT [--seconds S] [--call-rate C]
 *                   [--capacity N] [--rate R] [--steady-from T] [--summary FILE]
 *
 * One thread calls hirate_allow(key, cost 1) on one key at C calls per second
 * (default 10,000, paced on absolute deadlines of CLOCK_MONOTONIC: a sleep
 * while more than 200 µs remain, a busy-wait for the rest, so a late call
 * does not shift the ones after it) for S seconds (default 2), against a
 * bucket of capacity N (10) refilling at R tokens per second (100): C/R = 100
 * times its rate. It runs twice, each with a fresh limiter and its own key
 * (reset first): deny_cache 1 (the default) and deny_cache 0. Redis calls are
 * hirate_counters_get' evalsha + eval. Every allowed decision spends a token in
 * Redis, so it needs a Redis call of its own: the allowed decisions per
 * 1,000 are the floor no cache can go below. The whole run includes the
 * first moments, when the full bucket lets N calls through in a row; "steady
 * state" counts only the calls from T seconds on (default 0.5), long after
 * that burst.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "hirate_io.h"

typedef struct counts {
    uint64_t decisions, allowed, cache, redis_refused, redis_calls;
} counts;

typedef struct mode_result {
    counts whole, steady;
    double achieved;          /* decisions per second actually made */
    double late_max_us;       /* the latest a call started after its deadline */
} mode_result;

static void fail(const char *msg)
{
    fprintf(stderr, "bench_denycache: %s\n", msg);
    exit(1);
}

/* Until deadline on CLOCK_MONOTONIC: sleep while far, then spin. */
static void wait_until(int64_t deadline_ns)
{
    int64_t left = deadline_ns - bench_now_ns();
    if (left > 200000) {
        int64_t wake = deadline_ns - 100000;
        struct timespec ts = {(time_t)(wake / 1000000000), (long)(wake % 1000000000)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
        }
    }
    while (bench_now_ns() < deadline_ns) {
    }
}

static uint64_t redis_calls(hirate_limiter *lim)
{
    hirate_counters st;
    hirate_counters_get(lim, &st);
    return st.evalsha + st.eval;
}

static mode_result run_mode(const char *url, int deny_cache, int64_t capacity, double rate,
                            double seconds, double call_rate, double steady_from)
{
    mode_result mr;
    memset(&mr, 0, sizeof mr);
    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.capacity = capacity;
    o.rate = rate;
    o.deny_cache = deny_cache;
    o.timeout_ms = 2000;   /* a slow moment must not turn into a policy decision */
    hirate_limiter *lim;
    char err[HIRATE_ERRMSG_SIZE];
    if (hirate_limiter_new(&lim, &o, err, sizeof err) < 0)
        fail(err);

    char key[64];
    snprintf(key, sizeof key, "hammered:%s:%d", deny_cache ? "cache-on" : "cache-off", (int)getpid());
    size_t keylen = strlen(key);
    /* Connected, the script known, the key's bucket full. */
    hirate_decision d;
    if (hirate_peek(lim, "warm-up", 7, 1, &d) < 0 || hirate_reset(lim, key, keylen) < 0)
        fail("cannot reach Redis");

    uint64_t n = (uint64_t)(seconds * call_rate);
    uint64_t steady_k = (uint64_t)(steady_from * call_rate);
    double period = 1e9 / call_rate;
    counts *cur = &mr.whole;
    uint64_t calls0 = redis_calls(lim), calls_steady = 0;
    bench_progress("deny cache %s: %llu calls at %.0f/s", deny_cache ? "on" : "off",
                   (unsigned long long)n, call_rate);
    int64_t start = bench_now_ns() + 1000000;
    int64_t last = start;
    for (uint64_t k = 0; k < n; k++) {
        int64_t deadline = start + (int64_t)((double)k * period);
        wait_until(deadline);
        if (k == steady_k)
            calls_steady = redis_calls(lim);
        int64_t t = bench_now_ns();
        double late = (double)(t - deadline) / 1e3;
        if (late > mr.late_max_us)
            mr.late_max_us = late;
        int rc = hirate_allow(lim, key, keylen, 1, &d);
        if (rc < 0 || (d.source != HIRATE_SOURCE_REDIS && d.source != HIRATE_SOURCE_CACHE)) {
            char msg[HIRATE_ERRMSG_SIZE];
            fprintf(stderr, "bench_denycache: hirate_allow: %s, source %s (%s)\n",
                    hirate_err_name(rc), hirate_source_name(d.source),
                    hirate_limiter_errmsg(lim, msg, sizeof msg));
            exit(1);
        }
        for (int w = 0; w < 2; w++) {
            if (w == 1 && k < steady_k)
                break;
            cur = w ? &mr.steady : &mr.whole;
            cur->decisions++;
            cur->allowed += (uint64_t)d.allowed;
            cur->cache += d.source == HIRATE_SOURCE_CACHE;
            cur->redis_refused += d.source == HIRATE_SOURCE_REDIS && !d.allowed;
        }
        last = bench_now_ns();
    }
    uint64_t calls1 = redis_calls(lim);
    mr.whole.redis_calls = calls1 - calls0;
    mr.steady.redis_calls = calls1 - calls_steady;
    mr.achieved = (double)n / ((double)(last - start) / 1e9);
    hirate_reset(lim, key, keylen);
    hirate_limiter_free(lim);
    return mr;
}

static double per1000(uint64_t x, uint64_t n)
{
    return n ? 1000.0 * (double)x / (double)n : 0;
}

static void print_row(const char *cache, const char *window, const counts *c)
{
    char a[32], b[32], e[32], f[32], g[32];
    printf("| %s | %s | %s | %s | %s | %s | %s | %.2f | **%.2f** |\n", cache, window,
           bench_group(a, sizeof a, (double)c->decisions),
           bench_group(b, sizeof b, (double)c->allowed), bench_group(e, sizeof e, (double)c->cache),
           bench_group(f, sizeof f, (double)c->redis_calls),
           bench_group(g, sizeof g, (double)c->redis_refused), per1000(c->allowed, c->decisions),
           per1000(c->redis_calls, c->decisions));
}

static void summary_counts(const char *path, const char *tag, const counts *c)
{
    char name[96];
    snprintf(name, sizeof name, "%s_decisions", tag);
    bench_summary(path, name, (double)c->decisions);
    snprintf(name, sizeof name, "%s_allowed", tag);
    bench_summary(path, name, (double)c->allowed);
    snprintf(name, sizeof name, "%s_calls", tag);
    bench_summary(path, name, (double)c->redis_calls);
    snprintf(name, sizeof name, "%s_refused_by_redis", tag);
    bench_summary(path, name, (double)c->redis_refused);
    snprintf(name, sizeof name, "%s_per1000", tag);
    bench_summary(path, name, per1000(c->redis_calls, c->decisions));
    snprintf(name, sizeof name, "%s_floor_per1000", tag);
    bench_summary(path, name, per1000(c->allowed, c->decisions));
}

int main(int argc, char **argv)
{
    const char *url = bench_opt(argc, argv, "--url", NULL);
    double seconds = bench_opt_num(argc, argv, "--seconds", 2.0);
    double call_rate = bench_opt_num(argc, argv, "--call-rate", 10000);
    int64_t capacity = (int64_t)bench_opt_num(argc, argv, "--capacity", 10);
    double rate = bench_opt_num(argc, argv, "--rate", 100);
    double steady_from = bench_opt_num(argc, argv, "--steady-from", 0.5);
    const char *summary = bench_opt(argc, argv, "--summary", NULL);
    if (!url || seconds <= 0 || call_rate <= 0 || capacity < 1 || rate <= 0 ||
        steady_from < 0 || steady_from >= seconds) {
        fprintf(stderr, "usage: bench_denycache --url redis://HOST:PORT [--seconds S] "
                        "[--call-rate C] [--capacity N] [--rate R] [--steady-from T] "
                        "[--summary FILE]\n");
        return 2;
    }

    mode_result on = run_mode(url, 1, capacity, rate, seconds, call_rate, steady_from);
    mode_result off = run_mode(url, 0, capacity, rate, seconds, call_rate, steady_from);
    bench_progress_done();

    char w[64], st[64];
    snprintf(w, sizeof w, "whole run (0–%g s)", seconds);
    snprintf(st, sizeof st, "steady state (%g–%g s)", steady_from, seconds);
    printf("### Deny cache: Redis calls for a key hammered at %.0f times its rate\n\n",
           call_rate / rate);
    char cr[32], p1[32], p2[32];
    bench_group(cr, sizeof cr, call_rate);
    printf("One key, capacity %lld, rate %g/s; one thread calls `hirate_allow` (cost 1) %s "
           "times a second for %g s, paced on absolute deadlines (busy-wait), with "
           "`deny_cache` 1 (default) and 0, each with a fresh limiter and its own key. Redis "
           "calls are `hirate_counters_get()` EVALSHA + EVAL. Each allowed decision spends in Redis "
           "and so needs a call of its own: \"floor\" is the allowed decisions per 1,000, "
           "which no cache can beat. The whole run includes the first moments, when the full "
           "bucket passes %lld calls in a row; the steady state counts only calls from %g s "
           "on.\n\n", (long long)capacity, rate, cr, seconds, (long long)capacity,
           steady_from);
    printf("| deny cache | window | decisions | allowed | answered by the cache | Redis calls "
           "| refused by Redis | floor per 1,000 | Redis calls per 1,000 decisions |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    print_row("on", w, &on.whole);
    print_row("on", st, &on.steady);
    print_row("off", w, &off.whole);
    print_row("off", st, &off.steady);
    printf("\nThe pace held: %s (cache on) and %s (cache off) decisions per second; the "
           "latest start of a call after its deadline was %.0f µs and %.0f µs.\n\n",
           bench_group(p1, sizeof p1, on.achieved), bench_group(p2, sizeof p2, off.achieved),
           on.late_max_us, off.late_max_us);

    summary_counts(summary, "deny_on_whole", &on.whole);
    summary_counts(summary, "deny_on_steady", &on.steady);
    summary_counts(summary, "deny_off_whole", &off.whole);
    summary_counts(summary, "deny_off_steady", &off.steady);
    bench_summary(summary, "deny_call_rate", call_rate);
    bench_summary(summary, "deny_rate", rate);
    bench_summary(summary, "deny_steady_from", steady_from);
    return 0;
}
