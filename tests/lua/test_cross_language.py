"""One Redis bucket, three languages: a Lua 5.4 process (plain
`require "hirate"`), a Python process (`hirate.Limiter`) and the `hirate`
command-line tool spend from the same key at the same time, and together
they get exactly its capacity. Each sees what the others spent.

    HIRATE_LUA54_CPATH=<dir with hirate/core.so for Lua 5.4> \
    HIRATE_CLI=<the hirate tool> [HIRATE_LUA54_PATH=<dir with hirate.lua>] \
    [HIRATE_PYTHON=<python with hirate installed>] \
        python3 tests/lua/test_cross_language.py

tests/lua/nginx/run.sh runs it with what it built or luarocks installed.

The Python part needs the package installed (tests/python/run.sh puts it in
build-py/venv); without it that part is skipped, saying so.
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))

from redis_server import RedisServer  # noqa: E402

CAPACITY = 30
RATE = 0.001        # a token per 1000 s: nothing refills during the test
PREFIX = "xlang:"
REDIS = None

LUA = r"""
package.path = arg[1] .. "/?.lua;" .. package.path
package.cpath = arg[2] .. "/?.so;" .. package.cpath
local hirate = require "hirate"
local lim = hirate.new{ url = arg[3], capacity = tonumber(arg[4]), rate = tonumber(arg[5]),
                        prefix = arg[6] }
local op, key, n = arg[7], arg[8], tonumber(arg[9])
local allowed, last_d = 0, nil
for _ = 1, n do
    local d, err, code = lim[op](lim, key, tonumber(arg[10]))
    if not d then
        io.stderr:write(err, " ", code, "\n")
        os.exit(2)
    end
    if d.allowed then
        allowed = allowed + 1
    end
    last_d = d
end
print(string.format('{"allowed": %d, "remaining": %d, "source": "%s"}', allowed,
                    last_d.remaining, last_d.source))
lim:close()
"""

PYTHON = r"""
import json, sys, hirate
url, capacity, rate, prefix, op, key, n, cost = sys.argv[1:]
lim = hirate.Limiter(url, capacity=int(capacity), rate=float(rate), prefix=prefix)
allowed = 0
for _ in range(int(n)):
    d = getattr(lim, op)(key, int(cost))
    allowed += d.allowed
print(json.dumps({"allowed": allowed, "remaining": d.remaining, "source": d.source}))
lim.close()
"""


def setUpModule():
    global REDIS
    REDIS = RedisServer()


def tearDownModule():
    if REDIS:
        REDIS.close()


def lua54_cpath():
    path = os.environ.get("HIRATE_LUA54_CPATH", "")
    if not os.path.exists(os.path.join(path, "hirate", "core.so")):
        raise RuntimeError("set HIRATE_LUA54_CPATH to the directory holding hirate/core.so "
                           "built for Lua 5.4 (tests/lua/nginx/run.sh does)")
    return path


def cli():
    tool = os.environ.get("HIRATE_CLI", "")
    if not os.access(tool, os.X_OK):
        raise RuntimeError("set HIRATE_CLI to the hirate command-line tool "
                           "(tests/lua/nginx/run.sh does)")
    return tool


def python_with_hirate():
    """The Python that has the hirate package, or None."""
    candidates = [os.environ.get("HIRATE_PYTHON"),
                  str(ROOT / "build-py" / "venv" / "bin" / "python")]
    for py in filter(None, candidates):
        if os.access(py, os.X_OK) and subprocess.run(
                [py, "-c", "import hirate; hirate.Limiter"], capture_output=True).returncode == 0:
            return py
    return None


def run_lua(op, key, n, cost=1):
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(LUA)
    try:
        out = subprocess.run(
            ["lua5.4", f.name, os.environ.get("HIRATE_LUA54_PATH", str(ROOT / "bindings" / "lua")),
             lua54_cpath(), REDIS.url,
             str(CAPACITY), str(RATE), PREFIX, op, key, str(n), str(cost)],
            capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(f.name)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def run_python(py, op, key, n, cost=1):
    out = subprocess.run([py, "-c", PYTHON, REDIS.url, str(CAPACITY), str(RATE), PREFIX, op,
                          key, str(n), str(cost)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def run_cli(op, key, n, cost=1):
    allowed, last = 0, None
    for _ in range(n):
        out = subprocess.run([cli(), op, "--url", REDIS.url, "--capacity", str(CAPACITY),
                              "--rate", str(RATE), "--prefix", PREFIX, "--cost", str(cost),
                              "--json", key], capture_output=True, text=True, timeout=60)
        assert out.returncode in (0, 1), out.stderr
        last = json.loads(out.stdout)
        assert (out.returncode == 0) == last["allowed"], out.stdout
        allowed += last["allowed"]
    return {"allowed": allowed, "remaining": last["remaining"], "source": last["source"]}


def at_once(*jobs):
    """Runs the jobs in threads, started together; their results in order."""
    gate = threading.Barrier(len(jobs))
    results = [None] * len(jobs)

    def one(i, job):
        gate.wait()
        try:
            results[i] = job()
        except BaseException as e:   # re-raised below
            results[i] = e

    threads = [threading.Thread(target=one, args=(i, j)) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


class SharedBucket(unittest.TestCase):

    def test_lua_python_and_the_cli_together_get_exactly_the_capacity(self):
        py = python_with_hirate()
        if py is None:
            self.skipTest("the hirate Python package is not installed (build-py/venv, made by "
                          "tests/python/run.sh, or HIRATE_PYTHON): the Python part is skipped")
        lua, python, tool = at_once(lambda: run_lua("allow", "three", 20),
                                    lambda: run_python(py, "allow", "three", 20),
                                    lambda: run_cli("allow", "three", 20))
        self.assertEqual(lua["allowed"] + python["allowed"] + tool["allowed"], CAPACITY,
                         (lua, python, tool))
        # Each now sees the empty bucket the others left.
        for peek in (run_lua("peek", "three", 1), run_python(py, "peek", "three", 1),
                     run_cli("peek", "three", 1)):
            self.assertEqual((peek["allowed"], peek["remaining"], peek["source"]),
                             (0, 0, "redis"))

    def test_each_language_sees_what_the_others_spent(self):
        py = python_with_hirate()
        spent = run_lua("allow", "seen", 1, cost=5)
        self.assertEqual((spent["allowed"], spent["remaining"]), (1, CAPACITY - 5))
        self.assertEqual(run_cli("peek", "seen", 1)["remaining"], CAPACITY - 5)
        self.assertEqual(run_cli("allow", "seen", 1, cost=7)["remaining"], CAPACITY - 12)
        self.assertEqual(run_lua("peek", "seen", 1)["remaining"], CAPACITY - 12)
        if py is not None:
            self.assertEqual(run_python(py, "allow", "seen", 1, 3)["remaining"], CAPACITY - 15)
            self.assertEqual(run_lua("peek", "seen", 1)["remaining"], CAPACITY - 15)
            self.assertEqual(run_cli("peek", "seen", 1)["remaining"], CAPACITY - 15)

    def test_lua_and_the_cli_together_get_exactly_the_capacity(self):
        lua, tool = at_once(lambda: run_lua("allow", "two", 25),
                            lambda: run_cli("allow", "two", 25))
        self.assertEqual(lua["allowed"] + tool["allowed"], CAPACITY, (lua, tool))


if __name__ == "__main__":
    unittest.main()
