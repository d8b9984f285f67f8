#!/bin/sh
# The Lua tests (make test-lua), run against what `luarocks make` installs:
#
#   1. copies the checkout (without .git, bench/ and build directories) to
#      $out/src, and runs `luarocks make` there for Lua 5.4, packs what it
#      installed with `luarocks pack` and installs the packed rock into
#      $out/tree-5.4 (the module in it needs no libhiredis: ldd shows it), for LuaJIT (luarocks' Lua 5.1 with LuaJIT's headers, as
#      OpenResty loads it) into $out/tree-luajit, and for PUC Lua 5.3, 5.2 and
#      5.1 into $out/tree-5.3, $out/tree-5.2 and $out/tree-5.1;
#   2. runs tests/lua/alloc_fail.lua with Lua's allocator failing at each
#      allocation in turn (tests/lua/alloc_fail.c, under AddressSanitizer);
#   3. runs the busted specs (tests/lua/*_spec.lua, the module's) under lua5.4,
#      luajit, lua5.3, lua5.2 and lua5.1, each with its own tree;
#   4. runs them once more under valgrind on Lua 5.4: no memory error and no
#      definite leak, or the run fails (tests/lua/valgrind.supp names the one
#      exception, the core's once-per-process TLS state);
#   5. then the OpenResty steps at the end of this file (with OpenResty over a
#      Redis Cluster, tests/lua/nginx/test_cluster.py, and through Redis
#      Sentinel, tests/lua/nginx/test_sentinel.py).
#
#   tests/lua/run.sh [busted arguments]       e.g. tests/lua/run.sh --filter=vectors
#
# Environment: HIRATE_LUA_BUILD (default <checkout>/build-lua) holds all of
# it; JOBS (default 2) bounds the compiler. The steps after the specs may use
# HIRATE_LUA_TREE_54 and HIRATE_LUA_TREE_JIT (the two luarocks trees) and
# HIRATE_LUA_TMP (a scratch directory removed on exit). Every redis-server the
# specs start dies with the process that started it; the TLS specs make their
# certificates once, with tests/support/make_certs.sh, under $TMPDIR.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${HIRATE_LUA_BUILD:-$root/build-lua}
jobs=${JOBS:-2}
mkdir -p "$out"
out=$(cd "$out" && pwd)

HIRATE_LUA_TMP=$(mktemp -d "$out/tmp.XXXXXX")
trap 'rm -rf "$HIRATE_LUA_TMP"' EXIT INT TERM
export HIRATE_LUA_TMP TMPDIR="$HIRATE_LUA_TMP" HIRATE_SOURCE_DIR="$root"

step() { printf '\n== %s\n' "$*"; }

# ---- 1. luarocks make, from a copy of the checkout --------------------------------
step "copying the checkout to $out/src"
rm -rf "$out/src"
mkdir -p "$out/src"
tar -C "$root" --exclude=./.git --exclude='./build*' --exclude=./bench -cf - . |
    tar -C "$out/src" -xf -

rockspec=$(cd "$out/src" && ls hirate-*.rockspec)
export CMAKE_BUILD_PARALLEL_LEVEL="$jobs"
HIRATE_LUA_TREE_54=$out/tree-5.4
HIRATE_LUA_TREE_JIT=$out/tree-luajit
export HIRATE_LUA_TREE_54 HIRATE_LUA_TREE_JIT
rm -rf "$HIRATE_LUA_TREE_54" "$HIRATE_LUA_TREE_JIT"

step "luarocks make for Lua 5.4"
(cd "$out/src" && luarocks --lua-version 5.4 make --tree "$out/tree-make-5.4" "$rockspec")
# The Lua 5.4 specs run against a packed rock: `luarocks pack` of what make
# installed, installed into a fresh tree. It carries hiredis inside (the
# module needs no libhiredis) and nothing of bench/.
step "luarocks pack, and the packed rock installed into a fresh tree"
rm -rf "$out/rock"
mkdir -p "$out/rock"
(cd "$out/rock" && luarocks --lua-version 5.4 pack --tree "$out/tree-make-5.4" hirate)
rock=$(ls "$out"/rock/hirate-*.rock)
unzip -l "$rock" | grep -qE " bench/" && { echo "$rock holds bench/"; exit 1; }
luarocks --lua-version 5.4 install --tree "$HIRATE_LUA_TREE_54" --deps-mode=none "$rock"
core=$HIRATE_LUA_TREE_54/lib/lua/5.4/hirate/core.so
ldd "$core"
if ldd "$core" | grep -q hiredis; then echo "$core needs libhiredis"; exit 1; fi
if nm -D --defined-only "$core" | grep -v " luaopen_hirate_core$" | grep -q .; then
    echo "$core exports more than luaopen_hirate_core"; exit 1
fi
# The --local install as README.md and docs/lua.md show it, line for line,
# into a scratch HOME: after it, lua5.4 finds the module with no other setup.
step "the --local install of README.md and docs/lua.md, as written"
for page in README.md docs/lua.md; do
    lines=$(grep -E '^luarocks --lua-version 5\.4 make --local|^eval "\$\(luarocks --lua-version 5\.4 path\)"' \
        "$root/$page" | sed 's/ *#.*$//')
    [ "$(printf '%s\n' "$lines" | wc -l)" -eq 2 ] ||
        { echo "$page: no --local install followed by eval \"\$(luarocks path)\""; exit 1; }
    home=$HIRATE_LUA_TMP/home-$(basename "$page" .md)
    mkdir -p "$home"
    (cd "$out/src" && env -u LUA_PATH -u LUA_CPATH -u LUA_PATH_5_4 -u LUA_CPATH_5_4 HOME="$home" \
        sh -ec "$lines
lua5.4 -e 'local h = require \"hirate\"; assert(h.new{ capacity = 1, rate = 1 }:allow(\"k\").allowed)
           assert(package.searchpath(\"hirate.core\", package.cpath):find(os.getenv(\"HOME\"), 1, true))'" \
        >"$HIRATE_LUA_TMP/local.log" 2>&1) ||
        { cat "$HIRATE_LUA_TMP/local.log"; echo "$page: the --local install does not work as written"; exit 1; }
done
step "luarocks make for LuaJIT"
(cd "$out/src" && luarocks --lua-version 5.1 --lua-dir /usr make --tree "$HIRATE_LUA_TREE_JIT" \
    "$rockspec" LUA_INCDIR=/usr/include/luajit-2.1)
for v in 5.3 5.2 5.1; do
    step "luarocks make for Lua $v"
    rm -rf "$out/tree-$v"
    (cd "$out/src" && luarocks --lua-version $v --lua-dir /usr make --tree "$out/tree-$v" \
        "$rockspec" LUA_INCDIR=/usr/include/lua$v)
done

# ---- 2. out of memory: every Lua allocation of alloc_fail.lua failing in turn ------
step "Lua running out of memory at each allocation (AddressSanitizer)"
wrap="-Wl,--wrap=hirate_limiter_new -Wl,--wrap=hirate_limiter_free"
wrap="$wrap -Wl,--wrap=hirate_op_start -Wl,--wrap=hirate_op_start_bands"
wrap="$wrap -Wl,--wrap=hirate_op_start_reset -Wl,--wrap=hirate_op_free"
wrap="$wrap -Wl,--wrap=hirate_handshake_start -Wl,--wrap=hirate_node_handshake_start"
wrap="$wrap -Wl,--wrap=hirate_handshake_free"
# shellcheck disable=SC2086
${CC:-cc} -std=c11 -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all \
    -fno-omit-frame-pointer -Wall -Wextra -Werror -D_DEFAULT_SOURCE \
    -I/usr/include/lua5.4 -I"$out/src/core/include" \
    -o "$HIRATE_LUA_TMP/alloc_fail" "$root/tests/lua/alloc_fail.c" \
    "$root/bindings/lua/hirate_core.c" "$out/src/build.luarocks/libhirate.a" $wrap \
    -llua5.4 -lhiredis -lssl -lcrypto -lm -lpthread
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "$HIRATE_LUA_TMP/alloc_fail" \
    "$root/tests/lua/alloc_fail.lua"

# ---- 3. the specs, once per interpreter ------------------------------------------
specs=""
for f in "$root"/tests/lua/*_spec.lua; do
    case $(basename "$f") in
        *resty*|*nginx*) ;;   # the OpenResty specs run in step 5
        *cluster*) ;;         # Redis Cluster: on its own below, under Lua 5.4 and LuaJIT
        *sentinel*) ;;        # Redis Sentinel: on its own below, under Lua 5.4
        *) specs="$specs $f" ;;
    esac
done

all_specs=$specs

# Runs busted under interpreter $1 with tree $2 (its Lua version $3).
run_specs() {
    lua=$1 tree=$2 v=$3
    shift 3
    cd "$HIRATE_LUA_TMP"
    # shellcheck disable=SC2086
    LUA_PATH="$tree/share/lua/$v/?.lua;$tree/share/lua/$v/?/init.lua;$root/tests/lua/?.lua;;" \
    LUA_CPATH="$tree/lib/lua/$v/?.so;;" \
        $lua /usr/bin/busted "$@" $specs
    cd "$root"
}

step "busted under Lua 5.4"
run_specs lua5.4 "$HIRATE_LUA_TREE_54" 5.4 "$@"
step "busted under LuaJIT"
run_specs luajit "$HIRATE_LUA_TREE_JIT" 5.1 "$@"
for v in 5.3 5.2 5.1; do
    step "busted under Lua $v"
    run_specs lua$v "$out/tree-$v" $v "$@"
done

step "busted: Redis Cluster, under Lua 5.4 and LuaJIT"
specs=$root/tests/lua/cluster_spec.lua
run_specs lua5.4 "$HIRATE_LUA_TREE_54" 5.4 "$@"
run_specs luajit "$HIRATE_LUA_TREE_JIT" 5.1 "$@"
step "busted: Redis Sentinel, under Lua 5.4"
specs=$root/tests/lua/sentinel_spec.lua
run_specs lua5.4 "$HIRATE_LUA_TREE_54" 5.4 "$@"
specs=$all_specs

# ---- 4. valgrind ------------------------------------------------------------------
# PUC Lua: Debian's LuaJIT is not built for valgrind (no LUAJIT_USE_VALGRIND).
step "busted under valgrind (Lua 5.4)"
# valgrind.supp: the core's once-per-process TLS state, lost when Lua unloads
# the module at exit (see there).
run_specs "valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
    --show-leak-kinds=definite --suppressions=$root/tests/lua/valgrind.supp lua5.4" \
    "$HIRATE_LUA_TREE_54" 5.4 "$@"

# ---- 5. OpenResty ------------------------------------------------------------------
"$root/tests/lua/nginx/run.sh"
step "OpenResty over a Redis Cluster"
HIRATE_LUA_DIR=$HIRATE_LUA_TREE_JIT/share/lua/5.1 HIRATE_LUAJIT_CPATH=$HIRATE_LUA_TREE_JIT/lib/lua/5.1 \
    "${PYTHON:-python3}" "$root/tests/lua/nginx/test_cluster.py" -v
step "OpenResty through Redis Sentinel"
HIRATE_LUA_DIR=$HIRATE_LUA_TREE_JIT/share/lua/5.1 HIRATE_LUAJIT_CPATH=$HIRATE_LUA_TREE_JIT/lib/lua/5.1 \
    "${PYTHON:-python3}" "$root/tests/lua/nginx/test_sentinel.py" -v
