/*
 * Limits as people write them (docs/semantics.md, "Limit strings"):
 *
 *   limits = limit *( ( ";" / "," ) limit )
 *   limit  = count ( "/" / "per" ) window [ "burst" count ]
 *   window = [ count ] unit
 *   unit   = s / sec / secs / second / seconds / m / min / mins / minute /
 *            minutes / h / hr / hrs / hour / hours / d / day / days
 *
 * Spaces may surround every part; units ignore case. "N/window" is a bucket
 * of N tokens refilled at N per window; "burst B" makes the bucket B tokens
 * instead, at the same rate. A message quotes the limit it is about and
 * names the part that is wrong.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "bucket.h"
#include "errors.h"
#include "hirate.h"

/* ASCII only, whatever the process' locale (<ctype.h> follows LC_CTYPE, and
 * a host such as Python sets it from the environment): the same text must
 * mean the same limits in every program. */
static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int is_alpha(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static char lower(char c)
{
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

typedef struct cursor {
    const char *p, *end;    /* what is left of this limit */
    const char *start;      /* the limit, for messages */
    size_t len;
} cursor;

static void skip_spaces(cursor *c)
{
    while (c->p < c->end && is_space(*c->p))
        c->p++;
}

/* A whole number from 1 to 2^53-1 at the cursor: 1, 0 when there is none
 * (not a digit), -1 when it is out of range. */
static int read_count(cursor *c, int64_t *out)
{
    skip_spaces(c);
    if (c->p == c->end || !is_digit(*c->p))
        return 0;
    int64_t v = 0;
    int over = 0;
    for (; c->p < c->end && is_digit(*c->p); c->p++) {
        if (v > (HIRATE_EXACT_MAX - (*c->p - '0')) / 10)
            over = 1;
        else
            v = v * 10 + (*c->p - '0');
    }
    if (over || v < 1)
        return -1;
    *out = v;
    return 1;
}

/* The next word (letters), lower-cased into buf: its length, 0 if none. */
static size_t read_word(cursor *c, char *buf, size_t cap)
{
    skip_spaces(c);
    size_t n = 0;
    while (c->p < c->end && is_alpha(*c->p)) {
        if (n + 1 < cap)
            buf[n] = lower(*c->p);
        n++;
        c->p++;
    }
    buf[n < cap ? n : cap - 1] = '\0';
    return n;
}

static int64_t unit_seconds(const char *w)
{
    static const struct { const char *name; int64_t seconds; } units[] = {
        {"s", 1},     {"sec", 1},     {"secs", 1},    {"second", 1},  {"seconds", 1},
        {"m", 60},    {"min", 60},    {"mins", 60},   {"minute", 60}, {"minutes", 60},
        {"h", 3600},  {"hr", 3600},   {"hrs", 3600},  {"hour", 3600}, {"hours", 3600},
        {"d", 86400}, {"day", 86400}, {"days", 86400},
    };
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (strcmp(w, units[i].name) == 0)
            return units[i].seconds;
    return 0;
}

/* A message about limit c: "limit '<the limit>': <what>". */
static int fail_at(const cursor *c, char *err, size_t errlen, const char *fmt, ...)
    HIRATE_PRINTF(4, 5);

static int fail_at(const cursor *c, char *err, size_t errlen, const char *fmt, ...)
{
    char detail[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    /* Up to 60 bytes of it, each byte that is not printable ASCII as '?', as
     * every message that quotes what it was given. */
    char shown[61];
    size_t n = c->len > 60 ? 60 : c->len;
    for (size_t i = 0; i < n; i++)
        shown[i] = c->start[i] >= ' ' && c->start[i] < 0x7f ? c->start[i] : '?';
    shown[n] = '\0';
    return hirate__fail(err, errlen, HIRATE_EOPTION, "limit '%s%s': %s", shown,
                        c->len > 60 ? "..." : "", detail);
}

static int parse_one(cursor *c, hirate_limit *out, char *err, size_t errlen)
{
    int64_t count, every = 1, burst = 0;
    char word[16];
    int got = read_count(c, &count);
    if (got <= 0 || (c->p < c->end && *c->p == '.'))
        return fail_at(c, err, errlen, "the count must be a whole number from 1 to 2^53-1");
    skip_spaces(c);
    if (c->p < c->end && *c->p == '/') {
        c->p++;
    } else {
        const char *at = c->p;
        if (!read_word(c, word, sizeof word) || strcmp(word, "per") != 0) {
            c->p = at;
            return fail_at(c, err, errlen, "expected N/window or N per window, e.g. 100/minute");
        }
    }
    got = read_count(c, &every);
    if (got < 0 || (c->p < c->end && *c->p == '.'))
        return fail_at(c, err, errlen,
                       "the window must be a whole number of units from 1 to 2^53-1");
    if (!read_word(c, word, sizeof word))
        return fail_at(c, err, errlen, "the window needs a unit: second, minute, hour or day");
    int64_t unit = unit_seconds(word);
    if (!unit)
        return fail_at(c, err, errlen, "unknown unit '%s' (second, minute, hour or day)", word);
    if (every > HIRATE_EXACT_MAX / unit)
        return fail_at(c, err, errlen, "the window is longer than 2^53-1 seconds");
    const char *after = c->p;
    size_t wl = read_word(c, word, sizeof word);
    if (wl && strcmp(word, "burst") == 0) {
        if (read_count(c, &burst) <= 0)
            return fail_at(c, err, errlen, "burst needs a whole number from 1 to 2^53-1");
        after = c->p;
        wl = read_word(c, word, sizeof word);
    }
    skip_spaces(c);
    if (wl || c->p < c->end) {
        char rest[40];
        const char *from = after;
        while (from < c->end && is_space(*from))
            from++;
        size_t n = (size_t)(c->end - from) < sizeof rest - 1 ? (size_t)(c->end - from)
                                                              : sizeof rest - 1;
        for (size_t i = 0; i < n; i++)
            rest[i] = from[i] >= ' ' && from[i] < 0x7f ? from[i] : '?';
        rest[n] = '\0';
        return fail_at(c, err, errlen, "unexpected '%s' after the window", rest);
    }
    out->count = count;
    out->window_s = every * unit;
    out->capacity = burst ? burst : count;
    out->rate = (double)count / (double)out->window_s;
    hirate_bucket_cfg cfg;
    char why[HIRATE_ERRMSG_SIZE];
    if (hirate_bucket_cfg_init(&cfg, out->capacity, out->rate, why, sizeof why) < 0)
        return fail_at(c, err, errlen, "%s", why);
    return 0;
}

int hirate_limits_parse(const char *text, hirate_limit *out, size_t max, size_t *n, char *err,
                        size_t errlen)
{
    if (n)
        *n = 0;
    if (!text || !n || (!out && max))
        return hirate__fail(err, errlen, HIRATE_EINVAL,
                            "hirate_limits_parse needs text, out and n");
    const char *p = text, *end = text + strlen(text);
    size_t k = 0;
    for (;;) {
        const char *q = p;
        while (q < end && *q != ';' && *q != ',')
            q++;
        cursor c = {p, q, p, (size_t)(q - p)};
        /* The limit as written, without the spaces around it. */
        while (c.start < q && is_space(*c.start))
            c.start++;
        c.len = (size_t)(q - c.start);
        while (c.len && is_space(c.start[c.len - 1]))
            c.len--;
        if (!c.len)
            return hirate__fail(err, errlen, HIRATE_EOPTION, "%s",
                                k || q < end ? "an empty limit before or after a separator"
                                             : "the limit string is empty");
        if (k == max || k == HIRATE_LIMITS_MAX)
            return hirate__fail(err, errlen, HIRATE_EOPTION, "more than %zu limits",
                                max < HIRATE_LIMITS_MAX ? max : (size_t)HIRATE_LIMITS_MAX);
        int rc = parse_one(&c, &out[k], err, errlen);
        if (rc < 0)
            return rc;
        k++;
        if (q == end)
            break;
        p = q + 1;
    }
    *n = k;
    return 0;
}
