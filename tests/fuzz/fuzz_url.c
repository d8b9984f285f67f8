/*
 * The Redis URL parser (core/src/url.c), on any string.
 *
 * It must accept or refuse without reading past the string, and:
 *   - a refusal is HIRATE_EURL with one of the parser's own messages, which
 *     quote nothing from the URL (so never a password);
 *   - an accepted URL has fields within their documented ranges, and
 *     written back out canonically (every byte of user, password and path
 *     percent-encoded) it parses to exactly the same fields;
 *   - the AUTH and SELECT it asks for encode to RESP that decodes to the same
 *     user, password and database;
 *   - hirate_limiter_new() accepts it too, and its message never holds the
 *     password.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "hirate_io.h"
#include "proto.h"
#include "url.h"

/* Everything url.c can say; the numbers are those of its limits. */
static const char *const messages[] = {
    "invalid Redis URL: it is empty",
    "invalid Redis URL: it must start with redis://, rediss://, unix://, redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel://",
    "invalid Redis URL: the user name is malformed or too long",
    "invalid Redis URL: the password is malformed or too long",
    "invalid Redis URL: a user name needs a password (user:password@)",
    "invalid Redis URL: unclosed '[' in the host",
    "invalid Redis URL: the host is missing",
    "invalid Redis URL: the host is too long",
    "invalid Redis URL: the port must be a number from 1 to 65535",
    "invalid Redis URL: the database must be a number from 0 up",
    "invalid Redis URL: unexpected query after the host (use /db)",
    "invalid Redis URL: unix:// needs an absolute socket path",
    "invalid Redis URL: the socket path is malformed or longer than 107 bytes",
    "invalid Redis URL: the only query is ?db=N with N a number from 0 up",
    "invalid Redis URL: several hosts need redis+cluster:// (or rediss+cluster://)",
    "invalid Redis URL: more than 16 seeds",
    "invalid Redis URL: more than 16 sentinels",
    "invalid Redis URL: the seed list is too long",
    "invalid Redis URL: the sentinel list is too long",
    "invalid Redis URL: a Sentinel URL names the master after the sentinels, as in redis+sentinel://host:26379/mymaster",
    "invalid Redis URL: the master's name is malformed or longer than 127 bytes",
    "invalid Redis URL: the master's name has a space or a control character",
    /* A '*' at the end: the rest is a number the message names. */
    "invalid Redis URL: a cluster has only database 0, got /*",
    "invalid Redis URL: seed * must be host[:port] (port 1 to 65535)",
    "invalid Redis URL: sentinel * must be host[:port] (port 1 to 65535)",
};

/* m is messages[i], where a '*' stands for a decimal number. */
static int matches(const char *m, const char *pattern)
{
    for (; *pattern; pattern++) {
        if (*pattern != '*') {
            if (*m++ != *pattern)
                return 0;
            continue;
        }
        if (*m < '0' || *m > '9')
            return 0;
        while (*m >= '0' && *m <= '9')
            m++;
    }
    return *m == '\0';
}

static int known_message(const char *m)
{
    for (size_t i = 0; i < sizeof messages / sizeof *messages; i++)
        if (matches(m, messages[i]))
            return 1;
    return 0;
}

/* Appends s percent-encoded (all but letters, digits and `keep`). */
static size_t put_encoded(char *out, size_t o, const char *s, const char *keep)
{
    static const char hex[] = "0123456789ABCDEF";
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            (c && strchr(keep, c))) {
            out[o++] = (char)c;
        } else {
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    return o;
}

/* The canonical form of a parsed URL. */
static void unparse(const hirate_url *u, char *out)
{
    size_t o = 0;
    const char *scheme = u->is_unix    ? "unix://"
                         : u->cluster  ? (u->tls ? "rediss+cluster://" : "redis+cluster://")
                         : u->sentinel ? (u->tls ? "rediss+sentinel://" : "redis+sentinel://")
                         : u->tls      ? "rediss://"
                                       : "redis://";
    o = strlen(scheme);
    memcpy(out, scheme, o);
    if (u->password[0]) {
        o = put_encoded(out, o, u->user, "");
        out[o++] = ':';
        o = put_encoded(out, o, u->password, "");
        out[o++] = '@';
    }
    if (u->is_unix) {
        o = put_encoded(out, o, u->path, "/");
        o += (size_t)sprintf(out + o, "?db=%d", u->db);
    } else {
        /* The host is kept as it was given, in brackets when it holds a
         * byte that would end a bare host (':' of IPv6, and '/', '?', '@',
         * ',', which a bracketed host may hold) or starts with one; a
         * cluster's other seeds (or the other sentinels) follow as they were
         * written, then a Sentinel URL's master. */
        int bracket = strpbrk(u->host, ":/?@,") != NULL || u->host[0] == '[';
        o += (size_t)sprintf(out + o, bracket ? "[%s]:%d" : "%s:%d", u->host, u->port);
        if (u->seeds[0])
            o += (size_t)sprintf(out + o, ",%s", u->seeds);
        if (u->sentinel) {
            out[o++] = '/';
            o = put_encoded(out, o, u->service, "");
        }
        o += (size_t)sprintf(out + o, "/%d", u->db);
    }
    out[o] = '\0';
}

static void check_fields(const hirate_url *u)
{
    FUZZ_CHECK(u->db >= 0 && u->db <= 1000000);
    FUZZ_CHECK(strlen(u->user) < sizeof u->user && strlen(u->password) < sizeof u->password);
    FUZZ_CHECK(!u->user[0] || u->password[0]);   /* a user always comes with a password */
    FUZZ_CHECK(u->tls == 0 || u->tls == 1);
    if (u->is_unix) {
        FUZZ_CHECK(u->path[0] == '/');
        FUZZ_CHECK(strlen(u->path) < sizeof u->path);
        FUZZ_CHECK(u->host[0] == '\0' && u->port == 6379);
        FUZZ_CHECK(u->tls == 0);   /* unix:// stays plain */
    } else {
        FUZZ_CHECK(u->host[0] != '\0' && strlen(u->host) < sizeof u->host);
        FUZZ_CHECK(u->port >= 1 && u->port <= 65535);
        FUZZ_CHECK(u->path[0] == '\0');
    }
}

/* AUTH [user] password and SELECT db, encoded and decoded again. */
static void check_handshake(const hirate_url *u)
{
    const char *argv[3];
    size_t lens[3];
    char buf[1024], db[16];
    hirate_reply rep;

    int argc = hirate_url_auth_argv(u, argv, lens);
    FUZZ_CHECK(argc == (u->password[0] ? (u->user[0] ? 3 : 2) : 0));
    if (argc) {
        size_t n = hirate_proto_encode_argv(buf, sizeof buf, argc, argv, lens);
        FUZZ_CHECK(n <= sizeof buf);
        FUZZ_CHECK_EQ(hirate_proto_parse(buf, n, &rep), (long)n);
        FUZZ_CHECK_EQ(rep.nelem, (size_t)argc);
        FUZZ_CHECK(rep.elem[0].len == 4 && memcmp(rep.elem[0].str, "AUTH", 4) == 0);
        const hirate_reply_elem *pw = &rep.elem[argc - 1];
        FUZZ_CHECK(pw->len == strlen(u->password) && memcmp(pw->str, u->password, pw->len) == 0);
        if (argc == 3)
            FUZZ_CHECK(rep.elem[1].len == strlen(u->user) &&
                       memcmp(rep.elem[1].str, u->user, rep.elem[1].len) == 0);
    }
    argc = hirate_url_select_argv(u, db, argv, lens);
    FUZZ_CHECK(argc == (u->db ? 2 : 0));
    if (argc) {
        size_t n = hirate_proto_encode_argv(buf, sizeof buf, argc, argv, lens);
        FUZZ_CHECK_EQ(hirate_proto_parse(buf, n, &rep), (long)n);
        FUZZ_CHECK_EQ(atoi(rep.elem[1].str), u->db);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A C string of exactly the input (up to a NUL it may hold), on the
     * heap so that ASan catches a read past its terminator. */
    char *url = malloc(size + 1);
    memcpy(url, data, size);
    url[size] = '\0';

    hirate_url u, again;
    char err[HIRATE_ERRMSG_SIZE] = "";
    int rc = hirate_url_parse(url, &u, err, sizeof err);
    FUZZ_CHECK(rc == 0 || rc == HIRATE_EURL);
    if (rc < 0) {
        if (!known_message(err)) {
            fprintf(stderr, "unknown message: %s\n", err);
            FUZZ_CHECK(!"a message quotes the URL");
        }
    } else {
        check_fields(&u);
        check_handshake(&u);
        char canon[4096];   /* a cluster's seeds, credentials percent-encoded */
        unparse(&u, canon);
        char err2[HIRATE_ERRMSG_SIZE] = "";
        int rc2 = hirate_url_parse(canon, &again, err2, sizeof err2);
        if (rc2 != 0 || memcmp(&u, &again, sizeof u) != 0) {
            fprintf(stderr, "canonical form %s does not read back (%s)\n", canon, err2);
            FUZZ_CHECK(!"parse(unparse(u)) == u");
        }
    }

    /* The limiter says the same, and never the password. */
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = 1;
    o.rate = 1;
    o.url = url;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE] = "";
    int lrc = hirate_limiter_new(&lim, &o, why, sizeof why);
    FUZZ_CHECK_EQ(lrc, rc);
    if (rc < 0) {
        FUZZ_CHECK(lim == NULL && strcmp(why, err) == 0);
    } else {
        hirate_endpoint ep;
        FUZZ_CHECK_EQ(hirate_endpoint_get(lim, &ep), 0);
        FUZZ_CHECK(ep.is_unix == u.is_unix && ep.port == u.port);
        FUZZ_CHECK(strcmp(ep.host, u.host) == 0 && strcmp(ep.path, u.path) == 0);
        FUZZ_CHECK(ep.tls == u.tls);
        /* The handshake: AUTH when there is a password, SELECT when a
         * database other than 0, then PING; each answered +OK, +PONG. Node
         * 0 of a Sentinel URL is a sentinel: no AUTH (it has no credentials
         * of its own here), no SELECT. */
        hirate_handshake *hs;
        char msg[HIRATE_ERRMSG_SIZE];
        FUZZ_CHECK_EQ(hirate_handshake_start(lim, &hs, msg, sizeof msg), 0);
        size_t n, used;
        hirate_handshake_request(hs, &n);
        FUZZ_CHECK(n > 0);
        static const char oks[] = "+OK\r\n+OK\r\n";
        size_t nok = u.sentinel ? 0 : 5 * (size_t)((u.password[0] != 0) + (u.db != 0));
        int state = nok ? hirate_handshake_feed(hs, oks, nok, &used) : HIRATE_IO_MORE;
        FUZZ_CHECK_EQ(state, HIRATE_IO_MORE);
        FUZZ_CHECK_EQ(hirate_handshake_feed(hs, "+PONG\r\n", 7, &used), HIRATE_IO_DONE);
        FUZZ_CHECK_EQ(hirate_handshake_result(hs, msg, sizeof msg), 0);
        hirate_handshake_free(hs);
        hirate_limiter_free(lim);
    }
    free(url);
    return 0;
}
