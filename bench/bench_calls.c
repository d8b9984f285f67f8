/*
 * Client instructions per decision, counted by callgrind.
 *
 *   valgrind --tool=callgrind --collect-atstart=no --toggle-collect=bench_measured \
 *       bench_calls --mode MODE [--n N] [--warmup W] [--keys K] [--url redis://HOST:PORT]
 *       bench_calls --mode hirate --url rediss://HOST:PORT --tls-ca-file ca.crt    (TLS)
 *       bench_calls --mode hirate --functions 0 ...     (by EVALSHA, not FCALL)
 *
 * MODE is one of
 *   hirate   hirate_allow against Redis
 *   plain    redisCommand(c, "EVALSHA %s 1 %s %s %s %s %s", ...): the plain hiredis loop
 *   argv     redisCommandArgv with the arguments already split: hiredis at its leanest
 *   memory   hirate_allow on the in-memory backend
 * Each makes W calls first (connections, lazy binding, script cache; for
 * memory, by default two passes over the keys so that all are stored), then N
 * calls inside bench_measured(), the one function callgrind collects in, so
 * the total Ir of the run divided by N is the user-space instructions per
 * decision (the kernel's side of send/recv is not counted by callgrind).
 * Nothing outside bench_measured() is counted, so no empty run needs to be
 * subtracted: the connection, the TLS handshake and the warm-up are not in
 * the total. Without --url a Redis mode starts its own redis-server.
 *
 * Over TLS (hirate only: this hiredis has no TLS) the script is not loaded
 * beforehand: the warm-up's first call meets NOSCRIPT and sends EVAL, and
 * every measured call is an EVALSHA, as over TCP.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "bench_util.h"
#include "hirate_io.h"
#include "redis_harness.h"

#define CAPACITY 1000000000LL
#define RATE 1e6

enum mode { HIRATE, PLAIN, ARGV, MEMORY };

typedef struct ctx {
    enum mode mode;
    hirate_limiter *lim;
    redisContext *c;
    const bench_keys *keys;
    uint32_t *order;
    char (*full)[24];
    char cap[32], rate[32];
    size_t pos;
} ctx;

static void fail(const char *what)
{
    fprintf(stderr, "bench_calls: %s\n", what);
    exit(1);
}

static void calls(ctx *x, size_t n)
{
    const char *sha = hirate_script_sha1();
    for (size_t k = 0; k < n; k++) {
        uint32_t i = x->order[x->pos];
        x->pos = x->pos + 1 == x->keys->n ? 0 : x->pos + 1;
        if (x->mode == HIRATE || x->mode == MEMORY) {
            hirate_decision d;
            if (hirate_allow(x->lim, x->keys->key[i], x->keys->len[i], 1, &d) < 0 || !d.allowed)
                fail("hirate_allow failed");
        } else {
            redisReply *r;
            if (x->mode == PLAIN) {
                r = redisCommand(x->c, "EVALSHA %s 1 %s %s %s %s %s", sha, x->full[i], x->cap,
                                 x->rate, "1", "1");
            } else {
                const char *argv[8] = {"EVALSHA", sha, "1", x->full[i], x->cap, x->rate, "1", "1"};
                size_t lens[8] = {7, 40, 1, strlen(x->full[i]), strlen(x->cap), strlen(x->rate),
                                  1, 1};
                r = redisCommandArgv(x->c, 8, argv, lens);
            }
            if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
                r->element[0]->type != REDIS_REPLY_INTEGER)
                fail(r && r->type == REDIS_REPLY_ERROR ? r->str : "EVALSHA failed");
            freeReplyObject(r);
        }
    }
}

/* The only function callgrind collects in (--toggle-collect=bench_measured). */
__attribute__((noinline)) void bench_measured(ctx *x, size_t n);
__attribute__((noinline)) void bench_measured(ctx *x, size_t n)
{
    calls(x, n);
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv)
{
    const char *m = bench_opt(argc, argv, "--mode", "hirate");
    size_t n = (size_t)bench_opt_num(argc, argv, "--n", 2000);
    size_t nkeys = (size_t)bench_opt_num(argc, argv, "--keys", 10000);
    /* The memory backend stores a key on its first spend: warm up over every
     * key twice, so that the count holds no insertions. */
    size_t warmup = (size_t)bench_opt_num(argc, argv, "--warmup", strcmp(m, "memory") == 0
                                                                   ? 2.0 * (double)nkeys : 200);
    const char *url = bench_opt(argc, argv, "--url", NULL);
    const char *ca = bench_opt(argc, argv, "--tls-ca-file", NULL);
    int functions = (int)bench_opt_num(argc, argv, "--functions", 1);
    int tls = url && strncmp(url, "rediss://", 9) == 0;
    ctx x;
    memset(&x, 0, sizeof x);
    if (strcmp(m, "hirate") == 0) x.mode = HIRATE;
    else if (strcmp(m, "plain") == 0) x.mode = PLAIN;
    else if (strcmp(m, "argv") == 0) x.mode = ARGV;
    else if (strcmp(m, "memory") == 0) x.mode = MEMORY;
    else fail("--mode must be hirate, plain, argv or memory");
    if (tls && x.mode != HIRATE)
        fail("a rediss:// URL needs --mode hirate (this hiredis has no TLS)");
    if (ca && !tls)
        fail("--tls-ca-file needs a rediss:// URL");

    rh_server srv;
    memset(&srv, 0, sizeof srv);
    if (x.mode != MEMORY && !url) {
        if (rh_start(&srv) < 0)
            return 1;
        url = srv.url;
    }

    bench_keys keys;
    if (bench_keys_make(&keys, nkeys, 42) < 0)
        fail("out of memory");
    x.keys = &keys;
    x.order = malloc(nkeys * sizeof *x.order);
    x.full = calloc(nkeys, sizeof *x.full);
    for (size_t i = 0; i < nkeys; i++) {
        x.order[i] = (uint32_t)i;
        snprintf(x.full[i], sizeof x.full[i], "rl:%s", keys.key[i]);
    }
    uint64_t rng = 7;
    bench_shuffle(x.order, nkeys, &rng);
    snprintf(x.cap, sizeof x.cap, "%lld", CAPACITY);
    snprintf(x.rate, sizeof x.rate, "1e+06");   /* what the library sends for 1e6 */

    if (x.mode == HIRATE || x.mode == MEMORY) {
        hirate_options o;
        hirate_options_init(&o);
        o.url = x.mode == HIRATE ? url : NULL;
        o.capacity = CAPACITY;
        o.rate = RATE;
        o.timeout_ms = 5000;   /* valgrind is slow; a timeout would spoil the count */
        o.connect_timeout_ms = 5000;   /* and so is a TLS handshake under it */
        o.tls_ca_file = ca;
        o.functions = functions;
        char err[HIRATE_ERRMSG_SIZE];
        if (hirate_limiter_new(&x.lim, &o, err, sizeof err) < 0)
            fail(err);
    }
    if (x.mode != MEMORY && !tls) {
        /* Every Redis mode starts with the script loaded, so that hirate's
         * first call meets no NOSCRIPT either. */
        char host[256];
        int port;
        if (sscanf(url, "redis://%255[^:/]:%d", host, &port) != 2)
            fail("--url must be redis://HOST:PORT");
        x.c = redisConnect(host, port);
        if (!x.c || x.c->err)
            fail("cannot connect");
        size_t slen;
        const char *src = hirate_script_source(&slen);
        redisReply *r = redisCommand(x.c, "SCRIPT LOAD %b", src, slen);
        if (!r || r->type != REDIS_REPLY_STRING)
            fail("SCRIPT LOAD failed");
        freeReplyObject(r);
    }

    calls(&x, warmup);
    bench_measured(&x, n);

    if (x.mode == HIRATE) {
        hirate_counters st;
        hirate_counters_get(x.lim, &st);
        printf("hirate: %llu EVALSHA, %llu EVAL, %llu connections\n",
               (unsigned long long)st.evalsha, (unsigned long long)st.eval,
               (unsigned long long)st.connects);
    }
    printf("%s: %zu measured calls\n", m, n);
    hirate_limiter_free(x.lim);
    if (x.c)
        redisFree(x.c);
    bench_keys_free(&keys);
    free(x.order);
    free(x.full);
    if (srv.pid)
        rh_stop(&srv);
    return 0;
}
