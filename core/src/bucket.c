/* The token-bucket arithmetic. Keep it in step with lua/token_bucket.lua. */
#include <math.h>
#include <stdio.h>

#include "bucket.h"
#include "errors.h"

static int out_of_range(int code, const char *what, int64_t v, char *err, size_t errlen)
{
    char shown[24];
    snprintf(shown, sizeof shown, "%lld", (long long)v);
    return hirate_range_errmsg(code, what, shown, err, errlen);
}

int hirate_bucket_cfg_init(hirate_bucket_cfg *cfg, int64_t capacity, double rate,
                           char *err, size_t errlen)
{
    if (capacity < 1 || capacity > HIRATE_EXACT_MAX)
        return out_of_range(HIRATE_ECAPACITY, NULL, capacity, err, errlen);
    if (!(rate > 0) || !isfinite(rate))
        return hirate__fail(err, errlen, HIRATE_ERATE,
                            "rate must be a finite number of tokens per second above 0, got %g",
                            rate);
    /* The time to refill the whole bucket, in µs, bounds every time the
     * arithmetic produces; past 2^53 doubles stop counting whole µs. */
    if ((double)capacity * 1000000.0 / rate > (double)HIRATE_EXACT_MAX)
        return hirate__fail(err, errlen, HIRATE_ERANGE,
                            "capacity %lld at rate %g takes over 2^53 us to refill; "
                            "raise the rate or lower the capacity",
                            (long long)capacity, rate);
    cfg->capacity = capacity;
    cfg->capacity_d = (double)capacity;
    cfg->rate = rate;
    cfg->token_us = 1000000.0 / rate;
    return 0;
}

int hirate_check_cost(int64_t cost, const char *what, char *err, size_t errlen)
{
    if (cost < 0 || cost > HIRATE_EXACT_MAX)
        return out_of_range(HIRATE_ECOST, what, cost, err, errlen);
    return 0;
}

/* What a call at now + r computes from the stored state, before the min.
 * Nothing elapsed (a bucket just spent, a clock that went back) refills
 * nothing: tokens + 0.0, the very double the division of 0 gives, without
 * the division. */
static inline double level_at(const hirate_bucket_cfg *cfg, const hirate_bucket *b,
                              int64_t now, double r)
{
    double elapsed = (double)(now - b->ts) + r;
    if (elapsed <= 0)
        return b->tokens + 0.0;
    return b->tokens + elapsed * cfg->rate / 1000000.0;
}

/* floor() for a level: a cast truncates, which is floor for what is not
 * negative (a level is at most 2^53), without the call to libm. */
static inline int64_t whole(double level)
{
    return level >= 0 ? (int64_t)level : (int64_t)floor(level);
}

/* Inlined into hirate_bucket_decide, which calls it once or twice a
 * decision: the same operations in the same order, so the same doubles. */
static inline __attribute__((always_inline)) int64_t
until(const hirate_bucket_cfg *cfg, const hirate_bucket *b, int64_t now, double target)
{
    double level = level_at(cfg, b, now, 0);
    if (level >= target)
        return 0;
    /* The answer is the least r >= 1 at which level_at reaches target
     * (level_at never falls as r grows: each of its operations is monotonic
     * in round-to-nearest). A first guess within a unit or two of it, from
     * a multiplication rather than a division, and the bounded loops settle
     * it in the very arithmetic a later call uses: from any guess within their
     * 64 steps of it, they stop at that least r. */
    double r = ceil((target - level) * cfg->token_us);
    if (b->ts > now)
        r += (double)(b->ts - now);
    for (int i = 0; i < 64 && !(level_at(cfg, b, now, r) >= target); i++)
        r += 1;
    for (int i = 0; i < 64 && r > 1 && level_at(cfg, b, now, r - 1) >= target; i++)
        r -= 1;
    return (int64_t)r;
}

int64_t hirate_bucket_until(const hirate_bucket_cfg *cfg, const hirate_bucket *b, int64_t now,
                            double target)
{
    return until(cfg, b, now, target);
}

double hirate_bucket_level(const hirate_bucket_cfg *cfg, const hirate_bucket *b, int64_t now)
{
    double level = level_at(cfg, b, now, 0);
    return level < cfg->capacity_d ? level : cfg->capacity_d;   /* Lua's math.min */
}

int hirate_bucket_refund(const hirate_bucket_cfg *cfg, hirate_bucket *b, int64_t now,
                         int64_t tokens, hirate_decision *d)
{
    double level = hirate_bucket_level(cfg, b, now);
    int changed = 0;
    if (tokens > 0 && level < cfg->capacity_d) {
        double after = level + (double)tokens;
        b->tokens = after < cfg->capacity_d ? after : cfg->capacity_d;   /* math.min */
        if (now > b->ts)
            b->ts = now;
        level = b->tokens;
        changed = 1;
    }
    d->band = 0;
    d->allowed = 1;
    d->retry_after_us = 0;
    d->source = HIRATE_SOURCE_LOCAL;
    d->error = 0;
    d->limit = cfg->capacity;
    d->remaining = whole(level);
    d->reset_after_us = until(cfg, b, now, cfg->capacity_d);
    d->time_us = now;
    return changed;
}

int hirate_bucket_decide(const hirate_bucket_cfg *cfg, hirate_bucket *b, int64_t now,
                         int64_t cost, int spend, hirate_decision *d)
{
    if (__builtin_expect(spend == HIRATE_SPEND_REFUND, 0))
        return hirate_bucket_refund(cfg, b, now, cost, d);
    d->band = 0;
    double level = hirate_bucket_level(cfg, b, now);
    int changed = 0;

    d->allowed = 0;
    d->retry_after_us = 0;
    if (cost > cfg->capacity) {
        d->retry_after_us = HIRATE_NEVER;
    } else if (level >= (double)cost) {
        d->allowed = 1;
        if (spend && cost > 0) {
            b->tokens = level - (double)cost;
            if (now > b->ts)
                b->ts = now;
            level = b->tokens;
            changed = 1;
        }
    } else {
        d->retry_after_us = until(cfg, b, now, (double)cost);
    }
    d->source = HIRATE_SOURCE_LOCAL;
    d->error = 0;
    d->limit = cfg->capacity;
    d->remaining = whole(level);
    d->reset_after_us = until(cfg, b, now, cfg->capacity_d);
    d->time_us = now;
    return changed;
}

void hirate_bands_combine(const hirate_decision *per, size_t n, hirate_decision *whole)
{
    int allowed = 1;
    for (size_t i = 0; i < n; i++)
        allowed &= per[i].allowed;
    /* The band behind the figures: when refused, the refusing band that
     * waits longest; when allowed, the one left with the fewest tokens; the
     * first of equals. */
    size_t band = 0;
    int64_t remaining = per[0].remaining, reset = per[0].reset_after_us;
    for (size_t i = 1; i < n; i++) {
        const hirate_decision *d = &per[i], *b = &per[band];
        if (allowed ? d->remaining < b->remaining
                    : !d->allowed && (b->allowed || d->retry_after_us > b->retry_after_us))
            band = i;
        if (d->remaining < remaining)
            remaining = d->remaining;
        if (d->reset_after_us > reset)
            reset = d->reset_after_us;
    }
    *whole = per[band];
    whole->band = (int)band;
    whole->remaining = remaining;
    whole->reset_after_us = reset;
}

int hirate_bands_decide_many(const hirate_bucket_cfg *cfg, size_t n, hirate_bucket *b,
                             int64_t now, int64_t cost, int spend, hirate_decision *whole,
                             hirate_decision *per)
{
    hirate_decision own[HIRATE_BANDS_MAX];
    if (!per)
        per = own;
    if (spend == HIRATE_SPEND_REFUND) {   /* every band gets the tokens back */
        int changed = 0;
        for (size_t i = 0; i < n; i++) {
            changed |= hirate_bucket_refund(&cfg[i], &b[i], now, cost, &per[i]);
            per[i].band = (int)i;
        }
        hirate_bands_combine(per, n, whole);
        return changed;
    }
    /* Each band as a peek first; the cost is spent only when all hold it,
     * each band then moving as its own bucket would. */
    int allowed = 1;
    for (size_t i = 0; i < n; i++)
        allowed &= (hirate_bucket_decide(&cfg[i], &b[i], now, cost, 0, &per[i]), per[i].allowed);
    int changed = 0;
    if (allowed && spend && cost > 0)
        for (size_t i = 0; i < n; i++)
            changed |= hirate_bucket_decide(&cfg[i], &b[i], now, cost, 1, &per[i]);
    for (size_t i = 0; i < n; i++)
        per[i].band = (int)i;
    hirate_bands_combine(per, n, whole);
    return changed;
}

int64_t hirate_refill_seconds(int64_t capacity, double rate)
{
    hirate_bucket_cfg cfg;
    if (hirate_bucket_cfg_init(&cfg, capacity, rate, NULL, 0) < 0)
        return 0;
    hirate_bucket empty = {0, 0};
    int64_t us = until(&cfg, &empty, 0, cfg.capacity_d);
    return us / 1000000 + (us % 1000000 != 0);
}
