/*
 * The sans-IO layer (core/src/proto.h): parsing one RESP2 reply with exact
 * byte counts, "incomplete" for every prefix, HIRATE_EPROTO for what the
 * library refuses; the exact bytes of every command it encodes; what an error
 * reply means; and turning the script's reply into a decision.
 *
 * Every parse below reads from a heap copy of exactly the bytes offered, so
 * under AddressSanitizer a read past the end is a failure too.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "hirate.h"
#include "proto.h"

/* A byte string literal that may hold NUL bytes: pointer and length. */
#define B(s) s, sizeof(s) - 1

/* Parses exactly [bytes, bytes+len) from a heap copy of that size. The copy
 * stays alive in *keep so that the strings in *r can be read. */
static long parse_copy(const char *bytes, size_t len, hirate_reply *r, char **keep)
{
    char *copy = malloc(len ? len : 1);
    if (len)
        memcpy(copy, bytes, len);
    long rc = hirate_proto_parse(copy, len, r);
    if (keep)
        *keep = copy;
    else
        free(copy);
    return rc;
}

static int elem_eq(const hirate_reply_elem *a, const hirate_reply_elem *b)
{
    if (a->type != b->type || a->len != b->len || a->integer != b->integer)
        return 0;
    return a->len == 0 || memcmp(a->str, b->str, a->len) == 0;
}

static int reply_eq(const hirate_reply *a, const hirate_reply *b)
{
    if (!elem_eq(&a->top, &b->top) || a->nelem != b->nelem)
        return 0;
    for (size_t i = 0; i < a->nelem; i++)
        if (!elem_eq(&a->elem[i], &b->elem[i]))
            return 0;
    return 1;
}

/* ---- parsing: whole replies -------------------------------------------------- */

/* {allowed, remaining, retry, reset, tokens, ts, now, key}: a cost-0 call for
 * rl:alice (capacity 10, rate 0.1) whose bucket was stored a microsecond ago */
#define SCRIPT_REPLY                                                                 \
    "*8\r\n:1\r\n:9\r\n:0\r\n:9999999\r\n$1\r\n9\r\n:1699999999999999\r\n"            \
    ":1700000000000000\r\n$8\r\nrl:alice\r\n"

typedef struct ok_case {
    const char *rule;
    const char *bytes;
    size_t len;
    char type;            /* top.type */
    const char *str;      /* top.str for '+', '-', '$' */
    size_t slen;
    int64_t integer;      /* top.integer: ':' value, '*' element count */
    size_t nelem;
} ok_case;

static const ok_case valid[] = {
    {"a status line", B("+OK\r\n"), '+', B("OK"), 0, 0},
    {"an empty status line", B("+\r\n"), '+', B(""), 0, 0},
    {"an error line keeps its whole text", B("-ERR wrong number of arguments\r\n"), '-',
     B("ERR wrong number of arguments"), 0, 0},
    {"an integer", B(":42\r\n"), ':', NULL, 0, 42, 0},
    {"a zero integer", B(":0\r\n"), ':', NULL, 0, 0, 0},
    {"a negative integer", B(":-1\r\n"), ':', NULL, 0, -1, 0},
    {"an 18-digit integer, the longest accepted", B(":999999999999999999\r\n"), ':', NULL, 0,
     999999999999999999LL, 0},
    {"a negative 18-digit integer", B(":-999999999999999999\r\n"), ':', NULL, 0,
     -999999999999999999LL, 0},
    {"a bulk string", B("$5\r\nhello\r\n"), '$', B("hello"), 0, 0},
    {"a bulk string is length-counted: CR, LF and NUL inside", B("$6\r\na\r\nb\0c\r\n"), '$',
     B("a\r\nb\0c"), 0, 0},
    {"an empty bulk string", B("$0\r\n\r\n"), '$', B(""), 0, 0},
    {"a nil bulk string has type 0", B("$-1\r\n"), 0, NULL, 0, 0, 0},
    {"a nil array has type 0 and no elements", B("*-1\r\n"), 0, NULL, 0, -1, 0},
    {"an empty array", B("*0\r\n"), '*', NULL, 0, 0, 0},
    {"an array of mixed scalars", B("*3\r\n+a\r\n:-7\r\n$-1\r\n"), '*', NULL, 0, 3, 3},
    {"an array of 8, the most accepted",
     B("*8\r\n:1\r\n:2\r\n:3\r\n:4\r\n:5\r\n:6\r\n:7\r\n:8\r\n"), '*', NULL, 0, 8, 8},
    {"the script's 8-element reply", B(SCRIPT_REPLY), '*', NULL, 0, 8, 8},
};
#define NVALID (sizeof valid / sizeof valid[0])

static void valid_replies_parse_whole_with_exact_counts(void)
{
    for (size_t i = 0; i < NVALID; i++) {
        const ok_case *c = &valid[i];
        hirate_reply r;
        char *keep;
        long rc = parse_copy(c->bytes, c->len, &r, &keep);
        if (rc != (long)c->len)
            fprintf(stderr, "case: %s\n", c->rule);
        CHECK_EQ_I64(rc, c->len);
        CHECK_EQ_I64(r.top.type, c->type);
        CHECK_EQ_I64(r.top.integer, c->integer);
        CHECK_EQ_I64(r.nelem, c->nelem);
        CHECK(r.why == NULL);
        if (c->str) {
            CHECK_EQ_I64(r.top.len, c->slen);
            CHECK(memcmp(r.top.str, c->str, c->slen) == 0);
            /* the string points into the caller's buffer: no copy was made */
            CHECK(r.top.str > keep && r.top.str < keep + c->len);
        }
        free(keep);
    }
}

static void trailing_bytes_belong_to_the_next_reply(void)
{
    for (size_t i = 0; i < NVALID; i++) {
        const ok_case *c = &valid[i];
        char buf[256];
        memcpy(buf, c->bytes, c->len);
        memcpy(buf + c->len, ":5\r\n+OK\r\n", 9);
        hirate_reply r;
        CHECK_EQ_I64(parse_copy(buf, c->len + 9, &r, NULL), c->len);
    }
}

static void the_elements_of_an_array_are_exact(void)
{
    hirate_reply r;
    char *keep;
    CHECK_EQ_I64(parse_copy(B("*3\r\n+a\r\n:-7\r\n$-1\r\n"), &r, &keep), 18);
    CHECK_EQ_I64(r.elem[0].type, '+');
    CHECK_EQ_I64(r.elem[0].len, 1);
    CHECK(memcmp(r.elem[0].str, "a", 1) == 0);
    CHECK_EQ_I64(r.elem[1].type, ':');
    CHECK_EQ_I64(r.elem[1].integer, -7);
    CHECK_EQ_I64(r.elem[2].type, 0);
    free(keep);

    CHECK_EQ_I64(parse_copy(B(SCRIPT_REPLY), &r, &keep), sizeof SCRIPT_REPLY - 1);
    static const char types[] = "::::$::$";
    static const int64_t ints[] = {1, 9, 0, 9999999, 0, 1699999999999999LL,
                                   1700000000000000LL, 0};
    CHECK_EQ_I64(r.nelem, 8);
    for (int i = 0; i < 8; i++) {
        CHECK_EQ_I64(r.elem[i].type, types[i]);
        CHECK_EQ_I64(r.elem[i].integer, ints[i]);
    }
    CHECK_EQ_I64(r.elem[4].len, 1);
    CHECK(memcmp(r.elem[4].str, "9", 1) == 0);
    CHECK_EQ_I64(r.elem[7].len, 8);
    CHECK(memcmp(r.elem[7].str, "rl:alice", 8) == 0);
    free(keep);
}

/* ---- parsing: incomplete input ------------------------------------------------ */

static void every_proper_prefix_is_incomplete(void)
{
    for (size_t i = 0; i < NVALID; i++) {
        const ok_case *c = &valid[i];
        for (size_t n = 0; n < c->len; n++) {
            hirate_reply r;
            long rc = parse_copy(c->bytes, n, &r, NULL);
            if (rc != 0)
                fprintf(stderr, "case: %s, prefix of %zu bytes\n", c->rule, n);
            CHECK_EQ_I64(rc, 0);
        }
    }
}

/* A reader that receives the reply in pieces and asks after each piece, from
 * the same start, with a buffer exactly as long as what it has. */
static long feed_in_pieces(const char *bytes, size_t len, const size_t *cuts, size_t ncuts,
                           hirate_reply *r, char **keep, size_t *asked_at)
{
    char *buf = NULL;
    size_t have = 0;
    long rc = 0;
    for (size_t k = 0; k <= ncuts && rc == 0; k++) {
        size_t upto = k < ncuts ? cuts[k] : len;
        if (upto <= have)
            continue;
        buf = realloc(buf, upto);
        memcpy(buf + have, bytes + have, upto - have);
        have = upto;
        rc = hirate_proto_parse(buf, have, r);
        *asked_at = have;
    }
    *keep = buf;
    return rc;
}

static void byte_by_byte_feeding_gives_the_whole_result(void)
{
    size_t cuts[256];
    for (size_t i = 0; i < NVALID; i++) {
        const ok_case *c = &valid[i];
        hirate_reply whole, fed;
        char *kw, *kf;
        size_t at = 0;
        CHECK_EQ_I64(parse_copy(c->bytes, c->len, &whole, &kw), c->len);
        for (size_t n = 0; n < c->len; n++)
            cuts[n] = n + 1;
        CHECK_EQ_I64(feed_in_pieces(c->bytes, c->len, cuts, c->len, &fed, &kf, &at), c->len);
        CHECK_EQ_I64(at, c->len);
        CHECK(reply_eq(&whole, &fed));
        free(kw);
        free(kf);
    }
}

static void random_split_feeding_gives_the_whole_result(void)
{
    unsigned seed = 12345;
    size_t cuts[256];
    for (int round = 0; round < 200; round++) {
        for (size_t i = 0; i < NVALID; i++) {
            const ok_case *c = &valid[i];
            size_t n = 0;
            for (size_t pos = 0; pos < c->len && n < 255;) {
                seed = seed * 1103515245u + 12345u;
                pos += 1 + (seed >> 16) % 7;
                cuts[n++] = pos < c->len ? pos : c->len;
            }
            hirate_reply whole, fed;
            char *kw, *kf;
            size_t at = 0;
            CHECK_EQ_I64(parse_copy(c->bytes, c->len, &whole, &kw), c->len);
            CHECK_EQ_I64(feed_in_pieces(c->bytes, c->len, cuts, n, &fed, &kf, &at), c->len);
            CHECK_EQ_I64(at, c->len);
            CHECK(reply_eq(&whole, &fed));
            free(kw);
            free(kf);
        }
    }
}

/* ---- parsing: malformed input ------------------------------------------------- */

typedef struct bad_case {
    const char *rule;
    const char *bytes;
    size_t len;
    const char *why;
} bad_case;

static const bad_case malformed[] = {
    {"a CR not followed by LF ends nothing", B("+OK\rX\r\n"), "CR without LF"},
    {"a CR without LF in an integer", B(":1\r1\r\n"), "CR without LF"},
    {"a CR without LF inside an array", B("*1\r\n:1\rX"), "CR without LF"},
    {"an integer with a letter", B(":12a\r\n"), "malformed integer"},
    {"an empty integer", B(":\r\n"), "malformed integer"},
    {"a lone minus sign", B(":-\r\n"), "malformed integer"},
    {"a plus sign", B(":+5\r\n"), "malformed integer"},
    {"a space in an integer", B(": 5\r\n"), "malformed integer"},
    {"19 digits may overflow and are refused", B(":1234567890123456789\r\n"), "malformed integer"},
    {"a bulk length of -2", B("$-2\r\n"), "bulk length out of range"},
    {"a bulk length over HIRATE_PROTO_MAX_REPLY (4097)",
     B("$4097\r\n"), "bulk length out of range"},
    {"a bulk length of 2^32-1", B("$4294967295\r\n"), "bulk length out of range"},
    {"an empty bulk length", B("$\r\n"), "bulk length out of range"},
    {"a bulk length with a letter", B("$1x\r\na\r\n"), "bulk length out of range"},
    {"an array of 84, over HIRATE_REPLY_MAX_ELEMS", B("*84\r\n"), "array length out of range"},
    {"an array of 2^32-1", B("*4294967295\r\n"), "array length out of range"},
    {"an array length of -2", B("*-2\r\n"), "array length out of range"},
    {"an empty array length", B("*\r\n"), "array length out of range"},
    {"a nested array", B("*1\r\n*1\r\n:1\r\n"), "nested array"},
    {"a nested empty array", B("*2\r\n:1\r\n*0\r\n"), "nested array"},
    {"an unknown type byte", B("?\r\n"), "unknown reply type"},
    {"an inline (telnet) line", B("PONG\r\n"), "unknown reply type"},
    {"an unknown type inside an array", B("*2\r\n:1\r\n?x\r\n"), "unknown reply type"},
    {"RESP3 null", B("_\r\n"), "unknown reply type"},
    {"RESP3 double", B(",1.5\r\n"), "unknown reply type"},
    {"RESP3 map", B("%1\r\n+a\r\n+b\r\n"), "unknown reply type"},
    {"RESP3 boolean", B("#t\r\n"), "unknown reply type"},
    {"RESP3 blob error", B("!3\r\nERR\r\n"), "unknown reply type"},
    {"a bulk whose terminator is two other bytes", B("$3\r\nabcXY"),
     "bulk string not terminated by CRLF"},
    {"a bulk whose terminator is LF CR", B("$3\r\nabc\n\r"), "bulk string not terminated by CRLF"},
    {"a bulk one byte longer than it said",
     B("$2\r\nabc\r\n"), "bulk string not terminated by CRLF"},
    {"a bad bulk inside an array", B("*1\r\n$1\r\nab\r\n"), "bulk string not terminated by CRLF"},
};

static void malformed_replies_are_refused_with_a_reason(void)
{
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
        const bad_case *c = &malformed[i];
        hirate_reply r;
        long rc = parse_copy(c->bytes, c->len, &r, NULL);
        if (rc != HIRATE_EPROTO || !r.why || strcmp(r.why, c->why) != 0)
            fprintf(stderr, "case: %s\n", c->rule);
        CHECK_EQ_I64(rc, HIRATE_EPROTO);
        CHECK_EQ_STR(r.why, c->why);
    }
}

/* A number line ends by its 19th digit: an integer, a bulk length or an array
 * length of more than 18 digits is malformed before any CRLF arrives. */
static void a_number_line_of_19_digits_is_an_error_at_once(void)
{
    static const struct { char type; const char *why; } types[] = {
        {':', "malformed integer"},
        {'$', "bulk length out of range"},
        {'*', "array length out of range"},
    };
    char buf[64];
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        hirate_reply r;
        buf[0] = types[t].type;
        memset(buf + 1, '1', sizeof buf - 1);
        CHECK_EQ_I64(parse_copy(buf, 1 + 18, &r, NULL), 0);
        CHECK_EQ_I64(parse_copy(buf, 1 + 19, &r, NULL), HIRATE_EPROTO);
        CHECK_EQ_STR(r.why, types[t].why);
        buf[1] = '-';
        CHECK_EQ_I64(parse_copy(buf, 2 + 18, &r, NULL), 0);
        CHECK_EQ_I64(parse_copy(buf, 2 + 19, &r, NULL), HIRATE_EPROTO);
        CHECK_EQ_STR(r.why, types[t].why);
    }
}

/* A server that never sends CRLF must not keep the reader waiting forever:
 * a line that has grown past HIRATE_PROTO_MAX_REPLY is an error, not "more". */
static void a_line_too_long_without_crlf_is_an_error(void)
{
    static const char types[] = "+-";
    char *buf = malloc(2 * HIRATE_PROTO_MAX_REPLY);
    for (size_t t = 0; t < sizeof types - 1; t++) {
        hirate_reply r;
        buf[0] = types[t];
        memset(buf + 1, '1', 2 * HIRATE_PROTO_MAX_REPLY - 1);
        /* the line after the type byte may be HIRATE_PROTO_MAX_REPLY bytes... */
        CHECK_EQ_I64(parse_copy(buf, 1 + HIRATE_PROTO_MAX_REPLY, &r, NULL), 0);
        /* ...and not one more */
        CHECK_EQ_I64(parse_copy(buf, 2 + HIRATE_PROTO_MAX_REPLY, &r, NULL), HIRATE_EPROTO);
        CHECK_EQ_STR(r.why, "line too long");
        CHECK_EQ_I64(parse_copy(buf, 2 * HIRATE_PROTO_MAX_REPLY, &r, NULL), HIRATE_EPROTO);
    }
    /* the same inside an array */
    memcpy(buf, "*1\r\n+", 5);
    memset(buf + 5, 'a', 2 * HIRATE_PROTO_MAX_REPLY - 5);
    hirate_reply r;
    CHECK_EQ_I64(parse_copy(buf, 5 + HIRATE_PROTO_MAX_REPLY + 1, &r, NULL), HIRATE_EPROTO);
    CHECK_EQ_STR(r.why, "line too long");
    free(buf);
}

/* ...and the same line is an error when its CRLF is there too: whether the
 * bytes come in one piece or two must not change the answer. */
static void a_line_too_long_is_an_error_with_its_crlf(void)
{
    static const char types[] = "+-";
    size_t n = HIRATE_PROTO_MAX_REPLY;
    char *buf = malloc(n + 4);
    for (size_t t = 0; t < sizeof types - 1; t++) {
        hirate_reply r;
        buf[0] = types[t];
        memset(buf + 1, 'e', n + 1);
        memcpy(buf + 1 + n, "\r\n", 2);   /* the longest line: accepted */
        CHECK_EQ_I64(parse_copy(buf, n + 3, &r, NULL), (long)n + 3);
        CHECK_EQ_I64(r.top.len, n);
        buf[1 + n] = 'e';
        memcpy(buf + 2 + n, "\r\n", 2);   /* one byte more: refused */
        CHECK_EQ_I64(parse_copy(buf, n + 4, &r, NULL), HIRATE_EPROTO);
        CHECK_EQ_STR(r.why, "line too long");
        CHECK_EQ_I64(parse_copy(buf, n + 3, &r, NULL), HIRATE_EPROTO);   /* CR, no LF yet */
    }
    free(buf);
}

static void the_largest_bulk_is_accepted(void)
{
    size_t n = HIRATE_PROTO_MAX_REPLY;
    char *buf = malloc(n + 16);
    int h = snprintf(buf, 16, "$%zu\r\n", n);
    memset(buf + h, 'x', n);
    memcpy(buf + h + n, "\r\n", 2);
    hirate_reply r;
    CHECK_EQ_I64(parse_copy(buf, (size_t)h + n + 2, &r, NULL), (long)h + (long)n + 2);
    CHECK_EQ_I64(r.top.type, '$');
    CHECK_EQ_I64(r.top.len, n);
    free(buf);
}

/* ---- encoding ------------------------------------------------------------------ */

/* The bands of every reply below: capacity 10 (rate 0.1). */
static const hirate_bucket_cfg cfg10 = {10, 10.0, 0.1, 1e7};

/* The call the tests encode: capacity 10 and rate 0.1 for "rl:" + key. */
static char limits[64];
static size_t limitslen;

static hirate_call call_for(const void *key, size_t keylen, int64_t cost, int spend, int64_t now)
{
    hirate_call c = {"rl:", 3, key, keylen, limits, limitslen, 1, cost, spend, now};
    return c;
}

/* Encodes into a heap buffer of exactly the length the call takes (so an
 * overrun is an ASan failure) and compares the bytes. */
static void check_call_bytes(const hirate_call *c, int eval, const char *expect, size_t len)
{
    size_t need = hirate_proto_encode_call(NULL, 0, c, eval);
    CHECK_EQ_I64(need, len);
    char *buf = malloc(need);
    CHECK_EQ_I64(hirate_proto_encode_call(buf, need, c, eval), len);
    int same = need == len && memcmp(buf, expect, len) == 0;
    if (!same)
        fprintf(stderr, "got:    %.*s\nexpect: %.*s\n", (int)need, buf, (int)len, expect);
    CHECK(same);
    free(buf);
}

/* Builds the expected bytes with the sha (or script) spliced in where "@" is. */
static size_t splice(char *out, const char *tmpl, size_t tlen, const char *body, size_t blen)
{
    const char *at = memchr(tmpl, '@', tlen);
    size_t head = (size_t)(at - tmpl);
    memcpy(out, tmpl, head);
    memcpy(out + head, body, blen);
    memcpy(out + head + blen, at + 1, tlen - head - 1);
    return tlen - 1 + blen;
}

typedef struct call_case {
    const char *rule;
    const char *key;
    size_t keylen;
    int64_t cost;
    int spend;
    int64_t now;
    const char *expect;   /* '@' stands for the 40 hex digits of the sha */
    size_t len;
} call_case;

static const call_case calls[] = {
    {"EVALSHA without a time has 8 parts: Redis' clock decides", B("alice"), 1, 1, -1,
     B("*8\r\n$7\r\nEVALSHA\r\n$40\r\n@\r\n$1\r\n1\r\n$8\r\nrl:alice\r\n"
       "$2\r\n10\r\n$3\r\n0.1\r\n$1\r\n1\r\n$1\r\n1\r\n")},
    {"EVALSHA with an injected time has 9 parts", B("alice"), 3, 0, 1700000000000000LL,
     B("*9\r\n$7\r\nEVALSHA\r\n$40\r\n@\r\n$1\r\n1\r\n$8\r\nrl:alice\r\n"
       "$2\r\n10\r\n$3\r\n0.1\r\n$1\r\n3\r\n$1\r\n0\r\n$16\r\n1700000000000000\r\n")},
    {"time 0 is a time, not Redis' clock", B("k"), 0, 1, 0,
     B("*9\r\n$7\r\nEVALSHA\r\n$40\r\n@\r\n$1\r\n1\r\n$4\r\nrl:k\r\n"
       "$2\r\n10\r\n$3\r\n0.1\r\n$1\r\n0\r\n$1\r\n1\r\n$1\r\n0\r\n")},
    {"the largest cost and time", B("k"), 9007199254740991LL, 1, 9007199254740991LL,
     B("*9\r\n$7\r\nEVALSHA\r\n$40\r\n@\r\n$1\r\n1\r\n$4\r\nrl:k\r\n"
       "$2\r\n10\r\n$3\r\n0.1\r\n$16\r\n9007199254740991\r\n$1\r\n1\r\n"
       "$16\r\n9007199254740991\r\n")},
    {"a key with NUL, CR LF and '%' is length-counted, never formatted",
     B("a\0b\r\n%s%n"), 1, 1, -1,
     B("*8\r\n$7\r\nEVALSHA\r\n$40\r\n@\r\n$1\r\n1\r\n$12\r\nrl:a\0b\r\n%s%n\r\n"
       "$2\r\n10\r\n$3\r\n0.1\r\n$1\r\n1\r\n$1\r\n1\r\n")},
    {"a key that looks like RESP is just bytes", B("*1\r\n$4\r\nPING\r\n"), 10, 1, -1,
     B("*8\r\n$7\r\nEVALSHA\r\n$40\r\n@\r\n$1\r\n1\r\n$17\r\nrl:*1\r\n$4\r\nPING\r\n\r\n"
       "$2\r\n10\r\n$3\r\n0.1\r\n$2\r\n10\r\n$1\r\n1\r\n")},
};

static void evalsha_calls_are_exact_resp(void)
{
    const char *sha = hirate_script_sha1();
    CHECK_EQ_I64(strlen(sha), 40);
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        const call_case *cc = &calls[i];
        char expect[512];
        size_t len = splice(expect, cc->expect, cc->len, sha, 40);
        hirate_call c = call_for(cc->key, cc->keylen, cc->cost, cc->spend, cc->now);
        check_call_bytes(&c, 0, expect, len);
    }
}

/* FCALL names the function where EVALSHA names the SHA1: the same parts. */
static void fcall_calls_are_exact_resp(void)
{
    const char *name = hirate_function_name();
    char want[32];
    snprintf(want, sizeof want, "hirate_%.16s", hirate_script_sha1());
    CHECK_EQ_STR(name, want);
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        const call_case *cc = &calls[i];
        char tmpl[512], expect[512];
        /* The EVALSHA case with FCALL and a 23-byte name in its place. */
        static const char head[] = "$7\r\nEVALSHA\r\n$40\r\n";
        const char *at = strstr(cc->expect, head);
        CHECK(at != NULL);
        size_t pre = (size_t)(at - cc->expect), post = cc->len - pre - (sizeof head - 1);
        memcpy(tmpl, cc->expect, pre);
        static const char fcall[] = "$5\r\nFCALL\r\n$23\r\n";
        size_t flen = sizeof fcall - 1;
        memcpy(tmpl + pre, fcall, flen);
        memcpy(tmpl + pre + flen, cc->expect + pre + sizeof head - 1, post);
        size_t len = splice(expect, tmpl, pre + flen + post, name, 23);
        hirate_call c = call_for(cc->key, cc->keylen, cc->cost, cc->spend, cc->now);
        check_call_bytes(&c, HIRATE_FORM_FCALL, expect, len);
    }
}

/* FUNCTION LOAD of a library that is the script itself inside a function,
 * registered under the name FCALL uses. */
static void function_load_carries_the_script_whole(void)
{
    size_t liblen, slen;
    const char *lib = hirate_function_library(&liblen);
    const char *script = hirate_script_source(&slen);
    char head[128];
    int h = snprintf(head, sizeof head, "#!lua name=%s\nlocal function bucket(KEYS, ARGV)\n",
                     hirate_function_name());
    char tail[128];
    int t = snprintf(tail, sizeof tail, "\nend\nredis.register_function('%s', bucket)\n",
                     hirate_function_name());
    CHECK_EQ_I64(liblen, (size_t)h + slen + (size_t)t);
    CHECK(memcmp(lib, head, (size_t)h) == 0);
    CHECK(memcmp(lib + h, script, slen) == 0);
    CHECK(memcmp(lib + h + slen, tail, (size_t)t) == 0);
    size_t need = hirate_proto_encode_load(NULL, 0);
    char *buf = malloc(need);
    CHECK_EQ_I64(hirate_proto_encode_load(buf, need), need);
    char start[64];
    int n = snprintf(start, sizeof start, "*3\r\n$8\r\nFUNCTION\r\n$4\r\nLOAD\r\n$%zu\r\n",
                     liblen);
    CHECK_EQ_I64(need, (size_t)n + liblen + 2);
    CHECK(memcmp(buf, start, (size_t)n) == 0 && memcmp(buf + n, lib, liblen) == 0);
    free(buf);
}

/* What FUNCTION LOAD's reply means: there (loaded, or loaded by another
 * client first), refused (no Redis Functions here), or an outage. */
static void a_refused_load_is_told_apart(void)
{
    static const struct { const char *bytes; int outcome; } cases[] = {
        {"$23\r\nhirate_0123456789abcdef\r\n", 0},
        {"-ERR Library 'hirate_0123456789abcdef' already exists\r\n", 0},
        {"-NOPERM this user has no permissions to run the 'function|load' command\r\n",
         HIRATE_PROTO_NOFUNC},
        {"-ERR unknown command 'FUNCTION', with args beginning with: 'LOAD' \r\n",
         HIRATE_PROTO_NOFUNC},
        {"-ERR Error compiling function: user_function:1: syntax error\r\n", HIRATE_PROTO_NOFUNC},
        /* the server cannot now: it says nothing of Redis Functions */
        {"-OOM command not allowed when used memory > 'maxmemory'.\r\n", HIRATE_ESERVER},
        {"-READONLY You can't write against a read only replica.\r\n", HIRATE_ESERVER},
        {"-LOADING Redis is loading the dataset in memory\r\n", HIRATE_ESERVER},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hirate_reply rep;
        CHECK(hirate_proto_parse(cases[i].bytes, strlen(cases[i].bytes), &rep) > 0);
        CHECK_EQ_I64(hirate_proto_load_outcome(&rep), cases[i].outcome);
    }
}

static void a_key_of_512_bytes_has_a_3_digit_length(void)
{
    char key[512], expect[1024];
    memset(key, 'k', sizeof key);
    int n = snprintf(expect, sizeof expect,
                     "*8\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$1\r\n1\r\n$515\r\nrl:",
                     hirate_script_sha1());
    memcpy(expect + n, key, sizeof key);
    n += (int)sizeof key;
    n += snprintf(expect + n, sizeof expect - (size_t)n,
                  "\r\n$2\r\n10\r\n$3\r\n0.1\r\n$1\r\n1\r\n$1\r\n1\r\n");
    hirate_call c = call_for(key, sizeof key, 1, 1, -1);
    check_call_bytes(&c, 0, expect, (size_t)n);
}

static void eval_sends_the_script_itself(void)
{
    size_t slen;
    const char *script = hirate_script_source(&slen);
    char head[64];
    int h = snprintf(head, sizeof head, "*8\r\n$4\r\nEVAL\r\n$%zu\r\n", slen);
    static const char tail[] = "\r\n$1\r\n1\r\n$8\r\nrl:alice\r\n"
                               "$2\r\n10\r\n$3\r\n0.1\r\n$1\r\n1\r\n$1\r\n1\r\n";
    size_t len = (size_t)h + slen + sizeof tail - 1;
    char *expect = malloc(len);
    memcpy(expect, head, (size_t)h);
    memcpy(expect + h, script, slen);
    memcpy(expect + h + slen, tail, sizeof tail - 1);
    hirate_call c = call_for("alice", 5, 1, 1, -1);
    check_call_bytes(&c, 1, expect, len);
    free(expect);
}

static void an_empty_prefix_sends_the_key_alone(void)
{
    char expect[256];
    size_t len = splice(expect, B("*8\r\n$7\r\nEVALSHA\r\n$40\r\n@\r\n$1\r\n1\r\n$5\r\nalice\r\n"
                                  "$2\r\n10\r\n$3\r\n0.1\r\n$1\r\n1\r\n$1\r\n1\r\n"),
                        hirate_script_sha1(), 40);
    hirate_call c = {"", 0, "alice", 5, limits, limitslen, 1, 1, 1, -1};
    check_call_bytes(&c, 0, expect, len);
}

/* Too small a buffer: the length it needs comes back and no byte is written. */
static void a_short_buffer_gets_the_length_and_no_bytes(void)
{
    hirate_call c = call_for("alice", 5, 1, 1, 1700000000000000LL);
    size_t need = hirate_proto_encode_call(NULL, 0, &c, 0);
    CHECK(need > 100);
    unsigned char buf[1024];
    const size_t caps[] = {0, 1, 4, need / 2, need - 1};
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        memset(buf, 0xA5, sizeof buf);
        CHECK_EQ_I64(hirate_proto_encode_call((char *)buf, caps[i], &c, 0), need);
        size_t touched = 0;
        for (size_t j = 0; j < sizeof buf; j++)
            touched += buf[j] != 0xA5;
        CHECK_EQ_I64(touched, 0);
    }
    /* exactly enough: all of it written, the byte after it untouched */
    memset(buf, 0xA5, sizeof buf);
    CHECK_EQ_I64(hirate_proto_encode_call((char *)buf, need, &c, 0), need);
    CHECK_EQ_I64(buf[0], '*');
    CHECK_EQ_I64(buf[need - 1], '\n');
    CHECK_EQ_I64(buf[need], 0xA5);

    /* the same for EVAL, whose call is the script's length and more */
    size_t need_eval = hirate_proto_encode_call(NULL, 0, &c, 1);
    size_t slen;
    hirate_script_source(&slen);
    CHECK(need_eval > slen);
    char *big = malloc(need_eval + 1);
    memset(big, 0x5A, need_eval + 1);
    CHECK_EQ_I64(hirate_proto_encode_call(big, need_eval - 1, &c, 1), need_eval);
    size_t touched = 0;
    for (size_t j = 0; j <= need_eval; j++)
        touched += big[j] != 0x5A;
    CHECK_EQ_I64(touched, 0);
    free(big);
}

static void an_evalsha_call_fits_the_overhead_plus_the_key(void)
{
    static char key[HIRATE_KEY_MAX];
    static char prefix[HIRATE_PREFIX_MAX];
    memset(key, 'k', sizeof key);
    memset(prefix, 'p', sizeof prefix);
    char args[96];
    size_t argslen = hirate_proto_encode_limits(args, sizeof args, HIRATE_EXACT_MAX,
                                                0.30000000000000004);
    hirate_call c = {prefix, sizeof prefix, key, sizeof key, args, argslen, 1,
                     HIRATE_EXACT_MAX, 1, HIRATE_EXACT_MAX};
    size_t need = hirate_proto_encode_call(NULL, 0, &c, 0);
    CHECK(need <= HIRATE_PROTO_CALL_OVERHEAD + sizeof prefix + sizeof key);
}

typedef struct limits_case {
    const char *rule;
    int64_t capacity;
    double rate;
    const char *expect;
    size_t len;
} limits_case;

static const limits_case limit_cases[] = {
    {"0.1 in its shortest form, not 0.10000000000000001", 10, 0.1, B("$2\r\n10\r\n$3\r\n0.1\r\n")},
    {"a third needs 16 digits", 1, 1.0 / 3, B("$1\r\n1\r\n$18\r\n0.3333333333333333\r\n")},
    /* %.1g already reads back as 1e6; Lua's tonumber() reads "1e+06" too */
    {"a million comes out in exponent form", 1, 1e6, B("$1\r\n1\r\n$5\r\n1e+06\r\n")},
    {"a whole rate has no point", 5, 7, B("$1\r\n5\r\n$1\r\n7\r\n")},
    {"0.1 + 0.2 needs all 17 digits", 3, 0.1 + 0.2, B("$1\r\n3\r\n$19\r\n0.30000000000000004\r\n")},
    {"a small rate", 1, 1e-7, B("$1\r\n1\r\n$5\r\n1e-07\r\n")},
    {"six significant digits", 100, 123456.789, B("$3\r\n100\r\n$10\r\n123456.789\r\n")},
    {"the largest capacity", HIRATE_EXACT_MAX, 2.5,
     B("$16\r\n9007199254740991\r\n$3\r\n2.5\r\n")},
};

static void limits_are_encoded_in_the_fewest_exact_digits(void)
{
    for (size_t i = 0; i < sizeof limit_cases / sizeof limit_cases[0]; i++) {
        const limits_case *lc = &limit_cases[i];
        char buf[96];
        memset(buf, 0, sizeof buf);
        size_t n = hirate_proto_encode_limits(buf, sizeof buf, lc->capacity, lc->rate);
        if (n != lc->len || memcmp(buf, lc->expect, lc->len) != 0)
            fprintf(stderr, "case: %s: got \"%.*s\"\n", lc->rule, (int)n, buf);
        CHECK_EQ_I64(n, lc->len);
        CHECK(memcmp(buf, lc->expect, lc->len) == 0);
        /* the rate's bulk reads back as the very same double */
        hirate_reply r;
        const char *second = buf + hirate_proto_parse(buf, n, &r);
        CHECK_EQ_I64(hirate_proto_parse(second, (size_t)(buf + n - second), &r),
                     buf + n - second);
        char num[40];
        memcpy(num, r.top.str, r.top.len);
        num[r.top.len] = '\0';
        CHECK(strtod(num, NULL) == lc->rate);
    }
}

static void every_rate_reads_back_exactly(void)
{
    unsigned long long x = 88172645463325252ull;
    int wrong = 0;
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        /* rates from 1e-6 to 1e9 with every mantissa */
        double rate = ldexp((double)(x >> 11) / 9007199254740992.0 + 0.5, (int)(x % 50) - 20);
        char buf[96];
        size_t n = hirate_proto_encode_limits(buf, sizeof buf, 1, rate);
        CHECK(n > 14 && n <= 7 + 4 + 24 + 2);
        /* "$1\r\n1\r\n" then "$<len>\r\n<digits>\r\n" */
        hirate_reply r;
        long rc = hirate_proto_parse(buf + 7, n - 7, &r);
        char num[40];
        memcpy(num, r.top.str, r.top.len);
        num[r.top.len] = '\0';
        if (rc != (long)(n - 7) || strtod(num, NULL) != rate) {
            fprintf(stderr, "rate %.17g encoded as %s\n", rate, num);
            wrong++;
        }
    }
    CHECK_EQ_I64(wrong, 0);
}

static void limits_with_a_short_buffer_write_nothing(void)
{
    char buf[64];
    memset(buf, 0x77, sizeof buf);
    CHECK_EQ_I64(hirate_proto_encode_limits(buf, 16, 10, 0.1), 17);
    size_t touched = 0;
    for (size_t j = 0; j < sizeof buf; j++)
        touched += buf[j] != 0x77;
    CHECK_EQ_I64(touched, 0);
    CHECK_EQ_I64(hirate_proto_encode_limits(buf, 17, 10, 0.1), 17);
    CHECK(memcmp(buf, "$2\r\n10\r\n$3\r\n0.1\r\n", 17) == 0);
    CHECK_EQ_I64(buf[17], 0x77);
}

typedef struct argv_case {
    const char *rule;
    int argc;
    const char *argv[3];
    size_t lens[3];
    const char *expect;
    size_t len;
} argv_case;

static const argv_case argv_cases[] = {
    {"DEL of one key", 2, {"DEL", "rl:alice"}, {3, 8}, B("*2\r\n$3\r\nDEL\r\n$8\r\nrl:alice\r\n")},
    {"DEL of a key with NUL and CR LF", 2, {"DEL", "rl:a\0\r\n"}, {3, 7},
     B("*2\r\n$3\r\nDEL\r\n$7\r\nrl:a\0\r\n\r\n")},
    {"an empty argument", 2, {"ECHO", ""}, {4, 0}, B("*2\r\n$4\r\nECHO\r\n$0\r\n\r\n")},
    {"no arguments at all", 0, {NULL}, {0}, B("*0\r\n")},
    {"SCRIPT LOAD x", 3, {"SCRIPT", "LOAD", "x"}, {6, 4, 1},
     B("*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n$1\r\nx\r\n")},
};

static void argv_commands_are_exact_resp(void)
{
    for (size_t i = 0; i < sizeof argv_cases / sizeof argv_cases[0]; i++) {
        const argv_case *ac = &argv_cases[i];
        char buf[128];
        memset(buf, 0x33, sizeof buf);
        CHECK_EQ_I64(hirate_proto_encode_argv(buf, 0, ac->argc, ac->argv, ac->lens), ac->len);
        CHECK_EQ_I64(buf[0], 0x33);
        CHECK_EQ_I64(hirate_proto_encode_argv(buf, ac->len, ac->argc, ac->argv, ac->lens), ac->len);
        if (memcmp(buf, ac->expect, ac->len) != 0)
            fprintf(stderr, "case: %s\n", ac->rule);
        CHECK(memcmp(buf, ac->expect, ac->len) == 0);
        CHECK_EQ_I64(buf[ac->len], 0x33);
    }
}

/* ---- what an error reply means --------------------------------------------------- */

typedef struct class_case {
    const char *msg;
    size_t len;
    int cls;
    int drops;
} class_case;

static const class_case classes[] = {
    {B("NOSCRIPT No matching script. Please use EVAL."), HIRATE_PROTO_NOSCRIPT, 0},
    /* Redis Functions: the library is missing, or FCALL/FUNCTION will not run */
    {B("ERR Function not found"), HIRATE_PROTO_NOSCRIPT, 0},
    {B("ERR Function not found here"), HIRATE_EREPLY, 0},
    {B("ERR unknown command 'FCALL', with args beginning with: 'hirate_x' '1' "),
     HIRATE_PROTO_NOFUNC, 0},
    {B("ERR unknown command `FCALL`, with args beginning with: `hirate_x`, `1`, "),
     HIRATE_PROTO_NOFUNC, 0},
    {B("ERR unsupported command 'fcall'"), HIRATE_PROTO_NOFUNC, 0},
    {B("NOPERM this user has no permissions to run the 'fcall' command"), HIRATE_PROTO_NOFUNC, 0},
    {B("NOPERM this user has no permissions to run the 'function|load' command"),
     HIRATE_PROTO_NOFUNC, 0},
    {B("OOM command not allowed when used memory > 'maxmemory'."), HIRATE_ESERVER, 0},
    {B("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."),
     HIRATE_ESERVER, 0},
    {B("READONLY You can't write against a read only replica."), HIRATE_ESERVER, 1},
    {B("LOADING Redis is loading the dataset in memory"), HIRATE_ESERVER, 1},
    {B("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
     HIRATE_ESERVER, 1},
    {B("CLUSTERDOWN The cluster is down"), HIRATE_ESERVER, 0},
    {B("TRYAGAIN Multiple keys request during rehashing of slot"), HIRATE_ESERVER, 0},
    {B("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist"),
     HIRATE_ESERVER, 0},
    {B("NOREPLICAS Not enough good replicas to write."), HIRATE_ESERVER, 0},
    {B("OOM"), HIRATE_ESERVER, 0},                    /* the first word alone */
    {B("READONLY"), HIRATE_ESERVER, 1},
    {B("WRONGPASS invalid username-password pair or user is disabled."), HIRATE_EAUTH, 0},
    {B("NOAUTH Authentication required."), HIRATE_EAUTH, 0},
    {B("NOPERM this user has no permissions to run the 'evalsha' command"), HIRATE_ENOPERM, 0},
    {B("ERR hirate: cost must be a whole number from 0 to 2^53-1"), HIRATE_EREPLY, 0},
    {B("ERR unknown command 'EVALSHA'"), HIRATE_EREPLY, 0},
    {B("WRONGTYPE Operation against a key holding the wrong kind of value"), HIRATE_EREPLY, 0},
    /* the first word must match whole: a longer word is another error */
    {B("BUSYKEY Target key name already exists."), HIRATE_EREPLY, 0},
    {B("OOMKILLER x"), HIRATE_EREPLY, 0},
    {B("NOSCRIPTS x"), HIRATE_EREPLY, 0},
    {B("READONLYX x"), HIRATE_EREPLY, 0},
    {B("LOADINGS x"), HIRATE_EREPLY, 0},
    {B("NOAUTHX x"), HIRATE_EREPLY, 0},
    /* case matters: Redis sends upper case */
    {B("noscript No matching script"), HIRATE_EREPLY, 0},
    {B("readonly x"), HIRATE_EREPLY, 0},
    /* a word in the middle is not the first word */
    {B("ERR OOM"), HIRATE_EREPLY, 0},
    {B(" OOM x"), HIRATE_EREPLY, 0},
    {B(""), HIRATE_EREPLY, 0},
};

static void error_replies_are_classed_by_their_first_word(void)
{
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        const class_case *cc = &classes[i];
        /* a heap copy of exactly len bytes: no NUL to lean on */
        char *msg = malloc(cc->len ? cc->len : 1);
        memcpy(msg, cc->msg, cc->len);
        int cls = hirate_proto_error_class(msg, cc->len);
        int drops = hirate_proto_error_drops_connection(msg, cc->len);
        if (cls != cc->cls || drops != cc->drops)
            fprintf(stderr, "case: \"%s\": class %d drops %d\n", cc->msg, cls, drops);
        CHECK_EQ_I64(cls, cc->cls);
        CHECK_EQ_I64(drops, cc->drops);
        free(msg);
    }
}

static void only_the_given_length_counts(void)
{
    /* "BUSYKEY ..." cut after 4 bytes is "BUSY" */
    CHECK_EQ_I64(hirate_proto_error_class("BUSYKEY x", 4), HIRATE_ESERVER);
    CHECK_EQ_I64(hirate_proto_error_class("NOSCRIPT", 7), HIRATE_EREPLY);
    CHECK_EQ_I64(hirate_proto_error_drops_connection("LOADINGX", 7), 1);
    CHECK_EQ_I64(hirate_proto_error_drops_connection("LOADIN", 6), 0);
}

/* ---- the script's reply as a decision --------------------------------------------- */

/* {allowed, remaining, retry_after_us, reset_after_us, tokens, ts, now_us, key}:
 * tokens and ts are the bucket as stored after the decision. */
typedef struct decision_case {
    const char *rule;
    const char *bytes;
    size_t len;
    int allowed;
    int64_t remaining, retry, reset, time;
    double tokens;   /* the stored state *state must get */
    int64_t ts;
} decision_case;

#define KEY_ALICE "$8\r\nrl:alice\r\n"

/* Each reply is what the script sends for alice at capacity 10 and rate 0.1:
 * remaining is the floor of the refilled level, retry and reset the least
 * waits from the stored state (tokens, ts) at now (worked out in the comment,
 * in exact arithmetic). */
static const decision_case good_replies[] = {
    /* stored {9, now - 1}: level 9.0000001; 9 + (1 + r) / 1e7 >= 10 */
    {"an allowed call", B(SCRIPT_REPLY), 1, 9, 0, 9999999, 1700000000000000LL, 9.0,
     1699999999999999LL},
    /* stored {0.5, 2} at 12: level 0.500001; 0.5 + (10 + r) / 1e7 >= 1, >= 10 */
    {"a refusal keeps the exact fractional level",
     B("*8\r\n:0\r\n:0\r\n:4999990\r\n:94999990\r\n$3\r\n0.5\r\n:2\r\n:12\r\n" KEY_ALICE),
     0, 0, 4999990, 94999990, 12, 0.5, 2},
    /* stored {3, 0} at 0, cost 11: 3 + r / 1e7 >= 10 */
    {"retry -1 means never: the cost exceeds the capacity",
     B("*8\r\n:0\r\n:3\r\n:-1\r\n:70000000\r\n$1\r\n3\r\n:0\r\n:0\r\n" KEY_ALICE),
     0, 3, HIRATE_NEVER, 70000000, 0, 3.0, 0},
    /* a key never stored is a full bucket at now */
    {"a full bucket: remaining equals the capacity",
     B("*8\r\n:1\r\n:10\r\n:0\r\n:0\r\n$2\r\n10\r\n:5\r\n:5\r\n" KEY_ALICE), 1, 10, 0, 0, 5,
     10.0, 5},
    /* stored {0.30000000000000004, 5} at 5: (1 - 0.3) * 1e7, (10 - 0.3) * 1e7 */
    {"17 significant digits of level",
     B("*8\r\n:0\r\n:0\r\n:7000000\r\n:97000000\r\n$19\r\n0.30000000000000004\r\n:5\r\n:5\r\n"
       KEY_ALICE),
     0, 0, 7000000, 97000000, 5, 0.30000000000000004, 5},
    /* stored {0.5, 0} at 25 s, cost 5, refused: the level is 0.5 + 2.5 = 3, so
     * remaining is 3 while the stored level stays 0.5;
     * 0.5 + (25e6 + r) / 1e7 >= 5, >= 10 */
    {"a refusal reports the refilled level and the stored one, which differ",
     B("*8\r\n:0\r\n:3\r\n:20000000\r\n:70000000\r\n$3\r\n0.5\r\n:0\r\n:25000000\r\n"
       KEY_ALICE),
     0, 3, 20000000, 70000000, 25000000, 0.5, 0},
    /* stored {12, 0} under an earlier capacity of 12, now 10: the level is
     * min(10, 12) = 10 and a refusal (cost 11) stores nothing */
    {"a level stored under a larger capacity passes through",
     B("*8\r\n:0\r\n:10\r\n:-1\r\n:0\r\n$2\r\n12\r\n:0\r\n:100\r\n" KEY_ALICE),
     0, 10, HIRATE_NEVER, 0, 100, 12.0, 0},
    /* stored {0.5, 2e6} at 1e6: a flat second, then 0.5 + (r - 1e6) / 1e7 >= 1, >= 10 */
    {"a stored time after now: the clock went back",
     B("*8\r\n:0\r\n:0\r\n:6000000\r\n:96000000\r\n$3\r\n0.5\r\n:2000000\r\n:1000000\r\n"
       KEY_ALICE),
     0, 0, 6000000, 96000000, 1000000, 0.5, 2000000},
    /* a full bucket at the last exact microsecond */
    {"the largest stored time and time",
     B("*8\r\n:1\r\n:10\r\n:0\r\n:0\r\n$2\r\n10\r\n:9007199254740991\r\n:9007199254740991\r\n"
       KEY_ALICE),
     1, 10, 0, 0, 9007199254740991LL, 10.0, 9007199254740991LL},
    /* %.17g never writes this, but 31 bytes is the longest level read */
    {"a level of 31 characters, the longest accepted",
     B("*8\r\n:1\r\n:10\r\n:0\r\n:0\r\n$31\r\n9.00000000000000000000000000000\r\n:5\r\n:5\r\n"
       KEY_ALICE),
     1, 10, 0, 0, 5, 9.0, 5},
    /* what %.17g writes for a level below 1e-4 (the script's own format);
     * stored {1e-5, 5} at 5: (1 - 1e-5) * 1e7, (10 - 1e-5) * 1e7 */
    {"a tiny level in exponent form",
     B("*8\r\n:0\r\n:0\r\n:9999900\r\n:99999900\r\n$22\r\n1.0000000000000001e-05\r\n:5\r\n:5\r\n"
       KEY_ALICE),
     0, 0, 9999900, 99999900, 5, 1.0000000000000001e-05, 5},
};

static hirate_call alice(void)
{
    return call_for("alice", 5, 1, 1, -1);
}

static void a_good_reply_fills_every_field(void)
{
    hirate_call c = alice();
    for (size_t i = 0; i < sizeof good_replies / sizeof good_replies[0]; i++) {
        const decision_case *dc = &good_replies[i];
        hirate_reply r;
        char *keep;
        CHECK_EQ_I64(parse_copy(dc->bytes, dc->len, &r, &keep), dc->len);
        hirate_decision d;
        memset(&d, 0x5A, sizeof d);   /* every field must be written */
        hirate_bucket state = {-42, -42};
        const char *why = NULL;
        int rc = hirate_proto_decision(&r, &c, &cfg10, &d, NULL, &state, &why);
        if (rc != 0)
            fprintf(stderr, "case: %s: %s\n", dc->rule, why ? why : "");
        CHECK_EQ_I64(rc, 0);
        CHECK_EQ_I64(d.allowed, dc->allowed);
        CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
        CHECK_EQ_I64(d.error, 0);
        CHECK_EQ_I64(d.limit, 10);
        CHECK_EQ_I64(d.remaining, dc->remaining);
        CHECK_EQ_I64(d.retry_after_us, dc->retry);
        CHECK_EQ_I64(d.reset_after_us, dc->reset);
        CHECK_EQ_I64(d.time_us, dc->time);
        /* the stored state, to the bit; the level is read only when the
         * bucket was left short of the cost (1 here), else it is NAN */
        if (dc->allowed && dc->remaining >= c.cost) {
            CHECK(isnan(state.tokens));
        } else {
            if (state.tokens != dc->tokens)
                fprintf(stderr, "case: %s: level %.17g\n", dc->rule, state.tokens);
            CHECK(memcmp(&state.tokens, &dc->tokens, sizeof(double)) == 0);
        }
        CHECK_EQ_I64(state.ts, dc->ts);
        free(keep);
    }
}

/* The base of the bad replies below: allowed, remaining 9, retry 0, reset
 * 100000, level "9", stored time 0, time 1, key rl:alice; each changes one
 * thing. */
static const bad_case bad_replies[] = {
    {"the 7-element reply of the script before the stored time was added",
     B("*7\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:1\r\n" KEY_ALICE),
     "the script's reply is not an array of 8"},
    {"6 elements", B("*6\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:1\r\n"),
     "the script's reply is not an array of 8"},
    /* (9 elements do not parse: HIRATE_REPLY_MAX_ELEMS is 8) */
    {"an empty array", B("*0\r\n"), "the script's reply is not an array of 8"},
    {"a nil array", B("*-1\r\n"), "the script's reply is not an array of 8"},
    {"an integer", B(":1\r\n"), "the script's reply is not an array of 8"},
    {"a status", B("+OK\r\n"), "the script's reply is not an array of 8"},
    {"a nil bulk", B("$-1\r\n"), "the script's reply is not an array of 8"},
    {"allowed as a bulk string",
     B("*8\r\n$1\r\n1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has an element of the wrong type"},
    {"the level as an integer",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n:9\r\n:0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has an element of the wrong type"},
    {"the stored time as a bulk string",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n$1\r\n0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has an element of the wrong type"},
    {"the stored time as a nil",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n$-1\r\n:1\r\n" KEY_ALICE),
     "the script's reply has an element of the wrong type"},
    {"the stored time as a status",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n+0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has an element of the wrong type"},
    {"the time as a bulk string",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:0\r\n$1\r\n1\r\n" KEY_ALICE),
     "the script's reply has an element of the wrong type"},
    {"the level and the stored time swapped",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n:0\r\n$1\r\n9\r\n:1\r\n" KEY_ALICE),
     "the script's reply has an element of the wrong type"},
    {"the key as a nil", B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n$-1\r\n"),
     "the script's reply has an element of the wrong type"},
    {"the key as a status",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n+rl:alice\r\n"),
     "the script's reply has an element of the wrong type"},
    {"allowed = 2", B("*8\r\n:2\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has a value out of range"},
    {"allowed = -1", B("*8\r\n:-1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has a value out of range"},
    {"remaining above the capacity",
     B("*8\r\n:1\r\n:11\r\n:0\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has a value out of range"},
    {"negative remaining",
     B("*8\r\n:0\r\n:-1\r\n:5\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has a value out of range"},
    {"allowed with a retry time",
     B("*8\r\n:1\r\n:9\r\n:5\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has a value out of range"},
    {"allowed with retry never",
     B("*8\r\n:1\r\n:9\r\n:-1\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has a value out of range"},
    {"retry below -1",
     B("*8\r\n:0\r\n:9\r\n:-2\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has a value out of range"},
    {"a negative reset",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:-1\r\n$1\r\n9\r\n:0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has a value out of range"},
    {"a negative stored time",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:-1\r\n:1\r\n" KEY_ALICE),
     "the script's reply has a value out of range"},
    {"a hugely negative stored time",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:-999999999999999999\r\n:1\r\n"
       KEY_ALICE),
     "the script's reply has a value out of range"},
    {"a negative time",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:0\r\n:-1\r\n" KEY_ALICE),
     "the script's reply has a value out of range"},
    {"an empty level",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$0\r\n\r\n:0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has a value out of range"},
    {"a level of 32 characters",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$32\r\n9.000000000000000000000000000000\r\n:0\r\n"
       ":1\r\n" KEY_ALICE),
     "the script's reply has a value out of range"},
    {"the reply of another key",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n$6\r\nrl:bob\r\n"),
     "the reply is for another key"},
    {"a key that differs in its last byte",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n$8\r\nrl:alicf\r\n"),
     "the reply is for another key"},
    {"a key that differs only after the prefix, by one more byte",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n$9\r\nrl:alice2\r\n"),
     "the reply is for another key"},
    {"a key one byte short",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n$7\r\nrl:alic\r\n"),
     "the reply is for another key"},
    {"the same key under another prefix",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n$8\r\nxx:alice\r\n"),
     "the reply is for another key"},
    {"the key without the prefix",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:0\r\n:1\r\n$5\r\nalice\r\n"),
     "the reply is for another key"},
    {"a level with a letter after it",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$2\r\n9x\r\n:0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has a malformed token level"},
    {"a level that is not a number",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$3\r\nabc\r\n:0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has a malformed token level"},
    {"a level with a trailing space",
     B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$2\r\n9 \r\n:0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has a malformed token level"},
    {"a level in a comma locale",
     B("*8\r\n:0\r\n:0\r\n:5\r\n:100000\r\n$3\r\n0,5\r\n:0\r\n:1\r\n" KEY_ALICE),
     "the script's reply has a malformed token level"},
};

static void a_bad_reply_is_a_protocol_error(void)
{
    hirate_call c = alice();
    for (size_t i = 0; i < sizeof bad_replies / sizeof bad_replies[0]; i++) {
        const bad_case *bc = &bad_replies[i];
        hirate_reply r;
        char *keep;
        long n = parse_copy(bc->bytes, bc->len, &r, &keep);
        if (n != (long)bc->len)
            fprintf(stderr, "case does not parse: %s\n", bc->rule);
        CHECK_EQ_I64(n, bc->len);
        hirate_decision d;
        hirate_bucket state;
        const char *why = NULL;
        int rc = hirate_proto_decision(&r, &c, &cfg10, &d, NULL, &state, &why);
        if (rc != HIRATE_EPROTO || !why || strcmp(why, bc->why) != 0)
            fprintf(stderr, "case: %s\n", bc->rule);
        CHECK_EQ_I64(rc, HIRATE_EPROTO);
        CHECK_EQ_STR(why, bc->why);
        free(keep);
    }
}

/* The level is the script's %.17g of a stored level of 0 or more: digits, a
 * point, an exponent. Anything else did not come from the script, and a NaN,
 * an infinity or a negative level must not reach the caller (or a cache).
 * (A level above the capacity, or one whose floor is not remaining, can come
 * from the script: see good_replies.) */
typedef struct level_case {
    const char *rule;
    const char *bytes;
    size_t len;
} level_case;

#define LEVEL_REPLY(remaining, len, level)                                                  \
    "*8\r\n:0\r\n:" remaining "\r\n:5\r\n:100000\r\n$" len "\r\n" level "\r\n:0\r\n:1\r\n" \
    KEY_ALICE

static const level_case impossible_levels[] = {
    {"NaN", B(LEVEL_REPLY("0", "3", "nan"))},
    {"NaN in capitals", B(LEVEL_REPLY("0", "3", "NAN"))},
    {"infinity", B(LEVEL_REPLY("10", "3", "inf"))},
    {"minus infinity", B(LEVEL_REPLY("0", "4", "-inf"))},
    {"a level past the largest double, which reads as infinity",
     B(LEVEL_REPLY("10", "5", "1e999"))},
    {"a negative level", B(LEVEL_REPLY("0", "4", "-0.5"))},
    {"a negative exponent-form level", B(LEVEL_REPLY("0", "6", "-1e-05"))},
    {"a hexadecimal level", B(LEVEL_REPLY("9", "3", "0x9"))},
    {"a level with a capital exponent", B(LEVEL_REPLY("9", "3", "9E0"))},
    {"a level after a space", B(LEVEL_REPLY("9", "2", " 9"))},
    {"a level with a space inside", B(LEVEL_REPLY("9", "3", "9 5"))},
    {"a level with a NUL byte after it", B(LEVEL_REPLY("9", "2", "9\0"))},
    {"a level with a NUL byte inside", B(LEVEL_REPLY("9", "3", "9\0" "5"))},
    {"a level that is a NUL byte", B(LEVEL_REPLY("0", "1", "\0"))},
    {"a lone point", B(LEVEL_REPLY("0", "1", "."))},
    {"a lone minus", B(LEVEL_REPLY("0", "1", "-"))},
    {"an exponent with no digits", B(LEVEL_REPLY("9", "2", "9e"))},
    {"two numbers", B(LEVEL_REPLY("9", "3", "9-1"))},
};

static void a_level_the_script_cannot_write_is_a_protocol_error(void)
{
    hirate_call c = alice();
    for (size_t i = 0; i < sizeof impossible_levels / sizeof impossible_levels[0]; i++) {
        const level_case *lc = &impossible_levels[i];
        hirate_reply r;
        char *keep;
        CHECK_EQ_I64(parse_copy(lc->bytes, lc->len, &r, &keep), lc->len);
        hirate_decision d;
        hirate_bucket state = {0, 0};
        const char *why = NULL;
        int rc = hirate_proto_decision(&r, &c, &cfg10, &d, NULL, &state, &why);
        if (rc != HIRATE_EPROTO)
            fprintf(stderr, "case: %s: accepted as a level of %g\n", lc->rule, state.tokens);
        CHECK_EQ_I64(rc, HIRATE_EPROTO);
        CHECK_EQ_STR(why, "the script's reply has a malformed token level");
        free(keep);
    }
}

static void a_key_with_nul_is_matched_whole(void)
{
    hirate_call c = call_for("a\0b", 3, 1, 1, -1);
    hirate_reply r;
    const char *why = NULL;
    hirate_decision d;
    hirate_bucket state = {-42, -42};
    char *keep;
    parse_copy(B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:7\r\n:8\r\n$6\r\nrl:a\0b\r\n"),
               &r, &keep);
    CHECK_EQ_I64(hirate_proto_decision(&r, &c, &cfg10, &d, NULL, &state, &why), 0);
    CHECK(isnan(state.tokens));   /* 9 left of a cost of 1: the level is not read */
    CHECK_EQ_I64(state.ts, 7);
    free(keep);
    parse_copy(B("*8\r\n:1\r\n:9\r\n:0\r\n:100000\r\n$1\r\n9\r\n:7\r\n:8\r\n$6\r\nrl:a\0c\r\n"),
               &r, &keep);
    CHECK_EQ_I64(hirate_proto_decision(&r, &c, &cfg10, &d, NULL, &state, &why), HIRATE_EPROTO);
    CHECK_EQ_STR(why, "the reply is for another key");
    free(keep);
}

typedef struct error_reply_case {
    const char *bytes;
    size_t len;
    int rc;
} error_reply_case;

static const error_reply_case error_replies[] = {
    {B("-NOSCRIPT No matching script. Please use EVAL.\r\n"), HIRATE_PROTO_NOSCRIPT},
    {B("-ERR hirate: cost must be a whole number from 0 to 2^53-1\r\n"), HIRATE_EREPLY},
    {B("-OOM command not allowed when used memory > 'maxmemory'.\r\n"), HIRATE_ESERVER},
    {B("-BUSY Redis is busy running a script.\r\n"), HIRATE_ESERVER},
    {B("-NOPERM this user has no permissions\r\n"), HIRATE_ENOPERM},
    {B("-NOAUTH Authentication required.\r\n"), HIRATE_EAUTH},
    {B("-BUSYKEY Target key name already exists.\r\n"), HIRATE_EREPLY},
};

static void an_error_reply_gives_its_class(void)
{
    hirate_call c = alice();
    for (size_t i = 0; i < sizeof error_replies / sizeof error_replies[0]; i++) {
        hirate_reply r;
        char *keep;
        CHECK_EQ_I64(parse_copy(error_replies[i].bytes, error_replies[i].len, &r, &keep),
                     error_replies[i].len);
        hirate_decision d;
        hirate_bucket state;
        const char *why = NULL;
        CHECK_EQ_I64(hirate_proto_decision(&r, &c, &cfg10, &d, NULL, &state, &why), error_replies[i].rc);
        free(keep);
    }
}

int main(void)
{
    limitslen = hirate_proto_encode_limits(limits, sizeof limits, 10, 0.1);
    CHECK_EQ_I64(limitslen, 17);
    CHECK(memcmp(limits, "$2\r\n10\r\n$3\r\n0.1\r\n", 17) == 0);

    valid_replies_parse_whole_with_exact_counts();
    trailing_bytes_belong_to_the_next_reply();
    the_elements_of_an_array_are_exact();
    every_proper_prefix_is_incomplete();
    byte_by_byte_feeding_gives_the_whole_result();
    random_split_feeding_gives_the_whole_result();
    malformed_replies_are_refused_with_a_reason();
    a_number_line_of_19_digits_is_an_error_at_once();
    a_line_too_long_without_crlf_is_an_error();
    a_line_too_long_is_an_error_with_its_crlf();
    the_largest_bulk_is_accepted();

    evalsha_calls_are_exact_resp();
    fcall_calls_are_exact_resp();
    function_load_carries_the_script_whole();
    a_refused_load_is_told_apart();
    a_key_of_512_bytes_has_a_3_digit_length();
    eval_sends_the_script_itself();
    an_empty_prefix_sends_the_key_alone();
    a_short_buffer_gets_the_length_and_no_bytes();
    an_evalsha_call_fits_the_overhead_plus_the_key();
    limits_are_encoded_in_the_fewest_exact_digits();
    every_rate_reads_back_exactly();
    limits_with_a_short_buffer_write_nothing();
    argv_commands_are_exact_resp();

    error_replies_are_classed_by_their_first_word();
    only_the_given_length_counts();

    a_good_reply_fills_every_field();
    a_bad_reply_is_a_protocol_error();
    a_level_the_script_cannot_write_is_a_protocol_error();
    a_key_with_nul_is_matched_whole();
    an_error_reply_gives_its_class();
    return check_summary("test_proto");
}
