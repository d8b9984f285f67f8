/*
 * The options whose ranges a front end needs before it has a C field to
 * put the value in: max_keys, a size_t that a host's integer (negative, or
 * wider) may not fit. The range is here, once: hirate_limiter_new checks the
 * C field against it, and hirate_options_set_max_keys checks a host's
 * integer against it, with the same words. And on_error by its name, with
 * one message for every front end.
 */
#include <stddef.h>
#include <string.h>

#include "errors.h"
#include "options.h"

#define MAX_KEYS_MAX 4000000000LL

static int max_keys_check(long long n, char *err, size_t errlen)
{
    if (n < 1 || n > MAX_KEYS_MAX)
        return hirate__fail(err, errlen, HIRATE_EOPTION,
                            "max_keys must be from 1 to %lld, got %lld", MAX_KEYS_MAX, n);
    return 0;
}

int hirate__max_keys_check(size_t n, char *err, size_t errlen)
{
    return max_keys_check(n > (size_t)MAX_KEYS_MAX ? MAX_KEYS_MAX + 1 : (long long)n, err, errlen);
}

int hirate_options_set_max_keys(hirate_options *o, long long n, char *err, size_t errlen)
{
    if (!o)
        return hirate__fail(err, errlen, HIRATE_EINVAL,
                            "hirate_options_set_max_keys needs options");
    int rc = max_keys_check(n, err, errlen);
    if (rc < 0)
        return rc;
    o->max_keys = (size_t)n;
    return 0;
}

int hirate_options_set_on_error(hirate_options *o, const char *name, char *err, size_t errlen)
{
    if (!o || !name)
        return hirate__fail(err, errlen, HIRATE_EINVAL,
                            "hirate_options_set_on_error needs options and a name");
    int v = hirate_on_error_from_name(name);
    if (v < 0) {
        char shown[96];
        hirate__quote(shown, sizeof shown, name, strlen(name));
        return hirate__fail(err, errlen, HIRATE_EOPTION,
                            "on_error must be \"local\", \"open\" or \"closed\", got %s", shown);
    }
    o->on_error = v;
    return 0;
}
