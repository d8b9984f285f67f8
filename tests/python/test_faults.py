"""Spot checks of the fault matrix (tests/c/test_faults*.c has all of it)
from Python, through the same core:

- Redis hangs (SIGSTOP): the call times out and the policy decides; the
  call is not sent again, and Redis may still run it (a timeout has an
  unknown outcome);
- Redis is killed: connections are refused and the policy decides, then
  the limiter is back on Redis by itself after a restart (EVAL once, since
  the new server has no script);
- a wrong password: AuthError (EAUTH) under every policy, without the
  password in any message;
- malformed replies from a mock RESP server (tests/integration/
  mock_resp.py): a clean EPROTO (or EIO) and the policy, never a crash or
  a huge allocation, then Redis again once the replies are good.
"""

import sys
import time
from pathlib import Path

import pytest

import hirate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from mock_resp import MockRedis  # noqa: E402
from redis_server import RedisServer  # noqa: E402

pytestmark = pytest.mark.timeout(120)

SOURCE = {"local": "local", "open": "fail_open", "closed": "fail_closed"}


def limiter(url, on_error, **kw):
    # The EVALSHA path (functions=False): the mock server plays its replies,
    # and the counts below are EVAL's; test_functions has FCALL's.
    opts = dict(capacity=5, rate=0.001, on_error=on_error, timeout=0.3, connect_timeout=0.3,
                functions=False)
    opts.update(kw)
    return hirate.Limiter(url, **opts)


def until_redis(lim, key="probe", within=15.0):
    """Calls (spending nothing) until Redis decides again: the breaker lets
    one probe through after its backoff."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        d = lim.allow(key, 0)
        if d.source == "redis":
            return d
        time.sleep(0.02)
    pytest.fail(f"not back on Redis within {within} s")


@pytest.mark.parametrize("on_error", ["closed", "open", "local"])
def test_a_hung_redis_times_out_to_the_policy_and_the_call_is_not_sent_twice(own_redis,
                                                                            on_error):
    lim = limiter(own_redis.url, on_error)
    assert lim.allow("warm").source == "redis"   # a pooled connection
    own_redis.stop()
    try:
        t = time.monotonic()
        d = lim.allow("k", 2)
        took = time.monotonic() - t
    finally:
        own_redis.cont()
    assert (d.source, d.error) == (SOURCE[on_error], "ETIMEDOUT")
    assert d.allowed == (on_error != "closed")
    assert 0.25 <= took < 3.0   # the 0.3 s timeout, with room for a busy machine
    # The outcome was unknown: Redis read the call when it woke up and ran
    # it. Sent once, spent once: 5 - 2, never 5 - 4.
    d = until_redis(lim, "k")
    assert d.remaining == 3


@pytest.mark.parametrize("on_error", ["closed", "open", "local"])
def test_a_killed_redis_is_refused_to_the_policy_then_back_after_a_restart(own_redis,
                                                                         on_error):
    lim = limiter(own_redis.url, on_error)
    assert lim.allow("k").remaining == 4
    own_redis.kill()
    t = time.monotonic()
    d = lim.allow("k")
    assert time.monotonic() - t < 1.0   # refused: no timeout to wait out
    assert d.source == SOURCE[on_error]
    assert d.error in ("ECONNECT", "EIO")   # a new connection refused, or the pooled one broken
    # While the breaker is open nothing is tried: the policy answers at once,
    # but for one probe per backoff (75 ms at the least, with its jitter; a
    # stalled machine may let a probe or two through).
    before, t = lim._stats()["connects"], time.monotonic()
    for _ in range(50):
        assert lim.allow("k", 0).source == SOURCE[on_error]
    probes = lim._stats()["connects"] - before
    assert probes <= 1 + (time.monotonic() - t) / 0.075, probes
    own_redis.start(own_redis.port)
    evals = lim._stats()["eval"]
    until_redis(lim)
    # A new server: an empty bucket store, and no script (EVAL once, then EVALSHA).
    d = lim.allow("k")
    assert (d.source, d.error, d.remaining) == ("redis", None, 4)
    assert lim._stats()["eval"] - evals == 1


def test_a_wrong_password_is_auth_error_under_every_policy_and_never_shown():
    canary = "Sp0t-check-canary-91"
    server = RedisServer(["--requirepass", "the-right-one"])
    try:
        for on_error in ("local", "open", "closed"):
            lim = limiter(f"redis://:{canary}@127.0.0.1:{server.port}", on_error)
            def first_of_batch():
                got, = lim.allow_many([("k", 1)])   # the error in the item's place
                raise got
            for call in (lambda: lim.allow("k"), lambda: lim.peek("k"), first_of_batch,
                         lambda: lim.reset("k")):
                with pytest.raises(hirate.AuthError) as info:
                    call()
                e = info.value
                assert (e.name, e.code) == ("EAUTH", hirate._hirate.EAUTH)
                assert isinstance(e, PermissionError)
                assert "WRONGPASS" in str(e)
                for text in (str(e), repr(e), repr(lim), lim.url):
                    assert canary not in text, text
            lim.close()
    finally:
        server.close()


MALFORMED = [
    ("huge-array", "EPROTO"),   # *4294967295: refused before any allocation
    ("neg-bulk", "EPROTO"),
    ("status", "EPROTO"),       # +OK where the script's array belongs
    ("deep", "EPROTO"),         # *1 nested 100000 times
    ("garbage", "EPROTO"),
    ("cut", "EIO"),             # the connection closes mid-reply
]


@pytest.mark.parametrize("play,error", MALFORMED)
@pytest.mark.parametrize("on_error", ["closed", "open", "local"])
def test_a_malformed_reply_is_a_clean_failure_for_the_policy(play, error, on_error):
    server = MockRedis([play, "good"])
    try:
        lim = limiter(server.url, on_error, timeout=2, connect_timeout=2)
        d = lim.allow("k", 2)
        assert (d.source, d.error) == (SOURCE[on_error], error)
        assert d.allowed == (on_error != "closed")
        if on_error == "open":
            assert d.remaining == 3
        # The connection that carried it is dropped; once the replies are
        # good the limiter is back on "Redis".
        d = until_redis(lim, "k")
        assert (d.allowed, d.remaining, d.error) == (True, 4, None)
        assert lim._stats()["conns_dropped"] >= 1
        assert [w[0] for w in server.commands] == [b"EVALSHA", b"EVALSHA"]
        assert server.commands[1][3] == b"rl:k"
        lim.close()
    finally:
        server.close()


def test_reset_returns_a_malformed_reply_as_backend_error():
    server = MockRedis(["status"])
    try:
        lim = limiter(server.url, "local", timeout=2, connect_timeout=2)
        with pytest.raises(hirate.BackendError) as info:
            lim.reset("k")
        assert info.value.name == "EPROTO"
        assert str(info.value).startswith("malformed reply from Redis")
        assert server.commands == [[b"DEL", b"rl:k"]]
    finally:
        server.close()
