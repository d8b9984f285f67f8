/*
 * Deciding without I/O (hirate_io.h): the test does the network I/O itself,
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
#include "hirate_io.h"
#include "proto.h"
#include "redis_harness.h"
#include "test_time.h"

static rh_server S;

static hirate_limiter *make(const char *url, const char *prefix, int64_t capacity,
                            int on_error)
{
    hirate_options o;
    hirate_options_init(&o);
    o.functions = 0;   /* the EVALSHA path; test_sentinel.c has FCALL's */
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
    const char *req = hirate_op_request(op, &len);
    send_all(fd, req, len);
    int sent = 1;
    for (;;) {
        ssize_t n = recv(fd, buf + have, 1, 0);
        if (n <= 0) {
            hirate_op_fail(op, HIRATE_EIO, NULL);
            return sent;
        }
        have += (size_t)n;
        size_t used;
        int r = hirate_op_feed(op, buf, have, &used);
        memmove(buf, buf + used, have - used);
        have -= used;
        if (r == HIRATE_IO_DONE) {
            CHECK_EQ_I64(have, 0);   /* no byte nobody asked for */
            return sent;
        }
        if (r == HIRATE_IO_SEND) {
            req = hirate_op_request(op, &len);
            send_all(fd, req, len);
            sent++;
        }
    }
}

static void decisions_match_the_c_client_byte_by_byte(void)
{
    hirate_limiter *lim = make(S.url, "op:", 3, HIRATE_ON_ERROR_CLOSED);
    hirate_endpoint ep;
    CHECK_EQ_I64(hirate_endpoint_get(lim, &ep), 0);
    CHECK_EQ_I64(ep.port, S.port);
    CHECK_EQ_STR(ep.host, "127.0.0.1");
    int fd = connect_to(&ep);
    CHECK(fd >= 0);
    static const int64_t remaining[] = {2, 1, 0, 0};
    for (int i = 0; i < 4; i++) {
        hirate_item it = {"alice", 5, 1, 0, {0}};
        hirate_op *op;
        int started = hirate_op_start(lim, &it, 1, 1, -1, &op);
        /* the fourth is refused by the deny cache: nothing to send */
        CHECK_EQ_I64(started, i < 3);
        if (started == 1) {
            CHECK_EQ_I64(drive(op, fd), i == 0 ? 2 : 1);   /* a fresh server: NOSCRIPT once */
            CHECK_EQ_I64(hirate_op_drop(op), 0);
        }
        hirate_op_free(op);
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
    hirate_endpoint_get(lim, &ep);
    int fd = connect_to(&ep);
    hirate_item items[4] = {{"a", 1, 3, 0, {0}}, {"b", 1, 11, 0, {0}}, {"", 0, 1, 0, {0}},
                            {"a", 1, 4, 0, {0}}};
    hirate_op *op;
    CHECK_EQ_I64(hirate_op_start(lim, items, 4, 1, -1, &op), 1);
    size_t len;
    const char *req = hirate_op_request(op, &len);
    CHECK(len > 0 && memcmp(req, "*8\r\n$7\r\nEVALSHA\r\n", 17) == 0);
    CHECK_EQ_I64(drive(op, fd), 2);
    req = hirate_op_request(op, &len);   /* the second request: EVAL first */
    CHECK(memcmp(req, "*8\r\n$4\r\nEVAL\r\n", 14) == 0);
    hirate_op_free(op);
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
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    hirate_op_fail(op, HIRATE_ETIMEDOUT, NULL);
    CHECK_EQ_I64(hirate_op_drop(op), 1);
    hirate_op_free(op);
    CHECK_EQ_I64(it.rc, 0);
    CHECK_EQ_I64(it.decision.source, HIRATE_SOURCE_FAIL_CLOSED);
    CHECK_EQ_I64(it.decision.error, HIRATE_ETIMEDOUT);
    /* The breaker is open: the next decision needs no I/O. */
    hirate_item next = {"k", 1, 1, 0, {0}};
    CHECK_EQ_I64(hirate_op_start(lim, &next, 1, 1, -1, &op), 0);
    CHECK(op == NULL);
    CHECK_EQ_I64(next.decision.source, HIRATE_SOURCE_FAIL_CLOSED);
    CHECK_EQ_I64(next.decision.error, HIRATE_ETIMEDOUT);
    hirate_counters st;
    hirate_counters_get(lim, &st);
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
    hirate_counters st;
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    hirate_op_fail(op, HIRATE_ECLOSED, NULL);
    CHECK_EQ_I64(hirate_op_drop(op), 1);
    hirate_op_free(op);
    CHECK_EQ_I64(it.rc, HIRATE_ECLOSED);
    hirate_counters_get(lim, &st);
    CHECK_EQ_I64(st.breaker_opens, 0);
    CHECK_EQ_I64(st.policy, 0);
    /* Open the breaker, wait out its backoff (100 ms, jittered up to 125). */
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    hirate_op_fail(op, HIRATE_ETIMEDOUT, NULL);
    hirate_op_free(op);
    struct timespec backoff = {0, 200 * 1000000L};
    nanosleep(&backoff, NULL);
    /* The probe is given up: the next call is a probe again, at once. */
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    hirate_op_fail(op, HIRATE_ECLOSED, NULL);
    hirate_op_free(op);
    CHECK_EQ_I64(it.rc, HIRATE_ECLOSED);
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    hirate_op_fail(op, HIRATE_ETIMEDOUT, NULL);
    hirate_op_free(op);
    CHECK_EQ_I64(it.rc, 0);
    CHECK_EQ_I64(it.decision.source, HIRATE_SOURCE_FAIL_CLOSED);
    hirate_counters_get(lim, &st);
    CHECK_EQ_I64(st.breaker_opens, 1);
    hirate_limiter_free(lim);
}

static void a_malformed_reply_is_a_failure_and_drops_the_connection(void)
{
    hirate_limiter *lim = make(S.url, "opm:", 5, HIRATE_ON_ERROR_OPEN);
    hirate_item it = {"k", 1, 1, 0, {0}};
    hirate_op *op;
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    static const char junk[] = "*8\r\n:1\r\n?what\r\n";
    size_t used;
    CHECK_EQ_I64(hirate_op_feed(op, junk, sizeof junk - 1, &used), HIRATE_IO_DONE);
    CHECK_EQ_I64(hirate_op_drop(op), 1);
    hirate_op_free(op);
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
        CHECK_EQ_I64(hirate_op_start(lim, items, 2, 1, -1, &op), 1);
        if (how == 0) {
            CHECK_EQ_I64(hirate_op_feed(op, junk, sizeof junk - 1, &used), HIRATE_IO_DONE);
        } else {
            CHECK_EQ_I64(hirate_op_feed(op, noscript, sizeof noscript - 1, &used), HIRATE_IO_MORE);
            CHECK_EQ_I64(used, sizeof noscript - 1);
            hirate_op_fail(op, HIRATE_ETIMEDOUT, NULL);
        }
        hirate_op_free(op);
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
        CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
        if (pieces == 2)
            CHECK_EQ_I64(hirate_op_feed(op, reply, 4000, &used), HIRATE_IO_MORE);
        CHECK_EQ_I64(hirate_op_feed(op, reply, n, &used), HIRATE_IO_DONE);
        CHECK_EQ_I64(hirate_op_drop(op), 1);
        hirate_op_free(op);
        CHECK_EQ_I64(it.rc, 0);
        CHECK_EQ_I64(it.decision.source, HIRATE_SOURCE_FAIL_CLOSED);
        CHECK_EQ_I64(it.decision.error, HIRATE_EPROTO);
        hirate_limiter_free(lim);
    }
    free(reply);
}

/* One handshake fed `replies` (in pieces of `piece` bytes, 0: whole) after
 * its request was taken; returns the result and its message. */
static int handshake_with(const char *url, const char *replies, size_t len, size_t piece,
                          char *msg)
{
    hirate_limiter *lim = make(url, "hs:", 5, HIRATE_ON_ERROR_LOCAL);
    hirate_handshake *hs;
    CHECK_EQ_I64(hirate_handshake_start(lim, &hs, msg, HIRATE_ERRMSG_SIZE), 0);
    size_t reqlen, used;
    hirate_handshake_request(hs, &reqlen);
    int state = HIRATE_IO_MORE;
    for (size_t at = 0; at < len && state == HIRATE_IO_MORE; at += used) {
        size_t n = piece && len - at > piece ? piece : len - at;
        state = hirate_handshake_feed(hs, replies + at, n, &used);
        CHECK_EQ_I64(used, n);
    }
    if (state == HIRATE_IO_MORE)   /* the server closed after its line */
        state = hirate_handshake_fail(hs, HIRATE_EIO, "closed");
    CHECK_EQ_I64(state, HIRATE_IO_DONE);
    /* After DONE a byte more is not taken: the caller closes. */
    CHECK_EQ_I64(hirate_handshake_feed(hs, "+", 1, &used), HIRATE_IO_DONE);
    CHECK_EQ_I64(used, 0);
    int rc = hirate_handshake_result(hs, msg, HIRATE_ERRMSG_SIZE);
    hirate_handshake_free(hs);
    hirate_limiter_free(lim);
    return rc;
}

static void the_handshake_is_auth_select_then_ping(void)
{
    static const char want[] = "*3\r\n$4\r\nAUTH\r\n$2\r\nrl\r\n$6\r\ns3cr3t\r\n"
                               "*2\r\n$6\r\nSELECT\r\n$1\r\n2\r\n*1\r\n$4\r\nPING\r\n";
    hirate_limiter *lim = make("redis://rl:s3cr3t@127.0.0.1:6379/2", "rl:", 5,
                               HIRATE_ON_ERROR_LOCAL);
    char err[HIRATE_ERRMSG_SIZE];
    hirate_handshake *hs;
    size_t len;
    CHECK_EQ_I64(hirate_handshake_start(lim, &hs, err, sizeof err), 0);
    const char *req = hirate_handshake_request(hs, &len);
    CHECK_EQ_I64(len, sizeof want - 1);
    CHECK(memcmp(req, want, len) == 0);
    hirate_handshake_free(hs);
    hirate_limiter_free(lim);
    lim = make("redis://127.0.0.1:6379", "rl:", 5, HIRATE_ON_ERROR_LOCAL);
    CHECK_EQ_I64(hirate_handshake_start(lim, &hs, err, sizeof err), 0);
    req = hirate_handshake_request(hs, &len);
    CHECK_EQ_I64(len, 14);
    CHECK(memcmp(req, "*1\r\n$4\r\nPING\r\n", 14) == 0);
    hirate_handshake_free(hs);
    hirate_limiter_free(lim);
    /* without a URL there is no Redis to talk to */
    lim = make(NULL, "rl:", 5, HIRATE_ON_ERROR_LOCAL);
    hirate_endpoint ep;
    hirate_op *op;
    hirate_item it = {"k", 1, 1, 0, {0}};
    CHECK_EQ_I64(hirate_endpoint_get(lim, &ep), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_handshake_start(lim, &hs, err, sizeof err), HIRATE_EINVAL);
    hirate_limiter_free(lim);
}

static void each_handshake_reply_has_its_meaning(void)
{
    static const char auth[] = "redis://rl:s3cr3t@127.0.0.1:6379/2", plain[] = "redis://127.0.0.1:6379";
    static const struct {
        const char *rule, *url, *replies;
        int rc;
        const char *msg;
    } cases[] = {
        {"OK, OK and PONG: ready", auth, "+OK\r\n+OK\r\n+PONG\r\n", 0, ""},
        {"a PING alone: ready", plain, "+PONG\r\n", 0, ""},
        {"a wrong password is EAUTH, in Redis' words", auth,
         "-WRONGPASS invalid username-password pair or user is disabled.\r\n", HIRATE_EAUTH,
         "AUTH refused: WRONGPASS invalid username-password pair or user is disabled."},
        {"a password Redis wants and the URL lacks is EAUTH", plain,
         "-NOAUTH Authentication required.\r\n", HIRATE_EAUTH,
         "PING refused: NOAUTH Authentication required."},
        {"a wrong database is EREPLY", auth, "+OK\r\n-ERR DB index is out of range\r\n",
         HIRATE_EREPLY, "SELECT 2 refused: ERR DB index is out of range"},
        {"maxclients is EREFUSED, whatever the command", auth,
         "-ERR max number of clients reached\r\n", HIRATE_EREFUSED,
         "Redis at 127.0.0.1:6379 refused the connection: ERR max number of clients reached"},
        {"protected mode is EREFUSED", plain,
         "-DENIED Redis is running in protected mode because protected mode is enabled\r\n",
         HIRATE_EREFUSED,
         "Redis at 127.0.0.1:6379 refused the connection: DENIED Redis is running in protected "
         "mode because protected mode is enabled"},
        {"a loading server is an outage", plain, "-LOADING Redis is loading the dataset in memory\r\n",
         HIRATE_ESERVER, "PING at 127.0.0.1:6379: LOADING Redis is loading the dataset in memory"},
        {"a PING the ACL refuses still proves Redis", plain,
         "-NOPERM this user has no permissions to run the 'ping' command\r\n", 0, ""},
        {"an SSH server is not Redis", plain, "SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n", HIRATE_ENOTREDIS,
         "the server at 127.0.0.1:6379 is not Redis: it answered \"SSH-2.0-OpenSSH_9.2p1 Debian-2\""},
        {"an HTTP server is not Redis", plain, "HTTP/1.1 400 Bad Request\r\n\r\n", HIRATE_ENOTREDIS,
         "the server at 127.0.0.1:6379 is not Redis: it answered \"HTTP/1.1 400 Bad Request\""},
        {"a TLS alert on a plain URL is ETLS", plain, "\x15\x03\x03\x00\x02\x02\x46", HIRATE_ETLS,
         "127.0.0.1:6379 answered with a TLS record: it speaks TLS, use rediss://"},
        {"AUTH answered with something else is malformed", auth, "+PONG\r\n", HIRATE_EPROTO,
         "malformed reply from Redis: AUTH gave no +OK"},
        {"bytes after the last reply are malformed", plain, "+PONG\r\n+PONG\r\n", HIRATE_EPROTO,
         "malformed reply from Redis: bytes after the handshake's replies"},
        {"an array is not a handshake reply", plain, "*1\r\n:1\r\n", HIRATE_ENOTREDIS,
         "not a Redis reply from 127.0.0.1:6379: an array in the reply has too many elements"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (size_t piece = 0; piece <= 1; piece++) {
            if (piece && cases[i].rc == HIRATE_EPROTO && strstr(cases[i].msg, "after"))
                continue;   /* in pieces, the extra bytes come after DONE: see below */
            char msg[HIRATE_ERRMSG_SIZE] = "";
            int rc = handshake_with(cases[i].url, cases[i].replies, strlen(cases[i].replies),
                                    piece, msg);
            if (rc != cases[i].rc || (rc && strcmp(msg, cases[i].msg) != 0))
                fprintf(stderr, "  %s (piece %zu): %d \"%s\"\n", cases[i].rule, piece, rc, msg);
            CHECK_EQ_I64(rc, cases[i].rc);
            if (rc)
                CHECK_EQ_STR(msg, cases[i].msg);
        }
    }
}

/* Fails a new handshake of url with code; then, when it probes, feeds the
 * probe `probe` (NULL: the probe fails too). Returns the result. */
static int handshake_failing(const char *url, int sent, int code, const char *probe,
                             int *probed_tls, char *msg)
{
    hirate_limiter *lim = make(url, "hs:", 5, HIRATE_ON_ERROR_OPEN);
    hirate_handshake *hs;
    size_t len, used;
    CHECK_EQ_I64(hirate_handshake_start(lim, &hs, msg, HIRATE_ERRMSG_SIZE), 0);
    if (sent)
        hirate_handshake_request(hs, &len);
    int state = hirate_handshake_fail(hs, code, code == HIRATE_ECONNECT ? "Connection refused"
                                                                         : NULL);
    *probed_tls = -1;
    if (state == HIRATE_IO_PROBE) {
        *probed_tls = hirate_handshake_probe_tls(hs);
        const char *req = hirate_handshake_request(hs, &len);
        CHECK_EQ_I64(len, 14);
        CHECK(memcmp(req, "*1\r\n$4\r\nPING\r\n", 14) == 0);
        state = probe ? hirate_handshake_feed(hs, probe, strlen(probe), &used)
                      : hirate_handshake_fail(hs, HIRATE_ETIMEDOUT, NULL);
    }
    CHECK_EQ_I64(state, HIRATE_IO_DONE);
    int rc = hirate_handshake_result(hs, msg, HIRATE_ERRMSG_SIZE);
    hirate_handshake_free(hs);
    hirate_limiter_free(lim);
    return rc;
}

static void a_tls_mismatch_is_asked_once_on_the_other_transport(void)
{
    char msg[HIRATE_ERRMSG_SIZE];
    int tls;
    /* A plain connection closed at the first command, on a port that speaks TLS. */
    CHECK_EQ_I64(handshake_failing("redis://127.0.0.1:6380", 1, HIRATE_EIO, "+PONG\r\n", &tls, msg),
                 HIRATE_ETLS);
    CHECK_EQ_I64(tls, 1);
    CHECK_EQ_STR(msg, "127.0.0.1:6380 closed the connection at the first command, and the port "
                      "speaks TLS: use rediss://");
    /* ... on a port that does not: the outage stands. */
    CHECK_EQ_I64(handshake_failing("redis://127.0.0.1:6380", 1, HIRATE_EIO, NULL, &tls, msg),
                 HIRATE_EIO);
    CHECK_EQ_STR(msg, "handshake with 127.0.0.1:6380: I/O error on the Redis connection");
    /* A TLS handshake with no answer, on a port that speaks plain Redis. */
    CHECK_EQ_I64(handshake_failing("rediss://localhost:6379", 0, HIRATE_ETIMEDOUT,
                                   "-NOAUTH Authentication required.\r\n", &tls, msg),
                 HIRATE_ETLS);
    CHECK_EQ_I64(tls, 0);
    CHECK_EQ_STR(msg, "the TLS handshake with localhost:6379 got no answer, and the port answers "
                      "plain Redis: use redis://, or the TLS port");
    CHECK_EQ_I64(handshake_failing("rediss://localhost:6379", 0, HIRATE_ETIMEDOUT,
                                   "garbage\r\n", &tls, msg),
                 HIRATE_ETIMEDOUT);
    /* Failures a mismatch does not explain are not asked about. */
    CHECK_EQ_I64(handshake_failing("redis://127.0.0.1:1", 0, HIRATE_ECONNECT, NULL, &tls, msg),
                 HIRATE_ECONNECT);
    CHECK_EQ_I64(tls, -1);
    CHECK_EQ_STR(msg, "connect to 127.0.0.1:1: Connection refused");
    CHECK_EQ_I64(handshake_failing("redis://127.0.0.1:6380", 1, HIRATE_ETIMEDOUT, NULL, &tls, msg),
                 HIRATE_ETIMEDOUT);
    CHECK_EQ_I64(tls, -1);
    CHECK_EQ_I64(handshake_failing("rediss://localhost:6379", 1, HIRATE_EIO, NULL, &tls, msg),
                 HIRATE_EIO);
    CHECK_EQ_I64(tls, -1);
    CHECK_EQ_I64(handshake_failing("unix:///tmp/no.sock", 1, HIRATE_EIO, NULL, &tls, msg),
                 HIRATE_EIO);
    CHECK_EQ_I64(tls, -1);
}

static void after_a_failure_new_connections_wait_and_keep_its_code(void)
{
    hirate_limiter *lim = make("redis://u:pw@127.0.0.1:6379", "hs:", 5, HIRATE_ON_ERROR_OPEN);
    char msg[HIRATE_ERRMSG_SIZE];
    hirate_handshake *hs;
    size_t len, used;
    static const char wrong[] = "-WRONGPASS invalid username-password pair\r\n";
    CHECK_EQ_I64(hirate_handshake_start(lim, &hs, msg, sizeof msg), 0);
    hirate_handshake_request(hs, &len);
    hirate_handshake_feed(hs, wrong, sizeof wrong - 1, &used);
    CHECK_EQ_I64(hirate_handshake_result(hs, msg, sizeof msg), HIRATE_EAUTH);
    hirate_handshake_free(hs);
    /* The backoff (10 ms +-25%) keeps the code and the words. */
    CHECK_EQ_I64(hirate_handshake_start(lim, &hs, msg, sizeof msg), HIRATE_EAUTH);
    CHECK(hs == NULL);
    CHECK(strstr(msg, "not reconnecting for ") == msg);
    CHECK(strstr(msg, " ms after: AUTH refused: WRONGPASS invalid username-password pair") != NULL);
    /* Then one caller is let through, and only one. */
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
    CHECK_EQ_I64(hirate_handshake_start(lim, &hs, msg, sizeof msg), 0);
    hirate_handshake *other;
    CHECK_EQ_I64(hirate_handshake_start(lim, &other, msg, sizeof msg), HIRATE_EAUTH);
    /* Given up: nothing learnt, the backoff runs on. */
    hirate_handshake_free(hs);
    hirate_counters c;
    hirate_counters_get(lim, &c);
    CHECK_EQ_I64(c.connects, 2);
    CHECK_EQ_I64(c.breaker_opens, 0);
    hirate_limiter_free(lim);
}

static void the_endpoint_says_where_and_how(void)
{
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = 5;
    o.rate = 1;
    o.url = "rediss://u:pw@cache.example:6380/1";   /* the system's trust store */
    o.connect_timeout_ms = 200;
    hirate_limiter *lim;
    char err[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, err, sizeof err), 0);
    hirate_endpoint ep;
    CHECK_EQ_I64(hirate_endpoint_get(lim, &ep), 0);
    CHECK_EQ_I64(ep.tls, 1);
    CHECK_EQ_I64(ep.tls_verify, 1);
    CHECK_EQ_STR(ep.host, "cache.example");
    CHECK_EQ_STR(ep.where, "cache.example:6380");
    CHECK_EQ_STR(ep.tls_server_name, "cache.example");
    CHECK(ep.tls_ca_file == NULL && ep.tls_ca_dir == NULL && ep.tls_cert_file == NULL);
    CHECK_EQ_I64(ep.connect_timeout_ms, 150);   /* a quarter is kept for the probe */
    CHECK_EQ_I64(ep.probe_timeout_ms, 50);
    hirate_limiter_free(lim);

    static const struct { const char *url, *ca, *cert, *key; int verify, rc; const char *msg; } bad[] = {
        {"redis://h", "/dev/null", NULL, NULL, 1, HIRATE_EOPTION,
         "tls_ca_file is set, but the URL is not rediss:// (TLS)"},
        {"redis://h", NULL, NULL, NULL, 0, HIRATE_EOPTION,
         "tls_verify is off, but the URL is not rediss:// (TLS)"},
        {"rediss://h", NULL, NULL, NULL, 2, HIRATE_EOPTION, "tls_verify must be 0 or 1, got 2"},
        {"rediss://h", NULL, "/dev/null", NULL, 1, HIRATE_EOPTION,
         "tls_cert_file and tls_key_file go together: set both or neither"},
        {"rediss://h", "/nonexistent/ca.pem", NULL, NULL, 1, HIRATE_ETLS,
         "tls_ca_file /nonexistent/ca.pem: No such file or directory"},
        {"rediss://h", "", NULL, NULL, 1, HIRATE_EOPTION, "tls_ca_file must be 1 to 4095 bytes, got 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hirate_options_init(&o);
        o.capacity = 5;
        o.rate = 1;
        o.url = bad[i].url;
        o.tls_ca_file = bad[i].ca;
        o.tls_cert_file = bad[i].cert;
        o.tls_key_file = bad[i].key;
        o.tls_verify = bad[i].verify;
        CHECK_EQ_I64(hirate_limiter_new(&lim, &o, err, sizeof err), bad[i].rc);
        CHECK_EQ_STR(err, bad[i].msg);
    }
}

/* The whole life of a connection through the public API, over a real socket. */
static void a_connection_opened_through_the_api_serves_calls(void)
{
    hirate_limiter *lim = make(S.url, "hsio:", 2, HIRATE_ON_ERROR_CLOSED);
    hirate_endpoint ep;
    hirate_endpoint_get(lim, &ep);
    hirate_handshake *hs;
    char err[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_handshake_start(lim, &hs, err, sizeof err), 0);
    int fd = connect_to(&ep);
    CHECK(fd >= 0);
    size_t len, used;
    const char *req = hirate_handshake_request(hs, &len);
    send_all(fd, req, len);
    char buf[64];
    int state = HIRATE_IO_MORE;
    while (state == HIRATE_IO_MORE) {
        ssize_t n = recv(fd, buf, 1, 0);
        state = n > 0 ? hirate_handshake_feed(hs, buf, (size_t)n, &used)
                      : hirate_handshake_fail(hs, HIRATE_EIO, "closed");
    }
    CHECK_EQ_I64(hirate_handshake_result(hs, err, sizeof err), 0);
    hirate_handshake_free(hs);
    hirate_item it = {"bob", 3, 1, 0, {0}};
    hirate_op *op;
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    drive(op, fd);
    hirate_op_free(op);
    CHECK_EQ_I64(it.rc, 0);
    CHECK_EQ_I64(it.decision.remaining, 1);
    /* A reset as an op: one DEL, an integer reply. */
    CHECK_EQ_I64(hirate_op_start_reset(lim, "bob", 3, &op), 1);
    req = hirate_op_request(op, &len);
    CHECK_EQ_I64(len, strlen("*2\r\n$3\r\nDEL\r\n$8\r\nhsio:bob\r\n"));
    CHECK(memcmp(req, "*2\r\n$3\r\nDEL\r\n$8\r\nhsio:bob\r\n", len) == 0);
    send_all(fd, req, len);
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    CHECK_EQ_I64(hirate_op_feed(op, buf, (size_t)n, &used), HIRATE_IO_DONE);
    CHECK_EQ_I64(hirate_op_result(op), 0);
    CHECK(hirate_op_errmsg(op, 0) == NULL);
    hirate_op_free(op);
    CHECK_EQ_I64(hirate_op_start_reset(lim, "", 0, &op), HIRATE_EKEY);
    CHECK(op == NULL);
    hirate_decision d;
    CHECK_EQ_I64(hirate_peek(lim, "bob", 3, 2, &d), 0);
    CHECK_EQ_I64(d.allowed, 1);
    close(fd);
    hirate_limiter_free(lim);
}

/* An item's error keeps its own words, next to the others' decisions. */
static void an_items_error_keeps_its_own_message(void)
{
    hirate_limiter *lim = make("redis://127.0.0.1:1", "msg:", 5, HIRATE_ON_ERROR_CLOSED);
    hirate_item items[2] = {{"a", 1, 1, 0, {0}}, {"b", 1, 1, 0, {0}}};
    hirate_op *op;
    size_t used;
    CHECK_EQ_I64(hirate_op_start(lim, items, 2, 1, -1, &op), 1);
    static const char replies[] =
        "-NOPERM this user has no permissions to access one of the keys used as arguments\r\n"
        "-ERR hirate: cost must be a whole number from 0 to 2^53-1\r\n";
    CHECK_EQ_I64(hirate_op_feed(op, replies, sizeof replies - 1, &used), HIRATE_IO_DONE);
    CHECK_EQ_I64(items[0].rc, HIRATE_ENOPERM);
    CHECK_EQ_I64(items[1].rc, HIRATE_EREPLY);
    CHECK_EQ_STR(hirate_op_errmsg(op, 0), "Redis replied: NOPERM this user has no permissions to "
                                          "access one of the keys used as arguments");
    CHECK_EQ_STR(hirate_op_errmsg(op, 1),
                 "Redis replied: ERR hirate: cost must be a whole number from 0 to 2^53-1");
    hirate_op_free(op);
    /* The script's command refused by an ACL is ENOPERM too. */
    hirate_item it = {"c", 1, 1, 0, {0}};
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    static const char script[] = "-ERR The user executing the script can't run this command or "
                                 "subcommand script: 26e4, on @user_script:85.\r\n";
    CHECK_EQ_I64(hirate_op_feed(op, script, sizeof script - 1, &used), HIRATE_IO_DONE);
    CHECK_EQ_I64(it.rc, HIRATE_ENOPERM);
    hirate_op_free(op);
    /* A failure of the I/O keeps the binding's words. */
    CHECK_EQ_I64(hirate_op_start(lim, &it, 1, 1, -1, &op), 1);
    hirate_op_fail(op, HIRATE_EREFUSED, "Redis at 127.0.0.1:1 refused the connection: ERR max "
                                        "number of clients reached");
    CHECK_EQ_I64(it.rc, HIRATE_EREFUSED);
    CHECK_EQ_STR(hirate_op_errmsg(op, 0), "Redis at 127.0.0.1:1 refused the connection: ERR max "
                                          "number of clients reached");
    hirate_op_free(op);
    hirate_counters c;
    hirate_counters_get(lim, &c);
    CHECK_EQ_I64(c.breaker_opens, 0);   /* no misconfiguration opens it */
    hirate_limiter_free(lim);
}

/* A check's latency_us is the round trip of its request: from when its bytes
 * are taken to be sent (the connection open, its handshake done) to its last
 * reply, not the time the caller took to open the connection before that. */
static void a_checks_latency_is_its_requests_round_trip(void)
{
    hirate_limiter *lim = make(S.url, "op:", 3, HIRATE_ON_ERROR_CLOSED);
    hirate_endpoint ep;
    CHECK_EQ_I64(hirate_endpoint_get(lim, &ep), 0);
    hirate_op *op;
    CHECK_EQ_I64(hirate_op_start_check(lim, &op), 1);
    sleep_ms(50);   /* a slow connect, between the op's start and its send */
    int fd = connect_to(&ep);
    CHECK(fd >= 0);
    int64_t before = mono_us();
    CHECK_EQ_I64(drive(op, fd), 1);
    int64_t after = mono_us();
    hirate_check_node node;
    size_t n = 0;
    CHECK_EQ_I64(hirate_op_check(op, &node, 1, &n), 0);
    CHECK_EQ_I64(n, 1);
    CHECK_EQ_I64(node.rc, 0);
    CHECK_EQ_STR(node.role, "master");
    CHECK(node.latency_us >= 0);
    CHECK(node.latency_us <= after - before);   /* inside the send and the last reply */
    hirate_op_free(op);
    close(fd);
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
    the_handshake_is_auth_select_then_ping();
    each_handshake_reply_has_its_meaning();
    a_tls_mismatch_is_asked_once_on_the_other_transport();
    after_a_failure_new_connections_wait_and_keep_its_code();
    the_endpoint_says_where_and_how();
    a_connection_opened_through_the_api_serves_calls();
    an_items_error_keeps_its_own_message();
    a_checks_latency_is_its_requests_round_trip();
    rh_stop(&S);
    return check_summary("test_op");
}
