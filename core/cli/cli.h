/*
 * What hirate.c (options, allow, peek, reset, script) and bench.c (the load
 * generator) share. Only the public hirate.h is used: the tool is a client of
 * the library like any other program.
 */
#ifndef HIRATE_CLI_H
#define HIRATE_CLI_H

#include <stddef.h>
#include <stdint.h>

#include <hirate.h>

/* Exit status: the shell's view of a decision (check: CLI_REFUSED for a node
 * that is not healthy). */
enum { CLI_ALLOWED = 0, CLI_REFUSED = 1, CLI_ERROR = 2 };

/* Everything the command line said, validated for syntax; the library
 * validates the ranges of what it is given. */
typedef struct cli_config {
    hirate_options opts; /* url NULL: in memory */
    int64_t cost;        /* default 1 */
    int json;            /* --json */
    int quiet;           /* -q, --quiet: nothing on stdout */
    int sha1;            /* script --sha1 */
    int threads;         /* bench --threads, default 4 */
    uint64_t keys;       /* bench --keys, default 1000 */
    double duration_s;   /* bench --duration, default 5 */
    int batch;           /* bench --batch, default 1 */
} cli_config;

/* "hirate: <message>" and a newline on stderr. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* hirate_limiter_new, with its message printed on failure. Returns 0 or -1. */
int cli_limiter_new(const hirate_options *opts, hirate_limiter **out);

/* The message of the last error on lim (or of rc when there is none). */
const char *cli_limiter_error(hirate_limiter *lim, int rc, char *buf, size_t len);

/* hirate bench; returns an exit status. */
int cli_bench(const cli_config *c);

#endif /* HIRATE_CLI_H */
