/*
 * Threads sharing one limiter against Redis: hirate_allow from T threads (one
 * decision a call, so that concurrent calls share round trips only as the
 * pool coalesces them) next to hirate_allow_many of 16 decisions a call from
 * the same T threads, in the same run.
 *
 *   bench_threads --url redis://HOST:PORT [--threads 8,50] [--pool 16,4]
 *                 [--keys 100000] [--seconds S] [--rounds R] [--summary FILE]
 *
 * Every call decides cost 1 on a key drawn uniformly from K ("bench:" + 6
 * digits, default prefix "rl:"), capacity 1e9 at 1e6/s, so that every call is
 * allowed and writes its bucket. The script is loaded first. Each
 * configuration (threads x pool) runs R rounds of allow then allow_many (the
 * order reversed every other round, so that drift falls on both) of S seconds
 * each, on a fresh limiter each; decisions/s is all threads' decisions that
 * Redis made over the run's wall time (a call that timed out and was decided
 * by the failure policy is not counted: it would flatter the client; the
 * share of those is a column of its own). The table gives the median round,
 * the ratio allow / allow_many of the medians, and the p50 and p99 of
 * hirate_allow's latency in the median round.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <hiredis/hiredis.h>

#include "bench_util.h"
#include "hirate_io.h"

#define MAX_THREADS 256
#define MAX_ROUNDS 32
#define BATCH 16
#define LAT_SAMPLES 4096

typedef struct shared {
    hirate_limiter *lim;
    long keys;
    int many;
    atomic_int stop;
    pthread_barrier_t start;
} shared;

typedef struct worker {
    pthread_t tid;
    shared *sh;
    uint64_t rng;
    uint64_t count, bad;
    double lat[LAT_SAMPLES];
    size_t nlat;
} worker;

static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void *work(void *arg)
{
    worker *w = arg;
    shared *sh = w->sh;
    char keys[BATCH][24];
    hirate_item items[BATCH];
    pthread_barrier_wait(&sh->start);
    while (!atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
        if (sh->many) {
            for (int i = 0; i < BATCH; i++) {
                int n = snprintf(keys[i], sizeof keys[i], "bench:%06ld",
                                 (long)(next_rand(&w->rng) % (uint64_t)sh->keys));
                items[i] = (hirate_item){keys[i], (size_t)n, 1, 0, {0}};
            }
            hirate_allow_many(sh->lim, items, BATCH);
            for (int i = 0; i < BATCH; i++)
                w->bad += items[i].rc != 0 || items[i].decision.source != HIRATE_SOURCE_REDIS;
            w->count += BATCH;
        } else {
            int n = snprintf(keys[0], sizeof keys[0], "bench:%06ld",
                             (long)(next_rand(&w->rng) % (uint64_t)sh->keys));
            hirate_decision d;
            int64_t t0 = bench_now_ns();
            int rc = hirate_allow(sh->lim, keys[0], (size_t)n, 1, &d);
            double us = (double)(bench_now_ns() - t0) / 1000.0;
            if (w->nlat < LAT_SAMPLES)
                w->lat[w->nlat++] = us;
            else
                w->lat[next_rand(&w->rng) % LAT_SAMPLES] = us;   /* a uniform sample, roughly */
            w->bad += rc != 0 || d.source != HIRATE_SOURCE_REDIS;
            w->count++;
        }
    }
    return NULL;
}

typedef struct run {
    double rate, p50, p99;
    double cpu_us;      /* CPU time per decision: this process' and redis-server's */
    double not_redis;   /* the share of decisions that did not come from Redis */
} run;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* CPU seconds this process has used (every thread). */
static double self_cpu(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 +
           (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec / 1e6;
}

/* CPU seconds the server has used (INFO cpu), or 0 when it cannot tell. */
static redisContext *info_conn;
static double server_cpu(void)
{
    if (!info_conn)
        return 0;
    redisReply *rep = redisCommand(info_conn, "INFO cpu");
    double sys = 0, user = 0;
    if (rep && rep->type == REDIS_REPLY_STRING) {
        const char *p = strstr(rep->str, "used_cpu_sys:");
        if (p)
            sys = atof(p + 13);
        p = strstr(rep->str, "used_cpu_user:");
        if (p)
            user = atof(p + 14);
    }
    if (rep)
        freeReplyObject(rep);
    return sys + user;
}

static run run_once(const char *url, int threads, int pool, long keys, int many, double seconds)
{
    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.capacity = 1000000000;
    o.rate = 1e6;
    o.pool_size = pool;
    char err[HIRATE_ERRMSG_SIZE];
    static shared sh;
    memset(&sh, 0, sizeof sh);
    if (hirate_limiter_new(&sh.lim, &o, err, sizeof err) < 0) {
        fprintf(stderr, "bench_threads: %s\n", err);
        exit(1);
    }
    sh.keys = keys;
    sh.many = many;
    worker *w = calloc((size_t)threads, sizeof *w);
    pthread_barrier_init(&sh.start, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) {
        w[t].sh = &sh;
        w[t].rng = 0x9e3779b97f4a7c15ull * (uint64_t)(t + 1) + (uint64_t)many;
        if (pthread_create(&w[t].tid, NULL, work, &w[t]) != 0) {
            perror("pthread_create");
            exit(1);
        }
    }
    pthread_barrier_wait(&sh.start);
    double cpu0 = self_cpu() + server_cpu();
    int64_t t0 = bench_now_ns();
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {}
    atomic_store(&sh.stop, 1);
    uint64_t count = 0, bad = 0;
    size_t nlat = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(w[t].tid, NULL);
        count += w[t].count;
        bad += w[t].bad;
        nlat += w[t].nlat;
    }
    double wall = (double)(bench_now_ns() - t0) / 1e9;
    double cpu = self_cpu() + server_cpu() - cpu0;
    /* Only Redis' decisions count: one that a timeout left to the policy
     * would flatter the client. */
    run r = {(double)(count - bad) / wall, 0, 0, count ? cpu * 1e6 / (double)count : 0,
             count ? (double)bad / (double)count : 0};
    if (nlat) {
        double *all = malloc(nlat * sizeof *all);
        size_t k = 0;
        for (int t = 0; t < threads; t++)
            for (size_t i = 0; i < w[t].nlat; i++)
                all[k++] = w[t].lat[i];
        qsort(all, nlat, sizeof *all, cmp_double);
        r.p50 = all[nlat / 2];
        r.p99 = all[(size_t)((double)nlat * 0.99)];
        free(all);
    }
    pthread_barrier_destroy(&sh.start);
    free(w);
    hirate_limiter_free(sh.lim);
    return r;
}

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    while (s && *s && n < max) {
        out[n++] = atoi(s);
        s = strchr(s, ',');
        if (s)
            s++;
    }
    return n;
}

int main(int argc, char **argv)
{
    const char *url = bench_opt(argc, argv, "--url", NULL);
    int threads[8], pools[8];
    int nt = parse_list(bench_opt(argc, argv, "--threads", "8,50"), threads, 8);
    int np = parse_list(bench_opt(argc, argv, "--pool", "16,4"), pools, 8);
    long keys = (long)bench_opt_num(argc, argv, "--keys", 100000);
    double seconds = bench_opt_num(argc, argv, "--seconds", 2.0);
    int rounds = (int)bench_opt_num(argc, argv, "--rounds", 3);
    const char *summary = bench_opt(argc, argv, "--summary", NULL);
    if (!url || rounds < 1 || rounds > MAX_ROUNDS || keys < 1 || seconds <= 0) {
        fprintf(stderr, "usage: bench_threads --url redis://HOST:PORT [--threads 8,50] "
                        "[--pool 16,4] [--keys N] [--seconds S] [--rounds R]\n");
        return 2;
    }
    for (int i = 0; i < nt; i++)
        if (threads[i] < 1 || threads[i] > MAX_THREADS) {
            fprintf(stderr, "bench_threads: 1 to %d threads\n", MAX_THREADS);
            return 2;
        }
    {   /* the script loaded, so that no run meets NOSCRIPT */
        char host[256];
        int port;
        if (sscanf(url, "redis://%255[^:/]:%d", host, &port) == 2) {
            redisContext *c = redisConnect(host, port);
            if (c && !c->err) {
                redisReply *rep = redisCommand(c, "SCRIPT LOAD %s", hirate_script_source(NULL));
                if (rep)
                    freeReplyObject(rep);
            }
            if (c && !c->err)
                info_conn = c;
            else if (c)
                redisFree(c);
        }
    }

    printf("### Threads sharing one limiter: hirate_allow next to hirate_allow_many\n\n");
    printf("%ld keys, capacity 1e9 at 1e6/s (every call allowed), median of %d rounds of "
           "%.1f s each; allow_many decides %d keys a call.\n\n", keys, rounds, seconds, BATCH);
    printf("CPU us/decision: this process' and redis-server's CPU time over the run, per "
           "decision (on a shared machine a steadier measure than decisions/s).\n\n");
    printf("| threads | pool_size | hirate_allow (decisions/s) | p50 us | p99 us | "
           "not from Redis | hirate_allow_many (decisions/s) | allow / allow_many | "
           "CPU us/decision allow | CPU us/decision allow_many |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int ti = 0; ti < nt; ti++) {
        for (int pi = 0; pi < np; pi++) {
            double a[MAX_ROUNDS], m[MAX_ROUNDS], ca[MAX_ROUNDS], cm[MAX_ROUNDS];
            run ra[MAX_ROUNDS], rm;
            for (int r = 0; r < rounds; r++) {
                bench_progress("threads %d, pool %d: round %d/%d", threads[ti], pools[pi], r + 1,
                               rounds);
                if (r % 2 == 0) {
                    ra[r] = run_once(url, threads[ti], pools[pi], keys, 0, seconds);
                    rm = run_once(url, threads[ti], pools[pi], keys, 1, seconds);
                } else {
                    rm = run_once(url, threads[ti], pools[pi], keys, 1, seconds);
                    ra[r] = run_once(url, threads[ti], pools[pi], keys, 0, seconds);
                }
                a[r] = ra[r].rate;
                m[r] = rm.rate;
                ca[r] = ra[r].cpu_us;
                cm[r] = rm.cpu_us;
            }
            double am = bench_median(a, (size_t)rounds), mm = bench_median(m, (size_t)rounds);
            run mid = ra[0];
            for (int r = 0; r < rounds; r++)
                if (ra[r].rate == am)
                    mid = ra[r];
            printf("| %d | %d | %.0f | %.0f | %.0f | %.1f%% | %.0f | %.2f | %.1f | %.1f |\n",
                   threads[ti], pools[pi], am, mid.p50, mid.p99, mid.not_redis * 100, mm, am / mm,
                   bench_median(ca, (size_t)rounds), bench_median(cm, (size_t)rounds));
            fflush(stdout);
            char tag[64];
            snprintf(tag, sizeof tag, "threads_allow_%dt_pool%d", threads[ti], pools[pi]);
            bench_summary(summary, tag, am);
            snprintf(tag, sizeof tag, "threads_many_%dt_pool%d", threads[ti], pools[pi]);
            bench_summary(summary, tag, mm);
        }
    }
    bench_progress_done();
    printf("\n");
    return 0;
}
