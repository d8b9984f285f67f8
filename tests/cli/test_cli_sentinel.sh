#!/bin/sh
# The hirate command-line tool through Redis Sentinel: exact stdout and exit
# status with --url redis+sentinel://... (the tool passes the URL to the core
# unchanged), the sentinels' password from HIRATE_SENTINEL_PASSWORD (never
# from the command line, never printed), --sentinel-user, the errors of a
# service the sentinels do not know (EREPLY), a wrong sentinel
# password (EAUTH) and a URL without a service (EURL), and
# --no-functions as INFO commandstats on the master shows it; after SENTINEL
# FAILOVER the next run is on the new master, whose copy of the bucket it
# spends; rediss+sentinel:// with --tls-ca-file. The groups (a master, a
# replica, three sentinels with a password of their own; then the same over
# TLS) are tests/support/redis_sentinel.py's, started here on free loopback
# ports and stopped on exit.
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
    # Closing a harness' stdin stops its group and removes its files.
    exec 3>&- 4>&-
    for pid in $group_pid $tls_pid; do wait "$pid" 2>/dev/null; done
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

# start NAME FD ARGS...: a harness whose stdin is fifo $tmp/NAME.in, held
# open on fd FD; waits for its JSON line in $tmp/NAME.json.
start() {
    name=$1 fd=$2
    shift 2
    mkfifo "$tmp/$name.in"
    python3 "$HARNESS" start "$@" <"$tmp/$name.in" >"$tmp/$name.json" 2>"$tmp/$name.err" &
    last_pid=$!
    eval "exec $fd>\"\$tmp/\$name.in\""
    i=0
    until [ -s "$tmp/$name.json" ] && head -n 1 "$tmp/$name.json" | grep -q '}$'; do
        i=$((i + 1))
        if [ $i -gt 1200 ] || ! kill -0 "$last_pid" 2>/dev/null; then
            echo "FAIL: the $name group did not start"
            cat "$tmp/$name.err"
            echo "$pass passed, $((fail + 1)) failed"
            exit 1
        fi
        sleep 0.05
    done
}

# ask COMMAND: one command to the plain group's harness; prints its answer,
# the JSON line it adds.
ask() {
    lines=$(wc -l <"$tmp/group.json")
    printf '%s\n' "$1" >&3
    i=0
    until [ "$(wc -l <"$tmp/group.json")" -gt "$lines" ]; do
        i=$((i + 1))
        [ $i -gt 1200 ] && break
        sleep 0.05
    done
    tail -n 1 "$tmp/group.json"
}

# field EXPR [NAME]: a Python expression over harness NAME's (default: the
# plain group's) JSON line `g`.
field() {
    head -n 1 "$tmp/${2:-group}.json" | python3 -c "import json, sys; g = json.loads(sys.stdin.readline()); print($1)"
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
# refills in RESET seconds (a multiple of 10) less the few seconds since its
# first call.
json() {
    printf '\\{"allowed":true,"remaining":%s,"limit":3,"retry_after":0,"reset_after":(%s|%s[0-9](\\.[0-9]{1,6})?),"source":"redis"\\}' \
        "$1" "$2" "$(($2 / 10 - 1))"
}

H=$HIRATE

# ---- the group ------------------------------------------------------------------

start group 3 --replicas 1 --sentinels 3 --sentinel-password "$SPW"
group_pid=$last_pid

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

# The sentinels' credentials beside another URL are the library's error,
# from the environment as from --sentinel-user.
expect_err "sentinel: HIRATE_SENTINEL_PASSWORD beside a plain URL" \
    "hirate: sentinel_password is set, but the URL is not redis+sentinel:// (or rediss+sentinel://)" \
    "$H" --json allow dave --url "redis://127.0.0.1:$MASTER" --capacity 3 --rate 0.001
expect_err "sentinel: --sentinel-user with a plain URL" \
    "hirate: sentinel_username is set, but the URL is not redis+sentinel:// (or rediss+sentinel://)" \
    "$H" allow dave --url "redis://127.0.0.1:$MASTER" --capacity 3 --rate 0.001 --sentinel-user default

# ---- misconfigurations: exit 2 under every policy ---------------------------------

for policy in local open closed; do
    expect_err "sentinel: an unknown service is EREPLY (--on-error $policy)" \
        "hirate: sentinel 127.0.0.1:$S1 knows no master named 'nosuch' (EREPLY)" \
        "$H" allow alice --url "redis+sentinel://127.0.0.1:$S1/nosuch" --capacity 3 \
        --rate 0.001 --on-error "$policy"
    expect_err "sentinel: a wrong HIRATE_SENTINEL_PASSWORD is EAUTH (--on-error $policy)" \
        "hirate: AUTH refused: WRONGPASS invalid username-password pair or user is disabled. (EAUTH)" \
        env HIRATE_SENTINEL_PASSWORD="$WRONG" "$H" allow alice $R --on-error "$policy"
done
expect_err "sentinel: no HIRATE_SENTINEL_PASSWORD for sentinels that want one" \
    "hirate: PING refused: NOAUTH Authentication required. (EAUTH)" \
    env -u HIRATE_SENTINEL_PASSWORD "$H" allow alice $R
expect_err "sentinel: an empty HIRATE_SENTINEL_PASSWORD is none" \
    "hirate: PING refused: NOAUTH Authentication required. (EAUTH)" \
    env HIRATE_SENTINEL_PASSWORD= "$H" allow alice $R
expect_err "sentinel: --sentinel-user of no such user is EAUTH" \
    "hirate: AUTH refused: WRONGPASS invalid username-password pair or user is disabled. (EAUTH)" \
    "$H" allow alice $R --sentinel-user nosuch
# No service: the library's EURL, before anything is asked of anyone.
for url in "redis+sentinel://127.0.0.1:$S1" "redis+sentinel://127.0.0.1:$S1/" \
    "rediss+sentinel://localhost:$S1" "redis+sentinel://127.0.0.1:$S1//0"; do
    expect_err "sentinel: $url has no service (EURL)" \
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

# ---- a failover: the next run asks the sentinels and finds the new master --------

expect_re "failover: before it, the first of dan's three" 0 "$(json 2 1000)" \
    "$H" --json allow dan $R
REPLICA=$(field 'g["replicas"][0]["port"]')
# The replica has the bucket: replication is done before the failover.
i=0
until [ "$(redis-cli -p "$REPLICA" exists rl:dan)" = 1 ] || [ $i -gt 100 ]; do
    i=$((i + 1)); sleep 0.05; done
# What the replica executed so far (FUNCTION LOAD among it: it is replicated
# as itself), against what it does once it is the master.
was=$(MASTER=$REPLICA; echo "fcall=$(cmdstat fcall) function=$(cmdstat 'function|load') evalsha=$(cmdstat evalsha) eval=$(cmdstat eval)")
ask failover >/dev/null
switched=$(ask "wait-switch $MASTER 30" | python3 -c 'import json, sys; print(json.load(sys.stdin).get("port"))')
if [ "$switched" = "$REPLICA" ]; then ok; else
    rc=- out=$switched err= bad "failover: the replica ($REPLICA) is the new master" "port $REPLICA"; fi
expect_re "failover: the next allow spends dan's bucket on the new master" 0 "$(json 1 2000)" \
    "$H" --json allow dan $R
MASTER=$REPLICA
got="fcall=$(cmdstat fcall) function=$(cmdstat 'function|load') evalsha=$(cmdstat evalsha) eval=$(cmdstat eval)"
want=$(printf '%s\n' "$was" | sed 's/fcall=\([0-9]*\)/fcall=$((\1 + 1))/')
want=$(eval "echo \"$want\"")
if [ "$got" = "$want" ]; then ok; else
    rc=- out=$got err= bad "failover: one FCALL on the new master, no FUNCTION LOAD, EVALSHA or EVAL" "$want (before: $was)"; fi

exec 3>&-
wait "$group_pid"
group_pid=

# ---- rediss+sentinel://: TLS to the sentinels and to the master ------------------

unset HIRATE_SENTINEL_PASSWORD
start tls 4 --replicas 1 --sentinels 3 --tls "$tmp/certs"
tls_pid=$last_pid
TURL=$(field 'g["url"]' tls)
case $TURL in rediss+sentinel://localhost:*,localhost:*/mymaster) ok ;;
    *) rc=- out=$TURL err= bad "the TLS harness' URL" "rediss+sentinel://localhost:.../mymaster" ;; esac
T="--url $TURL --tls-ca-file $tmp/certs/ca.crt --capacity 3 --rate 0.001"
expect "TLS: the first allow" 0 \
    '{"allowed":true,"remaining":2,"limit":3,"retry_after":0,"reset_after":1000,"source":"redis"}' \
    "$H" --json allow erin $T
expect_re "TLS: the second" 0 "$(json 1 2000)" "$H" --json allow erin $T
expect_re "TLS: the third spends the last" 0 "$(json 0 3000)" "$H" --json allow erin $T
expect_re "TLS: the fourth is refused" 1 \
    'refused  remaining=0 limit=3 retry_after=(99[0-9]|1000)\.[0-9]{3,6}s reset_after=(299[0-9]|3000)\.[0-9]{3,6}s source=redis' \
    "$H" allow erin $T
run "$H" allow erin --url "$TURL" --capacity 3 --rate 0.001
if [ "$rc" = 2 ] && [ -z "$out" ] && printf '%s\n' "$err" | grep -Eqx 'hirate: .* \(ETLS\)'; then
    ok; else bad "TLS: without the CA the certificate fails the check" "exit 2, (ETLS)"; fi
exec 4>&-
wait "$tls_pid"
tls_pid=

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
