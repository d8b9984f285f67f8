/*
 * A library with hirate 0.1's soname and symbols, none versioned, as 0.1's
 * libhirate was: old_program links against it, so that its references are a
 * 0.1 program's, then runs with the real library in its place. Nothing here
 * is ever called.
 */
#include <stdlib.h>

#include "hirate-0.1.0.h"

const char *hirate_strerror(int code) { (void)code; abort(); }
const char *hirate_err_name(int code) { (void)code; abort(); }
const char *hirate_source_name(int source) { (void)source; abort(); }
const char *hirate_on_error_name(int on_error) { (void)on_error; abort(); }
int hirate_on_error_from_name(const char *name) { (void)name; abort(); }
void hirate_options_init(hirate_options *opts) { (void)opts; abort(); }
int hirate_limiter_new(hirate_limiter **out, const hirate_options *opts, char *errbuf,
                       size_t errlen)
{
    (void)out, (void)opts, (void)errbuf, (void)errlen;
    abort();
}
void hirate_limiter_free(hirate_limiter *lim) { (void)lim; abort(); }
int hirate_allow(hirate_limiter *lim, const void *key, size_t keylen, int64_t cost,
                 hirate_decision *out)
{
    (void)lim, (void)key, (void)keylen, (void)cost, (void)out;
    abort();
}
int hirate_peek(hirate_limiter *lim, const void *key, size_t keylen, int64_t cost,
                hirate_decision *out)
{
    (void)lim, (void)key, (void)keylen, (void)cost, (void)out;
    abort();
}
int hirate_reset(hirate_limiter *lim, const void *key, size_t keylen)
{
    (void)lim, (void)key, (void)keylen;
    abort();
}
int hirate_allow_many(hirate_limiter *lim, hirate_item *items, size_t n)
{
    (void)lim, (void)items, (void)n;
    abort();
}
const char *hirate_limiter_errmsg(hirate_limiter *lim, char *buf, size_t len)
{
    (void)lim, (void)buf, (void)len;
    abort();
}
const char *hirate_script_source(size_t *len) { (void)len; abort(); }
const char *hirate_script_sha1(void) { abort(); }
const char *hirate_version(void) { abort(); }
