"""The breaker's log records through the logger "hirate", during real
outages of a redis-server the test starts: it hangs (SIGSTOP) or dies
(SIGKILL, then a restart on its port) while calls keep flowing. One WARNING
when the outage begins (not one per call, nor per failed probe), one INFO
when Redis answers again, with the real port and never the password."""

import asyncio
import logging
import re
import threading
import time

import pytest

import hirate
from redis_server import RedisServer

pytestmark = pytest.mark.timeout(90)

PASSWORD = "s3cr3t-pw"
WARNING = re.compile(r"Redis at 127\.0\.0\.1:(\d+) failed \((.+)\): the '(\w+)' policy decides "
                     r"until it answers again")
INFO = re.compile(r"Redis at 127\.0\.0\.1:(\d+) answers again, after (\d+\.\d) s")


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []
        self.mu = threading.Lock()

    def emit(self, record):
        with self.mu:
            self.records.append((record.levelno, record.getMessage()))

    def take(self):
        with self.mu:
            out, self.records = self.records, []
        return out


@pytest.fixture
def records():
    h = Records()
    log = logging.getLogger("hirate")
    log.addHandler(h)
    old = log.level
    log.setLevel(logging.INFO)
    yield h
    log.removeHandler(h)
    log.setLevel(old)


@pytest.fixture
def pw_redis():
    server = RedisServer(extra=["--requirepass", PASSWORD])
    yield server
    server.close()


def url_of(server):
    return f"redis://:{PASSWORD}@127.0.0.1:{server.port}"


def flow(call, seconds):
    """Calls call() for that long, one every 10 ms: how many calls."""
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        call()
        n += 1
        time.sleep(0.01)
    return n


def until_redis(call, seconds=20):
    """Calls call() until Redis decides again (the probe succeeded)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if call().source == "redis":
            return
        time.sleep(0.02)
    raise AssertionError("Redis did not answer again")


def check_outage(got, port, policy, seconds_at_least):
    assert [lvl for lvl, _ in got] == [logging.WARNING, logging.INFO], got
    (_, warning), (_, info) = got
    m = WARNING.fullmatch(warning)
    assert m, warning
    assert (int(m.group(1)), m.group(3)) == (port, policy)
    m = INFO.fullmatch(info)
    assert m, info
    assert int(m.group(1)) == port and float(m.group(2)) >= seconds_at_least
    assert all(PASSWORD not in text for _, text in got)
    return WARNING.fullmatch(warning).group(2)


@pytest.mark.parametrize("policy", ["local", "open", "closed"])
def test_a_hang_logs_one_warning_and_one_info(pw_redis, records, policy):
    lim = hirate.Limiter(url_of(pw_redis), capacity=1000, rate=100.0, on_error=policy,
                         timeout=0.1, connect_timeout=0.2)
    call = lambda: lim.allow("k")   # noqa: E731
    assert call().source == "redis"
    assert records.take() == []
    for _ in range(2):   # two outages, a pair of records each
        pw_redis.stop()
        try:
            assert flow(call, 1.0) > 20   # many calls, several failed probes
        finally:
            pw_redis.cont()
        until_redis(call)
        why = check_outage(records.take(), pw_redis.port, policy, 0.5)
        assert why   # the failure's own words
    assert lim.stats().breaker_opens == lim.stats().breaker_closes == 2


def test_a_dead_server_logs_its_refused_connections_once(pw_redis, records):
    lim = hirate.Limiter(url_of(pw_redis), capacity=1000, rate=100.0, timeout=0.5,
                         connect_timeout=0.5)
    call = lambda: lim.allow("k")   # noqa: E731
    assert call().source == "redis"
    pw_redis.kill()
    assert flow(call, 1.0) > 20
    pw_redis.start(pw_redis.port)
    until_redis(call)
    check_outage(records.take(), pw_redis.port, "local", 0.5)


def test_threads_share_one_outage(pw_redis, records):
    lim = hirate.Limiter(url_of(pw_redis), capacity=10**6, rate=1e5, timeout=0.1,
                         connect_timeout=0.2)
    assert lim.allow("k").source == "redis"
    pw_redis.stop()
    try:
        threads = [threading.Thread(target=flow, args=(lambda: lim.allow("k"), 1.0))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        pw_redis.cont()
    until_redis(lambda: lim.allow("k"))
    check_outage(records.take(), pw_redis.port, "local", 0.5)


def test_async_limiter_logs_the_same(pw_redis, records):
    async def main():
        async with hirate.AsyncLimiter(url_of(pw_redis), capacity=1000, rate=100.0,
                                       on_error="closed", timeout=0.1,
                                       connect_timeout=0.2) as lim:
            assert (await lim.allow("k")).source == "redis"
            pw_redis.stop()
            try:
                end = time.monotonic() + 1.0
                while time.monotonic() < end:
                    await lim.allow("k")
                    await asyncio.sleep(0.01)
            finally:
                pw_redis.cont()
            end = time.monotonic() + 20
            while (await lim.allow("k")).source != "redis":
                assert time.monotonic() < end
                await asyncio.sleep(0.02)

    asyncio.run(main())
    check_outage(records.take(), pw_redis.port, "closed", 0.5)
