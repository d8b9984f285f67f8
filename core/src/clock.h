/*
 * The monotonic clock of the memory backend, the breaker and the timeouts:
 * CLOCK_MONOTONIC in whole microseconds (core/src/clock.c says why this
 * clock and no cheaper one).
 */
#ifndef HIRATE_CLOCK_H
#define HIRATE_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC in microseconds. */
int64_t hirate_monotonic_us(void);

#endif
