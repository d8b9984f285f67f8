/*
 * The shared in-memory backend (hirate_options.shared): one table of
 * buckets that every process forked after the limiter was made decides on,
 * e.g. all the workers of one nginx.
 *
 * Where it lives. One MAP_SHARED | MAP_ANONYMOUS mapping, made whole when
 * the limiter is made (in OpenResty: in init_by_lua, in nginx's master,
 * before the workers fork), of a fixed size: max_keys slots, each with room
 * for a key of HIRATE_KEY_MAX bytes and every band's bucket, split into
 * shards of their own lock, hash chains and CLOCK hand. Nothing in it is a
 * pointer (slots are numbered), and nothing is ever allocated after it is
 * made: it is bounded by construction, and a decision cannot fail. The
 * mapping is MAP_NORESERVE: it takes address space at once and memory only
 * as slots are first written (slots are handed out in order, so the pages
 * touched follow the keys held).
 *
 * Why not lua_shared_dict (ngx.shared.DICT). Its operations are atomic one
 * at a time (get, set, incr), but a decision is a read, bucket.c's
 * arithmetic and a write: done with get and set (as lua-resty-limit-traffic
 * does) two workers read the same level and both spend it; done under a
 * lock built of add and delete (resty.lock), a worker that dies holding it
 * stalls the key until the lock's expiry, and the arithmetic would have to
 * be restated in Lua, which is a second copy of the rule. The dict's own
 * mutex is nginx's and cannot be held from here. This table runs bucket.c
 * itself under its own lock, and serves a C program that forks as well.
 *
 * Atomic. Every read and write of a shard (lookup, decision, insert,
 * eviction, reset) is under the shard's pthread mutex, process-shared and
 * robust: a process that dies holding it (a worker killed by a signal or a
 * crash) does not stall the others. The next process to lock it is told
 * (EOWNERDEAD) and repairs the shard before deciding: the slots are the
 * truth and everything else is rebuilt from them (chains, free list,
 * count), and a decision cut short while writing its buckets is undone from
 * the shard's undo record (the old buckets, written before the new ones).
 * A slot becomes live only once its key and buckets are written (a release
 * store), so a half-made slot is never taken for a key. A decision cut
 * short is thus either whole or not made; the dead process never answered.
 *
 * fork(). The mapping is inherited, so the child decides on the same
 * buckets; nothing needs doing around fork(): the locks are in the shared
 * mapping, and one held by a thread of the parent is released by that
 * thread, in the parent. A process that frees the limiter unmaps only its
 * own view. `nginx -s reload` runs init_by_lua again in the master, so the
 * new workers get a new table (full buckets, as after a restart) and the old
 * workers finish on the old one, which goes when the last of them exits
 * and the master has closed its old Lua state.
 *
 * The clock: CLOCK_MONOTONIC, one clock for every process of the machine,
 * read under the lock, so one bucket's decisions are in the order of their
 * times whichever process makes them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>

#include "memory.h"
#include "shm.h"

#define SHARDS_MAX 64
/* As in memory.c: every shard holds at least twice the eviction scan. */
#define EVICT_SCAN 8
#define SHARD_MIN (2 * EVICT_SCAN)

/* A slot: a key's buckets, then its key. Numbered from 1 (0: none). */
typedef struct slot {
    uint32_t next;          /* live: its hash chain; not live: the free list */
    uint32_t hash;
    uint16_t keylen;
    uint8_t live;           /* 1 once key and buckets are written (release) */
    uint8_t used;           /* decided on since the CLOCK hand last passed */
    uint32_t pad_;
    hirate_bucket b[];      /* nbands buckets, then HIRATE_KEY_MAX key bytes */
} slot;

typedef struct shard {
    pthread_mutex_t lock;   /* process-shared, robust */
    uint32_t cap;           /* slots */
    uint32_t mask;          /* hash heads - 1 */
    uint32_t fresh;         /* slots handed out so far, 1..fresh (never shrinks) */
    uint32_t free_head;     /* slots given back by reset or eviction */
    uint32_t count;         /* live slots */
    uint32_t hand;          /* the CLOCK hand: next slot to look at, 0-based */
    uint32_t undo_slot;     /* a decision is writing this slot's buckets (0: none) */
    uint32_t pad_;
    uint64_t repairs;       /* times a dead holder's shard was repaired */
    size_t heads_off;       /* from the mapping's start: uint32_t heads[mask + 1] */
    size_t slots_off;       /* then cap slots of the table's slot_size */
    hirate_bucket undo[HIRATE_BANDS_MAX];   /* the buckets before that write */
} __attribute__((aligned(64))) shard;

struct hirate_shm {
    uint64_t seed;
    size_t size;            /* bytes mapped */
    size_t slot_size;
    unsigned nshards;       /* a power of two */
    unsigned nbands;
    shard shards[];
};

static uint32_t *heads_of(hirate_shm *t, shard *s)
{
    return (uint32_t *)((char *)t + s->heads_off);
}

static slot *slot_at(hirate_shm *t, shard *s, uint32_t n)   /* n >= 1 */
{
    return (slot *)((char *)t + s->slots_off + (size_t)(n - 1) * t->slot_size);
}

static unsigned char *key_of(hirate_shm *t, slot *e)
{
    return (unsigned char *)(e->b + t->nbands);
}

static shard *shard_for(hirate_shm *t, uint64_t h)
{
    return &t->shards[(h >> 32) & (t->nshards - 1)];
}

/* ---- the table's making ------------------------------------------------------ */

hirate_shm *hirate_shm_new(size_t max_keys, size_t nbands)
{
    unsigned nshards = 1;
    while (nshards < SHARDS_MAX && (size_t)nshards * 2 * SHARD_MIN <= max_keys)
        nshards *= 2;
    size_t slot_size = sizeof(slot) + nbands * sizeof(hirate_bucket) + HIRATE_KEY_MAX;
    slot_size = (slot_size + 7) / 8 * 8;
    size_t size = (sizeof(hirate_shm) + nshards * sizeof(shard) + 63) / 64 * 64;
    size_t offs[SHARDS_MAX][2];
    for (unsigned i = 0; i < nshards; i++) {
        size_t cap = max_keys / nshards + (i < max_keys % nshards);
        size_t heads = 1;
        while (heads < cap)
            heads *= 2;
        offs[i][0] = size;
        size += (heads * sizeof(uint32_t) + 63) / 64 * 64;
        offs[i][1] = size;
        size += (cap * slot_size + 63) / 64 * 64;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    hirate_shm *t = p;   /* zeroed by the kernel */
    t->size = size;
    t->slot_size = slot_size;
    t->nshards = nshards;
    t->nbands = (unsigned)nbands;
    if (getrandom(&t->seed, sizeof t->seed, GRND_NONBLOCK) != sizeof t->seed)
        t->seed = (uint64_t)(uintptr_t)t ^ (uint64_t)hirate_monotonic_us() * 0x9e3779b97f4a7c15ull;

    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    for (unsigned i = 0; i < nshards; i++) {
        shard *s = &t->shards[i];
        s->cap = (uint32_t)(max_keys / nshards + (i < max_keys % nshards));
        s->heads_off = offs[i][0];
        s->slots_off = offs[i][1];
        uint32_t heads = 1;
        while (heads < s->cap)
            heads *= 2;
        s->mask = heads - 1;
        if (pthread_mutex_init(&s->lock, &attr) != 0) {
            pthread_mutexattr_destroy(&attr);
            munmap(p, size);
            return NULL;
        }
    }
    pthread_mutexattr_destroy(&attr);
    return t;
}

void hirate_shm_free(hirate_shm *t)
{
    /* The mutexes are not destroyed: other processes may still use them. */
    if (t)
        munmap(t, t->size);
}

/* ---- one shard, under its lock ------------------------------------------------ */

/* A process died holding s's lock: undo its half-written decision, and
 * rebuild what is derived from the slots (which slots are live is the
 * truth, written last). */
static void repair(hirate_shm *t, shard *s)
{
    uint32_t u = __atomic_load_n(&s->undo_slot, __ATOMIC_ACQUIRE);
    if (u) {
        memcpy(slot_at(t, s, u)->b, s->undo, t->nbands * sizeof(hirate_bucket));
        __atomic_store_n(&s->undo_slot, 0, __ATOMIC_RELEASE);
    }
    uint32_t *heads = heads_of(t, s);
    memset(heads, 0, ((size_t)s->mask + 1) * sizeof *heads);
    s->free_head = 0;
    s->count = 0;
    if (s->fresh > s->cap)
        s->fresh = s->cap;
    for (uint32_t n = s->fresh; n >= 1; n--) {
        slot *e = slot_at(t, s, n);
        if (__atomic_load_n(&e->live, __ATOMIC_ACQUIRE)) {
            e->next = heads[e->hash & s->mask];
            heads[e->hash & s->mask] = n;
            s->count++;
        } else {
            e->next = s->free_head;
            s->free_head = n;
        }
    }
    if (s->hand >= s->cap)
        s->hand = 0;
    s->repairs++;
}

static void shard_lock(hirate_shm *t, shard *s)
{
    if (pthread_mutex_lock(&s->lock) == EOWNERDEAD) {
        repair(t, s);
        pthread_mutex_consistent(&s->lock);
    }
}

static void shard_unlock(shard *s)
{
    pthread_mutex_unlock(&s->lock);
}

/* The link that holds key's slot number, or holds 0 at the chain's end. */
static uint32_t *find(hirate_shm *t, shard *s, uint32_t hash, const void *key, size_t keylen)
{
    uint32_t *pp = &heads_of(t, s)[hash & s->mask];
    while (*pp) {
        slot *e = slot_at(t, s, *pp);
        if (e->hash == hash && e->keylen == keylen && memcmp(key_of(t, e), key, keylen) == 0)
            break;
        pp = &e->next;
    }
    return pp;
}

/* Takes slot n (live, at *pp) out: it is forgotten first, then unlinked. */
static void remove_slot(hirate_shm *t, shard *s, uint32_t *pp)
{
    uint32_t n = *pp;
    slot *e = slot_at(t, s, n);
    __atomic_store_n(&e->live, 0, __ATOMIC_RELEASE);
    *pp = e->next;
    e->next = s->free_head;
    s->free_head = n;
    s->count--;
}

/* A full shard makes room, by memory.c's rule: among the EVICT_SCAN slots
 * at the CLOCK hand, one whose every band has refilled goes first
 * (forgetting it changes no answer); else the fullest not used since the
 * hand last passed (the used get a second chance); else the fullest. */
static void evict_one(hirate_shm *t, shard *s, const hirate_bucket_cfg *cfg, int64_t now)
{
    uint32_t victim = 0, fallback = 0;
    double best = -1, best_any = -1;
    for (int i = 0; i < EVICT_SCAN && i < (int)s->cap; i++) {
        uint32_t n = s->hand + 1;
        s->hand = (s->hand + 1) % s->cap;
        slot *e = slot_at(t, s, n);
        if (!e->live)
            continue;
        double level = 1;
        int full = 1;
        for (unsigned k = 0; k < t->nbands; k++) {
            double held = hirate_bucket_level(&cfg[k], &e->b[k], now);
            full &= held >= cfg[k].capacity_d;
            if (held / cfg[k].capacity_d < level)
                level = held / cfg[k].capacity_d;
        }
        if (full) {
            victim = n;
            break;
        }
        if (level > best_any) {
            best_any = level;
            fallback = n;
        }
        if (e->used) {
            e->used = 0;
        } else if (level > best) {
            best = level;
            victim = n;
        }
    }
    if (!victim)
        victim = fallback;
    if (victim) {
        slot *e = slot_at(t, s, victim);
        remove_slot(t, s, find(t, s, e->hash, key_of(t, e), e->keylen));
    }
}

/* Stores a new key's buckets; there is always room (evicting if need be). */
static void insert(hirate_shm *t, shard *s, const hirate_bucket_cfg *cfg, uint32_t hash,
                   const void *key, size_t keylen, const hirate_bucket *b, int64_t now)
{
    if (!s->free_head && s->fresh >= s->cap)
        evict_one(t, s, cfg, now);
    uint32_t n;
    if (s->free_head) {
        n = s->free_head;
        s->free_head = slot_at(t, s, n)->next;
    } else {
        n = ++s->fresh;   /* counted first: a repair looks at it either way */
    }
    slot *e = slot_at(t, s, n);
    e->hash = hash;
    e->keylen = (uint16_t)keylen;
    e->used = 0;
    memcpy(e->b, b, t->nbands * sizeof *b);
    memcpy(key_of(t, e), key, keylen);
    uint32_t *head = &heads_of(t, s)[hash & s->mask];
    e->next = *head;
    __atomic_store_n(&e->live, 1, __ATOMIC_RELEASE);
    *head = n;
    s->count++;
}

/* Writes a live slot's new buckets, the old ones kept first for a repair. */
static void store(hirate_shm *t, shard *s, uint32_t n, const hirate_bucket *b)
{
    slot *e = slot_at(t, s, n);
    memcpy(s->undo, e->b, t->nbands * sizeof *b);
    __atomic_store_n(&s->undo_slot, n, __ATOMIC_RELEASE);
    memcpy(e->b, b, t->nbands * sizeof *b);
    __atomic_store_n(&s->undo_slot, 0, __ATOMIC_RELEASE);
}

/* ---- the table ------------------------------------------------------------------ */

void hirate_shm_decide(hirate_shm *t, const hirate_bucket_cfg *cfg, const void *key,
                       size_t keylen, int64_t now, int64_t cost, int spend, hirate_decision *d,
                       hirate_decision *per)
{
    uint64_t h = hirate_key_hash(key, keylen, t->seed);
    shard *s = shard_for(t, h);
    hirate_bucket b[HIRATE_BANDS_MAX];
    shard_lock(t, s);
    if (now < 0)
        now = hirate_monotonic_us();
    uint32_t n = *find(t, s, (uint32_t)h, key, keylen);
    if (n) {
        slot *e = slot_at(t, s, n);
        memcpy(b, e->b, t->nbands * sizeof *b);
        if (hirate_bands_decide(cfg, t->nbands, b, now, cost, spend, d, per))
            store(t, s, n, b);
        e->used = 1;
    } else {
        /* A key without a bucket has a full one; stored once it spent. */
        for (unsigned k = 0; k < t->nbands; k++)
            b[k] = (hirate_bucket){cfg[k].capacity_d, now};
        if (hirate_bands_decide(cfg, t->nbands, b, now, cost, spend, d, per))
            insert(t, s, cfg, (uint32_t)h, key, keylen, b, now);
    }
    shard_unlock(s);
}

void hirate_shm_reset(hirate_shm *t, const void *key, size_t keylen)
{
    uint64_t h = hirate_key_hash(key, keylen, t->seed);
    shard *s = shard_for(t, h);
    shard_lock(t, s);
    uint32_t *pp = find(t, s, (uint32_t)h, key, keylen);
    if (*pp)
        remove_slot(t, s, pp);
    shard_unlock(s);
}

size_t hirate_shm_count(hirate_shm *t)
{
    size_t n = 0;
    for (unsigned i = 0; i < t->nshards; i++) {
        shard_lock(t, &t->shards[i]);
        n += t->shards[i].count;
        shard_unlock(&t->shards[i]);
    }
    return n;
}

size_t hirate_shm_bytes(const hirate_shm *t)
{
    return t->size;
}

uint64_t hirate_shm_repairs(hirate_shm *t)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < t->nshards; i++) {
        shard_lock(t, &t->shards[i]);
        n += t->shards[i].repairs;
        shard_unlock(&t->shards[i]);
    }
    return n;
}

void hirate_shm__die_mid_write(hirate_shm *t, const void *key, size_t keylen)
{
    uint64_t h = hirate_key_hash(key, keylen, t->seed);
    shard *s = shard_for(t, h);
    shard_lock(t, s);
    uint32_t n = *find(t, s, (uint32_t)h, key, keylen);
    if (!n)
        return;
    slot *e = slot_at(t, s, n);
    memcpy(s->undo, e->b, t->nbands * sizeof(hirate_bucket));
    __atomic_store_n(&s->undo_slot, n, __ATOMIC_RELEASE);
    e->b[0].tokens = -12345.0;   /* half a write: a level no decision makes */
}
