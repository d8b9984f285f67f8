"""Limiter.check() and AsyncLimiter.check(): hirate.Health from the core's
health check, against a live Redis (before and after its first decision),
a stopped one, one that wants another password, a replica, the session's
cluster and Sentinel group, and a limiter without Redis."""

import asyncio
import json

import pytest

import hirate
from redis_server import RedisServer

KINDS = ["Limiter", "AsyncLimiter"]
SLOW = dict(connect_timeout=2.0, timeout=2.0)


def make(kind, url, **kw):
    opts = dict(capacity=5, rate=1, prefix="chk:", **SLOW)
    opts.update(kw)
    return (hirate.Limiter if kind == "Limiter" else hirate.AsyncLimiter)(url, **opts)


def run(lim, method, *args):
    r = getattr(lim, method)(*args)
    return asyncio.run(r) if asyncio.iscoroutine(r) else r


def check_and_close(lim, *before):
    """check() (after the calls in before), and close, in one event loop."""
    async def both():
        for call in before:
            await getattr(lim, call[0])(*call[1:])
        h = await lim.check()
        await lim.close()
        return h
    if isinstance(lim, hirate.AsyncLimiter):
        return asyncio.run(both())
    for call in before:
        getattr(lim, call[0])(*call[1:])
    h = lim.check()
    lim.close()
    return h


@pytest.mark.parametrize("kind", KINDS)
def test_memory_limiter_is_healthy_with_no_node(kind):
    h = check_and_close(make(kind, None))
    assert h == hirate.Health(ok=True, error=None, nodes=())
    assert bool(h) is True
    assert h.as_dict() == {"ok": True, "error": None, "nodes": []}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("functions", [True, False])
def test_live_redis_before_and_after_the_first_decision(kind, functions, redis):
    redis.command("FUNCTION", "FLUSH")
    h = check_and_close(make(kind, redis.url, functions=functions))
    assert h.ok and h.error is None and len(h.nodes) == 1
    node = h.nodes[0]
    assert (node.addr, node.ok, node.error, node.message, node.role, node.functions,
            node.loaded) == (f"127.0.0.1:{redis.port}", True, None, "", "master", functions,
                             False)
    assert 0 <= node.latency < 2.0
    h = check_and_close(make(kind, redis.url, functions=functions), ("allow", "k"))
    assert (h.ok, h.nodes[0].functions, h.nodes[0].loaded) == (True, functions, True)
    json.dumps(h.as_dict())   # JSON-ready for a readiness endpoint


@pytest.mark.parametrize("kind", KINDS)
def test_check_is_not_a_decision(kind, redis):
    lim = make(kind, redis.url)

    async def go():
        await lim.allow("k")
        before = lim.stats()
        h = await lim.check()
        after = lim.stats()
        await lim.close()
        return h, before, after
    if kind == "Limiter":
        lim.allow("k")
        before = lim.stats()
        h = lim.check()
        after = lim.stats()
        lim.close()
    else:
        h, before, after = asyncio.run(go())
    assert h.ok
    assert after == before
    assert after.decisions["redis"] == 1


@pytest.mark.parametrize("kind", KINDS)
def test_stopped_server(kind, own_redis):
    port = own_redis.port
    own_redis.kill()
    h = check_and_close(make(kind, own_redis.url))
    assert (h.ok, h.error) == (False, "ECONNECT")
    node = h.nodes[0]
    assert (node.addr, node.ok, node.error, node.role, node.functions, node.loaded,
            node.latency) == (f"127.0.0.1:{port}", False, "ECONNECT", None, None, None, None)
    assert f"127.0.0.1:{port}" in node.message
    assert bool(h) is False


@pytest.mark.parametrize("kind", KINDS)
def test_wrong_password_is_eauth_and_never_shown(kind):
    server = RedisServer(extra=["--requirepass", "right-pw-81d3"])
    try:
        url = f"redis://:wrong-pw-51ab@127.0.0.1:{server.port}"
        h = check_and_close(make(kind, url))
        assert (h.ok, h.error, h.nodes[0].error) == (False, "EAUTH", "EAUTH")
        assert "WRONGPASS" in h.nodes[0].message
        assert "wrong-pw-51ab" not in repr(h) and "right-pw-81d3" not in repr(h)
        h = check_and_close(make(kind, f"redis://:right-pw-81d3@127.0.0.1:{server.port}"))
        assert h.ok
    finally:
        server.close()


@pytest.mark.parametrize("kind", KINDS)
def test_replica_is_not_healthy(kind, redis):
    replica = RedisServer(extra=["--replicaof", "127.0.0.1", str(redis.port)])
    try:
        h = check_and_close(make(kind, replica.url))
        node = h.nodes[0]
        assert (h.ok, h.error, node.role) == (False, "ESERVER", "slave")
        assert node.message == (f"Redis at 127.0.0.1:{replica.port} is not a master "
                                "(ROLE: slave): it cannot take decisions")
    finally:
        replica.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
def test_cluster_masters(kind, cluster):
    h = check_and_close(make(kind, cluster.url))
    masters = sorted(f"127.0.0.1:{n.port}" for n in cluster.nodes if n.role == "master")
    assert h.ok
    assert sorted(n.addr for n in h.nodes) == masters
    assert {n.role for n in h.nodes} == {"master"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
def test_sentinel_master(kind, sentinel):
    h = check_and_close(make(kind, sentinel.url))
    assert h.ok
    assert [(n.addr, n.role) for n in h.nodes] == [(f"127.0.0.1:{sentinel.master.port}",
                                                    "master")]


def test_check_after_close_raises_closed():
    lim = hirate.Limiter(None, capacity=1, rate=1)
    lim.close()
    with pytest.raises(hirate.ClosedError):
        lim.check()
