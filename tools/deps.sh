#!/bin/sh
# Installs the Debian/Ubuntu packages a task needs, when they are missing.
#   tools/deps.sh build      compiler, CMake, pkg-config, hiredis
#   tools/deps.sh test       build + redis-server, cJSON, jsonschema
#   tools/deps.sh bench      test + valgrind
set -eu

build="gcc make cmake pkg-config libhiredis-dev"
test="$build redis-server redis-tools libcjson-dev python3 python3-jsonschema"
bench="$test valgrind"

case "${1:-build}" in
    build) want=$build ;;
    test) want=$test ;;
    bench) want=$bench ;;
    *) echo "usage: $0 build|test|bench" >&2; exit 2 ;;
esac

missing=""
for p in $want; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

echo "hirate: installing$missing" >&2
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# shellcheck disable=SC2086
$sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
