/*
 * The token-bucket arithmetic (core/src/bucket.h), pure and with time passed
 * in: which configurations and costs are accepted, the exact time until a
 * level is reached, and what one decision reports and stores.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bucket.h"
#include "check.h"
#include "hirate.h"

#define EXACT HIRATE_EXACT_MAX          /* 2^53 - 1 */
#define TWO_53 (HIRATE_EXACT_MAX + 1)

/* ---- configuration ------------------------------------------------------------ */

typedef struct cfg_case {
    const char *rule;
    int64_t capacity;
    double rate;
    int rc;
    const char *mention;   /* a word the message must contain */
} cfg_case;

static const cfg_case cfg_cases[] = {
    {"capacity 0 holds nothing", 0, 1, HIRATE_ECAPACITY, "capacity"},
    {"capacity -1", -1, 1, HIRATE_ECAPACITY, "capacity"},
    {"capacity 2^53 is past exact doubles", TWO_53, 1e9, HIRATE_ECAPACITY, "capacity"},
    {"capacity INT64_MAX", INT64_MAX, 1e9, HIRATE_ECAPACITY, "capacity"},
    {"capacity INT64_MIN", INT64_MIN, 1, HIRATE_ECAPACITY, "capacity"},
    {"rate 0 never refills", 10, 0, HIRATE_ERATE, "rate"},
    {"rate -0.0", 10, -0.0, HIRATE_ERATE, "rate"},
    {"rate -1", 10, -1, HIRATE_ERATE, "rate"},
    {"rate NaN", 10, NAN, HIRATE_ERATE, "rate"},
    {"rate +inf", 10, INFINITY, HIRATE_ERATE, "rate"},
    {"rate -inf", 10, -INFINITY, HIRATE_ERATE, "rate"},
    {"the capacity is checked before the rate", 0, NAN, HIRATE_ECAPACITY, "capacity"},
    {"1e9 tokens at 0.1/s take 1e16 us to refill", 1000000000, 0.1, HIRATE_ERANGE, "2^53"},
    {"2^53-1 tokens at 1/s", EXACT, 1, HIRATE_ERANGE, "2^53"},
    {"one token at 1e-300/s", 1, 1e-300, HIRATE_ERANGE, "2^53"},
    {"one token at the smallest subnormal rate", 1, 5e-324, HIRATE_ERANGE, "2^53"},
    {"one token a second", 1, 1, 0, NULL},
    {"the largest capacity at 1e9/s", EXACT, 1e9, 0, NULL},
    {"1e9 tokens at 1/s", 1000000000, 1, 0, NULL},
    {"a third of a token a second", 10, 1.0 / 3, 0, NULL},
    {"the largest finite rate", 1, 1.7976931348623157e308, 0, NULL},
};

static void configurations_are_checked(void)
{
    for (size_t i = 0; i < sizeof cfg_cases / sizeof cfg_cases[0]; i++) {
        const cfg_case *c = &cfg_cases[i];
        hirate_bucket_cfg cfg;
        char err[HIRATE_ERRMSG_SIZE] = "";
        int rc = hirate_bucket_cfg_init(&cfg, c->capacity, c->rate, err, sizeof err);
        if (rc != c->rc)
            fprintf(stderr, "case: %s: %s\n", c->rule, err);
        CHECK_EQ_I64(rc, c->rc);
        if (c->rc == 0) {
            CHECK_EQ_I64(cfg.capacity, c->capacity);
            CHECK(cfg.capacity_d == (double)c->capacity);
            CHECK(cfg.rate == c->rate);
        } else {
            CHECK(strstr(err, c->mention) != NULL);
            /* no buffer is fine: the code alone */
            CHECK_EQ_I64(hirate_bucket_cfg_init(&cfg, c->capacity, c->rate, NULL, 0), c->rc);
        }
    }
}

/* The least rate that refills a capacity in at most 2^53-1 µs, found by
 * stepping through doubles (the rule, not the library's arithmetic). */
static double least_rate(int64_t capacity)
{
    double r = (double)capacity * 1e6 / (double)EXACT;
    while ((double)capacity * 1e6 / r > (double)EXACT)
        r = nextafter(r, INFINITY);
    while ((double)capacity * 1e6 / nextafter(r, 0) <= (double)EXACT)
        r = nextafter(r, 0);
    return r;
}

static void the_slowest_accepted_rate_is_the_boundary(void)
{
    static const int64_t capacities[] = {1, 10, 1000, 1000000000, 123456789012345LL, EXACT};
    for (size_t i = 0; i < sizeof capacities / sizeof capacities[0]; i++) {
        hirate_bucket_cfg cfg;
        double r = least_rate(capacities[i]);
        CHECK_EQ_I64(hirate_bucket_cfg_init(&cfg, capacities[i], r, NULL, 0), 0);
        CHECK_EQ_I64(hirate_bucket_cfg_init(&cfg, capacities[i], nextafter(r, 0), NULL, 0),
                     HIRATE_ERANGE);
    }
    /* e.g. the largest capacity needs about a million tokens a second */
    double r = least_rate(EXACT);
    CHECK(r > 999999.0 && r < 1000001.0);
}

typedef struct cost_case {
    int64_t cost;
    int rc;
} cost_case;

static const cost_case cost_cases[] = {
    {0, 0}, {1, 0}, {EXACT, 0},
    {-1, HIRATE_ECOST}, {INT64_MIN, HIRATE_ECOST},
    {TWO_53, HIRATE_ECOST}, {INT64_MAX, HIRATE_ECOST},
};

static void costs_are_checked(void)
{
    for (size_t i = 0; i < sizeof cost_cases / sizeof cost_cases[0]; i++) {
        char err[HIRATE_ERRMSG_SIZE] = "";
        CHECK_EQ_I64(hirate_bucket_check_cost(cost_cases[i].cost, err, sizeof err),
                     cost_cases[i].rc);
        if (cost_cases[i].rc)
            CHECK(strstr(err, "cost") != NULL);
        else
            CHECK_EQ_STR(err, "");
    }
}

/* ---- time until a level --------------------------------------------------------- */

/* The level after r µs, in the refill's own arithmetic. */
static double after(double tokens, double r, double rate)
{
    return tokens + r * rate / 1000000.0;
}

typedef struct until_case {
    const char *rule;
    double tokens, target, rate;
    int64_t us;
} until_case;

static const until_case until_cases[] = {
    {"a level already reached takes no time", 10, 10, 1, 0},
    {"a level above the target takes no time", 11, 10, 1, 0},
    {"one token at one a second", 0, 1, 1, 1000000},
    {"half a token at one a second", 9.5, 10, 1, 500000},
    {"a million a second: one token a microsecond", 0, 5, 1e6, 5},
    {"a sliver short still waits a whole microsecond", 0.999999, 1, 1e6, 1},
    {"a sliver short at a slow rate", 1 - 1e-12, 1, 1, 1},
    {"seven a second: 1/7 s rounds up", 0, 1, 7, 142858},
    {"a tenth a second: 100 s for ten", 0, 10, 0.1, 100000000},
    {"a third a second: three seconds for one", 0, 1, 1.0 / 3, 3000000},
};

static void until_has_exact_answers(void)
{
    for (size_t i = 0; i < sizeof until_cases / sizeof until_cases[0]; i++) {
        const until_case *c = &until_cases[i];
        int64_t got = hirate_bucket_until(c->tokens, c->target, c->rate);
        if (got != c->us)
            fprintf(stderr, "case: %s\n", c->rule);
        CHECK_EQ_I64(got, c->us);
    }
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static double unit(void)   /* [0, 1) */
{
    return (double)(rng() >> 11) / 9007199254740992.0;
}

/* until() is the least r with after(r) >= target: check both halves of that
 * statement directly for many levels, targets and rates. */
static void until_is_the_least_time_that_reaches_the_target(void)
{
    static const double rates[] = {1.0 / 3, 0.1, 1e6, 7, 1, 2.5, 0.30000000000000004,
                                   123456.789, 1e9, 0.001, 1.0 / 7, 0.2};
    static const int64_t capacities[] = {1, 2, 3, 10, 100, 1000, 65536, 1000000, 1000000000,
                                         1000000007, 4503599627370495LL, EXACT};
    long wrong = 0, checked = 0;
    for (int n = 0; n < 300000; n++) {
        int64_t capacity = capacities[rng() % (sizeof capacities / sizeof capacities[0])];
        double rate = rates[rng() % (sizeof rates / sizeof rates[0])];
        hirate_bucket_cfg cfg;
        if (hirate_bucket_cfg_init(&cfg, capacity, rate, NULL, 0) != 0)
            continue;   /* past 2^53 µs: not a bucket the library makes */
        double target;
        switch (rng() % 3) {
        case 0: target = (double)capacity; break;        /* reset_after */
        case 1: target = 1 + (double)(rng() % (uint64_t)capacity); break;   /* a cost */
        default: target = (double)capacity - (double)(rng() % 3); if (target < 1) target = 1;
        }
        double tokens;
        switch (rng() % 4) {
        case 0: tokens = 0; break;
        case 1: tokens = unit() * target; break;
        case 2: tokens = nextafter(target, 0); break;           /* one ulp short */
        default: tokens = target - 1 + unit(); if (tokens < 0) tokens = 0;
        }
        int64_t r = hirate_bucket_until(tokens, target, rate);
        int reaches = after(tokens, (double)r, rate) >= target;
        int least = r == 0 ? tokens >= target
                           : tokens < target &&
                                 (r == 1 || after(tokens, (double)(r - 1), rate) < target);
        int ok = reaches && least;
        if (!ok && wrong++ < 5)
            fprintf(stderr, "until(%.17g, %.17g, %.17g) = %lld is not the least time\n", tokens,
                    target, rate, (long long)r);
        checked++;
    }
    CHECK_EQ_I64(wrong, 0);
    CHECK(checked > 100000);
}

/* ---- one decision ------------------------------------------------------------------- */

typedef struct decide_case {
    const char *rule;
    int64_t capacity;
    double rate;
    hirate_bucket before;
    int64_t now, cost;
    int spend;
    int stored;            /* what decide returns */
    hirate_bucket after;   /* the bucket afterwards */
    int allowed;
    int64_t remaining, retry, reset;
} decide_case;

static const decide_case decide_cases[] = {
    {"a full bucket allows and the spend must be stored",
     10, 1, {10, 0}, 0, 3, 1, 1, {7, 0}, 1, 7, 0, 3000000},
    {"refill adds rate times the time passed, and the time moves on",
     10, 1, {7, 0}, 1500000, 1, 1, 1, {7.5, 1500000}, 1, 7, 0, 2500000},
    {"a refusal stores nothing",
     10, 1, {2, 0}, 500000, 3, 1, 0, {2, 0}, 0, 2, 500000, 7500000},
    {"a peek that would pass stores nothing",
     10, 1, {2, 0}, 500000, 2, 0, 0, {2, 0}, 1, 2, 0, 7500000},
    {"a peek that would fail says when to retry",
     10, 1, {2, 0}, 500000, 5, 0, 0, {2, 0}, 0, 2, 2500000, 7500000},
    {"cost 0 is allowed and stores nothing",
     10, 1, {2, 0}, 500000, 0, 1, 0, {2, 0}, 1, 2, 0, 7500000},
    {"cost 0 is allowed from an empty bucket",
     10, 1, {0, 0}, 0, 0, 1, 0, {0, 0}, 1, 0, 0, 10000000},
    {"a cost above the capacity never passes",
     10, 1, {10, 0}, 0, 11, 1, 0, {10, 0}, 0, 10, HIRATE_NEVER, 0},
    {"a cost above the capacity never passes, peeked",
     10, 1, {3, 0}, 0, 11, 0, 0, {3, 0}, 0, 3, HIRATE_NEVER, 7000000},
    {"the whole capacity drains a full bucket",
     10, 1, {10, 0}, 0, 10, 1, 1, {0, 0}, 1, 0, 0, 10000000},
    {"a clock that went back refills nothing and keeps the later time",
     10, 1, {5, 10000000}, 9000000, 1, 1, 1, {4, 10000000}, 1, 4, 0, 6000000},
    {"a clock that went back: a refusal counts from the stored level",
     10, 1, {5, 10000000}, 0, 6, 1, 0, {5, 10000000}, 0, 5, 1000000, 5000000},
    {"the same instant refills nothing",
     10, 1, {5, 7}, 7, 5, 1, 1, {0, 7}, 1, 0, 0, 10000000},
    {"the level stops at the capacity however long the wait",
     10, 1, {9, 0}, 4000000000000000LL, 1, 1, 1, {9, 4000000000000000LL}, 1, 9, 0, 1000000},
    {"a peek of an old bucket reports it full",
     10, 1, {0, 0}, 1000000000, 0, 0, 0, {0, 0}, 1, 10, 0, 0},
    {"a million a second: three microseconds give three tokens",
     5, 1e6, {0, 0}, 3, 5, 1, 0, {0, 0}, 0, 3, 2, 2},
    {"remaining is the whole tokens, rounded down",
     10, 1, {0, 0}, 2999999, 1, 1, 1, {2.999999 - 1, 2999999}, 1, 1, 0, 8000001},
    {"the largest capacity and cost",
     EXACT, 1e9, {(double)EXACT, 0}, 0, EXACT, 1, 1, {0, 0}, 1, 0, 0, EXACT / 1000 + 1},
};

static void decisions_report_and_store_exactly(void)
{
    for (size_t i = 0; i < sizeof decide_cases / sizeof decide_cases[0]; i++) {
        const decide_case *c = &decide_cases[i];
        hirate_bucket_cfg cfg;
        CHECK_EQ_I64(hirate_bucket_cfg_init(&cfg, c->capacity, c->rate, NULL, 0), 0);
        hirate_bucket b = c->before;
        hirate_decision d;
        memset(&d, 0x5A, sizeof d);   /* every field must be written */
        int stored = hirate_bucket_decide(&cfg, &b, c->now, c->cost, c->spend, &d);
        int ok = stored == c->stored && b.tokens == c->after.tokens && b.ts == c->after.ts &&
                 d.allowed == c->allowed && d.remaining == c->remaining &&
                 d.retry_after_us == c->retry && d.reset_after_us == c->reset;
        if (!ok)
            fprintf(stderr,
                    "case: %s: stored %d bucket {%.17g, %lld} allowed %d remaining %lld "
                    "retry %lld reset %lld\n",
                    c->rule, stored, b.tokens, (long long)b.ts, d.allowed, (long long)d.remaining,
                    (long long)d.retry_after_us, (long long)d.reset_after_us);
        CHECK_EQ_I64(stored, c->stored);
        CHECK(b.tokens == c->after.tokens);
        CHECK_EQ_I64(b.ts, c->after.ts);
        CHECK_EQ_I64(d.allowed, c->allowed);
        CHECK_EQ_I64(d.remaining, c->remaining);
        CHECK_EQ_I64(d.retry_after_us, c->retry);
        CHECK_EQ_I64(d.reset_after_us, c->reset);
        CHECK_EQ_I64(d.limit, c->capacity);
        CHECK_EQ_I64(d.source, HIRATE_SOURCE_LOCAL);
        CHECK_EQ_I64(d.error, 0);
        CHECK_EQ_I64(d.time_us, c->now);
    }
}

/* A long random life of one bucket: steps forward and back in time, costs
 * that pass and fail, peeks. After each step the stated rules hold. */
static void a_random_walk_keeps_every_rule(void)
{
    static const double rates[] = {1.0 / 3, 0.1, 7, 1e6, 2.5};
    long broken = 0, ok_level = 0, steps = 0;
    for (size_t ri = 0; ri < sizeof rates / sizeof rates[0]; ri++) {
        hirate_bucket_cfg cfg;
        int64_t capacity = 1 + (int64_t)(rng() % 1000);
        CHECK_EQ_I64(hirate_bucket_cfg_init(&cfg, capacity, rates[ri], NULL, 0), 0);
        hirate_bucket b = {(double)capacity, 1000000};
        int64_t now = 1000000;
        for (int step = 0; step < 40000; step++) {
            now += (int64_t)(rng() % 2000000) - 400000;   /* sometimes backwards */
            if (now < 0)
                now = 0;
            int64_t cost = (int64_t)(rng() % (uint64_t)(capacity + 2));
            int spend = (int)(rng() % 4 != 0);
            hirate_bucket old = b;
            /* the level by the rule: refill for the time passed, at most full */
            double level = old.tokens + (double)(now > old.ts ? now - old.ts : 0) * cfg.rate / 1e6;
            if (level > cfg.capacity_d)
                level = cfg.capacity_d;
            ok_level += level == hirate_bucket_level(&cfg, &old, now);
            hirate_decision d;
            int stored = hirate_bucket_decide(&cfg, &b, now, cost, spend, &d);
            steps++;
            int ok = level >= 0 && level <= cfg.capacity_d && d.remaining == (int64_t)floor(
                         d.allowed && spend ? level - (double)cost : level);
            if (cost > capacity)
                ok = ok && !d.allowed && d.retry_after_us == HIRATE_NEVER && !stored;
            else if (level >= (double)cost)
                ok = ok && d.allowed && d.retry_after_us == 0;
            else
                ok = ok && !d.allowed &&
                     d.retry_after_us == hirate_bucket_until(level, (double)cost, cfg.rate);
            if (stored)
                ok = ok && spend && d.allowed && cost > 0 && b.tokens == level - (double)cost &&
                     b.ts == (now > old.ts ? now : old.ts);
            else
                ok = ok && b.tokens == old.tokens && b.ts == old.ts;
            ok = ok && d.reset_after_us ==
                           hirate_bucket_until(stored ? b.tokens : level, cfg.capacity_d, cfg.rate);
            if (!ok && broken++ < 5)
                fprintf(stderr,
                        "walk: rate %g capacity %lld now %lld cost %lld spend %d broke a rule\n",
                        rates[ri], (long long)capacity, (long long)now, (long long)cost, spend);
        }
    }
    CHECK_EQ_I64(broken, 0);
    CHECK_EQ_I64(ok_level, steps);
}

int main(void)
{
    configurations_are_checked();
    the_slowest_accepted_rate_is_the_boundary();
    costs_are_checked();
    until_has_exact_answers();
    until_is_the_least_time_that_reaches_the_target();
    decisions_report_and_store_exactly();
    a_random_walk_keeps_every_rule();
    return check_summary("test_bucket");
}
