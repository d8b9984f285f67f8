/*
 * Wall-clock steps do not change the memory backend's decisions.
 *
 * A real NTP step or `date -s` moves CLOCK_REALTIME and leaves
 * CLOCK_MONOTONIC alone; the memory backend reads only the monotonic clock,
 * so its decisions must not change. This program runs one sequence of
 * decisions three times, each in a child process (itself, with --sequence):
 *
 *   1. as it is;
 *   2. under libfaketime (the library behind `faketime`), with the wall
 *      clock stepped mid-run an hour back, then a day forward, by rewriting
 *      FAKETIME_TIMESTAMP_FILE (read on every call: FAKETIME_NO_CACHE=1),
 *      and with DONT_FAKE_MONOTONIC=1, since libfaketime would otherwise move
 *      CLOCK_MONOTONIC too, which no real wall-clock step does. The child
 *      reports the steps it saw, so a libfaketime that did not load fails
 *      the test instead of passing it;
 *   3. as 2, but with the monotonic clock faked too: the same steps now
 *      reach the limiter, and the decisions must differ, which shows that
 *      the comparison would catch a limiter that read a clock that steps.
 *
 * Runs 1 and 2 must give the same decisions: allowed and remaining exactly,
 * and waits within the scheduling noise of two runs (a wall-clock limiter
 * would be an hour or a day off). libfaketime is preloaded directly
 * (LD_PRELOAD) rather than through the `faketime` command, whose FAKETIME
 * variable would take precedence over the timestamp file.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "test_time.h"
#include "hirate.h"

#ifndef HIRATE_FAKETIME_LIB
#define HIRATE_FAKETIME_LIB "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
#endif

#define STEPS 8
#define NOISE_US 250000        /* two runs' waits may differ by scheduling */

/* ---- the child: one sequence of decisions ------------------------------------------ */

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Sets libfaketime's offset; a rename, so that it never reads half a file. */
static void set_offset(const char *file, const char *offset)
{
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.new", file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%s\n", offset) < 0 || fclose(f) != 0 || rename(tmp, file) != 0) {
        perror("test_clock: writing the timestamp file");
        exit(3);
    }
}

/* Steps the wall clock (when run under libfaketime) and prints how far the
 * wall and monotonic clocks moved across the step. */
static void step_wall_clock(const char *file, const char *offset)
{
    double w0 = clock_s(CLOCK_REALTIME), m0 = clock_s(CLOCK_MONOTONIC);
    if (file)
        set_offset(file, offset);
    printf("step %s wall %+.0f mono %+.0f\n", offset, clock_s(CLOCK_REALTIME) - w0,
           clock_s(CLOCK_MONOTONIC) - m0);
}

static void decide(hirate_limiter *lim, int spend, int64_t cost)
{
    hirate_decision d;
    int rc = spend ? hirate_allow(lim, "k", 1, cost, &d) : hirate_peek(lim, "k", 1, cost, &d);
    printf("decision %d %d %lld %lld %lld\n", rc, rc ? 0 : d.allowed,
           rc ? 0LL : (long long)d.remaining, rc ? 0LL : (long long)d.retry_after_us,
           rc ? 0LL : (long long)d.reset_after_us);
}

/* Capacity 3, one token a second. Without the steps: a burst of four (the
 * fourth refused), refused again after each step (no time has passed),
 * a peek at the whole capacity, then after 1.3 s one token is back. */
static int sequence(const char *file)
{
    hirate_options o;
    hirate_options_init(&o);
    o.capacity = 3;
    o.rate = 1;
    hirate_limiter *lim;
    if (hirate_limiter_new(&lim, &o, NULL, 0) != 0)
        return 3;
    for (int i = 0; i < 4; i++)
        decide(lim, 1, 1);
    step_wall_clock(file, "-1h");
    decide(lim, 1, 1);
    step_wall_clock(file, "+1d");
    decide(lim, 1, 1);
    decide(lim, 0, 3);
    sleep_ms(1300);
    decide(lim, 1, 1);
    hirate_limiter_free(lim);
    fflush(stdout);
    return 0;
}

/* ---- the parent: three runs, compared ------------------------------------------------ */

typedef struct run {
    int n;
    int rc[STEPS], allowed[STEPS];
    long long remaining[STEPS], retry[STEPS], reset[STEPS];
    int nsteps;
    double wall[2], mono[2];
} run;

/* Runs `self --sequence file` with extra environment (NAME=VALUE strings);
 * parses what it prints. Returns 0, or -1 when it did not run to the end. */
static int run_child(const char *self, const char *file, const char *const *env, run *r)
{
    int fds[2];
    memset(r, 0, sizeof *r);
    if (pipe(fds) != 0)
        return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        for (const char *const *e = env; e && *e; e++)
            putenv((char *)*e);
        execl(self, self, "--sequence", file ? file : "-", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *in = fdopen(fds[0], "r");
    char line[256], what[16];
    while (in && fgets(line, sizeof line, in)) {
        double w, m;
        if (r->n < STEPS && sscanf(line, "decision %d %d %lld %lld %lld", &r->rc[r->n],
                                   &r->allowed[r->n], &r->remaining[r->n], &r->retry[r->n],
                                   &r->reset[r->n]) == 5) {
            r->n++;
        } else if (r->nsteps < 2 && sscanf(line, "step %15s wall %lf mono %lf", what, &w, &m) == 3) {
            r->wall[r->nsteps] = w;
            r->mono[r->nsteps++] = m;
        } else {
            fprintf(stderr, "  child said: %s", line);
        }
    }
    if (in)
        fclose(in);
    int status;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "  the child exited with status %d\n", status);
        return -1;
    }
    return r->n == 8 && r->nsteps == 2 ? 0 : -1;
}

static long long diff(long long a, long long b)
{
    return a > b ? a - b : b - a;
}

/* The same decisions: the same outcomes and levels, waits within the noise. */
static int same_decisions(const run *a, const run *b, int verbose)
{
    int same = a->n == b->n;
    for (int i = 0; same && i < a->n; i++) {
        int ok = a->rc[i] == b->rc[i] && a->allowed[i] == b->allowed[i] &&
                 a->remaining[i] == b->remaining[i] && diff(a->retry[i], b->retry[i]) <= NOISE_US &&
                 diff(a->reset[i], b->reset[i]) <= NOISE_US;
        if (!ok && verbose)
            fprintf(stderr, "  decision %d: allowed %d/%d remaining %lld/%lld retry %lld/%lld "
                    "reset %lld/%lld\n", i, a->allowed[i], b->allowed[i], a->remaining[i],
                    b->remaining[i], a->retry[i], b->retry[i], a->reset[i], b->reset[i]);
        same &= ok;
    }
    return same;
}

static void print_run(const char *name, const run *r)
{
    printf("  %-22s", name);
    for (int i = 0; i < r->n; i++)
        printf(" %s%lld", r->allowed[i] ? "+" : "-", r->remaining[i]);
    printf("  (wall steps %+.0f s, %+.0f s; monotonic %+.0f s, %+.0f s)\n", r->wall[0],
           r->wall[1], r->mono[0], r->mono[1]);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--sequence") == 0)
        return sequence(strcmp(argv[2], "-") == 0 ? NULL : argv[2]);

    const char *lib = getenv("HIRATE_FAKETIME_LIB");
    if (!lib || !*lib)
        lib = HIRATE_FAKETIME_LIB;
    if (access(lib, R_OK) != 0) {
        fprintf(stderr, "test_clock: %s is missing; tools/deps.sh test installs faketime\n", lib);
        CHECK(!"libfaketime must be installed");
        return check_summary("test_clock");
    }

    char dir[] = "/tmp/hirate-clock-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("test_clock: mkdtemp");
        return 1;
    }
    char file[64], preload[600], tsfile[128];
    snprintf(file, sizeof file, "%s/offset", dir);
    snprintf(preload, sizeof preload, "LD_PRELOAD=%s", lib);
    snprintf(tsfile, sizeof tsfile, "FAKETIME_TIMESTAMP_FILE=%s", file);
    /* Under ASan, libfaketime comes first among the preloaded libraries;
     * ASan only needs to be told that this is fine. */
    const char *asan = getenv("ASAN_OPTIONS");
    char asan_env[512];
    snprintf(asan_env, sizeof asan_env, "ASAN_OPTIONS=%s%sverify_asan_link_order=0",
             asan ? asan : "", asan && *asan ? ":" : "");
    const char *const wall_only[] = {preload, tsfile, "FAKETIME_NO_CACHE=1",
                                     "DONT_FAKE_MONOTONIC=1", asan_env, NULL};
    const char *const both[] = {preload, tsfile, "FAKETIME_NO_CACHE=1", asan_env, NULL};

    run plain, stepped, control;
    set_offset(file, "+0");
    int ok_plain = run_child(argv[0], NULL, NULL, &plain) == 0;
    int ok_stepped = run_child(argv[0], file, wall_only, &stepped) == 0;
    set_offset(file, "+0");
    int ok_control = run_child(argv[0], file, both, &control) == 0;
    unlink(file);
    rmdir(dir);
    CHECK(ok_plain);
    CHECK(ok_stepped);
    CHECK(ok_control);
    if (!ok_plain || !ok_stepped || !ok_control)
        return check_summary("test_clock");
    print_run("as it is:", &plain);
    print_run("wall clock stepped:", &stepped);
    print_run("both clocks stepped:", &control);

    /* The sequence itself, without steps: exact outcomes and levels. */
    static const int allowed[STEPS] = {1, 1, 1, 0, 0, 0, 0, 1};
    static const long long remaining[STEPS] = {2, 1, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < STEPS; i++) {
        CHECK_EQ_I64(plain.rc[i], 0);
        CHECK_EQ_I64(plain.allowed[i], allowed[i]);
        CHECK_EQ_I64(plain.remaining[i], remaining[i]);
    }
    CHECK(plain.wall[0] > -5 && plain.wall[0] < 5 && plain.wall[1] > -5 && plain.wall[1] < 5);

    /* libfaketime did step the wall clock, an hour back then a day forward
     * (from an hour back: 25 hours), and left the monotonic clock alone. */
    CHECK(stepped.wall[0] > -3600 - 5 && stepped.wall[0] < -3600 + 5);
    CHECK(stepped.wall[1] > 90000 - 5 && stepped.wall[1] < 90000 + 5);
    CHECK(stepped.mono[0] > -5 && stepped.mono[0] < 5);
    CHECK(stepped.mono[1] > -5 && stepped.mono[1] < 5);
    CHECK(same_decisions(&plain, &stepped, 1));

    /* With the monotonic clock stepped as well, the decisions change: the
     * comparison above is able to see a clock step. */
    CHECK(control.mono[1] > 90000 - 5);
    CHECK(!same_decisions(&plain, &control, 0));
    return check_summary("test_clock");
}
