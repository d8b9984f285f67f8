/*
 * Decision latency while Redis is down: hirate's circuit breaker next to a
 * naive loop that tries Redis again on every call.
 *
 *   bench_outage --url redis://127.0.0.1:PORT --pid PID [--seconds S]
 *                [--naive-stopped N] [--summary FILE]
 *
 * PID is the redis-server behind URL, started for this program alone (by
 * bench/run.sh): the program stops it with SIGSTOP, resumes it with SIGCONT,
 * then kills it with SIGKILL, and times every decision in between. Whoever
 * starts the server must also send it SIGCONT when this program ends by any
 * path (bench/run.sh does it from its exit trap); the program sends it itself
 * on a normal exit, on exit() and on SIGINT/SIGTERM.
 *
 * The clients, one call at a time on one thread, cycling through 10,000 keys:
 *   hirate: hirate_allow, on_error local, timeout_ms 100, the default backoff
 *           (100 ms doubling to 5 s) and connect timeout (250 ms);
 *   naive:  plain hiredis that, whenever its connection is broken, reconnects
 *           (redisConnectWithTimeout, 100 ms) and then sends the EVALSHA
 *           (timeout 100 ms) on every call; a failed call is decided at once
 *           (allowed, as fail-open would), so its latency is the failed attempt.
 * Both first run for a moment against the live server, so each has a live
 * connection when the outage begins. Then, for each outage:
 *   stopped: SIGSTOP; the connection stays up but nothing answers. hirate
 *            runs S seconds, then the naive loop makes N calls (each waits out
 *            the 100 ms timeout, so N stays small); SIGCONT; both recover.
 *   killed:  SIGKILL; the port refuses connections. hirate runs S seconds,
 *            then the naive loop runs S seconds.
 * The clock starts once /proc shows the signal took effect. Every decision is
 * timed, the first one (which meets the outage) included. "Redis attempts"
 * counts what reached for the server in the window: connection attempts plus
 * EVALSHA/EVAL sent (hirate's from hirate_counters_get).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>

#include "bench_util.h"
#include "hirate_io.h"

#define CAPACITY 1000000000LL
#define RATE 1e6
#define NKEYS 10000
#define TIMEOUT_MS 100

static pid_t server_pid;
static volatile sig_atomic_t server_stopped;

/* Never leave the server stopped behind us. */
static void resume_server(void)
{
    if (server_stopped && server_pid > 0)
        kill(server_pid, SIGCONT);
}

static void on_signal(int sig)
{
    resume_server();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("bench_outage: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);   /* atexit: resume_server */
}

/* The state letter of /proc/PID/stat ('R', 'S', 'T', 'Z', ...); 0 when gone. */
static char proc_state(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

/* Waits until the server's state is one of `want` (0 in want: gone). */
static void await_state(const char *want, size_t nwant, const char *what)
{
    int64_t end = bench_now_ns() + 2000000000LL;
    for (;;) {
        char st = proc_state(server_pid);
        if (memchr(want, st, nwant))
            return;
        if (bench_now_ns() > end)
            fail("redis-server (pid %d) did not %s within 2 s (state %c)", (int)server_pid, what,
                 st ? st : '-');
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

typedef struct keyset {
    char key[NKEYS][16];
    size_t len[NKEYS];
    char full[NKEYS][24];   /* "rl:" + key, for the naive loop */
} keyset;

/* The naive client: reconnects whenever its connection is broken. */
typedef struct naive {
    redisContext *c;
    char host[256];
    int port;
    const char *sha;
    uint64_t connects, evalsha, ok;
} naive;

/* Whether a TCP connection is to itself: a connect to a port in the
 * ephemeral range, with nothing listening, can pick that very port as its
 * source and "succeed" (TCP simultaneous open). Its own request then comes
 * back as an array "reply", so such a loop would time an echo, not Redis. */
static int self_connected(int fd)
{
    struct sockaddr_storage a, b;
    socklen_t la = sizeof a, lb = sizeof b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    return getsockname(fd, (struct sockaddr *)&a, &la) == 0 &&
           getpeername(fd, (struct sockaddr *)&b, &lb) == 0 && la == lb && memcmp(&a, &b, la) == 0;
}

/* One naive decision; returns 1 when Redis answered it. */
static int naive_call(naive *nv, const char *fullkey)
{
    struct timeval tv = {0, TIMEOUT_MS * 1000};
    if (!nv->c || nv->c->err) {
        if (nv->c)
            redisFree(nv->c);
        nv->connects++;
        nv->c = redisConnectWithTimeout(nv->host, nv->port, tv);
        if (!nv->c)
            fail("out of memory");
        if (nv->c->err)
            return 0;
        if (self_connected(nv->c->fd))
            fail("the naive client connected to itself on port %d: run the server on a port "
                 "outside net.ipv4.ip_local_port_range", nv->port);
        redisSetTimeout(nv->c, tv);
    }
    nv->evalsha++;
    redisReply *r = redisCommand(nv->c, "EVALSHA %s 1 %s %s %s %s %s", nv->sha, fullkey,
                                 "1000000000", "1e+06", "1", "1");
    /* The script's reply: an array that begins with allowed (an integer). */
    int ok = r && r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
             r->element[0]->type == REDIS_REPLY_INTEGER;
    if (r)
        freeReplyObject(r);
    nv->ok += (uint64_t)ok;
    return ok;
}

typedef struct result {
    size_t n;
    double median, p99, max;
    size_t slow;              /* decisions that took 1 ms or more */
    size_t over20;            /* decisions over 20 µs (the target's bound) */
    uint64_t attempts;        /* connection attempts + script calls sent */
    uint64_t redis_decided;   /* decisions Redis itself made */
    uint64_t breaker_opens;
} result;

static void summarize(bench_samples *s, result *r)
{
    r->n = s->n;
    r->max = bench_max(s->v, s->n);
    r->slow = r->over20 = 0;
    for (size_t i = 0; i < s->n; i++) {
        r->slow += s->v[i] >= 1000;
        r->over20 += s->v[i] > 20;
    }
    r->median = bench_quantile(s->v, s->n, 0.5);
    r->p99 = bench_quantile(s->v, s->n, 0.99);
}

/* hirate for `seconds`, every decision timed. */
static void run_hirate(hirate_limiter *lim, const keyset *ks, size_t *pos, double seconds,
                       const char *label, result *r)
{
    bench_samples s = {0};
    hirate_counters st0, st1;
    hirate_counters_get(lim, &st0);
    bench_progress("outage: %s: hirate for %.1f s", label, seconds);
    uint64_t from_redis = 0;
    int64_t end = bench_now_ns() + (int64_t)(seconds * 1e9);
    for (;;) {
        size_t i = *pos;
        *pos = (*pos + 1) % NKEYS;
        hirate_decision d;
        int64_t t0 = bench_now_ns();
        int rc = hirate_allow(lim, ks->key[i], ks->len[i], 1, &d);
        int64_t t1 = bench_now_ns();
        if (rc < 0) {
            char msg[HIRATE_ERRMSG_SIZE];
            fail("hirate_allow during the outage: %s (%s)", hirate_err_name(rc),
                 hirate_limiter_errmsg(lim, msg, sizeof msg));
        }
        from_redis += d.source == HIRATE_SOURCE_REDIS;
        bench_samples_push(&s, (double)(t1 - t0) / 1e3);
        if (t1 >= end)
            break;
    }
    hirate_counters_get(lim, &st1);
    summarize(&s, r);
    r->attempts = (st1.connects - st0.connects) + (st1.evalsha - st0.evalsha) +
                  (st1.eval - st0.eval);
    r->redis_decided = from_redis;
    r->breaker_opens = st1.breaker_opens - st0.breaker_opens;
    bench_samples_free(&s);
}

/* The naive loop for `seconds` or `calls` decisions, whichever ends first. */
static void run_naive(naive *nv, const keyset *ks, size_t *pos, double seconds, size_t calls,
                      const char *label, result *r)
{
    bench_samples s = {0};
    uint64_t c0 = nv->connects, e0 = nv->evalsha, ok0 = nv->ok;
    if (calls == (size_t)-1)
        bench_progress("outage: %s: naive loop for %.1f s", label, seconds);
    else
        bench_progress("outage: %s: naive loop for %zu calls", label, calls);
    int64_t end = bench_now_ns() + (int64_t)(seconds * 1e9);
    while (s.n < calls) {
        size_t i = *pos;
        *pos = (*pos + 1) % NKEYS;
        int64_t t0 = bench_now_ns();
        naive_call(nv, ks->full[i]);
        int64_t t1 = bench_now_ns();
        bench_samples_push(&s, (double)(t1 - t0) / 1e3);
        if (t1 >= end)
            break;
    }
    summarize(&s, r);
    r->attempts = (nv->connects - c0) + (nv->evalsha - e0);
    r->redis_decided = nv->ok - ok0;
    r->breaker_opens = 0;
    bench_samples_free(&s);
}

/* Both clients against the live server until each has had a decision from
 * Redis, then for `seconds` more (connections made, keys hot). */
static void live(hirate_limiter *lim, naive *nv, const keyset *ks, size_t *pos, double seconds)
{
    int64_t give_up = bench_now_ns() + 15000000000LL;   /* the breaker may wait up to 5 s */
    int64_t until = 0;
    int hirate_ok = 0, naive_ok = 0;
    for (;;) {
        size_t i = *pos;
        *pos = (*pos + 1) % NKEYS;
        hirate_decision d;
        if (hirate_allow(lim, ks->key[i], ks->len[i], 1, &d) == 0 && d.source == HIRATE_SOURCE_REDIS)
            hirate_ok = 1;
        naive_ok |= naive_call(nv, ks->full[i]);
        int64_t now = bench_now_ns();
        if (hirate_ok && naive_ok && !until)
            until = now + (int64_t)(seconds * 1e9);
        if (until && now >= until)
            return;
        if (now > give_up)
            fail("the clients did not get back to Redis within 15 s (hirate %d, naive %d)",
                 hirate_ok, naive_ok);
        if (!hirate_ok || !naive_ok) {
            struct timespec ts = {0, 1000000};   /* recovering: do not spin */
            nanosleep(&ts, NULL);
        }
    }
}

/* Microseconds: two decimals below 100, whole ones with thin groups above. */
static const char *us(char *buf, size_t len, double v)
{
    if (v < 100)
        snprintf(buf, len, "%.2f", v);
    else
        bench_group(buf, len, v);
    return buf;
}

/* "once", "twice", "3 times" */
static const char *times(char *buf, size_t len, uint64_t n)
{
    if (n == 1)
        snprintf(buf, len, "once");
    else if (n == 2)
        snprintf(buf, len, "twice");
    else
        snprintf(buf, len, "%llu times", (unsigned long long)n);
    return buf;
}

static void print_row(const char *outage, const char *client, const result *r)
{
    char n[32], a[32], m[32], p[32], x[32];
    printf("| %s | %s | %s | %s | %s | %s | %s | %zu |\n", outage, client,
           bench_group(n, sizeof n, (double)r->n), bench_group(a, sizeof a, (double)r->attempts),
           us(m, sizeof m, r->median), us(p, sizeof p, r->p99), us(x, sizeof x, r->max), r->slow);
}

static void summary_result(const char *path, const char *tag, const result *r)
{
    char name[96];
    snprintf(name, sizeof name, "%s_n", tag);
    bench_summary(path, name, (double)r->n);
    snprintf(name, sizeof name, "%s_median_us", tag);
    bench_summary(path, name, r->median);
    snprintf(name, sizeof name, "%s_p99_us", tag);
    bench_summary(path, name, r->p99);
    snprintf(name, sizeof name, "%s_max_us", tag);
    bench_summary(path, name, r->max);
    snprintf(name, sizeof name, "%s_attempts", tag);
    bench_summary(path, name, (double)r->attempts);
    snprintf(name, sizeof name, "%s_slow", tag);
    bench_summary(path, name, (double)r->slow);
    snprintf(name, sizeof name, "%s_over20", tag);
    bench_summary(path, name, (double)r->over20);
}

int main(int argc, char **argv)
{
    const char *url = bench_opt(argc, argv, "--url", NULL);
    server_pid = (pid_t)bench_opt_num(argc, argv, "--pid", 0);
    double seconds = bench_opt_num(argc, argv, "--seconds", 1.5);
    size_t naive_stopped = (size_t)bench_opt_num(argc, argv, "--naive-stopped", 20);
    const char *summary = bench_opt(argc, argv, "--summary", NULL);
    if (!url || server_pid <= 0 || seconds <= 0 || naive_stopped < 1) {
        fprintf(stderr, "usage: bench_outage --url redis://HOST:PORT --pid PID [--seconds S] "
                        "[--naive-stopped N] [--summary FILE]\n");
        return 2;
    }
    if (proc_state(server_pid) == 0)
        fail("no process %d", (int)server_pid);
    atexit(resume_server);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    naive nv;
    memset(&nv, 0, sizeof nv);
    if (sscanf(url, "redis://%255[^:/]:%d", nv.host, &nv.port) != 2)
        fail("--url must be redis://HOST:PORT, got %s", url);
    nv.sha = hirate_script_sha1();

    /* The script loaded, as for every Redis benchmark here. */
    size_t slen;
    const char *src = hirate_script_source(&slen);
    redisContext *c = redisConnect(nv.host, nv.port);
    redisReply *r = c && !c->err ? redisCommand(c, "SCRIPT LOAD %b", src, slen) : NULL;
    if (!r || r->type != REDIS_REPLY_STRING || strcmp(r->str, nv.sha) != 0)
        fail("SCRIPT LOAD failed or named another SHA1");
    freeReplyObject(r);
    redisFree(c);

    keyset *ks = calloc(1, sizeof *ks);
    bench_keys keys;
    if (!ks || bench_keys_make(&keys, NKEYS, 42) < 0)
        fail("out of memory");
    for (size_t i = 0; i < NKEYS; i++) {
        memcpy(ks->key[i], keys.key[i], sizeof ks->key[i]);
        ks->len[i] = keys.len[i];
        snprintf(ks->full[i], sizeof ks->full[i], "rl:%s", keys.key[i]);
    }
    bench_keys_free(&keys);

    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.capacity = CAPACITY;
    o.rate = RATE;
    o.on_error = HIRATE_ON_ERROR_LOCAL;
    o.timeout_ms = TIMEOUT_MS;
    hirate_limiter *lim;
    char err[HIRATE_ERRMSG_SIZE];
    if (hirate_limiter_new(&lim, &o, err, sizeof err) < 0)
        fail("%s", err);

    size_t hpos = 0, npos = 0;
    result stopped_h, stopped_n, killed_h, killed_n;

    /* ---- stopped: connections stay up, nothing answers ---- */
    bench_progress("outage: warming up against the live server");
    live(lim, &nv, ks, &hpos, 0.3);
    npos = hpos;
    server_stopped = 1;
    if (kill(server_pid, SIGSTOP) < 0)
        fail("SIGSTOP %d: %s", (int)server_pid, strerror(errno));
    await_state("Tt", 2, "stop");
    run_hirate(lim, ks, &hpos, seconds, "stopped", &stopped_h);
    run_naive(&nv, ks, &npos, 1e9, naive_stopped, "stopped", &stopped_n);
    if (kill(server_pid, SIGCONT) < 0)
        fail("SIGCONT %d: %s", (int)server_pid, strerror(errno));
    await_state("RSD", 3, "resume");
    server_stopped = 0;

    /* ---- killed: the port refuses ---- */
    bench_progress("outage: back on the live server");
    live(lim, &nv, ks, &hpos, 0.3);
    npos = hpos;
    if (kill(server_pid, SIGKILL) < 0)
        fail("SIGKILL %d: %s", (int)server_pid, strerror(errno));
    await_state("ZX\0", 3, "die");
    run_hirate(lim, ks, &hpos, seconds, "killed", &killed_h);
    run_naive(&nv, ks, &npos, seconds, (size_t)-1, "killed", &killed_n);
    bench_progress_done();

    if (stopped_h.redis_decided || killed_h.redis_decided)
        fail("Redis decided %llu calls while it was down",
             (unsigned long long)(stopped_h.redis_decided + killed_h.redis_decided));

    printf("### Outage: decision latency while Redis is down\n\n");
    printf("One thread, one call at a time over 10,000 keys, every decision timed, from the "
           "moment the outage took effect. `hirate_allow` has `on_error` local, `timeout_ms` %d "
           "and the default backoff (%d ms doubling to %d s); the naive loop is plain hiredis "
           "that reconnects whenever its connection is broken and sends the EVALSHA on every "
           "call, with %d ms connect and command timeouts, and decides at once when the attempt "
           "fails. Stopped: `SIGSTOP` (connections and new connects still succeed, nothing "
           "answers); hirate for %.1f s, the naive loop for %zu calls, since each waits out "
           "its timeout. Killed: `SIGKILL` (connections refused); each for %.1f s. \"Redis "
           "attempts\": connection attempts plus script calls sent in the window; \"≥ 1 ms\": "
           "decisions that took a millisecond or more.\n\n",
           TIMEOUT_MS, 100, 5, TIMEOUT_MS, seconds, naive_stopped, seconds);
    printf("| outage | client | decisions | Redis attempts | median µs | p99 µs | max µs | ≥ 1 ms |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
    print_row("killed (connection refused)", "naive: reconnect + EVALSHA every call", &killed_n);
    print_row("killed (connection refused)", "`hirate_allow` with the breaker", &killed_h);
    print_row("stopped (`SIGSTOP`), 100 ms timeout", "naive: reconnect + EVALSHA every call",
              &stopped_n);
    print_row("stopped (`SIGSTOP`), 100 ms timeout", "`hirate_allow` with the breaker", &stopped_h);
    char ko[32], so[32];
    printf("\nWhile Redis was down hirate's local fallback made every decision (none came from "
           "Redis). The breaker opened %s in the killed outage and %s in the stopped "
           "one; hirate's Redis attempts are the call that met the outage and the breaker's "
           "probes after each backoff (a connect, and when it succeeds the script call): against "
           "the killed server each fails at once, against the stopped one each waits out the "
           "%d ms timeout, and those are hirate's decisions of 1 ms or more.\n\n",
           times(ko, sizeof ko, killed_h.breaker_opens), times(so, sizeof so, stopped_h.breaker_opens),
           TIMEOUT_MS);

    summary_result(summary, "outage_killed_hirate", &killed_h);
    summary_result(summary, "outage_killed_naive", &killed_n);
    summary_result(summary, "outage_stopped_hirate", &stopped_h);
    summary_result(summary, "outage_stopped_naive", &stopped_n);

    hirate_limiter_free(lim);
    if (nv.c)
        redisFree(nv.c);
    free(ks);
    return 0;
}
