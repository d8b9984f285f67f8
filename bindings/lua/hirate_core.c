/*
 * hirate.core: the Lua binding of the hirate C core.
 *
 * One source for Lua 5.1 to 5.4 and LuaJIT (the differences live in
 * hirate_compat.h). The shape follows lua-cjson and luasocket: a limiter is a
 * userdata with a metatable; close() is idempotent and serves __gc and, on
 * 5.4, __close; argument errors raise; runtime errors return
 * nil, message, code, where code is the error's name without the HIRATE_
 * prefix ("EAUTH").
 *
 * Plain Lua uses the core's blocking client (hirate_allow and friends). The
 * methods whose names start with an underscore are the hooks of the
 * OpenResty path (hirate/resty.lua), which does the network I/O itself
 * through cosockets and lets the core decide everything else through the
 * public no-I/O API of hirate_io.h (the endpoint, the handshake op, the call
 * ops), and of the tests (injected time, counters). They are not public API.
 *
 * A Redis Cluster URL (redis+cluster://, rediss+cluster://) needs nothing
 * more in plain Lua: the core's blocking client routes every key to its
 * node. The OpenResty path runs a cluster's ops in rounds of legs (op:legs(),
 * op:leg_node(leg) ... op:next()), each leg on a cosocket of the node the
 * core names (lim:_endpoint(node), lim:_handshake_start(node)). Legs are
 * numbered from 1, as Lua numbers things; nodes keep the core's numbers (0
 * is the URL's first host), which only name them.
 * A Sentinel URL (redis+sentinel://, rediss+sentinel://) needs nothing more
 * either: its nodes are the sentinels and the masters they name, each with
 * the endpoint and handshake the core gives (a sentinel's own credentials,
 * ROLE for a master), and the OpenResty path runs its ops in rounds of legs
 * as a cluster's (lim:_is_sentinel()).
 * Only hirate.h and hirate_io.h are included: the binding knows no more of
 * the core than any other program could.
 *
 * The core's log lines (a breaker opened or closed, a Sentinel master found
 * or moved, Redis Functions refused by a server) arrive in log_line(),
 * which may run inside a call of the core, on any thread: it never calls
 * Lua, it queues the line in the limiter's userdata (a few lines, the
 * oldest dropped when full). The methods of plain Lua hand the queue to the
 * `log` function once the core has returned; the OpenResty path takes it
 * with lim:_log_next() after each call and writes it with ngx.log.
 *
 * Memory: nothing here mallocs. Scratch space and keys live in userdata, so
 * an error raised halfway (a longjmp) leaks nothing; the only C allocations
 * are the core's own limiter, ops and handshakes, each stored in its
 * userdata the moment it exists, and each also on its state's list of owned
 * objects (below: "the owner", whose entries come from the state's own
 * allocator), since Lua may collect a userdata without calling its __gc.
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hirate.h"
#include "hirate_compat.h"
#include "hirate_io.h"

#define LIMITER_MT "hirate.limiter"
#define OP_MT "hirate.op"
#define HS_MT "hirate.handshake"

#if defined(__GNUC__)
#define HL_EXPORT __attribute__((visibility("default")))
#else
#define HL_EXPORT
#endif

/* Limiters made and not yet freed, in every Lua state of the process: the
 * tests check that the garbage collector frees an open limiter. */
static long live_limiters;

/* The core's log lines not yet handed to Lua. The core logs an event once,
 * not once a call, so a few lines are room enough; when they are not, the
 * oldest goes. */
#define LOG_LINES 8
#define LOG_LINE_MAX 512

typedef struct log_queue {
    int lock;               /* a spin lock (__atomic): the core may log from any thread */
    unsigned pending;       /* lines queued; read without the lock, so a call that
                               logged nothing pays one load */
    unsigned head;          /* the oldest line */
    struct {
        int level;          /* HIRATE_LOG_* */
        char msg[LOG_LINE_MAX];
    } lines[LOG_LINES];
} log_queue;

struct owned;

typedef struct limiter_ud {
    hirate_limiter *lim;    /* NULL once freed */
    struct owned *own;      /* lim's entry on the owner's list, while it has one */
    int closed;             /* close() was called: every call answers ECLOSED */
    int users;              /* ops and handshakes still holding lim: it outlives them */
    int has_redis;
    size_t nbands;          /* the limiter's bands: 1 for capacity and rate */
    int show_bands;         /* made with limits: allow and peek give each
                               band's figures too (`bands`), even of one band;
                               capacity and rate keep the shorter path */
    log_queue *logq;        /* with a log function: in this userdata, after where */
    char where[];           /* "memory", or the URL with the password as *** */
} limiter_ud;

/* The limiter's uservalue: [1] its log function, when it has one; [2] what
 * tostring shows of its limit; with show_bands, [3 + i] band i's name,
 * interned once so that a decision's band tables get it without hashing. */
enum { UV_LIM_LOG = 1, UV_LIM_DESC, UV_LIM_NAMES };

/* Zeroed memory is an op that is done with nothing held: what __gc meets
 * when making the op's userdata raised (out of memory) halfway. */
enum { OP_DONE, OP_PENDING };

typedef struct op_ud {
    hirate_op *op;          /* the core's op while it waits for Redis */
    struct owned *own;      /* op's entry on the owner's list */
    limiter_ud *lud;        /* while op is held; the uservalue keeps it alive */
    int state;
    int reset;              /* an op of _op_start_reset: result(), not results() */
    int check;              /* an op of _op_start_check: health() */
    int drop;               /* once answered: the connection must be closed */
    int rc;                 /* once answered: a reset's outcome */
    size_t n;
    int show_bands;         /* its limiter's: decisions have band */
    size_t nbands;          /* with show_bands: each item's band figures, */
    hirate_decision *bands; /* nbands an item, which the core writes as it
                               decides the item (source 0: not decided) */
    hirate_item items[];    /* then the band figures, then the keys' bytes:
                               the core points into them */
} op_ud;

/* An op's uservalue: [1] its limiter's userdata; once the op is answered,
 * [2 + i] item i's message when it failed ([2]: a reset's; a check's
 * health table). */
enum { UV_OP_LIMITER = 1, UV_OP_MESSAGES };

/* Zeroed memory is a freed handshake, as for ops. */
enum { HS_FREED, HS_RUNNING, HS_DONE };

typedef struct hs_ud {
    hirate_handshake *hs;   /* the core's handshake, until free() */
    struct owned *own;      /* hs's entry on the owner's list */
    limiter_ud *lud;        /* while hs is held; the uservalue keeps it alive */
    int state;
} hs_ud;

/* ---- the owner: every core object, whatever Lua's collector skips ------------------ */

/* Lua may collect a userdata without calling its __gc: a finalizer whose
 * call cannot even start (Lua has no memory for the call's frame while an
 * allocation fails) is reported as a warning and never tried again. A
 * limiter, op or handshake held only by that userdata would have no owner
 * left. So each is also on a list that the Lua state owns (a userdata in
 * the registry, made when the module is opened), in blocks of the state's
 * allocator that no collection frees: the userdata's own release frees the
 * object and takes it off the list; the list's __gc, at lua_close, frees
 * what is still on it. Being the module's first userdata with a __gc, it
 * is finalized after every other of the module's. An op or handshake that
 * lost its __gc so keeps its limiter (users) until lua_close. */
enum { OWN_OP, OWN_HS, OWN_LIMITER };

typedef struct owned {
    struct owned *prev, *next;
    struct owner *owner;
    int kind;               /* OWN_* */
    void *obj;              /* the core's object; NULL until it exists */
} owned;

typedef struct owner {
    owned ring;             /* the list's head: ring.next is the newest */
    lua_Alloc alloc;        /* the state's, for the entries */
    void *alloc_ud;
} owner;

static const char owner_key;   /* its address: the owner's key in the registry */

/* A new entry of kind on the state's list, taken before the core's object
 * is made, so that storing the object in it (entry->obj) cannot fail. */
static owned *owned_new(lua_State *L, int kind)
{
    lua_pushlightuserdata(L, (void *)&owner_key);
    lua_rawget(L, LUA_REGISTRYINDEX);
    owner *ow = (owner *)lua_touserdata(L, -1);
    lua_pop(L, 1);
    owned *e = ow ? (owned *)ow->alloc(ow->alloc_ud, NULL, 0, sizeof *e) : NULL;
    if (!e)
        luaL_error(L, "not enough memory");
    e->owner = ow;
    e->kind = kind;
    e->obj = NULL;
    e->prev = &ow->ring;
    e->next = ow->ring.next;
    ow->ring.next->prev = e;
    ow->ring.next = e;
    return e;
}

/* Takes *ep off the list (its object is freed, or was never made). */
static void owned_free(owned **ep)
{
    owned *e = *ep;
    if (!e)
        return;
    *ep = NULL;
    e->prev->next = e->next;
    e->next->prev = e->prev;
    e->owner->alloc(e->owner->alloc_ud, e, sizeof *e, 0);
}

/* The owner's __gc (lua_close): frees the objects whose userdata never freed
 * them, the ops and handshakes before the limiters they use. Allocates
 * nothing, so nothing can stop it halfway. */
static int l_owner_gc(lua_State *L)
{
    owner *ow = (owner *)lua_touserdata(L, 1);
    for (int kind = OWN_OP; kind <= OWN_LIMITER; kind++) {
        owned *e = ow->ring.next;
        while (e != &ow->ring) {
            owned *next = e->next;
            if (e->kind == kind) {
                if (kind == OWN_OP)
                    hirate_op_free((hirate_op *)e->obj);
                else if (kind == OWN_HS)
                    hirate_handshake_free((hirate_handshake *)e->obj);
                else if (e->obj) {
                    hirate_limiter_free((hirate_limiter *)e->obj);
                    __atomic_fetch_sub(&live_limiters, 1, __ATOMIC_RELAXED);
                }
                owned_free(&e);
            }
            e = next;
        }
    }
    return 0;
}

/* Makes the state's owner once (the module may be opened again). */
static void open_owner(lua_State *L)
{
    lua_pushlightuserdata(L, (void *)&owner_key);
    lua_rawget(L, LUA_REGISTRYINDEX);
    int have = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (have)
        return;
    owner *ow = (owner *)lua_newuserdata(L, sizeof *ow);
    ow->ring.prev = ow->ring.next = &ow->ring;
    ow->alloc = lua_getallocf(L, &ow->alloc_ud);
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, l_owner_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    lua_pushlightuserdata(L, (void *)&owner_key);
    lua_pushvalue(L, -2);
    lua_rawset(L, LUA_REGISTRYINDEX);
    lua_pop(L, 1);
}

/* ---- errors -------------------------------------------------------------------- */

/* Raises "bad argument #arg to 'f' (message)", formatted. */
static int arg_errorf(lua_State *L, int arg, const char *fmt, ...)
{
    char msg[HIRATE_ERRMSG_SIZE + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return luaL_argerror(L, arg, msg);
}

/* "EAUTH" for HIRATE_EAUTH: the core's name. */
static const char *code_name(int rc)
{
    return hirate_err_name(rc);
}

static int push_closed(lua_State *L)
{
    lua_pushnil(L);
    lua_pushstring(L, hirate_strerror(HIRATE_ECLOSED));
    lua_pushstring(L, code_name(HIRATE_ECLOSED));
    return 3;
}

static int push_error(lua_State *L, int rc, const char *msg)
{
    lua_pushnil(L);
    lua_pushstring(L, msg && msg[0] ? msg : hirate_strerror(rc));
    lua_pushstring(L, code_name(rc));
    return 3;
}

/* nil, the limiter's message for rc, its code. */
static int push_failure(lua_State *L, limiter_ud *u, int rc)
{
    char msg[HIRATE_ERRMSG_SIZE];
    hirate_limiter_errmsg(u->lim, msg, sizeof msg);
    return push_error(L, rc, msg);
}

/* ---- numbers --------------------------------------------------------------------- */

/* The shortest %g that reads back as the same double: 2 for 2.0, 0.1 for 0.1. */
static void format_double(char *buf, size_t len, double v)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

/* The number or value at idx as a message shows it. */
static const char *describe(lua_State *L, int idx, char *buf, size_t len)
{
    if (lua_type(L, idx) != LUA_TNUMBER)
        return luaL_typename(L, idx);
    int64_t i;
    if (hl_toint64(L, idx, &i)) {
        snprintf(buf, len, "%lld", (long long)i);
    } else {
        format_double(buf, len, (double)lua_tonumber(L, idx));
        /* A whole float (5.3 and later) as Lua shows it: 10.0, not 10. */
        if (strspn(buf, "-0123456789") == strlen(buf) && strlen(buf) + 2 < len)
            strcat(buf, ".0");
    }
    return buf;
}

/* A whole number too large for int64_t, which only doubles can hold (5.1,
 * LuaJIT): a value out of range, not a fraction, as the message must say. On
 * 5.3 and later such a number is a float, and so not an integer anyway. */
static int beyond_int64(lua_State *L, int idx)
{
#if LUA_VERSION_NUM >= 503
    (void)L;
    (void)idx;
    return 0;
#else
    int64_t v;
    lua_Number n = lua_tonumber(L, idx);
    return lua_type(L, idx) == LUA_TNUMBER && n == floor(n) && !hl_toint64(L, idx, &v);
#endif
}

/* An integer at idx into *out. what names it in messages ("cost",
 * "item 2: cost"); arg is the argument to blame. */
static void check_int(lua_State *L, int idx, int arg, const char *what, int64_t *out)
{
    char buf[64];
    if (lua_type(L, idx) != LUA_TNUMBER)
        arg_errorf(L, arg, "%s must be an integer, got %s", what, luaL_typename(L, idx));
    if (!hl_toint64(L, idx, out))
        arg_errorf(L, arg, "%s must be an integer, got %s", what, describe(L, idx, buf, sizeof buf));
}

/* A whole number of the range [lo, hi] at idx. */
static int64_t check_int_range(lua_State *L, int idx, int arg, const char *what, int64_t lo,
                               int64_t hi)
{
    char buf[64];
    int64_t v;
    check_int(L, idx, arg, what, &v);
    if (v < lo || v > hi)
        arg_errorf(L, arg, "%s must be from %lld to %lld, got %s", what, (long long)lo,
                   (long long)hi, describe(L, idx, buf, sizeof buf));
    return v;
}

/* ---- keys and costs: checked here, before the core sees them, so that a bad
 * item of a batch raises before any item of it was spent; the rules and their
 * words are the core's (hirate_check_key, hirate_check_cost) ---------------------- */

/* The message of the key at idx that a decision would refuse (what names it:
 * "key", "item 2: key") in msg, else NULL; its bytes in *key, *len. */
static const char *key_problem(lua_State *L, int idx, const char *what, const char **key,
                               size_t *len, char *msg, size_t n)
{
    *key = lua_type(L, idx) == LUA_TSTRING ? lua_tolstring(L, idx, len) : NULL;
    if (!*key) {
        snprintf(msg, n, "%s must be a string, got %s", what, luaL_typename(L, idx));
        return msg;
    }
    return hirate_check_key(*len, what, msg, n) < 0 ? msg : NULL;
}

/* The message of the cost at idx (a number) that a decision would refuse in
 * msg, else NULL with the cost in *cost. */
static const char *cost_problem(lua_State *L, int idx, const char *what, int64_t *cost,
                                char *msg, size_t n)
{
    char buf[64];
    if (lua_type(L, idx) != LUA_TNUMBER) {
        snprintf(msg, n, "%s must be an integer, got %s", what, luaL_typename(L, idx));
        return msg;
    }
    if (beyond_int64(L, idx)) {   /* out of range, not a fraction */
        hirate_range_errmsg(HIRATE_ECOST, what, describe(L, idx, buf, sizeof buf), msg, n);
        return msg;
    }
    if (!hl_toint64(L, idx, cost)) {
        snprintf(msg, n, "%s must be an integer, got %s", what, describe(L, idx, buf, sizeof buf));
        return msg;
    }
    return hirate_check_cost(*cost, what, msg, n) < 0 ? msg : NULL;
}

static const char *check_key(lua_State *L, int idx, int arg, int item, size_t *len)
{
    const char *key = lua_type(L, idx) == LUA_TSTRING ? lua_tolstring(L, idx, len) : NULL;
    if (key && hirate_check_key(*len, NULL, NULL, 0) == 0)
        return key;   /* the usual case: no message, so no label to format */
    char what[32] = "key", msg[HIRATE_ERRMSG_SIZE];
    if (item)
        snprintf(what, sizeof what, "item %d: key", item);
    key_problem(L, idx, what, &key, len, msg, sizeof msg);
    arg_errorf(L, arg, "%s", msg);
    return NULL;
}

/* A cost: nil means 1. */
static int64_t check_cost(lua_State *L, int idx, int arg, int item)
{
    int64_t cost;
    if (lua_isnoneornil(L, idx))
        return 1;
    if (lua_type(L, idx) == LUA_TNUMBER && hl_toint64(L, idx, &cost) &&
        hirate_check_cost(cost, NULL, NULL, 0) == 0)
        return cost;  /* the usual case: no message, so no label to format */
    char what[32] = "cost", msg[HIRATE_ERRMSG_SIZE];
    if (item)
        snprintf(what, sizeof what, "item %d: cost", item);
    cost_problem(L, idx, what, &cost, msg, sizeof msg);
    return arg_errorf(L, arg, "%s", msg);
}

/* key_error(key [, what]) -> nil or the message of a key a decision would
 * refuse; cost_error(cost [, what]) the same for a cost (nil is 1): for the
 * front ends in Lua (hirate.resty), which raise it in their own name. */
static int l_key_error(lua_State *L)
{
    const char *key, *what = luaL_optstring(L, 2, "key");
    size_t len;
    char msg[HIRATE_ERRMSG_SIZE];
    if (key_problem(L, 1, what, &key, &len, msg, sizeof msg))
        lua_pushstring(L, msg);
    else
        lua_pushnil(L);
    return 1;
}

static int l_cost_error(lua_State *L)
{
    const char *what = luaL_optstring(L, 2, "cost");
    int64_t cost;
    char msg[HIRATE_ERRMSG_SIZE];
    if (!lua_isnoneornil(L, 1) && cost_problem(L, 1, what, &cost, msg, sizeof msg))
        lua_pushstring(L, msg);
    else
        lua_pushnil(L);
    return 1;
}

/* A boolean at idx; arg is the argument to blame. */
static int check_boolean(lua_State *L, int idx, int arg, const char *what)
{
    if (lua_type(L, idx) != LUA_TBOOLEAN)
        arg_errorf(L, arg, "%s must be a boolean, got %s", what, luaL_typename(L, idx));
    return lua_toboolean(L, idx);
}

/* What a decision does with its cost: true spends it, false peeks, "refund"
 * gives it back (HIRATE_OP_*). */
static int check_spend(lua_State *L, int idx, int arg)
{
    if (lua_type(L, idx) == LUA_TSTRING && strcmp(lua_tostring(L, idx), "refund") == 0)
        return HIRATE_OP_REFUND;
    if (lua_type(L, idx) != LUA_TBOOLEAN)
        arg_errorf(L, arg, "spend must be a boolean or \"refund\", got %s",
                   luaL_typename(L, idx));
    return lua_toboolean(L, idx);
}

/* An injected time in µs: 0 to 2^53-1, the range of the vectors and of the
 * script's arithmetic. */
static int64_t check_now_us(lua_State *L, int arg)
{
    return check_int_range(L, arg, arg, "now_us", 0, HIRATE_EXACT_MAX);
}

/* The items of a batch, {{key, cost}, ...}, at arg: checks every one and
 * returns how many there are; *keybytes sums their keys' lengths. */
static size_t check_items(lua_State *L, int arg, size_t *keybytes)
{
    luaL_checktype(L, arg, LUA_TTABLE);
    size_t n = hl_rawlen(L, arg);
    if (n > INT_MAX / 2)
        arg_errorf(L, arg, "%lu items are too many", (unsigned long)n);
    *keybytes = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        lua_rawgeti(L, arg, (int)i + 1);
        if (lua_type(L, -1) != LUA_TTABLE)
            arg_errorf(L, arg, "item %d must be a table {key, cost}, got %s", (int)i + 1,
                       luaL_typename(L, -1));
        lua_rawgeti(L, -1, 1);
        lua_rawgeti(L, -2, 2);
        check_key(L, -2, arg, (int)i + 1, &len);
        check_cost(L, -1, arg, (int)i + 1);
        *keybytes += len;
        lua_pop(L, 3);
    }
    return n;
}

/* Fills items[0..n) from the checked table at arg. With keys non-NULL the
 * key bytes are copied there (the op keeps them); otherwise the items point
 * into the Lua strings, which the table keeps alive for the call. */
static void fill_items(lua_State *L, int arg, hirate_item *items, size_t n, char *keys)
{
    for (size_t i = 0; i < n; i++) {
        size_t len;
        lua_rawgeti(L, arg, (int)i + 1);
        lua_rawgeti(L, -1, 1);
        lua_rawgeti(L, -2, 2);
        const char *key = lua_tolstring(L, -2, &len);
        memset(&items[i], 0, sizeof items[i]);
        items[i].cost = check_cost(L, -1, arg, (int)i + 1);
        items[i].keylen = len;
        if (keys) {
            memcpy(keys, key, len);
            items[i].key = keys;
            keys += len;
        } else {
            items[i].key = key;
        }
        lua_pop(L, 3);
    }
}

/* ---- decisions ------------------------------------------------------------------- */

/* The strings a decision table is built from, made once at load time and
 * kept as upvalues of every function of a class (new_class): setting a
 * field through a string already on hand skips interning its name on every
 * call, which lua_setfield would do. The sources follow the field names in
 * the order of HIRATE_SOURCE_* (1..5). */
static const char *const decision_strings[] = {
    "allowed", "remaining", "limit", "retry_after", "reset_after", "source", "time", "band",
    "bands", "name", "error", "redis", "local", "cache", "fail_open", "fail_closed", "message"};
enum {
    UV_ALLOWED = 1, UV_REMAINING, UV_LIMIT, UV_RETRY_AFTER, UV_RESET_AFTER, UV_SOURCE, UV_TIME,
    UV_BAND, UV_BANDS, UV_NAME, UV_ERROR,
    UV_SOURCES = UV_ERROR,   /* + HIRATE_SOURCE_*: the source's name */
    UV_MESSAGE = UV_SOURCES + HIRATE_SOURCE_FAIL_CLOSED + 1,
    UV_COUNT = (int)(sizeof decision_strings / sizeof *decision_strings),
    UV_CLASS,                /* the class's own metatable (check_class) */
    UV_ALL = UV_CLASS
};

_Static_assert(UV_MESSAGE == UV_COUNT, "a decision string for every source, then message");

/* Pushes decision string k (a UV_* index). */
static inline void push_string(lua_State *L, int k)
{
    lua_pushvalue(L, lua_upvalueindex(k));
}

/* Pushes a decision as a table with room for fields fields, with band (a
 * limiter made with limits) or without (one of capacity and rate, whose one
 * band is the whole: its decisions cost what they always did). Only for the
 * functions of a class (new_class gives them the decision strings as
 * upvalues). band is the core's 0-based number, 1-based here as Lua numbers
 * things. */
static void push_decision_sized(lua_State *L, const hirate_decision *d, int fields, int band)
{
    lua_createtable(L, 0, fields);
    if (band) {
        push_string(L, UV_BAND);
        lua_pushinteger(L, (lua_Integer)d->band + 1);
        lua_rawset(L, -3);
    }
    push_string(L, UV_ALLOWED);
    lua_pushboolean(L, d->allowed);
    lua_rawset(L, -3);
    push_string(L, UV_REMAINING);
    hl_pushint64(L, d->remaining);
    lua_rawset(L, -3);
    push_string(L, UV_LIMIT);
    hl_pushint64(L, d->limit);
    lua_rawset(L, -3);
    /* Seconds as us / 1e6, one correctly rounded division, so that Lua code
     * computing the same quotient gets the same double. */
    push_string(L, UV_RETRY_AFTER);
    lua_pushnumber(L, d->retry_after_us == HIRATE_NEVER ? (lua_Number)HUGE_VAL
                                                         : (lua_Number)d->retry_after_us / 1e6);
    lua_rawset(L, -3);
    push_string(L, UV_RESET_AFTER);
    lua_pushnumber(L, (lua_Number)d->reset_after_us / 1e6);
    lua_rawset(L, -3);
    push_string(L, UV_SOURCE);
    if (d->source >= HIRATE_SOURCE_REDIS && d->source <= HIRATE_SOURCE_FAIL_CLOSED)
        push_string(L, UV_SOURCES + d->source);
    else
        lua_pushstring(L, hirate_source_name(d->source));
    lua_rawset(L, -3);
    /* When it was decided, in seconds: Redis' clock (since the epoch) for
     * Redis' own answers, this process' monotonic clock otherwise (or the
     * injected time). A double holds today's epoch microseconds to a quarter
     * of a microsecond, so the exact value is one rounding away. */
    push_string(L, UV_TIME);
    lua_pushnumber(L, (lua_Number)d->time_us / 1e6);
    lua_rawset(L, -3);
    if (d->error) {
        push_string(L, UV_ERROR);
        lua_pushstring(L, code_name(d->error));
        lua_rawset(L, -3);
    }
}

/* A decision of capacity and rate: seven fields, and error for a policy's
 * decision, in a table's eight slots. With band (a limiter made with
 * limits): eight, and error makes it grow. */
static void push_decision(lua_State *L, const hirate_decision *d, int band)
{
    push_decision_sized(L, d, 8, band);
}

/* Sets `bands` in the decision table on top: an array of each band's own
 * figures, bands[0 .. n), each a decision table of its own (band is its own
 * number) with the band's name. names is the stack index of the limiter's
 * uservalue, which holds the names (UV_LIM_NAMES). */
static void set_bands(lua_State *L, const hirate_decision *bands, size_t n, int names)
{
    push_string(L, UV_BANDS);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        hirate_decision b = bands[i];
        b.band = (int)i;
        push_decision_sized(L, &b, 9, 1);   /* and its name */
        push_string(L, UV_NAME);
        lua_rawgeti(L, names, UV_LIM_NAMES + (int)i);
        lua_rawset(L, -3);
        lua_rawseti(L, -2, (int)i + 1);
    }
    lua_rawset(L, -3);
}

/* An item of a batch that failed: {allowed = false, error = code, message =
 * msg}. No source, since nothing decided it; error is a code's name, as in a
 * decision the policy made; allowed is false, so that `if d.allowed` admits
 * only what was spent. */
static void push_item_error(lua_State *L, int rc, const char *msg)
{
    lua_createtable(L, 0, 3);
    push_string(L, UV_ALLOWED);
    lua_pushboolean(L, 0);
    lua_rawset(L, -3);
    push_string(L, UV_ERROR);
    lua_pushstring(L, code_name(rc));
    lua_rawset(L, -3);
    push_string(L, UV_MESSAGE);
    lua_pushstring(L, msg && msg[0] ? msg : hirate_strerror(rc));
    lua_rawset(L, -3);
}

/* An array with every item's outcome: its decision, or its error
 * (push_item_error) with the message msg(i). */
static void push_items(lua_State *L, const hirate_item *items, size_t n, int band,
                       const char *(*msg)(const void *ctx, size_t i, int rc), const void *ctx)
{
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        if (items[i].rc < 0)
            push_item_error(L, items[i].rc, msg(ctx, i, items[i].rc));
        else
            push_decision(L, &items[i].decision, band);
        lua_rawseti(L, -2, (int)i + 1);
    }
}

/* Adds to the array on top each item's band figures that the op kept
 * (allow and peek of a limiter made with limits); names is the stack index
 * of the limiter's uservalue. */
static void add_item_bands(lua_State *L, const op_ud *o, int names)
{
    for (size_t i = 0; i < o->n; i++) {
        const hirate_decision *b = o->bands + i * o->nbands;
        if (o->items[i].rc < 0 || b->source == 0)
            continue;
        lua_rawgeti(L, -1, (int)i + 1);
        set_bands(L, b, o->nbands, names);
        lua_pop(L, 1);
    }
}

/* ---- the core's log lines ----------------------------------------------------------- */

static void logq_lock(log_queue *q)
{
    while (__atomic_exchange_n(&q->lock, 1, __ATOMIC_ACQUIRE))
        ;
}

static void logq_unlock(log_queue *q)
{
    __atomic_store_n(&q->lock, 0, __ATOMIC_RELEASE);
}

/* The core's hirate_log_fn: queues the line, and calls no Lua (the core may
 * be in the middle of an op, or on another thread). A full queue loses its
 * oldest line. */
static void log_line(void *arg, int level, const char *msg)
{
    log_queue *q = (log_queue *)arg;
    logq_lock(q);
    unsigned n = q->pending, slot;
    if (n == LOG_LINES) {
        slot = q->head;
        q->head = (q->head + 1) % LOG_LINES;
    } else {
        slot = (q->head + n) % LOG_LINES;
        n++;
    }
    q->lines[slot].level = level;
    snprintf(q->lines[slot].msg, sizeof q->lines[slot].msg, "%s", msg ? msg : "");
    __atomic_store_n(&q->pending, n, __ATOMIC_RELEASE);
    logq_unlock(q);
}

/* Takes the oldest queued line; 0 when there is none (one load, no lock). */
static int logq_take(log_queue *q, int *level, char *msg)
{
    if (!q || __atomic_load_n(&q->pending, __ATOMIC_ACQUIRE) == 0)
        return 0;
    logq_lock(q);
    int got = q->pending > 0;
    if (got) {
        *level = q->lines[q->head].level;
        memcpy(msg, q->lines[q->head].msg, LOG_LINE_MAX);
        q->head = (q->head + 1) % LOG_LINES;
        __atomic_store_n(&q->pending, q->pending - 1, __ATOMIC_RELEASE);
    }
    logq_unlock(q);
    return got;
}

/* "warning" or "info": the names a log function gets. */
static const char *log_level_name(int level)
{
    return level == HIRATE_LOG_WARNING ? "warning" : "info";
}

/* Hands the queued lines to the log function of the limiter at 1, now that
 * the core has returned, and returns nresults: the method's results, on top
 * of the stack, stay there. An error the function raises is dropped, since
 * a log line must not cost the caller its decision. */
static int emit_logs(lua_State *L, limiter_ud *u, int nresults)
{
    int level;
    char msg[LOG_LINE_MAX];
    while (logq_take(u->logq, &level, msg)) {
        hl_getuservalue(L, 1);
        lua_rawgeti(L, -1, UV_LIM_LOG);
        lua_remove(L, -2);
        lua_pushstring(L, log_level_name(level));
        lua_pushstring(L, msg);
        if (lua_pcall(L, 2, 0, 0) != 0)
            lua_pop(L, 1);
    }
    return nresults;
}

/* ---- the limiter ------------------------------------------------------------------ */

/* The userdata at 1 when its metatable is the calling function's class,
 * compared with the upvalue instead of looked up in the registry by name;
 * anything else gets luaL_checkudata's own error. Only for the functions
 * of a class (new_class). */
static void *check_class(lua_State *L, const char *name)
{
    void *p = lua_touserdata(L, 1);
    if (p && lua_getmetatable(L, 1)) {
        int same = lua_rawequal(L, -1, lua_upvalueindex(UV_CLASS));
        lua_pop(L, 1);
        if (same)
            return p;
    }
    return luaL_checkudata(L, 1, name);
}

static limiter_ud *check_limiter(lua_State *L)
{
    return (limiter_ud *)check_class(L, LIMITER_MT);
}

/* Frees the C limiter once it is closed and no op or handshake holds it. */
static void limiter_release(limiter_ud *u)
{
    if (u->lim && u->closed && u->users == 0) {
        hirate_limiter_free(u->lim);
        u->lim = NULL;
        __atomic_fetch_sub(&live_limiters, 1, __ATOMIC_RELAXED);
        owned_free(&u->own);
    }
}

/* close(), __gc and __close: idempotent. */
static int l_close(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    u->closed = 1;
    limiter_release(u);
    lua_pushboolean(L, 1);
    return 1;
}

/* The URL with its password replaced by ***, split as url.c splits it: the
 * userinfo ends at the last '@' before the first '/' or '?' after the
 * scheme, and the password follows its first ':'. out has room for
 * strlen(url) + 4 bytes. */
static void redact_url(const char *url, char *out)
{
    const char *start = strstr(url, "://");
    start = start ? start + 3 : url;
    const char *at = NULL;
    for (const char *q = start; *q && *q != '/' && *q != '?'; q++)
        if (*q == '@')
            at = q;
    const char *colon = at ? memchr(start, ':', (size_t)(at - start)) : NULL;
    if (!colon) {
        strcpy(out, url);
        return;
    }
    size_t head = (size_t)(colon + 1 - url);
    memcpy(out, url, head);
    memcpy(out + head, "***", 3);
    strcpy(out + head + 3, at);
}

/* The option names new() knows, so that a misspelt one is an error, not a
 * silent default. */
static const char *const option_names[] = {
    "url", "capacity", "rate", "limits", "prefix", "on_error", "instances", "timeout",
    "connect_timeout", "deny_cache", "deny_cache_max", "max_keys", "pool_size", "tls_ca_file",
    "tls_ca_dir", "tls_cert_file", "tls_key_file", "tls_server_name", "tls_verify",
    "sentinel_username", "sentinel_password", "functions", "log", "shared", NULL};

static void check_option_names(lua_State *L)
{
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        int known = 0;
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING)
            arg_errorf(L, 1, "option names must be strings, got %s", luaL_typename(L, -1));
        const char *name = lua_tostring(L, -1);
        for (int i = 0; option_names[i] && !known; i++)
            known = strcmp(name, option_names[i]) == 0 && strlen(name) == hl_rawlen(L, -1);
        if (!known)
            arg_errorf(L, 1, "unknown option '%.40s'", name);
    }
}

/* Pushes option name and returns its type: the value stays on the stack, so
 * that a string stays alive while the core reads it. */
static int get_option(lua_State *L, const char *name)
{
    lua_getfield(L, 1, name);
    return lua_type(L, -1);
}

static const char *opt_string(lua_State *L, const char *name, const char *dflt)
{
    int t = get_option(L, name);
    if (t == LUA_TNIL)
        return dflt;
    if (t != LUA_TSTRING)
        arg_errorf(L, 1, "%s must be a string, got %s", name, luaL_typename(L, -1));
    size_t len;
    const char *s = lua_tolstring(L, -1, &len);
    if (strlen(s) != len)
        arg_errorf(L, 1, "%s contains a NUL byte", name);
    return s;
}

/* A whole-number option the core keeps in an int and checks the range of
 * (its words for a value an int holds; here only for one it cannot). */
static int opt_c_int(lua_State *L, const char *name, int dflt)
{
    char buf[64];
    int64_t v;
    if (get_option(L, name) == LUA_TNIL)
        return dflt;
    check_int(L, -1, 1, name, &v);
    if (v < INT_MIN || v > INT_MAX)
        arg_errorf(L, 1, "%s is out of range, got %s", name, describe(L, -1, buf, sizeof buf));
    return (int)v;
}

/* max_keys, a whole number whose range the core checks and words. */
static void opt_max_keys(lua_State *L, hirate_options *o)
{
    char why[HIRATE_ERRMSG_SIZE];
    int64_t v;
    if (get_option(L, "max_keys") == LUA_TNIL)
        return;
    check_int(L, -1, 1, "max_keys", &v);
    if (hirate_options_set_max_keys(o, (long long)v, why, sizeof why) < 0)
        arg_errorf(L, 1, "%s", why);
}

/* A duration option (timeout, connect_timeout, deny_cache_max): a string
 * the core reads ("100ms", "0.25s", "0.25") or a number of seconds, into
 * *o; the core checks the range and words it in the unit given. */
static const char *check_cstring(lua_State *L, int idx, const char *what);

static void opt_duration(lua_State *L, const char *name, hirate_options *o)
{
    char why[HIRATE_ERRMSG_SIZE];
    int rc = 0, t = get_option(L, name);
    if (t == LUA_TNIL)
        return;
    if (t == LUA_TSTRING)
        rc = hirate_options_set_duration(o, name, check_cstring(L, -1, name), why, sizeof why);
    else if (t == LUA_TNUMBER)
        rc = hirate_options_set_seconds(o, name, (double)lua_tonumber(L, -1), why, sizeof why);
    else
        arg_errorf(L, 1, "%s must be a number of seconds or a string with a unit (\"100ms\"), "
                   "got %s", name, luaL_typename(L, -1));
    if (rc < 0)
        arg_errorf(L, 1, "%s", why);
}

/* ---- the limit: capacity and rate, or limits ------------------------------------- */

/* The capacity at idx (what: "capacity", "limits[2]: capacity"), converted
 * as every capacity is; the core checks its range. */
static int64_t check_capacity(lua_State *L, int idx, const char *what)
{
    char buf[64];
    int64_t v;
    if (beyond_int64(L, idx)) {
        char why[HIRATE_ERRMSG_SIZE];
        hirate_range_errmsg(HIRATE_ECAPACITY, what, describe(L, idx, buf, sizeof buf), why,
                            sizeof why);
        arg_errorf(L, 1, "%s", why);
    }
    check_int(L, idx, 1, what, &v);
    return v;
}

static double check_rate(lua_State *L, int idx, const char *what)
{
    if (lua_type(L, idx) != LUA_TNUMBER)
        arg_errorf(L, 1, "%s must be a number, got %s", what, luaL_typename(L, idx));
    return (double)lua_tonumber(L, idx);
}

/* A string at idx with no NUL byte inside (the core reads C strings). */
static const char *check_cstring(lua_State *L, int idx, const char *what)
{
    size_t len;
    const char *s = lua_tolstring(L, idx, &len);
    if (strlen(s) != len)
        arg_errorf(L, 1, "%s contains a NUL byte", what);
    return s;
}

/* Limit string `text` (entry `entry` of limits) as the core reads it into
 * out; returns how many limits it holds. */
static size_t parse_entry(lua_State *L, const char *text, int entry, hirate_limit *out)
{
    size_t n;
    char err[HIRATE_ERRMSG_SIZE];
    if (hirate_limits_parse(text, out, HIRATE_LIMITS_MAX, &n, err, sizeof err) < 0)
        arg_errorf(L, 1, "limits[%d]: %s", entry, err);
    return n;
}

/* Entry i of the limits table at t, a table {capacity =, rate =, name =}:
 * its fields converted into *b (name points into the table's string). */
static void check_band_entry(lua_State *L, int t, int i, hirate_band *b)
{
    static const char *const fields[] = {"capacity", "rate", "name", NULL};
    char what[48];
    lua_pushnil(L);
    while (lua_next(L, t)) {
        int known = 0;
        lua_pop(L, 1);
        if (lua_type(L, -1) == LUA_TSTRING)
            for (int f = 0; fields[f] && !known; f++)
                known = strcmp(lua_tostring(L, -1), fields[f]) == 0 &&
                        strlen(fields[f]) == hl_rawlen(L, -1);
        if (!known) {
            if (lua_type(L, -1) == LUA_TSTRING)
                arg_errorf(L, 1, "limits[%d]: unknown field '%.40s' (capacity, rate, name)", i,
                           lua_tostring(L, -1));
            arg_errorf(L, 1, "limits[%d]: unknown field of type %s (capacity, rate, name)", i,
                       luaL_typename(L, -1));
        }
    }
    lua_pushliteral(L, "capacity");
    lua_rawget(L, t);
    if (lua_isnil(L, -1))
        arg_errorf(L, 1, "limits[%d]: capacity is required", i);
    snprintf(what, sizeof what, "limits[%d]: capacity", i);
    b->capacity = check_capacity(L, -1, what);
    lua_pushliteral(L, "rate");
    lua_rawget(L, t);
    if (lua_isnil(L, -1))
        arg_errorf(L, 1, "limits[%d]: rate is required", i);
    snprintf(what, sizeof what, "limits[%d]: rate", i);
    b->rate = check_rate(L, -1, what);
    lua_pushliteral(L, "name");
    lua_rawget(L, t);
    b->name = NULL;   /* the core's default name */
    if (!lua_isnil(L, -1)) {
        snprintf(what, sizeof what, "limits[%d]: name", i);
        if (lua_type(L, -1) != LUA_TSTRING)
            arg_errorf(L, 1, "%s must be a string, got %s", what, luaL_typename(L, -1));
        b->name = check_cstring(L, -1, what);   /* the table keeps it alive */
    }
    lua_pop(L, 3);
}

/* The bands of a limits table at t, in a userdata pushed for them (scratch
 * space: an error raised meanwhile leaks nothing): each entry a table
 * {capacity =, rate =, name =} or a limit string, which gives a band for each
 * limit it holds, named by the core. (*from)[k] is the entry band k came
 * from, so that the core's message about band k can name the entry. How
 * many there may be is the core's to say. */
static hirate_band *check_bands(lua_State *L, int t, size_t *nbands, int **from)
{
    hirate_limit parsed[HIRATE_LIMITS_MAX];
    size_t n = 0, entries = hl_rawlen(L, t);
    if (entries > INT_MAX / 2)
        arg_errorf(L, 1, "limits has too many entries");
    /* Every key is an entry: a misspelt {capcity = 10} is not an empty list. */
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        int64_t k;
        if (lua_type(L, -1) != LUA_TNUMBER || !hl_toint64(L, -1, &k) || k < 1 ||
            (uint64_t)k > entries)
            arg_errorf(L, 1, "limits must be an array of limits ({capacity =, rate =, "
                             "name =} or limit strings), or a limit string");
    }
    for (size_t i = 1; i <= entries; i++) {
        lua_rawgeti(L, t, (int)i);
        if (lua_type(L, -1) == LUA_TSTRING) {
            char what[32];
            snprintf(what, sizeof what, "limits[%d]", (int)i);
            n += parse_entry(L, check_cstring(L, -1, what), (int)i, parsed);
        } else if (lua_type(L, -1) == LUA_TTABLE) {
            n++;
        } else {
            arg_errorf(L, 1, "limits[%d] must be a table {capacity =, rate =, name =} or a "
                             "limit string, got %s", (int)i, luaL_typename(L, -1));
        }
        lua_pop(L, 1);
    }
    size_t room = n ? n : 1;
    hirate_band *bands = (hirate_band *)lua_newuserdata(L, room * (sizeof *bands + sizeof(int)));
    *from = (int *)(void *)(bands + room);
    size_t k = 0;
    for (size_t i = 1; i <= entries; i++) {
        lua_rawgeti(L, t, (int)i);
        if (lua_type(L, -1) == LUA_TTABLE) {
            check_band_entry(L, lua_gettop(L), (int)i, &bands[k]);
            (*from)[k++] = (int)i;
        } else {
            size_t got = parse_entry(L, lua_tostring(L, -1), (int)i, parsed);
            for (size_t j = 0; j < got; j++) {
                bands[k].capacity = parsed[j].capacity;
                bands[k].rate = parsed[j].rate;
                bands[k].name = NULL;
                (*from)[k++] = (int)i;
            }
        }
        lua_pop(L, 1);
    }
    *nbands = n;
    return bands;
}

/* Raises the core's message about the options. In one about the bands of
 * a limits table, each "bands[k]" (the core's 0-based band) becomes the
 * entry of limits it came from, as Lua numbers them: "limits[2]: limits[1]
 * has the same name, 'a'". */
static int raise_option_error(lua_State *L, const char *why, const int *from, size_t nbands)
{
    if (!from || !strstr(why, "bands["))
        return luaL_argerror(L, 1, why);   /* the core's message names the option */
    char msg[HIRATE_ERRMSG_SIZE + 64];
    size_t at = 0;
    for (const char *p = why; *p && at + 24 < sizeof msg;) {
        char *end;
        unsigned long k = strncmp(p, "bands[", 6) == 0 ? strtoul(p + 6, &end, 10) : nbands;
        if (k < nbands && end != p + 6 && *end == ']' && (p == why || p[-1] == ' ')) {
            at += (size_t)snprintf(msg + at, sizeof msg - at, "limits[%d]", from[k]);
            p = end + 1;
        } else {
            msg[at++] = *p++;
        }
    }
    msg[at] = '\0';
    return luaL_argerror(L, 1, msg);
}

/* What tostring shows of the limit: "capacity=10, rate=2", or each band's
 * name, capacity and rate. Pushed as a string. */
static void push_limit_desc(lua_State *L, hirate_limiter *lim, size_t nbands)
{
    luaL_Buffer b;
    char line[HIRATE_BAND_NAME_MAX + 96], rate[64];
    luaL_buffinit(L, &b);
    for (size_t i = 0; i < nbands; i++) {
        hirate_band band;
        if (hirate_limiter_band(lim, i, &band) < 0)
            break;
        format_double(rate, sizeof rate, band.rate);
        if (nbands == 1)
            snprintf(line, sizeof line, "capacity=%lld, rate=%s", (long long)band.capacity,
                     rate);
        else
            snprintf(line, sizeof line, "%s\"%s\" capacity=%lld rate=%s", i ? ", " : "bands: ",
                     band.name, (long long)band.capacity, rate);
        luaL_addstring(&b, line);
    }
    luaL_pushresult(&b);
}

/* hirate.new{url = ..., capacity = ..., rate = ..., ...}, or limits = ...
 * instead of capacity and rate */
static int l_new(lua_State *L)
{
    hirate_options o;

    hirate_options_init(&o);
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    luaL_checkstack(L, 40, "hirate.new");
    check_option_names(L);

    o.url = opt_string(L, "url", NULL);
    /* The limit: capacity and rate, or limits (a string, or a table of
     * bands). Given both, the core says which to leave out. */
    int *from = NULL;
    int t = get_option(L, "limits");
    int limits = t != LUA_TNIL;
    if (t == LUA_TSTRING)
        o.limits = check_cstring(L, -1, "limits");
    else if (t == LUA_TTABLE)
        o.bands = check_bands(L, lua_gettop(L), &o.nbands, &from);
    else if (limits)
        arg_errorf(L, 1, "limits must be a limit string (\"10/second; 1000/day\") or a table "
                         "of limits, got %s", luaL_typename(L, -1));
    t = get_option(L, "capacity");
    if (t == LUA_TNIL && !limits)
        arg_errorf(L, 1, "capacity is required (or limits)");
    if (t != LUA_TNIL)
        o.capacity = check_capacity(L, -1, "capacity");
    t = get_option(L, "rate");
    if (t == LUA_TNIL && !limits)
        arg_errorf(L, 1, "rate is required");
    if (t != LUA_TNIL)
        o.rate = check_rate(L, -1, "rate");
    o.prefix = opt_string(L, "prefix", o.prefix);
    const char *policy = opt_string(L, "on_error", NULL);
    char why[HIRATE_ERRMSG_SIZE];
    if (policy && hirate_options_set_on_error(&o, policy, why, sizeof why) < 0)
        arg_errorf(L, 1, "%s", why);
    o.instances = opt_c_int(L, "instances", o.instances);
    opt_duration(L, "timeout", &o);
    opt_duration(L, "connect_timeout", &o);
    t = get_option(L, "deny_cache");
    if (t != LUA_TNIL)
        o.deny_cache = check_boolean(L, -1, 1, "deny_cache");
    /* How long one reply may foretell a refusal (so a reset made elsewhere
     * is seen within it): up to a day, as the core takes it. */
    opt_duration(L, "deny_cache_max", &o);
    opt_max_keys(L, &o);
    o.pool_size = opt_c_int(L, "pool_size", o.pool_size);
    /* TLS: the core checks that they go with a rediss:// URL. */
    o.tls_ca_file = opt_string(L, "tls_ca_file", NULL);
    o.tls_ca_dir = opt_string(L, "tls_ca_dir", NULL);
    o.tls_cert_file = opt_string(L, "tls_cert_file", NULL);
    o.tls_key_file = opt_string(L, "tls_key_file", NULL);
    o.tls_server_name = opt_string(L, "tls_server_name", NULL);
    t = get_option(L, "tls_verify");
    if (t != LUA_TNIL)
        o.tls_verify = check_boolean(L, -1, 1, "tls_verify");
    /* Sentinel, for redis+sentinel:// URLs: the core checks them. */
    o.sentinel_username = opt_string(L, "sentinel_username", NULL);
    o.sentinel_password = opt_string(L, "sentinel_password", NULL);
    t = get_option(L, "functions");
    if (t != LUA_TNIL)
        o.functions = check_boolean(L, -1, 1, "functions");
    /* The in-memory buckets shared with the processes forked after new()
     * (nginx's workers, for a limiter made in init_by_lua). */
    t = get_option(L, "shared");
    if (t != LUA_TNIL)
        o.shared = check_boolean(L, -1, 1, "shared");
    t = get_option(L, "log");
    if (t != LUA_TNIL && t != LUA_TFUNCTION)
        arg_errorf(L, 1, "log must be a function(level, message), got %s",
                   luaL_typename(L, -1));
    int log_at = t == LUA_TFUNCTION ? lua_gettop(L) : 0;


    /* The queue of log lines, when there is a log function, follows where
     * (at a multiple of 16 bytes, aligned for any of its fields). */
    size_t wlen = o.url ? strlen(o.url) + 4 : sizeof "memory";
    size_t qat = (sizeof(limiter_ud) + wlen + 15) & ~(size_t)15;
    limiter_ud *u = (limiter_ud *)lua_newuserdata(L, log_at ? qat + sizeof(log_queue)
                                                            : sizeof *u + wlen);
    int ud_at = lua_gettop(L);
    memset(u, 0, sizeof *u);
    if (o.url)
        redact_url(o.url, u->where);
    else
        strcpy(u->where, "memory");
    luaL_getmetatable(L, LIMITER_MT);
    lua_setmetatable(L, -2);
    lua_createtable(L, 2, 0);
    if (log_at) {
        u->logq = (log_queue *)(void *)((char *)u + qat);
        memset(u->logq, 0, sizeof *u->logq);
        lua_pushvalue(L, log_at);
        lua_rawseti(L, -2, UV_LIM_LOG);
        o.log = log_line;
        o.log_arg = u->logq;
    }
    hl_setuservalue(L, -2);

    hirate_limiter *lim;
    owned *own = owned_new(L, OWN_LIMITER);
    int rc = hirate_limiter_new(&lim, &o, why, sizeof why);
    if (rc < 0)
        owned_free(&own);
    if (rc == HIRATE_ENOMEM)
        return luaL_error(L, "hirate.new: %s", why);
    if (rc < 0)
        return raise_option_error(L, why, from, o.nbands);
    own->obj = lim;
    u->own = own;
    u->lim = lim;
    __atomic_fetch_add(&live_limiters, 1, __ATOMIC_RELAXED);
    u->has_redis = o.url != NULL;
    u->nbands = hirate_limiter_nbands(lim);
    hl_getuservalue(L, ud_at);
    push_limit_desc(L, lim, u->nbands);
    lua_rawseti(L, -2, UV_LIM_DESC);
    u->show_bands = limits;
    for (size_t i = 0; u->show_bands && i < u->nbands; i++) {
        hirate_band band;
        hirate_limiter_band(lim, i, &band);
        lua_pushstring(L, band.name);
        lua_rawseti(L, -2, UV_LIM_NAMES + (int)i);
    }
    lua_settop(L, ud_at);
    return 1;
}

/* A decision of a limiter made with limits, with each band's figures:
 * hirate_allow_bands or hirate_peek_bands, or at an injected time now_us
 * (not -1). One of capacity and rate keeps the shorter path of
 * hirate_allow. */
static int decide_bands(lua_State *L, limiter_ud *u, const char *key, size_t keylen,
                        int64_t cost, int spend, int64_t now_us)
{
    hirate_decision d, bands[HIRATE_BANDS_MAX];
    size_t n = u->nbands < HIRATE_BANDS_MAX ? u->nbands : HIRATE_BANDS_MAX;
    int rc;
    if (now_us >= 0)
        rc = hirate_decide_at_bands(u->lim, key, keylen, cost, spend, now_us, &d, bands, n);
    else if (spend == HIRATE_OP_REFUND)
        rc = hirate_refund_bands(u->lim, key, keylen, cost, &d, bands, n);
    else if (spend)
        rc = hirate_allow_bands(u->lim, key, keylen, cost, &d, bands, n);
    else
        rc = hirate_peek_bands(u->lim, key, keylen, cost, &d, bands, n);
    if (rc < 0)
        return emit_logs(L, u, push_failure(L, u, rc));
    hl_getuservalue(L, 1);
    int names = lua_gettop(L);
    push_decision_sized(L, &d, 9, 1);   /* and bands */
    set_bands(L, bands, n, names);
    return emit_logs(L, u, 1);
}

/* A key of a length, or a cost of a value, that the core refuses goes to
 * the core's decision all the same, which refuses and counts it
 * (lim:stats().errors) as it counts every front end's; the binding raises
 * the argument's error after. (A key or a cost of the wrong type never
 * reaches the core, from any front end.) */
static void refused(limiter_ud *u, const char *key, size_t keylen, int64_t cost, int spend)
{
    hirate_decision d;
    if (spend == HIRATE_OP_REFUND)
        hirate_refund(u->lim, key, keylen, cost, &d);
    else if (spend)
        hirate_allow(u->lim, key, keylen, cost, &d);
    else
        hirate_peek(u->lim, key, keylen, cost, &d);
}

/* lim:allow(key, cost), lim:peek(key, cost) and lim:refund(key, tokens) */
static int decide(lua_State *L, int spend)
{
    limiter_ud *u = check_limiter(L);
    size_t keylen;
    int64_t cost = 1;
    const char *key = lua_type(L, 2) == LUA_TSTRING ? lua_tolstring(L, 2, &keylen) : NULL;
    int typed = lua_isnoneornil(L, 3) || (lua_type(L, 3) == LUA_TNUMBER && hl_toint64(L, 3, &cost));
    if (!key || !typed || hirate_check_key(keylen, NULL, NULL, 0) < 0 ||
        hirate_check_cost(cost, NULL, NULL, 0) < 0) {
        if (key && typed && !u->closed)
            refused(u, key, keylen, cost, spend);
        key = check_key(L, 2, 2, 0, &keylen);   /* these raise */
        cost = check_cost(L, 3, 3, 0);
    }
    if (u->closed)
        return push_closed(L);
    hirate_decision d;
    if (u->show_bands)
        return decide_bands(L, u, key, keylen, cost, spend, -1);
    int rc = spend == HIRATE_OP_REFUND ? hirate_refund(u->lim, key, keylen, cost, &d)
             : spend                   ? hirate_allow(u->lim, key, keylen, cost, &d)
                                       : hirate_peek(u->lim, key, keylen, cost, &d);
    if (rc < 0)
        return emit_logs(L, u, push_failure(L, u, rc));
    push_decision(L, &d, 0);
    return emit_logs(L, u, 1);
}

static int l_allow(lua_State *L)
{
    return decide(L, 1);
}

static int l_peek(lua_State *L)
{
    return decide(L, 0);
}

static int l_refund(lua_State *L)
{
    return decide(L, HIRATE_OP_REFUND);
}

/* lim:reset(key) -> true, or nil, message, code */
static int l_reset(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    size_t keylen;
    const char *key = check_key(L, 2, 2, 0, &keylen);
    if (u->closed)
        return push_closed(L);
    int rc = hirate_reset(u->lim, key, keylen);
    if (rc < 0)
        return emit_logs(L, u, push_failure(L, u, rc));
    lua_pushboolean(L, 1);
    return emit_logs(L, u, 1);
}

/* The health table of a check: {ok =, error =, nodes = {{addr =, ok =,
 * error =, message =, role =, functions =, loaded =, latency =}, ...}},
 * error the code's name (nil when ok), role nil when unknown, functions and
 * loaded booleans or nil when unknown, latency in seconds or nil. */
static void push_health(lua_State *L, int rc, const hirate_check_node *nodes, size_t n)
{
    lua_createtable(L, 0, 3);
    lua_pushboolean(L, rc == 0);
    lua_setfield(L, -2, "ok");
    if (rc < 0) {
        lua_pushstring(L, code_name(rc));
        lua_setfield(L, -2, "error");
    }
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        const hirate_check_node *c = &nodes[i];
        lua_createtable(L, 0, 8);
        lua_pushstring(L, c->addr);
        lua_setfield(L, -2, "addr");
        lua_pushboolean(L, c->rc == 0);
        lua_setfield(L, -2, "ok");
        if (c->rc < 0) {
            lua_pushstring(L, code_name(c->rc));
            lua_setfield(L, -2, "error");
        }
        lua_pushstring(L, c->message);
        lua_setfield(L, -2, "message");
        if (c->role[0]) {
            lua_pushstring(L, c->role);
            lua_setfield(L, -2, "role");
        }
        if (c->functions >= 0) {
            lua_pushboolean(L, c->functions);
            lua_setfield(L, -2, "functions");
        }
        if (c->loaded >= 0) {
            lua_pushboolean(L, c->loaded);
            lua_setfield(L, -2, "loaded");
        }
        if (c->latency_us >= 0) {
            lua_pushnumber(L, (lua_Number)c->latency_us / 1e6);
            lua_setfield(L, -2, "latency");
        }
        lua_rawseti(L, -2, (int)i + 1);
    }
    lua_setfield(L, -2, "nodes");
}

/* lim:check() -> the health table (push_health): hirate_check(), one round
 * trip to every node decisions go to; or nil, message, code once closed */
static int l_check(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    if (u->closed)
        return push_closed(L);
    hirate_check_node *nodes =
        (hirate_check_node *)lua_newuserdata(L, HIRATE_IO_NODES_MAX * sizeof *nodes);
    size_t n = 0;
    int rc = hirate_check(u->lim, nodes, HIRATE_IO_NODES_MAX, &n);
    if (rc == HIRATE_EINVAL || rc == HIRATE_ENOMEM)
        return emit_logs(L, u, push_failure(L, u, rc));
    push_health(L, rc, nodes, n < HIRATE_IO_NODES_MAX ? n : HIRATE_IO_NODES_MAX);
    return emit_logs(L, u, 1);
}

/* The message of item i of a blocking batch: its own, from
 * hirate_allow_many_msgs (HIRATE_ERRMSG_SIZE bytes an item at ctx). */
static const char *batch_msg(const void *ctx, size_t i, int rc)
{
    (void)rc;
    return (const char *)ctx + i * HIRATE_ERRMSG_SIZE;
}

/* lim:allow_many{{key, cost}, ...} -> {outcome, ...}: one round trip. Each
 * outcome is the item's decision, or its error (push_item_error): the
 * items that Redis decided were spent there, so no item's error may hide
 * them. */
static int l_allow_many(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    size_t keybytes;
    size_t n = check_items(L, 2, &keybytes);
    if (u->closed)
        return push_closed(L);
    hirate_item *items = (hirate_item *)lua_newuserdata(L, (n ? n : 1) * sizeof *items);
    char *msgs = (char *)lua_newuserdata(L, (n ? n : 1) * HIRATE_ERRMSG_SIZE);
    fill_items(L, 2, items, n, NULL);
    int rc = hirate_allow_many_msgs(u->lim, items, n, NULL, msgs, HIRATE_ERRMSG_SIZE);
    if (rc < 0)
        return emit_logs(L, u, push_failure(L, u, rc));
    push_items(L, items, n, u->show_bands, batch_msg, msgs);
    return emit_logs(L, u, 1);
}

/* lim:_decide_at(key, cost, spend, now_us): a decision at an injected time
 * (the test vectors). */
static int l_decide_at(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    size_t keylen;
    const char *key = check_key(L, 2, 2, 0, &keylen);
    int64_t cost = check_cost(L, 3, 3, 0);
    int spend = check_spend(L, 4, 4);
    int64_t now_us = check_now_us(L, 5);
    if (u->closed)
        return push_closed(L);
    if (u->show_bands)
        return decide_bands(L, u, key, keylen, cost, spend, now_us);
    hirate_decision d;
    int rc = hirate_decide_at(u->lim, key, keylen, cost, spend, now_us, &d);
    if (rc < 0)
        return emit_logs(L, u, push_failure(L, u, rc));
    push_decision(L, &d, 0);
    return emit_logs(L, u, 1);
}

/* Pushes t[name] = v for the table on top, v a count. */
static void set_count(lua_State *L, const char *name, uint64_t v)
{
    hl_pushint64(L, (int64_t)v);   /* exact below 2^53, which no count reaches */
    lua_setfield(L, -2, name);
}

/* lim:stats() -> the core's metrics (hirate_stats_get) as a table:
 * decisions by the core's source names, errors by code name (every code,
 * 0 for those never met), the latency histogram with its bounds in seconds
 * (hirate_latency_bounds) and its counts, not cumulative, the last one
 * above every bound; or nil, message, code once closed. */
static int l_stats(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    if (u->closed)
        return push_closed(L);
    hirate_stats s;
    if (hirate_stats_get(u->lim, &s, sizeof s) < 0)
        return push_failure(L, u, HIRATE_EINVAL);
    lua_createtable(L, 0, 11);
    lua_createtable(L, 0, HIRATE_SOURCE_FAIL_CLOSED);
    for (int src = HIRATE_SOURCE_REDIS; src <= HIRATE_SOURCE_FAIL_CLOSED; src++)
        set_count(L, hirate_source_name(src), s.decisions[src]);
    lua_setfield(L, -2, "decisions");
    lua_createtable(L, 0, HIRATE_ERRNO_MAX);
    for (int code = 1; code <= HIRATE_ERRNO_MAX; code++)
        set_count(L, code_name(-code), s.errors[code]);
    lua_setfield(L, -2, "errors");
    set_count(L, "refused", s.refused);
    set_count(L, "peeks", s.peeks);
    set_count(L, "breaker_opens", s.breaker_opens);
    set_count(L, "breaker_closes", s.breaker_closes);
    set_count(L, "connects", s.connects);
    set_count(L, "conns_dropped", s.conns_dropped);
    size_t nb;
    const int64_t *bounds = hirate_latency_bounds(&nb);
    uint64_t count = 0;
    lua_createtable(L, 0, 2);
    lua_createtable(L, (int)nb, 0);
    for (size_t i = 0; i < nb; i++) {
        lua_pushnumber(L, (lua_Number)bounds[i] / 1e6);
        lua_rawseti(L, -2, (int)i + 1);
    }
    lua_setfield(L, -2, "bounds");
    lua_createtable(L, HIRATE_LATENCY_BUCKETS, 0);
    for (int i = 0; i < HIRATE_LATENCY_BUCKETS; i++) {
        hl_pushint64(L, (int64_t)s.latency[i]);
        lua_rawseti(L, -2, i + 1);
        count += s.latency[i];
    }
    lua_setfield(L, -2, "counts");
    lua_setfield(L, -2, "latency");
    set_count(L, "latency_count", count);
    lua_pushnumber(L, (lua_Number)s.latency_sum_us / 1e6);
    lua_setfield(L, -2, "latency_sum");
    return 1;
}

/* lim:_stats() -> the io layer's counters (hirate_counters_get: the tests') */
static int l_counters(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    if (u->closed)
        return push_closed(L);
    hirate_counters s;
    hirate_counters_get(u->lim, &s);
    lua_createtable(L, 0, 14);
#define FIELD(name)                          \
    hl_pushint64(L, (int64_t)s.name);        \
    lua_setfield(L, -2, #name)
    FIELD(connects);
    FIELD(evalsha);
    FIELD(eval);
    FIELD(conns_dropped);
    FIELD(cache_hits);
    FIELD(policy);
    FIELD(breaker_opens);
    FIELD(memory_keys);
    FIELD(local_keys);
    FIELD(cache_keys);
    FIELD(fcall);
    FIELD(function_loads);
    FIELD(sentinel_queries);
    FIELD(master_changes);
#undef FIELD
    return 1;
}

static void check_redis(lua_State *L, limiter_ud *u, const char *what)
{
    if (!u->has_redis)
        luaL_error(L, "%s needs a limiter with a Redis URL (this one is in memory)", what);
}

static void set_string(lua_State *L, const char *name, const char *value)
{
    if (value) {
        lua_pushstring(L, value);
        lua_setfield(L, -2, name);
    }
}

static void set_seconds(lua_State *L, const char *name, int ms)
{
    lua_pushnumber(L, (lua_Number)ms / 1000);
    lua_setfield(L, -2, name);
}

/* A node's number at arg: nil means node 0 (the URL's). */
static int opt_node(lua_State *L, int arg)
{
    if (lua_isnoneornil(L, arg))
        return 0;
    return (int)check_int_range(L, arg, arg, "node", 0, HIRATE_IO_NODES_MAX - 1);
}

/* lim:_is_cluster() -> true for a Redis Cluster URL */
static int l_is_cluster(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    lua_pushboolean(L, u->lim && hirate_is_cluster(u->lim));
    return 1;
}

/* lim:_is_sentinel() -> true for a Sentinel URL */
static int l_is_sentinel(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    lua_pushboolean(L, u->lim && hirate_is_sentinel(u->lim));
    return 1;
}

/* lim:_log_next() -> level ("warning" | "info"), message: the oldest log
 * line the core queued, or nothing (the OpenResty path, after each call) */
static int l_log_next(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    int level;
    char msg[LOG_LINE_MAX];
    if (!logq_take(u->logq, &level, msg))
        return 0;
    lua_pushstring(L, log_level_name(level));
    lua_pushstring(L, msg);
    return 2;
}

/* lim:_endpoint(node) -> where to connect to node (default 0, the URL's), as
 * hirate_node_endpoint says:
 * {host =, port =} or {path =}; where (for messages); connect_timeout,
 * timeout and probe_timeout in seconds; tls and tls_verify (booleans); the
 * tls_* settings that are set. */
static int l_endpoint(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    int node = opt_node(L, 2);
    check_redis(L, u, "_endpoint");
    if (u->closed)
        return push_closed(L);
    hirate_endpoint ep;
    int rc = hirate_node_endpoint(u->lim, node, &ep);
    if (rc < 0) {
        char msg[64];
        snprintf(msg, sizeof msg, "the limiter has no node %d", node);
        return push_error(L, rc, msg);
    }
    lua_createtable(L, 0, 14);
    if (ep.is_unix) {
        set_string(L, "path", ep.path);
    } else {
        set_string(L, "host", ep.host);
        lua_pushinteger(L, ep.port);
        lua_setfield(L, -2, "port");
    }
    set_string(L, "where", ep.where);
    set_seconds(L, "connect_timeout", ep.connect_timeout_ms);
    set_seconds(L, "timeout", ep.timeout_ms);
    set_seconds(L, "probe_timeout", ep.probe_timeout_ms);
    lua_pushboolean(L, ep.tls);
    lua_setfield(L, -2, "tls");
    lua_pushboolean(L, ep.tls_verify);
    lua_setfield(L, -2, "tls_verify");
    set_string(L, "tls_ca_file", ep.tls_ca_file);
    set_string(L, "tls_ca_dir", ep.tls_ca_dir);
    set_string(L, "tls_cert_file", ep.tls_cert_file);
    set_string(L, "tls_key_file", ep.tls_key_file);
    set_string(L, "tls_server_name", ep.tls ? ep.tls_server_name : NULL);
    return 1;
}

static int l_tostring(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    hl_getuservalue(L, 1);
    lua_rawgeti(L, -1, UV_LIM_DESC);
    const char *desc = lua_tostring(L, -1);
    lua_pushfstring(L, "hirate.limiter(%s, %s%s)", u->where, desc ? desc : "?",
                    u->closed ? ", closed" : "");
    return 1;
}

/* lim:bands() -> { {capacity =, rate =, name =}, ... }: the limiter's bands,
 * as the core holds them (a name the core gave is its default name). */
static int l_bands(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    if (u->closed)
        return push_closed(L);
    lua_createtable(L, (int)u->nbands, 0);
    for (size_t i = 0; i < u->nbands; i++) {
        hirate_band band;
        if (hirate_limiter_band(u->lim, i, &band) < 0)
            break;
        lua_createtable(L, 0, 3);
        hl_pushint64(L, band.capacity);
        lua_setfield(L, -2, "capacity");
        lua_pushnumber(L, (lua_Number)band.rate);
        lua_setfield(L, -2, "rate");
        lua_pushstring(L, band.name);
        lua_setfield(L, -2, "name");
        lua_rawseti(L, -2, (int)i + 1);
    }
    return 1;
}

/* ---- codes that the caller's I/O reports ---------------------------------------------- */

static const struct {
    const char *name;
    int code;
} error_codes[] = {
#define HL_ERROR_ENTRY(name, code, msg) {#name, HIRATE_##name},
    HIRATE_ERRNO_MAP(HL_ERROR_ENTRY)
#undef HL_ERROR_ENTRY
};

/* The code named at arg ("ETIMEDOUT"): any error's name, since a failed
 * handshake's own code (EAUTH, ETLS ...) is what fails the op that waited
 * for the connection. */
static int check_code(lua_State *L, int arg)
{
    if (lua_type(L, arg) != LUA_TSTRING)
        arg_errorf(L, arg, "code must be an error name such as \"ETIMEDOUT\", got %s",
                   luaL_typename(L, arg));
    const char *name = lua_tostring(L, arg);
    for (size_t i = 0; i < sizeof error_codes / sizeof error_codes[0]; i++)
        if (strcmp(name, error_codes[i].name) == 0)
            return error_codes[i].code;
    return arg_errorf(L, arg, "code must be an error name such as \"ETIMEDOUT\", got "
                      "\"%.20s\"", name);
}

/* The I/O library's words at arg, or NULL. */
static const char *opt_why(lua_State *L, int arg)
{
    if (lua_isnoneornil(L, arg))
        return NULL;
    if (lua_type(L, arg) != LUA_TSTRING)
        arg_errorf(L, arg, "why must be a string, got %s", luaL_typename(L, arg));
    return lua_tostring(L, arg);
}

static const char *state_name(int state)
{
    switch (state) {
    case HIRATE_IO_MORE: return "more";
    case HIRATE_IO_SEND: return "send";
    case HIRATE_IO_PROBE: return "probe";
    default: return "done";
    }
}

/* A new userdata of class mt and size bytes (zeroed) whose uservalue keeps
 * the limiter at 1 alive. */
static void *new_holder(lua_State *L, size_t size, const char *mt)
{
    void *p = lua_newuserdata(L, size);
    memset(p, 0, size);
    luaL_getmetatable(L, mt);
    lua_setmetatable(L, -2);
    lua_createtable(L, 1, 0);
    lua_pushvalue(L, 1);
    lua_rawseti(L, -2, 1);
    hl_setuservalue(L, -2);
    return p;
}

/* ---- handshakes: opening a connection whose I/O the caller does ----------------------- */

static hs_ud *check_hs(lua_State *L)
{
    return (hs_ud *)check_class(L, HS_MT);
}

/* lim:_handshake_start(node) -> a handshake for a new connection to node
 * (default 0), or nil, message, code when none may be opened now (that
 * node's backoff after a failure, with the failure's own code). */
static int l_handshake_start(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    int node = opt_node(L, 2);
    check_redis(L, u, "_handshake_start");
    if (u->closed)
        return push_closed(L);
    hs_ud *h = (hs_ud *)new_holder(L, sizeof *h, HS_MT);
    h->state = HS_FREED;   /* until the core's handshake exists */
    h->own = owned_new(L, OWN_HS);
    char err[HIRATE_ERRMSG_SIZE];
    int rc = hirate_node_handshake_start(u->lim, node, &h->hs, err, sizeof err);
    if (rc < 0) {
        h->hs = NULL;
        owned_free(&h->own);
        return push_error(L, rc, err);
    }
    h->own->obj = h->hs;
    h->lud = u;
    h->state = HS_RUNNING;
    u->users++;
    return 1;
}

static void check_hs_held(lua_State *L, hs_ud *h, const char *what)
{
    if (h->state == HS_FREED)
        luaL_error(L, "%s: the handshake is freed", what);
}

/* hs:request() -> the bytes to send now (the handshake's, or during a
 * probe the probe's) */
static int l_hs_request(lua_State *L)
{
    hs_ud *h = check_hs(L);
    check_hs_held(L, h, "request");
    size_t len;
    const char *req = hirate_handshake_request(h->hs, &len);
    lua_pushlstring(L, req, len);
    return 1;
}

/* hs:feed(bytes) -> "more" | "done", bytes used */
static int l_hs_feed(lua_State *L)
{
    hs_ud *h = check_hs(L);
    size_t len, used = 0;
    if (lua_type(L, 2) != LUA_TSTRING)
        arg_errorf(L, 2, "bytes must be a string, got %s", luaL_typename(L, 2));
    const char *buf = lua_tolstring(L, 2, &len);
    check_hs_held(L, h, "feed");
    if (h->state == HS_DONE)
        luaL_error(L, "feed: the handshake is done (it has its result)");
    int r = hirate_handshake_feed(h->hs, buf, len, &used);
    if (r == HIRATE_IO_DONE)
        h->state = HS_DONE;
    lua_pushstring(L, state_name(r));
    lua_pushinteger(L, (lua_Integer)used);
    return 2;
}

/* hs:fail(code, why) -> "probe" | "done": the I/O failed (ECONNECT,
 * ETIMEDOUT, EIO, ETLS, ECLOSED) in the words of the I/O library. On a
 * handshake that is done already it does nothing. */
static int l_hs_fail(lua_State *L)
{
    hs_ud *h = check_hs(L);
    int code = check_code(L, 2);
    const char *why = opt_why(L, 3);
    check_hs_held(L, h, "fail");
    int r = HIRATE_IO_DONE;
    if (h->state == HS_RUNNING)
        r = hirate_handshake_fail(h->hs, code, why);
    if (r == HIRATE_IO_DONE)
        h->state = HS_DONE;
    lua_pushstring(L, state_name(r));
    return 1;
}

/* hs:probe_tls() -> true when the probe connection is TLS (without
 * verification), false when it is plain */
static int l_hs_probe_tls(lua_State *L)
{
    hs_ud *h = check_hs(L);
    check_hs_held(L, h, "probe_tls");
    lua_pushboolean(L, hirate_handshake_probe_tls(h->hs));
    return 1;
}

/* hs:result() -> true (the connection is ready), or nil, message, code */
static int l_hs_result(lua_State *L)
{
    hs_ud *h = check_hs(L);
    check_hs_held(L, h, "result");
    if (h->state != HS_DONE)
        return luaL_error(L, "result: the handshake is not done (feed it the replies, or "
                             "fail it)");
    char err[HIRATE_ERRMSG_SIZE];
    int rc = hirate_handshake_result(h->hs, err, sizeof err);
    if (rc < 0)
        return push_error(L, rc, err);
    lua_pushboolean(L, 1);
    return 1;
}

/* hs:free() and __gc: idempotent. One freed before its result teaches the
 * core's backoff nothing. */
static int l_hs_free(lua_State *L)
{
    hs_ud *h = check_hs(L);
    if (h->hs) {
        hirate_handshake_free(h->hs);
        h->hs = NULL;
        h->lud->users--;
        limiter_release(h->lud);
        h->lud = NULL;
    }
    owned_free(&h->own);
    h->state = HS_FREED;
    return 0;
}

static int l_hs_tostring(lua_State *L)
{
    hs_ud *h = check_hs(L);
    lua_pushfstring(L, "hirate.handshake(%s)", h->state == HS_RUNNING ? "running"
                                               : h->state == HS_DONE  ? "done"
                                                                      : "freed");
    return 1;
}

/* ---- ops: one decision (or batch, or reset) whose I/O the caller does ------------------- */

static op_ud *check_op(lua_State *L)
{
    return (op_ud *)check_class(L, OP_MT);
}

/* Gives back the core's op and lets a closed limiter go. */
static void op_release(op_ud *o)
{
    if (o->op) {
        hirate_op_free(o->op);
        o->op = NULL;
        o->lud->users--;
        limiter_release(o->lud);
    }
    owned_free(&o->own);
    o->lud = NULL;
}

/* Keeps message for item i (of a reset: i is 0) in the uservalue of the
 * op at idx. */
static void keep_message(lua_State *L, int idx, size_t i, const char *message)
{
    hl_getuservalue(L, idx);
    lua_pushstring(L, message);
    lua_rawseti(L, -2, UV_OP_MESSAGES + (int)i);
    lua_pop(L, 1);
}

/* The op at idx is answered: keep what results() and result() need (the
 * core's messages), then give back the core's op, so that a closed limiter
 * goes as soon as nothing waits on it. An error raised meanwhile (out of
 * memory) leaves the core's op to free() and __gc. */
static void op_finish(lua_State *L, op_ud *o, int idx)
{
    o->state = OP_DONE;
    o->drop = hirate_op_drop(o->op);
    o->rc = hirate_op_result(o->op);
    if (o->check) {
        size_t n = 0;
        hirate_op_check(o->op, NULL, 0, &n);
        hirate_check_node *nodes = (hirate_check_node *)lua_newuserdata(L, (n ? n : 1) *
                                                                               sizeof *nodes);
        hirate_op_check(o->op, nodes, n, &n);
        hl_getuservalue(L, idx < 0 ? idx - 1 : idx);
        push_health(L, o->rc, nodes, n);
        lua_rawseti(L, -2, UV_OP_MESSAGES);
        lua_pop(L, 2);
    } else if (o->reset) {
        if (o->rc < 0)
            keep_message(L, idx, 0, hirate_op_errmsg(o->op, 0));
    } else {
        for (size_t i = 0; i < o->n; i++)
            if (o->items[i].rc < 0)
                keep_message(L, idx, i, hirate_op_errmsg(o->op, i));
    }
    op_release(o);
}

/* Holds the core's op (rc 1 from a start function), or, when the core
 * needed none, keeps each failed item's message: such an item failed before
 * any I/O, on its key or cost (hirate_validate's words), or for want of
 * memory. */
static int op_started(lua_State *L, limiter_ud *u, op_ud *o, int rc, hirate_op *op)
{
    if (rc != 1)
        owned_free(&o->own);   /* the core made no op */
    if (rc < 0)
        return push_failure(L, u, rc);
    if (rc == 1) {
        o->own->obj = op;
        o->op = op;
        o->lud = u;
        o->state = OP_PENDING;
        u->users++;
        return 1;
    }
    o->state = OP_DONE;
    char msg[HIRATE_ERRMSG_SIZE];
    for (size_t i = 0; i < o->n; i++) {
        const hirate_item *it = &o->items[i];
        if (it->rc >= 0)
            continue;
        if (hirate_validate(it->key, it->keylen, it->cost, msg, sizeof msg) == 0)
            snprintf(msg, sizeof msg, "%s", hirate_strerror(it->rc));
        keep_message(L, -1, i, msg);
    }
    return 1;
}

/* lim:_op_start(items, spend, now_us, with_bands) -> op; with_bands true:
 * the decisions of a limiter made with limits carry each band's figures
 * (allow and peek), else only the whole's (allow_many, as in plain Lua). */
static int l_op_start(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    size_t keybytes;
    size_t n = check_items(L, 2, &keybytes);
    int spend = check_spend(L, 3, 3);
    int64_t now_us = lua_isnoneornil(L, 4) ? -1 : check_now_us(L, 4);
    int with_bands = !lua_isnoneornil(L, 5) && check_boolean(L, 5, 5, "with_bands");
    check_redis(L, u, "_op_start");
    if (u->closed)
        return push_closed(L);

    size_t nb = with_bands && u->show_bands ? u->nbands : 0;
    op_ud *o = (op_ud *)new_holder(L, sizeof *o + n * sizeof(hirate_item) +
                                          n * nb * sizeof(hirate_decision) + keybytes, OP_MT);
    o->state = OP_DONE;   /* until the core's op exists */
    o->n = n;
    o->show_bands = u->show_bands;
    o->nbands = nb;
    o->bands = (hirate_decision *)(void *)(o->items + n);
    fill_items(L, 2, o->items, n, (char *)(o->bands + n * nb));
    hirate_op *op = NULL;
    o->own = owned_new(L, OWN_OP);
    /* The band figures go straight into the op's userdata, whether the
     * core decides an item at once or once Redis answers. */
    int rc = nb ? hirate_op_start_bands(u->lim, o->items, n, spend, now_us, o->bands, &op)
                : hirate_op_start(u->lim, o->items, n, spend, now_us, &op);
    return op_started(L, u, o, rc, op);
}

/* lim:_op_start_reset(key) -> op: reset(key) as an op (its bytes are the
 * core's; result() gives its outcome) */
static int l_op_start_reset(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    size_t keylen;
    const char *key = check_key(L, 2, 2, 0, &keylen);
    check_redis(L, u, "_op_start_reset");
    if (u->closed)
        return push_closed(L);

    op_ud *o = (op_ud *)new_holder(L, sizeof *o + keylen, OP_MT);
    o->state = OP_DONE;
    o->reset = 1;
    char *copy = (char *)o->items;   /* n is 0: the key's bytes follow */
    memcpy(copy, key, keylen);
    hirate_op *op = NULL;
    o->own = owned_new(L, OWN_OP);
    int rc = hirate_op_start_reset(u->lim, copy, keylen, &op);
    return op_started(L, u, o, rc, op);
}

/* lim:_op_start_check() -> op: check() as an op (health() gives its table);
 * with no node to ask (none found), the op is done at once */
static int l_op_start_check(lua_State *L)
{
    limiter_ud *u = check_limiter(L);
    check_redis(L, u, "_op_start_check");
    if (u->closed)
        return push_closed(L);
    op_ud *o = (op_ud *)new_holder(L, sizeof *o, OP_MT);
    o->state = OP_DONE;
    o->check = 1;
    hirate_op *op = NULL;
    o->own = owned_new(L, OWN_OP);
    int rc = hirate_op_start_check(u->lim, &op);
    rc = op_started(L, u, o, rc, op);
    if (o->op && !hirate_op_legs(o->op))
        op_finish(L, o, -1);
    return rc;
}

/* op:request() -> the bytes to send now, or nil when the op needs no Redis */
static int l_op_request(lua_State *L)
{
    op_ud *o = check_op(L);
    if (o->state != OP_PENDING) {
        lua_pushnil(L);
        return 1;
    }
    size_t len;
    const char *req = hirate_op_request(o->op, &len);
    lua_pushlstring(L, req, len);
    return 1;
}

static void check_pending(lua_State *L, op_ud *o, const char *what)
{
    if (o->state != OP_PENDING)
        luaL_error(L, "%s: the op is done (it has its results)", what);
}

/* op:feed(bytes) -> "more" | "send" | "done", bytes used */
static int l_op_feed(lua_State *L)
{
    op_ud *o = check_op(L);
    size_t len, used = 0;
    if (lua_type(L, 2) != LUA_TSTRING)
        arg_errorf(L, 2, "bytes must be a string, got %s", luaL_typename(L, 2));
    const char *buf = lua_tolstring(L, 2, &len);
    check_pending(L, o, "feed");
    int r = hirate_op_feed(o->op, buf, len, &used);
    if (r == HIRATE_IO_DONE)
        op_finish(L, o, 1);
    lua_pushstring(L, state_name(r));
    lua_pushinteger(L, (lua_Integer)used);
    return 2;
}

/* op:fail(code, why): the I/O failed ("ETIMEDOUT", "ECONNECT", "EIO",
 * "ETLS", or the code of the handshake that opened the connection); why is
 * the I/O library's words, or nil. The policy decides every outage. On an
 * op that is done already it does nothing, so that error handling around
 * the I/O may call it without knowing how far the I/O got. */
static int l_op_fail(lua_State *L)
{
    op_ud *o = check_op(L);
    int code = check_code(L, 2);
    const char *why = opt_why(L, 3);
    if (o->state == OP_PENDING) {
        hirate_op_fail(o->op, code, why);
        op_finish(L, o, 1);
    }
    return 0;
}

/* op:drop() -> true when the connection must be closed, not reused */
static int l_op_drop(lua_State *L)
{
    op_ud *o = check_op(L);
    lua_pushboolean(L, o->op ? hirate_op_drop(o->op) : o->drop);
    return 1;
}

/* ---- the legs of an op's rounds (a cluster's; a single Redis has one) ---------------- */

/* The leg at arg, 1-based, of the op's current round: the core's index. */
static size_t check_leg(lua_State *L, op_ud *o, int arg)
{
    size_t n = o->state == OP_PENDING ? hirate_op_legs(o->op) : 0;
    int64_t leg;
    check_int(L, arg, arg, "leg", &leg);
    if (leg < 1 || (uint64_t)leg > n)
        arg_errorf(L, arg, "the round has no leg %lld (it has %lu)", (long long)leg,
                   (unsigned long)n);
    return (size_t)(leg - 1);
}

/* op:legs() -> how many legs the current round has (0 once the op is done) */
static int l_op_legs(lua_State *L)
{
    op_ud *o = check_op(L);
    lua_pushinteger(L, o->state == OP_PENDING ? (lua_Integer)hirate_op_legs(o->op) : 0);
    return 1;
}

/* op:leg_node(leg) -> the node the leg goes to (lim:_endpoint(node)) */
static int l_op_leg_node(lua_State *L)
{
    op_ud *o = check_op(L);
    size_t leg = check_leg(L, o, 2);
    lua_pushinteger(L, hirate_op_leg_node(o->op, leg));
    return 1;
}

/* op:leg_request(leg) -> the bytes to send on a connection of the leg's node */
static int l_op_leg_request(lua_State *L)
{
    op_ud *o = check_op(L);
    size_t leg = check_leg(L, o, 2), len;
    const char *req = hirate_op_leg_request(o->op, leg, &len);
    lua_pushlstring(L, req, len);
    return 1;
}

/* op:leg_feed(leg, bytes) -> "more" | "done" (the leg has its replies),
 * bytes used */
static int l_op_leg_feed(lua_State *L)
{
    op_ud *o = check_op(L);
    size_t len, used = 0;
    if (lua_type(L, 3) != LUA_TSTRING)
        arg_errorf(L, 3, "bytes must be a string, got %s", luaL_typename(L, 3));
    const char *buf = lua_tolstring(L, 3, &len);
    check_pending(L, o, "leg_feed");
    size_t leg = check_leg(L, o, 2);
    int r = hirate_op_leg_feed(o->op, leg, buf, len, &used);
    lua_pushstring(L, state_name(r));
    lua_pushinteger(L, (lua_Integer)used);
    return 2;
}

/* op:leg_fail(leg, code, why): the leg's I/O failed (the codes of
 * op:fail). On an op that is done already it does nothing, as op:fail. */
static int l_op_leg_fail(lua_State *L)
{
    op_ud *o = check_op(L);
    int code = check_code(L, 3);
    const char *why = opt_why(L, 4);
    if (o->state == OP_PENDING)
        hirate_op_leg_fail(o->op, check_leg(L, o, 2), code, why);
    return 0;
}

/* op:leg_drop(leg) -> true when the leg's connection must be closed, not
 * reused (once the op is done: whether any leg's must) */
static int l_op_leg_drop(lua_State *L)
{
    op_ud *o = check_op(L);
    if (o->state != OP_PENDING) {
        lua_pushboolean(L, o->drop);
        return 1;
    }
    lua_pushboolean(L, hirate_op_leg_drop(o->op, check_leg(L, o, 2)));
    return 1;
}

/* op:next() -> "send" (a new round: its legs are there) | "done" (every
 * item has its outcome), once every leg of the round is done or failed. */
static int l_op_next(lua_State *L)
{
    op_ud *o = check_op(L);
    int r = HIRATE_IO_DONE;
    if (o->state == OP_PENDING) {
        r = hirate_op_next(o->op);
        if (r == HIRATE_IO_DONE)
            op_finish(L, o, 1);
    }
    lua_pushstring(L, state_name(r));
    return 1;
}

static void check_answered(lua_State *L, op_ud *o, const char *what)
{
    if (o->state == OP_PENDING)
        luaL_error(L, "%s: the op still waits for Redis (feed it the replies, or fail it)",
                   what);
}

/* The message op_finish kept for item i; the uservalue is at the top. */
static const char *kept_message(const void *ctx, size_t i, int rc)
{
    lua_State *L = (lua_State *)(uintptr_t)ctx;
    (void)rc;
    lua_rawgeti(L, -2, UV_OP_MESSAGES + (int)i);   /* -2: under the array being built */
    const char *msg = lua_tostring(L, -1);   /* the uservalue keeps it alive */
    lua_pop(L, 1);
    return msg;
}

/* op:results() -> {outcome, ...}: each item's decision, or its error
 * (push_item_error) */
static int l_op_results(lua_State *L)
{
    op_ud *o = check_op(L);
    check_answered(L, o, "results");
    if (o->reset)
        return luaL_error(L, "results: a reset op has one result (result())");
    if (o->check)
        return luaL_error(L, "results: a check op's outcome is health()");
    hl_getuservalue(L, 1);
    push_items(L, o->items, o->n, o->show_bands, kept_message, (const void *)(uintptr_t)L);
    if (o->nbands) {
        lua_rawgeti(L, -2, UV_OP_LIMITER);
        hl_getuservalue(L, -1);
        int names = lua_gettop(L);
        lua_pushvalue(L, -3);   /* the array */
        add_item_bands(L, o, names);
    }
    return 1;
}

/* op:health() -> the health table of a check op (push_health) */
static int l_op_health(lua_State *L)
{
    op_ud *o = check_op(L);
    check_answered(L, o, "health");
    if (!o->check)
        return luaL_error(L, "health: only a check op has one");
    hl_getuservalue(L, 1);
    lua_rawgeti(L, -1, UV_OP_MESSAGES);
    return 1;
}

/* op:result() -> true, or nil, message, code: a reset op's outcome */
static int l_op_result(lua_State *L)
{
    op_ud *o = check_op(L);
    check_answered(L, o, "result");
    if (o->check)
        return luaL_error(L, "result: a check op's outcome is health()");
    if (!o->reset)
        return luaL_error(L, "result: a decision op has one result per item (results())");
    if (o->rc < 0) {
        hl_getuservalue(L, 1);
        lua_rawgeti(L, -1, UV_OP_MESSAGES);
        return push_error(L, o->rc, lua_tostring(L, -1));
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* op:free() and __gc. An op dropped before it is done is given up
 * (ECLOSED): the core may be waiting on it as the breaker's one probe, and a
 * probe that never reports would keep every later call on the policy; given
 * up, it teaches the breaker nothing and the next call probes. */
static int l_op_free(lua_State *L)
{
    op_ud *o = check_op(L);
    if (o->state == OP_PENDING && o->op) {
        hirate_op_fail(o->op, HIRATE_ECLOSED, NULL);
        op_finish(L, o, 1);
    }
    op_release(o);
    return 0;
}

static int l_op_tostring(lua_State *L)
{
    op_ud *o = check_op(L);
    const char *state = o->state == OP_PENDING ? "waiting" : "done";
    if (o->reset || o->check)
        lua_pushfstring(L, "hirate.op(%s, %s)", state, o->reset ? "reset" : "check");
    else
        lua_pushfstring(L, "hirate.op(%s, %d items)", state, (int)o->n);
    return 1;
}

/* ---- the module --------------------------------------------------------------------- */

/* hirate.parse_limits(text) -> { {capacity=, rate=, count=, window=}, ... },
 * or nil, message, "EOPTION". The core reads the grammar (docs/semantics.md,
 * "Limit strings"), so that every language reads a limit alike; this only
 * converts. window is the window in seconds, the core's window_s, as every
 * time in this module is in seconds. */
static int l_parse_limits(lua_State *L)
{
    if (lua_type(L, 1) != LUA_TSTRING)
        return arg_errorf(L, 1, "text must be a string, got %s", luaL_typename(L, 1));
    size_t len;
    const char *text = lua_tolstring(L, 1, &len);
    /* The core reads a C string: "10/s\0x" would be "10/s" there. */
    if (strlen(text) != len)
        return arg_errorf(L, 1, "text contains a NUL byte");
    hirate_limit limits[HIRATE_LIMITS_MAX];
    size_t n;
    char err[HIRATE_ERRMSG_SIZE];
    int rc = hirate_limits_parse(text, limits, HIRATE_LIMITS_MAX, &n, err, sizeof err);
    if (rc < 0)
        return push_error(L, rc, err);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_createtable(L, 0, 4);
        hl_pushint64(L, limits[i].capacity);
        lua_setfield(L, -2, "capacity");
        lua_pushnumber(L, (lua_Number)limits[i].rate);
        lua_setfield(L, -2, "rate");
        hl_pushint64(L, limits[i].count);
        lua_setfield(L, -2, "count");
        hl_pushint64(L, limits[i].window_s);
        lua_setfield(L, -2, "window");
        lua_rawseti(L, -2, (int)i + 1);
    }
    return 1;
}

/* hirate.refill_seconds(capacity, rate) -> whole seconds an empty bucket
 * takes to fill, rounded up: the core's, the "w" of a RateLimit-Policy
 * header (0 for a capacity or rate no limiter takes). */
static int l_refill_seconds(lua_State *L)
{
    int64_t capacity;
    check_int(L, 1, 1, "capacity", &capacity);
    if (lua_type(L, 2) != LUA_TNUMBER)
        arg_errorf(L, 2, "rate must be a number, got %s", luaL_typename(L, 2));
    hl_pushint64(L, hirate_refill_seconds(capacity, (double)lua_tonumber(L, 2)));
    return 1;
}

/* A decision table's figures back into a hirate_decision (the seconds are
 * us / 1e6, one rounding from the microseconds, which llround undoes below
 * 2^53). */
static void read_decision(lua_State *L, int idx, hirate_decision *d)
{
    memset(d, 0, sizeof *d);
    lua_getfield(L, idx, "allowed");
    d->allowed = lua_toboolean(L, -1);
    lua_getfield(L, idx, "remaining");
    d->remaining = (int64_t)lua_tonumber(L, -1);
    lua_getfield(L, idx, "retry_after");
    lua_Number retry = lua_tonumber(L, -1);
    d->retry_after_us = retry == HUGE_VAL ? HIRATE_NEVER : (int64_t)llround(retry * 1e6);
    lua_getfield(L, idx, "reset_after");
    d->reset_after_us = (int64_t)llround(lua_tonumber(L, -1) * 1e6);
    lua_getfield(L, idx, "source");
    const char *src = lua_tostring(L, -1);
    for (int k = HIRATE_SOURCE_REDIS; src && k <= HIRATE_SOURCE_FAIL_CLOSED; k++)
        if (strcmp(src, hirate_source_name(k)) == 0)
            d->source = k;
    lua_pop(L, 5);
}

/* hirate.core.response(limits, d, flags) -> status, retry_after (nil: none),
 * then the values of RateLimit-Policy, RateLimit, X-RateLimit-Limit,
 * X-RateLimit-Remaining, X-RateLimit-Reset, Retry-After and the refusal's
 * text (each nil when not sent): the core's hirate_response_format of one
 * limiter's decision d. limits is { {name =, capacity =, rate =}, ... },
 * one per band; with several, d.bands gives each band's figures. */
static int l_response(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_checktype(L, 2, LUA_TTABLE);
    int flags = (int)luaL_checkinteger(L, 3);
    size_t n = (size_t)hl_rawlen(L, 1);
    if (n < 1 || n > HIRATE_BANDS_MAX)
        arg_errorf(L, 1, "limits must hold 1 to %d limits, got %d", HIRATE_BANDS_MAX, (int)n);
    hirate_response_limit lim[HIRATE_BANDS_MAX];
    hirate_decision dec[HIRATE_BANDS_MAX];
    lua_getfield(L, 2, "bands");
    int bands = lua_gettop(L);
    int have_bands = n > 1 && lua_type(L, bands) == LUA_TTABLE;
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, 1, (int)i + 1);
        int t = lua_gettop(L);
        if (lua_type(L, t) != LUA_TTABLE)
            arg_errorf(L, 1, "limits[%d] must be a table", (int)i + 1);
        lua_getfield(L, t, "name");
        lim[i].name = lua_tostring(L, -1);   /* kept alive by limits */
        lua_getfield(L, t, "capacity");
        lim[i].capacity = (int64_t)lua_tonumber(L, -1);
        lua_getfield(L, t, "rate");
        lim[i].rate = (double)lua_tonumber(L, -1);
        lua_pop(L, 4);
        if (have_bands) {
            lua_rawgeti(L, bands, (int)i + 1);
            read_decision(L, lua_gettop(L), &dec[i]);
            lua_pop(L, 1);
        } else {
            read_decision(L, 2, &dec[i]);
        }
        lim[i].decision = &dec[i];
    }
    lua_pop(L, 1);
    char buf[HIRATE_RESPONSE_SIZE(HIRATE_BANDS_MAX)], err[HIRATE_ERRMSG_SIZE];
    hirate_response r;
    int rc = hirate_response_format(lim, n, flags, &r, buf, sizeof buf, err, sizeof err);
    if (rc < 0)
        return luaL_error(L, "%s", err);
    lua_pushinteger(L, r.status);
    if (r.allowed || r.retry_after_s < 0)
        lua_pushnil(L);
    else
        hl_pushint64(L, r.retry_after_s);
    const char *v[7] = {r.ratelimit_policy, r.ratelimit, r.x_ratelimit_limit,
                        r.x_ratelimit_remaining, r.x_ratelimit_reset, r.retry_after, r.detail};
    for (int i = 0; i < 7; i++) {
        if (v[i])
            lua_pushstring(L, v[i]);
        else
            lua_pushnil(L);
    }
    return 9;
}

static int l_script_source(lua_State *L)
{
    size_t len;
    const char *s = hirate_script_source(&len);
    lua_pushlstring(L, s, len);
    return 1;
}

static int l_script_sha1(lua_State *L)
{
    lua_pushstring(L, hirate_script_sha1());
    return 1;
}

static int l_function_library(lua_State *L)
{
    size_t len;
    const char *s = hirate_function_library(&len);
    lua_pushlstring(L, s, len);
    return 1;
}

static int l_function_name(lua_State *L)
{
    lua_pushstring(L, hirate_function_name());
    return 1;
}

static int l_version(lua_State *L)
{
    lua_pushstring(L, hirate_version());
    return 1;
}

/* Limiters not yet freed, in the whole process (tests). */
static int l_live(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)__atomic_load_n(&live_limiters, __ATOMIC_RELAXED));
    return 1;
}

/* Pushes the upvalues of a class's functions (UV_*): the decision strings,
 * then the metatable at (absolute) index mt. */
static void push_class_upvalues(lua_State *L, int mt)
{
    for (int i = 0; i < UV_COUNT; i++)
        lua_pushstring(L, decision_strings[i]);
    lua_pushvalue(L, mt);
}

/* A metatable with its metamethods, and its methods as __index; every one
 * of them a closure over the class's upvalues. */
static void new_class(lua_State *L, const char *name, const luaL_Reg *meta,
                      const luaL_Reg *methods)
{
    luaL_newmetatable(L, name);
    int mt = lua_gettop(L);
    push_class_upvalues(L, mt);
    hl_setfuncs(L, meta, UV_ALL);
    lua_newtable(L);
    push_class_upvalues(L, mt);
    hl_setfuncs(L, methods, UV_ALL);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
}

/* ------------------------------------------------------------------------
 * Client identity (hirate.h, "Client identity"): the core's rules for the
 * client of a request behind proxies, its key, identities and bucket keys.
 * hirate/client_ip.lua and hirate/resty.lua call these and state none of
 * the rules. */

#define CLIENT_MT "hirate.client_ip"

static hirate_client_ip *check_client(lua_State *L)
{
    hirate_client_ip **c = luaL_checkudata(L, 1, CLIENT_MT);
    if (!*c)
        luaL_argerror(L, 1, "freed client rules");
    return *c;
}

/* client_ip({entries...}, proxy_hops, header|nil, ipv6_subnet) -> rules, or
 * nil, message (the core's, naming the bad option). */
static int l_client_ip(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    double hops = luaL_checknumber(L, 2);
    const char *header = luaL_optstring(L, 3, NULL);
    double subnet = luaL_checknumber(L, 4);
    size_t n = hl_rawlen(L, 1);
    hirate_client_ip **ud = lua_newuserdata(L, sizeof *ud);
    *ud = NULL;
    luaL_getmetatable(L, CLIENT_MT);
    lua_setmetatable(L, -2);
    const char **entries = lua_newuserdata(L, (n + 1) * sizeof *entries);
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, 1, (int)i + 1);
        /* The table keeps its strings alive; another value shows as its
         * type in the message. */
        entries[i] = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : luaL_typename(L, -1);
        lua_pop(L, 1);
    }
    char err[HIRATE_ERRMSG_SIZE];
    int rc = hirate_client_ip_new(ud, entries, n, hops, header, subnet, err, sizeof err);
    lua_pop(L, 1);
    if (rc < 0) {
        lua_pushnil(L);
        lua_pushstring(L, err);
        return 2;
    }
    return 1;
}

static int l_client_free(lua_State *L)
{
    hirate_client_ip **c = luaL_checkudata(L, 1, CLIENT_MT);
    hirate_client_ip_free(*c);
    *c = NULL;
    return 0;
}

/* Pushes what resolve or key found: the text, the given value itself, or
 * nil; then whether it is an address. */
static int push_client(lua_State *L, int kind, const char *out, int given)
{
    if (kind == HIRATE_CLIENT_ADDRESS)
        lua_pushstring(L, out);
    else if (kind == HIRATE_CLIENT_AS_GIVEN)
        lua_pushvalue(L, given);
    else if (kind == HIRATE_CLIENT_NONE)
        lua_pushnil(L);
    else
        return luaL_error(L, "hirate.client_ip: %s", hirate_strerror(kind));
    lua_pushboolean(L, kind == HIRATE_CLIENT_ADDRESS);
    return 2;
}

/* rules:resolve(peer|nil, value|{values...}|nil) -> the client or nil,
 * whether it is an address */
static int l_client_resolve(lua_State *L)
{
    hirate_client_ip *c = check_client(L);
    size_t pn = 0;
    const char *peer = luaL_optlstring(L, 2, NULL, &pn);
    const char *one[1];
    size_t one_len[1];
    const char **v = one;
    size_t *l = one_len, n = 0;
    if (lua_type(L, 3) == LUA_TSTRING) {
        one[0] = lua_tolstring(L, 3, &one_len[0]);
        n = 1;
    } else if (lua_type(L, 3) == LUA_TTABLE) {
        n = hl_rawlen(L, 3);
        v = lua_newuserdata(L, n * (sizeof *v + sizeof *l) + 1);
        l = (size_t *)(void *)(v + n);
        for (size_t i = 0; i < n; i++) {
            lua_rawgeti(L, 3, (int)i + 1);
            v[i] = luaL_checklstring(L, -1, &l[i]);
            lua_pop(L, 1);
        }
    } else if (!lua_isnoneornil(L, 3)) {
        return luaL_argerror(L, 3, "a header value, a list of them or nil");
    }
    char out[HIRATE_CLIENT_TEXT_MAX];
    return push_client(L, hirate_client_ip_resolve(c, peer, pn, v, l, n, out, sizeof out), out, 2);
}

/* rules:key(address|nil) -> its key for buckets or nil, whether it is an
 * address's */
static int l_client_key(lua_State *L)
{
    hirate_client_ip *c = check_client(L);
    size_t n = 0;
    const char *a = luaL_optlstring(L, 2, NULL, &n);
    char out[HIRATE_CLIENT_TEXT_MAX];
    return push_client(L, hirate_client_ip_key(c, a, n, out, sizeof out), out, 2);
}

static int l_client_header(lua_State *L)
{
    lua_pushstring(L, hirate_client_ip_header(check_client(L)));
    return 1;
}

static int l_client_uses_header(lua_State *L)
{
    lua_pushboolean(L, hirate_client_ip_uses_header(check_client(L)));
    return 1;
}

/* Pushes the bytes the core writes, sized by a first call when they do not
 * fit the stack buffer. */
#define PUSH_CORE_BYTES(L, call_with)                                           \
    do {                                                                        \
        char small_[HIRATE_KEY_MAX + 1];                                        \
        size_t len_;                                                            \
        char *out_ = small_;                                                    \
        size_t cap_ = sizeof small_;                                            \
        if (call_with < 0)                                                      \
            return luaL_error(L, "hirate: bad identity arguments");             \
        if (len_ >= sizeof small_) {                                            \
            cap_ = len_ + 1;                                                    \
            out_ = lua_newuserdata(L, cap_);                                    \
            (void)(call_with);                                                  \
        }                                                                       \
        lua_pushlstring(L, out_, len_);                                         \
        return 1;                                                               \
    } while (0)

/* ident_for_ip(key|nil) -> "ip:<key>" ("ip:unknown" for nil) */
static int l_ident_for_ip(lua_State *L)
{
    size_t n = 0;
    const char *k = luaL_optlstring(L, 1, NULL, &n);
    PUSH_CORE_BYTES(L, hirate_ident(HIRATE_IDENT_ADDRESS, k, n, out_, cap_, &len_));
}

/* ident_for_key(value) -> "k:<value>" */
static int l_ident_for_key(lua_State *L)
{
    size_t n;
    const char *k = luaL_checklstring(L, 1, &n);
    PUSH_CORE_BYTES(L, hirate_ident(HIRATE_IDENT_KEY, k, n, out_, cap_, &len_));
}

/* bucket_key(ident, scope|nil, head|nil) -> the bucket's key ("{ident}"
 * without a scope; a long identity hashed) */
static int l_bucket_key(lua_State *L)
{
    size_t ni, ns = 0, nh = 0;
    const char *ident = luaL_checklstring(L, 1, &ni);
    const char *scope = luaL_optlstring(L, 2, NULL, &ns);
    const char *head = luaL_optlstring(L, 3, scope ? "" : NULL, &nh);
    PUSH_CORE_BYTES(L, hirate_bucket_key(ident, ni, scope, ns, head, nh, out_, cap_, &len_));
}

/* The class and the functions, into the module table at the top. */
static void open_client(lua_State *L)
{
    static const luaL_Reg meta[] = {{"__gc", l_client_free}, {NULL, NULL}};
    static const luaL_Reg methods[] = {
        {"resolve", l_client_resolve},     {"key", l_client_key},
        {"header", l_client_header},       {"uses_header", l_client_uses_header},
        {NULL, NULL}};
    static const luaL_Reg functions[] = {
        {"client_ip", l_client_ip},         {"ident_for_ip", l_ident_for_ip},
        {"ident_for_key", l_ident_for_key}, {"bucket_key", l_bucket_key},
        {NULL, NULL}};
    luaL_newmetatable(L, CLIENT_MT);
    hl_setfuncs(L, meta, 0);
    lua_newtable(L);
    hl_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
    hl_setfuncs(L, functions, 0);
}

/* ------------------------------------------------------------------------ */

HL_EXPORT int luaopen_hirate_core(lua_State *L);

HL_EXPORT int luaopen_hirate_core(lua_State *L)
{
    static const luaL_Reg limiter_meta[] = {
        {"__gc", l_close}, {"__close", l_close}, {"__tostring", l_tostring}, {NULL, NULL}};
    static const luaL_Reg limiter_methods[] = {
        {"allow", l_allow},
        {"peek", l_peek},
        {"reset", l_reset},
        {"refund", l_refund},
        {"allow_many", l_allow_many},
        {"bands", l_bands},
        {"close", l_close},
        {"_op_start", l_op_start},
        {"_op_start_reset", l_op_start_reset},
        {"_op_start_check", l_op_start_check},
        {"check", l_check},
        {"_endpoint", l_endpoint},
        {"_handshake_start", l_handshake_start},
        {"_is_cluster", l_is_cluster},
        {"_is_sentinel", l_is_sentinel},
        {"_log_next", l_log_next},
        {"_decide_at", l_decide_at},
        {"stats", l_stats},
        {"_stats", l_counters},
        {NULL, NULL}};
    static const luaL_Reg op_meta[] = {
        {"__gc", l_op_free}, {"__tostring", l_op_tostring}, {NULL, NULL}};
    static const luaL_Reg op_methods[] = {
        {"request", l_op_request},
        {"feed", l_op_feed},
        {"fail", l_op_fail},
        {"drop", l_op_drop},
        {"legs", l_op_legs},
        {"leg_node", l_op_leg_node},
        {"leg_request", l_op_leg_request},
        {"leg_feed", l_op_leg_feed},
        {"leg_fail", l_op_leg_fail},
        {"leg_drop", l_op_leg_drop},
        {"next", l_op_next},
        {"results", l_op_results},
        {"result", l_op_result},
        {"health", l_op_health},
        {"free", l_op_free},
        {NULL, NULL}};
    static const luaL_Reg hs_meta[] = {
        {"__gc", l_hs_free}, {"__tostring", l_hs_tostring}, {NULL, NULL}};
    static const luaL_Reg hs_methods[] = {
        {"request", l_hs_request},
        {"feed", l_hs_feed},
        {"fail", l_hs_fail},
        {"probe_tls", l_hs_probe_tls},
        {"result", l_hs_result},
        {"free", l_hs_free},
        {NULL, NULL}};
    static const luaL_Reg functions[] = {
        {"new", l_new},
        {"script_source", l_script_source},
        {"script_sha1", l_script_sha1},
        {"function_library", l_function_library},
        {"function_name", l_function_name},
        {"version", l_version},
        {"parse_limits", l_parse_limits},
        {"refill_seconds", l_refill_seconds},
        {"key_error", l_key_error},
        {"cost_error", l_cost_error},
        {"response", l_response},
        {"_live", l_live},
        {NULL, NULL}};

    open_owner(L);   /* first: its __gc must come after every other */
    new_class(L, LIMITER_MT, limiter_meta, limiter_methods);
    new_class(L, OP_MT, op_meta, op_methods);
    new_class(L, HS_MT, hs_meta, hs_methods);
    lua_newtable(L);
    hl_setfuncs(L, functions, 0);
    open_client(L);
    lua_pushstring(L, HIRATE_VERSION_STRING);
    lua_setfield(L, -2, "_VERSION");
    lua_pushstring(L, "hirate.core");
    lua_setfield(L, -2, "_NAME");
    /* The core's limits, so that Lua code (hirate/resty.lua) states none. */
    hl_pushint64(L, HIRATE_KEY_MAX);
    lua_setfield(L, -2, "KEY_MAX");
    lua_pushinteger(L, HIRATE_IPV6_SUBNET_DEFAULT);
    lua_setfield(L, -2, "IPV6_SUBNET_DEFAULT");
    hl_pushint64(L, HIRATE_HEADERS_RATELIMIT);
    lua_setfield(L, -2, "HEADERS_RATELIMIT");
    hl_pushint64(L, HIRATE_HEADERS_LEGACY);
    lua_setfield(L, -2, "HEADERS_LEGACY");
    hl_pushint64(L, HIRATE_PREFIX_MAX);
    lua_setfield(L, -2, "PREFIX_MAX");
    hl_pushint64(L, HIRATE_EXACT_MAX);
    lua_setfield(L, -2, "EXACT_MAX");
    hl_pushint64(L, HIRATE_IO_REPLY_MAX);
    lua_setfield(L, -2, "IO_REPLY_MAX");
    hl_pushint64(L, HIRATE_IO_NODES_MAX);
    lua_setfield(L, -2, "IO_NODES_MAX");
    hl_pushint64(L, HIRATE_ERRMSG_SIZE);
    lua_setfield(L, -2, "ERRMSG_SIZE");
    hl_pushint64(L, HIRATE_BANDS_MAX);
    lua_setfield(L, -2, "BANDS_MAX");
    return 1;
}
