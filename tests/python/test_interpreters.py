"""Subinterpreters (CPython 3.12 and later): hirate._hirate declares
Py_MOD_PER_INTERPRETER_GIL_SUPPORTED, so an isolated subinterpreter (its own
GIL, extensions checked) imports it and gets a module of its own, which
decides exactly as the main interpreter's does, in memory and in Redis; two
of them decide at once, each under its own GIL; and the main interpreter's
module still works after they are destroyed."""

import json
import sys
import textwrap
import threading

import pytest

import hirate

pytestmark = [pytest.mark.skipif(sys.version_info < (3, 12),
                                 reason="per-interpreter GILs need CPython 3.12"),
              pytest.mark.timeout(120)]

if sys.version_info >= (3, 13):
    import _interpreters as interpreters
elif sys.version_info >= (3, 12):
    import _xxsubinterpreters as interpreters

# One token a thousand seconds: no refill during a test, so every remaining
# figure is exact.
RATE = 0.001


def run(iid, code, out):
    """Runs code in interpreter iid with `out` (a file name) and the main
    interpreter's sys.path; returns what the code wrote to out as JSON."""
    script = f"import sys\nsys.path[:] = {sys.path!r}\nOUT = {str(out)!r}\n" + \
        textwrap.dedent(code)
    failure = interpreters.run_string(iid, script)   # 3.12 raises RunFailedError
    assert failure is None, failure
    with open(out) as f:
        return json.load(f)


def new_interpreter():
    if sys.version_info >= (3, 13):
        iid = interpreters.create("isolated")
        config = interpreters.get_config(iid)
        assert config.gil == "own" and config.check_multi_interp_extensions
        return iid
    return interpreters.create(isolated=True)


DECIDE = """
    import json
    import hirate
    lim = hirate.Limiter(URL, capacity=3, rate=RATE, deny_cache=False)
    got = [(d.allowed, d.remaining, d.limit, d.source) for d in
           (lim.allow(KEY) for _ in range(4))]
    lim.close()
    with open(OUT, "w") as f:
        json.dump({"got": got, "module": id(hirate._hirate),
                   "decision": id(hirate.Decision)}, f)
"""


def decide_in(iid, tmp_path, url, key):
    code = f"URL = {url!r}\nKEY = {key!r}\nRATE = {RATE!r}\n" + textwrap.dedent(DECIDE)
    return run(iid, code, tmp_path / f"{key}.json")


def expected(source):
    return [[True, 2, 3, source], [True, 1, 3, source], [True, 0, 3, source],
            [False, 0, 3, source]]


def test_a_subinterpreter_decides_in_memory_and_in_redis(redis, tmp_path):
    iid = new_interpreter()
    try:
        here = decide_in(iid, tmp_path, None, "mem")
        there = decide_in(iid, tmp_path, redis.url, "sub")
    finally:
        interpreters.destroy(iid)
    assert here["got"] == expected("local")
    assert there["got"] == expected("redis")
    # The subinterpreter's module and types are its own.
    assert here["module"] != id(hirate._hirate) and here["decision"] != id(hirate.Decision)
    # The bucket it spent is in Redis: the main interpreter sees it empty.
    with hirate.Limiter(redis.url, capacity=3, rate=RATE) as lim:
        d = lim.peek("sub")
        assert (d.allowed, d.remaining) == (False, 0)


def test_the_main_interpreter_decides_after_a_subinterpreter_is_gone(redis, tmp_path):
    iid = new_interpreter()
    decide_in(iid, tmp_path, None, "gone")
    interpreters.destroy(iid)
    for url, source in [(None, "local"), (redis.url, "redis")]:
        with hirate.Limiter(url, capacity=3, rate=RATE, deny_cache=False) as lim:
            got = [[d.allowed, d.remaining, d.limit, d.source]
                   for d in (lim.allow("main") for _ in range(4))]
        assert got == expected(source)
    with pytest.raises(hirate.ConfigError) as e:
        hirate.Limiter(capacity=0, rate=1.0)
    assert e.value.name == "ECAPACITY"


MANY = """
    import json
    import hirate
    mem = hirate.Limiter(capacity=N, rate=RATE)
    red = hirate.Limiter(URL, capacity=N, rate=RATE)
    got = {}
    for name, lim in (("memory", mem), ("redis", red)):
        ds = [lim.allow(KEY) for _ in range(N + 1)]
        got[name] = [sum(d.allowed for d in ds), [d.remaining for d in ds[-2:]]]
    red.close()
    with open(OUT, "w") as f:
        json.dump(got, f)
"""


def test_two_subinterpreters_decide_at_once_each_under_its_own_gil(redis, tmp_path):
    n = 300
    iids = [new_interpreter() for _ in range(2)]
    # Imported one after the other: CPython 3.12.1 itself hangs when two
    # isolated subinterpreters import asyncio at once (hirate imports it).
    for i, iid in enumerate(iids):
        run(iid, "import hirate, json\njson.dump(0, open(OUT, 'w'))\n", tmp_path / f"imp{i}.json")
    results, errors = {}, []

    def work(i, iid):
        code = (f"URL = {redis.url!r}\nKEY = 'k{i}'\nN = {n}\nRATE = {RATE!r}\n"
                + textwrap.dedent(MANY))
        try:
            results[i] = run(iid, code, tmp_path / f"many{i}.json")
        except BaseException as e:   # reported by the main thread below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i, iid)) for i, iid in enumerate(iids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for iid in iids:
        interpreters.destroy(iid)
    assert errors == []
    for i in range(2):
        assert results[i] == {"memory": [n, [0, 0]], "redis": [n, [0, 0]]}
