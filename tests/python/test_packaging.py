"""Packaging: `python -m build` makes an sdist and, from that sdist, a wheel;
the sdist carries everything the build reads and the tests, not bench/;
the wheel only the hirate
package (extension, .py files, stubs, py.typed), both named with the
version of core/include/hirate.h; the wheel installs and works."""

import pathlib
import re
import subprocess
import sys
import tarfile
import venv
import zipfile

import pytest

import hirate

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)


def header_version():
    text = (ROOT / "core" / "include" / "hirate.h").read_text()
    return re.search(r'#define HIRATE_VERSION_STRING "([0-9.]+)"', text).group(1)


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    # Without --sdist/--wheel, build makes the sdist and then the wheel from
    # the unpacked sdist: so the wheel proves the sdist is complete.
    r = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=850)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    sdists = list(out.glob("*.tar.gz"))
    wheels = list(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, list(out.iterdir())
    return sdists[0], wheels[0]


def test_the_version_is_the_headers():
    assert hirate.__version__ == header_version()


def test_the_sdist_has_what_the_build_reads(dist):
    sdist, _ = dist
    v = header_version()
    assert sdist.name == f"hirate-{v}.tar.gz"
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for need in ["pyproject.toml", "CMakeLists.txt", "PKG-INFO", "core/include/hirate.h",
                 "core/include/hirate_io.h", "core/src/limiter.c", "core/src/transport.c", "core/src/script.c.in",
                 "core/cli/CMakeLists.txt", "lua/token_bucket.lua", "cmake/hirate.pc.in",
                 "cmake/hirateConfig.cmake.in", "bindings/python/CMakeLists.txt",
                 "bindings/python/_hirate/module.c", "bindings/python/_hirate/_hirate.h",
                 "bindings/python/hirate/__init__.py",
                 "bindings/python/hirate/__init__.pyi", "bindings/python/hirate/_hirate.pyi",
                 "bindings/python/hirate/py.typed", "docs/python.md"]:
        assert need in names, need
    assert not [n for n in names if n.startswith(("build", ".ci/", ".git/"))
                or n.endswith((".so", ".pyc"))]


def test_the_sdist_has_the_tests_and_not_the_benchmarks(dist):
    sdist, _ = dist
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for need in ["tests/python/conftest.py", "tests/python/test_limiter.py",
                 "tests/python/requirements.txt", "tests/vectors/token_bucket.json",
                 "tests/support/make_certs.sh"]:
        assert need in names, need
    # bench/ (the benchmarks, their Go, Node and nginx peers) is no part of
    # the product; the wheel above was built from this sdist without it.
    assert [n for n in names if n == "bench" or n.startswith("bench/")] == []


def test_the_wheel_holds_only_the_package(dist):
    _, wheel = dist
    v = header_version()
    assert wheel.name.startswith(f"hirate-{v}-cp{sys.version_info[0]}{sys.version_info[1]}-")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(f"hirate-{v}.dist-info/METADATA").decode()
    outside = [n for n in names
               if not n.startswith("hirate/") and not n.startswith(f"hirate-{v}.dist-info/")]
    assert outside == []   # no libhirate, header, pkg-config file or CLI
    for need in ["hirate/__init__.py", "hirate/__init__.pyi", "hirate/_hirate.pyi",
                 "hirate/py.typed"]:
        assert need in names, need
    assert [n for n in names if re.fullmatch(r"hirate/_hirate\.cpython-.*\.so", n)]
    assert not [n for n in names if n.endswith((".c", ".h", ".a", ".pyc"))]
    assert f"Version: {v}" in meta
    assert "Requires-Python: >=3.9" in meta


def test_the_wheel_installs_and_decides(dist, tmp_path):
    _, wheel = dist
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    py = env / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps",
                        "--disable-pip-version-check", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    code = ("import hirate; lim = hirate.Limiter(capacity=2, rate=1.0); "
            "print(hirate.__version__, [bool(lim.allow('k')) for _ in range(3)])")
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{header_version()} [True, True, False]"


def test_the_extension_carries_hiredis_and_exports_only_its_entry_point(dist, tmp_path):
    _, wheel = dist
    with zipfile.ZipFile(wheel) as z:
        [so] = [n for n in z.namelist() if re.fullmatch(r"hirate/_hirate\..*\.so", n)]
        path = z.extract(so, tmp_path)
    syms = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True,
                          check=True).stdout.split()
    assert syms[1:] == ["T", "PyInit__hirate"] and len(syms) == 3, syms
    dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True,
                             check=True).stdout
    needed = sorted(re.findall(r"\(NEEDED\).*\[(.*)\]", dynamic))
    # hiredis is inside; OpenSSL and the C library are what it links.
    assert [n for n in needed if "hiredis" in n] == [], needed
    assert {n.split(".so")[0] for n in needed} >= {"libssl", "libcrypto", "libc"}, needed
