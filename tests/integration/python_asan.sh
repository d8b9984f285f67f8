#!/bin/sh
# The Python tests that exercise the extension, with the extension built
# under AddressSanitizer and UndefinedBehaviorSanitizer (make test-python-asan).
#
# CPython itself is not instrumented, so the sanitizer runtimes are preloaded
# (they must come first in the process), and PYTHONMALLOC=malloc sends every
# Python allocation through ASan's malloc, so that an overrun or a
# use-after-free of a Python object the extension holds is caught too. Leak
# checking is off: CPython leaves objects allocated at exit on purpose (the
# Python tests check leaks with flat RSS over 10^5 calls instead). The stub
# checks (test_stubs.py: mypy and stubtest) run in the plain suite only.
#
#   tests/integration/python_asan.sh [pytest arguments]
#
# Environment: HIRATE_PY_ASAN_BUILD (default <checkout>/build-py-asan) holds
# the virtualenv and the CMake build; PYTHON (default python3) makes the venv.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${HIRATE_PY_ASAN_BUILD:-$root/build-py-asan}
python=${PYTHON:-python3}
venv=$out/venv
mkdir -p "$out"

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
    -r "$root/tests/python/requirements.txt"
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
    --config-settings=build-dir="$out/cmake" \
    --config-settings=cmake.build-type=RelWithDebInfo \
    --config-settings=cmake.define.HIRATE_SANITIZE=address,undefined \
    --config-settings=cmake.define.HIRATE_WERROR=ON "$root"

# The installed extension must be the instrumented one.
# (Found by path: importing it here, without the runtimes preloaded, fails.)
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
ext=$(ls "$site"/hirate/_hirate*.so 2>/dev/null || true)
if [ -z "$ext" ] || ! nm -D "$ext" | grep -q __asan_report; then
    echo "python_asan.sh: hirate._hirate ($ext) is not built with AddressSanitizer" >&2
    exit 1
fi

cd "$out"
LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
PYTHONMALLOC=malloc
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LD_PRELOAD PYTHONMALLOC ASAN_OPTIONS UBSAN_OPTIONS

# A clean run means something only if an error would have stopped it: an
# overrun of a Python-allocated buffer must abort with ASan's report.
overrun='import ctypes; b = ctypes.create_string_buffer(16); ctypes.memmove(b, b"x" * 64, 64)'
if "$venv/bin/python" -c "$overrun" >"$out/canary.log" 2>&1 ||
        ! grep -q "AddressSanitizer: heap-buffer-overflow" "$out/canary.log"; then
    echo "python_asan.sh: ASan did not catch an overrun; the run would prove nothing" >&2
    cat "$out/canary.log" >&2
    exit 1
fi

# Every Python test, the web frameworks and the gunicorn and uvicorn workers
# included (they inherit the preload), but two kinds: the packaging test,
# which builds an sdist and a wheel without the sanitizers, and the flat-RSS
# tests, since ASan holds freed memory in quarantine and RSS grows by design.
"$venv/bin/python" -m pytest -q -p no:cacheprovider \
    --ignore="$root/tests/python/test_packaging.py" \
    --ignore="$root/tests/python/test_stubs.py" -k "not rss_flat" "$root/tests/python" "$@"
