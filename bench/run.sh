#!/usr/bin/env bash
# The whole benchmark suite, on one machine: writes docs/benchmarks.md, the
# results it is drawn from (docs/benchmarks.json) and the charts
# (docs/img/bench-*.png). Builds nothing of the C library itself:
#
#   cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build-bench -j2
#   bench/run.sh build-bench          # or: make bench
#   QUICK=1 bench/run.sh build-bench  # or: make bench QUICK=1
#   bench/run.sh build-bench cluster  # only the Redis Cluster comparison (part 3's
#                                     # cluster phase), about 3 minutes
#   bench/run.sh build-bench functions  # only FCALL against EVALSHA against EVAL
#                                       # (part 3's functions phase), about 1.5 minutes
#   bench/run.sh build-bench failover   # only the Sentinel failover times (part 3's
#                                       # failover phase), about 2 minutes
#   bench/run.sh build-bench bands      # only two limits on one identity (part 3's
#                                       # bands phase), about 2 minutes
#
# 1. hirate alone, the C benchmarks of BUILD_DIR/bench: it starts its own
#    redis-server on a free loopback port (and stops it), runs bench_memory
#    and bench/memory_peers.sh (the memory backend next to Rust's governor
#    and Go's x/time/rate, built with cargo and go when they are installed),
#    then against that server bench_redis, bench_denycache, bench_batch (next
#    to redis-benchmark) and bench_calls under valgrind --tool=callgrind; then
#    bench_calls again over TLS, against a redis-server of its own that
#    speaks only TLS (certificates from tests/support/make_certs.sh); then
#    a second redis-server of its own for bench_outage, which stops it
#    (SIGSTOP), resumes it and kills it. Whatever happens, the exit trap sends
#    SIGCONT before it stops a server, so that none is left stopped.
# 2. bench/suite/install.py installs the contenders under BUILD_DIR/suite (a
#    venv with redis-py, limits, matplotlib and hirate itself; npm ci of
#    bench/peers/node; go mod download and go build of bench/peers/go;
#    hirate's Lua module): whatever cannot be installed is reported missing.
# 3. bench/suite/suite.py: hirate next to its peers (C, Go, Node, Python,
#    OpenResty) on one redis-server of its own, interleaved rounds; then
#    hirate, redis-py and go-redis over TLS on a second, TLS-only server,
#    next to the same clients over TCP; then hirate, redis-py (RedisCluster)
#    and go-redis (ClusterClient) on a Redis Cluster of 3 masters and 3
#    replicas of its own (tests/support/redis_cluster.py) and on the one
#    redis-server, next to redis-benchmark --cluster; then FCALL against
#    EVALSHA against EVAL of the same decision on the one redis-server
#    (BUILD_DIR/bench/bench_functions, raw and through hirate); then the time
#    from a master's death (kill -9) and from SENTINEL FAILOVER to the first
#    decision on the new master, for hirate, redis-py's Sentinel and
#    go-redis' FailoverClient side by side, on Sentinel groups of their own
#    (tests/support/redis_sentinel.py); then a request limited by two rules
#    ("10/second; 1000/day") on the one redis-server: hirate's one decision
#    of both (peer_c's hirate_allow_bands; hirate.Limiter(limits=...)) next
#    to Flask-Limiter's way (limits, one hit per limit) and
#    rate-limiter-flexible's RateLimiterUnion, with the server's count of
#    the calls each decision took; then the bindings' own benchmarks
#    (bench/python, bench/lua, bench/nginx).
# 4. bench/suite/report.py: the page and the charts, from one results file.
#
# Progress goes to stderr. About 25 minutes in full on 2 cores; QUICK=1
# (one short round of everything but the bindings' own benchmarks, under two
# minutes) checks that the suite works and writes to bench/out/quick/
# instead, so that the committed page keeps the figures of the last full
# run. The first run installs the contenders (3 to 4 minutes more); later
# runs reinstall only what changed.
#
# Knobs (environment): QUICK (unset); BENCH_OUT (docs/benchmarks.md, in
# quick mode bench/out/quick/benchmarks.md), BENCH_JSON (next to it,
# benchmarks.json), BENCH_IMG (docs/img, in quick mode bench/out/quick/img);
# BENCH_PARTS (c,peers: which of parts 1 and 2-3 to run; "cluster",
# "functions", "bands" or "failover", as the second argument of that name does, runs
# only that phase and writes its results into the existing results file and
# its section into the page, the other sections kept as they are). Part 1:
# BENCH_SECONDS (1) and BENCH_RUNS (5) for each memory configuration,
# BENCH_STORE_KEYS (1000000) for its bytes per key, BENCH_ROUNDS (8) and
# BENCH_ROUND_SECONDS (1) for the Redis comparison, BENCH_OUTAGE_SECONDS
# (1.5) for each client in an outage, BENCH_DENY_SECONDS (2) for each
# deny-cache run, BENCH_BATCH_ROUNDS (3) and BENCH_BATCH_SECONDS (2) for the
# batch comparison, BENCH_CALLS (2000) and BENCH_MEM_CALLS (200000)
# decisions counted by callgrind. Parts 2-3: BENCH_PEER_ROUNDS (5),
# BENCH_PEER_SECONDS (1), BENCH_PEER_WARMUP (0.3), BENCH_ONLY (contender
# ids, comma-separated), BENCH_PIECES (1: the bindings' own benchmarks in
# quick mode too; they take a few minutes). QUICK=1 changes the defaults to
# a few tenths of a second each and one round.
#
# Needs (Debian, tools/deps.sh bench): redis-server, redis-tools
# (redis-cli, redis-benchmark), valgrind, python3-venv, nginx,
# libnginx-mod-http-lua, luajit2, lua5.4, wrk; and to build: cmake, gcc,
# pkg-config, libhiredis-dev, liblua5.4-dev, libluajit2-5.1-dev. Go (1.26)
# and Node.js (18 or later, with npm) come from outside Debian 12, and so
# does cargo (rustup; tools/deps.sh bench installs it); without them their
# contenders are reported missing.
set -euo pipefail

usage() { echo "usage: [QUICK=1] $0 BUILD_DIR [cluster|functions|bands|failover]" >&2; exit 2; }
[ $# -eq 1 ] || { [ $# -eq 2 ] && case $2 in cluster|functions|bands|failover) true ;; *) false ;; esac; } || usage
[ $# -eq 2 ] && BENCH_PARTS=$2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$1" 2>/dev/null && pwd) || { echo "$0: no build directory $1" >&2; exit 2; }
BIN="$BUILD/bench"
QUICK=${QUICK:-}
[ "$QUICK" = 0 ] && QUICK=
if [ -n "$QUICK" ]; then
    q() { echo "$1"; }
    OUTDIR=$ROOT/bench/out/quick
    OUT=${BENCH_OUT:-$OUTDIR/benchmarks.md}
    IMG=${BENCH_IMG:-$OUTDIR/img}
else
    q() { echo "$2"; }
    OUT=${BENCH_OUT:-$ROOT/docs/benchmarks.md}
    IMG=${BENCH_IMG:-$ROOT/docs/img}
fi
JSON=${BENCH_JSON:-$(dirname "$OUT")/benchmarks.json}
PARTS=${BENCH_PARTS:-c,peers}
case ",$PARTS," in *,c,*) RUN_C=1 ;; *) RUN_C=0 ;; esac
case ",$PARTS," in *,peers,*) RUN_PEERS=1 ;; *) RUN_PEERS=0 ;; esac
# One phase alone (each runs with the peers too): merged into $JSON.
PHASE_ONLY=0
case $PARTS in cluster|functions|bands|failover) PHASE_ONLY=1 ;; esac
SECONDS_EACH=${BENCH_SECONDS:-$(q 0.2 1)}
RUNS=${BENCH_RUNS:-$(q 1 5)}
STORE_KEYS=${BENCH_STORE_KEYS:-$(q 100000 1000000)}
ROUNDS=${BENCH_ROUNDS:-$(q 2 8)}
ROUND_SECONDS=${BENCH_ROUND_SECONDS:-$(q 0.2 1)}
NCALLS=${BENCH_CALLS:-$(q 200 2000)}
MEM_CALLS=${BENCH_MEM_CALLS:-$(q 20000 200000)}
OUTAGE_SECONDS=${BENCH_OUTAGE_SECONDS:-$(q 0.3 1.5)}
DENY_SECONDS=${BENCH_DENY_SECONDS:-$(q 1 2)}
BATCH_ROUNDS=${BENCH_BATCH_ROUNDS:-$(q 1 3)}
BATCH_SECONDS=${BENCH_BATCH_SECONDS:-$(q 0.3 2)}
PEER_ROUNDS=${BENCH_PEER_ROUNDS:-$(q 1 5)}
PEER_SECONDS=${BENCH_PEER_SECONDS:-$(q 0.2 1)}
PEER_WARMUP=${BENCH_PEER_WARMUP:-$(q 0.1 0.3)}
COMMAND="bench/run.sh $1"
[ $PHASE_ONLY = 1 ] && COMMAND="bench/run.sh $1 $PARTS"
for v in BENCH_SECONDS BENCH_RUNS BENCH_STORE_KEYS BENCH_ROUNDS BENCH_ROUND_SECONDS \
         BENCH_OUTAGE_SECONDS BENCH_DENY_SECONDS BENCH_BATCH_ROUNDS BENCH_BATCH_SECONDS \
         BENCH_CALLS BENCH_MEM_CALLS BENCH_PEER_ROUNDS BENCH_PEER_SECONDS BENCH_PEER_WARMUP \
         BENCH_ONLY BENCH_PARTS BENCH_PIECES; do
    [ $PHASE_ONLY = 1 ] && [ $v = BENCH_PARTS ] && continue
    [ -n "${!v:-}" ] && COMMAND="$v=${!v} $COMMAND"
done
[ -n "$QUICK" ] && COMMAND="QUICK=1 $COMMAND"

for b in bench_memory bench_redis bench_calls bench_outage bench_denycache bench_batch peer_c \
         bench_functions failover_c; do
    [ -x "$BIN/$b" ] || { echo "$0: $BIN/$b is not built (configure with -DHIRATE_BUILD_BENCH=ON and build first)" >&2; exit 1; }
done
command -v redis-server >/dev/null || { echo "$0: redis-server not found (apt-get install redis-server)" >&2; exit 1; }
command -v redis-cli >/dev/null || { echo "$0: redis-cli not found (apt-get install redis-tools)" >&2; exit 1; }
command -v redis-benchmark >/dev/null || { echo "$0: redis-benchmark not found (apt-get install redis-tools)" >&2; exit 1; }
PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null || { echo "$0: $PYTHON not found" >&2; exit 1; }
HAVE_VALGRIND=1
command -v valgrind >/dev/null && command -v callgrind_annotate >/dev/null || HAVE_VALGRIND=0

WORK=$(mktemp -d "${TMPDIR:-/tmp}/hirate-bench.XXXXXX")
REDIS_PID=
# A server may be stopped (bench_outage sends it SIGSTOP): SIGCONT first,
# always, or SIGTERM would stay pending and wait would never return.
stop_redis() {
    if [ -n "$REDIS_PID" ]; then
        kill -CONT "$REDIS_PID" 2>/dev/null || true
        kill "$REDIS_PID" 2>/dev/null || true
        wait "$REDIS_PID" 2>/dev/null || true
        # wait does not wait for a disowned server (the outages'): poll.
        for _ in $(seq 40); do kill -0 "$REDIS_PID" 2>/dev/null || break; sleep 0.05; done
        REDIS_PID=
    fi
}
cleanup() {
    stop_redis
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step() { printf '[bench %3ds] %s\n' "$SECONDS" "$*" >&2; }

# ---- a redis-server of our own on a free loopback port --------------------------
# Ports are drawn from PORT_LO .. PORT_LO + PORT_SPAN - 1.
PORT_LO=20000
PORT_SPAN=40000
# start_redis tls: the server speaks only TLS (--port 0 --tls-port P), with
# the certificates of tests/support/make_certs.sh in $CERTS; PORT is its port.
start_redis() {
    local try port listen ping
    for try in 1 2 3 4 5 6 7 8; do
        port=$((PORT_LO + RANDOM % PORT_SPAN))
        # Something already answers there: pick another.
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then continue; fi
        listen=(--port "$port")
        ping=(redis-cli -p "$port")
        if [ "${1:-}" = tls ]; then
            listen=(--port 0 --tls-port "$port" --tls-cert-file "$CERTS/server.crt"
                    --tls-key-file "$CERTS/server.key" --tls-ca-cert-file "$CERTS/ca.crt"
                    --tls-auth-clients no)
            ping=(redis-cli --tls --cacert "$CERTS/ca.crt" -h localhost -p "$port")
        fi
        redis-server "${listen[@]}" --bind 127.0.0.1 --save '' --appendonly no \
            --dir "$WORK" --logfile "$WORK/redis.log" --daemonize no &
        REDIS_PID=$!
        for _ in $(seq 100); do
            if ! kill -0 "$REDIS_PID" 2>/dev/null; then break; fi   # lost the port: retry
            if [ "$("${ping[@]}" ping 2>/dev/null)" = PONG ]; then
                PORT=$port
                return 0
            fi
            sleep 0.05
        done
        kill "$REDIS_PID" 2>/dev/null || true
        wait "$REDIS_PID" 2>/dev/null || true
        REDIS_PID=
    done
    echo "$0: could not start redis-server; see $WORK/redis.log" >&2
    return 1
}
CERTS="$WORK/certs"

# ---- facts about the machine and the build ----------------------------------------
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
ncpu=$(nproc)
kernel=$(uname -sr)
mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)
clocksource=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null || echo unknown)
hyper=$(lscpu 2>/dev/null | sed -n 's/^Hypervisor vendor:[[:space:]]*//p')
[ -n "$hyper" ] || hyper=$(grep -q hypervisor /proc/cpuinfo && echo "a hypervisor" || echo none)
container=$( (systemd-detect-virt --container 2>/dev/null || true) | head -1)
virt="hypervisor $hyper"
[ -n "$container" ] && [ "$container" != none ] && virt="$virt, container $container"
redis_v=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
hiredis_v=$(pkg-config --modversion hiredis 2>/dev/null || echo unknown)
gcc_v=$(gcc --version | head -1)
valgrind_v=$( [ $HAVE_VALGRIND = 1 ] && valgrind --version || echo "not installed")
hirate_v=$(sed -n 's/^#define HIRATE_VERSION_STRING "\(.*\)"/\1/p' "$ROOT/core/include/hirate.h")
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
bt_upper=$(echo "${build_type:-none}" | tr '[:lower:]' '[:upper:]')
cflags=$(sed -n "s/^CMAKE_C_FLAGS_${bt_upper}:[A-Z]*=//p" "$BUILD/CMakeCache.txt")
# The project's options whose value in this build is not their default, as
# they would be given to cmake: the configure line below is then the one used.
cmake_opts=$(
    sed -n 's/^option(\(HIRATE_[A-Z_]*\) "[^"]*" \([A-Z]*\)).*/\1 \2/p' "$ROOT/CMakeLists.txt" |
    while read -r name def; do
        v=$(sed -n "s/^$name:[A-Z]*=//p" "$BUILD/CMakeCache.txt")
        [ -n "$v" ] && [ "$v" != "$def" ] && printf ' -D%s=%s' "$name" "$v"
    done
    v=$(sed -n 's/^HIRATE_SANITIZE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
    [ -n "$v" ] && printf ' -DHIRATE_SANITIZE=%s' "$v"
    true)
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "none yet")
dirty=$(git -C "$ROOT" status --porcelain -- core lua bench 2>/dev/null | head -1)
[ -n "$dirty" ] && commit="$commit (with uncommitted changes)"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
# Busy CPU time of the whole machine (clock ticks), to tell afterwards how much
# of it went to processes other than this run's.
busy_ticks() { awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8 + $9; exit}' /proc/stat; }
busy0=$(busy_ticks)
wall0=$(date +%s.%N)
started=$(date -u '+%Y-%m-%d %H:%M UTC')


# ---- 1. hirate alone: the C benchmarks --------------------------------------------------
run_c() {
CDIR="$WORK/c"
mkdir -p "$CDIR"
SUMMARY="$CDIR/summary.txt"
: >"$SUMMARY"

# ---- 1. memory backend ---------------------------------------------------------------
step "memory backend: 12 configurations x $RUNS runs x ${SECONDS_EACH}s, then $STORE_KEYS keys"
"$BIN/bench_memory" --seconds "$SECONDS_EACH" --runs "$RUNS" --store-keys "$STORE_KEYS" \
    --summary "$SUMMARY" >"$WORK/memory.md"
step "memory backend next to governor and x/time/rate: $RUNS interleaved rounds x ${SECONDS_EACH}s (bench/memory_peers.sh)"
MEMORY_PEERS_SUMMARY=$SUMMARY "$ROOT/bench/memory_peers.sh" "$BUILD" "$SECONDS_EACH" "$RUNS" \
    >>"$WORK/memory.md"

# ---- 2. Redis path ----------------------------------------------------------------------
step "starting redis-server"
start_redis
URL="redis://127.0.0.1:$PORT"
step "redis path: $ROUNDS rounds x 2 clients x ${ROUND_SECONDS}s, for 1 key and for 10,000 keys ($URL)"
"$BIN/bench_redis" --url "$URL" --rounds "$ROUNDS" --seconds "$ROUND_SECONDS" \
    --summary "$SUMMARY" >"$WORK/redis.md"

# ---- 3. deny cache and batches, on the same server --------------------------------------
step "deny cache: one key at 100 times its rate, ${DENY_SECONDS}s with the cache on, then off"
"$BIN/bench_denycache" --url "$URL" --seconds "$DENY_SECONDS" --summary "$SUMMARY" \
    >"$WORK/denycache.md"
step "batches: $BATCH_ROUNDS rounds x 6 configurations x ${BATCH_SECONDS}s (redis-benchmark, hirate_allow_many)"
"$BIN/bench_batch" --url "$URL" --rounds "$BATCH_ROUNDS" --seconds "$BATCH_SECONDS" \
    --redis-benchmark "$(command -v redis-benchmark)" --summary "$SUMMARY" >"$WORK/batch.md"

# ---- 4. instructions per decision under callgrind ---------------------------------------
# count_mode NAME MODE N W [ARGS]: prints "Ir_total" of one bench_calls run
# (ARGS default: --url $URL); the callgrind output stays in $WORK/cg.NAME.
count_mode() {
    local name=$1 mode=$2 n=$3 w=$4
    shift 4
    [ $# -gt 0 ] || set -- --url "$URL"
    valgrind --tool=callgrind --collect-atstart=no --toggle-collect=bench_measured \
        --callgrind-out-file="$WORK/cg.$name" \
        "$BIN/bench_calls" --mode "$mode" --n "$n" --warmup "$w" "$@" >"$WORK/calls.$name.log" 2>&1 ||
        { cat "$WORK/calls.$name.log" >&2; return 1; }
    awk '/^totals:/ {print $2}' "$WORK/cg.$name"
}

# The function table of one profile (self cost, every function), without the
# annotated source that follows it.
annotate() {
    callgrind_annotate --threshold=100 --auto=no "$WORK/cg.$1" 2>/dev/null |
        sed -n '/file:function/,/^$/p'
}

# Top functions of one profile as Markdown rows: Ir per decision and share.
profile_rows() {
    local mode=$1 n=$2 top=$3
    annotate "$mode" |
        awk -v n="$n" -v top="$top" '
            match($0, /^ *[0-9,]+ \( *[0-9.]+%\) +/) {
                head = substr($0, 1, RLENGTH); rest = substr($0, RLENGTH + 1)
                gsub(/,/, "", head); gsub(/[()%]/, " ", head); split(head, h, " "); ir = h[1]; pct = h[2]
                obj = ""
                if (match(rest, / \[[^]]*\]$/)) obj = substr(rest, RSTART + 2, RLENGTH - 3)
                sub(/ \[[^]]*\]$/, "", rest)
                i = index(rest, ":"); file = substr(rest, 1, i - 1); fn = substr(rest, i + 1)
                # A library without debug information (libssl, libcrypto):
                # its name, since the file is unknown.
                if (file == "???" && obj != "") file = obj
                sub(/.*\//, "", file)
                sub(/@@?GLIBC.*/, "", fn)
                # Read to the end (no early exit: the pipe must not break).
                if (++rows <= top)
                    printf "| `%s` | %s | %.0f | %.1f%% |\n", fn, file, ir / n, pct
            }'
}

# Self cost per decision by object (the program, libssl, libcrypto, libc),
# one "object instructions" line each.
object_sums() {
    annotate "$1" |
        awk -v n="$2" '
            match($0, /^ *[0-9,]+ \( *[0-9.]+%\) +/) {
                head = substr($0, 1, RLENGTH); gsub(/[ ,]/, "", head); sub(/\(.*/, "", head)
                obj = "???"
                if (match($0, / \[[^]]*\]$/)) obj = substr($0, RSTART + 2, RLENGTH - 3)
                sub(/.*\//, "", obj); sub(/\.so.*/, "", obj)
                if (obj == "???") obj = "(unnamed)"
                ir[obj] += head
            }
            END { for (o in ir) printf "%s %.0f\n", o, ir[o] / n }' | sort -k2 -nr
}

# Calls to clock_gettime per decision. Callgrind counts calls outside the
# collected function too, so divide by the warm-up and the measured calls.
clock_reads() {
    awk -v n="$2" '
        /^cfn=/ { s = $0; sub(/^cfn=/, "", s); id = s; sub(/ .*/, "", id)
                  nm = s; sub(/^[^ ]* ?/, "", nm); if (nm != "") name[id] = nm; cur = name[id] }
        /^calls=/ { split($1, a, "="); if (cur ~ /^clock_gettime/) c += a[2] }
        END { printf "%.0f", c / n }' "$WORK/cg.$1"
}

MEM_WARMUP=20000   # bench_calls: two passes over its 10,000 keys
if [ $HAVE_VALGRIND = 1 ]; then
    for mode in hirate plain argv memory; do
        n=$NCALLS w=200
        [ $mode = memory ] && n=$MEM_CALLS w=$MEM_WARMUP
        step "callgrind: $mode ($n measured decisions)"
        total=$(count_mode $mode $mode $n $w)
        echo "calls_ir_$mode $(awk -v t="$total" -v n="$n" 'BEGIN {printf "%.1f", t / n}')" >>"$SUMMARY"
        echo "calls_clock_$mode $(clock_reads $mode $((n + w)))" >>"$SUMMARY"
    done
fi

stop_redis

# ---- 4b. the same count over TLS, on a redis-server that speaks only TLS ----------------
# Not fatal: a build without TLS leaves the reason in the report instead.
TLS_CALLS_WHY=
if [ $HAVE_VALGRIND = 1 ]; then
    if ! sh "$ROOT/tests/support/make_certs.sh" "$CERTS" 2>"$WORK/certs.log"; then
        TLS_CALLS_WHY="tests/support/make_certs.sh failed: $(tail -1 "$WORK/certs.log")"
    elif ! start_redis tls; then
        TLS_CALLS_WHY="the TLS redis-server did not start"
    else
        step "callgrind: hirate over TLS ($NCALLS measured decisions, rediss://localhost:$PORT)"
        if total=$(count_mode hirate_tls hirate "$NCALLS" 200 --url "rediss://localhost:$PORT" \
                       --tls-ca-file "$CERTS/ca.crt" 2>/dev/null); then
            echo "calls_ir_hirate_tls $(awk -v t="$total" -v n="$NCALLS" 'BEGIN {printf "%.1f", t / n}')" >>"$SUMMARY"
            echo "calls_clock_hirate_tls $(clock_reads hirate_tls $((NCALLS + 200)))" >>"$SUMMARY"
        else
            TLS_CALLS_WHY="bench_calls over TLS failed: $(grep -v '^==' "$WORK/calls.hirate_tls.log" | tail -1)"
            step "callgrind over TLS: not counted ($TLS_CALLS_WHY)"
        fi
        stop_redis
    fi
fi

# ---- 5. outages, against a redis-server of their own -------------------------------------
# bench_outage stops this server (SIGSTOP), resumes it, then kills it; the
# exit trap (stop_redis) resumes it whatever happens in between.
# Outside the ephemeral port range: the naive loop's hundreds of thousands of
# refused connects would otherwise, sooner or later, pick the server's own
# port as their source and connect to themselves (bench_outage checks).
read -r eph_lo eph_hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || { eph_lo=32768; eph_hi=60999; }
if [ "$eph_lo" -gt 11024 ]; then
    PORT_LO=10000; PORT_SPAN=$((eph_lo - 10000))
else
    PORT_LO=$((eph_hi + 1)); PORT_SPAN=$((65536 - PORT_LO))
fi
[ "$PORT_SPAN" -gt 32767 ] && PORT_SPAN=32767   # $RANDOM stops at 32767
[ "$PORT_SPAN" -ge 100 ] || { PORT_LO=20000; PORT_SPAN=40000; }
step "starting a redis-server for the outages (a port from $PORT_LO to $((PORT_LO + PORT_SPAN - 1)), outside the ephemeral range)"
start_redis
# bench_outage kills it: without disown the shell would report "Killed".
disown "$REDIS_PID"
step "outage: stopped (SIGSTOP), then killed: ${OUTAGE_SECONDS}s of hirate_allow each, next to a naive loop"
"$BIN/bench_outage" --url "redis://127.0.0.1:$PORT" --pid "$REDIS_PID" \
    --seconds "$OUTAGE_SECONDS" --summary "$SUMMARY" >"$WORK/outage.md"
stop_redis

# ---- the report ------------------------------------------------------------------------
val() { awk -v k="$1" '$1 == k {print $2; found = 1} END {if (!found) print "nan"}' "$SUMMARY"; }
fmt() { awk -v x="$1" -v f="$2" 'BEGIN {printf f, x}'; }
# 21454.3 -> 21,454
grp() { awk -v x="$1" 'BEGIN {s = sprintf("%.0f", x); while (s ~ /[0-9][0-9][0-9][0-9]/) sub(/[0-9][0-9][0-9]($|,)/, ",&", s); sub(/^,/, "", s); print s}'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN {exit !(a + 0 <= b + 0)}'; }

api1=$(val mem_allow_api_1t); inj1=$(val mem_allow_inj_1t)
api2=$(val mem_allow_api_2t); inj2=$(val mem_allow_inj_2t)
dis2=$(val mem_allow_inj_2t_disjoint)
bpk=$(val mem_bytes_per_key); rss=$(val mem_rss_per_key); klen=$(val mem_key_len)
rh=$(val redis_ratio_hot); rk=$(val redis_ratio_keys)
ir_h=$(val calls_ir_hirate); ir_p=$(val calls_ir_plain); ir_a=$(val calls_ir_argv)
ir_m=$(val calls_ir_memory)
ir_t=$(val calls_ir_hirate_tls)

{
cat <<EOF
The programs are in \`bench/\`: \`bench_memory.c\` (memory backend), \`bench_redis.c\`
(round trips against redis-server, next to a plain hiredis loop), \`bench_outage.c\` (decision
latency while Redis is stopped or killed, next to a loop that retries every call),
\`bench_denycache.c\` (Redis calls for a key hammered far beyond its rate),
\`bench_batch.c\` (\`hirate_allow_many\` next to \`redis-benchmark\` pipelining the same
script call) and \`bench_calls.c\` (instructions per decision under callgrind). Each file's
opening comment says exactly what it measures. The numbers come from a shared virtual machine: compare figures from the
same run, not across runs.

EOF
cat "$WORK/memory.md"
cat "$WORK/redis.md"
cat "$WORK/outage.md"
cat "$WORK/denycache.md"
cat "$WORK/batch.md"

echo "### Client instructions per decision (callgrind)"
echo
if [ $HAVE_VALGRIND = 1 ]; then
    cat <<EOF
\`valgrind --tool=callgrind --collect-atstart=no --toggle-collect=bench_measured bench_calls --mode MODE\`:
after a warm-up (200 calls; for the memory backend two passes over its 10,000 keys, so
that every bucket exists), $NCALLS decisions (${MEM_CALLS} for the memory backend) run
inside \`bench_measured()\`, the only function whose instructions are collected, against the
same redis-server; the count divided by the number of decisions is below. Callgrind counts
user-space instructions only: what the kernel does for \`send\`/\`recv\` (or \`write\`/\`read\`)
is not in it. Under valgrind \`clock_gettime\` is a real system call, so the vDSO's own
instructions are not counted either (clock reads per decision: \`hirate_allow\` over Redis
$(val calls_clock_hirate), in memory $(val calls_clock_memory), the plain hiredis loop $(val calls_clock_plain)).

| client | instructions per decision | vs plain redisCommand |
|---|---:|---:|
| plain hiredis \`redisCommand(c, "EVALSHA %s 1 %s %s %s %s %s", ...)\` | $(grp "$ir_p") | 1.00 |
| hiredis \`redisCommandArgv\` (arguments already split) | $(grp "$ir_a") | $(awk -v a="$ir_a" -v p="$ir_p" 'BEGIN {printf "%.2f", a / p}') |
| \`hirate_allow\` (Redis) | **$(grp "$ir_h")** | $(awk -v a="$ir_h" -v p="$ir_p" 'BEGIN {printf "%.2f", a / p}') |
$(if [ -z "$TLS_CALLS_WHY" ]; then
    echo "| \`hirate_allow\` (Redis over TLS, \`rediss://localhost\`, \`tls_ca_file\`) | $(grp "$ir_t") | $(awk -v a="$ir_t" -v p="$ir_p" 'BEGIN {printf "%.2f", a / p}') |"
else
    echo "| \`hirate_allow\` (Redis over TLS) | not counted: $(echo "$TLS_CALLS_WHY" | tr '|' '/') | |"
fi)
| \`hirate_allow\` (memory backend) | $(grp "$ir_m") | |

Where a Redis-backed \`hirate_allow\` spends them (self cost, top functions):

| function | file | instructions per decision | share |
|---|---|---:|---:|
EOF
    profile_rows hirate "$NCALLS" 14
    if [ -z "$TLS_CALLS_WHY" ]; then
        cat <<EOF

Where a Redis-backed \`hirate_allow\` over TLS spends them (the same run against a
redis-server that speaks only TLS, certificates from \`tests/support/make_certs.sh\`; clock
reads per decision $(val calls_clock_hirate_tls)):

| function | file | instructions per decision | share |
|---|---|---:|---:|
EOF
        profile_rows hirate_tls "$NCALLS" 14
        cat <<EOF

The same two runs by object (self cost per decision; \`bench_calls\` holds hirate's static
library):

| object | over TCP | over TLS |
|---|---:|---:|
EOF
        object_sums hirate "$NCALLS" >"$WORK/obj.tcp"
        object_sums hirate_tls "$NCALLS" >"$WORK/obj.tls"
        awk 'NR == FNR {tcp[$1] = $2; next} {printf "| %s | %s | %s |\n", $1, ($1 in tcp) ? tcp[$1] : 0, $2; seen[$1] = 1}
             END {for (o in tcp) if (!(o in seen)) printf "| %s | %s | 0 |\n", o, tcp[o]}' \
            "$WORK/obj.tcp" "$WORK/obj.tls"
    fi
    cat <<EOF

Where a memory-backed \`hirate_allow\` spends them:

| function | file | instructions per decision | share |
|---|---|---:|---:|
EOF
    profile_rows memory "$MEM_CALLS" 14
    echo
else
    echo "Not measured: valgrind is not installed (\`apt-get install valgrind\`)."
    echo
fi

} >"$CDIR/sections.md"

# ---- targets ----
{
clock_ns=$(awk -v a="$api1" -v i="$inj1" 'BEGIN {printf "%.0f", 1e9 / a - 1e9 / i}')
if le 20000000 "$api1"; then
    echo "- **Met**: memory backend, one thread, hot set of 10,000 keys: $(awk -v x="$api1" 'BEGIN {printf "%.1f", x / 1e6}') million decisions/s through \`hirate_allow\` (target: at least 20 million)."
else
    echo "- **Not met**: memory backend, one thread, hot set of 10,000 keys: $(awk -v x="$api1" 'BEGIN {printf "%.1f", x / 1e6}') million decisions/s through \`hirate_allow\` ($(awk -v x="$api1" 'BEGIN {printf "%.0f", 1e9 / x}') ns each; target: at least 20 million, 50 ns each)."
    echo "  What stands in the way:"
    echo "  - The clock. With the time injected (\`hirate_decide_at\`, the clock read once per 1024 decisions) the same loop makes $(awk -v x="$inj1" 'BEGIN {printf "%.1f", x / 1e6}') million/s: each decision's \`clock_gettime(CLOCK_MONOTONIC)\` (clock source $clocksource, in a virtual machine) costs about $clock_ns ns of the budget of 50."
    if le 20000000 "$inj1"; then
        echo "  - Only the clock: with the time injected the loop meets the target."
    elif [ $HAVE_VALGRIND = 1 ]; then
        echo "  - The work itself: even with the time injected a decision takes $(awk -v x="$inj1" 'BEGIN {printf "%.0f", 1e9 / x}') ns, $(grp "$ir_m") instructions, of which the largest self costs are $(profile_rows memory "$MEM_CALLS" 6 | awk -F' [|] ' '{gsub(/^[|] /, "", $1); printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $3}') (table above)."
    fi
fi
echo "- Two threads on the same hot set make $(awk -v x="$api2" 'BEGIN {printf "%.1f", x / 1e6}') million/s together through \`hirate_allow\` ($(awk -v a="$api2" -v b="$api1" 'BEGIN {printf "%.2f", a / b}') times one thread; $(awk -v x="$inj2" 'BEGIN {printf "%.1f", x / 1e6}') million/s with the time injected, $(awk -v x="$dis2" 'BEGIN {printf "%.1f", x / 1e6}') million/s when each thread has its own half of the keys). No target is set for two threads; the table above shows how far they are from scaling."

worst=$(awk -v a="$bpk" -v b="$rss" 'BEGIN {print (a > b ? a : b)}')
if le "$worst" "$(awk -v k="$klen" 'BEGIN {print 96 + k}')"; then
    echo "- **Met**: bytes per key: $(fmt "$bpk" "%.1f") by the table's own count and $(fmt "$rss" "%.1f") by resident-set growth for $klen-byte keys, that is $(awk -v a="$bpk" -v k="$klen" 'BEGIN {printf "%.1f", a - k}') and $(awk -v a="$rss" -v k="$klen" 'BEGIN {printf "%.1f", a - k}') plus the key (target: at most 96 plus the key)."
else
    echo "- **Not met**: bytes per key: $(fmt "$bpk" "%.1f") by the table's own count and $(fmt "$rss" "%.1f") by resident-set growth for $klen-byte keys, that is $(awk -v a="$bpk" -v k="$klen" 'BEGIN {printf "%.1f", a - k}') and $(awk -v a="$rss" -v k="$klen" 'BEGIN {printf "%.1f", a - k}') plus the key (target: at most 96 plus the key). What stands in the way: each entry is a separate malloc chunk (48 bytes of fields plus the key, plus malloc's own header and rounding) and the slot arrays add 8 to 16 bytes per key."
fi

if le "$rh" 1.05 && le "$rk" 1.05; then
    echo "- **Met**: Redis path: \`hirate_allow\` takes $(fmt "$rh" "%.3f") times the plain hiredis loop's time per decision on one hot key and $(fmt "$rk" "%.3f") times on 10,000 keys (median of $ROUNDS interleaved rounds; target: at most 1.05)."
else
    echo "- **Not met**: Redis path: \`hirate_allow\` takes $(fmt "$rh" "%.3f") times the plain hiredis loop's time per decision on one hot key and $(fmt "$rk" "%.3f") times on 10,000 keys (median of $ROUNDS interleaved rounds; target: at most 1.05). What stands in the way: the per-round ratios range over $(fmt "$(val redis_ratio_min_hot)" "%.2f")..$(fmt "$(val redis_ratio_max_hot)" "%.2f") (one key) and $(fmt "$(val redis_ratio_min_keys)" "%.2f")..$(fmt "$(val redis_ratio_max_keys)" "%.2f") (10,000 keys), and the client's own work is $(grp "$ir_h") instructions per decision against the plain loop's $(grp "$ir_p"): look for the cause outside the client's CPU time (system calls, scheduling, a busy machine) before changing code."
fi

# ---- outages: decision latency with the breaker ----
lt() { awk -v a="$1" -v b="$2" 'BEGIN {exit !(a + 0 < b + 0)}'; }
ok_p99=$(val outage_killed_hirate_p99_us); os_p99=$(val outage_stopped_hirate_p99_us)
outage_line="decision latency while Redis is down, \`hirate_allow\` with the breaker (\`on_error\` local): p99 $(fmt "$ok_p99" "%.2f") µs with the server killed and $(fmt "$os_p99" "%.2f") µs with it stopped (100 ms timeout), medians $(fmt "$(val outage_killed_hirate_median_us)" "%.2f") and $(fmt "$(val outage_stopped_hirate_median_us)" "%.2f") µs (target: p99 under 20 µs); the naive loop that tries Redis on every call: p99 $(fmt "$(val outage_killed_naive_p99_us)" "%.2f") µs (killed) and $(grp "$(val outage_stopped_naive_p99_us)") µs (stopped)."
if lt "$ok_p99" 20 && lt "$os_p99" 20; then
    echo "- **Met**: $outage_line Only hirate's first call into each outage and the breaker's probes were slow: $(grp "$(val outage_stopped_hirate_slow)") of $(grp "$(val outage_stopped_hirate_n)") decisions took 1 ms or more with the server stopped (the max, $(grp "$(val outage_stopped_hirate_max_us)") µs, is one timeout), $(grp "$(val outage_killed_hirate_slow)") of $(grp "$(val outage_killed_hirate_n)") with it killed."
else
    echo "- **Not met**: $outage_line What stands in the way: $(grp "$(val outage_killed_hirate_over20)") of $(grp "$(val outage_killed_hirate_n)") decisions took over 20 µs with the server killed and $(grp "$(val outage_stopped_hirate_over20)") of $(grp "$(val outage_stopped_hirate_n)") with it stopped, of which $(grp "$(val outage_killed_hirate_slow)") and $(grp "$(val outage_stopped_hirate_slow)") took 1 ms or more (the first call into the outage and the breaker's probes, $(grp "$(val outage_killed_hirate_attempts)") and $(grp "$(val outage_stopped_hirate_attempts)") Redis attempts); the rest are the local fallback's own decisions, slowed by the machine."
fi

# ---- deny cache: Redis calls per 1,000 decisions ----
dws=$(val deny_on_steady_per1000); dww=$(val deny_on_whole_per1000)
dfs=$(val deny_on_steady_floor_per1000); drs=$(val deny_on_steady_refused_by_redis)
drw=$(val deny_on_whole_refused_by_redis)
ratio_x=$(awk -v c="$(val deny_call_rate)" -v r="$(val deny_rate)" 'BEGIN {printf "%.0f", c / r}')
deny_line="one key hammered at $ratio_x times its rate makes $(fmt "$dws" "%.2f") Redis calls per 1,000 decisions with the deny cache in the steady state (from $(fmt "$(val deny_steady_from)" "%g") s on) and $(fmt "$dww" "%.2f") over the whole run, whose first moments include the full bucket's burst (target: at most 10; without the cache: $(fmt "$(val deny_off_steady_per1000)" "%.0f"))."
if le "$dws" 10; then
    echo "- **Met**: $deny_line Every allowed decision needs its own Redis call, so the floor at $ratio_x times the rate is $(fmt "$dfs" "%.2f") per 1,000 in the steady state: the cache reaches it, with $(grp "$drs") refusals sent to Redis ($(grp "$drw") over the whole run)."
else
    echo "- **Not met**: $deny_line What stands in the way:"
    echo "  - the floor: each allowed decision spends in Redis and needs a call of its own, $(fmt "$dfs" "%.2f") per 1,000 in the steady state at $ratio_x times the rate; a target of 10 leaves no room above it."
    if ! le "$drs" 0; then
        echo "  - $(grp "$drs") refusals still reached Redis in the steady state: the cache let those calls through before the refill could cover them."
    fi
fi

# ---- batches against the redis-benchmark ceiling ----
batch_desc() {
    case $1 in
        h16x1) echo "batches of 16 on 1 thread" ;; h16x2) echo "batches of 16 on 2 threads" ;;
        h100x1) echo "batches of 100 on 1 thread" ;; h100x2) echo "batches of 100 on 2 threads" ;;
    esac
}
best=$(for t in h16x1 h16x2 h100x1 h100x2; do echo "$t $(val "batch_${t}_rate")"; done |
       sort -k2 -g | tail -1 | cut -d' ' -f1)
bb=$(val "batch_${best}_rate"); rb50=$(val batch_rb_c50_rate); rb1=$(val batch_rb_c1_rate)
bratio=$(awk -v a="$bb" -v b="$rb50" 'BEGIN {printf "%.3f", a / b}')
batch_line="\`hirate_allow_many\`'s best configuration, $(batch_desc "$best"), makes $(grp "$bb") decisions/s, $bratio times \`redis-benchmark -c 50 -P 16\` ($(grp "$rb50")/s) with the same script call (target: at least 0.90). The comparison is with redis-benchmark's default 50 clients because that is the ceiling: 800 calls in flight keep the single-threaded server busy ($(fmt "$(val batch_rb_c50_busy)" "%.2f" | awk '{printf "%.0f%%", $1 * 100}') of its CPU, $(fmt "$(val batch_rb_c50_usec)" "%.2f") µs of script per call), and with hirate's best because a caller picks the batch size and threads. One connection each: \`redis-benchmark -c 1 -P 16\` $(grp "$rb1")/s, hirate with batches of 16 on 1 thread $(grp "$(val batch_h16x1_rate)")/s ($(awk -v a="$(val batch_h16x1_rate)" -v b="$rb1" 'BEGIN {printf "%.3f", a / b}') times)."
if ! lt "$bratio" 0.9; then
    echo "- **Met**: $batch_line"
else
    echo "- **Not met**: $batch_line What stands in the way: the server is the bottleneck of both (busy $(fmt "$(val "batch_${best}_busy")" "%.2f" | awk '{printf "%.0f%%", $1 * 100}') under hirate's best against $(fmt "$(val batch_rb_c50_busy)" "%.2f" | awk '{printf "%.0f%%", $1 * 100}') under redis-benchmark); while one thread's client encodes, waits and decodes, the server has nothing of its in flight, which only more threads (connections) or larger batches overlap."
fi

if [ $HAVE_VALGRIND = 1 ]; then
    if le "$ir_h" 3000; then
        echo "- **Met**: $(grp "$ir_h") client instructions per Redis-backed decision (target: at most 3,000; the plain \`redisCommand\` loop: $(grp "$ir_p"))."
    else
        echo "- **Not met**: $(grp "$ir_h") client instructions per Redis-backed decision (target: at most 3,000; the plain \`redisCommand\` loop: $(grp "$ir_p")). What stands in the way, from the profile above (instructions per decision):"
        # Sum the self cost of the profile's functions by what they do.
        annotate hirate |
        awk -v n="$NCALLS" '
            match($0, /^ *[0-9,]+ /) {
                ir = substr($0, 1, RLENGTH); gsub(/[ ,]/, "", ir)
                if ($0 ~ /strtod|mpn|round_and_return|round_away/) g["strtod"] += ir
                else if ($0 ~ /proto.c:(hirate_proto_parse|parse_scalar|parse_i64|find_crlf)|memchr/) g["parse"] += ir
                else if ($0 ~ /proto.c:(hirate_proto_encode_call|put_|bulk_size|int_bulk_size|u64_digits)|memmove|memcpy/) g["encode"] += ir
                else if ($0 ~ /proto.c:hirate_proto_decision|memcmp|strspn/) g["decision"] += ir
                else if ($0 ~ /redis.c:(acquire|release)|pthread_|clock_gettime|monotonic/) g["pool"] += ir
                else g["other"] += ir
            }
            END {
                printf "  - reading the reply: %.0f in the RESP parser (`hirate_proto_parse` and its helpers, `memchr`) and %.0f checking it (`hirate_proto_decision`, `memcmp`, `strspn`);\n", g["parse"] / n, g["decision"] / n
                if (g["strtod"] > 0)
                    printf "  - %.0f in glibc `strtod_l`, reading the token level (17 significant digits) from the reply;\n", g["strtod"] / n
                printf "  - %.0f encoding the call (`hirate_proto_encode_call` and its helpers, `memcpy`);\n", g["encode"] / n
                printf "  - %.0f in the pool (`acquire`/`release`: mutex, condition signal, clock reads);\n", g["pool"] / n
                printf "  - %.0f everywhere else (`limiter.c`, the rest of `redis.c`, the benchmark loop).\n", g["other"] / n
            }'
    fi
    if [ -z "$TLS_CALLS_WHY" ]; then
        echo "- Over TLS (no target of its own): $(grp "$ir_t") client instructions per Redis-backed decision, $(grp "$(awk -v a="$ir_t" -v b="$ir_h" 'BEGIN {print a - b}')") more than over plain TCP ($(awk -v a="$ir_t" -v b="$ir_h" 'BEGIN {printf "%.2f", a / b}') times)."
    else
        echo "- **Not measured**: client instructions per Redis-backed decision over TLS ($TLS_CALLS_WHY)."
    fi
else
    echo "- **Not measured**: client instructions per Redis-backed decision (valgrind is not installed)."
fi
} >"$CDIR/targets.md"
}

if [ $RUN_C = 1 ]; then
    run_c
else
    mkdir -p "$WORK/c"
    echo "BENCH_PARTS=$PARTS" >"$WORK/c/skipped"
fi

# ---- 2 and 3. the contenders, then hirate next to them ----------------------------------------
if [ $RUN_PEERS = 1 ]; then
    step "setup: the contenders under $BUILD/suite (bench/suite/install.py)"
    "$PYTHON" "$ROOT/bench/suite/install.py" --dir "$BUILD/suite"
    suite_args=(--build "$BUILD" --setup "$BUILD/suite/setup.json" --out "$JSON"
                --rounds "$PEER_ROUNDS" --seconds "$PEER_SECONDS" --warmup "$PEER_WARMUP")
    [ -n "$QUICK" ] && suite_args+=(--quick)
    [ -n "${BENCH_PIECES:-}" ] && [ "$BENCH_PIECES" != 0 ] && suite_args+=(--pieces)
    [ -n "${BENCH_ONLY:-}" ] && suite_args+=(--only "$BENCH_ONLY")
    BENCH_ELAPSED=$SECONDS "$PYTHON" "$ROOT/bench/suite/suite.py" "${suite_args[@]}"
elif [ $PHASE_ONLY = 1 ]; then
    step "setup: the contenders under $BUILD/suite (bench/suite/install.py)"
    install_args=(--dir "$BUILD/suite")
    # The bands phase's contenders are C, Python and Node only.
    [ "$PARTS" = bands ] && install_args+=(--skip go,lua,nginx)
    "$PYTHON" "$ROOT/bench/suite/install.py" "${install_args[@]}"
    suite_args=(--build "$BUILD" --setup "$BUILD/suite/setup.json" --out "$JSON" --merge
                --phases "$PARTS" --rounds "$PEER_ROUNDS" --seconds "$PEER_SECONDS"
                --warmup "$PEER_WARMUP")
    [ -n "$QUICK" ] && suite_args+=(--quick)
    BENCH_ELAPSED=$SECONDS "$PYTHON" "$ROOT/bench/suite/suite.py" "${suite_args[@]}"
else
    mkdir -p "$(dirname "$JSON")"
    "$PYTHON" - "$JSON" "$QUICK" <<'PY'
import json, sys
json.dump({"schema": 1, "mode": "quick" if sys.argv[2] else "full", "params": {},
           "scenarios": [], "contenders": [], "speed": {}, "atomic": {}, "outage": {},
           "memory": {}, "pieces": {}}, open(sys.argv[1], "w"))
PY
fi

# ---- 4. the page and the charts ---------------------------------------------------------------
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
busy1=$(busy_ticks)
wall1=$(date +%s.%N)
# CPU seconds of this script's children (benchmarks, valgrind, redis-server).
times >"$WORK/times"   # not in $(...): a subshell has no children of its own
ours=$(awk 'NR == 2 {
    for (i = 1; i <= 2; i++) { split($i, t, "m"); sub(/s$/, "", t[2]); s += t[1] * 60 + t[2] }
    print s }' "$WORK/times")
others=$(awk -v b0="$busy0" -v b1="$busy1" -v hz="$(getconf CLK_TCK)" -v ours="$ours" \
             -v w0="$wall0" -v w1="$wall1" -v n="$ncpu" \
             'BEGIN {o = (b1 - b0) / hz - ours; if (o < 0) o = 0; printf "%.0f", 100 * o / ((w1 - w0) * n)}')
if [ "$others" -ge 10 ]; then
    busy_note="Other processes kept the machine busy during this run (about $others% of its CPU time went to them): the timings below are pessimistic and noisier than on an idle machine."
    echo "$0: warning: other processes used about $others% of the CPU during the run" >&2
else
    busy_note="Other processes used about $others% of the machine's CPU time during this run."
fi

# The venv has matplotlib; without it the page is written without charts.
REPORT_PY=$PYTHON
[ -x "$BUILD/suite/venv/bin/python" ] && REPORT_PY=$BUILD/suite/venv/bin/python
rel() { case $1 in "$ROOT"/*) echo "${1#"$ROOT"/}" ;; *) echo "$1" ;; esac; }
{
    printf 'command\t%s\n' "$COMMAND"
    printf 'build_note\t, after `cmake -S . -B %s -DCMAKE_BUILD_TYPE=%s%s && cmake --build %s` (C flags `%s`; `make bench%s` builds and runs the same way)\n' \
        "$1" "${build_type:-none}" "$cmake_opts" "$1" "$cflags" "${QUICK:+ QUICK=1}"
    printf 'date\t%s\n' "$started"
    printf 'hirate\t%s\n' "$hirate_v"
    printf 'commit\t%s\n' "$commit"
    printf 'seconds\t%s\n' "$SECONDS"
    printf 'cpu\t%s\n' "$cpu"
    printf 'ncpu\t%s\n' "$ncpu"
    printf 'mem\t%s\n' "$mem"
    printf 'kernel\t%s\n' "$kernel"
    printf 'virt\t%s\n' "$virt"
    printf 'clocksource\t%s\n' "$clocksource"
    printf 'load_before\t%s\n' "$load_before"
    printf 'load_after\t%s\n' "$load_after"
    printf 'busy_note\t%s\n' "$busy_note"
    printf 'results_path\t%s\n' "$(rel "$JSON")"
    # Versions the C part used, for a run without the contenders' setup.
    printf 'v.redis-server\t%s\n' "$redis_v"
    printf 'v.hiredis\t%s\n' "$hiredis_v"
    printf 'v.gcc\t%s\n' "$(gcc -dumpfullversion 2>/dev/null || echo "$gcc_v")"
    if [ $HAVE_VALGRIND = 1 ]; then printf 'v.valgrind\t%s\n' "${valgrind_v#valgrind-}"; fi
} >"$WORK/facts.tsv"
mkdir -p "$(dirname "$OUT")" "$IMG"
if [ $PHASE_ONLY = 1 ]; then
    # The page again from the merged results: only that phase's section
    # changes; the charts of the other sections stay as they were drawn.
    step "writing the $PARTS section of $OUT"
    "$REPORT_PY" "$ROOT/bench/suite/report.py" --results "$JSON" --out "$OUT" --img "$IMG" \
        --phase-facts "$PARTS=$WORK/facts.tsv" --keep-charts
else
    step "writing $OUT and the charts in $IMG"
    "$REPORT_PY" "$ROOT/bench/suite/report.py" --results "$JSON" --out "$OUT" --img "$IMG" \
        --c-dir "$WORK/c" --facts "$WORK/facts.tsv"
fi
# What pip install of the wheel costs next to limits and Flask-Limiter: the
# page's "## Install" section (bench/install.sh).
if [ $PHASE_ONLY = 0 ]; then
    step "install: the wheel, limits and Flask-Limiter into fresh venvs (bench/install.sh)"
    HIRATE_INSTALL_BENCH="$BUILD/install" "$ROOT/bench/install.sh" "$OUT"
fi
step "done: $OUT"
