/* A policy's name, as bands and response headers take it. */
#ifndef HIRATE_NAME_H
#define HIRATE_NAME_H

#include <stddef.h>

/* 0 when name is 1..HIRATE_BAND_NAME_MAX printable ASCII bytes (it is sent
 * in headers, as a Structured Fields string); else HIRATE_EOPTION with a
 * message "<what>: ..." in err. */
int hirate__name_check(const char *name, const char *what, char *err, size_t errlen);

#endif
