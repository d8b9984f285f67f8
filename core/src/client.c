/* Client identity: the client address of a request behind proxies, its key
 * (IPv6 by its network), identities and bucket keys (hirate.h, "Client
 * identity"). Addresses are held as 16 bytes, IPv4 as ::ffff:a.b.c.d, so
 * one comparison serves both families. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "hirate.h"
#include "sha256.h"

typedef struct net {
    uint8_t bytes[16];
    int bits;
} net;

struct hirate_client_ip {
    net *nets;
    size_t nnets;
    int trust_unix;
    int hops;
    int forwarded; /* 1: Forwarded, 0: X-Forwarded-For */
    int subnet;
};

static const uint8_t V4_MAPPED[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

/* A byte string: a slice of what the caller gave. */
typedef struct span {
    const char *p;
    size_t n;
} span;

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int hex_value(char c)
{
    if (is_digit(c))
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Whether s is word (lower case ASCII), case ignored. */
static int same_word(span s, const char *word)
{
    size_t n = strlen(word);
    if (s.n != n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s.p[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != word[i])
            return 0;
    }
    return 1;
}

static span trim(span s)
{
    while (s.n > 0 && is_space(s.p[0]))
        s.p++, s.n--;
    while (s.n > 0 && is_space(s.p[s.n - 1]))
        s.n--;
    return s;
}

/* A dotted quad. Leading zeros are refused: "010" is 8 to some parsers and
 * 10 to others. */
static int parse_v4(span s, uint8_t out[4])
{
    size_t i = 0;
    for (int part = 0; part < 4; part++) {
        if (part > 0) {
            if (i >= s.n || s.p[i] != '.')
                return 0;
            i++;
        }
        size_t start = i;
        unsigned v = 0;
        while (i < s.n && is_digit(s.p[i]) && i - start < 4)
            v = v * 10 + (unsigned)(s.p[i++] - '0');
        size_t len = i - start;
        if (len == 0 || len > 3 || (len > 1 && s.p[start] == '0') || v > 255)
            return 0;
        out[part] = (uint8_t)v;
    }
    return i == s.n;
}

/* The groups of one side of "::" into g[*n ..] (an IPv4 tail allowed where
 * tail_ok); 0 when they are not groups. */
static int groups(span part, int tail_ok, unsigned g[8], int *n)
{
    if (part.n == 0)
        return 1;
    size_t i = 0;
    for (;;) {
        size_t start = i;
        while (i < part.n && part.p[i] != ':')
            i++;
        span f = {part.p + start, i - start};
        int last = i == part.n;
        if (tail_ok && last && memchr(f.p, '.', f.n)) {
            uint8_t v4[4];
            if (!parse_v4(f, v4) || *n > 6)
                return 0;
            g[(*n)++] = (unsigned)v4[0] << 8 | v4[1];
            g[(*n)++] = (unsigned)v4[2] << 8 | v4[3];
        } else {
            if (f.n < 1 || f.n > 4 || *n > 7)
                return 0;
            unsigned v = 0;
            for (size_t k = 0; k < f.n; k++) {
                int h = hex_value(f.p[k]);
                if (h < 0)
                    return 0;
                v = v << 4 | (unsigned)h;
            }
            g[(*n)++] = v;
        }
        if (last)
            return 1;
        i++; /* the ':' */
    }
}

/* IPv6 text (one "::", an IPv4 tail allowed, no zone). */
static int parse_v6(span s, uint8_t out[16])
{
    if (s.n == 0)
        return 0;
    for (size_t i = 0; i < s.n; i++)
        if (hex_value(s.p[i]) < 0 && s.p[i] != ':' && s.p[i] != '.')
            return 0;
    span head = s, tail = {NULL, 0};
    int dc = 0;
    for (size_t i = 0; i + 1 < s.n; i++) {
        if (s.p[i] == ':' && s.p[i + 1] == ':') {
            dc = 1;
            head.n = i;
            tail.p = s.p + i + 2;
            tail.n = s.n - i - 2;
            for (size_t k = 0; k + 1 < tail.n; k++)
                if (tail.p[k] == ':' && tail.p[k + 1] == ':')
                    return 0;
            break;
        }
    }
    unsigned h[8], t[8];
    int nh = 0, nt = 0;
    if (!groups(head, !dc, h, &nh) || (dc && !groups(tail, 1, t, &nt)))
        return 0;
    int n = nh + nt;
    if ((dc && n > 7) || (!dc && n != 8))
        return 0;
    unsigned all[8] = {0};
    for (int i = 0; i < nh; i++)
        all[i] = h[i];
    for (int i = 0; i < nt; i++)
        all[8 - nt + i] = t[i];
    for (int i = 0; i < 8; i++) {
        out[2 * i] = (uint8_t)(all[i] >> 8);
        out[2 * i + 1] = (uint8_t)all[i];
    }
    return 1;
}

/* An address; *v4 says whether it was written as a dotted quad. */
static int parse_ip(span s, uint8_t out[16], int *v4)
{
    uint8_t q[4];
    if (parse_v4(s, q)) {
        memcpy(out, V4_MAPPED, 12);
        memcpy(out + 12, q, 4);
        if (v4)
            *v4 = 1;
        return 1;
    }
    if (v4)
        *v4 = 0;
    return parse_v6(s, out);
}

static int is_v4(const uint8_t b[16])
{
    return memcmp(b, V4_MAPPED, 12) == 0;
}

/* b with all but its first bits bits cleared. */
static void network(const uint8_t b[16], int bits, uint8_t out[16])
{
    for (int i = 0; i < 16; i++) {
        int keep = bits - 8 * i;
        out[i] = keep >= 8 ? b[i] : keep <= 0 ? 0 : (uint8_t)(b[i] & (0xff << (8 - keep)));
    }
}

/* The text of an address: a dotted quad for IPv4, else IPv6 with the
 * longest run (the first of equal ones) of two or more zero groups written
 * "::" (RFC 5952, as Python's ipaddress writes it). Returns its length. */
static size_t text(const uint8_t b[16], char *out)
{
    if (is_v4(b))
        return (size_t)sprintf(out, "%u.%u.%u.%u", b[12], b[13], b[14], b[15]);
    unsigned g[8];
    for (int i = 0; i < 8; i++)
        g[i] = (unsigned)b[2 * i] << 8 | b[2 * i + 1];
    int best = -1, best_len = 1, run = 0;
    for (int i = 0; i < 8; i++) {
        run = g[i] == 0 ? run + 1 : 0;
        if (run > best_len)
            best = i - run + 1, best_len = run;
    }
    size_t n = 0;
    for (int i = 0; i < 8; i++) {
        if (i == best) {
            n += (size_t)sprintf(out + n, "::");
            i += best_len - 1;
            continue;
        }
        n += (size_t)sprintf(out + n, "%s%x", n > 0 && out[n - 1] != ':' ? ":" : "", g[i]);
    }
    return n;
}

static int valid_port(span s)
{
    if (s.n < 2 || s.p[0] != ':')
        return 0;
    if (s.p[1] == '_') {
        if (s.n < 3)
            return 0;
        for (size_t i = 2; i < s.n; i++) {
            char c = s.p[i];
            if (!(is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' ||
                  c == '_' || c == '-'))
                return 0;
        }
        return 1;
    }
    if (s.n > 6)
        return 0;
    for (size_t i = 1; i < s.n; i++)
        if (!is_digit(s.p[i]))
            return 0;
    return 1;
}

/* s with every `from` (two bytes) replaced by `to`, into out (as long as s
 * at least). */
static span replace2(span s, char a, char b, char to, char *out)
{
    size_t n = 0;
    for (size_t i = 0; i < s.n; i++) {
        if (s.p[i] == a && i + 1 < s.n && s.p[i + 1] == b) {
            out[n++] = to;
            i++;
        } else {
            out[n++] = s.p[i];
        }
    }
    return (span){out, n};
}

/* One hop of X-Forwarded-For, or the for= of a Forwarded element
 * ("192.0.2.1", "192.0.2.1:80", "[2001:db8::1]:443", "2001:db8::1", quoted
 * or not): 1 and the address, 0 when it is not one ("unknown", an
 * obfuscated "_name", garbage), HIRATE_ENOMEM. */
static int parse_node(span s, uint8_t out[16])
{
    char small[256];
    char *buf = NULL;
    s = trim(s);
    if (s.n >= 2 && s.p[0] == '"' && s.p[s.n - 1] == '"') {
        span inner = {s.p + 1, s.n - 2};
        buf = inner.n <= sizeof small / 2 ? small : malloc(2 * inner.n + 1);
        if (!buf)
            return HIRATE_ENOMEM;
        /* \" first, then \\, as two passes. */
        span once = replace2(inner, '\\', '"', '"', buf);
        s = trim(replace2(once, '\\', '\\', '\\', buf + inner.n));
    }
    span host = s;
    int ok = 1;
    if (s.n > 0 && s.p[0] == '[') {
        const char *close = memchr(s.p, ']', s.n);
        if (!close) {
            ok = 0;
        } else {
            host = (span){s.p + 1, (size_t)(close - s.p - 1)};
            span rest = {close + 1, s.n - (size_t)(close + 1 - s.p)};
            ok = rest.n == 0 || valid_port(rest);
        }
    } else {
        const char *colon = memchr(s.p, ':', s.n);
        if (colon && !memchr(colon + 1, ':', s.n - (size_t)(colon + 1 - s.p))) {
            host.n = (size_t)(colon - s.p);
            ok = valid_port((span){colon, s.n - host.n});
        }
    }
    ok = ok && parse_ip(host, out, NULL);
    if (buf != small)
        free(buf);
    return ok;
}

/* ---------------------------------------------------------------- hops */

typedef struct hops {
    span *v;
    size_t n, cap;
    span small[32];
} hops;

static int push(hops *h, span s)
{
    if (h->n == h->cap) {
        size_t cap = h->cap * 2;
        span *v = malloc(cap * sizeof *v);
        if (!v)
            return HIRATE_ENOMEM;
        memcpy(v, h->v, h->n * sizeof *v);
        if (h->v != h->small)
            free(h->v);
        h->v = v;
        h->cap = cap;
    }
    h->v[h->n++] = s;
    return 0;
}

static int xff_hops(span value, hops *h)
{
    size_t start = 0;
    for (size_t i = 0; i <= value.n; i++) {
        if (i == value.n || value.p[i] == ',') {
            if (push(h, (span){value.p + start, i - start}) < 0)
                return HIRATE_ENOMEM;
            start = i + 1;
        }
    }
    return 0;
}

/* The for= of each element of a Forwarded value, left to right (empty for
 * an element without one); "," and ";" inside quoted strings belong to
 * them. Each parameter's text is the slice since the last separator. */
static int forwarded_fors(span value, hops *h)
{
    span element_for = {value.p, 0};
    int param = 0, is_for = 0, quoted = 0;
    size_t start = 0;
    size_t first = h->n;
    for (size_t i = 0; i <= value.n; i++) {
        char c = i < value.n ? value.p[i] : ',';
        if (quoted && i < value.n) {
            if (c == '\\' && i + 1 < value.n)
                i++;
            else if (c == '"')
                quoted = 0;
        } else if (c == '"') {
            quoted = 1;
        } else if (c == '=' && !param) {
            span name = trim((span){value.p + start, i - start});
            param = 1;
            is_for = same_word(name, "for");
            start = i + 1;
        } else if (c == ';' || c == ',') {
            if (param && is_for) {
                span v = trim((span){value.p + start, i - start});
                if (v.n > 0)
                    element_for = v;
            }
            param = is_for = 0;
            start = i + 1;
            if (c == ',') {
                if (push(h, element_for) < 0)
                    return HIRATE_ENOMEM;
                element_for = (span){value.p, 0};
            }
        }
    }
    if (quoted && h->n > first) /* unterminated: the last hop is garbage */
        h->v[h->n - 1].n = 0;
    return 0;
}

static int trusted(const hirate_client_ip *c, const uint8_t b[16])
{
    for (size_t i = 0; i < c->nnets; i++) {
        uint8_t m[16];
        network(b, c->nets[i].bits, m);
        if (memcmp(m, c->nets[i].bytes, 16) == 0)
            return 1;
    }
    return 0;
}

/* ------------------------------------------------------------- options */

static void number_text(char *out, size_t cap, double v)
{
    if (v == floor(v) && fabs(v) < 9.2e18)
        snprintf(out, cap, "%lld", (long long)v);
    else
        snprintf(out, cap, "%.14g", v);
}

static int parse_net(span spec, net *out)
{
    const char *slash = memchr(spec.p, '/', spec.n);
    span addr = spec;
    long bits = -1;
    if (slash && slash > spec.p) {
        span digits = {slash + 1, spec.n - (size_t)(slash + 1 - spec.p)};
        if (digits.n == 0)
            return 0;
        bits = 0;
        for (size_t i = 0; i < digits.n; i++) {
            if (!is_digit(digits.p[i]))
                return 0;
            if (bits < 1000)
                bits = bits * 10 + (digits.p[i] - '0');
        }
        addr.n = (size_t)(slash - spec.p);
    }
    uint8_t b[16];
    int v4;
    if (!parse_ip(addr, b, &v4))
        return 0;
    long max = v4 ? 32 : 128;
    if (bits < 0)
        bits = max;
    if (bits > max)
        return 0;
    out->bits = (int)(v4 ? bits + 96 : bits);
    network(b, out->bits, out->bytes);
    return 1;
}

int hirate_client_ip_new(hirate_client_ip **out, const char *const *trusted_list, size_t ntrusted,
                         double proxy_hops, const char *header, double ipv6_subnet, char *err,
                         size_t errlen)
{
    if (!out)
        return hirate__fail(err, errlen, HIRATE_EINVAL, "no place for the client options");
    *out = NULL;
    if (ntrusted > 0 && !trusted_list)
        return hirate__fail(err, errlen, HIRATE_EINVAL, "trusted_proxies is NULL");
    hirate_client_ip *c = calloc(1, sizeof *c);
    if (!c || (ntrusted > 0 && !(c->nets = calloc(ntrusted, sizeof *c->nets)))) {
        free(c);
        return hirate__fail(err, errlen, HIRATE_ENOMEM, "out of memory");
    }
    char shown[HIRATE_ERRMSG_SIZE];
    for (size_t i = 0; i < ntrusted; i++) {
        const char *entry = trusted_list[i] ? trusted_list[i] : "";
        span spec = trim((span){entry, strlen(entry)});
        if (same_word(spec, "unix")) {
            c->trust_unix = 1;
        } else if (parse_net(spec, &c->nets[c->nnets])) {
            c->nnets++;
        } else {
            hirate__quote(shown, sizeof shown / 2, entry, strlen(entry));
            hirate_client_ip_free(c);
            return hirate__fail(err, errlen, HIRATE_EOPTION,
                                "trusted_proxies: %s is not an address or network "
                                "(e.g. '10.0.0.0/8', '::1', 'unix')",
                                shown);
        }
    }
    if (!(proxy_hops >= 0 && proxy_hops <= 64 && proxy_hops == floor(proxy_hops))) {
        number_text(shown, sizeof shown, proxy_hops);
        hirate_client_ip_free(c);
        return hirate__fail(err, errlen, HIRATE_EOPTION,
                            "proxy_hops must be a whole number from 0 to 64, got %s", shown);
    }
    c->hops = (int)proxy_hops;
    span name = {header ? header : "", header ? strlen(header) : 0};
    if (header && same_word(name, "forwarded")) {
        c->forwarded = 1;
    } else if (header && !same_word(name, "x-forwarded-for")) {
        hirate__quote(shown, sizeof shown / 2, name.p, name.n);
        hirate_client_ip_free(c);
        return hirate__fail(err, errlen, HIRATE_EOPTION,
                            "forwarded_header must be 'X-Forwarded-For' or 'Forwarded', got %s",
                            shown);
    }
    if (!(ipv6_subnet >= 1 && ipv6_subnet <= 128 && ipv6_subnet == floor(ipv6_subnet))) {
        number_text(shown, sizeof shown, ipv6_subnet);
        hirate_client_ip_free(c);
        return hirate__fail(err, errlen, HIRATE_EOPTION,
                            "ipv6_subnet must be a prefix length from 1 to 128, got %s", shown);
    }
    c->subnet = (int)ipv6_subnet;
    *out = c;
    return 0;
}

void hirate_client_ip_free(hirate_client_ip *c)
{
    if (!c)
        return;
    free(c->nets);
    free(c);
}

const char *hirate_client_ip_header(const hirate_client_ip *c)
{
    return c && c->forwarded ? "Forwarded" : "X-Forwarded-For";
}

int hirate_client_ip_uses_header(const hirate_client_ip *c)
{
    return c && (c->nnets > 0 || c->trust_unix || c->hops > 0);
}

int hirate_client_ip_proxy_hops(const hirate_client_ip *c)
{
    return c ? c->hops : 0;
}

int hirate_client_ip_ipv6_subnet(const hirate_client_ip *c)
{
    return c ? c->subnet : 0;
}

/* -------------------------------------------------------------- resolve */

/* Where the walk ended: no client, the peer as given, or an address. */
typedef struct found {
    int kind;
    uint8_t b[16];
} found;

static found walk(const hirate_client_ip *c, const hops *h, found nearest)
{
    size_t n = h->n;
    uint8_t b[16];
    if (c->hops > 0) {
        size_t want = (size_t)c->hops;
        if (n < want)
            return nearest;
        for (size_t i = n; i > n - want + 1; i--) {
            if (parse_node(h->v[i - 1], b) != 1)
                return nearest;
            nearest.kind = HIRATE_CLIENT_ADDRESS;
            memcpy(nearest.b, b, 16);
        }
        if (parse_node(h->v[n - want], b) == 1) {
            nearest.kind = HIRATE_CLIENT_ADDRESS;
            memcpy(nearest.b, b, 16);
        }
        return nearest;
    }
    for (size_t i = n; i > 0; i--) {
        if (parse_node(h->v[i - 1], b) != 1)
            return nearest;
        nearest.kind = HIRATE_CLIENT_ADDRESS;
        memcpy(nearest.b, b, 16);
        if (!trusted(c, b))
            return nearest;
    }
    return nearest;
}

int hirate_client_ip_resolve(const hirate_client_ip *c, const char *peer, size_t peer_len,
                             const char *const *values, const size_t *lens, size_t n, char *out,
                             size_t cap)
{
    if (!c || !out || cap < HIRATE_CLIENT_TEXT_MAX || (n > 0 && (!values || !lens)))
        return HIRATE_EINVAL;
    if (!peer)
        peer_len = 0;
    found peer_at = {HIRATE_CLIENT_NONE, {0}};
    if (peer_len > 0) {
        int rc = parse_node((span){peer, peer_len}, peer_at.b);
        if (rc < 0)
            return rc;
        peer_at.kind = rc == 1 ? HIRATE_CLIENT_ADDRESS : HIRATE_CLIENT_AS_GIVEN;
    }
    found got = peer_at;
    int peer_trusted = peer_len > 0 ? peer_at.kind == HIRATE_CLIENT_ADDRESS && trusted(c, peer_at.b)
                                    : c->trust_unix;
    if (hirate_client_ip_uses_header(c) && n > 0 &&
        !((c->nnets > 0 || c->trust_unix) && !peer_trusted)) {
        hops h = {NULL, 0, 32, {{0}}};
        h.v = h.small;
        int rc = 0;
        for (size_t i = 0; i < n && rc == 0; i++) {
            span v = {values[i] ? values[i] : "", values[i] ? lens[i] : 0};
            rc = c->forwarded ? forwarded_fors(v, &h) : xff_hops(v, &h);
        }
        if (rc == 0)
            got = walk(c, &h, peer_at);
        if (h.v != h.small)
            free(h.v);
        if (rc < 0)
            return rc;
    }
    if (got.kind == HIRATE_CLIENT_ADDRESS)
        text(got.b, out);
    return got.kind;
}

int hirate_client_ip_key(const hirate_client_ip *c, const char *address, size_t len, char *out,
                         size_t cap)
{
    if (!c || !out || cap < HIRATE_CLIENT_TEXT_MAX)
        return HIRATE_EINVAL;
    if (!address)
        return HIRATE_CLIENT_NONE;
    uint8_t b[16];
    if (!parse_ip((span){address, len}, b, NULL))
        return HIRATE_CLIENT_AS_GIVEN;
    if (!is_v4(b) && c->subnet < 128) {
        uint8_t m[16];
        network(b, c->subnet, m);
        size_t k = text(m, out);
        sprintf(out + k, "/%d", c->subnet);
    } else {
        text(b, out);
    }
    return HIRATE_CLIENT_ADDRESS;
}

/* ----------------------------------------------------- identities, keys */

/* Writes the parts, one after another, into out when they fit with a NUL;
 * *outlen gets their length either way. */
static int join(const span *parts, int n, char *out, size_t cap, size_t *outlen)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += parts[i].n;
    *outlen = total;
    if (out && cap > total) {
        size_t k = 0;
        for (int i = 0; i < n; i++) {
            if (parts[i].n)
                memcpy(out + k, parts[i].p, parts[i].n);
            k += parts[i].n;
        }
        out[k] = '\0';
    }
    return 0;
}

int hirate_ident(int kind, const void *value, size_t len, char *out, size_t cap, size_t *outlen)
{
    if (!outlen || (kind != HIRATE_IDENT_ADDRESS && kind != HIRATE_IDENT_KEY) ||
        (kind == HIRATE_IDENT_KEY && !value && len > 0))
        return HIRATE_EINVAL;
    span parts[2];
    if (kind == HIRATE_IDENT_KEY) {
        parts[0] = (span){"k:", 2};
        parts[1] = (span){value, len};
    } else {
        parts[0] = (span){"ip:", 3};
        parts[1] = value ? (span){value, len} : (span){"unknown", 7};
    }
    return join(parts, 2, out, cap, outlen);
}

int hirate_bucket_key(const void *ident, size_t ident_len, const char *scope, size_t scope_len,
                      const char *head, size_t head_len, char *out, size_t cap, size_t *outlen)
{
    if (!outlen || (!ident && ident_len > 0) || (scope && !head && head_len > 0))
        return HIRATE_EINVAL;
    size_t tail = scope ? 3 + scope_len + head_len : 1;
    char hashed[1 + 2 * HIRATE_SHA256_SIZE];
    span id = {ident, ident_len};
    if (1 + ident_len + tail > HIRATE_KEY_MAX) {
        /* Plain identities start with "ip:" or "k:", so a hash never equals
         * one. */
        uint8_t d[HIRATE_SHA256_SIZE];
        hirate__sha256(ident, ident_len, d);
        hashed[0] = '#';
        for (int i = 0; i < HIRATE_SHA256_SIZE; i++) {
            hashed[1 + 2 * i] = "0123456789abcdef"[d[i] >> 4];
            hashed[2 + 2 * i] = "0123456789abcdef"[d[i] & 15];
        }
        id = (span){hashed, sizeof hashed};
    }
    span parts[7] = {{"{", 1}, id, {"}", 1}, {"|", 1}, {scope, scope_len}, {"|", 1},
                     {head ? head : "", head ? head_len : 0}};
    return join(parts, scope ? 7 : 3, out, cap, outlen);
}
