/*
 * The memory backend, directly (core/src/memory.h) and through the public API
 * with no URL: keys are independent, reset forgets, nothing is stored for a
 * key that has spent nothing, the table is bounded, eviction forgets full
 * buckets before drained ones, it is exact under threads, and it survives
 * fork() while another thread is using it.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bucket.h"
#include "check.h"
#include "hirate.h"
#include "hirate_io.h"
#include "memory.h"

#define SECOND 1000000LL

static hirate_bucket_cfg make_cfg(int64_t capacity, double rate)
{
    hirate_bucket_cfg cfg;
    CHECK_EQ_I64(hirate_bucket_cfg_init(&cfg, capacity, rate, NULL, 0), 0);
    return cfg;
}

static hirate_limiter *make_limiter(int64_t capacity, double rate, size_t max_keys)
{
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = capacity;
    o.rate = rate;
    o.max_keys = max_keys;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE];
    if (hirate_limiter_new(&lim, &o, why, sizeof why) < 0)
        fprintf(stderr, "hirate_limiter_new: %s\n", why);
    CHECK(lim != NULL);
    return lim;
}

/* Decides at an injected time through the memory table; returns remaining,
 * or -1000 - code on an error. */
static int64_t mem_decide(hirate_memory *m, const hirate_bucket_cfg *cfg, const char *key,
                          int64_t now, int64_t cost, int spend, hirate_decision *d)
{
    int rc = hirate_memory_decide(m, cfg, key, strlen(key), now, cost, spend, d, NULL);
    return rc < 0 ? -1000 + rc : d->remaining;
}

/* The same through the limiter. */
static int64_t lim_decide(hirate_limiter *lim, const char *key, int64_t now, int64_t cost,
                          int spend, hirate_decision *d)
{
    int rc = hirate_decide_at(lim, key, strlen(key), cost, spend, now, d);
    return rc < 0 ? -1000 + rc : d->remaining;
}

static size_t lim_keys(hirate_limiter *lim)
{
    hirate_counters st;
    hirate_counters_get(lim, &st);
    return st.memory_keys;
}

/* ---- one table, a few keys ---------------------------------------------------- */

typedef struct step {
    const char *rule;
    const char *key;
    int64_t now, cost;
    int spend;
    int reset;          /* 1: reset the key instead of deciding */
    int allowed;
    int64_t remaining;
    size_t keys;        /* buckets held afterwards */
} step;

/* capacity 10, one token a second */
static const step steps[] = {
    {"a new table holds nothing: a peek stores nothing", "a", 0, 1, 0, 0, 1, 10, 0},
    {"a cost above the capacity is refused and stores nothing", "a", 0, 11, 1, 0, 0, 10, 0},
    {"cost 0 of an unknown key stores nothing", "a", 0, 0, 1, 0, 1, 10, 0},
    {"the first spend stores a bucket", "a", 0, 10, 1, 0, 1, 0, 1},
    {"another key has its own full bucket", "b", 0, 1, 1, 0, 1, 9, 2},
    {"the first key is still drained", "a", 0, 1, 1, 0, 0, 0, 2},
    {"a peek of an unknown key stores nothing", "c", 0, 1, 0, 0, 1, 10, 2},
    {"a refusal of an unknown key stores nothing", "c", 0, 11, 1, 0, 0, 10, 2},
    {"time refills the first key only by its rate", "a", 3 * SECOND, 0, 0, 0, 1, 3, 2},
    {"the second key is full again", "b", 3 * SECOND, 0, 0, 0, 1, 10, 2},
    {"reset forgets a key", "a", 3 * SECOND, 0, 0, 1, 0, 0, 1},
    {"a forgotten key is full", "a", 3 * SECOND, 0, 0, 0, 1, 10, 1},
    {"reset of an unknown key changes nothing", "zzz", 3 * SECOND, 0, 0, 1, 0, 0, 1},
    {"the other key was not reset", "b", 3 * SECOND, 10, 1, 0, 1, 0, 1},
    {"a key differing in one byte is another key", "B", 3 * SECOND, 10, 1, 0, 1, 0, 2},
};

static void keys_are_independent_through_the_table(void)
{
    hirate_bucket_cfg cfg = make_cfg(10, 1);
    hirate_memory *m = hirate_memory_new(100, 1, 0);
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        const step *s = &steps[i];
        hirate_decision d;
        if (s->reset) {
            hirate_memory_reset(m, s->key, strlen(s->key));
        } else {
            int64_t rem = mem_decide(m, &cfg, s->key, s->now, s->cost, s->spend, &d);
            if (rem != s->remaining || d.allowed != s->allowed)
                fprintf(stderr, "case: %s\n", s->rule);
            CHECK_EQ_I64(rem, s->remaining);
            CHECK_EQ_I64(d.allowed, s->allowed);
        }
        CHECK_EQ_I64(hirate_memory_count(m), s->keys);
    }
    hirate_memory_free(m);
}

static void keys_are_independent_through_the_api(void)
{
    hirate_limiter *lim = make_limiter(10, 1, 100);
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        const step *s = &steps[i];
        hirate_decision d;
        if (s->reset) {
            CHECK_EQ_I64(hirate_reset(lim, s->key, strlen(s->key)), 0);
        } else {
            int64_t rem = lim_decide(lim, s->key, s->now, s->cost, s->spend, &d);
            if (rem != s->remaining || d.allowed != s->allowed)
                fprintf(stderr, "case: %s\n", s->rule);
            CHECK_EQ_I64(rem, s->remaining);
            CHECK_EQ_I64(d.allowed, s->allowed);
            CHECK_EQ_I64(d.source, HIRATE_SOURCE_LOCAL);
            CHECK_EQ_I64(d.time_us, s->now);
        }
        CHECK_EQ_I64(lim_keys(lim), s->keys);
    }
    hirate_limiter_free(lim);
}

static void keys_with_nul_bytes_are_whole_keys(void)
{
    hirate_limiter *lim = make_limiter(10, 1, 100);
    hirate_decision d;
    CHECK_EQ_I64(hirate_decide_at(lim, "a\0b", 3, 10, 1, 0, &d), 0);
    CHECK_EQ_I64(d.remaining, 0);
    CHECK_EQ_I64(hirate_decide_at(lim, "a\0c", 3, 1, 0, 0, &d), 0);
    CHECK_EQ_I64(d.remaining, 10);
    CHECK_EQ_I64(hirate_decide_at(lim, "a", 1, 1, 0, 0, &d), 0);
    CHECK_EQ_I64(d.remaining, 10);
    CHECK_EQ_I64(hirate_decide_at(lim, "a\0b", 3, 1, 0, 0, &d), 0);
    CHECK_EQ_I64(d.remaining, 0);
    hirate_limiter_free(lim);
}

/* The real clock: hirate_allow and hirate_peek without an injected time. */
static void the_monotonic_clock_drives_the_public_calls(void)
{
    hirate_limiter *lim = make_limiter(3, 1e-6, 100);
    hirate_decision d;
    int64_t before = hirate_monotonic_us();
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_I64(hirate_allow(lim, "k", 1, 1, &d), 0);
        CHECK_EQ_I64(d.allowed, 1);
        CHECK_EQ_I64(d.remaining, 2 - i);
    }
    CHECK_EQ_I64(hirate_allow(lim, "k", 1, 1, &d), 0);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK(d.retry_after_us > 900000000000LL);   /* a millionth of a token a second */
    CHECK_EQ_I64(hirate_peek(lim, "k", 1, 1, &d), 0);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK(d.time_us >= before && d.time_us <= hirate_monotonic_us());
    hirate_limiter_free(lim);
}

/* ---- bounded ----------------------------------------------------------------------- */

static void the_table_never_holds_more_than_max_keys(void)
{
    hirate_bucket_cfg cfg = make_cfg(10, 1);
    hirate_memory *m = hirate_memory_new(1000, 1, 0);
    hirate_limiter *lim = make_limiter(10, 1, 1000);
    size_t most = 0, most_lim = 0;
    long refused = 0;
    char key[32];
    for (int i = 0; i < 100000; i++) {
        int n = snprintf(key, sizeof key, "key-%d", i);
        hirate_decision d;
        CHECK_EQ_I64(hirate_memory_decide(m, &cfg, key, (size_t)n, i, 1, 1, &d, NULL), 0);
        if (hirate_decide_at(lim, key, (size_t)n, 1, 1, i, &d) != 0 || !d.allowed)
            refused++;
        if (i % 1000 == 999) {
            size_t c = hirate_memory_count(m), cl = lim_keys(lim);
            most = c > most ? c : most;
            most_lim = cl > most_lim ? cl : most_lim;
        }
    }
    CHECK_EQ_I64(refused, 0);
    CHECK(most <= 1000);
    CHECK(most_lim <= 1000);
    /* flooded with a hundred times as many keys, every shard is full */
    CHECK_EQ_I64(hirate_memory_count(m), 1000);
    CHECK_EQ_I64(lim_keys(lim), 1000);
    hirate_memory_free(m);
    hirate_limiter_free(lim);
}

static void a_one_key_table_holds_one_key(void)
{
    hirate_bucket_cfg cfg = make_cfg(10, 1);
    hirate_memory *m = hirate_memory_new(1, 1, 0);
    hirate_decision d;
    CHECK_EQ_I64(mem_decide(m, &cfg, "a", 0, 1, 1, &d), 9);
    CHECK_EQ_I64(mem_decide(m, &cfg, "b", 0, 2, 1, &d), 8);
    CHECK_EQ_I64(hirate_memory_count(m), 1);
    CHECK_EQ_I64(mem_decide(m, &cfg, "b", 0, 0, 0, &d), 8);
    hirate_memory_free(m);
}

/* ---- eviction ----------------------------------------------------------------------- */

/* Capacity 10, one token a second, a table of 64. "hot" is drained and is
 * the least recently used of all; every other bucket has refilled to full.
 * New keys must push out full buckets (forgetting them changes no answer),
 * never the drained one: plain LRU would forget "hot" and hand it a fresh
 * burst of 10. */
static void eviction_forgets_full_buckets_before_a_drained_one(void)
{
    enum { MAX = 64 };
    hirate_limiter *lim = make_limiter(10, 1, MAX);
    hirate_decision d;
    char key[32];

    for (int i = 0; i < MAX - 1; i++) {            /* 9 tokens each at t=0 */
        snprintf(key, sizeof key, "filler-%d", i);
        CHECK_EQ_I64(lim_decide(lim, key, 0, 1, 1, &d), 9);
    }
    CHECK_EQ_I64(lim_decide(lim, "hot", SECOND, 10, 1, &d), 0);   /* drained at t=1s */
    for (int i = 0; i < MAX - 1; i++) {            /* full again at t=1s, and newer than hot */
        snprintf(key, sizeof key, "filler-%d", i);
        CHECK_EQ_I64(lim_decide(lim, key, SECOND, 0, 0, &d), 10);
    }
    for (int i = 0; i < 20 * MAX; i++) {           /* a flood of new keys */
        snprintf(key, sizeof key, "new-%d", i);
        CHECK_EQ_I64(lim_decide(lim, key, SECOND, 1, 1, &d), 9);
        CHECK(lim_keys(lim) <= MAX);
    }
    CHECK_EQ_I64(lim_decide(lim, "hot", SECOND, 1, 0, &d), 0);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK_EQ_I64(d.retry_after_us, SECOND);
    hirate_limiter_free(lim);
}

/* No bucket is full: capacity 100, time stands still. Four drained buckets
 * are the oldest; every other bucket holds 50 or 99 tokens. Eviction takes
 * the fullest of the least recently used few, so the drained four stay;
 * plain LRU would forget them first. */
static void without_a_full_bucket_the_fullest_of_the_oldest_goes(void)
{
    enum { MAX = 64 };
    hirate_limiter *lim = make_limiter(100, 1, MAX);
    hirate_decision d;
    char key[32];

    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "drained-%d", i);
        CHECK_EQ_I64(lim_decide(lim, key, 0, 100, 1, &d), 0);
    }
    for (int i = 0; i < MAX - 4; i++) {
        snprintf(key, sizeof key, "half-%d", i);
        CHECK_EQ_I64(lim_decide(lim, key, 0, 50, 1, &d), 50);
    }
    for (int i = 0; i < 20 * MAX; i++) {
        snprintf(key, sizeof key, "new-%d", i);
        CHECK_EQ_I64(lim_decide(lim, key, 0, 1, 1, &d), 99);
    }
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "drained-%d", i);
        CHECK_EQ_I64(lim_decide(lim, key, 0, 1, 0, &d), 0);
    }
    hirate_limiter_free(lim);
}

/* One shard of 16 (max_keys 16 gives one shard): "old" is the oldest and the
 * fullest bucket that is not full, but it was used again after it was
 * stored, so it gets a second chance and "second-fullest" (8 left, never used
 * again) goes instead. Without the second chance "old" would go. */
static void a_used_bucket_gets_a_second_chance(void)
{
    hirate_bucket_cfg cfg = make_cfg(10, 0.001);
    hirate_memory *m = hirate_memory_new(16, 1, 0);
    hirate_decision d;
    char key[32];

    CHECK_EQ_I64(hirate_memory_decide(m, &cfg, "old", 3, 0, 1, 1, &d, NULL), 0);       /* 9 left */
    for (int i = 0; i < 15; i++) {
        int64_t cost = i == 2 ? 2 : 5;                            /* 8 left, else 5 */
        int n = snprintf(key, sizeof key, i == 2 ? "second-fullest" : "other-%d", i);
        CHECK_EQ_I64(hirate_memory_decide(m, &cfg, key, (size_t)n, 0, cost, 1, &d, NULL), 0);
    }
    CHECK_EQ_I64(hirate_memory_count(m), 16);
    CHECK_EQ_I64(hirate_memory_decide(m, &cfg, "old", 3, 0, 0, 0, &d, NULL), 0);       /* a use */
    CHECK_EQ_I64(hirate_memory_decide(m, &cfg, "newcomer", 8, 0, 1, 1, &d, NULL), 0);
    CHECK_EQ_I64(hirate_memory_count(m), 16);
    CHECK_EQ_I64(hirate_memory_lookup(m, &cfg, "old", 3, 0, 0, 1, &d, NULL), 1);
    CHECK_EQ_I64(d.remaining, 9);
    CHECK_EQ_I64(hirate_memory_lookup(m, &cfg, "second-fullest", 14, 0, 0, 1, &d, NULL), 0);
    hirate_memory_free(m);
}

/* ---- memory per key -------------------------------------------------------------------- */

static void a_16_byte_key_costs_at_most_128_bytes(void)
{
    enum { N = 100000, KEYLEN = 16 };
    hirate_bucket_cfg cfg = make_cfg(10, 1);
    hirate_memory *m = hirate_memory_new(1000000, 1, 0);
    char key[KEYLEN + 1];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "user:%011d", i);
        hirate_decision d;
        CHECK_EQ_I64(hirate_memory_decide(m, &cfg, key, KEYLEN, 0, 1, 1, &d, NULL), 0);
    }
    CHECK_EQ_I64(hirate_memory_count(m), N);
    double per_key = (double)hirate_memory_bytes(m) / (double)hirate_memory_count(m);
    printf("memory: %.1f bytes per key of %d bytes (%zu bytes for %d keys)\n", per_key, KEYLEN,
           hirate_memory_bytes(m), N);
    /* the target is 96 bytes a key plus the key; 16 more for malloc's rounding */
    CHECK(per_key <= 96 + KEYLEN + 16);
    CHECK(per_key >= KEYLEN + 2 * sizeof(double));   /* it counts at least the key and bucket */
    hirate_memory_free(m);
}

/* ---- threads ----------------------------------------------------------------------------- */

enum { THREADS = 8, PER_THREAD = 20000, SHARED_KEYS = 100 };
#define BIG_CAPACITY 1000000000LL

static atomic_long allows_on[SHARED_KEYS];

typedef struct worker {
    hirate_limiter *lim;
    unsigned seed;
    long errors;
} worker;

static void *allow_many(void *arg)
{
    worker *w = arg;
    char key[16];
    for (int i = 0; i < PER_THREAD; i++) {
        w->seed = w->seed * 1103515245u + 12345u;
        int k = (int)((w->seed >> 16) % SHARED_KEYS);
        int n = snprintf(key, sizeof key, "shared-%d", k);
        hirate_decision d;
        /* time stands still: only the spending changes the buckets */
        if (hirate_decide_at(w->lim, key, (size_t)n, 1, 1, SECOND, &d) != 0 || !d.allowed)
            w->errors++;
        else
            atomic_fetch_add(&allows_on[k], 1);
    }
    return NULL;
}

static void threads_spend_exactly_what_they_were_allowed(void)
{
    hirate_limiter *lim = make_limiter(BIG_CAPACITY, 0.2, 1000);
    pthread_t t[THREADS];
    worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){lim, 7919u * (unsigned)(i + 1), 0};
        pthread_create(&t[i], NULL, allow_many, &w[i]);
    }
    long errors = 0, total = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        errors += w[i].errors;
    }
    CHECK_EQ_I64(errors, 0);
    long wrong = 0;
    for (int k = 0; k < SHARED_KEYS; k++) {
        char key[16];
        int n = snprintf(key, sizeof key, "shared-%d", k);
        hirate_decision d;
        CHECK_EQ_I64(hirate_decide_at(lim, key, (size_t)n, 0, 0, SECOND, &d), 0);
        long made = atomic_load(&allows_on[k]);
        total += made;
        if (d.remaining != BIG_CAPACITY - made) {
            fprintf(stderr, "shared-%d: remaining %lld after %ld allows\n", k,
                    (long long)d.remaining, made);
            wrong++;
        }
    }
    CHECK_EQ_I64(wrong, 0);
    CHECK_EQ_I64(total, THREADS * PER_THREAD);
    CHECK_EQ_I64(lim_keys(lim), SHARED_KEYS);
    hirate_limiter_free(lim);
}

/* ---- fork ---------------------------------------------------------------------------------- */

static atomic_int stop_hammer;

static void *hammer(void *arg)
{
    hirate_limiter *lim = arg;
    char key[16];
    unsigned i = 0;
    while (!atomic_load(&stop_hammer)) {
        int n = snprintf(key, sizeof key, "h%u", i++ % 512);
        hirate_decision d;
        hirate_allow(lim, key, (size_t)n, 1, &d);
        if (i % 64 == 0)
            hirate_reset(lim, key, (size_t)n);
    }
    return NULL;
}

/* In the child: every lock must be free and the parent's buckets there. */
static int child_uses_the_limiter(hirate_limiter *lim)
{
    hirate_decision d;
    alarm(5);   /* a deadlock ends as SIGALRM, which the parent reports */
    if (hirate_peek(lim, "drained", 7, 1, &d) != 0 || d.allowed || d.remaining != 0)
        return 2;
    if (hirate_allow(lim, "child", 5, 1, &d) != 0 || !d.allowed || d.remaining != 9)
        return 3;
    for (int i = 0; i < 512; i++) {   /* every key the other thread was using */
        char key[16];
        int n = snprintf(key, sizeof key, "h%d", i);
        if (hirate_allow(lim, key, (size_t)n, 0, &d) != 0 || hirate_reset(lim, key, (size_t)n) != 0)
            return 4;
    }
    hirate_counters st;
    hirate_counters_get(lim, &st);
    if (st.memory_keys < 2)
        return 5;
    hirate_limiter_free(lim);
    return 0;
}

static void a_forked_child_can_use_the_limiter(void)
{
    hirate_limiter *lim = make_limiter(10, 1e-6, 100000);
    hirate_decision d;
    CHECK_EQ_I64(hirate_allow(lim, "drained", 7, 10, &d), 0);
    CHECK_EQ_I64(d.remaining, 0);

    pthread_t t;
    atomic_store(&stop_hammer, 0);
    pthread_create(&t, NULL, hammer, lim);
    int good = 0;
    for (int round = 0; round < 20; round++) {
        usleep(1000);   /* let the other thread get going */
        pid_t pid = fork();
        if (pid == 0)
            _exit(child_uses_the_limiter(lim));
        int status = 0;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
            good++;
        else if (WIFSIGNALED(status))
            fprintf(stderr, "fork round %d: the child died of signal %d\n", round,
                    WTERMSIG(status));
        else
            fprintf(stderr, "fork round %d: the child exited %d\n", round, WEXITSTATUS(status));
    }
    atomic_store(&stop_hammer, 1);
    pthread_join(t, NULL);
    CHECK_EQ_I64(good, 20);
    /* the parent goes on as before */
    CHECK_EQ_I64(hirate_peek(lim, "drained", 7, 1, &d), 0);
    CHECK_EQ_I64(d.remaining, 0);
    CHECK_EQ_I64(hirate_peek(lim, "child", 5, 1, &d), 0);
    CHECK_EQ_I64(d.remaining, 10);   /* the child's spending stayed in the child */
    hirate_limiter_free(lim);
}

int main(void)
{
    keys_are_independent_through_the_table();
    keys_are_independent_through_the_api();
    keys_with_nul_bytes_are_whole_keys();
    the_monotonic_clock_drives_the_public_calls();
    the_table_never_holds_more_than_max_keys();
    a_one_key_table_holds_one_key();
    eviction_forgets_full_buckets_before_a_drained_one();
    without_a_full_bucket_the_fullest_of_the_oldest_goes();
    a_used_bucket_gets_a_second_chance();
    a_16_byte_key_costs_at_most_128_bytes();
    threads_spend_exactly_what_they_were_allowed();
    a_forked_child_can_use_the_limiter();
    return check_summary("test_memory");
}
