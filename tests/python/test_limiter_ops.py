"""The low-level hooks AsyncLimiter is built on (Limiter._op_start, Op,
_endpoint, _handshake, _stats), driven here over a plain blocking socket."""

import socket

import pytest

import hirate
from hirate import _hirate
from redis_server import RedisServer

pytestmark = pytest.mark.timeout(60)


def connect(lim):
    host, port, path, connect_timeout, timeout = lim._endpoint()
    s = socket.create_connection((host, port), timeout=5)
    request, replies = lim._handshake()
    if replies:
        s.sendall(request)
        got = b""
        while got.count(b"\r\n") < replies:
            got += s.recv(4096)
        assert got == b"+OK\r\n" * replies, got
    return s


def drive(op, sock, chunk=65536):
    """Sends the op's requests and feeds it the replies, `chunk` bytes at a
    time; returns how many requests went out."""
    sock.sendall(op.request)
    sent, buf = 1, b""
    while True:
        data = sock.recv(chunk)
        assert data, "Redis closed the connection"
        buf += data
        state, used = op.feed(buf)
        assert 0 <= used <= len(buf)
        buf = buf[used:]
        if state == _hirate.OP_DONE:
            assert buf == b""
            return sent
        if state == _hirate.OP_SEND:
            sock.sendall(op.request)
            sent += 1
        else:
            assert state == _hirate.OP_MORE


def test_an_op_gives_the_decisions_allow_would(redis):
    lim = hirate.Limiter(redis.url, capacity=3, rate=0.001, prefix="op:", on_error="closed",
                         timeout=5, connect_timeout=5)
    sock = connect(lim)
    try:
        op = lim._op_start([("a", 1), ("b", 4), ("a", 2)], True)
        assert op.request.startswith(b"*8\r\n$7\r\nEVALSHA\r\n")
        assert not op.done
        assert drive(op, sock, chunk=1) == 2   # a fresh server: NOSCRIPT, then EVAL once
        assert op.done and op.request is None and op.drop is False
        got = op.results()
        assert [(d.allowed, d.remaining, d.source) for d in got] == [
            (True, 2, "redis"), (False, 3, "redis"), (True, 0, "redis")]
        assert got[1].retry_after_us is None
        # the C client sees the same bucket, and the script is cached now
        assert not lim.peek("a").allowed
        op = lim._op_start([("b", 1)], False)
        assert drive(op, sock) == 1
        assert op.results()[0].remaining == 3
    finally:
        sock.close()


def test_an_op_with_injected_time(redis):
    lim = hirate.Limiter(redis.url, capacity=10, rate=1.0, prefix="opt:", deny_cache=False)
    sock = connect(lim)
    try:
        op = lim._op_start([("k", 4)], True, now_us=1_000_000)
        drive(op, sock)
        d = op.results()[0]
        assert (d.remaining, d.reset_after_us, d.time_us) == (6, 4_000_000, 1_000_000)
        op = lim._op_start([("k", 1)], False, 3_000_000)
        drive(op, sock)
        assert op.results()[0].remaining == 8
    finally:
        sock.close()


def test_what_needs_no_redis_is_decided_at_start(redis):
    lim = hirate.Limiter(redis.url, capacity=1, rate=0.001, prefix="opc:")
    sock = connect(lim)
    try:
        op = lim._op_start([("k", 1)], True)
        drive(op, sock)
        op = lim._op_start([("k", 1)], True)   # the deny cache knows this refusal
        assert op.done and op.request is None
        assert op.results()[0].source == "cache"
    finally:
        sock.close()
    mem = hirate.Limiter(capacity=2, rate=0.001)
    op = mem._op_start([("k", 1), ("k", 2)], True)
    assert op.request is None and op.done and not op.drop
    assert [d.allowed for d in op.results()] == [True, False]
    op = mem._op_start([("k", 1)], True, 5)
    assert op.results()[0].time_us == 5


def test_a_failed_op_is_decided_by_the_policy(redis):
    lim = hirate.Limiter(redis.url, capacity=5, rate=0.001, prefix="opf:", on_error="closed")
    op = lim._op_start([("k", 1), ("j", 0)], True)
    op.fail(_hirate.ETIMEDOUT)
    assert op.done and op.drop and op.request is None
    got = op.results()
    assert [(d.allowed, d.source, d.error) for d in got] == [
        (False, "fail_closed", "ETIMEDOUT"), (True, "fail_closed", "ETIMEDOUT")]
    op.fail(_hirate.EIO)   # after the outcome: nothing changes
    assert op.results() == got
    # the breaker is open: the next op needs no I/O
    nxt = lim._op_start([("k", 1)], True)
    assert nxt.request is None and nxt.results()[0].error == "ETIMEDOUT"
    assert lim._stats()["breaker_opens"] == 1


def test_a_malformed_reply_drops_the_connection(redis):
    lim = hirate.Limiter(redis.url, capacity=5, rate=0.001, prefix="opm:", on_error="open")
    op = lim._op_start([("k", 1)], True)
    state, used = op.feed(b"*8\r\n:1\r\n?what\r\n")
    assert state == _hirate.OP_DONE and op.drop
    d = op.results()[0]
    assert (d.source, d.error) == ("fail_open", "EPROTO")


def test_an_op_dropped_undecided_is_given_up_and_teaches_the_breaker_nothing(redis):
    lim = hirate.Limiter(redis.url, capacity=5, rate=0.001, prefix="opd:", on_error="open")
    op = lim._op_start([("k", 1)], True)
    assert op.request
    del op   # a cancelled task: neither an outage nor a probe left waiting
    d = lim.allow("k")
    assert (d.source, d.error, d.remaining) == ("redis", None, 4)
    assert lim._stats()["breaker_opens"] == 0


def test_bad_items_fail_the_op_with_their_own_error(redis):
    lim = hirate.Limiter(redis.url, capacity=5, rate=0.001, prefix="ope:")
    op = lim._op_start([("ok", 1), ("", 1), ("x", -2)], True)
    op.fail(_hirate.ECONNECT)
    with pytest.raises(hirate.ConfigError, match="key is empty") as info:
        op.results()
    assert info.value.name == "EKEY"
    with pytest.raises(TypeError):
        lim._op_start([("ok", 1.5)], True)


def test_bad_items_decided_at_start_raise_at_once(redis):
    for lim in (hirate.Limiter(redis.url, capacity=5, rate=0.001, prefix="opb:"),
                hirate.Limiter(capacity=5, rate=0.001)):
        with pytest.raises(hirate.ConfigError, match="key is 513 bytes") as info:
            lim._op_start([("k" * 513, 1)], True)
        assert info.value.name == "EKEY"
        with pytest.raises(hirate.ConfigError, match="got -1") as info:
            lim._op_start([("k", -1)], False, 7)
        assert info.value.name == "ECOST"
    mem = hirate.Limiter(capacity=5, rate=0.001)
    with pytest.raises(hirate.ConfigError, match="key is empty"):
        mem._op_start([("a", 2), ("", 1)], True)   # as allow_many: the rest was decided
    assert mem.peek("a").remaining == 3


def test_op_misuse_is_refused(redis):
    lim = hirate.Limiter(redis.url, capacity=5, rate=0.001, prefix="opu:")
    op = lim._op_start([("k", 1)], True)
    with pytest.raises(ValueError, match="results\\(\\) before the Op is decided"):
        op.results()
    with pytest.raises(ValueError, match="hirate error code"):
        op.fail(5)
    op.fail(_hirate.EIO)
    with pytest.raises(ValueError, match="already decided"):
        op.feed(b"+OK\r\n")
    with pytest.raises(TypeError):
        _hirate.Op()


def test_ops_after_close(redis):
    lim = hirate.Limiter(redis.url, capacity=5, rate=0.001, prefix="opx:")
    op = lim._op_start([("k", 1), ("", 1)], True)
    lim.close()
    with pytest.raises(hirate.ClosedError):
        op.feed(b"")
    op.fail(_hirate.EIO)   # what still waited for Redis is ClosedError now
    with pytest.raises(hirate.ClosedError, match="limiter is closed"):
        op.results()   # the first item's error
    op = None
    with pytest.raises(hirate.ClosedError):
        lim._op_start([("k", 1)], True)


def test_endpoint_and_handshake():
    lim = hirate.Limiter("redis://rl:s3cr3t@127.0.0.1:6390/2", capacity=5, rate=1,
                         connect_timeout=0.5, timeout=0.3)
    assert lim._endpoint() == ("127.0.0.1", 6390, None, 0.5, 0.3)
    assert lim._handshake() == (b"*3\r\n$4\r\nAUTH\r\n$2\r\nrl\r\n$6\r\ns3cr3t\r\n"
                                b"*2\r\n$6\r\nSELECT\r\n$1\r\n2\r\n", 2)
    assert hirate.Limiter("redis://:pw@[::1]", capacity=5, rate=1)._endpoint()[:2] == (
        "::1", 6379)
    mem = hirate.Limiter(capacity=5, rate=1)
    for call in (mem._endpoint, mem._handshake):
        with pytest.raises(hirate.ConfigError, match="no Redis URL"):
            call()


def test_a_handshake_over_a_socket_authenticates():
    server = RedisServer(["--requirepass", "pw"])
    try:
        lim = hirate.Limiter(f"redis://:pw@127.0.0.1:{server.port}/1", capacity=2, rate=0.001,
                             prefix="oph:")
        sock = connect(lim)
        try:
            op = lim._op_start([("k", 2)], True)
            drive(op, sock)
            assert op.results()[0].remaining == 0
        finally:
            sock.close()
        assert server.command("AUTH", "pw") == "OK"
    finally:
        server.close()


def test_stats():
    lim = hirate.Limiter(capacity=5, rate=1)
    lim.allow("a")
    lim.allow("b")
    s = lim._stats()
    assert s == dict(connects=0, evalsha=0, eval=0, conns_dropped=0, cache_hits=0, policy=0,
                     breaker_opens=0, memory_keys=2, local_keys=0, cache_keys=0)
