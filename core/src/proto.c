/* RESP2 encoding of the script call and in-place parsing of its reply. */
#define _GNU_SOURCE /* strtod_l, uselocale: numbers on the wire ignore the locale */
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "proto.h"
#include "script.h"

/* The "C" locale, so that a host program's setlocale() (LC_NUMERIC="de_DE"
 * writes "0,1") cannot change what goes on the wire or how it is read. */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void make_c_locale(void)
{
    c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
}

static locale_t wire_locale(void)
{
    pthread_once(&c_locale_once, make_c_locale);
    return c_locale;
}

/* ---- parsing ------------------------------------------------------------ */

/* Index of the '\r' of the line starting at pos, 0 when the line is not
 * complete yet, or HIRATE_EPROTO. A line never starts at 0, so 0 is free. */
static long find_crlf(const char *buf, size_t len, size_t pos, const char **why)
{
    const char *cr = pos < len ? memchr(buf + pos, '\r', len - pos) : NULL;
    if (!cr) {
        if (len - pos > HIRATE_PROTO_MAX_REPLY) {
            *why = "line too long";
            return HIRATE_EPROTO;
        }
        return 0;
    }
    size_t i = (size_t)(cr - buf);
    /* The same limit when the end has arrived, or the answer would depend
     * on how the bytes were split. */
    if (i - pos > HIRATE_PROTO_MAX_REPLY) {
        *why = "line too long";
        return HIRATE_EPROTO;
    }
    if (i + 1 >= len)
        return 0;
    if (buf[i + 1] != '\n') {
        *why = "CR without LF";
        return HIRATE_EPROTO;
    }
    return (long)i;
}

/* Reads "[-]digits\r\n" (1 to 18 digits) at pos in one pass: the value, and
 * the position after the CRLF as the result; 0 when the line is not complete
 * yet; HIRATE_EPROTO with *why = bad when it is not such a line. */
static inline long parse_int_line(const char *buf, size_t len, size_t pos, int64_t *out,
                                  const char *bad, const char **why)
{
    size_t i = pos;
    int neg = i < len && buf[i] == '-';
    i += (size_t)neg;
    size_t first = i, stop = len - first > 19 ? first + 19 : len;
    uint64_t v = 0;   /* unsigned: 19 digits may wrap, harmlessly, before the check */
    unsigned d;
    for (; i < stop && (d = (unsigned char)buf[i] - (unsigned char)'0') <= 9; i++)
        v = v * 10 + d;
    if (i - first > 18) {
        *why = bad;
        return HIRATE_EPROTO;
    }
    if (i >= len)
        return 0;
    if (i == first || buf[i] != '\r') {
        *why = bad;
        return HIRATE_EPROTO;
    }
    if (i + 1 >= len)
        return 0;
    if (buf[i + 1] != '\n') {
        *why = "CR without LF";
        return HIRATE_EPROTO;
    }
    *out = neg ? -(int64_t)v : (int64_t)v;
    return (long)(i + 2);
}

/* Parses the scalar at pos into *e. Returns the position after it, 0 when
 * incomplete, or HIRATE_EPROTO. */
static inline long parse_scalar(const char *buf, size_t len, size_t pos,
                                hirate_reply_elem *e, const char **why)
{
    if (pos >= len)
        return 0;
    char type = buf[pos];
    long end;
    int64_t blen;

    e->str = NULL;
    e->len = 0;
    e->integer = 0;
    switch (type) {
    case '+':
    case '-':
        end = find_crlf(buf, len, pos + 1, why);
        if (end <= 0)
            return end;
        e->type = type;
        e->str = buf + pos + 1;
        e->len = (size_t)end - pos - 1;
        return end + 2;
    case ':':
        end = parse_int_line(buf, len, pos + 1, &e->integer, "malformed integer", why);
        if (end > 0)
            e->type = ':';
        return end;
    case '$':
        end = parse_int_line(buf, len, pos + 1, &blen, "bulk length out of range", why);
        if (end <= 0)
            return end;
        if (blen < -1 || blen > HIRATE_PROTO_MAX_REPLY) {
            *why = "bulk length out of range";
            return HIRATE_EPROTO;
        }
        if (blen == -1) {
            e->type = 0;
            return end;
        }
        if (len < (size_t)end + (size_t)blen + 2)
            return 0;
        if (buf[end + blen] != '\r' || buf[end + blen + 1] != '\n') {
            *why = "bulk string not terminated by CRLF";
            return HIRATE_EPROTO;
        }
        e->type = '$';
        e->str = buf + end;
        e->len = (size_t)blen;
        return end + (long)blen + 2;
    case '*':
        *why = "nested array";
        return HIRATE_EPROTO;
    default:
        *why = "unknown reply type";
        return HIRATE_EPROTO;
    }
}

long hirate_proto_parse(const char *buf, size_t len, hirate_reply *r)
{
    r->why = NULL;
    r->nelem = 0;
    if (len == 0)
        return 0;
    if (buf[0] != '*')
        return parse_scalar(buf, len, 0, &r->top, &r->why);

    int64_t count;
    long pos = parse_int_line(buf, len, 1, &count, "array length out of range", &r->why);
    if (pos <= 0)
        return pos;
    if (count < -1 || count > HIRATE_REPLY_MAX_ELEMS) {
        r->why = "array length out of range";
        return HIRATE_EPROTO;
    }
    r->top.type = count < 0 ? 0 : '*';
    r->top.str = NULL;
    r->top.len = 0;
    r->top.integer = count;
    for (int64_t i = 0; i < count; i++) {
        pos = parse_scalar(buf, len, (size_t)pos, &r->elem[i], &r->why);
        if (pos <= 0)
            return pos;
    }
    r->nelem = count < 0 ? 0 : (size_t)count;
    return pos;
}

/* ---- encoding ----------------------------------------------------------- */

/* Decimal digits of v, written backwards from end; returns the start. */
static char *u64_digits(char *end, uint64_t v)
{
    do {
        *--end = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return end;
}

/* The length "$<n>\r\n<data>\r\n" takes. */
static size_t bulk_size(size_t n)
{
    char tmp[24];
    return 1 + (size_t)(tmp + sizeof tmp - u64_digits(tmp + sizeof tmp, n)) + 2 + n + 2;
}

/* Writes a header such as "$12\r\n" or "*8\r\n" at p; returns the end. */
static char *put_header(char *p, char type, uint64_t n)
{
    char tmp[24];
    char *s = u64_digits(tmp + sizeof tmp, n);
    size_t len = (size_t)(tmp + sizeof tmp - s);
    *p++ = type;
    memcpy(p, s, len);
    p += len;
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

static char *put_bulk(char *p, const void *data, size_t n)
{
    p = put_header(p, '$', n);
    memcpy(p, data, n);
    p += n;
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

static size_t int_bulk_size(int64_t v)
{
    char tmp[24];
    return bulk_size((size_t)(tmp + sizeof tmp - u64_digits(tmp + sizeof tmp, (uint64_t)v)));
}

static char *put_int_bulk(char *p, int64_t v)
{
    char tmp[24];
    char *s = u64_digits(tmp + sizeof tmp, (uint64_t)v);
    return put_bulk(p, s, (size_t)(tmp + sizeof tmp - s));
}

size_t hirate_proto_call_bound(const hirate_call *c, int form)
{
    return HIRATE_PROTO_CALL_OVERHEAD + c->prefixlen + c->keylen + c->argslen +
           (form == HIRATE_FORM_EVAL ? hirate__script_len : 0);
}

size_t hirate_proto_encode_call(char *buf, size_t cap, const hirate_call *c, int form)
{
    /* The command, and how it names the script (the function's name is 23
     * bytes: "hirate_" and 16 hex digits). */
    static const char *const cmds[] = {"$7\r\nEVALSHA\r\n", "$4\r\nEVAL\r\n", "$5\r\nFCALL\r\n"};
    static const size_t cmdlens[] = {13, 10, 11};
    static const char one_key[] = "$1\r\n1\r\n";
    const char *body = form == HIRATE_FORM_EVAL    ? hirate__script
                       : form == HIRATE_FORM_FCALL ? hirate__function_name
                                                   : hirate__script_sha1;
    size_t bodylen = form == HIRATE_FORM_EVAL    ? hirate__script_len
                     : form == HIRATE_FORM_FCALL ? sizeof hirate__function_name - 1
                                                 : 40;
    int has_time = c->now_us >= 0;

    /* Within the bound, skip counting digits: it is the common case. */
    if (cap < hirate_proto_call_bound(c, form)) {
        size_t need = 4 + cmdlens[form] + bulk_size(bodylen) +
                      sizeof one_key - 1 + bulk_size(c->prefixlen + c->keylen) + c->argslen +
                      int_bulk_size(c->cost) + 7 + (has_time ? int_bulk_size(c->now_us) : 0) +
                      (c->nbands >= 3);   /* "*10" and more: a digit more */
        if (need > cap)
            return need;
    }

    char *p = buf;
    if (c->nbands == 1) {
        memcpy(p, has_time ? "*9\r\n" : "*8\r\n", 4);
        p += 4;
    } else {
        p = put_header(p, '*', (uint64_t)(6 + 2 * c->nbands + has_time));
    }
    /* Each a copy of a known length, which the compiler makes a few moves. */
    switch (form) {
    case HIRATE_FORM_FCALL: memcpy(p, cmds[HIRATE_FORM_FCALL], 11); p += 11; break;
    case HIRATE_FORM_EVAL: memcpy(p, cmds[HIRATE_FORM_EVAL], 10); p += 10; break;
    default: memcpy(p, cmds[HIRATE_FORM_EVALSHA], 13); p += 13; break;
    }
    p = put_bulk(p, body, bodylen);
    memcpy(p, one_key, sizeof one_key - 1);
    p += sizeof one_key - 1;
    p = put_header(p, '$', c->prefixlen + c->keylen);
    memcpy(p, c->prefix, c->prefixlen);
    p += c->prefixlen;
    memcpy(p, c->key, c->keylen);
    p += c->keylen;
    *p++ = '\r';
    *p++ = '\n';
    memcpy(p, c->args, c->argslen);
    p += c->argslen;
    p = put_int_bulk(p, c->cost);
    memcpy(p, c->spend == HIRATE_OP_REFUND ? "$1\r\n2\r\n"
              : c->spend                  ? "$1\r\n1\r\n"
                                          : "$1\r\n0\r\n", 7);
    p += 7;
    if (has_time)
        p = put_int_bulk(p, c->now_us);
    return (size_t)(p - buf);
}

size_t hirate_proto_encode_load(char *buf, size_t cap)
{
    const char *argv[3] = {"FUNCTION", "LOAD", hirate__library};
    size_t lens[3] = {8, 4, hirate__library_len};
    return hirate_proto_encode_argv(buf, cap, 3, argv, lens);
}

size_t hirate_proto_batch_bound(const hirate_call *calls, size_t n, const int *rcs, int select,
                                int fcall, int load)
{
    /* The code itself, once: the library, or the script in the first EVAL. */
    size_t total = !load ? 0 : fcall ? hirate_proto_encode_load(NULL, 0) : hirate__script_len;
    for (size_t i = 0; i < n; i++)
        if (!select || rcs[i] == select)
            total += hirate_proto_call_bound(&calls[i], HIRATE_FORM_EVALSHA);
    return total;
}

size_t hirate_proto_encode_batch(char *buf, size_t cap, const hirate_call *calls, size_t n,
                                 const int *rcs, int select, int fcall, int load)
{
    int form = fcall ? HIRATE_FORM_FCALL : load ? HIRATE_FORM_EVAL : HIRATE_FORM_EVALSHA;
    size_t len = fcall && load ? hirate_proto_encode_load(buf, cap) : 0;
    for (size_t i = 0; i < n; i++) {
        if (!select || rcs[i] == select) {
            len += hirate_proto_encode_call(buf + len, cap - len, &calls[i], form);
            if (form == HIRATE_FORM_EVAL)
                form = HIRATE_FORM_EVALSHA;   /* one EVAL loads the script for the rest */
        }
    }
    return len;
}

size_t hirate_proto_encode_limits(char *buf, size_t cap, int64_t capacity, double rate)
{
    char r[32];
    /* The shortest form that reads back as the same double: "0.1", not
     * "0.10000000000000001"; Lua's tonumber() reads it back exactly. */
    locale_t old = uselocale(wire_locale());
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(r, sizeof r, "%.*g", prec, rate);
        if (strtod(r, NULL) == rate)
            break;
    }
    uselocale(old);
    size_t need = int_bulk_size(capacity) + bulk_size(strlen(r));
    if (need > cap)
        return need;
    char *p = put_int_bulk(buf, capacity);
    put_bulk(p, r, strlen(r));
    return need;
}

size_t hirate_proto_encode_argv(char *buf, size_t cap, int argc, const char *const *argv,
                                const size_t *lens)
{
    char tmp[24];
    size_t need = 1 + (size_t)(tmp + sizeof tmp - u64_digits(tmp + sizeof tmp, (uint64_t)argc)) + 2;
    for (int i = 0; i < argc; i++)
        need += bulk_size(lens[i]);
    if (need > cap)
        return need;
    char *p = put_header(buf, '*', (uint64_t)argc);
    for (int i = 0; i < argc; i++)
        p = put_bulk(p, argv[i], lens[i]);
    return need;
}

/* ---- meaning -------------------------------------------------------------- */

/* Is the first word of the error message exactly word? */
static int first_word_is(const char *msg, size_t len, const char *word)
{
    size_t n = strlen(word);
    return len >= n && memcmp(msg, word, n) == 0 && (len == n || msg[n] == ' ');
}

/* Does [msg, msg+len) contain word? */
static int contains(const char *msg, size_t len, const char *word)
{
    size_t n = strlen(word);
    for (size_t i = 0; i + n <= len; i++)
        if (memcmp(msg + i, word, n) == 0)
            return 1;
    return 0;
}

/* Does [msg, msg+len) contain word, in any case? */
static int contains_ci(const char *msg, size_t len, const char *word)
{
    size_t n = strlen(word);
    for (size_t i = 0; i + n <= len; i++) {
        size_t k = 0;
        while (k < n && (msg[i + k] | 0x20) == word[k])
            k++;
        if (k == n)
            return 1;
    }
    return 0;
}

/* The server will not run FCALL or FUNCTION: it does not know them (Redis
 * before 7, or a proxy that does not pass them: "unknown command 'FCALL'",
 * "unsupported command"), or the ACL forbids them ("NOPERM ... 'fcall'",
 * "... 'function|load'"). */
static int no_functions(const char *msg, size_t len)
{
    int unknown = first_word_is(msg, len, "ERR") && (contains(msg, len, "unknown command") ||
                                                     contains(msg, len, "unsupported command"));
    int denied = first_word_is(msg, len, "NOPERM");
    return (unknown || denied) && (contains_ci(msg, len, "fcall") ||
                                   contains_ci(msg, len, "function"));
}

int hirate_proto_error_class(const char *msg, size_t len)
{
    static const char *const unavailable[] = {
        "OOM", "BUSY", "READONLY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN",
        "MISCONF", "NOREPLICAS",
    };
    if (first_word_is(msg, len, "NOSCRIPT") ||
        (len == 22 && memcmp(msg, "ERR Function not found", 22) == 0))
        return HIRATE_PROTO_NOSCRIPT;
    if (no_functions(msg, len))
        return HIRATE_PROTO_NOFUNC;
    if (first_word_is(msg, len, "MOVED"))
        return HIRATE_PROTO_MOVED;
    if (first_word_is(msg, len, "ASK"))
        return HIRATE_PROTO_ASK;
    for (size_t i = 0; i < sizeof unavailable / sizeof *unavailable; i++)
        if (first_word_is(msg, len, unavailable[i]))
            return HIRATE_ESERVER;
    if (first_word_is(msg, len, "WRONGPASS") || first_word_is(msg, len, "NOAUTH"))
        return HIRATE_EAUTH;
    /* A command the ACL user may not run, directly or from the script
     * (Redis 7.0 words the latter as an ERR). */
    if (first_word_is(msg, len, "NOPERM") ||
        (first_word_is(msg, len, "ERR") &&
         contains(msg, len, "The user executing the script can't run this command")))
        return HIRATE_ENOPERM;
    /* The server turns clients away: maxclients, or protected mode. */
    if (first_word_is(msg, len, "DENIED") ||
        (first_word_is(msg, len, "ERR") && contains(msg, len, "max number of clients reached")))
        return HIRATE_EREFUSED;
    return HIRATE_EREPLY;
}

int hirate_proto_error_drops_connection(const char *msg, size_t len)
{
    return first_word_is(msg, len, "READONLY") || first_word_is(msg, len, "LOADING") ||
           first_word_is(msg, len, "MASTERDOWN");
}

int hirate_proto_error_readonly(const char *msg, size_t len)
{
    return first_word_is(msg, len, "READONLY");
}

/* Reads a stored level the script wrote with %.17g: 0 or more, never NaN,
 * an infinity, hex, spaces or a NUL. */
static int read_level(const hirate_reply_elem *e, double *out)
{
    char num[32], *end;
    if (e->len == 0 || e->len > 31 || strspn(e->str, "0123456789.e+-") < e->len)
        return -1;
    memcpy(num, e->str, e->len);
    num[e->len] = '\0';
    *out = strtod_l(num, &end, wire_locale());
    return *end != '\0' || !(*out >= 0) || !isfinite(*out) ? -1 : 0;
}

/* hirate_proto_decision for n bands: inlined twice, for n == 1 (the common
 * case, whose loops the compiler then unrolls away) and for any n. */
static inline __attribute__((always_inline)) int
decision(const hirate_reply *r, const hirate_call *c, const hirate_bucket_cfg *cfg,
         hirate_decision *d, hirate_decision *per, hirate_bucket *state, const char **why,
         size_t n)
{
    static const char shape[] = "::::$::$", band_shape[] = ":::$:";
    const hirate_reply_elem *e = r->elem;
    hirate_decision own[HIRATE_BANDS_MAX];
    if (!per && n > 1)
        per = own;

    if (r->top.type == '-')
        return hirate_proto_error_class(r->top.str, r->top.len);
    if (r->top.type != '*' || r->nelem != 8 + 5 * (n - 1)) {
        *why = n == 1 ? "the script's reply is not an array of 8"
                      : "the script's reply does not hold every band";
        return HIRATE_EPROTO;
    }
    for (size_t i = 0; i < 8; i++) {
        if (e[i].type != shape[i]) {
            *why = "the script's reply has an element of the wrong type";
            return HIRATE_EPROTO;
        }
    }
    for (size_t i = 8; i < 8 + 5 * (n - 1); i += 5) {
        for (size_t k = 0; k < 5; k++) {
            if (e[i + k].type != band_shape[k]) {
                *why = "the script's reply has an element of the wrong type";
                return HIRATE_EPROTO;
            }
        }
    }
    /* The echoed key proves that this reply answers this call. */
    if (e[7].len != c->prefixlen + c->keylen ||
        memcmp(e[7].str, c->prefix, c->prefixlen) != 0 ||
        memcmp(e[7].str + c->prefixlen, c->key, c->keylen) != 0) {
        *why = "the reply is for another key";
        return HIRATE_EPROTO;
    }
    int64_t allowed = e[0].integer, now = e[6].integer;
    if ((allowed != 0 && allowed != 1) || now < 0 || (c->spend == HIRATE_OP_REFUND && !allowed)) {
        *why = "the script's reply has a value out of range";
        return HIRATE_EPROTO;
    }
    /* Band i's five: remaining, retry, reset, tokens, ts. */
    int short_of_cost = !allowed, refused = 0;
    for (size_t i = 0; i < n; i++) {
        const hirate_reply_elem *b = i == 0 ? e + 1 : e + 8 + 5 * (i - 1);
        int64_t remaining = b[0].integer, retry = b[1].integer, reset = b[2].integer;
        if (remaining < 0 || remaining > cfg[i].capacity || retry < -1 ||
            (allowed && retry != 0) || reset < 0 || b[4].integer < 0 ||
            b[3].len == 0 || b[3].len > 31) {
            *why = "the script's reply has a value out of range";
            return HIRATE_EPROTO;
        }
        refused |= retry != 0;
        short_of_cost |= remaining < c->cost;
    }
    if (!allowed && !refused) {
        *why = "the script's reply refuses with no band short";
        return HIRATE_EPROTO;
    }
    /* A level is read (strtod is the dearest step of a decision) only when
     * a bucket is left short of the cost, the one case in which a caller
     * can use the state; else every level is NAN. */
    for (size_t i = 0; i < n; i++) {
        const hirate_reply_elem *b = i == 0 ? e + 1 : e + 8 + 5 * (i - 1);
        if (strspn(b[3].str, "0123456789.e+-") < b[3].len ||
            (short_of_cost && read_level(&b[3], &state[i].tokens) < 0)) {
            *why = "the script's reply has a malformed token level";
            return HIRATE_EPROTO;
        }
        if (!short_of_cost)
            state[i].tokens = NAN;
        state[i].ts = b[4].integer;
        hirate_decision *o = n == 1 ? d : &per[i];
        o->allowed = b[1].integer == 0;
        o->source = HIRATE_SOURCE_REDIS;
        o->error = 0;
        o->band = (int)i;
        o->limit = cfg[i].capacity;
        o->remaining = b[0].integer;
        o->retry_after_us = b[1].integer < 0 ? HIRATE_NEVER : b[1].integer;
        o->reset_after_us = b[2].integer;
        o->time_us = now;
    }
    if (n == 1) {
        if (per)
            per[0] = *d;
    } else {
        hirate_bands_combine(per, n, d);
    }
    return 0;
}

int hirate_proto_decision(const hirate_reply *r, const hirate_call *c,
                          const hirate_bucket_cfg *cfg, hirate_decision *d, hirate_decision *per,
                          hirate_bucket *state, const char **why)
{
    if (__builtin_expect(c->nbands == 1, 1))
        return decision(r, c, cfg, d, per, state, why, 1);
    return decision(r, c, cfg, d, per, state, why, (size_t)c->nbands);
}

int hirate_proto_error_reply(const hirate_reply *rep, int *drop, char *err, size_t errlen)
{
    /* Keep the connection unless the server is the wrong one to talk to now
     * (READONLY after a failover, LOADING, MASTERDOWN). */
    if (hirate_proto_error_drops_connection(rep->top.str, rep->top.len))
        *drop = 1;
    int rc = hirate_proto_error_class(rep->top.str, rep->top.len);
    if (rc == HIRATE_PROTO_MOVED || rc == HIRATE_PROTO_ASK)
        return hirate__fail_quoting(err, errlen, HIRATE_EREPLY,
                                    "the server is a Redis Cluster node (use a redis+cluster:// "
                                    "URL); it replied: ", rep->top.str, rep->top.len);
    return hirate__fail_quoting(err, errlen, rc > 0 ? HIRATE_EREPLY : rc,
                                "Redis replied: ", rep->top.str, rep->top.len);
}

int hirate_proto_outcome(const hirate_reply *rep, const hirate_call *c,
                         const hirate_bucket_cfg *cfg, int after_eval, hirate_decision *d,
                         hirate_decision *per, hirate_bucket *state, int *drop, char *err,
                         size_t errlen)
{
    const char *why = NULL;
    int rc = hirate_proto_decision(rep, c, cfg, d, per, state, &why);
    if (rc == HIRATE_PROTO_NOSCRIPT && after_eval)
        rc = HIRATE_EREPLY;   /* NOSCRIPT after EVAL: no second fallback */
    if (rc != HIRATE_PROTO_NOSCRIPT && rc != HIRATE_PROTO_NOFUNC && rc != 0 &&
        rep->top.type == '-') {
        rc = hirate_proto_error_reply(rep, drop, err, errlen);
    } else if (rc == HIRATE_EPROTO) {
        rc = hirate__fail(err, errlen, HIRATE_EPROTO, "malformed reply from Redis: %s", why);
        *drop = 1;
    }
    return rc;
}

int hirate_proto_load_outcome(const hirate_reply *rep)
{
    if (rep->top.type != '-')
        return 0;
    /* "ERR Library 'hirate_...' already exists": the name is the script's
     * own SHA1's, so the code is the same. */
    if (first_word_is(rep->top.str, rep->top.len, "ERR") &&
        contains(rep->top.str, rep->top.len, "already exists"))
        return 0;
    if (hirate_proto_error_class(rep->top.str, rep->top.len) == HIRATE_ESERVER)
        return HIRATE_ESERVER;
    return HIRATE_PROTO_NOFUNC;
}
