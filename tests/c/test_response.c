/*
 * hirate_response_format: the headers, status and refusal text of a
 * response, for each kind of decision (docs/semantics.md, "Response
 * headers"). Every web integration writes these very strings.
 */
#include <stdlib.h>

#include "check.h"
#include "hirate.h"

#define S 1000000LL

static hirate_decision dec(int allowed, int source, int64_t limit, int64_t remaining,
                           int64_t retry_us, int64_t reset_us)
{
    hirate_decision d = {0};
    d.allowed = allowed;
    d.source = source;
    d.limit = limit;
    d.remaining = remaining;
    d.retry_after_us = retry_us;
    d.reset_after_us = reset_us;
    return d;
}

static char buf[HIRATE_RESPONSE_SIZE(HIRATE_BANDS_MAX)];
static const int ALL = HIRATE_HEADERS_RATELIMIT | HIRATE_HEADERS_LEGACY;

static hirate_response fmt(const hirate_response_limit *l, size_t n, int flags)
{
    hirate_response r;
    char err[HIRATE_ERRMSG_SIZE];
    int rc = hirate_response_format(l, n, flags, &r, buf, sizeof buf, err, sizeof err);
    CHECK_EQ_I64(rc, 0);
    if (rc)
        fprintf(stderr, "%s\n", err);
    return r;
}

static void test_allowed_one_limit(void)
{
    hirate_decision d = dec(1, HIRATE_SOURCE_REDIS, 5, 4, 0, 12 * S);
    hirate_response_limit l = {"5-per-60s", 5, 5.0 / 60, &d};
    hirate_response r = fmt(&l, 1, ALL);
    CHECK_EQ_I64(r.allowed, 1);
    CHECK_EQ_I64(r.status, 200);
    CHECK_EQ_I64(r.retry_after_s, 0);
    CHECK_EQ_STR(r.ratelimit_policy, "\"5-per-60s\";q=5;w=60");
    CHECK_EQ_STR(r.ratelimit, "\"5-per-60s\";r=4;t=12");
    CHECK_EQ_STR(r.x_ratelimit_limit, "5");
    CHECK_EQ_STR(r.x_ratelimit_remaining, "4");
    CHECK_EQ_STR(r.x_ratelimit_reset, "12");
    CHECK(r.retry_after == NULL);
    CHECK(r.detail == NULL && r.title == NULL && r.problem_type == NULL);
}

static void test_refused_one_limit_rounds_up(void)
{
    hirate_decision d = dec(0, HIRATE_SOURCE_CACHE, 5, 0, 11 * S + 1, 60 * S);
    hirate_response_limit l = {"login", 5, 5.0 / 60, &d};
    hirate_response r = fmt(&l, 1, ALL);
    CHECK_EQ_I64(r.status, 429);
    CHECK_EQ_I64(r.retry_after_s, 12);
    CHECK_EQ_STR(r.ratelimit, "\"login\";r=0;t=12");
    CHECK_EQ_STR(r.x_ratelimit_reset, "12");
    CHECK_EQ_STR(r.retry_after, "12");
    CHECK_EQ_STR(r.detail, "Too many requests; retry in 12 seconds.");
    CHECK_EQ_STR(r.title, "Too many requests");
    CHECK_EQ_STR(r.problem_type,
                 "https://iana.org/assignments/http-problem-types#quota-exceeded");
}

static void test_one_second_is_singular(void)
{
    hirate_decision d = dec(0, HIRATE_SOURCE_REDIS, 1, 0, S, S);
    hirate_response_limit l = {"a", 1, 1.0, &d};
    hirate_response r = fmt(&l, 1, 0);
    CHECK(r.ratelimit_policy == NULL && r.ratelimit == NULL && r.x_ratelimit_limit == NULL);
    CHECK_EQ_STR(r.retry_after, "1");
    CHECK_EQ_STR(r.detail, "Too many requests; retry in 1 second.");
}

static void test_never_has_no_t_nor_retry_after(void)
{
    hirate_decision d = dec(0, HIRATE_SOURCE_REDIS, 5, 5, HIRATE_NEVER, 0);
    hirate_response_limit l = {"5-per-60s", 5, 5.0 / 60, &d};
    hirate_response r = fmt(&l, 1, ALL);
    CHECK_EQ_I64(r.retry_after_s, -1);
    CHECK_EQ_STR(r.ratelimit, "\"5-per-60s\";r=5");
    CHECK(r.x_ratelimit_reset == NULL);
    CHECK(r.retry_after == NULL);
    CHECK_EQ_STR(r.detail, "Too many requests; this request exceeds the limit and can "
                           "never pass.");
}

/* A burst band refused; the daily band held the cost, spent nothing and
 * reports its own reset time, never the burst's retry time. */
static void test_stacked_refusal_each_band_its_own_t(void)
{
    hirate_decision burst = dec(0, HIRATE_SOURCE_REDIS, 10, 0, 100000, S);
    hirate_decision daily = dec(1, HIRATE_SOURCE_REDIS, 1000, 990, 0, 864 * S);
    hirate_response_limit l[2] = {{"burst", 10, 10.0, &burst},
                                  {"daily", 1000, 1000.0 / 86400, &daily}};
    hirate_response r = fmt(l, 2, ALL);
    CHECK_EQ_I64(r.status, 429);
    CHECK_EQ_STR(r.ratelimit_policy, "\"burst\";q=10;w=1, \"daily\";q=1000;w=86400");
    CHECK_EQ_STR(r.ratelimit, "\"burst\";r=0;t=1, \"daily\";r=990;t=864");
    CHECK_EQ_STR(r.x_ratelimit_limit, "10");
    CHECK_EQ_STR(r.x_ratelimit_remaining, "0");
    CHECK_EQ_STR(r.x_ratelimit_reset, "1");
    CHECK_EQ_STR(r.retry_after, "1");
    CHECK_EQ_STR(r.detail, "Too many requests (burst); retry in 1 second.");
}

static void test_allowed_legacy_is_the_fewest_left(void)
{
    hirate_decision a = dec(1, HIRATE_SOURCE_REDIS, 10, 3, 0, 2 * S);
    hirate_decision b = dec(1, HIRATE_SOURCE_REDIS, 100, 3, 0, 90 * S);
    hirate_decision c = dec(1, HIRATE_SOURCE_REDIS, 100, 50, 0, 9 * S);
    hirate_response_limit l[3] = {{"a", 10, 5.0, &a}, {"b", 100, 1.0, &b}, {"c", 100, 10, &c}};
    hirate_response r = fmt(l, 3, HIRATE_HEADERS_LEGACY);
    CHECK(r.ratelimit == NULL);
    CHECK_EQ_STR(r.x_ratelimit_limit, "100");
    CHECK_EQ_STR(r.x_ratelimit_remaining, "3");
    CHECK_EQ_STR(r.x_ratelimit_reset, "90");
}

static void test_names_are_sf_strings(void)
{
    hirate_decision d = dec(1, HIRATE_SOURCE_LOCAL, 2, 1, 0, S / 2);
    hirate_response_limit l = {"a \"b\" \\c", 2, 2.0, &d};
    hirate_response r = fmt(&l, 1, HIRATE_HEADERS_RATELIMIT);
    CHECK_EQ_STR(r.ratelimit_policy, "\"a \\\"b\\\" \\\\c\";q=2;w=1");
    CHECK_EQ_STR(r.ratelimit, "\"a \\\"b\\\" \\\\c\";r=1;t=1");
}

/* on_error "open": no bucket behind the figures, so no RateLimit item and
 * no legacy header; the policy still holds. */
static void test_fail_open_has_no_ratelimit_item(void)
{
    hirate_decision d = dec(1, HIRATE_SOURCE_FAIL_OPEN, 5, 4, 0, 0);
    hirate_response_limit l = {"5-per-60s", 5, 5.0 / 60, &d};
    hirate_response r = fmt(&l, 1, ALL);
    CHECK_EQ_I64(r.status, 200);
    CHECK_EQ_STR(r.ratelimit_policy, "\"5-per-60s\";q=5;w=60");
    CHECK(r.ratelimit == NULL);
    CHECK(r.x_ratelimit_limit == NULL && r.x_ratelimit_remaining == NULL &&
          r.x_ratelimit_reset == NULL);
}

/* on_error "closed": a 503, Retry-After until Redis is asked again, no
 * RateLimit item. */
static void test_fail_closed_is_503_without_items(void)
{
    hirate_decision d = dec(0, HIRATE_SOURCE_FAIL_CLOSED, 5, 0, 100000, 100000);
    hirate_response_limit l = {"5-per-60s", 5, 5.0 / 60, &d};
    hirate_response r = fmt(&l, 1, ALL);
    CHECK_EQ_I64(r.status, 503);
    CHECK_EQ_I64(r.retry_after_s, 1);
    CHECK(r.ratelimit == NULL);
    CHECK(r.x_ratelimit_limit == NULL);
    CHECK_EQ_STR(r.retry_after, "1");
    CHECK_EQ_STR(r.title, "Rate limit unavailable");
    CHECK_EQ_STR(r.problem_type, "https://iana.org/assignments/http-problem-types"
                                 "#temporary-reduced-capacity");
    CHECK_EQ_STR(r.detail, "The rate limit cannot be checked now; retry in 1 second.");
}

/* One limit decided by Redis, another by the policy: only the first has
 * an item; a refusal by both is a 429 (not every refusal was the policy's). */
static void test_mixed_sources(void)
{
    hirate_decision a = dec(0, HIRATE_SOURCE_REDIS, 10, 0, 3 * S, 10 * S);
    hirate_decision b = dec(0, HIRATE_SOURCE_FAIL_CLOSED, 100, 0, 100000, 100000);
    hirate_response_limit l[2] = {{"a", 10, 1.0, &a}, {"b", 100, 1.0, &b}};
    hirate_response r = fmt(l, 2, ALL);
    CHECK_EQ_I64(r.status, 429);
    CHECK_EQ_STR(r.ratelimit, "\"a\";r=0;t=3");
    CHECK_EQ_STR(r.x_ratelimit_limit, "10");
    CHECK_EQ_STR(r.x_ratelimit_reset, "3");
    CHECK_EQ_STR(r.retry_after, "3");
    CHECK_EQ_STR(r.detail, "Too many requests (a, b); retry in 3 seconds.");
}

static void test_bad_input(void)
{
    hirate_decision d = dec(1, HIRATE_SOURCE_REDIS, 1, 0, 0, 0);
    hirate_response_limit l = {"\x01", 1, 1.0, &d};
    hirate_response r;
    char err[HIRATE_ERRMSG_SIZE], small[8];
    CHECK_EQ_I64(hirate_response_format(&l, 1, 0, &r, buf, sizeof buf, err, sizeof err),
                 HIRATE_EOPTION);
    CHECK_EQ_STR(err, "limits[0]: a band's name must be printable ASCII (it is sent in "
                      "headers)");
    l.name = "";
    CHECK_EQ_I64(hirate_response_format(&l, 1, 0, &r, buf, sizeof buf, err, sizeof err),
                 HIRATE_EOPTION);
    CHECK_EQ_STR(err, "limits[0]: a band's name must be 1 to 64 bytes, got 0");
    l.name = "ok";
    CHECK_EQ_I64(hirate_response_format(&l, 0, 0, &r, buf, sizeof buf, err, sizeof err),
                 HIRATE_EINVAL);
    CHECK_EQ_STR(err, "a response describes at least one limit");
    CHECK_EQ_I64(hirate_response_format(&l, 1, 0, &r, small, sizeof small, err, sizeof err),
                 HIRATE_ERANGE);
    CHECK_EQ_STR(err, "buffer of 8 bytes; a response of 1 limits needs 736");
    CHECK_EQ_I64(hirate_response_format(&l, 1, 0, &r, buf, sizeof buf, NULL, 0), 0);
}

/* The most a response of HIRATE_BANDS_MAX limits writes fits the bound. */
static void test_the_bound_holds(void)
{
    static hirate_response_limit l[HIRATE_BANDS_MAX];
    static hirate_decision d[HIRATE_BANDS_MAX];
    static char names[HIRATE_BANDS_MAX][HIRATE_BAND_NAME_MAX + 1];
    for (int i = 0; i < HIRATE_BANDS_MAX; i++) {
        memset(names[i], '"', HIRATE_BAND_NAME_MAX);
        names[i][0] = (char)('A' + i);
        d[i] = dec(0, HIRATE_SOURCE_REDIS, HIRATE_EXACT_MAX, HIRATE_EXACT_MAX,
                   HIRATE_EXACT_MAX, HIRATE_EXACT_MAX);
        l[i] = (hirate_response_limit){names[i], HIRATE_EXACT_MAX, 1e-300, &d[i]};
    }
    memset(buf, 0x7f, sizeof buf);
    hirate_response r = fmt(l, HIRATE_BANDS_MAX, ALL);
    CHECK(r.detail != NULL);
    size_t end = (size_t)(r.detail - buf) + strlen(r.detail);
    CHECK(end < sizeof buf);
    /* Each item: quotes, a letter and 63 escaped quotes, r of 16 digits, t of
     * 10, and ", " between. */
    CHECK_EQ_I64(strlen(r.ratelimit),
                 HIRATE_BANDS_MAX * (2 + 1 + 2 * 63 + 3 + 16 + 3 + 10 + 2) - 2);
}

int main(void)
{
    test_allowed_one_limit();
    test_refused_one_limit_rounds_up();
    test_one_second_is_singular();
    test_never_has_no_t_nor_retry_after();
    test_stacked_refusal_each_band_its_own_t();
    test_allowed_legacy_is_the_fewest_left();
    test_names_are_sf_strings();
    test_fail_open_has_no_ratelimit_item();
    test_fail_closed_is_503_without_items();
    test_mixed_sources();
    test_bad_input();
    test_the_bound_holds();
    return check_summary("test_response");
}
