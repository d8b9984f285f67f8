/*
 * The clock: CLOCK_MONOTONIC, in whole microseconds, truncated.
 *
 * Why this clock. A memory-backed decision depends on every microsecond
 * (bucket.c refills by elapsed µs × rate), so the clock must be monotonic
 * and exact to the microsecond, and the same clock for every thread and
 * process (core/src/shm.c shares buckets between processes):
 * - CLOCK_MONOTONIC through the vDSO takes no system call (about 20 ns
 *   here, most of it the fenced rdtsc of the kernel's own code) and meets
 *   all three.
 * - CLOCK_MONOTONIC_COARSE is cheaper (a load of the last tick) but only
 *   as fine as the kernel's tick (1 to 4 ms): the answers would change.
 * - rdtsc of our own would need a calibration against CLOCK_MONOTONIC that
 *   drifts from it (and from other processes' reads) between calibrations,
 *   on a TSC the kernel may not trust; the vDSO already does that
 *   arithmetic, with the kernel's own correction.
 * What does save time is when the clock is read: memory.c reads it once
 * the bucket is found, so that the lookup's cache misses do not wait for
 * the read's fence.
 */
#include <time.h>

#include "clock.h"

int64_t hirate_monotonic_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
