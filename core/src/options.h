/* The ranges of the options a front end sets through a function (options.c). */
#ifndef HIRATE_OPTIONS_H
#define HIRATE_OPTIONS_H

#include <stddef.h>

#include "hirate.h"

/* Checks the C field max_keys against its range: 0, or HIRATE_EOPTION with
 * the message hirate_options_set_max_keys gives (a value past the range is
 * reported as one more than its top). */
int hirate__max_keys_check(size_t n, char *err, size_t errlen);

#endif
