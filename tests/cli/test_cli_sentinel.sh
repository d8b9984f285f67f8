#!/bin/sh
# The hirate command-line tool through Redis Sentinel: exact stdout and exit
# status with --url redis+sentinel://... (the tool passes the URL to the core
# unchanged), the sentinels' password from HIRATE_SENTINEL_PASSWORD (never
# from the command line, never printed), --sentinel-user, the errors of a
# service the sentinels do not know (HIRATE_EREPLY), a wrong sentinel
# password (HIRATE_EAUTH) and a URL without a service (HIRATE_EURL), and
# --no-functions as INFO commandstats on the master shows it. The group (a
# master, a replica, three sentinels with a password of their own) is
# tests/support/redis_sentinel.py's, started here on free loopback ports and
# stopped on exit.
#
#   sh tests/cli/test_cli_sentinel.sh path/to/hirate [source-dir]
#
# Prints "N passed, N failed" and exits non-zero on any failure.

HIRATE=${1:?usage: test_cli_sentinel.sh path/to/hirate [source-dir]}
SRC=${2:-$(dirname "$0")/../..}
HARNESS=$SRC/tests/support/redis_sentinel.py
unset REDIS_URL HIRATE_SENTINEL_PASSWORD

# The sentinels' password: every check below that must not print it looks
# for it in stdout and stderr.
SPW=sentinel-s3cret-pw
WRONG=not-the-sentinels-pw

pass=0
fail=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hirate-cli-sentinel.XXXXXX") || exit 2

cleanup() {
    # Closing the harness' stdin stops its group and removes its files.
    exec 3>&-
    [ -n "$group_pid" ] && wait "$group_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 2' INT TERM

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
        [ "$(wc -l <"$tmp/out")" -eq 1 ]; then ok; else
        bad "$name" "exit $want_rc, stdout $want_out"
    fi
}

# expect_re NAME RC REGEX CMD...: as expect, stdout matching REGEX in full.
expect_re() {
    name=$1 want_rc=$2 re=$3
    shift 3
    run "$@"
    if [ "$rc" = "$want_rc" ] && [ "$(wc -l <"$tmp/out")" -eq 1 ] &&
        printf '%s\n' "$out" | grep -Eqx -- "$re"; then ok; else
        bad "$name" "exit $want_rc, stdout matching $re"
    fi
}

# expect_err NAME STDERR CMD...: exit status 2, nothing on stdout, stderr
# exactly the line STDERR, and no password in it.
expect_err() {
    name=$1 want_err=$2
    shift 2
    run "$@"
    if [ "$rc" = 2 ] && [ -z "$out" ] && [ "$err" = "$want_err" ] &&
        ! printf '%s\n' "$err" | grep -q -e "$SPW" -e "$WRONG"; then ok; else
        bad "$name" "exit 2, stderr $want_err"
    fi
}

# field EXPR: a Python expression over the harness' JSON line `g`.
field() {
    head -n 1 "$tmp/group.json" | python3 -c "import json, sys; g = json.loads(sys.stdin.readline()); print($1)"
}

# master_cli ARGS...: redis-cli against the master (it has no password).
master_cli() { redis-cli -p "$MASTER" "$@"; }

# cmdstat NAME: the calls= of INFO commandstats' cmdstat_NAME on the master,
# 0 when the command was not called since the last CONFIG RESETSTAT.
cmdstat() {
    n=$(master_cli info commandstats | tr -d '\r' |
        sed -n "s/^cmdstat_$1:calls=\([0-9]*\),.*/\1/p")
    echo "${n:-0}"
}

# json REMAINING RESET: the --json line of an allowed decision whose bucket
# refills in RESET seconds less the little time since its first call.
json() {
    printf '\\{"allowed":true,"remaining":%s,"limit":3,"retry_after":0,"reset_after":(%s|%s(\\.[0-9]{1,6})?),"source":"redis"\\}' \
        "$1" "$2" "$(($2 - 1))"
}

H=$HIRATE

# ---- the group ------------------------------------------------------------------

mkfifo "$tmp/group.in"
python3 "$HARNESS" start --replicas 1 --sentinels 3 --sentinel-password "$SPW" \
    <"$tmp/group.in" >"$tmp/group.json" 2>"$tmp/group.err" &
group_pid=$!
exec 3>"$tmp/group.in"
i=0
until [ -s "$tmp/group.json" ] && head -n 1 "$tmp/group.json" | grep -q '}$'; do
    i=$((i + 1))
    if [ $i -gt 1200 ] || ! kill -0 "$group_pid" 2>/dev/null; then
        echo "FAIL: the sentinel group did not start"
        cat "$tmp/group.err"
        echo "$pass passed, $((fail + 1)) failed"
        exit 1
    fi
    sleep 0.05
done

URL=$(field 'g["url"]')
SERVICE=$(field 'g["service"]')
MASTER=$(field 'g["master"]["port"]')
S1=$(field 'g["sentinels"][0]["port"]')
case $URL in redis+sentinel://127.0.0.1:*,127.0.0.1:*/"$SERVICE") ok ;;
    *) rc=- out=$URL err= bad "the harness' URL" "redis+sentinel://127.0.0.1:...,.../$SERVICE" ;; esac

export HIRATE_SENTINEL_PASSWORD="$SPW"
R="--url $URL --capacity 3 --rate 0.001"

# ---- exactly the capacity through Sentinel ---------------------------------------

expect "sentinel: the first allow spends one of three" 0 \
    '{"allowed":true,"remaining":2,"limit":3,"retry_after":0,"reset_after":1000,"source":"redis"}' \
    "$H" --json allow alice $R
expect_re "sentinel: the second allow" 0 \
    'allowed  remaining=1 limit=3 reset_after=(199[0-9]|2000)\.[0-9]{3,6}s source=redis' \
    "$H" allow alice $R
expect_re "sentinel: the third allow spends the last" 0 \
    'allowed  remaining=0 limit=3 reset_after=(299[0-9]|3000)\.[0-9]{3,6}s source=redis' \
    "$H" allow alice $R
expect_re "sentinel: the fourth allow is refused" 1 \
    'refused  remaining=0 limit=3 retry_after=(99[0-9]|1000)\.[0-9]{3,6}s reset_after=(299[0-9]|3000)\.[0-9]{3,6}s source=redis' \
    "$H" allow alice $R
# The bucket is on the master the sentinels name.
if [ "$(master_cli exists rl:alice)" = 1 ]; then ok; else
    rc=- out= err= bad "sentinel: the bucket rl:alice is on the master ($MASTER)" "it exists"; fi
expect_re "sentinel: peek spends nothing" 1 \
    'refused  remaining=0 limit=3 retry_after=(99[0-9]|1000)\.[0-9]{3,6}s reset_after=(299[0-9]|3000)\.[0-9]{3,6}s source=redis' \
    "$H" peek alice $R
expect "sentinel: reset prints reset" 0 'reset' "$H" reset alice --url "$URL"
if [ "$(master_cli exists rl:alice)" = 0 ]; then ok; else
    rc=- out= err= bad "sentinel: reset removed rl:alice from the master" "it is gone"; fi
expect "sentinel: after reset, allow leaves capacity - 1" 0 \
    '{"allowed":true,"remaining":2,"limit":3,"retry_after":0,"reset_after":1000,"source":"redis"}' \
    "$H" --json allow alice $R
expect "sentinel: --sentinel-user default with its password" 0 \
    '{"allowed":true,"remaining":2,"limit":3,"retry_after":0,"reset_after":1000,"source":"redis"}' \
    "$H" --json allow bob $R --sentinel-user default
expect_re "sentinel: one sentinel alone names the same master" 0 "$(json 1 2000)" \
    "$H" --json allow bob --url "redis+sentinel://127.0.0.1:$S1/$SERVICE" --capacity 3 --rate 0.001
expect_re "sentinel: REDIS_URL names the service too" 0 "$(json 0 3000)" \
    env REDIS_URL="$URL" "$H" --json allow bob --capacity 3 --rate 0.001
expect "sentinel: bench" 0 "errors 0" sh -c \
    "'$H' bench --json --duration 0.5 --threads 2 --keys 100 --capacity 1000 --rate 1 --url '$URL' |
     python3 -c 'import json, sys; b = json.load(sys.stdin); print(\"errors\", b[\"errors\"]) if b[\"decisions\"] > 0 and b[\"sources\"].get(\"redis\", 0) == b[\"decisions\"] else print(b)'"

# The environment's password goes with a Sentinel URL only; --sentinel-user,
# given on purpose, is the library's error beside another URL.
expect "sentinel: HIRATE_SENTINEL_PASSWORD is left out for a plain URL" 0 \
    '{"allowed":true,"remaining":2,"limit":3,"retry_after":0,"reset_after":1000,"source":"redis"}' \
    "$H" --json allow dave --url "redis://127.0.0.1:$MASTER" --capacity 3 --rate 0.001
expect_err "sentinel: --sentinel-user with a plain URL" \
    "hirate: sentinel_username is set, but the URL is not redis+sentinel:// (or rediss+sentinel://)" \
    "$H" allow dave --url "redis://127.0.0.1:$MASTER" --capacity 3 --rate 0.001 --sentinel-user default

# ---- misconfigurations: exit 2 under every policy ---------------------------------

for policy in local open closed; do
    expect_err "sentinel: an unknown service is HIRATE_EREPLY (--on-error $policy)" \
        "hirate: sentinel 127.0.0.1:$S1 knows no master named 'nosuch' (HIRATE_EREPLY)" \
        "$H" allow alice --url "redis+sentinel://127.0.0.1:$S1/nosuch" --capacity 3 \
        --rate 0.001 --on-error "$policy"
    expect_err "sentinel: a wrong HIRATE_SENTINEL_PASSWORD is HIRATE_EAUTH (--on-error $policy)" \
        "hirate: AUTH refused: WRONGPASS invalid username-password pair or user is disabled. (HIRATE_EAUTH)" \
        env HIRATE_SENTINEL_PASSWORD="$WRONG" "$H" allow alice $R --on-error "$policy"
done
expect_err "sentinel: no HIRATE_SENTINEL_PASSWORD for sentinels that want one" \
    "hirate: PING refused: NOAUTH Authentication required. (HIRATE_EAUTH)" \
    env -u HIRATE_SENTINEL_PASSWORD "$H" allow alice $R
expect_err "sentinel: an empty HIRATE_SENTINEL_PASSWORD is none" \
    "hirate: PING refused: NOAUTH Authentication required. (HIRATE_EAUTH)" \
    env HIRATE_SENTINEL_PASSWORD= "$H" allow alice $R
expect_err "sentinel: --sentinel-user of no such user is HIRATE_EAUTH" \
    "hirate: AUTH refused: WRONGPASS invalid username-password pair or user is disabled. (HIRATE_EAUTH)" \
    "$H" allow alice $R --sentinel-user nosuch
# No service: the library's HIRATE_EURL, before anything is asked of anyone.
for url in "redis+sentinel://127.0.0.1:$S1" "redis+sentinel://127.0.0.1:$S1/" \
    "rediss+sentinel://localhost:$S1" "redis+sentinel://127.0.0.1:$S1//0"; do
    expect_err "sentinel: $url has no service (HIRATE_EURL)" \
        "hirate: invalid Redis URL: a Sentinel URL names the master after the sentinels, as in redis+sentinel://host:26379/mymaster" \
        "$H" allow alice --url "$url" --capacity 3 --rate 0.001
done
expect_err "sentinel: --sentinel-password is refused, its value never printed" \
    "hirate: --sentinel-password: give the sentinels' password in the environment, as HIRATE_SENTINEL_PASSWORD (a command line is visible to every user of the machine)" \
    "$H" allow alice $R --sentinel-password "$WRONG"
expect_err "sentinel: --sentinel-password=... too" \
    "hirate: --sentinel-password: give the sentinels' password in the environment, as HIRATE_SENTINEL_PASSWORD (a command line is visible to every user of the machine)" \
    "$H" --sentinel-password="$WRONG" allow alice $R
run "$H" --help
if [ "$rc" = 0 ] && printf '%s\n' "$out" | grep -q -- '--sentinel-user NAME' &&
    printf '%s\n' "$out" | grep -q 'HIRATE_SENTINEL_PASSWORD' &&
    printf '%s\n' "$out" | grep -q -- '--no-functions' &&
    printf '%s\n' "$out" | grep -q 'redis+sentinel://'; then ok; else
    bad "--help names the Sentinel URL, --sentinel-user, HIRATE_SENTINEL_PASSWORD, --no-functions" \
        "all four"
fi

# ---- Redis Functions, and --no-functions -------------------------------------------

# The library is loaded by now (the calls above): one call is one FCALL.
master_cli config resetstat >/dev/null
expect "functions: allow decides with FCALL" 0 \
    '{"allowed":true,"remaining":2,"limit":3,"retry_after":0,"reset_after":1000,"source":"redis"}' \
    "$H" --json allow carol $R
got="fcall=$(cmdstat fcall) evalsha=$(cmdstat evalsha) eval=$(cmdstat eval) function=$(cmdstat 'function|load')"
if [ "$got" = "fcall=1 evalsha=0 eval=0 function=0" ]; then ok; else
    rc=- out=$got err= bad "functions: INFO commandstats after one allow" "fcall=1 evalsha=0 eval=0 function=0"; fi

# --no-functions: EVALSHA, and EVAL once after NOSCRIPT (FUNCTION LOAD puts
# nothing in the script cache); then EVALSHA alone. No FCALL at all.
master_cli config resetstat >/dev/null
master_cli script flush >/dev/null
expect_re "--no-functions: the first allow" 0 "$(json 1 2000)" \
    "$H" --json allow carol $R --no-functions
expect_re "--no-functions: the second allow" 0 "$(json 0 3000)" \
    "$H" --json --no-functions allow carol $R
got="fcall=$(cmdstat fcall) evalsha=$(cmdstat evalsha) eval=$(cmdstat eval) function=$(cmdstat 'function|load')"
if [ "$got" = "fcall=0 evalsha=2 eval=1 function=0" ]; then ok; else
    rc=- out=$got err= bad "--no-functions: INFO commandstats" "fcall=0 evalsha=2 eval=1 function=0"; fi
master_cli config resetstat >/dev/null
expect "--no-functions: bench" 0 "errors 0" sh -c \
    "'$H' bench --json --no-functions --duration 0.3 --threads 2 --keys 10 --capacity 1000 --rate 1 --url '$URL' |
     python3 -c 'import json, sys; b = json.load(sys.stdin); print(\"errors\", b[\"errors\"]) if b[\"decisions\"] > 0 else print(b)'"
got="fcall=$(cmdstat fcall) evalsha=$(cmdstat evalsha)"
case $got in "fcall=0 evalsha="[1-9]*) ok ;;
    *) rc=- out=$got err= bad "--no-functions: bench sent no FCALL" "fcall=0 evalsha=N" ;; esac

exec 3>&-
wait "$group_pid"
group_pid=

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
