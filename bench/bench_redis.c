/*
 * The Redis path: the round-trip time of hirate_allow next to a plain hiredis
 * loop that sends the same script call, against one redis-server.
 *
 *   bench_redis [--url redis://127.0.0.1:PORT] [--rounds R] [--seconds S]
 *               [--keys K] [--summary FILE]
 *
 * Without --url it starts its own redis-server (tests/support/redis_harness.c).
 *
 * Both clients send EVALSHA of the very script the library embeds (loaded
 * first with SCRIPT LOAD), with the same key ("rl:" + key), capacity, rate,
 * cost 1 and spend "1", over one TCP connection each, one call at a time:
 *   plain:  redisCommand(c, "EVALSHA %s 1 %s %s %s %s %s", sha, key, cap, rate, "1", "1")
 *   hirate: hirate_allow(lim, key, keylen, 1, &d)
 * The capacity (1e9) is large enough that every call is allowed and writes
 * its bucket, so the server does the same work for both. Rounds alternate the
 * clients (A B, then B A, ...) so that drift in the machine's speed falls on
 * both; a round runs each client for S seconds and timestamps every call. The
 * ratio is the median over rounds of hirate's mean time per call over the
 * plain loop's in the same round.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "bench_util.h"
#include "hirate_io.h"
#include "redis_harness.h"

#define MAX_ROUNDS 64
#define CAPACITY 1000000000LL
#define RATE 1e6

typedef struct client {
    const char *name;
    int is_hirate;
    redisContext *c;          /* plain */
    hirate_limiter *lim;      /* hirate */
    size_t pos;               /* next index into the key order */
    double *lat;              /* µs of every timed call, all rounds */
    size_t nlat, caplat;
    double round_mean[MAX_ROUNDS];
} client;

typedef struct setup {
    const bench_keys *keys;
    const uint32_t *order;
    char (*full)[24];         /* "rl:" + key, for the plain loop */
    const char *sha, *cap, *rate;
} setup;

/* One call; exits on anything but an allowed decision from Redis. */
static inline void one_call(client *cl, const setup *su, uint32_t i)
{
    if (cl->is_hirate) {
        hirate_decision d;
        int rc = hirate_allow(cl->lim, su->keys->key[i], su->keys->len[i], 1, &d);
        if (rc < 0 || d.source != HIRATE_SOURCE_REDIS || !d.allowed) {
            char msg[HIRATE_ERRMSG_SIZE];
            fprintf(stderr, "bench_redis: hirate_allow: %s (%s), allowed %d\n",
                    hirate_strerror(rc), hirate_limiter_errmsg(cl->lim, msg, sizeof msg),
                    d.allowed);
            exit(1);
        }
    } else {
        redisReply *r = redisCommand(cl->c, "EVALSHA %s 1 %s %s %s %s %s", su->sha, su->full[i],
                                     su->cap, su->rate, "1", "1");
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
            r->element[0]->type != REDIS_REPLY_INTEGER || r->element[0]->integer != 1) {
            fprintf(stderr, "bench_redis: EVALSHA: %s\n",
                    !r ? cl->c->errstr : r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
            exit(1);
        }
        freeReplyObject(r);
    }
}

/* Runs cl for seconds (timing every call when round >= 0); returns calls made. */
static size_t run(client *cl, const setup *su, size_t nkeys, double seconds, int round)
{
    int64_t end = bench_now_ns() + (int64_t)(seconds * 1e9);
    int64_t t0 = bench_now_ns(), start = t0;
    size_t calls = 0;
    for (;;) {
        uint32_t i = su->order[cl->pos];
        cl->pos = cl->pos + 1 == nkeys ? 0 : cl->pos + 1;
        one_call(cl, su, i);
        int64_t t1 = bench_now_ns();
        calls++;
        if (round >= 0) {
            if (cl->nlat == cl->caplat) {
                cl->caplat = cl->caplat ? cl->caplat * 2 : 1 << 16;
                cl->lat = realloc(cl->lat, cl->caplat * sizeof *cl->lat);
                if (!cl->lat) {
                    fprintf(stderr, "bench_redis: out of memory\n");
                    exit(1);
                }
            }
            cl->lat[cl->nlat++] = (double)(t1 - t0) / 1e3;
        }
        t0 = t1;
        if (t1 >= end)
            break;
    }
    if (round >= 0)
        cl->round_mean[round] = (double)(t0 - start) / 1e3 / (double)calls;
    return calls;
}

/* "1e+06" for 1e6: the fewest digits that read back as the same double, as
 * the library encodes the rate, so both clients send the same bytes. */
static void shortest(char *buf, size_t len, double v)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

/* The script's server time per call: cmdstat_evalsha's and cmdstat_fcall's
 * (hirate's default) together, or -1. */
static double evalsha_usec_per_call(redisContext *c)
{
    double calls = 0, usec = 0;
    redisReply *r = redisCommand(c, "INFO commandstats");
    for (int i = 0; r && r->type == REDIS_REPLY_STRING && i < 2; i++) {
        const char *p = strstr(r->str, i ? "cmdstat_fcall:" : "cmdstat_evalsha:");
        const char *n = p ? strstr(p, "calls=") : NULL, *u = p ? strstr(p, "usec=") : NULL;
        if (n && u) {
            calls += strtod(n + strlen("calls="), NULL);
            usec += strtod(u + strlen("usec="), NULL);
        }
    }
    if (r)
        freeReplyObject(r);
    return calls > 0 ? usec / calls : -1;
}

/* Median round trip of PING on a fresh plain hiredis connection. */
static double ping_median_us(const char *host, int port, double seconds)
{
    redisContext *c = redisConnect(host, port);
    if (!c || c->err)
        return -1;
    size_t n = 0, cap = 1 << 16;
    double *lat = malloc(cap * sizeof *lat);
    int64_t end = bench_now_ns() + (int64_t)(seconds * 1e9);
    bench_progress("redis: PING for scale");
    for (int64_t t0 = bench_now_ns(); t0 < end && lat;) {
        redisReply *r = redisCommand(c, "PING");
        if (!r)
            break;
        freeReplyObject(r);
        int64_t t1 = bench_now_ns();
        if (n == cap)
            lat = realloc(lat, (cap *= 2) * sizeof *lat);
        if (lat)
            lat[n++] = (double)(t1 - t0) / 1e3;
        t0 = t1;
    }
    double med = lat ? bench_median(lat, n) : -1;
    free(lat);
    redisFree(c);
    return med;
}

static void parse_url(const char *url, char *host, size_t hostlen, int *port)
{
    char h[256];
    if (sscanf(url, "redis://%255[^:/]:%d", h, port) != 2) {
        fprintf(stderr, "bench_redis: --url must be redis://HOST:PORT, got %s\n", url);
        exit(2);
    }
    snprintf(host, hostlen, "%s", h);
}

typedef struct pattern_result {
    double ratio_median, ratio_min, ratio_max;
    double mean[2], median[2], p99[2];
    size_t calls[2];
} pattern_result;

static pattern_result bench_pattern(const char *label, const bench_keys *keys, const char *url,
                                    const char *host, int port, int rounds, double seconds,
                                    const char *sha)
{
    pattern_result pr;
    char cap[32], rate[32];
    snprintf(cap, sizeof cap, "%lld", CAPACITY);
    shortest(rate, sizeof rate, RATE);

    uint32_t *order = malloc(keys->n * sizeof *order);
    char (*full)[24] = calloc(keys->n, sizeof *full);
    for (size_t i = 0; i < keys->n; i++) {
        order[i] = (uint32_t)i;
        snprintf(full[i], sizeof full[i], "rl:%s", keys->key[i]);
    }
    uint64_t rng = 7;
    bench_shuffle(order, keys->n, &rng);
    setup su = {keys, order, full, sha, cap, rate};

    client cl[2];
    memset(cl, 0, sizeof cl);
    cl[0].name = "plain hiredis";
    cl[0].c = redisConnect(host, port);
    if (!cl[0].c || cl[0].c->err) {
        fprintf(stderr, "bench_redis: connect: %s\n", cl[0].c ? cl[0].c->errstr : "out of memory");
        exit(1);
    }
    cl[1].name = "hirate";
    cl[1].is_hirate = 1;
    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.capacity = CAPACITY;
    o.rate = RATE;
    o.timeout_ms = 2000;   /* a slow moment must not become an error here */
    char err[HIRATE_ERRMSG_SIZE];
    if (hirate_limiter_new(&cl[1].lim, &o, err, sizeof err) < 0) {
        fprintf(stderr, "bench_redis: %s\n", err);
        exit(1);
    }

    /* Warm-up: connections made, keys written, both paths hot. */
    for (int c = 0; c < 2; c++)
        run(&cl[c], &su, keys->n, 0.3, -1);

    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < 2; k++) {
            int c = (r % 2) ? 1 - k : k;   /* A B, B A, A B, ... */
            bench_progress("redis: %s, round %d/%d: %s", label, r + 1, rounds, cl[c].name);
            run(&cl[c], &su, keys->n, seconds, r);
        }
    }

    hirate_counters st;
    hirate_counters_get(cl[1].lim, &st);
    if (st.eval != 0 || st.connects != 1 || st.conns_dropped != 0) {
        fprintf(stderr, "bench_redis: hirate sent %llu EVAL, made %llu connections, dropped %llu\n",
                (unsigned long long)st.eval, (unsigned long long)st.connects,
                (unsigned long long)st.conns_dropped);
        exit(1);
    }

    double ratios[MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        ratios[r] = cl[1].round_mean[r] / cl[0].round_mean[r];
    pr.ratio_min = bench_min(ratios, (size_t)rounds);
    pr.ratio_max = bench_max(ratios, (size_t)rounds);
    pr.ratio_median = bench_median(ratios, (size_t)rounds);
    for (int c = 0; c < 2; c++) {
        double sum = 0;
        for (size_t i = 0; i < cl[c].nlat; i++)
            sum += cl[c].lat[i];
        pr.calls[c] = cl[c].nlat;
        pr.mean[c] = sum / (double)cl[c].nlat;
        pr.median[c] = bench_quantile(cl[c].lat, cl[c].nlat, 0.5);
        pr.p99[c] = bench_quantile(cl[c].lat, cl[c].nlat, 0.99);
        free(cl[c].lat);
    }
    redisFree(cl[0].c);
    hirate_limiter_free(cl[1].lim);
    free(order);
    free(full);
    return pr;
}

int main(int argc, char **argv)
{
    int rounds = (int)bench_opt_num(argc, argv, "--rounds", 5);
    double seconds = bench_opt_num(argc, argv, "--seconds", 1.0);
    size_t nkeys = (size_t)bench_opt_num(argc, argv, "--keys", 10000);
    const char *summary = bench_opt(argc, argv, "--summary", NULL);
    const char *url = bench_opt(argc, argv, "--url", NULL);
    if (rounds < 1 || rounds > MAX_ROUNDS || seconds <= 0 || nkeys < 1) {
        fprintf(stderr, "bench_redis: bad arguments\n");
        return 2;
    }

    rh_server srv;
    memset(&srv, 0, sizeof srv);
    if (!url) {
        if (rh_start(&srv) < 0)
            return 1;
        url = srv.url;
    }
    char host[256];
    int port;
    parse_url(url, host, sizeof host, &port);

    /* SCRIPT LOAD the library's own script; the server must name the same SHA1. */
    size_t slen;
    const char *src = hirate_script_source(&slen);
    redisContext *c = redisConnect(host, port);
    redisReply *r = c && !c->err ? redisCommand(c, "SCRIPT LOAD %b", src, slen) : NULL;
    if (!r || r->type != REDIS_REPLY_STRING || strcmp(r->str, hirate_script_sha1()) != 0) {
        fprintf(stderr, "bench_redis: SCRIPT LOAD failed or named another SHA1\n");
        return 1;
    }
    freeReplyObject(r);
    redisFree(c);

    /* Server-side time per call, from INFO commandstats, over the rounds only. */
    redisContext *admin = redisConnect(host, port);
    if (!admin || admin->err) {
        fprintf(stderr, "bench_redis: cannot connect to %s\n", url);
        return 1;
    }
    freeReplyObject(redisCommand(admin, "CONFIG RESETSTAT"));

    bench_keys hot = {0}, many = {0};
    if (bench_keys_make(&many, nkeys, 42) < 0 || bench_keys_make(&hot, 1, 4242) < 0) {
        fprintf(stderr, "bench_redis: out of memory\n");
        return 1;
    }
    char kl[64], g[32];
    snprintf(kl, sizeof kl, "%s keys", bench_group(g, sizeof g, (double)nkeys));
    struct {
        const char *label, *tag;
        const bench_keys *keys;
        pattern_result pr;
    } pats[2] = {{"1 hot key", "hot", &hot, {0, 0, 0, {0}, {0}, {0}, {0}}},
                 {kl, "keys", &many, {0, 0, 0, {0}, {0}, {0}, {0}}}};

    for (int p = 0; p < 2; p++)
        pats[p].pr = bench_pattern(pats[p].label, pats[p].keys, url, host, port, rounds, seconds,
                                   hirate_script_sha1());
    double server_us = evalsha_usec_per_call(admin);
    double ping_us = ping_median_us(host, port, 0.5);
    redisFree(admin);
    bench_progress_done();

    printf("### Redis path: time per decision\n\n");
    printf("One connection per client over TCP to 127.0.0.1, one call at a time. %d rounds; "
           "in each, each client runs for %.1f s (the order alternates between rounds) and "
           "every call is timed. Times in microseconds over all rounds; the ratio is the "
           "median over rounds of hirate's mean over the plain loop's mean in the same round "
           "(min..max over rounds).\n\n", rounds, seconds);
    printf("| keys | client | calls | mean µs | median µs | p99 µs | hirate / plain |\n");
    printf("|---|---|---:|---:|---:|---:|---:|\n");
    for (int p = 0; p < 2; p++) {
        pattern_result *pr = &pats[p].pr;
        char n0[32], n1[32];
        printf("| %s | plain hiredis `redisCommand(\"EVALSHA %%s 1 %%s %%s %%s %%s %%s\")` | %s "
               "| %.2f | %.2f | %.2f | |\n", pats[p].label,
               bench_group(n0, sizeof n0, (double)pr->calls[0]), pr->mean[0], pr->median[0],
               pr->p99[0]);
        printf("| %s | `hirate_allow` | %s | %.2f | %.2f | %.2f | **%.3f** (%.3f..%.3f) |\n",
               pats[p].label, bench_group(n1, sizeof n1, (double)pr->calls[1]), pr->mean[1],
               pr->median[1], pr->p99[1], pr->ratio_median, pr->ratio_min, pr->ratio_max);
        char tag[64];
        snprintf(tag, sizeof tag, "redis_ratio_%s", pats[p].tag);
        bench_summary(summary, tag, pr->ratio_median);
        snprintf(tag, sizeof tag, "redis_ratio_min_%s", pats[p].tag);
        bench_summary(summary, tag, pr->ratio_min);
        snprintf(tag, sizeof tag, "redis_ratio_max_%s", pats[p].tag);
        bench_summary(summary, tag, pr->ratio_max);
        snprintf(tag, sizeof tag, "redis_plain_mean_us_%s", pats[p].tag);
        bench_summary(summary, tag, pr->mean[0]);
        snprintf(tag, sizeof tag, "redis_hirate_mean_us_%s", pats[p].tag);
        bench_summary(summary, tag, pr->mean[1]);
    }
    printf("\nFor scale: redis-server itself spent %.2f µs per EVALSHA (`INFO commandstats`, "
           "both clients, all rounds), and a plain hiredis `PING` round trip over the same kind "
           "of connection takes %.2f µs (median): most of a decision's time is the server's "
           "and the loopback round trip's, which both clients pay alike.\n\n", server_us, ping_us);
    bench_summary(summary, "redis_server_usec_per_call", server_us);
    bench_summary(summary, "redis_ping_median_us", ping_us);

    bench_keys_free(&hot);
    bench_keys_free(&many);
    if (srv.pid)
        rh_stop(&srv);
    return 0;
}
