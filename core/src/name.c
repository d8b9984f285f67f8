/* A policy's name: the one rule for a band's name and a response limit's. */
#include <string.h>

#include "errors.h"
#include "hirate.h"
#include "name.h"

int hirate__name_check(const char *name, const char *what, char *err, size_t errlen)
{
    size_t len = strlen(name);
    if (len == 0 || len > HIRATE_BAND_NAME_MAX)
        return hirate__fail(err, errlen, HIRATE_EOPTION,
                            "%s: a band's name must be 1 to %d bytes, got %zu", what,
                            HIRATE_BAND_NAME_MAX, len);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)name[i] < 0x20 || (unsigned char)name[i] > 0x7e)
            return hirate__fail(err, errlen, HIRATE_EOPTION,
                                "%s: a band's name must be printable ASCII (it is sent in "
                                "headers)", what);
    return 0;
}
