"""Redis Sentinel through the Python API: redis+sentinel:// URLs with Limiter
and AsyncLimiter against a real group (tests/support/redis_sentinel.py).
Exactly the capacity passes through the master the sentinels name; a
failover under load (SENTINEL FAILOVER, and a kill -9 of the master) brings
the decisions back to source "redis" on the new master within 2 s of the
switch (the bound of the issue; the switch is when the harness sees every
sentinel name the new master and it says ROLE master); the core's INFO lines
reach the logger "hirate"; an unknown service and a wrong sentinel password
raise their classes under every policy, and the sentinels' password shows
nowhere. Flask and ASGI take the URL and the sentinels' credentials as they
take every other setting.

The session's group (`sentinel`) is never failed over: a group that was
takes its sentinels ~20 s to settle again, so each failover test starts a
group of its own."""

import asyncio
import logging
import re
import threading
import time

import pytest

import hirate
from redis_sentinel import SentinelGroup

pytestmark = pytest.mark.timeout(120)

# Patience for a busy machine, so that a slow reply is not a fallback.
PATIENT = dict(timeout=5, connect_timeout=5)
# Under a failover: short enough that a call on the dead or demoted master
# gives way soon, long enough for a loaded machine.
BRISK = dict(timeout=0.5, connect_timeout=0.5)
# The bound, from the switch to the end of the first decision on the
# new master. The harness sees the switch a few ms late at most (it polls
# every 10 ms), which the bound absorbs; runs here take under 0.1 s.
BOUND_S = 2.0
SENTINEL_PW = "s3nt1nel-Pw"


def fcalls(g, node):
    """The FCALLs a node ran, by its INFO commandstats."""
    m = re.search(r"^cmdstat_fcall:calls=(\d+)", g.cli(node.port, "INFO", "commandstats"), re.M)
    return int(m.group(1)) if m else 0


def sentinel_records(caplog):
    return [r for r in caplog.records if r.name == "hirate" and r.levelno == logging.INFO]


# ------------------------------------------------------------------ counting

def test_exactly_the_capacity_through_sentinel(sentinel):
    lim = hirate.Limiter(sentinel.url, capacity=5, rate=0.001, **PATIENT)
    try:
        assert lim.is_sentinel and not lim.is_cluster
        got = [lim.allow("alice") for _ in range(8)]
        assert [d.allowed for d in got] == [True] * 5 + [False] * 3
        assert [d.remaining for d in got[:5]] == [4, 3, 2, 1, 0]
        assert {d.source for d in got} <= {"redis", "cache"}
        assert [d.source for d in got[:5]] == ["redis"] * 5
        stats = lim._stats()
        assert stats["master_changes"] == 1   # the first discovery
        assert stats["sentinel_queries"] >= 1
        assert stats["policy"] == 0
        # The bucket is in the master the sentinels name.
        assert sentinel.cli(sentinel.master.port, "EXISTS", "rl:alice").strip() == "1"
    finally:
        lim.close()


def test_exactly_the_capacity_through_sentinel_async(sentinel):
    async def main():
        lim = hirate.AsyncLimiter(sentinel.url, capacity=5, rate=0.001, **PATIENT)
        try:
            got = [await lim.allow("bob") for _ in range(7)]
            batch = await lim.allow_many([("carol", 3), ("carol", 3), ("dave", 1)])
            return got, batch, lim._stats()
        finally:
            await lim.close()

    got, batch, stats = asyncio.run(main())
    assert [d.allowed for d in got] == [True] * 5 + [False] * 2
    assert [d.source for d in got[:5]] == ["redis"] * 5
    assert [(d.allowed, d.remaining, d.source) for d in batch] == [
        (True, 2, "redis"), (False, 2, "redis"), (True, 4, "redis")]
    assert stats["master_changes"] == 1 and stats["sentinel_queries"] >= 1
    assert stats["policy"] == 0
    port = sentinel.master.port
    assert sentinel.cli(port, "EXISTS", "rl:bob", "rl:carol", "rl:dave").strip() == "3"


def test_tls_to_the_sentinels_and_the_master(certs):
    # rediss+sentinel://: the tls_* options hold for the sentinels and the
    # master alike (TLS-only ports; the certificate names localhost).
    with SentinelGroup(replicas=0, sentinels=1, tls=certs) as g:
        assert g.url.startswith("rediss+sentinel://localhost:")
        tls = dict(tls_ca_file=certs / "ca.crt", **PATIENT)
        lim = hirate.Limiter(g.url, capacity=3, rate=0.001, **tls)
        try:
            assert [(d.allowed, d.source) for d in (lim.allow("k") for _ in range(3))] == [
                (True, "redis")] * 3
        finally:
            lim.close()

        async def main():
            async with hirate.AsyncLimiter(g.url, capacity=3, rate=0.001, **tls) as a:
                return await a.allow("k")

        d = asyncio.run(main())
        assert (d.allowed, d.remaining, d.source) == (False, 0, "redis")   # the same bucket


# ----------------------------------------------------------------- failover

class Load:
    """Calls under way while a failover happens. Each call is kept as
    (start, end, master_changes when it started, source); a call that
    started when the core already knew the new master (master_changes 2)
    and was decided by Redis was decided by the new master."""

    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def add(self, start, end, changes, source):
        with self.lock:
            self.calls.append((start, end, changes, source))

    def back_on_new_master(self):
        """When the first call decided by the new master ended."""
        ends = [end for _, end, changes, source in self.calls
                if changes == 2 and source == "redis"]
        return min(ends) if ends else None

    def sources_after(self, t):
        return {source for start, _, _, source in self.calls if start >= t}


def run_threads(lim, load, n=4):
    def worker(i):
        while not load.stop.is_set():
            changes = lim._stats()["master_changes"]
            start = time.monotonic()
            d = lim.allow(f"load:{i}")
            load.add(start, time.monotonic(), changes, d.source)
            time.sleep(0.005)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def check_back_in_time(g, lim, load, old, new, switch):
    """The decisions came back to Redis on the new master within the bound,
    and stayed there."""
    back = load.back_on_new_master()
    assert back is not None, "no decision on the new master"
    assert back - switch < BOUND_S, (back - switch, "s after the switch")
    assert load.sources_after(back) == {"redis"}
    stats = lim._stats()
    assert stats["master_changes"] == 2
    # The promoted replica has the function library already (replicated): no
    # FUNCTION LOAD and no script after the failover.
    assert stats["function_loads"] == 1
    assert (stats["evalsha"], stats["eval"]) == (0, 0)
    assert new.port != old.port
    # The new master ran calls of its own (as a replica it only applied the
    # old master's writes: the calls are not replicated, their effects are).
    assert fcalls(g, new) > 0


def test_failover_under_load_threads(caplog):
    caplog.set_level(logging.INFO, logger="hirate")
    with SentinelGroup(replicas=1, sentinels=3) as g:
        lim = hirate.Limiter(g.url, capacity=10 ** 9, rate=1000.0, **BRISK)
        load = Load()
        old = g.master
        assert lim.allow("warm").source == "redis"
        threads = run_threads(lim, load)
        try:
            time.sleep(0.3)
            g.failover()
            new, switch = g.wait_switch(old, 30)
            deadline = switch + BOUND_S + 1.0
            while time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            load.stop.set()
            for t in threads:
                t.join()
        check_back_in_time(g, lim, load, old, new, switch)
        lim.close()
    msgs = [r.getMessage() for r in sentinel_records(caplog)]
    assert [m for m in msgs if " is " in m] == [
        f"sentinel: the master of 'mymaster' is 127.0.0.1:{old.port}"]
    assert [m for m in msgs if "moved from" in m] == [
        f"sentinel: the master of 'mymaster' moved from 127.0.0.1:{old.port} to "
        f"127.0.0.1:{new.port}"]


def test_failover_under_load_tasks(caplog):
    caplog.set_level(logging.INFO, logger="hirate")

    async def main(g):
        lim = hirate.AsyncLimiter(g.url, capacity=10 ** 9, rate=1000.0, **BRISK)
        load = Load()
        old = g.master
        assert (await lim.allow("warm")).source == "redis"

        async def worker(i):
            while not load.stop.is_set():
                changes = lim._stats()["master_changes"]
                start = time.monotonic()
                d = await lim.allow(f"load:{i}")
                load.add(start, time.monotonic(), changes, d.source)
                await asyncio.sleep(0.005)

        tasks = [asyncio.ensure_future(worker(i)) for i in range(8)]
        try:
            await asyncio.sleep(0.3)
            # The harness blocks: in a thread, so that the tasks go on.
            await asyncio.to_thread(g.failover)
            new, switch = await asyncio.to_thread(g.wait_switch, old, 30)
            await asyncio.sleep(max(switch + BOUND_S + 1.0 - time.monotonic(), 0))
        finally:
            load.stop.set()
            await asyncio.gather(*tasks)
        check_back_in_time(g, lim, load, old, new, switch)
        await lim.close()
        return old, new

    with SentinelGroup(replicas=1, sentinels=3) as g:
        old, new = asyncio.run(main(g))
    msgs = [r.getMessage() for r in sentinel_records(caplog)]
    assert [m for m in msgs if " is " in m] == [
        f"sentinel: the master of 'mymaster' is 127.0.0.1:{old.port}"]
    assert [m for m in msgs if "moved from" in m] == [
        f"sentinel: the master of 'mymaster' moved from 127.0.0.1:{old.port} to "
        f"127.0.0.1:{new.port}"]


def test_master_killed_under_load_threads():
    # The sentinels see the master down after down_after_ms (1 s), then
    # elect and promote; meanwhile the policy ("local") decides.
    with SentinelGroup(replicas=1, sentinels=3) as g:
        lim = hirate.Limiter(g.url, capacity=10 ** 9, rate=1000.0, **BRISK)
        load = Load()
        assert lim.allow("warm").source == "redis"
        threads = run_threads(lim, load)
        try:
            time.sleep(0.3)
            old = g.kill_master()
            new, switch = g.wait_switch(old, 30)
            deadline = switch + BOUND_S + 1.0
            while time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            load.stop.set()
            for t in threads:
                t.join()
        check_back_in_time(g, lim, load, old, new, switch)
        assert "local" in {source for _, _, _, source in load.calls}   # the outage was seen
        lim.close()


# -------------------------------------------------------------------- errors

@pytest.mark.parametrize("url,kw,name,words", [
    ("redis://127.0.0.1", dict(sentinel_password="pw"), "EOPTION",
     "sentinel_password is set, but the URL is not redis+sentinel://"),
    ("redis://127.0.0.1", dict(sentinel_username="u"), "EOPTION",
     "sentinel_username is set, but the URL is not redis+sentinel://"),
    ("redis+sentinel://127.0.0.1", {}, "EURL", "names the master after the sentinels"),
])
def test_sentinel_options_and_urls_are_checked(url, kw, name, words):
    for make in (hirate.Limiter, hirate.AsyncLimiter):
        with pytest.raises(hirate.ConfigError) as info:
            make(url, capacity=1, rate=1.0, **kw)
        assert info.value.name == name and words in str(info.value), str(info.value)


def test_the_urls_password_and_the_sentinels_never_show():
    url = "redis+sentinel://app:master-pw@127.0.0.1,127.0.0.2:26380/mymaster/2"
    for make in (hirate.Limiter, hirate.AsyncLimiter):
        lim = make(url, capacity=1, rate=1.0, sentinel_username="sent",
                   sentinel_password=SENTINEL_PW)
        assert lim.url == "redis+sentinel://app:***@127.0.0.1,127.0.0.2:26380/mymaster/2"
        assert "master-pw" not in repr(lim) and SENTINEL_PW not in repr(lim)
        if make is hirate.Limiter:
            assert lim.is_sentinel
            lim.close()
        else:
            asyncio.run(lim.close())


@pytest.fixture(scope="module")
def guarded():
    """One sentinel with a password of its own, and its master."""
    g = SentinelGroup(replicas=0, sentinels=1, sentinel_password=SENTINEL_PW)
    yield g
    g.stop()


@pytest.mark.parametrize("on_error", ["local", "open", "closed"])
def test_an_unknown_service_is_a_reply_error_under_every_policy(sentinel, on_error):
    url = sentinel.url.replace("/mymaster", "/nosuch")
    lim = hirate.Limiter(url, capacity=5, rate=1.0, on_error=on_error, **PATIENT)
    try:
        with pytest.raises(hirate.BackendError) as info:
            lim.allow("k")
    finally:
        lim.close()
    assert type(info.value) is hirate.BackendError
    assert (info.value.name, info.value.code) == ("EREPLY", hirate._hirate.EREPLY)
    m = re.fullmatch(r"sentinel 127\.0\.0\.1:(\d+) knows no master named 'nosuch'",
                     str(info.value))
    assert m, str(info.value)
    assert int(m.group(1)) in {s.port for s in sentinel.sentinels}


def test_an_unknown_service_async(sentinel):
    url = sentinel.url.replace("/mymaster", "/nosuch")

    async def main():
        lim = hirate.AsyncLimiter(url, capacity=5, rate=1.0, on_error="open", **PATIENT)
        try:
            with pytest.raises(hirate.BackendError) as info:
                await lim.allow("k")
            return info.value
        finally:
            await lim.close()

    e = asyncio.run(main())
    assert e.name == "EREPLY"
    assert re.fullmatch(r"sentinel 127\.0\.0\.1:\d+ knows no master named 'nosuch'", str(e))


def test_the_sentinels_password(guarded):
    lim = hirate.Limiter(guarded.url, capacity=3, rate=0.001, sentinel_password=SENTINEL_PW,
                         **PATIENT)
    try:
        assert [lim.allow("k").allowed for _ in range(4)] == [True] * 3 + [False]
        for text in (repr(lim), str(lim.url)):
            assert SENTINEL_PW not in text
    finally:
        lim.close()


@pytest.mark.parametrize("on_error", ["local", "open", "closed"])
def test_a_wrong_sentinel_password_is_an_auth_error(guarded, on_error, caplog):
    caplog.set_level(logging.DEBUG, logger="hirate")
    wrong = SENTINEL_PW + "-not"
    lim = hirate.Limiter(guarded.url, capacity=3, rate=1.0, on_error=on_error,
                         sentinel_password=wrong, **PATIENT)
    try:
        with pytest.raises(hirate.AuthError) as info:
            lim.allow("k")
        assert (info.value.name, info.value.code) == ("EAUTH", hirate._hirate.EAUTH)
        texts = [str(info.value), repr(info.value), repr(lim), str(lim.url)]
        texts += [r.getMessage() for r in caplog.records]
        assert not [t for t in texts if SENTINEL_PW in t]
    finally:
        lim.close()


def test_no_sentinel_password_where_one_is_needed(guarded):
    lim = hirate.Limiter(guarded.url, capacity=3, rate=1.0, on_error="open", **PATIENT)
    try:
        with pytest.raises(hirate.AuthError):
            lim.allow("k")
    finally:
        lim.close()


def test_a_wrong_sentinel_password_async(guarded):
    async def main():
        lim = hirate.AsyncLimiter(guarded.url, capacity=3, rate=1.0,
                                  sentinel_password="nope-" + SENTINEL_PW, **PATIENT)
        try:
            with pytest.raises(hirate.AuthError) as info:
                await lim.allow("k")
            assert SENTINEL_PW not in repr(lim)
            return info.value
        finally:
            await lim.close()

    e = asyncio.run(main())
    assert e.name == "EAUTH" and SENTINEL_PW not in str(e)


# ---------------------------------------------------------- web integrations

def test_flask_with_a_sentinel_url(guarded):
    flask = pytest.importorskip("flask")
    from hirate.flask import RateLimiter

    guarded.command(guarded.master, "FLUSHALL")
    app = flask.Flask(__name__)
    app.testing = True
    app.config.update(HIRATE_URL=guarded.url, HIRATE_SENTINEL_PASSWORD=SENTINEL_PW,
                      HIRATE_TIMEOUT=5, HIRATE_CONNECT_TIMEOUT=5)
    limiter = RateLimiter(app)

    @app.get("/x")
    @limiter.limit(2, 0.001)
    def x():
        return "ok"

    client = app.test_client()
    assert [client.get("/x").status_code for _ in range(3)] == [200, 200, 429]
    assert SENTINEL_PW not in repr(app.extensions["hirate"][limiter])
    assert len(guarded.command(guarded.master, "KEYS", "rl:*")) == 1   # its bucket, in Redis
    limiter.close(app)


def test_asgi_with_a_sentinel_url(guarded):
    pytest.importorskip("fastapi")
    from fastapi import FastAPI
    from starlette.testclient import TestClient

    from hirate.asgi import Limit, RateLimiter, RateLimitMiddleware

    guarded.command(guarded.master, "FLUSHALL")
    limiter = RateLimiter(url=guarded.url, sentinel_password=SENTINEL_PW,
                          routes={"/y": Limit(2, 0.001)}, **PATIENT)
    assert SENTINEL_PW not in repr(limiter)
    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, limiter=limiter)

    @app.get("/y")
    async def y():
        return {"ok": True}

    with TestClient(app) as client:
        assert [client.get("/y").status_code for _ in range(3)] == [200, 200, 429]
    assert len(guarded.command(guarded.master, "KEYS", "rl:*")) == 1
