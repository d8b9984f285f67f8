/* Key -> slot, as Redis computes it (cluster.c in the Redis source). */
#include <pthread.h>
#include <string.h>

#include "slot.h"

/* CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection. */
static unsigned short crc16_table[256];

static void crc16_init(void)
{
    for (unsigned i = 0; i < 256; i++) {
        unsigned c = i << 8;
        for (int k = 0; k < 8; k++)
            c = c & 0x8000 ? (c << 1) ^ 0x1021 : c << 1;
        crc16_table[i] = (unsigned short)(c & 0xffff);
    }
}

static unsigned crc16(unsigned crc, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        crc = ((crc << 8) ^ crc16_table[((crc >> 8) ^ p[i]) & 0xff]) & 0xffff;
    return crc;
}

static pthread_once_t crc16_once = PTHREAD_ONCE_INIT;

unsigned hirate_keyslot2(const void *a, size_t alen, const void *b, size_t blen)
{
    const unsigned char *pa = a, *pb = b;
    pthread_once(&crc16_once, crc16_init);
    /* The first '{', in a then in b; then the first '}' after it. */
    size_t open = (size_t)-1, total = alen + blen;
    for (size_t i = 0; i < total && open == (size_t)-1; i++)
        if ((i < alen ? pa[i] : pb[i - alen]) == '{')
            open = i;
    if (open != (size_t)-1) {
        for (size_t i = open + 1; i < total; i++) {
            if ((i < alen ? pa[i] : pb[i - alen]) != '}')
                continue;
            if (i == open + 1)
                break;   /* "{}": no tag, the whole key counts */
            /* The tag is [open + 1, i). */
            unsigned crc = 0;
            size_t s = open + 1;
            if (s < alen)
                crc = crc16(crc, pa + s, (i < alen ? i : alen) - s);
            if (i > alen)
                crc = crc16(crc, pb + (s > alen ? s - alen : 0), i - (s > alen ? s : alen));
            return crc & (HIRATE_SLOTS - 1);
        }
    }
    return crc16(crc16(0, pa, alen), pb, blen) & (HIRATE_SLOTS - 1);
}

unsigned hirate_keyslot(const void *key, size_t len)
{
    return hirate_keyslot2(key, len, "", 0);
}
