"""TLS (rediss://) for Limiter and AsyncLimiter, against real TLS-only
redis-servers with certificates the harness makes (tests/support/
make_certs.sh): exactly the capacity, every shared vector, mutual TLS; and
each bad certificate and each plain/TLS mismatch is hirate.TLSError (ETLS)
under every policy, within the connect timeout, without opening the breaker
and without a storm of connections. A password never shows.

Limiter runs on the core's own TLS (OpenSSL), AsyncLimiter on Python's ssl
module; the tests are the same for both (AsyncLimiter through Looped)."""

import asyncio
import math
import threading
import time

import pytest

import hirate
import test_vectors
from redis_server import RedisServer

pytestmark = pytest.mark.timeout(120)

KINDS = ["Limiter", "AsyncLimiter"]
POLICIES = ["local", "open", "closed"]
CANARY = "Canary-tls-5be1"
# Generous timeouts where a test is about decisions, not about timeouts.
SLOW = dict(timeout=5, connect_timeout=5)


class Looped:
    """An AsyncLimiter driven from synchronous test code, on one event loop
    of its own, so that its connections (and the core's backoff) carry over
    from call to call as a Limiter's do."""

    def __init__(self, *args, **kwargs):
        self.loop = asyncio.new_event_loop()
        self.lim = hirate.AsyncLimiter(*args, **kwargs)

    def run(self, coro):
        return self.loop.run_until_complete(asyncio.wait_for(coro, 60))

    def allow(self, key, cost=1):
        return self.run(self.lim.allow(key, cost))

    def peek(self, key, cost=1):
        return self.run(self.lim.peek(key, cost))

    def reset(self, key):
        return self.run(self.lim.reset(key))

    def allow_many(self, pairs):
        return self.run(self.lim.allow_many(pairs))

    def _decide_at(self, key, cost, spend, now_us):
        d, = self.run(self.lim._decide([(key, cost)], spend, now_us))
        if isinstance(d, BaseException):
            raise d
        return d

    def _stats(self):
        return self.lim._stats()

    def __repr__(self):
        return repr(self.lim)

    @property
    def capacity(self):
        return self.lim.capacity

    def close(self):
        self.run(self.lim.close())
        self.loop.close()


def make(kind, url, **kwargs):
    return (hirate.Limiter if kind == "Limiter" else Looped)(url, **kwargs)


def ca(certs, **kwargs):
    return dict(tls_ca_file=certs / "ca.crt", **kwargs)


@pytest.fixture(scope="module")
def bad_servers(certs):
    """A TLS server for each certificate that must be refused."""
    servers = {cert: RedisServer(tls=certs, cert=cert)
               for cert in ("wronghost", "expired", "selfsigned")}
    yield servers
    for s in servers.values():
        s.close()


@pytest.fixture(scope="module")
def mtls_server(certs):
    """A TLS server that asks every client for a certificate of the CA."""
    server = RedisServer(tls=certs, auth_clients=True)
    yield server
    server.close()


# ----------------------------------------------------------- what works

@pytest.mark.parametrize("kind", KINDS)
def test_exactly_the_capacity_over_tls(kind, tls_redis, certs):
    lim = make(kind, tls_redis.url, capacity=50, rate=0.001, prefix="cap:", **ca(certs),
               **SLOW)
    try:
        if kind == "Limiter":
            got = []
            def worker():
                for _ in range(25):
                    got.append(lim.allow("k"))
            threads = [threading.Thread(target=worker) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            async def burst():
                return await asyncio.gather(*(lim.lim.allow("k") for _ in range(200)))
            got = lim.run(burst())
        assert len(got) == 200
        assert sum(d.allowed for d in got) == 50
        assert {d.source for d in got} <= {"redis", "cache"}
        assert {d.error for d in got} == {None}
        assert lim.peek("k").remaining == 0
        assert tls_redis.command("EXISTS", "cap:k") == 1
        assert lim._stats()["connects"] <= 16   # the pool's bound
    finally:
        lim.close()


@pytest.mark.parametrize("deny_cache", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_every_vector_over_tls(kind, deny_cache, tls_redis, certs):
    backend = "redis+cache" if deny_cache else "redis"
    steps = 0
    for case in test_vectors.CASES:
        kw = dict(prefix=f"tv:{case['id']}:", on_error="closed", deny_cache=deny_cache,
                  **ca(certs), **SLOW)
        if "config_error" in case:
            with pytest.raises(hirate.ConfigError) as info:
                make(kind, tls_redis.url, **test_vectors.limit_of(case["config"]), **kw)
            assert info.value.name == test_vectors.short(case["config_error"]), case["id"]
            continue
        lim = make(kind, tls_redis.url, **test_vectors.limit_of(case["config"]), **kw)
        try:
            for i, step in enumerate(case["steps"]):
                steps += 1
                if step["op"] == "reconfigure":   # the same prefix: the keys stay
                    lim.close()
                    lim = make(kind, tls_redis.url, **test_vectors.limit_of(step["config"]),
                               **kw)
                    continue
                test_vectors.check_step(backend, lim, case, i, step)
        finally:
            lim.close()
    assert steps == sum(len(c.get("steps", ())) for c in test_vectors.CASES)


@pytest.mark.parametrize("kind", KINDS)
def test_mutual_tls(kind, mtls_server, certs):
    lim = make(kind, mtls_server.url, capacity=5, rate=0.001, prefix=f"mtls:{kind}:",
               tls_cert_file=certs / "client.crt", tls_key_file=str(certs / "client.key"),
               **ca(certs), **SLOW)
    try:
        d = lim.allow("k")
        assert (d.source, d.remaining) == ("redis", 4)
    finally:
        lim.close()
    for on_error in POLICIES:
        lim = make(kind, mtls_server.url, capacity=5, rate=0.001, on_error=on_error,
                   **ca(certs), **SLOW)
        try:
            with pytest.raises(hirate.TLSError) as info:
                lim.allow("k")   # no client certificate: the server refuses it
            assert info.value.code == hirate._hirate.ETLS
            assert lim._stats()["breaker_opens"] == 0
        finally:
            lim.close()


@pytest.mark.parametrize("kind", KINDS)
def test_the_name_checked_is_tls_server_name_and_verification_can_be_off(kind, bad_servers,
                                                                         certs):
    wrong = bad_servers["wronghost"]
    for kw in (dict(tls_server_name="wrong.invalid", **ca(certs)),
               dict(tls_verify=False)):
        lim = make(kind, wrong.url, capacity=5, rate=0.001, prefix=f"name:{kind}:", **kw, **SLOW)
        try:
            assert lim.allow("k").source == "redis"
        finally:
            lim.close()
    lim = make(kind, bad_servers["selfsigned"].url, capacity=5, rate=0.001, tls_verify=False,
               **SLOW)
    try:
        assert lim.allow("k").source == "redis"
    finally:
        lim.close()


@pytest.mark.parametrize("kind", KINDS)
def test_localhost_by_name(kind, tls_redis, certs):
    lim = make(kind, f"rediss://localhost:{tls_redis.port}", capacity=5, rate=0.001,
               prefix="lh:", **ca(certs), **SLOW)
    try:
        assert lim.allow("k").source == "redis"
    finally:
        lim.close()


# ------------------------------------------------ misconfigurations: ETLS

def check_tls_error(kind, url, on_error, words, connect_timeout=1.0, **kwargs):
    """Each call raises TLSError with words in its message, under on_error,
    within the connect timeout; the breaker stays closed; the backoff keeps
    the connections few; the password never shows."""
    lim = make(kind, url, capacity=5, rate=0.001, on_error=on_error,
               connect_timeout=connect_timeout, timeout=1.0, **kwargs)
    seen = [repr(lim)]
    try:
        t0 = time.monotonic()
        with pytest.raises(hirate.TLSError) as info:
            lim.allow("k")
        took = time.monotonic() - t0
        e = info.value
        assert (e.code, e.name) == (hirate._hirate.ETLS, "ETLS")
        assert words in str(e), str(e)
        assert took < connect_timeout + 0.5, took
        seen += [str(e), repr(e)]
        for _ in range(10):
            with pytest.raises(hirate.TLSError) as info:
                lim.allow("k")
            seen.append(str(info.value))
        got, = lim.allow_many([("k", 1)])
        assert isinstance(got, hirate.TLSError) and not got
        with pytest.raises(hirate.TLSError):
            lim.reset("k")
        stats = lim._stats()
        assert stats["breaker_opens"] == 0 and stats["policy"] == 0
        # The reconnect backoff doubles from 10 ms (-25% at worst): after the
        # first failure, at most this many attempts got through it in the
        # time the other calls took, however slow the machine (ASan).
        after_ms = (time.monotonic() - t0 - took) * 1000
        assert stats["connects"] <= 2 + math.ceil(math.log2(after_ms / 7.5 + 1)), \
            (stats["connects"], after_ms)
    finally:
        lim.close()
    for text in seen:
        assert CANARY not in text, text


@pytest.mark.parametrize("on_error", POLICIES)
@pytest.mark.parametrize("cert", ["wronghost", "expired", "selfsigned"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_certificate_is_tls_error(kind, cert, on_error, bad_servers, certs):
    server = bad_servers[cert]
    url = f"rediss://rl:{CANARY}@127.0.0.1:{server.port}"
    check_tls_error(kind, url, on_error, "certificate", **ca(certs))


@pytest.mark.parametrize("on_error", POLICIES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_certificate_of_another_ca_is_tls_error(kind, on_error, tls_redis, certs):
    url = f"rediss://:{CANARY}@127.0.0.1:{tls_redis.port}"
    check_tls_error(kind, url, on_error, "certificate", tls_ca_file=certs / "other-ca.crt")


@pytest.mark.parametrize("on_error", POLICIES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_plain_url_to_a_tls_port_is_tls_error(kind, on_error, tls_redis):
    url = f"redis://:{CANARY}@127.0.0.1:{tls_redis.port}"
    check_tls_error(kind, url, on_error, "use rediss://")


@pytest.mark.parametrize("on_error", POLICIES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_tls_url_to_a_plain_port_is_tls_error(kind, on_error, redis, certs):
    url = f"rediss://:{CANARY}@127.0.0.1:{redis.port}"
    # The handshake waits out three quarters of the connect timeout before
    # the plain-Redis probe has the rest: 2 s leaves the probe 500 ms, which
    # a machine running the suites of four Pythons at once can need (with 1 s
    # a probe of 250 ms ran out once, and the call was an outage).
    check_tls_error(kind, url, on_error, "use redis://", connect_timeout=2.0, **ca(certs))


@pytest.mark.parametrize("kind", KINDS)
def test_a_ca_file_that_cannot_be_read_is_tls_error_at_once(kind, tmp_path):
    with pytest.raises(hirate.TLSError) as info:
        make(kind, "rediss://127.0.0.1:6380", capacity=5, rate=1,
             tls_ca_file=tmp_path / "missing.crt")
    assert str(tmp_path / "missing.crt") in str(info.value)


@pytest.mark.parametrize("kind", KINDS)
def test_a_ca_directory(kind, tls_redis, certs, tmp_path):
    import shutil
    import subprocess
    shutil.copy(certs / "ca.crt", tmp_path / "ca.pem")
    subprocess.run(["openssl", "rehash", str(tmp_path)], check=True)
    lim = make(kind, tls_redis.url, capacity=5, rate=0.001, prefix=f"dir:{kind}:",
               tls_ca_dir=tmp_path, **SLOW)
    try:
        assert lim.allow("k").source == "redis"
    finally:
        lim.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_tcp_connect_without_an_answer_is_an_outage_not_tls(kind, certs):
    # A listener that never accepts, with its backlog full: the SYN is
    # dropped. Nothing about TLS was learnt: the policy decides (ECONNECT).
    import socket
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(3):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            fillers.append(s)
        lim = make(kind, f"rediss://127.0.0.1:{port}", capacity=5, rate=1,
                   connect_timeout=0.3, timeout=5, **ca(certs))
        try:
            t0 = time.monotonic()
            d = lim.allow("k")
            assert (d.source, d.error) == ("local", "ECONNECT")
            assert time.monotonic() - t0 < 1.5
        finally:
            lim.close()
    finally:
        for s in fillers:
            s.close()
        listener.close()


# ------------------------------------------------------- outages over TLS

@pytest.mark.parametrize("kind", KINDS)
def test_a_stopped_tls_server_is_an_outage_for_the_policy(kind, certs):
    """SIGSTOP: the kernel still accepts, but nothing answers. Mid-call that
    is a timeout; for a new connection it is a TLS handshake without an
    answer, which the probe cannot explain either: an outage (ETIMEDOUT),
    not a TLSError, within the connect timeout."""
    server = RedisServer(tls=certs)
    lim = make(kind, server.url, capacity=5, rate=0.001, on_error="closed",
               connect_timeout=0.5, timeout=0.5, **ca(certs))
    try:
        assert lim.allow("k").source == "redis"   # a pooled connection
        server.stop()
        try:
            t0 = time.monotonic()
            d = lim.allow("k")
            assert (d.source, d.error) == ("fail_closed", "ETIMEDOUT")
            assert time.monotonic() - t0 < 1.5
            # A new connection now: the pooled one was dropped with the
            # call, and the breaker lets one call try after its backoff.
            deadline = time.monotonic() + 5
            while lim._stats()["connects"] < 2 and time.monotonic() < deadline:
                t0 = time.monotonic()
                d = lim.allow("k")
                assert d.source == "fail_closed" and d.error in ("ETIMEDOUT", "ECONNECT"), d
                assert time.monotonic() - t0 < 1.5
                time.sleep(0.05)
            assert lim._stats()["connects"] >= 2
        finally:
            server.cont()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            d = lim.allow("k", 0)
            if d.source == "redis":
                break
            time.sleep(0.05)
        # The call that timed out had been sent: Redis ran it when it woke
        # (a timeout's outcome is unknown, and it is never sent twice).
        assert (d.source, d.remaining) == ("redis", 3)
    finally:
        lim.close()
        server.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_tls_server_killed_after_the_handshake_is_an_outage(kind, certs):
    server = RedisServer(tls=certs)
    lim = make(kind, server.url, capacity=5, rate=0.001, on_error="open",
               connect_timeout=0.5, timeout=0.5, **ca(certs))
    try:
        assert lim.allow("k").source == "redis"
        server.kill()
        d = lim.allow("k")
        assert (d.source, d.error) in {("fail_open", "EIO"), ("fail_open", "ECONNECT")}
        server.start(server.port)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            d = lim.allow("k", 0)
            if d.source == "redis":
                break
            time.sleep(0.05)
        assert (d.source, d.remaining) == ("redis", 5)   # a new server, an empty store
    finally:
        lim.close()
        server.close()


def test_a_tls_limiter_made_before_fork_works_in_4_children(tls_redis, certs):
    """The children open TLS connections of their own and never touch the
    parent's TLS state; the parent's connection stays intact."""
    from test_threads_fork import in_children
    lim = hirate.Limiter(tls_redis.url, capacity=20, rate=0.001, prefix="tfork:",
                         on_error="closed", **ca(certs), **SLOW)
    assert lim.peek("k").source == "redis"   # the parent holds a TLS connection now

    def child():
        got = [lim.allow("k") for _ in range(10)]
        assert all(d.source in ("redis", "cache") and d.error is None for d in got), got
        return sum(d.allowed for d in got)

    assert sum(in_children(4, child)) == 20
    d = lim.allow("k")
    assert (d.allowed, d.source in ("redis", "cache"), d.error) == (False, True, None)
    assert lim.peek("k", 0).source == "redis"
    assert lim._stats()["connects"] == 1
    lim.close()


# ----------------------------------------------- next to Python's own ssl

SSL_FIRST = r'''
import socket, ssl, sys
url, port, cafile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context(cafile=cafile)

def python_ping():
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(b"PING\r\n")
            return s.recv(64)

print(python_ping())
import hirate
lim = hirate.Limiter(url, capacity=2, rate=0.001, prefix="sslfirst:", tls_ca_file=cafile,
                     timeout=5, connect_timeout=5)
print([(d.allowed, d.remaining, d.source) for d in (lim.allow("k") for _ in range(3))])
lim.close()
print(python_ping())
import os
print(sorted({line.rsplit("/", 1)[-1].strip() for line in open("/proc/self/maps")
              if "/libssl" in line}))
# A wheel repaired by auditwheel carries its own, renamed copy next to the package.
bundled = os.path.join(os.path.dirname(os.path.dirname(hirate.__file__)), "hirate.libs")
print(sorted(["libssl.so.3"] + [f for f in (os.listdir(bundled) if os.path.isdir(bundled) else [])
                                if f.startswith("libssl")]))
'''


def test_python_ssl_first_then_a_tls_decision_through_the_core(tls_redis, certs):
    """Python's ssl loaded and used first, then the core's TLS in the same
    process: both verify the server, and the core decides over TLS (the deny
cache answers the third call). Whichever
    libssl the extension carries (the wheel's, renamed by auditwheel, or the
    system's), its symbols and Python's do not clash."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", SSL_FIRST, tls_redis.url, str(tls_redis.port),
                        str(certs / "ca.crt")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:3] == ["b'+PONG\\r\\n'",
                         "[(True, 1, 'redis'), (True, 0, 'redis'), (False, 0, 'cache')]",
                         "b'+PONG\\r\\n'"]
    # Python's libssl and the extension's are both mapped (one file when the
    # extension links the system's).
    assert lines[3] == lines[4]
