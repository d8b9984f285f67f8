/*
 * Limit strings: every case of tests/vectors/limit_strings.json, the file
 * the other languages check too. A valid text gives exactly its limits (the
 * rate bit for bit: count / window_s as a double); an invalid one gives
 * HIRATE_EOPTION and exactly its message. Then the edges of the API itself.
 *
 *   test_limits [limit_strings.json]   (default: under $HIRATE_SOURCE_DIR)
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "hirate.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = '\0';
    fclose(f);
    return s;
}

static void valid_cases(const cJSON *cases)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(c, "limits");
        hirate_limit got[HIRATE_LIMITS_MAX];
        size_t n = 99;
        char err[HIRATE_ERRMSG_SIZE] = "";
        int rc = hirate_limits_parse(text, got, HIRATE_LIMITS_MAX, &n, err, sizeof err);
        if (rc)
            fprintf(stderr, "  '%s': %d %s\n", text, rc, err);
        CHECK_EQ_I64(rc, 0);
        CHECK_EQ_I64(n, (size_t)cJSON_GetArraySize(want));
        for (size_t i = 0; rc == 0 && i < n && i < (size_t)cJSON_GetArraySize(want); i++) {
            const cJSON *w = cJSON_GetArrayItem(want, (int)i);
            CHECK_EQ_I64(got[i].capacity, (int64_t)cJSON_GetObjectItem(w, "capacity")->valuedouble);
            CHECK_EQ_I64(got[i].count, (int64_t)cJSON_GetObjectItem(w, "count")->valuedouble);
            CHECK_EQ_I64(got[i].window_s, (int64_t)cJSON_GetObjectItem(w, "window_s")->valuedouble);
            CHECK(got[i].rate == cJSON_GetObjectItem(w, "rate")->valuedouble);
            CHECK(got[i].rate == (double)got[i].count / (double)got[i].window_s);
        }
    }
}

static void invalid_cases(const cJSON *cases)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        const char *want = cJSON_GetObjectItem(c, "error")->valuestring;
        hirate_limit got[HIRATE_LIMITS_MAX];
        size_t n = 99;
        char err[HIRATE_ERRMSG_SIZE] = "";
        CHECK_EQ_I64(hirate_limits_parse(text, got, HIRATE_LIMITS_MAX, &n, err, sizeof err),
                     HIRATE_EOPTION);
        CHECK_EQ_I64(n, 0);
        CHECK_EQ_STR(err, want);
    }
}

/* The API's own edges: room for fewer limits than the text has, NULLs, a
 * long limit quoted in part. */
static void the_api_edges(void)
{
    hirate_limit one[1];
    size_t n = 99;
    char err[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_limits_parse("1/s; 2/s", one, 1, &n, err, sizeof err), HIRATE_EOPTION);
    CHECK_EQ_STR(err, "more than 1 limits");
    CHECK_EQ_I64(n, 0);
    CHECK_EQ_I64(hirate_limits_parse(NULL, one, 1, &n, err, sizeof err), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_limits_parse("1/s", NULL, 1, &n, err, sizeof err), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_limits_parse("1/s", one, 1, NULL, err, sizeof err), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_limits_parse("1/s", one, 1, &n, NULL, 0), 0);
    CHECK_EQ_I64(n, 1);
    char text[200];
    snprintf(text, sizeof text, "1/minute burst 1 %054d", 0);
    CHECK_EQ_I64(hirate_limits_parse(text, one, 1, &n, err, sizeof err), HIRATE_EOPTION);
    /* The limit quoted up to 60 bytes and "...", the rest up to 39. */
    char want[300];
    snprintf(want, sizeof want, "limit '1/minute burst 1 %.43s...': unexpected '%.39s' after "
             "the window", text + 17, text + 17);
    CHECK_EQ_STR(err, want);
}

int main(int argc, char **argv)
{
    char path[4096];
    if (argc > 1) {
        snprintf(path, sizeof path, "%s", argv[1]);
    } else {
        const char *src = getenv("HIRATE_SOURCE_DIR");
        if (!src) {
            fprintf(stderr, "usage: test_limits [limit_strings.json] (or set HIRATE_SOURCE_DIR)\n");
            return 2;
        }
        snprintf(path, sizeof path, "%s/tests/vectors/limit_strings.json", src);
    }
    char *text = slurp(path);
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    if (!doc) {
        fprintf(stderr, "test_limits: cannot read %s\n", path);
        return 2;
    }
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "valid")) >= 20);
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "invalid")) >= 20);
    valid_cases(cJSON_GetObjectItem(doc, "valid"));
    invalid_cases(cJSON_GetObjectItem(doc, "invalid"));
    the_api_edges();
    cJSON_Delete(doc);
    free(text);
    return check_summary("test_limits");
}
