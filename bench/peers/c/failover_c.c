/*
 * hirate's side of the Sentinel failover measurement (bench/suite/suite.py,
 * phase failover; bench/peers/README.md, "Following a failover"):
 *
 *   failover_c --url redis+sentinel://H:P[,H:P...]/SERVICE --prefix fo:c: [--interval-ms 10]
 *
 * hirate_allow with the options' defaults but the URL (the breaker, the
 * local fallback, a 100 ms timeout), one decision on a key of its own each
 * (PREFIX + sequence number, capacity 10, rate 0.001/s, so each key lives
 * 1,000 s), a sleep of --interval-ms between decisions, until SIGTERM. One
 * line per decision on stdout, flushed:
 *
 *   SEQ UNIX_NS OK SOURCE
 *
 * UNIX_NS the CLOCK_REALTIME when the call returned, OK 1 when Redis decided
 * (source redis) and 0 otherwise, SOURCE hirate's name of who decided; and
 * at the end "# name=value ..." of hirate's counters.
 * The driver tells on which server each decision landed from the keys
 * each server holds.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hirate.h"
#include "hirate_io.h"

static volatile sig_atomic_t stop;

static void on_term(int sig)
{
    (void)sig;
    stop = 1;
}

int main(int argc, char **argv)
{
    const char *url = NULL, *prefix = "fo:c:";
    long interval_ms = 10;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--url") == 0)
            url = argv[i + 1];
        else if (strcmp(argv[i], "--prefix") == 0)
            prefix = argv[i + 1];
        else if (strcmp(argv[i], "--interval-ms") == 0)
            interval_ms = strtol(argv[i + 1], NULL, 10);
    }
    if (!url || interval_ms < 0) {
        fprintf(stderr, "usage: failover_c --url redis+sentinel://H:P/SERVICE [--prefix P] "
                        "[--interval-ms MS]\n");
        return 2;
    }
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.capacity = 10;
    o.rate = 0.001;
    hirate_limiter *lim;
    char err[256];
    if (hirate_limiter_new(&lim, &o, err, sizeof err) < 0) {
        fprintf(stderr, "failover_c: %s\n", err);
        return 1;
    }
    struct timespec pause = {interval_ms / 1000, (interval_ms % 1000) * 1000000};
    for (long seq = 0; !stop; seq++) {
        char key[128];
        int n = snprintf(key, sizeof key, "%s%ld", prefix, seq);
        hirate_decision d;
        int rc = hirate_allow(lim, key, (size_t)n, 1, &d);
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        if (rc < 0) {
            /* A misconfiguration: not an outage, nothing to measure. */
            char msg[256];
            fprintf(stderr, "failover_c: %s: %s\n", hirate_err_name(rc),
                    hirate_limiter_errmsg(lim, msg, sizeof msg));
            hirate_limiter_free(lim);
            return 1;
        }
        printf("%ld %lld %d %s\n", seq, (long long)now.tv_sec * 1000000000LL + now.tv_nsec,
               d.source == HIRATE_SOURCE_REDIS, hirate_source_name(d.source));
        fflush(stdout);
        nanosleep(&pause, NULL);
    }
    /* What it took: how often the sentinels were asked, the master found
     * anew, the script or the library sent. */
    hirate_counters k;
    hirate_counters_get(lim, &k);
    printf("# sentinel_queries=%" PRIu64 " master_changes=%" PRIu64 " fcall=%" PRIu64
           " function_loads=%" PRIu64 " evalsha=%" PRIu64 " eval=%" PRIu64 "\n",
           k.sentinel_queries, k.master_changes, k.fcall, k.function_loads, k.evalsha, k.eval);
    fflush(stdout);
    hirate_limiter_free(lim);
    return 0;
}
