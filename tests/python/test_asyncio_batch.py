"""AsyncLimiter: the calls of one loop iteration share a write on one
connection, and each gets its own reply, in order, whatever its neighbours'
callers do."""

import asyncio

import pytest

import hirate

# Generous timeouts: these tests are about replies, not about timeouts.
SLOW = {"connect_timeout": 5.0, "timeout": 5.0}


def run(coro, limit=60.0):
    return asyncio.run(asyncio.wait_for(coro, limit))


def reads(server):
    """The server's reads of client data so far (INFO stats; this asking
    included)."""
    text = server.command("INFO", "stats")
    stats = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return int(stats["total_reads_processed"])


KEYS, ROUNDS, CAPACITY = 10, 4, 5


def test_the_calls_of_one_iteration_each_get_their_own_decision(own_redis):
    """40 calls on 10 keys made in one loop iteration (gather), and 8 on one
    key of capacity 5: each is answered in the order it was made, as if one
    caller had made them one after the other, and they reach the server in
    one write after the first call's own."""
    async def main():
        async with hirate.AsyncLimiter(own_redis.url, capacity=CAPACITY, rate=0.001,
                                       pool_size=1, **SLOW) as lim:
            assert (await lim.allow("warm")).remaining == CAPACITY - 1   # connected
            keys = ["k%d" % (i % KEYS) for i in range(KEYS * ROUNDS)] + ["hot"] * 8
            before = reads(own_redis)
            ds = await asyncio.gather(*[lim.allow(k) for k in keys])
            after = reads(own_redis)
            for i, d in enumerate(ds[:KEYS * ROUNDS]):
                assert (d.source, d.allowed, d.remaining) == \
                    ("redis", True, CAPACITY - 1 - i // KEYS), (i, d)
            hot = [(d.allowed, d.remaining) for d in ds[KEYS * ROUNDS:]]
            assert hot == [(True, 4), (True, 3), (True, 2), (True, 1), (True, 0),
                           (False, 0), (False, 0), (False, 0)]
            assert all(d.source == "redis" for d in ds[KEYS * ROUNDS:])
            # 48 calls, one connection: the first sent at once, the other 47
            # in the write of the iteration's end, which the server may take
            # in more than one read; far fewer reads than calls either way
            # (the second INFO's own read is counted too).
            assert after - before <= 6
            assert lim.stats().conns_dropped == 0
    run(main())


def test_a_call_cancelled_mid_batch_shifts_no_reply(own_redis):
    """Ten calls on ten keys go out together while Redis is stopped; the
    caller of the fifth gives up. Its call stays on the connection (it may
    run, and here it does), so each of the other nine gets its own key's
    answer."""
    async def main():
        async with hirate.AsyncLimiter(own_redis.url, capacity=CAPACITY, rate=0.001,
                                       pool_size=1, on_error="closed", **SLOW) as lim:
            # Each key i has spent i tokens already, so that a shifted reply
            # would show another key's count.
            for i in range(KEYS):
                for _ in range(i % CAPACITY):
                    await lim.allow("c%d" % i)
            own_redis.stop()
            try:
                tasks = [asyncio.create_task(lim.allow("c%d" % i)) for i in range(KEYS)]
                await asyncio.sleep(0.1)    # sent, unanswered
                tasks[4].cancel()
            finally:
                own_redis.cont()
            with pytest.raises(asyncio.CancelledError):
                await tasks[4]
            for i, t in enumerate(tasks):
                if i == 4:
                    continue
                d = await t
                assert (d.source, d.allowed, d.remaining) == \
                    ("redis", True, CAPACITY - 1 - i % CAPACITY), (i, d)
            # The cancelled call ran: its token is spent.
            assert (await lim.peek("c4")).remaining == CAPACITY - 1 - 4
            stats = lim.stats()
            assert (stats.conns_dropped, stats.breaker_opens) == (0, 0)
    run(main())
