/*
 * The fault matrix's spot checks over TLS (the table of test_faults.c, for
 * the faults where TLS changes what the client sees). Each fault is an
 * outage: the failure policy decides, with the error below, every call ends
 * within its timeouts, and Redis decides again once the fault clears.
 *
 * fault                                               error
 * --------------------------------------------------- -------------------------
 * server stopped (SIGSTOP) before the TLS handshake:  ETIMEDOUT, within the
 *   the TCP connect completes (the kernel's accept      connect timeout (and the
 *   queue), the handshake never does                    mismatch probe's)
 * the server's handshake bytes trickled (proxy)       ETIMEDOUT, the same bound
 * a server that closes right after the handshake:      EIO
 *   with our request unread (a reset), after reading
 *   it with a close_notify, and without one
 * a reply that trickles in, a byte every 10 ms        ETIMEDOUT, one deadline:
 *   (proxy), on a connection already open               the call's timeout
 *
 * The closing server is an OpenSSL server in a thread of this program (a real
 * Redis never closes right after a handshake); once it stops closing it
 * relays to the real Redis, so the same limiter shows the recovery.
 */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "hirate_io.h"
#include "proxy.h"
#include "redis_harness.h"
#include "test_faults.h"

static rh_server S;   /* a TLS server of its own: SIGSTOP must reach only this test's */

enum { TIMEOUT_MS = 300, CONNECT_MS = 300 };

static hirate_limiter *tls_limiter(const char *url, int policy, int deny_cache)
{
    hirate_options o;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE] = "";
    hirate_options_init(&o);
    o.functions = 0;   /* the EVALSHA path; test_sentinel.c has FCALL's */
    o.url = url;
    o.capacity = 10;
    o.rate = FAULT_RATE;
    o.on_error = policy;
    o.timeout_ms = TIMEOUT_MS;
    o.connect_timeout_ms = CONNECT_MS;
    o.backoff_min_ms = 20;
    o.backoff_max_ms = 200;
    o.deny_cache = deny_cache;
    o.tls_ca_file = S.ca_file;
    int rc = hirate_limiter_new(&lim, &o, why, sizeof why);
    if (rc != 0) fprintf(stderr, "  hirate_limiter_new: %s (%s)\n", hirate_err_name(rc), why);
    CHECK_EQ_I64(rc, 0);
    return lim;
}

static fcfg as_fcfg(int policy)
{
    return (fcfg){.on_error = policy, .capacity = 10, .timeout_ms = TIMEOUT_MS,
                  .connect_timeout_ms = CONNECT_MS, .backoff_min_ms = 20, .backoff_max_ms = 200};
}

static hirate_counters tls_counters(hirate_limiter *lim)
{
    hirate_counters c;
    memset(&c, 0, sizeof c);
    hirate_counters_get(lim, &c);
    return c;
}

/* DEL key on the server: 1 when it was there. */
static long long int_reply_del(rh_server *s, const char *key)
{
    redisReply *r = rh_command(s, "DEL %s", key);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r) freeReplyObject(r);
    return v;
}

static int64_t probe_ms(hirate_limiter *lim)
{
    hirate_endpoint ep;
    return hirate_endpoint_get(lim, &ep) == 0 ? ep.probe_timeout_ms : 0;
}

/* After the fault: Redis decides again within the breaker's longest wait,
 * and the next call is Redis' with `remaining` left. */
static void recovers(hirate_limiter *lim, const fexpect *e, int64_t remaining, const char *what)
{
    double back = wait_for_redis(lim, "probe", 3000);
    printf("  %s: Redis decides again %.1f ms after the fault cleared\n", what, back);
    CHECK(back >= 0 && back <= (double)e->max_wait_us / MS + SLACK_MS + CONNECT_MS);
    hirate_decision d;
    int64_t dt;
    CHECK(redis_decided(timed_allow(lim, "k", 1, &d, &dt), &d, 1, remaining, what));
}

/* ---- a handshake that never completes ------------------------------------------------ */

/* The first call of a fresh limiter, during the fault: the policy's decision
 * with ETIMEDOUT, within the connect timeout and the probe's. */
static void handshake_times_out(hirate_limiter *lim, fcfg c, const char *what)
{
    fexpect e = fault_expect(c);
    hirate_decision d;
    int64_t dt;
    /* Over TLS the handshake has three quarters of the connect timeout and
     * the mismatch probe the last quarter (docs/semantics.md). */
    hirate_endpoint ep;
    CHECK_EQ_I64(hirate_endpoint_get(lim, &ep), 0);
    int64_t bound = (CONNECT_MS + SLACK_MS) * MS;
    int rc = timed_allow(lim, "k", 1, &d, &dt);
    printf("  %s, on_error %s: %s (%s) in %.1f ms (bound %.0f ms): %s\n", what,
           hirate_on_error_name(c.on_error), hirate_source_name(d.source),
           hirate_err_name(d.error), (double)dt / MS, (double)bound / MS, fault_errmsg(lim));
    CHECK(policy_decided(&e, rc, &d, 1, HIRATE_ETIMEDOUT, what));
    CHECK(dt >= ep.connect_timeout_ms * MS * 4 / 5);   /* it waited for the handshake */
    CHECK(dt <= bound);
    /* The breaker answers the next calls at once, with the same failure. */
    rc = timed_allow(lim, "k", 1, &d, &dt);
    CHECK(policy_decided(&e, rc, &d, 1, HIRATE_ETIMEDOUT, what));
    CHECK(dt <= 5 * MS + SLACK_MS * MS);
    hirate_counters st = tls_counters(lim);
    CHECK(st.breaker_opens >= 1);
    CHECK(st.policy >= 2);
}

static void stopped_mid_handshake(int policy)
{
    fcfg c = as_fcfg(policy);
    hirate_limiter *lim = tls_limiter(S.url, policy, 0);
    if (!lim) return;
    rh_pause(&S);
    handshake_times_out(lim, c, "server stopped before the TLS handshake");
    rh_resume(&S);
    fexpect e = fault_expect(c);
    recovers(lim, &e, 9, "after SIGCONT");
    CHECK_EQ_I64(int_reply_del(&S, "rl:k"), 1);
    hirate_limiter_free(lim);
}

static void test_a_server_stopped_mid_handshake_times_out_then_recovers(void)
{
    ON_ERROR_EACH(p) stopped_mid_handshake(p);
}

static void trickled_handshake(int policy)
{
    proxy *px = NULL;
    CHECK_EQ_I64(proxy_start(&px, S.tls_port), 0);
    if (!px) return;
    char url[128];
    snprintf(url, sizeof url, "rediss://localhost:%d", proxy_port(px));
    fcfg c = as_fcfg(policy);
    hirate_limiter *lim = tls_limiter(url, policy, 0);
    if (lim) {
        /* The server's first flight is a few KB: at 2 ms a byte, seconds. */
        proxy_set(px, PROXY_TRICKLE, 2);
        handshake_times_out(lim, c, "the server's handshake trickled");
        proxy_set(px, PROXY_PASS, 0);
        fexpect e = fault_expect(c);
        recovers(lim, &e, 9, "after the trickle");
        CHECK_EQ_I64(int_reply_del(&S, "rl:k"), 1);
        hirate_limiter_free(lim);
    }
    proxy_stop(px);
}

static void test_a_trickled_handshake_is_bounded_by_the_connect_timeout(void)
{
    ON_ERROR_EACH(p) trickled_handshake(p);
}

/* ---- a reply that trickles in ----------------------------------------------------------- */

static void trickled_reply(int policy)
{
    proxy *px = NULL;
    CHECK_EQ_I64(proxy_start(&px, S.tls_port), 0);
    if (!px) return;
    char url[128];
    snprintf(url, sizeof url, "rediss://localhost:%d", proxy_port(px));
    fcfg c = as_fcfg(policy);
    fexpect e = fault_expect(c);
    hirate_limiter *lim = tls_limiter(url, policy, 0);
    if (lim) {
        hirate_decision d;
        int64_t dt;
        CHECK(redis_decided(timed_allow(lim, "k", 1, &d, &dt), &d, 1, 9, "before the trickle"));
        hirate_counters st0 = tls_counters(lim);
        /* The reply's TLS record is over 100 bytes: over a second at 10 ms a
         * byte, each byte well within the timeout of the one before. */
        proxy_set(px, PROXY_TRICKLE, 10);
        int rc = timed_allow(lim, "k", 1, &d, &dt);
        printf("  a trickled reply, on_error %s: %s (%s) in %.1f ms\n",
               hirate_on_error_name(policy), hirate_source_name(d.source),
               hirate_err_name(d.error), (double)dt / MS);
        CHECK(policy_decided(&e, rc, &d, 1, HIRATE_ETIMEDOUT, "a trickled reply"));
        CHECK(dt >= TIMEOUT_MS * MS * 4 / 5);
        CHECK(dt <= (TIMEOUT_MS + SLACK_MS) * MS);   /* one deadline, not one a read */
        hirate_counters st1 = tls_counters(lim);
        CHECK_EQ_I64(st1.evalsha - st0.evalsha, 1);
        CHECK_EQ_I64(st1.conns_dropped - st0.conns_dropped, 1);   /* never read again */
        proxy_set(px, PROXY_PASS, 0);
        /* The timed-out call ran in Redis: 9, it, then this call. */
        recovers(lim, &e, 7, "after the trickle");
        CHECK_EQ_I64(int_reply_del(&S, "rl:k"), 1);
        hirate_limiter_free(lim);
    }
    proxy_stop(px);
}

static void test_a_reply_that_trickles_in_is_bounded_by_one_timeout(void)
{
    ON_ERROR_EACH(p) trickled_reply(p);
}

/* ---- a server that closes right after the handshake --------------------------------------- */

enum { CLOSE_UNREAD = 1, CLOSE_NOTIFY, CLOSE_ABRUPT, RELAY };

static struct {
    SSL_CTX *ctx;
    int lfd, port, upstream;
    int mode;                 /* atomic: CLOSE_UNREAD, CLOSE_NOTIFY, CLOSE_ABRUPT or RELAY */
    int stop;                 /* atomic */
    uint64_t handshakes;      /* atomic: TLS handshakes completed */
    pthread_t thread;
} T;

static int connect_upstream(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Plain bytes between the TLS client and Redis' plain port, until either
 * side closes or the server stops. */
static void relay(SSL *ssl, int cfd)
{
    int ufd = connect_upstream(T.upstream);
    if (ufd < 0) return;
    char buf[16384];
    while (!__atomic_load_n(&T.stop, __ATOMIC_ACQUIRE)) {
        struct pollfd fds[2] = {{cfd, POLLIN, 0}, {ufd, POLLIN, 0}};
        if (!SSL_pending(ssl) && poll(fds, 2, 50) <= 0) continue;
        if (SSL_pending(ssl) || fds[0].revents) {
            int n = SSL_read(ssl, buf, sizeof buf);
            if (n <= 0 || send(ufd, buf, (size_t)n, MSG_NOSIGNAL) != n) break;
        }
        if (fds[1].revents) {
            ssize_t n = recv(ufd, buf, sizeof buf, 0);
            if (n <= 0 || SSL_write(ssl, buf, (int)n) != (int)n) break;
        }
    }
    close(ufd);
}

static void *serve_one(void *arg)
{
    int cfd = (int)(intptr_t)arg;
    SSL *ssl = SSL_new(T.ctx);
    if (ssl && SSL_set_fd(ssl, cfd) == 1 && SSL_accept(ssl) == 1) {
        __atomic_fetch_add(&T.handshakes, 1, __ATOMIC_ACQ_REL);
        int mode = __atomic_load_n(&T.mode, __ATOMIC_ACQUIRE);
        char req[4096];
        if (mode == RELAY) {
            relay(ssl, cfd);
        } else if (mode != CLOSE_UNREAD && SSL_read(ssl, req, sizeof req) > 0) {
            /* The request read, so that the close is a FIN, not a reset
             * (CLOSE_UNREAD: closed with it unread, the kernel resets). */
            if (mode == CLOSE_NOTIFY) SSL_shutdown(ssl);
            shutdown(cfd, SHUT_WR);
            struct pollfd p = {cfd, POLLIN, 0};
            while (poll(&p, 1, 200) > 0 && recv(cfd, req, sizeof req, 0) > 0) {}
        }
        /* CLOSE_ABRUPT: the socket just closes, no close_notify. */
    }
    if (ssl) SSL_free(ssl);
    close(cfd);
    return NULL;
}

static void *tls_server_main(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&T.stop, __ATOMIC_ACQUIRE)) {
        struct pollfd p = {T.lfd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        int cfd = accept4(T.lfd, NULL, NULL, SOCK_CLOEXEC);
        if (cfd < 0) continue;
        pthread_t t;
        if (pthread_create(&t, NULL, serve_one, (void *)(intptr_t)cfd) == 0) pthread_detach(t);
        else close(cfd);
    }
    return NULL;
}

static int tls_server_start(void)
{
    char crt[400], key[400];
    T.ctx = SSL_CTX_new(TLS_server_method());
    if (!T.ctx ||
        SSL_CTX_use_certificate_chain_file(T.ctx, rh_cert_path(&S, "server.crt", crt, sizeof crt))
            != 1 ||
        SSL_CTX_use_PrivateKey_file(T.ctx, rh_cert_path(&S, "server.key", key, sizeof key),
                                    SSL_FILETYPE_PEM) != 1) {
        ERR_print_errors_fp(stderr);
        return -1;
    }
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    T.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (T.lfd < 0 || bind(T.lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(T.lfd, 64) != 0 ||
        getsockname(T.lfd, (struct sockaddr *)&a, &alen) != 0)
        return -1;
    T.port = ntohs(a.sin_port);
    T.upstream = S.port;
    return pthread_create(&T.thread, NULL, tls_server_main, NULL) == 0 ? 0 : -1;
}

static void tls_server_stop(void)
{
    __atomic_store_n(&T.stop, 1, __ATOMIC_RELEASE);
    pthread_join(T.thread, NULL);
    close(T.lfd);
    sleep_ms(120);   /* the relays see the stop within their 50 ms poll */
    SSL_CTX_free(T.ctx);
}

static void closed_after_handshake(int policy, int mode, const char *what)
{
    char url[128];
    snprintf(url, sizeof url, "rediss://localhost:%d", T.port);
    fcfg c = as_fcfg(policy);
    fexpect e = fault_expect(c);
    __atomic_store_n(&T.mode, mode, __ATOMIC_RELEASE);
    hirate_limiter *lim = tls_limiter(url, policy, 0);
    if (!lim) return;
    uint64_t hs0 = __atomic_load_n(&T.handshakes, __ATOMIC_ACQUIRE);
    hirate_decision d;
    int64_t dt;
    int rc = timed_allow(lim, "k", 1, &d, &dt);
    printf("  %s, on_error %s: %s (%s) in %.1f ms: %s\n", what, hirate_on_error_name(policy),
           hirate_source_name(d.source), hirate_err_name(d.error), (double)dt / MS,
           fault_errmsg(lim));
    CHECK(policy_decided(&e, rc, &d, 1, HIRATE_EIO, what));
    CHECK(dt <= (CONNECT_MS + probe_ms(lim) + SLACK_MS) * MS);
    CHECK(__atomic_load_n(&T.handshakes, __ATOMIC_ACQUIRE) > hs0);   /* it got that far */
    CHECK(tls_counters(lim).breaker_opens >= 1);
    __atomic_store_n(&T.mode, RELAY, __ATOMIC_RELEASE);
    recovers(lim, &e, 9, "once the server relays to Redis");
    CHECK_EQ_I64(int_reply_del(&S, "rl:k"), 1);
    hirate_limiter_free(lim);
}

static void test_a_server_that_closes_after_the_handshake_is_eio(void)
{
    if (tls_server_start() != 0) {
        CHECK(!"the closing TLS server must start");
        return;
    }
    ON_ERROR_EACH(p) {
        closed_after_handshake(p, CLOSE_UNREAD, "closed after the handshake, the request unread");
        closed_after_handshake(p, CLOSE_NOTIFY, "closed after the handshake, with close_notify");
        closed_after_handshake(p, CLOSE_ABRUPT, "closed after the handshake, no close_notify");
    }
    tls_server_stop();
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);   /* timings reach the log even on a crash */
    memset(&S, 0, sizeof S);
    S.tls = 1;
    if (rh_start(&S) != 0) {
        CHECK(!"a TLS redis-server must start");
        return check_summary("test_faults_tls");
    }
    printf("redis-server pid %d, TLS port %d, plain port %d\n", (int)S.pid, S.tls_port, S.port);
    rh_watchdog(&S, "test_faults_tls", 150);

    test_a_server_stopped_mid_handshake_times_out_then_recovers();
    test_a_trickled_handshake_is_bounded_by_the_connect_timeout();
    test_a_reply_that_trickles_in_is_bounded_by_one_timeout();
    test_a_server_that_closes_after_the_handshake_is_eio();

    rh_stop(&S);
    return check_summary("test_faults_tls");
}
