/* The Redis script, embedded at build time (see script.c.in). */
#ifndef HIRATE_SCRIPT_H
#define HIRATE_SCRIPT_H

#include <stddef.h>

extern const char *const hirate__script;
extern const size_t hirate__script_len;
extern const char hirate__script_sha1[41];
/* The script inside a Redis Functions library, and its function's name
 * ("hirate_" and the first 16 hex digits of the script's SHA1). */
extern const char *const hirate__library;
extern const size_t hirate__library_len;
extern const char hirate__function_name[24];

#endif
