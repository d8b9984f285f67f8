/*
 * The Redis path against a real redis-server started by the harness: exact
 * decisions and keys, the EVALSHA/EVAL protocol, atomicity under threads and
 * fork(), and what happens when the server dies, stops, refuses the password
 * or never accepts. Every failure case asserts a wall-clock bound.
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>

#include "check.h"
#include "test_time.h"
#include "hirate.h"
#include "hirate_io.h"
#include "redis_harness.h"

#define CANARY "s3cr3t-canary"

static rh_server S;   /* the shared server; tests (d) and (e) kill and stop it */

/* ---- helpers ----------------------------------------------------------- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct cfg {
    int64_t capacity;
    double rate;
    const char *url;        /* NULL: the shared server */
    const char *prefix;
    int timeout_ms, connect_timeout_ms, pool_size;   /* 0: the default */
    int on_error;           /* a hirate_on_error; 0 is the default, LOCAL */
    int no_deny_cache;      /* 1: deny_cache = 0, every decision reaches Redis */
} cfg;

static hirate_limiter *make(cfg c)
{
    hirate_options o;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE] = "";
    hirate_options_init(&o);
    o.functions = 0;   /* the EVALSHA path; test_sentinel.c has FCALL's */
    o.url = c.url ? c.url : S.url;
    o.capacity = c.capacity;
    o.rate = c.rate;
    if (c.prefix) o.prefix = c.prefix;
    if (c.timeout_ms) o.timeout_ms = c.timeout_ms;
    if (c.connect_timeout_ms) o.connect_timeout_ms = c.connect_timeout_ms;
    if (c.pool_size) o.pool_size = c.pool_size;
    o.on_error = c.on_error;
    if (c.no_deny_cache) o.deny_cache = 0;
    int rc = hirate_limiter_new(&lim, &o, why, sizeof why);
    if (rc != 0) fprintf(stderr, "  hirate_limiter_new(%s): %s (%s)\n", o.url, hirate_err_name(rc), why);
    CHECK_EQ_I64(rc, 0);
    return lim;
}

static int allow_s(hirate_limiter *lim, const char *key, int64_t cost, hirate_decision *d)
{
    return hirate_allow(lim, key, strlen(key), cost, d);
}

/* The integer reply of one command, or -999999 when it is not an integer. */
static long long int_reply(redisReply *r)
{
    long long v = (r && r->type == REDIS_REPLY_INTEGER) ? r->integer : -999999;
    if (r) freeReplyObject(r);
    return v;
}

/* EXISTS (what = "EXISTS") or PTTL of prefix+key in db, byte-exact through %b,
 * on one raw connection (rh_command opens a new one per command, so SELECT
 * would not carry over). */
static long long key_query(const char *what, int db, const char *prefix, const void *key,
                           size_t keylen)
{
    char full[HIRATE_PREFIX_MAX + HIRATE_KEY_MAX];
    size_t plen = strlen(prefix);
    memcpy(full, prefix, plen);
    memcpy(full + plen, key, keylen);
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", S.port, tv);
    long long v = -999999;
    if (c && !c->err && redisSetTimeout(c, tv) == REDIS_OK) {
        redisReply *r = redisCommand(c, "SELECT %d", db);
        int ok = r && r->type == REDIS_REPLY_STATUS;
        if (r) freeReplyObject(r);
        if (ok) v = int_reply(redisCommand(c, "%s %b", what, full, plen + keylen));
    }
    if (c) redisFree(c);
    return v;
}

static long long exists_in(int db, const void *key, size_t keylen)
{
    return key_query("EXISTS", db, "rl:", key, keylen);
}

static int reply_is(redisReply *r, const char *status)
{
    int ok = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, status) == 0;
    if (!ok && r && r->str) fprintf(stderr, "  reply: %s\n", r->str);
    if (r) freeReplyObject(r);
    return ok;
}

static int errmsg_has_no_canary(hirate_limiter *lim)
{
    char buf[HIRATE_ERRMSG_SIZE];
    hirate_limiter_errmsg(lim, buf, sizeof buf);
    if (strstr(buf, "s3cr3t") || strstr(buf, "canary")) {
        fprintf(stderr, "  the password leaked: \"%s\"\n", buf);
        return 0;
    }
    return buf[0] != '\0';
}

static void check_fresh_allow(int rc, const hirate_decision *d, int64_t capacity)
{
    CHECK_EQ_I64(rc, 0);
    if (rc != 0) return;   /* *d holds nothing to compare */
    CHECK_EQ_I64(d->allowed, 1);
    CHECK_EQ_I64(d->source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(d->limit, capacity);
    CHECK_EQ_I64(d->remaining, capacity - 1);
}

/* ---- (b) the script itself ---------------------------------------------- */

static void test_script_sha1_is_what_redis_computes(void)
{
    size_t len = 0;
    const char *src = hirate_script_source(&len);
    const char *sha = hirate_script_sha1();
    CHECK(src != NULL && len > 0);
    CHECK_EQ_I64(strlen(sha), 40);
    redisReply *r = rh_command(&S, "SCRIPT LOAD %b", src, len);
    CHECK(r && r->type == REDIS_REPLY_STRING);
    if (r && r->type == REDIS_REPLY_STRING) CHECK_EQ_STR(r->str, sha);
    if (r) freeReplyObject(r);
}

/* ---- (a) decisions, keys, TTLs ------------------------------------------ */

/* rate 0.01: one token per 100 s, so nothing refills during the test and
 * every value is exact. */
static void test_decisions_are_exact_and_every_key_has_a_ttl(void)
{
    hirate_limiter *lim = make((cfg){.capacity = 5, .rate = 0.01});
    hirate_decision d;
    if (!lim) return;

    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    int64_t wall_us = (int64_t)wall.tv_sec * 1000000 + wall.tv_nsec / 1000;

    int rc = allow_s(lim, "basic", 1, &d);
    check_fresh_allow(rc, &d, 5);
    CHECK_EQ_I64(d.error, 0);
    CHECK_EQ_I64(d.retry_after_us, 0);
    CHECK_EQ_I64(d.reset_after_us, 100000000);      /* 1 token at 0.01/s */
    CHECK(d.time_us > wall_us - 5000000 && d.time_us < wall_us + 5000000);  /* Redis' TIME */

    long long pttl = key_query("PTTL", 0, "rl:", "basic", 5);
    CHECK(pttl > 0 && pttl <= 100000);               /* never -1 (no TTL) or -2 */

    /* cost 0 reports the bucket and spends nothing. */
    rc = allow_s(lim, "basic", 0, &d);
    CHECK_EQ_I64(rc, 0);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.remaining, 4);

    /* A cost above the capacity can never pass. */
    rc = allow_s(lim, "basic", 6, &d);
    CHECK_EQ_I64(rc, 0);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK_EQ_I64(d.retry_after_us, HIRATE_NEVER);
    CHECK_EQ_I64(d.remaining, 4);

    rc = allow_s(lim, "basic", 4, &d);
    CHECK_EQ_I64(rc, 0);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.remaining, 0);
    pttl = key_query("PTTL", 0, "rl:", "basic", 5);
    CHECK(pttl > 400000 && pttl <= 500000);          /* about 5 tokens to refill */

    rc = allow_s(lim, "basic", 1, &d);
    CHECK_EQ_I64(rc, 0);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK_EQ_I64(d.remaining, 0);
    CHECK(d.source == HIRATE_SOURCE_REDIS || d.source == HIRATE_SOURCE_CACHE);
    CHECK(d.retry_after_us > 90000000 && d.retry_after_us <= 100000000);
    hirate_limiter_free(lim);
}

static void test_peek_spends_nothing_and_creates_nothing(void)
{
    hirate_limiter *lim = make((cfg){.capacity = 5, .rate = 0.01});
    hirate_decision d;
    if (!lim) return;

    int rc = hirate_peek(lim, "peek-fresh", 10, 1, &d);
    CHECK_EQ_I64(rc, 0);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.remaining, 5);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(exists_in(0, "peek-fresh", 10), 0);

    CHECK_EQ_I64(allow_s(lim, "peek", 2, &d), 0);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.remaining, 3);
    for (int i = 0; i < 3; i++) {
        rc = hirate_peek(lim, "peek", 4, 3, &d);
        CHECK_EQ_I64(rc, 0);
        CHECK_EQ_I64(d.allowed, 1);
        CHECK_EQ_I64(d.remaining, 3);
    }
    rc = hirate_peek(lim, "peek", 4, 4, &d);          /* would be refused */
    CHECK_EQ_I64(rc, 0);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK_EQ_I64(d.remaining, 3);
    rc = allow_s(lim, "peek", 3, &d);                 /* the 3 are all still there */
    CHECK_EQ_I64(rc, 0);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.remaining, 0);
    hirate_limiter_free(lim);
}

static void test_reset_deletes_the_key_and_the_bucket_is_full_again(void)
{
    hirate_limiter *lim = make((cfg){.capacity = 3, .rate = 0.01});
    hirate_decision d;
    if (!lim) return;

    CHECK_EQ_I64(allow_s(lim, "reset", 3, &d), 0);
    CHECK_EQ_I64(d.remaining, 0);
    CHECK_EQ_I64(allow_s(lim, "reset", 1, &d), 0);   /* a refusal, maybe cached */
    CHECK_EQ_I64(d.allowed, 0);
    CHECK_EQ_I64(exists_in(0, "reset", 5), 1);

    CHECK_EQ_I64(hirate_reset(lim, "reset", 5), 0);
    CHECK_EQ_I64(exists_in(0, "reset", 5), 0);
    /* Full again: neither Redis nor a remembered refusal may say otherwise. */
    CHECK_EQ_I64(allow_s(lim, "reset", 1, &d), 0);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(d.remaining, 2);

    CHECK_EQ_I64(hirate_reset(lim, "never-used", 10), 0);   /* nothing to delete is fine */
    hirate_limiter_free(lim);
}

typedef struct bkey {
    const char *bytes;
    size_t len;
} bkey;

static void test_keys_are_stored_byte_exactly_under_the_prefix(void)
{
    static char big[HIRATE_KEY_MAX];
    memset(big, 'k', sizeof big);
    big[7] = '\0';
    big[100] = '\r';
    big[101] = '\n';
    const bkey keys[] = {
        {"a\0b", 3},           /* truncated at NUL, it would merge with "a" */
        {"a", 1},
        {"a\r\nb", 4},          /* would end a RESP line if sent inline */
        {"%s%n%b", 6},          /* would be a format string if misused */
        {"{user}", 6},          /* braces choose a cluster slot */
        {"}{", 2},
        {"\xff\xfe\x00\x80", 4}, /* not UTF-8 */
        {" ", 1},
        {big, sizeof big},      /* the longest key allowed */
    };
    hirate_limiter *lim = make((cfg){.capacity = 5, .rate = 0.01});
    hirate_decision d;
    if (!lim) return;

    CHECK_EQ_I64(exists_in(0, "a", 1), 0);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        CHECK_EQ_I64(exists_in(0, keys[i].bytes, keys[i].len), 0);
        int rc = hirate_allow(lim, keys[i].bytes, keys[i].len, 1, &d);
        check_fresh_allow(rc, &d, 5);   /* each is its own, fresh bucket */
        CHECK_EQ_I64(exists_in(0, keys[i].bytes, keys[i].len), 1);
        long long pttl = key_query("PTTL", 0, "rl:", keys[i].bytes, keys[i].len);
        CHECK(pttl > 0 && pttl <= 100000);
    }
    /* The same bytes are the same bucket. */
    CHECK_EQ_I64(hirate_allow(lim, "a\0b", 3, 1, &d), 0);
    CHECK_EQ_I64(d.remaining, 3);

    CHECK_EQ_I64(hirate_allow(lim, "", 0, 1, &d), HIRATE_EKEY);
    static char too_big[HIRATE_KEY_MAX + 1];
    memset(too_big, 'k', sizeof too_big);
    CHECK_EQ_I64(hirate_allow(lim, too_big, sizeof too_big, 1, &d), HIRATE_EKEY);
    hirate_limiter_free(lim);

    /* A custom prefix, braces and all, is prepended byte for byte. */
    lim = make((cfg){.capacity = 5, .rate = 0.01, .prefix = "app:{t}:"});
    if (!lim) return;
    check_fresh_allow(hirate_allow(lim, "x\0y", 3, 1, &d), &d, 5);
    CHECK_EQ_I64(key_query("EXISTS", 0, "app:{t}:", "x\0y", 3), 1);
    CHECK_EQ_I64(exists_in(0, "x\0y", 3), 0);
    hirate_limiter_free(lim);
}

/* ---- (b) EVALSHA first, EVAL only after NOSCRIPT ------------------------- */

static void stats(hirate_limiter *lim, hirate_counters *st)
{
    memset(st, 0, sizeof *st);
    hirate_counters_get(lim, st);
}

static void test_evalsha_first_and_one_eval_after_noscript(void)
{
    hirate_counters st;
    hirate_decision d;
    CHECK(reply_is(rh_command(&S, "SCRIPT FLUSH"), "OK"));
    /* No deny cache: this counts what goes on the wire. */
    hirate_limiter *lim = make((cfg){.capacity = 100, .rate = 0.001, .no_deny_cache = 1});
    if (!lim) return;

    stats(lim, &st);
    CHECK_EQ_I64(st.connects, 0);   /* making a limiter does not connect */
    CHECK_EQ_I64(st.evalsha + st.eval, 0);

    CHECK_EQ_I64(allow_s(lim, "proto", 1, &d), 0);
    CHECK_EQ_I64(d.remaining, 99);
    stats(lim, &st);
    CHECK_EQ_I64(st.evalsha, 1);
    CHECK_EQ_I64(st.eval, 1);
    CHECK_EQ_I64(st.connects, 1);

    for (int i = 0; i < 3; i++) {
        CHECK_EQ_I64(allow_s(lim, "proto", 1, &d), 0);
        CHECK_EQ_I64(d.remaining, 98 - i);
    }
    stats(lim, &st);
    CHECK_EQ_I64(st.evalsha, 4);
    CHECK_EQ_I64(st.eval, 1);

    CHECK(reply_is(rh_command(&S, "SCRIPT FLUSH"), "OK"));
    CHECK_EQ_I64(allow_s(lim, "proto", 1, &d), 0);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.remaining, 95);
    stats(lim, &st);
    CHECK_EQ_I64(st.evalsha, 5);
    CHECK_EQ_I64(st.eval, 2);
    CHECK_EQ_I64(allow_s(lim, "proto", 1, &d), 0);
    CHECK_EQ_I64(d.remaining, 94);
    stats(lim, &st);
    CHECK_EQ_I64(st.evalsha, 6);
    CHECK_EQ_I64(st.eval, 2);
    CHECK_EQ_I64(st.connects, 1);       /* NOSCRIPT is an answer, not a broken link */
    CHECK_EQ_I64(st.conns_dropped, 0);
    hirate_limiter_free(lim);
}

typedef struct worker {
    hirate_limiter *lim;
    pthread_barrier_t *barrier;
    const char *key;
    int calls;
    int allowed, refused, errors;
    int first_error;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    pthread_barrier_wait(w->barrier);
    for (int i = 0; i < w->calls; i++) {
        hirate_decision d;
        int rc = allow_s(w->lim, w->key, 1, &d);
        if (rc < 0) {
            w->errors++;
            if (!w->first_error) w->first_error = rc;
        } else if (d.allowed) {
            w->allowed++;
        } else {
            w->refused++;
        }
    }
    return NULL;
}

/* n threads released together, each making `calls` calls on key; sums into *sum. */
static void run_threads(hirate_limiter *lim, const char *key, int n, int calls, worker *sum)
{
    worker w[128];
    pthread_t t[128];
    pthread_barrier_t barrier;
    memset(sum, 0, sizeof *sum);
    if (n > 128) n = 128;
    pthread_barrier_init(&barrier, NULL, (unsigned)n);
    for (int i = 0; i < n; i++) {
        w[i] = (worker){.lim = lim, .barrier = &barrier, .key = key, .calls = calls};
        if (pthread_create(&t[i], NULL, worker_main, &w[i]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            abort();   /* the barrier would wait forever */
        }
    }
    for (int i = 0; i < n; i++) {
        pthread_join(t[i], NULL);
        sum->allowed += w[i].allowed;
        sum->refused += w[i].refused;
        sum->errors += w[i].errors;
        if (!sum->first_error) sum->first_error = w[i].first_error;
    }
    pthread_barrier_destroy(&barrier);
}

/* Several connections at once: each may send the script once (EVAL); the
 * calls pipelined behind its NOSCRIPT go again by EVALSHA, after it. */
static void test_script_flush_costs_at_most_one_eval_per_connection(void)
{
    hirate_counters st0, st1;
    worker sum;
    hirate_limiter *lim = make((cfg){.capacity = 1000, .rate = 0.001, .timeout_ms = 2000,
                                     .connect_timeout_ms = 2000, .pool_size = 8,
                                     .no_deny_cache = 1});
    if (!lim) return;
    run_threads(lim, "flush-threads", 8, 10, &sum);
    CHECK_EQ_I64(sum.allowed, 80);
    CHECK_EQ_I64(sum.errors, 0);
    CHECK(reply_is(rh_command(&S, "SCRIPT FLUSH"), "OK"));
    stats(lim, &st0);
    long long noscripts = rh_error_count(&S, "NOSCRIPT");
    run_threads(lim, "flush-threads", 8, 10, &sum);
    stats(lim, &st1);
    noscripts = rh_error_count(&S, "NOSCRIPT") - noscripts;
    CHECK_EQ_I64(sum.allowed, 80);
    CHECK_EQ_I64(sum.errors, 0);
    CHECK(st0.connects >= 1 && st0.connects <= 8);
    /* NOSCRIPT drops no connection. (The pool may still grow to its 8 if the
     * second round happens to overlap more than the first did.) */
    CHECK_EQ_I64(st1.conns_dropped, st0.conns_dropped);
    CHECK(st1.connects >= st0.connects && st1.connects <= 8);
    CHECK(st1.eval - st0.eval >= 1 && st1.eval - st0.eval <= st1.connects);
    /* Every call sent once, and once more for each NOSCRIPT the server gave. */
    CHECK(noscripts >= 1);
    CHECK_EQ_I64(st1.evalsha - st0.evalsha + st1.eval - st0.eval, 80 + noscripts);
    hirate_decision d;
    CHECK_EQ_I64(allow_s(lim, "flush-threads", 1, &d), 0);
    CHECK_EQ_I64(d.remaining, 1000 - 161);
    hirate_limiter_free(lim);
}

/* The command name of one MONITOR line, lowercased, unless a script ran it:
 * `1700000000.123456 [0 127.0.0.1:5555] "evalsha" "..."` → "evalsha";
 * `... [0 lua] "TIME"` → "". */
static void monitor_command(const char *line, char *name, size_t cap)
{
    const char *lb = strchr(line, '['), *rb = lb ? strchr(lb, ']') : NULL;
    name[0] = '\0';
    if (!rb || (rb - lb >= 4 && memcmp(rb - 3, "lua", 3) == 0)) return;
    const char *q = strchr(rb, '"');
    if (!q) return;
    size_t n = 0;
    for (q++; *q && *q != '"' && n + 1 < cap; q++) name[n++] = (char)(*q | 0x20);
    name[n] = '\0';
}

static void test_wire_sequence_is_evalsha_eval_evalsha(void)
{
    CHECK(reply_is(rh_command(&S, "SCRIPT FLUSH"), "OK"));
    struct timeval tv = {2, 0};
    redisContext *mon = redisConnectWithTimeout("127.0.0.1", S.port, tv);
    CHECK(mon && !mon->err);
    if (!mon || mon->err) {
        if (mon) redisFree(mon);
        return;
    }
    redisSetTimeout(mon, tv);
    CHECK(reply_is(redisCommand(mon, "MONITOR"), "OK"));

    hirate_limiter *lim = make((cfg){.capacity = 10, .rate = 0.001, .pool_size = 1,
                                     .no_deny_cache = 1});
    hirate_decision d;
    if (lim) {
        CHECK_EQ_I64(allow_s(lim, "monitor", 1, &d), 0);
        CHECK_EQ_I64(d.remaining, 9);
        CHECK_EQ_I64(allow_s(lim, "monitor", 1, &d), 0);
        CHECK_EQ_I64(d.remaining, 8);
        hirate_limiter_free(lim);
    }
    /* Commands are logged in the order the server runs them, so everything
     * the limiter sent comes before this marker. */
    redisReply *echo = rh_command(&S, "ECHO %s", "hirate-monitor-end");
    if (echo) freeReplyObject(echo);

    char seq[256] = "";
    for (int i = 0; i < 100; i++) {
        redisReply *r = NULL;
        if (redisGetReply(mon, (void **)&r) != REDIS_OK || !r) break;
        int done = r->type == REDIS_REPLY_STATUS && strstr(r->str, "hirate-monitor-end");
        char name[32];
        if (r->type == REDIS_REPLY_STATUS) monitor_command(r->str, name, sizeof name);
        else name[0] = '\0';
        freeReplyObject(r);
        if (done) break;
        if (strncmp(name, "eval", 4) == 0 || strcmp(name, "script") == 0 ||
            strncmp(name, "fcall", 5) == 0) {
            if (seq[0]) strncat(seq, ",", sizeof seq - strlen(seq) - 1);
            strncat(seq, name, sizeof seq - strlen(seq) - 1);
        }
    }
    CHECK_EQ_STR(seq, "evalsha,eval,evalsha");
    redisFree(mon);
}

/* ---- (c) atomicity: threads, then processes ------------------------------ */

static void test_100_threads_on_one_key_get_exactly_the_capacity(void)
{
    worker sum;
    hirate_limiter *lim = make((cfg){.capacity = 10, .rate = 0.001, .timeout_ms = 2000,
                                     .connect_timeout_ms = 2000});
    if (!lim) return;
    run_threads(lim, "burst-threads", 100, 1, &sum);
    if (sum.errors) fprintf(stderr, "  first error: %s\n", hirate_err_name(sum.first_error));
    CHECK_EQ_I64(sum.allowed, 10);
    CHECK_EQ_I64(sum.refused, 90);
    CHECK_EQ_I64(sum.errors, 0);
    hirate_limiter_free(lim);
}

typedef struct child_report {
    int allowed, refused, errors;
} child_report;

static void test_forked_processes_share_one_budget_and_the_parent_survives(void)
{
    enum { CHILDREN = 4, THREADS = 25 };
    hirate_counters st0, st1;
    hirate_decision d;
    worker warm;
    hirate_limiter *lim = make((cfg){.capacity = 10, .rate = 0.001, .timeout_ms = 2000,
                                     .connect_timeout_ms = 2000});
    if (!lim) return;

    /* The parent holds open connections (several, from several threads)
     * before it forks: the children inherit those sockets. */
    run_threads(lim, "fork-warm", 4, 2, &warm);
    CHECK_EQ_I64(warm.allowed, 8);
    stats(lim, &st0);
    CHECK(st0.connects >= 1);
    long long conns0 = rh_info_int(&S, "total_connections_received");

    int p[2];
    CHECK_EQ_I64(pipe(p), 0);
    pid_t pids[CHILDREN];
    fflush(NULL);
    for (int i = 0; i < CHILDREN; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            signal(SIGALRM, SIG_DFL);   /* the parent's handler would kill the server */
            alarm(30);                  /* a hung child must not hang the test */
            close(p[0]);
            worker sum;
            run_threads(lim, "fork-shared", THREADS, 1, &sum);
            child_report rep = {sum.allowed, sum.refused, sum.errors};
            /* Freeing in the child must not disturb the parent's sockets. */
            hirate_limiter_free(lim);
            ssize_t n = write(p[1], &rep, sizeof rep);
            _exit(n == (ssize_t)sizeof rep ? 0 : 3);
        }
        CHECK(pids[i] > 0);
    }
    close(p[1]);

    /* Meanwhile the parent keeps using its own connections. */
    for (int i = 0; i < 12; i++) {
        int rc = allow_s(lim, "fork-parent", 1, &d);
        CHECK_EQ_I64(rc, 0);
        CHECK_EQ_I64(d.allowed, i < 10);
        CHECK_EQ_I64(d.remaining, i < 10 ? 9 - i : 0);
    }

    child_report total = {0, 0, 0}, rep;
    int reports = 0;
    for (;;) {
        ssize_t n = read(p[0], &rep, sizeof rep);
        if (n < 0 && errno == EINTR) continue;
        if (n != (ssize_t)sizeof rep) break;
        reports++;
        total.allowed += rep.allowed;
        total.refused += rep.refused;
        total.errors += rep.errors;
    }
    close(p[0]);
    for (int i = 0; i < CHILDREN; i++) {
        int status = 0;
        if (pids[i] <= 0) continue;
        CHECK_EQ_I64(waitpid(pids[i], &status, 0), pids[i]);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    CHECK_EQ_I64(reports, CHILDREN);
    CHECK_EQ_I64(total.allowed, 10);
    CHECK_EQ_I64(total.refused, CHILDREN * THREADS - 10);
    CHECK_EQ_I64(total.errors, 0);

    /* Each child opened its own connection(s) rather than using ours. */
    CHECK(rh_info_int(&S, "total_connections_received") - conns0 >= CHILDREN);

    /* The parent's connections are intact: no reconnect, no drop. */
    check_fresh_allow(allow_s(lim, "fork-after", 1, &d), &d, 10);
    stats(lim, &st1);
    CHECK_EQ_I64(st1.conns_dropped, st0.conns_dropped);
    hirate_limiter_free(lim);
}

/* ---- (f) authentication, ACL permissions, db, unix socket ------------------ */

static void test_acl_user_and_db_from_the_url(void)
{
    char url[512];
    hirate_decision d;
    CHECK(reply_is(rh_command(&S, "ACL SETUSER rl on >%s ~* &* +@all", CANARY), "OK"));
    CHECK(reply_is(rh_command(&S, "ACL SETUSER rl-noeval on >%s ~* &* +@all -evalsha -eval",
                              CANARY), "OK"));
    CHECK(reply_is(rh_command(&S, "ACL SETUSER rl-otherkeys on >%s ~other:* &* +@all",
                              CANARY), "OK"));

    snprintf(url, sizeof url, "redis://rl:%s@127.0.0.1:%d/3", CANARY, S.port);
    hirate_limiter *lim = make((cfg){.capacity = 5, .rate = 0.01, .url = url});
    if (lim) {
        check_fresh_allow(allow_s(lim, "auth-db", 1, &d), &d, 5);
        CHECK_EQ_I64(exists_in(3, "auth-db", 7), 1);
        CHECK_EQ_I64(exists_in(0, "auth-db", 7), 0);
        hirate_limiter_free(lim);
    }

    snprintf(url, sizeof url, "redis://rl:wrong-%s@127.0.0.1:%d/3", CANARY, S.port);
    lim = make((cfg){.capacity = 5, .rate = 0.01, .url = url});
    if (lim) {
        CHECK_EQ_I64(allow_s(lim, "auth-db", 1, &d), HIRATE_EAUTH);
        CHECK(errmsg_has_no_canary(lim));
        hirate_limiter_free(lim);
    }

    snprintf(url, sizeof url, "redis://rl-noeval:%s@127.0.0.1:%d", CANARY, S.port);
    lim = make((cfg){.capacity = 5, .rate = 0.01, .url = url});
    if (lim) {
        CHECK_EQ_I64(allow_s(lim, "auth-noeval", 1, &d), HIRATE_ENOPERM);
        CHECK(errmsg_has_no_canary(lim));
        hirate_limiter_free(lim);
    }
    CHECK_EQ_I64(exists_in(0, "auth-noeval", 11), 0);

    /* May run scripts, but not on keys under the limiter's prefix. */
    snprintf(url, sizeof url, "redis://rl-otherkeys:%s@127.0.0.1:%d", CANARY, S.port);
    lim = make((cfg){.capacity = 5, .rate = 0.01, .url = url});
    if (lim) {
        CHECK_EQ_I64(allow_s(lim, "auth-keys", 1, &d), HIRATE_ENOPERM);
        CHECK(errmsg_has_no_canary(lim));
        hirate_limiter_free(lim);
    }
    CHECK_EQ_I64(exists_in(0, "auth-keys", 9), 0);
}

static void test_unix_socket_with_a_db(void)
{
    char url[512];
    hirate_decision d;
    snprintf(url, sizeof url, "unix://%s?db=2", S.unixsock);
    hirate_limiter *lim = make((cfg){.capacity = 5, .rate = 0.01, .url = url});
    if (!lim) return;
    check_fresh_allow(allow_s(lim, "unix-db", 1, &d), &d, 5);
    CHECK_EQ_I64(allow_s(lim, "unix-db", 1, &d), 0);
    CHECK_EQ_I64(d.remaining, 3);
    CHECK_EQ_I64(exists_in(2, "unix-db", 7), 1);
    CHECK_EQ_I64(exists_in(0, "unix-db", 7), 0);
    hirate_limiter_free(lim);
}

/* The default user with --requirepass: a password and no user in the URL. */
static void test_requirepass_with_a_password_only_url(void)
{
    rh_server t;
    char url[512];
    hirate_decision d;
    memset(&t, 0, sizeof t);
    t.extra = "--requirepass " CANARY;
    CHECK_EQ_I64(rh_start(&t), 0);
    if (!t.pid) return;

    snprintf(url, sizeof url, "redis://:%s@127.0.0.1:%d/1", CANARY, t.port);
    hirate_limiter *lim = make((cfg){.capacity = 5, .rate = 0.01, .url = url});
    if (lim) {
        check_fresh_allow(allow_s(lim, "pass", 1, &d), &d, 5);
        hirate_limiter_free(lim);
    }
    snprintf(url, sizeof url, "redis://:nope-%s@127.0.0.1:%d/1", CANARY, t.port);
    lim = make((cfg){.capacity = 5, .rate = 0.01, .url = url});
    if (lim) {
        CHECK_EQ_I64(allow_s(lim, "pass", 1, &d), HIRATE_EAUTH);
        CHECK(errmsg_has_no_canary(lim));
        hirate_limiter_free(lim);
    }
    /* No password at all: the server answers NOAUTH. */
    lim = make((cfg){.capacity = 5, .rate = 0.01, .url = t.url});
    if (lim) {
        CHECK_EQ_I64(allow_s(lim, "pass", 1, &d), HIRATE_EAUTH);
        hirate_limiter_free(lim);
    }
    rh_stop(&t);
}

/* ---- (g) a server that never accepts ------------------------------------- */

/* What the CLOSED policy answers for a failure: refused, nothing remaining,
 * come back when the breaker lets a probe through (at most max_wait_us). */
static void check_fail_closed(int rc, const hirate_decision *d, int64_t capacity, int error,
                              int64_t max_wait_us)
{
    CHECK_EQ_I64(rc, 0);
    if (rc != 0) return;
    CHECK_EQ_I64(d->allowed, 0);
    CHECK_EQ_I64(d->source, HIRATE_SOURCE_FAIL_CLOSED);
    CHECK_EQ_I64(d->error, error);
    CHECK_EQ_I64(d->limit, capacity);
    CHECK_EQ_I64(d->remaining, 0);
    CHECK(d->retry_after_us >= 1 && d->retry_after_us <= max_wait_us);
    CHECK_EQ_I64(d->reset_after_us, d->retry_after_us);
}

/* The breaker's longest wait with the default backoff (5 s, +25% jitter). */
#define DEFAULT_MAX_WAIT_US 6250000

static void test_connect_timeout_bounds_a_server_that_never_accepts(void)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    int lfd = socket(AF_INET, SOCK_STREAM, 0), fill[3] = {-1, -1, -1};
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(lfd >= 0 && bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 0) == 0 &&
          getsockname(lfd, (struct sockaddr *)&a, &alen) == 0);
    /* Fill the accept queue so that later SYNs are dropped. */
    for (int i = 0; i < 3; i++) {
        fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fill[i] >= 0) connect(fill[i], (struct sockaddr *)&a, sizeof a);
    }
    sleep_ms(50);

    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", ntohs(a.sin_port));
    /* A long command timeout: only the connect timeout can end the call early.
     * The policy answers for the failure: closed, so every call is refused. */
    hirate_limiter *lim = make((cfg){.capacity = 5, .rate = 1, .url = url,
                                     .connect_timeout_ms = 100, .timeout_ms = 5000,
                                     .on_error = HIRATE_ON_ERROR_CLOSED});
    if (lim) {
        for (int i = 0; i < 2; i++) {
            hirate_decision d;
            memset(&d, 0, sizeof d);   /* printed even if the call fails */
            double t0 = now_ms();
            int rc = allow_s(lim, "never-accepts", 1, &d);
            double dt = now_ms() - t0;
            printf("  connect timeout 100 ms: call %d returned %s, %s (%s) after %.1f ms\n", i,
                   hirate_err_name(rc), hirate_source_name(d.source), hirate_err_name(d.error), dt);
            /* The first failure opens the breaker for backoff_min_ms (100 ms
             * by default, +25% jitter) at most. */
            check_fail_closed(rc, &d, 5, HIRATE_ECONNECT, i == 0 ? 125000 : DEFAULT_MAX_WAIT_US);
            CHECK(dt < 1000);
            if (i == 0) CHECK(dt >= 80);   /* it did wait for the timeout */
        }
        hirate_limiter_free(lim);
    }
    for (int i = 0; i < 3; i++)
        if (fill[i] >= 0) close(fill[i]);
    close(lfd);
}

/* ---- (e) a stopped server: timeouts, then no late reply is ever read -------- */

static void test_stopped_server_times_out_and_no_reply_is_misattributed(void)
{
    enum { CAP = 100 };
    hirate_decision d;
    hirate_counters st0, st1, sa, sb;
    hirate_limiter *lim = make((cfg){.capacity = CAP, .rate = 0.001, .timeout_ms = 100,
                                     .connect_timeout_ms = 250,
                                     .on_error = HIRATE_ON_ERROR_CLOSED});
    if (!lim) return;
    /* Two buckets far apart: A near full, B half empty. */
    check_fresh_allow(allow_s(lim, "pause-a", 1, &d), &d, CAP);
    CHECK_EQ_I64(allow_s(lim, "pause-b", 50, &d), 0);
    CHECK_EQ_I64(d.remaining, 50);
    stats(lim, &st0);

    /* Calls sent to the stopped server (the first, then the breaker's probes)
     * time out and may still run after SIGCONT; the others are answered by
     * the policy at once. The EVALSHA counter tells which were sent. */
    int sent_a = 0, sent_b = 0;
    rh_pause(&S);
    for (int i = 0; i < 4; i++) {
        const char *key = i % 2 ? "pause-b" : "pause-a";
        stats(lim, &sa);
        memset(&d, 0, sizeof d);
        double t0 = now_ms();
        int rc = allow_s(lim, key, 1, &d);
        double dt = now_ms() - t0;
        stats(lim, &sb);
        int sent = (int)(sb.evalsha - sa.evalsha);
        printf("  SIGSTOP, timeout 100 ms: %s returned %s, %s (%s), %d sent, after %.1f ms\n",
               key, hirate_err_name(rc), hirate_source_name(d.source), hirate_err_name(d.error),
               sent, dt);
        check_fail_closed(rc, &d, CAP, HIRATE_ETIMEDOUT, DEFAULT_MAX_WAIT_US);
        CHECK(sent == 0 || sent == 1);
        if (i == 0) {
            CHECK_EQ_I64(sent, 1);
            CHECK(dt >= 80);
        }
        CHECK(dt < 1000);
        if (sent == 0) CHECK(dt < 50);   /* the breaker kept it away from Redis */
        *(i % 2 ? &sent_b : &sent_a) += sent;
    }
    rh_resume(&S);
    stats(lim, &st1);
    CHECK(st1.conns_dropped > st0.conns_dropped);   /* the timed-out link is gone */

    /* Recovery: after its backoff (here at most 1.25 x 800 ms) the breaker
     * lets one probe through. Probed with peeks, which spend nothing. */
    int rc = -1;
    double r0 = now_ms();
    memset(&d, 0, sizeof d);
    for (double end = r0 + 3000; now_ms() < end; sleep_ms(10)) {
        rc = hirate_peek(lim, "pause-probe", 11, 1, &d);
        if (rc != 0 || d.source == HIRATE_SOURCE_REDIS) break;
        check_fail_closed(rc, &d, CAP, HIRATE_ETIMEDOUT, DEFAULT_MAX_WAIT_US);
    }
    printf("  resumed: Redis decides again after %.1f ms\n", now_ms() - r0);
    CHECK_EQ_I64(rc, 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(d.error, 0);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.remaining, CAP);
    sleep_ms(50);   /* let the server run what the stopped calls left queued */

    /* Alternate: each reply must carry its own key's level. A late reply to
     * an older call would show the other bucket's numbers. */
    int64_t last_a = -1, last_b = -1;
    for (int i = 0; i < 20; i++) {
        int is_b = i % 2;
        rc = allow_s(lim, is_b ? "pause-b" : "pause-a", 1, &d);
        CHECK_EQ_I64(rc, 0);
        CHECK_EQ_I64(d.allowed, 1);
        CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
        int64_t *last = is_b ? &last_b : &last_a;
        int64_t base = is_b ? 50 : CAP - 1, maybe = is_b ? sent_b : sent_a;
        if (*last < 0) {
            if (d.remaining > base - 1 || d.remaining < base - 1 - maybe)
                fprintf(stderr, "  %s: remaining %" PRId64 " not in [%" PRId64 ", %" PRId64 "]\n",
                        is_b ? "pause-b" : "pause-a", d.remaining, base - 1 - maybe, base - 1);
            CHECK(d.remaining <= base - 1 && d.remaining >= base - 1 - maybe);
        } else {
            CHECK_EQ_I64(d.remaining, *last - 1);
        }
        *last = d.remaining;
    }
    hirate_limiter_free(lim);
}

/* ---- (d) a killed server, restarted on the same port ----------------------- */

static void test_killed_server_fails_fast_and_recovers_after_restart(void)
{
    enum { CONNECT_MS = 250, TIMEOUT_MS = 100 };
    const double bound = CONNECT_MS + TIMEOUT_MS + 650;
    hirate_decision d;
    hirate_counters st0, st1, st2;
    hirate_limiter *lim = make((cfg){.capacity = 5, .rate = 0.001, .timeout_ms = TIMEOUT_MS,
                                     .connect_timeout_ms = CONNECT_MS,
                                     .on_error = HIRATE_ON_ERROR_CLOSED});
    if (!lim) return;
    check_fresh_allow(allow_s(lim, "kill-before", 1, &d), &d, 5);
    stats(lim, &st0);

    rh_kill(&S);
    int calls = 0;
    double worst = 0;
    for (int i = 0; i < 20; i++, calls++) {
        memset(&d, 0, sizeof d);
        double t0 = now_ms();
        int rc = allow_s(lim, "kill-during", 1, &d);
        double dt = now_ms() - t0;
        if (dt > worst) worst = dt;
        /* The pooled connection is found closed before the call goes out
         * on it, and new ones are refused (ECONNECT); in between the
         * breaker repeats the last failure. */
        int known = i == 0 ? d.error == HIRATE_ECONNECT
                           : d.error == HIRATE_EIO || d.error == HIRATE_ECONNECT;
        if (rc != 0 || !known)
            fprintf(stderr, "  server down: call %d returned %s, error %s\n", i,
                    hirate_err_name(rc), hirate_err_name(d.error));
        CHECK(known);
        check_fail_closed(rc, &d, 5, d.error, DEFAULT_MAX_WAIT_US);
        CHECK(dt < bound);
        sleep_ms(10);
    }
    stats(lim, &st1);
    printf("  server down: %d calls, %" PRIu64 " connection attempts, slowest %.1f ms\n",
           calls, st1.connects - st0.connects, worst);
    /* Backoff: the calls do not each knock on a dead port. */
    CHECK(st1.connects - st0.connects < (uint64_t)calls / 2);
    CHECK(st1.conns_dropped >= st0.conns_dropped + 1);

    CHECK_EQ_I64(rh_restart(&S), 0);
    int rc = -1;
    memset(&d, 0, sizeof d);
    double t0 = now_ms();
    /* The breaker's backoff after ~250 ms of failures is at most 1.25 x 400 ms;
     * until it ends the policy answers (and "kill-after" is not touched). */
    for (double end = t0 + 3000; now_ms() < end; sleep_ms(20)) {
        double c0 = now_ms();
        rc = allow_s(lim, "kill-after", 1, &d);
        CHECK(now_ms() - c0 < bound);
        if (rc != 0 || d.source == HIRATE_SOURCE_REDIS) break;
        CHECK_EQ_I64(d.source, HIRATE_SOURCE_FAIL_CLOSED);
        CHECK(d.error == HIRATE_ECONNECT || d.error == HIRATE_EIO);
    }
    printf("  restarted: working again after %.1f ms\n", now_ms() - t0);
    check_fresh_allow(rc, &d, 5);
    CHECK_EQ_I64(d.error, 0);
    stats(lim, &st2);
    CHECK_EQ_I64(st2.eval - st1.eval, 1);   /* the restarted server forgot the script */
    CHECK_EQ_I64(allow_s(lim, "kill-after", 1, &d), 0);
    CHECK_EQ_I64(d.remaining, 3);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    stats(lim, &st1);
    CHECK_EQ_I64(st1.eval, st2.eval);
    CHECK_EQ_I64(st1.evalsha, st2.evalsha + 1);
    hirate_limiter_free(lim);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);   /* timings reach the log even on a crash */
    if (rh_start(&S) != 0) {
        CHECK(!"redis-server must start (is it installed and on PATH?)");
        return check_summary("test_redis");
    }
    printf("redis-server pid %d on port %d, dir %s\n", (int)S.pid, S.port, S.dir);
    rh_watchdog(&S, "test_redis", 60);

    test_script_sha1_is_what_redis_computes();
    test_decisions_are_exact_and_every_key_has_a_ttl();
    test_peek_spends_nothing_and_creates_nothing();
    test_reset_deletes_the_key_and_the_bucket_is_full_again();
    test_keys_are_stored_byte_exactly_under_the_prefix();
    test_evalsha_first_and_one_eval_after_noscript();
    test_script_flush_costs_at_most_one_eval_per_connection();
    test_wire_sequence_is_evalsha_eval_evalsha();
    test_100_threads_on_one_key_get_exactly_the_capacity();
    test_forked_processes_share_one_budget_and_the_parent_survives();
    test_acl_user_and_db_from_the_url();
    test_unix_socket_with_a_db();
    test_requirepass_with_a_password_only_url();
    test_connect_timeout_bounds_a_server_that_never_accepts();
    test_stopped_server_times_out_and_no_reply_is_misattributed();
    test_killed_server_fails_fast_and_recovers_after_restart();

    rh_stop(&S);
    return check_summary("test_redis");
}
