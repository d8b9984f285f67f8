/*
 * 64 threads sharing limiters: the program ThreadSanitizer runs (label tsan),
 * and a plain and ASan test as well.
 *
 *   (a) memory backend: a hot key that cannot refill admits exactly its
 *       capacity, each admitted call seeing a different "remaining"; 512
 *       keys, hit by every thread, each admit exactly theirs; meanwhile the
 *       same threads peek, reset other keys, read stats and messages, make
 *       bad calls, and a table of 32 buckets evicts under contention;
 *   (b) Redis backend (a redis-server of its own): 64 threads on one key,
 *       with single calls and batches, admit exactly the capacity, every
 *       admitted call seeing a different "remaining";
 *   (c) outages: threads keep calling three limiters (policies local, open,
 *       closed) while the main thread stops, resumes, kills and restarts the
 *       server. No call fails, none takes longer than its bound, every
 *       decision has a source its policy allows (Redis, the deny cache, or
 *       the policy with the failure named), each policy decides during the
 *       outage, and Redis decides again after it.
 *
 * A deadlock ends the program through the harness' watchdog.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "test_time.h"
#include "hirate_io.h"
#include "redis_harness.h"

#define THREADS 64
#define SECOND 1000000LL

/* A millionth of a token a second: in the minutes a run takes, no bucket
 * gains a whole token, so every count below is exact. */
#define NO_REFILL 1e-6

static rh_server S;
static pthread_barrier_t start_line;

typedef struct opts {
    const char *url;
    int64_t capacity;
    double rate;
    size_t max_keys;
    int on_error;
    int timeout_ms, connect_timeout_ms, backoff_min_ms, backoff_max_ms;
} opts;

static hirate_limiter *make(opts c)
{
    hirate_options o;
    hirate_options_init(&o);
    o.url = c.url;
    o.capacity = c.capacity;
    o.rate = c.rate;
    o.on_error = c.on_error;
    if (c.max_keys) o.max_keys = c.max_keys;
    if (c.timeout_ms) o.timeout_ms = c.timeout_ms;
    if (c.connect_timeout_ms) o.connect_timeout_ms = c.connect_timeout_ms;
    if (c.backoff_min_ms) o.backoff_min_ms = c.backoff_min_ms;
    if (c.backoff_max_ms) o.backoff_max_ms = c.backoff_max_ms;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE] = "";
    int rc = hirate_limiter_new(&lim, &o, why, sizeof why);
    if (rc != 0)
        fprintf(stderr, "  hirate_limiter_new: %s (%s)\n", hirate_err_name(rc), why);
    CHECK_EQ_I64(rc, 0);
    return lim;
}

/* Runs fn on THREADS threads started together; each gets its index. */
typedef struct worker {
    int index;
    void *(*fn)(struct worker *);
    void *arg;
} worker;

static void *worker_main(void *p)
{
    worker *w = p;
    pthread_barrier_wait(&start_line);
    return w->fn(w);
}

static void run_threads(void *(*fn)(worker *), void *arg)
{
    pthread_t t[THREADS];
    worker w[THREADS];
    pthread_barrier_init(&start_line, NULL, THREADS);
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){i, fn, arg};
        if (pthread_create(&t[i], NULL, worker_main, &w[i]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            exit(1);
        }
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&start_line);
}

/* Failures are counted in the threads and reported by the main thread:
 * check.h's counters are not meant for many writers. */
static int failures;

static void fail(const char *what)
{
    if (__atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED) < 10)
        fprintf(stderr, "  thread: %s\n", what);
}

/* ---- (a) memory backend --------------------------------------------------------- */

#define HOT_CAPACITY 1000
#define HOT_CALLS 100          /* per thread: 6400 calls for 1000 tokens */
#define KEYS 512
#define KEY_CAPACITY 8         /* each of the 512 keys gets 64 calls */
#define SMALL_TABLE 32

static struct {
    hirate_limiter *hot, *many, *small;
    int hot_admitted;
    unsigned char hot_seen[HOT_CAPACITY];   /* remaining values of admitted calls */
    int key_admitted[KEYS];
    unsigned char key_seen[KEYS][KEY_CAPACITY];
    size_t small_most;
} mem;

static void *memory_worker(worker *w)
{
    char key[32], msg[HIRATE_ERRMSG_SIZE];
    hirate_decision d;
    for (int i = 0; i < HOT_CALLS; i++) {
        if (hirate_allow(mem.hot, "hot", 3, 1, &d) != 0) {
            fail("hot: hirate_allow failed");
            continue;
        }
        if (d.source != HIRATE_SOURCE_LOCAL || d.remaining < 0 || d.remaining >= HOT_CAPACITY ||
            (!d.allowed && d.remaining != 0)) {
            fail("hot: a decision out of range");
            continue;
        }
        if (d.allowed) {
            __atomic_fetch_add(&mem.hot_admitted, 1, __ATOMIC_RELAXED);
            if (__atomic_exchange_n(&mem.hot_seen[d.remaining], 1, __ATOMIC_RELAXED))
                fail("hot: two admitted calls saw the same remaining");
        }
        /* Around the hot key, the calls that read or change other state. */
        switch ((w->index + i) % 8) {
        case 0:
            if (hirate_peek(mem.hot, "hot", 3, 1, &d) != 0 || d.remaining < 0)
                fail("hot: peek");
            break;
        case 1: {
            int n = snprintf(key, sizeof key, "other-%d-%d", w->index, i);
            if (hirate_allow(mem.hot, key, (size_t)n, 1, &d) != 0 ||
                hirate_reset(mem.hot, key, (size_t)n) != 0)
                fail("other: allow or reset");
            break;
        }
        case 2: {
            hirate_counters st;
            hirate_counters_get(mem.hot, &st);
            if (st.memory_keys > 1 + THREADS)
                fail("stats: more keys than could exist");
            break;
        }
        case 3:
            if (hirate_allow(mem.hot, "", 0, 1, &d) != HIRATE_EKEY)
                fail("an empty key is HIRATE_EKEY");
            hirate_limiter_errmsg(mem.hot, msg, sizeof msg);
            break;
        default: {
            /* The small table: 1000 keys through 32 buckets. */
            int n = snprintf(key, sizeof key, "small-%d", (w->index * HOT_CALLS + i) % 1000);
            if (hirate_allow(mem.small, key, (size_t)n, 1, &d) != 0)
                fail("small: hirate_allow failed");
            break;
        }
        }
    }
    /* Every thread walks all keys, from its own place in the list. */
    for (int k = 0; k < KEYS; k++) {
        int key_i = (k + w->index * 8) % KEYS;
        int n = snprintf(key, sizeof key, "key-%d", key_i);
        if (hirate_allow(mem.many, key, (size_t)n, 1, &d) != 0) {
            fail("many: hirate_allow failed");
            continue;
        }
        if (d.allowed) {
            __atomic_fetch_add(&mem.key_admitted[key_i], 1, __ATOMIC_RELAXED);
            if (d.remaining < 0 || d.remaining >= KEY_CAPACITY ||
                __atomic_exchange_n(&mem.key_seen[key_i][d.remaining], 1, __ATOMIC_RELAXED))
                fail("many: two admitted calls saw the same remaining");
        }
    }
    return NULL;
}

static void memory_backend(void)
{
    mem.hot = make((opts){.capacity = HOT_CAPACITY, .rate = NO_REFILL});
    mem.many = make((opts){.capacity = KEY_CAPACITY, .rate = NO_REFILL});
    mem.small = make((opts){.capacity = 5, .rate = NO_REFILL, .max_keys = SMALL_TABLE});
    if (!mem.hot || !mem.many || !mem.small)
        return;
    run_threads(memory_worker, NULL);

    CHECK_EQ_I64(mem.hot_admitted, HOT_CAPACITY);
    int seen = 0;
    for (int i = 0; i < HOT_CAPACITY; i++)
        seen += mem.hot_seen[i];
    CHECK_EQ_I64(seen, HOT_CAPACITY);   /* 0 .. capacity-1, each once */
    int exact = 0;
    for (int k = 0; k < KEYS; k++) {
        int s = 0;
        for (int i = 0; i < KEY_CAPACITY; i++)
            s += mem.key_seen[k][i];
        exact += mem.key_admitted[k] == KEY_CAPACITY && s == KEY_CAPACITY;
    }
    CHECK_EQ_I64(exact, KEYS);
    hirate_counters st;
    hirate_counters_get(mem.hot, &st);
    CHECK_EQ_I64(st.memory_keys, 1);   /* every "other" key was reset */
    hirate_counters_get(mem.many, &st);
    CHECK_EQ_I64(st.memory_keys, KEYS);
    hirate_counters_get(mem.small, &st);
    CHECK(st.memory_keys <= SMALL_TABLE);
    CHECK(st.memory_keys >= SMALL_TABLE / 2);
    hirate_limiter_free(mem.hot);
    hirate_limiter_free(mem.many);
    hirate_limiter_free(mem.small);
}

/* ---- (b) Redis backend ----------------------------------------------------------- */

#define REDIS_CAPACITY 200
#define REDIS_CALLS 8          /* per thread, some of them as batches of 4 */

static struct {
    hirate_limiter *lim;
    int admitted, refused;
    unsigned char seen[REDIS_CAPACITY];
} red;

static void count_redis(const hirate_decision *d)
{
    /* The command timeout is far above any round trip here, so the policy
     * (closed) must never decide: only Redis or the deny cache. */
    if (d->source != HIRATE_SOURCE_REDIS && d->source != HIRATE_SOURCE_CACHE) {
        fprintf(stderr, "  redis: source %s, error %s\n", hirate_source_name(d->source),
                hirate_err_name(d->error));
        fail("redis: a decision not from Redis or the deny cache");
        return;
    }
    if (!d->allowed) {
        __atomic_fetch_add(&red.refused, 1, __ATOMIC_RELAXED);
        return;
    }
    __atomic_fetch_add(&red.admitted, 1, __ATOMIC_RELAXED);
    if (d->source != HIRATE_SOURCE_REDIS || d->remaining < 0 || d->remaining >= REDIS_CAPACITY ||
        __atomic_exchange_n(&red.seen[d->remaining], 1, __ATOMIC_RELAXED))
        fail("redis: two admitted calls saw the same remaining");
}

static void *redis_worker(worker *w)
{
    for (int i = 0; i < REDIS_CALLS; i++) {
        if ((w->index + i) % 4 == 0) {
            hirate_item items[4];
            for (int j = 0; j < 4; j++)
                items[j] = (hirate_item){"one", 3, 1, 0, {0}};
            if (hirate_allow_many(red.lim, items, 4) != 0) {
                fail("redis: hirate_allow_many failed");
                continue;
            }
            for (int j = 0; j < 4; j++) {
                if (items[j].rc != 0)
                    fail("redis: a batch item failed");
                else
                    count_redis(&items[j].decision);
            }
        } else {
            hirate_decision d;
            if (hirate_allow(red.lim, "one", 3, 1, &d) != 0)
                fail("redis: hirate_allow failed");
            else
                count_redis(&d);
        }
    }
    return NULL;
}

static void redis_backend(void)
{
    /* Generous timeouts: 64 threads under TSan on a shared machine. */
    red.lim = make((opts){.url = S.url, .capacity = REDIS_CAPACITY, .rate = NO_REFILL,
                          .on_error = HIRATE_ON_ERROR_CLOSED, .timeout_ms = 5000,
                          .connect_timeout_ms = 5000});
    if (!red.lim)
        return;
    run_threads(redis_worker, NULL);
    CHECK_EQ_I64(red.admitted, REDIS_CAPACITY);
    int seen = 0;
    for (int i = 0; i < REDIS_CAPACITY; i++)
        seen += red.seen[i];
    CHECK_EQ_I64(seen, REDIS_CAPACITY);
    /* Every call was decided: 2 of each thread's 8 are batches of 4. */
    CHECK_EQ_I64(red.admitted + red.refused, THREADS * (REDIS_CALLS - 2 + 2 * 4));
    hirate_decision d;
    CHECK_EQ_I64(hirate_peek(red.lim, "one", 3, 1, &d), 0);
    CHECK_EQ_I64(d.remaining, 0);
    hirate_limiter_free(red.lim);
}

/* ---- (c) outages --------------------------------------------------------------- */

enum { TIMEOUT_MS = 100, CONNECT_MS = 100 };
/* The longest a call may wait: a pooled connection (timeout_ms), a new
 * connection (connect_timeout_ms), EVALSHA and, after a restart, EVAL
 * (timeout_ms each). */
#define CALL_BOUND_MS (TIMEOUT_MS + CONNECT_MS + 2 * TIMEOUT_MS)
/* On top of it, scheduling: 64 threads on a shared 2-core machine, slowed
 * several times by TSan or ASan, may wait for a CPU after a timeout fires
 * (about 200 ms is typical: a pool wait and one timed-out command). */
#define MARGIN_MS 600

static const int policy_source[] = {HIRATE_SOURCE_LOCAL, HIRATE_SOURCE_FAIL_OPEN,
                                    HIRATE_SOURCE_FAIL_CLOSED};

static struct {
    hirate_limiter *lim[3];    /* by policy */
    int stop;
    int phase;                 /* the main thread's, read by the workers */
    int64_t worst_us[3];
    long redis[3], policy[3], cache[3], calls[3];
    long redis_after[3];       /* Redis decisions in the last phase */
} out;

static void *outage_worker(worker *w)
{
    int p = w->index % 3;
    hirate_limiter *lim = out.lim[p];
    int64_t worst = 0;
    long redis = 0, policy = 0, cache = 0, calls = 0, redis_after = 0;
    char key[32];
    for (int i = 0; !__atomic_load_n(&out.stop, __ATOMIC_ACQUIRE); i++) {
        int n = snprintf(key, sizeof key, "o%d-%d", w->index, i % 16);
        hirate_decision d;
        int phase = __atomic_load_n(&out.phase, __ATOMIC_ACQUIRE);
        int64_t t0 = mono_us();
        int rc = hirate_allow(lim, key, (size_t)n, 1, &d);
        int64_t dt = mono_us() - t0;
        worst = dt > worst ? dt : worst;
        calls++;
        /* A breath between calls: decisions during an outage take
         * microseconds, and 64 threads spinning on two cores would measure
         * the scheduler (a thread whose timeout fired waiting for a CPU),
         * not the limiter. */
        sleep_ms(1);
        if (rc != 0) {
            fprintf(stderr, "  outage: %s: %s\n", hirate_on_error_name(p), hirate_err_name(rc));
            fail("outage: a call failed instead of the policy deciding");
            continue;
        }
        if (d.source == HIRATE_SOURCE_REDIS || d.source == HIRATE_SOURCE_CACHE) {
            if (d.error != 0)
                fail("outage: a Redis decision with an error");
            redis += d.source == HIRATE_SOURCE_REDIS;
            cache += d.source == HIRATE_SOURCE_CACHE;
            redis_after += phase == -1 && d.source == HIRATE_SOURCE_REDIS;
        } else if (d.source == policy_source[p]) {
            policy++;
            if (d.error != HIRATE_ECONNECT && d.error != HIRATE_ETIMEDOUT &&
                d.error != HIRATE_EIO && d.error != HIRATE_EPROTO && d.error != HIRATE_ESERVER)
                fail("outage: a policy decision without the failure behind it");
            if ((p == HIRATE_ON_ERROR_OPEN && !d.allowed) ||
                (p == HIRATE_ON_ERROR_CLOSED && d.allowed))
                fail("outage: open must allow and closed must refuse");
        } else {
            fprintf(stderr, "  outage: %s policy, source %s\n", hirate_on_error_name(p),
                    hirate_source_name(d.source));
            fail("outage: a source this policy never gives");
        }
    }
    __atomic_fetch_add(&out.calls[p], calls, __ATOMIC_RELAXED);
    __atomic_fetch_add(&out.redis[p], redis, __ATOMIC_RELAXED);
    __atomic_fetch_add(&out.cache[p], cache, __ATOMIC_RELAXED);
    __atomic_fetch_add(&out.policy[p], policy, __ATOMIC_RELAXED);
    __atomic_fetch_add(&out.redis_after[p], redis_after, __ATOMIC_RELAXED);
    int64_t cur = __atomic_load_n(&out.worst_us[p], __ATOMIC_RELAXED);
    while (worst > cur && !__atomic_compare_exchange_n(&out.worst_us[p], &cur, worst, 1,
                                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return NULL;
}

static void *outage_director(void *arg)
{
    (void)arg;
    /* What the server goes through, each step held for a while. */
    static const struct {
        const char *what;
        int ms;
    } steps[] = {{"up", 300},     {"stop", 400},    {"cont", 300}, {"kill", 400},
                 {"restart", 300}, {"stop", 300},   {"kill", 300}, {"restart", 0}};
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        const char *w = steps[i].what;
        __atomic_store_n(&out.phase, (int)i, __ATOMIC_RELEASE);
        if (strcmp(w, "stop") == 0)
            rh_pause(&S);
        else if (strcmp(w, "cont") == 0)
            rh_resume(&S);
        else if (strcmp(w, "kill") == 0)
            rh_kill(&S);
        else if (strcmp(w, "restart") == 0 && rh_restart(&S) != 0)
            fail("outage: redis-server did not restart");
        sleep_ms(steps[i].ms);
    }
    /* Up for good: the breakers probe, NOSCRIPT brings EVAL, then Redis
     * decides again. Give it time even on a slow machine. */
    __atomic_store_n(&out.phase, -1, __ATOMIC_RELEASE);
    sleep_ms(1500);
    __atomic_store_n(&out.stop, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void outages(void)
{
    for (int p = 0; p < 3; p++) {
        out.lim[p] = make((opts){.url = S.url, .capacity = 1000, .rate = 100, .on_error = p,
                                 .timeout_ms = TIMEOUT_MS, .connect_timeout_ms = CONNECT_MS,
                                 .backoff_min_ms = 20, .backoff_max_ms = 200});
        if (!out.lim[p])
            return;
    }
    pthread_t director;
    pthread_create(&director, NULL, outage_director, NULL);
    run_threads(outage_worker, NULL);
    pthread_join(director, NULL);
    for (int p = 0; p < 3; p++) {
        printf("  %-6s %6ld calls: %5ld redis, %4ld cache, %5ld policy, %4ld redis after; "
               "slowest %lld ms\n", hirate_on_error_name(p), out.calls[p], out.redis[p],
               out.cache[p], out.policy[p], out.redis_after[p],
               (long long)(out.worst_us[p] / 1000));
        CHECK(out.policy[p] > 0);         /* the outage was seen */
        CHECK(out.redis_after[p] > 0);    /* and Redis came back */
        CHECK(out.worst_us[p] <= (CALL_BOUND_MS + MARGIN_MS) * 1000LL);
        hirate_limiter_free(out.lim[p]);
    }
}

int main(void)
{
    if (rh_start(&S) != 0) {
        CHECK(!"redis-server must start (is it installed and on PATH?)");
        return check_summary("test_stress");
    }
    /* Under TSan on two busy cores the whole program takes well under a
     * minute; a deadlock takes forever. */
    rh_watchdog(&S, "test_stress", 170);
    int64_t t0 = mono_us();
    memory_backend();
    printf("  memory backend: %lld ms\n", (long long)((mono_us() - t0) / 1000));
    t0 = mono_us();
    redis_backend();
    printf("  redis backend: %lld ms\n", (long long)((mono_us() - t0) / 1000));
    t0 = mono_us();
    outages();
    printf("  outages: %lld ms\n", (long long)((mono_us() - t0) / 1000));
    CHECK_EQ_I64(failures, 0);
    rh_stop(&S);
    return check_summary("test_stress");
}
