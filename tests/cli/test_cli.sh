#!/bin/sh
# End-to-end tests of the hirate command-line tool: exact stdout and exit
# status, against the in-memory backend and a throwaway redis-server that
# this script starts on a free loopback port and stops on exit.
#
#   sh tests/cli/test_cli.sh path/to/hirate [source-dir]
#
# Prints "N passed, N failed" and exits non-zero on any failure.

HIRATE=${1:?usage: test_cli.sh path/to/hirate [source-dir]}
SRC=${2:-$(dirname "$0")/../..}
SCRIPT_FILE=$SRC/lua/token_bucket.lua
CANARY=canary-pw-5d41b2
unset REDIS_URL

pass=0
fail=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hirate-cli.XXXXXX") || exit 2
redis_pid=
auth_pid=
tls_pids=

cleanup() {
    for pid in $redis_pid $auth_pid $tls_pids; do
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 2' INT TERM

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run CMD...: runs it; sets rc, out (stdout) and err (stderr).
run() {
    "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    out=$(cat "$tmp/out")
    err=$(cat "$tmp/err")
}

ok() { pass=$((pass + 1)); }

bad() {
    fail=$((fail + 1))
    printf 'FAIL: %s\n  wanted: %s\n  exit %s\n  stdout: %s\n  stderr: %s\n' \
        "$1" "$2" "$rc" "$out" "$err"
}

# expect NAME RC STDOUT CMD...: exit status RC, stdout exactly the line STDOUT.
expect() {
    name=$1 want_rc=$2 want_out=$3
    shift 3
    run "$@"
    if [ "$rc" = "$want_rc" ] && [ "$out" = "$want_out" ] &&
        [ "$(wc -l <"$tmp/out")" -eq 1 ]; then
        ok
    else
        bad "$name" "exit $want_rc, stdout $want_out"
    fi
}

# expect_lines NAME RC TEXT CMD...: exit status RC, stdout exactly TEXT (lines).
expect_lines() {
    name=$1 want_rc=$2 want_out=$3
    shift 3
    run "$@"
    if [ "$rc" = "$want_rc" ] && [ "$out" = "$want_out" ]; then
        ok
    else
        bad "$name" "exit $want_rc, stdout $want_out"
    fi
}

# expect_re NAME RC REGEX CMD...: exit status RC, stdout one line matching the
# extended regular expression REGEX in full.
expect_re() {
    name=$1 want_rc=$2 re=$3
    shift 3
    run "$@"
    if [ "$rc" = "$want_rc" ] && [ "$(wc -l <"$tmp/out")" -eq 1 ] &&
        printf '%s\n' "$out" | grep -Eqx -- "$re"; then
        ok
    else
        bad "$name" "exit $want_rc, stdout matching $re"
    fi
}

# expect_error NAME REGEX CMD...: exit status 2, nothing on stdout, a
# "hirate: " message on stderr matching REGEX, and never the password canary.
expect_error() {
    name=$1 re=$2
    shift 2
    run "$@"
    if [ "$rc" = 2 ] && [ -z "$out" ] && printf '%s\n' "$err" | grep -q '^hirate: ' &&
        printf '%s\n' "$err" | grep -Eq -- "$re" &&
        ! printf '%s%s\n' "$out" "$err" | grep -q "$CANARY"; then
        ok
    else
        bad "$name" "exit 2, stderr matching $re, no password"
    fi
}

H=$HIRATE
N='[0-9]+(\.[0-9]{1,6})?' # seconds, as JSON prints them
MEM="--capacity 5 --rate 2"

# ---- without Redis ---------------------------------------------------------

version=$(sed -n 's/^#define HIRATE_VERSION_STRING "\(.*\)"$/\1/p' "$SRC/core/include/hirate.h")
expect "--version prints the version" 0 "hirate $version" "$H" --version
run "$H" --help
if [ "$rc" = 0 ] && printf '%s\n' "$out" | grep -q '^usage: hirate' &&
    printf '%s\n' "$out" | grep -q -- '--on-error' && [ -z "$err" ]; then ok; else
    bad "--help prints usage on stdout" "exit 0, usage"; fi
run "$H" -h
if [ "$rc" = 0 ] && printf '%s\n' "$out" | grep -q '^usage: hirate'; then ok; else
    bad "-h prints usage" "exit 0, usage"; fi
run "$H"
if [ "$rc" = 2 ] && [ -z "$out" ] && printf '%s\n' "$err" | grep -q '^usage: hirate'; then ok; else
    bad "no command prints usage on stderr" "exit 2, usage on stderr"; fi

expect "in memory: allow prints the exact JSON" 0 \
    '{"allowed":true,"remaining":4,"limit":5,"retry_after":0,"reset_after":0.5,"source":"local"}' \
    "$H" --json allow alice $MEM
expect "in memory: allow prints one line of text" 0 \
    'allowed  remaining=4 limit=5 reset_after=0.500s source=local' \
    "$H" allow alice $MEM
expect "options may come before the command" 0 \
    'allowed  remaining=4 limit=5 reset_after=0.500s source=local' \
    "$H" --capacity 5 --rate 2 allow alice
expect "options after the command work even with POSIXLY_CORRECT" 0 \
    'allowed  remaining=4 limit=5 reset_after=0.500s source=local' \
    env POSIXLY_CORRECT=1 "$H" allow alice $MEM
expect "-- ends the options, so a key may start with a dash" 0 \
    'allowed  remaining=4 limit=5 reset_after=0.500s source=local' \
    "$H" allow $MEM -- -alice
expect "in memory: a cost above the capacity is refused for ever" 1 \
    'refused  remaining=5 limit=5 retry_after=never reset_after=0.000s source=local' \
    "$H" allow alice $MEM --cost 6
expect "in memory: reset prints reset" 0 'reset' "$H" reset alice
expect "reset --json" 0 '{"reset":true}' "$H" reset alice --json
expect "an empty REDIS_URL means in memory" 0 \
    '{"allowed":true,"remaining":4,"limit":5,"retry_after":0,"reset_after":0.5,"source":"local"}' \
    env REDIS_URL= "$H" --json allow alice $MEM

# --limit: the core reads the limits; several are one decision, shown whole
# and band by band. 2/s and 4/16s (0.25 token/s): whole seconds and halves.
TWO="--limit 2/s;4/16s"
expect_lines "--limit with two limits shows the whole, then each band" 0 \
'allowed  remaining=1 limit=2 reset_after=4.000s source=local band=2-per-1s
  band=2-per-1s allowed  remaining=1 limit=2 reset_after=0.500s
  band=4-per-16s allowed  remaining=3 limit=4 reset_after=4.000s' \
    "$H" allow alice $TWO
expect "--limit --json has the band behind the limit and each band's figures" 0 \
    '{"allowed":true,"remaining":1,"limit":2,"retry_after":0,"reset_after":4,"source":"local","band":"2-per-1s","bands":[{"name":"2-per-1s","allowed":true,"remaining":1,"limit":2,"retry_after":0,"reset_after":0.5},{"name":"4-per-16s","allowed":true,"remaining":3,"limit":4,"retry_after":0,"reset_after":4}]}' \
    "$H" --json allow alice --limit "2/second; 4 per 16s"
expect_lines "--limit: a cost above one band's capacity is never, and the other band held it" 1 \
'refused  remaining=2 limit=2 retry_after=never reset_after=0.000s source=local band=2-per-1s
  band=2-per-1s refused  remaining=2 limit=2 retry_after=never reset_after=0.000s
  band=4-per-16s allowed  remaining=4 limit=4 reset_after=0.000s' \
    "$H" allow alice $TWO --cost 3
expect "--limit of one limit prints what --capacity and --rate print" 0 \
    'allowed  remaining=4 limit=5 reset_after=2.000s source=local' "$H" allow alice --limit 5/10s
expect "--limit of one limit, --json: the same as --capacity and --rate" 0 \
    '{"allowed":true,"remaining":5,"limit":5,"retry_after":0,"reset_after":0,"source":"local"}' \
    "$H" --json peek alice --limit "5 per 10 seconds"
expect "--limit burst: the bucket is the burst" 0 \
    'allowed  remaining=1 limit=2 reset_after=2.000s source=local' \
    "$H" allow alice --limit "5/10s burst 2"
expect "reset takes --limit" 0 'reset' "$H" reset alice $TWO
expect_error "--limit names the part that is wrong" \
    "^hirate: limit '100/fortnight': unknown unit 'fortnight' \\(second, minute, hour or day\\)\$" \
    "$H" allow k --limit 100/fortnight
expect_error "an empty --limit is refused" '^hirate: the limit string is empty$' \
    "$H" allow k --limit ''
expect_error "--limit with --capacity is one limit too many" \
    '^hirate: set the limit once: capacity and rate, bands, or limits$' \
    "$H" allow k --limit 1/s --capacity 3
expect_error "--limit with --rate too" \
    '^hirate: set the limit once: capacity and rate, bands, or limits$' \
    "$H" allow k --limit 1/s --rate 3
expect_error "without --capacity or --limit, both are named" \
    '^hirate: allow needs --capacity N \(the bucket size\) and --rate R, or --limit$' "$H" allow k

# --rate N/M: N/M tokens a second, the double 1/3 is in C, Lua and Python.
expect "--rate 1/3 is a token every 3 seconds" 0 \
    'allowed  remaining=1 limit=2 reset_after=3.000s source=local' \
    "$H" allow alice --capacity 2 --rate 1/3
expect "--rate 1/3 --json" 0 \
    '{"allowed":true,"remaining":1,"limit":2,"retry_after":0,"reset_after":3,"source":"local"}' \
    "$H" --json allow alice --capacity 2 --rate 1/3
expect "--rate 1/3 is the double 0.3333333333333333" 0 \
    "$("$H" --json allow alice --capacity 7 --rate 0.3333333333333333 --cost 5)" \
    "$H" --json allow alice --capacity 7 --rate 1/3 --cost 5
expect "--rate 5/2 is 2.5 a second" 0 \
    'allowed  remaining=4 limit=5 reset_after=0.400s source=local' \
    "$H" allow alice --capacity 5 --rate 5/2
expect_error "--rate 1/0 divides by zero" '^hirate: --rate: 1/0 divides by zero$' \
    "$H" allow k --capacity 2 --rate 1/0
expect_error "--rate 10/s points to --limit" \
    '^hirate: --rate: "10/s" is not a number or a fraction N/M \(a limit such as "10/minute" goes in --limit\)$' \
    "$H" allow k --capacity 2 --rate 10/s
expect_error "--rate 1/3/4 is not a fraction" '"1/3/4" is not a number or a fraction N/M' \
    "$H" allow k --capacity 2 --rate 1/3/4
expect_error "--rate /3 is not a fraction" '"/3" is not a number or a fraction N/M' \
    "$H" allow k --capacity 2 --rate /3
expect_error "--rate -1/3 is refused by the library, in its words" \
    '^hirate: rate must be a finite number of tokens per second above 0, got -0.333333$' \
    "$H" allow k --capacity 2 --rate -1/3

run "$H" script
if [ "$rc" = 0 ] && cmp -s "$tmp/out" "$SCRIPT_FILE"; then ok; else
    bad "script prints the script byte for byte" "stdout = $SCRIPT_FILE"; fi
expect_re "script --sha1 prints 40 hex digits" 0 '[0-9a-f]{40}' "$H" script --sha1
run "$H" script --sha1
if [ "$rc" = 0 ] && [ "$(wc -c <"$tmp/out")" -eq 41 ] && [ "$(tail -c 1 "$tmp/out" | od -An -c | tr -d ' ')" = '\n' ]; then
    ok; else bad "script --sha1 ends with a newline" "41 bytes, the last a newline"; fi

# -q, --quiet: nothing on stdout, the exit status is the answer; errors still said.
expect_lines "-q: an allowed call prints nothing, exit 0" 0 "" "$H" -q allow k $MEM
expect_lines "--quiet: a refused call prints nothing, exit 1" 1 "" \
    "$H" --quiet allow k --capacity 1 --rate 1 --cost 2
expect_lines "-q after the command: --json is silenced too" 0 "" "$H" --json allow k $MEM -q
expect_error "-q: an error is still said on stderr" 'capacity' "$H" -q allow k --capacity 0 --rate 1

# Durations: a number and a unit, or a number alone in seconds; the library
# reads them, and words its ranges in the unit given.
expect "--timeout 100ms is taken" 0 "allowed  remaining=4 limit=5 reset_after=0.500s source=local" \
    "$H" allow k $MEM --timeout 100ms
expect "--timeout 0.25 is seconds" 0 "allowed  remaining=4 limit=5 reset_after=0.500s source=local" \
    "$H" allow k $MEM --timeout 0.25 --connect-timeout 2s
expect_error "--timeout 0ms: the range in the unit given" \
    '^hirate: timeout must be from 1ms to 60s, got 0ms$' "$H" allow k $MEM --timeout 0ms
expect_error "--timeout 100: a number alone is seconds" \
    '^hirate: timeout must be from 0.001 to 60 seconds, got 100$' "$H" allow k $MEM --timeout 100
expect_error "--connect-timeout 2m is over 60 s" \
    '^hirate: connect_timeout must be from 1ms to 60s, got 2m$' "$H" allow k $MEM --connect-timeout 2m
expect_error "--timeout soon is not a duration" \
    '^hirate: timeout: "soon" is not a duration \(a number and a unit: 250us, 100ms, 0.25s, 2m, 1h; a number alone is seconds\)$' \
    "$H" allow k $MEM --timeout soon
expect_error "bench --duration 0s is out of range" '^hirate: --duration: 0s is out of range' \
    "$H" bench $MEM --duration 0s

expect_error "--capacity 0 is refused" 'capacity' "$H" allow k --capacity 0 --rate 1
expect_error "--capacity abc is refused" 'capacity.*abc' "$H" allow k --capacity abc --rate 1
expect_error "--capacity 10x is refused" 'capacity.*10x' "$H" allow k --capacity 10x --rate 1
expect_error "--capacity '' is refused" 'capacity' "$H" allow k --capacity '' --rate 1
expect_error "--capacity 1e400 is refused" 'capacity.*1e400' "$H" allow k --capacity 1e400 --rate 1
expect_error "--capacity nan is refused" 'capacity.*nan' "$H" allow k --capacity nan --rate 1
expect_error "--rate -1 is refused" 'rate' "$H" allow k --capacity 1 --rate -1
expect_error "--rate nan is refused" 'rate' "$H" allow k --capacity 1 --rate nan
expect_error "--rate 1e400 is refused" 'rate' "$H" allow k --capacity 1 --rate 1e400
expect_error "--cost -1 is refused" 'cost' "$H" allow k --capacity 1 --rate 1 --cost -1
expect_error "--timeout 61 is refused" 'timeout' "$H" allow k --capacity 1 --rate 1 --timeout 61
expect_error "--on-error maybe names the policies" 'local.*open.*closed' \
    "$H" allow k --capacity 1 --rate 1 --on-error maybe
expect_error "a missing --rate is named" '--rate' "$H" allow k --capacity 1
expect_error "a missing --capacity is named" '--capacity' "$H" peek k --rate 1
expect_error "bench needs --capacity too" '--capacity' "$H" bench --rate 1
expect_error "an unknown command is refused" 'frob' "$H" frob k
expect_error "an unknown option is refused" '--frob' "$H" allow k --capacity 1 --rate 1 --frob
expect_error "allow needs a key" 'KEY' "$H" allow --capacity 1 --rate 1
expect_error "an empty key is refused" 'key' "$H" allow '' --capacity 1 --rate 1
long_key=$(printf '%0513d' 0)
expect_error "a key longer than 512 bytes is refused" 'key' "$H" allow "$long_key" --capacity 1 --rate 1
expect_error "a bench option elsewhere is refused" '--threads' "$H" allow k --capacity 1 --rate 1 --threads 2
expect_error "a URL with a password and a bad port is refused, password unsaid" 'port' \
    "$H" allow k --capacity 1 --rate 1 --url "redis://:$CANARY@127.0.0.1:99999"
expect_error "a mistyped --url= option does not echo the password" 'unknown option' \
    "$H" allow k --capacity 1 --rate 1 "--urlx=redis://:$CANARY@127.0.0.1:6379"

run "$H" bench --duration 1 --threads 2 --keys 10 --capacity 100 --rate 1000
if [ "$rc" = 0 ] && printf '%s\n' "$out" | grep -Eq '^decisions/s +[0-9]+$' && [ -z "$err" ]; then
    ok; else bad "bench in memory prints decisions/s, no progress off a terminal" "exit 0"; fi
run "$H" bench --json --duration 0.3 --threads 2 --keys 10 --capacity 100 --rate 1000
if [ "$rc" = 0 ] && printf '%s\n' "$out" | python3 -c '
import json, sys
b = json.load(sys.stdin)
assert b["decisions"] > 0 and b["errors"] == 0, b
assert b["allowed"] + b["refused"] == b["decisions"], b
assert set(b["latency_us"]) == {"p50", "p90", "p99", "p99.9", "max"}, b
'; then ok; else bad "bench --json prints one JSON object" "exit 0, JSON"; fi

run "$H" bench --json --duration 0.3 --threads 2 --keys 10 --limit "100/s; 1000/minute"
if [ "$rc" = 0 ] && printf '%s\n' "$out" | python3 -c '
import json, sys
b = json.load(sys.stdin)
assert b["decisions"] > 0 and b["errors"] == 0, b
assert b["allowed"] + b["refused"] == b["decisions"], b
'; then ok; else bad "bench takes --limit" "exit 0, JSON"; fi

# ---- against Redis -----------------------------------------------------------

port=$(free_port)
dead_port=$(free_port) # nothing listens there
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" \
    --daemonize no >"$tmp/redis.log" 2>&1 &
redis_pid=$!
i=0
until redis-cli -p "$port" ping >/dev/null 2>&1; do
    i=$((i + 1))
    if [ $i -gt 100 ]; then
        echo "FAIL: redis-server did not start on port $port"
        cat "$tmp/redis.log"
        fail=$((fail + 1))
        echo "$pass passed, $fail failed"
        exit 1
    fi
    sleep 0.05
done
URL=redis://127.0.0.1:$port
R="--url $URL --capacity 2 --rate 0.001"

expect "redis: the first allow spends one of two" 0 \
    '{"allowed":true,"remaining":1,"limit":2,"retry_after":0,"reset_after":1000,"source":"redis"}' \
    "$H" --json allow bob $R
expect_re "redis: the second allow spends the last" 0 \
    "\\{\"allowed\":true,\"remaining\":0,\"limit\":2,\"retry_after\":0,\"reset_after\":$N,\"source\":\"redis\"\\}" \
    "$H" --json allow bob $R
expect_re "redis: the third is refused for about 1000 s" 1 \
    "\\{\"allowed\":false,\"remaining\":0,\"limit\":2,\"retry_after\":(99[0-9]|1000)(\\.[0-9]{1,6})?,\"reset_after\":(199[0-9]|2000)(\\.[0-9]{1,6})?,\"source\":\"redis\"\\}" \
    "$H" --json allow bob $R
expect_re "redis: a refusal as text" 1 \
    'refused  remaining=0 limit=2 retry_after=(99[0-9]|1000)\.[0-9]{3,6}s reset_after=(199[0-9]|2000)\.[0-9]{3,6}s source=redis' \
    "$H" allow bob $R
if [ "$(redis-cli -p "$port" exists rl:bob)" = 1 ]; then ok; else
    bad "redis: the bucket is stored under the default prefix rl:" "rl:bob exists"; fi

"$H" allow carol $R >/dev/null
# Time passes between calls, so a stored bucket's times are matched, not fixed.
PEEK1="\\{\"allowed\":true,\"remaining\":1,\"limit\":2,\"retry_after\":0,\"reset_after\":(99[0-9]|1000)(\\.[0-9]{1,6})?,\"source\":\"redis\"\\}"
expect_re "redis: peek reports the bucket" 0 "$PEEK1" "$H" --json peek carol $R
expect_re "redis: a second peek reports the same: peek spends nothing" 0 "$PEEK1" \
    "$H" --json peek carol $R
expect_re "redis: peek --cost 2 says it would not pass, and spends nothing" 1 \
    'refused  remaining=1 limit=2 retry_after=(99[0-9]|1000)\.[0-9]{3,6}s reset_after=(99[0-9]|1000)\.[0-9]{3,6}s source=redis' \
    "$H" peek carol $R --cost 2
expect_re "redis: allow after the peeks still finds the token" 0 \
    "\\{\"allowed\":true,\"remaining\":0,\"limit\":2,\"retry_after\":0,\"reset_after\":$N,\"source\":\"redis\"\\}" \
    "$H" --json allow carol $R

expect "redis: reset prints reset" 0 'reset' "$H" reset bob --url "$URL"
expect "redis: after reset, allow leaves capacity - 1" 0 \
    '{"allowed":true,"remaining":1,"limit":2,"retry_after":0,"reset_after":1000,"source":"redis"}' \
    "$H" --json allow bob $R
expect "redis: a cost above the capacity is refused, retry_after null" 1 \
    '{"allowed":false,"remaining":2,"limit":2,"retry_after":null,"reset_after":0,"source":"redis"}' \
    "$H" --json allow dave $R --cost 3

"$H" allow erin --prefix app: $R >/dev/null
if [ "$(redis-cli -p "$port" exists app:erin)" = 1 ] &&
    [ "$(redis-cli -p "$port" exists rl:erin)" = 0 ]; then ok; else
    bad "redis: --prefix names the Redis key" "app:erin exists, rl:erin does not"; fi

expect "REDIS_URL from the environment is used without --url" 0 \
    '{"allowed":true,"remaining":1,"limit":2,"retry_after":0,"reset_after":1000,"source":"redis"}' \
    env REDIS_URL="$URL" "$H" --json allow frank --capacity 2 --rate 0.001
expect "--url '' overrides REDIS_URL: in memory" 0 \
    '{"allowed":true,"remaining":4,"limit":5,"retry_after":0,"reset_after":0.5,"source":"local"}' \
    env REDIS_URL="$URL" "$H" --json allow frank --url '' $MEM

# Two limits in Redis: one key holds both bands; one script call decides.
# 2/s and 4/1024s (1/256 token/s): times whole or halves, as far as the
# milliseconds between the calls allow.
RB="--url $URL --limit 2/s;4/1024s"
expect_lines "redis: --limit spends from both bands" 0 \
'allowed  remaining=1 limit=2 reset_after=256.000s source=redis band=2-per-1s
  band=2-per-1s allowed  remaining=1 limit=2 reset_after=0.500s
  band=4-per-1024s allowed  remaining=3 limit=4 reset_after=256.000s' \
    "$H" allow gina $RB
if [ "$(redis-cli -p "$port" get rl:gina | wc -w)" = 4 ]; then ok; else
    bad "redis: one key holds both bands, tokens and time of each" "4 fields in rl:gina"; fi
"$H" allow gina $RB >/dev/null
run "$H" allow gina $RB
S='\.[0-9]{3,6}s'
if [ "$rc" = 1 ] && [ "$(wc -l <"$tmp/out")" -eq 3 ] && printf '%s\n' "$out" | sed -n 1p |
    grep -Eqx "refused  remaining=0 limit=2 retry_after=0$S reset_after=(51[01]|512)$S source=redis band=2-per-1s" &&
    printf '%s\n' "$out" | sed -n 2p |
    grep -Eqx "  band=2-per-1s refused  remaining=0 limit=2 retry_after=0$S reset_after=[01]$S" &&
    printf '%s\n' "$out" | sed -n 3p |
    grep -Eqx "  band=4-per-1024s allowed  remaining=2 limit=4 reset_after=(51[01]|512)$S"; then
    ok; else bad "redis: the burst band refuses; the other held the cost" "exit 1, 3 lines"; fi
run "$H" --json peek gina $RB
if [ "$rc" = 1 ] && printf '%s\n' "$out" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["source"] == "redis" and d["band"] == "2-per-1s", d
assert [b["name"] for b in d["bands"]] == ["2-per-1s", "4-per-1024s"], d
assert [b["allowed"] for b in d["bands"]] == [False, True], d
assert [b["remaining"] for b in d["bands"]] == [0, 2], d
'; then ok; else bad "redis: peek --json gives each band; the refused call spent nothing" "exit 1"; fi
expect "redis: reset forgets every band" 0 'reset' "$H" reset gina $RB
expect_re "redis: after reset both bands are full" 0 \
    '\{"allowed":true,"remaining":2,"limit":2,.*"bands":\[\{"name":"2-per-1s","allowed":true,"remaining":2,.*\{"name":"4-per-1024s","allowed":true,"remaining":4,.*' \
    "$H" --json peek gina $RB
expect "redis: --rate 1/3 in Redis" 0 \
    '{"allowed":true,"remaining":1,"limit":2,"retry_after":0,"reset_after":3,"source":"redis"}' \
    "$H" --json allow hank --url "$URL" --capacity 2 --rate 1/3

expect "script --sha1 is the SHA1 Redis gives the script" 0 \
    "$(redis-cli -p "$port" -x script load <"$SCRIPT_FILE")" "$H" script --sha1
expect "script | redis-cli -x SCRIPT LOAD loads that SHA1" 0 \
    "$("$H" script --sha1)" sh -c "'$H' script | redis-cli -p $port -x script load"

expect_error "redis: a wrong password fails, and is never printed" '.' \
    "$H" allow k --capacity 1 --rate 1 --url "redis://:$CANARY@127.0.0.1:$port"

expect_re "--on-error open: Redis down allows, and says why" 0 \
    '\{"allowed":true,.*"source":"fail_open","error":"ECONNECT"\}' \
    "$H" --json allow k --capacity 1 --rate 1 --url "redis://127.0.0.1:$dead_port" --on-error open
expect_re "--on-error closed: Redis down refuses, and says why" 1 \
    '\{"allowed":false,.*"source":"fail_closed","error":"ECONNECT"\}' \
    "$H" --json allow k --capacity 1 --rate 1 --url "redis://127.0.0.1:$dead_port" --on-error closed
expect_re "--on-error local: Redis down decides in memory, and says why" 0 \
    'allowed  remaining=0 limit=1 reset_after=[0-9.]+s source=local error=ECONNECT' \
    "$H" allow k --capacity 1 --rate 1 --url "redis://127.0.0.1:$dead_port"

run "$H" bench --json --duration 0.5 --threads 2 --keys 10 --batch 4 --capacity 100 --rate 1000 \
    --url "$URL"
if [ "$rc" = 0 ] && printf '%s\n' "$out" | python3 -c '
import json, sys
b = json.load(sys.stdin)
assert b["backend"] == "redis" and b["batch"] == 4, b
assert b["decisions"] > 0 and b["errors"] == 0, b
assert b["decisions"] == 4 * b["calls"], b
assert set(b["sources"]) <= {"redis", "cache"}, b  # cache: remembered refusals
assert sum(b["sources"].values()) == b["decisions"], b
'; then ok; else bad "redis: bench --batch 4 decides in batches" "exit 0, JSON"; fi

# ---- check -------------------------------------------------------------------

L='latency=[0-9]+\.[0-9]{3,6}s'
expect "check in memory: no node, healthy" 0 \
    "memory  OK  no Redis to check: decisions are made in this process" "$H" check
expect "check --json in memory" 0 '{"ok":true,"error":null,"nodes":[]}' "$H" check --json
redis-cli -p "$port" function flush >/dev/null
redis-cli -p "$port" script flush >/dev/null
expect_re "check: a live server before any decision: healthy, the library not loaded yet" 0 \
    "127\\.0\\.0\\.1:$port  OK  role=master functions=yes loaded=no $L" "$H" check --url "$URL"
"$H" -q allow checked --url "$URL" --capacity 1 --rate 1
expect_re "check: after a decision the library is loaded" 0 \
    "127\\.0\\.0\\.1:$port  OK  role=master functions=yes loaded=yes $L" "$H" check --url "$URL"
expect_re "check --no-functions: the script is asked for" 0 \
    "127\\.0\\.0\\.1:$port  OK  role=master functions=no loaded=(yes|no) $L" \
    "$H" check --url "$URL" --no-functions
expect_re "check --json: a live server" 0 \
    "\\{\"ok\":true,\"error\":null,\"nodes\":\\[\\{\"addr\":\"127\\.0\\.0\\.1:$port\",\"ok\":true,\"error\":null,\"message\":\"\",\"role\":\"master\",\"functions\":true,\"loaded\":true,\"latency\":0\\.[0-9]{1,6}\\}\\]\\}" \
    "$H" --json check --url "$URL"
expect "check: a stopped server is ECONNECT, exit 1" 1 \
    "127.0.0.1:$dead_port  ECONNECT  role=unknown functions=unknown loaded=unknown  connect to 127.0.0.1:$dead_port: Connection refused" \
    "$H" check --url "redis://127.0.0.1:$dead_port"
expect "check --json: a stopped server" 1 \
    "{\"ok\":false,\"error\":\"ECONNECT\",\"nodes\":[{\"addr\":\"127.0.0.1:$dead_port\",\"ok\":false,\"error\":\"ECONNECT\",\"message\":\"connect to 127.0.0.1:$dead_port: Connection refused\",\"role\":null,\"functions\":null,\"loaded\":null,\"latency\":null}]}" \
    "$H" check --json --url "redis://127.0.0.1:$dead_port"
expect_lines "check -q: a stopped server, exit 1 and nothing said" 1 "" \
    "$H" -q check --url "redis://127.0.0.1:$dead_port"

auth_port=$(free_port)
redis-server --port "$auth_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" \
    --requirepass "$CANARY" --daemonize no >"$tmp/redis-auth.log" 2>&1 &
auth_pid=$!
i=0
until redis-cli -p "$auth_port" -a "$CANARY" --no-auth-warning ping >/dev/null 2>&1 || [ $i -gt 100 ]; do
    i=$((i + 1))
    sleep 0.05
done
WRONGPASS='AUTH refused: WRONGPASS invalid username-password pair or user is disabled.'
expect "check: a wrong password is EAUTH, exit 1, the password unsaid" 1 \
    "127.0.0.1:$auth_port  EAUTH  role=unknown functions=unknown loaded=unknown  $WRONGPASS" \
    "$H" check --url "redis://:wrong-$CANARY@127.0.0.1:$auth_port"
expect "check --json: a wrong password" 1 \
    "{\"ok\":false,\"error\":\"EAUTH\",\"nodes\":[{\"addr\":\"127.0.0.1:$auth_port\",\"ok\":false,\"error\":\"EAUTH\",\"message\":\"$WRONGPASS\",\"role\":null,\"functions\":null,\"loaded\":null,\"latency\":null}]}" \
    "$H" check --json --url "redis://:wrong-$CANARY@127.0.0.1:$auth_port"
expect_lines "check: no password where one is required is EAUTH" 1 \
    "127.0.0.1:$auth_port  EAUTH  role=unknown functions=unknown loaded=unknown  PING refused: NOAUTH Authentication required." \
    "$H" check --url "redis://127.0.0.1:$auth_port"
expect_re "check: the right password is healthy" 0 \
    "127\\.0\\.0\\.1:$auth_port  OK  role=master functions=yes loaded=no $L" \
    "$H" check --url "redis://:$CANARY@127.0.0.1:$auth_port"
expect_error "check takes no arguments" 'check takes no arguments' "$H" check extra

# ---- against Redis over TLS --------------------------------------------------

# tls_server NAME CERT AUTH_CLIENTS: a redis-server with a plain port (for
# redis-cli here) and a TLS port with certs/CERT.crt; sets NAME_port and
# NAME_tls to them.
tls_server() {
    name=$1 cert=$2 auth=$3
    p=$(free_port)
    tp=$(free_port)
    while [ "$tp" = "$p" ]; do tp=$(free_port); done
    mkdir -p "$tmp/$name"
    redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp/$name" \
        --tls-port "$tp" --tls-cert-file "$certs/$cert.crt" --tls-key-file "$certs/$cert.key" \
        --tls-ca-cert-file "$certs/ca.crt" --tls-auth-clients "$auth" \
        --daemonize no >"$tmp/$name/redis.log" 2>&1 &
    tls_pids="$tls_pids $!"
    i=0
    until redis-cli -p "$p" ping >/dev/null 2>&1; do
        i=$((i + 1))
        if [ $i -gt 100 ]; then
            echo "FAIL: the TLS redis-server $name did not start"
            cat "$tmp/$name/redis.log"
            return 1
        fi
        sleep 0.05
    done
    eval "${name}_port=$p ${name}_tls=$tp"
}

certs=$tmp/certs
if sh "$SRC/tests/support/make_certs.sh" "$certs" && tls_server good server no &&
    tls_server wrong wronghost no && tls_server mutual server yes; then
    CA="--tls-ca-file $certs/ca.crt"
    T="--capacity 2 --rate 0.001"
    GOOD=rediss://localhost:$good_tls

    expect "tls: allow over rediss:// with --tls-ca-file spends in Redis" 0 \
        '{"allowed":true,"remaining":1,"limit":2,"retry_after":0,"reset_after":1000,"source":"redis"}' \
        "$H" --json allow tina --url "$GOOD" $CA $T
    if [ "$(redis-cli -p "$good_port" exists rl:tina)" = 1 ]; then ok; else
        bad "tls: the bucket is in the TLS server" "rl:tina exists"; fi
    expect_re "tls: the second allow spends the last token" 0 \
        "\\{\"allowed\":true,\"remaining\":0,\"limit\":2,\"retry_after\":0,\"reset_after\":$N,\"source\":\"redis\"\\}" \
        "$H" --json allow tina --url "$GOOD" $CA $T
    expect_re "tls: the third is refused by Redis" 1 \
        'refused  remaining=0 limit=2 retry_after=(99[0-9]|1000)\.[0-9]{3,6}s reset_after=(199[0-9]|2000)\.[0-9]{3,6}s source=redis' \
        "$H" allow tina --url "$GOOD" $CA $T
    expect "tls: reset over TLS" 0 'reset' "$H" reset tina --url "$GOOD" $CA
    expect "tls: 127.0.0.1 is in the certificate too" 0 \
        '{"allowed":true,"remaining":1,"limit":2,"retry_after":0,"reset_after":1000,"source":"redis"}' \
        "$H" --json allow tina --url "rediss://127.0.0.1:$good_tls" $CA $T

    for policy in local open closed; do
        expect_error "tls: a certificate for another host is ETLS under --on-error $policy" \
            'ETLS\)$' "$H" allow k --url "rediss://localhost:$wrong_tls" $CA $T \
            --on-error "$policy"
        expect_error "tls: redis:// to a TLS port is ETLS under --on-error $policy" \
            'ETLS\)$' "$H" allow k --url "redis://127.0.0.1:$good_tls" $T \
            --on-error "$policy"
        expect_error "tls: rediss:// to a plain port is ETLS under --on-error $policy" \
            'ETLS\)$' "$H" allow k --url "rediss://localhost:$good_port" $CA $T \
            --on-error "$policy"
        expect_error "tls: the system's trust store does not know the test CA ($policy)" \
            'ETLS\)$' "$H" allow k --url "$GOOD" $T --on-error "$policy"
    done
    expect_re "tls: --tls-server-name checks the name the certificate holds" 0 \
        'allowed  remaining=1 limit=2 reset_after=[0-9.]+s source=redis' \
        "$H" allow k --url "rediss://localhost:$wrong_tls" $CA $T --tls-server-name wrong.invalid
    expect_re "tls: --tls-no-verify accepts the wrong host (and the help says why not to)" 0 \
        'allowed  remaining=1 limit=2 reset_after=[0-9.]+s source=redis' \
        "$H" allow k-no-verify --url "rediss://localhost:$wrong_tls" $T --tls-no-verify
    run "$H" --help
    if printf '%s\n' "$out" | grep -q -- '--tls-no-verify.*NOT verify'; then ok; else
        bad "--help says loudly what --tls-no-verify does" "--tls-no-verify  do NOT verify"; fi
    expect_re "tls: mutual TLS with --tls-cert-file and --tls-key-file" 0 \
        'allowed  remaining=1 limit=2 reset_after=[0-9.]+s source=redis' \
        "$H" allow k-mutual --url "rediss://localhost:$mutual_tls" $CA $T \
        --tls-cert-file "$certs/client.crt" --tls-key-file "$certs/client.key"
    expect_error "tls: mutual TLS without a client certificate is ETLS" 'ETLS\)$' \
        "$H" allow k --url "rediss://localhost:$mutual_tls" $CA $T --on-error open
    expect_error "tls: a TLS option with a redis:// URL is refused" 'tls_ca_file' \
        "$H" allow k --url "redis://127.0.0.1:$good_port" $CA $T
    expect_error "tls: an unreadable --tls-ca-file is named" "tls_ca_file $tmp/no-such-ca.crt" \
        "$H" allow k --url "$GOOD" --tls-ca-file "$tmp/no-such-ca.crt" $T
    expect_error "tls: a password in a rediss:// URL is never printed" '.' \
        "$H" allow k --url "rediss://:$CANARY@localhost:$wrong_tls" $CA $T
else
    fail=$((fail + 1))
    echo "FAIL: the TLS servers did not start: the TLS half did not run"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
