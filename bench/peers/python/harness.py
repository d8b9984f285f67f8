"""The Python contenders of the side-by-side benchmark, behind the harness
protocol of bench/peers/README.md (bench/suite/suite.py drives them):

    python harness.py speed|atomic|outage|fill --impl IMPL --url redis://HOST:PORT [...]
    python harness.py ... --url rediss://HOST:PORT --tls-ca-file ca.crt   (TLS)
    python harness.py ... --url redis+cluster://HOST:PORT,HOST:PORT       (Redis Cluster)

    redis-py        redis-py's register_script of hirate's own script
                    (lua/token_bucket.lua), key "rl:" + key, threads sharing
                    one client (its connection pool), replies read by
                    redis-py's pure-Python parser (asked for by name: redis-py
                    takes hiredis' whenever the hiredis package is installed)
    redis-py-hiredis  the same with redis-py's hiredis parser (the hiredis
                    package, `redis[hiredis]`): what a user who cares about
                    speed runs
    redis-py-pipeline  the same script, 16 decisions a call: a pipeline
                    (transaction=False) of 16 EVALSHA, the script loaded
                    first, as redis-benchmark -P 16 pipelines 16 calls
    redis-py-async  the same on redis.asyncio, asyncio tasks
    limits-moving   limits' MovingWindowRateLimiter, RedisStorage, capacity
    limits-sliding  limits' SlidingWindowCounterRateLimiter, RedisStorage
                    (both: capacity hits per capacity / rate seconds)
    limits-stack    several limits on one key (--limits "10/second; 1000/day")
                    as Flask-Limiter decides them: limits' parse_many of the
                    string, its FixedWindowRateLimiter (Flask-Limiter's default
                    strategy) on RedisStorage, one hit per limit in
                    Flask-Limiter's order (sorted), stopping at the first
                    refusal (its default fail_on_first_breach); the limits
                    hit before it stay charged
    hirate          hirate.Limiter, threads sharing one limiter; with
                    --limits, hirate.Limiter(url, limits=...): every limit in
                    one decision
    hirate-async    hirate.AsyncLimiter, asyncio tasks

Threads for the synchronous clients and tasks for the asyncio ones: what a
service using each would run. Every client gets a 250 ms connect timeout and
a --timeout-ms command timeout; everything else is its library's default.
Over TLS (rediss://; redis-py and hirate) --tls-ca-file is the CA the
server's certificate is checked against: redis-py's ssl_ca_certs (a rediss://
URL is its ssl=True), hirate's tls_ca_file.

A redis+cluster:// URL (its hosts the seeds) makes redis-py's client a
redis.cluster.RedisCluster, which routes each key to its slot's master and
follows MOVED and ASK; its pipeline groups the calls by node. hirate takes
the URL as it is.
"""

import argparse
import array
import asyncio
import os
import random
import sys
import threading
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))
from protocol import die, emit, rate_arg  # noqa: E402
# Samples a worker keeps before it starts keeping every 2nd, 4th, ... call.
LAT_CAP = 1 << 18
# Key draws are precomputed (a random draw costs more than some decisions)
# and then cycled.
DRAWS = 1 << 16

ASYNC = {"redis-py-async", "hirate-async"}
IMPLS = ("redis-py", "redis-py-hiredis", "redis-py-async", "redis-py-pipeline", "limits-moving", "limits-sliding",
         "limits-stack", "hirate", "hirate-async")
# The implementations that take --limits (several limits on one key).
WITH_LIMITS = ("limits-stack", "hirate", "hirate-async")
# Decisions per call of a batch client (redis-py-pipeline).
BATCH = 16


def cluster_seeds(url):
    """The (host, port) seeds of a redis+cluster:// URL, or None for another URL."""
    if not url.startswith("redis+cluster://"):
        return None
    hosts = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].rsplit("@", 1)[-1]
    seeds = []
    for h in hosts.split(","):
        host, _, port = h.rpartition(":")
        seeds.append((host.strip("[]") or "127.0.0.1", int(port or 6379)))
    return seeds


def key_name(i):
    return "user:%06d" % i


def script_source():
    with open(os.path.join(ROOT, "lua", "token_bucket.lua"), encoding="utf-8") as f:
        return f.read()


def make_decider(c, capacity, rate, sources=False):
    """A function deciding one key: True allowed, False refused; raises on
    failure. For the asyncio clients, a coroutine function. Also a closer.
    With sources, hirate's decisions are counted by source in SOURCES."""
    timeout = c.timeout_ms / 1000.0
    seeds = cluster_seeds(c.url)
    if seeds and c.impl not in ("redis-py", "redis-py-hiredis", "redis-py-pipeline", "hirate"):
        die("--impl %s: no Redis Cluster here (redis-py, redis-py-hiredis, redis-py-pipeline, "
            "hirate)" % c.impl)
    if c.impl in ("redis-py", "redis-py-hiredis", "redis-py-async", "redis-py-pipeline"):
        import redis
        import redis.asyncio

        cls = redis.asyncio.Redis if c.impl == "redis-py-async" else redis.Redis
        tls = {"ssl_ca_certs": c.tls_ca_file} if c.tls_ca_file else {}
        parser = {}
        if c.impl == "redis-py":
            from redis._parsers import _RESP2Parser
            parser["parser_class"] = _RESP2Parser
        elif c.impl == "redis-py-hiredis":
            from redis._parsers import _HiredisParser
            from redis.utils import HIREDIS_AVAILABLE
            if not HIREDIS_AVAILABLE:
                die("--impl redis-py-hiredis: the hiredis package is not installed")
            parser["parser_class"] = _HiredisParser
        if seeds:
            from redis.cluster import ClusterNode, RedisCluster
            client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in seeds],
                                  socket_timeout=timeout, socket_connect_timeout=0.25, **parser)
        else:
            client = cls.from_url(c.url, socket_timeout=timeout, socket_connect_timeout=0.25,
                                  **tls, **parser)
        script = client.register_script(script_source())
        args = [capacity, rate_arg(rate), 1, 1]
        if c.impl in ("redis-py", "redis-py-hiredis"):
            def decide(key):
                return script(keys=["rl:" + key], args=args)[0] == 1
            return decide, client.close
        if c.impl == "redis-py-pipeline":
            # EVALSHA in a pipeline cannot fall back to EVAL: loaded first
            # (RedisCluster sends SCRIPT LOAD to every master).
            sha = client.script_load(script_source())

            def decide_many(keys):
                pipe = client.pipeline(transaction=False)
                for k in keys:
                    # The raw command: ClusterPipeline refuses its evalsha
                    # method, yet routes EVALSHA by its key.
                    pipe.execute_command("EVALSHA", sha, 1, "rl:" + k, *args)
                # An item's failure is its own (raise_on_error=False).
                return [r if isinstance(r, Exception) else r[0] == 1
                        for r in pipe.execute(raise_on_error=False)]

            def decide(key):
                r = decide_many([key])[0]
                if isinstance(r, Exception):
                    raise r
                return r
            decide.many = decide_many
            return decide, client.close

        async def adecide(key):
            return (await script(keys=["rl:" + key], args=args))[0] == 1
        return adecide, client.aclose
    if c.impl in ("limits-moving", "limits-sliding"):
        from limits import RateLimitItemPerSecond, storage, strategies

        if c.tls_ca_file:
            die("--tls-ca-file: the limits contenders run over plain TCP only")

        st = storage.RedisStorage(c.url, socket_timeout=timeout, socket_connect_timeout=0.25)
        if c.impl == "limits-moving":
            strategy = strategies.MovingWindowRateLimiter(st)
        else:
            strategy = strategies.SlidingWindowCounterRateLimiter(st)
        item = RateLimitItemPerSecond(capacity, max(1, round(capacity / rate)))
        hit = strategy.hit

        def decide(key):
            return hit(item, key)
        return decide, lambda: None
    if c.impl == "limits-stack":
        from limits import parse_many, storage, strategies

        if c.tls_ca_file:
            die("--tls-ca-file: the limits contenders run over plain TCP only")
        st = storage.RedisStorage(c.url, socket_timeout=timeout, socket_connect_timeout=0.25)
        hit = strategies.FixedWindowRateLimiter(st).hit
        # Flask-Limiter evaluates a route's limits sorted (by granularity).
        items = sorted(parse_many(c.limits))

        def decide(key):
            for item in items:
                if not hit(item, key):
                    return False
            return True
        return decide, lambda: None
    if c.impl in ("hirate", "hirate-async"):
        import hirate

        cls = hirate.AsyncLimiter if c.impl == "hirate-async" else hirate.Limiter
        tls = {"tls_ca_file": c.tls_ca_file} if c.tls_ca_file else {}
        limit = {"limits": c.limits} if c.limits else {"capacity": capacity, "rate": rate}
        lim = cls(c.url, timeout=timeout, connect_timeout=0.25, **limit, **tls)
        allow = lim.allow
        if c.impl == "hirate":
            def decide(key):
                d = allow(key)
                if sources:
                    SOURCES[d.source] = SOURCES.get(d.source, 0) + 1
                return d.allowed
            return decide, lim.close

        async def adecide(key):
            d = await allow(key)
            if sources:
                SOURCES[d.source] = SOURCES.get(d.source, 0) + 1
            return d.allowed
        return adecide, lim.close
    die("--impl: unknown client %r (%s)" % (c.impl, ", ".join(IMPLS)))


# How many decisions each source made (hirate only; reported by outage).
SOURCES = {}


class Worker:
    __slots__ = ("decisions", "allowed", "errors", "error", "lat", "stride", "draws", "calls")

    def __init__(self, c, index, keys):
        rng = random.Random(c.seed * 1000003 + index)
        self.draws = keys * DRAWS if len(keys) == 1 else rng.choices(keys, k=DRAWS)
        # calls: every decision that returned, warm-up and the calls ending
        # after the window included (the driver divides the server's whole
        # count of commands by it).
        self.decisions = self.allowed = self.errors = self.calls = 0
        self.error = None
        self.lat = array.array("q")
        self.stride = 1


WARM, MEASURE, STOP = 0, 1, 2


class Phase:
    now = WARM


def batch_worker_loop(w, decide_many):
    """worker_loop for a batch client: BATCH keys a call, the call's wall
    time one latency sample, each decision counted (a failed one as an error)."""
    draws, mask, i = w.draws, DRAWS - 1, 0
    lat, stride, tick = w.lat, 1, 0
    clock = time.perf_counter_ns
    while True:
        ph = Phase.now
        if ph == STOP:
            break
        keys = [draws[(i + j) & mask] for j in range(BATCH)]
        i += BATCH
        t0 = clock()
        try:
            outcomes = decide_many(keys)
        except Exception as e:  # the whole call failed
            outcomes = [e] * BATCH
        dt = clock() - t0
        w.calls += BATCH
        if Phase.now != MEASURE:
            continue
        if ph != MEASURE and not w.errors:
            w.error = None
        done = 0
        for o in outcomes:
            if isinstance(o, Exception):
                w.errors += 1
                if w.error is None:
                    w.error = "%s: %s" % (type(o).__name__, o)
                continue
            done += 1
            if o:
                w.allowed += 1
        w.decisions += done
        if not done:
            continue
        tick += 1
        if tick >= stride:
            tick = 0
            if len(lat) == LAT_CAP:
                lat = lat[1::2]
                stride *= 2
            lat.append(dt)
    w.lat, w.stride = lat, stride


def worker_loop(w, decide):
    """One synchronous worker; the asyncio one below is the same loop."""
    draws, mask, i = w.draws, DRAWS - 1, 0
    lat, stride, tick = w.lat, 1, 0
    clock = time.perf_counter_ns
    while True:
        ph = Phase.now
        if ph == STOP:
            break
        key = draws[i & mask]
        i += 1
        t0 = clock()
        try:
            ok = decide(key)
            err = None
        except Exception as e:  # a failed decision is data
            err = e
        dt = clock() - t0
        w.calls += 1
        if Phase.now != MEASURE:
            continue  # only calls that end inside the window count
        if ph != MEASURE and not w.errors:
            w.error = None
        if err is not None:
            w.errors += 1
            if w.error is None:
                w.error = "%s: %s" % (type(err).__name__, err)
            continue
        w.decisions += 1
        if ok:
            w.allowed += 1
        tick += 1
        if tick >= stride:
            tick = 0
            if len(lat) == LAT_CAP:
                lat = lat[1::2]
                stride *= 2
            lat.append(dt)
    w.lat, w.stride = lat, stride


async def aworker_loop(w, decide):
    draws, mask, i = w.draws, DRAWS - 1, 0
    lat, stride, tick = w.lat, 1, 0
    clock = time.perf_counter_ns
    while True:
        ph = Phase.now
        if ph == STOP:
            break
        key = draws[i & mask]
        i += 1
        t0 = clock()
        try:
            ok = await decide(key)
            err = None
        except Exception as e:  # a failed decision is data
            err = e
        dt = clock() - t0
        w.calls += 1
        if Phase.now != MEASURE:
            continue
        if ph != MEASURE and not w.errors:
            w.error = None
        if err is not None:
            w.errors += 1
            if w.error is None:
                w.error = "%s: %s" % (type(err).__name__, err)
            continue
        w.decisions += 1
        if ok:
            w.allowed += 1
        tick += 1
        if tick >= stride:
            tick = 0
            if len(lat) == LAT_CAP:
                lat = lat[1::2]
                stride *= 2
            lat.append(dt)
    w.lat, w.stride = lat, stride


def quantiles(workers):
    """p50 and p99 in µs, the workers' samples merged at the largest stride
    among them, so that each kept sample stands for the same number of calls."""
    stride = max([w.stride for w in workers] or [1])
    merged = []
    for w in workers:
        step = stride // w.stride
        merged.extend(w.lat[step - 1::step])
    if not merged:
        return 0.0, 0.0
    merged.sort()
    n = len(merged)
    return merged[n // 2] / 1e3, merged[min(n - 1, int(0.99 * n))] / 1e3


def speed_result(workers, cpu, wall):
    p50, p99 = quantiles(workers)
    first = next((w.error for w in workers if w.error), None)
    return {"decisions": sum(w.decisions for w in workers),
            "allowed": sum(w.allowed for w in workers),
            "errors": sum(w.errors for w in workers),
            "p50_us": p50, "p99_us": p99, "cpu_s": cpu, "wall_s": wall,
            "calls_total": sum(w.calls for w in workers), "error": first}


def run_speed(c):
    decide, close = make_decider(c, c.capacity, c.rate)
    keys = [key_name(i) for i in range(c.keys)]
    workers = [Worker(c, i, keys) for i in range(c.concurrency)]
    many = getattr(decide, "many", None)
    threads = [threading.Thread(target=batch_worker_loop, args=(w, many)) if many else
               threading.Thread(target=worker_loop, args=(w, decide)) for w in workers]
    for t in threads:
        t.start()
    time.sleep(c.warmup)
    cpu0, t0 = time.process_time(), time.perf_counter()
    Phase.now = MEASURE
    time.sleep(c.seconds)
    Phase.now = STOP
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    for t in threads:
        t.join()
    emit(speed_result(workers, cpu, wall))
    close()


async def arun_speed(c):
    decide, close = make_decider(c, c.capacity, c.rate)
    keys = [key_name(i) for i in range(c.keys)]
    workers = [Worker(c, i, keys) for i in range(c.concurrency)]
    tasks = [asyncio.ensure_future(aworker_loop(w, decide)) for w in workers]
    await asyncio.sleep(c.warmup)
    cpu0, t0 = time.process_time(), time.perf_counter()
    Phase.now = MEASURE
    await asyncio.sleep(c.seconds)
    Phase.now = STOP
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    await asyncio.gather(*tasks)
    emit(speed_result(workers, cpu, wall))
    await close()


def tally(outcomes):
    """outcomes: True, False or an exception each."""
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    return {"admitted": sum(1 for o in outcomes if o is True),
            "refused": sum(1 for o in outcomes if o is False),
            "errors": len(errors),
            "error": "%s: %s" % (type(errors[0]).__name__, errors[0]) if errors else None}


def call(decide, key):
    try:
        return bool(decide(key))
    except Exception as e:
        return e


async def acall(decide, key):
    try:
        return bool(await decide(key))
    except Exception as e:
        return e


def run_atomic(c):
    decide, close = make_decider(c, c.capacity, c.rate)
    barrier = threading.Barrier(c.requests)
    outcomes = [None] * c.requests

    def one(i):
        barrier.wait()
        outcomes[i] = call(decide, c.key)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(c.requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    emit(dict(requests=c.requests, **tally(outcomes)))
    close()


async def arun_atomic(c):
    decide, close = make_decider(c, c.capacity, c.rate)
    # Created together, the tasks all start in the same turn of the loop.
    outcomes = await asyncio.gather(*[acall(decide, c.key) for _ in range(c.requests)])
    emit(dict(requests=c.requests, **tally(outcomes)))
    await close()


def outage_result(c, outcomes, lat_us):
    out = dict(calls=c.calls, **tally(outcomes))
    out["lat_us"] = lat_us
    if c.impl.startswith("hirate"):
        out["sources"] = dict(SOURCES)
    return out


def run_outage(c):
    decide, close = make_decider(c, c.capacity, c.rate, sources=True)
    # The warm-up key is the test key's own: harnesses run side by side on
    # one server, and each library stores its own kind of value.
    first = call(decide, c.key + "-warmup")
    if isinstance(first, BaseException):
        die("the warm-up decision failed: %s" % first)
    SOURCES.clear()
    emit({"ready": True})
    if not sys.stdin.readline():
        die("stdin closed before the go line")
    outcomes, lat_us = [], []
    for _ in range(c.calls):
        t0 = time.perf_counter_ns()
        outcomes.append(call(decide, c.key))
        lat_us.append((time.perf_counter_ns() - t0) / 1e3)
    emit(outage_result(c, outcomes, lat_us))
    close()


async def arun_outage(c):
    decide, close = make_decider(c, c.capacity, c.rate, sources=True)
    first = await acall(decide, c.key + "-warmup")
    if isinstance(first, BaseException):
        die("the warm-up decision failed: %s" % first)
    SOURCES.clear()
    emit({"ready": True})
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if not line:
        die("stdin closed before the go line")
    outcomes, lat_us = [], []
    for _ in range(c.calls):
        t0 = time.perf_counter_ns()
        outcomes.append(await acall(decide, c.key))
        lat_us.append((time.perf_counter_ns() - t0) / 1e3)
    emit(outage_result(c, outcomes, lat_us))
    await close()


def run_fill(c):
    decide, close = make_decider(c, c.capacity, c.rate)
    t = tally([call(decide, key_name(i)) for i in range(c.keys)])
    emit({"keys": c.keys, "admitted": t["admitted"], "errors": t["errors"], "error": t["error"]})
    close()


async def arun_fill(c):
    decide, close = make_decider(c, c.capacity, c.rate)
    t = tally([await acall(decide, key_name(i)) for i in range(c.keys)])
    emit({"keys": c.keys, "admitted": t["admitted"], "errors": t["errors"], "error": t["error"]})
    await close()


def positive(kind):
    def parse(s):
        v = kind(s)
        if not v > 0:
            raise argparse.ArgumentTypeError("must be positive, got %r" % s)
        return v
    return parse


def main():
    p = argparse.ArgumentParser(description="a contender of hirate's benchmark suite "
                                "(bench/peers/README.md)")
    p.add_argument("mode", choices=("speed", "atomic", "outage", "fill"))
    p.add_argument("--impl", required=True, choices=IMPLS)
    p.add_argument("--url", required=True)
    p.add_argument("--key", default="fresh")
    p.add_argument("--keys", type=positive(int), default=100000)
    p.add_argument("--concurrency", type=positive(int), default=1)
    p.add_argument("--requests", type=positive(int), default=100)
    p.add_argument("--calls", type=positive(int), default=20)
    p.add_argument("--timeout-ms", type=positive(int), default=100)
    p.add_argument("--seconds", type=positive(float), default=2.0)
    p.add_argument("--warmup", type=float, default=0.3)
    p.add_argument("--rate", type=positive(float), default=10.0)
    p.add_argument("--capacity", type=positive(int), default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tls-ca-file", help="with a rediss:// URL: the CA of the server's certificate")
    p.add_argument("--limits", help="several limits on one key, a limit string such as "
                   "\"10/second; 1000/day\" (%s; instead of --capacity and --rate)"
                   % ", ".join(WITH_LIMITS))
    c = p.parse_args()
    if c.limits is not None and c.impl not in WITH_LIMITS:
        die("--limits: --impl %s takes --capacity and --rate (--limits: %s)"
            % (c.impl, ", ".join(WITH_LIMITS)))
    if c.impl == "limits-stack" and not c.limits:
        die("--impl limits-stack needs --limits")
    if c.tls_ca_file and not c.url.startswith("rediss://"):
        die("--tls-ca-file needs a rediss:// URL")
    if c.impl in ASYNC:
        run = {"speed": arun_speed, "atomic": arun_atomic, "outage": arun_outage,
               "fill": arun_fill}[c.mode]
        asyncio.run(run(c))
    else:
        {"speed": run_speed, "atomic": run_atomic, "outage": run_outage,
         "fill": run_fill}[c.mode](c)


if __name__ == "__main__":
    main()
