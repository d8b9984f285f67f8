/* The handshake op of hirate_io.h, made for a link (link.c lets it start). */
#ifndef HIRATE_HANDSHAKE_H
#define HIRATE_HANDSHAKE_H

#include "hirate_io.h"

struct hirate_link;

/* 0, or HIRATE_ENOMEM. */
int hirate__handshake_new(struct hirate_link *k, hirate_handshake **out);

#endif
