/* The blocking client's sockets: connect by a deadline, TLS, bounded I/O (see transport.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "errors.h"
#include "memory.h"
#include "transport.h"


/* TCP keepalive as hiredis sets it: probe after 15 s idle,
 * every 5 s, give up after 3, so that a dead peer is noticed in ~30 s. */
#define KEEPALIVE_IDLE_S 15
#define KEEPALIVE_INTVL_S 5
#define KEEPALIVE_CNT 3

/* ---- time ------------------------------------------------------------------------- */

/* What is left of the deadline in whole milliseconds, rounded up; 0 when
 * it has passed. */
static int ms_left(int64_t deadline_us)
{
    int64_t left = deadline_us - hirate_monotonic_us();
    if (left <= 0)
        return 0;
    left = (left + 999) / 1000;
    return left > INT_MAX ? INT_MAX : (int)left;
}

/* Waits for events on fd until the deadline: 1 ready, 0 timed out. */
static int wait_fd(int fd, short events, int64_t deadline_us)
{
    for (;;) {
        int ms = ms_left(deadline_us);
        if (ms == 0)
            return 0;
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, ms);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return 1;   /* let the next I/O call say what is wrong */
    }
}

static void set_timeo(int fd, int opt, int ms)
{
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof tv);
}

/* ---- a BIO that cannot raise SIGPIPE --------------------------------------------- */

/* OpenSSL's socket BIO writes with write(2), which raises SIGPIPE on a
 * connection the peer reset; changing the process' disposition is not a
 * library's to do. This BIO sends with MSG_NOSIGNAL instead. Its data is the
 * hirate_sock: its dontwait asks for MSG_DONTWAIT (the idle check and the
 * last close_notify must never block), and its deadline bounds every read
 * that SSL_read makes for one record, so that a record that trickles in
 * cannot stretch a call read by read. It never closes the descriptor:
 * hirate_sock_close does. */
static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

static int bio_fd(BIO *b, int *flags)
{
    hirate_sock *s = BIO_get_data(b);
    *flags = s->dontwait ? MSG_DONTWAIT : 0;
    return s->fd;
}

static void bio_set(BIO *b, hirate_sock *s, int dontwait)
{
    s->dontwait = dontwait;
    BIO_set_data(b, s);
}

static int bio_retry(BIO *b, int writing)
{
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        if (writing)
            BIO_set_retry_write(b);
        else
            BIO_set_retry_read(b);
    }
    return -1;
}

static int bio_write(BIO *b, const char *buf, int len)
{
    int flags;
    int fd = bio_fd(b, &flags);
    BIO_clear_retry_flags(b);
    ssize_t n = send(fd, buf, (size_t)len, flags | MSG_NOSIGNAL);
    return n >= 0 ? (int)n : bio_retry(b, 1);
}

static int bio_read(BIO *b, char *buf, int len)
{
    int flags;
    int fd = bio_fd(b, &flags);
    hirate_sock *s = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    if (!flags && s->deadline_us) {
        /* Only what is left of the call's deadline; the timeout is set
         * again only when that differs from the one set. */
        int ms = ms_left(s->deadline_us);
        if (ms == 0) {
            errno = EAGAIN;
            return bio_retry(b, 0);
        }
        if (ms != s->rcvtimeo_ms) {
            set_timeo(fd, SO_RCVTIMEO, ms);
            s->rcvtimeo_ms = ms;
        }
    }
    ssize_t n = recv(fd, buf, (size_t)len, flags);
    return n >= 0 ? (int)n : bio_retry(b, 0);
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)num;
    int flags;
    switch (cmd) {
    case BIO_CTRL_FLUSH:
        return 1;
    case BIO_C_GET_FD:
        if (ptr)
            *(int *)ptr = bio_fd(b, &flags);
        return bio_fd(b, &flags);
    default:
        return 0;
    }
}

static int bio_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

static int bio_destroy(BIO *b)
{
    (void)b;
    return 1;
}

static void bio_make(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "hirate socket");
    if (m && BIO_meth_set_write(m, bio_write) && BIO_meth_set_read(m, bio_read) &&
        BIO_meth_set_ctrl(m, bio_ctrl) && BIO_meth_set_create(m, bio_create) &&
        BIO_meth_set_destroy(m, bio_destroy)) {
        bio_method = m;
        return;
    }
    BIO_meth_free(m);
}

/* ---- errors ----------------------------------------------------------------------- */

/* OpenSSL's words for the last failure, and an empty error queue for the
 * next call in this thread. */
static const char *ssl_reason(void)
{
    unsigned long e = ERR_peek_last_error();
    const char *why = e ? ERR_reason_error_string(e) : NULL;
    ERR_clear_error();
    return why ? why : "unknown error";
}

/* Can an address be tried next? A refusal, an unreachable network or an
 * address family this host lacks is that address' problem only. */
static int connect_failed(int e)
{
    return e == ECONNREFUSED || e == ENETUNREACH || e == EHOSTUNREACH || e == EADDRNOTAVAIL ||
           e == EAFNOSUPPORT || e == ENOENT || e == ECONNRESET || e == ETIMEDOUT || e == EACCES ||
           e == EPERM || e == ENOTSOCK;
}

/* ---- connecting ------------------------------------------------------------------- */

/* One address: 0 with *out, HIRATE_ETIMEDOUT, or HIRATE_ECONNECT with *e. */
static int connect_one(int family, const struct sockaddr *sa, socklen_t salen, int64_t deadline_us,
                       int *out, int *e)
{
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        *e = errno;
        return HIRATE_ECONNECT;
    }
    int rc = connect(fd, sa, salen);
    if (rc < 0 && (errno == EINPROGRESS || errno == EAGAIN || errno == EINTR)) {
        if (!wait_fd(fd, POLLOUT, deadline_us)) {
            close(fd);
            return HIRATE_ETIMEDOUT;
        }
        socklen_t len = sizeof *e;
        *e = 0;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, e, &len) < 0)
            *e = errno;
        rc = *e ? -1 : 0;
        errno = *e;
    }
    if (rc < 0) {
        *e = errno;
        close(fd);
        return HIRATE_ECONNECT;
    }
    *out = fd;
    return 0;
}

static int connect_unix(const hirate_endpoint *ep, int64_t deadline_us, int *fd, char *err,
                        size_t errlen)
{
    struct sockaddr_un sun;
    memset(&sun, 0, sizeof sun);
    sun.sun_family = AF_UNIX;
    if (strlen(ep->path) >= sizeof sun.sun_path)
        return hirate__fail(err, errlen, HIRATE_ECONNECT, "connect to %s: path too long", ep->where);
    memcpy(sun.sun_path, ep->path, strlen(ep->path) + 1);
    int e = 0;
    int rc = connect_one(AF_UNIX, (struct sockaddr *)&sun, sizeof sun, deadline_us, fd, &e);
    if (rc == HIRATE_ETIMEDOUT)   /* nothing connected: nothing was sent */
        return hirate__fail(err, errlen, HIRATE_ECONNECT, "connect to %s: no answer within %d ms",
                            ep->where, ep->connect_timeout_ms);
    if (rc < 0)
        return hirate__fail(err, errlen, rc, "connect to %s: %s", ep->where, strerror(e));
    return 0;
}

/* Every address of the name in turn, until one takes the connection or the
 * deadline passes. No AI_ADDRCONFIG: glibc does not count loopback addresses
 * as configured, so a host with only lo would find no address for ::1 or
 * localhost. An address family the host lacks fails at once instead. */
static int connect_tcp(const hirate_endpoint *ep, int64_t deadline_us, int *fd, char *err,
                       size_t errlen)
{
    struct addrinfo hints, *res = NULL;
    char port[16];
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(port, sizeof port, "%d", ep->port);
    int g = getaddrinfo(ep->host, port, &hints, &res);
    if (g != 0)
        return hirate__fail(err, errlen, g == EAI_MEMORY ? HIRATE_ENOMEM : HIRATE_ECONNECT,
                            "connect to %s: %s", ep->where,
                            g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
    int rc = HIRATE_ECONNECT, e = EADDRNOTAVAIL;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        rc = connect_one(a->ai_family, a->ai_addr, a->ai_addrlen, deadline_us, fd, &e);
        if (rc == 0 || rc == HIRATE_ETIMEDOUT || !connect_failed(e))
            break;
    }
    freeaddrinfo(res);
    if (rc == HIRATE_ETIMEDOUT)   /* nothing connected: nothing was sent */
        return hirate__fail(err, errlen, HIRATE_ECONNECT, "connect to %s: no answer within %d ms",
                            ep->where, ep->connect_timeout_ms);
    if (rc < 0)
        return hirate__fail(err, errlen, rc, "connect to %s: %s", ep->where, strerror(e));
    int one = 1;
    setsockopt(*fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(*fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    int idle = KEEPALIVE_IDLE_S, intvl = KEEPALIVE_INTVL_S, cnt = KEEPALIVE_CNT;
    setsockopt(*fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(*fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(*fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    return 0;
}

static int is_ip_literal(const char *host)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

/* Why a handshake failed, in the words of "TLS handshake with X: ...". */
static int handshake_error(SSL *ssl, int ret, const hirate_endpoint *ep, const char *name,
                           char *err, size_t errlen)
{
    int e = errno;
    int kind = SSL_get_error(ssl, ret);
    long v = SSL_get_verify_result(ssl);
    if (kind == SSL_ERROR_SSL && v != X509_V_OK) {
        int named = v == X509_V_ERR_HOSTNAME_MISMATCH || v == X509_V_ERR_IP_ADDRESS_MISMATCH;
        ERR_clear_error();
        return hirate__fail(err, errlen, HIRATE_ETLS,
                            "TLS handshake with %s: certificate verify failed: %s%s%s%s",
                            ep->where, X509_verify_cert_error_string(v),
                            named ? " (the certificate is not for " : "", named ? name : "",
                            named ? ")" : "");
    }
    if (kind == SSL_ERROR_SSL)
        return hirate__fail(err, errlen, HIRATE_ETLS, "TLS handshake with %s: %s", ep->where,
                            ssl_reason());
    ERR_clear_error();
    /* The peer went away mid-handshake: an outage, unless the probe finds
     * that it speaks plain Redis. */
    if (kind == SSL_ERROR_SYSCALL && ret < 0 && e != 0)
        return hirate__fail(err, errlen, HIRATE_EIO, "TLS handshake with %s: %s", ep->where,
                            strerror(e));
    return hirate__fail(err, errlen, HIRATE_EIO,
                        "TLS handshake with %s: the server closed the connection", ep->where);
}

static int tls_handshake(hirate_sock *s, const hirate_endpoint *ep, hirate_tls_ctx *ctx, int mode,
                         void **session, int64_t deadline_us, char *err, size_t errlen)
{
    pthread_once(&bio_once, bio_make);
    if (!ctx)
        return hirate__fail(err, errlen, HIRATE_ETLS, "TLS handshake with %s: no TLS context",
                            ep->where);
    SSL *ssl = bio_method ? SSL_new(hirate__tls_ssl_ctx(ctx)) : NULL;
    BIO *bio = ssl ? BIO_new(bio_method) : NULL;
    if (!bio) {
        SSL_free(ssl);
        ERR_clear_error();
        return hirate__fail(err, errlen, HIRATE_ENOMEM, "TLS handshake with %s: out of memory",
                            ep->where);
    }
    bio_set(bio, s, 0);
    SSL_set_bio(ssl, bio, bio);
    s->ssl = ssl;

    const char *name = ep->tls_server_name ? ep->tls_server_name : ep->host;
    int ip = is_ip_literal(name);
    int ok = 1;
    /* SNI names a host; RFC 6066 forbids sending an address. */
    if (!ip)
        ok = SSL_set_tlsext_host_name(ssl, name);
    if (mode == HIRATE_SOCK_TLS && ep->tls_verify) {
        /* As ssl.create_default_context() checks: the chain, then the name
         * (no partial wildcards such as f*.example.com) or the address. */
        SSL_set_verify(ssl, SSL_VERIFY_PEER, NULL);
        if (ip) {
            ok = ok && X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name);
        } else {
            SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
            ok = ok && SSL_set1_host(ssl, name);
        }
    } else {
        SSL_set_verify(ssl, SSL_VERIFY_NONE, NULL);
    }
    if (ok && session && *session)
        ok = SSL_set_session(ssl, (SSL_SESSION *)*session);
    if (!ok)
        return hirate__fail(err, errlen, HIRATE_ETLS, "TLS handshake with %s: %s", ep->where,
                            ssl_reason());

    for (;;) {
        ERR_clear_error();
        errno = 0;
        int ret = SSL_connect(ssl);
        if (ret == 1)
            return 0;
        int kind = SSL_get_error(ssl, ret);
        short ev = kind == SSL_ERROR_WANT_READ ? POLLIN : kind == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
        if (!ev)
            return handshake_error(ssl, ret, ep, name, err, errlen);
        if (!wait_fd(s->fd, ev, deadline_us)) {
            ERR_clear_error();
            return hirate__fail(err, errlen, HIRATE_ETIMEDOUT,
                                "TLS handshake with %s: no answer within %d ms", ep->where,
                                ep->connect_timeout_ms);
        }
    }
}

int hirate_sock_connect(hirate_sock *s, const hirate_endpoint *ep, hirate_tls_ctx *ctx, int mode,
                        void **session, int64_t deadline_us, char *err, size_t errlen)
{
    s->fd = -1;
    s->ssl = NULL;
    s->rcvtimeo_ms = 0;
    s->dontwait = 0;
    s->deadline_us = 0;
    int rc = ep->is_unix ? connect_unix(ep, deadline_us, &s->fd, err, errlen)
                         : connect_tcp(ep, deadline_us, &s->fd, err, errlen);
    if (rc == 0 && mode != HIRATE_SOCK_PLAIN && !ep->is_unix)
        rc = tls_handshake(s, ep, ctx, mode, session, deadline_us, err, errlen);
    if (rc < 0) {
        hirate_sock_close(s, 1, NULL);
        return rc;
    }
    /* Blocking from now on: a lone call is one send() and one recv(), the
     * kernel keeping time through SO_SNDTIMEO and SO_RCVTIMEO. */
    int fl = fcntl(s->fd, F_GETFL);
    if (fl >= 0)
        fcntl(s->fd, F_SETFL, fl & ~O_NONBLOCK);
    int ms = ep->timeout_ms > 0 ? ep->timeout_ms : 0;
    set_timeo(s->fd, SO_SNDTIMEO, ms);
    set_timeo(s->fd, SO_RCVTIMEO, ms);
    s->rcvtimeo_ms = ms;
    return 0;
}

/* ---- sending and receiving --------------------------------------------------------- */

/* A server that refuses the client after the handshake (TLS 1.3 and a
 * missing client certificate) sends an alert and closes: a request sent
 * after that meets a reset, while the alert waits to be read. Reads it:
 * 1 with the message when an alert was there. */
static int tls_refused(hirate_sock *s, char *err, size_t errlen)
{
    SSL *ssl = s->ssl;
    char byte;
    ERR_clear_error();
    bio_set(SSL_get_rbio(ssl), s, 1);
    int r = SSL_read(ssl, &byte, 1);
    int alert = r <= 0 && SSL_get_error(ssl, r) == SSL_ERROR_SSL &&
                ERR_GET_REASON(ERR_peek_last_error()) >= SSL_AD_REASON_OFFSET;
    if (alert)
        hirate__fail(err, errlen, HIRATE_ETLS, "send to Redis: TLS: %s", ssl_reason());
    ERR_clear_error();
    bio_set(SSL_get_rbio(ssl), s, 0);
    return alert;
}

/* The rest of a send: TLS, a partial send() or a full socket buffer. Out of
 * line, so that the usual plain send stays a few instructions. */
__attribute__((noinline)) static int send_rest(hirate_sock *s, const char *buf, size_t len,
                                               int64_t deadline_us, char *err, size_t errlen)
{
    SSL *ssl = s->ssl;
    while (len) {
        ssize_t n;
        int again;
        if (!ssl) {
            /* MSG_NOSIGNAL: a peer that closed must not SIGPIPE the process. */
            n = send(s->fd, buf, len, MSG_NOSIGNAL);
            again = n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK);
            if (n < 0 && !again)
                return hirate__fail(err, errlen, HIRATE_EIO, "send to Redis: %s", strerror(errno));
        } else {
            ERR_clear_error();
            /* Retried with the same bytes after WANT_WRITE, as OpenSSL asks. */
            n = SSL_write(ssl, buf, len > INT_MAX ? INT_MAX : (int)len);
            int kind = n > 0 ? SSL_ERROR_NONE : SSL_get_error(ssl, (int)n);
            again = kind == SSL_ERROR_WANT_WRITE || kind == SSL_ERROR_WANT_READ ||
                    (kind == SSL_ERROR_SYSCALL && errno == EINTR);
            if (n <= 0 && !again) {
                int e = errno;
                if (kind == SSL_ERROR_SYSCALL && tls_refused(s, err, errlen))
                    return HIRATE_ETLS;
                const char *why = kind == SSL_ERROR_SSL ? ssl_reason()
                                  : e ? strerror(e) : "the connection is closed";
                ERR_clear_error();
                return hirate__fail(err, errlen, HIRATE_EIO, "send to Redis: %s", why);
            }
        }
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
        } else if (!wait_fd(s->fd, POLLOUT, deadline_us)) {
            return hirate__fail(err, errlen, HIRATE_ETIMEDOUT, "sending to Redis took too long");
        }
    }
    return 0;
}

int hirate_sock_send(hirate_sock *s, const char *buf, size_t len, int64_t deadline_us, char *err,
                     size_t errlen)
{
    /* The usual case: plain, and the whole request taken at once. */
    if (!s->ssl) {
        ssize_t n = send(s->fd, buf, len, MSG_NOSIGNAL);
        if (n == (ssize_t)len)
            return 0;
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
        }
    }
    return send_rest(s, buf, len, deadline_us, err, errlen);
}

/* The rest of a receive: TLS, a wait cut short, the end, or a new
 * timeout to set. Out of line, as send_rest. */
__attribute__((noinline)) static long recv_rest(hirate_sock *s, char *buf, size_t cap,
                                                int64_t deadline_us, char *err, size_t errlen)
{
    SSL *ssl = s->ssl;
    for (;;) {
        /* Each wait is for what is left of the deadline; the timeout is set
         * again only when that differs from the one set (at the first read
         * of a round trip it is the whole of it, already set). */
        int ms = ms_left(deadline_us);
        if (ms == 0)
            return hirate__fail(err, errlen, HIRATE_ETIMEDOUT, "no reply from Redis in time");
        if (ms != s->rcvtimeo_ms) {
            set_timeo(s->fd, SO_RCVTIMEO, ms);
            s->rcvtimeo_ms = ms;
        }
        if (!ssl) {
            ssize_t n = recv(s->fd, buf, cap, 0);
            if (n > 0)
                return (long)n;
            if (n == 0)
                return hirate__fail(err, errlen, HIRATE_EIO, "Redis closed the connection");
            if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
                return hirate__fail(err, errlen, HIRATE_EIO, "receive from Redis: %s",
                                    strerror(errno));
            continue;   /* the deadline decides */
        }
        ERR_clear_error();
        errno = 0;
        s->deadline_us = deadline_us;
        int n = SSL_read(ssl, buf, cap > INT_MAX ? INT_MAX : (int)cap);
        s->deadline_us = 0;
        if (n > 0)
            return n;
        int e = errno;
        switch (SSL_get_error(ssl, n)) {
        case SSL_ERROR_WANT_READ:    /* a timeout, or a record without data (a ticket) */
        case SSL_ERROR_WANT_WRITE:   /* a renegotiation's answer could not go out yet */
            continue;
        case SSL_ERROR_ZERO_RETURN:
            return hirate__fail(err, errlen, HIRATE_EIO, "Redis closed the connection");
        case SSL_ERROR_SYSCALL:
            ERR_clear_error();
            if (e == EINTR)
                continue;
            if (n == 0 || e == 0)
                return hirate__fail(err, errlen, HIRATE_EIO, "Redis closed the connection");
            return hirate__fail(err, errlen, HIRATE_EIO, "receive from Redis: %s", strerror(e));
        default: {
            /* An alert from the server is its refusal (TLS 1.3 finishes the
             * client's handshake before a server that wants a client
             * certificate says there is none): a misconfiguration. Any other
             * TLS failure breaks this connection only. */
            int alert = ERR_GET_REASON(ERR_peek_last_error()) >= SSL_AD_REASON_OFFSET;
            return hirate__fail(err, errlen, alert ? HIRATE_ETLS : HIRATE_EIO,
                                "receive from Redis: TLS: %s", ssl_reason());
        }
        }
    }
}

long hirate_sock_recv(hirate_sock *s, char *buf, size_t cap, int64_t deadline_us, char *err,
                      size_t errlen)
{
    /* The usual case: plain, the timeout set is what is left of the
     * deadline (to the millisecond, rounded up), and bytes come. */
    if (!s->ssl) {
        int64_t left = deadline_us - hirate_monotonic_us();
        if ((uint64_t)((int64_t)s->rcvtimeo_ms * 1000 - left) < 1000 && left > 0) {
            ssize_t n = recv(s->fd, buf, cap, 0);
            if (n > 0)
                return (long)n;
            if (n == 0)
                return hirate__fail(err, errlen, HIRATE_EIO, "Redis closed the connection");
            if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
                return hirate__fail(err, errlen, HIRATE_EIO, "receive from Redis: %s",
                                    strerror(errno));
        }
    }
    return recv_rest(s, buf, cap, deadline_us, err, errlen);
}

/* hirate_sock_gone when TLS bytes have arrived. */
__attribute__((noinline)) static int tls_gone(hirate_sock *s)
{
    /* Records that carry no data (TLS 1.3 session tickets, sent after the
     * handshake) are read and forgotten; data, an alert or the end of the
     * stream mean the connection cannot carry a call. */
    SSL *ssl = s->ssl;
    char byte;
    if (SSL_pending(ssl) > 0)
        return 1;
    BIO *bio = SSL_get_rbio(ssl);
    bio_set(bio, s, 1);
    int gone = 1;
    for (int i = 0; i < 16; i++) {
        ERR_clear_error();
        int r = SSL_read(ssl, &byte, 1);
        if (r > 0 || SSL_get_error(ssl, r) != SSL_ERROR_WANT_READ)
            break;
        if (SSL_pending(ssl) > 0)
            break;
        if (SSL_has_pending(ssl))
            continue;   /* more records already read ahead */
        ssize_t n = recv(s->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            gone = 0;   /* all that came were records without data */
            break;
        }
        if (n <= 0)
            break;
    }
    ERR_clear_error();
    bio_set(bio, s, 0);
    return gone;
}

int hirate_sock_gone(hirate_sock *s)
{
    char byte;
    ssize_t n = recv(s->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return 1;
    if (n < 0)   /* nothing on the socket; TLS may hold records read ahead */
        return s->ssl && SSL_has_pending((SSL *)s->ssl) ? tls_gone(s) : 0;
    if (n == 0 || !s->ssl)
        return 1;   /* end of file, or bytes nobody asked for */
    return tls_gone(s);
}

/* ---- closing --------------------------------------------------------------------- */

void hirate_sock_close(hirate_sock *s, int quiet, void **session)
{
    SSL *ssl = s->ssl;
    if (ssl) {
        if (quiet) {
            /* After fork(): the session and the stream belong to the
             * parent. No close_notify, now or from SSL_free. */
            SSL_set_quiet_shutdown(ssl, 1);
        } else {
            if (session) {
                SSL_SESSION *sess = SSL_get1_session(ssl);
                if (sess && SSL_SESSION_is_resumable(sess)) {
                    SSL_SESSION_free((SSL_SESSION *)*session);
                    *session = sess;
                } else {
                    SSL_SESSION_free(sess);
                }
            }
            /* One close_notify if it can go out at once; no waiting for
             * the server's. */
            if (s->fd >= 0) {
                bio_set(SSL_get_wbio(ssl), s, 1);
                ERR_clear_error();
                SSL_shutdown(ssl);
            }
            SSL_set_quiet_shutdown(ssl, 1);
        }
    }
    if (s->fd >= 0)
        close(s->fd);
    if (ssl) {
        SSL_free(ssl);   /* our BIO neither writes nor closes here */
        ERR_clear_error();
    }
    s->fd = -1;
    s->ssl = NULL;
    s->rcvtimeo_ms = 0;
}

void hirate_sock_session_free(void *session)
{
    SSL_SESSION_free((SSL_SESSION *)session);
}
