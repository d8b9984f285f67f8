"""The stubs (.pyi, py.typed) are what type checkers see: mypy --strict must
accept a program that uses the public API as users write it
(tests/python/typed/uses_the_api.py, which also runs), and stubtest must find
the stubs true to the installed package, module by module."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "typed", "uses_the_api.py")


def run(*args, cwd=None):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "MYPY_CACHE_DIR": os.devnull})


def test_the_typed_program_runs():
    p = run(PROGRAM)
    assert (p.returncode, p.stdout, p.stderr) == (0, "ok\n", "")


def test_mypy_strict_accepts_a_program_of_the_public_api(tmp_path):
    p = run("-m", "mypy", "--strict", "--no-incremental", PROGRAM, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout == "Success: no issues found in 1 source file\n"


def test_mypy_strict_refuses_what_the_stubs_forbid(tmp_path):
    # A check that can fail: a wrong type passed to the API is reported.
    bad = tmp_path / "bad.py"
    bad.write_text("import hirate\n\nhirate.Limiter(capacity='ten', rate=1.0)\n")
    p = run("-m", "mypy", "--strict", "--no-incremental", str(bad), cwd=tmp_path)
    assert p.returncode == 1
    assert 'Argument "capacity" to "Limiter" has incompatible type "str"; expected "int"' \
        in p.stdout


def test_stubtest_finds_the_stubs_true_to_the_package(tmp_path):
    p = run("-m", "mypy.stubtest", "hirate", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("Success: no issues found in ")


def test_exit_returns_none_as_the_stubs_say_and_swallows_nothing():
    import hirate
    lim = hirate.Limiter(capacity=1, rate=1.0)
    assert lim.__exit__(None, None, None) is None
    with pytest.raises(KeyError):
        with hirate.Limiter(capacity=1, rate=1.0):
            raise KeyError("k")
