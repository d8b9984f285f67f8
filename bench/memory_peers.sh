#!/usr/bin/env bash
# The memory backend next to two in-memory peers doing the same work:
# Rust's governor 0.10 keyed limiter (DefaultKeyedRateLimiter) and Go's
# golang.org/x/time/rate limiters in a sync.Map (bench/memory_peers/). Each
# makes bench_memory's "allowed" decisions: 10,000 keys of 12 bytes, burst
# (capacity) 1e9 at 1e6 tokens a second, cost 1, a monotonic clock read per
# decision, on 1 thread, 2 threads sharing every key, and 2 threads with
# half the keys each. Rounds are interleaved (hirate, governor, x/time/rate,
# then again), one run of SECONDS each configuration a round; the table
# gives the median of ROUNDS.
#
#   bench/memory_peers.sh BUILD_DIR [SECONDS] [ROUNDS]   (defaults 1 and 5)
#
# Prints a Markdown section on stdout and "name value" summary lines into
# $MEMORY_PEERS_SUMMARY when set. Builds the peers under
# BUILD_DIR/memory_peers (go build; cargo build --release, from crates.io);
# a peer whose toolchain (go, cargo: also looked for in /usr/local/go/bin
# and ~/.cargo/bin) is missing is reported as not measured.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [SECONDS] [ROUNDS]" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$1" && pwd)
SECS=${2:-1}
ROUNDS=${3:-5}
OUT=$BUILD/memory_peers
mkdir -p "$OUT"
PATH=$PATH:/usr/local/go/bin:$HOME/.cargo/bin
log() { echo "[memory_peers] $*" >&2; }

GO_BIN= RUST_BIN= GO_WHY="go not found" RUST_WHY="cargo not found"
if command -v go >/dev/null; then
    if (cd "$ROOT/bench/memory_peers/go" && go build -o "$OUT/memory_peer_go" .) >"$OUT/go.log" 2>&1; then
        GO_BIN=$OUT/memory_peer_go
    else GO_WHY="go build failed: $(tail -1 "$OUT/go.log")"; fi
fi
if command -v cargo >/dev/null; then
    log "cargo build --release (governor)"
    if (cd "$ROOT/bench/memory_peers/rust" && CARGO_TARGET_DIR="$OUT/cargo" cargo build --release --locked) >"$OUT/cargo.log" 2>&1; then
        RUST_BIN=$OUT/cargo/release/memory_peer_rust
    else RUST_WHY="cargo build failed: $(tail -1 "$OUT/cargo.log")"; fi
fi

RES=$OUT/results.txt
: >"$RES"
for r in $(seq "$ROUNDS"); do
    log "round $r/$ROUNDS"
    for c in 1t 2t 2t_disjoint; do
        "$BUILD/bench/bench_memory" --only "allow_api_$c" --seconds "$SECS" --runs 1 2>/dev/null |
            awk -v c="$c" '/M\/s/ {print "hirate_" c, $4 * 1e6}' >>"$RES"
    done
    [ -n "$RUST_BIN" ] && "$RUST_BIN" --seconds "$SECS" --runs 1 >>"$RES"
    [ -n "$GO_BIN" ] && "$GO_BIN" -seconds "$SECS" -runs 1 >>"$RES"
done

med() {   # median of the figures named $1, or empty
    awk -v n="$1" '$1 == n {print $2}' "$RES" | sort -g |
        awk '{v[NR] = $1} END {if (NR) printf "%.0f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
mps() { [ -n "$1" ] && awk -v x="$1" 'BEGIN {printf "%.2f M (%.0f ns)", x / 1e6, 1e9 / x}' || echo "–"; }
ratio() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}' || echo "–"; }

echo "### Memory backend next to governor and x/time/rate"
echo
echo "The same work in each: 10,000 hot keys (12 bytes), burst 1e9 at 1e6 a second (every decision spends), cost 1, a monotonic clock read per decision: hirate through \`hirate_allow\` (bench_memory's \"allowed\" row), Rust's [governor](https://crates.io/crates/governor) 0.10 \`DefaultKeyedRateLimiter\` (\`check_key\`), Go's \`golang.org/x/time/rate\` limiters in a \`sync.Map\` (\`AllowN(time.Now(), 1)\`), programs in \`bench/memory_peers/\`. Median of $ROUNDS interleaved rounds of ${SECS} s each; decisions per second, two threads summed; \`bench/memory_peers.sh BUILD_DIR $SECS $ROUNDS\`."
echo
echo "| threads | hirate | governor | x/time/rate | hirate / governor | hirate / x/time/rate |"
echo "|---|---:|---:|---:|---:|---:|"
for c in 1t 2t 2t_disjoint; do
    h=$(med "hirate_$c") g=$(med "rust_governor_$c") x=$(med "go_xtime_$c")
    case $c in 1t) d="1" ;; 2t) d="2, every key shared" ;; *) d="2, disjoint keys" ;; esac
    echo "| $d | $(mps "$h") | $(mps "$g") | $(mps "$x") | $(ratio "$h" "$g") | $(ratio "$h" "$x") |"
    if [ -n "${MEMORY_PEERS_SUMMARY:-}" ]; then
        for p in "hirate $h" "governor $g" "xtime $x"; do
            set -- $p
            [ -n "${2:-}" ] && echo "mempeer_${1}_$c $2" >>"$MEMORY_PEERS_SUMMARY"
        done
    fi
done
h1=$(med hirate_1t) hd=$(med hirate_2t_disjoint) g1=$(med rust_governor_1t) gd=$(med rust_governor_2t_disjoint)
x1=$(med go_xtime_1t) xd=$(med go_xtime_2t_disjoint)
echo
echo "Two threads on disjoint keys / one thread: hirate $(ratio "$hd" "$h1"), governor $(ratio "$gd" "$g1"), x/time/rate $(ratio "$xd" "$x1")."
[ -z "$RUST_BIN" ] && echo "governor not measured: $RUST_WHY."
[ -z "$GO_BIN" ] && echo "x/time/rate not measured: $GO_WHY."
echo
