/* The metrics' sums and the latency buckets. */
#include "metrics.h"

static const int64_t bounds[HIRATE_LATENCY_BUCKETS - 1] = {
    100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000,
};

const int64_t *hirate_latency_bounds(size_t *n)
{
    if (n)
        *n = sizeof bounds / sizeof *bounds;
    return bounds;
}

void hirate_latency_add(hirate_latency *h, int64_t us)
{
    size_t i = 0;
    while (i < sizeof bounds / sizeof *bounds && us > bounds[i])
        i++;
    __atomic_fetch_add(&h->n[i], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&h->sum_us, (uint64_t)(us > 0 ? us : 0), __ATOMIC_RELAXED);
}

static uint64_t load(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

void hirate_counts_sum(const hirate_counts *counts, hirate_stats *out)
{
    for (int s = 0; s < HIRATE_METRICS_STRIPES; s++) {
        const hirate_counts *c = &counts[s];
        for (int i = 0; i < 6; i++)
            out->decisions[i] += load(&c->decisions[i]);
        out->refused += load(&c->refused);
        out->peeks += load(&c->peeks);
        for (int i = 0; i <= HIRATE_ERRNO_MAX; i++)
            out->errors[i] += load(&c->errors[i]);
    }
}

void hirate_latency_sum(const hirate_latency *h, hirate_stats *out)
{
    for (int i = 0; i < HIRATE_LATENCY_BUCKETS; i++)
        out->latency[i] += load(&h->n[i]);
    out->latency_sum_us += load(&h->sum_us);
}
