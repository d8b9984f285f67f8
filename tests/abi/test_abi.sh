#!/bin/sh
# A program of hirate 0.1 runs with this library, and abidiff finds no change
# to what 0.1 programs use.
#   test_abi.sh <old_program> <libhirate.so> <version> <source dir>
#
# hirate-0.1.0.abi is `abidw --headers-dir core/include` of 0.1.0's
# libhirate.so.0.1.0 (built from the tree of v0.1.0), with each symbol given
# the version node core/hirate.map gives it now (HIRATE_0.1; 0.1's
# hirate_limiter_new as the non-default hirate_limiter_new@HIRATE_0.1), which
# is where the dynamic linker binds a 0.1 program's unversioned references:
# so abidiff compares each 0.1 symbol with the definition such a program gets.
set -eu
prog=$1 lib=$2 version=$3 src=$4

# The program's references are a 0.1 program's: no symbol version.
refs=$(objdump -T "$prog" | grep -E ' (hirate_limiter_new|hirate_options_init)$')
echo "$refs"
if echo "$refs" | grep -q HIRATE_; then
    echo "test_abi: old_program is not linked as a 0.1 program" >&2
    exit 1
fi
LD_LIBRARY_PATH=$(dirname "$lib") "$prog" "$version"

if ! command -v abidiff >/dev/null; then
    echo "test_abi: abidiff is missing (abigail-tools; tools/deps.sh test)" >&2
    exit 1
fi
rc=0
out=$(abidiff --suppressions "$src/tests/abi/hirate-0.1.0.supp" \
      "$src/tests/abi/hirate-0.1.0.abi" "$lib") || rc=$?
echo "$out" | grep -v '^  \[A\]'
# Bit 8: an incompatible change; "Changed": a 0.1 function whose types did.
if [ $((rc & 8)) -ne 0 ] || [ $((rc & 3)) -ne 0 ] ||
   ! echo "$out" | grep -q '^Functions changes summary: 0 Removed, 0 Changed' ||
   ! echo "$out" | grep -q '^Variables changes summary: 0 Removed, 0 Changed'; then
    echo "test_abi: abidiff found a change to 0.1's ABI (status $rc)" >&2
    exit 1
fi
echo "test_abi: passed"
