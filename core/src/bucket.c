/* The token-bucket arithmetic. Keep it in step with lua/token_bucket.lua. */
#include <math.h>

#include "bucket.h"
#include "errors.h"

int hirate_bucket_cfg_init(hirate_bucket_cfg *cfg, int64_t capacity, double rate,
                           char *err, size_t errlen)
{
    if (capacity < 1 || capacity > HIRATE_EXACT_MAX)
        return hirate__fail(err, errlen, HIRATE_ECAPACITY,
                            "capacity must be a whole number from 1 to 2^53-1, got %lld",
                            (long long)capacity);
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
    return 0;
}

int hirate_bucket_check_cost(int64_t cost, char *err, size_t errlen)
{
    if (cost < 0 || cost > HIRATE_EXACT_MAX)
        return hirate__fail(err, errlen, HIRATE_ECOST,
                            "cost must be a whole number from 0 to 2^53-1, got %lld",
                            (long long)cost);
    return 0;
}

int64_t hirate_bucket_until(double tokens, double target, double rate)
{
    if (tokens >= target)
        return 0;
    /* ceil() is within a unit or two of the answer; the bounded loops settle
     * it in the very arithmetic the refill uses. */
    double r = ceil((target - tokens) * 1000000.0 / rate);
    for (int i = 0; i < 64 && !(tokens + r * rate / 1000000.0 >= target); i++)
        r += 1;
    for (int i = 0; i < 64 && r > 1 && tokens + (r - 1) * rate / 1000000.0 >= target; i++)
        r -= 1;
    return (int64_t)r;
}

double hirate_bucket_level(const hirate_bucket_cfg *cfg, const hirate_bucket *b, int64_t now)
{
    int64_t elapsed = now - b->ts;
    if (elapsed < 0)
        elapsed = 0;   /* a clock that went back refills nothing */
    double level = b->tokens + (double)elapsed * cfg->rate / 1000000.0;
    return level < cfg->capacity_d ? level : cfg->capacity_d;   /* Lua's math.min */
}

int hirate_bucket_decide(const hirate_bucket_cfg *cfg, hirate_bucket *b, int64_t now,
                         int64_t cost, int spend, hirate_decision *d)
{
    double tokens = hirate_bucket_level(cfg, b, now);
    int changed = 0;

    d->allowed = 0;
    d->retry_after_us = 0;
    if (cost > cfg->capacity) {
        d->retry_after_us = HIRATE_NEVER;
    } else if (tokens >= (double)cost) {
        d->allowed = 1;
        if (spend && cost > 0) {
            tokens -= (double)cost;
            b->tokens = tokens;
            if (now > b->ts)
                b->ts = now;
            changed = 1;
        }
    } else {
        d->retry_after_us = hirate_bucket_until(tokens, (double)cost, cfg->rate);
    }
    d->source = HIRATE_SOURCE_LOCAL;
    d->error = 0;
    d->limit = cfg->capacity;
    d->remaining = (int64_t)floor(tokens);
    d->reset_after_us = hirate_bucket_until(tokens, cfg->capacity_d, cfg->rate);
    d->time_us = now;
    return changed;
}
