#!/bin/sh
# Every supported CPython but CI's own (make test-python-versions): for each
# of 3.9, 3.10, 3.12 and 3.13 (3.11 runs the whole suite in make
# test-python), builds the extension with warnings as errors and runs the
# Python suite through tests/python/run.sh, each version in a build directory
# and venv of its own, all versions at once (the suites mostly wait on
# redis-server), each one's output in its log and shown when it fails.
#
# The files that start their own clusters, sentinels or web servers, the
# mypy stub checks and the packaging build are left to the 3.11 run: they
# test the servers and the tools more than the Python (SKIP below).
#
# Python 3.9 also leaves out the two files that parse headers with http-sf
# and the stub checks' mypy, which need 3.10 (SKIP_39).
#
# Each Python is, in this order: $PYENV_ROOT/versions/X.Y.* (the newest
# patch release there), pythonX.Y on PATH, or else one `uv python install`
# fetches (uv from PyPI, into $out/tools; its Pythons, python-build-standalone,
# come from GitHub). A version found nowhere fails the run.
#
#   tests/python/versions.sh [pytest arguments]
#
# Environment: HIRATE_PY_VERSIONS (default "3.9 3.10 3.12 3.13"),
# HIRATE_PY_VERSIONS_BUILD (default <checkout>/build-pyver).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${HIRATE_PY_VERSIONS_BUILD:-$root/build-pyver}
versions=${HIRATE_PY_VERSIONS:-"3.9 3.10 3.12 3.13"}
SKIP="test_cluster.py test_sentinel.py test_servers.py test_django_servers.py
      test_observability_servers.py test_logs.py test_stubs.py test_packaging.py"
SKIP_39="test_django.py test_response_headers.py"
mkdir -p "$out"
out=$(cd "$out" && pwd)

find_python() {
    v=$1
    pyenv=${PYENV_ROOT:-$HOME/.pyenv}
    # The newest X.Y.Z under pyenv (not X.Y-dev, not X.Yt).
    p=$(ls -d "$pyenv/versions/$v".* 2>/dev/null | grep -E "/$v\.[0-9]+$" | sort -t. -k3 -n |
        tail -n 1)
    if [ -n "$p" ] && [ -x "$p/bin/python$v" ]; then echo "$p/bin/python$v"; return; fi
    if command -v "python$v" >/dev/null 2>&1; then command -v "python$v"; return; fi
    if [ ! -x "$out/tools/bin/uv" ]; then
        python3 -m venv "$out/tools" >&2
        "$out/tools/bin/python" -m pip install -q --disable-pip-version-check uv >&2
    fi
    UV_PYTHON_INSTALL_DIR=$out/pythons "$out/tools/bin/uv" python install "$v" >&2
    UV_PYTHON_INSTALL_DIR=$out/pythons "$out/tools/bin/uv" python find "$v"
}

ignores() {
    skip=$SKIP
    [ "$1" = 3.9 ] && skip="$skip $SKIP_39"
    for f in $skip; do printf ' --ignore=%s' "$root/tests/python/$f"; done
}

# One version: its Python, build directory, venv and log.
run_one() {
    v=$1
    shift
    py=$(find_python "$v") || py=""
    if [ -z "$py" ] || [ ! -x "$py" ]; then
        echo "== Python $v: not found (pyenv, python$v, uv python install)" | tee "$out/$v.log"
        return 1
    fi
    echo "== Python $v: $py ($("$py" -c 'import sys; print(sys.version.split()[0])'))"
    # shellcheck disable=SC2086
    HIRATE_PY_BUILD=$out/$v PYTHON=$py CMAKE_BUILD_PARALLEL_LEVEL=1 \
        sh "$root/tests/python/run.sh" $(ignores "$v") "$@" >"$out/$v.log" 2>&1
}

failed=""
# All at once: the builds share the two cores (one compiler each), the suites
# mostly wait on their redis-servers.
pids=""
for v in $versions; do
    run_one "$v" "$@" &
    pids="$pids $v:$!"
done
for vp in $pids; do
    wait "${vp#*:}" || failed="$failed ${vp%%:*}"
done
for v in $versions; do
    echo "== Python $v: $(tail -n 1 "$out/$v.log")"
done
for v in $failed; do
    echo "== Python $v failed; its log ($out/$v.log):"
    tail -n 60 "$out/$v.log"
done
[ -z "$failed" ]
