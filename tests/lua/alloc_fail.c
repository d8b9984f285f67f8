/*
 * hirate.core when Lua runs out of memory: runs tests/lua/alloc_fail.lua again
 * and again in a fresh Lua 5.4 state whose allocator refuses every new block
 * from the n-th on, for n = 1, 2, 3, ... until the script runs through. Each
 * refusal is a memory error thrown (a longjmp) from wherever the binding
 * was; then lua_close() must free everything. Built with AddressSanitizer by
 * tests/lua/run.sh, so that a leak, a double free or a use after free on any
 * of those paths fails the run. A limiter that is never freed would not show
 * as a leak (the core keeps every live limiter on its fork list), so the
 * program is linked with -Wl,--wrap for hirate_limiter_new/_free,
 * hirate_op_start/_start_bands/_start_reset/_free and
 * hirate_handshake_start/_free and hirate_node_handshake_start (the one the
 * module calls), counts what the module makes and frees, and after each
 * lua_close() every count must be back to 0. A link without the last wrap
 * would count no handshake at all: the program refuses to run then.
 *
 *     alloc_fail <path/to/alloc_fail.lua>
 *
 * Only Lua's allocations fail; the C core's own (malloc) do not.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hirate_io.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

int luaopen_hirate_core(lua_State *L);

static long countdown = -1;   /* allocations left before refusing; -1: never */

static void *alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    (void)ud;
    if (nsize == 0) {
        free(ptr);
        return NULL;
    }
    /* Lua counts on a block that shrinks never failing. */
    if ((!ptr || nsize > osize) && countdown >= 0 && countdown-- == 0) {
        countdown = 0;   /* and every one after it */
        return NULL;
    }
    return realloc(ptr, nsize);
}

/* What the module made through the core and has not freed yet. */
static long live_limiters, live_ops, live_handshakes;

int __real_hirate_limiter_new(hirate_limiter **out, const hirate_options *o, char *err,
                              size_t len);
void __real_hirate_limiter_free(hirate_limiter *lim);
int __real_hirate_op_start(hirate_limiter *lim, hirate_item *items, size_t n, int spend,
                           int64_t now_us, hirate_op **op);
int __real_hirate_op_start_bands(hirate_limiter *lim, hirate_item *items, size_t n, int spend,
                                 int64_t now_us, hirate_decision *bands, hirate_op **op);
int __real_hirate_op_start_reset(hirate_limiter *lim, const void *key, size_t keylen,
                                 hirate_op **op);
void __real_hirate_op_free(hirate_op *op);
int __real_hirate_handshake_start(hirate_limiter *lim, hirate_handshake **out, char *err,
                                  size_t errlen);
/* Weak: NULL when the program was linked without its wrap. */
int __real_hirate_node_handshake_start(hirate_limiter *lim, int node, hirate_handshake **out,
                                       char *err, size_t errlen) __attribute__((weak));
void __real_hirate_handshake_free(hirate_handshake *hs);
int __wrap_hirate_limiter_new(hirate_limiter **out, const hirate_options *o, char *err,
                              size_t len);
void __wrap_hirate_limiter_free(hirate_limiter *lim);
int __wrap_hirate_op_start(hirate_limiter *lim, hirate_item *items, size_t n, int spend,
                           int64_t now_us, hirate_op **op);
int __wrap_hirate_op_start_bands(hirate_limiter *lim, hirate_item *items, size_t n, int spend,
                                 int64_t now_us, hirate_decision *bands, hirate_op **op);
int __wrap_hirate_op_start_reset(hirate_limiter *lim, const void *key, size_t keylen,
                                 hirate_op **op);
void __wrap_hirate_op_free(hirate_op *op);
int __wrap_hirate_handshake_start(hirate_limiter *lim, hirate_handshake **out, char *err,
                                  size_t errlen);
int __wrap_hirate_node_handshake_start(hirate_limiter *lim, int node, hirate_handshake **out,
                                       char *err, size_t errlen);
void __wrap_hirate_handshake_free(hirate_handshake *hs);

int __wrap_hirate_limiter_new(hirate_limiter **out, const hirate_options *o, char *err,
                              size_t len)
{
    int rc = __real_hirate_limiter_new(out, o, err, len);
    live_limiters += rc == 0;
    return rc;
}

void __wrap_hirate_limiter_free(hirate_limiter *lim)
{
    live_limiters -= lim != NULL;
    __real_hirate_limiter_free(lim);
}

int __wrap_hirate_op_start(hirate_limiter *lim, hirate_item *items, size_t n, int spend,
                           int64_t now_us, hirate_op **op)
{
    int rc = __real_hirate_op_start(lim, items, n, spend, now_us, op);
    live_ops += rc == 1;
    return rc;
}

int __wrap_hirate_op_start_bands(hirate_limiter *lim, hirate_item *items, size_t n, int spend,
                                 int64_t now_us, hirate_decision *bands, hirate_op **op)
{
    int rc = __real_hirate_op_start_bands(lim, items, n, spend, now_us, bands, op);
    live_ops += rc == 1;
    return rc;
}

int __wrap_hirate_op_start_reset(hirate_limiter *lim, const void *key, size_t keylen,
                                 hirate_op **op)
{
    int rc = __real_hirate_op_start_reset(lim, key, keylen, op);
    live_ops += rc == 1;
    return rc;
}

void __wrap_hirate_op_free(hirate_op *op)
{
    live_ops -= op != NULL;
    __real_hirate_op_free(op);
}

/* The handshakes the module started: the core's own blocking client frees
 * handshakes it made itself through the same hirate_handshake_free, and
 * those are not the module's to count. */
static hirate_handshake *started[64];

/* Counts a handshake the module started, once (hirate_handshake_start may
 * go through hirate_node_handshake_start). */
static void count_started(hirate_handshake *hs)
{
    size_t i, free_at = sizeof started / sizeof *started;
    for (i = 0; i < sizeof started / sizeof *started; i++) {
        if (started[i] == hs)
            return;
        if (!started[i] && free_at == sizeof started / sizeof *started)
            free_at = i;
    }
    if (free_at == sizeof started / sizeof *started) {
        fprintf(stderr, "alloc_fail: more than %zu handshakes at once\n", free_at);
        abort();
    }
    started[free_at] = hs;
    live_handshakes++;
}

int __wrap_hirate_handshake_start(hirate_limiter *lim, hirate_handshake **out, char *err,
                                  size_t errlen)
{
    int rc = __real_hirate_handshake_start(lim, out, err, errlen);
    if (rc == 0)
        count_started(*out);
    return rc;
}

int __wrap_hirate_node_handshake_start(hirate_limiter *lim, int node, hirate_handshake **out,
                                       char *err, size_t errlen)
{
    int rc = __real_hirate_node_handshake_start(lim, node, out, err, errlen);
    if (rc == 0)
        count_started(*out);
    return rc;
}

void __wrap_hirate_handshake_free(hirate_handshake *hs)
{
    for (size_t i = 0; hs && i < sizeof started / sizeof *started; i++)
        if (started[i] == hs) {
            started[i] = NULL;
            live_handshakes--;
        }
    __real_hirate_handshake_free(hs);
}

/* One run with allocations refused from the n-th on: 1 when the script ran
 * through, 0 when it met its memory error, -1 on any other error. */
static int run(const char *path, long n, char *why, size_t len)
{
    lua_State *L = lua_newstate(alloc, NULL);
    if (!L)
        return -1;
    luaL_openlibs(L);
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
    lua_pushcfunction(L, luaopen_hirate_core);
    lua_setfield(L, -2, "hirate.core");
    lua_pop(L, 1);
    int rc = -1;
    if (luaL_loadfile(L, path) != LUA_OK) {
        snprintf(why, len, "%s", lua_tostring(L, -1));
    } else {
        countdown = n;
        int st = lua_pcall(L, 0, 1, 0);
        countdown = -1;
        if (st == LUA_OK) {
            rc = 1;
        } else if (st == LUA_ERRMEM ||
                   (lua_type(L, -1) == LUA_TSTRING &&
                    strstr(lua_tostring(L, -1), "not enough memory"))) {
            rc = 0;
        } else {
            snprintf(why, len, "%s", lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1)
                                                                     : "(an error object)");
        }
    }
    lua_close(L);
    return rc;
}

int main(int argc, char **argv)
{
    char why[512] = "";
    if (argc != 2) {
        fprintf(stderr, "usage: %s <alloc_fail.lua>\n", argv[0]);
        return 2;
    }
    if (!__real_hirate_node_handshake_start) {
        fprintf(stderr, "alloc_fail: linked without -Wl,--wrap=hirate_node_handshake_start: "
                        "the module's handshakes would go uncounted\n");
        return 2;
    }
    for (long n = 0; n < 1000000; n++) {
        int rc = run(argv[1], n, why, sizeof why);
        if (live_limiters != 0 || live_ops != 0 || live_handshakes != 0) {
            fprintf(stderr, "alloc_fail: failing from allocation %ld on: %ld limiters, %ld "
                    "ops and %ld handshakes were never freed\n", n + 1, live_limiters, live_ops,
                    live_handshakes);
            return 1;
        }
        if (rc < 0) {
            fprintf(stderr, "alloc_fail: failing from allocation %ld on: %s\n", n + 1, why);
            return 1;
        }
        if (rc == 1) {
            printf("alloc_fail: a memory error at each of the script's first %ld allocations; "
                   "every state closed cleanly\n", n);
            return n > 100 ? 0 : 1;   /* the script must have allocated, or it tested nothing */
        }
    }
    fprintf(stderr, "alloc_fail: the script never ran through\n");
    return 1;
}
