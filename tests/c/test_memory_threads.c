/*
 * 64 threads on one memory-backed limiter admit exactly what its buckets
 * hold, through hirate_allow (the real clock), on disjoint and on shared
 * keys. The rate is so small (1e-9 tokens a second) that no bucket gains a
 * token during the run, so the totals are exact: capacity x keys. `make
 * test-tsan` runs it under ThreadSanitizer (label tsan).
 *
 *   disjoint: thread t owns KEYS keys of its own and asks each of them
 *             CAPACITY + EXTRA times: it alone admits CAPACITY x KEYS;
 *   shared:   every thread asks each of the same KEYS keys CAPACITY + EXTRA
 *             times, each in its own order: all of them together admit
 *             CAPACITY x KEYS, and every key is left with 0 tokens.
 */
#include <pthread.h>
#include <stdio.h>

#include "check.h"
#include "hirate_io.h"   /* hirate_counters_get: the buckets held */

#define THREADS 64
#define KEYS 32
#define CAPACITY 5
#define EXTRA 3

typedef struct worker {
    pthread_t tid;
    hirate_limiter *lim;
    int id, shared;
    pthread_barrier_t *start;
    long allowed, failed;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    char key[32];
    hirate_decision d;
    pthread_barrier_wait(w->start);
    for (int round = 0; round < CAPACITY + EXTRA; round++) {
        for (int k = 0; k < KEYS; k++) {
            /* shared: each thread starts at another key */
            int i = w->shared ? (k + w->id) % KEYS : k;
            int n = w->shared ? snprintf(key, sizeof key, "shared:%d", i)
                              : snprintf(key, sizeof key, "t%d:k%d", w->id, i);
            if (hirate_allow(w->lim, key, (size_t)n, 1, &d) < 0)
                w->failed++;
            else
                w->allowed += d.allowed;
        }
    }
    return NULL;
}

static hirate_limiter *new_limiter(void)
{
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = CAPACITY;
    o.rate = 1e-9;
    hirate_limiter *lim = NULL;
    char err[HIRATE_ERRMSG_SIZE];
    if (hirate_limiter_new(&lim, &o, err, sizeof err) < 0) {
        fprintf(stderr, "hirate_limiter_new: %s\n", err);
        return NULL;
    }
    return lim;
}

static void run(int shared)
{
    hirate_limiter *lim = new_limiter();
    CHECK(lim != NULL);
    if (!lim)
        return;
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, THREADS);
    worker w[THREADS];
    for (int t = 0; t < THREADS; t++) {
        w[t] = (worker){.lim = lim, .id = t, .shared = shared, .start = &start};
        CHECK_EQ_I64(pthread_create(&w[t].tid, NULL, work, &w[t]), 0);
    }
    long total = 0, failed = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(w[t].tid, NULL);
        total += w[t].allowed;
        failed += w[t].failed;
        if (!shared)   /* each thread's own keys: exactly theirs */
            CHECK_EQ_I64(w[t].allowed, CAPACITY * KEYS);
    }
    pthread_barrier_destroy(&start);
    CHECK_EQ_I64(failed, 0);
    CHECK_EQ_I64(total, (long)CAPACITY * KEYS * (shared ? 1 : THREADS));

    /* every bucket is empty, and each key has one */
    hirate_decision d;
    char key[32];
    int empty = 0;
    for (int k = 0; k < KEYS; k++) {
        int n = shared ? snprintf(key, sizeof key, "shared:%d", k)
                       : snprintf(key, sizeof key, "t%d:k%d", THREADS - 1, k);
        if (hirate_peek(lim, key, (size_t)n, 1, &d) == 0 && !d.allowed && d.remaining == 0)
            empty++;
    }
    CHECK_EQ_I64(empty, KEYS);
    /* the stripes of the counters add up to every call */
    hirate_stats st;
    CHECK_EQ_I64(hirate_stats_get(lim, &st, sizeof st), 0);
    long calls = (long)THREADS * KEYS * (CAPACITY + EXTRA);
    CHECK_EQ_I64(st.decisions[HIRATE_SOURCE_LOCAL], calls);
    CHECK_EQ_I64(st.refused, calls - total);
    CHECK_EQ_I64(st.peeks, KEYS);
    hirate_counters c;
    hirate_counters_get(lim, &c);
    CHECK_EQ_I64(c.memory_keys, KEYS * (shared ? 1 : THREADS));
    hirate_limiter_free(lim);
}

int main(void)
{
    run(0);
    run(1);
    return check_summary("test_memory_threads");
}
