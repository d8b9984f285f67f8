/* SHA-256 (FIPS 180-4), for the hashed identities of bucket keys: one hash
 * for every language, so a long identity has one bucket wherever it is
 * keyed. Not for secrets: nothing here is constant-time. */
#ifndef HIRATE_SHA256_H
#define HIRATE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define HIRATE_SHA256_SIZE 32

/* The digest of data[0 .. len) into out[0 .. 32). */
void hirate__sha256(const void *data, size_t len, uint8_t out[HIRATE_SHA256_SIZE]);

#endif
