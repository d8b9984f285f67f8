/*
 * The blocking client's sockets (core/src/transport.c, tls.c) against real
 * redis-servers: plain TCP over IPv4, IPv6 and a host name, a unix socket,
 * TLS with each kind of certificate, mutual TLS, deadlines, and how an idle
 * TLS connection is judged. The TLS server is one redis-server with a plain
 * port too, through which each case installs its certificate (CONFIG SET).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>

#include "check.h"
#include "hirate.h"
#include "hirate_io.h"
#include "memory.h"
#include "redis_harness.h"
#include "tls.h"
#include "transport.h"

#define PING "*1\r\n$4\r\nPING\r\n"
#define CONNECT_MS 300

static rh_server plain_srv, tls_srv;
static int tls_port;
static char certs[200];

static int64_t ms_from_now(int ms)
{
    return hirate_monotonic_us() + (int64_t)ms * 1000;
}

/* A port that nothing listens on right now. */
static int free_port(void)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &alen) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static hirate_endpoint tcp_ep(const char *host, int port)
{
    hirate_endpoint ep;
    memset(&ep, 0, sizeof ep);
    snprintf(ep.host, sizeof ep.host, "%s", host);
    ep.port = port;
    snprintf(ep.where, sizeof ep.where, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    ep.connect_timeout_ms = CONNECT_MS;
    ep.timeout_ms = 1000;
    ep.probe_timeout_ms = 200;
    return ep;
}

/* A copy that outlives the endpoint copies pointing at it. */
static const char *stable(const char *s)
{
    static char names[8][256];
    static int next;
    char *p = names[next++ % 8];
    snprintf(p, 256, "%s", s);
    return p;
}

static hirate_endpoint tls_ep(const char *host)
{
    hirate_endpoint ep = tcp_ep(host, tls_port);
    ep.tls = 1;
    ep.tls_verify = 1;
    ep.tls_server_name = stable(host);
    return ep;
}

static const char *cert(const char *name)
{
    static char path[8][300];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 300, "%s/%s", certs, name);
    return p;
}

/* The TLS server's certificate (and whether it asks for the client's). */
static int serve_cert(const char *name, int auth_clients)
{
    char crt[64], key[64];
    snprintf(crt, sizeof crt, "%s.crt", name);
    snprintf(key, sizeof key, "%s.key", name);
    redisReply *r = rh_command(&tls_srv, "CONFIG SET tls-cert-file %s tls-key-file %s "
                                         "tls-auth-clients %s",
                               cert(crt), cert(key), auth_clients ? "yes" : "no");
    int ok = r && r->type == REDIS_REPLY_STATUS;
    if (!ok)
        fprintf(stderr, "CONFIG SET %s: %s\n", name, r && r->str ? r->str : "no reply");
    if (r)
        freeReplyObject(r);
    return ok ? 0 : -1;
}

static hirate_tls_ctx *make_ctx(const char *ca, const char *crt, const char *key, int verify)
{
    hirate_tls_cfg cfg = {ca ? cert(ca) : NULL, NULL, crt ? cert(crt) : NULL, key ? cert(key) : NULL,
                          verify};
    char err[256];
    int rc;
    hirate_tls_ctx *c = hirate_tls_ctx_new(&cfg, &rc, err, sizeof err);
    if (!c)
        fprintf(stderr, "hirate_tls_ctx_new: %s\n", err);
    return c;
}

/* A PING and its PONG, whole. */
static void check_ping(hirate_sock *s)
{
    char err[256], buf[64];
    size_t got = 0;
    int64_t deadline = ms_from_now(1000);
    CHECK_EQ_I64(hirate_sock_send(s, PING, strlen(PING), deadline, err, sizeof err), 0);
    while (got < 7) {
        long n = hirate_sock_recv(s, buf + got, sizeof buf - 1 - got, deadline, err, sizeof err);
        if (n <= 0) {
            fprintf(stderr, "recv: %s\n", err);
            break;
        }
        got += (size_t)n;
    }
    buf[got] = '\0';
    CHECK_EQ_STR(buf, "+PONG\r\n");
}

/* Connects, PINGs and closes; returns the connect's code. */
static int connect_ping(const hirate_endpoint *ep, hirate_tls_ctx *ctx, int mode, char *err,
                        size_t errlen)
{
    hirate_sock s;
    int rc = hirate_sock_connect(&s, ep, ctx, mode, NULL, ms_from_now(ep->connect_timeout_ms), err,
                                 errlen);
    if (rc == 0) {
        check_ping(&s);
        hirate_sock_close(&s, 0, NULL);
    }
    return rc;
}

static void test_plain(void)
{
    char err[256];
    hirate_endpoint ep = tcp_ep("127.0.0.1", plain_srv.port);
    CHECK_EQ_I64(connect_ping(&ep, NULL, HIRATE_SOCK_PLAIN, err, sizeof err), 0);
    ep = tcp_ep("::1", plain_srv.port);
    CHECK_EQ_I64(connect_ping(&ep, NULL, HIRATE_SOCK_PLAIN, err, sizeof err), 0);
    ep = tcp_ep("localhost", plain_srv.port);
    CHECK_EQ_I64(connect_ping(&ep, NULL, HIRATE_SOCK_PLAIN, err, sizeof err), 0);

    memset(&ep, 0, sizeof ep);
    ep.is_unix = 1;
    snprintf(ep.path, sizeof ep.path, "%.100s", plain_srv.unixsock);
    snprintf(ep.where, sizeof ep.where, "%s", plain_srv.unixsock);
    ep.connect_timeout_ms = CONNECT_MS;
    ep.timeout_ms = 1000;
    CHECK_EQ_I64(connect_ping(&ep, NULL, HIRATE_SOCK_PLAIN, err, sizeof err), 0);
}

static void test_connect_failures(void)
{
    char err[256], want[300];
    int port = free_port();
    hirate_endpoint ep = tcp_ep("127.0.0.1", port);
    hirate_sock s;
    CHECK_EQ_I64(hirate_sock_connect(&s, &ep, NULL, HIRATE_SOCK_PLAIN, NULL, ms_from_now(300), err,
                                     sizeof err),
                 HIRATE_ECONNECT);
    snprintf(want, sizeof want, "connect to 127.0.0.1:%d: Connection refused", port);
    CHECK_EQ_STR(err, want);
    CHECK_EQ_I64(s.fd, -1);

    ep = tcp_ep("no-such-host.invalid", 6379);
    CHECK_EQ_I64(hirate_sock_connect(&s, &ep, NULL, HIRATE_SOCK_PLAIN, NULL, ms_from_now(300), err,
                                     sizeof err),
                 HIRATE_ECONNECT);
    CHECK(strncmp(err, "connect to no-such-host.invalid:6379: ", 38) == 0);

    memset(&ep, 0, sizeof ep);
    ep.is_unix = 1;
    snprintf(ep.path, sizeof ep.path, "%.90s/nobody.sock", plain_srv.dir);
    snprintf(ep.where, sizeof ep.where, "%s", ep.path);
    CHECK_EQ_I64(hirate_sock_connect(&s, &ep, NULL, HIRATE_SOCK_PLAIN, NULL, ms_from_now(300), err,
                                     sizeof err),
                 HIRATE_ECONNECT);
    snprintf(want, sizeof want, "connect to %s: No such file or directory", ep.path);
    CHECK_EQ_STR(err, want);
}

/* A listener whose accept queue is full drops new SYNs: the connect can
 * only end by the deadline, as a failure to connect (nothing was sent). */
static void test_connect_timeout(void)
{
    char err[256], want[300];
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    int l = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 0) == 0 &&
          getsockname(l, (struct sockaddr *)&a, &alen) == 0);
    int filler = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(filler, (struct sockaddr *)&a, sizeof a) == 0);

    hirate_endpoint ep = tcp_ep("127.0.0.1", ntohs(a.sin_port));
    hirate_sock s;
    int64_t t0 = hirate_monotonic_us();
    CHECK_EQ_I64(hirate_sock_connect(&s, &ep, NULL, HIRATE_SOCK_PLAIN, NULL, t0 + CONNECT_MS * 1000,
                                     err, sizeof err),
                 HIRATE_ECONNECT);
    int64_t took_ms = (hirate_monotonic_us() - t0) / 1000;
    CHECK(took_ms >= CONNECT_MS && took_ms < CONNECT_MS + 200);
    snprintf(want, sizeof want, "connect to 127.0.0.1:%d: no answer within %d ms",
             ntohs(a.sin_port), CONNECT_MS);
    CHECK_EQ_STR(err, want);
    close(filler);
    close(l);
}

/* A stopped server: the kernel completes TCP connects, so a plain connect
 * succeeds and its first read ends at the deadline; a TLS handshake ends at
 * the connect deadline. */
static void test_stopped_server(void)
{
    char err[256], want[300], buf[16];
    hirate_tls_ctx *ctx = make_ctx("ca.crt", NULL, NULL, 1);
    CHECK(serve_cert("server", 0) == 0);
    rh_pause(&tls_srv);

    hirate_endpoint ep = tcp_ep("127.0.0.1", tls_srv.port);
    hirate_sock s;
    CHECK_EQ_I64(hirate_sock_connect(&s, &ep, NULL, HIRATE_SOCK_PLAIN, NULL, ms_from_now(300), err,
                                     sizeof err),
                 0);
    int64_t t0 = hirate_monotonic_us();
    CHECK_EQ_I64(hirate_sock_send(&s, PING, strlen(PING), t0 + 300000, err, sizeof err), 0);
    CHECK_EQ_I64(hirate_sock_recv(&s, buf, sizeof buf, t0 + 300000, err, sizeof err),
                 HIRATE_ETIMEDOUT);
    int64_t took_ms = (hirate_monotonic_us() - t0) / 1000;
    CHECK(took_ms >= 300 && took_ms < 500);
    CHECK_EQ_STR(err, "no reply from Redis in time");
    hirate_sock_close(&s, 0, NULL);

    ep = tls_ep("localhost");
    t0 = hirate_monotonic_us();
    CHECK_EQ_I64(hirate_sock_connect(&s, &ep, ctx, HIRATE_SOCK_TLS, NULL, t0 + CONNECT_MS * 1000,
                                     err, sizeof err),
                 HIRATE_ETIMEDOUT);
    took_ms = (hirate_monotonic_us() - t0) / 1000;
    CHECK(took_ms >= CONNECT_MS && took_ms < CONNECT_MS + 200);
    snprintf(want, sizeof want, "TLS handshake with localhost:%d: no answer within %d ms",
             tls_port, CONNECT_MS);
    CHECK_EQ_STR(err, want);
    rh_resume(&tls_srv);
    hirate_tls_ctx_free(ctx);
}

static void test_tls_ok(void)
{
    char err[256];
    hirate_tls_ctx *ctx = make_ctx("ca.crt", NULL, NULL, 1);
    CHECK(ctx != NULL);
    CHECK(serve_cert("server", 0) == 0);
    const char *hosts[] = {"localhost", "127.0.0.1", "::1"};
    for (size_t i = 0; i < 3; i++) {
        hirate_endpoint ep = tls_ep(hosts[i]);
        CHECK_EQ_I64(connect_ping(&ep, ctx, HIRATE_SOCK_TLS, err, sizeof err), 0);
    }
    /* The server name to verify may differ from the host connected to. */
    hirate_endpoint ep = tls_ep("127.0.0.1");
    ep.tls_server_name = "localhost";
    CHECK_EQ_I64(connect_ping(&ep, ctx, HIRATE_SOCK_TLS, err, sizeof err), 0);
    hirate_tls_ctx_free(ctx);
}

/* Each certificate the client must refuse, with its reason; and accepted
 * when verification is off. */
static void test_tls_refused(void)
{
    char err[256], want[400];
    hirate_tls_ctx *ctx = make_ctx("ca.crt", NULL, NULL, 1);
    hirate_tls_ctx *none = make_ctx("ca.crt", NULL, NULL, 0);
    struct {
        const char *cert, *host;
        long verr;
        const char *extra;
    } cases[] = {
        {"wronghost", "localhost", X509_V_ERR_HOSTNAME_MISMATCH,
         " (the certificate is not for localhost)"},
        {"wronghost", "127.0.0.1", X509_V_ERR_IP_ADDRESS_MISMATCH,
         " (the certificate is not for 127.0.0.1)"},
        {"expired", "localhost", X509_V_ERR_CERT_HAS_EXPIRED, ""},
        {"selfsigned", "localhost", X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(serve_cert(cases[i].cert, 0) == 0);
        hirate_endpoint ep = tls_ep(cases[i].host);
        hirate_sock s;
        CHECK_EQ_I64(hirate_sock_connect(&s, &ep, ctx, HIRATE_SOCK_TLS, NULL,
                                         ms_from_now(CONNECT_MS), err, sizeof err),
                     HIRATE_ETLS);
        snprintf(want, sizeof want, "TLS handshake with %s: certificate verify failed: %s%s",
                 ep.where, X509_verify_cert_error_string(cases[i].verr), cases[i].extra);
        CHECK_EQ_STR(err, want);
        CHECK_EQ_I64(s.fd, -1);
        CHECK(s.ssl == NULL);
        /* Verification off (the option, or the probe's mode): accepted. */
        CHECK_EQ_I64(connect_ping(&ep, hirate_tls_probe_ctx(), HIRATE_SOCK_TLS_NOVERIFY, err,
                                  sizeof err), 0);
        ep.tls_verify = 0;
        CHECK_EQ_I64(connect_ping(&ep, ctx, HIRATE_SOCK_TLS, err, sizeof err), 0);
        CHECK_EQ_I64(connect_ping(&ep, none, HIRATE_SOCK_TLS, err, sizeof err), 0);
    }
    /* A CA that signed none of it (the server sends the chain up to its
     * own CA, which the client does not trust). */
    hirate_tls_ctx *other = make_ctx("other-ca.crt", NULL, NULL, 1);
    CHECK(serve_cert("server", 0) == 0);
    hirate_endpoint ep = tls_ep("localhost");
    hirate_sock s;
    CHECK_EQ_I64(hirate_sock_connect(&s, &ep, other, HIRATE_SOCK_TLS, NULL, ms_from_now(CONNECT_MS),
                                     err, sizeof err),
                 HIRATE_ETLS);
    snprintf(want, sizeof want, "TLS handshake with %s: certificate verify failed: %s", ep.where,
             X509_verify_cert_error_string(X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN));
    CHECK_EQ_STR(err, want);
    hirate_tls_ctx_free(other);
    hirate_tls_ctx_free(none);
    hirate_tls_ctx_free(ctx);
}

/* TLS to a plain port, plain to a TLS port: the failures that the
 * handshake op's probe explains. */
static void test_mismatch(void)
{
    char err[256], want[300], buf[16];
    hirate_tls_ctx *ctx = make_ctx("ca.crt", NULL, NULL, 1);
    CHECK(serve_cert("server", 0) == 0);
    /* Redis waits for a newline that a ClientHello never brings. */
    hirate_endpoint ep = tcp_ep("127.0.0.1", plain_srv.port);
    ep.tls = 1;
    ep.tls_verify = 1;
    ep.tls_server_name = "127.0.0.1";
    hirate_sock s;
    CHECK_EQ_I64(hirate_sock_connect(&s, &ep, ctx, HIRATE_SOCK_TLS, NULL, ms_from_now(CONNECT_MS),
                                     err, sizeof err),
                 HIRATE_ETIMEDOUT);
    /* A TLS port resets a plain request, sending nothing. */
    ep = tcp_ep("127.0.0.1", tls_port);
    CHECK_EQ_I64(hirate_sock_connect(&s, &ep, NULL, HIRATE_SOCK_PLAIN, NULL, ms_from_now(CONNECT_MS),
                                     err, sizeof err),
                 0);
    int64_t deadline = ms_from_now(1000);
    CHECK_EQ_I64(hirate_sock_send(&s, PING, strlen(PING), deadline, err, sizeof err), 0);
    long n = hirate_sock_recv(&s, buf, sizeof buf, deadline, err, sizeof err);
    CHECK_EQ_I64(n, HIRATE_EIO);
    CHECK(strcmp(err, "Redis closed the connection") == 0 ||
          strcmp(err, "receive from Redis: Connection reset by peer") == 0);
    hirate_sock_close(&s, 0, NULL);
    (void)want;
    hirate_tls_ctx_free(ctx);
}

static void test_mutual_tls(void)
{
    char err[256];
    hirate_tls_ctx *anon = make_ctx("ca.crt", NULL, NULL, 1);
    hirate_tls_ctx *client = make_ctx("ca.crt", "client.crt", "client.key", 1);
    CHECK(anon != NULL && client != NULL);
    CHECK(serve_cert("server", 1) == 0);
    hirate_endpoint ep = tls_ep("localhost");
    CHECK_EQ_I64(connect_ping(&ep, client, HIRATE_SOCK_TLS, err, sizeof err), 0);

    /* Without a certificate: TLS 1.3 finishes the client's side of the
     * handshake before the server has judged it, so the refusal (an alert)
     * comes with the first reply. Either way it is HIRATE_ETLS. */
    for (int wait_ms = 0; wait_ms <= 100; wait_ms += 50) {
        hirate_sock s;
        int rc = hirate_sock_connect(&s, &ep, anon, HIRATE_SOCK_TLS, NULL, ms_from_now(CONNECT_MS),
                                     err, sizeof err);
        if (rc == 0) {
            /* Sent at once, the request may meet the alert on its way; sent
             * later, a reset that the alert came before. */
            struct timespec pause = {0, wait_ms * 1000000L};
            nanosleep(&pause, NULL);
            char buf[16];
            int64_t deadline = ms_from_now(1000);
            int sent = hirate_sock_send(&s, PING, strlen(PING), deadline, err, sizeof err);
            rc = sent < 0 ? sent
                          : (int)hirate_sock_recv(&s, buf, sizeof buf, deadline, err, sizeof err);
            hirate_sock_close(&s, 0, NULL);
        }
        CHECK_EQ_I64(rc, HIRATE_ETLS);
        CHECK(strcmp(err, "receive from Redis: TLS: tlsv13 alert certificate required") == 0 ||
              strcmp(err, "send to Redis: TLS: tlsv13 alert certificate required") == 0);
        if (rc != HIRATE_ETLS)
            fprintf(stderr, "after %d ms: %s\n", wait_ms, err);
    }
    CHECK(serve_cert("server", 0) == 0);
    hirate_tls_ctx_free(client);
    hirate_tls_ctx_free(anon);
}

/* TLS 1.3 sends session tickets after the handshake: those bytes do not
 * make an idle connection gone; the server closing it does. */
static void test_gone(void)
{
    char err[256];
    hirate_tls_ctx *ctx = make_ctx("ca.crt", NULL, NULL, 1);
    CHECK(serve_cert("server", 0) == 0);
    hirate_endpoint ep = tls_ep("localhost");
    hirate_sock s;
    CHECK_EQ_I64(hirate_sock_connect(&s, &ep, ctx, HIRATE_SOCK_TLS, NULL, ms_from_now(CONNECT_MS),
                                     err, sizeof err),
                 0);
    CHECK_EQ_I64(SSL_version((SSL *)s.ssl), TLS1_3_VERSION);
    struct timespec pause = {0, 50 * 1000000L};
    nanosleep(&pause, NULL);   /* the tickets arrive */
    CHECK_EQ_I64(hirate_sock_gone(&s), 0);
    CHECK_EQ_I64(hirate_sock_gone(&s), 0);
    check_ping(&s);
    CHECK_EQ_I64(hirate_sock_gone(&s), 0);

    redisReply *r = rh_command(&tls_srv, "CLIENT KILL TYPE normal SKIPME yes");
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    if (r)
        freeReplyObject(r);
    int gone = 0;
    for (int i = 0; i < 100 && !gone; i++) {
        gone = hirate_sock_gone(&s);
        if (!gone)
            nanosleep(&pause, NULL);
    }
    CHECK_EQ_I64(gone, 1);
    hirate_sock_close(&s, 0, NULL);

    /* Plain: the same verdicts. */
    ep = tcp_ep("127.0.0.1", plain_srv.port);
    CHECK_EQ_I64(hirate_sock_connect(&s, &ep, NULL, HIRATE_SOCK_PLAIN, NULL, ms_from_now(CONNECT_MS),
                                     err, sizeof err),
                 0);
    CHECK_EQ_I64(hirate_sock_gone(&s), 0);
    check_ping(&s);
    CHECK_EQ_I64(hirate_sock_gone(&s), 0);
    r = rh_command(&plain_srv, "CLIENT KILL TYPE normal SKIPME yes");
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    if (r)
        freeReplyObject(r);
    gone = 0;
    for (int i = 0; i < 100 && !gone; i++) {
        gone = hirate_sock_gone(&s);
        if (!gone)
            nanosleep(&pause, NULL);
    }
    CHECK_EQ_I64(gone, 1);
    hirate_sock_close(&s, 0, NULL);
    hirate_tls_ctx_free(ctx);
}

/* A session kept by one close is resumed by the next connect. */
static void test_resumption(void)
{
    char err[256];
    hirate_tls_ctx *ctx = make_ctx("ca.crt", NULL, NULL, 1);
    CHECK(serve_cert("server", 0) == 0);
    hirate_endpoint ep = tls_ep("localhost");
    void *session = NULL;
    hirate_sock s;
    CHECK_EQ_I64(hirate_sock_connect(&s, &ep, ctx, HIRATE_SOCK_TLS, &session,
                                     ms_from_now(CONNECT_MS), err, sizeof err),
                 0);
    CHECK_EQ_I64(SSL_session_reused((SSL *)s.ssl), 0);
    check_ping(&s);   /* reads the tickets too */
    hirate_sock_close(&s, 0, &session);
    CHECK(session != NULL);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_I64(hirate_sock_connect(&s, &ep, ctx, HIRATE_SOCK_TLS, &session,
                                         ms_from_now(CONNECT_MS), err, sizeof err),
                     0);
        CHECK_EQ_I64(SSL_session_reused((SSL *)s.ssl), 1);
        check_ping(&s);
        hirate_sock_close(&s, 0, &session);
        CHECK(session != NULL);
    }
    /* A quiet close hands nothing out and keeps what was given. */
    void *kept = session;
    CHECK_EQ_I64(hirate_sock_connect(&s, &ep, ctx, HIRATE_SOCK_TLS, &session,
                                     ms_from_now(CONNECT_MS), err, sizeof err),
                 0);
    hirate_sock_close(&s, 1, &session);
    CHECK(session == kept);
    hirate_sock_session_free(session);
    hirate_tls_ctx_free(ctx);
}

/* A bad file is HIRATE_ETLS naming it. */
static void test_ctx_errors(void)
{
    char err[256], want[400];
    int rc = 0;
    hirate_tls_cfg cfg = {"/nonexistent/ca.pem", NULL, NULL, NULL, 1};
    CHECK(hirate_tls_ctx_new(&cfg, &rc, err, sizeof err) == NULL);
    CHECK_EQ_I64(rc, HIRATE_ETLS);
    CHECK_EQ_STR(err, "TLS CA file /nonexistent/ca.pem: No such file or directory");

    hirate_tls_cfg bad = {cert("ca.crt"), NULL, cert("client.crt"), cert("server.key"), 1};
    CHECK(hirate_tls_ctx_new(&bad, &rc, err, sizeof err) == NULL);
    CHECK_EQ_I64(rc, HIRATE_ETLS);
    snprintf(want, sizeof want, "TLS client key %s (for %s): key values mismatch", bad.key_file,
             bad.cert_file);
    CHECK_EQ_STR(err, want);

    hirate_tls_cfg nokey = {NULL, NULL, cert("client.crt"), "/nonexistent/client.key", 1};
    CHECK(hirate_tls_ctx_new(&nokey, &rc, err, sizeof err) == NULL);
    CHECK_EQ_I64(rc, HIRATE_ETLS);
    snprintf(want, sizeof want,
             "TLS client key /nonexistent/client.key (for %s): No such file or directory",
             nokey.cert_file);
    CHECK_EQ_STR(err, want);

    hirate_tls_cfg half = {NULL, NULL, cert("client.crt"), NULL, 1};
    CHECK(hirate_tls_ctx_new(&half, &rc, err, sizeof err) == NULL);
    CHECK_EQ_I64(rc, HIRATE_ETLS);
    snprintf(want, sizeof want, "TLS client certificate %s needs a key too", half.cert_file);
    CHECK_EQ_STR(err, want);

    hirate_tls_cfg sys = {NULL, NULL, NULL, NULL, 1};
    hirate_tls_ctx *c = hirate_tls_ctx_new(&sys, &rc, err, sizeof err);
    CHECK(c != NULL);
    CHECK_EQ_I64(rc, 0);
    hirate_tls_ctx_free(c);
    CHECK(hirate_tls_probe_ctx() != NULL);
    CHECK(hirate_tls_probe_ctx() == hirate_tls_probe_ctx());
}

/* ---- the blocking client (redis.c) over these connections ------------------------ */

typedef struct lcfg {
    const char *url, *ca, *cert, *key, *server_name;
    int no_verify, on_error;
} lcfg;

static hirate_limiter *limiter(lcfg c)
{
    hirate_options o;
    hirate_options_init(&o);
    o.functions = 0;   /* the EVALSHA path; test_sentinel.c has FCALL's */
    o.url = c.url;
    o.capacity = 5;
    o.rate = 0.001;
    o.prefix = "tr:";
    o.deny_cache = 0;   /* every decision on the wire */
    o.connect_timeout_ms = CONNECT_MS;
    o.timeout_ms = 500;
    o.on_error = c.on_error;
    o.tls_ca_file = c.ca ? cert(c.ca) : NULL;
    o.tls_cert_file = c.cert ? cert(c.cert) : NULL;
    o.tls_key_file = c.key ? cert(c.key) : NULL;
    o.tls_server_name = c.server_name;
    o.tls_verify = !c.no_verify;
    char err[256];
    hirate_limiter *lim = NULL;
    if (hirate_limiter_new(&lim, &o, err, sizeof err) != 0)
        fprintf(stderr, "hirate_limiter_new(%s): %s\n", c.url, err);
    return lim;
}

static const char *errmsg(hirate_limiter *lim)
{
    static char buf[HIRATE_ERRMSG_SIZE];
    return hirate_limiter_errmsg(lim, buf, sizeof buf);
}

/* Exactly the capacity over TLS, one connection, through every name. */
static void test_limiter_over_tls(void)
{
    char url[128], key[32];
    CHECK(serve_cert("server", 0) == 0);
    const char *hosts[] = {"localhost", "127.0.0.1", "[::1]"};
    for (int h = 0; h < 3; h++) {
        snprintf(url, sizeof url, "rediss://%s:%d", hosts[h], tls_port);
        hirate_limiter *lim = limiter((lcfg){.url = url, .ca = "ca.crt"});
        CHECK(lim != NULL);
        if (!lim)
            continue;
        snprintf(key, sizeof key, "cap-%d", h);
        hirate_decision d;
        for (int i = 0; i < 6; i++) {
            CHECK_EQ_I64(hirate_allow(lim, key, strlen(key), 1, &d), 0);
            CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
            CHECK_EQ_I64(d.allowed, i < 5);
            CHECK_EQ_I64(d.remaining, i < 5 ? 4 - i : 0);
        }
        hirate_counters st;
        hirate_counters_get(lim, &st);
        CHECK_EQ_I64(st.connects, 1);
        CHECK_EQ_I64(st.conns_dropped, 0);
        hirate_limiter_free(lim);
    }
    /* Mutual TLS: with the client's certificate. */
    CHECK(serve_cert("server", 1) == 0);
    snprintf(url, sizeof url, "rediss://localhost:%d", tls_port);
    hirate_limiter *lim = limiter((lcfg){.url = url, .ca = "ca.crt", .cert = "client.crt",
                                         .key = "client.key"});
    hirate_decision d;
    CHECK_EQ_I64(hirate_allow(lim, "mtls", 4, 1, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(d.remaining, 4);
    hirate_limiter_free(lim);
    /* Without it: a misconfiguration, under the open policy too. */
    lim = limiter((lcfg){.url = url, .ca = "ca.crt", .on_error = HIRATE_ON_ERROR_OPEN});
    CHECK_EQ_I64(hirate_allow(lim, "mtls", 4, 1, &d), HIRATE_ETLS);
    CHECK(strstr(errmsg(lim), "certificate required") != NULL);
    hirate_limiter_free(lim);
    CHECK(serve_cert("server", 0) == 0);
}

/* A server that closes idle connections: the pool reconnects, once per
 * close, and nothing is decided twice. */
static void test_limiter_reconnects_over_tls(void)
{
    char url[128];
    CHECK(serve_cert("server", 0) == 0);
    snprintf(url, sizeof url, "rediss://localhost:%d", tls_port);
    hirate_limiter *lim = limiter((lcfg){.url = url, .ca = "ca.crt"});
    hirate_decision d;
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_I64(hirate_allow(lim, "again", 5, 1, &d), 0);
        CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
        CHECK_EQ_I64(d.remaining, 4 - i);
        redisReply *r = rh_command(&tls_srv, "CLIENT KILL TYPE normal SKIPME yes");
        CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
        if (r)
            freeReplyObject(r);
        struct timespec pause = {0, 20 * 1000000L};
        nanosleep(&pause, NULL);
    }
    hirate_counters st;
    hirate_counters_get(lim, &st);
    CHECK_EQ_I64(st.connects, 3);
    CHECK_EQ_I64(st.conns_dropped, 2);
    CHECK_EQ_I64(st.evalsha + st.eval, 3);
    hirate_limiter_free(lim);
}

/* Misconfigurations are returned under every policy, with their words. */
static void test_limiter_tls_misconfigured(void)
{
    char url[128], want[400];
    hirate_decision d;
    CHECK(serve_cert("wronghost", 0) == 0);
    snprintf(url, sizeof url, "rediss://localhost:%d", tls_port);
    hirate_limiter *lim = limiter((lcfg){.url = url, .ca = "ca.crt",
                                         .on_error = HIRATE_ON_ERROR_OPEN});
    CHECK_EQ_I64(hirate_allow(lim, "bad", 3, 1, &d), HIRATE_ETLS);
    snprintf(want, sizeof want,
             "TLS handshake with localhost:%d: certificate verify failed: hostname mismatch "
             "(the certificate is not for localhost)", tls_port);
    CHECK_EQ_STR(errmsg(lim), want);
    hirate_limiter_free(lim);
    /* The name to check, given apart from the host. */
    lim = limiter((lcfg){.url = url, .ca = "ca.crt", .server_name = "wrong.invalid"});
    CHECK_EQ_I64(hirate_allow(lim, "bad", 3, 1, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    hirate_limiter_free(lim);
    /* Verification off: accepted. */
    lim = limiter((lcfg){.url = url, .no_verify = 1});
    CHECK_EQ_I64(hirate_allow(lim, "bad", 3, 1, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    hirate_limiter_free(lim);
    CHECK(serve_cert("server", 0) == 0);

    /* rediss:// to a plain port, and redis:// to a TLS port. */
    snprintf(url, sizeof url, "rediss://127.0.0.1:%d", plain_srv.port);
    lim = limiter((lcfg){.url = url, .ca = "ca.crt", .on_error = HIRATE_ON_ERROR_OPEN});
    CHECK_EQ_I64(hirate_allow(lim, "mismatch", 8, 1, &d), HIRATE_ETLS);
    snprintf(want, sizeof want,
             "the TLS handshake with 127.0.0.1:%d got no answer, and the port answers plain "
             "Redis: use redis://, or the TLS port", plain_srv.port);
    CHECK_EQ_STR(errmsg(lim), want);
    hirate_limiter_free(lim);
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", tls_port);
    lim = limiter((lcfg){.url = url, .on_error = HIRATE_ON_ERROR_OPEN});
    CHECK_EQ_I64(hirate_allow(lim, "mismatch", 8, 1, &d), HIRATE_ETLS);
    snprintf(want, sizeof want,
             "127.0.0.1:%d closed the connection at the first command, and the port speaks TLS: "
             "use rediss://", tls_port);
    CHECK_EQ_STR(errmsg(lim), want);
    hirate_limiter_free(lim);

    /* An outage stays one: the policy decides, and the words name it once. */
    int port = free_port();
    snprintf(url, sizeof url, "rediss://127.0.0.1:%d", port);
    lim = limiter((lcfg){.url = url, .ca = "ca.crt",
                         .on_error = HIRATE_ON_ERROR_CLOSED});
    CHECK_EQ_I64(hirate_allow(lim, "down", 4, 1, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_FAIL_CLOSED);
    CHECK_EQ_I64(d.error, HIRATE_ECONNECT);
    snprintf(want, sizeof want, "connect to 127.0.0.1:%d: Connection refused", port);
    CHECK_EQ_STR(errmsg(lim), want);
    hirate_limiter_free(lim);
}

/* A TLS server stopped before the handshake: an outage (the policy
 * decides), found within the connect timeout, the plain probe included. */
static void test_limiter_stopped_tls_server(void)
{
    char url[128], want[300];
    CHECK(serve_cert("server", 0) == 0);
    snprintf(url, sizeof url, "rediss://localhost:%d", tls_port);
    hirate_limiter *lim = limiter((lcfg){.url = url, .ca = "ca.crt",
                                         .on_error = HIRATE_ON_ERROR_CLOSED});
    if (!lim)
        return;
    rh_pause(&tls_srv);
    hirate_decision d;
    int64_t t0 = hirate_monotonic_us();
    CHECK_EQ_I64(hirate_allow(lim, "stopped", 7, 1, &d), 0);
    int64_t took_ms = (hirate_monotonic_us() - t0) / 1000;
    rh_resume(&tls_srv);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_FAIL_CLOSED);
    CHECK_EQ_I64(d.error, HIRATE_ETIMEDOUT);
    CHECK(took_ms >= CONNECT_MS * 3 / 4 && took_ms < CONNECT_MS + 150);
    hirate_endpoint ep;
    CHECK_EQ_I64(hirate_endpoint_get(lim, &ep), 0);
    snprintf(want, sizeof want, "TLS handshake with localhost:%d: no answer within %d ms",
             tls_port, ep.connect_timeout_ms);
    CHECK_EQ_STR(errmsg(lim), want);
    hirate_limiter_free(lim);
}

/* fork(): a child never writes on the parent's TLS connections (a
 * close_notify, or a record out of the parent's sequence, would break
 * them). The parent's connection carries on; the child decides on its own. */
static void test_fork_over_tls(void)
{
    char url[128];
    CHECK(serve_cert("server", 0) == 0);
    snprintf(url, sizeof url, "rediss://localhost:%d", tls_port);
    hirate_limiter *lim = limiter((lcfg){.url = url, .ca = "ca.crt"});
    if (!lim)
        return;
    hirate_decision d;
    CHECK_EQ_I64(hirate_allow(lim, "fork", 4, 1, &d), 0);
    CHECK_EQ_I64(d.remaining, 4);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGALRM, SIG_DFL);
        alarm(20);
        int ok = hirate_allow(lim, "fork", 4, 1, &d) == 0 && d.source == HIRATE_SOURCE_REDIS &&
                 d.remaining == 3;
        hirate_limiter_free(lim);   /* closes the inherited connection: quietly */
        _exit(ok ? 0 : 3);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The parent's own connection still works: no reconnect, nothing dropped. */
    CHECK_EQ_I64(hirate_allow(lim, "fork", 4, 1, &d), 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    CHECK_EQ_I64(d.remaining, 2);
    hirate_counters st;
    hirate_counters_get(lim, &st);
    CHECK_EQ_I64(st.connects, 1);
    CHECK_EQ_I64(st.conns_dropped, 0);
    hirate_limiter_free(lim);
}

/* Threads share the pool over TLS: exactly the capacity passes. */
enum { THREADS = 8, CALLS = 25 };

static void *allow_many_times(void *arg)
{
    hirate_limiter *lim = arg;
    long allowed = 0;
    for (int i = 0; i < CALLS; i++) {
        hirate_decision d;
        if (hirate_allow(lim, "threads", 7, 1, &d) == 0 && d.source == HIRATE_SOURCE_REDIS)
            allowed += d.allowed;
        else
            allowed += 1000;   /* an error or a policy decision: counted apart */
    }
    return (void *)allowed;
}

static void test_threads_over_tls(void)
{
    char url[128];
    CHECK(serve_cert("server", 0) == 0);
    snprintf(url, sizeof url, "rediss://localhost:%d", tls_port);
    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.capacity = 100;
    o.rate = 0.001;
    o.prefix = "tr:";
    o.deny_cache = 0;
    o.pool_size = 4;
    o.timeout_ms = 2000;
    o.connect_timeout_ms = 2000;
    o.tls_ca_file = cert("ca.crt");
    char err[256];
    hirate_limiter *lim = NULL;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, err, sizeof err), 0);
    if (!lim)
        return;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        CHECK_EQ_I64(pthread_create(&t[i], NULL, allow_many_times, lim), 0);
    long allowed = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        allowed += (long)r;
    }
    CHECK_EQ_I64(allowed, 100);
    hirate_counters st;
    hirate_counters_get(lim, &st);
    CHECK(st.connects >= 1 && st.connects <= 4);
    CHECK_EQ_I64(st.conns_dropped, 0);
    hirate_limiter_free(lim);
}

int main(void)
{
    const char *src = getenv("HIRATE_SOURCE_DIR");
    const char *tmp = getenv("TMPDIR");
    char cmd[600];
    snprintf(certs, sizeof certs, "%s/hirate-certs-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!src || !mkdtemp(certs)) {
        fprintf(stderr, "test_transport: needs HIRATE_SOURCE_DIR and a temporary directory\n");
        return 1;
    }
    snprintf(cmd, sizeof cmd, "sh '%s/tests/support/make_certs.sh' '%s'", src, certs);
    if (system(cmd) != 0)
        return 1;

    static char tls_extra[1200];
    plain_srv.extra = "--bind 127.0.0.1 ::1";
    tls_port = free_port();
    snprintf(tls_extra, sizeof tls_extra,
             "--bind 127.0.0.1 ::1 --tls-port %d --tls-cert-file %s --tls-key-file %s "
             "--tls-ca-cert-file %s --tls-auth-clients no",
             tls_port, cert("server.crt"), cert("server.key"), cert("ca.crt"));
    tls_srv.extra = tls_extra;
    if (rh_start(&plain_srv) != 0)
        return 1;
    if (rh_start(&tls_srv) != 0) {
        rh_stop(&plain_srv);
        return 1;
    }
    rh_watchdog(&tls_srv, "test_transport", 120);

    test_ctx_errors();
    test_plain();
    test_connect_failures();
    test_connect_timeout();
    test_tls_ok();
    test_tls_refused();
    test_mismatch();
    test_mutual_tls();
    test_gone();
    test_resumption();
    test_stopped_server();
    test_limiter_over_tls();
    test_limiter_reconnects_over_tls();
    test_limiter_tls_misconfigured();
    test_limiter_stopped_tls_server();
    test_fork_over_tls();
    test_threads_over_tls();

    rh_stop(&tls_srv);
    rh_stop(&plain_srv);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", certs);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", certs);
    return check_summary("test_transport");
}
