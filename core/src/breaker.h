/*
 * The circuit breaker in front of Redis. After a failure, Redis is left alone
 * for a backoff (exponential, jittered, bounded); then exactly one caller
 * probes while the others keep using the failure policy. A successful probe
 * closes the breaker; a failed one doubles the backoff. While it is closed,
 * asking costs one atomic load.
 */
#ifndef HIRATE_BREAKER_H
#define HIRATE_BREAKER_H

#include <pthread.h>
#include <stdint.h>

enum { HIRATE_BREAKER_PASS, HIRATE_BREAKER_PROBE, HIRATE_BREAKER_SKIP };

typedef struct hirate_breaker {
    int state;              /* closed, open or probing; read without the lock */
    pthread_mutex_t lock;
    int64_t retry_at_us;    /* when open: the first moment to probe */
    int backoff_ms, min_ms, max_ms;
    int last_error;         /* the failure that opened it */
    uint64_t jitter;
    uint64_t opens, closes;
    int64_t opened_us;      /* when the outage began */
} hirate_breaker;

void hirate_breaker_init(hirate_breaker *b, int min_ms, int max_ms);
void hirate_breaker_destroy(hirate_breaker *b);

/* PASS: call Redis. PROBE: call Redis, and report the outcome with probe set.
 * SKIP: do not call Redis; *error is the failure that opened the breaker and
 * *wait_us the time until the next probe. */
int hirate_breaker_enter(hirate_breaker *b, int64_t now_us, int *error, int64_t *wait_us);

/* The outcome of a call that reached Redis (success) or failed (failure).
 * success returns how long Redis was gone (µs) when this closed the breaker,
 * else -1. failure returns the time until the next probe, and sets *opened
 * when it opened a closed breaker (an outage begins). */
int64_t hirate_breaker_success(hirate_breaker *b, int probe, int64_t now_us);
int64_t hirate_breaker_failure(hirate_breaker *b, int probe, int error, int64_t now_us,
                               int *opened);
/* A probe that ended without an outcome (its caller gave up): the breaker
 * stays open as it was, and the next call probes. */
void hirate_breaker_release(hirate_breaker *b, int probe);

#endif
