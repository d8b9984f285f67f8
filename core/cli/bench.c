/*
 * hirate bench: a load generator. Threads share one limiter, as an
 * application's threads would, and decide on keys "bench:<i>" drawn at random
 * until the time is up. Each thread times every call with CLOCK_MONOTONIC
 * into its own histogram; at the end the histograms are merged into
 * percentiles. Nothing is allocated per call: keys are formatted into
 * per-thread buffers and a histogram is a fixed array.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* ---- log-linear histogram of nanoseconds ------------------------------ */

/* Values below 32 have a bucket each; above, every power of two is split
 * into 32 buckets, so a bucket spans at most 1/32 (3%) of its values. */
#define SUB_BITS 5
#define SUB (1 << SUB_BITS)
#define NBUCKETS (SUB + (64 - SUB_BITS) * SUB)

static int hist_index(uint64_t v)
{
    if (v < SUB)
        return (int)v;
    int shift = 63 - __builtin_clzll(v) - SUB_BITS;
    return SUB + shift * SUB + (int)((v >> shift) - SUB);
}

/* The largest value that falls into bucket i. */
static uint64_t hist_high(int i)
{
    if (i < SUB)
        return (uint64_t)i;
    int shift = (i - SUB) / SUB;
    uint64_t top = (uint64_t)((i - SUB) % SUB + SUB) + 1;
    return (top << shift) - 1;
}

/* The q-quantile (0..1) by nearest rank, never above the exact maximum. */
static uint64_t hist_quantile(const uint64_t *h, uint64_t total, double q, uint64_t max)
{
    if (total == 0)
        return 0;
    uint64_t rank = (uint64_t)(q * (double)total + 0.999999999);
    if (rank < 1)
        rank = 1;
    uint64_t seen = 0;
    for (int i = 0; i < NBUCKETS; i++) {
        seen += h[i];
        if (seen >= rank)
            return hist_high(i) < max ? hist_high(i) : max;
    }
    return max;
}

/* ---- the workers -------------------------------------------------------- */

#define ERR_SLOTS 32 /* by -code; slot 0 holds codes outside 1..31 */
#define SRC_SLOTS 8  /* by hirate_source; slot 0 holds unknown sources */
#define KEY_SIZE 32  /* "bench:" and 20 digits */

typedef struct shared {
    const cli_config *c;
    hirate_limiter *lim;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int go;          /* under mu: 1 start, -1 give up */
    atomic_int stop; /* the time is up */
} shared;

typedef struct worker {
    shared *sh;
    pthread_t tid;
    uint64_t rng;
    atomic_uint_fast64_t done; /* decisions and errors so far, for the progress line */
    uint64_t calls, allowed, refused, max_ns;
    uint64_t errors[ERR_SLOTS];
    uint64_t sources[SRC_SLOTS];
    uint64_t hist[NBUCKETS];
    hirate_item *items;
    char (*keys)[KEY_SIZE];
} worker;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* splitmix64: cheap, and good enough to spread keys. */
static uint64_t next_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* "bench:<i>" into buf; returns its length. */
static size_t bench_key(char *buf, uint64_t i)
{
    char digits[20];
    int n = 0;
    do
        digits[n++] = (char)('0' + i % 10);
    while ((i /= 10) != 0);
    memcpy(buf, "bench:", 6);
    for (int j = 0; j < n; j++)
        buf[6 + j] = digits[n - 1 - j];
    return (size_t)(6 + n);
}

static void count(worker *w, int rc, const hirate_decision *d)
{
    if (rc < 0) {
        w->errors[rc > -ERR_SLOTS ? -rc : 0]++;
        return;
    }
    if (d->allowed)
        w->allowed++;
    else
        w->refused++;
    w->sources[d->source > 0 && d->source < SRC_SLOTS ? d->source : 0]++;
}

static void *work(void *arg)
{
    worker *w = arg;
    shared *sh = w->sh;
    const cli_config *c = sh->c;
    pthread_mutex_lock(&sh->mu);
    while (sh->go == 0)
        pthread_cond_wait(&sh->cv, &sh->mu);
    int go = sh->go;
    pthread_mutex_unlock(&sh->mu);
    if (go < 0)
        return NULL;

    uint64_t done = 0;
    while (!atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
        for (int j = 0; j < c->batch; j++) {
            w->items[j].key = w->keys[j];
            w->items[j].keylen = bench_key(w->keys[j], next_rand(&w->rng) % c->keys);
            w->items[j].cost = c->cost;
        }
        hirate_decision d;
        int rc;
        int64_t t0 = now_ns();
        if (c->batch == 1)
            rc = hirate_allow(sh->lim, w->items[0].key, w->items[0].keylen, c->cost, &d);
        else
            rc = hirate_allow_many(sh->lim, w->items, (size_t)c->batch);
        uint64_t ns = (uint64_t)(now_ns() - t0);

        w->hist[hist_index(ns)]++;
        if (ns > w->max_ns)
            w->max_ns = ns;
        w->calls++;
        if (c->batch == 1)
            count(w, rc, &d);
        else
            for (int j = 0; j < c->batch; j++)
                count(w, rc < 0 ? rc : w->items[j].rc, &w->items[j].decision);
        done += (uint64_t)c->batch;
        atomic_store_explicit(&w->done, done, memory_order_relaxed);
    }
    return NULL;
}

/* ---- running and reporting --------------------------------------------- */

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static void sleep_ns(int64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    nanosleep(&ts, NULL); /* SIGINT cuts it short, which is what we want */
}

static void release(shared *sh, int go)
{
    pthread_mutex_lock(&sh->mu);
    sh->go = go;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}

/* Every worker's counts added into the first one's shape. */
static void merge(worker *sum, worker **w, int n)
{
    memset(sum, 0, sizeof *sum);
    for (int t = 0; t < n; t++) {
        sum->calls += w[t]->calls;
        sum->allowed += w[t]->allowed;
        sum->refused += w[t]->refused;
        if (w[t]->max_ns > sum->max_ns)
            sum->max_ns = w[t]->max_ns;
        for (int i = 0; i < ERR_SLOTS; i++)
            sum->errors[i] += w[t]->errors[i];
        for (int i = 0; i < SRC_SLOTS; i++)
            sum->sources[i] += w[t]->sources[i];
        for (int i = 0; i < NBUCKETS; i++)
            sum->hist[i] += w[t]->hist[i];
    }
}

/* A percentile in microseconds to 3 significant digits: its bucket is only
 * that precise, and more digits would claim otherwise. */
static void print_us(const char *before, uint64_t ns)
{
    double us = (double)ns / 1e3;
    int decimals = us >= 100 ? 0 : us >= 10 ? 1 : us >= 1 ? 2 : 3;
    printf("%s%.*f", before, decimals, us);
}

static const char *err_slot_name(int slot)
{
    return slot ? hirate_err_name(-slot) : "UNKNOWN";
}

static void report(const cli_config *c, const worker *s, double secs)
{
    static const double qs[] = {0.5, 0.9, 0.99, 0.999};
    static const char *const qnames[] = {"p50", "p90", "p99", "p99.9"};
    uint64_t decisions = s->allowed + s->refused, errors = 0;
    for (int i = 0; i < ERR_SLOTS; i++)
        errors += s->errors[i];
    double per_s = secs > 0 ? (double)decisions / secs : 0;
    const char *backend = c->opts.url ? "redis" : "memory";
    int first;

    if (c->json) {
        printf("{\"backend\":\"%s\",\"threads\":%d,\"keys\":%llu,\"batch\":%d,\"cost\":%lld,"
               "\"seconds\":%.6f,\"calls\":%llu,\"decisions\":%llu,\"decisions_per_s\":%.1f,"
               "\"allowed\":%llu,\"refused\":%llu,\"errors\":%llu,\"errors_by_code\":{",
               backend, c->threads, (unsigned long long)c->keys, c->batch,
               (long long)c->cost, secs, (unsigned long long)s->calls,
               (unsigned long long)decisions, per_s, (unsigned long long)s->allowed,
               (unsigned long long)s->refused, (unsigned long long)errors);
        first = 1;
        for (int i = 0; i < ERR_SLOTS; i++)
            if (s->errors[i]) {
                printf("%s\"%s\":%llu", first ? "" : ",", err_slot_name(i),
                       (unsigned long long)s->errors[i]);
                first = 0;
            }
        printf("},\"sources\":{");
        first = 1;
        for (int i = 0; i < SRC_SLOTS; i++)
            if (s->sources[i]) {
                printf("%s\"%s\":%llu", first ? "" : ",", hirate_source_name(i),
                       (unsigned long long)s->sources[i]);
                first = 0;
            }
        printf("},\"latency_us\":{");
        for (int i = 0; i < 4; i++) {
            printf("\"%s\":", qnames[i]);
            print_us("", hist_quantile(s->hist, s->calls, qs[i], s->max_ns));
            printf(",");
        }
        printf("\"max\":%.3f}}\n", (double)s->max_ns / 1e3);
        return;
    }

    printf("bench        %s, %d threads, %llu keys, batch %d, cost %lld\n", backend,
           c->threads, (unsigned long long)c->keys, c->batch, (long long)c->cost);
    printf("decisions    %llu in %.3f s\n", (unsigned long long)decisions, secs);
    printf("decisions/s  %.0f\n", per_s);
    printf("allowed      %llu\n", (unsigned long long)s->allowed);
    printf("refused      %llu\n", (unsigned long long)s->refused);
    printf("errors       %llu", (unsigned long long)errors);
    first = 1;
    for (int i = 0; i < ERR_SLOTS; i++)
        if (s->errors[i]) {
            printf("%s%s %llu", first ? " (" : ", ", err_slot_name(i),
                   (unsigned long long)s->errors[i]);
            first = 0;
        }
    printf("%s\nsources     ", first ? "" : ")");
    for (int i = 0; i < SRC_SLOTS; i++)
        if (s->sources[i])
            printf(" %s %llu", hirate_source_name(i), (unsigned long long)s->sources[i]);
    printf("\nlatency_us  ");
    for (int i = 0; i < 4; i++) {
        printf(" %s", qnames[i]);
        print_us(" ", hist_quantile(s->hist, s->calls, qs[i], s->max_ns));
    }
    printf(" max %.3f%s\n", (double)s->max_ns / 1e3,
           c->batch > 1 ? "  (per call of a batch)" : "");
}

/* Sleeps until the time is up or SIGINT, with a progress line on a terminal. */
static void wait_out(const cli_config *c, worker **w, int64_t start)
{
    int tty = isatty(STDERR_FILENO);
    int64_t end = start + (int64_t)(c->duration_s * 1e9);
    uint64_t last_n = 0;
    int64_t last_t = start;
    for (;;) {
        int64_t t = now_ns();
        if (interrupted || t >= end)
            break;
        sleep_ns(end - t < 250000000 ? end - t : 250000000);
        if (!tty)
            continue;
        uint64_t n = 0;
        for (int i = 0; i < c->threads; i++)
            n += atomic_load_explicit(&w[i]->done, memory_order_relaxed);
        t = now_ns();
        double rate = t > last_t ? (double)(n - last_n) * 1e9 / (double)(t - last_t) : 0;
        fprintf(stderr, "\r%7.1f s  %12llu decisions  %12.0f/s ", (double)(t - start) / 1e9,
                (unsigned long long)n, rate);
        last_n = n;
        last_t = t;
    }
    if (tty)
        fprintf(stderr, "\r%60s\r", "");
}

static void free_workers(worker **w, int n)
{
    for (int i = 0; i < n; i++)
        if (w[i]) {
            free(w[i]->items);
            free(w[i]->keys);
            free(w[i]);
        }
    free(w);
}

int cli_bench(const cli_config *c)
{
    hirate_options o = c->opts;
    if (o.pool_size < c->threads)
        o.pool_size = c->threads; /* one connection a thread, as a server would size it */
    shared sh;
    memset(&sh, 0, sizeof sh);
    sh.c = c;
    pthread_mutex_init(&sh.mu, NULL);
    pthread_cond_init(&sh.cv, NULL);
    atomic_init(&sh.stop, 0);
    if (cli_limiter_new(&o, &sh.lim) < 0)
        return CLI_ERROR;

    worker **w = calloc((size_t)c->threads, sizeof *w);
    for (int i = 0; w && i < c->threads; i++) {
        w[i] = calloc(1, sizeof **w);
        if (!w[i] || !(w[i]->items = calloc((size_t)c->batch, sizeof *w[i]->items)) ||
            !(w[i]->keys = calloc((size_t)c->batch, sizeof *w[i]->keys))) {
            cli_error("out of memory");
            free_workers(w, c->threads);
            hirate_limiter_free(sh.lim);
            return CLI_ERROR;
        }
        w[i]->sh = &sh;
        w[i]->rng = 0x243f6a8885a308d3ull * (uint64_t)(i + 1);
        atomic_init(&w[i]->done, 0);
    }
    if (!w) {
        cli_error("out of memory");
        hirate_limiter_free(sh.lim);
        return CLI_ERROR;
    }

    /* Workers never see SIGINT: it must not cut a call to Redis short. */
    struct sigaction sa, old_sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    sigset_t block, old_mask;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old_mask);
    int started = 0, err = 0;
    for (; started < c->threads; started++)
        if ((err = pthread_create(&w[started]->tid, NULL, work, w[started])) != 0)
            break;
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);

    int status = CLI_ALLOWED;
    if (started < c->threads) {
        cli_error("cannot start thread %d: %s", started + 1, strerror(err));
        release(&sh, -1);
        status = CLI_ERROR;
    } else {
        int64_t start = now_ns();
        release(&sh, 1);
        wait_out(c, w, start);
        atomic_store(&sh.stop, 1);
        for (int i = 0; i < started; i++)
            pthread_join(w[i]->tid, NULL);
        double secs = (double)(now_ns() - start) / 1e9;
        started = 0;

        worker *sum = malloc(sizeof *sum);
        if (!sum) {
            cli_error("out of memory");
            status = CLI_ERROR;
        } else {
            merge(sum, w, c->threads);
            report(c, sum, secs);
            if (sum->allowed + sum->refused == 0) { /* every call failed */
                char why[HIRATE_ERRMSG_SIZE];
                cli_error("no decision at all: %s",
                          cli_limiter_error(sh.lim, HIRATE_EINVAL, why, sizeof why));
                status = CLI_ERROR;
            }
            free(sum);
        }
    }
    for (int i = 0; i < started; i++)
        pthread_join(w[i]->tid, NULL);
    sigaction(SIGINT, &old_sa, NULL);
    free_workers(w, c->threads);
    hirate_limiter_free(sh.lim);
    pthread_mutex_destroy(&sh.mu);
    pthread_cond_destroy(&sh.cv);
    return status;
}
