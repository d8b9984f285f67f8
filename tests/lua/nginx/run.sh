#!/bin/sh
# The OpenResty tests, which tests/lua/run.sh (make test-lua) runs last:
#   1. the specs of the pure-Lua parts of the OpenResty path
#      (tests/lua/resty_*_spec.lua), under Lua 5.4 and under LuaJIT;
#   2. real nginx (Debian's, with lua-nginx-module, 2 workers) running the
#      nginx.conf of docs/lua.md and the tests' own server, against a
#      redis-server of its own (test_nginx.py);
#   2b. pipeline = true (2 workers): exact counts, a stalled Redis (no reply
#      handed to another call), clients gone while their calls wait, an idle
#      connection closed after keepalive_timeout, a killed and restarted
#      Redis, a reload under load after which the old workers exit
#      (test_pipeline.py);
#   3. examples/openresty/nginx.conf (4 workers): hirate.metrics' sums at
#      /metrics and the log lines of a real outage (test_metrics.py);
#   4. docs/lua.md's nginx.conf of one in-memory table shared by 4 workers
#      (shared = true): exactly the capacity over all of them, a killed
#      worker, a reload (test_shared.py);
#   5. Lua 5.4, Python and the hirate tool spending one Redis bucket
#      (tests/lua/test_cross_language.py; its Python part needs the package
#      in build-py/venv, which make test-python leaves there).
#
#   tests/lua/nginx/run.sh
#
# Under tests/lua/run.sh it tests what `luarocks make` installed
# (HIRATE_LUA_TREE_JIT, HIRATE_LUA_TREE_54). Run alone, it builds hirate.core
# for LuaJIT and Lua 5.4 with CMake and uses the files in bindings/lua. The
# hirate tool is built either way, in $HIRATE_LUA_BUILD/nginx (default
# build-lua/nginx).
set -eu
root=$(cd "$(dirname "$0")/../../.." && pwd)
out=${HIRATE_LUA_BUILD:-$root/build-lua}
build=$out/nginx
python=${PYTHON:-python3}
export PYTHONDONTWRITEBYTECODE=1   # nothing written into the checkout

targets=hirate_cli
if [ -n "${HIRATE_LUA_TREE_JIT:-}" ] && [ -n "${HIRATE_LUA_TREE_54:-}" ]; then
    jit_path=$HIRATE_LUA_TREE_JIT/share/lua/5.1 jit_cpath=$HIRATE_LUA_TREE_JIT/lib/lua/5.1
    l54_path=$HIRATE_LUA_TREE_54/share/lua/5.4 l54_cpath=$HIRATE_LUA_TREE_54/lib/lua/5.4
else
    jit_path=$root/bindings/lua jit_cpath=$build/lua-luajit
    l54_path=$root/bindings/lua l54_cpath=$build/lua-5.4
    targets="$targets hirate_lua_luajit hirate_lua_54"
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHIRATE_WERROR=ON \
        -DHIRATE_BUILD_TESTS=OFF -DHIRATE_BUILD_BENCH=OFF -DHIRATE_BUILD_LUA=ON \
        "-DHIRATE_LUA_FLAVORS=5.4;luajit" >/dev/null
fi
# shellcheck disable=SC2086
cmake --build "$build" -j "${JOBS:-2}" --target $targets >/dev/null

# busted runs in a scratch directory, so that nothing lands in the checkout.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hirate-resty.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

for run in "lua5.4 $l54_path $l54_cpath" "luajit $jit_path $jit_cpath"; do
    set -- $run
    printf '\n== hirate.headers and hirate.client_ip under %s\n' "$1"
    (cd "$tmp" && LUA_PATH="$2/?.lua;$root/tests/lua/?.lua;;" LUA_CPATH="$3/?.so;;" \
        "$1" /usr/bin/busted "$root"/tests/lua/resty_*_spec.lua)
done

# The nginx tests parse every rate-limit header with a Structured Fields
# parser (tests/lua/nginx/requirements.txt), in a virtualenv of their own.
venv=$out/nginx/venv
[ -x "$venv/bin/python" ] || "$python" -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
    -r "$root/tests/lua/nginx/requirements.txt"

printf '\n== OpenResty: %s with lua-nginx-module, 2 workers\n' "$(nginx -v 2>&1 | sed 's/.*: //')"
HIRATE_LUA_DIR=$jit_path HIRATE_LUAJIT_CPATH=$jit_cpath \
    "$venv/bin/python" "$root/tests/lua/nginx/test_nginx.py"

printf '\n== OpenResty: one pipelined connection per worker (pipeline = true)\n'
HIRATE_LUA_DIR=$jit_path HIRATE_LUAJIT_CPATH=$jit_cpath \
    "$python" "$root/tests/lua/nginx/test_pipeline.py"

printf '\n== OpenResty: metrics summed over 4 workers, log lines of an outage\n'
HIRATE_LUA_DIR=$jit_path HIRATE_LUAJIT_CPATH=$jit_cpath \
    "$python" "$root/tests/lua/nginx/test_metrics.py"

printf '\n== OpenResty: one in-memory table shared by 4 workers\n'
HIRATE_LUA_DIR=$jit_path HIRATE_LUAJIT_CPATH=$jit_cpath \
    "$python" "$root/tests/lua/nginx/test_shared.py"

printf '\n== One Redis bucket: Lua 5.4, Python, the hirate tool\n'
HIRATE_LUA54_PATH=$l54_path HIRATE_LUA54_CPATH=$l54_cpath HIRATE_CLI=$build/core/cli/hirate \
    "$python" "$root/tests/lua/test_cross_language.py" -v
