-- luarocks make (from a checkout) builds hirate.core with CMake, through the
-- top-level CMakeLists.txt, for the Lua luarocks runs for, and installs
--   hirate        bindings/lua/hirate.lua         require "hirate"
--   hirate.resty  bindings/lua/hirate/resty.lua   the OpenResty (cosocket) path
--                 (with hirate.headers and hirate.client_ip)
--   hirate.metrics bindings/lua/hirate/metrics.lua lim:stats() as Prometheus text,
--                 summed over nginx's workers
--   hirate.core   the C module, with the C core and hiredis (its archive,
--                 libhiredis.a) inside; OpenSSL is its one run-time dependency
-- See docs/lua.md for Lua 5.4, LuaJIT and OpenResty.
rockspec_format = "3.0"
package = "hirate"
-- The version is the C header's (HIRATE_VERSION_STRING); tests/lua/run.sh
-- checks that they agree.
version = "0.2.0-1"

source = {
   -- luarocks make builds the checkout it runs in and never fetches this;
   -- `luarocks install hirate` would fetch a published release from here.
   url = "git+https://git.hirate.invalid/hirate.git",
   tag = "v0.2.0",
}

description = {
   summary = "A distributed token-bucket rate limiter: one atomic script call in Redis, or an in-memory bucket",
   detailed = [[
hirate answers "may this key spend this many tokens now?" with one atomic
token-bucket script call in Redis (FCALL where the server has Redis
Functions, else EVALSHA; the code sent only when the server lacks it), so
every process that shares the Redis shares the limit exactly, or from an
in-memory bucket without Redis. When Redis fails, a policy decides (a local
bucket, allow, or refuse) behind a circuit breaker. Plain Lua uses the C
core's client; inside OpenResty the same API runs on nginx cosockets and never
blocks the worker.
]],
   labels = { "ratelimit", "redis", "openresty", "nginx" },
}

dependencies = {
   "lua >= 5.1, < 5.5",
}

external_dependencies = {
   HIREDIS = {
      header = "hiredis/hiredis.h",
      library = "hiredis",
   },
   -- TLS (rediss://) in the core's blocking client.
   OPENSSL = {
      header = "openssl/ssl.h",
      library = "ssl",
   },
}

build = {
   type = "cmake",
   variables = {
      CMAKE_BUILD_TYPE = "Release",
      CMAKE_C_FLAGS = "$(CFLAGS)",
      -- Where luarocks found hiredis: CMake's pkg-config lookup searches its
      -- lib/pkgconfig too (e.g. luarocks make HIREDIS_DIR=/opt/hiredis).
      CMAKE_PREFIX_PATH = "$(HIREDIS_DIR)",
      -- And where it found OpenSSL, for CMake's FindOpenSSL.
      OPENSSL_ROOT_DIR = "$(OPENSSL_DIR)",
      HIRATE_BUILD_LUA = "ON",
      -- hiredis linked in from libhiredis.a: the rock needs no libhiredis.
      HIRATE_STATIC_HIREDIS = "ON",
      HIRATE_BUILD_TESTS = "OFF",
      HIRATE_BUILD_BENCH = "OFF",
      LUA_INCDIR = "$(LUA_INCDIR)",
   },
   -- CMake's own install would put the C library, header and tool into the
   -- rock; the module and the Lua files are all a rock needs.
   install_pass = false,
   install = {
      lua = {
         ["hirate"] = "bindings/lua/hirate.lua",
         ["hirate.resty"] = "bindings/lua/hirate/resty.lua",
         ["hirate.resty.driver"] = "bindings/lua/hirate/resty/driver.lua",
         ["hirate.resty.limit"] = "bindings/lua/hirate/resty/limit.lua",
         ["hirate.headers"] = "bindings/lua/hirate/headers.lua",
         ["hirate.client_ip"] = "bindings/lua/hirate/client_ip.lua",
         ["hirate.metrics"] = "bindings/lua/hirate/metrics.lua",
      },
      lib = {
         ["hirate.core"] = "build.luarocks/lua/hirate/core.so",
      },
   },
   copy_directories = { "docs" },
}
