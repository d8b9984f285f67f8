/*
 * Redis Cluster end to end, through the public API only (hirate.h,
 * hirate_io.h), against clusters of tests/support/redis_cluster.py:
 * one of 3 masters with a replica each, shared by the cases in order (the
 * later ones kill nodes), and a 3-master TLS one.
 *
 *   case                                         holds
 *   -------------------------------------------- -----------------------------------------
 *   keys with and without {tags}                 each bucket lives on the master of Redis'
 *                                                  CLUSTER KEYSLOT of prefix + key; keys of
 *                                                  one tag on one node; no call redirected
 *   1,000 keys over every slot range, capacity 5 exactly 5 allowed each, the 6th refused,
 *                                                  source redis; allow_many the same, in order
 *   a replica as the only seed                   the same
 *   resharding under load (SETSLOT, MIGRATE),    no call fails, every source redis, each key
 *     allow and allow_many                         admits exactly its capacity
 *   SIGKILL of a master under load               other shards redis throughout; the dead
 *                                                  shard's keys fail_closed, then redis again
 *                                                  within FOUND_BOUND_MS of the promotion
 *   SIGSTOP of a master under load               the same
 *   a dead seed listed first                     the first decision is Redis' already
 *   a master and its replica killed              with full coverage required, Redis'
 *                                                  CLUSTERDOWN sends every key to the policy
 *                                                  (ESERVER); without, only their slots go
 *                                                  to the policy (fail_open), others redis
 *   TLS (rediss+cluster://)                      the same exact results as plain
 *
 * Rate 0.001 tokens/s: a token takes 1000 s to come back, so within the
 * test every count is exact (capacity + rate * elapsed < capacity + 1).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "cluster_harness.h"
#include "hirate.h"
#include "hirate_io.h"
#include "test_time.h"

#define RATE 0.001
/* The limiters' command timeout: generous, as a healthy shard's call must
 * never time out on this busy machine. */
#define TIMEOUT_MS 1000
/* After the harness sees the promoted replica (every node agrees), the
 * limiter must find it within this: a call to the stopped master may have
 * started just before (it waits TIMEOUT_MS), a map refresh is at most 100 ms
 * apart, the rest is slack for a shared, sanitised machine. */
#define FOUND_BOUND_MS (TIMEOUT_MS + 1000)

static ch_cluster C;   /* 3 masters, 1 replica each */

/* ---- helpers ---------------------------------------------------------------------- */

typedef struct cfg {
    const char *url;        /* NULL: C's */
    const char *prefix;
    int64_t capacity;
    int on_error;
    const char *ca;         /* tls_ca_file */
} cfg;

static hirate_limiter *make(cfg c)
{
    hirate_options o;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE] = "";
    hirate_options_init(&o);
    o.url = c.url ? c.url : C.url;
    o.prefix = c.prefix;
    o.capacity = c.capacity;
    o.rate = RATE;
    o.on_error = c.on_error;
    o.timeout_ms = TIMEOUT_MS;
    o.connect_timeout_ms = 1000;
    o.backoff_min_ms = 50;
    o.backoff_max_ms = 200;
    o.deny_cache = 0;   /* every decision asks Redis */
    o.tls_ca_file = c.ca;
    int rc = hirate_limiter_new(&lim, &o, why, sizeof why);
    if (rc != 0) fprintf(stderr, "  hirate_limiter_new: %s (%s)\n", hirate_err_name(rc), why);
    CHECK_EQ_I64(rc, 0);
    return lim;
}

static const char *errmsg(hirate_limiter *lim)
{
    static char buf[HIRATE_ERRMSG_SIZE];
    return hirate_limiter_errmsg(lim, buf, sizeof buf);
}

/* Keys with their slot (Redis' answer for prefix + key) and its master. */
#define KEYS_MAX 1000
typedef struct keyset {
    int n;
    char key[KEYS_MAX][40];
    size_t len[KEYS_MAX];
    int slot[KEYS_MAX];
    int port[KEYS_MAX];     /* the master owning slot when made */
} keyset;

/* Fills in slot and port of ks' keys (Redis' slot of prefix + key). */
static void fill_slots(ch_cluster *c, keyset *ks, const char *prefix)
{
    static char full[KEYS_MAX][80];
    static const void *ptr[KEYS_MAX];
    static size_t flen[KEYS_MAX];
    for (int i = 0; i < ks->n; i++) {
        flen[i] = (size_t)snprintf(full[i], sizeof full[i], "%s%s", prefix, ks->key[i]);
        ptr[i] = full[i];
    }
    CHECK_EQ_I64(ch_keyslots(c, (size_t)ks->n, ptr, flen, ks->slot), 0);
    for (int i = 0; i < ks->n; i++) {
        ch_node *m = ch_master_of(c, ks->slot[i]);
        ks->port[i] = m ? m->port : 0;
    }
}

/* n keys printf(fmt, i) (fmt takes one int). */
static void make_keys(ch_cluster *c, keyset *ks, const char *prefix, const char *fmt, int n)
{
    ks->n = n;
    for (int i = 0; i < n; i++)
        ks->len[i] = (size_t)snprintf(ks->key[i], sizeof ks->key[i], fmt, i);
    fill_slots(c, ks, prefix);
}

/* Where each key's bucket is (ch_where of prefix + key). */
static void where_keys(ch_cluster *c, const keyset *ks, const char *prefix, int *out)
{
    static char full[KEYS_MAX][80];
    static const void *ptr[KEYS_MAX];
    static size_t flen[KEYS_MAX];
    for (int i = 0; i < ks->n; i++) {
        flen[i] = (size_t)snprintf(full[i], sizeof full[i], "%s%s", prefix, ks->key[i]);
        ptr[i] = full[i];
    }
    CHECK_EQ_I64(ch_where(c, (size_t)ks->n, ptr, flen, out), 0);
}

/* The exact decision of the (round)th call on a fresh key of capacity cap,
 * decided by Redis. Returns the number of mismatches (and prints the first). */
static int check_round(const hirate_decision *d, int rc, int round, int64_t cap, const char *key,
                       int *printed)
{
    int want_allowed = round < cap;
    int64_t want_remaining = want_allowed ? cap - 1 - round : 0;
    int bad = rc != 0 || d->source != HIRATE_SOURCE_REDIS || d->allowed != want_allowed ||
              d->remaining != want_remaining || d->limit != cap || d->error != 0 ||
              (want_allowed ? d->retry_after_us != 0
                            : d->retry_after_us <= 0 || d->retry_after_us > 1000000000LL);
    if (bad && (*printed)++ < 5)
        fprintf(stderr,
                "  key %s round %d: rc %s source %s allowed %d remaining %lld error %s "
                "(want allowed %d remaining %lld)\n",
                key, round, hirate_err_name(rc), hirate_source_name(d->source), d->allowed,
                (long long)d->remaining, hirate_err_name(d->error), want_allowed,
                (long long)want_remaining);
    return bad;
}

/* cap + 1 rounds of hirate_allow over every key (round after round, so that
 * consecutive calls go to different nodes), then the same with allow_many on
 * other buckets (prefix2), in batches mixing keys of every node, each key
 * cap + 1 times in one batch; every result exact. */
static void exact_rounds(hirate_limiter *lim, hirate_limiter *lim2, const keyset *ks, int64_t cap)
{
    int bad = 0, printed = 0;
    for (int r = 0; r <= cap; r++) {
        for (int i = 0; i < ks->n; i++) {
            hirate_decision d;
            memset(&d, 0, sizeof d);
            int rc = hirate_allow(lim, ks->key[i], ks->len[i], 1, &d);
            bad += check_round(&d, rc, r, cap, ks->key[i], &printed);
        }
    }
    CHECK_EQ_I64(bad, 0);
    if (printed) fprintf(stderr, "  (allow) last error: %s\n", errmsg(lim));

    enum { PER_BATCH = 100 };
    static hirate_item items[PER_BATCH * 16];
    int bad_many = 0, item_rc = 0;
    printed = 0;
    for (int base = 0; base < ks->n; base += PER_BATCH) {
        int k = ks->n - base < PER_BATCH ? ks->n - base : PER_BATCH;
        size_t n = 0;
        for (int r = 0; r <= cap; r++) {
            for (int i = 0; i < k; i++) {
                hirate_item *it = &items[n++];
                memset(it, 0, sizeof *it);
                it->key = ks->key[base + i];
                it->keylen = ks->len[base + i];
                it->cost = 1;
                it->rc = -999;
            }
        }
        item_rc |= hirate_allow_many(lim2, items, n);
        size_t j = 0;
        for (int r = 0; r <= cap; r++)
            for (int i = 0; i < k; i++, j++)
                bad_many += check_round(&items[j].decision, items[j].rc, r, cap,
                                        ks->key[base + i], &printed);
    }
    CHECK_EQ_I64(item_rc, 0);
    CHECK_EQ_I64(bad_many, 0);
    if (printed) fprintf(stderr, "  (allow_many) last error: %s\n", errmsg(lim2));
}

/* A live master owning slots (a failed master keeps its flag, not its slots). */
static int is_shard(const ch_node *n) { return n->master && n->alive && n->nranges > 0; }

/* How many keys each master owns, by port; checks every master has some. */
static void check_spread(ch_cluster *c, const keyset *ks, int at_least)
{
    for (int m = 0; m < c->n; m++) {
        if (!is_shard(&c->nodes[m])) continue;
        int count = 0;
        for (int i = 0; i < ks->n; i++) count += ks->port[i] == c->nodes[m].port;
        if (count < at_least)
            fprintf(stderr, "  master %d has %d keys, want %d\n", c->nodes[m].port, count,
                    at_least);
        CHECK(count >= at_least);
    }
}

/* ---- cases ------------------------------------------------------------------------ */

/* The core exports no slot function: its slots are checked by where the
 * buckets land (test_slot checks the function itself). */
static void test_slots(void)
{
    static keyset plain, tagged;
    static int where[KEYS_MAX];
    const char *prefix = "slot:";
    hirate_limiter *lim = make((cfg){.prefix = prefix, .capacity = 3});
    make_keys(&C, &plain, prefix, "k%d", 300);
    /* 30 tags of 10 keys each, the tag anywhere in the key; the last 2 of
     * each have braces that make no tag ({} empty) or another one (} before
     * {, nested braces). */
    static const char *const odd[] = {"{}", "{}x", "}{x}", "a{}b{c}", "{{x}}", "{x{y}}"};
    tagged.n = 300;
    for (int tag = 0; tag < 30; tag++)
        for (int j = 0; j < 10; j++) {
            int i = tag * 10 + j;
            char *k = tagged.key[i];
            size_t cap = sizeof tagged.key[i];
            int n = j < 4 ? snprintf(k, cap, "%d{tag%d}", j, tag)
                  : j < 8 ? snprintf(k, cap, "{tag%d}:%d", tag, j)
                          : snprintf(k, cap, "%s%d", odd[(tag + j) % 6], i);
            tagged.len[i] = (size_t)n;
        }
    fill_slots(&C, &tagged, prefix);

    /* A first call loads the map; from then on no call may be redirected. */
    hirate_decision d;
    CHECK_EQ_I64(hirate_allow(lim, "warm", 4, 1, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(ch_reset_stats(&C), 0);

    const keyset *sets[] = {&plain, &tagged};
    for (int s = 0; s < 2; s++) {
        int bad = 0;
        for (int i = 0; i < sets[s]->n; i++) {
            memset(&d, 0, sizeof d);
            int rc = hirate_allow(lim, sets[s]->key[i], sets[s]->len[i], 1, &d);
            bad += rc != 0 || d.source != HIRATE_SOURCE_REDIS || !d.allowed || d.remaining != 2;
        }
        CHECK_EQ_I64(bad, 0);
    }
    long long calls = 0, rejected = -1;
    CHECK_EQ_I64(ch_stats(&C, &calls, &rejected), 0);
    CHECK_EQ_I64(rejected, 0);   /* no MOVED, no ASK: every call went to its slot's master */

    for (int s = 0; s < 2; s++) {
        where_keys(&C, sets[s], prefix, where);
        int misplaced = 0;
        for (int i = 0; i < sets[s]->n; i++) {
            if (where[i] != sets[s]->port[i] && misplaced++ < 5)
                fprintf(stderr, "  key %s: on %d, its slot %d is %d's\n", sets[s]->key[i],
                        where[i], sets[s]->slot[i], sets[s]->port[i]);
        }
        CHECK_EQ_I64(misplaced, 0);
    }
    /* hirate put the first 8 keys of each tag on one node (where[] is the
     * tagged set's now; the last 2 keys of a tag have braces of their own). */
    int apart = 0;
    for (int t = 0; t < 30; t++)
        for (int j = 1; j < 8; j++) apart += where[t * 10 + j] != where[t * 10];
    CHECK_EQ_I64(apart, 0);
    check_spread(&C, &plain, 50);
    hirate_limiter_free(lim);
}

static void test_exact(void)
{
    static keyset ks;
    make_keys(&C, &ks, "ex:", "key:%d", 1000);
    /* allow_many writes under its own prefix: ex2: + the same names. */
    check_spread(&C, &ks, 200);
    hirate_limiter *lim = make((cfg){.prefix = "ex:", .capacity = 5});
    hirate_limiter *lim2 = make((cfg){.prefix = "ex2:", .capacity = 5});
    CHECK_EQ_I64(hirate_is_cluster(lim), 1);
    exact_rounds(lim, lim2, &ks, 5);
    hirate_limiter_free(lim);
    hirate_limiter_free(lim2);
}

static void test_replica_seed(void)
{
    static keyset ks;
    char url[128];
    ch_node *m = ch_master_of(&C, 0);
    ch_node *r = m ? ch_replica_of(&C, m) : NULL;
    CHECK(r != NULL);
    if (!r) return;
    ch_node_url(&C, r, url, sizeof url);
    make_keys(&C, &ks, "rs:", "key:%d", 100);
    hirate_limiter *lim = make((cfg){.url = url, .prefix = "rs:", .capacity = 5});
    hirate_limiter *lim2 = make((cfg){.url = url, .prefix = "rs2:", .capacity = 5});
    exact_rounds(lim, lim2, &ks, 5);
    hirate_limiter_free(lim);
    hirate_limiter_free(lim2);
}

/* ---- load ------------------------------------------------------------------------- */

typedef struct tally {
    long calls, allowed, failed;    /* failed: rc != 0 or a source other than redis */
} tally;

typedef struct load {
    hirate_limiter *lim;
    const keyset *ks;
    const int *which;   /* indexes into ks */
    int nwhich;
    int start;          /* each thread walks the keys from its own offset */
    int batch;          /* 1: by allow_many of all its keys at once */
    int *stop;          /* set (atomically) to end the load */
    tally *t;           /* per key (index into ks), shared by the threads: atomics */
    /* For the failover cases: a decision other than redis, its time. */
    int64_t first_other_us, last_other_us;
    long other, other_not_closed;
    int first_rc, first_source, first_error;
} load;

static void *hammer(void *arg)
{
    load *L = arg;
    static __thread hirate_item items[KEYS_MAX];
    L->first_other_us = L->last_other_us = 0;
    for (long n = 0; !__atomic_load_n(L->stop, __ATOMIC_RELAXED); n++) {
        int i = L->which[(L->start + n) % L->nwhich];
        hirate_decision d;
        int rc;
        if (L->batch) {
            /* Every key once in one allow_many, keys of every node mixed;
             * the batch is refilled when used up. */
            int j = (int)(n % L->nwhich);
            if (j == 0) {
                for (int k = 0; k < L->nwhich; k++) {
                    int w = L->which[(L->start + n + k) % L->nwhich];
                    items[k] = (hirate_item){.key = L->ks->key[w], .keylen = L->ks->len[w],
                                             .cost = 1, .rc = -999};
                }
                if (hirate_allow_many(L->lim, items, (size_t)L->nwhich) != 0)
                    for (int k = 0; k < L->nwhich; k++) items[k].rc = HIRATE_EINVAL;
            }
            rc = items[j].rc;
            d = items[j].decision;
        } else {
            memset(&d, 0, sizeof d);
            rc = hirate_allow(L->lim, L->ks->key[i], L->ks->len[i], 1, &d);
        }
        tally *t = &L->t[i];
        __atomic_add_fetch(&t->calls, 1, __ATOMIC_RELAXED);
        if (rc == 0 && d.source == HIRATE_SOURCE_REDIS) {
            if (d.allowed) __atomic_add_fetch(&t->allowed, 1, __ATOMIC_RELAXED);
            continue;
        }
        __atomic_add_fetch(&t->failed, 1, __ATOMIC_RELAXED);
        int64_t now = mono_us();
        if (!L->other) {
            L->first_other_us = now;
            L->first_rc = rc;
            L->first_source = d.source;
            L->first_error = d.error;
        }
        __atomic_add_fetch(&L->other, 1, __ATOMIC_RELAXED);   /* read during the load */
        L->last_other_us = now;
        if (rc != 0 || d.source != HIRATE_SOURCE_FAIL_CLOSED || d.allowed) L->other_not_closed++;
    }
    return NULL;
}

/* Until every key in which[] was called at least `calls` times. */
static int wait_calls(const tally *t, const int *which, int n, long calls, int timeout_ms)
{
    int64_t end = mono_us() + timeout_ms * 1000LL;
    for (;;) {
        int done = 1;
        for (int i = 0; i < n && done; i++)
            done = __atomic_load_n(&t[which[i]].calls, __ATOMIC_RELAXED) >= calls;
        if (done) return 1;
        if (mono_us() > end) return 0;
        sleep_ms(5);
    }
}

/* Tags whose slots the given master owns: count of them into tags (as
 * "{rt<j>}"), their slots into slots. */
static void tags_on(ch_cluster *c, const ch_node *m, int count, char tags[][16], int *slots)
{
    enum { CANDIDATES = 64 };
    static char cand[CANDIDATES][16];
    static const void *ptr[CANDIDATES];
    static size_t len[CANDIDATES];
    static int slot[CANDIDATES];
    static int base;
    int found = 0;
    while (found < count) {
        for (int j = 0; j < CANDIDATES; j++) {
            len[j] = (size_t)snprintf(cand[j], sizeof cand[j], "{rt%d}", base + j);
            ptr[j] = cand[j];
        }
        base += CANDIDATES;
        if (ch_keyslots(c, CANDIDATES, ptr, len, slot) < 0) return;
        for (int j = 0; j < CANDIDATES && found < count; j++)
            if (ch_owns(m, slot[j])) {
                memcpy(tags[found], cand[j], sizeof cand[j]);
                slots[found++] = slot[j];
            }
    }
}

/* Slots of keys under load change masters twice (to the next master and on
 * to the third), each migration caught halfway for a while (ASK), the
 * others at once. */
static void test_resharding(void)
{
    enum { TAGS_PER = 2, KEYS_PER_TAG = 8, THREADS = 4, CAP = 20 };
    static keyset ks;
    static tally t[KEYS_MAX];
    static int which[KEYS_MAX];
    static load L[THREADS];
    char tags[3 * TAGS_PER][16];
    int slots[3 * TAGS_PER];
    ch_node *masters[3];
    int nm = 0;
    for (int i = 0; i < C.n && nm < 3; i++)
        if (is_shard(&C.nodes[i])) masters[nm++] = &C.nodes[i];
    CHECK_EQ_I64(nm, 3);
    if (nm < 3) return;
    int ports[3] = {masters[0]->port, masters[1]->port, masters[2]->port};
    for (int m = 0; m < 3; m++) tags_on(&C, masters[m], TAGS_PER, tags + m * TAGS_PER,
                                        slots + m * TAGS_PER);
    ks.n = 3 * TAGS_PER * KEYS_PER_TAG;
    for (int i = 0; i < ks.n; i++) {
        ks.len[i] = (size_t)snprintf(ks.key[i], sizeof ks.key[i], "%s%d", tags[i / KEYS_PER_TAG],
                                     i % KEYS_PER_TAG);
        ks.slot[i] = slots[i / KEYS_PER_TAG];
        which[i] = i;
    }

    hirate_limiter *lim = make((cfg){.prefix = "mig:", .capacity = CAP});
    int stop = 0;
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        L[i] = (load){.lim = lim, .ks = &ks, .which = which, .nwhich = ks.n,
                      .start = i * ks.n / THREADS, .batch = i == 0, .stop = &stop, .t = t};
        pthread_create(&th[i], NULL, hammer, &L[i]);
    }
    CHECK(wait_calls(t, which, ks.n, 3, 10000));
    CHECK_EQ_I64(ch_reset_stats(&C), 0);

    int moved_keys = 0, migrations = 0;
    for (int step = 1; step <= 2; step++) {
        for (int s = 0; s < 3 * TAGS_PER; s++) {
            int from = (s / TAGS_PER + step - 1) % 3, to = (s / TAGS_PER + step) % 3;
            ch_node *src = ch_node_by_port(&C, ports[from]);
            ch_node *dst = ch_node_by_port(&C, ports[to]);
            if (s % 2 == 0) {
                /* Caught halfway: half its keys on each side, ASK for the moved. */
                CHECK_EQ_I64(ch_migrate_begin(&C, slots[s], src, dst), 0);
                int n = ch_migrate_keys(&C, slots[s], src, dst, KEYS_PER_TAG / 2);
                CHECK_EQ_I64(n, KEYS_PER_TAG / 2);
                sleep_ms(50);
                int rest = ch_migrate_keys(&C, slots[s], src, dst, -1);
                CHECK_EQ_I64(rest, KEYS_PER_TAG - KEYS_PER_TAG / 2);
                moved_keys += n + rest;
                CHECK_EQ_I64(ch_migrate_finish(&C, slots[s], dst), 0);
            } else {
                CHECK_EQ_I64(ch_migrate_slot(&C, slots[s], src, dst), 0);
                moved_keys += KEYS_PER_TAG;
            }
            migrations++;
            sleep_ms(20);
        }
    }
    /* Enough calls after the last move that each key must have used its
     * whole capacity. */
    long before = 0;
    for (int i = 0; i < ks.n; i++) before += __atomic_load_n(&t[i].calls, __ATOMIC_RELAXED);
    CHECK(wait_calls(t, which, ks.n, 2 * CAP + before / ks.n, 20000));
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);

    long long calls = 0, rejected = 0;
    CHECK_EQ_I64(ch_stats(&C, &calls, &rejected), 0);
    CHECK(rejected > 0);   /* the calls did meet MOVED and ASK */
    long failed = 0, total = 0;
    int wrong = 0;
    for (int i = 0; i < ks.n; i++) {
        failed += t[i].failed;
        total += t[i].calls;
        if (t[i].allowed != CAP && wrong++ < 5)
            fprintf(stderr, "  key %s: %ld allowed of %ld calls, want %d\n", ks.key[i],
                    t[i].allowed, t[i].calls, CAP);
    }
    CHECK_EQ_I64(failed, 0);
    CHECK_EQ_I64(wrong, 0);
    if (failed)
        fprintf(stderr, "  first failure: rc %s source %s error %s (%s)\n",
                hirate_err_name(L[0].first_rc), hirate_source_name(L[0].first_source),
                hirate_err_name(L[0].first_error), errmsg(lim));
    CHECK_EQ_I64(migrations, 2 * 3 * TAGS_PER);
    CHECK_EQ_I64(moved_keys, 2 * ks.n);
    /* Every bucket is where its slot now is (the third master of its tag). */
    static int where[KEYS_MAX];
    where_keys(&C, &ks, "mig:", where);
    int misplaced = 0;
    for (int i = 0; i < ks.n; i++)
        misplaced += where[i] != ports[(i / KEYS_PER_TAG / TAGS_PER + 2) % 3];
    CHECK_EQ_I64(misplaced, 0);
    printf("test_cluster: resharding: %d slots moved %d times under %ld calls, %lld redirected\n",
           3 * TAGS_PER, migrations, total, rejected);
    hirate_limiter_free(lim);
}

/* The URL of the live nodes only: the cases after a kill must not depend
 * on how a new limiter copes with a dead seed (test_dead_seed does). */
static const char *live_url(void)
{
    static char url[1024];
    size_t n = (size_t)snprintf(url, sizeof url, "redis+cluster://");
    for (int i = 0; i < C.n; i++)
        if (C.nodes[i].alive && !C.nodes[i].paused)
            n += (size_t)snprintf(url + n, sizeof url - n, "%s127.0.0.1:%d",
                                  url[n - 1] == '/' ? "" : ",", C.nodes[i].port);
    return url;
}

/* SIGKILL (kill = 1) or SIGSTOP (0) of a master with a replica while one
 * thread per shard hammers that shard's keys, with on_error closed. */
static void test_failover(int kill_it)
{
    enum { KEYS = 90, CAP = 10 };
    const char *prefix = kill_it ? "fk:" : "fs:";
    static keyset ks;
    static tally t[KEYS_MAX];
    static int which[3][KEYS_MAX];
    static load L[3];
    memset(t, 0, sizeof t);
    ch_refresh(&C);
    make_keys(&C, &ks, prefix, "key:%d", KEYS);

    /* The victim: a master that has a replica. */
    ch_node *victim = NULL;
    for (int i = 0; i < C.n && !victim; i++)
        if (is_shard(&C.nodes[i]) && ch_replica_of(&C, &C.nodes[i])) victim = &C.nodes[i];
    CHECK(victim != NULL);
    if (!victim) return;
    ch_node old = *victim;
    int shard_port[3], nw[3] = {0, 0, 0}, ns = 0, dead = -1;
    for (int i = 0; i < C.n && ns < 3; i++)
        if (is_shard(&C.nodes[i])) {
            if (C.nodes[i].port == old.port) dead = ns;
            shard_port[ns++] = C.nodes[i].port;
        }
    CHECK_EQ_I64(ns, 3);
    CHECK(dead >= 0);
    if (ns != 3 || dead < 0) return;
    for (int i = 0; i < ks.n; i++)
        for (int s = 0; s < ns; s++)
            if (ks.port[i] == shard_port[s]) which[s][nw[s]++] = i;
    for (int s = 0; s < ns; s++) CHECK(nw[s] > 5);

    hirate_limiter *lim = make((cfg){.url = live_url(), .prefix = prefix, .capacity = CAP,
                                     .on_error = HIRATE_ON_ERROR_CLOSED});
    int stop = 0;
    pthread_t th[3];
    for (int s = 0; s < 3; s++) {
        L[s] = (load){.lim = lim, .ks = &ks, .which = which[s], .nwhich = nw[s], .stop = &stop,
                      .t = t};
        pthread_create(&th[s], NULL, hammer, &L[s]);
    }
    /* Every key spent, and the spending replicated (a replica is
     * milliseconds behind) before the master goes: after the failover the
     * counts stay exact. */
    for (int s = 0; s < 3; s++) CHECK(wait_calls(t, which[s], nw[s], CAP + 2, 10000));
    sleep_ms(200);
    for (int s = 0; s < 3; s++) CHECK_EQ_I64(__atomic_load_n(&L[s].other, __ATOMIC_RELAXED), 0);

    int64_t t_fault = mono_us();
    CHECK_EQ_I64(kill_it ? ch_kill(&C, &old) : ch_pause(&C, &old), 0);
    ch_node *promoted = ch_wait_failover(&C, &old, 15);
    int64_t t_promoted = mono_us();
    CHECK(promoted != NULL);
    /* Calls made from now on run a while: the dead shard's keys must be
     * back to redis within the bound, and stay so. */
    sleep_ms(FOUND_BOUND_MS + 500);
    int64_t t_end = mono_us();
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    for (int s = 0; s < 3; s++) pthread_join(th[s], NULL);
    if (!kill_it) CHECK_EQ_I64(ch_resume(&C, &old), 0);

    for (int s = 0; s < 3; s++) {
        if (s == dead) continue;
        CHECK_EQ_I64(L[s].other, 0);   /* healthy shards: redis throughout */
        if (L[s].other)
            fprintf(stderr, "  healthy shard %d: %ld other decisions, first rc %s source %s "
                    "error %s\n", shard_port[s], L[s].other, hirate_err_name(L[s].first_rc),
                    hirate_source_name(L[s].first_source), hirate_err_name(L[s].first_error));
    }
    load *D = &L[dead];
    CHECK(D->other > 0);                /* the outage did reach the policy */
    CHECK_EQ_I64(D->other_not_closed, 0);   /* and the policy refused, no error */
    int64_t back_ms = D->last_other_us ? (D->last_other_us - t_promoted) / 1000 : -1;
    CHECK(D->last_other_us < t_promoted + FOUND_BOUND_MS * 1000LL);
    CHECK(D->last_other_us < t_end);
    int wrong = 0;
    for (int i = 0; i < ks.n; i++)
        if (t[i].allowed != CAP && wrong++ < 5)
            fprintf(stderr, "  key %s: %ld allowed, want %d\n", ks.key[i], t[i].allowed, CAP);
    CHECK_EQ_I64(wrong, 0);
    printf("test_cluster: %s of a master: promoted after %lld ms, last fail_closed %lld ms after "
           "the promotion (bound %d ms), %ld policy decisions (first: %s)\n",
           kill_it ? "SIGKILL" : "SIGSTOP", (long long)((t_promoted - t_fault) / 1000),
           (long long)back_ms, FOUND_BOUND_MS, D->other, hirate_err_name(D->first_error));
    hirate_limiter_free(lim);
    ch_refresh(&C);
}

/* A seed that is down (killed earlier) listed first: the limiter learns the
 * map from the next seed, and the first decision is Redis' already. */
static void test_dead_seed(void)
{
    char url[1024];
    int dead = 0;
    for (int i = 0; i < C.n && !dead; i++)
        if (!C.nodes[i].alive) dead = C.nodes[i].port;
    CHECK(dead != 0);
    const char *live = live_url() + strlen("redis+cluster://");
    snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d,%s", dead, live);
    hirate_limiter *lim = make((cfg){.url = url, .prefix = "ds:", .capacity = 5});
    hirate_decision d;
    memset(&d, 0, sizeof d);
    CHECK_EQ_I64(hirate_allow(lim, "first", 5, 1, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(d.remaining, 4);
    if (d.source != HIRATE_SOURCE_REDIS)
        fprintf(stderr, "  first call with a dead first seed: %s, %s (%s)\n",
                hirate_source_name(d.source), hirate_err_name(d.error), errmsg(lim));
    hirate_limiter_free(lim);
}

/* A shard with no node left. With cluster-require-full-coverage yes
 * (Redis' default) the other masters declare the whole cluster down once
 * they see it failed, and answer CLUSTERDOWN for every slot: the policy
 * decides every key (ESERVER). With no (the harness' default), the other
 * shards serve on: only the dead shard's keys go to the policy. */
static void test_shard_down(void)
{
    enum { KEYS = 60, CAP = 5, ROUNDS = 6 };
    static keyset ks, ks2;
    ch_refresh(&C);
    ch_node *victim = NULL, *replica = NULL;
    for (int i = 0; i < C.n && !victim; i++)
        if (is_shard(&C.nodes[i]) && (replica = ch_replica_of(&C, &C.nodes[i])))
            victim = &C.nodes[i];
    CHECK(victim != NULL);
    if (!victim) return;
    int dead_port = victim->port;
    make_keys(&C, &ks, "cd:", "key:%d", KEYS);
    make_keys(&C, &ks2, "cd2:", "key:%d", KEYS);
    int live = -1, ndead = 0;
    for (int i = 0; i < ks.n; i++) {
        if (ks.port[i] != dead_port && live < 0) live = i;
        ndead += ks2.port[i] == dead_port;
    }
    CHECK(live >= 0 && ndead > 5);
    if (live < 0) return;

    CHECK_EQ_I64(ch_config_set(&C, "cluster-require-full-coverage", "yes"), 0);
    hirate_limiter *lim = make((cfg){.url = live_url(), .prefix = "cd:", .capacity = CAP,
                                     .on_error = HIRATE_ON_ERROR_OPEN});
    /* The replica first, so that nobody takes over. */
    CHECK_EQ_I64(ch_kill(&C, replica), 0);
    CHECK_EQ_I64(ch_kill(&C, victim), 0);
    int64_t t_kill = mono_us();
    hirate_decision d;
    do {   /* until the live masters see the shard failed: node timeout and gossip */
        memset(&d, 0, sizeof d);
        CHECK_EQ_I64(hirate_allow(lim, ks.key[live], ks.len[live], 0, &d), 0);
        if (d.source != HIRATE_SOURCE_REDIS) break;
        sleep_ms(20);
    } while (mono_us() < t_kill + 5000 * 1000LL);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_FAIL_OPEN);
    CHECK_EQ_I64(d.error, HIRATE_ESERVER);
    int not_open = 0;
    for (int i = 0; i < ks.n; i++) {
        memset(&d, 0, sizeof d);
        int rc = hirate_allow(lim, ks.key[i], ks.len[i], 1, &d);
        not_open += rc != 0 || d.source != HIRATE_SOURCE_FAIL_OPEN || !d.allowed || !d.error;
    }
    CHECK_EQ_I64(not_open, 0);
    printf("test_cluster: full coverage required: CLUSTERDOWN %lld ms after the kill\n",
           (long long)((mono_us() - t_kill) / 1000));

    /* Full coverage not required: the live masters serve again (after
     * Redis' rejoin delay, the node timeout), and only the dead shard's
     * keys go to the policy. */
    CHECK_EQ_I64(ch_config_set(&C, "cluster-require-full-coverage", "no"), 0);
    int64_t t_no = mono_us();
    /* Every live node leaves its failed state on its own: a wait, not a
     * bound (a loaded machine once took over 10 s), as long as the start's. */
    CHECK_EQ_I64(ch_settle(&C, 30), 0);
    for (int i = 0; i < ks.n; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++) seen |= ks.port[j] == ks.port[i];
        if (seen || ks.port[i] == dead_port) continue;
        do {
            memset(&d, 0, sizeof d);
            CHECK_EQ_I64(hirate_allow(lim, ks.key[i], ks.len[i], 0, &d), 0);
            if (d.source == HIRATE_SOURCE_REDIS) break;
            sleep_ms(20);
        } while (mono_us() < t_no + 5000 * 1000LL);
        CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    }
    hirate_limiter_free(lim);
    lim = make((cfg){.url = live_url(), .prefix = "cd2:", .capacity = CAP,
                     .on_error = HIRATE_ON_ERROR_OPEN});
    int bad_live = 0, bad_dead = 0, printed = 0;
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < ks2.n; i++) {
            memset(&d, 0, sizeof d);
            int rc = hirate_allow(lim, ks2.key[i], ks2.len[i], 1, &d);
            if (ks2.port[i] == dead_port) {
                int ok = rc == 0 && d.source == HIRATE_SOURCE_FAIL_OPEN && d.allowed &&
                         d.error != 0;
                bad_dead += !ok;
                if (!ok && printed++ < 5)
                    fprintf(stderr, "  dead shard key %s: rc %s source %s error %s\n", ks2.key[i],
                            hirate_err_name(rc), hirate_source_name(d.source),
                            hirate_err_name(d.error));
            } else {
                bad_live += check_round(&d, rc, r, CAP, ks2.key[i], &printed);
            }
        }
    }
    CHECK_EQ_I64(bad_dead, 0);
    CHECK_EQ_I64(bad_live, 0);
    hirate_limiter_free(lim);
}

/* ---- TLS -------------------------------------------------------------------------- */

static void test_tls(const char *certs)
{
    static keyset ks;
    static ch_cluster T;
    char ca[600];
    if (ch_start(&T, 3, 0, certs) < 0) {
        CHECK(!"the TLS cluster started");
        return;
    }
    CHECK(strncmp(T.url, "rediss+cluster://localhost:", 27) == 0);
    snprintf(ca, sizeof ca, "%s/ca.crt", certs);
    make_keys(&T, &ks, "tls:", "key:%d", 300);
    check_spread(&T, &ks, 50);
    hirate_limiter *lim = make((cfg){.url = T.url, .prefix = "tls:", .capacity = 5, .ca = ca});
    hirate_limiter *lim2 = make((cfg){.url = T.url, .prefix = "tls2:", .capacity = 5, .ca = ca});
    exact_rounds(lim, lim2, &ks, 5);
    printf("test_cluster: TLS: %s\n", T.url);
    hirate_limiter_free(lim);
    hirate_limiter_free(lim2);
    ch_stop(&T);
}

int main(void)
{
    char certs[] = "/tmp/hirate-cluster-certs.XXXXXX";
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!mkdtemp(certs)) return 2;
    ch_watchdog("test_cluster", 150);
    if (ch_start(&C, 3, 1, NULL) < 0) return 2;
    printf("test_cluster: %s\n", C.url);

    test_slots();
    test_exact();
    test_replica_seed();
    test_resharding();
    test_failover(1);
    test_failover(0);
    test_dead_seed();
    test_shard_down();
    ch_stop(&C);
    test_tls(certs);

    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf '%s'", certs);
    if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", certs);
    return check_summary("test_cluster");
}
