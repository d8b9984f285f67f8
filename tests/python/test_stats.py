"""Limiter.stats() and AsyncLimiter.stats(): hirate.Stats, the core's
metrics of a limiter, after scripted sequences with exact figures, in memory
and on a real redis-server (an outage of one breaker period included); the
web integrations' stats(), summed over their limiters."""

import asyncio
import dataclasses
import math
import pickle
import time

import pytest

import hirate

pytestmark = pytest.mark.timeout(60)

SOURCES = ["redis", "local", "cache", "fail_open", "fail_closed"]
CODES = ["EINVAL", "ECAPACITY", "ERATE", "ECOST", "EKEY", "ERANGE", "EURL", "EOPTION",
         "ENOMEM", "ECONNECT", "ETIMEDOUT", "EIO", "EPROTO", "ESERVER", "EAUTH", "ENOPERM",
         "EREPLY", "ECLOSED", "ETLS", "EREFUSED", "ENOTREDIS"]
BOUNDS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
          1.0, math.inf]


def counts(mapping):
    """The nonzero items of decisions or errors."""
    return {k: v for k, v in mapping.items() if v}


def test_a_new_limiter_has_every_name_and_bound_and_no_count():
    s = hirate.Limiter(capacity=1, rate=1.0).stats()
    assert type(s) is hirate.Stats
    assert list(s.decisions) == SOURCES and list(s.errors) == CODES
    assert [le for le, _ in s.latency_buckets] == BOUNDS
    assert s == hirate.Stats.zero()
    assert (s.refused, s.peeks, s.latency_count, s.latency_sum) == (0, 0, 0, 0.0)


def test_the_error_names_are_the_exceptions_codes():
    # errors are keyed as hirate.Error.name is
    assert [getattr(hirate._hirate, c) for c in CODES] == list(range(-1, -22, -1))


def test_stats_are_frozen_and_pickle():
    s = hirate.Limiter(capacity=1, rate=1.0).stats()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.refused = 3
    assert pickle.loads(pickle.dumps(s)) == s


def test_memory_decisions_refusals_peeks_and_bad_input_are_counted_exactly():
    lim = hirate.Limiter(capacity=10, rate=1e-6)
    for _ in range(15):
        lim.allow("k")           # 10 allowed, 5 refused
    for _ in range(3):
        lim.peek("k")
    lim.allow_many([("a", 1), ("b", 2), ("c", 11)])   # 3 decisions, c refused
    with pytest.raises(hirate.ConfigError):
        lim.allow("")             # EKEY
    with pytest.raises(hirate.ConfigError):
        lim.allow("k", -1)        # ECOST
    s = lim.stats()
    assert counts(s.decisions) == {"local": 18}
    assert (s.refused, s.peeks) == (6, 3)
    assert counts(s.errors) == {"EKEY": 1, "ECOST": 1}
    assert (s.breaker_opens, s.breaker_closes, s.connects, s.conns_dropped) == (0, 0, 0, 0)
    assert (s.latency_count, s.latency_sum) == (0, 0.0)   # no round trip in memory
    assert all(n == 0 for _, n in s.latency_buckets)


def test_stats_after_close_are_the_last_figures():
    with hirate.Limiter(capacity=2, rate=1e-6) as lim:
        for _ in range(3):
            lim.allow("k")
        before = lim.stats()
    after = lim.stats()
    assert after == before and counts(after.decisions) == {"local": 3}
    assert after.refused == 1
    with pytest.raises(hirate.ClosedError):
        lim.allow("k")
    lim.close()
    assert lim.stats() == before   # a refused call after close() counts nothing


def test_stats_add_up():
    a, b = hirate.Limiter(capacity=1, rate=1e-6), hirate.Limiter(capacity=5, rate=1e-6)
    for _ in range(3):
        a.allow("k")
        b.allow("k")
    b.peek("k")
    s = a.stats() + b.stats()
    assert counts(s.decisions) == {"local": 6}
    assert (s.refused, s.peeks) == (2, 1)
    assert hirate.Stats.sum([a.stats(), b.stats()]) == s
    assert hirate.Stats.sum([]) == hirate.Stats.zero()
    with pytest.raises(TypeError):
        s + 1


# ---- on a real redis-server


def test_redis_sequence_and_an_outage_of_one_breaker_period(own_redis):
    """10 allowed, 5 refused (no deny cache: all of them in Redis), then
    Redis hangs (SIGSTOP) for one call, which times out and opens the
    breaker; back, calls are the policy's until the backoff ends, and the
    first after it is the probe that closes the breaker."""
    lim = hirate.Limiter(own_redis.url, capacity=10, rate=1e-6, deny_cache=False,
                         on_error="closed", timeout=0.5, connect_timeout=5, functions=False)
    for _ in range(15):
        lim.allow("k")
    s = lim.stats()
    assert counts(s.decisions) == {"redis": 15}
    assert s.refused == 5 and counts(s.errors) == {}
    assert (s.connects, s.conns_dropped) == (1, 0)
    # A round trip a call, and one more: the first EVALSHA met NOSCRIPT,
    # and its EVAL went in a round trip of its own.
    assert s.latency_count == 16
    assert s.latency_buckets[-1] == (math.inf, 16)
    assert [n for _, n in s.latency_buckets] == sorted(n for _, n in s.latency_buckets)
    assert 0 < s.latency_sum <= 16 * 0.5

    own_redis.stop()
    try:
        d = lim.allow("k")
        assert (d.allowed, d.source, d.error) == (False, "fail_closed", "ETIMEDOUT")
    finally:
        own_redis.cont()
    s = lim.stats()
    assert counts(s.decisions) == {"redis": 15, "fail_closed": 1}
    assert s.refused == 6 and counts(s.errors) == {"ETIMEDOUT": 1}
    assert (s.breaker_opens, s.breaker_closes, s.conns_dropped) == (1, 0, 1)
    assert s.latency_count == 16   # the call that timed out had no reply

    policy = 0   # calls the policy answers until the backoff is over
    deadline = time.monotonic() + 20
    while True:
        d = lim.allow("k")
        if d.source == "redis":
            break
        assert (d.source, d.error) == ("fail_closed", "ETIMEDOUT")
        assert time.monotonic() < deadline
        policy += 1
        time.sleep(0.005)
    assert not d.allowed   # Redis' own answer: the bucket is still empty
    s = lim.stats()
    assert counts(s.decisions) == {"redis": 16, "fail_closed": 1 + policy}
    assert s.refused == 7 + policy
    assert counts(s.errors) == {"ETIMEDOUT": 1 + policy}
    assert (s.breaker_opens, s.breaker_closes, s.connects, s.conns_dropped) == (1, 1, 2, 1)
    assert s.latency_count == 17   # the probe; the script was still loaded


def test_the_deny_cache_answers_without_a_round_trip(own_redis):
    lim = hirate.Limiter(own_redis.url, capacity=2, rate=1e-6, timeout=5, connect_timeout=5,
                         functions=False)
    got = [(d.allowed, d.source) for d in (lim.allow("k") for _ in range(6))]
    # the second reply, 0 left, already foretells the refusals
    assert got == [(True, "redis")] * 2 + [(False, "cache")] * 4
    s = lim.stats()
    assert counts(s.decisions) == {"redis": 2, "cache": 4}
    assert s.refused == 4
    assert s.latency_count == 3   # 2 calls, and the EVAL after NOSCRIPT


def test_async_limiter_counts_its_own_round_trips(own_redis):
    async def main():
        async with hirate.AsyncLimiter(own_redis.url, capacity=10, rate=1e-6,
                                       deny_cache=False, timeout=5, connect_timeout=5,
                                       functions=False) as lim:
            for _ in range(15):
                await lim.allow("k")
            await lim.peek("k")
            await lim.allow_many([("a", 1), ("b", 1)])
            return lim, lim.stats()

    lim, s = asyncio.run(main())
    assert counts(s.decisions) == {"redis": 17}
    assert (s.refused, s.peeks) == (5, 1)
    assert s.connects == 1
    # the 15 allows, the peek and the batch a round trip each, and the EVAL
    # after NOSCRIPT
    assert s.latency_count == 18
    assert lim.stats() == s   # closed: the last figures


def test_async_limiter_outage_of_one_breaker_period(own_redis):
    async def main():
        lim = hirate.AsyncLimiter(own_redis.url, capacity=1000, rate=100.0, on_error="closed",
                                  timeout=0.1, connect_timeout=5, functions=False)
        assert (await lim.allow("k")).source == "redis"
        own_redis.stop()
        try:
            d = await lim.allow("k")
            assert (d.source, d.error) == ("fail_closed", "ETIMEDOUT")
        finally:
            own_redis.cont()
        policy, deadline = 0, time.monotonic() + 20
        while (await lim.allow("k")).source != "redis":
            assert time.monotonic() < deadline
            policy += 1
            await asyncio.sleep(0.005)
        await lim.close()
        return policy, lim.stats()

    policy, s = asyncio.run(main())
    assert counts(s.decisions) == {"redis": 2, "fail_closed": 1 + policy}
    assert s.refused == 1 + policy
    assert counts(s.errors) == {"ETIMEDOUT": 1 + policy}
    assert (s.breaker_opens, s.breaker_closes) == (1, 1)
    # the connection that timed out was closed, and the probe made a new one
    assert (s.connects, s.conns_dropped) == (2, 1)
    assert s.latency_count == 3   # the first call's two (NOSCRIPT), the probe


def test_async_memory_limiter_counts_as_limiter_does():
    async def main():
        lim = hirate.AsyncLimiter(capacity=1, rate=1e-6)
        await lim.allow("k")
        await lim.allow("k")
        await lim.peek("k")
        await lim.close()
        return lim.stats()

    s = asyncio.run(main())
    assert counts(s.decisions) == {"local": 2}
    assert (s.refused, s.peeks) == (1, 1)


# ---- the web integrations: one Stats for all their limiters


def test_flask_rate_limiter_stats_sum_its_limiters_and_survive_close():
    flask = pytest.importorskip("flask")
    from hirate.flask import RateLimiter

    app = flask.Flask(__name__)
    limiter = RateLimiter(app, default_limits="2/minute")

    @app.get("/a")
    def a():
        return "a"

    @app.get("/b")
    @limiter.limit("1/minute; 100/day")   # other bands: a limiter of its own
    def b():
        return "b"

    client = app.test_client()
    statuses = [client.get(p).status_code for p in ["/a", "/a", "/a", "/b", "/b"]]
    assert statuses == [200, 200, 429, 200, 429]
    assert len(app.extensions["hirate"][limiter].limiters) == 2
    s = limiter.stats()   # no app context needed
    assert counts(s.decisions) == {"local": 5} and s.refused == 2
    with app.app_context():
        assert limiter.stats() == s == limiter.stats(app)
        limiter.close()
    assert limiter.stats() == s   # the closed limiters' figures stay
    assert client.get("/a").status_code == 200   # a new limiter, new buckets
    assert counts(limiter.stats().decisions) == {"local": 6}
    limiter.init_app(app)   # set up again: the figures carry over
    assert counts(limiter.stats().decisions) == {"local": 6}


def test_asgi_rate_limiter_stats_sum_its_limiters_and_survive_close():
    pytest.importorskip("starlette")
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from hirate.asgi import RateLimiter, RateLimitMiddleware

    limiter = RateLimiter(default_limits="2/minute", routes={"/b": "1/minute; 100/day"})

    async def ok(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/a", ok), Route("/b", ok)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter)
    with TestClient(app) as client:
        statuses = [client.get(p).status_code for p in ["/a", "/a", "/a", "/b", "/b"]]
        assert statuses == [200, 200, 429, 200, 429]
        assert len(limiter._limiters) == 2
        s = limiter.stats()
        assert counts(s.decisions) == {"local": 5} and s.refused == 2
    # the app's shutdown closed them: the figures stay
    assert limiter._limiters == {} and limiter.stats() == s
