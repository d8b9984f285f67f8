/*
 * The token-bucket arithmetic, pure: time is passed in. lua/token_bucket.lua
 * performs the same operations in the same order, so both give the same
 * doubles bit for bit (the shared test vectors check it).
 */
#ifndef HIRATE_BUCKET_H
#define HIRATE_BUCKET_H

#include <stdint.h>

#include "hirate.h"
#include "hirate_io.h"

typedef struct hirate_bucket {
    double tokens;   /* level at ts */
    int64_t ts;      /* µs */
} hirate_bucket;

typedef struct hirate_bucket_cfg {
    int64_t capacity;
    double capacity_d;
    double rate;     /* tokens per second */
    double token_us; /* 1e6 / rate: only for a first guess (bucket.c) */
} hirate_bucket_cfg;

/* Checks capacity and rate; fills cfg. Returns 0 or a HIRATE_E* code with a
 * message in err. */
int hirate_bucket_cfg_init(hirate_bucket_cfg *cfg, int64_t capacity, double rate,
                           char *err, size_t errlen);

/* A cost is checked by hirate_check_cost (hirate.h). */

/* What spend asks of a decision: look (a peek), spend the cost when it
 * passes, or give the cost back (a refund). HIRATE_OP_* of hirate_io.h. */
#define HIRATE_SPEND_PEEK HIRATE_OP_PEEK
#define HIRATE_SPEND_REFUND HIRATE_OP_REFUND

/* Gives tokens back to the stored state *b at now: the level at now plus
 * tokens, capped at the capacity (a bucket never holds more). Fills *d with
 * the bucket after it (allowed 1, retry 0). Returns 1 when *b changed and
 * must be stored, 0 when it stays as it was (tokens 0, or a bucket already
 * full, whose state reads the same either way). */
int hirate_bucket_refund(const hirate_bucket_cfg *cfg, hirate_bucket *b, int64_t now,
                         int64_t tokens, hirate_decision *d);

/* Decides cost at now for the stored state *b (a full bucket at now for a key
 * that has none). Fills *d. Returns 1 when *b changed and must be stored,
 * 0 when it stays as it was (a refusal or a peek). spend HIRATE_SPEND_REFUND
 * is hirate_bucket_refund. */
int hirate_bucket_decide(const hirate_bucket_cfg *cfg, hirate_bucket *b, int64_t now,
                         int64_t cost, int spend, hirate_decision *d);

/* Decides cost at now for the n bands of one key, all or nothing: the cost
 * passes when every band holds it, and is then spent in each; otherwise
 * nothing is spent (a refund gives it back to each band). b[i] is band i's stored state (a full bucket at now
 * when it has none). Fills *whole and, when per is not NULL, per[0 .. n)
 * with each band's own figures (docs/semantics.md, "Several limits").
 * Returns 1 when b[] changed and must be stored, 0 when not. With n == 1
 * it is hirate_bucket_decide. */
int hirate_bands_decide_many(const hirate_bucket_cfg *cfg, size_t n, hirate_bucket *b,
                             int64_t now, int64_t cost, int spend, hirate_decision *whole,
                             hirate_decision *per);

static inline int hirate_bands_decide(const hirate_bucket_cfg *cfg, size_t n, hirate_bucket *b,
                                      int64_t now, int64_t cost, int spend,
                                      hirate_decision *whole, hirate_decision *per)
{
    if (__builtin_expect(n == 1, 1)) {
        int changed = hirate_bucket_decide(cfg, b, now, cost, spend, whole);
        if (per)
            per[0] = *whole;
        return changed;
    }
    return hirate_bands_decide_many(cfg, n, b, now, cost, spend, whole, per);
}

/* The whole decision from the n bands' own ones (per[i] filled, each with
 * its allowed, limit, remaining, retry and reset): see hirate_decision. */
void hirate_bands_combine(const hirate_decision *per, size_t n, hirate_decision *whole);

/* The level at now, without storing anything. */
double hirate_bucket_level(const hirate_bucket_cfg *cfg, const hirate_bucket *b, int64_t now);

/* Microseconds from now until the stored state *b holds target tokens: the
 * least r with b->tokens + max(0, now + r - b->ts) * rate / 1e6 >= target,
 * which is what a call at now + r computes. */
int64_t hirate_bucket_until(const hirate_bucket_cfg *cfg, const hirate_bucket *b, int64_t now,
                            double target);

#endif
