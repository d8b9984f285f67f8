/*
 * What every fuzz target shares: a check that stops the run with a message
 * (libFuzzer then keeps the input), a reader that takes typed values off the
 * front of the input, and a small PRNG seeded from the input, so that "random"
 * splits are the same every time the same input is run again.
 */
#ifndef HIRATE_FUZZ_UTIL_H
#define HIRATE_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* abort(), not a return: libFuzzer saves the input as a crash. */
#define FUZZ_CHECK(cond) do {                                                    \
    if (!(cond)) {                                                               \
        fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
        abort();                                                                 \
    }                                                                            \
} while (0)

#define FUZZ_CHECK_EQ(a, b) do {                                                 \
    long long a_ = (long long)(a), b_ = (long long)(b);                          \
    if (a_ != b_) {                                                              \
        fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, \
                #a, #b, a_, b_);                                                 \
        abort();                                                                 \
    }                                                                            \
} while (0)

/* Takes bytes off the front of the input; past its end every value is 0. */
typedef struct fuzz_reader {
    const uint8_t *p;
    size_t left;
} fuzz_reader;

static inline void fuzz_take(fuzz_reader *r, void *out, size_t n)
{
    size_t k = n < r->left ? n : r->left;
    memset(out, 0, n);
    memcpy(out, r->p, k);
    r->p += k;
    r->left -= k;
}

static inline uint8_t fuzz_u8(fuzz_reader *r)
{
    uint8_t v;
    fuzz_take(r, &v, 1);
    return v;
}

static inline uint32_t fuzz_u32(fuzz_reader *r)
{
    uint32_t v;
    fuzz_take(r, &v, sizeof v);
    return v;
}

static inline uint64_t fuzz_u64(fuzz_reader *r)
{
    uint64_t v;
    fuzz_take(r, &v, sizeof v);
    return v;
}

/* FNV-1a of the whole input, the seed of its splits. */
static inline uint64_t fuzz_seed(const uint8_t *data, size_t size)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < size; i++)
        h = (h ^ data[i]) * 0x100000001b3ull;
    return h | 1;
}

/* xorshift64 */
static inline uint64_t fuzz_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* The size of the next piece in split mode: mostly small, sometimes large,
 * so that splits land inside headers, inside bulk strings and between
 * replies alike. */
static inline size_t fuzz_piece(uint64_t *s)
{
    uint64_t x = fuzz_next(s);
    switch (x & 3) {
    case 0: return 1 + (size_t)(x >> 8) % 3;
    case 1: return 1 + (size_t)(x >> 8) % 16;
    case 2: return 1 + (size_t)(x >> 8) % 256;
    default: return 1 + (size_t)(x >> 8) % 8192;
    }
}

#endif
