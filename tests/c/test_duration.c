/*
 * Durations: hirate_duration_parse's grammar (a number and a unit, or a
 * number alone in seconds), and the duration options set from text or from
 * seconds, their ranges worded in the unit the caller used.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "hirate.h"

static const struct {
    const char *text;
    int64_t us;
} valid[] = {
    {"100ms", 100000}, {"0.25s", 250000}, {"2s", 2000000}, {"0.25", 250000},
    {"2", 2000000}, {"250us", 250}, {"1.5ms", 1500}, {"2m", 120000000},
    {"1h", 3600000000LL}, {" 100 ms ", 100000}, {"100MS", 100000}, {".5s", 500000},
    {"5.s", 5000000}, {"0", 0}, {"0.0000004s", 0}, {"0.0000005s", 1}, {"0.1", 100000},
    {"86400s", 86400000000LL}, {"007ms", 7000},
};

static const char *const invalid[] = {
    "", "   ", "ms", "s", ".", "-1s", "+1s", "1e3ms", "1 2s", "10 minutes", "1d", "1,5s",
    "0x10", "inf", "nan", "1s1", "1.2.3s",
};

static void parses(void)
{
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++) {
        int64_t us = -1;
        char err[HIRATE_ERRMSG_SIZE] = "x";
        int rc = hirate_duration_parse(valid[i].text, &us, err, sizeof err);
        if (rc || us != valid[i].us)
            fprintf(stderr, "  \"%s\": rc %d, %lld us (%s)\n", valid[i].text, rc,
                    (long long)us, err);
        CHECK_EQ_I64(rc, 0);
        CHECK_EQ_I64(us, valid[i].us);
        CHECK_EQ_STR(err, "");
    }
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        int64_t us = 42;
        char err[HIRATE_ERRMSG_SIZE] = "", want[HIRATE_ERRMSG_SIZE];
        CHECK_EQ_I64(hirate_duration_parse(invalid[i], &us, err, sizeof err), HIRATE_EOPTION);
        CHECK_EQ_I64(us, 42);
        snprintf(want, sizeof want,
                 "\"%s\" is not a duration (a number and a unit: 250us, 100ms, 0.25s, 2m, 1h; "
                 "a number alone is seconds)", invalid[i]);
        CHECK_EQ_STR(err, want);
    }
    int64_t us;
    char err[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_duration_parse("999999999999999h", &us, err, sizeof err), HIRATE_EOPTION);
    CHECK_EQ_STR(err, "\"999999999999999h\" is too long a duration");
    CHECK_EQ_I64(hirate_duration_parse("1234567890123456s", &us, err, sizeof err), HIRATE_EOPTION);
    CHECK_EQ_STR(err, "\"1234567890123456s\" has more than 15 digits");
    CHECK_EQ_I64(hirate_duration_parse("0.000000000000001s", &us, err, sizeof err), 0);
    CHECK_EQ_I64(us, 0);
    CHECK_EQ_I64(hirate_duration_parse(NULL, &us, err, sizeof err), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_duration_parse("1s", NULL, err, sizeof err), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_duration_parse("1s", &us, NULL, 0), 0);
}

/* Each option from text: the field in milliseconds, or the range in the
 * caller's unit. */
static void options_from_text(void)
{
    static const struct {
        const char *name, *text;
        int ms;           /* the field after, or 0 when refused */
        const char *err;  /* the message when refused */
    } cases[] = {
        {"timeout", "250ms", 250, NULL},
        {"timeout", "0.25s", 250, NULL},
        {"timeout", "0.25", 250, NULL},
        {"timeout", "60s", 60000, NULL},
        {"timeout", "500us", 1, NULL},
        {"timeout", "1500us", 2, NULL},
        {"connect_timeout", "2s", 2000, NULL},
        {"deny_cache_max", "1h", 3600000, NULL},
        {"deny_cache_max", "86400", 86400000, NULL},
        {"timeout", "0ms", 0, "timeout must be from 1ms to 60s, got 0ms"},
        {"timeout", "499us", 0, "timeout must be from 1ms to 60s, got 499us"},
        {"timeout", "61s", 0, "timeout must be from 1ms to 60s, got 61s"},
        {"timeout", " 2m ", 0, "timeout must be from 1ms to 60s, got 2m"},
        {"timeout", "100", 0, "timeout must be from 0.001 to 60 seconds, got 100"},
        {"timeout", "60.0004", 0, "timeout must be from 0.001 to 60 seconds, got 60.0004"},
        {"connect_timeout", "0", 0, "connect_timeout must be from 0.001 to 60 seconds, got 0"},
        {"deny_cache_max", "25h", 0, "deny_cache_max must be from 1ms to 86400s, got 25h"},
        {"deny_cache_max", "0.0004", 0,
         "deny_cache_max must be from 0.001 to 86400 seconds, got 0.0004"},
        {"timeout", "soon", 0,
         "timeout: \"soon\" is not a duration (a number and a unit: 250us, 100ms, 0.25s, 2m, "
         "1h; a number alone is seconds)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hirate_options o;
        hirate_options_init(&o);
        char err[HIRATE_ERRMSG_SIZE] = "x";
        int rc = hirate_options_set_duration(&o, cases[i].name, cases[i].text, err, sizeof err);
        int got = strcmp(cases[i].name, "timeout") == 0           ? o.timeout_ms
                  : strcmp(cases[i].name, "connect_timeout") == 0 ? o.connect_timeout_ms
                                                                   : o.deny_cache_max_ms;
        if (cases[i].err) {
            CHECK_EQ_I64(rc, HIRATE_EOPTION);
            CHECK_EQ_STR(err, cases[i].err);
            CHECK_EQ_I64(o.timeout_ms, 100); /* unchanged */
            CHECK_EQ_I64(o.deny_cache_max_ms, 1000);
        } else {
            CHECK_EQ_I64(rc, 0);
            CHECK_EQ_I64(got, cases[i].ms);
            CHECK_EQ_STR(err, "");
        }
    }
    hirate_options o;
    hirate_options_init(&o);
    char err[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_options_set_duration(&o, "timeout_ms", "1s", err, sizeof err),
                 HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_options_set_duration(&o, "backoff", "1s", err, sizeof err),
                 HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_options_set_duration(NULL, "timeout", "1s", err, sizeof err),
                 HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_options_set_duration(&o, "timeout", NULL, err, sizeof err),
                 HIRATE_EINVAL);
}

/* From seconds, as Python and Lua give them: the number in the message as
 * the shortest text that reads back as it. */
static void options_from_seconds(void)
{
    static const struct {
        const char *name;
        double s;
        int ms;
        const char *err;
    } cases[] = {
        {"timeout", 0.1, 100, NULL},
        {"timeout", 0.0005, 1, NULL},
        {"timeout", 60, 60000, NULL},
        {"deny_cache_max", 86400, 86400000, NULL},
        {"timeout", 0, 0, "timeout must be from 0.001 to 60 seconds, got 0"},
        {"timeout", 61, 0, "timeout must be from 0.001 to 60 seconds, got 61"},
        {"timeout", 60.0004, 0, "timeout must be from 0.001 to 60 seconds, got 60.0004"},
        {"connect_timeout", 0.0004, 0,
         "connect_timeout must be from 0.001 to 60 seconds, got 0.0004"},
        {"timeout", -1, 0, "timeout must be from 0.001 to 60 seconds, got -1"},
        {"timeout", INFINITY, 0, "timeout must be from 0.001 to 60 seconds, got inf"},
        {"deny_cache_max", 86400.001, 0,
         "deny_cache_max must be from 0.001 to 86400 seconds, got 86400.001"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hirate_options o;
        hirate_options_init(&o);
        char err[HIRATE_ERRMSG_SIZE] = "x";
        int rc = hirate_options_set_seconds(&o, cases[i].name, cases[i].s, err, sizeof err);
        int got = strcmp(cases[i].name, "timeout") == 0           ? o.timeout_ms
                  : strcmp(cases[i].name, "connect_timeout") == 0 ? o.connect_timeout_ms
                                                                   : o.deny_cache_max_ms;
        if (cases[i].err) {
            CHECK_EQ_I64(rc, HIRATE_EOPTION);
            CHECK_EQ_STR(err, cases[i].err);
        } else {
            CHECK_EQ_I64(rc, 0);
            CHECK_EQ_I64(got, cases[i].ms);
        }
    }
    hirate_options o;
    hirate_options_init(&o);
    char err[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_options_set_seconds(&o, "timeout", NAN, err, sizeof err), HIRATE_EOPTION);
    CHECK(strncmp(err, "timeout must be from 0.001 to 60 seconds, got ", 46) == 0);
    CHECK_EQ_I64(hirate_options_set_seconds(&o, "rate", 1, err, sizeof err), HIRATE_EINVAL);
}

/* C programs set the fields in milliseconds; the same ranges, in those. */
static void fields_in_milliseconds(void)
{
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = 1;
    o.rate = 1;
    o.timeout_ms = 60001;
    hirate_limiter *lim = NULL;
    char err[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, err, sizeof err), HIRATE_EOPTION);
    CHECK_EQ_STR(err, "timeout_ms must be from 1 to 60000, got 60001");
    o.timeout_ms = 100;
    o.deny_cache_max_ms = 0;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, err, sizeof err), HIRATE_EOPTION);
    CHECK_EQ_STR(err, "deny_cache_max_ms must be from 1 to 86400000, got 0");
    o.deny_cache = 0; /* no deny cache: its bound is not read */
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, err, sizeof err), 0);
    hirate_limiter_free(lim);
}

int main(void)
{
    parses();
    options_from_text();
    options_from_seconds();
    fields_in_milliseconds();
    return check_summary("test_duration");
}
