/*
 * The core's key slot (core/src/slot.h) against Redis' own CLUSTER KEYSLOT,
 * for 2,000 random keys: plain ones, any bytes, and every shape of braces the
 * hash-tag rule cares about ({tag}, an empty {}, nested and unbalanced
 * braces, a tag at the end, several tags). hirate_keyslot2 (prefix and key
 * apart) must give the slot of the two joined, split anywhere.
 *
 * The seed is printed; HIRATE_TEST_SEED=N repeats a run.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "cluster_harness.h"
#include "slot.h"

#define NKEYS 2000
#define KEY_MAX 64

static uint64_t rng;

static uint64_t next(void)
{
    /* xorshift64*: reproducible from the printed seed. */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ULL;
}

static unsigned pick(unsigned n) { return (unsigned)(next() % n); }

/* A random key of one of the shapes; returns its length. */
static size_t make_key(unsigned char *k)
{
    static const char *const pieces[] = {"{", "}", "{}", "{a}", "{user1000}", "}{", "{{", "}}",
                                         "{{x}}", "{x{y}z}", "a", "b:", "rl:", "\xff", "\0"};
    size_t len = 0;
    switch (pick(4)) {
    case 0:   /* any bytes, braces rare */
        len = pick(KEY_MAX);
        for (size_t i = 0; i < len; i++) k[i] = (unsigned char)pick(256);
        break;
    case 1:   /* printable, braces common */
        len = 1 + pick(KEY_MAX - 1);
        for (size_t i = 0; i < len; i++) {
            unsigned r = pick(10);
            k[i] = r == 0 ? '{' : r == 1 ? '}' : (unsigned char)('a' + pick(26));
        }
        break;
    default:  /* built from the shapes above */
        for (unsigned n = 1 + pick(6); n > 0; n--) {
            unsigned i = pick(sizeof pieces / sizeof pieces[0]);
            size_t plen = pieces[i][0] ? strlen(pieces[i]) : 1;
            if (len + plen > KEY_MAX) break;
            memcpy(k + len, pieces[i], plen);
            len += plen;
        }
        break;
    }
    return len;
}

int main(void)
{
    static unsigned char keys[NKEYS][KEY_MAX];
    static size_t lens[NKEYS];
    static const void *ptrs[NKEYS];
    static int slots[NKEYS];
    ch_cluster c;

    const char *s = getenv("HIRATE_TEST_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("test_slot: seed %llu\n", (unsigned long long)seed);
    rng = seed * 2 + 1;

    /* The fixed cases first, each spelled out. */
    static const char *const fixed[] = {"", "foo", "{user1000}.following", "{user1000}.followers",
                                        "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{}",
                                        "{", "}", "}{a}", "a{b", "{{}}", "{a}{", "123456789"};
    size_t nfixed = sizeof fixed / sizeof fixed[0];
    for (size_t i = 0; i < NKEYS; i++) {
        if (i < nfixed) {
            lens[i] = strlen(fixed[i]);
            memcpy(keys[i], fixed[i], lens[i]);
        } else {
            lens[i] = make_key(keys[i]);
        }
        ptrs[i] = keys[i];
    }

    if (ch_start(&c, 3, 0, NULL) < 0) return 2;
    ch_watchdog("test_slot", 60);
    CHECK_EQ_I64(ch_keyslots(&c, NKEYS, ptrs, lens, slots), 0);
    ch_stop(&c);

    /* Known values, as the Redis Cluster specification gives them. */
    CHECK_EQ_I64(hirate_keyslot("123456789", 9), 0x31C3 % HIRATE_SLOTS);
    CHECK_EQ_I64(hirate_keyslot("{user1000}.following", 20),
                 hirate_keyslot("{user1000}.followers", 20));

    int mismatches = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        unsigned mine = hirate_keyslot(keys[i], lens[i]);
        if ((int)mine != slots[i]) {
            if (mismatches++ < 10) {
                fprintf(stderr, "  key %zu (len %zu):", i, lens[i]);
                for (size_t j = 0; j < lens[i]; j++) fprintf(stderr, " %02x", keys[i][j]);
                fprintf(stderr, ": hirate %u, Redis %d\n", mine, slots[i]);
            }
        }
        /* Prefix and key apart, split at every point. */
        for (size_t cut = 0; cut <= lens[i]; cut++) {
            unsigned two = hirate_keyslot2(keys[i], cut, keys[i] + cut, lens[i] - cut);
            if (two != mine && mismatches++ < 10)
                fprintf(stderr, "  key %zu split at %zu: keyslot2 %u, keyslot %u\n", i, cut, two,
                        mine);
        }
    }
    CHECK_EQ_I64(mismatches, 0);
    return check_summary("test_slot");
}
