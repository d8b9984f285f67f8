#!/usr/bin/env python3
"""Every place that states hirate's version states the header's.

    test_versions.py <source dir> <build dir> <hirate CLI>

The version lives in core/include/hirate.h (HIRATE_VERSION_STRING, with its
MAJOR, MINOR and PATCH); CMake, pyproject.toml (scikit-build-core's regex),
the Lua module and the Python module read it from there. The places that must
write it out are found in every tracked file by the patterns below, and must
agree; so must what the build made: `hirate --version`, the man page, hirate.pc
and the shared library's file name. Not checked, on purpose: the measured
runs of docs/benchmarks.* (each names the version it measured),
tests/abi (0.1.0's header and ABI) and CHANGELOG.md's older releases.
"""
import pathlib
import re
import subprocess
import sys

src, build, cli = (pathlib.Path(a) for a in sys.argv[1:4])
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


header = (src / "core/include/hirate.h").read_text()
macro = {m[0]: m[1] for m in re.findall(r"#define HIRATE_VERSION_(\w+) (\S+)", header)}
version = macro["STRING"].strip('"')
check(re.fullmatch(r"\d+\.\d+\.\d+", version) is not None, f"HIRATE_VERSION_STRING {version}")
check(f'{macro["MAJOR"]}.{macro["MINOR"]}.{macro["PATCH"]}' == version,
      "HIRATE_VERSION_MAJOR, _MINOR, _PATCH make HIRATE_VERSION_STRING")
major_minor = version.rsplit(".", 1)[0]

SKIP = re.compile(r"^(docs/benchmarks\.|tests/abi/|CHANGELOG\.md$)")
# (pattern, what the captured group must be)
PATTERNS = [
    # "hirate 0.2.0", file names; not tests/abi's files of 0.1.0, named by others
    (re.compile(r"\bhirate[ -]v?(\d+\.\d+\.\d+)\b(?!\.(?:h|abi|supp)\b)"), version),
    (re.compile(r'^version = "(\d+\.\d+\.\d+)-\d+"', re.M), version),  # the rockspec
    (re.compile(r'\btag = "v(\d+\.\d+\.\d+)"'), version),
    (re.compile(r'_VERSION\W[^\n]{0,40}?"(\d+\.\d+\.\d+)"'), version),  # docs of _VERSION
    (re.compile(r'assert\.equal\("(\d+\.\d+\.\d+)", version\)'), version),
    (re.compile(r"find_package\(hirate (\d+\.\d+(?:\.\d+)?)"), major_minor),
]
files = subprocess.run(["git", "-C", str(src), "ls-files"], capture_output=True, text=True,
                       check=True).stdout.split()
found = 0
for name in files:
    if SKIP.match(name):
        continue
    path = src / name
    try:
        text = path.read_text()
    except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
        continue
    for where in (name, text):
        for pattern, want in PATTERNS:
            for m in pattern.finditer(where):
                found += 1
                line = text.count("\n", 0, m.start()) + 1 if where is text else 0
                check(m.group(1) == want, f"{name}:{line}: {m.group(0)!r} says {want}")
check(found >= 8, f"{found} version strings found in the tree")

rockspecs = [f for f in files if re.fullmatch(r"hirate-.*\.rockspec", f)]
check(rockspecs == [f"hirate-{version}-1.rockspec"], f"the one rockspec: {rockspecs}")

changelog = (src / "CHANGELOG.md").read_text()
first = re.search(r"^## \[?(\d+\.\d+\.\d+)", changelog, re.M)
check(first is not None and first.group(1) == version, "CHANGELOG.md's first release")

out = subprocess.run([str(cli), "--version"], capture_output=True, text=True).stdout
check(out == f"hirate {version}\n", f"hirate --version: {out!r}")
man = (build / "core/cli/hirate.1").read_text().splitlines()[0]
check(f'"hirate {version}"' in man, f"the man page: {man}")
pc = (build / "hirate.pc").read_text()
check(f"\nVersion: {version}\n" in pc, "hirate.pc's Version")
check((build / f"libhirate.so.{version}").exists(), f"libhirate.so.{version}")

print(f"test_versions: {'FAILED' if failures else 'passed'} ({version})")
sys.exit(1 if failures else 0)
