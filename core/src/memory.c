/*
 * The in-memory backend: sharded, bounded, CLOCK eviction (a queue, oldest
 * first, with a "used" mark that earns a second chance), and decisions that
 * take no shared lock.
 *
 * Why it is built this way. A decision must stay exactly what bucket.c
 * computes from the stored (tokens, ts), a double and a 64-bit time: the 16
 * bytes cannot be folded into one 64-bit word without changing answers, and
 * a 16-byte compare-and-swap (cmpxchg16b, through libatomic) costs as much
 * as a lock and needs a retry loop around bucket.c's arithmetic. So each
 * bucket has a one-byte lock of its own, in its own entry: a decision on a
 * stored key finds the entry without any lock (the hash chains are read with
 * atomic loads), takes that byte (one atomic exchange, released by a plain
 * store), checks the entry still holds its key, decides, and lets go. Two
 * threads on different keys then write only their own entries, never a
 * shard's lock or queue, so the table scales with cores; one thread pays
 * one atomic instead of pthread_mutex_lock and _unlock. For the same reason
 * entries are cut from slabs of whole cache lines (a 48-byte entry and a key
 * of up to 16 bytes fill one line): a decision writes its entry, and no
 * other key's entry is on that line. Shards are line-aligned too, and the
 * counters a decision adds to are striped by thread (metrics.h).
 *
 * What takes the shard's mutex: a key that is not stored (insert, eviction,
 * the table growing), a reset, and the counters. Those change chains while
 * lock-free readers may be walking them, which is safe because an entry is
 * never freed while the table lives: an entry that leaves the table (evicted
 * or reset) goes to its shard's spares, by the size of key it has room for,
 * and the next new key of that size reuses it; a superseded slot array is
 * kept until the table is freed. A reader that followed a chain while it
 * changed may miss its key; it then looks again under the mutex (a decision)
 * or, when a shard's `moves` count says a chain was changed under it, under
 * the mutex too (a lookup). A reader that reaches an entry reused for
 * another key sees it under the entry's lock and walks on. What the table
 * holds is bounded by max_keys live entries plus their spares (a spare is an
 * entry another key will reuse; keys of many different sizes can leave more
 * of them: at most max_keys per size class of 16 bytes).
 *
 * The clock (core/src/clock.c): CLOCK_MONOTONIC through the vDSO, read once
 * per decision (the answers depend on every microsecond: a coarse or cached
 * clock would change them, and an rdtsc of our own would drift from it).
 * hirate_allow passes no
 * time, and the clock is read here once the bucket is found and locked: the
 * vDSO's read is fenced (lfence; rdtsc), and read before the lookup it made
 * the lookup's cache misses wait for it, which cost twice the read itself
 * (measured: 89 ns a decision against 65). Under the bucket's lock, the
 * times of one bucket's decisions are also in their order.
 */
#define _GNU_SOURCE /* malloc_usable_size */
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "clock.h"
#include "memory.h"

#define SHARDS_MAX 64
#define FIRST_SLOTS 8
/* How many of the oldest buckets a full shard looks at for one
 * to evict: enough to find a full one most of the time, and still O(1). */
#define EVICT_SCAN 8
/* The fewest buckets a shard holds (when max_keys allows): twice the scan. */
#define SHARD_MIN (2 * EVICT_SCAN)
/* Spare entries are kept by the key room they have, in steps of 16 bytes. */
#define KEY_STEP 16
#define SPARE_CLASSES ((HIRATE_KEY_MAX + KEY_STEP - 1) / KEY_STEP)
/* A lock-free walk longer than this (chains are short; a walk that long has
 * been led astray by entries moving under it) looks again under the mutex. */
#define WALK_MAX 64

typedef struct entry {
    struct entry *next;           /* hash chain: changed under the shard's mutex,
                                     read with atomic loads by anyone */
    struct entry *older, *newer;  /* queue, oldest first (under the mutex);
                                     `newer` links the spares */
    double tokens;                /* the first band's bucket, under the entry's lock */
    int64_t ts;
    uint32_t hash;                /* atomic: read before taking the lock */
    uint16_t keylen;              /* under the entry's lock (or the mutex); an
                                     entry is reused only for a key of the same
                                     room (ROOM(keylen)), so it also says that */
    uint8_t lock;                 /* the entry's lock */
    uint8_t used : 1;             /* used since it last came up for eviction */
    uint8_t live : 1;             /* 0 once evicted or reset (a spare); both
                                     bits under the entry's lock */
    unsigned char key[];          /* then, after ROOM(keylen) bytes, the
                                     buckets of bands 2 .. n and, in a stamped
                                     table, the time it was stored (unaligned) */
} entry;   /* 48 bytes: with a key of up to 16 bytes, one cache line */

_Static_assert(sizeof(void *) != 8 || sizeof(entry) == 48, "an entry and a 16-byte key in a line");

/* The key bytes an entry of a key of n bytes has room for. */
#define ROOM(n) (((size_t)(n) + KEY_STEP - 1) / KEY_STEP * KEY_STEP)

/* Entries are cut from slabs of whole cache lines, so that a decision (which
 * writes its entry: the lock, the bucket) never writes a line that holds
 * another key's entry: two threads on different keys then share no line.
 * malloc packed entries at 80 bytes, so neighbours shared lines, and two
 * threads on disjoint keys made 1.2 times one thread's decisions. Slabs
 * grow from SLAB_FIRST to SLAB_MAX bytes; entries are never freed one by
 * one (spares are reused), so a slab goes when the table does. */
#define LINE 64
#define SLAB_FIRST 1024
#define SLAB_MAX 65536
typedef struct slab {
    struct slab *prev;
} slab;

/* The slots of a shard; a larger one replaces it as the shard grows. */
typedef struct table {
    uint32_t mask;                /* number of slots - 1 */
    struct table *prev;           /* the one it replaced: kept for readers */
    entry *head[];
} table;

typedef struct shard {
    pthread_mutex_t lock;
    table *tab;                   /* atomic: readers load it without the mutex */
    uint32_t moves;               /* atomic: odd while a chain is being changed,
                                     so a lock-free miss can tell it was undisturbed */
    uint32_t count, cap;
    entry *newest, *oldest;
    entry *spare[SPARE_CLASSES];
    slab *slabs;                  /* the newest slab; each links the one before */
    size_t slab_size;             /* of the newest */
    size_t slab_used;             /* its bytes given out */
    size_t bytes;                 /* entries (live and spare) and slot arrays,
                                     as malloc holds them */
} __attribute__((aligned(64))) shard;   /* cache lines of its own: no false sharing */

struct hirate_memory {
    uint64_t seed;
    unsigned nshards;             /* a power of two */
    unsigned nbands;              /* buckets an entry holds, one a band */
    unsigned stamped;             /* entries keep when they were stored */
    size_t live;                  /* buckets held, read without a lock */
    shard shards[];
};

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

/* ---- the entry's lock: held for a few dozen instructions ------------------- */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline void entry_lock(entry *e)
{
    if (__builtin_expect(!__atomic_exchange_n(&e->lock, 1, __ATOMIC_ACQUIRE), 1))
        return;
    for (unsigned spins = 0;; spins++) {
        /* A holder that lost its core would keep us spinning: after a
         * while, let it run. */
        if (spins >= 64)
            sched_yield();
        else
            cpu_relax();
        if (!__atomic_load_n(&e->lock, __ATOMIC_RELAXED) &&
            !__atomic_exchange_n(&e->lock, 1, __ATOMIC_ACQUIRE))
            return;
    }
}

static inline void entry_unlock(entry *e)
{
    __atomic_store_n(&e->lock, 0, __ATOMIC_RELEASE);
}

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

uint64_t hirate_key_hash(const void *key, size_t keylen, uint64_t seed)
{
    return hash_key(key, keylen, seed);
}

/* ---- one shard ------------------------------------------------------------- */

static inline int key_eq(const unsigned char *a, const void *b, size_t n)
{
    /* Keys are short: a call to memcmp costs more than the compare. */
    const unsigned char *q = b;
    if (n >= 8 && n <= 16)
        return read64(a) == read64(q) && read64(a + n - 8) == read64(q + n - 8);
    return memcmp(a, q, n) == 0;
}

/* An entry's buckets: the first band's in its fields, the others after
 * its key's room. Under the entry's lock. */
static inline void load_bands(const hirate_memory *m, const entry *e, hirate_bucket *b)
{
    b[0].tokens = e->tokens;
    b[0].ts = e->ts;
    if (m->nbands > 1)
        memcpy(b + 1, e->key + ROOM(e->keylen), (m->nbands - 1) * sizeof *b);
}

static inline void store_bands(const hirate_memory *m, entry *e, const hirate_bucket *b)
{
    e->tokens = b[0].tokens;
    e->ts = b[0].ts;
    if (m->nbands > 1)
        memcpy(e->key + ROOM(e->keylen), b + 1, (m->nbands - 1) * sizeof *b);
}

/* A stamped table's entry: when it was stored. */
static inline unsigned char *stamp_of(const hirate_memory *m, entry *e)
{
    return e->key + ROOM(e->keylen) + (m->nbands - 1) * sizeof(hirate_bucket);
}

static inline void stamp(const hirate_memory *m, entry *e, int64_t now)
{
    if (m->stamped)
        memcpy(stamp_of(m, e), &now, sizeof now);
}

static inline int64_t stamp_get(const hirate_memory *m, entry *e)
{
    int64_t t;
    memcpy(&t, stamp_of(m, e), sizeof t);
    return t;
}

/* Under the mutex: the link that points to key's entry, or to NULL. Chains
 * hold live entries only. */
static entry **find(shard *s, uint32_t hash, const void *key, size_t keylen)
{
    table *t = s->tab;
    entry **pp = &t->head[hash & t->mask];
    for (; *pp; pp = &(*pp)->next) {
        entry *e = *pp;
        if (e->hash == hash && e->keylen == keylen && key_eq(e->key, key, keylen))
            break;
    }
    return pp;
}

/* Without the mutex: key's entry with its lock taken, or NULL (then *calm
 * says whether no chain of the shard changed during the walk, so that the
 * miss is real). */
static inline __attribute__((always_inline)) entry *find_locked(shard *s, uint32_t hash, const void *key, size_t keylen,
                                 int *calm)
{
    uint32_t moves = LOAD(&s->moves);
    table *t = LOAD(&s->tab);
    entry *e = LOAD(&t->head[hash & t->mask]);
    for (int steps = 0; e && steps < WALK_MAX; steps++) {
        if (__atomic_load_n(&e->hash, __ATOMIC_RELAXED) == hash) {
            entry_lock(e);
            if (e->live && e->keylen == keylen && e->hash == hash && key_eq(e->key, key, keylen))
                return e;
            entry_unlock(e);
        }
        e = LOAD(&e->next);
    }
    *calm = !e && !(moves & 1) && LOAD(&s->moves) == moves;
    return NULL;
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
 * its own entry, never the queue. Under the entry's lock. */
static inline void touch(entry *e)
{
    if (!e->used)
        e->used = 1;
}

/* A change of chains, as lock-free readers see it (under the mutex). The
 * chain stores that follow are release stores: a reader that sees one of
 * them (an acquire load) sees this odd count too when it looks again, so no
 * fence is needed (and TSan, which cannot see fences, sees it all). */
static inline void moves_begin(shard *s)
{
    STORE(&s->moves, s->moves + 1);
}

static inline void moves_end(shard *s)
{
    STORE(&s->moves, s->moves + 1);
}

/* Takes the entry at *pp out of the table (under the mutex): it becomes a
 * spare, its lock taken once so that a reader deciding on it finishes first. */
static void remove_entry(hirate_memory *m, shard *s, entry **pp)
{
    entry *e = *pp;
    __atomic_fetch_sub(&m->live, 1, __ATOMIC_RELAXED);
    entry_lock(e);
    e->live = 0;
    entry_unlock(e);
    moves_begin(s);
    STORE(pp, e->next);   /* e->next stays: a reader on e walks on */
    moves_end(s);
    unlink_recency(s, e);
    s->count--;
    e->newer = s->spare[ROOM(e->keylen) / KEY_STEP - 1];
    s->spare[ROOM(e->keylen) / KEY_STEP - 1] = e;
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
        hirate_bucket b[HIRATE_BANDS_MAX];
        entry_lock(e);
        load_bands(m, e, b);
        int used = e->used;
        e->used = 0;
        entry_unlock(e);
        /* How full it is: its emptiest band's share of its capacity; full
         * (forgetting it loses nothing) only when every band is. */
        double level = 1;
        int full = 1;
        for (unsigned k = 0; k < m->nbands; k++) {
            double held = hirate_bucket_level(&cfg[k], &b[k], now);
            full &= held >= cfg[k].capacity_d;
            if (held / cfg[k].capacity_d < level)
                level = held / cfg[k].capacity_d;
        }
        if (full) {
            victim = e;
            break;
        }
        if (level > best_any) {
            best_any = level;
            fallback = e;
        }
        if (used) {
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

static table *table_new(uint32_t n)
{
    table *t = calloc(1, sizeof *t + n * sizeof(entry *));
    if (t)
        t->mask = n - 1;
    return t;
}

/* A table twice as large; the old one stays (readers may be on it). */
static void grow(shard *s)
{
    table *old = s->tab;
    uint32_t n = (old->mask + 1) * 2;
    table *t = table_new(n);
    if (!t)
        return;   /* longer chains, still correct */
    moves_begin(s);
    for (uint32_t i = 0; i <= old->mask; i++) {
        for (entry *e = old->head[i], *next; e; e = next) {
            next = e->next;
            STORE(&e->next, t->head[e->hash & (n - 1)]);
            t->head[e->hash & (n - 1)] = e;
        }
    }
    t->prev = old;
    STORE(&s->tab, t);
    moves_end(s);
    s->bytes += malloc_usable_size(t);
}

/* Under the mutex: size bytes (a multiple of LINE) on their own cache lines. */
static void *slab_take(shard *s, size_t size)
{
    if (!s->slabs || s->slab_used + size > s->slab_size) {
        size_t n = s->slabs ? s->slab_size * 2 : SLAB_FIRST;
        if (n > SLAB_MAX)
            n = SLAB_MAX;
        while (n < LINE + size)
            n *= 2;
        slab *sl = aligned_alloc(LINE, n);
        if (!sl)
            return NULL;
        sl->prev = s->slabs;
        s->slabs = sl;
        s->slab_size = n;
        s->slab_used = LINE;   /* the link's line */
        s->bytes += malloc_usable_size(sl);
    }
    void *p = (unsigned char *)s->slabs + s->slab_used;
    s->slab_used += size;
    return p;
}

static entry *insert(hirate_memory *m, shard *s, const hirate_bucket_cfg *cfg, uint32_t hash,
                     const void *key, size_t keylen, const hirate_bucket *state, int64_t now)
{
    if (s->count >= s->cap)
        evict_one(m, s, cfg, now);
    else if (s->count > s->tab->mask)
        grow(s);
    size_t room = ROOM(keylen) / KEY_STEP;
    entry *e = s->spare[room - 1];
    if (e) {
        s->spare[room - 1] = e->newer;
        /* a reader may still hold it from before: it sees the new key */
        entry_lock(e);
    } else {
        size_t size = sizeof *e + room * KEY_STEP + (m->nbands - 1) * sizeof(hirate_bucket) +
                      (m->stamped ? sizeof(int64_t) : 0);
        e = slab_take(s, (size + LINE - 1) / LINE * LINE);
        if (!e)
            return NULL;
        e->lock = 1;
        e->next = NULL;
    }
    __atomic_store_n(&e->hash, hash, __ATOMIC_RELAXED);
    e->keylen = (uint16_t)keylen;
    e->used = 0;
    e->live = 1;
    store_bands(m, e, state);
    stamp(m, e, now);
    memcpy(e->key, key, keylen);
    entry_unlock(e);
    entry **head = &s->tab->head[hash & s->tab->mask];
    STORE(&e->next, *head);
    STORE(head, e);   /* published: its fields are set */
    push_newest(s, e);
    s->count++;
    __atomic_fetch_add(&m->live, 1, __ATOMIC_RELAXED);
    return e;
}

/* ---- the table ------------------------------------------------------------- */

static shard *shard_for(hirate_memory *m, uint64_t h)
{
    return &m->shards[(h >> 32) & (m->nshards - 1)];
}

hirate_memory *hirate_memory_new(size_t max_keys, size_t nbands, int stamped)
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
    m->nbands = (unsigned)nbands;
    m->stamped = stamped != 0;
    if (getrandom(&m->seed, sizeof m->seed, GRND_NONBLOCK) != sizeof m->seed)
        m->seed = (uint64_t)(uintptr_t)m ^ (uint64_t)hirate_monotonic_us() * 0x9e3779b97f4a7c15ull;
    for (unsigned i = 0; i < nshards; i++) {
        shard *s = &m->shards[i];
        s->cap = (uint32_t)(max_keys / nshards + (i < max_keys % nshards));
        s->tab = table_new(FIRST_SLOTS);
        pthread_mutex_init(&s->lock, NULL);
        if (!s->tab) {
            m->nshards = i + 1;
            hirate_memory_free(m);
            return NULL;
        }
        s->bytes = malloc_usable_size(s->tab);
    }
    return m;
}

void hirate_memory_free(hirate_memory *m)
{
    if (!m)
        return;
    for (unsigned i = 0; i < m->nshards; i++) {
        shard *s = &m->shards[i];
        for (slab *sl = s->slabs, *prev; sl; sl = prev) {   /* every entry */
            prev = sl->prev;
            free(sl);
        }
        for (table *t = s->tab, *prev; t; t = prev) {
            prev = t->prev;
            free(t);
        }
        pthread_mutex_destroy(&s->lock);
    }
    free(m);
}

static __attribute__((noinline)) void decide_bands(hirate_memory *m, entry *e,
                                                  const hirate_bucket_cfg *cfg, int64_t now,
                                                  int64_t cost, int spend, hirate_decision *d,
                                                  hirate_decision *per)
{
    hirate_bucket b[HIRATE_BANDS_MAX];
    load_bands(m, e, b);
    if (hirate_bands_decide_many(cfg, m->nbands, b, now, cost, spend, d, per))
        store_bands(m, e, b);
}

/* Decides on e's bands (under its lock) and stores what changed; one band,
 * the common case, without copying it out and back. */
static inline void decide_entry(hirate_memory *m, entry *e, const hirate_bucket_cfg *cfg,
                                int64_t now, int64_t cost, int spend, hirate_decision *d,
                                hirate_decision *per)
{
    if (__builtin_expect(m->nbands == 1, 1)) {
        hirate_bucket b = {e->tokens, e->ts};
        if (hirate_bucket_decide(cfg, &b, now, cost, spend, d)) {
            e->tokens = b.tokens;
            e->ts = b.ts;
        }
        if (per)
            per[0] = *d;
    } else {
        decide_bands(m, e, cfg, now, cost, spend, d, per);
    }
    touch(e);
}

int hirate_memory_decide(hirate_memory *m, const hirate_bucket_cfg *cfg, const void *key,
                         size_t keylen, int64_t now, int64_t cost, int spend, hirate_decision *d,
                         hirate_decision *per)
{
    uint64_t h = hash_key(key, keylen, m->seed);
    shard *s = shard_for(m, h);
    int calm, rc = 0;

    entry *e = find_locked(s, (uint32_t)h, key, keylen, &calm);
    if (__builtin_expect(e != NULL, 1)) {
        if (now < 0)
            now = hirate_monotonic_us();
        decide_entry(m, e, cfg, now, cost, spend, d, per);
        entry_unlock(e);
        return 0;
    }

    pthread_mutex_lock(&s->lock);
    if (now < 0)
        now = hirate_monotonic_us();
    e = *find(s, (uint32_t)h, key, keylen);
    if (e) {   /* stored meanwhile, or missed by the walk */
        entry_lock(e);
        decide_entry(m, e, cfg, now, cost, spend, d, per);
        entry_unlock(e);
    } else {
        /* A key without a bucket has a full one; store it only once it has
         * spent something. */
        hirate_bucket b[HIRATE_BANDS_MAX];
        for (unsigned k = 0; k < m->nbands; k++)
            b[k] = (hirate_bucket){cfg[k].capacity_d, now};
        if (hirate_bands_decide(cfg, m->nbands, b, now, cost, spend, d, per) &&
            !insert(m, s, cfg, (uint32_t)h, key, keylen, b, now))
            rc = HIRATE_ENOMEM;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int hirate_memory_lookup(hirate_memory *m, const hirate_bucket_cfg *cfg, const void *key,
                         size_t keylen, int64_t now, int64_t since, int64_t cost,
                         hirate_decision *d, hirate_decision *per)
{
    /* An empty table (the deny cache, most of the time) costs one load. A
     * bucket stored concurrently may be missed: the caller then asks Redis,
     * which is always right. */
    if (__atomic_load_n(&m->live, __ATOMIC_RELAXED) == 0)
        return 0;
    uint64_t h = hash_key(key, keylen, m->seed);
    shard *s = shard_for(m, h);
    int calm;
    entry *e = find_locked(s, (uint32_t)h, key, keylen, &calm);
    if (!e && calm)
        return 0;
    if (!e) {   /* the walk was disturbed: look again, under the mutex */
        pthread_mutex_lock(&s->lock);
        e = *find(s, (uint32_t)h, key, keylen);
        if (e)
            entry_lock(e);
        pthread_mutex_unlock(&s->lock);
        if (!e)
            return 0;
    }
    hirate_bucket b[HIRATE_BANDS_MAX];
    load_bands(m, e, b);
    int fresh = !m->stamped || stamp_get(m, e) >= since;
    entry_unlock(e);
    if (!fresh)
        return 0;
    hirate_bands_decide(cfg, m->nbands, b, now, cost, 0, d, per);
    return 1;
}

int hirate_memory_put(hirate_memory *m, const hirate_bucket_cfg *cfg, const void *key,
                      size_t keylen, const hirate_bucket *state, int64_t now)
{
    uint64_t h = hash_key(key, keylen, m->seed);
    shard *s = shard_for(m, h);
    int rc = 0;
    pthread_mutex_lock(&s->lock);
    entry *e = *find(s, (uint32_t)h, key, keylen);
    if (e) {
        entry_lock(e);
        touch(e);
        store_bands(m, e, state);
        stamp(m, e, now);
        entry_unlock(e);
    } else if (!insert(m, s, cfg, (uint32_t)h, key, keylen, state, now)) {
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
        n += s->bytes;
        pthread_mutex_unlock(&s->lock);
    }
    return n;
}

/* Every entry of a shard, live or spare (under the mutex). */
static void lock_entries(shard *s, int take)
{
    for (entry *e = s->oldest; e; e = e->newer)
        take ? entry_lock(e) : entry_unlock(e);
    for (int c = 0; c < SPARE_CLASSES; c++)
        for (entry *e = s->spare[c]; e; e = e->newer)
            take ? entry_lock(e) : entry_unlock(e);
}

/* fork(): every mutex, then every entry's lock, so that no decision is half
 * done in the child (which would keep its lock forever). It takes time in
 * proportion to the keys held, once per fork. */
void hirate_memory_lock_all(hirate_memory *m)
{
    for (unsigned i = 0; i < m->nshards; i++) {
        pthread_mutex_lock(&m->shards[i].lock);
        lock_entries(&m->shards[i], 1);
    }
}

void hirate_memory_unlock_all(hirate_memory *m)
{
    for (unsigned i = 0; i < m->nshards; i++) {
        lock_entries(&m->shards[i], 0);
        pthread_mutex_unlock(&m->shards[i].lock);
    }
}
