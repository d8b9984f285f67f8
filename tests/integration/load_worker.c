/*
 * load_worker: threads of one C process spending from one Redis key, for
 * the invariants-under-load test (test_invariants.py, which runs it next to
 * the Python and Lua workers and checks the merged logs).
 *
 *   load_worker NAME URL PREFIX KEY CAPACITY RATE SECONDS THREADS DRAIN TIMEOUT_MS LOG
 *
 * It makes one limiter (on_error "closed", so no local bucket ever admits
 * anything), prints "ready NAME" and waits for a line on stdin; then every
 * thread calls hirate_allow with costs 1 to 3 until SECONDS have passed (or,
 * with DRAIN 1, until a decision shows the bucket empty). LOG gets the lines
 * the checker reads (check_invariants.py):
 *
 *   A <time_us> <cost>                  admitted: Redis' clock, when it ran
 *   P <start_us> <end_us> <cost> <err>  decided by the policy after a failure:
 *                                       Redis may have run it, at some moment
 *                                       of the call (CLOCK_REALTIME, the clock
 *                                       Redis' TIME reads on this host)
 *   S <name> <counter>=<n> ...          what the process decided, by source
 *
 * With HIRATE_TLS_CA_FILE set, a rediss:// URL is verified against that CA
 * (the invariants' run over TLS). With HIRATE_LOG_DECISIONS=1 (the failover
 * test, test_failover.py) LOG also gets a line for every decision, in order
 * within each thread:
 *
 *   D <name> <thread> <source> <time_us|-> <allowed> <cost> <mc_before> <mc_after>
 *
 * time_us is Redis' clock for a decision of Redis ("-" for any other);
 * mc_before and mc_after are the limiter's master_changes counter just before
 * and just after the call: a call with mc_before 2 went to the master that a
 * failover promoted, one with mc_after 1 to the first master.
 *
 * Exit status 0, or 1 when a call returned an error (the message on stderr).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hirate.h"
#include "hirate_io.h"

#define MAX_EVENTS 100000

typedef struct event {
    char kind;          /* 'A' admitted, 'P' possibly admitted, 'D' a decision */
    int64_t t1, t2;     /* A: time_us; P: the call's interval; D: time_us or -1 */
    int64_t cost;
    int error;          /* P: the failure; D: the source */
    int allowed;        /* D */
    uint64_t mc1, mc2;  /* D: master_changes before and after the call */
} event;

typedef struct worker {
    hirate_limiter *lim;
    const char *key;
    int64_t deadline_us;  /* CLOCK_MONOTONIC */
    int drain;
    unsigned seed;
    int failed;           /* a call returned an error */
    uint64_t decisions, admitted, admitted_cost, refused, by_redis, by_cache, by_policy;
    size_t nevents;
    event *events;
} worker;

static atomic_int drained;   /* DRAIN: some thread saw the bucket empty */
static int log_decisions;    /* HIRATE_LOG_DECISIONS=1: a D line per decision */

static uint64_t master_changes(hirate_limiter *lim)
{
    hirate_counters s;
    hirate_counters_get(lim, &s);
    return s.master_changes;
}

static int64_t clock_us(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* A short pause between calls, so that a handful of threads contend for the
 * key without taking the whole of a shared machine's CPU. */
static void pause_us(long us)
{
    struct timespec ts = {0, us * 1000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

static void record(worker *w, char kind, int64_t t1, int64_t t2, int64_t cost, int error)
{
    if (w->nevents < MAX_EVENTS)
        w->events[w->nevents++] = (event){kind, t1, t2, cost, error, 0, 0, 0};
    else
        w->failed = 1;   /* a log cut short would hide admissions from the checker */
}

static void *run(void *arg)
{
    worker *w = arg;
    while (clock_us(CLOCK_MONOTONIC) < w->deadline_us && !(w->drain && drained)) {
        int64_t cost = 1 + rand_r(&w->seed) % 3;
        hirate_decision d;
        uint64_t mc1 = log_decisions ? master_changes(w->lim) : 0;
        int64_t start = clock_us(CLOCK_REALTIME);
        int rc = hirate_allow(w->lim, w->key, strlen(w->key), cost, &d);
        int64_t end = clock_us(CLOCK_REALTIME);
        uint64_t mc2 = log_decisions ? master_changes(w->lim) : 0;
        if (rc < 0) {
            char why[HIRATE_ERRMSG_SIZE];
            fprintf(stderr, "load_worker: %s: %s\n", hirate_err_name(rc),
                    hirate_limiter_errmsg(w->lim, why, sizeof why));
            w->failed = 1;
            break;
        }
        w->decisions++;
        if (log_decisions && w->nevents < MAX_EVENTS)
            w->events[w->nevents++] = (event){'D', d.source == HIRATE_SOURCE_REDIS ? d.time_us : -1,
                                              0, cost, d.source, d.allowed, mc1, mc2};
        else if (log_decisions)
            w->failed = 1;
        if (d.source == HIRATE_SOURCE_REDIS) w->by_redis++;
        else if (d.source == HIRATE_SOURCE_CACHE) w->by_cache++;
        else w->by_policy++;
        if (d.error) {
            /* The policy answered: the call may have run in Redis anyway. */
            record(w, 'P', start, end, cost, d.error);
        } else if (d.allowed) {
            w->admitted++;
            w->admitted_cost += (uint64_t)cost;
            record(w, 'A', d.time_us, 0, cost, 0);
        } else {
            w->refused++;
            if (w->drain && d.remaining == 0)
                drained = 1;
        }
        pause_us(200 + rand_r(&w->seed) % 300);
    }
    return NULL;
}

static int parse_i64(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 12) {
        fprintf(stderr, "usage: load_worker NAME URL PREFIX KEY CAPACITY RATE SECONDS THREADS "
                        "DRAIN TIMEOUT_MS LOG\n");
        return 2;
    }
    const char *name = argv[1], *logpath = argv[11];
    int64_t capacity, threads, drain, timeout_ms;
    double rate = strtod(argv[6], NULL), seconds = strtod(argv[7], NULL);
    if (parse_i64(argv[5], &capacity) || parse_i64(argv[8], &threads) || threads < 1 ||
        threads > 64 || parse_i64(argv[9], &drain) || parse_i64(argv[10], &timeout_ms) ||
        !(seconds > 0)) {
        fprintf(stderr, "load_worker: bad arguments\n");
        return 2;
    }

    hirate_options o;
    hirate_options_init(&o);
    o.url = argv[2];
    o.prefix = argv[3];
    o.capacity = capacity;
    o.rate = rate;
    o.on_error = HIRATE_ON_ERROR_CLOSED;
    o.timeout_ms = (int)timeout_ms;
    o.connect_timeout_ms = (int)timeout_ms;
    const char *ld = getenv("HIRATE_LOG_DECISIONS");
    log_decisions = ld && strcmp(ld, "1") == 0;
    const char *ca = getenv("HIRATE_TLS_CA_FILE");
    if (ca && *ca) o.tls_ca_file = ca;
    hirate_limiter *lim;
    char why[HIRATE_ERRMSG_SIZE];
    if (hirate_limiter_new(&lim, &o, why, sizeof why) < 0) {
        fprintf(stderr, "load_worker: %s\n", why);
        return 2;
    }

    printf("ready %s\n", name);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) {
        fprintf(stderr, "load_worker: no start signal\n");
        hirate_limiter_free(lim);
        return 2;
    }

    int64_t deadline = clock_us(CLOCK_MONOTONIC) + (int64_t)(seconds * 1e6);
    worker *ws = calloc((size_t)threads, sizeof *ws);
    pthread_t *tids = calloc((size_t)threads, sizeof *tids);
    if (!ws || !tids) {
        fprintf(stderr, "load_worker: out of memory\n");
        return 2;
    }
    for (int64_t i = 0; i < threads; i++) {
        ws[i] = (worker){.lim = lim, .key = argv[4], .deadline_us = deadline,
                         .drain = (int)drain,
                         .seed = (unsigned)getpid() * 7919u + (unsigned)i,
                         .events = malloc(MAX_EVENTS * sizeof(event))};
        if (!ws[i].events || pthread_create(&tids[i], NULL, run, &ws[i]) != 0) {
            fprintf(stderr, "load_worker: cannot start thread %" PRId64 "\n", i);
            return 2;
        }
    }

    worker sum = {0};
    FILE *log = fopen(logpath, "w");
    if (!log) {
        perror(logpath);
        return 2;
    }
    for (int64_t i = 0; i < threads; i++) {
        pthread_join(tids[i], NULL);
        worker *w = &ws[i];
        for (size_t j = 0; j < w->nevents; j++) {
            event *e = &w->events[j];
            if (e->kind == 'A')
                fprintf(log, "A %" PRId64 " %" PRId64 "\n", e->t1, e->cost);
            else if (e->kind == 'D' && e->t1 < 0)
                fprintf(log, "D %s %" PRId64 " %s - %d %" PRId64 " %" PRIu64 " %" PRIu64 "\n",
                        name, i, hirate_source_name(e->error), e->allowed, e->cost, e->mc1,
                        e->mc2);
            else if (e->kind == 'D')
                fprintf(log, "D %s %" PRId64 " %s %" PRId64 " %d %" PRId64 " %" PRIu64 " %" PRIu64
                        "\n", name, i, hirate_source_name(e->error), e->t1, e->allowed, e->cost,
                        e->mc1, e->mc2);
            else
                fprintf(log, "P %" PRId64 " %" PRId64 " %" PRId64 " %s\n", e->t1, e->t2,
                        e->cost, hirate_err_name(e->error));
        }
        sum.failed |= w->failed;
        sum.decisions += w->decisions;
        sum.admitted += w->admitted;
        sum.admitted_cost += w->admitted_cost;
        sum.refused += w->refused;
        sum.by_redis += w->by_redis;
        sum.by_cache += w->by_cache;
        sum.by_policy += w->by_policy;
        free(w->events);
    }
    fprintf(log,
            "S %s threads=%" PRId64 " decisions=%" PRIu64 " admitted=%" PRIu64
            " admitted_cost=%" PRIu64 " refused=%" PRIu64 " redis=%" PRIu64 " cache=%" PRIu64
            " policy=%" PRIu64 " errors=%d",
            name, threads, sum.decisions, sum.admitted, sum.admitted_cost, sum.refused,
            sum.by_redis, sum.by_cache, sum.by_policy, sum.failed);
    if (log_decisions)
        fprintf(log, " master_changes=%" PRIu64, master_changes(lim));
    fprintf(log, "\n");
    int bad = fclose(log) != 0 || sum.failed;
    free(ws);
    free(tids);
    hirate_limiter_free(lim);
    return bad ? 1 : 0;
}
