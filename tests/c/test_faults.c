/*
 * The fault matrix: every way Redis can fail a limiter, and the test that
 * provokes it. For each fault the tests assert: no crash; no call longer than
 * its timeouts (each call is timed); the failure policy's decision, with the
 * source and error fields docs/semantics.md gives; Redis deciding again once
 * the fault clears; few connection attempts (hirate_counters_get connects); and,
 * for configuration errors, the error itself under every policy with the
 * password absent from every message.
 *
 * fault                                               error
 *     covered by (program: test)
 * --------------------------------------------------- -------------------------
 * server stopped (SIGSTOP): a hang                    ETIMEDOUT
 *     test_redis: test_stopped_server_times_out_and_no_reply_is_misattributed
 *     test_policy: test_each_policy_decides_each_outage_and_redis_returns (stopped),
 *                  test_breaker_open_decides_in_microseconds,
 *                  test_breaker_lets_one_probe_through_per_backoff
 * connect never completes (a full accept queue)       ECONNECT
 *     test_redis: test_connect_timeout_bounds_a_server_that_never_accepts
 * connection refused (nothing listens)                ECONNECT
 *     test_policy: test_a_batch_in_an_outage_is_decided_by_the_policy,
 *                  test_local_policy_divides_capacity_and_rate_by_instances,
 *                  test_breaker_backoff_doubles_up_to_the_maximum
 * crash (SIGKILL), then restart on the same port      ECONNECT
 *     test_redis: test_killed_server_fails_fast_and_recovers_after_restart
 *     test_policy: test_each_policy_decides_each_outage_and_redis_returns (killed)
 * idle connections closed by the server               none: a fresh connection
 *   (CONFIG SET timeout 1; CLIENT KILL)
 *     test_faults: test_idle_connections_closed_by_the_server_are_replaced_unsent
 * CLIENT PAUSE <ms> WRITE                             ETIMEDOUT
 *     test_faults: test_client_pause_write_times_out_then_recovers
 * a reply delayed past the timeout (proxy)            ETIMEDOUT
 *     test_faults: test_late_replies_are_never_read_as_another_keys
 * the replies of a batch trickled past the timeout    ETIMEDOUT
 *     test_faults_mock: test_a_trickled_batch_is_bounded_by_one_timeout
 * replies that fill the client's read buffer exactly  none
 *     test_faults_mock: test_replies_that_fill_the_read_buffer_exactly
 * NOSCRIPT: SCRIPT FLUSH mid-run, a restart           none: EVAL once
 *     test_redis: test_evalsha_first_and_one_eval_after_noscript,
 *                 test_script_flush_costs_at_most_one_eval_per_connection,
 *                 test_wire_sequence_is_evalsha_eval_evalsha,
 *                 test_killed_server_fails_fast_and_recovers_after_restart
 *     test_policy: test_noscript_in_a_batch_costs_one_eval
 * NOSCRIPT again, after EVAL                          EREPLY, returned
 *     test_faults_mock: test_noscript_after_eval_is_returned_not_looped
 * READONLY: pointed at a replica                      ESERVER
 *     test_faults: test_readonly_replica_is_a_failure
 * READONLY: the primary demoted mid-run (REPLICAOF)   ESERVER
 *     test_faults: test_readonly_after_demotion_then_promotion
 * OOM (maxmemory 1, noeviction)                       ESERVER
 *     test_policy: test_each_policy_decides_each_outage_and_redis_returns (oom)
 *     test_faults: test_oom_leaves_a_stored_bucket_as_it_was (nothing half written)
 * BUSY (a script that never ends), then SCRIPT KILL   ESERVER
 *     test_faults: test_busy_server_is_a_failure_until_script_kill
 * LOADING, MASTERDOWN, TRYAGAIN, CLUSTERDOWN,         ESERVER
 *   MISCONF, NOREPLICAS (mock server)
 *     test_faults_mock: test_malformed_replies_are_failures_that_drop_the_connection
 * WRONGPASS, NOAUTH                                   EAUTH, returned
 *     test_policy: test_configuration_errors_are_returned_under_every_policy
 *     test_redis: test_acl_user_and_db_from_the_url,
 *                 test_requirepass_with_a_password_only_url
 *     test_faults: test_auth_errors_are_returned_under_every_policy
 * NOPERM (no EVALSHA; not the limiter's keys)         ENOPERM, returned
 *     test_policy: test_configuration_errors_are_returned_under_every_policy
 *     test_redis: test_acl_user_and_db_from_the_url
 *     test_faults: test_auth_errors_are_returned_under_every_policy
 * another error reply (-ERR, -MOVED)                  EREPLY, returned
 *     test_faults_mock: test_other_error_replies_are_returned
 * malformed replies: absurd lengths ($999999999999,   EPROTO
 *   *2147483647), deep nesting (*1 x 10^5), wrong
 *   types and shapes, an unknown type byte, another
 *   key, bytes after the reply, a line too long
 *     test_faults_mock: test_malformed_replies_are_failures_that_drop_the_connection
 * a reply split across writes                         none
 *     test_faults_mock: the "split" cases of the test above
 * closed mid-reply, closed before replying            EIO
 *     test_faults_mock: the "closed" cases of the test above
 * half a reply then silence; no reply at all          ETIMEDOUT
 *     test_faults_mock: the "silence" and "no reply" cases of the test above
 *
 * An error is the decision's error field (the policy decides) unless marked
 * "returned": then it is the call's return value under every policy. "none"
 * means Redis decides as if nothing had happened. Times are CLOCK_MONOTONIC;
 * bounds that depend on the machine are loose and say why, every
 * deterministic value is compared exactly.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "proxy.h"
#include "redis_harness.h"
#include "test_faults.h"

static rh_server S;   /* the shared server; each test puts back what it changes */

/* ---- helpers ------------------------------------------------------------------------ */

static int reply_is(redisReply *r, const char *status)
{
    int ok = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, status) == 0;
    if (!ok) fprintf(stderr, "  reply: %s\n", r && r->str ? r->str : "(none)");
    if (r) freeReplyObject(r);
    return ok;
}

/* The value of `field` in INFO `section` of s, copied into out ("" if absent). */
static const char *info_str(rh_server *s, const char *section, const char *field, char *out,
                            size_t cap)
{
    redisReply *r = rh_command(s, "INFO %s", section);
    out[0] = '\0';
    size_t flen = strlen(field);
    for (const char *line = r && r->type == REDIS_REPLY_STRING ? r->str : NULL; line && *line;) {
        if (strncmp(line, field, flen) == 0 && line[flen] == ':') {
            size_t n = strcspn(line + flen + 1, "\r\n");
            snprintf(out, cap, "%.*s", (int)n, line + flen + 1);
            break;
        }
        line = strchr(line, '\n');
        if (line) line++;
    }
    if (r) freeReplyObject(r);
    return out;
}

/* Waits up to ms for `field` of INFO `section` to read `want`. */
static int wait_info(rh_server *s, const char *section, const char *field, const char *want, int ms)
{
    char v[128];
    for (int64_t t0 = mono_us(); mono_us() - t0 < ms * MS; sleep_ms(20))
        if (strcmp(info_str(s, section, field, v, sizeof v), want) == 0) return 1;
    fprintf(stderr, "  INFO %s %s is \"%s\", not \"%s\" after %d ms\n", section, field, v, want,
            ms);
    return 0;
}

/* "calls" of `cmd` in INFO commandstats: how many the server ran. */
static long long server_calls(rh_server *s, const char *cmd)
{
    char head[64], v[256];
    snprintf(head, sizeof head, "cmdstat_%s", cmd);
    info_str(s, "commandstats", head, v, sizeof v);
    return strncmp(v, "calls=", 6) == 0 ? strtoll(v + 6, NULL, 10) : 0;
}

/* The stored value of a key, as a string ("(nil)" when missing). */
static void get_raw(rh_server *s, const char *key, char *out, size_t cap)
{
    redisReply *r = rh_command(s, "GET %s", key);
    snprintf(out, cap, "%s", r && r->type == REDIS_REPLY_STRING ? r->str : "(nil)");
    if (r) freeReplyObject(r);
}

static long long int_reply(redisReply *r)
{
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -999999;
    if (r) freeReplyObject(r);
    return v;
}

static void load_script(rh_server *s)
{
    size_t len;
    const char *src = hirate_script_source(&len);
    redisReply *r = rh_command(s, "SCRIPT LOAD %b", src, len);
    CHECK(r && r->type == REDIS_REPLY_STRING && strcmp(r->str, hirate_script_sha1()) == 0);
    if (r) freeReplyObject(r);
}

/* ---- idle connections closed by the server ----------------------------------------- */

typedef struct opener {
    hirate_limiter *lim;
    pthread_barrier_t *barrier;
    char key[16];
    int rc, allowed;
} opener;

static void *opener_main(void *arg)
{
    opener *o = arg;
    pthread_barrier_wait(o->barrier);
    o->rc = hirate_reset(o->lim, o->key, strlen(o->key));
    o->allowed = o->rc == 0;
    return NULL;
}

/* Fills the pool with exactly n connections: while the server holds writes
 * (CLIENT PAUSE WRITE), n threads each wait on a connection of their own for
 * a reset (decisions would share one connection's round trips). */
static int open_connections(hirate_limiter *lim, int n)
{
    enum { MAX = 8 };
    opener o[MAX];
    pthread_t t[MAX];
    pthread_barrier_t barrier;
    int ok = 0;
    if (n > MAX) n = MAX;
    CHECK(reply_is(rh_command(&S, "CLIENT PAUSE 200 WRITE"), "OK"));
    pthread_barrier_init(&barrier, NULL, (unsigned)n);
    for (int i = 0; i < n; i++) {
        o[i] = (opener){lim, &barrier, "", 0, 0};
        snprintf(o[i].key, sizeof o[i].key, "open-%d", i);
        if (pthread_create(&t[i], NULL, opener_main, &o[i]) != 0) abort();
    }
    for (int i = 0; i < n; i++) {
        pthread_join(t[i], NULL);
        ok += o[i].allowed;
    }
    pthread_barrier_destroy(&barrier);
    return ok;
}

/*
 * A pooled connection the server closed while it sat idle (its `timeout`,
 * CLIENT KILL) never carried the call: the limiter must notice before it
 * sends, and use a fresh connection, so the call still gets Redis' decision
 * and is run exactly once. Counted on both sides: the limiter's EVALSHA
 * counter and the server's own.
 */
static void test_idle_connections_closed_by_the_server_are_replaced_unsent(void)
{
    enum { POOL = 4 };
    fcfg c = {.url = S.url, .prefix = "idle:", .on_error = HIRATE_ON_ERROR_CLOSED,
              .pool_size = POOL, .timeout_ms = 1000};
    hirate_limiter *lim = fault_limiter(c);
    if (!lim) return;
    hirate_decision d;
    int64_t dt;
    CHECK_EQ_I64(open_connections(lim, POOL), POOL);
    hirate_counters st0 = fault_stats(lim);
    CHECK_EQ_I64(st0.connects, POOL);

    /* The server closes every client idle for over a second. */
    CHECK(reply_is(rh_command(&S, "CONFIG SET timeout 1"), "OK"));
    int64_t w0 = mono_us();
    int closed = 0;
    while (!closed && mono_us() - w0 < 5 * SECOND) {
        sleep_ms(100);
        closed = rh_info_int(&S, "connected_clients") == 1;   /* the INFO asking */
    }
    CHECK(reply_is(rh_command(&S, "CONFIG SET timeout 0"), "OK"));
    printf("  idle close: the server closed our %d connections after %.1f s\n", POOL,
           (double)(mono_us() - w0) / SECOND);
    CHECK(closed);

    long long ran0 = server_calls(&S, "evalsha");
    int rc = timed_allow(lim, "k", 1, &d, &dt);
    hirate_counters st1 = fault_stats(lim);
    printf("  idle close: the next call %s, %s (%s) in %.1f ms; %" PRIu64 " connection(s) "
           "dropped, %" PRIu64 " opened\n", hirate_err_name(rc), hirate_source_name(d.source),
           hirate_err_name(d.error), (double)dt / MS, st1.conns_dropped - st0.conns_dropped,
           st1.connects - st0.connects);
    CHECK(redis_decided(rc, &d, 1, 9, "the first call after the idle close"));
    CHECK(dt <= fault_bound_us(c));
    CHECK_EQ_I64(st1.conns_dropped - st0.conns_dropped, POOL);   /* every dead one, once */
    CHECK_EQ_I64(st1.connects - st0.connects, 1);
    CHECK_EQ_I64(st1.evalsha + st1.eval - st0.evalsha - st0.eval, 1);   /* sent once... */
    CHECK_EQ_I64(server_calls(&S, "evalsha") - ran0, 1);                /* ...and run once */
    CHECK_EQ_I64(st1.breaker_opens, 0);
    CHECK_EQ_I64(st1.policy, 0);
    rc = timed_allow(lim, "k", 1, &d, &dt);
    CHECK(redis_decided(rc, &d, 1, 8, "the call after it"));
    CHECK_EQ_I64(fault_stats(lim).connects, st1.connects);   /* the fresh one is pooled */

    /* The same for a connection the server kills (CLIENT KILL skips the
     * connection that asks, not ours). */
    CHECK(int_reply(rh_command(&S, "CLIENT KILL TYPE normal")) >= 1);
    ran0 = server_calls(&S, "evalsha");
    rc = timed_allow(lim, "k", 1, &d, &dt);
    hirate_counters st2 = fault_stats(lim);
    CHECK(redis_decided(rc, &d, 1, 7, "the first call after CLIENT KILL"));
    CHECK(dt <= fault_bound_us(c));
    CHECK_EQ_I64(st2.conns_dropped - st1.conns_dropped, 1);
    CHECK_EQ_I64(st2.connects - st1.connects, 1);
    CHECK_EQ_I64(server_calls(&S, "evalsha") - ran0, 1);
    CHECK_EQ_I64(st2.policy, 0);
    hirate_limiter_free(lim);
}

/* ---- CLIENT PAUSE WRITE ------------------------------------------------------------- */

/* Script calls are writes: during CLIENT PAUSE WRITE they wait, the limiter
 * times out and its policy decides; each timed-out call may still run after
 * the pause, so afterwards the bucket is known only within those calls. */
static void client_pause_write(int policy)
{
    enum { TIMEOUT_MS = 200, PAUSE_MS = 1000, CALLS_FOR_MS = 700 };
    char prefix[32], what[64];
    snprintf(prefix, sizeof prefix, "pause-%s:", hirate_on_error_name(policy));
    snprintf(what, sizeof what, "CLIENT PAUSE WRITE");
    fcfg c = {.url = S.url, .prefix = prefix, .on_error = policy, .timeout_ms = TIMEOUT_MS};
    hirate_limiter *lim = fault_limiter(c);
    if (!lim) return;
    fexpect e = fault_expect(c);
    hirate_decision d;
    int64_t dt, worst = 0;
    CHECK(redis_decided(timed_allow(lim, "k", 1, &d, &dt), &d, 1, 9, "before the pause"));
    hirate_counters st0 = fault_stats(lim);

    int64_t t_pause = mono_us();
    CHECK(reply_is(rh_command(&S, "CLIENT PAUSE %d WRITE", PAUSE_MS), "OK"));
    /* Calls stop well before the pause ends, so none can be answered by it. */
    int calls = 0, bad = 0, sent = 0;
    while (mono_us() - t_pause < CALLS_FOR_MS * MS) {
        hirate_counters sa = fault_stats(lim);
        int rc = timed_allow(lim, "k", 1, &d, &dt);
        hirate_counters sb = fault_stats(lim);
        int now_sent = (int)(sb.evalsha + sb.eval - sa.evalsha - sa.eval);
        bad += !policy_decided(&e, rc, &d, 1, HIRATE_ETIMEDOUT, what);
        if (calls == 0) {
            CHECK_EQ_I64(now_sent, 1);
            CHECK(dt >= TIMEOUT_MS * MS * 4 / 5);   /* it waited for its timeout */
        }
        if (dt > worst) worst = dt;
        sent += now_sent;
        calls++;
        sleep_ms(5);
    }
    hirate_counters st1 = fault_stats(lim);
    printf("  CLIENT PAUSE WRITE, on_error %s: %d calls, %d sent, slowest %.1f ms, "
           "%" PRIu64 " connection attempts\n", hirate_on_error_name(policy), calls, sent,
           (double)worst / MS, st1.connects - st0.connects);
    CHECK_EQ_I64(bad, 0);
    CHECK(calls > sent);   /* the breaker answered the others at once */
    CHECK(worst <= fault_bound_us(c));
    /* Only the breaker's probes (20, 40, 80, 160 ms ... apart) reached Redis;
     * each timed out and cost its connection, so each probe after the first
     * reconnected. */
    CHECK(sent >= 2 && sent <= 8);
    CHECK_EQ_I64(st1.conns_dropped - st0.conns_dropped, sent);
    CHECK_EQ_I64(st1.connects - st0.connects, sent - 1);

    while (mono_us() - t_pause < (PAUSE_MS + 20) * MS) sleep_ms(5);
    double back = wait_for_redis(lim, "probe", 2000);
    printf("  CLIENT PAUSE WRITE, on_error %s: Redis decides again %.1f ms after the pause\n",
           hirate_on_error_name(policy), back);
    CHECK(back >= 0 && back <= (double)e.max_wait_us / MS + SLACK_MS);
    int rc = timed_allow(lim, "k", 1, &d, &dt);
    CHECK_EQ_I64(rc, 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    /* 9 before, this call, and at most the `sent` calls that timed out. */
    printf("  after the pause: remaining %" PRId64 " (the timed-out calls ran %" PRId64
           " times)\n", d.remaining, 8 - d.remaining);
    CHECK(d.remaining <= 8 && d.remaining >= 8 - sent);
    hirate_limiter_free(lim);
}

static void test_client_pause_write_times_out_then_recovers(void)
{
    ON_ERROR_EACH(p) client_pause_write(p);
}

/* ---- late replies, through a delaying proxy ----------------------------------------- */

/*
 * Keys A and B, 50 tokens apart, alternate; some replies are held by the
 * proxy past the timeout (700 ms against 250 ms), the others arrive in time
 * (20 ms). Every call reaches Redis and runs there (the proxy passes requests
 * at once), so each key's level is known exactly: a decision from Redis must
 * show its own key's level, which a late reply for the other key could not.
 * A timed-out connection must be closed, so its late reply is never read.
 */
static void late_replies(int policy)
{
    enum { CAP = 100, CALLS = 12, TIMEOUT_MS = 250, LATE_MS = 700, ON_TIME_MS = 20 };
    proxy *px = NULL;
    CHECK_EQ_I64(proxy_start(&px, S.port), 0);
    if (!px) return;
    char prefix[32], what[96];
    snprintf(prefix, sizeof prefix, "late-%s:", hirate_on_error_name(policy));
    fcfg c = {.url = proxy_url(px), .prefix = prefix, .on_error = policy, .capacity = CAP,
              .timeout_ms = TIMEOUT_MS, .backoff_min_ms = 20, .backoff_max_ms = 20};
    hirate_limiter *lim = fault_limiter(c);
    if (!lim) {
        proxy_stop(px);
        return;
    }
    static const char *const keys[2] = {"A", "B"};
    fexpect e[2] = {fault_expect(c), fault_expect(c)};
    int64_t spent[2] = {1, 51};
    hirate_decision d;
    int64_t dt, worst = 0;
    CHECK(redis_decided(timed_allow(lim, "A", 1, &d, &dt), &d, 1, CAP - 1, "A before"));
    CHECK(redis_decided(timed_allow(lim, "B", 51, &d, &dt), &d, 1, CAP - 51, "B before"));
    hirate_counters st0 = fault_stats(lim);
    proxy_stats p0;
    proxy_get_stats(px, &p0);

    int timeouts = 0;
    for (int i = 0; i < CALLS; i++) {
        int k = i % 2, late = i % 3 == 0;   /* A late, B, A, B late, ... */
        proxy_set(px, PROXY_DELAY, late ? LATE_MS : ON_TIME_MS);
        sleep_ms(30);   /* past the breaker's 20 ms (+25%): every call goes to Redis */
        hirate_counters sa = fault_stats(lim);
        int rc = timed_allow(lim, keys[k], 1, &d, &dt);
        hirate_counters sb = fault_stats(lim);
        CHECK_EQ_I64(sb.evalsha - sa.evalsha, 1);
        spent[k]++;   /* it ran, whatever became of its reply */
        snprintf(what, sizeof what, "call %d (%s, reply %s)", i, keys[k],
                 late ? "late" : "on time");
        if (late) {
            CHECK(policy_decided(&e[k], rc, &d, 1, HIRATE_ETIMEDOUT, what));
            CHECK(dt >= TIMEOUT_MS * MS * 4 / 5);
            timeouts++;
        } else {
            CHECK(redis_decided(rc, &d, 1, CAP - spent[k], what));
        }
        if (dt > worst) worst = dt;
    }
    proxy_set(px, PROXY_PASS, 0);
    sleep_ms(LATE_MS + 50);   /* every late reply is due by now */
    hirate_counters st1 = fault_stats(lim);
    proxy_stats p1;
    proxy_get_stats(px, &p1);
    printf("  late replies, on_error %s: %d of %d calls timed out, slowest %.1f ms, "
           "%" PRIu64 " late bytes never delivered, %" PRIu64 " connections\n",
           hirate_on_error_name(policy), timeouts, CALLS, (double)worst / MS,
           p1.undelivered - p0.undelivered, st1.connects - st0.connects);
    CHECK_EQ_I64(timeouts, 4);
    CHECK(worst <= fault_bound_us(c));
    /* Each timeout closed its connection, with the late reply still in the
     * proxy; the next call reconnected. No other connection was made. */
    CHECK_EQ_I64(st1.conns_dropped - st0.conns_dropped, timeouts);
    CHECK_EQ_I64(st1.connects - st0.connects, timeouts);
    CHECK_EQ_I64(p1.client_closes - p0.client_closes, timeouts);
    CHECK(p1.undelivered - p0.undelivered > 0);
    /* And afterwards each key is still its own. */
    for (int k = 0; k < 2; k++) {
        spent[k]++;
        CHECK(redis_decided(timed_allow(lim, keys[k], 1, &d, &dt), &d, 1, CAP - spent[k],
                            "after the late replies"));
    }
    hirate_limiter_free(lim);
    proxy_stop(px);
}

static void test_late_replies_are_never_read_as_another_keys(void)
{
    ON_ERROR_EACH(p) late_replies(p);
}

/* ---- READONLY ------------------------------------------------------------------------- */

static rh_server P, R;   /* a primary and its replica */
static char r_extra[128];

static int start_pair(void)
{
    memset(&P, 0, sizeof P);
    memset(&R, 0, sizeof R);
    /* Diskless sync without its default 5 s wait for more replicas. */
    P.extra = "--repl-diskless-sync-delay 0";
    if (rh_start(&P) != 0) return -1;
    snprintf(r_extra, sizeof r_extra, "--repl-diskless-sync-delay 0 --replicaof 127.0.0.1 %d",
             P.port);
    R.extra = r_extra;
    if (rh_start(&R) != 0) return -1;
    return wait_info(&R, "replication", "master_link_status", "up", 10000) ? 0 : -1;
}

/* A write script on a replica fails with READONLY: a failure, so the policy
 * decides, and the connection is dropped (the server is the wrong one to
 * talk to now). A peek writes nothing, so a replica can answer it. */
static void test_readonly_replica_is_a_failure(void)
{
    ON_ERROR_EACH(p) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "ro-%s:", hirate_on_error_name(p));
        fcfg c = {.url = R.url, .prefix = prefix, .on_error = p};
        hirate_limiter *lim = fault_limiter(c);
        if (!lim) continue;
        fexpect e = fault_expect(c);
        hirate_decision d;
        int64_t dt, worst = 0;
        CHECK_EQ_I64(hirate_peek(lim, "k", 1, 1, &d), 0);
        CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
        CHECK_EQ_I64(d.remaining, 10);
        hirate_counters st0 = fault_stats(lim);
        int rc = timed_allow(lim, "k", 1, &d, &dt);
        CHECK(policy_decided(&e, rc, &d, 1, HIRATE_ESERVER, "allow on a replica"));
        CHECK(strncmp(fault_errmsg(lim), "Redis replied: READONLY", 23) == 0);
        CHECK(dt <= fault_bound_us(c));
        hirate_counters st1 = fault_stats(lim);
        CHECK_EQ_I64(st1.conns_dropped - st0.conns_dropped, 1);
        CHECK_EQ_I64(st1.breaker_opens, 1);
        /* 300 ms of calls: the breaker's probes only, each on a new connection. */
        int bad = 0, n = 0;
        for (int64_t t0 = mono_us(); mono_us() - t0 < 300 * MS; n++, sleep_ms(2)) {
            rc = timed_allow(lim, "k", 1, &d, &dt);
            bad += !policy_decided(&e, rc, &d, 1, HIRATE_ESERVER, "allow on a replica, later");
            if (dt > worst) worst = dt;
        }
        hirate_counters st2 = fault_stats(lim);
        printf("  replica, on_error %s: %d calls in 300 ms, %" PRIu64 " sent, %" PRIu64
               " connections, slowest %.1f ms\n", hirate_on_error_name(p), n,
               st2.evalsha + st2.eval - st1.evalsha - st1.eval, st2.connects - st1.connects,
               (double)worst / MS);
        CHECK_EQ_I64(bad, 0);
        CHECK(worst <= fault_bound_us(c));
        CHECK(st2.connects - st1.connects <= 6);
        CHECK_EQ_I64(st2.connects - st1.connects, st2.evalsha + st2.eval - st1.evalsha - st1.eval);
        CHECK_EQ_I64(int_reply(rh_command(&R, "EXISTS %sk", prefix)), 0);
        hirate_limiter_free(lim);
    }
}

/* The primary becomes a replica mid-run (REPLICAOF), then a primary again:
 * READONLY in between, for each policy, and afterwards Redis decides again
 * from the very bucket it had, which the failed calls did not touch. */
static void test_readonly_after_demotion_then_promotion(void)
{
    hirate_limiter *lims[3] = {NULL, NULL, NULL};
    fexpect e[3];
    fcfg cs[3];
    char prefix[3][32], key[64], on_p[64], on_r[64];
    hirate_decision d;
    int64_t dt;
    ON_ERROR_EACH(p) {
        snprintf(prefix[p], sizeof prefix[p], "demote-%s:", hirate_on_error_name(p));
        cs[p] = (fcfg){.url = P.url, .prefix = prefix[p], .on_error = p};
        lims[p] = fault_limiter(cs[p]);
        e[p] = fault_expect(cs[p]);
        if (!lims[p]) return;
        CHECK(redis_decided(timed_allow(lims[p], "k", 2, &d, &dt), &d, 1, 8, "before demotion"));
    }
    /* The replica has every bucket before it takes over. */
    ON_ERROR_EACH(p) {
        snprintf(key, sizeof key, "%.31sk", prefix[p]);
        int same = 0;
        for (int64_t t0 = mono_us(); !same && mono_us() - t0 < 5 * SECOND; sleep_ms(10)) {
            get_raw(&P, key, on_p, sizeof on_p);
            get_raw(&R, key, on_r, sizeof on_r);
            same = strcmp(on_p, on_r) == 0;
        }
        CHECK(same);
    }
    CHECK(reply_is(rh_command(&R, "REPLICAOF NO ONE"), "OK"));
    CHECK(reply_is(rh_command(&P, "REPLICAOF 127.0.0.1 %d", R.port), "OK"));
    CHECK(wait_info(&P, "replication", "master_link_status", "up", 10000));
    ON_ERROR_EACH(p) {
        hirate_counters st0 = fault_stats(lims[p]);
        int rc = timed_allow(lims[p], "k", 1, &d, &dt);
        CHECK(policy_decided(&e[p], rc, &d, 1, HIRATE_ESERVER, "allow on a demoted primary"));
        CHECK(strncmp(fault_errmsg(lims[p]), "Redis replied: READONLY", 23) == 0);
        CHECK(dt <= fault_bound_us(cs[p]));
        CHECK_EQ_I64(fault_stats(lims[p]).conns_dropped - st0.conns_dropped, 1);
    }
    CHECK(reply_is(rh_command(&P, "REPLICAOF NO ONE"), "OK"));
    ON_ERROR_EACH(p) {
        double back = wait_for_redis(lims[p], "probe", 2000);
        printf("  demoted and promoted again, on_error %s: Redis decides again after %.1f ms\n",
               hirate_on_error_name(p), back);
        CHECK(back >= 0 && back <= (double)e[p].max_wait_us / MS + SLACK_MS);
        CHECK(redis_decided(timed_allow(lims[p], "k", 1, &d, &dt), &d, 1, 7, "after promotion"));
        hirate_limiter_free(lims[p]);
    }
}

/* ---- OOM ------------------------------------------------------------------------------ */

/* Under maxmemory with noeviction the script's one write (SET ... PX) is
 * refused: the policy decides, and the stored bucket is exactly as it was,
 * TTL and all; a refusal writes nothing and so is still Redis' to give. OOM
 * keeps the connection. */
static void test_oom_leaves_a_stored_bucket_as_it_was(void)
{
    fcfg c = {.url = S.url, .prefix = "oom:", .on_error = HIRATE_ON_ERROR_CLOSED};
    hirate_limiter *lim = fault_limiter(c);
    if (!lim) return;
    fexpect e = fault_expect(c);
    hirate_decision d;
    int64_t dt;
    char before[64], after[64];
    CHECK(redis_decided(timed_allow(lim, "k", 3, &d, &dt), &d, 1, 7, "before OOM"));
    CHECK(redis_decided(timed_allow(lim, "dry", 10, &d, &dt), &d, 1, 0, "before OOM"));
    get_raw(&S, "oom:k", before, sizeof before);
    CHECK(reply_is(rh_command(&S, "CONFIG SET maxmemory-policy noeviction"), "OK"));
    CHECK(reply_is(rh_command(&S, "CONFIG SET maxmemory 1"), "OK"));
    hirate_counters st0 = fault_stats(lim);

    int rc = timed_allow(lim, "k", 1, &d, &dt);
    CHECK(policy_decided(&e, rc, &d, 1, HIRATE_ESERVER, "OOM, a stored bucket"));
    CHECK(strncmp(fault_errmsg(lim), "Redis replied: OOM", 18) == 0);
    CHECK(dt <= fault_bound_us(c));
    get_raw(&S, "oom:k", after, sizeof after);
    CHECK_EQ_STR(after, before);
    CHECK(int_reply(rh_command(&S, "PTTL oom:k")) > 0);
    sleep_ms(40);   /* past the breaker */
    rc = timed_allow(lim, "new", 1, &d, &dt);
    CHECK(policy_decided(&e, rc, &d, 1, HIRATE_ESERVER, "OOM, a new bucket"));
    CHECK_EQ_I64(int_reply(rh_command(&S, "EXISTS oom:new")), 0);
    sleep_ms(100);   /* past the breaker, doubled */
    /* A refusal needs no write: Redis gives it even now. */
    CHECK(redis_decided(timed_allow(lim, "dry", 1, &d, &dt), &d, 0, 0, "a refusal under OOM"));
    hirate_counters st1 = fault_stats(lim);
    CHECK_EQ_I64(st1.conns_dropped, st0.conns_dropped);
    CHECK_EQ_I64(st1.connects, 1);

    CHECK(reply_is(rh_command(&S, "CONFIG SET maxmemory 0"), "OK"));
    CHECK(wait_for_redis(lim, "probe", 2000) >= 0);
    CHECK(redis_decided(timed_allow(lim, "k", 1, &d, &dt), &d, 1, 6, "after OOM"));
    CHECK_EQ_I64(fault_stats(lim).connects, 1);
    hirate_limiter_free(lim);
}

/* ---- BUSY ------------------------------------------------------------------------------ */

/* Another client runs a script that never ends; past busy-reply-threshold
 * the server answers everything else with BUSY. That is an answer, at once:
 * the policy decides without waiting for a timeout, and the connection is
 * kept. SCRIPT KILL ends it, and Redis decides again. */
static void test_busy_server_is_a_failure_until_script_kill(void)
{
    hirate_limiter *lims[3] = {NULL, NULL, NULL};
    fexpect e[3];
    fcfg cs[3];
    char prefix[3][32];
    hirate_decision d;
    int64_t dt;
    ON_ERROR_EACH(p) {
        snprintf(prefix[p], sizeof prefix[p], "busy-%s:", hirate_on_error_name(p));
        cs[p] = (fcfg){.url = S.url, .prefix = prefix[p], .on_error = p};
        lims[p] = fault_limiter(cs[p]);
        e[p] = fault_expect(cs[p]);
        if (!lims[p]) return;
        CHECK(redis_decided(timed_allow(lims[p], "k", 1, &d, &dt), &d, 1, 9, "before BUSY"));
    }
    /* busy-reply-threshold is Redis 7's name; lua-time-limit the older one. */
    redisReply *r = rh_command(&S, "CONFIG SET busy-reply-threshold 100");
    int new_name = r && r->type == REDIS_REPLY_STATUS;
    if (r) freeReplyObject(r);
    if (!new_name) CHECK(reply_is(rh_command(&S, "CONFIG SET lua-time-limit 100"), "OK"));

    struct timeval tv = {5, 0};
    redisContext *busy = redisConnectWithTimeout("127.0.0.1", S.port, tv);
    CHECK(busy && !busy->err);
    if (!busy || busy->err) {
        if (busy) redisFree(busy);
        return;
    }
    redisSetTimeout(busy, tv);
    redisAppendCommand(busy, "EVAL %s 0", "while true do end");
    for (int done = 0; !done;)
        if (redisBufferWrite(busy, &done) != REDIS_OK) break;
    sleep_ms(300);   /* past the threshold: BUSY from now on */

    ON_ERROR_EACH(p) {
        hirate_counters st0 = fault_stats(lims[p]);
        int bad = 0;
        int64_t worst = 0;
        for (int i = 0; i < 3; i++, sleep_ms(40)) {   /* the first call, then probes */
            int rc = timed_allow(lims[p], "k", 1, &d, &dt);
            bad += !policy_decided(&e[p], rc, &d, 1, HIRATE_ESERVER, "BUSY");
            if (dt > worst) worst = dt;
        }
        hirate_counters st1 = fault_stats(lims[p]);
        printf("  BUSY, on_error %s: %" PRIu64 " calls sent, slowest %.1f ms, \"%.40s...\"\n",
               hirate_on_error_name(p), st1.evalsha - st0.evalsha, (double)worst / MS,
               fault_errmsg(lims[p]));
        CHECK_EQ_I64(bad, 0);
        CHECK(strncmp(fault_errmsg(lims[p]), "Redis replied: BUSY", 19) == 0);
        CHECK(st1.evalsha - st0.evalsha >= 1);
        /* An answer, not a silence: no timeout (1 s) was waited for. */
        CHECK(worst < 500 * MS);
        CHECK_EQ_I64(st1.conns_dropped, st0.conns_dropped);
    }
    CHECK(reply_is(rh_command(&S, "SCRIPT KILL"), "OK"));
    redisReply *killed = NULL;
    CHECK(redisGetReply(busy, (void **)&killed) == REDIS_OK && killed &&
          killed->type == REDIS_REPLY_ERROR);
    if (killed) freeReplyObject(killed);
    redisFree(busy);
    CHECK(reply_is(rh_command(&S, new_name ? "CONFIG SET busy-reply-threshold 5000"
                                           : "CONFIG SET lua-time-limit 5000"), "OK"));
    ON_ERROR_EACH(p) {
        double back = wait_for_redis(lims[p], "probe", 2000);
        CHECK(back >= 0 && back <= (double)e[p].max_wait_us / MS + SLACK_MS);
        CHECK(redis_decided(timed_allow(lims[p], "k", 1, &d, &dt), &d, 1, 8, "after SCRIPT KILL"));
        CHECK_EQ_I64(fault_stats(lims[p]).connects, 1);   /* BUSY kept the connection */
        hirate_limiter_free(lims[p]);
    }
}

/* ---- configuration errors ------------------------------------------------------------- */

/* One command on a connection that authenticates first. */
static redisReply *auth_command(rh_server *s, const char *pass, const char *fmt, const char *arg)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", s->port, tv);
    redisReply *r = NULL;
    if (c && !c->err) {
        redisReply *a = redisCommand(c, "AUTH %s", pass);
        if (a) freeReplyObject(a);
        r = redisCommand(c, fmt, arg);
    }
    if (c) redisFree(c);
    return r;
}

/*
 * A server with requirepass, and an ACL user who may not run scripts: each
 * configuration error is the return value of every call under every policy,
 * never a policy decision and never a trip of the breaker; the message after
 * every call names the problem without the password; and a wrong password
 * does not make a storm of connections.
 */
static void test_auth_errors_are_returned_under_every_policy(void)
{
    rh_server t;
    memset(&t, 0, sizeof t);
    t.extra = "--requirepass " CANARY;
    CHECK_EQ_I64(rh_start(&t), 0);
    if (!t.pid) return;
    CHECK(reply_is(auth_command(&t, CANARY,
                                "ACL SETUSER fa-noeval on >%s ~* &* +@all -evalsha -eval", CANARY),
                   "OK"));
    static const struct { const char *rule, *userinfo; int rc; } cases[] = {
        {"a wrong password is EAUTH", ":wrong-" CANARY "@", HIRATE_EAUTH},
        {"an unknown user is EAUTH", "nobody:" CANARY "@", HIRATE_EAUTH},
        {"no password at all is EAUTH (NOAUTH)", "", HIRATE_EAUTH},
        {"a user who may not run scripts is ENOPERM", "fa-noeval:" CANARY "@", HIRATE_ENOPERM},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ON_ERROR_EACH(p) {
            char url[256];
            snprintf(url, sizeof url, "redis://%s127.0.0.1:%d", cases[i].userinfo, t.port);
            fcfg c = {.url = url, .on_error = p};
            hirate_limiter *lim = fault_limiter(c);
            if (!lim) continue;
            int bad = 0, leaks = 0;
            int64_t dt, worst = 0;
            hirate_decision d;
            for (int k = 0; k < 6; k++) {
                int rc = timed_allow(lim, "k", 1, &d, &dt);
                bad += rc != cases[i].rc;
                leaks += !errmsg_is_clean(lim);
                if (dt > worst) worst = dt;
            }
            hirate_item items[2] = {{"a", 1, 1, 0, {0}}, {"b", 1, 0, 0, {0}}};
            CHECK_EQ_I64(hirate_allow_many(lim, items, 2), 0);
            bad += (items[0].rc != cases[i].rc) + (items[1].rc != cases[i].rc);
            leaks += !errmsg_is_clean(lim);
            /* DEL is not a script: only the AUTH errors stop it. */
            CHECK_EQ_I64(hirate_reset(lim, "k", 1), cases[i].rc == HIRATE_EAUTH ? cases[i].rc : 0);
            leaks += !errmsg_is_clean(lim);
            hirate_counters st = fault_stats(lim);
            if (bad)
                fprintf(stderr, "  %s, on_error %s: %d calls gave another code (%s)\n",
                        cases[i].rule, hirate_on_error_name(p), bad, fault_errmsg(lim));
            CHECK_EQ_I64(bad, 0);
            CHECK_EQ_I64(leaks, 0);
            CHECK(worst <= fault_bound_us(c));
            CHECK_EQ_I64(st.policy, 0);
            CHECK_EQ_I64(st.breaker_opens, 0);
            /* A refused AUTH waits out a reconnect backoff (10 ms, doubling);
             * a refused script keeps its connection. */
            if (cases[i].rc == HIRATE_EAUTH) CHECK(st.connects >= 1 && st.connects <= 3);
            else CHECK_EQ_I64(st.connects, 1);
            hirate_limiter_free(lim);
        }
    }
    /* A URL refused before any connection: its message has no password either. */
    static const char *const bad_urls[] = {
        "redis://u:" CANARY "@127.0.0.1:99999", "redis://u:" CANARY "@127.0.0.1/notadb",
        "rediss://u:" CANARY "@127.0.0.1:99999",
    };
    for (size_t i = 0; i < sizeof bad_urls / sizeof bad_urls[0]; i++) {
        hirate_options o;
        hirate_limiter *lim = NULL;
        char why[HIRATE_ERRMSG_SIZE] = "";
        hirate_options_init(&o);
        o.url = bad_urls[i];
        o.capacity = 1;
        o.rate = 1;
        CHECK_EQ_I64(hirate_limiter_new(&lim, &o, why, sizeof why), HIRATE_EURL);
        CHECK(why[0] != '\0' && strstr(why, "s3cr3t") == NULL && strstr(why, "canary") == NULL);
        if (strstr(why, "s3cr3t")) fprintf(stderr, "  the password leaked: \"%s\"\n", why);
    }
    rh_stop(&t);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);   /* timings reach the log even on a crash */
    if (rh_start(&S) != 0) {
        CHECK(!"redis-server must start (is it installed and on PATH?)");
        return check_summary("test_faults");
    }
    printf("redis-server pid %d on port %d, dir %s\n", (int)S.pid, S.port, S.dir);
    /* The other servers are our children too: they die with the program. */
    rh_watchdog(&S, "test_faults", 150);
    load_script(&S);

    test_idle_connections_closed_by_the_server_are_replaced_unsent();
    test_client_pause_write_times_out_then_recovers();
    test_late_replies_are_never_read_as_another_keys();
    test_oom_leaves_a_stored_bucket_as_it_was();
    test_busy_server_is_a_failure_until_script_kill();
    test_auth_errors_are_returned_under_every_policy();
    if (start_pair() == 0) {
        test_readonly_replica_is_a_failure();
        test_readonly_after_demotion_then_promotion();
    } else {
        CHECK(!"a primary and a replica must start");
    }
    rh_stop(&R);
    rh_stop(&P);
    rh_stop(&S);
    return check_summary("test_faults");
}
