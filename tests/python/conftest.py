"""Fixtures every Python test may use.

redis      one redis-server shared by the session, emptied (FLUSHALL, SCRIPT
           FLUSH) before each test that asks for it
own_redis  a redis-server for one test alone, which it may stop (SIGSTOP),
           kill, restart or reconfigure
"""

import pytest

from redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_session():
    server = RedisServer()
    yield server
    server.close()


@pytest.fixture
def redis(redis_session):
    """The session's server, empty. Do not stop or kill it: use own_redis."""
    if redis_session.proc.poll() is not None:
        redis_session.start(redis_session.port)
    redis_session.command("FLUSHALL")
    redis_session.command("SCRIPT", "FLUSH")
    return redis_session


@pytest.fixture
def own_redis():
    """A server for this test alone, which it may stop, kill or restart."""
    server = RedisServer()
    yield server
    server.close()
