/*
 * Durations as people write them, and the options that are durations.
 *
 *   duration = number [ unit ]
 *   number   = digits [ "." [ digits ] ] / "." digits
 *   unit     = us / ms / s / m / h        (no unit: seconds)
 *
 * Spaces may surround the number and the unit; units ignore case. A bare
 * number is seconds, as a duration is in Python and Lua, so "0.25", "0.25s"
 * and "250ms" are one duration everywhere (docs/semantics.md, "Durations").
 *
 * The options that are durations (timeouts, deny_cache_max) have their
 * ranges here, once: hirate_limiter_new checks the C fields against them,
 * and a front end that reads a duration as text or as seconds sets the field
 * through hirate_options_set_duration or _set_seconds, whose message gives
 * the range in the unit its caller used.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "duration.h"
#include "errors.h"
#include "hirate.h"

#define US_PER_MS 1000LL
#define US_PER_S 1000000LL

/* ASCII only, whatever the locale (as limits.c reads limits). */
static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static int lower(char c)
{
    return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c;
}

static const struct {
    const char *name;
    int64_t us;
} units[] = {
    {"us", 1}, {"ms", US_PER_MS}, {"s", US_PER_S}, {"m", 60 * US_PER_S}, {"h", 3600 * US_PER_S},
};

/* The unit that text[0 .. len) names, in microseconds; 0 for none. */
static int64_t unit_us(const char *text, size_t len)
{
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        size_t n = strlen(units[i].name);
        if (n != len)
            continue;
        size_t k = 0;
        while (k < n && lower(text[k]) == units[i].name[k])
            k++;
        if (k == n)
            return units[i].us;
    }
    return 0;
}

/* Reads text as a duration into *us; *has_unit (when not NULL) says
 * whether it named its unit. */
static int parse(const char *text, int64_t *us, int *has_unit, char *err, size_t errlen)
{
    const char *p = text;
    while (is_space(*p))
        p++;
    /* Digits and their decimal point, read as an integer mantissa and a
     * count of decimals: the value is exact whatever the locale. */
    double mantissa = 0;
    int digits = 0, decimals = 0, point = 0, any = 0;
    for (;; p++) {
        if (*p >= '0' && *p <= '9') {
            any = 1;
            if (mantissa > 0 || *p != '0')
                digits++;
            mantissa = mantissa * 10 + (*p - '0');
            decimals += point;
        } else if (*p == '.' && !point) {
            point = 1;
        } else {
            break;
        }
    }
    const char *u = p;
    while (is_space(*u))
        u++;
    const char *ue = u;
    while (*ue && !is_space(*ue))
        ue++;
    const char *end = ue;
    while (is_space(*end))
        end++;
    int64_t scale = ue > u ? unit_us(u, (size_t)(ue - u)) : US_PER_S;
    if (!any || !scale || *end)
        return hirate__fail(err, errlen, HIRATE_EOPTION,
                            "\"%.64s\" is not a duration (a number and a unit: 250us, 100ms, "
                            "0.25s, 2m, 1h; a number alone is seconds)", text);
    if (digits > 15) /* beyond them a double would not hold the number */
        return hirate__fail(err, errlen, HIRATE_EOPTION, "\"%.64s\" has more than 15 digits",
                            text);
    double v = mantissa * (double)scale;
    for (int i = 0; i < decimals; i++)
        v /= 10;
    if (!(v <= (double)HIRATE_EXACT_MAX))
        return hirate__fail(err, errlen, HIRATE_EOPTION, "\"%.64s\" is too long a duration",
                            text);
    *us = (int64_t)llround(v);
    if (has_unit)
        *has_unit = ue > u;
    return 0;
}

int hirate_duration_parse(const char *text, int64_t *us, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!text || !us)
        return hirate__fail(err, errlen, HIRATE_EINVAL, "hirate_duration_parse needs text and us");
    return parse(text, us, NULL, err, errlen);
}

/* ---- the options that are durations ------------------------------------- */

static const struct {
    const char *name;     /* as Python, Lua and the CLI call it */
    const char *field;    /* as C calls it */
    size_t offset;        /* of the int field of milliseconds */
    int min_ms, max_ms;
} options[] = {
    {"connect_timeout", "connect_timeout_ms", offsetof(hirate_options, connect_timeout_ms), 1,
     60000},
    {"timeout", "timeout_ms", offsetof(hirate_options, timeout_ms), 1, 60000},
    {"deny_cache_max", "deny_cache_max_ms", offsetof(hirate_options, deny_cache_max_ms), 1,
     86400000},
};
#define NOPTIONS (sizeof options / sizeof options[0])

static int find(const char *name)
{
    for (size_t i = 0; name && i < NOPTIONS; i++)
        if (strcmp(options[i].name, name) == 0)
            return (int)i;
    return -1;
}

static int *field(hirate_options *o, int i)
{
    return (int *)(void *)((char *)o + options[i].offset);
}

int hirate__duration_check(const hirate_options *o, const char *name, char *err, size_t errlen)
{
    int i = find(name);
    int v = *field((hirate_options *)o, i);
    if (v < options[i].min_ms || v > options[i].max_ms)
        return hirate__fail(err, errlen, HIRATE_EOPTION, "%s must be from %d to %d, got %d",
                            options[i].field, options[i].min_ms, options[i].max_ms, v);
    return 0;
}

/* us as the shortest of "250us", "100ms", "2s" that is exact. */
static void with_unit(char *buf, size_t len, int64_t us)
{
    if (us % US_PER_S == 0)
        snprintf(buf, len, "%llds", (long long)(us / US_PER_S));
    else if (us % US_PER_MS == 0)
        snprintf(buf, len, "%lldms", (long long)(us / US_PER_MS));
    else
        snprintf(buf, len, "%lldus", (long long)us);
}

/* The shortest %g that reads back as v, as Python's repr and Lua 5.4 print
 * a float ("0.0004", "60.0004", "61"). */
static void shortest(char *buf, size_t len, double v)
{
    if (v == floor(v) && fabs(v) < 1e16) {
        snprintf(buf, len, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (isnan(v) || strtod(buf, NULL) == v)
            return;
    }
}

/* us into option i, when its range holds it: milliseconds rounded to the
 * nearest, so that 0.0005 s is 1 ms and 60.0004 s is over 60 s. got is the
 * value as its caller wrote it; has_unit says how to word the range. */
static int set(hirate_options *o, int i, double us, const char *got, int has_unit, char *err,
               size_t errlen)
{
    double ms = us / US_PER_MS;
    if (!(ms >= options[i].min_ms - 0.5 && ms <= options[i].max_ms)) {
        char lo[32], hi[32];
        if (has_unit) {
            with_unit(lo, sizeof lo, (int64_t)options[i].min_ms * US_PER_MS);
            with_unit(hi, sizeof hi, (int64_t)options[i].max_ms * US_PER_MS);
            return hirate__fail(err, errlen, HIRATE_EOPTION, "%s must be from %s to %s, got %s",
                                options[i].name, lo, hi, got);
        }
        shortest(lo, sizeof lo, options[i].min_ms / 1000.0);
        shortest(hi, sizeof hi, options[i].max_ms / 1000.0);
        return hirate__fail(err, errlen, HIRATE_EOPTION,
                            "%s must be from %s to %s seconds, got %s", options[i].name, lo, hi,
                            got);
    }
    *field(o, i) = (int)floor(ms + 0.5);
    return 0;
}

int hirate_options_set_duration(hirate_options *o, const char *name, const char *text, char *err,
                                size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    int i = find(name);
    if (!o || i < 0 || !text)
        return hirate__fail(err, errlen, HIRATE_EINVAL,
                            "hirate_options_set_duration needs options, a duration option's "
                            "name and text");
    char why[HIRATE_ERRMSG_SIZE];
    int64_t us;
    int has_unit, rc = parse(text, &us, &has_unit, why, sizeof why);
    if (rc < 0)
        return hirate__fail(err, errlen, rc, "%s: %s", name, why);
    const char *t = text;
    size_t n = strlen(t);
    while (is_space(*t))
        t++, n--;
    while (n && is_space(t[n - 1]))
        n--;
    char got[80];
    snprintf(got, sizeof got, "%.*s", (int)(n < 64 ? n : 64), t);
    return set(o, i, (double)us, got, has_unit, err, errlen);
}

int hirate_options_set_seconds(hirate_options *o, const char *name, double seconds, char *err,
                               size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    int i = find(name);
    if (!o || i < 0)
        return hirate__fail(err, errlen, HIRATE_EINVAL,
                            "hirate_options_set_seconds needs options and a duration option's "
                            "name");
    char got[32];
    shortest(got, sizeof got, seconds);
    return set(o, i, seconds * US_PER_S, got, 0, err, errlen);
}
