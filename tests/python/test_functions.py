"""Redis Functions through the Python API, on a plain Redis 7: the library
hirate_<16 hex of the script's SHA1> is loaded with FUNCTION LOAD only after
FCALL said it is missing, then every call is one FCALL; functions=False keeps
the EVALSHA path exactly; a user whose ACL forbids FUNCTION (or FCALL) gets
EVALSHA from then on, with one WARNING record of the logger "hirate" for
that server, never more. Counters are the core's (Limiter._stats()); the
server's own INFO commandstats agrees."""

import asyncio
import logging
import re

import pytest

import hirate

pytestmark = pytest.mark.timeout(60)

PATIENT = dict(timeout=5, connect_timeout=5)
LIBRARY = "hirate_" + hirate.script_sha1()[:16]
COUNTERS = ("fcall", "function_loads", "evalsha", "eval")


def counters(lim):
    s = lim._stats()
    return {k: s[k] for k in COUNTERS}


def fresh(server):
    server.command("FUNCTION", "FLUSH")
    server.command("SCRIPT", "FLUSH")
    return server


def test_the_library_and_its_name():
    assert hirate.function_name() == LIBRARY
    lib = hirate.function_library()
    assert lib.startswith(f"#!lua name={LIBRARY}\n")
    assert hirate.script_source() in lib


def test_a_fresh_server_loads_the_library_once(redis):
    fresh(redis)
    lim = hirate.Limiter(redis.url, capacity=5, rate=0.001, **PATIENT)
    try:
        assert lim.allow("k").source == "redis"
        assert counters(lim) == dict(fcall=2, function_loads=1, evalsha=0, eval=0)
        got = [lim.allow("k").allowed for _ in range(4)]
        assert got == [True] * 4
        assert counters(lim) == dict(fcall=6, function_loads=1, evalsha=0, eval=0)
    finally:
        lim.close()
    libs = redis.command("FUNCTION", "LIST")
    assert [lib[1] for lib in libs] == [LIBRARY]
    # A second limiter finds it there: FCALL only.
    again = hirate.Limiter(redis.url, capacity=5, rate=0.001, **PATIENT)
    try:
        d = again.allow("k")
        assert (d.allowed, d.source) == (False, "redis")   # the first's bucket, spent
        assert counters(again) == dict(fcall=1, function_loads=0, evalsha=0, eval=0)
    finally:
        again.close()


def test_a_fresh_server_loads_the_library_once_async(redis):
    fresh(redis)

    async def main():
        lim = hirate.AsyncLimiter(redis.url, capacity=5, rate=0.001, **PATIENT)
        try:
            first = await lim.allow("k")
            after_first = counters(lim)
            rest = await lim.allow_many([("k", 1), ("j", 1)])
            return first, after_first, rest, counters(lim)
        finally:
            await lim.close()

    first, after_first, rest, end = asyncio.run(main())
    assert (first.allowed, first.source) == (True, "redis")
    assert after_first == dict(fcall=2, function_loads=1, evalsha=0, eval=0)
    assert [(d.allowed, d.source) for d in rest] == [(True, "redis")] * 2
    assert end == dict(fcall=4, function_loads=1, evalsha=0, eval=0)


def test_functions_off_is_the_evalsha_path(redis):
    fresh(redis)
    lim = hirate.Limiter(redis.url, capacity=5, rate=0.001, functions=False, **PATIENT)
    try:
        assert lim.allow("k").source == "redis"
        assert counters(lim) == dict(fcall=0, function_loads=0, evalsha=1, eval=1)
        lim.allow("k")
        assert counters(lim) == dict(fcall=0, function_loads=0, evalsha=2, eval=1)
    finally:
        lim.close()
    assert redis.command("FUNCTION", "LIST") == []


def test_the_server_counts_fcall_and_no_evalsha(own_redis):
    own_redis.command("CONFIG", "RESETSTAT")
    lim = hirate.Limiter(own_redis.url, capacity=100, rate=1.0, **PATIENT)
    try:
        for _ in range(10):
            assert lim.allow("k").source == "redis"
    finally:
        lim.close()
    stats = own_redis.command("INFO", "commandstats")
    calls = dict(re.findall(r"^cmdstat_([\w|]+):calls=(\d+)", stats, re.M))
    assert int(calls["fcall"]) == 11     # the one that found no library, and ten
    assert "evalsha" not in calls and "eval" not in calls
    assert int(calls["function|load"]) == 1


@pytest.mark.parametrize("rule,first", [
    ("-function", dict(fcall=2, function_loads=1, evalsha=1, eval=1)),
    ("-fcall", dict(fcall=1, function_loads=0, evalsha=1, eval=1)),
])
def test_an_acl_without_functions_gets_evalsha_and_one_warning(own_redis, caplog, rule,
                                                               first):
    own_redis.command("ACL", "SETUSER", "app", "on", ">app-pw", "~*", "+@all", rule)
    url = f"redis://app:app-pw@127.0.0.1:{own_redis.port}"
    caplog.set_level(logging.INFO, logger="hirate")
    lim = hirate.Limiter(url, capacity=100, rate=1.0, **PATIENT)
    try:
        assert lim.allow("k").source == "redis"
        assert counters(lim) == first
        for _ in range(49):
            assert lim.allow("k").source == "redis"
        assert counters(lim) == dict(first, evalsha=50)
    finally:
        lim.close()
    warnings = [r for r in caplog.records if r.name == "hirate"]
    assert [r.levelno for r in warnings] == [logging.WARNING]
    assert re.fullmatch(rf"Redis Functions are not usable on 127\.0\.0\.1:{own_redis.port} "
                        r"\(Redis replied: NOPERM .*\): deciding with EVALSHA there",
                        warnings[0].getMessage()), warnings[0].getMessage()
    assert "app-pw" not in warnings[0].getMessage()


def test_an_acl_without_functions_async(own_redis, caplog):
    own_redis.command("ACL", "SETUSER", "app", "on", ">app-pw", "~*", "+@all", "-function")
    url = f"redis://app:app-pw@127.0.0.1:{own_redis.port}"
    caplog.set_level(logging.INFO, logger="hirate")

    async def main():
        lim = hirate.AsyncLimiter(url, capacity=100, rate=1.0, **PATIENT)
        try:
            got = [(await lim.allow("k")).source for _ in range(20)]
            return got, counters(lim)
        finally:
            await lim.close()

    got, end = asyncio.run(main())
    assert got == ["redis"] * 20
    assert end == dict(fcall=2, function_loads=1, evalsha=20, eval=1)
    assert [r.levelno for r in caplog.records if r.name == "hirate"] == [logging.WARNING]


@pytest.mark.parametrize("kind", ["Limiter", "AsyncLimiter"])
def test_a_log_handler_that_raises_never_reaches_a_decision(own_redis, kind):
    # A handler's emit() that raises goes out of Logger.log (logging catches
    # only what its own handlers report): the binding drops it.
    class Broken(logging.Handler):
        def __init__(self):
            super().__init__()
            self.seen = []

        def emit(self, record):
            self.seen.append(record.getMessage())
            raise RuntimeError("a broken log handler")

    own_redis.command("ACL", "SETUSER", "app", "on", ">app-pw", "~*", "+@all", "-function")
    url = f"redis://app:app-pw@127.0.0.1:{own_redis.port}"
    logger = logging.getLogger("hirate")
    broken = Broken()
    logger.addHandler(broken)
    old_level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        if kind == "Limiter":
            lim = hirate.Limiter(url, capacity=100, rate=1.0, **PATIENT)
            try:
                got = [lim.allow("k") for _ in range(3)]
            finally:
                lim.close()
        else:   # the event loop's feed, with the GIL held
            async def main():
                async with hirate.AsyncLimiter(url, capacity=100, rate=1.0, **PATIENT) as lim:
                    return [await lim.allow("k") for _ in range(3)]
            got = asyncio.run(main())
    finally:
        logger.removeHandler(broken)
        logger.setLevel(old_level)
    assert [(d.allowed, d.remaining, d.source) for d in got] == [
        (True, 99, "redis"), (True, 98, "redis"), (True, 97, "redis")]
    assert len(broken.seen) == 1 and broken.seen[0].startswith("Redis Functions are not usable")
