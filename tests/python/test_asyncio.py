"""hirate.AsyncLimiter: the C core's decisions over the running event loop's
own non-blocking connections.

Every test runs its coroutines with asyncio.run (a loop of its own) under a
hard deadline, and talks to a real redis-server: the shared one (`redis`) or
one of its own (`own_redis`) that it may stop, kill or restart. A scripted
server appears only for what Redis will not do (bytes after a reply).
"""

import asyncio
import json
import math
import os
import socket
import threading
import time

import pytest

import hirate
from redis_server import RedisServer

VECTORS = os.path.join(os.path.dirname(__file__), "..", "vectors", "token_bucket.json")

# Generous I/O timeouts for tests that are about decisions, not about
# timeouts: a loaded 2-core CI machine must not turn them into fallbacks.
SLOW = {"connect_timeout": 5.0, "timeout": 5.0}


def run(coro, limit=60.0):
    """Runs coro on a fresh event loop; a hang fails the test instead of CI."""
    return asyncio.run(asyncio.wait_for(coro, limit))


def info(server, section):
    """INFO section as a dict of str -> str."""
    text = server.command("INFO", section)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def calls(server, command):
    """How many times the server ran command since its stats were reset
    (INFO commandstats; the `redis` fixture's server is shared)."""
    stats = info(server, "commandstats").get("cmdstat_" + command.lower(), "")
    fields = dict(kv.split("=") for kv in stats.split(",") if "=" in kv)
    return int(fields.get("calls", 0))


def clients(server):
    return int(info(server, "clients")["connected_clients"])


# ---------------------------------------------------------------- the vectors

def vector_key(spec):
    if isinstance(spec, str):
        return spec.encode()
    if "hex" in spec:
        return bytes.fromhex(spec["hex"])
    return (spec["repeat"] * spec["times"]).encode()


def seconds(us):
    return math.inf if us == "never" else us / 1_000_000


def vector_limit(config):
    """capacity and rate, or a case's bands as limits=[(capacity, rate[, name])]."""
    def rate_of(rate):
        return float(rate) if isinstance(rate, str) else rate
    if "bands" in config:
        return dict(limits=[(b["capacity"], rate_of(b["rate"]))
                            + ((b["name"],) if "name" in b else ()) for b in config["bands"]])
    return dict(capacity=config["capacity"], rate=rate_of(config["rate"]))


def vector_figures(d, want, t_us, where):
    got = (d.allowed, d.remaining, d.retry_after, d.reset_after, d.limit, d.time)
    assert got == (want["allowed"], want["remaining"], seconds(want["retry_after_us"]),
                   seconds(want["reset_after_us"]), want["limit"], t_us / 1_000_000), where


async def run_vectors(url, deny_cache, prefix):
    """Runs every case; returns (steps run, refusals the deny cache gave).
    A case of several bands checks each band's figures (Decision.bands); a
    "reconfigure" step goes on with a new limiter of its config on the same
    prefix, on Redis only (a memory backend runs no case that holds one).
    Both kinds must have run."""
    with open(VECTORS) as f:
        doc = json.load(f)
    assert doc["version"] == 1
    steps = cache_hits = band_steps = reconfigures = 0
    for case in doc["cases"]:
        cid, config = case["id"], case["config"]
        if url is None and case.get("redis_only", False):
            continue

        def limiter(config):
            return hirate.AsyncLimiter(url, prefix=f"{prefix}{cid}:", deny_cache=deny_cache,
                                       **vector_limit(config), **SLOW)
        if "config_error" in case:
            with pytest.raises(hirate.ConfigError) as e:
                limiter(config)
            assert "HIRATE_" + e.value.name == case["config_error"], cid
            continue
        lim = limiter(config)
        try:
            for i, step in enumerate(case["steps"]):
                where = f"{cid} step {i}"
                steps += 1
                if step["op"] == "reconfigure":
                    await lim.close()
                    lim = limiter(step["config"])
                    reconfigures += 1
                    continue
                key, cost = vector_key(step["key"]), step.get("cost", 1)
                if step["op"] == "reset":
                    assert await lim.reset(key) is None, where
                    continue
                spend = hirate._hirate.OP_REFUND if step["op"] == "refund" else step["op"] == "allow"
                if "expect_error" in step:
                    with pytest.raises(hirate.Error) as e:
                        await lim._decide([(key, cost)], spend, step["t_us"])
                    assert "HIRATE_" + e.value.name == step["expect_error"], where
                    assert str(e.value), where
                    continue
                d, = await lim._decide([(key, cost)], spend, step["t_us"])
                want = step["expect"]
                vector_figures(d, want, step["t_us"], where)
                assert d.band == want.get("band", 0), where
                if "bands" in want:
                    band_steps += 1
                    assert len(d.bands) == len(want["bands"]), where
                    for j, (b, wb) in enumerate(zip(d.bands, want["bands"])):
                        vector_figures(b, wb, step["t_us"], f"{where} band {j}")
                        assert (b.band, b.source) == (j, d.source), where
                else:
                    assert d.bands == (d,), where
                assert d.error is None, where
                if url is None:
                    assert d.source == "local", where
                elif d.source == "cache":
                    assert deny_cache and not d.allowed, where
                    cache_hits += 1
                else:
                    assert d.source == "redis", where
        finally:
            await lim.close()
    assert band_steps > 50
    assert (reconfigures > 0) is (url is not None)
    return steps, cache_hits


def test_every_vector_case_through_redis_gives_the_exact_decision(redis):
    steps, hits = run(run_vectors(redis.url, False, "vec:"), 120)
    assert steps > 200
    assert hits == 0


def test_every_vector_case_with_the_deny_cache_gives_redis_own_answers(redis):
    steps, hits = run(run_vectors(redis.url, True, "vc:"), 120)
    assert steps > 200
    assert hits > 20   # refusals answered without a round trip, equal to Redis'
    # Every key the vectors left behind is under the prefix and has a TTL
    # (the script's one write). Counted inside Redis: some keys are not UTF-8.
    keys = redis.command("KEYS", "*")
    assert keys and all(key.startswith("vc:") for key in keys)
    assert redis.command("EVAL", "local n = 0 for _, k in ipairs(redis.call('KEYS', '*')) do "
                         "if redis.call('PTTL', k) <= 0 then n = n + 1 end end return n", 0) == 0


def test_every_vector_case_in_memory():
    steps, _ = run(run_vectors(None, True, "vec:"))
    assert steps > 200


# ------------------------------------------------------------ the plain calls

def test_allow_peek_reset_on_redis(redis):
    redis.command("CONFIG", "RESETSTAT")

    async def main():
        # The EVALSHA path, whose calls the server counts (functions=False).
        async with hirate.AsyncLimiter(redis.url, capacity=3, rate=0.001, functions=False,
                                       **SLOW) as lim:
            got = [await lim.allow("alice") for _ in range(4)]
            assert [d.allowed for d in got] == [True, True, True, False]
            assert [d.remaining for d in got] == [2, 1, 0, 0]
            # The third reply showed an empty bucket: the deny cache refuses
            # the fourth without a round trip, as Redis would.
            assert [d.source for d in got] == ["redis", "redis", "redis", "cache"]
            assert 999.0 < got[3].retry_after <= 1000.0   # a token at 0.001/s
            # Three round trips (the first met NOSCRIPT and sent EVAL).
            assert (calls(redis, "evalsha"), calls(redis, "eval")) == (3, 1)
            d = await lim.peek("bob", 2)
            assert (d.allowed, d.remaining, d.source) == (True, 3, "redis")
            assert redis.command("EXISTS", "rl:bob") == 0   # a peek writes nothing
            assert await lim.reset("alice") is None
            assert redis.command("EXISTS", "rl:alice") == 0
            # The reset reached the deny cache too: Redis decides again.
            d = await lim.allow("alice", 3)
            assert (d.allowed, d.remaining, d.source) == (True, 0, "redis")
            d = await lim.allow(b"\x00\xff\r\n{}", 0)
            assert (d.allowed, d.remaining) == (True, 3)
    run(main())


def test_a_unix_socket_url(tmp_path):
    path = str(tmp_path / "redis.sock")
    server = RedisServer(["--unixsocket", path, "--unixsocketperm", "700"])
    try:
        async def main():
            async with hirate.AsyncLimiter(f"unix://{path}?db=2", capacity=5, rate=0.001,
                                           **SLOW) as lim:
                got = await lim.allow_many([("k", 2), ("k", 2), ("k", 2)])
                assert [(d.allowed, d.remaining, d.source) for d in got] == [
                    (True, 3, "redis"), (True, 1, "redis"), (False, 1, "redis")]
                await lim.reset("k")
                assert (await lim.peek("k")).remaining == 5
        run(main())
    finally:
        server.close()


def test_reset_also_forgets_the_local_fallback_bucket(own_redis):
    own_redis.kill()

    async def main():
        async with hirate.AsyncLimiter(own_redis.url, capacity=2, rate=0.001,
                                       on_error="local") as lim:
            got = [await lim.allow("k") for _ in range(3)]
            assert [(d.allowed, d.source) for d in got] == [(True, "local"), (True, "local"),
                                                          (False, "local")]
            # The DEL cannot reach Redis, and says so; the local bucket is
            # forgotten all the same, as hirate_reset() forgets it.
            with pytest.raises(hirate.BackendError) as e:
                await lim.reset("k")
            assert e.value.name == "ECONNECT"
            d = await lim.allow("k")
            assert (d.allowed, d.remaining, d.source, d.error) == (True, 1, "local", "ECONNECT")
    run(main())


def test_allow_many_is_one_round_trip_in_order(redis):
    redis.command("CONFIG", "RESETSTAT")

    async def main():
        async with hirate.AsyncLimiter(redis.url, capacity=10, rate=0.001, **SLOW) as lim:
            await lim.allow("warm")   # a fresh server's first call loads the library
            before = calls(redis, "fcall")
            got = await lim.allow_many([("a", 3), (b"b", 11), ("a", 4), (memoryview(b"c"), 0)])
            assert calls(redis, "fcall") - before == 4
            assert [d.allowed for d in got] == [True, False, True, True]
            assert [d.remaining for d in got] == [7, 10, 3, 10]
            assert got[1].retry_after == math.inf
            assert await lim.allow_many([]) == []
            got = await lim.allow_many(iter([("a", 1)]))   # any iterable
            assert [(d.allowed, d.remaining) for d in got] == [(True, 2)]
    run(main())


def test_a_bad_argument_raises_as_the_sync_limiter_does(redis):
    async def main():
        async with hirate.AsyncLimiter(redis.url, capacity=5, rate=1, **SLOW) as lim:
            with pytest.raises(hirate.ConfigError) as e:
                await lim.allow("")
            assert e.value.name == "EKEY"
            with pytest.raises(hirate.ConfigError) as e:
                await lim.allow("k" * 513)
            assert e.value.name == "EKEY"
            with pytest.raises(hirate.ConfigError) as e:
                await lim.peek("k", -1)
            assert e.value.name == "ECOST"
            with pytest.raises(TypeError):
                await lim.allow("k", True)
            with pytest.raises(TypeError):
                await lim.allow(5)
            with pytest.raises(hirate.ConfigError):
                await lim.reset("")
            with pytest.raises(TypeError):
                await lim.reset(None)
            with pytest.raises(TypeError):
                await lim.allow_many([("ok", 1), "bad"])
            assert lim._stats()["connects"] == 0   # none of them needed Redis
            # A bad value in a batch raises for the whole call before
            # anything is sent, as Limiter.allow_many does.
            with pytest.raises(hirate.ConfigError) as e:
                await lim.allow_many([("ok", 1), ("", 1)])
            assert e.value.name == "EKEY"
            assert (await lim.peek("ok", 0)).remaining == 5
    run(main())
    with pytest.raises(hirate.ConfigError) as e:
        hirate.AsyncLimiter(redis.url, capacity=0, rate=1)
    assert e.value.name == "ECAPACITY"
    with pytest.raises(hirate.ConfigError) as e:
        hirate.AsyncLimiter("http://x", capacity=1, rate=1)
    assert e.value.name == "EURL"


def test_in_memory_needs_no_loop_io():
    async def main():
        lim = hirate.AsyncLimiter(capacity=2, rate=0.001)
        assert lim.url is None
        got = [await lim.allow("k") for _ in range(3)]
        assert [(d.allowed, d.source) for d in got] == [(True, "local"), (True, "local"),
                                                      (False, "local")]
        assert (await lim.peek("k", 0)).remaining == 0
        await lim.reset("k")
        assert [d.remaining for d in await lim.allow_many([("k", 1), ("k", 1)])] == [1, 0]
        await lim.close()
        with pytest.raises(hirate.ClosedError):
            await lim.allow("k")
    run(main())


def test_attributes_repr_from_env_and_close(redis, monkeypatch):
    url = f"redis://user:pa55word@127.0.0.1:{redis.port}/0"
    lim = hirate.AsyncLimiter(url, capacity=7, rate=0.5, prefix="p:", on_error="closed")
    assert (lim.capacity, lim.rate, lim.prefix, lim.on_error) == (7, 0.5, "p:", "closed")
    assert "pa55word" not in lim.url and "***" in lim.url
    assert "pa55word" not in repr(lim)
    assert repr(lim).startswith("<hirate.AsyncLimiter url=")
    assert "capacity=7" in repr(lim) and "on_error='closed'" in repr(lim)
    for attr in ("capacity", "rate", "prefix", "on_error", "url"):
        with pytest.raises(AttributeError):
            setattr(lim, attr, None)
    run(lim.close())
    monkeypatch.setenv("REDIS_URL", "")
    assert hirate.AsyncLimiter.from_env(capacity=1, rate=1).url is None
    monkeypatch.setenv("REDIS_URL", redis.url)
    lim = hirate.AsyncLimiter.from_env(capacity=1, rate=1, **SLOW)

    async def main():
        async with lim:
            assert (await lim.allow("x")).source == "redis"
        with pytest.raises(hirate.ClosedError):
            await lim.allow("x")
        with pytest.raises(hirate.ClosedError):
            await lim.reset("x")
        await lim.aclose()   # twice is fine
    run(main())


# ------------------------------------------------------------- concurrency

def test_two_hundred_tasks_on_one_key_get_exactly_the_capacity(redis):
    async def main():
        async with hirate.AsyncLimiter(redis.url, capacity=37, rate=0.001, on_error="closed",
                                       pool_size=8, **SLOW) as lim:
            got = await asyncio.gather(*(lim.allow("hot") for _ in range(200)))
            assert sum(d.allowed for d in got) == 37
            assert {d.source for d in got} <= {"redis", "cache"}
            assert sorted(d.remaining for d in got if d.allowed) == list(range(37))
            assert lim._stats()["connects"] <= 8   # bounded by pool_size
            return lim._stats()
    stats = run(main())
    assert stats["policy"] == 0


def test_one_limiter_serves_two_event_loops_with_their_own_connections(redis):
    lim = hirate.AsyncLimiter(redis.url, capacity=100, rate=0.001, **SLOW)
    base = clients(redis)

    async def use():
        got = await asyncio.gather(*(lim.allow("shared") for _ in range(5)))
        assert {d.source for d in got} == {"redis"}
        assert clients(redis) > base   # connected while the loop runs
        return [d.remaining for d in got]

    first = run(use())
    connects = lim._stats()["connects"]
    # The first loop closed its connections when it shut down.
    deadline = time.monotonic() + 5
    while clients(redis) > base and time.monotonic() < deadline:
        time.sleep(0.01)
    assert clients(redis) == base
    second = run(use())
    assert lim._stats()["connects"] > connects   # new ones, not the first loop's
    assert sorted(first + second) == list(range(90, 100))
    run(lim.close())
    deadline = time.monotonic() + 5
    while clients(redis) > base and time.monotonic() < deadline:
        time.sleep(0.01)
    assert clients(redis) == base


def test_loops_in_two_threads_at_once_share_one_limit(redis):
    lim = hirate.AsyncLimiter(redis.url, capacity=60, rate=0.001, on_error="closed", **SLOW)
    results, errors = [], []

    def worker():
        async def main():
            return await asyncio.gather(*(lim.allow("shared") for _ in range(50)))
        try:
            results.extend(run(main()))
        except BaseException as e:  # re-raised in the test's thread below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(results) == 100
    assert sum(d.allowed for d in results) == 60
    assert {d.source for d in results} <= {"redis", "cache"}
    run(lim.close())


@pytest.mark.filterwarnings("ignore::ResourceWarning")   # the dead loop's transport, at GC
def test_a_loop_closed_without_shutting_down_leaves_no_connection_open(redis):
    lim = hirate.AsyncLimiter(redis.url, capacity=10, rate=0.001, **SLOW)
    base = clients(redis)
    loop = asyncio.new_event_loop()
    assert loop.run_until_complete(lim.allow("k")).remaining == 9
    # uvloop closes a loop's transports with it; asyncio leaves them open.
    kept = 0 if type(loop).__module__.startswith("uvloop") else 1
    loop.close()   # without loop.shutdown_asyncgens(): nobody told the pool
    assert clients(redis) == base + kept
    # The next loop that uses the limiter ends the dead loop's connection.
    assert run(lim.allow("k")).remaining == 8
    deadline = time.monotonic() + 5
    while clients(redis) > base and time.monotonic() < deadline:
        time.sleep(0.01)
    assert clients(redis) == base
    run(lim.close())


def test_noscript_after_script_flush_is_one_eval_then_evalsha(redis):
    redis.command("CONFIG", "RESETSTAT")

    async def main():
        async with hirate.AsyncLimiter(redis.url, capacity=50, rate=0.001, functions=False,
                                       **SLOW) as lim:
            d = await lim.allow("k")   # fresh server: NOSCRIPT, then EVAL
            assert (d.remaining, calls(redis, "eval")) == (49, 1)
            d = await lim.allow("k")
            assert (d.remaining, calls(redis, "eval")) == (48, 1)
            redis.command("SCRIPT", "FLUSH")
            d = await lim.allow("k", 2)
            assert (d.allowed, d.remaining, d.source) == (True, 46, "redis")
            assert calls(redis, "eval") == 2
            # A whole batch after a flush: the NOSCRIPT calls go again, one EVAL.
            redis.command("SCRIPT", "FLUSH")
            got = await lim.allow_many([("k", 1), ("j", 1), ("k", 1)])
            assert [d.remaining for d in got] == [45, 49, 44]
            assert calls(redis, "eval") == 3
            assert lim._stats()["connects"] == 1   # NOSCRIPT kept the connection
    run(main())


# ------------------------------------------------------------ when Redis fails

POLICY = {"local": ("local", True), "open": ("fail_open", True), "closed": ("fail_closed", False)}


@pytest.mark.parametrize("on_error", ["local", "open", "closed"])
def test_a_stopped_redis_never_blocks_the_loop(own_redis, on_error):
    """The proof: while Redis hangs (SIGSTOP), a ticker on the same loop keeps
    its 10 ms beat, calls wait out their timeout and the policy decides; after
    SIGCONT calls go to Redis again. A call that blocked the loop would stall
    the ticker for the whole timeout (0.3 s); the bound of 0.1 s leaves room
    for the scheduling of a loaded 2-core machine, nothing more."""
    source, allowed = POLICY[on_error]

    async def main():
        lim = hirate.AsyncLimiter(own_redis.url, capacity=1000, rate=1, on_error=on_error,
                                  connect_timeout=2.0, timeout=0.3)
        assert (await lim.allow("k")).source == "redis"
        gaps = []
        stop = asyncio.Event()

        async def ticker():
            last = time.monotonic()
            while not stop.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        own_redis.stop()
        try:
            async def timed(key):
                t0 = time.monotonic()
                d = await lim.allow(key)
                return d, time.monotonic() - t0

            # Ten calls at once: each waits out the timeout (a connection
            # each, since the first ones are busy), none longer.
            got = await asyncio.gather(*(timed("k%d" % i) for i in range(10)))
            for d, took in got:
                assert (d.source, d.allowed, d.error) == (source, allowed, "ETIMEDOUT")
                assert 0.29 <= took < 1.0
            # The breaker is open: the policy answers without any I/O, long
            # before a timeout.
            connects = lim._stats()["connects"]
            d, took = await timed("k")
            assert (d.source, d.error) == (source, "ETIMEDOUT")
            assert took < 0.2
            assert lim._stats()["connects"] == connects
        finally:
            own_redis.cont()
        # Back on Redis after the breaker's backoff (about 0.1 s), by itself.
        deadline = time.monotonic() + 5
        while (d := await lim.allow("k")).source != "redis":
            assert time.monotonic() < deadline, d
            await asyncio.sleep(0.02)
        assert (d.error, d.allowed) == (None, True)
        stop.set()
        await tick
        await lim.close()
        return max(gaps)

    assert run(main()) < 0.1


def test_a_refused_connection_follows_the_policy_and_an_open_breaker_connects_never(own_redis):
    own_redis.kill()

    async def main():
        async with hirate.AsyncLimiter(own_redis.url, capacity=5, rate=1,
                                       on_error="open") as lim:
            d = await lim.allow("k")
            assert (d.allowed, d.source, d.error, d.remaining) == (True, "fail_open",
                                                                  "ECONNECT", 4)
            assert lim._stats()["connects"] == 1
            got = [await lim.allow("k") for _ in range(50)]
            assert {(d.source, d.error) for d in got} == {("fail_open", "ECONNECT")}
            stats = lim._stats()
            assert (stats["connects"], stats["breaker_opens"]) == (1, 1)
            # reset() is no decision: the failure is its error.
            with pytest.raises(hirate.BackendError) as e:
                await lim.reset("k")
            assert e.value.name == "ECONNECT"
    run(main())


def test_an_open_breaker_makes_no_connection_at_all():
    """Counted at the listening socket: a server that closes every
    connection at once breaks the first call (EIO); while the breaker is open
    no further connection reaches it."""
    accepted = []

    async def main():
        def on_connect(reader, writer):
            accepted.append(1)
            writer.close()
        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with hirate.AsyncLimiter(f"redis://127.0.0.1:{port}", capacity=5, rate=1,
                                       on_error="closed", timeout=2.0) as lim:
            d = await lim.allow("k")
            assert (d.allowed, d.source, d.error) == (False, "fail_closed", "EIO")
            assert d.retry_after > 0
            # A reset before any reply is how a TLS port answers a plain
            # client: the core had it probed once with TLS, which met the
            # same reset, so EIO stands.
            assert len(accepted) == 2
            for _ in range(20):
                d = await lim.allow("k")
                assert (d.source, d.error) == ("fail_closed", "EIO")
            await asyncio.sleep(0.01)
            assert len(accepted) == 2
        server.close()
        await server.wait_closed()
    run(main())


def test_a_connect_that_hangs_is_bounded_by_connect_timeout():
    # A listener that never accepts, with its backlog full: the next connect
    # gets no answer at all (the kernel drops the SYN).
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(3):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            fillers.append(s)

        async def main():
            async with hirate.AsyncLimiter(f"redis://127.0.0.1:{port}", capacity=5, rate=1,
                                           connect_timeout=0.2, timeout=5.0) as lim:
                t0 = time.monotonic()
                d = await lim.allow("k")
                took = time.monotonic() - t0
                assert (d.source, d.error) == ("local", "ECONNECT")
                assert 0.19 <= took < 1.0
        run(main())
    finally:
        for s in fillers:
            s.close()
        listener.close()


def test_a_killed_and_restarted_redis_is_used_again(own_redis):
    async def main():
        # functions=False: the EVAL it counts is the EVALSHA path's.
        async with hirate.AsyncLimiter(own_redis.url, capacity=100, rate=0.001,
                                       on_error="local", functions=False, **SLOW) as lim:
            assert (await lim.allow("k")).remaining == 99
            own_redis.kill()
            d = await lim.allow("k")   # the pooled connection is dead
            assert (d.source, d.error) in {("local", "EIO"), ("local", "ECONNECT")}
            own_redis.restart()   # same port, empty, no script cached
            deadline = time.monotonic() + 10
            while (d := await lim.allow("k")).source != "redis":
                assert time.monotonic() < deadline, d
                await asyncio.sleep(0.02)
            assert d.remaining == 99   # a new server: a full bucket, less this call
            assert calls(own_redis, "eval") == 1   # NOSCRIPT, then EVAL once
            d = await lim.allow("k")
            assert (d.remaining, d.source) == (98, "redis")
            assert calls(own_redis, "eval") == 1
    run(main())


def test_a_wrong_password_raises_auth_error_without_the_password():
    secret = "S3cret-canary-81f2"
    server = RedisServer(["--requirepass", secret])
    try:
        async def main():
            # A password may hold any byte, CR LF included (percent-encoded).
            url = f"redis://:wrong%0D%0A{secret}@127.0.0.1:{server.port}/1"
            lim = hirate.AsyncLimiter(url, capacity=5, rate=1, **SLOW)
            async def first_of_batch():
                got, = await lim.allow_many([("k", 1)])   # the error in the item's place
                raise got
            for call in (lim.allow("k"), lim.peek("k"), first_of_batch()):
                with pytest.raises(hirate.AuthError) as e:
                    await call
                assert e.value.name == "EAUTH"
                assert isinstance(e.value, PermissionError)
                assert "AUTH refused: WRONGPASS" in str(e.value)
                for text in (str(e.value), repr(e.value), repr(lim), lim.url):
                    assert secret not in text
            with pytest.raises(hirate.AuthError) as e:
                await lim.reset("k")
            assert secret not in str(e.value)
            # The reconnect backoff keeps a wrong password from becoming a
            # storm of connections.
            for _ in range(50):
                with pytest.raises(hirate.AuthError):
                    await lim.allow("k")
            assert lim._stats()["connects"] <= 3
            await lim.close()

            # The right password, and a database: AUTH then SELECT.
            good = f"redis://:{secret}@127.0.0.1:{server.port}/3"
            async with hirate.AsyncLimiter(good, capacity=5, rate=1, **SLOW) as lim:
                d = await lim.allow("k")
                assert (d.source, d.remaining) == ("redis", 4)
        run(main())
        # The bucket is in database 3.
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(b"AUTH %s\r\nSELECT 3\r\nEXISTS rl:k\r\n" % secret.encode())
            f = s.makefile("rb")
            assert [f.readline() for _ in range(3)] == [b"+OK\r\n", b"+OK\r\n", b":1\r\n"]
    finally:
        server.close()


def test_an_acl_user_without_the_key_gets_auth_error_noperm(own_redis):
    # Every command, but only the keys under rl:.
    own_redis.command("ACL", "SETUSER", "rl", "on", ">pw", "~rl:*", "+@all")
    url = f"redis://rl:pw@127.0.0.1:{own_redis.port}"

    async def main():
        async with hirate.AsyncLimiter(url, capacity=5, rate=1, **SLOW) as lim:
            assert (await lim.allow("k")).source == "redis"
        async with hirate.AsyncLimiter(url, capacity=5, rate=1, prefix="other:",
                                       **SLOW) as lim:
            with pytest.raises(hirate.AuthError) as e:
                await lim.allow("k")
            assert e.value.name == "ENOPERM"
            assert "NOPERM" in str(e.value) and "pw" not in str(e.value)
            with pytest.raises(hirate.AuthError) as e:
                await lim.reset("k")   # DEL of a key outside the pattern
            assert e.value.name == "ENOPERM"
    run(main())


def test_a_database_redis_refuses_is_the_error_hirate_limiter_raises(redis):
    url = f"{redis.url}/99"
    with hirate.Limiter(url, capacity=5, rate=1, **SLOW) as sync:
        with pytest.raises(hirate.BackendError) as want:
            sync.allow("k")

    async def main():
        async with hirate.AsyncLimiter(url, capacity=5, rate=1, **SLOW) as lim:
            with pytest.raises(hirate.BackendError) as e:
                await lim.allow("k")
            assert (e.value.name, str(e.value)) == (want.value.name, str(want.value))
            assert e.value.name == "EREPLY"
            assert str(e.value) == "SELECT 99 refused: ERR DB index is out of range"
    run(main())


# ------------------------------------------------------- timeouts, cancellation

def test_a_late_reply_is_never_read_as_another_calls_answer(own_redis):
    async def main():
        async with hirate.AsyncLimiter(own_redis.url, capacity=10, rate=0.001, pool_size=1,
                                       on_error="closed", connect_timeout=2.0,
                                       timeout=0.5) as lim:
            assert (await lim.allow("a")).remaining == 9
            own_redis.stop()
            try:
                d = await lim.allow("a")   # sent; its reply comes after the timeout
                assert (d.source, d.error) == ("fail_closed", "ETIMEDOUT")
                await asyncio.sleep(0.25)   # the breaker's backoff (0.1 s +-25%)
                # The next call is sent while Redis still hangs, so that on a
                # reused connection the first reply it met would be a's.
                probe = asyncio.create_task(lim.allow("b"))
                await asyncio.sleep(0.05)
            finally:
                own_redis.cont()
            d = await probe
            assert (d.source, d.remaining, d.error) == ("redis", 9, None)
            assert lim._stats()["conns_dropped"] == 1
            d = await lim.allow("a")   # the timed-out call did run in Redis
            assert (d.source, d.remaining) == ("redis", 7)
    run(main())


def test_a_cancelled_call_stays_on_its_connection_which_stays_in_step(own_redis):
    """A call sent and then cancelled may have run: it stays on its
    connection, whose next reply is its own, so the calls pipelined with it
    and after it get theirs; the caller's giving up teaches the breaker
    nothing. A call cancelled before it was sent is taken back."""
    async def main():
        async with hirate.AsyncLimiter(own_redis.url, capacity=10, rate=0.001, pool_size=1,
                                       on_error="closed", connect_timeout=2.0,
                                       timeout=5.0) as lim:
            assert (await lim.allow("a")).remaining == 9
            own_redis.stop()
            try:
                task = asyncio.create_task(lim.allow("a"))
                await asyncio.sleep(0.05)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                # Two more on the one connection, behind the first, cancelled.
                busy = asyncio.create_task(lim.allow("c"))
                waiting = asyncio.create_task(lim.allow("c"))
                await asyncio.sleep(0.05)
                waiting.cancel()
                busy.cancel()
                for t in (waiting, busy):
                    with pytest.raises(asyncio.CancelledError):
                        await t
                # Sent in the same loop iteration as its cancellation: taken
                # back, never sent.
                late = asyncio.create_task(lim.allow("d"))
                await asyncio.sleep(0)
                late.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await late
            finally:
                own_redis.cont()
            # Every reply in its place: b's is b's, and the cancelled calls ran.
            d = await lim.allow("b")
            assert (d.source, d.remaining, d.error) == ("redis", 9, None)
            assert (await lim.allow("a")).remaining == 7
            assert (await lim.allow("c")).remaining == 7
            assert (await lim.allow("d")).remaining in (8, 9)
            stats = lim._stats()
            assert stats["conns_dropped"] == 0 and stats["breaker_opens"] == 0
    run(main())


def test_a_pool_that_stays_busy_times_out_into_the_policy(own_redis):
    async def main():
        async with hirate.AsyncLimiter(own_redis.url, capacity=10, rate=1, pool_size=1,
                                       on_error="open", connect_timeout=2.0,
                                       timeout=0.2) as lim:
            await lim.allow("a")
            own_redis.stop()
            try:
                t0 = time.monotonic()
                first, second = await asyncio.gather(lim.allow("a"), lim.allow("b"))
                took = time.monotonic() - t0
            finally:
                own_redis.cont()
            assert (first.source, first.error) == ("fail_open", "ETIMEDOUT")
            assert (second.source, second.error) == ("fail_open", "ETIMEDOUT")
            assert took < 1.0
    run(main())


def test_bytes_after_a_reply_close_the_connection():
    """Redis never sends more than was asked; a scripted server does, and the
    connection that carried them is never used again."""
    accepted = []

    async def main():
        async def serve(reader, writer):
            accepted.append(1)
            while True:
                head = await reader.readline()
                if not head:
                    break
                args = []
                for _ in range(int(head[1:])):
                    n = int((await reader.readline())[1:])
                    args.append((await reader.readexactly(n + 2))[:-2])
                if args == [b"PING"]:   # the handshake's
                    writer.write(b"+PONG\r\n")
                    continue
                key = args[3]
                reply = (b"*8\r\n:1\r\n:4\r\n:0\r\n:200000\r\n$1\r\n4\r\n:1\r\n:1\r\n$%d\r\n%s\r\n"
                         % (len(key), key))
                writer.write(reply + b"+EXTRA\r\n")
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with hirate.AsyncLimiter(f"redis://127.0.0.1:{port}", capacity=5, rate=5,
                                       **SLOW) as lim:
            for _ in range(2):
                d = await lim.allow("k")
                assert (d.allowed, d.remaining, d.source) == (True, 4, "redis")
            assert len(accepted) == 2
            assert lim._stats()["conns_dropped"] == 2
        server.close()
        await server.wait_closed()
    run(main())
