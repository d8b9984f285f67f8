/*
 * Redis Cluster's key slot: CRC16 (XMODEM) of the key, or of its hash tag,
 * modulo 16384, exactly as Redis' keyHashSlot computes it. The hash tag is
 * what lies between the first '{' and the first '}' after it, when that is
 * not empty; keys with the same tag share a slot, and so a node.
 */
#ifndef HIRATE_SLOT_H
#define HIRATE_SLOT_H

#include <stddef.h>

#define HIRATE_SLOTS 16384

unsigned hirate_keyslot(const void *key, size_t len);
/* The slot of prefix + key without joining them. */
unsigned hirate_keyslot2(const void *a, size_t alen, const void *b, size_t blen);

#endif
