"""Fixtures every Python test may use.

redis      one redis-server shared by the session, emptied (FLUSHALL, SCRIPT
           FLUSH) before each test that asks for it
own_redis  a redis-server for one test alone, which it may stop (SIGSTOP),
           kill, restart or reconfigure
certs      the TLS material of tests/support/make_certs.sh, made once
tls_redis  one TLS-only redis-server (the CA's certificate for localhost,
           127.0.0.1 and ::1) shared by the session, emptied as `redis`
cluster    a 3-master Redis Cluster with a replica each
           (tests/support/redis_cluster.py), shared by the session and
           emptied before each test that asks for it; started only when a
           test asks. Do not kill its nodes: start a RedisCluster of your own.
sentinel   a Redis Sentinel group (tests/support/redis_sentinel.py: a master,
           a replica, 3 sentinels), shared by the session, its master emptied
           (FLUSHALL, SCRIPT FLUSH, FUNCTION FLUSH) before each test that
           asks for it; started only when a test asks. Do not fail it over or
           kill its nodes (settling again takes a sentinel ~20 s): start a
           SentinelGroup of your own.
"""

import pathlib
import sys

import pytest

from redis_server import RedisServer, make_certs

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "support"))
from redis_cluster import RedisCluster  # noqa: E402
from redis_sentinel import SentinelGroup  # noqa: E402


@pytest.fixture(scope="session")
def redis_session():
    server = RedisServer()
    yield server
    server.close()


def emptied(server):
    if server.proc.poll() is not None:
        server.start(server.port)
    server.command("FLUSHALL")
    server.command("SCRIPT", "FLUSH")
    return server


@pytest.fixture
def redis(redis_session):
    """The session's server, empty. Do not stop or kill it: use own_redis."""
    return emptied(redis_session)


@pytest.fixture
def own_redis():
    """A server for this test alone, which it may stop, kill or restart."""
    server = RedisServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def tls_redis_session(certs):
    server = RedisServer(tls=certs)
    yield server
    server.close()


@pytest.fixture
def tls_redis(tls_redis_session):
    """The session's TLS server, empty; rediss:// URLs need
    tls_ca_file=certs / "ca.crt" to trust it."""
    return emptied(tls_redis_session)


@pytest.fixture(scope="session")
def cluster_session():
    c = RedisCluster(masters=3, replicas=1)
    yield c
    c.stop()


@pytest.fixture
def cluster(cluster_session):
    """The session's cluster, every master emptied (FLUSHALL, SCRIPT FLUSH)."""
    for node in cluster_session.nodes:
        if node.role == "master":
            cluster_session.pipeline(node, [("FLUSHALL",), ("SCRIPT", "FLUSH")])
    return cluster_session


@pytest.fixture(scope="session")
def sentinel_session():
    g = SentinelGroup(replicas=1, sentinels=3)
    yield g
    g.stop()


@pytest.fixture
def sentinel(sentinel_session):
    """The session's Sentinel group, its master emptied (the replica follows)."""
    master = sentinel_session.master
    for cmd in (("FLUSHALL",), ("SCRIPT", "FLUSH"), ("FUNCTION", "FLUSH")):
        sentinel_session.command(master, *cmd)
    return sentinel_session
