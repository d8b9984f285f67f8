"""Refunds against a real redis-server: Limiter.refund and AsyncLimiter.refund
(over the event loop's own connections) give tokens back in every band,
capped at the capacity, forget the deny cache's refusal, follow the failure
policy; Flask and ASGI refund one client's buckets by route, counted exactly
in a route that refunds a failed upstream call.
"""

import asyncio

import pytest
from fastapi import FastAPI
from flask import Flask, request
from starlette.testclient import TestClient

import hirate
from hirate import asgi
from hirate import flask as hflask

pytestmark = pytest.mark.timeout(60)

DOWN = "redis://127.0.0.1:1"


def test_refund_gives_back_capped_and_forgets_the_refusal(redis):
    with hirate.Limiter(redis.url, capacity=3, rate=0.001, prefix="rf:") as lim:
        d = lim.refund("fresh", 2)                 # a fresh key is full and stays so
        assert (d.allowed, d.remaining, d.source, d.reset_after) == (True, 3, "redis", 0.0)
        assert redis.command("EXISTS", "rf:fresh") == 0
        assert lim.allow("k", 3).remaining == 0
        d = lim.allow("k")
        assert (d.allowed, d.source) == (False, "cache")
        d = lim.refund("k", tokens=2)
        assert (d.allowed, d.remaining, d.source, d.retry_after) == (True, 2, "redis", 0.0)
        got = [lim.allow("k") for _ in range(3)]
        assert [(g.allowed, g.remaining, g.source) for g in got] == [
            (True, 1, "redis"), (True, 0, "redis"), (False, 0, "cache")]
        assert lim.refund("k", 100).remaining == 3
        assert redis.command("EXISTS", "rf:k") == 0  # full again: the key is gone
        assert lim.refund("k", 0).remaining == 3
        with pytest.raises(hirate.ConfigError) as e:
            lim.refund("k", -1)
        assert e.value.name == "ECOST"
        assert "refund cost must be a whole number" in str(e.value)


def test_refund_in_every_band(redis):
    with hirate.Limiter(redis.url, limits="5/second; 8/day", prefix="rfb:") as lim:
        assert [b.remaining for b in lim.allow("k", 4).bands] == [1, 4]
        d = lim.refund("k", 3)
        assert [b.remaining for b in d.bands] == [4, 7]
        assert (d.allowed, d.remaining, d.band) == (True, 4, 0)
        assert [b.remaining for b in lim.refund("k", 50).bands] == [5, 8]


def test_refund_in_an_outage_follows_the_policy():
    with hirate.Limiter(DOWN, capacity=10, rate=0.001, on_error="local") as lim:
        assert lim.allow("k", 4).remaining == 6
        d = lim.refund("k", 3)
        assert (d.source, d.error, d.allowed, d.remaining) == ("local", "ECONNECT", True, 9)
    for policy in ("open", "closed"):
        with hirate.Limiter(DOWN, capacity=10, rate=0.001, on_error=policy) as lim:
            with pytest.raises(hirate.Error) as e:
                lim.refund("k")
            assert e.value.name == "ECONNECT"
            assert str(e.value) == ("the refund was not made: Redis failed (cannot connect "
                                    "to Redis) and on_error is '%s'" % policy)


def test_async_refund_on_the_loops_connections(redis):
    async def main():
        async with hirate.AsyncLimiter(redis.url, capacity=3, rate=0.001,
                                       prefix="arf:") as lim:
            assert (await lim.allow("k", 3)).remaining == 0
            assert (await lim.allow("k")).source == "cache"
            d = await lim.refund("k", 2)
            assert (d.allowed, d.remaining, d.source) == (True, 2, "redis")
            got = [await lim.allow("k") for _ in range(3)]
            assert [(g.allowed, g.remaining) for g in got] == [(True, 1), (True, 0), (False, 0)]
            assert (await lim.refund("k", 9)).remaining == 3
            with pytest.raises(hirate.ConfigError):
                await lim.refund("k", -1)
            return lim._stats()

    stats = asyncio.run(main())
    assert stats["evalsha"] + stats["fcall"] + stats["eval"] >= 5
    async def down():
        async with hirate.AsyncLimiter(DOWN, capacity=3, rate=1, on_error="open") as lim:
            with pytest.raises(hirate.Error) as e:
                await lim.refund("k")
            return e.value.name
    assert asyncio.run(down()) == "ECONNECT"


# ----------------------------------------------------------------- Flask

def flask_app(server, upstream):
    app = Flask(__name__)
    app.config.update(HIRATE_URL=server.url)
    limiter = hflask.RateLimiter(app, key=hflask.key_header("X-User"))

    @app.get("/fetch")
    @limiter.limit("3/hour")
    def fetch():
        if not upstream.pop(0):
            # The upstream failed: the request paid for nothing.
            limiter.refund("fetch", key=request.headers["X-User"])
            return "upstream failed", 502
        return "fetched"

    return app, limiter


def test_flask_route_refunds_a_failed_upstream_call_exactly(redis):
    upstream = [True, False, False, True, False, True, True]
    app, limiter = flask_app(redis, upstream)
    c = app.test_client()
    user = {"X-User": "alice"}
    got = [c.get("/fetch", headers=user).status_code for _ in range(8)]
    # 3 tokens: the three failures gave theirs back, so three successes
    # pass, and the calls after them find none (the view never runs).
    assert got == [200, 502, 502, 200, 502, 200, 429, 429]
    assert upstream == [True]
    with app.app_context():
        assert limiter.peek("fetch", key="alice").checks[0][1].remaining == 0
        res = limiter.refund("fetch", key="alice", tokens=2)
        assert [(lim.name, d.remaining) for lim, d in res.checks] == [("3-per-3600s", 2)]
    assert c.get("/fetch", headers={"X-User": "bob"}).status_code == 200
    # Outside an app context, with app=, and capped at the capacity.
    res = limiter.refund("fetch", key="alice", tokens=10, app=app)
    assert res.checks[0][1].remaining == 3


# ------------------------------------------------------------------ ASGI

def test_asgi_refund_one_client_by_route(redis):
    limiter = asgi.RateLimiter(url=redis.url, key=asgi.key_header("X-User"),
                               routes={"/search": "2/hour"})
    app = FastAPI()
    app.add_middleware(asgi.RateLimitMiddleware, limiter=limiter)

    @app.get("/search")
    async def search():
        return "found"

    with TestClient(app) as c:
        alice = {"X-User": "alice"}
        assert [c.get("/search", headers=alice).status_code for _ in range(3)] == [200, 200, 429]
        res = c.portal.call(lambda: limiter.refund("/search", key="alice"))
        assert [(lim.name, d.remaining) for lim, d in res.checks] == [("2-per-3600s", 1)]
        assert [c.get("/search", headers=alice).status_code for _ in range(2)] == [200, 429]
        res = c.portal.call(lambda: limiter.refund("/search", key="alice", tokens=5))
        assert res.checks[0][1].remaining == 2
