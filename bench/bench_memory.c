/*
 * The memory backend: decisions per second for a hot set of keys on one
 * thread and on two, and the bytes a stored key costs.
 *
 *   bench_memory [--seconds S] [--runs N] [--keys K] [--store-keys M] [--summary FILE]
 *
 * Prints Markdown tables on stdout, progress on stderr, and "name value"
 * lines into FILE for bench/run.sh.
 *
 * Throughput: every thread cycles through the same K keys (12 bytes each), in
 * its own shuffled order, with cost 1. Each configuration gets a fresh
 * limiter, a warm-up, then N timed runs of S seconds; the table gives the
 * median run and the spread (min..max). "allowed": capacity 1e9 at 1e6/s, so
 * every decision spends. "refused": capacity 100 at 10/s, so after the
 * warm-up drains the buckets nearly every decision is a refusal, which also
 * computes a retry time. Each is measured through hirate_allow (which reads
 * CLOCK_MONOTONIC once per decision) and through hirate_decide_at with the
 * time injected (this loop reads the clock once per 1024 decisions), which
 * isolates the cost of the clock read.
 *
 * Bytes per key: M keys of 16 bytes go into one table (hirate_memory through
 * core/src/memory.h, with room for 2*M so that nothing is evicted), and both
 * the table's own count (hirate_memory_bytes: malloc_usable_size of the
 * slabs the entries are cut from, plus the slot arrays) and the growth of
 * the resident set are divided
 * by the number of keys held.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "hirate_io.h"
#include "memory.h"

#define BATCH 1024
#define MAX_THREADS 2
#define MAX_RUNS 64

typedef struct workload {
    const char *name;     /* for the table */
    const char *tag;      /* for the summary */
    int64_t capacity;
    double rate;
} workload;

static const workload workloads[] = {
    {"allowed (capacity 1e9, 1e6/s)", "allow", 1000000000, 1e6},
    {"refused (capacity 100, 10/s)", "refuse", 100, 10.0},
};

typedef struct shared {
    hirate_limiter *lim;
    const bench_keys *keys;
    int injected;
    pthread_barrier_t start;
    atomic_int stop;
} shared;

typedef struct worker {
    pthread_t tid;
    shared *sh;
    uint32_t *order;          /* indices into the key set */
    size_t norder, pos;
    uint64_t count, allowed, errors;
    int64_t elapsed_ns;
} worker;

/* The measured loop: BATCH decisions between looks at the stop flag. */
static void *work(void *arg)
{
    worker *w = arg;
    shared *sh = w->sh;
    const bench_keys *k = sh->keys;
    hirate_decision d;
    uint64_t count = 0, allowed = 0, errors = 0;
    size_t pos = w->pos, n = w->norder;

    pthread_barrier_wait(&sh->start);
    int64_t t0 = bench_now_ns();
    int64_t now_us = t0 / 1000;
    do {
        for (int j = 0; j < BATCH; j++) {
            uint32_t i = w->order[pos];
            pos = pos + 1 == n ? 0 : pos + 1;
            int rc = sh->injected
                     ? hirate_decide_at(sh->lim, k->key[i], k->len[i], 1, 1, now_us, &d)
                     : hirate_allow(sh->lim, k->key[i], k->len[i], 1, &d);
            errors += rc < 0;
            allowed += (unsigned)d.allowed;
        }
        count += BATCH;
        if (sh->injected)
            now_us = bench_now_us();
    } while (!atomic_load_explicit(&sh->stop, memory_order_relaxed));
    w->elapsed_ns = bench_now_ns() - t0;
    w->pos = pos;
    w->count = count;
    w->allowed = allowed;
    w->errors = errors;
    return NULL;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {}
}

/* One run of nthreads for seconds; returns decisions per second (the sum of
 * each thread's count over its own elapsed time). */
static double run_once(shared *sh, worker *w, int nthreads, double seconds, double *allowed_frac)
{
    atomic_store(&sh->stop, 0);
    pthread_barrier_init(&sh->start, NULL, (unsigned)nthreads + 1);
    for (int t = 0; t < nthreads; t++) {
        w[t].sh = sh;
        if (pthread_create(&w[t].tid, NULL, work, &w[t]) != 0) {
            perror("pthread_create");
            exit(1);
        }
    }
    pthread_barrier_wait(&sh->start);
    sleep_s(seconds);
    atomic_store(&sh->stop, 1);
    double rate = 0;
    uint64_t count = 0, allowed = 0;
    for (int t = 0; t < nthreads; t++) {
        pthread_join(w[t].tid, NULL);
        if (w[t].errors) {
            fprintf(stderr, "bench_memory: %llu decisions failed\n", (unsigned long long)w[t].errors);
            exit(1);
        }
        rate += (double)w[t].count * 1e9 / (double)w[t].elapsed_ns;
        count += w[t].count;
        allowed += w[t].allowed;
    }
    pthread_barrier_destroy(&sh->start);
    if (allowed_frac)
        *allowed_frac = count ? (double)allowed / (double)count : 0;
    return rate;
}

typedef struct result {
    double median, min, max, allowed_frac;
} result;

/* disjoint: thread t uses only the keys i with i % nthreads == t, so that
 * no bucket is shared and what remains shared is the table's structure. */
static result measure(const workload *wl, const bench_keys *keys, int injected, int nthreads,
                      int disjoint, double seconds, int runs)
{
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = wl->capacity;
    o.rate = wl->rate;
    char err[HIRATE_ERRMSG_SIZE];
    shared sh = {0};
    if (hirate_limiter_new(&sh.lim, &o, err, sizeof err) < 0) {
        fprintf(stderr, "bench_memory: %s\n", err);
        exit(1);
    }
    sh.keys = keys;
    sh.injected = injected;

    worker w[MAX_THREADS];
    uint64_t rng = 0x5eed0000u + (uint64_t)nthreads;
    for (int t = 0; t < nthreads; t++) {
        memset(&w[t], 0, sizeof w[t]);
        w[t].order = malloc(keys->n * sizeof *w[t].order);
        for (size_t i = 0; i < keys->n; i++)
            if (!disjoint || (int)(i % (size_t)nthreads) == t)
                w[t].order[w[t].norder++] = (uint32_t)i;
        bench_shuffle(w[t].order, w[t].norder, &rng);
        w[t].pos = disjoint ? 0 : (size_t)t * w[t].norder / 2;
    }

    /* Warm-up: every key stored, refused buckets drained, caches hot. */
    run_once(&sh, w, nthreads, seconds < 0.3 ? seconds : 0.3, NULL);

    double rates[MAX_RUNS], frac[MAX_RUNS];
    for (int r = 0; r < runs; r++) {
        bench_progress("memory: %s, %s, %d thread%s%s: run %d/%d", wl->tag,
                       injected ? "injected time" : "hirate_allow", nthreads,
                       nthreads > 1 ? "s" : "", disjoint ? " (disjoint keys)" : "", r + 1, runs);
        rates[r] = run_once(&sh, w, nthreads, seconds, &frac[r]);
    }
    result res;
    res.min = bench_min(rates, (size_t)runs);
    res.max = bench_max(rates, (size_t)runs);
    res.median = bench_median(rates, (size_t)runs);
    res.allowed_frac = bench_median(frac, (size_t)runs);

    for (int t = 0; t < nthreads; t++)
        free(w[t].order);
    hirate_limiter_free(sh.lim);
    return res;
}

static const char *mdps(char *buf, size_t len, const result *r)
{
    snprintf(buf, len, "%.2f M (%.2f..%.2f)", r->median / 1e6, r->min / 1e6, r->max / 1e6);
    return buf;
}

/* ---- bytes per key ----------------------------------------------------------- */

static size_t rss_bytes(void)
{
    long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &size, &resident) != 2) {
        perror("/proc/self/statm");
        exit(1);
    }
    fclose(f);
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

static void bytes_per_key(size_t nkeys, const char *summary)
{
    enum { KEYLEN = 16 };
    hirate_bucket_cfg cfg;
    char err[HIRATE_ERRMSG_SIZE], key[32];
    hirate_decision d;

    bench_progress("memory: storing %zu keys of %d bytes", nkeys, KEYLEN);
    if (hirate_bucket_cfg_init(&cfg, 100, 10.0, err, sizeof err) < 0) {
        fprintf(stderr, "bench_memory: %s\n", err);
        exit(1);
    }
    size_t rss0 = rss_bytes();
    hirate_memory *m = hirate_memory_new(2 * nkeys, 1, 0);
    if (!m) {
        fprintf(stderr, "bench_memory: out of memory\n");
        exit(1);
    }
    int64_t now = hirate_monotonic_us();
    int64_t t0 = bench_now_ns();
    for (size_t i = 0; i < nkeys; i++) {
        snprintf(key, sizeof key, "key:%012zu", i % 1000000000000u);
        if (hirate_memory_decide(m, &cfg, key, KEYLEN, now, 1, 1, &d, NULL) < 0) {
            fprintf(stderr, "bench_memory: out of memory at key %zu\n", i);
            exit(1);
        }
    }
    double insert_ns = (double)(bench_now_ns() - t0) / (double)nkeys;
    size_t rss1 = rss_bytes();
    size_t count = hirate_memory_count(m), bytes = hirate_memory_bytes(m);
    hirate_memory_free(m);

    /* The same number of keys through the public API with the default
     * max_keys: shards fill unevenly, so a table "for 1,000,000" holds fewer. */
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = 100;
    o.rate = 10.0;
    hirate_limiter *lim;
    if (hirate_limiter_new(&lim, &o, err, sizeof err) < 0) {
        fprintf(stderr, "bench_memory: %s\n", err);
        exit(1);
    }
    for (size_t i = 0; i < nkeys; i++) {
        snprintf(key, sizeof key, "key:%012zu", i % 1000000000000u);
        hirate_allow(lim, key, KEYLEN, 1, &d);
    }
    hirate_counters st;
    hirate_counters_get(lim, &st);
    hirate_limiter_free(lim);

    double per_key = (double)bytes / (double)count;
    double rss_per_key = (double)(rss1 - rss0) / (double)count;
    char c1[32], c2[32];
    printf("### Memory backend: bytes per key\n\n");
    printf("%s distinct keys of %d bytes, each spent once (a key is stored only once it has "
           "spent), in one table sized for twice as many so that nothing is evicted.\n\n",
           bench_group(c1, sizeof c1, (double)nkeys), KEYLEN);
    printf("| measure | bytes per key | without the %d key bytes |\n", KEYLEN);
    printf("|---|---:|---:|\n");
    printf("| `hirate_memory_bytes()` / keys held (malloc_usable_size of the entries' slabs + slot "
           "arrays) | %.1f | %.1f |\n", per_key, per_key - KEYLEN);
    printf("| resident set growth (`/proc/self/statm`) / keys held | %.1f | %.1f |\n\n",
           rss_per_key, rss_per_key - KEYLEN);
    printf("Keys held: %s. Inserting a new key took %.0f ns on average. Through the public "
           "API with the default `max_keys` (1,000,000), the same %s keys left %s buckets "
           "stored: each shard holds at most its share of `max_keys`, and keys do not "
           "spread over the shards exactly evenly.\n\n",
           bench_group(c1, sizeof c1, (double)count), insert_ns,
           bench_group(c2, sizeof c2, (double)nkeys),
           bench_group((char[32]){0}, 32, (double)st.memory_keys));
    bench_summary(summary, "mem_bytes_per_key", per_key);
    bench_summary(summary, "mem_rss_per_key", rss_per_key);
    bench_summary(summary, "mem_key_len", KEYLEN);
}

int main(int argc, char **argv)
{
    double seconds = bench_opt_num(argc, argv, "--seconds", 1.0);
    int runs = (int)bench_opt_num(argc, argv, "--runs", 5);
    size_t nkeys = (size_t)bench_opt_num(argc, argv, "--keys", 10000);
    size_t store = (size_t)bench_opt_num(argc, argv, "--store-keys", 1000000);
    const char *summary = bench_opt(argc, argv, "--summary", NULL);
    /* e.g. "--only allow_api_1t" (or _2t, _2t_disjoint): one configuration,
     * for profiling with perf and for comparing builds side by side. */
    const char *only = bench_opt(argc, argv, "--only", NULL);
    if (runs < 1 || runs > MAX_RUNS || seconds <= 0 || nkeys < 2 || store < 1) {
        fprintf(stderr, "bench_memory: bad arguments\n");
        return 2;
    }

    bench_keys keys;
    if (bench_keys_make(&keys, nkeys, 42) < 0) {
        fprintf(stderr, "bench_memory: out of memory\n");
        return 1;
    }

    char c[32];
    printf("### Memory backend: decisions per second\n\n");
    printf("A hot set of %s keys (`user:NNNNNNN`, 12 bytes), cost 1, each thread cycling "
           "through all of them in its own shuffled order. Median of %d runs of %.1f s after "
           "a warm-up, spread (min..max) in brackets; M = million decisions per second, "
           "two threads summed. \"2 threads\" share the whole hot set; in the last column "
           "each thread has its own half of it, so no bucket is shared and only the "
           "table (shards, locks, recency lists) is.\n\n",
           bench_group(c, sizeof c, (double)nkeys), runs, seconds);
    printf("| workload | call | allowed | 1 thread | ns per decision | 2 threads | 2 threads / 1 "
           "| 2 threads, disjoint keys |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
    for (size_t wi = 0; wi < sizeof workloads / sizeof *workloads; wi++) {
        for (int injected = 0; injected <= 1; injected++) {
            char tag[64];
            if (only) {
                for (int t = 1; t <= 3; t++) {   /* 3: two threads, disjoint keys */
                    snprintf(tag, sizeof tag, "%s_%s_%s", workloads[wi].tag,
                             injected ? "inj" : "api", t == 1 ? "1t" : t == 2 ? "2t" : "2t_disjoint");
                    if (strcmp(tag, only) == 0) {
                        result r = measure(&workloads[wi], &keys, injected, t == 1 ? 1 : 2, t == 3,
                                           seconds, runs);
                        printf("| %s | %.2f M/s |\n", tag, r.median / 1e6);
                    }
                }
                continue;
            }
            result r1 = measure(&workloads[wi], &keys, injected, 1, 0, seconds, runs);
            result r2 = measure(&workloads[wi], &keys, injected, 2, 0, seconds, runs);
            result rd = measure(&workloads[wi], &keys, injected, 2, 1, seconds, runs);
            char b1[64], b2[64], b3[64];
            printf("| %s | %s | %.1f%% | %s | %.1f | %s | %.2f | %s |\n", workloads[wi].name,
                   injected ? "`hirate_decide_at` (time injected)" : "`hirate_allow`",
                   r1.allowed_frac * 100, mdps(b1, sizeof b1, &r1), 1e9 / r1.median,
                   mdps(b2, sizeof b2, &r2), r2.median / r1.median, mdps(b3, sizeof b3, &rd));
            fflush(stdout);
            snprintf(tag, sizeof tag, "mem_%s_%s_1t", workloads[wi].tag, injected ? "inj" : "api");
            bench_summary(summary, tag, r1.median);
            snprintf(tag, sizeof tag, "mem_%s_%s_2t", workloads[wi].tag, injected ? "inj" : "api");
            bench_summary(summary, tag, r2.median);
            snprintf(tag, sizeof tag, "mem_%s_%s_2t_disjoint", workloads[wi].tag,
                     injected ? "inj" : "api");
            bench_summary(summary, tag, rd.median);
        }
    }
    printf("\n");
    if (!only)
        bytes_per_key(store, summary);
    bench_progress_done();
    bench_keys_free(&keys);
    return 0;
}
