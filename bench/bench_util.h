/*
 * What the benchmarks share: a nanosecond clock, order statistics, a
 * deterministic random generator, key sets and a small argument parser.
 * Header only; every benchmark is one C file plus this.
 */
#ifndef HIRATE_BENCH_UTIL_H
#define HIRATE_BENCH_UTIL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static inline int64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t bench_now_us(void)
{
    return bench_now_ns() / 1000;
}

/* splitmix64: a fixed seed, so every run uses the same keys and order. */
static inline uint64_t bench_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v in place and returns the q-quantile (0..1), nearest rank. */
static inline double bench_quantile(double *v, size_t n, double q)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, bench_cmp_double);
    size_t i = (size_t)(q * (double)n);
    if (i >= n)
        i = n - 1;
    return v[i];
}

/* Median of n values (the mean of the middle two when n is even). */
static inline double bench_median(double *v, size_t n)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static inline double bench_min(const double *v, size_t n)
{
    double m = n ? v[0] : 0;
    for (size_t i = 1; i < n; i++)
        if (v[i] < m)
            m = v[i];
    return m;
}

static inline double bench_max(const double *v, size_t n)
{
    double m = n ? v[0] : 0;
    for (size_t i = 1; i < n; i++)
        if (v[i] > m)
            m = v[i];
    return m;
}

static inline void bench_shuffle(uint32_t *v, size_t n, uint64_t *rng)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(bench_rand(rng) % i);
        uint32_t t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
}

/* A growing list of samples (e.g. µs per call); exits when memory runs out. */
typedef struct bench_samples {
    double *v;
    size_t n, cap;
} bench_samples;

static inline void bench_samples_push(bench_samples *s, double x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1 << 16;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        if (!s->v) {
            fprintf(stderr, "bench: out of memory for samples\n");
            exit(1);
        }
    }
    s->v[s->n++] = x;
}

static inline void bench_samples_free(bench_samples *s)
{
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

/* n distinct keys "user:NNNNNNN" (12 bytes): distinct 7-digit ids drawn at
 * random, as a service's user ids would be. */
typedef struct bench_keys {
    size_t n;
    char (*key)[16];
    size_t *len;
} bench_keys;

static inline int bench_keys_make(bench_keys *k, size_t n, uint64_t seed)
{
    k->n = n;
    k->key = calloc(n, sizeof *k->key);
    k->len = calloc(n, sizeof *k->len);
    unsigned char *used = calloc(10000000, 1);
    if (!k->key || !k->len || !used || n > 10000000)
        return -1;
    uint64_t rng = seed;
    for (size_t i = 0; i < n; i++) {
        uint32_t id;
        do
            id = (uint32_t)(bench_rand(&rng) % 10000000);
        while (used[id]);
        used[id] = 1;
        k->len[i] = (size_t)snprintf(k->key[i], sizeof k->key[i], "user:%07u", id);
    }
    free(used);
    return 0;
}

static inline void bench_keys_free(bench_keys *k)
{
    free(k->key);
    free(k->len);
}

/* --name value options: returns the value of name, or def. */
static inline const char *bench_opt(int argc, char **argv, const char *name, const char *def)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return argv[i + 1];
    return def;
}

static inline double bench_opt_num(int argc, char **argv, const char *name, double def)
{
    const char *s = bench_opt(argc, argv, name, NULL);
    if (!s)
        return def;
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end) {
        fprintf(stderr, "%s: not a number: %s\n", name, s);
        exit(2);
    }
    return v;
}

/* "12 345 678" for tables: thin groups read better than raw digits. */
static inline const char *bench_group(char *buf, size_t len, double v)
{
    char raw[32];
    snprintf(raw, sizeof raw, "%.0f", v);
    size_t n = strlen(raw), o = 0;
    for (size_t i = 0; i < n && o + 2 < len; i++) {
        if (i && (n - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = raw[i];
    }
    buf[o] = '\0';
    return buf;
}

/* A live progress line on stderr: rewritten in place on a terminal, one
 * line each otherwise (so that logs stay readable). */
static inline void bench_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void bench_progress(const char *fmt, ...)
{
    static int tty = -1;
    if (tty < 0)
        tty = isatty(2);
    va_list ap;
    va_start(ap, fmt);
    fputs(tty ? "\r\033[K  " : "  ", stderr);
    vfprintf(stderr, fmt, ap);
    if (!tty)
        fputc('\n', stderr);
    fflush(stderr);
    va_end(ap);
}

static inline void bench_progress_done(void)
{
    if (isatty(2))
        fputs("\r\033[K", stderr);
}

/* One "name value" line for bench/run.sh, which writes the Targets section
 * from them. */
static inline void bench_summary(const char *path, const char *name, double value)
{
    if (!path)
        return;
    FILE *f = fopen(path, "a");
    if (!f) {
        perror(path);
        exit(1);
    }
    fprintf(f, "%s %.10g\n", name, value);   /* counts of millions stay exact */
    fclose(f);
}

#endif
