"""Limiter and AsyncLimiter over a real Redis Cluster (tests/support/
redis_cluster.py: 3 masters with a replica each on loopback), through
redis+cluster:// and rediss+cluster:// URLs: every slot range, batches across
nodes in the caller's order, a replica as the only seed, resharding and a
master's failover while calls run, TLS, and a Flask route.

The session's cluster (conftest's `cluster`) serves most tests, each with a
key prefix of its own; the failover tests kill a master of their own
cluster, and the TLS tests share a TLS-only cluster. Rates are 0.001 token/s or none at all: no test runs long
enough to refill a token, so every count is exact. The core owns every
cluster rule; these tests only look at what a caller sees.
"""

import asyncio
import collections
import itertools
import pathlib
import sys
import threading
import time

import pytest
from flask import Flask

import hirate
from hirate.flask import RateLimiter

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "support"))
from redis_cluster import RedisCluster  # noqa: E402

pytestmark = pytest.mark.timeout(180)

KINDS = ["Limiter", "AsyncLimiter"]
# Generous timeouts where a test is about decisions, not about timeouts: this
# machine runs six servers and the calls at once.
SLOW = dict(connect_timeout=2.0, timeout=2.0)
SLOW_RATE = 0.001
# Where every decision must be Redis' own: no deny cache answering refusals.
REDIS_ONLY = dict(SLOW, deny_cache=False)
_prefixes = itertools.count()


@pytest.fixture(scope="module")
def tls_cluster(certs):
    c = RedisCluster(masters=3, replicas=0, tls=certs)
    yield c
    c.stop()


@pytest.fixture
def prefix():
    """A key prefix of this test's own, so that tests share the cluster."""
    return "c%d:" % next(_prefixes)


class Client:
    """A Limiter, or an AsyncLimiter on an event loop of its own (so that its
    pools carry over from call to call), behind one set of calls."""

    def __init__(self, kind, url, **kwargs):
        self.kind = kind
        if kind == "AsyncLimiter":
            self.loop = asyncio.new_event_loop()
            self.lim = hirate.AsyncLimiter(url, **kwargs)
        else:
            self.lim = hirate.Limiter(url, **kwargs)

    def _run(self, coro):
        return self.loop.run_until_complete(asyncio.wait_for(coro, 120))

    def allow_many(self, pairs):
        r = self.lim.allow_many(pairs)
        return self._run(r) if self.kind == "AsyncLimiter" else r

    def allow_each(self, keys):
        """allow() for every key: in turn on a Limiter, all at once (a task
        each) on an AsyncLimiter."""
        if self.kind == "Limiter":
            return [self.lim.allow(k) for k in keys]

        async def each():
            return await asyncio.gather(*(self.lim.allow(k) for k in keys))
        return self._run(each())

    def hammer(self, keys, stop, out, tasks=8):
        """In the calling thread: allow() on keys round robin until stop is
        set, each (key, decision, monotonic time) appended to out; an
        AsyncLimiter runs `tasks` tasks at once."""
        if self.kind == "Limiter":
            for k in itertools.cycle(keys):
                if stop.is_set():
                    return
                out.append((k, self.lim.allow(k), time.monotonic()))

        async def task(start):
            for k in itertools.islice(itertools.cycle(keys), start, None):
                if stop.is_set():
                    return
                out.append((k, await self.lim.allow(k), time.monotonic()))
        async def tasks_():
            await asyncio.gather(*(task(i * 7) for i in range(tasks)))
        self.loop.run_until_complete(tasks_())

    def close(self):
        if self.kind == "Limiter":
            self.lim.close()
            return
        self._run(self.lim.close())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


@pytest.fixture(params=KINDS)
def make(request):
    made = []

    def make(url, **kwargs):
        c = Client(request.param, url, **kwargs)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


def masters(cluster):
    return [n for n in cluster.refresh() if n.role == "master" and n.slots]


def owner(ms, slot):
    return next(m for m in ms if any(lo <= slot <= hi for lo, hi in m.slots))


def shape(d):
    return (d.allowed, d.remaining, d.limit, d.source, d.error)


class Load:
    """client.hammer(keys) in a thread while the test changes the cluster."""

    def __init__(self, client, keys):
        self.stop = threading.Event()
        self.out = []
        self.thread = threading.Thread(target=client.hammer, args=(keys, self.stop, self.out))
        self.thread.start()

    def calls(self, n, limit=60):
        """Waits until n more calls are answered (a bound, not a measure)."""
        want = len(self.out) + n
        deadline = time.monotonic() + limit
        while len(self.out) < want:
            assert self.thread.is_alive(), "the calls stopped"
            assert time.monotonic() < deadline, "no %d calls in %d s" % (n, limit)
            time.sleep(0.005)

    def end(self):
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        return self.out


# ---------------------------------------------------------- every slot range

def test_a_thousand_keys_over_every_slot_range_get_exactly_their_capacity(cluster, make,
                                                                          prefix):
    keys = ["user:%d" % i for i in range(1000)]
    slots = cluster.keyslots([prefix + k for k in keys])   # the core hashes prefix + key
    ms = masters(cluster)
    assert len(ms) == 3
    for m in ms:
        for lo, hi in m.slots:
            assert any(lo <= s <= hi for s in slots), "no key in %d-%d" % (lo, hi)
    c = make(cluster.url, capacity=3, rate=SLOW_RATE, prefix=prefix, **REDIS_ONLY)
    assert c.lim.url == cluster.url
    rounds = [c.allow_each(keys) for _ in range(4)]
    for remaining, got in zip([2, 1, 0], rounds):
        assert [shape(d) for d in got] == [(True, remaining, 3, "redis", None)] * 1000
    assert [shape(d) for d in rounds[3]] == [(False, 0, 3, "redis", None)] * 1000
    # Each bucket lives on its slot's master (a master asked for a key of
    # another's slot answers MOVED, which raises here).
    by_master = collections.defaultdict(list)
    for k, s in zip(keys, slots):
        by_master[owner(ms, s).port].append(prefix + k)
    for m in ms:
        assert cluster.pipeline(m, [("EXISTS", k) for k in by_master[m.port]]) == \
            [1] * len(by_master[m.port])


def test_allow_many_across_every_node_answers_in_the_callers_order(cluster, make, prefix):
    keys = ["order:%d" % i for i in range(60)]
    ms = masters(cluster)
    nodes = [owner(ms, s).port for s in cluster.keyslots([prefix + k for k in keys])]
    assert len(set(nodes)) == 3
    # Costs 1..4 by position, and two keys again at the end: every answer
    # says which item it is.
    pairs = [(k, 1 + i % 4) for i, k in enumerate(keys)] + [(keys[0], 2), (keys[5], 1)]
    c = make(cluster.url, capacity=10, rate=SLOW_RATE, prefix=prefix, **REDIS_ONLY)
    got = c.allow_many(pairs)
    want = [(True, 10 - (1 + i % 4), 10, "redis", None) for i in range(60)]
    want += [(True, 10 - 1 - 2, 10, "redis", None), (True, 10 - 2 - 1, 10, "redis", None)]
    assert [shape(d) for d in got] == want
    # A batch refused in part: each item its own answer, in place.
    got = c.allow_many([(keys[3], 5), (keys[0], 8), (keys[1], 1)])
    assert [shape(d) for d in got] == [(True, 1, 10, "redis", None),
                                      (False, 7, 10, "redis", None),
                                      (True, 7, 10, "redis", None)]


def test_a_replica_as_the_only_seed_serves_every_slot(cluster, make, prefix):
    replica = next(n for n in cluster.refresh() if n.role == "replica")
    url = "redis+cluster://127.0.0.1:%d" % replica.port
    keys = ["seed:%d" % i for i in range(300)]
    assert len({owner(masters(cluster), s).port
                for s in cluster.keyslots([prefix + k for k in keys])}) == 3
    c = make(url, capacity=2, rate=SLOW_RATE, prefix=prefix, **REDIS_ONLY)
    assert [shape(d) for d in c.allow_each(keys)] == [(True, 1, 2, "redis", None)] * 300
    assert [shape(d) for d in c.allow_each(keys)] == [(True, 0, 2, "redis", None)] * 300
    assert [shape(d) for d in c.allow_each(keys)] == [(False, 0, 2, "redis", None)] * 300


def test_reset_and_peek_go_to_each_keys_own_master(cluster, make, prefix):
    ms, groups = spread(cluster, prefix, "reset", 2)
    keys = [k for g in groups for k in g]
    c = make(cluster.url, capacity=3, rate=SLOW_RATE, prefix=prefix, **REDIS_ONLY)
    assert [shape(d) for d in c.allow_each(keys)] == [(True, 2, 3, "redis", None)] * 6
    run = c._run if c.kind == "AsyncLimiter" else (lambda r: r)
    for k in keys[::2]:
        assert run(c.lim.reset(k)) is None
    got = [run(c.lim.peek(k)) for k in keys]
    assert [d.remaining for d in got] == [3, 2] * 3
    assert all(d.source == "redis" for d in got)


# ---------------------------------------------------------------- resharding

def test_resharding_under_load_fails_no_call_and_admits_each_capacity_once(cluster, make,
                                                                           prefix):
    # Three slots, one a master; 20 keys in each (a hash tag), 20 tokens each.
    tags = ["{m%d}" % i for i in range(200)]
    ms = masters(cluster)
    chosen = {}
    for tag, slot in zip(tags, cluster.keyslots(tags)):
        chosen.setdefault(owner(ms, slot).port, (tag, slot))
    assert len(chosen) == 3
    keys = ["%s:%d" % (tag, i) for tag, _ in chosen.values() for i in range(20)]
    cap = 20
    c = make(cluster.url, capacity=cap, rate=SLOW_RATE, prefix=prefix, **SLOW)
    load = Load(c, keys)
    try:
        load.calls(50)
        for tag, slot in chosen.values():
            ms = masters(cluster)
            src = owner(ms, slot)
            dst = next(m for m in ms if m is not src)
            # As redis-cli --cluster reshard does it, with calls between the
            # steps: the source answers ASK for keys it gave away, then
            # everyone MOVED.
            cluster.begin_migration(slot, src, dst)
            load.calls(50)
            cluster.move_keys(slot, src, dst, count=7)
            load.calls(50)
            cluster.move_keys(slot, src, dst)
            load.calls(50)
            cluster.finish_migration(slot, dst)
            load.calls(50)
            assert owner(masters(cluster), slot).port == dst.port
        # Until every key has been refused once: all of its tokens are spent.
        deadline = time.monotonic() + 60
        while {k for k, d, _ in load.out if not d.allowed} != set(keys):
            assert time.monotonic() < deadline
            load.calls(100)
    finally:
        out = load.end()
    assert [(k, shape(d)) for k, d, _ in out
            if d.error is not None or d.source not in ("redis", "cache")] == []
    admitted = collections.Counter(k for k, d, _ in out if d.allowed)
    assert admitted == {k: cap for k in keys}


# ------------------------------------------- AsyncLimiter: pools per node

def clients(cluster, node):
    """Client connections of node, less the one asking."""
    text = cluster.command(node, "INFO", "clients")
    return int(text.split("connected_clients:")[1].split()[0]) - 1


def spread(cluster, prefix, name, per_master):
    """per_master keys for each master, in master order, by Redis' own slots."""
    ms = masters(cluster)
    names = ["%s:%d" % (name, i) for i in range(60 * per_master)]
    found = {m.port: [] for m in ms}
    for k, s in zip(names, cluster.keyslots([prefix + k for k in names])):
        found[owner(ms, s).port].append(k)
    return ms, [found[m.port][:per_master] for m in ms]


def test_async_pools_are_bounded_per_node_and_close_ends_every_one(cluster, prefix):
    ms, groups = spread(cluster, prefix, "pool", 100)
    keys = [k for g in groups for k in g]
    before = [clients(cluster, m) for m in ms]

    async def main():
        lim = hirate.AsyncLimiter(cluster.url, capacity=5, rate=SLOW_RATE, prefix=prefix,
                                  pool_size=2, **REDIS_ONLY)
        got = await asyncio.gather(*(lim.allow(k) for k in keys))
        assert [shape(d) for d in got] == [(True, 4, 5, "redis", None)] * 300
        # 100 calls at once a master, at most 2 connections to each.
        during = [clients(cluster, m) - b for m, b in zip(ms, before)]
        assert all(1 <= n <= 2 for n in during), during
        assert lim._stats()["conns_dropped"] == 0
        await lim.close()
        with pytest.raises(hirate.ClosedError):
            await lim.allow(keys[0])
        return during

    asyncio.run(main())
    deadline = time.monotonic() + 10   # the servers see the closes a moment later
    while [clients(cluster, m) for m in ms] != before:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_async_a_cancelled_batch_across_nodes_teaches_no_breaker(cluster, prefix):
    ms, groups = spread(cluster, prefix, "cancel", 3)
    pairs = [(k, 1) for g in groups for k in g]

    async def main():
        lim = hirate.AsyncLimiter(cluster.url, capacity=5, rate=SLOW_RATE, prefix=prefix,
                                  **REDIS_ONLY)
        await lim.allow_many(pairs)   # connections to every master are open
        cluster.pause(ms[0])          # its leg waits; the others' answer
        try:
            task = asyncio.ensure_future(lim.allow_many(pairs))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            cluster.resume(ms[0])
        stats = lim._stats()
        # The paused master's leg stays on its connection, which reads its
        # reply once the master wakes (the call was sent: it may run); the
        # caller gave up, which says nothing about Redis.
        assert stats["conns_dropped"] == 0 and stats["breaker_opens"] == 0
        got = await lim.allow_many(pairs)
        await lim.close()
        return got

    got = asyncio.run(main())
    # The cancelled batch ran on the healthy masters (2 spent there); on the
    # paused one it may have run once it woke (a call sent may have run).
    assert [shape(d) for d in got[3:]] == [(True, 2, 5, "redis", None)] * 6
    assert all(shape(d) in [(True, 2, 5, "redis", None), (True, 3, 5, "redis", None)]
               for d in got[:3])


def test_async_a_stalled_node_times_out_only_its_own_items(cluster, prefix):
    ms, groups = spread(cluster, prefix, "stall", 3)
    pairs = [(k, 1) for g in groups for k in g]

    async def main():
        lim = hirate.AsyncLimiter(cluster.url, capacity=5, rate=SLOW_RATE, prefix=prefix,
                                  timeout=0.2, connect_timeout=2.0, deny_cache=False)
        await lim.allow_many(pairs)
        cluster.pause(ms[1])
        try:
            got = await lim.allow_many(pairs)
        finally:
            cluster.resume(ms[1])
        await lim.close()
        return got

    got = asyncio.run(main())
    # The stalled master's items go to the policy (the local fallback, whose
    # buckets start full); the others are Redis' answers.
    assert [shape(d) for d in got] == [(True, 3, 5, "redis", None)] * 3 + \
        [(True, 4, 5, "local", "ETIMEDOUT")] * 3 + [(True, 3, 5, "redis", None)] * 3


def test_async_two_event_loops_share_one_limit_with_pools_of_their_own(cluster, prefix):
    ms, groups = spread(cluster, prefix, "loops", 20)
    keys = [k for g in groups for k in g]
    lim = hirate.AsyncLimiter(cluster.url, capacity=4, rate=SLOW_RATE, prefix=prefix,
                              **REDIS_ONLY)
    results = {}

    def in_thread(name):
        async def main():
            got = [await lim.allow(k) for k in keys]
            results[name] = (got, len(lim._pools[asyncio.get_running_loop()]))
        asyncio.run(main())

    threads = [threading.Thread(target=in_thread, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # Each key was allowed twice, once from each loop: 3 and 2 left, in
    # whichever order the loops came.
    for i in range(len(keys)):
        assert sorted(results[n][0][i].remaining for n in "ab") == [2, 3]
    assert all(d.source == "redis" for n in "ab" for d in results[n][0])
    assert results["a"][1] >= 3 and results["b"][1] >= 3   # a pool per node each
    assert lim._pools == {}   # asyncio.run closed each loop's pools
    asyncio.run(lim.close())


# ------------------------------------------------------------------ failover

@pytest.mark.parametrize("kind", KINDS)
def test_failover_under_load_keeps_healthy_shards_on_redis_and_finds_the_new_master(kind):
    with RedisCluster(masters=3, replicas=1) as cl:
        # A shard's outage must not stop the others: without this, every
        # node refuses every key (CLUSTERDOWN) from the moment the dead
        # master is marked failed until its replica takes over.
        for n in cl.nodes:
            cl.command(n, "CONFIG", "SET", "cluster-require-full-coverage", "no")
        ms = masters(cl)
        victim = ms[0]
        names = ["fo:%d" % i for i in range(300)]
        shard = {}
        for k, s in zip(names, cl.keyslots(["rl:" + k for k in names])):
            shard.setdefault(owner(ms, s).port, []).append(k)
        keys = [k for m in ms for k in shard[m.port][:10]]
        dead = set(shard[victim.port][:10])
        c = Client(kind, cl.url, capacity=10 ** 9, rate=1000.0, on_error="local",
                   connect_timeout=0.25, timeout=1.0)
        load = Load(c, keys)
        try:
            load.calls(200)
            killed = time.monotonic()
            cl.kill(victim)
            cl.wait_failover(victim, timeout=60)
            promoted = time.monotonic()
            # Found: every key of the dead shard is decided by Redis again.
            deadline = promoted + 60
            while True:
                back = {k for k, d, t in load.out if k in dead and t > promoted
                        and d.source == "redis"}
                if back == dead:
                    break
                assert time.monotonic() < deadline, "the promoted replica was not found"
                load.calls(50)
            found = time.monotonic()
            load.calls(300)
        finally:
            out = load.end()
            c.close()
    healthy = [(k, shape(d)) for k, d, _ in out if k not in dead and d.source != "redis"]
    assert healthy == []
    # Before the kill and once found, the dead shard's keys were Redis'; in
    # between the policy (local) answered, never an error.
    assert all(d.source == "redis" for k, d, t in out if k in dead and t < killed)
    assert all(d.source == "redis" for k, d, t in out if k in dead and t > found)
    assert all(d.allowed and d.source in ("redis", "local") for k, d, _ in out)
    # A loose bound: the cluster takes its node timeout (1 s) and an
    # election; the core asks for the map again at most once per interval.
    assert found - killed < 30
    print("\n%s: kill -> promoted %.2f s, promoted -> found %.2f s"
          % (kind, promoted - killed, found - promoted))


# ----------------------------------------------------------------------- TLS

def test_a_tls_cluster_gives_each_key_exactly_its_capacity(tls_cluster, certs, make,
                                                           prefix):
    url = tls_cluster.url
    assert url.startswith("rediss+cluster://localhost:")
    keys = ["tls:%d" % i for i in range(300)]
    assert len({owner(masters(tls_cluster), s).port
                for s in tls_cluster.keyslots([prefix + k for k in keys])}) == 3
    c = make(url, capacity=2, rate=SLOW_RATE, prefix=prefix,
             tls_ca_file=str(certs / "ca.crt"), **REDIS_ONLY)
    assert [shape(d) for d in c.allow_each(keys)] == [(True, 1, 2, "redis", None)] * 300
    assert [shape(d) for d in c.allow_each(keys)] == [(True, 0, 2, "redis", None)] * 300
    assert [shape(d) for d in c.allow_each(keys)] == [(False, 0, 2, "redis", None)] * 300
    got = c.allow_many([(k, 1) for k in keys[:30]])
    assert [shape(d) for d in got] == [(False, 0, 2, "redis", None)] * 30


# --------------------------------------------------------------------- Flask

def test_a_flask_route_limits_exactly_over_a_cluster_url(cluster):
    app = Flask(__name__)
    app.testing = True
    limiter = RateLimiter(app, url=cluster.url, prefix="flask:", **SLOW)

    @app.get("/limited")
    @limiter.limit(3, 0.1)
    def limited():
        return "ok"

    client = app.test_client()
    seen = []
    for _ in range(4):
        r = client.get("/limited")
        seen.append((r.status_code, r.headers["RateLimit"], r.headers.get("Retry-After")))
    assert seen == [
        (200, '"3-per-30s";r=2;t=10', None),
        (200, '"3-per-30s";r=1;t=20', None),
        (200, '"3-per-30s";r=0;t=30', None),
        (429, '"3-per-30s";r=0;t=10', "10"),
    ]
    key = "flask:{ip:127.0.0.1}|ep:limited|3/0.1"
    assert cluster.command(cluster.master_of(cluster.keyslot(key)), "EXISTS", key) == 1
    limiter.close(app)


# ------------------------------------------------------------ the leg hooks

def test_a_single_redis_op_is_one_leg_on_node_0(redis):
    lim = hirate.Limiter(redis.url, capacity=3, rate=SLOW_RATE, **SLOW)
    assert lim.is_cluster is False
    assert lim._endpoint(0) == lim._endpoint()
    op = lim._op_start([("a", 1), ("b", 1)], True)
    assert (op.legs, op.leg_node(0), op.leg_request(0)) == (1, 0, op.request)
    with pytest.raises(IndexError):
        op.leg_node(1)
    with pytest.raises(IndexError):
        op.leg_node(-1)
    lim.close()   # a round cut off by close(): ClosedError, nothing sent
    assert op.next() == hirate._hirate.IO_DONE and op.done and op.legs == 0
    assert [type(r) for r in op.results()] == [hirate.ClosedError] * 2


def test_a_cluster_op_has_a_leg_a_node_and_each_node_its_endpoint(cluster, prefix):
    ms, groups = spread(cluster, prefix, "legs", 2)
    lim = hirate.Limiter(cluster.url, capacity=3, rate=SLOW_RATE, prefix=prefix,
                         **REDIS_ONLY)
    assert lim.is_cluster is True
    # The map is learnt by the first calls; after them, a batch goes to the
    # three masters at once, one leg each.
    lim.allow_many([(k, 1) for g in groups for k in g])
    op = lim._op_start([(k, 1) for g in groups for k in g], True)
    nodes = sorted(op.leg_node(i) for i in range(op.legs))
    assert len(set(nodes)) == op.legs >= 3
    ports = {lim._endpoint(n)["port"] for n in nodes}
    assert {m.port for m in ms} <= ports
    with pytest.raises(hirate.ConfigError):
        lim._endpoint(10_000)   # a number the core never gave
    op.fail(hirate._hirate.ECLOSED)
    assert op.done
    lim.close()
