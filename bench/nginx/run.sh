#!/bin/sh
# hirate in nginx against a hand-written cosocket EVALSHA and no limit at all:
# requests per second with wrk on loopback, as a markdown table.
#
#   bench/nginx/run.sh [bench.py options]     e.g. --seconds 5 --rounds 5
#
# Needs Debian's nginx, libnginx-mod-http-lua, luajit2 headers, redis-server
# and wrk (tools/deps.sh bench). hirate.core for LuaJIT is built in
# $HIRATE_BENCH_BUILD (default build-bench/nginx).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${HIRATE_BENCH_BUILD:-$root/build-bench/nginx}
export PYTHONDONTWRITEBYTECODE=1

if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHIRATE_WERROR=ON \
        -DHIRATE_BUILD_TESTS=OFF -DHIRATE_BUILD_BENCH=OFF -DHIRATE_BUILD_LUA=ON \
        -DHIRATE_LUA_FLAVORS=luajit >/dev/null
fi
cmake --build "$build" -j "${JOBS:-2}" --target hirate_lua_luajit >/dev/null
HIRATE_LUAJIT_CPATH="$build/lua-luajit" exec "${PYTHON:-python3}" "$root/bench/nginx/bench.py" "$@"
