#!/bin/sh
# The OpenResty tests and the cross-language test:
#   1. real nginx (Debian's, with lua-nginx-module, 2 workers) running the
#      nginx.conf of docs/lua.md and the tests' own server, against a
#      redis-server of its own (test_nginx.py);
#   2. Lua 5.4, Python and the hirate tool spending one Redis bucket
#      (../test_cross_language.py; the Python part needs build-py/venv).
#
#   tests/lua/nginx/run.sh [build dir]
#
# The build dir (default build-lua, as tests/lua/run.sh uses) gets hirate.core
# for LuaJIT (nginx's) and Lua 5.4, and the hirate tool; it is configured
# here when it does not exist yet.
set -eu
root=$(cd "$(dirname "$0")/../../.." && pwd)
build=${1:-${HIRATE_LUA_BUILD:-$root/build-lua}}
python=${PYTHON:-python3}
export PYTHONDONTWRITEBYTECODE=1   # nothing written into the checkout

if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHIRATE_WERROR=ON \
        -DHIRATE_BUILD_TESTS=OFF -DHIRATE_BUILD_BENCH=OFF -DHIRATE_BUILD_LUA=ON \
        "-DHIRATE_LUA_FLAVORS=5.4;luajit" >/dev/null
fi
cmake --build "$build" -j 2 --target hirate_lua_luajit hirate_lua_54 hirate_cli >/dev/null

echo "== OpenResty: nginx + lua-nginx-module ($(nginx -v 2>&1 | sed 's/.*: //'))"
HIRATE_LUAJIT_CPATH="$build/lua-luajit" "$python" "$root/tests/lua/nginx/test_nginx.py"

echo "== One bucket: Lua 5.4, Python, the hirate tool"
HIRATE_LUA54_CPATH="$build/lua-5.4" HIRATE_CLI="$build/core/cli/hirate" \
    "$python" "$root/tests/lua/test_cross_language.py" -v
