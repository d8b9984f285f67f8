/*
 * The in-memory backend: a sharded, bounded hash table of buckets. A decision
 * on a stored key takes only that bucket's own lock; each shard has a mutex
 * for what changes its chains, and a CLOCK queue (oldest first, a "used" mark per bucket);
 * a new key in a full shard evicts, among the oldest few, a bucket that has
 * refilled to full (which loses nothing: a missing key is a full bucket),
 * else the fullest of those not used since they last came up (the used get a
 * second chance). The same table holds the deny cache.
 */
#ifndef HIRATE_MEMORY_H
#define HIRATE_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "bucket.h"
#include "clock.h"   /* hirate_monotonic_us, for the callers of the table */

typedef struct hirate_memory hirate_memory;

/* max_keys >= 1; nbands 1..HIRATE_BANDS_MAX: the buckets each key holds
 * (one a band, decided together by hirate_bands_decide), so that every cfg
 * and state below is an array of nbands. stamped: each entry keeps the time
 * it was stored (hirate_memory_put's now), which lookups can ask for (the
 * deny cache). Returns NULL when out of memory. */
hirate_memory *hirate_memory_new(size_t max_keys, size_t nbands, int stamped);
void hirate_memory_free(hirate_memory *m);

/* Decides cost at now for key (per: each band's figures, or NULL). Returns
 * 0 or HIRATE_ENOMEM. now < 0: the
 * monotonic clock, read once the bucket is found (so that its decisions are
 * in the order of their times, and the clock read does not hold up the
 * lookup). */
int hirate_memory_decide(hirate_memory *m, const hirate_bucket_cfg *cfg, const void *key,
                         size_t keylen, int64_t now, int64_t cost, int spend, hirate_decision *d,
                         hirate_decision *per);

/* If key has a bucket (in a stamped table: one stored at since or later):
 * fills *d (and per, when not NULL: each band's) with what cost would get
 * now, spends nothing, and returns 1. Returns 0 when the key has none. */
int hirate_memory_lookup(hirate_memory *m, const hirate_bucket_cfg *cfg, const void *key,
                         size_t keylen, int64_t now, int64_t since, int64_t cost,
                         hirate_decision *d, hirate_decision *per);

/* Stores *state as key's bucket (evicting as a new key would, at now).
 * Returns 0 or HIRATE_ENOMEM. */
int hirate_memory_put(hirate_memory *m, const hirate_bucket_cfg *cfg, const void *key,
                      size_t keylen, const hirate_bucket *state, int64_t now);

void hirate_memory_reset(hirate_memory *m, const void *key, size_t keylen);

/* Buckets held now, and the bytes they take (entries, keys and tables). */
size_t hirate_memory_count(hirate_memory *m);
size_t hirate_memory_bytes(hirate_memory *m);

/* fork(): hold every lock across it, release them on both sides. */
void hirate_memory_lock_all(hirate_memory *m);
void hirate_memory_unlock_all(hirate_memory *m);

/* The table's seeded hash of a key (the shared table's too). */
uint64_t hirate_key_hash(const void *key, size_t keylen, uint64_t seed);

#endif
