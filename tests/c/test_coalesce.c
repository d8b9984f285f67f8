/*
 * Coalescing in the blocking client: 64 threads on a pool of 2 connections,
 * so that nearly every call rides a round trip led by another thread (the
 * program ThreadSanitizer runs, label tsan).
 *
 *   one key:       exactly the capacity is admitted, each admitted call sees
 *                  a different "remaining", every call is sent once (EVALSHA
 *                  counted = calls made, no EVAL), the pool stays at 2;
 *   own keys:      each thread has its own key and sees its own count go
 *                  down one by one: no reply reaches another caller;
 *   SCRIPT FLUSH:  while threads call, the script is flushed again and
 *                  again; every call is answered by Redis, the NOSCRIPT
 *                  ones again as EVAL, and the count stays exact;
 *   SIGSTOP:       with Redis stopped, every call returns within its own
 *                  timeout (plus slack), decided by the policy; after
 *                  SIGCONT Redis decides again on new connections;
 *   fork():        a child forked while threads call decides through Redis
 *                  on a connection of its own and exits; the parent's
 *                  threads go on, exact.
 *   default pool:  with pool_size 16, the 64 threads' decisions ride the
 *                  four connections in flight: exactly the capacity is
 *                  admitted, at most four connections are opened;
 *   read-only:     the server is a replica for a while: the READONLY
 *                  replies close their connections once the calls behind
 *                  them have read theirs; each thread's Redis decisions
 *                  count down one by one, and the buckets hold what the
 *                  answers said;
 *   kill, restart: Redis is killed and started again (empty) while every
 *                  thread decides its own key; every call returns a decision,
 *                  from Redis or the policy with an outage code; on each
 *                  server a thread's Redis decisions count down one by one
 *                  from the capacity (none ran twice, none ran unanswered but
 *                  the ones in flight at the kill), and the new server's
 *                  buckets hold exactly what its answers said.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "hirate_io.h"
#include "redis_harness.h"
#include "test_time.h"

#define THREADS 64
#define NO_REFILL 1e-6

static rh_server S;
static atomic_int failures;

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); atomic_fetch_add(&failures, 1); } while (0)

static int pool_size = 2;

static hirate_limiter *make(const char *prefix, int64_t capacity, int on_error, int timeout_ms)
{
    hirate_options o;
    hirate_options_init(&o);
    o.functions = 0;   /* the EVALSHA path; test_sentinel.c has FCALL's */
    o.url = S.url;
    o.capacity = capacity;
    o.rate = capacity > 1000000 ? 1e6 : NO_REFILL;
    o.prefix = prefix;
    o.pool_size = pool_size;
    o.timeout_ms = timeout_ms;
    o.on_error = on_error;
    o.deny_cache = 0;   /* every call a round trip, so that they can be counted */
    o.backoff_min_ms = 20;
    o.backoff_max_ms = 100;
    hirate_limiter *l = NULL;
    char err[HIRATE_ERRMSG_SIZE];
    if (hirate_limiter_new(&l, &o, err, sizeof err) < 0)
        fprintf(stderr, "hirate_limiter_new: %s\n", err);
    CHECK(l != NULL);
    return l;
}

static void run_threads(void *(*fn)(void *), void *args, size_t argsize)
{
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        CHECK_EQ_I64(pthread_create(&t[i], NULL, fn, (char *)args + (size_t)i * argsize), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
}

/* ---- one key, exact ---------------------------------------------------------------- */

enum { CAPACITY = 1000, CALLS = 40 };   /* 64 * 40 = 2560 calls for 1000 tokens */

typedef struct one_key {
    hirate_limiter *l;
    const char *key;
    atomic_int *seen;          /* seen[remaining]: admitted calls that saw it */
    atomic_int *allowed;
    int flush;                 /* SCRIPT FLUSH runs meanwhile */
} one_key;

static void *one_key_worker(void *arg)
{
    one_key *a = *(one_key **)arg;
    for (int i = 0; i < CALLS; i++) {
        hirate_decision d;
        int rc = hirate_allow(a->l, a->key, strlen(a->key), 1, &d);
        if (rc != 0 || d.source != HIRATE_SOURCE_REDIS) {
            FAIL("one key: rc %d source %d\n", rc, rc == 0 ? (int)d.source : 0);
            continue;
        }
        if (d.allowed) {
            atomic_fetch_add(a->allowed, 1);
            if (d.remaining < 0 || d.remaining >= CAPACITY)
                FAIL("one key: remaining %lld\n", (long long)d.remaining);
            else if (atomic_fetch_add(&a->seen[d.remaining], 1) != 0)
                FAIL("one key: remaining %lld seen twice\n", (long long)d.remaining);
        }
    }
    return NULL;
}

static void one_key_run(const char *prefix, int flush)
{
    hirate_limiter *l = make(prefix, CAPACITY, HIRATE_ON_ERROR_CLOSED, 2000);
    static atomic_int seen[CAPACITY];
    atomic_int allowed = 0;
    for (int i = 0; i < CAPACITY; i++)
        atomic_store(&seen[i], 0);
    if (!flush) {
        redisReply *rep = rh_command(&S, "SCRIPT LOAD %s", hirate_script_source(NULL));
        CHECK(rep && rep->type == REDIS_REPLY_STRING && strcmp(rep->str, hirate_script_sha1()) == 0);
        if (rep)
            freeReplyObject(rep);
    }
    one_key a = {l, "the-key", seen, &allowed, flush};
    one_key *args[THREADS];
    for (int i = 0; i < THREADS; i++)
        args[i] = &a;
    /* The server counts a closed connection until it notices: wait for
     * those of the previous limiter to go, so that the pool's are counted. */
    for (int k = 0; k < 100 && rh_info_int(&S, "connected_clients") > 1; k++)
        usleep(10000);
    long long reads0 = rh_info_int(&S, "total_reads_processed");
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        CHECK_EQ_I64(pthread_create(&t[i], NULL, one_key_worker, &args[i]), 0);
    long long clients_max = 0;
    for (int k = 0; k < 20; k++) {
        long long clients = rh_info_int(&S, "connected_clients");
        if (clients > clients_max)
            clients_max = clients;
        if (flush) {
            redisReply *rep = rh_command(&S, "SCRIPT FLUSH");
            if (rep)
                freeReplyObject(rep);
        }
        usleep(flush ? 5000 : 2000);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    /* The server read the calls in fewer reads than there were calls: the
     * requests pipelined on a connection came to it together. How many a
     * read is the machine's speed, not a guarantee (a bench's figure): 7 to
     * 12 a read were measured, and under TSan, whose threads are slow to
     * come back with their next call, 2 to 3.6; one read a call would be
     * every call on a wire of its own. */
    long long reads = rh_info_int(&S, "total_reads_processed") - reads0;
    printf("  %d calls in %lld reads by the server\n", THREADS * CALLS, reads);
    if (!flush)
        CHECK(reads < THREADS * CALLS * 9 / 10);
    CHECK_EQ_I64(atomic_load(&allowed), CAPACITY);
    for (int i = 0; i < CAPACITY; i++)
        CHECK_EQ_I64(atomic_load(&seen[i]), 1);
    hirate_counters c;
    hirate_counters_get(l, &c);
    /* Every call sent once; after NOSCRIPT once more, as EVAL. */
    if (!flush) {   /* the script was loaded: no NOSCRIPT */
        CHECK_EQ_I64(c.evalsha, THREADS * CALLS);
        CHECK_EQ_I64(c.eval, 0);
    } else {        /* a call that ran twice would spend a token nobody saw */
        CHECK(c.eval >= 1);
        CHECK(c.evalsha + c.eval > THREADS * CALLS);
    }
    CHECK_EQ_I64(c.conns_dropped, 0);
    if (pool_size == 2) {
        CHECK(c.connects <= 2);
        /* the pool's two and the harness' own connection */
        CHECK(clients_max <= 3);
    } else {
        /* Decisions open a connection only while fewer than four are
         * open: the others ride their round trips. */
        CHECK(c.connects >= 1 && c.connects <= 4);
        CHECK(clients_max <= 5);
    }
    hirate_limiter_free(l);
}

/* ---- own keys: replies reach their callers -------------------------------------------- */

enum { OWN_CAPACITY = 30, OWN_CALLS = 35 };

typedef struct own_key {
    hirate_limiter *l;
    char key[32];
} own_key;

static void *own_key_worker(void *arg)
{
    own_key *a = arg;
    for (int i = 0; i < OWN_CALLS; i++) {
        hirate_decision d;
        int rc = hirate_allow(a->l, a->key, strlen(a->key), 1, &d);
        if (rc != 0 || d.source != HIRATE_SOURCE_REDIS) {
            FAIL("own key %s: rc %d\n", a->key, rc);
            continue;
        }
        int64_t want = i < OWN_CAPACITY ? OWN_CAPACITY - 1 - i : 0;
        if (d.allowed != (i < OWN_CAPACITY) || d.remaining != want)
            FAIL("own key %s, call %d: allowed %d remaining %lld, expected %d %lld\n", a->key, i,
                 d.allowed, (long long)d.remaining, i < OWN_CAPACITY, (long long)want);
    }
    return NULL;
}

static void own_keys(void)
{
    hirate_limiter *l = make("co:own:", OWN_CAPACITY, HIRATE_ON_ERROR_CLOSED, 2000);
    static own_key a[THREADS];
    for (int i = 0; i < THREADS; i++) {
        a[i].l = l;
        snprintf(a[i].key, sizeof a[i].key, "thread-%d", i);
    }
    run_threads(own_key_worker, a, sizeof a[0]);
    hirate_counters c;
    hirate_counters_get(l, &c);
    CHECK_EQ_I64(c.evalsha, THREADS * OWN_CALLS);
    CHECK(c.connects <= 2);
    hirate_limiter_free(l);
}

/* Waits (3 s at most) until Redis has made 1000 more decisions than now,
 * then stops the threads and joins them. */
static void resumed_then_stop(atomic_long *redis, atomic_int *stop, pthread_t *t)
{
    long resumed = atomic_load(redis);
    int64_t until = mono_us() + 3000000;
    while (atomic_load(redis) < resumed + 1000 && mono_us() < until)
        usleep(10000);
    atomic_store(stop, 1);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
}

/* ---- Redis stopped: each call within its own timeout --------------------------------- */

enum { STOP_TIMEOUT_MS = 100 };
/* Scheduling on two busy cores (and TSan's slowdown) on top of the timeout. */
#define STOP_SLACK_US (150 * 1000)

typedef struct stopped {
    hirate_limiter *l;
    atomic_int *stop;
    atomic_long *policy, *redis;
    int64_t worst_us;
} stopped;

static void *stopped_worker(void *arg)
{
    stopped *a = arg;
    char key[32];
    snprintf(key, sizeof key, "k%p", (void *)a);
    while (!atomic_load(a->stop)) {
        hirate_decision d;
        int64_t t0 = mono_us();
        int rc = hirate_allow(a->l, key, strlen(key), 1, &d);
        int64_t took = mono_us() - t0;
        if (took > a->worst_us)
            a->worst_us = took;
        if (rc != 0) {
            FAIL("stopped: rc %d\n", rc);
            continue;
        }
        if (took > STOP_TIMEOUT_MS * 1000 + STOP_SLACK_US)
            FAIL("stopped: a call took %lld us\n", (long long)took);
        if (d.source == HIRATE_SOURCE_REDIS)
            atomic_fetch_add(a->redis, 1);
        else if (d.source == HIRATE_SOURCE_FAIL_OPEN)
            atomic_fetch_add(a->policy, 1);
        else
            FAIL("stopped: source %d\n", (int)d.source);
        usleep(200);
    }
    return NULL;
}

static void redis_stopped(void)
{
    hirate_limiter *l = make("co:stop:", 1000000000, HIRATE_ON_ERROR_OPEN, STOP_TIMEOUT_MS);
    atomic_int stop = 0;
    atomic_long policy = 0, redis = 0;
    static stopped a[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        a[i] = (stopped){l, &stop, &policy, &redis, 0};
        CHECK_EQ_I64(pthread_create(&t[i], NULL, stopped_worker, &a[i]), 0);
    }
    usleep(100000);
    long redis_before = atomic_load(&redis);
    rh_pause(&S);
    usleep(600000);
    long policy_during = atomic_load(&policy);
    rh_resume(&S);
    /* The breaker's backoff (at most 100 ms) passes, a new connection is
     * made and Redis decides again. */
    long redis_resumed = atomic_load(&redis);
    resumed_then_stop(&redis, &stop, t);
    int64_t worst = 0;
    for (int i = 0; i < THREADS; i++)
        worst = a[i].worst_us > worst ? a[i].worst_us : worst;
    printf("  stopped: slowest call %lld us (timeout %d ms)\n", (long long)worst,
           STOP_TIMEOUT_MS);
    CHECK(redis_before > 0);
    CHECK(policy_during > 0);
    CHECK(atomic_load(&redis) >= redis_resumed + 1000);
    hirate_counters c;
    hirate_counters_get(l, &c);
    CHECK(c.conns_dropped >= 1);   /* the connection whose replies were in doubt */
    CHECK(c.connects >= 3);        /* and new ones after */
    hirate_limiter_free(l);
}

/* ---- read-only for a while: replies that close their connection ------------------------ */

/* While the server is a replica (of a master it cannot reach: it keeps its
 * data), every script call is refused with READONLY before it writes, and
 * the connection that carried the reply is closed once the turns pipelined
 * behind it have read theirs. Each thread's Redis decisions count down one
 * by one from the capacity: no reply reached another caller, none was lost
 * or taken twice. (Below 2^53 us to refill at NO_REFILL; a thread stops
 * short of the bottom.) */
enum { RO_CAPACITY = 9000, RO_FLOOR = 100 };

typedef struct readonly {
    hirate_limiter *l;
    atomic_int *stop;
    atomic_long *all_redis;
    char key[32];
    long redis, policy;
} readonly;

static void *readonly_worker(void *arg)
{
    readonly *a = arg;
    while (!atomic_load(a->stop) && a->redis < RO_CAPACITY - RO_FLOOR) {
        hirate_decision d;
        int rc = hirate_allow(a->l, a->key, strlen(a->key), 1, &d);
        if (rc != 0) {
            FAIL("read-only: rc %d\n", rc);
            continue;
        }
        if (d.source == HIRATE_SOURCE_REDIS) {
            a->redis++;
            atomic_fetch_add(a->all_redis, 1);
            if (d.remaining != RO_CAPACITY - a->redis)
                FAIL("read-only: %s has %lld left after %ld Redis decisions\n", a->key,
                     (long long)d.remaining, a->redis);
        } else if (d.source == HIRATE_SOURCE_FAIL_OPEN) {
            a->policy++;
        } else {
            FAIL("read-only: source %d\n", (int)d.source);
        }
        usleep(200);
    }
    return NULL;
}

static void read_only(void)
{
    hirate_limiter *l = make("co:ro:", RO_CAPACITY, HIRATE_ON_ERROR_OPEN, 1000);
    atomic_int stop = 0;
    atomic_long redis = 0;
    static readonly a[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        a[i] = (readonly){l, &stop, &redis, "", 0, 0};
        snprintf(a[i].key, sizeof a[i].key, "ro%d", i);
        CHECK_EQ_I64(pthread_create(&t[i], NULL, readonly_worker, &a[i]), 0);
    }
    usleep(100000);
    long before = atomic_load(&redis);
    redisReply *rep = rh_command(&S, "REPLICAOF 127.0.0.1 1");   /* nothing listens there */
    CHECK(rep && rep->type == REDIS_REPLY_STATUS);
    if (rep)
        freeReplyObject(rep);
    usleep(300000);
    rep = rh_command(&S, "REPLICAOF NO ONE");
    CHECK(rep && rep->type == REDIS_REPLY_STATUS);
    if (rep)
        freeReplyObject(rep);
    long resumed = atomic_load(&redis);
    resumed_then_stop(&redis, &stop, t);
    long policy = 0;
    for (int i = 0; i < THREADS; i++)
        policy += a[i].policy;
    printf("  read-only: %ld Redis decisions, %ld by the policy\n", atomic_load(&redis), policy);
    CHECK(before > 0);
    CHECK(policy > 0);
    CHECK(atomic_load(&redis) >= resumed + 1000);
    hirate_counters c;
    hirate_counters_get(l, &c);
    CHECK(c.conns_dropped >= 1);   /* each connection that carried a READONLY */
    for (int i = 0; i < THREADS; i++) {   /* the buckets hold what the answers said */
        hirate_decision d;
        CHECK_EQ_I64(hirate_peek(l, a[i].key, strlen(a[i].key), 1, &d), 0);
        CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
        CHECK_EQ_I64(d.remaining, RO_CAPACITY - a[i].redis);
    }
    hirate_limiter_free(l);
}

/* ---- Redis killed and restarted: exact accounting on each server ------------------------ */

/* Below 2^53 us to refill at NO_REFILL; a thread calls every 200 us or so,
 * and stops short of the bottom (a refusal would end the count). */
enum { KILL_CAPACITY = 9000, KILL_FLOOR = 100 };

typedef struct killed {
    hirate_limiter *l;
    atomic_int *stop;
    char key[32];
    long redis_old, redis_new, policy;   /* decisions on each server, by the policy */
    int64_t last;                        /* the last "remaining" Redis gave */
    atomic_int epoch;                    /* 0: the first server, 1: the new one */
} killed;

static void *killed_worker(void *arg)
{
    killed *a = arg;
    a->last = KILL_CAPACITY;
    while (!atomic_load(a->stop)) {
        hirate_decision d;
        usleep(200);
        if (a->last < KILL_FLOOR)
            continue;
        int rc = hirate_allow(a->l, a->key, strlen(a->key), 1, &d);
        if (rc != 0) {
            FAIL("kill %s: rc %d\n", a->key, rc);
            continue;
        }
        if (d.source == HIRATE_SOURCE_FAIL_CLOSED) {
            if (d.allowed || (d.error != HIRATE_ECONNECT && d.error != HIRATE_EIO &&
                              d.error != HIRATE_ETIMEDOUT && d.error != HIRATE_ESERVER))
                FAIL("kill %s: policy decision allowed %d error %s\n", a->key, d.allowed,
                     hirate_err_name(d.error));
            a->policy++;
            continue;
        }
        if (d.source != HIRATE_SOURCE_REDIS || !d.allowed) {
            FAIL("kill %s: source %d allowed %d\n", a->key, (int)d.source, d.allowed);
            continue;
        }
        if (d.remaining == KILL_CAPACITY - 1 && a->last != KILL_CAPACITY &&
            !atomic_load(&a->epoch)) {
            atomic_store(&a->epoch, 1);   /* the first answer of the empty new server */
        } else if (d.remaining != a->last - 1) {
            /* Only the calls in flight at the kill may have run unanswered,
             * and they ran on the old server, before the jump. */
            FAIL("kill %s: remaining %lld after %lld (server %d)\n", a->key,
                 (long long)d.remaining, (long long)a->last, a->epoch);
        }
        a->last = d.remaining;
        if (atomic_load(&a->epoch))
            a->redis_new++;
        else
            a->redis_old++;
    }
    return NULL;
}

static void kill_restart(void)
{
    hirate_limiter *l = make("co:kill:", KILL_CAPACITY, HIRATE_ON_ERROR_CLOSED, 2000);
    atomic_int stop = 0;
    static killed a[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        a[i] = (killed){.l = l, .stop = &stop, .epoch = 0};
        snprintf(a[i].key, sizeof a[i].key, "thread-%d", i);
        CHECK_EQ_I64(pthread_create(&t[i], NULL, killed_worker, &a[i]), 0);
    }
    usleep(150000);
    rh_kill(&S);
    usleep(200000);
    CHECK_EQ_I64(rh_restart(&S), 0);
    /* Until every thread has answers from the new server. */
    int64_t until = mono_us() + 10000000;
    for (int i = 0; i < THREADS; i++)
        while (!atomic_load(&a[i].epoch) && mono_us() < until)
            usleep(10000);
    usleep(50000);
    atomic_store(&stop, 1);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    long old = 0, fresh = 0, policy = 0;
    for (int i = 0; i < THREADS; i++) {
        old += a[i].redis_old;
        fresh += a[i].redis_new;
        policy += a[i].policy;
        /* What the new server holds is what its answers said: each of its
         * answers spent one token, and nothing else did. */
        hirate_decision d;
        CHECK_EQ_I64(hirate_peek(l, a[i].key, strlen(a[i].key), 1, &d), 0);
        CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
        CHECK_EQ_I64(d.remaining, KILL_CAPACITY - a[i].redis_new);
        CHECK_EQ_I64(atomic_load(&a[i].epoch), 1);
    }
    printf("  kill, restart: %ld decisions by the old server, %ld by the policy, %ld by the new "
           "server\n", old, policy, fresh);
    CHECK(old > 0);
    CHECK(policy > 0);
    CHECK(fresh > 0);
    hirate_limiter_free(l);
}

/* ---- fork() while threads call -------------------------------------------------------- */

static void *fork_worker(void *arg)
{
    one_key *a = *(one_key **)arg;
    for (int i = 0; i < CALLS; i++) {
        hirate_decision d;
        int rc = hirate_allow(a->l, a->key, strlen(a->key), 1, &d);
        if (rc != 0 || d.source != HIRATE_SOURCE_REDIS)
            FAIL("fork: rc %d\n", rc);
        else if (d.allowed)
            atomic_fetch_add(a->allowed, 1);
    }
    return NULL;
}

static void fork_in_the_middle(void)
{
    hirate_limiter *l = make("co:fork:", CAPACITY, HIRATE_ON_ERROR_CLOSED, 2000);
    atomic_int allowed = 0;
    one_key a = {l, "parent", NULL, &allowed, 0};
    one_key *args[THREADS];
    for (int i = 0; i < THREADS; i++)
        args[i] = &a;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        CHECK_EQ_I64(pthread_create(&t[i], NULL, fork_worker, &args[i]), 0);
    usleep(5000);
    for (int k = 0; k < 3; k++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(10);   /* a lock held by a thread that is not here would hang */
            int bad = 0;
            for (int i = 0; i < 5; i++) {
                hirate_decision d;
                int rc = hirate_allow(l, "child", 5, 1, &d);
                bad |= rc != 0 || d.source != HIRATE_SOURCE_REDIS || !d.allowed;
            }
#ifndef __SANITIZE_THREAD__
            /* Not under TSan: it knows nothing of the parent's threads being
             * gone from the child, so their last reads of the limiter (made
             * after their last lock) look concurrent with this free. */
            hirate_limiter_free(l);
#endif
            _exit(bad ? 1 : 0);
        }
        CHECK(pid > 0);
        int status = 0;
        CHECK_EQ_I64(waitpid(pid, &status, 0), pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        usleep(3000);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    CHECK_EQ_I64(atomic_load(&allowed), CAPACITY);
    hirate_decision d;
    CHECK_EQ_I64(hirate_peek(l, "child", 5, 1, &d), 0);
    CHECK_EQ_I64(d.remaining, CAPACITY - 15);   /* three children, five each */
    hirate_limiter_free(l);
}

int main(void)
{
    if (rh_start(&S) != 0) {
        CHECK(!"redis-server must start (is it installed and on PATH?)");
        return check_summary("test_coalesce");
    }
    rh_watchdog(&S, "test_coalesce", 170);
    int64_t t0 = mono_us();
    one_key_run("co:one:", 0);
    printf("  one key: %lld ms\n", (long long)((mono_us() - t0) / 1000));
    t0 = mono_us();
    own_keys();
    printf("  own keys: %lld ms\n", (long long)((mono_us() - t0) / 1000));
    t0 = mono_us();
    one_key_run("co:flush:", 1);
    printf("  script flush: %lld ms\n", (long long)((mono_us() - t0) / 1000));
    t0 = mono_us();
    fork_in_the_middle();
    printf("  fork: %lld ms\n", (long long)((mono_us() - t0) / 1000));
    t0 = mono_us();
    redis_stopped();
    printf("  redis stopped: %lld ms\n", (long long)((mono_us() - t0) / 1000));
    t0 = mono_us();
    read_only();
    printf("  read-only: %lld ms\n", (long long)((mono_us() - t0) / 1000));
    t0 = mono_us();
    kill_restart();
    printf("  kill, restart: %lld ms\n", (long long)((mono_us() - t0) / 1000));
    t0 = mono_us();
    pool_size = 16;
    one_key_run("co:pool16:", 0);
    printf("  default pool: %lld ms\n", (long long)((mono_us() - t0) / 1000));
    CHECK_EQ_I64(atomic_load(&failures), 0);
    rh_stop(&S);
    return check_summary("test_coalesce");
}
