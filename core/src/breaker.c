/* The circuit breaker: closed, open until retry_at_us, then one probe. */
#include "breaker.h"

enum { CLOSED, OPEN, PROBING };

void hirate_breaker_init(hirate_breaker *b, int min_ms, int max_ms)
{
    b->state = CLOSED;
    pthread_mutex_init(&b->lock, NULL);
    b->retry_at_us = 0;
    b->backoff_ms = 0;
    b->min_ms = min_ms;
    b->max_ms = max_ms;
    b->last_error = 0;
    b->jitter = (uint64_t)(uintptr_t)b * 0x9e3779b97f4a7c15ull | 1;
    b->opens = b->closes = 0;
    b->opened_us = 0;
}

void hirate_breaker_destroy(hirate_breaker *b)
{
    pthread_mutex_destroy(&b->lock);
}

/* backoff ± 25%, so that processes that failed together probe apart. */
static int64_t jittered_us(hirate_breaker *b)
{
    uint64_t x = b->jitter;   /* xorshift64, under the lock */
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b->jitter = x;
    int64_t us = (int64_t)b->backoff_ms * 1000;
    return us * 3 / 4 + (int64_t)(x % (uint64_t)(us / 2 + 1));
}

int hirate_breaker_enter(hirate_breaker *b, int64_t now_us, int *error, int64_t *wait_us)
{
    if (__atomic_load_n(&b->state, __ATOMIC_ACQUIRE) == CLOSED)
        return HIRATE_BREAKER_PASS;
    int verdict = HIRATE_BREAKER_SKIP;
    pthread_mutex_lock(&b->lock);
    if (b->state == CLOSED) {
        verdict = HIRATE_BREAKER_PASS;
    } else if (b->state == OPEN && now_us >= b->retry_at_us) {
        __atomic_store_n(&b->state, PROBING, __ATOMIC_RELEASE);
        verdict = HIRATE_BREAKER_PROBE;
    } else {
        *error = b->last_error;
        *wait_us = b->retry_at_us > now_us ? b->retry_at_us - now_us : 0;
    }
    pthread_mutex_unlock(&b->lock);
    return verdict;
}

int64_t hirate_breaker_success(hirate_breaker *b, int probe, int64_t now_us)
{
    if (!probe)
        return -1;   /* closed already, or a late answer to a call from before */
    pthread_mutex_lock(&b->lock);
    int64_t gone = -1;
    if (b->state != CLOSED) {
        gone = now_us - b->opened_us;
        b->closes++;
    }
    b->backoff_ms = 0;
    __atomic_store_n(&b->state, CLOSED, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&b->lock);
    return gone;
}

void hirate_breaker_release(hirate_breaker *b, int probe)
{
    if (!probe)
        return;
    pthread_mutex_lock(&b->lock);
    if (b->state == PROBING)
        __atomic_store_n(&b->state, OPEN, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&b->lock);
}

int64_t hirate_breaker_failure(hirate_breaker *b, int probe, int error, int64_t now_us,
                               int *opened)
{
    *opened = 0;
    pthread_mutex_lock(&b->lock);
    if (probe || b->state == CLOSED) {
        if (probe && b->backoff_ms)
            b->backoff_ms = b->backoff_ms >= b->max_ms / 2 ? b->max_ms : b->backoff_ms * 2;
        else
            b->backoff_ms = b->min_ms;
        b->retry_at_us = now_us + jittered_us(b);
        b->last_error = error;
        if (b->state == CLOSED) {
            b->opens++;
            b->opened_us = now_us;
            *opened = 1;
        }
        __atomic_store_n(&b->state, OPEN, __ATOMIC_RELEASE);
    }
    int64_t wait_us = b->retry_at_us > now_us ? b->retry_at_us - now_us : 0;
    pthread_mutex_unlock(&b->lock);
    return wait_us;
}
