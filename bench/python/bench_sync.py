#!/usr/bin/env python3
"""Synchronous decisions per second from one Python thread, written to
stdout as a markdown table.

Against one redis-server that it starts itself (loopback TCP, a port of its
own, no persistence), in interleaved rounds, side by side:

  hirate          Limiter.allow(key), the C extension
  redis-py        the same Lua script (hirate.script_source()) through
                  redis.Redis.register_script, called with the same arguments
  limits          limits.strategies.MovingWindowRateLimiter over limits'
                  RedisStorage (its own moving-window script)

each on one hot key and on 10,000 keys (cycled in order). The limits are so
high that nothing is refused, so that every decision is one round trip for
all three (no deny cache can answer). Each round runs every client for
--seconds, in an order that alternates between rounds; the figure is the
median over --rounds rounds, with the spread (min..max) beside it. Each round
uses fresh keys, so limits' lists do not grow from round to round.

Then the in-memory Limiter.allow (no URL), one hot key and 10,000 keys.

    pip install . -r bench/python/requirements.txt
    python bench/python/bench_sync.py [--rounds 5] [--seconds 1.0]
"""

import argparse
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import hirate

CAPACITY = 1_000_000_000      # nothing is refused within a benchmark
RATE = 1_000_000.0
NKEYS = 10_000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A throwaway redis-server on a free loopback port."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="hirate-bench-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        self.close()
        raise RuntimeError("redis-server did not start")

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def timed(call, keys, seconds):
    """Calls call(key) over keys, cycling, for about `seconds`; returns
    decisions per second. The loop is a plain for over a list of at least
    1,000 keys, so that the harness costs little next to a decision; the
    clock is read once per pass."""
    block = keys * max(1, 1000 // len(keys))
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for key in block:
            call(key)
        n += len(block)
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - start)


def redis_clients(url):
    """name -> function(round) -> call(key), each making what it needs for a
    round (fresh keys, so no state carries over)."""
    import limits
    import limits.storage
    import limits.strategies
    import redis

    lim = hirate.Limiter(url, capacity=CAPACITY, rate=RATE, prefix="h:")
    r = redis.Redis.from_url(url)
    script = r.register_script(hirate.script_source())
    args = [CAPACITY, repr(RATE), 1, 1]
    storage = limits.storage.RedisStorage(url)
    moving = limits.strategies.MovingWindowRateLimiter(storage)
    item = limits.RateLimitItemPerSecond(CAPACITY)

    def hirate_call(rnd):
        allow = lim.allow

        def call(key):
            if not allow(key).allowed:
                raise SystemExit("hirate refused: the benchmark's limits are too low")
        return call

    def redis_py_call(rnd):
        def call(key):
            if script(keys=["p:" + key], args=args)[0] != 1:
                raise SystemExit("redis-py refused: the benchmark's limits are too low")
        return call

    def limits_call(rnd):
        hit = moving.hit

        def call(key):
            if not hit(item, key):
                raise SystemExit("limits refused: the benchmark's limits are too low")
        return call

    clients = {"hirate `Limiter.allow`": hirate_call,
               "redis-py `register_script` (the same script)": redis_py_call,
               "limits `MovingWindowRateLimiter` (RedisStorage)": limits_call}
    versions = {"redis-py": redis.__version__, "limits": limits.__version__}
    return clients, versions, lim


def median_spread(xs):
    return statistics.median(xs), min(xs), max(xs)


def fmt(v):
    return f"{v:,.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0)
    opt = ap.parse_args()

    load_before = os.getloadavg()
    server = Server()
    try:
        clients, versions, lim = redis_clients(server.url)
        workloads = {"1 hot key": lambda rnd: [f"hot:{rnd}"],
                     "10,000 keys": lambda rnd: [f"k{rnd}:{i:05d}" for i in range(NKEYS)]}
        results = {(w, c): [] for w in workloads for c in clients}
        for w, make_keys in workloads.items():
            for c, make in clients.items():   # warm up: connections, script cache
                timed(make(-1), make_keys(-1), 0.1)
            for rnd in range(opt.rounds):
                order = list(clients) if rnd % 2 == 0 else list(reversed(clients))
                for c in order:
                    results[w, c].append(timed(clients[c](rnd), make_keys(rnd), opt.seconds))
        stats = lim._stats()
        lim.close()
    finally:
        server.close()

    mem = hirate.Limiter(capacity=CAPACITY, rate=RATE)
    mem_keys = {"1 hot key": ["hot"], "10,000 keys": [f"user:{i:07d}" for i in range(NKEYS)]}
    mem_results = {w: [] for w in mem_keys}
    allow = mem.allow
    for rnd in range(opt.rounds):
        for w, keys in mem_keys.items():
            mem_results[w].append(timed(allow, keys, opt.seconds))

    print("### Python: synchronous decisions per second, one thread\n")
    print(f"- hirate {hirate.__version__}, Python {platform.python_version()}, "
          f"redis-py {versions['redis-py']}, limits {versions['limits']}; "
          f"{opt.rounds} interleaved rounds of {opt.seconds:g} s per client, median "
          f"(min..max)")
    print(f"- {os.cpu_count()} CPUs; load average (1, 5, 15 min) before: "
          f"{' '.join('%.2f' % x for x in load_before)}, after: "
          f"{' '.join('%.2f' % x for x in os.getloadavg())}")
    print(f"- hirate's Redis calls: {stats['evalsha']:,} EVALSHA, {stats['eval']} EVAL, "
          f"{stats['connects']} connection(s), {stats['policy']} decided by the policy\n")
    print("| backend | keys | client | decisions/s | hirate / this |")
    print("|---|---|---|---:|---:|")
    hirate_name = next(iter(clients))
    for w in workloads:
        ours = statistics.median(results[w, hirate_name])
        for c in clients:
            m, lo, hi = median_spread(results[w, c])
            ratio = "" if c == hirate_name else f"**{ours / m:.2f}x**"
            print(f"| Redis (TCP loopback) | {w} | {c} | {fmt(m)} ({fmt(lo)}..{fmt(hi)}) "
                  f"| {ratio} |")
    for w in mem_keys:
        m, lo, hi = median_spread(mem_results[w])
        print(f"| memory (no URL) | {w} | hirate `Limiter.allow` | {fmt(m)} "
              f"({fmt(lo)}..{fmt(hi)}) | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
