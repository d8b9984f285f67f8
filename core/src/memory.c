/* The in-memory backend: sharded, bounded, least-recently-used eviction. */
#define _GNU_SOURCE /* malloc_usable_size */
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "memory.h"

#define SHARDS_MAX 64
#define FIRST_SLOTS 8
/* How many of the oldest buckets a full shard looks at for one
 * to evict: enough to find a full one most of the time, and still O(1). */
#define EVICT_SCAN 8
/* The fewest buckets a shard holds (when max_keys allows): twice the scan. */
#define SHARD_MIN (2 * EVICT_SCAN)

typedef struct entry {
    struct entry *next;           /* hash chain */
    struct entry *older, *newer;  /* queue, oldest first: inserted or given
                                     a second chance */
    double tokens;
    int64_t ts;
    uint32_t hash;
    uint16_t keylen;
    uint8_t used;                 /* used since it last came up for eviction */
    unsigned char key[];
} entry;

typedef struct shard {
    pthread_mutex_t lock;
    entry **slots;
    uint32_t mask;                /* number of slots - 1 */
    uint32_t count, cap;
    entry *newest, *oldest;
    size_t bytes;                 /* entries and keys as malloc holds them */
} __attribute__((aligned(64))) shard;   /* one cache line each: no false sharing */

struct hirate_memory {
    uint64_t seed;
    unsigned nshards;             /* a power of two */
    size_t live;                  /* buckets held, read without a lock */
    shard shards[];
};

/* ---- hashing: seeded, 64-bit multiply-fold (as in wyhash) ---------------- */

static inline uint64_t fold(uint64_t a, uint64_t b)
{
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

static inline uint64_t read64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t read32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t hash_key(const unsigned char *p, size_t n, uint64_t seed)
{
    static const uint64_t k0 = 0xa0761d6478bd642full, k1 = 0xe7037ed1a0b428dbull,
                          k2 = 0x8ebc6af09c88c6e3ull;
    uint64_t h = seed ^ k0, len = n, a = 0, b = 0;
    while (n > 16) {
        h = fold(read64(p) ^ k1, read64(p + 8) ^ h);
        p += 16;
        n -= 16;
    }
    if (n >= 8) {            /* 8..16 bytes: two reads that may overlap */
        a = read64(p);
        b = read64(p + n - 8);
    } else if (n >= 4) {
        a = read32(p);
        b = read32(p + n - 4);
    } else if (n > 0) {
        a = (uint64_t)p[0] << 16 | (uint64_t)p[n >> 1] << 8 | p[n - 1];
    }
    return fold(k2 ^ len, fold(a ^ k1, b ^ h));
}

/* ---- one shard (the caller holds its lock) -------------------------------- */

static entry **find(shard *s, uint32_t hash, const void *key, size_t keylen)
{
    entry **pp = &s->slots[hash & s->mask];
    for (; *pp; pp = &(*pp)->next) {
        entry *e = *pp;
        if (e->hash == hash && e->keylen == keylen && memcmp(e->key, key, keylen) == 0)
            break;
    }
    return pp;
}

static void unlink_recency(shard *s, entry *e)
{
    if (e->newer) e->newer->older = e->older; else s->newest = e->older;
    if (e->older) e->older->newer = e->newer; else s->oldest = e->newer;
}

static void push_newest(shard *s, entry *e)
{
    e->older = s->newest;
    e->newer = NULL;
    if (s->newest) s->newest->newer = e; else s->oldest = e;
    s->newest = e;
}

/* Marks a bucket as used (CLOCK, not strict LRU): a hit writes one byte of
 * its own entry, never the queue, so threads on different keys of a shard
 * do not bounce its head between them. */
static inline void touch(entry *e)
{
    if (!e->used)
        e->used = 1;
}

static void remove_entry(hirate_memory *m, shard *s, entry **pp)
{
    entry *e = *pp;
    __atomic_fetch_sub(&m->live, 1, __ATOMIC_RELAXED);
    *pp = e->next;
    unlink_recency(s, e);
    s->count--;
    s->bytes -= malloc_usable_size(e);
    free(e);
}

/* Makes room for one more bucket in a full shard, looking at the EVICT_SCAN
 * oldest. A bucket that has refilled goes first: forgetting it changes no
 * answer. Otherwise a used one gets a second chance (back of the queue) and
 * the fullest of the unused goes, since forgetting a drained bucket would
 * hand its key a fresh burst; if all were used, the fullest of all. */
static void evict_one(hirate_memory *m, shard *s, const hirate_bucket_cfg *cfg, int64_t now)
{
    entry *victim = NULL, *fallback = NULL, *e = s->oldest, *next;
    double best = -1, best_any = -1;
    for (int i = 0; e && i < EVICT_SCAN; i++, e = next) {
        next = e->newer;
        hirate_bucket b = {e->tokens, e->ts};
        double level = hirate_bucket_level(cfg, &b, now);
        if (level >= cfg->capacity_d) {
            victim = e;
            break;
        }
        if (level > best_any) {
            best_any = level;
            fallback = e;
        }
        if (e->used) {
            e->used = 0;
            unlink_recency(s, e);
            push_newest(s, e);
        } else if (level > best) {
            best = level;
            victim = e;
        }
    }
    if (!victim)
        victim = fallback;
    if (victim)
        remove_entry(m, s, find(s, victim->hash, victim->key, victim->keylen));
}

static void grow(shard *s)
{
    uint32_t n = (s->mask + 1) * 2;
    entry **slots = calloc(n, sizeof *slots);
    if (!slots)
        return;   /* longer chains, still correct */
    for (uint32_t i = 0; i <= s->mask; i++) {
        for (entry *e = s->slots[i], *next; e; e = next) {
            next = e->next;
            e->next = slots[e->hash & (n - 1)];
            slots[e->hash & (n - 1)] = e;
        }
    }
    free(s->slots);
    s->slots = slots;
    s->mask = n - 1;
}

static entry *insert(hirate_memory *m, shard *s, const hirate_bucket_cfg *cfg, uint32_t hash,
                     const void *key, size_t keylen, int64_t now)
{
    if (s->count >= s->cap)
        evict_one(m, s, cfg, now);
    else if (s->count > s->mask)
        grow(s);
    entry *e = malloc(sizeof *e + keylen);
    if (!e)
        return NULL;
    e->hash = hash;
    e->keylen = (uint16_t)keylen;
    e->used = 0;
    memcpy(e->key, key, keylen);
    entry **head = &s->slots[hash & s->mask];
    e->next = *head;
    *head = e;
    push_newest(s, e);
    s->count++;
    s->bytes += malloc_usable_size(e);
    __atomic_fetch_add(&m->live, 1, __ATOMIC_RELAXED);
    return e;
}

/* ---- the table ------------------------------------------------------------- */

static shard *shard_for(hirate_memory *m, uint64_t h)
{
    return &m->shards[(h >> 32) & (m->nshards - 1)];
}

hirate_memory *hirate_memory_new(size_t max_keys)
{
    unsigned nshards = 1;
    /* every shard holds at least SHARD_MIN buckets, so that eviction has a
     * choice: a shard of one bucket would have to forget a drained one */
    while (nshards < SHARDS_MAX && (size_t)nshards * 2 * SHARD_MIN <= max_keys)
        nshards *= 2;
    hirate_memory *m = aligned_alloc(64, (sizeof *m + nshards * sizeof(shard) + 63) / 64 * 64);
    if (!m)
        return NULL;
    memset(m, 0, sizeof *m + nshards * sizeof(shard));
    m->nshards = nshards;
    if (getrandom(&m->seed, sizeof m->seed, GRND_NONBLOCK) != sizeof m->seed)
        m->seed = (uint64_t)(uintptr_t)m ^ (uint64_t)hirate_monotonic_us() * 0x9e3779b97f4a7c15ull;
    for (unsigned i = 0; i < nshards; i++) {
        shard *s = &m->shards[i];
        s->cap = (uint32_t)(max_keys / nshards + (i < max_keys % nshards));
        s->mask = FIRST_SLOTS - 1;
        s->slots = calloc(FIRST_SLOTS, sizeof *s->slots);
        pthread_mutex_init(&s->lock, NULL);
        if (!s->slots) {
            m->nshards = i + 1;
            hirate_memory_free(m);
            return NULL;
        }
    }
    return m;
}

void hirate_memory_free(hirate_memory *m)
{
    if (!m)
        return;
    for (unsigned i = 0; i < m->nshards; i++) {
        shard *s = &m->shards[i];
        for (entry *e = s->oldest, *next; e; e = next) {
            next = e->newer;
            free(e);
        }
        free(s->slots);
        pthread_mutex_destroy(&s->lock);
    }
    free(m);
}

int hirate_memory_decide(hirate_memory *m, const hirate_bucket_cfg *cfg, const void *key,
                         size_t keylen, int64_t now, int64_t cost, int spend, hirate_decision *d)
{
    uint64_t h = hash_key(key, keylen, m->seed);
    shard *s = shard_for(m, h);
    int rc = 0;

    pthread_mutex_lock(&s->lock);
    entry *e = *find(s, (uint32_t)h, key, keylen);
    if (e) {
        hirate_bucket b = {e->tokens, e->ts};
        if (hirate_bucket_decide(cfg, &b, now, cost, spend, d)) {
            e->tokens = b.tokens;
            e->ts = b.ts;
        }
        touch(e);
    } else {
        /* A key without a bucket has a full one; store it only once it has
         * spent something. */
        hirate_bucket b = {cfg->capacity_d, now};
        if (hirate_bucket_decide(cfg, &b, now, cost, spend, d)) {
            e = insert(m, s, cfg, (uint32_t)h, key, keylen, now);
            if (e) {
                e->tokens = b.tokens;
                e->ts = b.ts;
            } else {
                rc = HIRATE_ENOMEM;
            }
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int hirate_memory_lookup(hirate_memory *m, const hirate_bucket_cfg *cfg, const void *key,
                         size_t keylen, int64_t now, int64_t cost, hirate_decision *d)
{
    /* An empty table (the deny cache, most of the time) costs one load. A
     * bucket stored concurrently may be missed: the caller then asks Redis,
     * which is always right. */
    if (__atomic_load_n(&m->live, __ATOMIC_RELAXED) == 0)
        return 0;
    uint64_t h = hash_key(key, keylen, m->seed);
    shard *s = shard_for(m, h);
    pthread_mutex_lock(&s->lock);
    entry *e = *find(s, (uint32_t)h, key, keylen);
    if (e) {
        hirate_bucket b = {e->tokens, e->ts};
        hirate_bucket_decide(cfg, &b, now, cost, 0, d);
    }
    pthread_mutex_unlock(&s->lock);
    return e != NULL;
}

int hirate_memory_put(hirate_memory *m, const hirate_bucket_cfg *cfg, const void *key,
                      size_t keylen, const hirate_bucket *state, int64_t now)
{
    uint64_t h = hash_key(key, keylen, m->seed);
    shard *s = shard_for(m, h);
    int rc = 0;
    pthread_mutex_lock(&s->lock);
    entry *e = *find(s, (uint32_t)h, key, keylen);
    if (e)
        touch(e);
    else
        e = insert(m, s, cfg, (uint32_t)h, key, keylen, now);
    if (e) {
        e->tokens = state->tokens;
        e->ts = state->ts;
    } else {
        rc = HIRATE_ENOMEM;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

void hirate_memory_reset(hirate_memory *m, const void *key, size_t keylen)
{
    uint64_t h = hash_key(key, keylen, m->seed);
    shard *s = shard_for(m, h);
    pthread_mutex_lock(&s->lock);
    entry **pp = find(s, (uint32_t)h, key, keylen);
    if (*pp)
        remove_entry(m, s, pp);
    pthread_mutex_unlock(&s->lock);
}

size_t hirate_memory_count(hirate_memory *m)
{
    size_t n = 0;
    for (unsigned i = 0; i < m->nshards; i++) {
        pthread_mutex_lock(&m->shards[i].lock);
        n += m->shards[i].count;
        pthread_mutex_unlock(&m->shards[i].lock);
    }
    return n;
}

size_t hirate_memory_bytes(hirate_memory *m)
{
    size_t n = sizeof *m + m->nshards * sizeof(shard);
    for (unsigned i = 0; i < m->nshards; i++) {
        shard *s = &m->shards[i];
        pthread_mutex_lock(&s->lock);
        n += s->bytes + ((size_t)s->mask + 1) * sizeof(entry *);
        pthread_mutex_unlock(&s->lock);
    }
    return n;
}

void hirate_memory_lock_all(hirate_memory *m)
{
    for (unsigned i = 0; i < m->nshards; i++)
        pthread_mutex_lock(&m->shards[i].lock);
}

void hirate_memory_unlock_all(hirate_memory *m)
{
    for (unsigned i = 0; i < m->nshards; i++)
        pthread_mutex_unlock(&m->shards[i].lock);
}

int64_t hirate_monotonic_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
