/*
 * The HTTP response of a request's limits: header values, status and the
 * refusal's text (hirate.h, hirate_response_format). Every web integration
 * writes its headers here, so that they say the same of the same decisions.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "hirate.h"
#include "name.h"

#define QUOTA_EXCEEDED "https://iana.org/assignments/http-problem-types#quota-exceeded"
#define REDUCED_CAPACITY \
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"

/* A writer over the caller's buffer; the size was checked up front, and the
 * bound is kept anyway. */
typedef struct out {
    char *buf;
    size_t len, at;
    int strings;    /* strings started */
} out;

static void put(out *o, const char *s, size_t n)
{
    if (o->at + n >= o->len)
        n = o->at < o->len ? o->len - o->at - 1 : 0;
    memcpy(o->buf + o->at, s, n);
    o->at += n;
    o->buf[o->at] = '\0';
}

static void puts_(out *o, const char *s)
{
    put(o, s, strlen(s));
}

static void put_i64(out *o, int64_t v)
{
    char num[24];
    int n = snprintf(num, sizeof num, "%" PRId64, v);
    put(o, num, (size_t)n);
}

/* A Structured Fields string: quotes around, '\' before '"' and '\'. */
static void put_sf_string(out *o, const char *s)
{
    put(o, "\"", 1);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            put(o, "\\", 1);
        put(o, s, 1);
    }
    put(o, "\"", 1);
}

/* Starts a string of its own, after the previous one's NUL: its start,
 * NUL-terminated as it grows. */
static const char *start(out *o)
{
    if (o->strings++ && o->at + 1 < o->len)
        o->at++;
    o->buf[o->at] = '\0';
    return o->buf + o->at;
}

/* Microseconds as whole seconds, rounded up (never below 0). */
static int64_t ceil_s(int64_t us)
{
    if (us <= 0)
        return 0;
    return us / 1000000 + (us % 1000000 != 0);
}

/* Whether a decision's figures are a bucket's: the failure policies' are
 * made up (open: as if full; closed: as if empty until Redis is tried). */
static int has_figures(const hirate_decision *d)
{
    return d->source != HIRATE_SOURCE_FAIL_OPEN && d->source != HIRATE_SOURCE_FAIL_CLOSED;
}

/* The t of a limit: until full when it held the cost, until the cost could
 * pass when it refused; -1 for never. */
static int64_t t_of(const hirate_decision *d)
{
    if (d->allowed)
        return ceil_s(d->reset_after_us);
    if (d->retry_after_us == HIRATE_NEVER)
        return -1;
    return ceil_s(d->retry_after_us);
}

/* The limit the legacy headers describe, or -1 when none has figures. */
static long binding(const hirate_response_limit *l, size_t n, int allowed)
{
    long best = -1;
    for (size_t i = 0; i < n; i++) {
        const hirate_decision *d = l[i].decision, *b = best < 0 ? NULL : l[best].decision;
        if (!has_figures(d) || (!allowed && d->allowed))
            continue;
        if (!b) {
            best = (long)i;
        } else if (!allowed) {
            if (d->retry_after_us > b->retry_after_us)
                best = (long)i;
        } else if (d->remaining < b->remaining ||
                   (d->remaining == b->remaining && d->reset_after_us > b->reset_after_us)) {
            best = (long)i;
        }
    }
    return best;
}

int hirate_response_format(const hirate_response_limit *limits, size_t n, int flags,
                           hirate_response *res, char *buf, size_t len, char *err,
                           size_t errlen)
{
    if (!limits || !res || !buf || n == 0)
        return hirate__fail(err, errlen, HIRATE_EINVAL,
                            n == 0 ? "a response describes at least one limit"
                                   : "limits, out and buf must not be NULL");
    for (size_t i = 0; i < n; i++) {
        if (!limits[i].decision)
            return hirate__fail(err, errlen, HIRATE_EINVAL, "limits[%zu]: decision is NULL",
                                i);
        char what[32];
        snprintf(what, sizeof what, "limits[%zu]", i);
        if (!limits[i].name)
            return hirate__fail(err, errlen, HIRATE_EINVAL, "%s: name is NULL", what);
        int rc = hirate__name_check(limits[i].name, what, err, errlen);
        if (rc < 0)
            return rc;
    }
    if (len < HIRATE_RESPONSE_SIZE(n))
        return hirate__fail(err, errlen, HIRATE_ERANGE,
                            "buffer of %zu bytes; a response of %zu limits needs %zu", len, n,
                            HIRATE_RESPONSE_SIZE(n));
    memset(res, 0, sizeof *res);
    out o = {buf, len, 0, 0};

    int allowed = 1, never = 0, all_closed = 1;
    int64_t wait = 0;
    for (size_t i = 0; i < n; i++) {
        const hirate_decision *d = limits[i].decision;
        if (d->allowed)
            continue;
        allowed = 0;
        all_closed = all_closed && d->source == HIRATE_SOURCE_FAIL_CLOSED;
        if (d->retry_after_us == HIRATE_NEVER)
            never = 1;
        else if (ceil_s(d->retry_after_us) > wait)
            wait = ceil_s(d->retry_after_us);
    }
    res->allowed = allowed;
    res->status = allowed ? 200 : all_closed ? 503 : 429;
    res->retry_after_s = allowed ? 0 : never ? -1 : wait;

    if (flags & HIRATE_HEADERS_RATELIMIT) {
        res->ratelimit_policy = start(&o);
        for (size_t i = 0; i < n; i++) {
            if (i)
                puts_(&o, ", ");
            put_sf_string(&o, limits[i].name);
            puts_(&o, ";q=");
            put_i64(&o, limits[i].capacity);
            puts_(&o, ";w=");
            put_i64(&o, hirate_refill_seconds(limits[i].capacity, limits[i].rate));
        }
        const char *rl = start(&o);
        int items = 0;
        for (size_t i = 0; i < n; i++) {
            const hirate_decision *d = limits[i].decision;
            if (!has_figures(d))
                continue;
            if (items++)
                puts_(&o, ", ");
            put_sf_string(&o, limits[i].name);
            puts_(&o, ";r=");
            put_i64(&o, d->remaining > 0 ? d->remaining : 0);
            int64_t t = t_of(d);
            if (t >= 0) {
                puts_(&o, ";t=");
                put_i64(&o, t);
            }
        }
        res->ratelimit = items ? rl : NULL;
    }
    if (flags & HIRATE_HEADERS_LEGACY) {
        long b = binding(limits, n, allowed);
        if (b >= 0) {
            const hirate_decision *d = limits[b].decision;
            res->x_ratelimit_limit = start(&o);
            put_i64(&o, limits[b].capacity);
            res->x_ratelimit_remaining = start(&o);
            put_i64(&o, d->remaining > 0 ? d->remaining : 0);
            int64_t t = t_of(d);
            if (t >= 0) {
                res->x_ratelimit_reset = start(&o);
                put_i64(&o, t);
            }
        }
    }
    if (allowed)
        return 0;
    if (!never) {
        res->retry_after = start(&o);
        put_i64(&o, wait);
    }
    res->problem_type = all_closed ? REDUCED_CAPACITY : QUOTA_EXCEEDED;
    res->title = all_closed ? "Rate limit unavailable" : "Too many requests";
    res->detail = start(&o);
    puts_(&o, all_closed ? "The rate limit cannot be checked now" : "Too many requests");
    if (n > 1 && !all_closed) {
        /* Which limits refused, when there is a choice. */
        size_t named = 0;
        puts_(&o, " (");
        for (size_t i = 0; i < n; i++) {
            if (limits[i].decision->allowed)
                continue;
            if (named++)
                puts_(&o, ", ");
            puts_(&o, limits[i].name);
        }
        puts_(&o, ")");
    }
    if (never) {
        puts_(&o, "; this request exceeds the limit and can never pass.");
    } else {
        puts_(&o, "; retry in ");
        put_i64(&o, wait);
        puts_(&o, wait == 1 ? " second." : " seconds.");
    }
    return 0;
}
