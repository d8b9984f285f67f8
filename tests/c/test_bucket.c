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
        CHECK_EQ_I64(hirate_check_cost(cost_cases[i].cost, NULL, err, sizeof err),
                     cost_cases[i].rc);
        if (cost_cases[i].rc)
            CHECK(strstr(err, "cost") != NULL);
        else
            CHECK_EQ_STR(err, "");
    }
}

/* ---- time until a level --------------------------------------------------------- */

/* What a call at now + x computes from the stored state (tokens, ts), before
 * the min with the capacity: written out here from the rule, operation for
 * operation, not taken from the library. */
static double level_after(double tokens, int64_t ts, int64_t now, double x, double rate)
{
    double elapsed = (double)(now - ts) + x;
    if (elapsed < 0)
        elapsed = 0;
    return tokens + elapsed * rate / 1000000.0;
}

typedef struct until_case {
    const char *rule;
    double tokens;
    int64_t ts, now;
    double target, rate;
    int64_t us;
} until_case;

/* Each answer is the least r with tokens + max(0, now - ts + r) * rate / 1e6
 * >= target, worked out by hand in exact arithmetic (the comment), and with
 * the doubles checked by hand where they could round the other way. The test
 * also checks every row against the definition itself (level_after at us and
 * at us - 1), so a row cannot drift from the rule. */
static const until_case until_cases[] = {
    /* f(0) = 10 >= 10 */
    {"a level already reached takes no time", 10, 0, 0, 10, 1, 0},
    /* f(0) = 11 */
    {"a level above the target takes no time", 11, 0, 0, 10, 1, 0},
    /* f(0) = 9 + 1e6 * 1 / 1e6 = 10: the refill since ts already counts */
    {"the refill since the stored time counts", 9, 0, 1000000, 10, 1, 0},
    /* r / 1e6 >= 1 */
    {"one token at one a second", 0, 0, 0, 1, 1, 1000000},
    /* 9 + (500000 + r) / 1e6 >= 10: r = 500000 */
    {"half refilled since the stored time, half to go", 9, 0, 500000, 10, 1, 500000},
    /* 9.5 + r / 1e6 >= 10 */
    {"half a token at one a second", 9.5, 0, 0, 10, 1, 500000},
    /* r * 1e6 / 1e6 >= 5 */
    {"a million a second: one token a microsecond", 0, 0, 0, 5, 1e6, 5},
    /* (2 + r) >= 5 */
    {"a million a second, two microseconds since the stored time", 0, 0, 2, 5, 1e6, 3},
    /* 0.999999 + r >= 1 for r = 1, not for r = 0 */
    {"a sliver short still waits a whole microsecond", 0.999999, 0, 0, 1, 1e6, 1},
    /* 1 - 1e-12 + 1e-6 >= 1 */
    {"a sliver short at a slow rate", 1 - 1e-12, 0, 0, 1, 1, 1},
    /* 142857 * 7 = 999999 < 1e6 <= 142858 * 7 = 1000006 */
    {"seven a second: 1/7 s rounds up", 0, 0, 0, 1, 7, 142858},
    /* r * 0.1 / 1e6 >= 10: 1e8 * 0.1 rounds to 1e7 exactly, 99999999 * 0.1 is 9999999.9 */
    {"a tenth a second: 100 s for ten", 0, 0, 0, 10, 0.1, 100000000},
    /* 3e6 * (1/3) is 1e6 - 5.6e-11, within half an ulp (5.8e-11) of 1e6: rounds to 1e6 */
    {"a third a second: three seconds for one", 0, 0, 0, 1, 1.0 / 3, 3000000},
    /* 0.5 + (1 + r) / 1e7 >= 3: 1 + r = 25000000, and 25000000 * 0.1 rounds to
     * 2500000 exactly (the error, 1.4e-10, is under half an ulp, 2.3e-10), so
     * f(24999999) = 0.5 + 2.5 = 3. From the refilled level 0.5000001 instead,
     * 0.5000001 + 24999999 * 0.1 / 1e6 falls short by a rounding. */
    {"counted from the stored state, not from the refilled level", 0.5, 0, 1, 3, 0.1, 24999999},
    /* 0.5 + (1 + r) / 1e7 >= 10: 1 + r = 95000000, 95000000 * 0.1 rounds to 9500000 */
    {"the time to full from the stored state", 0.5, 0, 1, 10, 0.1, 94999999},
    /* 1.7e15 is exact; (0 + r) * 1e6 / 1e6 >= 1 */
    {"the same instant at a real Unix time", 0, 1700000000000000LL, 1700000000000000LL, 1, 1e6,
     1},
    /* 1000 r >= 2^53 - 1 = 9007199254740991: r = 9007199254741 */
    {"the largest capacity at a billion a second", 0, 0, 0, 9007199254740991.0, 1e9,
     EXACT / 1000 + 1},
    /* the clock went back 1 s: 5 + max(0, r - 1e6) / 1e6 >= 6: r - 1e6 = 1e6 */
    {"a clock that went back: the flat second counts too", 5, 10000000, 9000000, 6, 1, 2000000},
    /* 4 + (r - 1e6) / 1e6 >= 10 */
    {"a clock that went back, the time to full", 4, 10000000, 9000000, 10, 1, 7000000},
    /* f(0) = 5: the flat part refills nothing, and nothing is needed */
    {"a clock that went back, a level already there", 5, 10000000, 0, 5, 1, 0},
    /* 5 + (r - 1e7) / 1e6 >= 6: ten flat seconds and one more */
    {"a clock that went back ten seconds", 5, 10000000, 0, 6, 1, 11000000},
    /* 5 + (r - 1e7) / 1e6 >= 10 */
    {"a clock that went back ten seconds, the time to full", 5, 10000000, 0, 10, 1, 15000000},
    /* max(0, r - 3) * 1e6 / 1e6 >= 5 */
    {"a clock that went back three microseconds, at a million a second", 0, 3, 0, 5, 1e6, 8},
};

static void until_has_exact_answers(void)
{
    for (size_t i = 0; i < sizeof until_cases / sizeof until_cases[0]; i++) {
        const until_case *c = &until_cases[i];
        /* the row itself against the definition */
        int row_ok = level_after(c->tokens, c->ts, c->now, (double)c->us, c->rate) >= c->target &&
                     (c->us == 0 || level_after(c->tokens, c->ts, c->now, (double)(c->us - 1),
                                                c->rate) < c->target);
        hirate_bucket_cfg cfg;   /* every target is whole: a bucket of that capacity */
        CHECK_EQ_I64(hirate_bucket_cfg_init(&cfg, (int64_t)c->target, c->rate, NULL, 0), 0);
        hirate_bucket b = {c->tokens, c->ts};
        int64_t got = hirate_bucket_until(&cfg, &b, c->now, c->target);
        if (got != c->us || !row_ok)
            fprintf(stderr, "case: %s: got %lld\n", c->rule, (long long)got);
        CHECK(row_ok);
        CHECK_EQ_I64(got, c->us);
        /* until() reads the stored state, never writes it */
        CHECK(b.tokens == c->tokens);
        CHECK_EQ_I64(b.ts, c->ts);
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

static int64_t below(int64_t n)   /* [0, n) for n >= 1 */
{
    return (int64_t)(rng() % (uint64_t)n);
}

/* until() is the least r with level_after(r) >= target: check both halves of
 * that statement directly for many stored states, times, targets and rates,
 * with the stored time before now, at now, and after now (a clock that went
 * back). */
static void until_is_the_least_time_that_reaches_the_target(void)
{
    static const double rates[] = {1.0 / 3, 0.1, 1e6, 7, 1, 2.5, 0.30000000000000004,
                                   123456.789, 1e9, 0.001, 1.0 / 7, 0.2};
    static const int64_t capacities[] = {1, 2, 3, 10, 100, 1000, 65536, 1000000, 1000000000,
                                         1000000007, 4503599627370495LL, EXACT};
    long wrong = 0, checked = 0, waited = 0, before = 0, same = 0, after_now = 0;
    for (int n = 0; n < 300000; n++) {
        int64_t capacity = capacities[rng() % (sizeof capacities / sizeof capacities[0])];
        double rate = rates[rng() % (sizeof rates / sizeof rates[0])];
        hirate_bucket_cfg cfg;
        if (hirate_bucket_cfg_init(&cfg, capacity, rate, NULL, 0) != 0)
            continue;   /* past 2^53 µs: not a bucket the library makes */
        /* the time to refill the whole bucket, which bounds every wait */
        int64_t refill = (int64_t)ceil((double)capacity * 1e6 / rate);
        double target;
        switch (rng() % 3) {
        case 0: target = (double)capacity; break;        /* reset_after */
        case 1: target = 1 + (double)(rng() % (uint64_t)capacity); break;   /* a cost */
        default: target = (double)capacity - (double)(rng() % 3); if (target < 1) target = 1;
        }
        double tokens;
        switch (rng() % 5) {
        case 0: tokens = 0; break;
        case 1: tokens = unit() * target; break;
        case 2: tokens = nextafter(target, 0); break;           /* one ulp short */
        case 3: tokens = unit() * (double)capacity; break;      /* maybe already there */
        default: tokens = target - 1 + unit(); if (tokens < 0) tokens = 0;
        }
        int64_t now = rng() % 2 ? below(1000000) : 1700000000000000LL + below(1000000000000LL);
        int64_t ts, d;
        switch (rng() % 5) {
        case 0: ts = now; break;
        case 1: d = 1 + below(refill < 1000 ? refill : 1000); ts = now - d; break;
        case 2: d = 1 + below(refill); ts = now - d; break;
        case 3: d = 1 + below(1000); ts = now + d; break;
        default: d = 1 + below(refill < 1000000000000LL ? refill : 1000000000000LL); ts = now + d;
        }
        if (ts < 0)
            ts = 0;   /* a stored time is never negative */
        if (ts > now && (ts - now) + refill > EXACT)
            ts = now + (EXACT - refill);   /* every wait stays a whole number of µs */
        hirate_bucket b = {tokens, ts};
        int64_t r = hirate_bucket_until(&cfg, &b, now, target);
        int reached_now = level_after(tokens, ts, now, 0, rate) >= target;
        int reaches = r >= 0 && level_after(tokens, ts, now, (double)r, rate) >= target;
        /* r == 0 exactly when no wait is needed; otherwise one µs less falls short
         * (for r == 1 that is the level at now itself) */
        int least = r == 0 ? reached_now
                           : !reached_now &&
                                 level_after(tokens, ts, now, (double)(r - 1), rate) < target;
        int ok = reaches && least && b.tokens == tokens && b.ts == ts;
        if (!ok && wrong++ < 5)
            fprintf(stderr,
                    "until({%.17g, %lld}, now %lld, target %.17g, rate %.17g) = %lld "
                    "is not the least time\n",
                    tokens, (long long)ts, (long long)now, target, rate, (long long)r);
        checked++;
        waited += r > 0;
        before += ts < now;
        same += ts == now;
        after_now += ts > now && r > 0;
    }
    CHECK_EQ_I64(wrong, 0);
    CHECK(checked > 100000);
    /* every kind of case was met often: waits, and stored times on each side */
    CHECK(waited > 100000);
    CHECK(before > 50000);
    CHECK(same > 25000);
    CHECK(after_now > 50000);
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
    /* stored {4, 1e7} at 9e6: one flat second, then 6 tokens at 1/s */
    {"a clock that went back refills nothing and keeps the later time",
     10, 1, {5, 10000000}, 9000000, 1, 1, 1, {4, 10000000}, 1, 4, 0, 7000000},
    /* stored {5, 1e7} at 0: ten flat seconds, then 1 (retry) or 5 (reset) at 1/s */
    {"a clock that went back: a refusal waits out the flat part too",
     10, 1, {5, 10000000}, 0, 6, 1, 0, {5, 10000000}, 0, 5, 11000000, 15000000},
    /* stored {5, 1e7} at 0, a peek: the same waits, nothing stored */
    {"a clock that went back: a peek that would fail waits out the flat part too",
     10, 1, {5, 10000000}, 0, 6, 0, 0, {5, 10000000}, 0, 5, 11000000, 15000000},
    /* stored {5, 1e7} at 0, cost 0: allowed; full after 10 flat s and 5 more */
    {"a clock that went back: cost 0 passes and the reset counts the flat part",
     10, 1, {5, 10000000}, 0, 0, 1, 0, {5, 10000000}, 1, 5, 0, 15000000},
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
    /* 0.5 + (1 + r) * 0.1 / 1e6 >= 3 at r = 24999999 exactly in doubles (see
     * until_cases); from the refilled level 0.5000001 it would say 25000000 */
    {"a refusal's waits are counted from the stored state",
     10, 0.1, {0.5, 0}, 1, 3, 1, 0, {0.5, 0}, 0, 0, 24999999, 94999999},
    /* a spend at 3 s from {0, 0} at 1/s: stored {2, 3e6}, 8 s to full */
    {"a spend's reset is counted from the state it stores",
     10, 1, {0, 0}, 3000000, 1, 1, 1, {2, 3000000}, 1, 2, 0, 8000000},
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
 * that pass and fail, peeks. After each step the stated rules hold: the
 * bucket stored is the one the rule says, retry and reset are until() from
 * that stored state, and a caller who waits them out is not let down by a
 * rounding. */
static void a_random_walk_keeps_every_rule(void)
{
    static const double rates[] = {1.0 / 3, 0.1, 7, 1e6, 2.5};
    long broken = 0, ok_level = 0, steps = 0, refused = 0, spent = 0, went_back = 0;
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
            /* the state the rule stores: a spend of a passing cost above 0
             * stores level - cost at the later of the two times */
            int passes = cost <= capacity && level >= (double)cost;
            int want_store = passes && spend && cost > 0;
            hirate_bucket want = old;
            if (want_store) {
                want.tokens = level - (double)cost;
                want.ts = now > old.ts ? now : old.ts;
            }
            hirate_decision d;
            int stored = hirate_bucket_decide(&cfg, &b, now, cost, spend, &d);
            steps++;
            refused += !passes && cost <= capacity;
            spent += want_store;
            went_back += old.ts > now;
            int ok = level >= 0 && level <= cfg.capacity_d && stored == want_store &&
                     b.tokens == want.tokens && b.ts == want.ts && d.allowed == passes &&
                     d.remaining == (int64_t)floor(want_store ? want.tokens : level);
            if (cost > capacity)
                ok = ok && d.retry_after_us == HIRATE_NEVER;
            else if (passes)
                ok = ok && d.retry_after_us == 0;
            else
                ok = ok && d.retry_after_us == hirate_bucket_until(&cfg, &want, now, (double)cost);
            ok = ok && d.reset_after_us == hirate_bucket_until(&cfg, &want, now, cfg.capacity_d);
            /* waiting retry_after passes (a peek from the stored state), a
             * microsecond less does not; retry >= 1 since the cost failed now */
            if (ok && !passes && cost <= capacity) {
                hirate_bucket probe = b;
                hirate_decision later;
                ok = d.retry_after_us >= 1;
                hirate_bucket_decide(&cfg, &probe, now + d.retry_after_us, cost, 0, &later);
                ok = ok && later.allowed;
                hirate_bucket_decide(&cfg, &probe, now + d.retry_after_us - 1, cost, 0, &later);
                ok = ok && !later.allowed;
            }
            /* after reset_after the bucket is full, a microsecond before it is not */
            if (ok) {
                ok = hirate_bucket_level(&cfg, &b, now + d.reset_after_us) == cfg.capacity_d;
                if (d.reset_after_us > 0)
                    ok = ok && hirate_bucket_level(&cfg, &b, now + d.reset_after_us - 1) <
                                   cfg.capacity_d;
            }
            if (!ok && broken++ < 5)
                fprintf(stderr,
                        "walk: rate %g capacity %lld bucket {%.17g, %lld} now %lld cost %lld "
                        "spend %d broke a rule\n",
                        rates[ri], (long long)capacity, old.tokens, (long long)old.ts,
                        (long long)now, (long long)cost, spend);
        }
    }
    CHECK_EQ_I64(broken, 0);
    CHECK_EQ_I64(ok_level, steps);
    /* the walk met every kind of step often */
    CHECK(refused > 50000);
    CHECK(spent > 10000);
    CHECK(went_back > 5000);
}

/* ---- refunds ------------------------------------------------------------------ */

static void refunds_give_back_up_to_the_capacity(void)
{
    hirate_bucket_cfg cfg;
    CHECK_EQ_I64(hirate_bucket_cfg_init(&cfg, 10, 2.0, NULL, 0), 0);
    hirate_decision d;

    /* 3 tokens at 1 s, 0.5 s later 4: 4 back is 8, stored at 1.5 s. */
    hirate_bucket b = {3.0, 1000000};
    CHECK_EQ_I64(hirate_bucket_refund(&cfg, &b, 1500000, 4, &d), 1);
    CHECK(b.tokens == 8.0);
    CHECK_EQ_I64(b.ts, 1500000);
    CHECK_EQ_I64(d.allowed, 1);
    CHECK_EQ_I64(d.remaining, 8);
    CHECK_EQ_I64(d.retry_after_us, 0);
    CHECK_EQ_I64(d.reset_after_us, 1000000);   /* 2 tokens at 2/s */
    CHECK_EQ_I64(d.limit, 10);
    CHECK_EQ_I64(d.time_us, 1500000);

    /* 100 back: capped at 10, full. */
    CHECK_EQ_I64(hirate_bucket_refund(&cfg, &b, 1500000, 100, &d), 1);
    CHECK(b.tokens == 10.0);
    CHECK_EQ_I64(d.remaining, 10);
    CHECK_EQ_I64(d.reset_after_us, 0);

    /* A full bucket (a fresh key's) stays as it is: nothing to store. */
    hirate_bucket full = {10.0, 0};
    CHECK_EQ_I64(hirate_bucket_refund(&cfg, &full, 5000000, 1, &d), 0);
    CHECK(full.tokens == 10.0);
    CHECK_EQ_I64(full.ts, 0);
    CHECK_EQ_I64(d.remaining, 10);

    /* 0 gives nothing and stores nothing, but reports the bucket. */
    hirate_bucket empty = {0.0, 0};
    CHECK_EQ_I64(hirate_bucket_refund(&cfg, &empty, 250000, 0, &d), 0);
    CHECK(empty.tokens == 0.0);
    CHECK_EQ_I64(d.remaining, 0);
    CHECK_EQ_I64(d.allowed, 1);

    /* The largest refund of an empty bucket is capped, not overflowed. */
    CHECK_EQ_I64(hirate_bucket_refund(&cfg, &empty, 0, EXACT, &d), 1);
    CHECK(empty.tokens == 10.0);

    /* A clock that went back refills nothing and keeps the later time. */
    hirate_bucket later = {0.0, 9000000};
    CHECK_EQ_I64(hirate_bucket_refund(&cfg, &later, 8000000, 3, &d), 1);
    CHECK(later.tokens == 3.0);
    CHECK_EQ_I64(later.ts, 9000000);

    /* hirate_bucket_decide with HIRATE_SPEND_REFUND is the refund. */
    hirate_bucket c = {1.0, 0};
    CHECK_EQ_I64(hirate_bucket_decide(&cfg, &c, 0, 2, HIRATE_SPEND_REFUND, &d), 1);
    CHECK(c.tokens == 3.0);

    /* Bands: each gets the tokens, each capped at its own capacity. */
    hirate_bucket_cfg two[2];
    CHECK_EQ_I64(hirate_bucket_cfg_init(&two[0], 5, 1.0, NULL, 0), 0);
    CHECK_EQ_I64(hirate_bucket_cfg_init(&two[1], 100, 0.001, NULL, 0), 0);
    hirate_bucket bb[2] = {{4.0, 0}, {50.0, 0}};
    hirate_decision whole, per[2];
    CHECK_EQ_I64(hirate_bands_decide(two, 2, bb, 0, 3, HIRATE_SPEND_REFUND, &whole, per), 1);
    CHECK(bb[0].tokens == 5.0);
    CHECK(bb[1].tokens == 53.0);
    CHECK_EQ_I64(per[0].remaining, 5);
    CHECK_EQ_I64(per[1].remaining, 53);
    CHECK_EQ_I64(whole.allowed, 1);
    CHECK_EQ_I64(whole.remaining, 5);
    CHECK_EQ_I64(whole.band, 0);
    CHECK_EQ_I64(whole.limit, 5);
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
    refunds_give_back_up_to_the_capacity();
    return check_summary("test_bucket");
}
