#!/bin/sh
# Installs hirate from a build tree into a scratch prefix, then builds and runs
# the demo against the installed files two ways: cc with pkg-config, and a
# CMake project with find_package(hirate). Prints "N passed, N failed".
#   test_install.sh BUILD_DIR SOURCE_DIR
set -u
build=$1
src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/hirate-install.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
passed=0
failed=0

not() { ! "$@"; }

check() {   # check NAME COMMAND...: passes when the command succeeds
    name=$1
    shift
    if "$@" >"$work/out" 2>&1; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL: $name" >&2
        sed 's/^/  /' "$work/out" >&2
    fi
}

# The demo's burst: the sixth request is refused and told when to retry:
# 0.500 s, less what refilled since the first (0.499 once a millisecond has
# passed: a loaded machine can stall the demo that long, or longer).
demo_ran() {
    "$@" >"$work/demo.out" 2>&1 &&
        grep -Eq "request 6              refused  retry in 0\.(4[0-9]{2}|500) s" "$work/demo.out"
}

prefix=$work/prefix
check "cmake --install" cmake --install "$build" --prefix "$prefix"
check "header installed" test -f "$prefix/include/hirate.h"
check "man page installed" test -f "$prefix/share/man/man1/hirate.1"
check "the tool runs" "$prefix/bin/hirate" --version

pcdir=$(dirname "$(find "$prefix" -name hirate.pc | head -n 1)")
export PKG_CONFIG_PATH=$pcdir
libdir=$(pkg-config --variable=libdir hirate)
check "pkg-config finds the installed prefix" test -f "$libdir/libhirate.a"
# shellcheck disable=SC2046
check "cc with pkg-config" cc -o "$work/demo-pc" "$src/examples/demo.c" \
    $(pkg-config --cflags --libs hirate)
# A prefix the dynamic linker does not search: the program names it in its
# rpath, as docs/c.md shows, and runs without LD_LIBRARY_PATH.
# shellcheck disable=SC2046
check "cc with pkg-config and the libdir as rpath" cc -o "$work/demo-rpath" \
    "$src/examples/demo.c" $(pkg-config --cflags --libs hirate) \
    -Wl,-rpath,"$(pkg-config --variable=libdir hirate)"
check "the rpath program runs without LD_LIBRARY_PATH" demo_ran env -u LD_LIBRARY_PATH \
    "$work/demo-rpath"
needs_libhirate() { readelf -d "$1" | grep -q 'NEEDED.*libhirate\.so'; }
check "the rpath program links libhirate.so" needs_libhirate "$work/demo-rpath"
# hirate-static: libhirate.a itself, though libhirate.so lies beside it.
# shellcheck disable=SC2046
check "cc with pkg-config --static hirate-static" cc -o "$work/demo-static" \
    "$src/examples/demo.c" $(pkg-config --static --cflags --libs hirate-static)
check "the static program needs no libhirate.so" not needs_libhirate "$work/demo-static"
check "the static program runs" demo_ran env -u LD_LIBRARY_PATH "$work/demo-static"
LD_LIBRARY_PATH=$libdir
export LD_LIBRARY_PATH
check "demo linked through pkg-config runs" demo_ran "$work/demo-pc"

# make install PREFIX=... installs there though the build was configured with
# another prefix (the build directory exists already).
if [ -f "$build/Makefile" ] && [ -f "$src/Makefile" ]; then
    check "make install PREFIX= of a configured build" \
        make -s -C "$src" install BUILD="$build" PREFIX="$work/make-prefix" JOBS=1
    check "make install put the header under PREFIX" test -f "$work/make-prefix/include/hirate.h"
    check "make install put the tool under PREFIX" test -x "$work/make-prefix/bin/hirate"
fi

mkdir -p "$work/consumer"
cp "$src/examples/demo.c" "$work/consumer/"
cat >"$work/consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.18)
project(consumer C)
find_package(hirate 0.2 REQUIRED)
add_executable(demo demo.c)
target_link_libraries(demo PRIVATE hirate::hirate)
add_executable(demo_static demo.c)
target_link_libraries(demo_static PRIVATE hirate::hirate_static)
CMAKE
check "find_package(hirate) configures" \
    cmake -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_PREFIX_PATH="$prefix"
check "find_package(hirate) builds" cmake --build "$work/consumer/build"
check "demo linked through CMake runs" demo_ran "$work/consumer/build/demo"
check "demo linked statically through CMake runs" demo_ran "$work/consumer/build/demo_static"

echo "test_install: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
