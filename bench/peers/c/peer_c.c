/*
 * The C contenders of the side-by-side benchmark, behind the harness protocol
 * of bench/peers/README.md (bench/suite/suite.py drives them):
 *
 *   peer_c speed|atomic|outage|fill --impl IMPL --url redis://HOST:PORT [...]
 *   peer_c ... --impl hirate --url rediss://HOST:PORT --tls-ca-file ca.crt   (TLS)
 *   peer_c ... --impl hirate|hirate-batch --url redis+cluster://HOST:PORT,...  (Redis Cluster)
 *
 *   hiredis         the floor for any client: plain hiredis, one connection
 *                   per thread, redisCommandArgv of EVALSHA with hirate's own
 *                   script (EVAL once after NOSCRIPT), the reply's first
 *                   element read as the decision
 *   hirate          hirate_allow, one limiter shared by every thread
 *   hirate-batch    hirate_allow_many, 16 decisions a call (--batch N: N), as
 *                   redis-benchmark -P 16 pipelines 16 calls
 *   hirate-nocache  hirate_allow with the deny cache off: every decision is a
 *                   round trip, as for the other clients
 *
 * --limits "10/second; 1000/day" (the hirate clients): a limiter of several
 * limits on one key (hirate_options.limits, one band each) instead of
 * --capacity and --rate; hirate and hirate-nocache then decide with
 * hirate_allow_bands, which also gives each band's own figures (what a web
 * integration's headers need), all in the one call.
 *
 * Every client has a 250 ms connect timeout and a --timeout-ms command
 * timeout (100 by default), hirate's defaults. Over TLS (rediss://, the
 * hirate clients only: Debian's hiredis 0.14 has no TLS) --tls-ca-file is the
 * CA the server's certificate is verified against, hirate's tls_ca_file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "../../bench_util.h"
#include "hirate.h"
#include "hirate_io.h"

/* Decisions per hirate_allow_many call of hirate-batch at most (--batch). */
#define BATCH_MAX 256
#define KEY_FMT "user:%06ld"
#define KEY_SIZE 16
/* --key at most; with "-warmup" appended it stays a valid hirate key. */
#define ARG_KEY_MAX 500
/* Samples a worker keeps before it starts keeping every 2nd, 4th, ... call. */
#define LAT_CAP (1u << 18)

enum impl { IMPL_HIREDIS, IMPL_HIRATE, IMPL_BATCH, IMPL_NOCACHE };

typedef struct config {
    const char *mode, *url, *key;
    const char *tls_ca_file;    /* NULL: plain TCP */
    const char *limits;         /* --limits: several limits; NULL: capacity, rate */
    enum impl impl;
    char host[256];
    int port;
    long keys;
    int concurrency, requests, calls, timeout_ms, batch;
    double seconds, warmup, rate;
    int64_t capacity;
    char capacity_s[32], rate_s[32];
    uint64_t seed;
} config;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("peer_c: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

/* ---- latency samples, decimated as they grow (see bench/peers/README.md) ---- */

typedef struct lat {
    int64_t *v;
    size_t n;
    uint64_t stride, tick;
} lat;

static void lat_add(lat *l, int64_t ns)
{
    if (++l->tick < l->stride)
        return;
    l->tick = 0;
    if (!l->v && !(l->v = malloc(LAT_CAP * sizeof *l->v)))
        die("out of memory for latency samples");
    if (l->n == LAT_CAP) {
        for (size_t i = 0; i < LAT_CAP / 2; i++)
            l->v[i] = l->v[2 * i + 1];
        l->n = LAT_CAP / 2;
        l->stride *= 2;
    }
    l->v[l->n++] = ns;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Merges the workers' samples at the largest stride among them, so that each
 * kept sample stands for the same number of calls, then takes p50 and p99. */
static void lat_quantiles(lat *ls, int n, double *p50_us, double *p99_us)
{
    uint64_t stride = 1;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (ls[i].stride > stride)
            stride = ls[i].stride;
    int64_t *all = malloc((size_t)n * LAT_CAP * sizeof *all);
    if (!all)
        die("out of memory for latency samples");
    for (int i = 0; i < n; i++) {
        uint64_t step = stride / ls[i].stride;
        for (size_t j = step - 1; j < ls[i].n; j += step)
            all[total++] = ls[i].v[j];
    }
    *p50_us = *p99_us = 0;
    if (total) {
        qsort(all, total, sizeof *all, cmp_i64);
        *p50_us = (double)all[(size_t)(0.50 * (double)total)] / 1e3;
        size_t i99 = (size_t)(0.99 * (double)total);
        *p99_us = (double)all[i99 < total ? i99 : total - 1] / 1e3;
    }
    free(all);
}

/* ---- one client of each kind ---------------------------------------------------- */

typedef struct worker {
    const config *cfg;
    hirate_limiter *lim;        /* hirate*: shared */
    redisContext *rc;           /* hiredis: this worker's own */
    int loaded;                 /* hiredis: EVAL sent after a NOSCRIPT */
    uint64_t rng;
    lat lat;
    uint64_t decisions, allowed, errors;
    uint64_t calls;             /* every decision that returned, warm-up and
                                   the calls after the window included */
    char error[200];            /* the first failure's message */
    int sources[8];
    pthread_t thread;
    int index;
} worker;

static void note_error(worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_error(worker *w, const char *fmt, ...)
{
    if (w->error[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->error, sizeof w->error, fmt, ap);
    va_end(ap);
}

static hirate_limiter *make_limiter(const config *c, int64_t capacity, double rate)
{
    hirate_options o;
    hirate_options_init(&o);
    o.url = c->url;
    if (c->limits) {
        o.limits = c->limits;
    } else {
        o.capacity = capacity;
        o.rate = rate;
    }
    o.timeout_ms = c->timeout_ms;
    o.deny_cache = c->impl != IMPL_NOCACHE;
    o.tls_ca_file = c->tls_ca_file;
    hirate_limiter *lim;
    char why[HIRATE_ERRMSG_SIZE];
    if (hirate_limiter_new(&lim, &o, why, sizeof why) < 0)
        die("hirate_limiter_new: %s", why);
    return lim;
}

static int hiredis_connect(worker *w)
{
    const config *c = w->cfg;
    struct timeval ct = {0, 250000}, tv = {c->timeout_ms / 1000, (c->timeout_ms % 1000) * 1000};
    if (w->rc)
        redisFree(w->rc);
    w->rc = redisConnectWithTimeout(c->host, c->port, ct);
    if (!w->rc)
        die("out of memory");
    if (w->rc->err) {
        note_error(w, "connect: %s", w->rc->errstr);
        redisFree(w->rc);
        w->rc = NULL;
        return -1;
    }
    redisSetTimeout(w->rc, tv);
    return 0;
}

/* One plain EVALSHA (EVAL after NOSCRIPT); 1 allowed, 0 refused, -1 failed. */
static int hiredis_decide(worker *w, const char *key, size_t keylen, const char *capacity,
                          const char *rate)
{
    char full[3 + HIRATE_KEY_MAX];
    if (keylen > HIRATE_KEY_MAX) {
        note_error(w, "key over %d bytes", HIRATE_KEY_MAX);
        return -1;
    }
    memcpy(full, "rl:", 3);
    memcpy(full + 3, key, keylen);
    size_t source_len;
    const char *source = hirate_script_source(&source_len);
    if (!w->rc && hiredis_connect(w) < 0)
        return -1;
    for (int attempt = 0; attempt < 2; attempt++) {
        int eval = attempt > 0;
        const char *argv[] = {eval ? "EVAL" : "EVALSHA", eval ? source : hirate_script_sha1(),
                              "1", full, capacity, rate, "1", "1"};
        size_t argvlen[] = {eval ? 4 : 7, eval ? source_len : 40, 1, 3 + keylen,
                            strlen(capacity), strlen(rate), 1, 1};
        redisReply *r = redisCommandArgv(w->rc, 8, argv, argvlen);
        if (!r) {
            note_error(w, "%s", w->rc->errstr);
            redisFree(w->rc);   /* a context that failed cannot be used again */
            w->rc = NULL;
            return -1;
        }
        if (r->type == REDIS_REPLY_ERROR && !eval && strncmp(r->str, "NOSCRIPT", 8) == 0) {
            freeReplyObject(r);
            continue;
        }
        int out = -1;
        if (r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
            r->element[0]->type == REDIS_REPLY_INTEGER)
            out = r->element[0]->integer == 1;
        else
            note_error(w, "%s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
        freeReplyObject(r);
        return out;
    }
    note_error(w, "NOSCRIPT after EVAL");
    return -1;
}

static int hirate_decide(worker *w, const char *key, size_t keylen)
{
    hirate_decision d;
    hirate_decision bands[HIRATE_BANDS_MAX];
    int rc = w->cfg->limits ? hirate_allow_bands(w->lim, key, keylen, 1, &d, bands,
                                                 HIRATE_BANDS_MAX)
                            : hirate_allow(w->lim, key, keylen, 1, &d);
    if (rc < 0) {
        char msg[HIRATE_ERRMSG_SIZE];
        note_error(w, "%s: %s", hirate_err_name(rc), hirate_limiter_errmsg(w->lim, msg, sizeof msg));
        return -1;
    }
    if (d.source > 0 && d.source < 8)
        w->sources[d.source]++;
    return d.allowed;
}

/* One decision of this worker's kind: 1 allowed, 0 refused, -1 failed. */
static int decide(worker *w, const char *key, size_t keylen, const char *capacity, const char *rate)
{
    if (w->cfg->impl == IMPL_HIREDIS)
        return hiredis_decide(w, key, keylen, capacity, rate);
    if (w->cfg->impl == IMPL_BATCH) {
        hirate_item it = {.key = key, .keylen = keylen, .cost = 1};
        if (hirate_allow_many(w->lim, &it, 1) < 0 || it.rc < 0) {
            char msg[HIRATE_ERRMSG_SIZE];
            note_error(w, "%s: %s", hirate_err_name(it.rc),
                       hirate_limiter_errmsg(w->lim, msg, sizeof msg));
            return -1;
        }
        if (it.decision.source > 0 && it.decision.source < 8)
            w->sources[it.decision.source]++;
        return it.decision.allowed;
    }
    return hirate_decide(w, key, keylen);
}

/* ---- speed --------------------------------------------------------------------- */

enum { PHASE_WARM, PHASE_MEASURE, PHASE_STOP };
static _Atomic int phase;
static char (*keytab)[KEY_SIZE];
static size_t *keylen;

static void make_keys(long n)
{
    keytab = calloc((size_t)n, sizeof *keytab);
    keylen = calloc((size_t)n, sizeof *keylen);
    if (!keytab || !keylen)
        die("out of memory for %ld keys", n);
    for (long i = 0; i < n; i++)
        keylen[i] = (size_t)snprintf(keytab[i], KEY_SIZE, KEY_FMT, i);
}

static void *speed_worker(void *arg)
{
    worker *w = arg;
    const config *c = w->cfg;
    uint64_t n = (uint64_t)c->keys;
    for (;;) {
        int ph = atomic_load_explicit(&phase, memory_order_relaxed);
        if (ph == PHASE_STOP)
            break;
        int64_t t0 = bench_now_ns();
        uint64_t done = 0, allowed = 0, failed = 0;
        if (c->impl == IMPL_BATCH) {
            hirate_item items[BATCH_MAX];
            size_t nb = (size_t)c->batch;
            for (size_t i = 0; i < nb; i++) {
                uint64_t k = bench_rand(&w->rng) % n;
                items[i] = (hirate_item){.key = keytab[k], .keylen = keylen[k], .cost = 1};
            }
            if (hirate_allow_many(w->lim, items, nb) < 0)
                die("hirate_allow_many: invalid arguments");
            for (size_t i = 0; i < nb; i++) {
                if (items[i].rc < 0) {
                    char msg[HIRATE_ERRMSG_SIZE];
                    if (ph == PHASE_MEASURE)
                        note_error(w, "%s: %s", hirate_err_name(items[i].rc),
                                   hirate_limiter_errmsg(w->lim, msg, sizeof msg));
                    continue;
                }
                done++;
                allowed += (uint64_t)items[i].decision.allowed;
            }
        } else {
            uint64_t k = bench_rand(&w->rng) % n;
            int r = decide(w, keytab[k], keylen[k], c->capacity_s, c->rate_s);
            done = r >= 0;
            allowed = r == 1;
            failed = r < 0;
        }
        int64_t t1 = bench_now_ns();
        w->calls += c->impl == IMPL_BATCH ? (uint64_t)c->batch : 1;
        /* Only calls that end inside the measured window count. */
        if (atomic_load_explicit(&phase, memory_order_relaxed) != PHASE_MEASURE)
            continue;
        if (ph != PHASE_MEASURE && !w->errors)
            w->error[0] = '\0';   /* a failure of the warm-up is not data */
        w->errors += failed;
        w->decisions += done;
        w->allowed += allowed;
        if (done)
            lat_add(&w->lat, t1 - t0);
    }
    return NULL;
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static void json_string(const char *s)
{
    if (!s || !*s) {
        fputs("null", stdout);
        return;
    }
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

static const char *first_error(worker *ws, int n)
{
    for (int i = 0; i < n; i++)
        if (ws[i].error[0])
            return ws[i].error;
    return NULL;
}

static worker *make_workers(const config *c, int n, hirate_limiter *lim)
{
    worker *ws = calloc((size_t)n, sizeof *ws);
    if (!ws)
        die("out of memory");
    for (int i = 0; i < n; i++) {
        ws[i].cfg = c;
        ws[i].lim = lim;
        ws[i].index = i;
        ws[i].rng = c->seed * 0x9e3779b97f4a7c15ull + (uint64_t)i + 1;
        ws[i].lat.stride = 1;
    }
    return ws;
}

static void run_speed(const config *c)
{
    make_keys(c->keys);
    hirate_limiter *lim = c->impl == IMPL_HIREDIS ? NULL : make_limiter(c, c->capacity, c->rate);
    worker *ws = make_workers(c, c->concurrency, lim);
    atomic_store(&phase, PHASE_WARM);
    for (int i = 0; i < c->concurrency; i++)
        if (pthread_create(&ws[i].thread, NULL, speed_worker, &ws[i]) != 0)
            die("pthread_create failed");
    sleep_s(c->warmup);
    double cpu0 = cpu_seconds();
    int64_t t0 = bench_now_ns();
    atomic_store(&phase, PHASE_MEASURE);
    sleep_s(c->seconds);
    atomic_store(&phase, PHASE_STOP);
    int64_t t1 = bench_now_ns();
    double cpu1 = cpu_seconds();
    uint64_t decisions = 0, allowed = 0, errors = 0, calls = 0;
    lat *ls = calloc((size_t)c->concurrency, sizeof *ls);
    for (int i = 0; i < c->concurrency; i++) {
        pthread_join(ws[i].thread, NULL);
        decisions += ws[i].decisions;
        allowed += ws[i].allowed;
        errors += ws[i].errors;
        calls += ws[i].calls;
        ls[i] = ws[i].lat;
    }
    double p50, p99;
    lat_quantiles(ls, c->concurrency, &p50, &p99);
    printf("{\"decisions\": %llu, \"allowed\": %llu, \"errors\": %llu, \"p50_us\": %.3f, "
           "\"p99_us\": %.3f, \"cpu_s\": %.6f, \"wall_s\": %.6f, \"error\": ",
           (unsigned long long)decisions, (unsigned long long)allowed,
           (unsigned long long)errors, p50, p99, cpu1 - cpu0, (double)(t1 - t0) / 1e9);
    json_string(first_error(ws, c->concurrency));
    printf(", \"calls_total\": %llu", (unsigned long long)calls);
    if (lim) {
        /* hirate's own count of what it sent, the whole run's. */
        hirate_counters k;
        hirate_counters_get(lim, &k);
        printf(", \"nbands\": %zu, \"hirate_counters\": {\"fcall\": %llu, \"evalsha\": %llu, "
               "\"eval\": %llu, \"cache_hits\": %llu}",
               hirate_limiter_nbands(lim), (unsigned long long)k.fcall,
               (unsigned long long)k.evalsha, (unsigned long long)k.eval,
               (unsigned long long)k.cache_hits);
    }
    puts("}");
    for (int i = 0; i < c->concurrency; i++) {
        free(ws[i].lat.v);
        if (ws[i].rc)
            redisFree(ws[i].rc);
    }
    free(ls);
    free(ws);
    hirate_limiter_free(lim);
}

/* ---- atomic: many decisions on one fresh key at once ------------------------------- */

static pthread_barrier_t barrier;
static int atomic_result[1024];

static void *atomic_worker(void *arg)
{
    worker *w = arg;
    const config *c = w->cfg;
    /* hiredis: each thread's connection is open before the release. */
    if (c->impl == IMPL_HIREDIS && hiredis_connect(w) < 0) {
        pthread_barrier_wait(&barrier);
        atomic_result[w->index] = -1;
        return NULL;
    }
    pthread_barrier_wait(&barrier);
    atomic_result[w->index] = decide(w, c->key, strlen(c->key), c->capacity_s, c->rate_s);
    return NULL;
}

static void run_atomic(const config *c)
{
    if (c->requests < 1 || c->requests > 1024)
        die("--requests must be from 1 to 1024");
    hirate_limiter *lim = c->impl == IMPL_HIREDIS ? NULL : make_limiter(c, c->capacity, c->rate);
    worker *ws = make_workers(c, c->requests, lim);
    pthread_barrier_init(&barrier, NULL, (unsigned)c->requests);
    for (int i = 0; i < c->requests; i++)
        if (pthread_create(&ws[i].thread, NULL, atomic_worker, &ws[i]) != 0)
            die("pthread_create failed");
    int admitted = 0, refused = 0, errors = 0;
    for (int i = 0; i < c->requests; i++) {
        pthread_join(ws[i].thread, NULL);
        admitted += atomic_result[i] == 1;
        refused += atomic_result[i] == 0;
        errors += atomic_result[i] < 0;
    }
    printf("{\"requests\": %d, \"admitted\": %d, \"refused\": %d, \"errors\": %d, \"error\": ",
           c->requests, admitted, refused, errors);
    json_string(first_error(ws, c->requests));
    puts("}");
    for (int i = 0; i < c->requests; i++)
        if (ws[i].rc)
            redisFree(ws[i].rc);
    pthread_barrier_destroy(&barrier);
    free(ws);
    hirate_limiter_free(lim);
}

/* ---- outage: decisions while the driver holds Redis stopped ------------------------ */

static void run_outage(const config *c)
{
    hirate_limiter *lim = c->impl == IMPL_HIREDIS ? NULL : make_limiter(c, c->capacity, c->rate);
    worker *w = make_workers(c, 1, lim);
    /* The warm-up key is the test key's own: harnesses run side by side on
     * one server, and each library stores its own kind of value. */
    char warm[ARG_KEY_MAX + 16];
    int warmlen = snprintf(warm, sizeof warm, "%s-warmup", c->key);
    if (warmlen < 0 || (size_t)warmlen >= sizeof warm)
        die("--key is too long");
    if (decide(w, warm, (size_t)warmlen, c->capacity_s, c->rate_s) < 0)
        die("the warm-up decision failed: %s", w->error);
    memset(w->sources, 0, sizeof w->sources);
    puts("{\"ready\": true}");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin))
        die("stdin closed before the go line");
    double *us = calloc((size_t)c->calls, sizeof *us);
    int admitted = 0, refused = 0, errors = 0;
    for (int i = 0; i < c->calls; i++) {
        int64_t t0 = bench_now_ns();
        int r = decide(w, c->key, strlen(c->key), c->capacity_s, c->rate_s);
        us[i] = (double)(bench_now_ns() - t0) / 1e3;
        admitted += r == 1;
        refused += r == 0;
        errors += r < 0;
    }
    printf("{\"calls\": %d, \"admitted\": %d, \"refused\": %d, \"errors\": %d, \"error\": ",
           c->calls, admitted, refused, errors);
    json_string(w->error);
    printf(", \"lat_us\": [");
    for (int i = 0; i < c->calls; i++)
        printf("%s%.3f", i ? ", " : "", us[i]);
    printf("]");
    if (lim) {
        printf(", \"sources\": {");
        int first = 1;
        for (int s = 1; s < 8; s++)
            if (w->sources[s]) {
                printf("%s\"%s\": %d", first ? "" : ", ", hirate_source_name(s), w->sources[s]);
                first = 0;
            }
        printf("}");
    }
    puts("}");
    free(us);
    if (w->rc)
        redisFree(w->rc);
    free(w);
    hirate_limiter_free(lim);
}

/* ---- fill: one decision on each of N keys ------------------------------------------ */

static void run_fill(const config *c)
{
    make_keys(c->keys);
    hirate_limiter *lim = c->impl == IMPL_HIREDIS ? NULL : make_limiter(c, c->capacity, c->rate);
    worker *w = make_workers(c, 1, lim);
    long admitted = 0, errors = 0;
    for (long i = 0; i < c->keys; i++) {
        int r = decide(w, keytab[i], keylen[i], c->capacity_s, c->rate_s);
        admitted += r == 1;
        errors += r < 0;
    }
    printf("{\"keys\": %ld, \"admitted\": %ld, \"errors\": %ld, \"error\": ", c->keys, admitted,
           errors);
    json_string(w->error);
    puts("}");
    if (w->rc)
        redisFree(w->rc);
    free(w);
    hirate_limiter_free(lim);
}

/* ---- arguments ----------------------------------------------------------------------- */

static double num(int argc, char **argv, const char *name, double def, double lo, double hi)
{
    const char *s = bench_opt(argc, argv, name, NULL);
    if (!s)
        return def;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !(v >= lo && v <= hi))
        die("%s: expected a number from %g to %g, got \"%s\"", name, lo, hi, s);
    return v;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: peer_c speed|atomic|outage|fill --impl hiredis|hirate|hirate-batch|"
            "hirate-nocache --url redis://HOST:PORT [--keys N] [--concurrency C] [--seconds S] "
            "[--warmup W] [--capacity C] [--rate R] [--seed X] [--key K] [--requests N] "
            "[--calls N] [--timeout-ms MS] [--batch N (hirate-batch)] "
            "[--tls-ca-file FILE (with rediss://)] [--limits TEXT (hirate*)]\n"
            "(see bench/peers/README.md)\n");
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argv[1][0] == '-')
        usage();
    config c = {.mode = argv[1]};
    const char *impl = bench_opt(argc, argv, "--impl", NULL);
    c.url = bench_opt(argc, argv, "--url", NULL);
    if (!impl || !c.url)
        usage();
    if (strcmp(impl, "hiredis") == 0)
        c.impl = IMPL_HIREDIS;
    else if (strcmp(impl, "hirate") == 0)
        c.impl = IMPL_HIRATE;
    else if (strcmp(impl, "hirate-batch") == 0)
        c.impl = IMPL_BATCH;
    else if (strcmp(impl, "hirate-nocache") == 0)
        c.impl = IMPL_NOCACHE;
    else
        die("--impl: unknown client \"%s\" (hiredis, hirate, hirate-batch, hirate-nocache)", impl);
    int tls = strncmp(c.url, "rediss://", 9) == 0;
    /* A cluster's URL goes to hirate as it is: the core routes by slot. */
    int cluster = strncmp(c.url, "redis+cluster://", 16) == 0 ||
                  strncmp(c.url, "rediss+cluster://", 17) == 0;
    if (cluster && c.impl == IMPL_HIREDIS)
        die("--impl hiredis: one connection per thread to one server; no cluster URL");
    if (!cluster && sscanf(c.url, tls ? "rediss://%255[^:/]:%d" : "redis://%255[^:/]:%d",
                           c.host, &c.port) != 2)
        die("--url: expected redis://HOST:PORT, rediss://HOST:PORT or redis+cluster://HOST:PORT,"
            "... got \"%s\"", c.url);
    tls = tls || strncmp(c.url, "rediss+cluster://", 17) == 0;
    c.tls_ca_file = bench_opt(argc, argv, "--tls-ca-file", NULL);
    c.limits = bench_opt(argc, argv, "--limits", NULL);
    if (c.limits && c.impl == IMPL_HIREDIS)
        die("--impl hiredis: one bucket of --capacity and --rate; --limits is for hirate*");
    if (c.tls_ca_file && !tls)
        die("--tls-ca-file needs a rediss:// or rediss+cluster:// URL");
    if (tls && c.impl == IMPL_HIREDIS)
        die("--impl hiredis: this hiredis has no TLS (hiredis_ssl); use redis://");
    c.keys = (long)num(argc, argv, "--keys", 100000, 1, 10000000);
    c.concurrency = (int)num(argc, argv, "--concurrency", 1, 1, 1024);
    c.seconds = num(argc, argv, "--seconds", 2, 0.01, 3600);
    c.warmup = num(argc, argv, "--warmup", 0.3, 0, 3600);
    c.capacity = (int64_t)num(argc, argv, "--capacity", 100, 1, 1e15);
    c.rate = num(argc, argv, "--rate", 10, 1e-9, 1e9);
    c.seed = (uint64_t)num(argc, argv, "--seed", 1, 0, 1e15);
    c.key = bench_opt(argc, argv, "--key", "fresh");
    if (!*c.key || strlen(c.key) > ARG_KEY_MAX)
        die("--key must be 1 to %d bytes", ARG_KEY_MAX);
    c.requests = (int)num(argc, argv, "--requests", 100, 1, 1024);
    c.calls = (int)num(argc, argv, "--calls", 20, 1, 100000);
    c.timeout_ms = (int)num(argc, argv, "--timeout-ms", 100, 1, 60000);
    c.batch = (int)num(argc, argv, "--batch", 16, 1, BATCH_MAX);
    snprintf(c.capacity_s, sizeof c.capacity_s, "%lld", (long long)c.capacity);
    /* The rate as the script reads it back exactly: the fewest digits. */
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(c.rate_s, sizeof c.rate_s, "%.*g", prec, c.rate);
        if (strtod(c.rate_s, NULL) == c.rate)
            break;
    }
    if (strcmp(c.mode, "speed") == 0)
        run_speed(&c);
    else if (strcmp(c.mode, "atomic") == 0)
        run_atomic(&c);
    else if (strcmp(c.mode, "outage") == 0)
        run_outage(&c);
    else if (strcmp(c.mode, "fill") == 0)
        run_fill(&c);
    else
        usage();
    free(keytab);
    free(keylen);
    return 0;
}
