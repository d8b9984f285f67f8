/*
 * FCALL against EVALSHA against EVAL: the same token-bucket decision, the
 * same redis-server, the same keys; one run of one way per invocation.
 *
 *   bench_functions --url redis://127.0.0.1:PORT --mode MODE [--depth 1|N]
 *       [--seconds S] [--warmup W] [--keys K] [--seed X]
 *
 * MODE is one of
 *   fcall           hiredis, FCALL <hirate_function_name()> 1 key ... of
 *                   hirate_function_library(), FUNCTION LOADed first
 *   evalsha         hiredis, EVALSHA <hirate_script_sha1()> 1 key ...,
 *                   SCRIPT LOADed first
 *   eval            hiredis, EVAL <the whole script> 1 key ...: the script's
 *                   text travels with every call and Redis hashes it each time
 *   hirate          hirate_allow (depth 1) or hirate_allow_many of depth items
 *                   (depth > 1), options.functions = 1: FCALL
 *   hirate-evalsha  the same with options.functions = 0: EVALSHA
 * --depth N > 1 sends N calls at once: hiredis appends N commands and then
 * reads N replies (one write, one pipeline on one connection), hirate sends
 * a batch of N through hirate_allow_many. Every call is allowed and writes
 * its bucket (capacity 1e9, rate 1e6/s) on K keys (default 10,000) drawn
 * uniformly, so every way does the same reads and writes.
 *
 * W seconds of warm-up (connections, the library or script loaded, hirate
 * finding that FCALL works), then CONFIG RESETSTAT, then S seconds measured,
 * then INFO commandstats: the server's own calls and microseconds of FCALL,
 * EVALSHA and EVAL over exactly the measured seconds (server_us_per_call is
 * that of the one of them the server ran most) (the statistics
 * connection sends only CONFIG and INFO, which are counted apart). Prints
 * one JSON object on one line (the fields of bench/peers/README.md's speed
 * mode, plus the commandstats), exit 0; a failed call ends the run with
 * exit 1 and a message on stderr.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <hiredis/hiredis.h>

#include "bench_util.h"
#include "hirate.h"
#include "hirate_io.h"

#define CAPACITY "1000000000"
#define RATE "1000000"
#define MAX_DEPTH 256

enum mode { FCALL, EVALSHA, EVAL, HIRATE, HIRATE_EVALSHA };

static const char *const mode_names[] = {"fcall", "evalsha", "eval", "hirate", "hirate-evalsha"};

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("bench_functions: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static redisReply *command(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (!r)
        die("redis: %s", c->errstr);
    return r;
}

typedef struct stat {
    long long calls, usec;
    double usec_per_call;
    long long failed;
} stat;

/* cmdstat_<name>:calls=N,usec=N,usec_per_call=X,... of an INFO commandstats text. */
static stat stat_of(const char *info, const char *name)
{
    stat s = {0, 0, 0, 0};
    char head[64];
    int hl = snprintf(head, sizeof head, "cmdstat_%s:", name);
    for (const char *p = info; (p = strstr(p, head)) != NULL; p += hl) {
        if (p != info && p[-1] != '\n')
            continue;
        const char *q = p + hl, *v;
        if ((v = strstr(q, "calls=")) != NULL)
            s.calls = strtoll(v + 6, NULL, 10);
        if ((v = strstr(q, "usec=")) != NULL)
            s.usec = strtoll(v + 5, NULL, 10);
        if ((v = strstr(q, "usec_per_call=")) != NULL)
            s.usec_per_call = strtod(v + 14, NULL);
        if ((v = strstr(q, "failed_calls=")) != NULL)
            s.failed = strtoll(v + 13, NULL, 10);
        break;
    }
    return s;
}

typedef struct run {
    enum mode mode;
    int depth;
    redisContext *c;
    hirate_limiter *lim;
    bench_keys keys;
    char (*full)[24]; /* "rl:" + key: what hirate's prefix makes */
    size_t *full_len;
    uint64_t rng;
    const char *script, *fname;
    size_t script_len;
    long long allowed, decisions;
} run;

static void check_reply(redisReply *r, redisContext *c, run *x)
{
    if (!r)
        die("redis: %s", c->errstr);
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_INTEGER)
        die("unexpected reply (type %d): %s", r->type,
            r->type == REDIS_REPLY_ERROR ? r->str : "");
    x->allowed += r->element[0]->integer == 1;
    x->decisions++;
    freeReplyObject(r);
}

/* One call of depth decisions. */
static void once(run *x)
{
    size_t pick[MAX_DEPTH];
    for (int i = 0; i < x->depth; i++)
        pick[i] = (size_t)(bench_rand(&x->rng) % x->keys.n);
    if (x->mode == HIRATE || x->mode == HIRATE_EVALSHA) {
        if (x->depth == 1) {
            hirate_decision d;
            size_t k = pick[0];
            int rc = hirate_allow(x->lim, x->keys.key[k], x->keys.len[k], 1, &d);
            if (rc < 0 || d.source != HIRATE_SOURCE_REDIS) {
                char msg[256];
                die("hirate_allow: %s (source %s): %s", hirate_err_name(rc ? rc : d.error),
                    hirate_source_name(d.source), hirate_limiter_errmsg(x->lim, msg, sizeof msg));
            }
            x->allowed += d.allowed;
            x->decisions++;
            return;
        }
        hirate_item it[MAX_DEPTH];
        for (int i = 0; i < x->depth; i++)
            it[i] = (hirate_item){.key = x->keys.key[pick[i]], .keylen = x->keys.len[pick[i]],
                                  .cost = 1};
        if (hirate_allow_many(x->lim, it, (size_t)x->depth) < 0)
            die("hirate_allow_many failed");
        for (int i = 0; i < x->depth; i++) {
            if (it[i].rc < 0 || it[i].decision.source != HIRATE_SOURCE_REDIS) {
                char msg[256];
                die("hirate_allow_many: item %d: %s (source %s): %s", i,
                    hirate_err_name(it[i].rc ? it[i].rc : it[i].decision.error),
                    hirate_source_name(it[i].decision.source),
                    hirate_limiter_errmsg(x->lim, msg, sizeof msg));
            }
            x->allowed += it[i].decision.allowed;
            x->decisions++;
        }
        return;
    }
    const char *argv[8];
    size_t lens[8];
    switch (x->mode) {
    case FCALL:
        argv[0] = "FCALL", argv[1] = x->fname;
        break;
    case EVALSHA:
        argv[0] = "EVALSHA", argv[1] = hirate_script_sha1();
        break;
    default:
        argv[0] = "EVAL", argv[1] = x->script;
        break;
    }
    lens[0] = strlen(argv[0]);
    lens[1] = x->mode == EVAL ? x->script_len : strlen(argv[1]);
    argv[2] = "1", lens[2] = 1;
    argv[4] = CAPACITY, lens[4] = sizeof CAPACITY - 1;
    argv[5] = RATE, lens[5] = sizeof RATE - 1;
    argv[6] = "1", lens[6] = 1;
    argv[7] = "1", lens[7] = 1;
    for (int i = 0; i < x->depth; i++) {
        argv[3] = x->full[pick[i]], lens[3] = x->full_len[pick[i]];
        if (x->depth == 1) {
            check_reply(redisCommandArgv(x->c, 8, argv, lens), x->c, x);
            return;
        }
        if (redisAppendCommandArgv(x->c, 8, argv, lens) != REDIS_OK)
            die("redis: %s", x->c->errstr);
    }
    for (int i = 0; i < x->depth; i++) {
        void *r = NULL;
        if (redisGetReply(x->c, &r) != REDIS_OK)
            die("redis: %s", x->c->errstr);
        check_reply(r, x->c, x);
    }
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static void json_stat(const char *name, stat s, int last)
{
    printf("\"%s\": {\"calls\": %lld, \"usec\": %lld, \"usec_per_call\": %.3f, "
           "\"failed_calls\": %lld}%s",
           name, s.calls, s.usec, s.usec_per_call, s.failed, last ? "" : ", ");
}

int main(int argc, char **argv)
{
    const char *url = bench_opt(argc, argv, "--url", NULL);
    const char *m = bench_opt(argc, argv, "--mode", NULL);
    double seconds = bench_opt_num(argc, argv, "--seconds", 1);
    double warmup = bench_opt_num(argc, argv, "--warmup", 0.3);
    size_t nkeys = (size_t)bench_opt_num(argc, argv, "--keys", 10000);
    int port = 0;
    if (!url || !m || sscanf(url, "redis://127.0.0.1:%d", &port) != 1) {
        fprintf(stderr, "usage: bench_functions --url redis://127.0.0.1:PORT --mode "
                        "fcall|evalsha|eval|hirate|hirate-evalsha [--depth N] [--seconds S] "
                        "[--warmup W] [--keys K] [--seed X]\n");
        return 2;
    }
    run x = {.depth = (int)bench_opt_num(argc, argv, "--depth", 1),
             .rng = (uint64_t)bench_opt_num(argc, argv, "--seed", 1)};
    int found = 0;
    for (int i = 0; i < 5; i++)
        if (strcmp(m, mode_names[i]) == 0)
            x.mode = (enum mode)i, found = 1;
    if (!found || x.depth < 1 || x.depth > MAX_DEPTH || nkeys < 1) {
        fprintf(stderr, "bench_functions: bad --mode, --depth (1..%d) or --keys\n", MAX_DEPTH);
        return 2;
    }
    if (bench_keys_make(&x.keys, nkeys, 42) < 0)
        die("out of memory for keys");
    x.full = calloc(nkeys, sizeof *x.full);
    x.full_len = calloc(nkeys, sizeof *x.full_len);
    if (!x.full || !x.full_len)
        die("out of memory for keys");
    for (size_t i = 0; i < nkeys; i++)
        x.full_len[i] = (size_t)snprintf(x.full[i], sizeof x.full[i], "rl:%s", x.keys.key[i]);
    x.script = hirate_script_source(&x.script_len);
    x.fname = hirate_function_name();

    struct timeval tv = {5, 0};
    redisContext *stats = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!stats || stats->err)
        die("connect to 127.0.0.1:%d: %s", port, stats ? stats->errstr : "out of memory");
    if (x.mode == FCALL) {
        size_t liblen;
        const char *lib = hirate_function_library(&liblen);
        redisReply *r = command(stats, "FUNCTION LOAD %b", lib, liblen);
        /* Loaded by an earlier run (or by hirate itself): the same text, the same name. */
        if (r->type == REDIS_REPLY_ERROR && !strstr(r->str, "already exists"))
            die("FUNCTION LOAD: %s", r->str);
        freeReplyObject(r);
    } else if (x.mode == EVALSHA) {
        redisReply *r = command(stats, "SCRIPT LOAD %b", x.script, x.script_len);
        if (r->type != REDIS_REPLY_STRING || strcmp(r->str, hirate_script_sha1()) != 0)
            die("SCRIPT LOAD did not name the script's SHA1");
        freeReplyObject(r);
    }
    if (x.mode == HIRATE || x.mode == HIRATE_EVALSHA) {
        hirate_options o;
        hirate_options_init(&o);
        o.url = url;
        o.capacity = 1000000000;
        o.rate = 1e6;
        o.functions = x.mode == HIRATE;
        char err[256];
        if (hirate_limiter_new(&x.lim, &o, err, sizeof err) < 0)
            die("hirate_limiter_new: %s", err);
    } else {
        x.c = redisConnectWithTimeout("127.0.0.1", port, tv);
        if (!x.c || x.c->err)
            die("connect to 127.0.0.1:%d: %s", port, x.c ? x.c->errstr : "out of memory");
    }

    int64_t end = bench_now_ns() + (int64_t)(warmup * 1e9);
    do
        once(&x);
    while (bench_now_ns() < end);
    freeReplyObject(command(stats, "CONFIG RESETSTAT"));

    bench_samples lat = {0};
    x.allowed = x.decisions = 0;
    double cpu0 = cpu_seconds();
    int64_t t0 = bench_now_ns(), t = t0;
    end = t0 + (int64_t)(seconds * 1e9);
    while (t < end) {
        once(&x);
        int64_t t1 = bench_now_ns();
        bench_samples_push(&lat, (double)(t1 - t) / 1e3);
        t = t1;
    }
    double wall = (double)(t - t0) / 1e9, cpu = cpu_seconds() - cpu0;

    redisReply *info = command(stats, "INFO commandstats");
    if (info->type != REDIS_REPLY_STRING && info->type != REDIS_REPLY_STATUS)
        die("INFO commandstats: unexpected reply");
    stat fc = stat_of(info->str, "fcall"), es = stat_of(info->str, "evalsha"),
         ev = stat_of(info->str, "eval"), fl = stat_of(info->str, "function|load"),
         sl = stat_of(info->str, "script|load");
    freeReplyObject(info);
    /* The command the decisions were: the one the server ran most (hirate's
     * is its own choice; functions = 1 is FCALL only where FCALL works). */
    const char *cmd = "fcall";
    stat own = fc;
    if (es.calls > own.calls)
        cmd = "evalsha", own = es;
    if (ev.calls > own.calls)
        cmd = "eval", own = ev;

    double p50 = bench_quantile(lat.v, lat.n, 0.5), p99 = bench_quantile(lat.v, lat.n, 0.99);
    printf("{\"mode\": \"%s\", \"depth\": %d, \"keys\": %zu, \"decisions\": %lld, "
           "\"allowed\": %lld, \"errors\": 0, \"error\": null, \"calls\": %zu, "
           "\"p50_us\": %.3f, \"p99_us\": %.3f, \"cpu_s\": %.6f, \"wall_s\": %.6f, "
           "\"command\": \"%s\", \"server_us_per_call\": %.3f, \"script_bytes\": %zu, "
           "\"commandstats\": {",
           mode_names[x.mode], x.depth, nkeys, x.decisions, x.allowed, lat.n, p50, p99, cpu,
           wall, cmd, own.usec_per_call, x.script_len);
    json_stat("fcall", fc, 0);
    json_stat("evalsha", es, 0);
    json_stat("eval", ev, 0);
    json_stat("function|load", fl, 0);
    json_stat("script|load", sl, 1);
    printf("}");
    if (x.lim) {
        /* The whole run's, warm-up included: did hirate load the library? */
        hirate_counters k;
        hirate_counters_get(x.lim, &k);
        printf(", \"hirate_counters\": {\"fcall\": %" PRIu64 ", \"function_loads\": %" PRIu64
               ", \"evalsha\": %" PRIu64 ", \"eval\": %" PRIu64 "}",
               k.fcall, k.function_loads, k.evalsha, k.eval);
    }
    printf("}\n");

    bench_samples_free(&lat);
    hirate_limiter_free(x.lim);
    if (x.c)
        redisFree(x.c);
    redisFree(stats);
    bench_keys_free(&x.keys);
    free(x.full);
    free(x.full_len);
    return 0;
}
