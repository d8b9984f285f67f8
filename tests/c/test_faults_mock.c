/*
 * The faults a real Redis will not produce, played by a scripted RESP server
 * (tests/support/mock_server.c): malformed and hostile replies, replies split
 * or cut, error replies that are hard to provoke on one machine, and a batch
 * whose replies trickle in. The fault matrix is in test_faults.c.
 *
 * Each case runs under each policy on a fresh limiter, and asserts: the code
 * (the policy's decision naming the failure, or the returned configuration
 * error); the call bounded by its timeouts; the connection dropped (or kept,
 * for an error reply that leaves the stream in step); the breaker keeping the
 * next calls away from the server; and Redis deciding again once the server
 * answers properly. Around all of it, the process' memory must not grow: a
 * client that believed "$999999999999" or "*2147483647" would allocate for it.
 */
#include <stdlib.h>
#include <string.h>

#include "mock_server.h"
#include "proto.h"
#include "test_faults.h"

#define TS "1700000000000000"
/* The command timeout of every limiter here; a mock server answers at once
 * unless the case is about time. */
enum { TIMEOUT_MS = 200 };
/* The script's reply up to the key it echoes: allowed, 4 of 5 left. */
#define GOOD_HEAD "*8\r\n:1\r\n:4\r\n:0\r\n:1000000000\r\n$1\r\n4\r\n:" TS "\r\n:" TS "\r\n"

typedef struct mcase {
    const char *rule;
    const char *raw;        /* bytes sent as they are; NULL: a script reply, below */
    size_t rawlen;          /* 0: strlen(raw) */
    const char *head;       /* the script reply up to its key; NULL: GOOD_HEAD */
    const char *key;        /* the key it echoes; NULL: the call's own */
    const char *tail;       /* bytes sent right after the reply */
    int piece, gap_ms;      /* sent `piece` bytes at a time, gap_ms apart */
    int cut;                /* > 0: close the connection after this many bytes */
    int silent;             /* answer nothing at all */
    int want;               /* 0: Redis' decision; else the failure the policy names */
    int returned;           /* `want` is returned by the call: a configuration error */
    int drops;              /* the limiter must close the connection */
    const char *says;       /* the start of the limiter's message */
} mcase;

static char deep[4 * 100000 + 1];   /* "*1\r\n" 10^5 times */
static char longline[6000];         /* "+aaa..." and no CRLF */

#define MALFORMED "malformed reply from Redis"

static mcase cases[] = {
    {.rule = "a good reply (the control case)"},
    {.rule = "a good reply split into 4-byte writes 2 ms apart", .piece = 4, .gap_ms = 2},
    {.rule = "a good reply split into 1-byte writes", .piece = 1, .gap_ms = 0},

    {.rule = "absurd bulk length", .raw = "$999999999999\r\n", .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": bulk length out of range"},
    {.rule = "absurd bulk length inside the array", .raw = "*8\r\n:1\r\n$999999999999\r\n",
     .want = HIRATE_EPROTO, .drops = 1, .says = MALFORMED ": bulk length out of range"},
    {.rule = "a bulk length of 19 digits", .raw = "$9999999999999999999\r\n",
     .want = HIRATE_EPROTO, .drops = 1, .says = MALFORMED ": bulk length out of range"},
    {.rule = "absurd array length", .raw = "*2147483647\r\n", .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": array length out of range"},
    {.rule = "negative bulk length", .raw = "$-2\r\n", .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": bulk length out of range"},
    {.rule = "negative array length", .raw = "*-2\r\n", .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": array length out of range"},
    {.rule = "deep nesting: *1 10^5 times", .raw = deep, .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": nested array"},
    {.rule = "a line longer than any reply", .raw = longline, .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED},

    {.rule = "an integer where the array should be", .raw = ":1\r\n", .want = HIRATE_EPROTO,
     .drops = 1, .says = MALFORMED ": the script's reply is not an array of 8"},
    {.rule = "a status where the array should be", .raw = "+OK\r\n", .want = HIRATE_EPROTO,
     .drops = 1, .says = MALFORMED ": the script's reply is not an array of 8"},
    {.rule = "a nil where the array should be", .raw = "$-1\r\n", .want = HIRATE_EPROTO,
     .drops = 1, .says = MALFORMED ": the script's reply is not an array of 8"},
    {.rule = "a nil array", .raw = "*-1\r\n", .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": the script's reply is not an array of 8"},
    {.rule = "an array of 7",
     .head = "*7\r\n:1\r\n:4\r\n:0\r\n:1000000000\r\n$1\r\n4\r\n:" TS "\r\n",
     .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": the script's reply is not an array of 8"},
    {.rule = "an array of 9", .head = "*9\r\n:0\r\n:1\r\n:4\r\n:0\r\n:1000000000\r\n$1\r\n4\r\n:" TS
                                      "\r\n:" TS "\r\n",
     .want = HIRATE_EPROTO, .drops = 1, .says = MALFORMED},
    {.rule = "an empty array", .raw = "*0\r\n", .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": the script's reply is not an array of 8"},
    {.rule = "a string where an integer should be",
     .head = "*8\r\n$1\r\n1\r\n:4\r\n:0\r\n:1000000000\r\n$1\r\n4\r\n:" TS "\r\n:" TS "\r\n",
     .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": the script's reply has an element of the wrong type"},
    {.rule = "a non-numeric token level",
     .head = "*8\r\n:1\r\n:4\r\n:0\r\n:1000000000\r\n$3\r\nabc\r\n:" TS "\r\n:" TS "\r\n",
     .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": the script's reply has a malformed token level"},
    {.rule = "a token level that is not a number",
     .head = "*8\r\n:0\r\n:0\r\n:5\r\n:1000000000\r\n$3\r\n1e+\r\n:" TS "\r\n:" TS "\r\n",
     .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": the script's reply has a malformed token level"},
    {.rule = "a malformed integer",
     .head = "*8\r\n:1\r\n:4x\r\n:0\r\n:1000000000\r\n$1\r\n4\r\n:" TS "\r\n:" TS "\r\n",
     .want = HIRATE_EPROTO, .drops = 1, .says = MALFORMED ": malformed integer"},
    {.rule = "allowed is neither 0 nor 1",
     .head = "*8\r\n:2\r\n:4\r\n:0\r\n:1000000000\r\n$1\r\n4\r\n:" TS "\r\n:" TS "\r\n",
     .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": the script's reply has a value out of range"},
    {.rule = "more remaining than the capacity",
     .head = "*8\r\n:1\r\n:6\r\n:0\r\n:1000000000\r\n$1\r\n6\r\n:" TS "\r\n:" TS "\r\n",
     .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": the script's reply has a value out of range"},
    {.rule = "a negative time",
     .head = "*8\r\n:1\r\n:4\r\n:0\r\n:1000000000\r\n$1\r\n4\r\n:-1\r\n:" TS "\r\n",
     .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": the script's reply has a value out of range"},
    {.rule = "the reply of another key", .key = "rl:other", .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": the reply is for another key"},
    {.rule = "the reply of a key that only starts the same", .key = "rl:k2",
     .want = HIRATE_EPROTO, .drops = 1, .says = MALFORMED ": the reply is for another key"},
    {.rule = "an unknown type byte", .raw = "!3\r\nfoo\r\n", .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": unknown reply type"},
    {.rule = "an unknown type byte inside the array", .raw = "*8\r\n:1\r\n?4\r\n",
     .want = HIRATE_EPROTO, .drops = 1, .says = MALFORMED ": unknown reply type"},
    {.rule = "a RESP3 map", .raw = "%1\r\n+a\r\n:1\r\n", .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": unknown reply type"},
    {.rule = "a bulk string not ended by CRLF", .raw = "$3\r\nabcXY", .want = HIRATE_EPROTO,
     .drops = 1, .says = MALFORMED ": bulk string not terminated by CRLF"},
    {.rule = "CR without LF", .raw = "+OK\rX\n", .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": CR without LF"},
    {.rule = "bytes after the reply", .tail = "+OK\r\n", .want = HIRATE_EPROTO, .drops = 1,
     .says = MALFORMED ": bytes after the reply"},

    {.rule = "closed before replying", .raw = "", .cut = -1, .want = HIRATE_EIO, .drops = 1,
     .says = "Redis closed the connection"},
    {.rule = "closed mid-reply", .cut = 40, .want = HIRATE_EIO, .drops = 1,
     .says = "Redis closed the connection"},
    {.rule = "closed mid-bulk", .raw = "*8\r\n:1\r\n:4\r\n$4000\r\nxx", .cut = 21,
     .want = HIRATE_EIO, .drops = 1, .says = "Redis closed the connection"},
    {.rule = "half a reply, then silence past the timeout", .piece = 50, .gap_ms = 300,
     .want = HIRATE_ETIMEDOUT, .drops = 1},
    {.rule = "no reply at all", .silent = 1, .want = HIRATE_ETIMEDOUT, .drops = 1,
     .says = "no reply from Redis within 200 ms"},

    {.rule = "LOADING", .raw = "-LOADING Redis is loading the dataset in memory\r\n",
     .want = HIRATE_ESERVER, .drops = 1, .says = "Redis replied: LOADING"},
    {.rule = "MASTERDOWN", .raw = "-MASTERDOWN Link with MASTER is down\r\n",
     .want = HIRATE_ESERVER, .drops = 1, .says = "Redis replied: MASTERDOWN"},
    {.rule = "TRYAGAIN", .raw = "-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
     .want = HIRATE_ESERVER, .says = "Redis replied: TRYAGAIN"},
    {.rule = "CLUSTERDOWN", .raw = "-CLUSTERDOWN The cluster is down\r\n",
     .want = HIRATE_ESERVER, .says = "Redis replied: CLUSTERDOWN"},
    {.rule = "MISCONF", .raw = "-MISCONF Redis is configured to save RDB snapshots\r\n",
     .want = HIRATE_ESERVER, .says = "Redis replied: MISCONF"},
    {.rule = "NOREPLICAS", .raw = "-NOREPLICAS Not enough good replicas to write.\r\n",
     .want = HIRATE_ESERVER, .says = "Redis replied: NOREPLICAS"},
};
enum { NCASES = sizeof cases / sizeof cases[0], GOOD = 0 };

/* Error replies that are configuration errors: returned, connection kept. */
static mcase returned_cases[] = {
    {.rule = "an ERR reply", .raw = "-ERR unknown command 'EVALSHA'\r\n",
     .want = HIRATE_EREPLY, .returned = 1, .says = "Redis replied: ERR unknown command"},
    {.rule = "a cluster's redirection on a redis:// URL names the cluster URL",
     .raw = "-MOVED 3999 127.0.0.1:6381\r\n", .want = HIRATE_EREPLY, .returned = 1,
     .says = "the server is a Redis Cluster node (use a redis+cluster:// URL); it replied: "
             "MOVED 3999 127.0.0.1:6381"},
    {.rule = "an ASK on a redis:// URL too", .raw = "-ASK 3999 127.0.0.1:6381\r\n",
     .want = HIRATE_EREPLY, .returned = 1,
     .says = "the server is a Redis Cluster node (use a redis+cluster:// URL); it replied: ASK"},
    {.rule = "NOSCRIPT after EVAL too", .raw = "-NOSCRIPT No matching script. Please use EVAL.\r\n",
     .want = HIRATE_EREPLY, .returned = 1, .says = "Redis replied: NOSCRIPT"},
    {.rule = "NOPERM",
     .raw = "-NOPERM this user has no permissions to run the 'evalsha' command\r\n",
     .want = HIRATE_ENOPERM, .returned = 1, .says = "Redis replied: NOPERM"},
};

/* ---- the server's side -------------------------------------------------------------- */

/* The C client reads into a buffer of HIRATE_PROTO_MAX_REPLY bytes: replies
 * of 128 bytes (GOOD_HEAD, and a key of 47 bytes with its header) fill it
 * exactly 32 times over. */
enum { FILL_REPLY_LEN = 128, FILL_REPLIES = HIRATE_PROTO_MAX_REPLY / FILL_REPLY_LEN };
#define FILL_KEY "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"   /* 44 bytes, 47 with "rl:" */
_Static_assert(sizeof GOOD_HEAD - 1 + sizeof "$47\r\n" - 1 + 3 + sizeof FILL_KEY - 1 + 2 ==
               FILL_REPLY_LEN, "a reply of FILL_REPLY_LEN bytes");
_Static_assert(HIRATE_PROTO_MAX_REPLY % FILL_REPLY_LEN == 0, "whole replies fill the buffer");

enum { MODE_CASE, MODE_TRICKLE, MODE_FILL, MODE_NOSCRIPT_TAIL };
static struct {
    int mode;
    const mcase *c;          /* the case MODE_CASE plays */
    int trickle_ms;          /* MODE_TRICKLE: each reply but the first this long after the last */
    int replies;             /* MODE_TRICKLE: replies sent so far */
} play;                      /* set by the test between calls; read by the server thread */

static const mcase *playing(int *mode, int *trickle_ms)
{
    *mode = __atomic_load_n(&play.mode, __ATOMIC_ACQUIRE);
    *trickle_ms = __atomic_load_n(&play.trickle_ms, __ATOMIC_ACQUIRE);
    return __atomic_load_n(&play.c, __ATOMIC_ACQUIRE);
}

static void set_case(const mcase *c)
{
    __atomic_store_n(&play.mode, MODE_CASE, __ATOMIC_RELEASE);
    __atomic_store_n(&play.c, c, __ATOMIC_RELEASE);
}

/* The script's reply with `head`, echoing `key`, then `tail`. */
static size_t script_reply(char *buf, size_t cap, const char *head, const char *key, size_t keylen,
                           const char *tail)
{
    int n = snprintf(buf, cap, "%s$%zu\r\n%.*s\r\n%s", head, keylen, (int)keylen, key,
                     tail ? tail : "");
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* Commands between two readings other than the handshakes' PINGs: each
 * connection the server accepted sent exactly one. */
static uint64_t calls(const mock_stats *m0, const mock_stats *m1)
{
    return (m1->commands - m0->commands) - (m1->accepted - m0->accepted);
}

static void handler(void *arg, const mock_cmd *cmd, mock_reply *r)
{
    static char buf[2048];   /* the server thread's own; valid until the next command */
    (void)arg;
    /* A new connection's handshake: its PING proves the server is Redis. */
    if (cmd->argc == 1 && cmd->lens[0] == 4 && memcmp(cmd->argv[0], "PING", 4) == 0) {
        mock_send_str(r, "+PONG\r\n");
        return;
    }
    int mode, trickle_ms;
    const mcase *c = playing(&mode, &trickle_ms);
    /* EVALSHA sha 1 key ... and EVAL script 1 key ...: the key is the fourth. */
    const char *key = cmd->argc > 3 ? cmd->argv[3] : "";
    size_t keylen = cmd->argc > 3 ? cmd->lens[3] : 0;
    if (mode == MODE_FILL) {
        /* The first FILL_REPLIES replies in one write, the rest one by one. */
        static char fill[FILL_REPLIES * FILL_REPLY_LEN + 1];
        static size_t filled;
        int i = __atomic_fetch_add(&play.replies, 1, __ATOMIC_ACQ_REL);
        if (i == 0) filled = 0;
        if (i >= FILL_REPLIES) {
            mock_send(r, buf, script_reply(buf, sizeof buf, GOOD_HEAD, key, keylen, NULL));
            return;
        }
        filled += script_reply(fill + filled, sizeof fill - filled, GOOD_HEAD, key, keylen, NULL);
        if (i == FILL_REPLIES - 1) mock_send(r, fill, filled);
        return;
    }
    if (mode == MODE_NOSCRIPT_TAIL) {
        /* EVALSHA of the first key: answered; of the second: NOSCRIPT; its
         * EVAL: answered, then bytes nobody asked for. */
        if (cmd->argc > 0 && cmd->lens[0] == 4) {
            mock_send(r, buf, script_reply(buf, sizeof buf, GOOD_HEAD, key, keylen, "+junk\r\n"));
        } else if (keylen && key[keylen - 1] == '1') {
            mock_send_str(r, "-NOSCRIPT No matching script. Please use EVAL.\r\n");
        } else {
            mock_send(r, buf, script_reply(buf, sizeof buf, GOOD_HEAD, key, keylen, NULL));
        }
        return;
    }
    if (mode == MODE_TRICKLE) {
        if (__atomic_fetch_add(&play.replies, 1, __ATOMIC_ACQ_REL) > 0) mock_pause(r, trickle_ms);
        mock_send(r, buf, script_reply(buf, sizeof buf, GOOD_HEAD, key, keylen, NULL));
        return;
    }
    if (c->silent) return;
    const char *bytes = buf;
    size_t len;
    if (c->raw) {
        bytes = c->raw;
        len = c->rawlen ? c->rawlen : strlen(c->raw);
    } else if (c->key) {
        len = script_reply(buf, sizeof buf, c->head ? c->head : GOOD_HEAD, c->key, strlen(c->key),
                           c->tail);
    } else {
        len = script_reply(buf, sizeof buf, c->head ? c->head : GOOD_HEAD, key, keylen, c->tail);
    }
    if (c->cut) {
        mock_send(r, bytes, c->cut < 0 ? 0 : (size_t)c->cut < len ? (size_t)c->cut : len);
        mock_close(r);
        return;
    }
    if (!c->piece) {
        mock_send(r, bytes, len);
        return;
    }
    for (size_t off = 0; off < len; off += (size_t)c->piece) {
        if (off && c->gap_ms) mock_pause(r, c->gap_ms);
        mock_send(r, bytes + off, len - off < (size_t)c->piece ? len - off : (size_t)c->piece);
    }
}

/* ---- the client's side -------------------------------------------------------------- */

static mock_server *M;

/* VmHWM (peak resident) and VmPeak (peak virtual) of this process, in kB. */
static void memory_peaks(long *hwm_kb, long *peak_kb)
{
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");
    *hwm_kb = *peak_kb = -1;
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmHWM:", 6) == 0) *hwm_kb = strtol(line + 6, NULL, 10);
        if (strncmp(line, "VmPeak:", 7) == 0) *peak_kb = strtol(line + 7, NULL, 10);
    }
    if (f) fclose(f);
}

/* Waits up to a second for the server to see `want` more closed connections. */
static int closes_seen(const mock_stats *before, uint64_t want)
{
    mock_stats now;
    for (int64_t t0 = mono_us(); mono_us() - t0 < SECOND; sleep_ms(2)) {
        mock_get_stats(M, &now);
        if (now.client_closes + now.server_closes - before->client_closes - before->server_closes >=
            want)
            return 1;
    }
    return 0;
}

static fcfg mock_cfg(int policy)
{
    /* backoff 30 ms, so that recovery is quick to see in every case */
    return (fcfg){.url = mock_url(M), .capacity = 5, .on_error = policy, .timeout_ms = TIMEOUT_MS,
                  .backoff_min_ms = 30, .backoff_max_ms = 30};
}

/* One case under one policy; the number of failed checks. */
static int run_case(const mcase *c, int policy)
{
    int failed0 = check_failed_;
    char what[160];
    snprintf(what, sizeof what, "%s", c->rule);
    fcfg cfg = mock_cfg(policy);
    hirate_limiter *lim = fault_limiter(cfg);
    if (!lim) return 1;
    fexpect e = fault_expect(cfg);
    hirate_decision d;
    int64_t dt;
    mock_stats m0, m1;
    mock_get_stats(M, &m0);
    set_case(c);

    int rc = timed_allow(lim, "k", 1, &d, &dt);
    hirate_counters st = fault_stats(lim);
    if (c->want == 0) {
        CHECK(redis_decided(rc, &d, 1, 4, what));
        CHECK_EQ_I64(d.time_us, 1700000000000000LL);
    } else if (c->returned) {
        if (rc != c->want)
            fprintf(stderr, "  %s, on_error %s: returned %s\n", what, hirate_on_error_name(policy),
                    hirate_err_name(rc));
        CHECK_EQ_I64(rc, c->want);
        CHECK_EQ_I64(st.policy, 0);
    } else {
        CHECK(policy_decided(&e, rc, &d, 1, c->want, what));
        CHECK_EQ_I64(st.breaker_opens, 1);
    }
    if (c->says && strncmp(fault_errmsg(lim), c->says, strlen(c->says)) != 0) {
        fprintf(stderr, "  %s: the message is \"%s\", not \"%s...\"\n", what, fault_errmsg(lim),
                c->says);
        CHECK(!"the message names the problem");
    }
    CHECK(dt <= fault_bound_us(cfg));
    /* Malformed, cut or silent: the stream is out of step, the connection
     * closed. An error reply leaves it in step: kept. */
    CHECK_EQ_I64(st.conns_dropped, c->drops);
    if (c->drops && !c->cut) CHECK(closes_seen(&m0, 1));
    mock_get_stats(M, &m1);
    CHECK_EQ_I64(m1.accepted - m0.accepted, 1);
    /* NOSCRIPT is answered once with EVAL; a second NOSCRIPT ends it. */
    CHECK_EQ_I64(calls(&m0, &m1), strstr(c->rule, "NOSCRIPT") ? 2 : 1);

    if (c->want && !c->returned) {
        /* The breaker keeps the next calls away from the broken server. */
        int bad = 0;
        for (int i = 0; i < 20; i++) {
            rc = timed_allow(lim, "k", 1, &d, &dt);
            bad += !policy_decided(&e, rc, &d, 1, c->want, what);
        }
        CHECK_EQ_I64(bad, 0);
        mock_get_stats(M, &m1);
        CHECK(calls(&m0, &m1) <= 2);   /* a probe or so, if the machine is slow */
        CHECK(fault_stats(lim).connects <= 2);
        /* The server answers properly again: Redis decides, from the next probe on. */
        set_case(&cases[GOOD]);
        double back = wait_for_redis(lim, "probe", 2000);
        CHECK(back >= 0 && back <= (double)e.max_wait_us / MS + SLACK_MS);
        CHECK(redis_decided(timed_allow(lim, "k", 1, &d, &dt), &d, 1, 4, "after the fault"));
    } else if (c->returned) {
        /* Returned every time, never the policy: the next call asks again. */
        rc = timed_allow(lim, "k", 1, &d, &dt);
        CHECK_EQ_I64(rc, c->want);
        CHECK_EQ_I64(fault_stats(lim).connects, 1);
        CHECK_EQ_I64(fault_stats(lim).breaker_opens, 0);
    }
    hirate_limiter_free(lim);
    set_case(&cases[GOOD]);
    return check_failed_ - failed0;
}

static void test_malformed_replies_are_failures_that_drop_the_connection(void)
{
    ON_ERROR_EACH(p) {
        for (int i = 0; i < NCASES; i++) {
            if (run_case(&cases[i], p))
                fprintf(stderr, "  ^ case \"%s\", on_error %s\n", cases[i].rule,
                        hirate_on_error_name(p));
        }
    }
}

static void test_other_error_replies_are_returned(void)
{
    ON_ERROR_EACH(p) {
        for (size_t i = 0; i < sizeof returned_cases / sizeof returned_cases[0]; i++) {
            if (strstr(returned_cases[i].rule, "NOSCRIPT")) continue;   /* the next test */
            if (run_case(&returned_cases[i], p))
                fprintf(stderr, "  ^ case \"%s\", on_error %s\n", returned_cases[i].rule,
                        hirate_on_error_name(p));
        }
    }
}

/* NOSCRIPT makes the limiter send the call once more, as EVAL; NOSCRIPT to
 * that is an error reply like any other, returned, never a loop. */
static void test_noscript_after_eval_is_returned_not_looped(void)
{
    for (size_t i = 0; i < sizeof returned_cases / sizeof returned_cases[0]; i++) {
        if (!strstr(returned_cases[i].rule, "NOSCRIPT")) continue;
        ON_ERROR_EACH(p) {
            mock_stats m0, m1;
            mock_get_stats(M, &m0);
            CHECK_EQ_I64(run_case(&returned_cases[i], p), 0);
            mock_get_stats(M, &m1);
            CHECK_EQ_I64(calls(&m0, &m1), 4);   /* EVALSHA, EVAL; twice */
        }
    }
}

/* A batch is one round trip, and the whole of it must end within the
 * timeout (docs/semantics.md, "Batches"): replies that each come a little
 * before the timeout must not stretch the call to a timeout per reply. */
static void test_a_trickled_batch_is_bounded_by_one_timeout(void)
{
    enum { N = 8, GAP_MS = 120 };
    ON_ERROR_EACH(p) {
        fcfg cfg = mock_cfg(p);
        hirate_limiter *lim = fault_limiter(cfg);
        if (!lim) continue;
        hirate_item items[N];
        static const char *const keys[N] = {"t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"};
        for (int i = 0; i < N; i++) items[i] = (hirate_item){keys[i], 2, 1, 12345, {0}};
        __atomic_store_n(&play.trickle_ms, GAP_MS, __ATOMIC_RELEASE);
        __atomic_store_n(&play.replies, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&play.mode, MODE_TRICKLE, __ATOMIC_RELEASE);
        int64_t t0 = mono_us();
        CHECK_EQ_I64(hirate_allow_many(lim, items, N), 0);
        int64_t dt = mono_us() - t0;
        set_case(&cases[GOOD]);
        int answered = 0, bad = 0;
        for (int i = 0; i < N; i++) {
            fexpect e = fault_expect(cfg);
            int from_redis = items[i].rc == 0 && items[i].decision.source == HIRATE_SOURCE_REDIS;
            answered += from_redis;
            /* Reply i comes i * 120 ms after the request: the first is in
             * time, and Redis' decision is kept; from the fourth (360 ms)
             * on, none can be. The second and third depend on the machine. */
            if (i == 0 || (i < 3 && from_redis))
                bad += !redis_decided(items[i].rc, &items[i].decision, 1, 4, "a trickled batch");
            else
                bad += !policy_decided(&e, items[i].rc, &items[i].decision, 1, HIRATE_ETIMEDOUT,
                                       "a trickled batch");
        }
        printf("  a batch of %d replies %d ms apart, timeout %d ms, on_error %s: %.1f ms, "
               "%d answered by the server\n", N, GAP_MS, TIMEOUT_MS, hirate_on_error_name(p),
               (double)dt / MS, answered);
        CHECK_EQ_I64(bad, 0);
        CHECK(answered >= 1 && answered <= 3);
        CHECK(dt <= (TIMEOUT_MS + SLACK_MS) * MS);
        CHECK_EQ_I64(fault_stats(lim).conns_dropped, 1);
        hirate_limiter_free(lim);
        sleep_ms(N * GAP_MS);   /* let the server finish the trickle it started */
    }
}

/* When the replies read so far fill the client's buffer exactly, the next
 * read must start in an empty buffer, not ask for zero bytes (which reads as
 * the server closing the connection). */
static void test_replies_that_fill_the_read_buffer_exactly(void)
{
    enum { N = FILL_REPLIES + 8 };
    hirate_item items[N];
    fcfg cfg = mock_cfg(HIRATE_ON_ERROR_CLOSED);
    hirate_limiter *lim = fault_limiter(cfg);
    if (!lim) return;
    for (int i = 0; i < N; i++)
        items[i] = (hirate_item){FILL_KEY, sizeof FILL_KEY - 1, 1, 12345, {0}};
    __atomic_store_n(&play.replies, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&play.mode, MODE_FILL, __ATOMIC_RELEASE);
    CHECK_EQ_I64(hirate_allow_many(lim, items, N), 0);
    set_case(&cases[GOOD]);
    int bad = 0;
    for (int i = 0; i < N; i++)
        if (!redis_decided(items[i].rc, &items[i].decision, 1, 4, "replies filling the buffer") &&
            bad++ == 0)
            fprintf(stderr, "  item %d of %d: %s\n", i, N, fault_errmsg(lim));
    CHECK_EQ_I64(bad, 0);
    CHECK_EQ_I64(fault_stats(lim).conns_dropped, 0);
    hirate_limiter_free(lim);
}

/* A batch whose second call met NOSCRIPT and whose EVAL reply came with
 * bytes after it: that stream is out of step, so the EVAL'd call goes to the
 * policy, but the first call, answered in the first round trip, which ended
 * in step, keeps Redis' decision. */
static void test_a_broken_eval_pass_keeps_the_first_pass_answers(void)
{
    ON_ERROR_EACH(p) {
        fcfg cfg = mock_cfg(p);
        hirate_limiter *lim = fault_limiter(cfg);
        if (!lim) continue;
        fexpect e = fault_expect(cfg);
        hirate_item items[2] = {{"n0", 2, 1, 12345, {0}}, {"n1", 2, 1, 12345, {0}}};
        __atomic_store_n(&play.mode, MODE_NOSCRIPT_TAIL, __ATOMIC_RELEASE);
        CHECK_EQ_I64(hirate_allow_many(lim, items, 2), 0);
        set_case(&cases[GOOD]);
        CHECK(redis_decided(items[0].rc, &items[0].decision, 1, 4, "answered before NOSCRIPT"));
        CHECK(policy_decided(&e, items[1].rc, &items[1].decision, 1, HIRATE_EPROTO,
                             "an EVAL reply with bytes after it"));
        CHECK_EQ_I64(fault_stats(lim).eval, 1);
        CHECK_EQ_I64(fault_stats(lim).conns_dropped, 1);
        hirate_limiter_free(lim);
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (size_t i = 0; i + 4 <= sizeof deep - 1; i += 4) memcpy(deep + i, "*1\r\n", 4);
    longline[0] = '+';
    memset(longline + 1, 'a', sizeof longline - 2);
    if (mock_start(&M, handler, NULL) != 0) {
        CHECK(!"the mock server must start");
        return check_summary("test_faults_mock");
    }
    set_case(&cases[GOOD]);
    printf("mock RESP server on port %d\n", mock_port(M));

    /* Memory is measured from after a first round trip, which settles the
     * allocations a first call makes (pool, thread arenas). */
    CHECK_EQ_I64(run_case(&cases[GOOD], HIRATE_ON_ERROR_LOCAL), 0);
    long hwm0, peak0, hwm1, peak1;
    memory_peaks(&hwm0, &peak0);

    test_malformed_replies_are_failures_that_drop_the_connection();
    test_other_error_replies_are_returned();
    test_noscript_after_eval_is_returned_not_looped();
    test_a_trickled_batch_is_bounded_by_one_timeout();
    test_replies_that_fill_the_read_buffer_exactly();
    test_a_broken_eval_pass_keeps_the_first_pass_answers();

    memory_peaks(&hwm1, &peak1);
    printf("  memory: peak resident %ld -> %ld kB, peak virtual %ld -> %ld kB\n", hwm0, hwm1,
           peak0, peak1);
    /* Believing one absurd length would cost gigabytes: 16 GiB of pointers
     * for *2147483647, a terabyte for $999999999999. */
    CHECK(hwm0 > 0 && hwm1 - hwm0 < 32 * 1024);
    CHECK(peak0 > 0 && peak1 - peak0 < 1024 * 1024);
    mock_stop(M);
    return check_summary("test_faults_mock");
}
