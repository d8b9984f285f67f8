"""hirate.AsyncLimiter.allow against redis-py's asyncio client running the
same script (redis.asyncio, register_script: EVALSHA, EVAL after NOSCRIPT).

    python bench/python/bench_async.py [--url redis://127.0.0.1:6379] [--rounds 7]

Without --url it starts a throwaway redis-server on a free loopback port (and
stops it). Both clients get a pool of at most 16 connections, and a bucket so
large that every call is allowed, so each decision is one round trip for both
(no deny cache answer). Rounds are interleaved, each client first in turn, and
the table shows the median decisions per second over the rounds, in markdown.
"""

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time

import hirate
import redis
import redis.asyncio

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "python"))
from redis_server import RedisServer  # noqa: E402

CAPACITY = 2 ** 40      # never empties within a run: every call is allowed
RATE = 1_000_000.0
POOL = 16
HOT_KEYS = 1
MANY_KEYS = 10_000


class Hirate:
    name = "hirate.AsyncLimiter"

    def __init__(self, url):
        self.lim = hirate.AsyncLimiter(url, capacity=CAPACITY, rate=RATE, prefix="bench:h:",
                                       pool_size=POOL, connect_timeout=2.0, timeout=2.0)

    async def allow(self, key):
        d = await self.lim.allow(key)
        if d.source != "redis":
            raise RuntimeError("a decision without Redis (%s, %s): the run is void"
                               % (d.source, d.error))
        return d.allowed

    async def close(self):
        await self.lim.close()


class RedisPy:
    name = "redis-py asyncio + script"

    def __init__(self, url):
        # Waiting for a connection without a time limit: redis-py's pool is
        # not fair, and with 50 tasks on 16 connections one task may wait
        # longer than any limit that would still measure something.
        pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=POOL,
                                                             timeout=None)
        self.client = redis.asyncio.Redis(connection_pool=pool)
        self.script = self.client.register_script(hirate.script_source())
        self.args = [CAPACITY, "%r" % RATE, 1, 1]   # capacity, rate, cost, spend

    async def allow(self, key):
        reply = await self.script(keys=["bench:r:" + key], args=self.args)
        return reply[0] == 1

    async def close(self):
        await self.client.aclose()


async def measure(client, tasks, nkeys, decisions):
    """Decisions per second of `tasks` tasks making `decisions` calls in all."""
    keys = ["k%d" % i for i in range(nkeys)]
    per_task = decisions // tasks

    async def worker(start):
        allow = client.allow
        for i in range(per_task):
            await allow(keys[(start + i) % nkeys])

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(t * 7919) for t in range(tasks)))
    return per_task * tasks / (time.perf_counter() - t0)


async def main(args):
    server = None
    url = args.url
    if url is None:
        server = RedisServer()
        url = server.url
    try:
        clients = [Hirate(url), RedisPy(url)]
        shapes = [(1, HOT_KEYS), (1, MANY_KEYS), (50, HOT_KEYS), (50, MANY_KEYS)]
        results = {(c.name, s): [] for c in clients for s in shapes}
        for c in clients:   # connections open, script cached
            await measure(c, 50, MANY_KEYS, 2000)
        for r in range(args.rounds):
            for shape in shapes:
                tasks, nkeys = shape
                n = args.decisions * (4 if tasks > 1 else 1)
                order = clients if r % 2 == 0 else clients[::-1]
                for c in order:
                    results[(c.name, shape)].append(await measure(c, tasks, nkeys, n))
        version = (await clients[1].client.info("server"))["redis_version"]
        for c in clients:
            await c.close()
    finally:
        if server is not None:
            server.close()

    try:
        import hiredis  # noqa: F401
        parser = "hiredis"
    except ImportError:
        parser = "pure Python"
    print("## AsyncLimiter.allow vs redis-py asyncio (decisions/s, median of %d rounds)"
          % args.rounds)
    print()
    print("Python %s, hirate %s, redis-py %s (%s parser), redis-server %s on loopback; "
          "pools of %d connections; %d decisions a measurement with 1 task, %d with 50."
          % (platform.python_version(), hirate.__version__, redis.__version__, parser,
             version, POOL, args.decisions, args.decisions * 4))
    print()
    print("| tasks | keys | %s | %s | ratio |" % (clients[0].name, clients[1].name))
    print("|---:|---|---:|---:|---:|")
    for shape in shapes:
        tasks, nkeys = shape
        a = statistics.median(results[(clients[0].name, shape)])
        b = statistics.median(results[(clients[1].name, shape)])
        keys = "one hot key" if nkeys == 1 else "%s keys" % format(nkeys, ",")
        print("| %d | %s | %s | %s | %.2f× |" % (tasks, keys, format(round(a), ","),
                                                 format(round(b), ","), a / b))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a Redis to use (default: a throwaway redis-server)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--decisions", type=int, default=5000,
                   help="decisions a measurement with 1 task; 4x that with 50 (default 5000)")
    asyncio.run(main(p.parse_args()))
