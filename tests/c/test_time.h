/*
 * Time for the C tests: the monotonic clock in microseconds, and a sleep
 * that a signal cannot cut short.
 */
#ifndef HIRATE_TEST_TIME_H
#define HIRATE_TEST_TIME_H

#include <errno.h>
#include <stdint.h>
#include <time.h>

static inline int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

#endif
