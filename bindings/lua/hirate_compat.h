/*
 * The few Lua C API differences between Lua 5.1 to 5.4 and LuaJIT that
 * hirate_core.c meets, under names of our own (hl_*).
 *
 * Our own names, not the 5.2+ ones: LuaJIT 2.1 reports LUA_VERSION_NUM 501
 * yet declares luaL_setfuncs and luaL_testudata, so defining those names for
 * "5.1" would clash with LuaJIT's headers; a shim under its own names works
 * with both, and with PUC Lua 5.1, which lacks them.
 */
#ifndef HIRATE_COMPAT_H
#define HIRATE_COMPAT_H

#include <math.h>
#include <stdint.h>

#include <lauxlib.h>
#include <lua.h>

#if LUA_VERSION_NUM >= 502

#define hl_setfuncs(L, l, nup) luaL_setfuncs((L), (l), (nup))
#define hl_rawlen(L, i) lua_rawlen((L), (i))
#define hl_testudata(L, i, t) luaL_testudata((L), (i), (t))

#else /* Lua 5.1, LuaJIT */

/* As luaL_setfuncs: the table below nup values gets every function as a
 * closure over copies of those values, which are then popped. */
static inline void hl_setfuncs(lua_State *L, const luaL_Reg *l, int nup)
{
    for (; l->name; l++) {
        for (int i = 0; i < nup; i++)
            lua_pushvalue(L, -nup);
        lua_pushcclosure(L, l->func, nup);
        lua_setfield(L, -(nup + 2), l->name);
    }
    lua_pop(L, nup);
}

#define hl_rawlen(L, i) lua_objlen((L), (i))

static inline void *hl_testudata(lua_State *L, int i, const char *tname)
{
    void *p = lua_touserdata(L, i);
    if (!p || !lua_getmetatable(L, i))
        return NULL;
    luaL_getmetatable(L, tname);
    if (!lua_rawequal(L, -1, -2))
        p = NULL;
    lua_pop(L, 2);
    return p;
}

#endif

/* The value a userdata keeps alive: a uservalue from 5.2 on (5.4 numbers
 * them), the environment table in 5.1, which must be a table. Callers
 * always pass a table, so one form serves every version. */
#if LUA_VERSION_NUM >= 504
#define hl_setuservalue(L, i) lua_setiuservalue((L), (i), 1)
#define hl_getuservalue(L, i) ((void)lua_getiuservalue((L), (i), 1))
#elif LUA_VERSION_NUM >= 502
#define hl_setuservalue(L, i) lua_setuservalue((L), (i))
#define hl_getuservalue(L, i) ((void)lua_getuservalue((L), (i)))
#else
#define hl_setuservalue(L, i) lua_setfenv((L), (i))
#define hl_getuservalue(L, i) lua_getfenv((L), (i))
#endif

/* Whole numbers: 5.3 and later have an integer subtype, so a float such as
 * 2.0 is not an integer there (math.type says so); 5.1 and LuaJIT hold every
 * number as a double, so a whole double is the integer. */
#if LUA_VERSION_NUM >= 503

static inline void hl_pushint64(lua_State *L, int64_t v)
{
    lua_pushinteger(L, (lua_Integer)v);
}

/* 1 and *out when the number at i is an integer; 0 otherwise. */
static inline int hl_toint64(lua_State *L, int i, int64_t *out)
{
    if (!lua_isinteger(L, i))
        return 0;
    *out = (int64_t)lua_tointeger(L, i);
    return 1;
}

#else

static inline void hl_pushint64(lua_State *L, int64_t v)
{
    lua_pushnumber(L, (lua_Number)v);   /* exact: every value hirate reports is below 2^53 */
}

static inline int hl_toint64(lua_State *L, int i, int64_t *out)
{
    lua_Number n = lua_tonumber(L, i);
    /* [-2^63, 2^63): the doubles that convert to int64_t without overflow. */
    if (n != floor(n) || !(n >= -9223372036854775808.0 && n < 9223372036854775808.0))
        return 0;
    *out = (int64_t)n;
    return 1;
}

#endif

#endif /* HIRATE_COMPAT_H */
