/*
 * Deciding without I/O (hirate__op_*): the test does the network I/O itself,
 * over a plain socket to its own redis-server, as asyncio or OpenResty would,
 * and the limiter supplies the bytes, reads the replies, and keeps the
 * breaker, the deny cache and the failure policy.
 */
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "hirate_internal.h"
#include "proto.h"
#include "redis_harness.h"

static rh_server S;

static hirate_limiter *make(const char *url, const char *prefix, int64_t capacity,
                            int on_error)
{
    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.prefix = prefix;
    o.capacity = capacity;
    o.rate = 0.001;
    o.on_error = on_error;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, why, sizeof why), 0);
    return lim;
}

static int connect_to(const hirate_endpoint *ep)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ep->port)};
    inet_pton(AF_INET, ep->host, &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void send_all(int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t n = send(fd, buf, len, 0);
        if (n <= 0)
            return;
        buf += n;
        len -= (size_t)n;
    }
}

/* Runs op to the end over fd, feeding the replies one byte at a time so that
 * every "more" path is taken. Returns how many requests were sent. */
static int drive(hirate_op *op, int fd)
{
    char buf[8192];
    size_t have = 0, len;
    const char *req = hirate__op_request(op, &len);
    send_all(fd, req, len);
    int sent = 1;
    for (;;) {
        ssize_t n = recv(fd, buf + have, 1, 0);
        if (n <= 0) {
            hirate__op_fail(op, HIRATE_EIO);
            return sent;
        }
        have += (size_t)n;
        size_t used;
        int r = hirate__op_feed(op, buf, have, &used);
        memmove(buf, buf + used, have - used);
        have -= used;
        if (r == HIRATE_OP_DONE) {
            CHECK_EQ_I64(have, 0);   /* no byte nobody asked for */
            return sent;
        }
        if (r == HIRATE_OP_SEND) {
            req = hirate__op_request(op, &len);
            send_all(fd, req, len);
            sent++;
        }
    }
}

static void decisions_match_the_c_client_byte_by_byte(void)
{
    hirate_limiter *lim = make(S.url, "op:", 3, HIRATE_ON_ERROR_CLOSED);
    hirate_endpoint ep;
    CHECK_EQ_I64(hirate__endpoint(lim, &ep), 0);
    CHECK_EQ_I64(ep.port, S.port);
    CHECK_EQ_STR(ep.host, "127.0.0.1");
    int fd = connect_to(&ep);
    CHECK(fd >= 0);
    static const int64_t remaining[] = {2, 1, 0, 0};
    for (int i = 0; i < 4; i++) {
        hirate_item it = {"alice", 5, 1, 0, {0}};
        hirate_op *op;
        int started = hirate__op_start(lim, &it, 1, 1, -1, &op);
        /* the fourth is refused by the deny cache: nothing to send */
        CHECK_EQ_I64(started, i < 3);
        if (started == 1) {
            CHECK_EQ_I64(drive(op, fd), i == 0 ? 2 : 1);   /* a fresh server: NOSCRIPT once */
            CHECK_EQ_I64(hirate__op_drop(op), 0);
        }
        hirate__op_free(op);
        CHECK_EQ_I64(it.rc, 0);
        CHECK_EQ_I64(it.decision.allowed, i < 3);
        CHECK_EQ_I64(it.decision.remaining, remaining[i]);
        CHECK_EQ_I64(it.decision.source, i < 3 ? HIRATE_SOURCE_REDIS : HIRATE_SOURCE_CACHE);
    }
    /* The C client sees the same bucket. */
    hirate_decision d;
    CHECK_EQ_I64(hirate_peek(lim, "alice", 5, 1, &d), 0);
    CHECK_EQ_I64(d.allowed, 0);
    close(fd);
    hirate_limiter_free(lim);
}

static void a_batch_goes_as_one_request_and_noscript_as_one_eval(void)
{
    redisReply *r = rh_command(&S, "SCRIPT FLUSH");
    freeReplyObject(r);
    hirate_limiter *lim = make(S.url, "opb:", 10, HIRATE_ON_ERROR_CLOSED);
    hirate_endpoint ep;
    hirate__endpoint(lim, &ep);
    int fd = connect_to(&ep);
    hirate_item items[4] = {{"a", 1, 3, 0, {0}}, {"b", 1, 11, 0, {0}}, {"", 0, 1, 0, {0}},
                            {"a", 1, 4, 0, {0}}};
    hirate_op *op;
    CHECK_EQ_I64(hirate__op_start(lim, items, 4, 1, -1, &op), 1);
    size_t len;
    const char *req = hirate__op_request(op, &len);
    CHECK(len > 0 && memcmp(req, "*8\r\n$7\r\nEVALSHA\r\n", 17) == 0);
    CHECK_EQ_I64(drive(op, fd), 2);
    req = hirate__op_request(op, &len);   /* the second request: EVAL first */
    CHECK(memcmp(req, "*8\r\n$4\r\nEVAL\r\n", 14) == 0);
    hirate__op_free(op);
    CHECK_EQ_I64(items[0].rc, 0);
    CHECK_EQ_I64(items[0].decision.remaining, 7);
    CHECK_EQ_I64(items[1].rc, 0);
    CHECK_EQ_I64(items[1].decision.allowed, 0);
    CHECK_EQ_I64(items[1].decision.retry_after_us, HIRATE_NEVER);
    CHECK_EQ_I64(items[2].rc, HIRATE_EKEY);
    CHECK_EQ_I64(items[3].rc, 0);
    CHECK_EQ_I64(items[3].decision.remaining, 3);
    close(fd);
    hirate_limiter_free(lim);
}

static void a_failed_io_is_decided_by_the_policy_and_opens_the_breaker(void)
{
    hirate_limiter *lim = make(S.url, "opf:", 5, HIRATE_ON_ERROR_CLOSED);
    hirate_item it = {"k", 1, 1, 0, {0}};
    hirate_op *op;
    CHECK_EQ_I64(hirate__op_start(lim, &it, 1, 1, -1, &op), 1);
    hirate__op_fail(op, HIRATE_ETIMEDOUT);
    CHECK_EQ_I64(hirate__op_drop(op), 1);
    hirate__op_free(op);
    CHECK_EQ_I64(it.rc, 0);
    CHECK_EQ_I64(it.decision.source, HIRATE_SOURCE_FAIL_CLOSED);
    CHECK_EQ_I64(it.decision.error, HIRATE_ETIMEDOUT);
    /* The breaker is open: the next decision needs no I/O. */
    hirate_item next = {"k", 1, 1, 0, {0}};
    CHECK_EQ_I64(hirate__op_start(lim, &next, 1, 1, -1, &op), 0);
    CHECK(op == NULL);
    CHECK_EQ_I64(next.decision.source, HIRATE_SOURCE_FAIL_CLOSED);
    CHECK_EQ_I64(next.decision.error, HIRATE_ETIMEDOUT);
    hirate_stats st;
    hirate__stats(lim, &st);
    CHECK_EQ_I64(st.breaker_opens, 1);
    hirate_limiter_free(lim);
}

/* A caller that gives up (a cancelled task) fails its op with ECLOSED: no
 * policy decides, and the breaker learns nothing either way: closed, it stays
 * closed; open, a probe given up lets the next call probe. */
static void a_call_given_up_teaches_the_breaker_nothing(void)
{
    hirate_limiter *lim = make(S.url, "opg:", 5, HIRATE_ON_ERROR_CLOSED);
    hirate_item it = {"k", 1, 1, 0, {0}};
    hirate_op *op;
    hirate_stats st;
    CHECK_EQ_I64(hirate__op_start(lim, &it, 1, 1, -1, &op), 1);
    hirate__op_fail(op, HIRATE_ECLOSED);
    CHECK_EQ_I64(hirate__op_drop(op), 1);
    hirate__op_free(op);
    CHECK_EQ_I64(it.rc, HIRATE_ECLOSED);
    hirate__stats(lim, &st);
    CHECK_EQ_I64(st.breaker_opens, 0);
    CHECK_EQ_I64(st.policy, 0);
    /* Open the breaker, wait out its backoff (100 ms, jittered up to 125). */
    CHECK_EQ_I64(hirate__op_start(lim, &it, 1, 1, -1, &op), 1);
    hirate__op_fail(op, HIRATE_ETIMEDOUT);
    hirate__op_free(op);
    struct timespec backoff = {0, 200 * 1000000L};
    nanosleep(&backoff, NULL);
    /* The probe is given up: the next call is a probe again, at once. */
    CHECK_EQ_I64(hirate__op_start(lim, &it, 1, 1, -1, &op), 1);
    hirate__op_fail(op, HIRATE_ECLOSED);
    hirate__op_free(op);
    CHECK_EQ_I64(it.rc, HIRATE_ECLOSED);
    CHECK_EQ_I64(hirate__op_start(lim, &it, 1, 1, -1, &op), 1);
    hirate__op_fail(op, HIRATE_ETIMEDOUT);
    hirate__op_free(op);
    CHECK_EQ_I64(it.rc, 0);
    CHECK_EQ_I64(it.decision.source, HIRATE_SOURCE_FAIL_CLOSED);
    hirate__stats(lim, &st);
    CHECK_EQ_I64(st.breaker_opens, 1);
    hirate_limiter_free(lim);
}

static void a_malformed_reply_is_a_failure_and_drops_the_connection(void)
{
    hirate_limiter *lim = make(S.url, "opm:", 5, HIRATE_ON_ERROR_OPEN);
    hirate_item it = {"k", 1, 1, 0, {0}};
    hirate_op *op;
    CHECK_EQ_I64(hirate__op_start(lim, &it, 1, 1, -1, &op), 1);
    static const char junk[] = "*8\r\n:1\r\n?what\r\n";
    size_t used;
    CHECK_EQ_I64(hirate__op_feed(op, junk, sizeof junk - 1, &used), HIRATE_OP_DONE);
    CHECK_EQ_I64(hirate__op_drop(op), 1);
    hirate__op_free(op);
    CHECK_EQ_I64(it.rc, 0);
    CHECK_EQ_I64(it.decision.source, HIRATE_SOURCE_FAIL_OPEN);
    CHECK_EQ_I64(it.decision.error, HIRATE_EPROTO);
    char msg[HIRATE_ERRMSG_SIZE];
    CHECK(strstr(hirate_limiter_errmsg(lim, msg, sizeof msg), "unknown reply type") != NULL);
    hirate_limiter_free(lim);
}

/* A call that met NOSCRIPT waits to be sent again; when the connection fails
 * first (here a malformed reply to the next call, or a timeout), the policy
 * decides it too, and no item is left with the NOSCRIPT marker as its rc. */
static void a_failure_after_noscript_leaves_no_call_undecided(void)
{
    static const char noscript[] = "-NOSCRIPT No matching script. Please use EVAL.\r\n";
    static const char junk[] = "-NOSCRIPT No matching script. Please use EVAL.\r\n*8\r\n:1@\r\n";
    for (int how = 0; how < 2; how++) {
        hirate_limiter *lim = make("redis://127.0.0.1:1", "opn:", 5, HIRATE_ON_ERROR_CLOSED);
        hirate_item items[2] = {{"a", 1, 1, 0, {0}}, {"b", 1, 1, 0, {0}}};
        hirate_op *op;
        size_t used;
        CHECK_EQ_I64(hirate__op_start(lim, items, 2, 1, -1, &op), 1);
        if (how == 0) {
            CHECK_EQ_I64(hirate__op_feed(op, junk, sizeof junk - 1, &used), HIRATE_OP_DONE);
        } else {
            CHECK_EQ_I64(hirate__op_feed(op, noscript, sizeof noscript - 1, &used), HIRATE_OP_MORE);
            CHECK_EQ_I64(used, sizeof noscript - 1);
            hirate__op_fail(op, HIRATE_ETIMEDOUT);
        }
        hirate__op_free(op);
        for (int i = 0; i < 2; i++) {
            CHECK_EQ_I64(items[i].rc, 0);
            CHECK_EQ_I64(items[i].decision.source, HIRATE_SOURCE_FAIL_CLOSED);
            CHECK_EQ_I64(items[i].decision.error, how == 0 ? HIRATE_EPROTO : HIRATE_ETIMEDOUT);
        }
        hirate_limiter_free(lim);
    }
}

/* An error reply of 4098 bytes: its line fits the parser's limit, the whole
 * reply does not fit the C client's buffer. Fed whole or in two pieces, it is
 * the same malformed reply, never an error the server "said". */
static void a_reply_too_long_is_refused_whole_as_in_pieces(void)
{
    size_t n = HIRATE_PROTO_MAX_REPLY + 2;
    char *reply = malloc(n);
    memcpy(reply, "-ERR ", 5);
    memset(reply + 5, 'x', n - 7);
    memcpy(reply + n - 2, "\r\n", 2);
    for (int pieces = 1; pieces <= 2; pieces++) {
        hirate_limiter *lim = make("redis://127.0.0.1:1", "opl:", 5, HIRATE_ON_ERROR_CLOSED);
        hirate_item it = {"k", 1, 1, 0, {0}};
        hirate_op *op;
        size_t used;
        CHECK_EQ_I64(hirate__op_start(lim, &it, 1, 1, -1, &op), 1);
        if (pieces == 2)
            CHECK_EQ_I64(hirate__op_feed(op, reply, 4000, &used), HIRATE_OP_MORE);
        CHECK_EQ_I64(hirate__op_feed(op, reply, n, &used), HIRATE_OP_DONE);
        CHECK_EQ_I64(hirate__op_drop(op), 1);
        hirate__op_free(op);
        CHECK_EQ_I64(it.rc, 0);
        CHECK_EQ_I64(it.decision.source, HIRATE_SOURCE_FAIL_CLOSED);
        CHECK_EQ_I64(it.decision.error, HIRATE_EPROTO);
        hirate_limiter_free(lim);
    }
    free(reply);
}

static void the_handshake_is_auth_then_select(void)
{
    static const char want[] = "*3\r\n$4\r\nAUTH\r\n$2\r\nrl\r\n$6\r\ns3cr3t\r\n"
                               "*2\r\n$6\r\nSELECT\r\n$1\r\n2\r\n";
    hirate_limiter *lim = make("redis://rl:s3cr3t@127.0.0.1:6379/2", "rl:", 5,
                               HIRATE_ON_ERROR_LOCAL);
    char buf[256];
    int replies;
    CHECK_EQ_I64(hirate__handshake(lim, buf, 10, &replies), sizeof want - 1);   /* too small */
    size_t len = hirate__handshake(lim, buf, sizeof buf, &replies);
    CHECK_EQ_I64(len, sizeof want - 1);
    CHECK(memcmp(buf, want, len) == 0);
    CHECK_EQ_I64(replies, 2);
    hirate_limiter_free(lim);
    lim = make("redis://127.0.0.1:6379", "rl:", 5, HIRATE_ON_ERROR_LOCAL);
    CHECK_EQ_I64(hirate__handshake(lim, buf, sizeof buf, &replies), 0);
    CHECK_EQ_I64(replies, 0);
    hirate_limiter_free(lim);
    /* without a URL there is no Redis to talk to */
    lim = make(NULL, "rl:", 5, HIRATE_ON_ERROR_LOCAL);
    hirate_endpoint ep;
    hirate_op *op;
    hirate_item it = {"k", 1, 1, 0, {0}};
    CHECK_EQ_I64(hirate__endpoint(lim, &ep), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate__op_start(lim, &it, 1, 1, -1, &op), HIRATE_EINVAL);
    hirate_limiter_free(lim);
}

int main(void)
{
    if (rh_start(&S) != 0) {
        CHECK(!"redis-server must start (is it installed and on PATH?)");
        return check_summary("test_op");
    }
    rh_watchdog(&S, "test_op", 60);
    decisions_match_the_c_client_byte_by_byte();
    a_batch_goes_as_one_request_and_noscript_as_one_eval();
    a_failed_io_is_decided_by_the_policy_and_opens_the_breaker();
    a_malformed_reply_is_a_failure_and_drops_the_connection();
    a_call_given_up_teaches_the_breaker_nothing();
    a_failure_after_noscript_leaves_no_call_undecided();
    a_reply_too_long_is_refused_whole_as_in_pieces();
    the_handshake_is_auth_then_select();
    rh_stop(&S);
    return check_summary("test_op");
}
