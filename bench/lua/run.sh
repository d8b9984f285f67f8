#!/usr/bin/env bash
# lim:allow per second from Lua 5.4 and from LuaJIT, in memory and on Redis,
# side by side in one run; prints a markdown table on stdout (progress on
# stderr).
#
#   bench/lua/run.sh [BUILD_DIR]          default build-lua
#
# BUILD_DIR is a CMake build of this checkout; the Lua modules
# (BUILD_DIR/lua-5.4, BUILD_DIR/lua-luajit) are configured
# (-DHIRATE_BUILD_LUA=ON) and built there when missing. It starts its own
# redis-server on a free loopback port and stops it. Each of the four cells is
# measured BENCH_LUA_ROUNDS times (default 3), interleaved, for
# BENCH_LUA_SECONDS each (default 1); the table shows the median. Then each
# cell's instructions per call under callgrind (BENCH_LUA_CALLS calls,
# default 20,000), which do not depend on how busy the machine is.
#
# Needs (Debian): lua5.4, luajit, redis-server, redis-tools, valgrind; to
# build: cmake, gcc, pkg-config, libhiredis-dev, liblua5.4-dev,
# libluajit2-5.1-dev.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
COMMAND="bench/lua/run.sh${1:+ $1}"
BUILD=${1:-$ROOT/build-lua}
ROUNDS=${BENCH_LUA_ROUNDS:-3}
SECS=${BENCH_LUA_SECONDS:-1}

step() { printf '[bench/lua %3ds] %s\n' "$SECONDS" "$*" >&2; }

for m in hirate_lua_54:lua-5.4 hirate_lua_luajit:lua-luajit; do
    [ -f "$BUILD/${m#*:}/hirate/core.so" ] && continue
    step "building ${m%%:*} in $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -DHIRATE_BUILD_LUA=ON "-DHIRATE_LUA_FLAVORS=5.4;luajit" >/dev/null
    cmake --build "$BUILD" -j 2 --target "${m%%:*}" >/dev/null
done
BUILD=$(cd "$BUILD" && pwd)
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")

WORK=$(mktemp -d "${TMPDIR:-/tmp}/hirate-bench-lua.XXXXXX")
REDIS_PID=
cleanup() {
    if [ -n "$REDIS_PID" ]; then
        kill "$REDIS_PID" 2>/dev/null || true
        wait "$REDIS_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A redis-server of our own; setpriv: it dies with this script, whatever happens.
for _ in 1 2 3 4 5 6 7 8; do
    port=$((20000 + RANDOM % 40000))
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then continue; fi
    setpriv --pdeathsig KILL redis-server --port "$port" --bind 127.0.0.1 --save '' \
        --appendonly no --dir "$WORK" --logfile "$WORK/redis.log" &
    REDIS_PID=$!
    for _ in $(seq 100); do
        kill -0 "$REDIS_PID" 2>/dev/null || break
        [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && break 2
        sleep 0.05
    done
    kill "$REDIS_PID" 2>/dev/null || true
    wait "$REDIS_PID" 2>/dev/null || true
    REDIS_PID=
done
[ -n "$REDIS_PID" ] || { echo "$0: could not start redis-server" >&2; exit 1; }
URL=redis://127.0.0.1:$port

# One measurement: prints calls per second.
measure() {   # <lua> <flavor> <url or "">
    local out
    out=$(LUA_PATH="$ROOT/bindings/lua/?.lua;;" LUA_CPATH="$BUILD/lua-$2/?.so;;" \
        "$1" "$ROOT/bench/lua/bench_allow.lua" "$SECS" $3)
    awk -v o="$out" 'BEGIN { split(o, a, /[ \t]+/); printf "%.0f\n", a[1] / a[2] }'
}

declare -A runs
cells=("lua5.4 5.4 memory" "luajit luajit memory" "lua5.4 5.4 redis" "luajit luajit redis")
for r in $(seq "$ROUNDS"); do
    for c in "${cells[@]}"; do
        read -r lua flavor backend <<<"$c"
        step "round $r/$ROUNDS: $lua, $backend"
        url=""
        [ "$backend" = redis ] && url=$URL
        runs[$c]="${runs[$c]:-} $(measure "$lua" "$flavor" "$url")"
    done
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
thousands() { sed ':a; s/\([0-9]\)\([0-9]\{3\}\)\($\|,\)/\1,\2\3/; ta'; }   # 12345 -> 12,345

# Instructions per call under callgrind: a run of CALLS calls less a run of
# none, so that start-up and warm-up cancel out; the median of ROUNDS such
# pairs, since the hash seeds (Lua's strings, hirate's table) move the count
# by a percent or two from run to run. Unlike the rates above, it does not
# depend on how busy the machine is. "–" without valgrind.
CALLS=${BENCH_LUA_CALLS:-20000}
callgrind_total() {   # <lua> <flavor> <calls> <url or "">
    LUA_PATH="$ROOT/bindings/lua/?.lua;;" LUA_CPATH="$BUILD/lua-$2/?.so;;" \
        valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$1" "$ROOT/bench/lua/calls.lua" "$3" $4 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
instructions() {   # <lua> <flavor> <url or "">
    command -v valgrind >/dev/null || { echo "–"; return; }
    local r none all per=""
    for r in $(seq "$ROUNDS"); do
        none=$(callgrind_total "$1" "$2" 0 "$3")
        all=$(callgrind_total "$1" "$2" "$CALLS" "$3")
        [ -n "$none" ] && [ -n "$all" ] || { echo "–"; return; }
        per="$per $(( (all - none + CALLS / 2) / CALLS ))"
    done
    echo "$per" | median | thousands
}
declare -A instr
for c in "${cells[@]}"; do
    read -r lua flavor backend <<<"$c"
    step "instructions per call (callgrind): $lua, $backend"
    url=""
    [ "$backend" = redis ] && url=$URL
    instr[$c]=$(instructions "$lua" "$flavor" "$url")
done

fmt() {   # calls/s -> "1.23 M/s (813 ns)"
    awk -v x="$1" 'BEGIN { if (x >= 1e6) printf "%.2f M/s (%.0f ns)", x / 1e6, 1e9 / x;
                            else printf "%.1f k/s (%.1f us)", x / 1e3, 1e6 / x }'
}

lua54=$(lua5.4 -v 2>&1 | awk '{ print $2 }')
luajit=$(luajit -v | awk '{ print $2 }')
redis=$(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/')
cat <<TABLE
### \`lim:allow\` from Lua ($build_type build, median of $ROUNDS runs of ${SECS} s)

| backend | Lua $lua54 | LuaJIT $luajit |
|---|---|---|
| memory, 10,000 keys | $(fmt "$(echo "${runs[lua5.4 5.4 memory]}" | median)") | $(fmt "$(echo "${runs[luajit luajit memory]}" | median)") |
| Redis $redis on loopback, 1 connection | $(fmt "$(echo "${runs[lua5.4 5.4 redis]}" | median)") | $(fmt "$(echo "${runs[luajit luajit redis]}" | median)") |
| instructions per call, memory (callgrind) | ${instr[lua5.4 5.4 memory]} | ${instr[luajit luajit memory]} |
| instructions per call, Redis (callgrind, user space only) | ${instr[lua5.4 5.4 redis]} | ${instr[luajit luajit redis]} |

One Lua state, one call at a time, each a real decision (allowed, never from
the deny cache), over 10,000 keys in turn. Instructions: \`valgrind
--tool=callgrind\` of \`bench/lua/calls.lua\` making $(echo "$CALLS" | thousands) calls over
1,000 keys, less the same with none, divided by their number (median of $ROUNDS); the kernel's side of each
Redis round trip is not counted. Command: \`$COMMAND\`.
TABLE
