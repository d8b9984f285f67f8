/*
 * Replies of general shape (the handshake's now; CLUSTER SHARDS, ROLE and
 * SENTINEL replies next), read by hiredis' sans-IO redisReader (0.14 or 1.x)
 * into hirate's own reply objects, bounded by hirate: a reply may hold no
 * string longer than max_str, no array of more than max_elems elements, and
 * take no more than max_bytes of input, so that a hostile server cannot make
 * the reader allocate without limit. (The script's replies, the hot path,
 * keep proto.c's allocation-free parser.)
 */
#ifndef HIRATE_REPLY_H
#define HIRATE_REPLY_H

#include <stddef.h>

typedef struct hirate_rnode {
    char type;                  /* '+' status, '-' error, ':' integer, '$' bulk,
                                   '*' array, 0 nil */
    long long integer;
    size_t len;                 /* bytes of str, or elements of elem */
    char *str;                  /* NUL-terminated */
    struct hirate_rnode **elem;
} hirate_rnode;

typedef struct hirate_rreader hirate_rreader;

hirate_rreader *hirate_rreader_new(size_t max_bytes, size_t max_elems, size_t max_str);
void hirate_rreader_free(hirate_rreader *r);

/* Takes len more bytes of the stream. 0, or -1 with *why set when they would
 * take the reply past max_bytes. */
int hirate_rreader_feed(hirate_rreader *r, const char *buf, size_t len, const char **why);

/* 1 with *out (free it with hirate_rnode_free) when a whole reply is there,
 * 0 when more bytes are needed, -1 with *why when the bytes are not RESP or
 * break a bound. */
int hirate_rreader_next(hirate_rreader *r, hirate_rnode **out, const char **why);

/* Bytes taken but not yet part of a reply that was returned. */
size_t hirate_rreader_pending(const hirate_rreader *r);

void hirate_rnode_free(hirate_rnode *n);

#endif
