/*
 * redis://[[user]:password@]host[:port][/db]   (host may be [IPv6])
 * rediss://...                                 the same over TLS
 * unix://[[user]:password@]/path[?db=N]
 * redis+cluster://[[user]:password@]host[:port][,host[:port]...][/0]
 * rediss+cluster://...                         a Redis Cluster's seeds, TLS
 * redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]
 * rediss+sentinel://...                        sentinels (default port 26379)
 *                                              and the master's name, TLS
 *
 * Messages name the part that is wrong and never quote the user or password.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "hirate.h"
#include "url.h"

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Percent-decodes [s, s+n) into out (size cap). Returns 0, or -1 when it is
 * malformed, does not fit, or decodes to a NUL byte. */
static int decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '%') {
            int hi, lo;
            if (i + 2 >= n) return -1;
            hi = hexval(s[i + 1]);
            lo = hexval(s[i + 2]);
            if (hi < 0 || lo < 0) return -1;
            c = (char)(hi * 16 + lo);
            if (c == '\0') return -1;
            i += 2;
        }
        if (o + 1 >= cap) return -1;
        out[o++] = c;
    }
    out[o] = '\0';
    return 0;
}

/* A whole decimal number in [lo, hi] spanning exactly [s, s+n). */
static int parse_int(const char *s, size_t n, long lo, long hi, int *out)
{
    long v = 0;
    if (n == 0 || n > 9) return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

/* Splits "[[user]:password@]" off the front of *p. */
static int parse_userinfo(const char **p, const char *end, hirate_url *u, char *err, size_t errlen)
{
    const char *at = NULL;
    for (const char *q = *p; q < end && *q != '/' && *q != '?'; q++)
        if (*q == '@') at = q;   /* the last '@' before the path ends the userinfo */
    if (!at)
        return 0;
    const char *colon = memchr(*p, ':', (size_t)(at - *p));
    const char *user_end = colon ? colon : at;
    if (decode(*p, (size_t)(user_end - *p), u->user, sizeof u->user) < 0)
        return hirate__fail(err, errlen, HIRATE_EURL,
                            "invalid Redis URL: the user name is malformed or too long");
    if (colon && decode(colon + 1, (size_t)(at - colon - 1), u->password, sizeof u->password) < 0)
        return hirate__fail(err, errlen, HIRATE_EURL,
                            "invalid Redis URL: the password is malformed or too long");
    /* "user@" and "user:@" alike: AUTH without a password would drop the
     * user and log in as the default one. */
    if (u->user[0] && !u->password[0])
        return hirate__fail(err, errlen, HIRATE_EURL,
                            "invalid Redis URL: a user name needs a password (user:password@)");
    *p = at + 1;
    return 0;
}

/* One "host[:port]" of a seed list at p (host may be [v6]): its end, or NULL
 * when it is malformed. */
static const char *seed_end(const char *p, const char *end, int default_port, char host[256],
                            int *port)
{
    const char *h = p, *he, *q;
    if (p < end && *p == '[') {
        h = p + 1;
        if (!(he = memchr(h, ']', (size_t)(end - h))))
            return NULL;
        q = he + 1;
    } else {
        for (q = p; q < end && *q != ':' && *q != ',' && *q != '/' && *q != '?'; q++) {}
        he = q;
    }
    if (he == h || (size_t)(he - h) >= 256 || memchr(h, '@', (size_t)(he - h)))
        return NULL;
    memcpy(host, h, (size_t)(he - h));
    host[he - h] = '\0';
    *port = default_port;
    if (q < end && *q == ':') {
        const char *ps = ++q;
        while (q < end && *q != ',' && *q != '/' && *q != '?') q++;
        if (parse_int(ps, (size_t)(q - ps), 1, 65535, port) < 0)
            return NULL;
    }
    return q;
}

/* The seeds after the first, kept as written in u->seeds: the end of the
 * list, or NULL with the message in err. */
static const char *parse_seeds(const char *p, const char *end, hirate_url *u, char *err,
                               size_t errlen)
{
    const char *start = p;
    int n = 1;
    for (;;) {
        char host[256];
        int port;
        const char *q = seed_end(p, end, u->port, host, &port);
        if (!q) {
            hirate__fail(err, errlen, HIRATE_EURL,
                         "invalid Redis URL: %s %d must be host[:port] (port 1 to 65535)",
                         u->sentinel ? "sentinel" : "seed", n + 1);
            return NULL;
        }
        if (++n > 16) {
            hirate__fail(err, errlen, HIRATE_EURL, "invalid Redis URL: more than 16 %s",
                         u->sentinel ? "sentinels" : "seeds");
            return NULL;
        }
        p = q;
        if (p == end || *p != ',')
            break;
        p++;
    }
    if ((size_t)(p - start) >= sizeof u->seeds) {
        hirate__fail(err, errlen, HIRATE_EURL, "invalid Redis URL: the %s list is too long",
                     u->sentinel ? "sentinel" : "seed");
        return NULL;
    }
    memcpy(u->seeds, start, (size_t)(p - start));
    u->seeds[p - start] = '\0';
    return p;
}

int hirate_url_next_seed(const hirate_url *u, const char **p, char host[256], int *port)
{
    if (!*p || !**p)
        return 0;
    const char *end = *p + strlen(*p);
    const char *q = seed_end(*p, end, u->sentinel ? 26379 : 6379, host, port);
    if (!q)
        return 0;
    *p = *q == ',' ? q + 1 : q;
    return 1;
}

/* A Sentinel URL's "/service": the master's name, as the sentinels know it.
 * The end of it, or NULL with the message in err. */
static const char *parse_service(const char *q, const char *end, hirate_url *u, char *err,
                                 size_t errlen)
{
    if (q == end || *q != '/' || q + 1 == end || q[1] == '/' || q[1] == '?') {
        hirate__fail(err, errlen, HIRATE_EURL,
                     "invalid Redis URL: a Sentinel URL names the master after the sentinels, "
                     "as in redis+sentinel://host:26379/mymaster");
        return NULL;
    }
    const char *s = ++q;
    while (q < end && *q != '/' && *q != '?') q++;
    if (decode(s, (size_t)(q - s), u->service, sizeof u->service) < 0) {
        hirate__fail(err, errlen, HIRATE_EURL,
                     "invalid Redis URL: the master's name is malformed or longer than %zu bytes",
                     sizeof u->service - 1);
        return NULL;
    }
    for (const char *c = u->service; *c; c++) {
        if ((unsigned char)*c <= ' ' || *c == 0x7f) {
            hirate__fail(err, errlen, HIRATE_EURL,
                         "invalid Redis URL: the master's name has a space or a control "
                         "character");
            return NULL;
        }
    }
    return q;
}

static int parse_tcp(const char *p, const char *end, hirate_url *u, char *err, size_t errlen)
{
    const char *host, *host_end, *q;
    if (*p == '[') {
        host = p + 1;
        host_end = memchr(host, ']', (size_t)(end - host));
        if (!host_end)
            return hirate__fail(err, errlen, HIRATE_EURL, "invalid Redis URL: unclosed '[' in the host");
        q = host_end + 1;
    } else {
        host = p;
        for (q = p; q < end && *q != ':' && *q != '/' && *q != '?' && *q != ','; q++) {}
        host_end = q;
    }
    if (host_end == host)
        return hirate__fail(err, errlen, HIRATE_EURL, "invalid Redis URL: the host is missing");
    if ((size_t)(host_end - host) >= sizeof u->host)
        return hirate__fail(err, errlen, HIRATE_EURL, "invalid Redis URL: the host is too long");
    memcpy(u->host, host, (size_t)(host_end - host));
    u->host[host_end - host] = '\0';

    if (q < end && *q == ':') {
        const char *ps = ++q;
        while (q < end && *q != '/' && *q != '?' && *q != ',') q++;
        if (parse_int(ps, (size_t)(q - ps), 1, 65535, &u->port) < 0)
            return hirate__fail(err, errlen, HIRATE_EURL,
                                "invalid Redis URL: the port must be a number from 1 to 65535");
    }
    if (q < end && *q == ',') {
        if (!u->cluster && !u->sentinel)
            return hirate__fail(err, errlen, HIRATE_EURL,
                                "invalid Redis URL: several hosts need redis+cluster:// "
                                "(or rediss+cluster://)");
        if ((q = parse_seeds(q + 1, end, u, err, errlen)) == NULL)
            return HIRATE_EURL;
    }
    if (u->sentinel && (q = parse_service(q, end, u, err, errlen)) == NULL)
        return HIRATE_EURL;
    if (q < end && *q == '/') {
        const char *ds = ++q;
        while (q < end && *q != '?') q++;
        if (q > ds && parse_int(ds, (size_t)(q - ds), 0, 1000000, &u->db) < 0)
            return hirate__fail(err, errlen, HIRATE_EURL,
                                "invalid Redis URL: the database must be a number from 0 up");
    }
    if (q < end)
        return hirate__fail(err, errlen, HIRATE_EURL,
                            "invalid Redis URL: unexpected query after the host (use /db)");
    if (u->cluster && u->db)
        return hirate__fail(err, errlen, HIRATE_EURL,
                            "invalid Redis URL: a cluster has only database 0, got /%d", u->db);
    return 0;
}

static int parse_unix(const char *p, const char *end, hirate_url *u, char *err, size_t errlen)
{
    const char *q = memchr(p, '?', (size_t)(end - p));
    const char *path_end = q ? q : end;
    if (path_end == p || *p != '/')
        return hirate__fail(err, errlen, HIRATE_EURL,
                            "invalid Redis URL: unix:// needs an absolute socket path");
    if (decode(p, (size_t)(path_end - p), u->path, sizeof u->path) < 0)
        return hirate__fail(err, errlen, HIRATE_EURL,
                            "invalid Redis URL: the socket path is malformed or longer than %zu bytes",
                            sizeof u->path - 1);
    if (q) {
        q++;
        if ((size_t)(end - q) < 3 || memcmp(q, "db=", 3) != 0 ||
            parse_int(q + 3, (size_t)(end - q - 3), 0, 1000000, &u->db) < 0)
            return hirate__fail(err, errlen, HIRATE_EURL,
                                "invalid Redis URL: the only query is ?db=N with N a number from 0 up");
    }
    return 0;
}

int hirate_url_parse(const char *url, hirate_url *u, char *err, size_t errlen)
{
    memset(u, 0, sizeof *u);
    u->port = 6379;
    if (!url || !*url)
        return hirate__fail(err, errlen, HIRATE_EURL, "invalid Redis URL: it is empty");

    const char *end = url + strlen(url);
    const char *p;
    if (strncmp(url, "redis://", 8) == 0) {
        p = url + 8;
    } else if (strncmp(url, "unix://", 7) == 0) {
        p = url + 7;
        u->is_unix = 1;
    } else if (strncmp(url, "rediss://", 9) == 0) {
        p = url + 9;
        u->tls = 1;
    } else if (strncmp(url, "redis+cluster://", 16) == 0) {
        p = url + 16;
        u->cluster = 1;
    } else if (strncmp(url, "rediss+cluster://", 17) == 0) {
        p = url + 17;
        u->cluster = u->tls = 1;
    } else if (strncmp(url, "redis+sentinel://", 17) == 0) {
        p = url + 17;
        u->sentinel = 1;
        u->port = 26379;
    } else if (strncmp(url, "rediss+sentinel://", 18) == 0) {
        p = url + 18;
        u->sentinel = u->tls = 1;
        u->port = 26379;
    } else {
        return hirate__fail(err, errlen, HIRATE_EURL,
                            "invalid Redis URL: it must start with redis://, rediss://, unix://, "
                            "redis+cluster://, rediss+cluster://, redis+sentinel:// or "
                            "rediss+sentinel://");
    }
    int rc = parse_userinfo(&p, end, u, err, errlen);
    if (rc < 0)
        return rc;
    return u->is_unix ? parse_unix(p, end, u, err, errlen) : parse_tcp(p, end, u, err, errlen);
}

int hirate_url_auth_argv(const hirate_url *u, const char *argv[3], size_t lens[3])
{
    if (!u->password[0])
        return 0;
    int n = 0;
    argv[n] = "AUTH";
    lens[n++] = 4;
    if (u->user[0]) {   /* an ACL user; else the default user's password */
        argv[n] = u->user;
        lens[n++] = strlen(u->user);
    }
    argv[n] = u->password;
    lens[n++] = strlen(u->password);
    return n;
}

int hirate_url_select_argv(const hirate_url *u, char db[16], const char *argv[2], size_t lens[2])
{
    if (!u->db)
        return 0;
    snprintf(db, 16, "%d", u->db);
    argv[0] = "SELECT";
    lens[0] = 6;
    argv[1] = db;
    lens[1] = strlen(db);
    return 2;
}
