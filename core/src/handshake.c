/*
 * Opening a connection, without I/O: the bytes a new connection sends (AUTH
 * and SELECT as the URL asks, then a PING that proves the server speaks
 * Redis; to a sentinel, the sentinels' AUTH and PING; to a master that a
 * sentinel named, ROLE in PING's place), and what its replies, or its
 * failure, mean:
 *
 *   +OK / +PONG                       ready
 *   ROLE other than master            HIRATE_ESERVER (a master a sentinel named
 *                                     has been demoted: a failover is under way)
 *   an error to AUTH                  HIRATE_EAUTH (a wrong user or password)
 *   NOAUTH                            HIRATE_EAUTH (the server needs a password)
 *   an error to SELECT                HIRATE_EREPLY (no such database)
 *   max number of clients, DENIED     HIRATE_EREFUSED
 *   LOADING, BUSY, ...                HIRATE_ESERVER, an outage
 *   bytes that are not RESP           HIRATE_ENOTREDIS, or HIRATE_ETLS when they
 *                                     are a TLS record (a TLS port, plain URL)
 *   connect, timeout, closed          the outage the binding reports
 *
 * Two outages are what a TLS mismatch looks like, and are asked about once
 * on a second connection with the other transport (HIRATE_IO_PROBE): a
 * plain connection that the server closes without a byte at the first
 * command (a TLS port reads our bytes as a broken TLS record), and a TLS
 * handshake that gets no answer (a plain Redis waits for a newline that a
 * ClientHello never has). If the probe answers like Redis, the mismatch is
 * HIRATE_ETLS, a misconfiguration; if not, the outage stands.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "handshake.h"
#include "link.h"
#include "proto.h"
#include "reply.h"

/* ROLE lists a master's replicas: room for a few hundred. No other reply
 * of a handshake is an array. */
#define ROLE_REPLY_BYTES (64u << 10)
#define ROLE_REPLY_ELEMS 1024

enum { MAIN, PROBE, DONE };
enum { AUTH, SELECT, PING, ROLE };

struct hirate_handshake {
    hirate_link *k;
    int phase;
    int sent;               /* the request of this connection was taken */
    size_t got;             /* bytes fed on this connection */
    int want, next;         /* replies expected, and the next one's index */
    int kinds[3];
    hirate_rreader *rd;
    char *req;
    size_t reqlen;
    int rc;
    char err[HIRATE_ERRMSG_SIZE];
    int settled;            /* the backoff was told */
    char alien[64];         /* the first bytes, when they are not RESP */
    size_t nalien;
    char where[300];
};

static hirate_rreader *new_reader(const hirate_link *k)
{
    if (k->role == HIRATE_LINK_MASTER)
        return hirate_rreader_new(ROLE_REPLY_BYTES, ROLE_REPLY_ELEMS, HIRATE_IO_REPLY_MAX);
    return hirate_rreader_new(HIRATE_IO_REPLY_MAX, 0, HIRATE_IO_REPLY_MAX);
}

static const char ping[] = "*1\r\n$4\r\nPING\r\n";
static const char role[] = "*1\r\n$4\r\nROLE\r\n";

/* AUTH's arguments: the URL's, or a sentinel's own. */
static int auth_argv(const hirate_link *k, const char *argv[3], size_t lens[3])
{
    if (k->role != HIRATE_LINK_SENTINEL)
        return hirate_url_auth_argv(&k->url, argv, lens);
    if (!k->sentinel_password)
        return 0;
    int n = 0;
    argv[n] = "AUTH";
    lens[n++] = 4;
    if (k->sentinel_user) {
        argv[n] = k->sentinel_user;
        lens[n++] = strlen(k->sentinel_user);
    }
    argv[n] = k->sentinel_password;
    lens[n++] = strlen(k->sentinel_password);
    return n;
}

static int build_request(hirate_handshake *hs)
{
    const hirate_url *u = &hs->k->url;
    const char *argv[3];
    size_t lens[3], len = 0;
    char db[16];
    int argc;
    for (int write = 0; write < 2; write++) {
        char *p = write ? hs->req : NULL;
        len = 0;
        hs->want = 0;
        if ((argc = auth_argv(hs->k, argv, lens)) > 0) {
            len += hirate_proto_encode_argv(p ? p + len : NULL, p ? (size_t)-1 : 0, argc, argv,
                                            lens);
            hs->kinds[hs->want++] = AUTH;
        }
        if (hs->k->role != HIRATE_LINK_SENTINEL &&
            (argc = hirate_url_select_argv(u, db, argv, lens)) > 0) {
            len += hirate_proto_encode_argv(p ? p + len : NULL, p ? (size_t)-1 : 0, argc, argv,
                                            lens);
            hs->kinds[hs->want++] = SELECT;
        }
        /* A master a sentinel named proves it still is one (ROLE is as
         * much a proof that the server speaks Redis as PING). */
        int master = hs->k->role == HIRATE_LINK_MASTER;
        if (p)
            memcpy(p + len, master ? role : ping, sizeof ping - 1);
        len += sizeof ping - 1;
        hs->kinds[hs->want++] = master ? ROLE : PING;
        if (!write && !(hs->req = malloc(len)))
            return HIRATE_ENOMEM;
    }
    hs->reqlen = len;
    return 0;
}

int hirate__handshake_new(hirate_link *k, hirate_handshake **out)
{
    hirate_handshake *hs = calloc(1, sizeof *hs);
    if (!hs)
        return HIRATE_ENOMEM;
    hs->k = k;
    hirate_endpoint ep;
    hirate_link_endpoint(k, &ep);
    snprintf(hs->where, sizeof hs->where, "%s", ep.where);
    if (build_request(hs) < 0 ||
        !(hs->rd = new_reader(k))) {
        hirate_handshake_free(hs);
        return HIRATE_ENOMEM;
    }
    *out = hs;
    return 0;
}

const char *hirate_handshake_request(const hirate_handshake *hs, size_t *len)
{
    /* Taking the request is sending it: a failure after this point happened
     * with the server's first command on the wire. */
    ((hirate_handshake *)hs)->sent = 1;
    if (hs->phase == PROBE) {
        *len = sizeof ping - 1;
        return ping;
    }
    *len = hs->phase == MAIN ? hs->reqlen : 0;
    return hs->req;
}

/* Ends the handshake with rc and, for a failure, a message. */
static int finish(hirate_handshake *hs, int rc)
{
    hs->rc = rc;
    hs->phase = DONE;
    return HIRATE_IO_DONE;
}

static int finish_msg(hirate_handshake *hs, int rc, const char *fmt, const char *a)
{
    hirate__fail(hs->err, sizeof hs->err, 0, fmt, hs->where, a);
    return finish(hs, rc);
}

/* The probe answered like Redis: the transports were mismatched. */
static int mismatch(hirate_handshake *hs)
{
    if (hs->k->url.tls)
        return finish_msg(hs, HIRATE_ETLS,
                          "the TLS handshake with %s got no answer, and the port answers plain "
                          "Redis: use redis://, or the TLS port%s", "");
    return finish_msg(hs, HIRATE_ETLS,
                      "%s closed the connection at the first command, and the port speaks TLS: "
                      "use rediss://%s", "");
}

/* The server's first bytes are not RESP: say what it answered, from its
 * first line (or as much of it as came before the connection ended). */
static int alien_answer(hirate_handshake *hs)
{
    const char *buf = hs->alien;
    size_t n = 0;
    while (n < hs->nalien && buf[n] != '\r' && buf[n] != '\n')
        n++;
    char prefix[400];
    hirate__fail(prefix, sizeof prefix, 0, "the server at %s is not Redis: it answered \"", hs->where);
    char quoted[HIRATE_ERRMSG_SIZE];
    hirate__fail_quoting(quoted, sizeof quoted - 1, 0, prefix, buf, n);
    hirate__fail(hs->err, sizeof hs->err, 0, "%s\"", quoted);
    return finish(hs, HIRATE_ENOTREDIS);
}

/* Bytes that cannot begin a reply: a TLS record (a TLS port, plain URL),
 * or another protocol, kept until its first line is whole. */
static int not_resp(hirate_handshake *hs, const char *buf, size_t len)
{
    unsigned char c = (unsigned char)(hs->nalien ? hs->alien[0] : buf[0]);
    if (hs->phase == PROBE)
        return finish(hs, hs->rc);   /* no Redis there either: the outage stands */
    if (!hs->k->url.tls && (c == 0x15 || c == 0x16))
        return finish_msg(hs, HIRATE_ETLS,
                          "%s answered with a TLS record: it speaks TLS, use rediss://%s", "");
    size_t n = len < sizeof hs->alien - hs->nalien ? len : sizeof hs->alien - hs->nalien;
    memcpy(hs->alien + hs->nalien, buf, n);
    hs->nalien += n;
    hs->got += len;
    if (!memchr(hs->alien, '\n', hs->nalien) && hs->nalien < sizeof hs->alien)
        return HIRATE_IO_MORE;
    return alien_answer(hs);
}

/* ROLE's reply: [role, ...]; only "master" may take calls. */
static int judge_role(hirate_handshake *hs, const hirate_rnode *r)
{
    if (r->type != '*' || r->len < 1 || r->elem[0]->type != '$') {
        hirate__fail(hs->err, sizeof hs->err, 0, "malformed reply from Redis: ROLE from %s",
                     hs->where);
        return finish(hs, HIRATE_EPROTO);
    }
    const hirate_rnode *name = r->elem[0];
    if (name->len == 6 && memcmp(name->str, "master", 6) == 0)
        return 0;
    char what[32];
    size_t n = name->len < sizeof what - 1 ? name->len : sizeof what - 1;
    for (size_t i = 0; i < n; i++)
        what[i] = name->str[i] > ' ' && name->str[i] < 0x7f ? name->str[i] : '?';
    what[n] = '\0';
    /* A failover under way: an outage, until the sentinels name another. */
    hirate__fail(hs->err, sizeof hs->err, 0, "%s is not the master of '%s' (ROLE: %s)",
                 hs->where, hs->k->url.service, what);
    return finish(hs, HIRATE_ESERVER);
}

/* What reply number hs->next means. */
static int judge(hirate_handshake *hs, const hirate_rnode *r)
{
    int kind = hs->kinds[hs->next];
    if (hs->phase == PROBE)
        return mismatch(hs);   /* any RESP reply: Redis is there, on the other transport */
    if (r->type == '-') {
        int cls = hirate_proto_error_class(r->str, r->len);
        const char *what = kind == AUTH     ? "AUTH"
                           : kind == SELECT ? "SELECT"
                           : kind == ROLE   ? "ROLE"
                                            : "PING";
        char prefix[400];
        if (cls == HIRATE_EREFUSED) {
            hirate__fail(prefix, sizeof prefix, 0, "Redis at %s refused the connection: ", hs->where);
        } else if (cls == HIRATE_ESERVER) {
            hirate__fail(prefix, sizeof prefix, 0, "%s at %s: ", what, hs->where);
        } else if (kind == AUTH || cls == HIRATE_EAUTH) {
            cls = HIRATE_EAUTH;
            hirate__fail(prefix, sizeof prefix, 0, "%s refused: ", what);
        } else if (kind == SELECT) {
            cls = HIRATE_EREPLY;
            hirate__fail(prefix, sizeof prefix, 0, "SELECT %d refused: ", hs->k->url.db);
        } else {
            /* PING or ROLE refused by an ACL, say: still, Redis answered.
             * A user kept to the limiter's commands may not run ROLE; the
             * sentinels' word and READONLY then guard against a replica. */
            return 0;
        }
        hirate__fail_quoting(hs->err, sizeof hs->err, cls, prefix, r->str, r->len);
        return finish(hs, cls);
    }
    if (kind == ROLE)
        return judge_role(hs, r);
    if (kind != PING && !(r->type == '+' && r->len == 2 && memcmp(r->str, "OK", 2) == 0)) {
        hirate__fail(hs->err, sizeof hs->err, 0, "malformed reply from Redis: %s gave no +OK",
                 kind == AUTH ? "AUTH" : "SELECT");
        return finish(hs, HIRATE_EPROTO);
    }
    return 0;
}

int hirate_handshake_feed(hirate_handshake *hs, const char *buf, size_t len, size_t *used)
{
    *used = 0;
    if (hs->phase == DONE)
        return HIRATE_IO_DONE;   /* bytes after the end: the caller closes */
    *used = len;
    if (len && (hs->nalien || (hs->got == 0 && !memchr("+-:$*", buf[0], 5))))
        return not_resp(hs, buf, len);
    hs->got += len;
    const char *why = NULL;
    if (hirate_rreader_feed(hs->rd, buf, len, &why) < 0)
        goto malformed;
    for (;;) {
        hirate_rnode *r;
        int got = hirate_rreader_next(hs->rd, &r, &why);
        if (got < 0)
            goto malformed;
        if (got == 0)
            return HIRATE_IO_MORE;
        int state = judge(hs, r);
        hirate_rnode_free(r);
        if (state)
            return state;
        if (++hs->next == hs->want) {
            if (hirate_rreader_pending(hs->rd)) {
                snprintf(hs->err, sizeof hs->err,
                         "malformed reply from Redis: bytes after the handshake's replies");
                return finish(hs, HIRATE_EPROTO);
            }
            return finish(hs, 0);
        }
    }
malformed:
    if (hs->phase == PROBE)
        return finish(hs, hs->rc);
    hirate__fail(hs->err, sizeof hs->err, 0, "%s from %s: %s",
             hs->next ? "malformed reply" : "not a Redis reply", hs->where, why);
    return finish(hs, hs->next ? HIRATE_EPROTO : HIRATE_ENOTREDIS);
}

int hirate_handshake_fail(hirate_handshake *hs, int code, const char *why)
{
    if (hs->phase == DONE)
        return HIRATE_IO_DONE;
    if (hs->phase == PROBE)
        return finish(hs, hs->rc);   /* nothing there either: the first failure stands */
    if (code == HIRATE_ECLOSED) {
        hirate__fail(hs->err, sizeof hs->err, 0, "the handshake with %s was given up", hs->where);
        return finish(hs, HIRATE_ECLOSED);
    }
    if (hs->nalien)
        return alien_answer(hs);   /* it said something, and it was not Redis */
    int tls = hs->k->url.tls, tcp = !hs->k->url.is_unix;
    why = why && *why ? why : hirate_strerror(code);
    if (strstr(why, hs->where))
        hirate__fail(hs->err, sizeof hs->err, 0, "%s", why);   /* it names the server already */
    else if (!hs->sent)   /* over TLS, all but a failed TCP connect is the TLS handshake's */
        hirate__fail(hs->err, sizeof hs->err, 0, "%s %s: %s",
                 tls && code != HIRATE_ECONNECT ? "TLS handshake with" : "connect to", hs->where,
                 why);
    else
        hirate__fail(hs->err, sizeof hs->err, 0, "handshake with %s: %s", hs->where, why);
    if (code != HIRATE_ECONNECT && code != HIRATE_ETIMEDOUT && code != HIRATE_EIO &&
        code != HIRATE_ETLS)
        code = HIRATE_EIO;
    hs->rc = code;
    /* The two faces of a mismatch: ask the other transport once. */
    if ((tls && !hs->sent && code == HIRATE_ETIMEDOUT) ||
        (!tls && tcp && hs->sent && code == HIRATE_EIO && hs->got == 0)) {
        hs->phase = PROBE;
        hs->sent = 0;
        hs->got = 0;
        hs->next = 0;
        hs->want = 1;
        hs->kinds[0] = PING;
        hirate_rreader_free(hs->rd);
        if (!(hs->rd = new_reader(hs->k)))
            return finish(hs, hs->rc);
        return HIRATE_IO_PROBE;
    }
    return finish(hs, code);
}

int hirate_handshake_probe_tls(const hirate_handshake *hs)
{
    return hs->phase == PROBE && !hs->k->url.tls;
}

int hirate_handshake_result(hirate_handshake *hs, char *err, size_t errlen)
{
    if (hs->phase != DONE) {
        hs->rc = HIRATE_ECLOSED;
        hs->phase = DONE;
        hirate__fail(hs->err, sizeof hs->err, 0, "the handshake was not finished");
    }
    if (!hs->settled) {
        hs->settled = 1;
        hirate_link_outcome(hs->k, hs->rc, hs->err);
    }
    if (hs->rc < 0)
        hirate__fail(err, errlen, hs->rc, "%s", hs->err);
    return hs->rc;
}

void hirate_handshake_free(hirate_handshake *hs)
{
    if (!hs)
        return;
    hirate_rreader_free(hs->rd);
    if (hs->req) {
        /* It held the password. */
        memset(hs->req, 0, hs->reqlen);
        free(hs->req);
    }
    free(hs);
}
