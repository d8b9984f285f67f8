/*
 * The rules of a Sentinel service and of Redis Functions, through the
 * public no-I/O API, without a server: which node each round's legs go to,
 * the exact bytes they carry, and what each reply (or failure) leads to.
 * Replies are written by hand, as a sentinel, a master or a replica would
 * send them; test_sentinel.c checks the same against real servers.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "hirate_io.h"

#define SENTINELS "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381/mymaster"

static char logged[8][HIRATE_ERRMSG_SIZE * 2];
static int nlogged, loglevel[8];

static void keep_log(void *arg, int level, const char *msg)
{
    (void)arg;
    if (nlogged < 8) {
        loglevel[nlogged] = level;
        snprintf(logged[nlogged++], sizeof logged[0], "%s", msg);
    }
}

static hirate_limiter *make(const char *url, int functions)
{
    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.capacity = 5;
    o.rate = 0.001;
    o.functions = functions;
    o.deny_cache = 0;
    o.on_error = HIRATE_ON_ERROR_CLOSED;
    o.log = keep_log;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, why, sizeof why), 0);
    nlogged = 0;
    return lim;
}

/* The script's reply to a spend of 1 on "rl:<key>" from a full bucket. */
static size_t bucket_reply(char *buf, size_t cap, const char *key)
{
    return (size_t)snprintf(buf, cap,
                            "*8\r\n:1\r\n:4\r\n:0\r\n:1000000\r\n$1\r\n4\r\n:7\r\n:7\r\n"
                            "$%zu\r\nrl:%s\r\n",
                            strlen(key) + 3, key);
}

/* Leg i's request begins with want. */
static int leg_starts(hirate_op *op, size_t i, const char *want)
{
    size_t len;
    const char *req = hirate_op_leg_request(op, i, &len);
    return req && len >= strlen(want) && memcmp(req, want, strlen(want)) == 0;
}

static void feed(hirate_op *op, size_t leg, const char *bytes, size_t len)
{
    size_t used;
    CHECK_EQ_I64(hirate_op_leg_feed(op, leg, bytes, len, &used), HIRATE_IO_DONE);
    CHECK_EQ_I64(used, len);
}

static void feed_str(hirate_op *op, size_t leg, const char *bytes)
{
    feed(op, leg, bytes, strlen(bytes));
}

static const char ask_master[] =
    "*3\r\n$8\r\nSENTINEL\r\n$23\r\nGET-MASTER-ADDR-BY-NAME\r\n$8\r\nmymaster\r\n";
static const char at_7000[] = "*2\r\n$9\r\n127.0.0.1\r\n$4\r\n7000\r\n";
static const char at_7001[] = "*2\r\n$9\r\n127.0.0.1\r\n$4\r\n7001\r\n";

/* The first call asks a sentinel, waits a round, then goes to the master
 * the sentinel named (a new node, after the three sentinels) by FCALL. */
static void the_first_call_asks_then_goes_to_the_master(void)
{
    hirate_limiter *lim = make(SENTINELS, 1);
    CHECK_EQ_I64(hirate_is_sentinel(lim), 1);
    CHECK_EQ_I64(hirate_is_cluster(lim), 0);
    hirate_item it = {"alice", 5, 1, 0, {0}};
    hirate_op *op;
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    CHECK_EQ_I64(hirate_op_legs(op), 1);
    CHECK_EQ_I64(hirate_op_leg_node(op, 0), 0);
    size_t len;
    const char *req = hirate_op_leg_request(op, 0, &len);
    CHECK(len == sizeof ask_master - 1 && memcmp(req, ask_master, len) == 0);
    feed_str(op, 0, at_7000);
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_SEND);
    CHECK_EQ_I64(hirate_op_legs(op), 1);
    CHECK_EQ_I64(hirate_op_leg_node(op, 0), 3);
    CHECK(leg_starts(op, 0, "*8\r\n$5\r\nFCALL\r\n$23\r\nhirate_"));
    hirate_endpoint ep;
    CHECK_EQ_I64(hirate_node_endpoint(lim, 3, &ep), 0);
    CHECK_EQ_STR(ep.where, "127.0.0.1:7000");
    char buf[256];
    feed(op, 0, buf, bucket_reply(buf, sizeof buf, "alice"));
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_DONE);
    hirate_op_free(op);
    CHECK_EQ_I64(it.rc, 0);
    CHECK_EQ_I64(it.decision.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(it.decision.remaining, 4);
    CHECK_EQ_I64(nlogged, 1);
    CHECK_EQ_I64(loglevel[0], HIRATE_LOG_INFO);
    CHECK_EQ_STR(logged[0], "sentinel: the master of 'mymaster' is 127.0.0.1:7000");

    /* The next call, within the poll interval, goes straight there. */
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    CHECK_EQ_I64(hirate_op_legs(op), 1);
    CHECK_EQ_I64(hirate_op_leg_node(op, 0), 3);
    feed(op, 0, buf, bucket_reply(buf, sizeof buf, "alice"));
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_DONE);
    hirate_op_free(op);

    /* After the poll interval, one call carries the question beside it. */
    usleep((HIRATE_SENTINEL_POLL_MS + 50) * 1000);
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    CHECK_EQ_I64(hirate_op_legs(op), 2);
    CHECK_EQ_I64(hirate_op_leg_node(op, 0), 3);
    CHECK_EQ_I64(hirate_op_leg_node(op, 1), 0);
    CHECK(leg_starts(op, 1, ask_master));
    feed(op, 0, buf, bucket_reply(buf, sizeof buf, "alice"));
    feed_str(op, 1, at_7000);
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_DONE);
    hirate_op_free(op);
    CHECK_EQ_I64(nlogged, 1);   /* the same master: nothing to say */

    hirate_counters c;
    hirate_counters_get(lim, &c);
    CHECK_EQ_I64(c.sentinel_queries, 2);
    CHECK_EQ_I64(c.master_changes, 1);
    CHECK_EQ_I64(c.nodes, 4);
    CHECK_EQ_I64(c.fcall, 3);
    CHECK_EQ_I64(c.evalsha, 0);

    /* An op dropped while its question was unanswered (a cancelled task)
     * does not keep the next ones from asking. */
    usleep((HIRATE_SENTINEL_POLL_MS + 50) * 1000);
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    CHECK_EQ_I64(hirate_op_legs(op), 2);
    hirate_op_free(op);
    usleep((HIRATE_SENTINEL_POLL_MS + 50) * 1000);
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    CHECK_EQ_I64(hirate_op_legs(op), 2);
    hirate_op_free(op);
    hirate_limiter_free(lim);
}

/* READONLY from a demoted master: the call did not run, so it goes again
 * to the master the sentinels name now, within the same op. */
static void readonly_follows_the_failover(void)
{
    hirate_limiter *lim = make(SENTINELS, 1);
    hirate_item it = {"bob", 3, 1, 0, {0}};
    hirate_op *op;
    char buf[256];
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    feed_str(op, 0, at_7000);
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_SEND);
    feed_str(op, 0, "-READONLY You can't write against a read only replica.\r\n");
    CHECK_EQ_I64(hirate_op_leg_drop(op, 0), 1);
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_SEND);
    CHECK_EQ_I64(hirate_op_legs(op), 1);
    CHECK_EQ_I64(hirate_op_leg_node(op, 0), 0);   /* asked again */
    feed_str(op, 0, at_7001);
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_SEND);
    CHECK_EQ_I64(hirate_op_leg_node(op, 0), 4);
    feed(op, 0, buf, bucket_reply(buf, sizeof buf, "bob"));
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_DONE);
    hirate_op_free(op);
    CHECK_EQ_I64(it.rc, 0);
    CHECK_EQ_I64(it.decision.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(nlogged, 2);
    CHECK_EQ_STR(logged[1], "sentinel: the master of 'mymaster' moved from 127.0.0.1:7000 to "
                            "127.0.0.1:7001");
    hirate_counters c;
    hirate_counters_get(lim, &c);
    CHECK_EQ_I64(c.master_changes, 2);
    CHECK_EQ_I64(c.sentinel_queries, 2);
    hirate_limiter_free(lim);
}

/* A sentinel that cannot be reached is skipped for the next one; one that
 * knows no such master is a misconfiguration, returned as such. */
static void sentinels_are_asked_in_turn(void)
{
    hirate_limiter *lim = make(SENTINELS, 1);
    hirate_item it = {"carol", 5, 1, 0, {0}};
    hirate_op *op;
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    CHECK_EQ_I64(hirate_op_leg_node(op, 0), 0);
    hirate_op_leg_fail(op, 0, HIRATE_ECONNECT, "connect to 127.0.0.1:26379: Connection refused");
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_SEND);
    CHECK_EQ_I64(hirate_op_legs(op), 1);
    CHECK_EQ_I64(hirate_op_leg_node(op, 0), 1);
    feed_str(op, 0, "*-1\r\n");
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_DONE);
    CHECK_EQ_I64(it.rc, HIRATE_EREPLY);
    CHECK_EQ_STR(hirate_op_errmsg(op, 0), "sentinel 127.0.0.1:26380 knows no master named "
                                          "'mymaster'");
    hirate_op_free(op);

    /* Every sentinel down: the policy decides, after a bounded wait. */
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    int rounds = 1;
    while (hirate_op_legs(op) == 1 && hirate_op_leg_node(op, 0) < 3) {
        hirate_op_leg_fail(op, 0, HIRATE_ECONNECT, "Connection refused");
        if (hirate_op_next(op) != HIRATE_IO_SEND)
            break;
        rounds++;
    }
    CHECK_EQ_I64(rounds, 5);   /* HIRATE_CLUSTER_REDIRECTS_MAX: a round for each */
    CHECK_EQ_I64(it.rc, 0);
    CHECK_EQ_I64(it.decision.source, HIRATE_SOURCE_FAIL_CLOSED);
    CHECK_EQ_I64(it.decision.error, HIRATE_ECONNECT);
    hirate_op_free(op);
    hirate_limiter_free(lim);
}

/* A connection to the master whose ROLE says replica is an outage, and the
 * next call asks the sentinels first. */
static void a_replica_is_never_the_master(void)
{
    hirate_limiter *lim = make(SENTINELS, 1);
    hirate_item it = {"dave", 4, 1, 0, {0}};
    hirate_op *op;
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    feed_str(op, 0, at_7000);
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_SEND);
    int node = hirate_op_leg_node(op, 0);
    hirate_handshake *hs;
    char err[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_node_handshake_start(lim, node, &hs, err, sizeof err), 0);
    size_t len;
    const char *req = hirate_handshake_request(hs, &len);
    CHECK(len == 14 && memcmp(req, "*1\r\n$4\r\nROLE\r\n", 14) == 0);
    static const char replica[] = "*5\r\n$5\r\nslave\r\n$9\r\n127.0.0.1\r\n:7001\r\n"
                                  "$9\r\nconnected\r\n:42\r\n";
    size_t used;
    CHECK_EQ_I64(hirate_handshake_feed(hs, replica, sizeof replica - 1, &used), HIRATE_IO_DONE);
    CHECK_EQ_I64(hirate_handshake_result(hs, err, sizeof err), HIRATE_ESERVER);
    CHECK_EQ_STR(err, "127.0.0.1:7000 is not the master of 'mymaster' (ROLE: slave)");
    hirate_handshake_free(hs);
    hirate_op_leg_fail(op, 0, HIRATE_ESERVER, err);
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_DONE);
    CHECK_EQ_I64(it.decision.source, HIRATE_SOURCE_FAIL_CLOSED);
    CHECK_EQ_I64(it.decision.error, HIRATE_ESERVER);
    hirate_op_free(op);
    /* The master was forgotten: the next call asks first. */
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    CHECK_EQ_I64(hirate_op_legs(op), 1);
    CHECK(hirate_op_leg_node(op, 0) < 3);
    hirate_op_free(op);

    /* A sentinel's handshake: the sentinels' AUTH, no SELECT, PING. */
    hirate_limiter_free(lim);
    hirate_options o;
    hirate_options_init(&o);
    o.url = "redis+sentinel://u:master-pw@127.0.0.1:26379/mymaster/2";
    o.capacity = 1;
    o.rate = 1;
    o.sentinel_password = "sentinel-pw";
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, err, sizeof err), 0);
    CHECK_EQ_I64(hirate_handshake_start(lim, &hs, err, sizeof err), 0);
    req = hirate_handshake_request(hs, &len);
    static const char sentinel_hs[] = "*2\r\n$4\r\nAUTH\r\n$11\r\nsentinel-pw\r\n*1\r\n$4\r\nPING\r\n";
    CHECK(len == sizeof sentinel_hs - 1 && memcmp(req, sentinel_hs, len) == 0);
    hirate_handshake_free(hs);
    hirate_limiter_free(lim);
    o.url = "redis://127.0.0.1:6379";
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, err, sizeof err), HIRATE_EOPTION);
    CHECK_EQ_STR(err, "sentinel_password is set, but the URL is not redis+sentinel:// (or "
                      "rediss+sentinel://)");
}

/* Functions on a single Redis: "Function not found" brings FUNCTION LOAD
 * and the call again; a refused FCALL brings EVALSHA, said once. */
static void functions_load_once_and_step_aside_when_refused(void)
{
    hirate_limiter *lim = make("redis://127.0.0.1:6379", 1);
    hirate_item it = {"erin", 4, 1, 0, {0}};
    hirate_op *op;
    char buf[256];
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    CHECK(leg_starts(op, 0, "*8\r\n$5\r\nFCALL\r\n"));
    feed_str(op, 0, "-ERR Function not found\r\n");
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_SEND);
    CHECK(leg_starts(op, 0, "*3\r\n$8\r\nFUNCTION\r\n$4\r\nLOAD\r\n"));
    char two[512];
    size_t n = (size_t)snprintf(two, sizeof two, "$23\r\n%s\r\n", hirate_function_name());
    n += bucket_reply(two + n, sizeof two - n, "erin");
    feed(op, 0, two, n);
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_DONE);
    hirate_op_free(op);
    CHECK_EQ_I64(it.rc, 0);
    hirate_counters c;
    hirate_counters_get(lim, &c);
    CHECK_EQ_I64(c.fcall, 2);
    CHECK_EQ_I64(c.function_loads, 1);
    CHECK_EQ_I64(c.evalsha + c.eval, 0);
    hirate_limiter_free(lim);

    lim = make("redis://127.0.0.1:6379", 1);
    for (int round = 0; round < 2; round++) {
        CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
        if (round == 0) {
            CHECK(leg_starts(op, 0, "*8\r\n$5\r\nFCALL\r\n"));
            feed_str(op, 0, "-NOPERM this user has no permissions to run the 'fcall' command\r\n");
            CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_SEND);
        }
        CHECK(leg_starts(op, 0, "*8\r\n$7\r\nEVALSHA\r\n"));
        feed(op, 0, buf, bucket_reply(buf, sizeof buf, "erin"));
        CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_DONE);
        CHECK_EQ_I64(it.rc, 0);
        hirate_op_free(op);
    }
    CHECK_EQ_I64(nlogged, 1);
    CHECK_EQ_I64(loglevel[0], HIRATE_LOG_WARNING);
    CHECK_EQ_STR(logged[0], "Redis Functions are not usable on 127.0.0.1:6379 (Redis replied: "
                            "NOPERM this user has no permissions to run the 'fcall' command): "
                            "deciding with EVALSHA there");
    hirate_counters_get(lim, &c);
    CHECK_EQ_I64(c.fcall, 1);
    CHECK_EQ_I64(c.evalsha, 2);
    hirate_limiter_free(lim);

    /* functions = 0: EVALSHA from the first call. */
    lim = make("redis://127.0.0.1:6379", 0);
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    CHECK(leg_starts(op, 0, "*8\r\n$7\r\nEVALSHA\r\n"));
    hirate_op_free(op);
    hirate_limiter_free(lim);
}

/* FUNCTION LOAD that meets an outage (a replica's READONLY, OOM) teaches
 * nothing of Redis Functions: the call is an outage, which the log says as
 * an outage (nothing of Redis Functions), and the next call is by FCALL
 * again. Behind a Sentinel URL the call
 * goes to the master the sentinels name now. */
static void a_load_that_meets_an_outage_changes_nothing(void)
{
    hirate_limiter *lim = make("redis://127.0.0.1:6379", 1);
    hirate_item it = {"frank", 5, 1, 0, {0}};
    hirate_op *op;
    char buf[512];
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    feed_str(op, 0, "-ERR Function not found\r\n");
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_SEND);
    CHECK(leg_starts(op, 0, "*3\r\n$8\r\nFUNCTION\r\n$4\r\nLOAD\r\n"));
    feed_str(op, 0, "-READONLY You can't write against a read only replica.\r\n"
                    "-ERR Function not found\r\n");
    CHECK_EQ_I64(hirate_op_leg_drop(op, 0), 1);
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_DONE);
    CHECK_EQ_I64(it.rc, 0);
    CHECK_EQ_I64(it.decision.source, HIRATE_SOURCE_FAIL_CLOSED);
    CHECK_EQ_I64(it.decision.error, HIRATE_ESERVER);
    hirate_op_free(op);
    CHECK_EQ_I64(nlogged, 1);
    CHECK_EQ_I64(loglevel[0], HIRATE_LOG_WARNING);
    CHECK_EQ_STR(logged[0], "Redis at 127.0.0.1:6379 failed (Redis replied: READONLY You can't "
                            "write against a read only replica.): the 'closed' policy decides "
                            "until it answers again");
    char msg[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_STR(hirate_limiter_errmsg(lim, msg, sizeof msg),
                 "Redis replied: READONLY You can't write against a read only replica.");
    hirate_limiter_free(lim);

    lim = make(SENTINELS, 1);
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    feed_str(op, 0, at_7000);
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_SEND);
    feed_str(op, 0, "-ERR Function not found\r\n");
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_SEND);
    feed_str(op, 0, "-READONLY You can't write against a read only replica.\r\n"
                    "-ERR Function not found\r\n");
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_SEND);
    CHECK_EQ_I64(hirate_op_leg_node(op, 0), 0);   /* asked again */
    feed_str(op, 0, at_7001);
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_SEND);
    CHECK_EQ_I64(hirate_op_leg_node(op, 0), 4);
    CHECK(leg_starts(op, 0, "*8\r\n$5\r\nFCALL\r\n"));   /* replicated: no load */
    feed(op, 0, buf, bucket_reply(buf, sizeof buf, "frank"));
    CHECK_EQ_I64(hirate_op_next(op), HIRATE_IO_DONE);
    CHECK_EQ_I64(it.decision.source, HIRATE_SOURCE_REDIS);
    hirate_op_free(op);
    CHECK_EQ_I64(nlogged, 2);   /* the master, then its move: no warning */
    hirate_limiter_free(lim);
}

int main(void)
{
    the_first_call_asks_then_goes_to_the_master();
    readonly_follows_the_failover();
    sentinels_are_asked_in_turn();
    a_replica_is_never_the_master();
    functions_load_once_and_step_aside_when_refused();
    a_load_that_meets_an_outage_changes_nothing();
    return check_summary("test_discovery");
}
