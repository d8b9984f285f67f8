/* The ranges of the options that are durations (duration.c). */
#ifndef HIRATE_DURATION_H
#define HIRATE_DURATION_H

#include <stddef.h>

#include "hirate.h"

/* Checks the C field of duration option name ("timeout", "connect_timeout",
 * "deny_cache_max") against its range: 0, or HIRATE_EOPTION with a message
 * in milliseconds, as C sets it ("timeout_ms must be from 1 to 60000, got 0"). */
int hirate__duration_check(const hirate_options *o, const char *name, char *err, size_t errlen);

#endif
