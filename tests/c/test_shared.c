/*
 * The shared in-memory backend (hirate_options.shared): processes forked
 * after the limiter is made spend one set of buckets, exactly; a process
 * killed while it holds a shard's lock (even halfway through writing a
 * bucket) neither blocks the others nor changes their answers; the table is
 * bounded by max_keys; threads of one process share it too (TSan).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "hirate.h"
#include "hirate_io.h"
#include "shm.h"

#define CHILDREN 8

static hirate_limiter *make(int shared, int64_t capacity, size_t max_keys)
{
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = capacity;
    o.rate = 0.001;   /* no token comes back while the test runs */
    o.max_keys = max_keys;
    o.shared = shared;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE];
    if (hirate_limiter_new(&lim, &o, why, sizeof why) < 0)
        fprintf(stderr, "hirate_limiter_new: %s\n", why);
    return lim;
}

/* CHILDREN processes, each running fn(lim, i) and reporting a number; the
 * sum of the numbers (-1 when a child failed). */
static int64_t in_children(hirate_limiter *lim, int64_t (*fn)(hirate_limiter *, int))
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pids[CHILDREN];
    for (int i = 0; i < CHILDREN; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            close(fds[0]);
            int64_t n = fn(lim, i);
            _exit(write(fds[1], &n, sizeof n) == sizeof n ? 0 : 3);
        }
    }
    close(fds[1]);
    int64_t sum = 0, n;
    int got = 0;
    while (read(fds[0], &n, sizeof n) == sizeof n) {
        sum += n;
        got++;
    }
    close(fds[0]);
    int ok = got == CHILDREN;
    for (int i = 0; i < CHILDREN; i++) {
        int status;
        ok &= pids[i] > 0 && waitpid(pids[i], &status, 0) == pids[i] && WIFEXITED(status) &&
              WEXITSTATUS(status) == 0;
    }
    return ok ? sum : -1;
}

static int64_t spend_300(hirate_limiter *lim, int i)
{
    (void)i;
    int64_t allowed = 0;
    for (int k = 0; k < 300; k++) {
        hirate_decision d;
        if (hirate_allow(lim, "k", 1, 1, &d) != 0)
            return -100000;
        allowed += d.allowed;
    }
    return allowed;
}

static void forked_processes_spend_exactly_the_capacity(void)
{
    hirate_limiter *lim = make(1, 1000, 1000);
    CHECK(lim != NULL);
    if (!lim)
        return;
    /* 8 x 300 asked, 1000 held: exactly 1000 pass, whatever the order. */
    CHECK_EQ_I64(in_children(lim, spend_300), 1000);
    hirate_decision d;
    CHECK_EQ_I64(hirate_peek(lim, "k", 1, 1, &d), 0);
    CHECK_EQ_I64(d.remaining, 0);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_LOCAL);
    /* The parent spent nothing: its own counts say so; its table is theirs. */
    hirate_stats st;
    CHECK_EQ_I64(hirate_stats_get(lim, &st, sizeof st), 0);
    CHECK_EQ_I64(st.decisions[HIRATE_SOURCE_LOCAL], 0);
    CHECK_EQ_I64(st.peeks, 1);
    hirate_limiter_free(lim);

    /* Without shared, each child has a copy of its own: 8 x 300 pass. */
    lim = make(0, 1000, 1000);
    CHECK_EQ_I64(in_children(lim, spend_300), CHILDREN * 300);
    CHECK_EQ_I64(hirate_peek(lim, "k", 1, 1, &d), 0);
    CHECK_EQ_I64(d.remaining, 1000);
    hirate_limiter_free(lim);
}

static int64_t spend_bands(hirate_limiter *lim, int i)
{
    (void)i;
    int64_t allowed = 0;
    for (int k = 0; k < 100; k++) {
        hirate_decision d, per[2];
        if (hirate_allow_bands(lim, "b", 1, 1, &d, per, 2) != 0)
            return -100000;
        allowed += d.allowed;
    }
    return allowed;
}

static void every_band_is_shared_and_spent_all_or_nothing(void)
{
    hirate_band bands[2] = {{500, 0.001, "burst"}, {120, 0.0001, "daily"}};
    hirate_options o;
    hirate_options_init(&o);
    o.bands = bands;
    o.nbands = 2;
    o.shared = 1;
    hirate_limiter *lim = NULL;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, NULL, 0), 0);
    if (!lim)
        return;
    CHECK_EQ_I64(in_children(lim, spend_bands), 120);
    hirate_decision d, per[2];
    CHECK_EQ_I64(hirate_peek_bands(lim, "b", 1, 1, &d, per, 2), 0);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK_EQ_I64(d.band, 1);
    CHECK_EQ_I64(per[0].remaining, 380);
    CHECK_EQ_I64(per[0].allowed, 1);
    CHECK_EQ_I64(per[1].remaining, 0);
    CHECK_EQ_I64(per[1].allowed, 0);
    hirate_limiter_free(lim);
}

static int64_t spend_in_fallback(hirate_limiter *lim, int i)
{
    (void)i;
    int64_t allowed = 0;
    for (int k = 0; k < 30; k++) {
        hirate_decision d;
        if (hirate_allow(lim, "f", 1, 1, &d) != 0 || d.source != HIRATE_SOURCE_LOCAL ||
            d.error != HIRATE_ECONNECT)
            return -100000;
        allowed += d.allowed;
    }
    return allowed;
}

static void the_local_fallback_is_shared_too(void)
{
    /* Nothing listens on port 1: every call is an outage, which the
     * fallback answers, from one table for every process. */
    hirate_options o;
    hirate_options_init(&o);
    o.url = "redis://127.0.0.1:1";
    o.capacity = 100;
    o.rate = 0.001;
    o.shared = 1;
    hirate_limiter *lim = NULL;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, NULL, 0), 0);
    if (!lim)
        return;
    CHECK_EQ_I64(in_children(lim, spend_in_fallback), 100);
    hirate_counters c;
    hirate_counters_get(lim, &c);
    CHECK_EQ_I64(c.local_keys, 1);
    hirate_limiter_free(lim);
}

static int64_t drain_then_report(hirate_limiter *lim, int i)
{
    hirate_decision d;
    if (i == 0 && hirate_allow(lim, "r", 1, 50, &d) != 0)
        return -1;
    return 0;
}

static int64_t remaining_of_r(hirate_limiter *lim, int i)
{
    hirate_decision d;
    (void)i;
    return hirate_peek(lim, "r", 1, 1, &d) == 0 ? d.remaining : -100000;
}

static void a_reset_is_seen_by_every_process(void)
{
    hirate_limiter *lim = make(1, 50, 100);
    CHECK_EQ_I64(in_children(lim, drain_then_report), 0);
    CHECK_EQ_I64(in_children(lim, remaining_of_r), 0);
    CHECK_EQ_I64(hirate_reset(lim, "r", 1), 0);
    CHECK_EQ_I64(in_children(lim, remaining_of_r), CHILDREN * 50);
    hirate_limiter_free(lim);
}

static int64_t many_keys(hirate_limiter *lim, int i)
{
    char key[32];
    for (int k = 0; k < 500; k++) {
        hirate_decision d;
        int n = snprintf(key, sizeof key, "key-%d-%d", i, k);
        if (hirate_allow(lim, key, (size_t)n, 1, &d) != 0 || !d.allowed)
            return -1;
    }
    return 0;
}

static void the_table_holds_max_keys_at_most(void)
{
    hirate_limiter *lim = make(1, 10, 64);
    CHECK_EQ_I64(in_children(lim, many_keys), 0);
    hirate_counters c;
    hirate_counters_get(lim, &c);
    CHECK_EQ_I64(c.memory_keys, 64);
    hirate_limiter_free(lim);

    /* The table's size is fixed when it is made. */
    hirate_bucket_cfg cfg;
    CHECK_EQ_I64(hirate_bucket_cfg_init(&cfg, 10, 1, NULL, 0), 0);
    hirate_shm *t = hirate_shm_new(64, 1);
    CHECK(t != NULL);
    size_t bytes = hirate_shm_bytes(t);
    CHECK(bytes >= 64 * (sizeof(hirate_bucket) + HIRATE_KEY_MAX));
    for (int k = 0; k < 1000; k++) {
        char key[32];
        hirate_decision d;
        int n = snprintf(key, sizeof key, "x%d", k);
        hirate_shm_decide(t, &cfg, key, (size_t)n, 1000, 1, 1, &d, NULL);
        CHECK_EQ_I64(d.allowed, 1);
    }
    CHECK_EQ_I64(hirate_shm_count(t), 64);
    CHECK_EQ_I64(hirate_shm_bytes(t), bytes);
    /* A key of HIRATE_KEY_MAX bytes is stored whole: a key that differs in
     * its last byte only has a bucket of its own. */
    char big[HIRATE_KEY_MAX];
    memset(big, 'z', sizeof big);
    hirate_decision d;
    hirate_shm_decide(t, &cfg, big, sizeof big, 2000, 10, 1, &d, NULL);
    CHECK_EQ_I64(d.allowed, 1);
    big[HIRATE_KEY_MAX - 1] = 'y';
    hirate_shm_decide(t, &cfg, big, sizeof big, 2000, 10, 1, &d, NULL);
    CHECK_EQ_I64(d.allowed, 1);
    big[HIRATE_KEY_MAX - 1] = 'z';
    hirate_shm_decide(t, &cfg, big, sizeof big, 2000, 1, 0, &d, NULL);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK_EQ_I64(d.remaining, 0);
    hirate_shm_free(t);
}

/* A child dies holding key's shard lock: halfway through writing its
 * bucket (mid_write), or just holding it. */
static int die_holding_the_lock(hirate_shm *t, const char *key, int mid_write)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (mid_write)
            hirate_shm__die_mid_write(t, key, strlen(key));
        else
            hirate_shm__die_mid_write(t, "no such key", 11);
        raise(SIGKILL);
        _exit(1);
    }
    int status;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFSIGNALED(status) &&
           WTERMSIG(status) == SIGKILL;
}

static void a_process_killed_holding_a_lock_blocks_nobody_and_changes_nothing(void)
{
    hirate_bucket_cfg cfg;
    CHECK_EQ_I64(hirate_bucket_cfg_init(&cfg, 100, 1, NULL, 0), 0);
    hirate_shm *t = hirate_shm_new(1000, 1);
    hirate_decision d;
    hirate_shm_decide(t, &cfg, "alice", 5, 1000000, 10, 1, &d, NULL);
    CHECK_EQ_I64(d.remaining, 90);
    hirate_shm_decide(t, &cfg, "bob", 3, 1000000, 30, 1, &d, NULL);
    CHECK_EQ_I64(d.remaining, 70);
    CHECK_EQ_I64(hirate_shm_repairs(t), 0);

    CHECK(die_holding_the_lock(t, "alice", 1));
    /* The next decision repairs the shard: alice's bucket is what it was. */
    hirate_shm_decide(t, &cfg, "alice", 5, 1000000, 1, 1, &d, NULL);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.remaining, 89);
    CHECK_EQ_I64(hirate_shm_repairs(t), 1);
    hirate_shm_decide(t, &cfg, "bob", 3, 1000000, 0, 0, &d, NULL);
    CHECK_EQ_I64(d.remaining, 70);
    CHECK_EQ_I64(hirate_shm_count(t), 2);

    CHECK(die_holding_the_lock(t, "bob", 0));
    CHECK_EQ_I64(hirate_shm_count(t), 2);   /* every shard lockable again */
    hirate_shm_decide(t, &cfg, "bob", 3, 1000000, 70, 1, &d, NULL);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.remaining, 0);
    hirate_shm_decide(t, &cfg, "alice", 5, 1000000, 0, 0, &d, NULL);
    CHECK_EQ_I64(d.remaining, 89);
    CHECK_EQ_I64(hirate_shm_repairs(t), 2);
    hirate_shm_free(t);
}

/* Children deciding without pause on one key (and on others they reset),
 * SIGKILLed one after another wherever they are, inside a shard's lock or
 * not: nobody hangs, no lock is lost, and what the table spent is what the
 * children counted, give or take the one decision each killed child may
 * have made and not yet counted. */
static void processes_killed_anywhere_leave_the_table_consistent(void)
{
    enum { CAP = 4000000, KILLS = 24, LIVE = 4 };
    hirate_bucket_cfg cfg;
    CHECK_EQ_I64(hirate_bucket_cfg_init(&cfg, CAP, 0.001, NULL, 0), 0);
    hirate_shm *t = hirate_shm_new(64, 1);
    /* Each child's count of its allowed decisions on "s". */
    int64_t *counted = mmap(NULL, (LIVE + KILLS) * sizeof *counted, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(counted != MAP_FAILED);
    if (!t || counted == MAP_FAILED)
        return;
    pid_t kids[LIVE], parent = getpid();
    for (int i = 0; i < LIVE + KILLS; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            char key[16];
            for (uint64_t n = 0;; n++) {
                if (n % 1024 == 0 && getppid() != parent)
                    _exit(0);   /* the test is gone */
                hirate_decision d;
                hirate_shm_decide(t, &cfg, "s", 1, -1, 1, 1, &d, NULL);
                if (d.allowed)
                    __atomic_store_n(&counted[i], counted[i] + 1, __ATOMIC_RELEASE);
                int len = snprintf(key, sizeof key, "o%d", (int)(n % 40));
                hirate_shm_decide(t, &cfg, key, (size_t)len, -1, 1, 1, &d, NULL);
                if (n % 7 == 0)
                    hirate_shm_reset(t, key, (size_t)len);
            }
        }
        if (i < LIVE) {
            kids[i] = pid;
            continue;
        }
        /* Let them run (at least one decision of the newest), then kill one. */
        for (int spin = 0; spin < 1000000 &&
                           __atomic_load_n(&counted[i - LIVE], __ATOMIC_ACQUIRE) < 100; spin++)
            sched_yield();
        int victim = i % LIVE;
        kill(kids[victim], SIGKILL);
        waitpid(kids[victim], NULL, 0);
        kids[victim] = pid;
    }
    for (int spin = 0; spin < 1000000 &&
                       __atomic_load_n(&counted[LIVE + KILLS - 1], __ATOMIC_ACQUIRE) < 100; spin++)
        sched_yield();
    for (int i = 0; i < LIVE; i++) {
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
    }
    int64_t told = 0;
    for (int i = 0; i < LIVE + KILLS; i++)
        told += counted[i];
    hirate_decision d;
    hirate_shm_decide(t, &cfg, "s", 1, -1, 0, 0, &d, NULL);
    int64_t spent = CAP - d.remaining;
    CHECK(told > 0);
    CHECK(spent >= told);
    CHECK(spent <= told + LIVE + KILLS);
    if (spent < told || spent > told + LIVE + KILLS)
        fprintf(stderr, "spent %" PRId64 ", counted %" PRId64 "\n", spent, told);
    /* Every key decided on again, every shard locked: no lock was lost. */
    for (int k = 0; k < 40; k++) {
        char key[16];
        int len = snprintf(key, sizeof key, "o%d", k);
        hirate_shm_decide(t, &cfg, key, (size_t)len, -1, 1, 1, &d, NULL);
        CHECK_EQ_I64(d.allowed, 1);
    }
    CHECK(hirate_shm_count(t) <= 41);
    printf("killed %d deciding processes: %" PRId64 " decisions on one key, %" PRIu64
           " shard repairs\n", LIVE + KILLS, spent, hirate_shm_repairs(t));
    munmap(counted, (LIVE + KILLS) * sizeof *counted);
    hirate_shm_free(t);
}

/* ---- threads of one process (TSan) ------------------------------------------- */

static hirate_limiter *g_lim;
static int64_t g_allowed;

static void *spend_thread(void *arg)
{
    (void)arg;
    for (int k = 0; k < 200; k++) {
        hirate_decision d;
        if (hirate_allow(g_lim, "t", 1, 1, &d) == 0 && d.allowed)
            __atomic_fetch_add(&g_allowed, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static void threads_share_it_too(void)
{
    g_lim = make(1, 700, 100);
    pthread_t th[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&th[i], NULL, spend_thread, NULL);
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ_I64(g_allowed, 700);
    hirate_stats st;
    CHECK_EQ_I64(hirate_stats_get(g_lim, &st, sizeof st), 0);
    CHECK_EQ_I64(st.decisions[HIRATE_SOURCE_LOCAL], 8 * 200);
    CHECK_EQ_I64(st.refused, 8 * 200 - 700);
    hirate_limiter_free(g_lim);
}

static void options(void)
{
    hirate_options o;
    hirate_options_init(&o);
    CHECK_EQ_I64(o.shared, 0);
    o.capacity = 1;
    o.rate = 1;
    o.shared = 2;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "shared must be from 0 to 1, got 2");
    o.shared = 1;
    o.url = "redis://127.0.0.1:1";
    o.on_error = HIRATE_ON_ERROR_OPEN;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "shared: a limiter with a URL keeps in-memory buckets only for "
                      "on_error = local; with on_error = open it has none to share");
    /* With on_error = local the fallback's buckets are shared. */
    o.on_error = HIRATE_ON_ERROR_LOCAL;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, why, sizeof why), 0);
    hirate_limiter_free(lim);
}

int main(void)
{
    forked_processes_spend_exactly_the_capacity();
    every_band_is_shared_and_spent_all_or_nothing();
    a_reset_is_seen_by_every_process();
    the_local_fallback_is_shared_too();
    the_table_holds_max_keys_at_most();
    a_process_killed_holding_a_lock_blocks_nobody_and_changes_nothing();
    processes_killed_anywhere_leave_the_table_consistent();
    threads_share_it_too();
    options();
    return check_summary("test_shared");
}
