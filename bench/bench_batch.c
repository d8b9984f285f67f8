/*
 * Batch throughput against the ceiling: hirate_allow_many next to
 * redis-benchmark pipelining the very same script call, on one redis-server.
 *
 *   bench_batch --url redis://HOST:PORT [--rounds R] [--seconds S]
 *               [--redis-benchmark PATH] [--summary FILE]
 *
 * The script is loaded first (SCRIPT LOAD of hirate_script_source(); the
 * server must name hirate_script_sha1()). Every client decides cost 1 on keys
 * drawn uniformly from 10,000, "rl:bench:" + 12 digits, with capacity 1e9 and
 * rate 1e6/s, so every call is allowed and writes its bucket:
 *
 *   redis-benchmark -h HOST -p PORT -c C -P 16 -n N -r 10000 --csv \
 *       EVALSHA <sha1> 1 rl:bench:__rand_int__ 1000000000 1e+06 1 1
 *     with C = 50 (its default) and C = 1; N is set from a calibration run
 *     so that one run lasts about S seconds; decisions/s is its own figure.
 *   hirate_allow_many(lim, items, B) with B = 16 and B = 100, on 1 and 2
 *     threads sharing one limiter (so each thread has its own connection
 *     from the pool and its own pipelined round trips), keys "bench:" + 12
 *     digits under the default prefix "rl:", for S seconds; decisions/s is
 *     all threads' decisions over the time from the start to the last one.
 *
 * Each configuration is warmed up, then R rounds run them all, in one order
 * and then the reverse (A B ... B A ...), so that drift in the machine's speed
 * falls on all of them; the table gives the median round and the spread. For
 * every run the server's statistics are reset first (CONFIG RESETSTAT) and
 * read after: INFO commandstats (usec_per_call of EVALSHA, the script's own
 * time inside the server, and a check that every call succeeded) and INFO cpu
 * (the server's CPU time over the run's wall time: how busy it was).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "bench_util.h"
#include "hirate_io.h"

#define MAX_ROUNDS 32
#define MAX_THREADS 2
#define NKEYS 10000
#define KEYLEN 18            /* "bench:" + 12 digits, as __rand_int__ */
#define CAPACITY 1000000000LL
#define RATE 1e6
#define PIPELINE 16

extern char **environ;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("bench_batch: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

typedef struct config {
    const char *label;        /* for the table */
    const char *tag;          /* for the summary */
    int rb_clients;           /* > 0: redis-benchmark -c rb_clients -P 16 */
    size_t batch;             /* hirate: items per hirate_allow_many */
    int threads;
    long rb_n;                /* redis-benchmark: -n, from the calibration */
    double rate[MAX_ROUNDS];  /* decisions/s of each round */
    double usec[MAX_ROUNDS];  /* server usec_per_call of EVALSHA */
    double busy[MAX_ROUNDS];  /* server CPU time / wall time */
} config;

typedef struct env {
    char host[256];
    int port;
    char portstr[16];
    const char *rb;           /* the redis-benchmark program */
    redisContext *admin;
    hirate_limiter *lim;
    char (*keys)[KEYLEN + 1];
} env;

/* ---- the server's own view ---------------------------------------------------- */

typedef struct server_stats {
    double calls, usec_per_call, failed, rejected;
    double cpu;               /* used_cpu_user + used_cpu_sys, seconds */
} server_stats;

static double info_field(const char *text, const char *after, const char *field)
{
    const char *p = after ? strstr(text, after) : text;
    if (!p)
        return -1;
    const char *eol = strchr(p, '\n');
    p = strstr(p, field);
    if (!p || (after && eol && p > eol))
        return -1;
    return strtod(p + strlen(field), NULL);
}

static void reset_stats(env *e)
{
    redisReply *r = redisCommand(e->admin, "CONFIG RESETSTAT");
    if (!r || r->type == REDIS_REPLY_ERROR)
        fail("CONFIG RESETSTAT failed");
    freeReplyObject(r);
}

static server_stats read_stats(env *e)
{
    server_stats s;
    redisReply *r = redisCommand(e->admin, "INFO commandstats");
    if (!r || r->type != REDIS_REPLY_STRING)
        fail("INFO commandstats failed");
    /* The script's calls: EVALSHA's (redis-benchmark's, hirate's with
     * functions off) and FCALL's (hirate's by default) together. */
    static const char *const cmds[] = {"cmdstat_evalsha:", "cmdstat_fcall:"};
    double usec = 0;
    s.calls = s.failed = s.rejected = 0;
    for (int i = 0; i < 2; i++) {
        double calls = info_field(r->str, cmds[i], "calls=");
        if (calls <= 0)
            continue;
        s.calls += calls;
        usec += calls * info_field(r->str, cmds[i], "usec_per_call=");
        s.failed += info_field(r->str, cmds[i], "failed_calls=");
        s.rejected += info_field(r->str, cmds[i], "rejected_calls=");
    }
    s.usec_per_call = s.calls > 0 ? usec / s.calls : -1;
    freeReplyObject(r);
    r = redisCommand(e->admin, "INFO cpu");
    if (!r || r->type != REDIS_REPLY_STRING)
        fail("INFO cpu failed");
    s.cpu = info_field(r->str, NULL, "used_cpu_user:") + info_field(r->str, NULL, "used_cpu_sys:");
    freeReplyObject(r);
    return s;
}

static double server_cpu(env *e)
{
    return read_stats(e).cpu;
}

/* ---- redis-benchmark -------------------------------------------------------------- */

/* Runs redis-benchmark; returns its requests per second. */
static double run_redis_benchmark(env *e, int clients, long n)
{
    char cs[16], ns[32], ps[16], rs[16];
    snprintf(cs, sizeof cs, "%d", clients);
    snprintf(ns, sizeof ns, "%ld", n);
    snprintf(ps, sizeof ps, "%d", PIPELINE);
    snprintf(rs, sizeof rs, "%d", NKEYS);
    char *argv[] = {(char *)e->rb, "-h", e->host, "-p", e->portstr, "-c", cs, "-P", ps,
                    "-n", ns, "-r", rs, "--csv", "EVALSHA", (char *)hirate_script_sha1(), "1",
                    "rl:bench:__rand_int__", "1000000000", "1e+06", "1", "1", NULL};
    int fd[2];
    if (pipe(fd) < 0)
        fail("pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    posix_spawn_file_actions_addclose(&fa, fd[1]);
    pid_t pid;
    int rc = posix_spawnp(&pid, e->rb, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    if (rc != 0)
        fail("cannot run %s: %s", e->rb, strerror(rc));
    char out[8192];
    size_t len = 0;
    for (;;) {
        ssize_t k = read(fd[0], out + len, sizeof out - 1 - len);
        if (k > 0)
            len += (size_t)k;
        else if (k == 0 || (errno != EINTR && errno != EAGAIN) || len == sizeof out - 1)
            break;
    }
    out[len] = '\0';
    close(fd[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("%s failed (status %d): %s", e->rb, status, out);
    /* --csv: a header line, then "<test>","<rps>","<avg ms>",... */
    const char *row = strstr(out, "\"EVALSHA ");
    const char *p = row ? strstr(row, "\",\"") : NULL;
    double rps = p ? strtod(p + 3, NULL) : 0;
    if (rps <= 0)
        fail("no requests per second in the output of %s: %s", e->rb, out);
    return rps;
}

/* ---- hirate_allow_many ------------------------------------------------------------- */

typedef struct shared {
    env *e;
    size_t batch;
    pthread_barrier_t start;
    atomic_int stop;
} shared;

typedef struct worker {
    pthread_t tid;
    shared *sh;
    uint64_t rng;
    uint64_t decisions, bad;
    int first_bad_rc, first_bad_source;
    int64_t end_ns;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    shared *sh = w->sh;
    size_t b = sh->batch;
    hirate_item *items = calloc(b, sizeof *items);
    if (!items)
        fail("out of memory");
    pthread_barrier_wait(&sh->start);
    while (!atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
        for (size_t j = 0; j < b; j++) {
            items[j].key = sh->e->keys[bench_rand(&w->rng) % NKEYS];
            items[j].keylen = KEYLEN;
            items[j].cost = 1;
        }
        if (hirate_allow_many(sh->e->lim, items, b) < 0)
            fail("hirate_allow_many failed");
        for (size_t j = 0; j < b; j++) {
            const hirate_item *it = &items[j];
            if (it->rc < 0 || it->decision.source != HIRATE_SOURCE_REDIS || !it->decision.allowed) {
                if (!w->bad++) {
                    w->first_bad_rc = it->rc;
                    w->first_bad_source = it->decision.source;
                }
            }
        }
        w->decisions += b;
    }
    w->end_ns = bench_now_ns();
    free(items);
    return NULL;
}

/* Returns decisions per second over `seconds`; *decisions gets the count. */
static double run_hirate(env *e, size_t batch, int threads, double seconds, uint64_t seed,
                         uint64_t *decisions)
{
    shared sh;
    memset(&sh, 0, sizeof sh);
    sh.e = e;
    sh.batch = batch;
    pthread_barrier_init(&sh.start, NULL, (unsigned)threads + 1);
    worker w[MAX_THREADS];
    memset(w, 0, sizeof w);
    for (int t = 0; t < threads; t++) {
        w[t].sh = &sh;
        w[t].rng = seed * 1000 + (uint64_t)t;
        if (pthread_create(&w[t].tid, NULL, work, &w[t]) != 0)
            fail("pthread_create failed");
    }
    pthread_barrier_wait(&sh.start);
    int64_t t0 = bench_now_ns();
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
    atomic_store(&sh.stop, 1);
    int64_t last = t0;
    *decisions = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(w[t].tid, NULL);
        if (w[t].bad) {
            char msg[HIRATE_ERRMSG_SIZE];
            fail("%llu of hirate's decisions were not allowed by Redis (first: %s, source %s: %s)",
                 (unsigned long long)w[t].bad, hirate_err_name(w[t].first_bad_rc),
                 hirate_source_name(w[t].first_bad_source),
                 hirate_limiter_errmsg(e->lim, msg, sizeof msg));
        }
        if (w[t].end_ns > last)
            last = w[t].end_ns;
        *decisions += w[t].decisions;
    }
    pthread_barrier_destroy(&sh.start);
    return (double)*decisions / ((double)(last - t0) / 1e9);
}

/* ---- one measured run of one configuration ------------------------------------------ */

static void measure(env *e, config *c, int round, double seconds)
{
    reset_stats(e);
    double cpu0 = server_cpu(e);
    int64_t w0 = bench_now_ns();
    double expected, extra = 0;
    if (c->rb_clients) {
        c->rate[round] = run_redis_benchmark(e, c->rb_clients, c->rb_n);
        expected = (double)c->rb_n;
        /* Its clients keep whole pipelines in flight: it may send up to
         * one more pipeline each than it counts. */
        extra = (double)c->rb_clients * PIPELINE;
    } else {
        uint64_t n;
        c->rate[round] = run_hirate(e, c->batch, c->threads, seconds,
                                    (uint64_t)round * 100 + c->batch + (uint64_t)c->threads, &n);
        expected = (double)n;
    }
    int64_t w1 = bench_now_ns();
    server_stats s = read_stats(e);
    if (s.calls < expected || s.calls > expected + extra || s.failed != 0 || s.rejected != 0)
        fail("%s: the server counted %.0f EVALSHA (%.0f failed, %.0f rejected), expected %.0f",
             c->label, s.calls, s.failed, s.rejected, expected);
    c->usec[round] = s.usec_per_call;
    c->busy[round] = (s.cpu - cpu0) / ((double)(w1 - w0) / 1e9);
}

int main(int argc, char **argv)
{
    const char *url = bench_opt(argc, argv, "--url", NULL);
    int rounds = (int)bench_opt_num(argc, argv, "--rounds", 3);
    double seconds = bench_opt_num(argc, argv, "--seconds", 2.0);
    const char *summary = bench_opt(argc, argv, "--summary", NULL);
    env e;
    memset(&e, 0, sizeof e);
    e.rb = bench_opt(argc, argv, "--redis-benchmark", "redis-benchmark");
    if (!url || rounds < 1 || rounds > MAX_ROUNDS || seconds <= 0) {
        fprintf(stderr, "usage: bench_batch --url redis://HOST:PORT [--rounds R] [--seconds S] "
                        "[--redis-benchmark PATH] [--summary FILE]\n");
        return 2;
    }
    if (sscanf(url, "redis://%255[^:/]:%d", e.host, &e.port) != 2)
        fail("--url must be redis://HOST:PORT, got %s", url);
    snprintf(e.portstr, sizeof e.portstr, "%d", e.port);

    e.admin = redisConnect(e.host, e.port);
    if (!e.admin || e.admin->err)
        fail("cannot connect to %s", url);
    size_t slen;
    const char *src = hirate_script_source(&slen);
    redisReply *r = redisCommand(e.admin, "SCRIPT LOAD %b", src, slen);
    if (!r || r->type != REDIS_REPLY_STRING || strcmp(r->str, hirate_script_sha1()) != 0)
        fail("SCRIPT LOAD failed or named another SHA1");
    freeReplyObject(r);

    e.keys = calloc(NKEYS, sizeof *e.keys);
    if (!e.keys)
        fail("out of memory");
    for (int i = 0; i < NKEYS; i++)
        snprintf(e.keys[i], sizeof e.keys[i], "bench:%012d", i);   /* as __rand_int__ */

    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.capacity = CAPACITY;
    o.rate = RATE;
    o.timeout_ms = 2000;   /* a batch of 100 behind another client's must not time out */
    char err[HIRATE_ERRMSG_SIZE];
    if (hirate_limiter_new(&e.lim, &o, err, sizeof err) < 0)
        fail("%s", err);

    config cfg[] = {
        {"`redis-benchmark -c 50 -P 16` (its default 50 clients)", "rb_c50", 50, 0, 0, 0, {0}, {0}, {0}},
        {"`hirate_allow_many`, batches of 16, 1 thread", "h16x1", 0, 16, 1, 0, {0}, {0}, {0}},
        {"`hirate_allow_many`, batches of 16, 2 threads", "h16x2", 0, 16, 2, 0, {0}, {0}, {0}},
        {"`hirate_allow_many`, batches of 100, 1 thread", "h100x1", 0, 100, 1, 0, {0}, {0}, {0}},
        {"`hirate_allow_many`, batches of 100, 2 threads", "h100x2", 0, 100, 2, 0, {0}, {0}, {0}},
        {"`redis-benchmark -c 1 -P 16` (one client)", "rb_c1", 1, 0, 0, 0, {0}, {0}, {0}},
    };
    int ncfg = (int)(sizeof cfg / sizeof cfg[0]);

    /* Warm-up and calibration: connections made, keys written, and -n set
     * so that a redis-benchmark run lasts about `seconds`. */
    for (int k = 0; k < ncfg; k++) {
        config *c = &cfg[k];
        bench_progress("batch: warm-up: %s", c->tag);
        if (c->rb_clients) {
            double rps = run_redis_benchmark(&e, c->rb_clients, 20000);
            c->rb_n = (long)(rps * seconds / 1000 + 1) * 1000;
        } else {
            uint64_t n;
            run_hirate(&e, c->batch, c->threads, 0.3, 999, &n);
        }
    }
    for (int round = 0; round < rounds; round++) {
        for (int k = 0; k < ncfg; k++) {
            config *c = &cfg[round % 2 ? ncfg - 1 - k : k];
            bench_progress("batch: round %d/%d: %s", round + 1, rounds, c->tag);
            measure(&e, c, round, seconds);
        }
    }
    bench_progress_done();

    double ceiling = 0;
    char n50[32], n1[32];
    bench_group(n50, sizeof n50, (double)cfg[0].rb_n);
    bench_group(n1, sizeof n1, (double)cfg[ncfg - 1].rb_n);
    printf("### Batches: decisions per second against the redis-benchmark ceiling\n\n");
    printf("The same script call (EVALSHA, capacity 1e9, rate 1e6/s, cost 1, so every call is "
           "allowed and writes its bucket) on keys drawn uniformly from 10,000 "
           "(`rl:bench:` + 12 digits), against one redis-server over TCP to 127.0.0.1. "
           "redis-benchmark: `redis-benchmark -c C -P %d -n N -r %d --csv EVALSHA <sha1> 1 "
           "rl:bench:__rand_int__ 1000000000 1e+06 1 1`, N set so that a run lasts about "
           "%.1f s (%s for 50 clients, %s for one), its own requests per second. hirate: "
           "`hirate_allow_many` on 1 or 2 threads sharing one limiter, each thread its own "
           "pipelined round trips on its own pooled connection, for %.1f s. %d round%s, each "
           "running every configuration, in reverse order every other round; median round "
           "and spread (min..max). Server µs per call: `usec_per_call` of EVALSHA in `INFO "
           "commandstats` (the script's own time); server busy: its CPU time (`INFO cpu`) "
           "over the run's wall time.\n\n",
           PIPELINE, NKEYS, seconds, n50, n1, seconds, rounds, rounds == 1 ? "" : "s");
    printf("| client | decisions/s | spread | vs redis-benchmark -c 50 | server µs per call | "
           "server busy |\n");
    printf("|---|---:|---:|---:|---:|---:|\n");
    for (int k = 0; k < ncfg; k++) {
        config *c = &cfg[k];
        double tmp[MAX_ROUNDS];
        memcpy(tmp, c->rate, sizeof tmp);
        double med = bench_median(tmp, (size_t)rounds);
        double lo = bench_min(c->rate, (size_t)rounds), hi = bench_max(c->rate, (size_t)rounds);
        memcpy(tmp, c->usec, sizeof tmp);
        double usec = bench_median(tmp, (size_t)rounds);
        memcpy(tmp, c->busy, sizeof tmp);
        double busy = bench_median(tmp, (size_t)rounds);
        if (k == 0)
            ceiling = med;
        char m[32], a[32], b[32];
        printf("| %s | %s | %s..%s | %.3f | %.2f | %.0f%% |\n", c->label,
               bench_group(m, sizeof m, med), bench_group(a, sizeof a, lo),
               bench_group(b, sizeof b, hi), med / ceiling, usec, 100 * busy);
        char name[64];
        snprintf(name, sizeof name, "batch_%s_rate", c->tag);
        bench_summary(summary, name, med);
        snprintf(name, sizeof name, "batch_%s_min", c->tag);
        bench_summary(summary, name, lo);
        snprintf(name, sizeof name, "batch_%s_max", c->tag);
        bench_summary(summary, name, hi);
        snprintf(name, sizeof name, "batch_%s_usec", c->tag);
        bench_summary(summary, name, usec);
        snprintf(name, sizeof name, "batch_%s_busy", c->tag);
        bench_summary(summary, name, busy);
        if (c->rb_clients) {
            snprintf(name, sizeof name, "batch_%s_n", c->tag);
            bench_summary(summary, name, (double)c->rb_n);
        }
    }
    printf("\n");

    hirate_limiter_free(e.lim);
    redisFree(e.admin);
    free(e.keys);
    return 0;
}
