/*
 * The error list: one X-macro in hirate.h gives the codes, their names and
 * their messages, so each is checked against the list itself; a few literal
 * cases guard against the list and the functions agreeing on a wrong thing.
 * Also the source names, the version string, and the range messages every
 * front end shows for a capacity or cost.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "hirate.h"

typedef struct listed {
    int code;
    const char *name;
    const char *message;
} listed;

/* What the list says, expanded here and not taken from the library. */
static const listed errors[] = {
#define LISTED_(name, code, msg) {HIRATE_##name, #name, msg},
    HIRATE_ERRNO_MAP(LISTED_)
#undef LISTED_
};
#define NERRORS (sizeof errors / sizeof errors[0])

static void every_listed_code_is_negative_and_distinct(void)
{
    CHECK(NERRORS > 0);
    for (size_t i = 0; i < NERRORS; i++) {
        CHECK(errors[i].code < 0);
        for (size_t j = i + 1; j < NERRORS; j++)
            if (errors[i].code == errors[j].code) {
                fprintf(stderr, "%s and %s share %d\n", errors[i].name, errors[j].name,
                        errors[i].code);
                CHECK(errors[i].code != errors[j].code);
            }
    }
}

static void every_listed_code_has_its_name_and_message(void)
{
    for (size_t i = 0; i < NERRORS; i++) {
        CHECK_EQ_STR(hirate_err_name(errors[i].code), errors[i].name);
        CHECK_EQ_STR(hirate_strerror(errors[i].code), errors[i].message);
    }
}

typedef struct spot {
    const char *rule;
    int code;
    int value;
    const char *name;
    const char *message;
} spot;

static const spot spots[] = {
    {"EINVAL is the first code, -1", HIRATE_EINVAL, -1, "EINVAL", "invalid argument"},
    {"ERATE names the rate", HIRATE_ERATE, -3, "ERATE", "invalid rate"},
    {"ERANGE speaks of exact arithmetic", HIRATE_ERANGE, -6, "ERANGE",
     "value too large for exact arithmetic"},
    {"EURL names the URL", HIRATE_EURL, -7, "EURL", "invalid Redis URL"},
    {"ESERVER is the server that cannot serve now", HIRATE_ESERVER, -14, "ESERVER",
     "Redis cannot serve the request now"},
    {"ECLOSED is the last code, -18", HIRATE_ECLOSED, -18, "ECLOSED", "limiter is closed"},
};

static void spot_checks_of_literal_names(void)
{
    for (size_t i = 0; i < sizeof spots / sizeof spots[0]; i++) {
        const spot *s = &spots[i];
        CHECK_EQ_I64(s->code, s->value);
        CHECK_EQ_STR(hirate_err_name(s->code), s->name);
        CHECK_EQ_STR(hirate_strerror(s->code), s->message);
    }
}

static void zero_is_success(void)
{
    CHECK_EQ_I64(HIRATE_OK, 0);
    CHECK_EQ_STR(hirate_err_name(0), "OK");
    CHECK_EQ_STR(hirate_strerror(0), "success");
}

static void unknown_codes_are_unknown(void)
{
    static const int unknown[] = {1, -22, -100, 42, INT_MAX, INT_MIN};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        CHECK_EQ_STR(hirate_err_name(unknown[i]), "UNKNOWN");
        CHECK_EQ_STR(hirate_strerror(unknown[i]), "unknown error");
    }
}

typedef struct source_case {
    int source;
    int value;
    const char *name;
} source_case;

static const source_case sources[] = {
    {HIRATE_SOURCE_REDIS, 1, "redis"},
    {HIRATE_SOURCE_LOCAL, 2, "local"},
    {HIRATE_SOURCE_CACHE, 3, "cache"},
    {HIRATE_SOURCE_FAIL_OPEN, 4, "fail_open"},
    {HIRATE_SOURCE_FAIL_CLOSED, 5, "fail_closed"},
    {0, 0, "unknown"},
    {6, 6, "unknown"},
    {-1, -1, "unknown"},
};

static void each_source_has_its_name(void)
{
    for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
        CHECK_EQ_I64(sources[i].source, sources[i].value);
        CHECK_EQ_STR(hirate_source_name(sources[i].source), sources[i].name);
    }
}

static void the_version_is_the_header_s(void)
{
    char expect[32];
    snprintf(expect, sizeof expect, "%d.%d.%d", HIRATE_VERSION_MAJOR, HIRATE_VERSION_MINOR,
             HIRATE_VERSION_PATCH);
    CHECK_EQ_STR(hirate_version(), HIRATE_VERSION_STRING);
    CHECK_EQ_STR(HIRATE_VERSION_STRING, expect);
    CHECK_EQ_I64(HIRATE_VERSION_NUM,
                 HIRATE_VERSION_MAJOR * 10000 + HIRATE_VERSION_MINOR * 100 + HIRATE_VERSION_PATCH);
}

/* The words of a capacity or cost out of range, for values C holds and
 * values only a front end's language does ("1.5", "2**70"). */
static void range_messages_are_the_core_s(void)
{
    char err[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_range_errmsg(HIRATE_ECOST, NULL, "-1", err, sizeof err), HIRATE_ECOST);
    CHECK_EQ_STR(err, "cost must be a whole number from 0 to 2^53-1, got -1");
    CHECK_EQ_I64(hirate_range_errmsg(HIRATE_ECOST, "item 2: cost", "2**70", err, sizeof err),
                 HIRATE_ECOST);
    CHECK_EQ_STR(err, "item 2: cost must be a whole number from 0 to 2^53-1, got 2**70");
    CHECK_EQ_I64(hirate_range_errmsg(HIRATE_ECAPACITY, NULL, "1.5", err, sizeof err),
                 HIRATE_ECAPACITY);
    CHECK_EQ_STR(err, "capacity must be a whole number from 1 to 2^53-1, got 1.5");
    CHECK_EQ_I64(hirate_range_errmsg(HIRATE_ECAPACITY, "bands[1]: capacity", "0", err,
                                     sizeof err),
                 HIRATE_ECAPACITY);
    CHECK_EQ_STR(err, "bands[1]: capacity must be a whole number from 1 to 2^53-1, got 0");
    CHECK_EQ_I64(hirate_range_errmsg(HIRATE_ERATE, NULL, "0", err, sizeof err), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_range_errmsg(HIRATE_ECOST, NULL, NULL, err, sizeof err), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_range_errmsg(HIRATE_ECOST, NULL, "-1", NULL, 0), HIRATE_ECOST);

    CHECK_EQ_I64(hirate_check_cost(0, NULL, err, sizeof err), 0);
    CHECK_EQ_I64(hirate_check_cost(HIRATE_EXACT_MAX, NULL, NULL, 0), 0);
    CHECK_EQ_I64(hirate_check_cost(HIRATE_EXACT_MAX + 1, NULL, err, sizeof err), HIRATE_ECOST);
    CHECK_EQ_STR(err, "cost must be a whole number from 0 to 2^53-1, got 9007199254740992");
    CHECK_EQ_I64(hirate_check_cost(INT64_MIN, NULL, err, sizeof err), HIRATE_ECOST);
    CHECK_EQ_STR(err, "cost must be a whole number from 0 to 2^53-1, got -9223372036854775808");
    CHECK_EQ_I64(hirate_check_cost(-1, "item 3: cost", err, sizeof err), HIRATE_ECOST);
    CHECK_EQ_STR(err, "item 3: cost must be a whole number from 0 to 2^53-1, got -1");

    CHECK_EQ_I64(hirate_check_key(1, NULL, err, sizeof err), 0);
    CHECK_EQ_I64(hirate_check_key(HIRATE_KEY_MAX, NULL, NULL, 0), 0);
    CHECK_EQ_I64(hirate_check_key(0, NULL, err, sizeof err), HIRATE_EKEY);
    CHECK_EQ_STR(err, "key is empty");
    CHECK_EQ_I64(hirate_check_key(HIRATE_KEY_MAX + 1, NULL, err, sizeof err), HIRATE_EKEY);
    CHECK_EQ_STR(err, "key is 513 bytes; the most is 512");
    CHECK_EQ_I64(hirate_check_key(0, "item 2: key", err, sizeof err), HIRATE_EKEY);
    CHECK_EQ_STR(err, "item 2: key is empty");
    CHECK_EQ_I64(hirate_check_key(SIZE_MAX, NULL, NULL, 0), HIRATE_EKEY);
}

int main(void)
{
    every_listed_code_is_negative_and_distinct();
    every_listed_code_has_its_name_and_message();
    spot_checks_of_literal_names();
    zero_is_success();
    unknown_codes_are_unknown();
    each_source_has_its_name();
    the_version_is_the_header_s();
    range_messages_are_the_core_s();
    return check_summary("test_errors");
}
