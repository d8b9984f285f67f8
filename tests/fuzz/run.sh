#!/bin/sh
# Builds the libFuzzer targets (tests/fuzz/CMakeLists.txt, clang with
# -fsanitize=fuzzer,address,undefined) and runs each for SECONDS on a copy of
# its seed corpus, so that a run never grows the repository; then replays
# every input kept under tests/fuzz/regressions/<target>/. Exits non-zero if
# any target crashed, leaked, hung or broke one of its checks.
#
#   tests/fuzz/run.sh [SECONDS]        default 10 (make test-fuzz); make fuzz: 60
#   BUILD_FUZZ=dir tests/fuzz/run.sh   build somewhere else than build-fuzz/
#
# A crash leaves its input in <build>/fuzz-artifacts/<target>/; once the bug
# is fixed, keep the input in tests/fuzz/regressions/<target>/.
set -eu

seconds=${1:-10}
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_FUZZ:-$root/build-fuzz}
here=$root/tests/fuzz
targets="fuzz_proto fuzz_url fuzz_key fuzz_options fuzz_op fuzz_handshake fuzz_cluster"

case $seconds in
    ''|*[!0-9]*) echo "usage: $0 [seconds]" >&2; exit 2 ;;
esac
command -v clang >/dev/null || { echo "$0: clang is missing (tools/deps.sh fuzz)" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/hirate-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
# The TLS files fuzz_options sets its options to (a CA, a client certificate
# and its key that a TLS context accepts).
sh "$root/tests/support/make_certs.sh" "$work/certs"
export HIRATE_FUZZ_CERTS="$work/certs"

cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DHIRATE_BUILD_FUZZ=ON -DHIRATE_BUILD_TESTS=OFF -DHIRATE_BUILD_BENCH=OFF -DHIRATE_WERROR=ON \
    >"$work/configure.log" 2>&1 || { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$build" -j "${JOBS:-2}" --target hirate_fuzz

# A smaller ASan quarantine than the default 256 MB: the targets make and
# free a limiter per input, and the quarantine alone would take half the
# RSS limit below. halt_on_error: UBSan findings are crashes too.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=64"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1:halt_on_error=1"

status=0
summary=""
for t in $targets; do
    bin=$build/tests/fuzz/$t
    mkdir -p "$work/$t" "$build/fuzz-artifacts/$t"
    cp "$here/corpus/$t/"* "$work/$t/"
    # Per target: replies may be long (the parser's limits are 4096 bytes a
    # line or bulk, more for a whole array), and the RESP and URL targets
    # get a dictionary of the tokens their inputs are made of.
    extra=""
    case $t in
        fuzz_proto|fuzz_op|fuzz_handshake|fuzz_cluster) extra="-max_len=12000 -dict=$here/resp.dict" ;;
        fuzz_url) extra="-dict=$here/url.dict" ;;
    esac
    echo "== $t: $seconds s"
    # -rss_limit_mb / -malloc_limit_mb: a hostile reply must not make the
    # library allocate much; -timeout: one input may not take 10 s (a loop).
    # shellcheck disable=SC2086
    if ! "$bin" -max_total_time="$seconds" -rss_limit_mb=512 -malloc_limit_mb=64 -timeout=10 \
            -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$t/" $extra \
            "$work/$t" >"$work/$t.log" 2>&1; then
        tail -n 60 "$work/$t.log"
        echo "$t: FAILED; the input is in $build/fuzz-artifacts/$t/" >&2
        status=1
    fi
    line=$(grep -E '^#[0-9]+.*DONE' "$work/$t.log" | tail -n 1 || true)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log" | tail -n 1)
    cov=$(echo "$line" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
    ft=$(echo "$line" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
    rate=$(echo "$line" | sed -n 's/.*exec\/s: \([0-9]*\).*/\1/p')
    corp=$(ls "$work/$t" | wc -l)
    summary="$summary$(printf '%-13s %10s runs %8s exec/s  cov %5s  ft %6s  corpus %5s' \
        "$t" "${runs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$corp")
"
    if [ -d "$here/regressions/$t" ] && [ -n "$(ls "$here/regressions/$t")" ]; then
        echo "== $t: regression inputs"
        if ! "$bin" -rss_limit_mb=512 -malloc_limit_mb=64 -timeout=10 "$here/regressions/$t/"* \
                >"$work/$t.regressions.log" 2>&1; then
            tail -n 60 "$work/$t.regressions.log"
            echo "$t: a regression input FAILED" >&2
            status=1
        fi
    fi
done

echo
echo "fuzzing summary ($seconds s a target):"
printf '%s' "$summary"
[ $status -eq 0 ] && echo "fuzz: all targets passed" || echo "fuzz: FAILED" >&2
exit $status
