#!/bin/sh
# The cross-language integration tests (make test-integration):
#
#   1. builds tests/integration/CMakeLists.txt: the core, the hirate tool,
#      the Lua 5.4 module, the Python extension (staged as py/hirate), and
#      the C programs here;
#   2. the bad-input sweep through the C API (badinput) and the hirate tool
#      (test_cli_badinput.py); the Python and Lua sweeps are
#      tests/python/test_badinput.py and tests/lua/badinput_spec.lua, which
#      their own suites run;
#   3. the checker of the invariants test on histories whose verdict is
#      known (test_checker.py), then the invariants under load
#      (test_invariants.py): C, Python, a forked Python and Lua 5.4 on one
#      Redis key for about ten seconds, and once more over TLS;
#   4. the same workers across a Sentinel failover (test_failover.py):
#      SENTINEL FAILOVER in one run, kill -9 of the master in another.
#   5. every code block of README.md and docs/*.md that claims to run
#      (tests/docs/test_blocks.py; the convention is in CONTRIBUTING.md):
#      C compiled against this build's library and run, Python with its
#      package, Lua with its module, shell in a scratch directory.
#
#   tests/integration/run.sh
#
# Environment: HIRATE_INTEGRATION_BUILD (default <checkout>/build-integration)
# holds the build; JOBS (default 2) bounds the compiler; PYTHON (default
# python3) is the Python the extension is built for and the tests run on; it
# needs its headers (Debian: python3-dev). Every redis-server the tests start
# is stopped by them, on failure too.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${HIRATE_INTEGRATION_BUILD:-$root/build-integration}
jobs=${JOBS:-2}
# The interpreter itself, not a version manager's shim: CMake builds the
# extension for exactly this one.
python=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')

step() { printf '\n== %s\n' "$*"; }

step "building in $out"
cmake -S "$root/tests/integration" -B "$out" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPython_EXECUTABLE="$python"
cmake --build "$out" -j "$jobs"

export HIRATE_INTEGRATION_BUILD="$out"
cd "$out"

step "bad input through the C API"
"$out/badinput"

step "bad input through the hirate tool"
"$python" "$root/tests/integration/test_cli_badinput.py"

step "the invariants checker on known histories"
"$python" "$root/tests/integration/test_checker.py"

step "invariants under load: C, Python, forked Python and Lua 5.4 on one key (and once over TLS)"
"$python" "$root/tests/integration/test_invariants.py" -v

step "invariants across a Sentinel failover: SENTINEL FAILOVER, then kill -9 of the master"
"$python" "$root/tests/integration/test_failover.py" -v

step "the code blocks of README.md and docs/*.md"
"$python" "$root/tests/docs/test_blocks.py" -v
