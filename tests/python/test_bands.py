"""Several limits on one key ("bands") through the Python API: how a
Limiter and an AsyncLimiter take them (limits= as a limit string or a
sequence of hirate.Band, tuples and one-limit strings), the core's words for
a bad one, the names, each band's exact figures in Decision.bands on both
backends, the Decision type's band fields, and, against a real
redis-server, one script call a decision and many threads in several
processes on one key: exactly the smaller budget admitted, and neither band
spent by a refused request (read back from the key in Redis)."""

import asyncio
import contextlib
import gc
import io
import math
import multiprocessing
import os
import pathlib
import re
import threading

import pytest

import hirate

pytestmark = pytest.mark.timeout(300)

T0 = 1_700_000_000_000_000   # an injected time, in µs
SLOW = dict(timeout=5, connect_timeout=5, on_error="closed")
BACKENDS = ["memory", "redis"]


def limiter(backend, redis, **kw):
    if backend == "memory":
        return hirate.Limiter(**kw)
    return hirate.Limiter(redis.url, **SLOW, **kw)


def whole_tokens(stored):
    """The whole tokens of each band in a key's "tokens ts tokens ts"."""
    return [math.floor(float(t)) for t in stored.split()[0::2]]


def figures(d):
    """(allowed, remaining, limit, retry_after_us, reset_after_us, band)."""
    return (d.allowed, d.remaining, d.limit, d.retry_after_us, d.reset_after_us, d.band)


# ------------------------------------------------------------ construction

@pytest.mark.parametrize("limits,want", [
    ("2/second; 3/day",
     [hirate.Band(2, 2.0, "2-per-1s"), hirate.Band(3, 3 / 86400, "3-per-86400s")]),
    ("10/5s, 100 per minute burst 20",
     [hirate.Band(10, 2.0, "10-per-5s"), hirate.Band(20, 100 / 60, "20-per-12s")]),
    ([hirate.Band(10, 10.0, "burst"), (1000, 1000 / 86400, "daily")],
     [hirate.Band(10, 10.0, "burst"), hirate.Band(1000, 1000 / 86400, "daily")]),
    ([(5, 1.0), hirate.Band(7, 0.5), "1000/day"],
     [hirate.Band(5, 1.0, "5-per-5s"), hirate.Band(7, 0.5, "7-per-14s"),
      hirate.Band(1000, 1000 / 86400, "1000-per-86400s")]),
    ((("3/minute"),), [hirate.Band(3, 0.05, "3-per-60s")]),
    ([(5.0, 2)], [hirate.Band(5, 2.0, "5-per-3s")]),
], ids=["string", "string-burst", "named", "mixed", "one-string", "float-int"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_limits_make_the_bands_in_order_with_the_core_default_names(backend, redis, limits,
                                                                    want):
    with limiter(backend, redis, limits=limits) as lim:
        assert lim.bands == tuple(want)
        assert all(type(b) is hirate.Band for b in lim.bands)
        assert (lim.capacity, lim.rate) == (want[0].capacity, want[0].rate)   # band 0's
    assert lim.bands == tuple(want)   # still known after close()


def test_a_band_name_defaults_to_the_core_refill_window():
    # w is hirate_refill_seconds(capacity, rate): whole seconds, rounded up.
    with hirate.Limiter(limits=[(10, 3.0), (1, 1 / 3)]) as lim:
        assert [b.name for b in lim.bands] == ["10-per-4s", "1-per-3s"]


@pytest.mark.parametrize("capacity,rate,w", [
    (10, 3.0, 4), (3, 3 / 86400, 86400), (1, 1 / 3, 3), (5, 1.0, 5), (7, 0.5, 14),
    (0, 1.0, 0), (5, 0.0, 0), (1.5, 1.0, 0), (5, 1e-12, 0),   # no limiter takes these
])
def test_refill_seconds_is_the_core_w_and_that_of_the_default_names(capacity, rate, w):
    assert hirate._hirate.refill_seconds(capacity, rate) == w
    if w:
        with hirate.Limiter(limits=[(capacity, rate)]) as lim:
            assert lim.bands[0].name == f"{capacity}-per-{w}s"


def test_one_band_is_the_limiter_of_capacity_and_rate():
    a = hirate.Limiter(capacity=5, rate=1.0)
    b = hirate.Limiter(limits=[(5, 1.0)])
    c = hirate.Limiter(limits="5/5s")
    assert a.bands == b.bands == c.bands == (hirate.Band(5, 1.0, "5-per-5s"),)
    assert repr(a) == repr(b) == repr(c) == \
        "<hirate.Limiter url=None capacity=5 rate=1.0 on_error='local'>"
    for lim in (a, b, c):
        d = lim._decide_at("k", 2, True, T0)
        assert (figures(d), d.bands) == ((True, 3, 5, 0, 2_000_000, 0), (d,))
        assert repr(d) == ("<Decision allowed remaining=3 limit=5 retry_after=0.0 "
                           "reset_after=2.0 source='local'>")


def test_the_repr_names_the_bands():
    lim = hirate.Limiter("redis://u:s3cr3t@127.0.0.1:1",
                         limits=[(10, 10.0, "burst"), "1000/day"])
    assert repr(lim) == ("<hirate.Limiter url='redis://u:***@127.0.0.1:1' "
                         "bands=('burst', '1000-per-86400s') on_error='local'>")
    alim = hirate.AsyncLimiter(limits=[(10, 10.0, "burst"), "1000/day"])
    assert repr(alim) == ("<hirate.AsyncLimiter url=None bands=('burst', '1000-per-86400s') "
                          "on_error='local'>")
    assert alim.bands == hirate.Limiter(limits=[(10, 10.0, "burst"), "1000/day"]).bands
    assert (alim.capacity, alim.rate) == (10, 10.0)


def test_from_env_takes_limits(monkeypatch, redis):
    monkeypatch.setenv("REDIS_URL", redis.url)
    with hirate.Limiter.from_env(limits="2/second; 3/day", **SLOW) as lim:
        assert lim.url == redis.url
        assert [b.name for b in lim.bands] == ["2-per-1s", "3-per-86400s"]
        assert lim.allow("k").source == "redis"
    alim = hirate.AsyncLimiter.from_env(limits="2/second; 3/day", **SLOW)
    assert (alim.url, alim.bands) == (redis.url, lim.bands)


# The core checks the limit and words every message: the Python layer
# passes the values on (a sequence's item i is the core's bands[i]).
CONFIG_ERRORS = [
    (dict(capacity=5, rate=1.0, limits="1/s"), "EOPTION",
     "set the limit once: capacity and rate, bands, or limits"),
    (dict(capacity=5, limits=[(5, 1.0)]), "EOPTION",
     "set the limit once: capacity and rate, bands, or limits"),
    (dict(rate=1.0, limits="5/s"), "EOPTION",
     "set the limit once: capacity and rate, bands, or limits"),
    (dict(limits=""), "EOPTION", "the limit string is empty"),
    (dict(limits="10/fortnight"), "EOPTION",
     "limit '10/fortnight': unknown unit 'fortnight' (second, minute, hour or day)"),
    (dict(limits="5/s; 5/s"), "EOPTION", "limits: two limits are the same (5-per-1s)"),
    (dict(limits=[(5, 1.0), (0, 1.0)]), "ECAPACITY",
     "bands[1]: capacity must be a whole number from 1 to 2^53-1, got 0"),
    (dict(limits=[(2 ** 53, 1.0)]), "ECAPACITY",
     "bands[0]: capacity must be a whole number from 1 to 2^53-1, got 9007199254740992"),
    (dict(limits=[(2 ** 64, 1.0)]), "ECAPACITY",
     "bands[0]: capacity must be a whole number from 1 to 2^53-1, got 18446744073709551616"),
    (dict(limits=[(1.5, 1.0)]), "ECAPACITY",
     "bands[0]: capacity must be a whole number from 1 to 2^53-1, got 1.5"),
    (dict(limits=[(5, 1.0), (5, 0)]), "ERATE",
     "bands[1]: rate must be a finite number of tokens per second above 0, got 0"),
    (dict(limits=[(5, 1.0), (5, math.nan)]), "ERATE",
     "bands[1]: rate must be a finite number of tokens per second above 0, got nan"),
    (dict(limits=[(5, 1.0), (5, 1e-12)]), "ERANGE",
     "bands[1]: capacity 5 at rate 1e-12 takes over 2^53 us to refill; "
     "raise the rate or lower the capacity"),
    (dict(limits=[(5, 1.0, "a"), (6, 1.0, "a")]), "EOPTION",
     "bands[1]: bands[0] has the same name, 'a'"),
    (dict(limits=[(5, 1.0), (5, 1.0)]), "EOPTION",
     "bands[1]: bands[0] has the same name, '5-per-5s'"),
    (dict(limits=[(5, 1.0, "")]), "EOPTION",
     "bands[0]: a band's name must be 1 to 64 bytes, got 0"),
    (dict(limits=[(5, 1.0, "x" * 65)]), "EOPTION",
     "bands[0]: a band's name must be 1 to 64 bytes, got 65"),
    (dict(limits=[(5, 1.0, "tab\there")]), "EOPTION",
     "bands[0]: a band's name must be printable ASCII (it is sent in headers)"),
    (dict(limits=[(5, 1.0, "é")]), "EOPTION",
     "bands[0]: a band's name must be printable ASCII (it is sent in headers)"),
    (dict(limits=[(i + 1, 1.0) for i in range(17)]), "EOPTION",
     "bands must be 1 to 16 bands, got 17"),
    (dict(limits=["1/fortnight"]), "EOPTION",
     "limit '1/fortnight': unknown unit 'fortnight' (second, minute, hour or day)"),
    # A sequence's item is one band: several limits go in one string.
    (dict(limits=["1/s; 2/m"]), "EOPTION",
     "limits[0] holds 2 limits, '1/s; 2/m': an item of a sequence is one"),
    (dict(limits=[(5, 1.0), (5, 1.0, "a\0b")]), "EOPTION",
     "bands[1]: a band's name must not contain a NUL character"),
    (dict(limits="1/s\0"), "EOPTION", "limits must not contain a NUL character"),
]


@pytest.mark.parametrize("cls", [hirate.Limiter, hirate.AsyncLimiter], ids=lambda c: c.__name__)
@pytest.mark.parametrize("kw,name,message", CONFIG_ERRORS, ids=lambda v: repr(v)[:30])
def test_a_bad_limit_raises_the_core_error_and_words(cls, kw, name, message):
    with pytest.raises(hirate.ConfigError) as info:
        cls("redis://127.0.0.1:1", **kw)   # nothing connects: the options come first
    assert (info.value.name, str(info.value)) == (name, message)
    assert info.value.code == getattr(hirate._hirate, name)


def test_an_empty_sequence_of_bands_is_the_core_error():
    with pytest.raises(hirate.ConfigError) as info:
        hirate.Limiter(limits=[])
    assert (info.value.name, str(info.value)) == ("EOPTION", "bands must be 1 to 16 bands, got 0")


@pytest.mark.parametrize("kw,message", [
    (dict(limits=[(5, 1.0), 5]), "limits[1] must be a hirate.Band, a (capacity, rate[, name]) "
                                 "tuple or a limit string, not int"),
    (dict(limits=[[5, 1.0]]), "limits[0] must be a hirate.Band, a (capacity, rate[, name]) "
                              "tuple or a limit string, not list"),
    (dict(limits=[(5,)]), "limits[0] must be a hirate.Band, a (capacity, rate[, name]) tuple "
                          "or a limit string, not tuple of that length"),
    (dict(limits=[(True, 1.0)]), "limits[0]: capacity must be an int, not bool"),
    (dict(limits=[(5, 1.0), (5, "1")]), "limits[1]: rate must be a number, not str"),
    (dict(limits=[(5, 1.0, 7)]), "limits[0]: name must be a str, not int"),
    (dict(limits=b"1/s"), "limits must be a limit string or a sequence of bands, not bytes"),
    (dict(limits=5), "limits must be a limit string or a sequence of bands, not int"),
    (dict(limits=[(5, 1.0)], capacity=None), "capacity must be an int, not NoneType"),
    (dict(), "Limiter() missing required keyword argument 'capacity' (or limits)"),
    (dict(capacity=5), "Limiter() missing required keyword argument 'rate' (or limits)"),
])
@pytest.mark.parametrize("cls", [hirate.Limiter, hirate.AsyncLimiter], ids=lambda c: c.__name__)
def test_a_limit_of_a_wrong_type_raises_type_error(cls, kw, message):
    with pytest.raises(TypeError) as info:
        cls(**kw)
    assert str(info.value) == message


# ------------------------------------------------------ each band's figures

# (op, cost, t_us after T0) -> the whole's figures, and each band's, for
# limits=[(2, 1.0, "burst"), (3, 0.25, "slow")]; figures() order, with
# retry_after_us None for never.
STEPS = [
    # 1 from each: band 0 has the fewest left; 4 s until slow is full.
    ("allow", 1, 0, (True, 1, 2, 0, 4_000_000, 0),
     [(True, 1, 2, 0, 1_000_000, 0), (True, 2, 3, 0, 4_000_000, 1)]),
    # burst lacks 2, slow holds it: refused by band 0, spent in neither.
    ("allow", 2, 0, (False, 1, 2, 1_000_000, 4_000_000, 0),
     [(False, 1, 2, 1_000_000, 1_000_000, 0), (True, 2, 3, 0, 4_000_000, 1)]),
    ("allow", 1, 0, (True, 0, 2, 0, 8_000_000, 0),
     [(True, 0, 2, 0, 2_000_000, 0), (True, 1, 3, 0, 8_000_000, 1)]),
    # 2 s on: burst is full again, slow has 1.5 and waits 2 s for 2.
    ("allow", 2, 2_000_000, (False, 1, 3, 2_000_000, 6_000_000, 1),
     [(True, 2, 2, 0, 0, 0), (False, 1, 3, 2_000_000, 6_000_000, 1)]),
    # above every capacity: never, and band 0 is the first of equals.
    ("peek", 5, 2_000_000, (False, 1, 2, None, 6_000_000, 0),
     [(False, 2, 2, None, 0, 0), (False, 1, 3, None, 6_000_000, 1)]),
    ("reset", None, None, None, None),
    ("peek", 0, 2_000_000, (True, 2, 2, 0, 0, 0),
     [(True, 2, 2, 0, 0, 0), (True, 3, 3, 0, 0, 1)]),
]


@pytest.mark.parametrize("deny_cache", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_decision_bands_give_each_band_exact_figures(backend, redis, deny_cache):
    with limiter(backend, redis, limits=[(2, 1.0, "burst"), (3, 0.25, "slow")],
                 deny_cache=deny_cache) as lim:
        for i, (op, cost, dt, whole, bands) in enumerate(STEPS):
            if op == "reset":
                assert lim.reset("k") is None
                continue
            d = lim._decide_at("k", cost, op == "allow", T0 + dt)
            assert (figures(d), [figures(b) for b in d.bands]) == (whole, bands), i
            for b in d.bands:   # the whole's source, error and time
                assert (b.source, b.error, b.time_us, b.bands) == (d.source, None, T0 + dt, (b,))
            assert d.source in ({"local"} if backend == "memory" else
                                {"redis", "cache"} if deny_cache else {"redis"})
        if backend == "redis":
            # One key holds both bands, "tokens ts tokens ts" (after the reset, a peek
            # wrote nothing: allow once to see it).
            lim._decide_at("k", 1, True, T0)
            assert redis.command("GET", "rl:k") == f"1 {T0} 2 {T0}"


def test_real_time_calls_give_bands_on_both_backends_and_allow_many(redis):
    for backend in BACKENDS:
        with limiter(backend, redis, limits=[(3, 0.001, "burst"), (5, 0.0001, "daily")],
                     prefix="rt:") as lim:
            d = lim.allow("a", 2)
            assert [(b.allowed, b.remaining, b.limit) for b in d.bands] == [
                (True, 1, 3), (True, 3, 5)]
            assert (d.allowed, d.remaining, d.limit, d.band) == (True, 1, 3, 0)
            p = lim.peek("a", 2)
            assert (p.allowed, p.band, [b.allowed for b in p.bands]) == (False, 0, [False, True])
            assert p.retry_after > 0 and p.bands[1].retry_after == 0.0
            got = lim.allow_many([("a", 1), ("b", 4), ("c", 6)])
            assert [g.allowed for g in got] == [True, False, False]
            assert [g.band for g in got] == [0, 0, 0]
            assert got[2].retry_after == math.inf
            # Every item's bands, from one pipelined round trip too.
            assert [[b.allowed for b in g.bands] for g in got] == [
                [True, True], [False, True], [False, False]]
            assert [b.remaining for b in got[1].bands] == [3, 5]
            if backend != "memory":
                assert whole_tokens(redis.command("GET", "rt:a")) == [0, 2]
            lim.reset("a")
            assert [b.remaining for b in lim.peek("a").bands] == [3, 5]


def test_the_failure_policies_answer_for_every_band():
    down = "redis://127.0.0.1:1"
    with hirate.Limiter(down, limits=[(3, 1.0), (5, 0.5)], on_error="open") as lim:
        d = lim.allow("k")
        assert (d.source, d.error, d.allowed, d.band) == ("fail_open", "ECONNECT", True, 0)
        assert [(b.allowed, b.limit, b.source) for b in d.bands] == [
            (True, 3, "fail_open"), (True, 5, "fail_open")]
    with hirate.Limiter(down, limits=[(3, 1.0), (5, 0.5)], on_error="local") as lim:
        d = lim.allow("k", 4)
        assert (d.source, d.allowed, d.band) == ("local", False, 0)
        assert [(b.allowed, b.remaining) for b in d.bands] == [(False, 3), (True, 5)]


def test_one_script_call_a_decision(redis):
    redis.command("CONFIG", "RESETSTAT")
    with hirate.Limiter(redis.url, limits="5/second; 8/day", deny_cache=False, **SLOW) as lim:
        got = [lim.allow("k") for _ in range(7)]
    assert [d.allowed for d in got] == [True] * 5 + [False] * 2
    stats = redis.command("INFO", "commandstats")
    calls = dict(re.findall(r"cmdstat_(\w+):calls=(\d+)", stats))
    assert int(calls.get("fcall", 0)) + int(calls.get("evalsha", 0)) == 7


# ----------------------------------------------------------- the Decision type

def test_decision_equality_and_hash_include_the_bands():
    lim = hirate.Limiter(limits=[(2, 1.0), (3, 0.25)])
    a = lim._decide_at("k", 1, False, T0)
    b = hirate.Limiter(limits=[(2, 1.0), (3, 0.25)])._decide_at("k", 1, False, T0)
    other = hirate.Limiter(limits=[(2, 1.0), (4, 0.25)])._decide_at("k", 1, False, T0)
    assert a == b and hash(a) == hash(b)
    # The whole's figures are the same, a band's differ.
    assert figures(a) == figures(other) and a.time_us == other.time_us
    assert a != other
    assert a.bands[0] == other.bands[0] and a.bands[1] != other.bands[1]
    assert a.bands is a.bands   # made once


def test_decision_can_be_made_with_bands():
    lim = hirate.Limiter(limits=[(2, 1.0), (3, 0.25)])
    d = lim._decide_at("k", 2, True, T0)
    d = lim._decide_at("k", 1, True, T0)
    made = hirate.Decision(d.allowed, d.remaining, d.limit, d.retry_after, d.reset_after,
                           d.source, time=d.time, band=d.band, bands=d.bands)
    assert made == d and repr(made) == repr(d)
    assert repr(d) == ("<Decision refused remaining=0 limit=2 retry_after=1.0 reset_after=8.0 "
                       "source='local' band=0 bands=(refused remaining=0 limit=2 "
                       "retry_after=1.0 reset_after=2.0; allowed remaining=1 limit=3 "
                       "retry_after=0.0 reset_after=8.0)>")
    one = hirate.Decision(True, 1, 2, 0.0, 1.0, "local")
    assert (one.band, one.bands) == (0, (one,))
    assert hirate.Decision(True, 1, 2, 0.0, 1.0, "local", bands=[one]) == one
    unknown = hirate.Decision(False, 0, 2, 1.0, 1.0, "redis", band=1, bands=())
    assert (unknown.band, unknown.bands) == (1, ())
    assert unknown != hirate.Decision(False, 0, 2, 1.0, 1.0, "redis")
    with pytest.raises(hirate.ConfigError, match=r"^band must be from 0 to 1, got 2$"):
        hirate.Decision(True, 1, 2, 0.0, 1.0, "local", band=2, bands=d.bands)
    with pytest.raises(hirate.ConfigError, match=r"^band must be 0 without bands, got 1$"):
        hirate.Decision(True, 1, 2, 0.0, 1.0, "local", band=1)
    with pytest.raises(TypeError, match=r"^bands\[1\] must be a Decision, not int$"):
        hirate.Decision(True, 1, 2, 0.0, 1.0, "local", bands=[one, 5])


# ------------------------------------------------------------ AsyncLimiter

def test_async_limiter_gives_bands_on_redis_and_in_memory(redis):
    async def main(url):
        kw = dict(SLOW, prefix="al:") if url else {}
        async with hirate.AsyncLimiter(url, limits=[(3, 0.001, "burst"), (5, 0.0001, "daily")],
                                       **kw) as lim:
            d = await lim.allow("a", 2)
            assert [(b.allowed, b.remaining) for b in d.bands] == [(True, 1), (True, 3)]
            p = await lim.peek("a", 2)
            assert (p.allowed, [b.allowed for b in p.bands]) == (False, [False, True])
            # allow_many keeps every item's bands, a deny-cache answer's too.
            got = await lim.allow_many([("a", 1), ("a", 1), ("b", 6)])
            assert [g.allowed for g in got] == [True, False, False]
            assert [[b.allowed for b in g.bands] for g in got] == [
                [True, True], [False, True], [False, False]]
            assert [b.remaining for b in got[1].bands] == [0, 2]
            await lim.reset("a")
            assert [b.remaining for b in (await lim.peek("a")).bands] == [3, 5]
            # 40 tasks at once on one key: exactly the burst.
            got = await asyncio.gather(*(lim.allow("c") for _ in range(40)))
            assert sum(g.allowed for g in got) == 3
            assert {(g.band, g.bands[0].allowed, g.bands[1].allowed)
                    for g in got if not g} == {(0, False, True)}
        if url:
            assert whole_tokens(redis.command("GET", "al:c")) == [0, 2]
    for url in (None, redis.url):
        asyncio.run(asyncio.wait_for(main(url), 60))


# ----------------------------------------- many threads, several processes

PROCESSES, THREADS, CALLS = 4, 25, 5    # 100 threads in all, 500 calls


def hammer(url, limits, key, barrier, queue):
    """One process: THREADS threads, released together with the other
    processes, each calling allow(key) CALLS times; puts what it saw."""
    lim = hirate.Limiter(url, limits=limits, prefix="conc:", timeout=10, connect_timeout=5,
                         on_error="closed")
    ready = threading.Barrier(THREADS)
    seen, errors = [], []

    def run():
        try:
            ready.wait()
            for _ in range(CALLS):
                d = lim.allow(key)
                seen.append((d.allowed, d.band, d.error, d.source,
                             tuple(b.allowed for b in d.bands)))
        except BaseException as e:   # noqa: BLE001 - reported below
            errors.append(repr(e))

    barrier.wait()
    ts = [threading.Thread(target=run) for _ in range(THREADS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    lim.close()
    queue.put((seen, errors))


def redis_time_us(redis):
    s, us = redis.command("TIME")
    return int(s) * 1_000_000 + int(us)


# A slow refill (so that during the run a band regains far less than one
# token: no refused spend could hide in it), a small burst and a smaller
# quota; and the other way round, so that each band is once the one that
# refuses while the other holds the cost.
@pytest.mark.parametrize("burst,quota", [(30, 10), (8, 20)], ids=["quota-binds", "burst-binds"])
def test_100_threads_in_4_processes_on_one_key_spend_exactly_the_smaller_budget(redis, burst,
                                                                               quota):
    rate = 1e-8   # tokens a second: 30 tokens take 3e9 s to refill, within 2^53 µs
    limits = [(burst, rate, "burst"), (quota, rate, "quota")]
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(PROCESSES), ctx.Queue()
    start = redis_time_us(redis)
    procs = [ctx.Process(target=hammer, args=(redis.url, limits, "hot", barrier, queue))
             for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    end = redis_time_us(redis)
    assert [e for _, errors in results for e in errors] == []
    seen = [s for r, _ in results for s in r]
    assert len(seen) == PROCESSES * THREADS * CALLS
    assert [s for s in seen if s[2] is not None] == []     # no failure turned into a refusal
    assert {s[3] for s in seen} <= {"redis", "cache"}
    smaller = min(burst, quota)
    admitted = [s for s in seen if s[0]]
    assert len(admitted) == smaller
    assert {s[4] for s in admitted} == {(True, True)}
    # Every refusal was the smaller band's, the other band holding the cost.
    binding = 0 if burst < quota else 1
    held = (True, False) if binding == 1 else (False, True)
    assert {(s[1], s[4]) for s in seen if not s[0]} == {(binding, held)}
    # The key: "tokens ts tokens ts". Each band holds its capacity less the
    # admitted calls, plus what it refilled while the run lasted (at most
    # rate x the run's time on Redis' clock, far below one token): a refused
    # call that had spent anywhere would show as a whole token missing.
    stored = redis.command("GET", "conc:hot").split()
    assert len(stored) == 4
    most = rate * (end - start) / 1e6
    assert most < 1e-5
    for capacity, tokens, ts in ((burst, stored[0], stored[1]), (quota, stored[2], stored[3])):
        left = float(tokens)
        assert capacity - smaller <= left <= capacity - smaller + most, (capacity, tokens)
        assert start <= int(ts) <= end


def test_100_threads_on_one_key_in_memory_spend_exactly_the_smaller_budget():
    lim = hirate.Limiter(limits=[(30, 1e-8, "burst"), (10, 1e-8, "quota")])
    ready = threading.Barrier(100)
    seen = []

    def run():
        ready.wait()
        for _ in range(5):
            seen.append(lim.allow("hot"))
    ts = [threading.Thread(target=run) for _ in range(100)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(seen) == 500 and sum(d.allowed for d in seen) == 10
    d = lim.peek("hot", 0)
    assert [b.remaining for b in d.bands] == [20, 0]


# --------------------------------------------------------------- the docs

def test_the_docs_example_of_several_limits_prints_what_it_says():
    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md").read_text("utf-8")
    section = doc[doc.index("## Several limits"):doc.index("## TLS")]
    code, = re.findall(r"```python\n(.*?)```", section, re.S)
    said = [line.split("# ", 1)[1].split(":")[0].strip()
            for line in code.splitlines() if "print(" in line]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/python.md, Several limits", "exec"), {})   # noqa: S102
    assert out.getvalue().splitlines() == said


# ------------------------------------------------------------------ leaks

def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_growth(work, warm, measured):
    """RSS growth over `measured` calls of work(i), after `warm` of them."""
    for i in range(warm):
        work(i)
    gc.collect()
    before = rss_bytes()
    for i in range(warm, warm + measured):
        work(i)
    gc.collect()
    return rss_bytes() - before


def test_100k_calls_of_several_bands_leave_rss_flat():
    lim = hirate.Limiter(limits=[(50, 1000.0, "burst"), (80, 500.0)])
    keys = ["user:%03d" % i for i in range(100)]

    def work(i):
        k = keys[i % 100]
        d = lim.allow(k)
        repr(d), d.bands, d.bands[1].remaining, hash(d), d == d
        lim.peek(k, 2).bands
        [r.bands for r in lim.allow_many([(k, 1), (k, 90)])]
        if i % 10 == 0:
            lim.reset(k)
            hirate.Decision(True, 1, 5, 0.0, 0.2, "local", band=1, bands=d.bands)
            with hirate.Limiter(limits=[(5, 1.0), "3/day"]) as other:
                other.bands, other.allow(k).bands
            try:
                hirate.Limiter(limits=[(5, 1.0), (5, 0)])
            except hirate.ConfigError:
                pass

    assert rss_growth(work, 10_000, 100_000) < 1 << 20


# --------------------------------------------------------- a Redis Cluster

def test_several_bands_over_a_cluster_with_limiter_and_async_limiter(cluster):
    """Each key of several bands is one key on one master: one call there,
    every band in it, for the blocking path and for AsyncLimiter's rounds."""
    keys = ["user:%d" % i for i in range(6)]   # spread over the masters
    limits = [(3, 1e-6, "burst"), (5, 1e-7, "daily")]
    with hirate.Limiter(cluster.url, limits=limits, prefix="cb:", **SLOW) as lim:
        got = [lim.allow(k, 2) for k in keys] + [lim.allow(k, 2) for k in keys]
    assert [d.allowed for d in got] == [True] * 6 + [False] * 6
    assert {(d.band, tuple((b.allowed, b.remaining) for b in d.bands)) for d in got[6:]} == {
        (0, ((False, 1), (True, 3)))}

    async def main():
        async with hirate.AsyncLimiter(cluster.url, limits=limits, prefix="cb:",
                                       **SLOW) as alim:
            one = [await alim.allow(k, 1) for k in keys]
            many = await alim.allow_many([(k, 1) for k in keys])
            return one, many
    one, many = asyncio.run(asyncio.wait_for(main(), 60))
    assert [[(b.allowed, b.remaining) for b in d.bands] for d in one] == [
        [(True, 0), (True, 2)]] * 6
    assert [[(b.allowed, b.remaining) for b in d.bands] for d in many] == [
        [(False, 0), (True, 2)]] * 6
    # Every key is on the master of its slot, holding both bands.
    where = cluster.where(["cb:" + k for k in keys])
    assert all(where)
    for k, node in zip(keys, where):
        assert whole_tokens(cluster.command(node, "GET", "cb:" + k)) == [0, 2]
