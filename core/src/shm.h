/*
 * The shared in-memory backend: a fixed-size table of buckets in one
 * MAP_SHARED anonymous mapping, made with the limiter, so that every process
 * forked after it (the workers of one nginx, a pre-forking server's
 * children) decides on the same buckets. See shm.c for why it is built so.
 */
#ifndef HIRATE_SHM_H
#define HIRATE_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "bucket.h"

typedef struct hirate_shm hirate_shm;

/* max_keys >= 1 buckets of nbands (1..HIRATE_BANDS_MAX) bands each, keys of
 * up to HIRATE_KEY_MAX bytes. The whole table is mapped at once (address
 * space; pages are taken as keys arrive). NULL when it cannot be mapped. */
hirate_shm *hirate_shm_new(size_t max_keys, size_t nbands);

/* Unmaps this process' view; the other processes keep theirs. */
void hirate_shm_free(hirate_shm *t);

/* Decides cost at now (now < 0: the monotonic clock, read under the lock)
 * for key, as hirate_memory_decide does: bucket.c's arithmetic on the stored
 * buckets, all of it under the key's shard lock, so that no other process
 * reads or writes the buckets in between. Never fails. */
void hirate_shm_decide(hirate_shm *t, const hirate_bucket_cfg *cfg, const void *key,
                       size_t keylen, int64_t now, int64_t cost, int spend, hirate_decision *d,
                       hirate_decision *per);

void hirate_shm_reset(hirate_shm *t, const void *key, size_t keylen);

/* Buckets held now (by every process), the bytes mapped, and the times a
 * shard was repaired after a process died holding its lock. */
size_t hirate_shm_count(hirate_shm *t);
size_t hirate_shm_bytes(const hirate_shm *t);
uint64_t hirate_shm_repairs(hirate_shm *t);

/* For the tests: takes key's shard lock, begins to write its stored
 * buckets (writing garbage into them, as a process killed mid-write leaves
 * them) and returns with the lock held, so that the caller can die holding
 * it. The key must hold a bucket. */
void hirate_shm__die_mid_write(hirate_shm *t, const void *key, size_t keylen);

#endif
