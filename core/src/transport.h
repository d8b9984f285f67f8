/*
 * The blocking client's sockets: connect with a deadline (TCP to a name or
 * an IPv4/IPv6 address, every address in turn; or a unix socket), TCP
 * keepalive, TLS, and bounded sends and receives. No Redis rules live here:
 * what to send and what the bytes mean is the io layer's (hirate_io.h).
 *
 * After connecting, the socket is blocking with SO_RCVTIMEO/SO_SNDTIMEO, so
 * that a lone call costs one send() and one recv() (or SSL_write/SSL_read).
 * Deadlines are on the monotonic clock (hirate_monotonic_us).
 */
#ifndef HIRATE_TRANSPORT_H
#define HIRATE_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "hirate_io.h"
#include "tls.h"

typedef struct hirate_sock {
    int fd;
    void *ssl;              /* SSL *, NULL for plain */
    int rcvtimeo_ms;        /* the receive timeout now set (0: none) */
    int dontwait;           /* TLS: the next reads and writes must not block */
    int64_t deadline_us;    /* TLS: while SSL_read runs, when its reply is due */
} hirate_sock;

/* TLS modes of hirate_sock_connect. */
enum { HIRATE_SOCK_PLAIN, HIRATE_SOCK_TLS, HIRATE_SOCK_TLS_NOVERIFY };

/* Connects to ep by deadline_us: plain, or TLS through ctx with ep's server
 * name (verified unless HIRATE_SOCK_TLS_NOVERIFY or !ep->tls_verify).
 * *session, when not NULL and set, is offered for resumption (SSL_SESSION *).
 * Returns 0, or HIRATE_ECONNECT (refused, unreachable, no such host, or no
 * TCP connection by the deadline), HIRATE_ETIMEDOUT (a TLS handshake that
 * got no answer by the deadline), HIRATE_EIO (closed or reset during the TLS handshake) or
 * HIRATE_ETLS (the peer failed verification, or spoke no TLS), with the
 * message in err ("connect to 127.0.0.1:6380: Connection refused",
 * "TLS handshake with localhost:6380: certificate verify failed: ..."). */
int hirate_sock_connect(hirate_sock *s, const hirate_endpoint *ep, hirate_tls_ctx *ctx, int mode,
                        void **session, int64_t deadline_us, char *err, size_t errlen);

/* Sends all of buf by deadline_us: 0, HIRATE_ETIMEDOUT or HIRATE_EIO, or
 * HIRATE_ETLS when the server refused us with a TLS alert after the
 * handshake (TLS 1.3 without the client certificate it requires). */
int hirate_sock_send(hirate_sock *s, const char *buf, size_t len, int64_t deadline_us,
                     char *err, size_t errlen);

/* Reads what has arrived, waiting for something until deadline_us: the
 * number of bytes (> 0), or HIRATE_ETIMEDOUT, HIRATE_ETLS (an alert, as
 * above), or HIRATE_EIO ("Redis closed
 * the connection" at end of file). */
long hirate_sock_recv(hirate_sock *s, char *buf, size_t cap, int64_t deadline_us, char *err,
                      size_t errlen);

/* True when an idle connection can no longer carry a call: the peer closed
 * it or sent bytes nobody asked for (TLS records that carry no data, such as
 * session tickets, are consumed, not counted). Never blocks. */
int hirate_sock_gone(hirate_sock *s);

/* Closes. quiet (after fork(), in the child): not a byte is sent, no TLS
 * close_notify, nothing shared with the parent is touched but the
 * descriptor. Otherwise, when session is not NULL, *session gets the TLS
 * session for resumption (freeing the one it held). */
void hirate_sock_close(hirate_sock *s, int quiet, void **session);

/* Frees a session that hirate_sock_close handed out. */
void hirate_sock_session_free(void *session);

#endif
