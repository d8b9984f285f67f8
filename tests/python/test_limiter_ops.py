"""The low-level hooks AsyncLimiter is built on (Limiter._endpoint,
_handshake_start and Handshake, _op_start, _op_start_reset and Op, _stats),
driven here over a plain blocking socket."""

import socket

import pytest

import hirate
from hirate import _hirate
from redis_server import RedisServer

pytestmark = pytest.mark.timeout(60)


def handshake(hs, sock):
    """Sends the handshake's bytes and feeds it the replies until it is done."""
    sock.sendall(hs.request)
    buf = b""
    while True:
        data = sock.recv(4096)
        if not data:
            return hs.fail(_hirate.EIO, "Redis closed the connection")
        buf += data
        state, used = hs.feed(buf)
        buf = buf[used:]
        if state == _hirate.IO_DONE:
            assert buf == b""
            return state
        assert state == _hirate.IO_MORE


def connect(lim):
    ep = lim._endpoint()
    hs = lim._handshake_start()
    s = socket.create_connection((ep["host"], ep["port"]), timeout=5)
    assert handshake(hs, s) == _hirate.IO_DONE
    assert hs.result() is None
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
        if state == _hirate.IO_DONE:
            assert buf == b""
            return sent
        if state == _hirate.IO_SEND:
            sock.sendall(op.request)
            sent += 1
        else:
            assert state == _hirate.IO_MORE


def test_an_op_gives_the_decisions_allow_would(redis):
    # The EVALSHA path, whose NOSCRIPT pass this counts (functions=False).
    lim = hirate.Limiter(redis.url, capacity=3, rate=0.001, prefix="op:", on_error="closed",
                         timeout=5, connect_timeout=5, functions=False)
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
    assert state == _hirate.IO_DONE and op.drop
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


def test_an_item_that_redis_refuses_gets_its_own_error_in_its_place(own_redis):
    own_redis.command("ACL", "SETUSER", "rl", "on", ">pw", "~rl:a*", "+@all")
    lim = hirate.Limiter(f"redis://rl:pw@127.0.0.1:{own_redis.port}", capacity=5, rate=0.001,
                         timeout=5, connect_timeout=5)
    sock = connect(lim)
    try:
        op = lim._op_start([("a1", 1), ("b1", 1), ("a2", 2)], True)
        drive(op, sock)
        a1, b1, a2 = op.results()
        assert (a1.remaining, a2.remaining) == (4, 3)
        assert isinstance(b1, hirate.AuthError) and b1.name == "ENOPERM" and not b1
        assert "NOPERM" in str(b1)
    finally:
        sock.close()


def test_bad_items_raise_at_start_before_anything_is_decided(redis):
    for lim in (hirate.Limiter(redis.url, capacity=5, rate=0.001, prefix="opb:"),
                hirate.Limiter(capacity=5, rate=0.001)):
        with pytest.raises(hirate.ConfigError, match="key is 513 bytes") as info:
            lim._op_start([("k" * 513, 1)], True)
        assert info.value.name == "EKEY"
        with pytest.raises(hirate.ConfigError, match="got -1") as info:
            lim._op_start([("k", -1)], False, 7)
        assert info.value.name == "ECOST"
        with pytest.raises(hirate.ConfigError, match="key is empty"):
            lim._op_start([("a", 2), ("", 1)], True)
        with pytest.raises(TypeError):
            lim._op_start([("ok", 1.5)], True)
    assert lim.peek("a").remaining == 5


def test_op_misuse_is_refused(redis):
    lim = hirate.Limiter(redis.url, capacity=5, rate=0.001, prefix="opu:")
    op = lim._op_start([("k", 1)], True)
    with pytest.raises(ValueError, match="results\\(\\) before the Op is decided"):
        op.results()
    with pytest.raises(ValueError, match="hirate error code"):
        op.fail(5)
    with pytest.raises(TypeError, match="reset's outcome"):
        op.result()
    op.fail(_hirate.EIO)
    with pytest.raises(ValueError, match="already decided"):
        op.feed(b"+OK\r\n")
    with pytest.raises(TypeError):
        _hirate.Op()


def test_ops_after_close(redis):
    lim = hirate.Limiter(redis.url, capacity=5, rate=0.001, prefix="opx:")
    op = lim._op_start([("k", 1), ("j", 1)], True)
    lim.close()
    with pytest.raises(hirate.ClosedError):
        op.feed(b"")
    op.fail(_hirate.EIO)   # what still waited for Redis is ClosedError now
    got = op.results()
    assert [type(e) for e in got] == [hirate.ClosedError, hirate.ClosedError]
    assert "limiter is closed" in str(got[0])
    op = None   # the last op frees the closed limiter
    with pytest.raises(hirate.ClosedError):
        lim._op_start([("k", 1)], True)
    with pytest.raises(hirate.ClosedError):
        lim._handshake_start()


def test_the_endpoint(certs):
    lim = hirate.Limiter("redis://rl:s3cr3t@127.0.0.1:6390/2", capacity=5, rate=1,
                         connect_timeout=0.5, timeout=0.3)
    ep = lim._endpoint()
    assert {k: ep[k] for k in ("host", "port", "path", "where", "timeout", "tls")} == dict(
        host="127.0.0.1", port=6390, path=None, where="127.0.0.1:6390", timeout=0.3, tls=False)
    assert (ep["connect_timeout"], ep["probe_timeout"]) == (0.5, 0.125)
    assert "s3cr3t" not in repr(ep)
    v6 = hirate.Limiter("redis://:pw@[::1]", capacity=5, rate=1)._endpoint()
    assert (v6["host"], v6["port"], v6["where"]) == ("::1", 6379, "[::1]:6379")
    tls = hirate.Limiter("rediss://localhost:6380", capacity=5, rate=1, tls_verify=False,
                         tls_server_name="redis.example", tls_ca_file=certs / "ca.crt",
                         tls_ca_dir=str(certs))._endpoint()
    # With TLS the probe's time comes out of the connect timeout: a mismatch
    # (a TLS handshake that gets no answer, then the probe) stays within it.
    assert tls["connect_timeout"] + tls["probe_timeout"] == pytest.approx(0.25)
    assert {k: v for k, v in tls.items() if k.startswith("tls")} == dict(
        tls=True, tls_verify=False, tls_ca_file=str(certs / "ca.crt"), tls_ca_dir=str(certs),
        tls_cert_file=None, tls_key_file=None, tls_server_name="redis.example")
    assert hirate.Limiter("rediss://localhost", capacity=5,
                          rate=1)._endpoint()["tls_server_name"] == "localhost"
    mem = hirate.Limiter(capacity=5, rate=1)
    for call in (mem._endpoint, mem._handshake_start, lambda: mem._op_start_reset("k")):
        with pytest.raises(hirate.ConfigError, match="no Redis URL"):
            call()


def test_a_handshake_over_a_socket_authenticates_and_selects():
    server = RedisServer(["--requirepass", "pw"])
    try:
        lim = hirate.Limiter(f"redis://:pw@127.0.0.1:{server.port}/1", capacity=2, rate=0.001,
                             prefix="oph:")
        hs = lim._handshake_start()
        assert hs.request.startswith(b"*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n")
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


def test_a_refused_handshake_is_the_cores_verdict_and_starts_the_backoff():
    secret = "Canary-hs-0c41"
    server = RedisServer(["--requirepass", "the-real-one"])
    try:
        lim = hirate.Limiter(f"redis://:{secret}@127.0.0.1:{server.port}", capacity=2,
                             rate=0.001, on_error="open")
        hs = lim._handshake_start()
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            assert handshake(hs, sock) == _hirate.IO_DONE
        with pytest.raises(hirate.AuthError) as info:
            hs.result()
        assert info.value.name == "EAUTH" and "WRONGPASS" in str(info.value)
        assert secret not in str(info.value)
        with pytest.raises(ValueError, match="done"):
            hs.feed(b"+OK\r\n")
        assert hs.request is None
        # During the backoff no handshake starts, with the failure's own code.
        with pytest.raises(hirate.AuthError, match="not reconnecting for") as info:
            lim._handshake_start()
        assert info.value.name == "EAUTH" and secret not in str(info.value)
        assert lim._stats()["connects"] == 1
    finally:
        server.close()


def test_a_failed_connect_is_told_to_the_handshake(redis):
    lim = hirate.Limiter("redis://127.0.0.1:1", capacity=2, rate=0.001)
    hs = lim._handshake_start()
    with pytest.raises(ValueError, match="before the Handshake is done"):
        hs.result()
    assert hs.fail(_hirate.ECONNECT, "Connection refused") == _hirate.IO_DONE
    with pytest.raises(hirate.BackendError) as info:
        hs.result()
    assert (info.value.name, str(info.value)) == (
        "ECONNECT", "connect to 127.0.0.1:1: Connection refused")
    with pytest.raises(ValueError, match="hirate error code"):
        hs.fail(1)
    with pytest.raises(TypeError):
        _hirate.Handshake()


def test_a_reset_op(redis):
    lim = hirate.Limiter(redis.url, capacity=2, rate=0.001, prefix="opr:", timeout=5,
                         connect_timeout=5)
    assert lim.allow("k", 2).remaining == 0
    sock = connect(lim)
    try:
        op = lim._op_start_reset("k")
        assert op.request == b"*2\r\n$3\r\nDEL\r\n$5\r\nopr:k\r\n"
        drive(op, sock)
        assert op.result() is None and op.results() == []
    finally:
        sock.close()
    assert lim.peek("k").remaining == 2
    with pytest.raises(hirate.ConfigError, match="key is empty"):
        lim._op_start_reset("")
    op = lim._op_start_reset("k")
    op.fail(_hirate.ETIMEDOUT, "no reply from Redis within 5000 ms")
    with pytest.raises(hirate.TimeoutError, match="no reply from Redis within 5000 ms"):
        op.result()


def test_stats():
    lim = hirate.Limiter(capacity=5, rate=1)
    lim.allow("a")
    lim.allow("b")
    s = lim._stats()
    assert s == dict(connects=0, evalsha=0, eval=0, conns_dropped=0, cache_hits=0, policy=0,
                     breaker_opens=0, memory_keys=2, local_keys=0, cache_keys=0, fcall=0,
                     function_loads=0, sentinel_queries=0, master_changes=0)


def test_every_python_front_end_shows_the_core_defaults():
    """The defaults come from hirate_options_init (and the core's IPv6 subnet):
    the signatures and settings of the Python classes show them, and a
    Limiter made without them has them."""
    import inspect
    from hirate import _http, asgi

    assert dict(_hirate.DEFAULTS) == dict(
        prefix="rl:", on_error="local", instances=1, connect_timeout=0.25, timeout=0.1,
        deny_cache=True, deny_cache_max=1.0, max_keys=1_000_000, pool_size=16,
        tls_verify=True, functions=True, ipv6_subnet=64,
        forwarded_header="X-Forwarded-For")
    with pytest.raises(TypeError):
        _hirate.DEFAULTS["prefix"] = "x"   # read-only
    lim = hirate.Limiter(capacity=1, rate=1)
    assert (lim.prefix, lim.on_error) == ("rl:", "local")
    for cls in (hirate.AsyncLimiter, asgi.RateLimiter):
        params = inspect.signature(cls).parameters
        for name, value in _hirate.DEFAULTS.items():
            if name in params:
                assert params[name].default == value, (cls, name)
    assert inspect.signature(_http.ClientIP).parameters["ipv6_subnet"].default == 64
    assert _http.ClientIP().ipv6_subnet == 64
    assert inspect.signature(_http.ClientIP).parameters["header"].default == "X-Forwarded-For"
    assert _http.ClientIP().header == "X-Forwarded-For"
    for name, value in _hirate.DEFAULTS.items():
        if name in _http.SETTINGS:
            assert _http.SETTINGS[name][1] == value, name
