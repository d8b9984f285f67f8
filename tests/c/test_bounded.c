/*
 * Bounded memory: 10^6 distinct keys against a cap of 10^4, in the memory
 * backend (max_keys) and in the deny cache (deny_cache_keys).
 *
 *   - the entry counts (hirate_counters_get) never pass the cap;
 *   - the resident set (/proc/self/statm) stops growing once the table is
 *     full: from 10^5 keys to 10^6 it may grow by BOUND_RSS_MB at most,
 *     while keeping every key would take over 60 MB more;
 *   - eviction spares a drained bucket: with the table full of idle buckets
 *     and one key drained, 10^6 new keys later that key is still drained
 *     (forgetting it would hand it a fresh burst).
 *
 * The deny cache learns from Redis' replies. Here they are crafted and fed
 * through the op API (hirate_op_start / hirate_op_feed), which runs the
 * very code that learns from a real server's replies; what is fed is a reply
 * the script gives for a bucket it has just drained. test_policy covers the
 * same cap with a real redis-server at a smaller scale.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "hirate_io.h"

#define KEYS 1000000
#define CAP 10000
#define WARM 100000            /* keys pushed before the first RSS reading */
#define BOUND_RSS_MB 8

#if defined(__SANITIZE_ADDRESS__)
/* ASan holds freed memory in a quarantine (256 MB by default) before it can
 * be used again, which would show in the RSS as if hirate kept it. A small
 * quarantine still catches use-after-free of recent frees. ASAN_OPTIONS,
 * when set, still decides. Visible: the ASan runtime looks it up from its
 * shared library, and the build hides symbols by default. */
const char *__asan_default_options(void);
__attribute__((visibility("default"))) const char *__asan_default_options(void)
{
    return "quarantine_size_mb=1";
}
#endif

static long rss_kb(void)
{
    long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return -1;
    if (fscanf(f, "%ld %ld", &size, &resident) != 2)
        resident = -1;
    fclose(f);
    return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static hirate_counters stats(hirate_limiter *lim)
{
    hirate_counters st;
    hirate_counters_get(lim, &st);
    return st;
}

static hirate_limiter *make(const char *url)
{
    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    /* 1000 s a token: nothing refills while the test runs, so drained and
     * idle buckets stay what they are. */
    o.capacity = url ? 1 : 10;
    o.rate = 0.001;
    o.max_keys = CAP;
    o.deny_cache_keys = CAP;
    o.on_error = HIRATE_ON_ERROR_CLOSED;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE] = "";
    int rc = hirate_limiter_new(&lim, &o, why, sizeof why);
    if (rc)
        fprintf(stderr, "  hirate_limiter_new: %s\n", why);
    CHECK_EQ_I64(rc, 0);
    return lim;
}

/* ---- the memory backend ------------------------------------------------------------- */

static void the_memory_backend_stays_bounded_and_spares_the_drained(void)
{
    hirate_limiter *lim = make(NULL);
    if (!lim)
        return;
    char key[32];
    hirate_decision d;
    int bad = 0;

    /* Idle buckets, each a token short of full, fill the table. */
    for (int i = 0; i < CAP; i++) {
        int n = snprintf(key, sizeof key, "idle-%d", i);
        bad += hirate_allow(lim, key, (size_t)n, 1, &d) != 0 || !d.allowed;
    }
    /* Full: each shard holds its share of the cap, and the keys do not fall
     * evenly on the shards, so a few shards already evicted. */
    size_t filled = stats(lim).memory_keys;
    CHECK(filled <= CAP && filled >= CAP * 9 / 10);
    /* One key drained. */
    CHECK_EQ_I64(hirate_allow(lim, "drained", 7, 10, &d), 0);
    CHECK_EQ_I64(d.remaining, 0);

    size_t most = 0;
    long rss_warm = 0;
    for (int i = 0; i < KEYS; i++) {
        int n = snprintf(key, sizeof key, "new-%d", i);
        bad += hirate_allow(lim, key, (size_t)n, 1, &d) != 0 || !d.allowed || d.remaining != 9;
        if (i % 10000 == 9999) {
            size_t c = stats(lim).memory_keys;
            most = c > most ? c : most;
        }
        if (i == WARM - 1)
            rss_warm = rss_kb();
    }
    long rss_end = rss_kb();
    printf("  memory backend: at most %zu buckets for %d keys; RSS %ld kB after %d keys, "
           "%ld kB after %d\n", most, KEYS, rss_warm, WARM, rss_end, KEYS);
    CHECK_EQ_I64(bad, 0);
    CHECK(most <= CAP);
    CHECK_EQ_I64(stats(lim).memory_keys, CAP);
    CHECK(rss_warm > 0 && rss_end > 0);
    CHECK(rss_end - rss_warm <= BOUND_RSS_MB * 1024);

    /* Still drained: refused, nothing left, and the wait of a whole token
     * (1000 s at 0.001 a second), not a fresh bucket's. */
    CHECK_EQ_I64(hirate_peek(lim, "drained", 7, 1, &d), 0);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK_EQ_I64(d.remaining, 0);
    CHECK(d.retry_after_us > 990 * 1000000LL);
    hirate_limiter_free(lim);
}

/* ---- the deny cache ------------------------------------------------------------------ */

#define BATCH 1000

/* The script's reply for a bucket of capacity 1 that this call drained: allowed,
 * 0 left, level "0", stored at `at` (Redis' clock), for key prefix + key. */
static size_t drained_reply(char *buf, size_t cap, const char *key, int64_t at)
{
    return (size_t)snprintf(buf, cap,
                            "*8\r\n:1\r\n:0\r\n:0\r\n:1000000000\r\n$1\r\n0\r\n:%" PRId64
                            "\r\n:%" PRId64 "\r\n$%zu\r\nrl:%s\r\n",
                            at, at, strlen(key) + 3, key);
}

static void the_deny_cache_stays_bounded(void)
{
    hirate_limiter *lim = make("redis://127.0.0.1:1");   /* never connected to */
    if (!lim)
        return;
    static char names[BATCH][16];
    static hirate_item items[BATCH];
    static char replies[BATCH * 128];
    size_t most = 0;
    long rss_warm = 0;
    int bad = 0;
    struct timespec wall;

    for (int k0 = 0; k0 < KEYS; k0 += BATCH) {
        for (int j = 0; j < BATCH; j++) {
            snprintf(names[j], sizeof names[j], "%d", k0 + j);
            items[j] = (hirate_item){names[j], strlen(names[j]), 1, 0, {0}};
        }
        hirate_op *op;
        if (hirate_op_start(lim, items, BATCH, 1, -1, &op) != 1) {
            bad++;
            hirate_op_free(op);
            continue;
        }
        clock_gettime(CLOCK_REALTIME, &wall);
        int64_t at = (int64_t)wall.tv_sec * 1000000 + wall.tv_nsec / 1000;
        size_t len = 0, used;
        for (int j = 0; j < BATCH; j++)
            len += drained_reply(replies + len, sizeof replies - len, names[j], at);
        bad += hirate_op_feed(op, replies, len, &used) != HIRATE_IO_DONE || used != len;
        hirate_op_free(op);
        for (int j = 0; j < BATCH; j++)
            bad += items[j].rc != 0 || items[j].decision.source != HIRATE_SOURCE_REDIS ||
                   !items[j].decision.allowed;
        size_t c = stats(lim).cache_keys;
        most = c > most ? c : most;
        if (k0 + BATCH == WARM)
            rss_warm = rss_kb();
    }
    long rss_end = rss_kb();
    hirate_counters st = stats(lim);
    printf("  deny cache: at most %zu refusals held for %d keys; RSS %ld kB after %d keys, "
           "%ld kB after %d\n", most, KEYS, rss_warm, WARM, rss_end, KEYS);
    CHECK_EQ_I64(bad, 0);
    CHECK(most <= CAP);
    CHECK_EQ_I64(st.cache_keys, CAP);   /* full: each key was learnt */
    CHECK(rss_warm > 0 && rss_end > 0);
    CHECK(rss_end - rss_warm <= BOUND_RSS_MB * 1024);

    /* The last key is known: refused from the cache, nothing to send. The
     * first was evicted long ago: it goes to Redis. */
    hirate_item last = {names[BATCH - 1], strlen(names[BATCH - 1]), 1, 0, {0}};
    hirate_item first = {"0", 1, 1, 0, {0}};
    hirate_op *op;
    CHECK_EQ_I64(hirate_op_start(lim, &last, 1, 1, -1, &op), 0);
    CHECK_EQ_I64(last.rc, 0);
    CHECK_EQ_I64(last.decision.source, HIRATE_SOURCE_CACHE);
    CHECK_EQ_I64(last.decision.allowed, 0);
    CHECK_EQ_I64(hirate_op_start(lim, &first, 1, 1, -1, &op), 1);
    hirate_op_free(op);
    hirate_limiter_free(lim);
}

int main(void)
{
    the_memory_backend_stays_bounded_and_spares_the_drained();
    the_deny_cache_stays_bounded();
    return check_summary("test_bounded");
}
