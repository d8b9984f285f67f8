/*
 * TLS and misconfiguration, end to end: hirate_allow, hirate_allow_many and
 * hirate_reset against real redis-servers with TLS ports (certificates made
 * by tests/support/make_certs.sh at the start), and the scripted server for
 * what a real one will not send.
 *
 *   rule                                                   code
 *   ------------------------------------------------------ ----------------
 *   rediss:// with the right CA: exactly the capacity      none: Redis decides
 *   mutual TLS with a client certificate                   none
 *   mutual TLS without one                                 ETLS, returned
 *   a certificate for another host, expired, self-signed,  ETLS, returned
 *     or signed by a CA the client does not trust
 *   redis:// to a TLS port; rediss:// to a plain port      ETLS, returned
 *   a TLS option with a redis:// or unix:// URL            EOPTION at hirate_limiter_new
 *   a CA file, CA dir, certificate or key that cannot be   ETLS at hirate_limiter_new,
 *     read, or is not what it should be                      naming the file
 *   a client certificate without its key, or the reverse   EOPTION at hirate_limiter_new
 *   maxclients reached                                     EREFUSED, returned
 *   maxclients reached on a TLS port (Redis closes the     EIO: an outage, the policy
 *     handshake without a word)                              decides
 *   protected mode (DENIED), from a non-loopback address   EREFUSED, returned
 *   an ACL user who may run the script but not its         ENOPERM, returned
 *     commands (+evalsha +eval +time ~rl:* only)
 *   a server that is not Redis (SSH, HTTP)                 ENOTREDIS, returned
 *   allow_many with one key outside the user's ACL keys    that item ENOPERM; the
 *                                                            others as Redis holds them
 *
 * "Returned" means the call's own return value under every policy (local,
 * open, closed): no policy decides, the breaker never opens, the message
 * names the problem without the password, each call ends within its
 * connect timeout (and the mismatch probe's), and the reconnect backoff keeps
 * the connection attempts few. The shared vectors over TLS are test_vectors
 * with HIRATE_TEST_TLS=1 (tls.cmake); the fault spot checks over TLS are
 * test_faults_tls.c.
 */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "check.h"
#include "hirate.h"
#include "hirate_io.h"
#include "mock_server.h"
#include "redis_harness.h"
#include "test_time.h"

#define CANARY "s3cr3t-canary"
#define MS 1000LL
/* A token takes 1000 s to come back: within a test every value is exact. */
#define RATE 0.001
/* Scheduling slack on top of a timeout: the machine is shared, and the ASan
 * build is several times slower. A hang would exceed it by seconds. */
enum { SLACK_MS = 250 };
/* The connect timeout of the failing cases: short enough that a call which
 * waited for it (instead of failing at once) shows. */
enum { BAD_CONNECT_MS = 500 };

static char CERTS[300];   /* make_certs.sh's files, shared by every server here */
static rh_server TLS;     /* server.crt (localhost, 127.0.0.1, ::1), no client certificate */

#define ON_ERROR_EACH(p) for (int p = HIRATE_ON_ERROR_LOCAL; p <= HIRATE_ON_ERROR_CLOSED; p++)

/* ---- helpers ------------------------------------------------------------------------ */

typedef struct tcfg {
    const char *url;
    int on_error;
    int64_t capacity;          /* 0: 10 */
    const char *ca;            /* tls_ca_file */
    const char *cert, *key;    /* tls_cert_file, tls_key_file */
    const char *server_name;
    int no_verify;
    int connect_timeout_ms;    /* 0: 2000 (a working connection must not fail on a busy machine) */
    const char *prefix;
} tcfg;

static const char *cert(const char *name)
{
    static char paths[8][400];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", CERTS, name);
    return p;
}

static hirate_limiter *make(tcfg c)
{
    hirate_options o;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE] = "";
    hirate_options_init(&o);
    o.url = c.url;
    o.capacity = c.capacity ? c.capacity : 10;
    o.rate = RATE;
    o.on_error = c.on_error;
    o.connect_timeout_ms = c.connect_timeout_ms ? c.connect_timeout_ms : 2000;
    o.timeout_ms = 2000;
    if (c.prefix) o.prefix = c.prefix;
    o.tls_ca_file = c.ca;
    o.tls_cert_file = c.cert;
    o.tls_key_file = c.key;
    o.tls_server_name = c.server_name;
    if (c.no_verify) o.tls_verify = 0;
    o.deny_cache = 0;   /* every decision asks the server */
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

/* The message names a problem, and never the password. */
static int errmsg_is_clean(hirate_limiter *lim)
{
    const char *m = errmsg(lim);
    if (strstr(m, "s3cr3t") || strstr(m, "canary")) {
        fprintf(stderr, "  the password leaked: \"%s\"\n", m);
        return 0;
    }
    return m[0] != '\0';
}

static hirate_counters counters(hirate_limiter *lim)
{
    hirate_counters c;
    memset(&c, 0, sizeof c);
    hirate_counters_get(lim, &c);
    return c;
}

static int timed_allow(hirate_limiter *lim, const char *key, int64_t cost, hirate_decision *d,
                       int64_t *took_us)
{
    memset(d, 0, sizeof *d);
    int64_t t0 = mono_us();
    int rc = hirate_allow(lim, key, strlen(key), cost, d);
    *took_us = mono_us() - t0;
    return rc;
}

static int redis_decided(int rc, const hirate_decision *d, int allowed, int64_t remaining,
                         const char *what)
{
    int ok = rc == 0 && d->source == HIRATE_SOURCE_REDIS && d->error == 0 &&
             d->allowed == allowed && d->remaining == remaining;
    if (!ok)
        fprintf(stderr, "  %s: rc %s, source %s, error %s, allowed %d, remaining %" PRId64
                " (wanted redis, allowed %d, remaining %" PRId64 ")\n", what, hirate_err_name(rc),
                hirate_source_name(d->source), hirate_err_name(d->error), d->allowed,
                d->remaining, allowed, remaining);
    return ok;
}

static int reply_is(redisReply *r, const char *status)
{
    int ok = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, status) == 0;
    if (!ok) fprintf(stderr, "  reply: %s\n", r && r->str ? r->str : "(none)");
    if (r) freeReplyObject(r);
    return ok;
}

static long long int_reply(redisReply *r)
{
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -999999;
    if (r) freeReplyObject(r);
    return v;
}

/* How many connections the reconnect backoff lets a limiter try in ms after
 * its first attempt: it waits at least 7.5 ms (10 ms less 25%), doubling up
 * to 750 ms (1 s less 25%); one more for a retry that had just begun. */
static int64_t backoff_attempts_max(int64_t ms)
{
    int64_t n = 1;
    for (double t = 0, wait = 7.5; t + wait <= (double)ms; wait = wait * 2 > 750 ? 750 : wait * 2) {
        t += wait;
        n++;
    }
    return n + 1;
}

/* How often the endpoint's "host:port" is in the message: once at most. */
static int where_count(hirate_limiter *lim, const char *msg)
{
    hirate_endpoint ep;
    int n = 0;
    if (hirate_endpoint_get(lim, &ep) != 0) return 0;
    for (const char *p = msg; (p = strstr(p, ep.where)) != NULL; p += strlen(ep.where)) n++;
    return n;
}

/*
 * A misconfiguration, under every policy: 20 calls 5 ms apart, then a batch
 * and a reset, each returning `want`; no policy decision and no breaker;
 * every call within connect_timeout (+ the probe's timeout when `probe`) and
 * the slack; the reconnect backoff (10 ms doubling, +-25%) keeps the
 * connection attempts to what it allows in the time the calls took (for 20
 * quick calls, 5 or fewer), counted by the limiter and, when `srv` is given,
 * bounded by what the server saw (twice as many at most: a probe is a second
 * connection; a TLS connection whose handshake failed is not counted there).
 * The message names the server once.
 */
static void returned_under_every_policy(const char *what, tcfg base, rh_server *srv, int want,
                                        int probe, const char *must_mention)
{
    ON_ERROR_EACH(p) {
        tcfg c = base;
        c.on_error = p;
        c.connect_timeout_ms = BAD_CONNECT_MS;
        hirate_limiter *lim = make(c);
        if (!lim) continue;
        /* Over TLS the probe's time is carved out of the connect timeout. */
        hirate_endpoint ep;
        CHECK_EQ_I64(hirate_endpoint_get(lim, &ep), 0);
        int64_t bound = (int64_t)(BAD_CONNECT_MS + SLACK_MS +
                                  (probe && !ep.tls ? ep.probe_timeout_ms : 0)) * MS;
        long long conns0 = srv ? rh_info_int(srv, "total_connections_received") : 0;
        int bad = 0, unclean = 0, mentions = 0, twice = 0;
        int64_t dt, worst = 0, t0 = mono_us();
        hirate_decision d;
        for (int k = 0; k < 20; k++) {
            int rc = timed_allow(lim, "k", 1, &d, &dt);
            if (rc != want && !bad)
                fprintf(stderr, "  %s, on_error %s, call %d: %s, wanted %s (source %s, error %s; "
                        "%s)\n", what, hirate_on_error_name(p), k, hirate_err_name(rc),
                        hirate_err_name(want), hirate_source_name(d.source),
                        hirate_err_name(d.error), errmsg(lim));
            bad += rc != want;
            unclean += !errmsg_is_clean(lim);
            mentions += !must_mention || strstr(errmsg(lim), must_mention) != NULL;
            twice += where_count(lim, errmsg(lim)) > 1;
            if (dt > worst) worst = dt;
            sleep_ms(5);
        }
        hirate_item items[2] = {{"a", 1, 1, 0, {0}}, {"b", 1, 0, 0, {0}}};
        CHECK_EQ_I64(hirate_allow_many(lim, items, 2), 0);
        CHECK_EQ_I64(items[0].rc, want);
        CHECK_EQ_I64(items[1].rc, want);
        CHECK_EQ_I64(hirate_reset(lim, "k", 1), want);
        unclean += !errmsg_is_clean(lim);
        int64_t took_ms = (mono_us() - t0) / MS;
        hirate_counters st = counters(lim);
        long long conns = srv ? rh_info_int(srv, "total_connections_received") - conns0 - 1 : 0;
        printf("  %s, on_error %s: %s in at most %.1f ms, %" PRIu64 " connection attempts in "
               "%" PRId64 " ms (the server saw %lld): %s\n", what, hirate_on_error_name(p),
               hirate_err_name(want), (double)worst / MS, st.connects, took_ms, conns, errmsg(lim));
        if (twice) fprintf(stderr, "  %s: the message names the server twice\n", what);
        CHECK_EQ_I64(twice, 0);
        CHECK_EQ_I64(bad, 0);
        CHECK_EQ_I64(unclean, 0);
        if (must_mention && mentions != 20)
            fprintf(stderr, "  %s: the message does not mention \"%s\"\n", what, must_mention);
        CHECK_EQ_I64(mentions, 20);
        CHECK(worst <= bound);
        CHECK_EQ_I64(st.policy, 0);
        CHECK_EQ_I64(st.breaker_opens, 0);
        CHECK(st.connects >= 1 && (int64_t)st.connects <= backoff_attempts_max(took_ms));
        CHECK(st.connects < 20);
        if (srv) CHECK(conns >= 0 && conns <= 2 * (long long)st.connects);
        hirate_limiter_free(lim);
    }
}

/* ---- TLS that works ----------------------------------------------------------------- */

static void test_exactly_the_capacity_over_tls(void)
{
    enum { CAP = 5 };
    hirate_limiter *lim = make((tcfg){.url = TLS.url, .ca = TLS.ca_file, .capacity = CAP,
                                      .prefix = "cap:", .on_error = HIRATE_ON_ERROR_OPEN});
    if (!lim) return;
    hirate_decision d;
    int64_t dt;
    char what[32];
    for (int i = 1; i <= CAP; i++) {
        snprintf(what, sizeof what, "allow %d of %d", i, CAP);
        CHECK(redis_decided(timed_allow(lim, "k", 1, &d, &dt), &d, 1, CAP - i, what));
    }
    CHECK(redis_decided(timed_allow(lim, "k", 1, &d, &dt), &d, 0, 0, "one past the capacity"));
    CHECK(d.retry_after_us > 990 * 1000 * MS && d.retry_after_us <= 1000 * 1000 * MS);
    /* The bucket is in the TLS server, drained: less than a token (the
     * refill of the moments between the calls). */
    redisReply *r = rh_command(&TLS, "GET cap:k");
    double left = -1;
    CHECK(r && r->type == REDIS_REPLY_STRING && sscanf(r->str, "%lf", &left) == 1);
    CHECK(left >= 0 && left < 1);
    if (r) freeReplyObject(r);
    /* One connection carried it all. */
    hirate_counters st = counters(lim);
    CHECK_EQ_I64(st.connects, 1);
    CHECK_EQ_I64(st.policy, 0);
    CHECK_EQ_I64(st.conns_dropped, 0);
    hirate_limiter_free(lim);

    /* The address instead of the name: 127.0.0.1 is in the certificate too. */
    char url[128];
    snprintf(url, sizeof url, "rediss://127.0.0.1:%d", TLS.tls_port);
    lim = make((tcfg){.url = url, .ca = TLS.ca_file, .capacity = CAP, .prefix = "cap:"});
    if (!lim) return;
    CHECK(redis_decided(timed_allow(lim, "k", 1, &d, &dt), &d, 0, 0, "127.0.0.1, drained"));
    CHECK(redis_decided(timed_allow(lim, "other", 1, &d, &dt), &d, 1, CAP - 1, "127.0.0.1"));
    hirate_limiter_free(lim);
}

/* Whether key exists in database db (hiredis on the plain port). */
static long long exists_in(rh_server *srv, int db, const char *key)
{
    struct timeval tv = {2, 0};
    long long v = -1;
    redisContext *c = redisConnectWithTimeout("127.0.0.1", srv->port, tv);
    if (c && !c->err) {
        redisReply *r = redisCommand(c, "SELECT %d", db);
        if (r) freeReplyObject(r);
        v = int_reply(redisCommand(c, "EXISTS %s", key));
    }
    if (c) redisFree(c);
    return v;
}

/* AUTH and SELECT travel inside TLS like any command. */
static void test_acl_user_and_db_over_tls(void)
{
    CHECK(reply_is(rh_command(&TLS, "ACL SETUSER tls-ok on >%s ~* &* +@all", CANARY), "OK"));
    char url[256];
    snprintf(url, sizeof url, "rediss://tls-ok:%s@localhost:%d/2", CANARY, TLS.tls_port);
    hirate_limiter *lim = make((tcfg){.url = url, .ca = TLS.ca_file, .prefix = "db:"});
    if (!lim) return;
    hirate_decision d;
    int64_t dt;
    CHECK(redis_decided(timed_allow(lim, "k", 3, &d, &dt), &d, 1, 7, "user and db over TLS"));
    CHECK(errmsg(lim)[0] == '\0' || errmsg_is_clean(lim));
    CHECK_EQ_I64(exists_in(&TLS, 2, "db:k"), 1);
    CHECK_EQ_I64(exists_in(&TLS, 0, "db:k"), 0);
    hirate_limiter_free(lim);
}

static void test_mutual_tls(void)
{
    rh_server m;
    memset(&m, 0, sizeof m);
    m.tls = 1;
    m.tls_auth_clients = 1;
    m.certs_dir = CERTS;
    CHECK_EQ_I64(rh_start(&m), 0);
    if (!m.pid) return;
    hirate_limiter *lim = make((tcfg){.url = m.url, .ca = m.ca_file, .cert = cert("client.crt"),
                                      .key = cert("client.key")});
    if (lim) {
        hirate_decision d;
        int64_t dt;
        CHECK(redis_decided(timed_allow(lim, "k", 1, &d, &dt), &d, 1, 9,
                            "with a client certificate"));
        hirate_limiter_free(lim);
    }
    /* Without one the server ends the handshake with an alert (with TLS 1.3
     * after the client thinks it is done, so on the first read): the TLS
     * library refuses, which is HIRATE_ETLS. */
    returned_under_every_policy("mutual TLS without a client certificate",
                                (tcfg){.url = m.url, .ca = m.ca_file}, &m, HIRATE_ETLS, 0, NULL);
    rh_stop(&m);
}

static void test_server_name_and_no_verify(void)
{
    rh_server w;
    memset(&w, 0, sizeof w);
    w.tls = 1;
    w.tls_cert = "wronghost";
    w.certs_dir = CERTS;
    CHECK_EQ_I64(rh_start(&w), 0);
    if (!w.pid) return;
    hirate_decision d;
    int64_t dt;
    /* The name checked is tls_server_name when given, not the URL's host. */
    hirate_limiter *lim = make((tcfg){.url = w.url, .ca = w.ca_file,
                                      .server_name = "wrong.invalid"});
    if (lim) {
        CHECK(redis_decided(timed_allow(lim, "k", 1, &d, &dt), &d, 1, 9, "tls_server_name"));
        hirate_limiter_free(lim);
    }
    /* tls_verify 0 checks nothing: the wrong host and no CA at all. */
    lim = make((tcfg){.url = w.url, .no_verify = 1});
    if (lim) {
        CHECK(redis_decided(timed_allow(lim, "k", 1, &d, &dt), &d, 1, 8, "tls_verify 0"));
        hirate_limiter_free(lim);
    }
    rh_stop(&w);
}

/* ---- certificates that fail ----------------------------------------------------------- */

static void test_each_bad_certificate_is_etls_under_every_policy(void)
{
    static const struct { const char *rule, *server_cert, *ca; } cases[] = {
        {"a certificate for another host", "wronghost", "ca.crt"},
        {"an expired certificate", "expired", "ca.crt"},
        {"a self-signed certificate", "selfsigned", "ca.crt"},
        {"a certificate of a CA the client does not trust", "server", "other-ca.crt"},
        {"the system's trust store, which does not know the test CA", "server", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rh_server s;
        memset(&s, 0, sizeof s);
        s.tls = 1;
        s.tls_cert = cases[i].server_cert;
        s.certs_dir = CERTS;
        CHECK_EQ_I64(rh_start(&s), 0);
        if (!s.pid) continue;
        char url[256];
        /* A password in the URL: TLS fails before AUTH, and no message shows it. */
        snprintf(url, sizeof url, "rediss://u:%s@localhost:%d", CANARY, s.tls_port);
        returned_under_every_policy(cases[i].rule,
                                    (tcfg){.url = url, .ca = cases[i].ca ? cert(cases[i].ca) : NULL},
                                    &s, HIRATE_ETLS, 0, NULL);
        rh_stop(&s);
    }
}

/* ---- plain and TLS mixed up ------------------------------------------------------------ */

static void test_plain_url_to_a_tls_port_is_etls_under_every_policy(void)
{
    char url[256];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", TLS.tls_port);
    returned_under_every_policy("redis:// to a TLS port", (tcfg){.url = url}, &TLS, HIRATE_ETLS,
                                1, NULL);
}

static void test_tls_url_to_a_plain_port_is_etls_under_every_policy(void)
{
    char url[256];
    snprintf(url, sizeof url, "rediss://localhost:%d", TLS.port);
    returned_under_every_policy("rediss:// to a plain port", (tcfg){.url = url, .ca = TLS.ca_file},
                                &TLS, HIRATE_ETLS, 1, NULL);
}

/* ---- options refused at construction ------------------------------------------------------ */

static int new_rc(hirate_options *o, char *why, size_t cap)
{
    hirate_limiter *lim = (hirate_limiter *)&lim;   /* must become NULL on failure */
    o->capacity = 10;
    o->rate = 1;
    why[0] = '\0';
    int rc = hirate_limiter_new(&lim, o, why, cap);
    if (rc == 0) hirate_limiter_free(lim);
    else CHECK(lim == NULL);
    return rc;
}

static void test_a_tls_option_without_rediss_is_eoption(void)
{
    static const char *const urls[] = {"redis://127.0.0.1:6379", "unix:///tmp/redis.sock"};
    static const char *const names[] = {"tls_ca_file", "tls_ca_dir", "tls_cert_file",
                                        "tls_key_file", "tls_server_name", "tls_verify"};
    for (size_t u = 0; u < 2; u++) {
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            hirate_options o;
            char why[HIRATE_ERRMSG_SIZE];
            hirate_options_init(&o);
            o.url = urls[u];
            switch (i) {
            case 0: o.tls_ca_file = TLS.ca_file; break;
            case 1: o.tls_ca_dir = CERTS; break;
            case 2: o.tls_cert_file = cert("client.crt"); break;
            case 3: o.tls_key_file = cert("client.key"); break;
            case 4: o.tls_server_name = "localhost"; break;
            default: o.tls_verify = 0; break;
            }
            int rc = new_rc(&o, why, sizeof why);
            if (rc != HIRATE_EOPTION || !strstr(why, names[i]))
                fprintf(stderr, "  %s with %s: %s \"%s\"\n", names[i], urls[u], hirate_err_name(rc),
                        why);
            CHECK_EQ_I64(rc, HIRATE_EOPTION);
            CHECK(strstr(why, names[i]) != NULL);
        }
    }
    /* The same options with rediss:// are accepted (no connection is made). */
    hirate_options o;
    char why[HIRATE_ERRMSG_SIZE];
    hirate_options_init(&o);
    o.url = TLS.url;
    o.tls_ca_file = TLS.ca_file;
    o.tls_ca_dir = CERTS;
    o.tls_cert_file = cert("client.crt");
    o.tls_key_file = cert("client.key");
    o.tls_server_name = "localhost";
    CHECK_EQ_I64(new_rc(&o, why, sizeof why), 0);
}

static void test_a_tls_file_that_cannot_serve_is_named_at_construction(void)
{
    char missing[400], missing_dir[400];
    snprintf(missing, sizeof missing, "%s/no-such.pem", CERTS);
    snprintf(missing_dir, sizeof missing_dir, "%s/no-such-dir", CERTS);
    for (int i = 0; i < 4; i++) {
        hirate_options o;
        char why[HIRATE_ERRMSG_SIZE];
        hirate_options_init(&o);
        o.url = TLS.url;
        const char *named = missing;
        switch (i) {
        case 0: o.tls_ca_file = missing; break;
        case 1: o.tls_ca_dir = missing_dir; named = missing_dir; break;
        case 2: o.tls_cert_file = missing; o.tls_key_file = cert("client.key"); break;
        default: o.tls_cert_file = cert("client.crt"); o.tls_key_file = missing; break;
        }
        int rc = new_rc(&o, why, sizeof why);
        if (rc != HIRATE_ETLS || !strstr(why, named))
            fprintf(stderr, "  unreadable file %d: %s \"%s\"\n", i, hirate_err_name(rc), why);
        CHECK_EQ_I64(rc, HIRATE_ETLS);
        CHECK(strstr(why, named) != NULL);
    }
    /* Readable, but not what it should be: a key of another certificate, a
     * CA file that holds no certificate. */
    for (int i = 0; i < 2; i++) {
        hirate_options o;
        char why[HIRATE_ERRMSG_SIZE];
        hirate_options_init(&o);
        o.url = TLS.url;
        const char *named;
        if (i == 0) {
            o.tls_cert_file = cert("client.crt");
            o.tls_key_file = named = cert("server.key");
        } else {
            o.tls_ca_file = named = cert("ca.srl");
        }
        int rc = new_rc(&o, why, sizeof why);
        if (rc != HIRATE_ETLS || !strstr(why, named))
            fprintf(stderr, "  bad file %d: %s \"%s\"\n", i, hirate_err_name(rc), why);
        CHECK_EQ_I64(rc, HIRATE_ETLS);
        CHECK(strstr(why, named) != NULL);
    }
    /* A certificate without its key, or a key without its certificate. */
    hirate_options o;
    char why[HIRATE_ERRMSG_SIZE];
    hirate_options_init(&o);
    o.url = TLS.url;
    o.tls_cert_file = cert("client.crt");
    CHECK_EQ_I64(new_rc(&o, why, sizeof why), HIRATE_EOPTION);
    CHECK(strstr(why, "tls_key_file") != NULL);
    o.tls_cert_file = NULL;
    o.tls_key_file = cert("client.key");
    CHECK_EQ_I64(new_rc(&o, why, sizeof why), HIRATE_EOPTION);
    CHECK(strstr(why, "tls_cert_file") != NULL);
}

/* ---- servers that refuse us ---------------------------------------------------------------- */

static void test_maxclients_is_erefused_under_every_policy(void)
{
    rh_server m;
    memset(&m, 0, sizeof m);
    CHECK_EQ_I64(rh_start(&m), 0);
    if (!m.pid) return;
    /* Our own connection holds the one place, and gives it back after. */
    struct timeval tv = {2, 0};
    redisContext *hold = redisConnectWithTimeout("127.0.0.1", m.port, tv);
    CHECK(hold && !hold->err);
    if (hold && !hold->err) {
        CHECK(reply_is(redisCommand(hold, "CONFIG SET maxclients 1"), "OK"));
        returned_under_every_policy("maxclients reached", (tcfg){.url = m.url}, NULL,
                                    HIRATE_EREFUSED, 0, "max number of clients reached");
        CHECK(reply_is(redisCommand(hold, "CONFIG SET maxclients 10000"), "OK"));
        /* Once there is room, Redis decides again (after the backoff). */
        hirate_limiter *lim = make((tcfg){.url = m.url});
        if (lim) {
            hirate_decision d;
            int64_t dt;
            CHECK(redis_decided(timed_allow(lim, "k", 1, &d, &dt), &d, 1, 9, "after maxclients"));
            hirate_limiter_free(lim);
        }
    }
    if (hold) redisFree(hold);
    rh_stop(&m);
}

/* On a TLS port Redis turns the client away without a word it could read:
 * it closes during the TLS handshake. That cannot be told from an outage,
 * so it is EIO, and the policy decides (docs/reliability.md, "Not
 * promised"). */
static void test_maxclients_on_a_tls_port_is_an_outage(void)
{
    struct timeval tv = {2, 0};
    redisContext *hold = redisConnectWithTimeout("127.0.0.1", TLS.port, tv);
    CHECK(hold && !hold->err);
    if (!hold || hold->err) {
        if (hold) redisFree(hold);
        return;
    }
    long long before = -1;
    redisReply *r = redisCommand(hold, "CONFIG GET maxclients");
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2)
        before = strtoll(r->element[1]->str, NULL, 10);
    if (r) freeReplyObject(r);
    CHECK(reply_is(redisCommand(hold, "CONFIG SET maxclients 1"), "OK"));
    ON_ERROR_EACH(p) {
        hirate_limiter *lim = make((tcfg){.url = TLS.url, .ca = TLS.ca_file, .on_error = p,
                                          .connect_timeout_ms = BAD_CONNECT_MS});
        if (!lim) continue;
        hirate_decision d;
        int64_t dt;
        int rc = timed_allow(lim, "k", 1, &d, &dt);
        printf("  maxclients on the TLS port, on_error %s: %s, %s (%s) in %.1f ms: %s\n",
               hirate_on_error_name(p), hirate_err_name(rc), hirate_source_name(d.source),
               hirate_err_name(d.error), (double)dt / MS, errmsg(lim));
        static const int policy_source[] = {HIRATE_SOURCE_LOCAL, HIRATE_SOURCE_FAIL_OPEN,
                                            HIRATE_SOURCE_FAIL_CLOSED};
        CHECK_EQ_I64(rc, 0);
        CHECK_EQ_I64(d.source, policy_source[p]);
        CHECK_EQ_I64(d.error, HIRATE_EIO);
        CHECK(dt <= (BAD_CONNECT_MS + SLACK_MS) * MS);
        hirate_limiter_free(lim);
    }
    char n[32];
    snprintf(n, sizeof n, "%lld", before > 0 ? before : 10000);
    CHECK(reply_is(redisCommand(hold, "CONFIG SET maxclients %s", n), "OK"));
    redisFree(hold);
}

/* An IPv4 address of this host that is not loopback, or NULL. */
static const char *outside_address(char *buf, size_t cap)
{
    struct ifaddrs *ifs, *i;
    const char *found = NULL;
    if (getifaddrs(&ifs) != 0) return NULL;
    for (i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        struct in_addr a = ((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr;
        if ((ntohl(a.s_addr) >> 24) == 127) continue;
        found = inet_ntop(AF_INET, &a, buf, (socklen_t)cap);
    }
    freeifaddrs(ifs);
    return found;
}

/* Redis DENIES only clients that do not come from loopback: a connection to
 * this host's own non-loopback address comes from that address. */
static void test_protected_mode_is_erefused_under_every_policy(void)
{
    char ip[64], extra[160], url[128];
    if (!outside_address(ip, sizeof ip)) {
        printf("  protected mode: this host has no non-loopback IPv4 address; the mock "
               "server's DENIED case stands for it\n");
        return;
    }
    rh_server s;
    memset(&s, 0, sizeof s);
    /* The later --bind wins over the harness' own. */
    snprintf(extra, sizeof extra, "--bind 127.0.0.1 %s --protected-mode yes", ip);
    s.extra = extra;
    CHECK_EQ_I64(rh_start(&s), 0);
    if (!s.pid) return;
    snprintf(url, sizeof url, "redis://%s:%d", ip, s.port);
    returned_under_every_policy("protected mode (DENIED) from a non-loopback address",
                                (tcfg){.url = url}, &s, HIRATE_EREFUSED, 0, "protected mode");
    rh_stop(&s);
}

/* The script's commands are not EVALSHA's: a user who may call the script but
 * not GET, SET or PING gets NOPERM (or Redis' "ERR The user executing the
 * script can't run this command"), which is a permission, not another error. */
static void test_a_user_who_may_not_run_the_scripts_commands_is_enoperm(void)
{
    CHECK(reply_is(rh_command(&TLS, "ACL SETUSER tls-scripts on >%s +evalsha +eval +time ~rl:*",
                              CANARY), "OK"));
    char url[256];
    snprintf(url, sizeof url, "rediss://tls-scripts:%s@localhost:%d", CANARY, TLS.tls_port);
    returned_under_every_policy("a user with only +evalsha +eval +time ~rl:*",
                                (tcfg){.url = url, .ca = TLS.ca_file}, &TLS, HIRATE_ENOPERM, 0,
                                NULL);
    CHECK_EQ_I64(int_reply(rh_command(&TLS, "EXISTS rl:k")), 0);
}

/* ---- servers that are not Redis (the scripted server) ----------------------------------------- */

enum { NOT_SSH = 1, NOT_HTTP, NOT_DENIED };

/* Redis 7.0's reply, whole, to a client off loopback. */
#define DENIED_WORDS \
    "DENIED Redis is running in protected mode because protected mode is " \
    "enabled and no password is set for the default user. In this mode " \
    "connections are only accepted from the loopback interface. If you want " \
    "to connect from external computers to Redis you may adopt one of the " \
    "following solutions: 1) Just disable protected mode sending the " \
    "command 'CONFIG SET protected-mode no' from the loopback interface by " \
    "connecting to Redis from the same host the server is running, however " \
    "MAKE SURE Redis is not publicly accessible from internet if you do so. " \
    "Use CONFIG REWRITE to make this change permanent. 2) Alternatively you " \
    "can just disable the protected mode by editing the Redis configuration " \
    "file, and setting the protected mode option to 'no', and then " \
    "restarting the server. 3) If you started the server manually just for " \
    "testing, restart it with the '--protected-mode no' option. 4) Setup a " \
    "an authentication password for the default user. NOTE: You only need " \
    "to do one of the above things in order for the server to start " \
    "accepting connections from the outside."
static const char DENIED_REPLY[] = "-" DENIED_WORDS "\r\n";
static int g_mock_mode;

static void impostor(void *arg, const mock_cmd *cmd, mock_reply *r)
{
    (void)arg;
    (void)cmd;
    switch (__atomic_load_n(&g_mock_mode, __ATOMIC_ACQUIRE)) {
    case NOT_SSH:
        /* What OpenSSH sends first, then its answer to a line that is not
         * an SSH banner. */
        mock_send_str(r, "SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n");
        mock_send_str(r, "Invalid SSH identification string.\r\n");
        mock_close(r);
        break;
    case NOT_HTTP:
        mock_send_str(r, "HTTP/1.1 400 Bad Request\r\nServer: nginx/1.22.1\r\n"
                         "Content-Type: text/html\r\nContent-Length: 0\r\n"
                         "Connection: close\r\n\r\n");
        mock_close(r);
        break;
    default:
        mock_send_str(r, DENIED_REPLY);
        mock_close(r);
        break;
    }
}

/* A reply too long for the message is quoted up to a whole word and "...". */
static void denied_is_quoted_whole_words(const char *url)
{
    hirate_limiter *lim = make((tcfg){.url = url});
    if (!lim) return;
    hirate_decision d;
    int64_t dt;
    CHECK_EQ_I64(timed_allow(lim, "k", 1, &d, &dt), HIRATE_EREFUSED);
    const char *m = errmsg(lim), *q = strstr(m, "DENIED ");
    size_t n = strlen(m);
    int cut = n > 3 && strcmp(m + n - 3, "...") == 0;
    if (!q || !cut) fprintf(stderr, "  DENIED quoted as: \"%s\"\n", m);
    CHECK(q != NULL && cut);
    if (q && cut) {
        /* What is quoted is the start of Redis' words, ending where a word does. */
        static const char full[] = DENIED_WORDS;
        size_t qn = (size_t)(m + n - 3 - q);
        CHECK(qn > 20 && qn < sizeof full && strncmp(q, full, qn) == 0);
        CHECK(qn < sizeof full && (full[qn] == ' ' || full[qn] == '\0') && q[qn - 1] != ' ');
    }
    hirate_limiter_free(lim);
}

static void test_a_server_that_is_not_redis_is_enotredis(void)
{
    mock_server *m = NULL;
    CHECK_EQ_I64(mock_start(&m, impostor, NULL), 0);
    if (!m) return;
    __atomic_store_n(&g_mock_mode, NOT_SSH, __ATOMIC_RELEASE);
    returned_under_every_policy("an SSH server", (tcfg){.url = mock_url(m)}, NULL,
                                HIRATE_ENOTREDIS, 0, NULL);
    __atomic_store_n(&g_mock_mode, NOT_HTTP, __ATOMIC_RELEASE);
    returned_under_every_policy("an HTTP server", (tcfg){.url = mock_url(m)}, NULL,
                                HIRATE_ENOTREDIS, 0, NULL);
    __atomic_store_n(&g_mock_mode, NOT_DENIED, __ATOMIC_RELEASE);
    returned_under_every_policy("DENIED, as Redis 7.0 words it", (tcfg){.url = mock_url(m)}, NULL,
                                HIRATE_EREFUSED, 0, "protected mode");
    denied_is_quoted_whole_words(mock_url(m));
    mock_stop(m);
}

/* ---- a batch with one key outside the user's keys ---------------------------------------------- */

/* What Redis holds for key: its tokens and time ("tokens ts"); 0, or -1. */
static int stored(const char *key, double *tokens, int64_t *ts)
{
    redisReply *r = rh_command(&TLS, "GET %s", key);
    long long t = 0;
    int ok = r && r->type == REDIS_REPLY_STRING && sscanf(r->str, "%lf %lld", tokens, &t) == 2;
    *ts = t;
    if (r) freeReplyObject(r);
    return ok ? 0 : -1;
}

static void test_allow_many_keeps_every_answer_when_acl_refuses_one_key(void)
{
    CHECK(reply_is(rh_command(&TLS, "ACL SETUSER tls-a on >%s ~rl:a* &* +@all", CANARY), "OK"));
    char url[256];
    snprintf(url, sizeof url, "rediss://tls-a:%s@localhost:%d", CANARY, TLS.tls_port);
    ON_ERROR_EACH(p) {
        hirate_limiter *lim = make((tcfg){.url = url, .ca = TLS.ca_file, .on_error = p});
        if (!lim) continue;
        char a1[32], b1[32], a2[32];
        snprintf(a1, sizeof a1, "a1-%s", hirate_on_error_name(p));
        snprintf(b1, sizeof b1, "b1-%s", hirate_on_error_name(p));
        snprintf(a2, sizeof a2, "a2-%s", hirate_on_error_name(p));
        hirate_item items[3] = {{a1, strlen(a1), 1, 0, {0}}, {b1, strlen(b1), 1, 0, {0}},
                                {a2, strlen(a2), 3, 0, {0}}};
        CHECK_EQ_I64(hirate_allow_many(lim, items, 3), 0);
        CHECK(redis_decided(items[0].rc, &items[0].decision, 1, 9, "rl:a1 in the batch"));
        CHECK_EQ_I64(items[1].rc, HIRATE_ENOPERM);
        CHECK(redis_decided(items[2].rc, &items[2].decision, 1, 7, "rl:a2 in the batch"));
        CHECK(errmsg_is_clean(lim));
        /* Each answer is what Redis holds: the tokens left and the time. */
        char key[48];
        for (int i = 0; i < 3; i += 2) {
            double tokens = -1;
            int64_t ts = -1;
            snprintf(key, sizeof key, "rl:%s", (const char *)items[i].key);
            CHECK_EQ_I64(stored(key, &tokens, &ts), 0);
            CHECK(tokens == (double)items[i].decision.remaining);
            CHECK_EQ_I64(ts, items[i].decision.time_us);
        }
        snprintf(key, sizeof key, "rl:%s", b1);
        CHECK_EQ_I64(int_reply(rh_command(&TLS, "EXISTS %s", key)), 0);
        hirate_counters st = counters(lim);
        CHECK_EQ_I64(st.policy, 0);
        CHECK_EQ_I64(st.breaker_opens, 0);
        CHECK_EQ_I64(st.connects, 1);   /* a refused key keeps the connection */
        hirate_limiter_free(lim);
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);   /* timings reach the log even on a crash */
    if (rh_certs_new(CERTS, sizeof CERTS) != 0) {
        CHECK(!"the test certificates must be made (openssl on PATH?)");
        return check_summary("test_tls");
    }
    memset(&TLS, 0, sizeof TLS);
    TLS.tls = 1;
    TLS.certs_dir = CERTS;
    if (rh_start(&TLS) != 0) {
        CHECK(!"a TLS redis-server must start");
        rh_certs_remove(CERTS);
        return check_summary("test_tls");
    }
    rh_watchdog(&TLS, "test_tls", 170);

    test_exactly_the_capacity_over_tls();
    test_acl_user_and_db_over_tls();
    test_mutual_tls();
    test_server_name_and_no_verify();
    test_each_bad_certificate_is_etls_under_every_policy();
    test_plain_url_to_a_tls_port_is_etls_under_every_policy();
    test_tls_url_to_a_plain_port_is_etls_under_every_policy();
    test_a_tls_option_without_rediss_is_eoption();
    test_a_tls_file_that_cannot_serve_is_named_at_construction();
    test_maxclients_is_erefused_under_every_policy();
    test_maxclients_on_a_tls_port_is_an_outage();
    test_protected_mode_is_erefused_under_every_policy();
    test_a_user_who_may_not_run_the_scripts_commands_is_enoperm();
    test_a_server_that_is_not_redis_is_enotredis();
    test_allow_many_keeps_every_answer_when_acl_refuses_one_key();

    rh_stop(&TLS);
    rh_certs_remove(CERTS);
    return check_summary("test_tls");
}
