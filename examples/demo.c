/*
 * make demo: a burst of requests against a small in-memory bucket.
 *
 * The bucket holds 5 tokens and refills 2 per second. Eight requests arrive
 * at once: five pass, three are refused, each told when to retry. The demo
 * then waits as long as it was told and shows that the retry passes.
 *
 * With REDIS_URL set (e.g. redis://127.0.0.1:6379) the same program uses
 * Redis instead, and several copies share one bucket.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hirate.h>

static void sleep_us(int64_t us)
{
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {}
}

/* Prints one decision; returns its retry_after_us (0 when it passed), or -1. */
static int64_t show(hirate_limiter *lim, const char *what, const char *key, int64_t cost)
{
    hirate_decision d;
    char why[HIRATE_ERRMSG_SIZE];
    int rc = hirate_allow(lim, key, strlen(key), cost, &d);
    if (rc < 0) {
        printf("  %-22s error %s: %s\n", what, hirate_err_name(rc),
               hirate_limiter_errmsg(lim, why, sizeof why));
        return -1;
    }
    if (d.allowed)
        printf("  %-22s pass     %lld of %lld left\n", what, (long long)d.remaining,
               (long long)d.limit);
    else if (d.retry_after_us == HIRATE_NEVER)
        printf("  %-22s refused  never: cost %lld is above the capacity\n", what, (long long)cost);
    else
        printf("  %-22s refused  retry in %.3f s\n", what, (double)d.retry_after_us / 1e6);
    return d.allowed ? 0 : d.retry_after_us;
}

int main(void)
{
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = 5;
    o.rate = 2.0;
    o.prefix = "demo:";
    o.url = getenv("REDIS_URL");
    if (o.url && !*o.url)
        o.url = NULL;

    hirate_limiter *lim;
    char why[HIRATE_ERRMSG_SIZE];
    int rc = hirate_limiter_new(&lim, &o, why, sizeof why);
    if (rc < 0) {
        fprintf(stderr, "hirate: %s\n", why);
        return 1;
    }
    printf("hirate %s: capacity 5, refill 2 tokens/s, %s\n\n", hirate_version(),
           o.url ? "Redis" : "in memory");
    hirate_reset(lim, "alice", 5);
    hirate_reset(lim, "bob", 3);

    printf("A burst of 8 requests from alice:\n");
    int64_t wait_us = 0;
    for (int i = 1; i <= 8; i++) {
        char what[32];
        snprintf(what, sizeof what, "request %d", i);
        int64_t retry = show(lim, what, "alice", 1);
        if (retry > 0 && wait_us == 0)
            wait_us = retry;
    }

    printf("\nbob has a bucket of his own:\n");
    show(lim, "request 1", "bob", 1);

    printf("\nA request that costs 3 tokens, and one that costs 6:\n");
    show(lim, "bob, cost 3", "bob", 3);
    show(lim, "bob, cost 6", "bob", 6);

    if (wait_us > 0) {
        printf("\nalice waits %.3f s, as she was told, and tries again:\n", (double)wait_us / 1e6);
        sleep_us(wait_us);
        show(lim, "request 9", "alice", 1);
    }
    hirate_limiter_free(lim);
    return 0;
}
