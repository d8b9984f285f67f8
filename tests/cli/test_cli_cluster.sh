#!/bin/sh
# The hirate command-line tool against a Redis Cluster: exact stdout and exit
# status with --url redis+cluster://... (the tool passes the URL to the core
# unchanged), keys on every master, a replica as the only seed, and TLS
# (rediss+cluster://). The clusters are tests/support/redis_cluster.py's,
# started here on free loopback ports and stopped on exit.
#
#   sh tests/cli/test_cli_cluster.sh path/to/hirate [source-dir]
#
# Prints "N passed, N failed" and exits non-zero on any failure.

HIRATE=${1:?usage: test_cli_cluster.sh path/to/hirate [source-dir]}
SRC=${2:-$(dirname "$0")/../..}
HARNESS=$SRC/tests/support/redis_cluster.py
unset REDIS_URL

pass=0
fail=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hirate-cli-cluster.XXXXXX") || exit 2

cleanup() {
    # Closing a harness' stdin stops its cluster and removes its files.
    exec 3>&- 4>&-
    for pid in $plain_pid $tls_pid; do wait "$pid" 2>/dev/null; done
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
        if [ $i -gt 600 ] || ! kill -0 "$last_pid" 2>/dev/null; then
            echo "FAIL: the $name cluster did not start"
            cat "$tmp/$name.err"
            echo "$pass passed, $((fail + 1)) failed"
            exit 1
        fi
        sleep 0.05
    done
}

# field NAME EXPR: a Python expression over the harness' JSON line `c`.
field() {
    head -n 1 "$tmp/$1.json" | python3 -c "import json, sys; c = json.loads(sys.stdin.readline()); print($2)"
}

H=$HIRATE

# ---- a plain cluster: 3 masters, a replica each ---------------------------------

start plain 3 --masters 3 --replicas 1
plain_pid=$last_pid
URL=$(field plain 'c["url"]')
R="--url $URL --capacity 2 --rate 0.001"
case $URL in redis+cluster://127.0.0.1:*,127.0.0.1:*) ok ;; *) bad "the harness' URL" "redis+cluster://..." ;; esac

# Keys of the three masters' slot ranges (the slots of rl:{a}.., rl:{b}..,
# rl:{c}.. are 15495, 3300 and 7365): each gets exactly its capacity.
for key in '{a}x' '{b}x' '{c}x' plain-key; do
    expect "cluster: the first allow of $key spends one of two" 0 \
        '{"allowed":true,"remaining":1,"limit":2,"retry_after":0,"reset_after":1000,"source":"redis"}' \
        "$H" --json allow "$key" $R
    expect_re "cluster: the second allow of $key spends the last" 0 \
        'allowed  remaining=0 limit=2 reset_after=(199[0-9]|2000)\.[0-9]{3,6}s source=redis' \
        "$H" allow "$key" $R
    expect_re "cluster: the third allow of $key is refused" 1 \
        'refused  remaining=0 limit=2 retry_after=(99[0-9]|1000)\.[0-9]{3,6}s reset_after=(199[0-9]|2000)\.[0-9]{3,6}s source=redis' \
        "$H" allow "$key" $R
done
masters=$(field plain '" ".join(str(n["port"]) for n in c["nodes"] if n["role"] == "master")')
for key in '{a}x' '{b}x' '{c}x'; do
    # Exactly one master holds the bucket: the one CLUSTER KEYSLOT names.
    holders=0
    for p in $masters; do
        [ "$(redis-cli -p "$p" exists "rl:$key" 2>/dev/null)" = 1 ] && holders=$((holders + 1))
    done
    slot=$(redis-cli -p "${masters%% *}" cluster keyslot "rl:$key")
    if [ "$holders" = 1 ] && [ "$(redis-cli -c -p "${masters%% *}" exists "rl:$key")" = 1 ]; then
        ok; else bad "cluster: the bucket of $key (slot $slot) is on one master" "1 holder, found $holders"; fi
done
# The three tags' buckets are on three different masters.
spread=$(for key in '{a}x' '{b}x' '{c}x'; do
    for p in $masters; do
        [ "$(redis-cli -p "$p" exists "rl:$key" 2>/dev/null)" = 1 ] && echo "$p"
    done
done | sort -u | wc -l)
if [ "$spread" -eq 3 ]; then ok; else bad "cluster: the keys cover the three masters" "3, got $spread"; fi

expect_re "cluster: peek spends nothing" 1 \
    'refused  remaining=0 limit=2 retry_after=(99[0-9]|1000)\.[0-9]{3,6}s reset_after=(199[0-9]|2000)\.[0-9]{3,6}s source=redis' \
    "$H" peek '{a}x' $R
expect "cluster: reset prints reset" 0 'reset' "$H" reset '{a}x' --url "$URL"
expect "cluster: after reset, allow leaves capacity - 1" 0 \
    '{"allowed":true,"remaining":1,"limit":2,"retry_after":0,"reset_after":1000,"source":"redis"}' \
    "$H" --json allow '{a}x' $R
expect "cluster: --prefix is part of the key the slot is taken of" 0 \
    '{"allowed":true,"remaining":1,"limit":2,"retry_after":0,"reset_after":1000,"source":"redis"}' \
    "$H" --json allow erin --prefix 'app:{x}' $R
if [ "$(redis-cli -c -p "${masters%% *}" exists 'app:{x}erin')" = 1 ]; then ok; else
    bad "cluster: the bucket is app:{x}erin" "it exists"; fi

replica=$(field plain '[n["port"] for n in c["nodes"] if n["role"] == "replica"][0]')
expect "cluster: a replica as the only seed" 0 \
    '{"allowed":true,"remaining":1,"limit":2,"retry_after":0,"reset_after":1000,"source":"redis"}' \
    "$H" --json allow '{b}replica' --url "redis+cluster://127.0.0.1:$replica" --capacity 2 --rate 0.001
expect_re "cluster: the same bucket through another seed" 0 \
    'allowed  remaining=0 limit=2 reset_after=(199[0-9]|2000)\.[0-9]{3,6}s source=redis' \
    "$H" allow '{b}replica' --url "redis+cluster://localhost:${masters##* }" --capacity 2 --rate 0.001
expect "cluster: bench" 0 "errors 0" sh -c \
    "'$H' bench --json --duration 0.5 --threads 2 --keys 100 --capacity 1000 --rate 1 --url '$URL' |
     python3 -c 'import json, sys; b = json.load(sys.stdin); print(\"errors\", b[\"errors\"]) if b[\"decisions\"] > 0 else print(b)'"
# check: one line per master, each healthy; the replica is not a node decisions go to.
run "$H" check --url "$URL"
want_masters=$(printf '%s\n' $masters | wc -l)
if [ "$rc" = 0 ] && [ "$(wc -l <"$tmp/out")" -eq "$want_masters" ] &&
    ! grep -Evq '^127\.0\.0\.1:[0-9]+  OK  role=master functions=yes loaded=(yes|no) latency=[0-9]+\.[0-9]{3,6}s$' "$tmp/out"; then
    ok; else bad "cluster: check prints every master, healthy" "exit 0, $want_masters lines"; fi
run "$H" check --json --url "redis+cluster://127.0.0.1:$replica"
if [ "$rc" = 0 ] && printf '%s\n' "$out" | python3 -c '
import json, sys
c = json.load(sys.stdin)
assert c["ok"] is True and c["error"] is None and len(c["nodes"]) == int(sys.argv[1]), c
assert {n["role"] for n in c["nodes"]} == {"master"} and {n["ok"] for n in c["nodes"]} == {True}, c
' "$want_masters"; then ok; else bad "cluster: check --json through a replica seed" "exit 0, the masters"; fi

exec 3>&-
wait "$plain_pid"
plain_pid=

# ---- TLS: rediss+cluster://localhost:... --------------------------------------

start tls 4 --masters 3 --replicas 0 --tls "$tmp/certs"
tls_pid=$last_pid
TURL=$(field tls 'c["url"]')
case $TURL in rediss+cluster://localhost:*) ok ;; *) bad "the TLS harness' URL" "rediss+cluster://localhost:..." ;; esac
T="--url $TURL --tls-ca-file $tmp/certs/ca.crt --capacity 2 --rate 0.001"
for key in '{a}x' '{b}x' '{c}x'; do
    expect "TLS cluster: the first allow of $key" 0 \
        '{"allowed":true,"remaining":1,"limit":2,"retry_after":0,"reset_after":1000,"source":"redis"}' \
        "$H" --json allow "$key" $T
    expect_re "TLS cluster: the second allow of $key" 0 \
        'allowed  remaining=0 limit=2 reset_after=(199[0-9]|2000)\.[0-9]{3,6}s source=redis' \
        "$H" allow "$key" $T
    expect_re "TLS cluster: the third allow of $key is refused" 1 \
        'refused  remaining=0 limit=2 retry_after=(99[0-9]|1000)\.[0-9]{3,6}s reset_after=(199[0-9]|2000)\.[0-9]{3,6}s source=redis' \
        "$H" allow "$key" $T
done
exec 4>&-
wait "$tls_pid"
tls_pid=

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
