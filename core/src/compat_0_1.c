/*
 * hirate 0.1's ABI, in the shared library only. 0.1's hirate_options had no
 * size and a shorter layout, so a program built against 0.1's hirate.h calls
 * hirate_options_init and hirate_limiter_new on that layout. Both symbols
 * keep it under the version node HIRATE_0.1 (core/hirate.map), where the
 * dynamic linker binds such a program's unversioned references; a program
 * built since calls hirate_options_init_size and hirate_limiter_new@@HIRATE_0.2.
 * A static link has one header and needs none of this.
 */
#include <string.h>

/* This file defines 0.1's hirate_options under its own name, so that the
 * debug information (and abidiff) sees 0.1's type behind 0.1's symbols. */
#define hirate_options hirate_options_0_2
#include "hirate.h"
#undef hirate_options

/* 0.1's hirate_options, field for field (tests/abi/hirate-0.1.0.h). */
typedef struct hirate_options {
    const char *url;
    int64_t capacity;
    double rate;
    const char *prefix;
    int connect_timeout_ms;
    int timeout_ms;
    int pool_size;
    size_t max_keys;
    int on_error;
    int instances;
    int backoff_min_ms;
    int backoff_max_ms;
    int deny_cache;
    size_t deny_cache_keys;
} hirate_options;

#define COMPAT_EXPORT __attribute__((visibility("default")))
COMPAT_EXPORT void compat_options_init_0_1(hirate_options *opts);
COMPAT_EXPORT int compat_limiter_new_0_1(hirate_limiter **out, const hirate_options *opts,
                                         char *errbuf, size_t errlen);
COMPAT_EXPORT int compat_limiter_new_0_2(hirate_limiter **out, const hirate_options_0_2 *opts,
                                         char *errbuf, size_t errlen);
__asm__(".symver compat_options_init_0_1, hirate_options_init@@HIRATE_0.1");
__asm__(".symver compat_limiter_new_0_1, hirate_limiter_new@HIRATE_0.1");
__asm__(".symver compat_limiter_new_0_2, hirate_limiter_new@@HIRATE_0.2");

/* limiter.c's hirate_limiter_new, which is weak: this file's versions take
 * its name in the shared library. */
int hirate__limiter_new(hirate_limiter **out, const hirate_options_0_2 *opts, char *errbuf,
                        size_t errlen);

int compat_limiter_new_0_2(hirate_limiter **out, const hirate_options_0_2 *opts, char *errbuf,
                           size_t errlen)
{
    return hirate__limiter_new(out, opts, errbuf, errlen);
}

/* 0.1's defaults are today's for the same fields: take them from there. */
void compat_options_init_0_1(hirate_options *o)
{
    hirate_options_0_2 d;
    hirate_options_init(&d);
    memset(o, 0, sizeof *o);
    o->url = d.url;
    o->capacity = d.capacity;
    o->rate = d.rate;
    o->prefix = d.prefix;
    o->connect_timeout_ms = d.connect_timeout_ms;
    o->timeout_ms = d.timeout_ms;
    o->pool_size = d.pool_size;
    o->max_keys = d.max_keys;
    o->on_error = d.on_error;
    o->instances = d.instances;
    o->backoff_min_ms = d.backoff_min_ms;
    o->backoff_max_ms = d.backoff_max_ms;
    o->deny_cache = d.deny_cache;
    o->deny_cache_keys = d.deny_cache_keys;
}

/* The fields 0.1 did not have keep today's defaults. */
int compat_limiter_new_0_1(hirate_limiter **out, const hirate_options *old, char *errbuf,
                           size_t errlen)
{
    if (!old)
        return hirate__limiter_new(out, NULL, errbuf, errlen);
    hirate_options_0_2 o;
    hirate_options_init(&o);
    o.url = old->url;
    o.capacity = old->capacity;
    o.rate = old->rate;
    o.prefix = old->prefix;
    o.connect_timeout_ms = old->connect_timeout_ms;
    o.timeout_ms = old->timeout_ms;
    o.pool_size = old->pool_size;
    o.max_keys = old->max_keys;
    o.on_error = old->on_error;
    o.instances = old->instances;
    o.backoff_min_ms = old->backoff_min_ms;
    o.backoff_max_ms = old->backoff_max_ms;
    o.deny_cache = old->deny_cache;
    o.deny_cache_keys = old->deny_cache_keys;
    return hirate__limiter_new(out, &o, errbuf, errlen);
}
