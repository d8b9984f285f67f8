#!/bin/sh
# The Python tests: installs the package with pip (scikit-build-core through
# the top-level CMake) into a virtualenv of its own, with the test
# requirements, and runs pytest against the installed package.
#   tests/python/run.sh [pytest arguments]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${HIRATE_PY_BUILD:-$root/build-py}
python=${PYTHON:-python3}
venv=$out/venv

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$root/tests/python/requirements.txt"
# The CMake build directory persists under $out, so a rerun rebuilds only
# what changed; warnings are errors here, as in the C build of make test.
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
    --config-settings=build-dir="$out/cmake" \
    --config-settings=cmake.define.HIRATE_WERROR=ON "$root"
cd "$out"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python" "$@"
