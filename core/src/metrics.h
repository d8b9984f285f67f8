/*
 * A limiter's metrics: counters that every thread adds to without a lock
 * and without writing a cache line the others write (each thread adds to
 * one of STRIPES stripes, chosen by its thread pointer; a read sums them),
 * and the latency histogram of Redis round trips.
 */
#ifndef HIRATE_METRICS_H
#define HIRATE_METRICS_H

#include <stdint.h>

#include "hirate.h"

#define HIRATE_METRICS_STRIPES 16

/* What the decisions of one stripe's threads add up to. */
typedef struct hirate_counts {
    uint64_t decisions[6];          /* by source, of calls that spend */
    uint64_t refused;
    uint64_t peeks;
    uint64_t errors[HIRATE_ERRNO_MAX + 1];
} __attribute__((aligned(64))) hirate_counts;

/* Round trips by duration, and their total time. */
typedef struct hirate_latency {
    uint64_t n[HIRATE_LATENCY_BUCKETS];
    uint64_t sum_us;
} hirate_latency;

/* This thread's stripe of counts[HIRATE_METRICS_STRIPES]. */
static inline hirate_counts *hirate_counts_mine(hirate_counts *counts)
{
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
    uintptr_t tp = (uintptr_t)__builtin_thread_pointer();
#else
    uintptr_t tp = (uintptr_t)&counts;   /* this thread's stack: as good a spread */
#endif
    /* Thread pointers lie megabytes apart: the multiply mixes the high bits. */
    return &counts[(tp * 0x9e3779b97f4a7c15ull) >> 60];
}

static inline void hirate_count(uint64_t *field)
{
    __atomic_fetch_add(field, 1, __ATOMIC_RELAXED);
}

/* A decision of one call (spend: of a call that spends) on this thread. */
static inline void hirate_count_decision(hirate_counts *counts, const hirate_decision *d,
                                         int spend)
{
    hirate_counts *c = hirate_counts_mine(counts);
    if (spend == 2) {   /* HIRATE_OP_REFUND: not a decision */
    } else if (spend) {
        hirate_count(&c->decisions[d->source]);
        if (!d->allowed)
            hirate_count(&c->refused);
    } else {
        hirate_count(&c->peeks);
    }
    if (__builtin_expect(d->error != 0, 0))
        hirate_count(&c->errors[-d->error]);
}

/* A call that failed with code. */
static inline void hirate_count_error(hirate_counts *counts, int code)
{
    if (code < 0 && code >= -HIRATE_ERRNO_MAX)
        hirate_count(&hirate_counts_mine(counts)->errors[-code]);
}

/* A round trip of us microseconds. */
void hirate_latency_add(hirate_latency *h, int64_t us);

/* Adds the counts of every stripe, and a histogram, into *out. */
void hirate_counts_sum(const hirate_counts *counts, hirate_stats *out);
void hirate_latency_sum(const hirate_latency *h, hirate_stats *out);

#endif
