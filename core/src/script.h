/* The Redis script, embedded at build time (see script.c.in). */
#ifndef HIRATE_SCRIPT_H
#define HIRATE_SCRIPT_H

#include <stddef.h>

extern const char *const hirate__script;
extern const size_t hirate__script_len;
extern const char hirate__script_sha1[41];

#endif
