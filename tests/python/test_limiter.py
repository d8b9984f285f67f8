"""hirate.Limiter and hirate.Decision: the API as documented, on the memory
backend and on a real redis-server."""

import gc
import hashlib
import math
import os
import weakref

import pytest

import hirate
from hirate import _hirate

# ---------------------------------------------------------------- Decision


def test_decision_fields_of_an_allowed_call():
    lim = hirate.Limiter(capacity=5, rate=2.0)
    d = lim._decide_at("alice", 1, True, 1_000_000)
    assert d.allowed is True
    assert d.remaining == 4
    assert d.limit == 5
    assert d.retry_after == 0.0 and d.retry_after_us == 0
    assert d.reset_after == 0.5 and d.reset_after_us == 500_000
    assert d.source == "local"
    assert d.error is None
    assert d.time == 1.0 and d.time_us == 1_000_000
    assert type(d.remaining) is int and type(d.retry_after) is float


def test_decision_fields_of_a_refusal():
    lim = hirate.Limiter(capacity=2, rate=4.0)
    lim._decide_at("k", 2, True, 0)
    d = lim._decide_at("k", 1, True, 0)
    assert (d.allowed, d.remaining, d.retry_after_us, d.reset_after_us) == (False, 0, 250_000,
                                                                           500_000)
    assert d.retry_after == 0.25


def test_a_cost_above_the_capacity_never_passes():
    d = hirate.Limiter(capacity=3, rate=1.0).allow("k", 4)
    assert not d.allowed
    assert d.retry_after == math.inf
    assert d.retry_after_us is None
    assert d.remaining == 3


def test_bool_of_a_decision_is_allowed():
    lim = hirate.Limiter(capacity=1, rate=0.001)
    assert bool(lim.allow("k")) is True
    assert bool(lim.allow("k")) is False


def test_decision_repr():
    lim = hirate.Limiter(capacity=5, rate=2.0)
    assert repr(lim._decide_at("a", 1, True, 0)) == (
        "<Decision allowed remaining=4 limit=5 retry_after=0.0 reset_after=0.5 source='local'>")
    lim._decide_at("b", 5, True, 0)
    assert repr(lim._decide_at("b", 1, True, 0)) == (
        "<Decision refused remaining=0 limit=5 retry_after=0.5 reset_after=2.5 source='local'>")
    assert repr(lim._decide_at("c", 6, False, 0)) == (
        "<Decision refused remaining=5 limit=5 retry_after=inf reset_after=0.0 source='local'>")


def test_decision_is_immutable():
    d = hirate.Limiter(capacity=5, rate=2.0).allow("a")
    for field in ("allowed", "remaining", "limit", "retry_after", "reset_after", "source",
                  "error", "time"):
        with pytest.raises(AttributeError):
            setattr(d, field, 1)
    with pytest.raises((AttributeError, TypeError)):
        d.extra = 1


def test_decision_can_be_made_compared_and_hashed():
    d = hirate.Decision(False, 0, 10, 0.25, 2.5, "fail_closed", "ETIMEDOUT", 3.0)
    assert (d.allowed, d.remaining, d.limit, d.retry_after_us, d.reset_after_us, d.source,
            d.error, d.time_us) == (False, 0, 10, 250_000, 2_500_000, "fail_closed",
                                    "ETIMEDOUT", 3_000_000)
    assert repr(d) == ("<Decision refused remaining=0 limit=10 retry_after=0.25 reset_after=2.5"
                       " source='fail_closed' error='ETIMEDOUT'>")
    same = hirate.Decision(allowed=False, remaining=0, limit=10, retry_after=0.25,
                           reset_after=2.5, source="fail_closed", error="ETIMEDOUT", time=3.0)
    assert d == same and hash(d) == hash(same)
    assert d != hirate.Decision(False, 0, 10, 0.25, 2.5, "fail_closed", "EIO", 3.0)
    assert hirate.Decision(False, 3, 3, math.inf, 0.0, "redis").retry_after_us is None
    with pytest.raises(hirate.ConfigError, match="source must be"):
        hirate.Decision(True, 1, 1, 0.0, 0.0, "somewhere")
    with pytest.raises(hirate.ConfigError, match="error must be"):
        hirate.Decision(True, 1, 1, 0.0, 0.0, "redis", "EWHAT")
    with pytest.raises(hirate.ConfigError, match="reset_after must be"):
        hirate.Decision(True, 1, 1, 0.0, -1.0, "redis")


# ----------------------------------------------------------------- Limiter


def test_a_burst_drains_the_bucket_then_refuses():
    lim = hirate.Limiter(capacity=5, rate=0.001)
    got = [lim.allow("alice") for _ in range(7)]
    assert [d.allowed for d in got] == [True] * 5 + [False] * 2
    assert [d.remaining for d in got] == [4, 3, 2, 1, 0, 0, 0]
    assert lim.allow("bob").remaining == 4   # keys are independent


def test_peek_spends_nothing():
    lim = hirate.Limiter(capacity=3, rate=0.001)
    for _ in range(5):
        d = lim.peek("k", 2)
        assert d.allowed and d.remaining == 3
    assert lim.allow("k", 2).remaining == 1
    assert not lim.peek("k", 2).allowed
    assert lim.peek("k").allowed


def test_cost_by_keyword_and_cost_zero():
    lim = hirate.Limiter(capacity=3, rate=0.001)
    assert lim.allow(key="k", cost=2).remaining == 1
    assert lim.allow("k", cost=0).allowed
    assert lim.peek(cost=1, key="k").remaining == 1


def test_reset_makes_the_bucket_full():
    lim = hirate.Limiter(capacity=2, rate=0.001)
    lim.allow("k", 2)
    assert not lim.allow("k").allowed
    assert lim.reset("k") is None
    assert lim.allow("k").remaining == 1


def test_str_bytes_bytearray_and_memoryview_name_the_same_bucket():
    lim = hirate.Limiter(capacity=10, rate=0.001)
    assert lim.allow("é").remaining == 9
    assert lim.allow("é".encode()).remaining == 8
    assert lim.allow(bytearray("é".encode())).remaining == 7
    assert lim.allow(memoryview("é".encode())).remaining == 6
    assert lim.allow(b"\xc3").remaining == 9   # another byte string, another bucket


def test_keys_are_bytes_with_nul_and_crlf():
    lim = hirate.Limiter(capacity=1, rate=0.001)
    assert lim.allow(b"a\x00b").allowed
    assert lim.allow(b"a\x00c").allowed   # not cut at the NUL
    assert lim.allow("a\r\nb").allowed
    assert not lim.allow(b"a\x00b").allowed


def test_allow_many_decides_each_pair_in_order():
    lim = hirate.Limiter(capacity=3, rate=0.001)
    got = lim.allow_many([("a", 1), (b"b", 3), ("a", 3), ("a", 2), ("c", 0)])
    assert [(d.allowed, d.remaining) for d in got] == [(True, 2), (True, 0), (False, 2),
                                                     (True, 0), (True, 3)]
    assert lim.allow_many([]) == []
    assert len(lim.allow_many((("k%d" % i, 1) for i in range(100)))) == 100


def test_attributes_and_repr():
    lim = hirate.Limiter(capacity=5, rate=2, on_error="open", prefix="app:")
    assert (lim.capacity, lim.rate, lim.prefix, lim.on_error, lim.url) == (5, 2.0, "app:",
                                                                           "open", None)
    assert repr(lim) == "<hirate.Limiter url=None capacity=5 rate=2.0 on_error='open'>"
    with pytest.raises(AttributeError):
        lim.capacity = 6
    lim.close()
    assert lim.closed
    assert repr(lim).endswith(" closed>")


def test_defaults():
    lim = hirate.Limiter(capacity=1, rate=1)
    assert (lim.prefix, lim.on_error) == ("rl:", "local")


def test_a_whole_float_capacity_is_accepted():
    assert hirate.Limiter(capacity=60.0, rate=1).capacity == 60


def test_close_then_use_raises_closed_error():
    lim = hirate.Limiter(capacity=5, rate=1)
    lim.close()
    lim.close()   # idempotent
    for call in (lambda: lim.allow("k"), lambda: lim.peek("k"), lambda: lim.reset("k"),
                 lambda: lim.allow_many([("k", 1)]), lambda: lim._stats(),
                 lambda: lim._op_start([("k", 1)], True)):
        with pytest.raises(hirate.ClosedError) as info:
            call()
        assert info.value.code == _hirate.ECLOSED and info.value.name == "ECLOSED"
        assert str(info.value) == "limiter is closed"
        assert isinstance(info.value, ValueError)


def test_context_manager_closes():
    with hirate.Limiter(capacity=5, rate=1) as lim:
        assert lim.allow("k").allowed
    assert lim.closed
    with pytest.raises(hirate.ClosedError):
        lim.allow("k")
    with pytest.raises(hirate.ClosedError):
        with lim:
            pass


def test_context_manager_closes_on_an_exception():
    with pytest.raises(KeyError):
        with hirate.Limiter(capacity=5, rate=1) as lim:
            raise KeyError("x")
    assert lim.closed


def test_from_env_reads_redis_url(monkeypatch, redis):
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert hirate.Limiter.from_env(capacity=2, rate=1).url is None
    monkeypatch.setenv("REDIS_URL", "")
    assert hirate.Limiter.from_env(capacity=2, rate=1).url is None
    monkeypatch.setenv("REDIS_URL", redis.url)
    lim = hirate.Limiter.from_env(capacity=2, rate=1, prefix="env:", timeout=5,
                                  connect_timeout=5)
    assert lim.url == redis.url
    assert lim.allow("k").source == "redis"
    with pytest.raises(TypeError):
        hirate.Limiter.from_env(redis.url, capacity=2, rate=1)


def test_a_subclass_works():
    class Mine(hirate.Limiter):
        def allow_twice(self, key):
            return self.allow(key, 2)

    lim = Mine(capacity=3, rate=0.001)
    assert lim.allow_twice("k").remaining == 1
    assert repr(lim).startswith("<")
    assert weakref.ref(lim)() is lim


def test_a_limiter_is_freed_when_dropped():
    lim = hirate.Limiter(capacity=5, rate=1)
    ref = weakref.ref(lim)
    del lim
    gc.collect()
    assert ref() is None


def test_script_source_and_sha1():
    src = hirate.script_source()
    assert "redis.call" in src
    assert hirate.script_sha1() == hashlib.sha1(src.encode()).hexdigest()


def test_version_is_the_headers():
    header = (pathlib_root() / "core" / "include" / "hirate.h").read_text()
    assert f'#define HIRATE_VERSION_STRING "{hirate.__version__}"' in header


def pathlib_root():
    import pathlib
    return pathlib.Path(__file__).resolve().parents[2]


def test_module_constants():
    assert (_hirate.IO_MORE, _hirate.IO_SEND, _hirate.IO_DONE, _hirate.IO_PROBE) == (1, 2, 3, 4)
    assert (_hirate.KEY_MAX, _hirate.PREFIX_MAX, _hirate.EXACT_MAX) == (512, 64, 2 ** 53 - 1)
    assert (_hirate.IO_REPLY_MAX, _hirate.ERRMSG_SIZE) == (4096, 256)
    codes = {"EINVAL": -1, "ECAPACITY": -2, "ERATE": -3, "ECOST": -4, "EKEY": -5, "ERANGE": -6,
             "EURL": -7, "EOPTION": -8, "ENOMEM": -9, "ECONNECT": -10, "ETIMEDOUT": -11,
             "EIO": -12, "EPROTO": -13, "ESERVER": -14, "EAUTH": -15, "ENOPERM": -16,
             "EREPLY": -17, "ECLOSED": -18, "ETLS": -19, "EREFUSED": -20, "ENOTREDIS": -21}
    assert {n: getattr(_hirate, n) for n in codes} == codes


def test_the_package_exports():
    for name in ("Limiter", "AsyncLimiter", "Decision", "Error", "ConfigError", "BackendError",
                 "TimeoutError", "AuthError", "ClosedError", "TLSError", "RefusedError",
                 "NotRedisError", "__version__", "script_source", "script_sha1"):
        assert hasattr(hirate, name), name
    assert hirate.Limiter.__module__ == "hirate"
    assert hirate.Decision.__module__ == "hirate"


# ------------------------------------------------------------- with Redis

# Generous timeouts: on a busy machine the default 0.1 s could turn a Redis
# decision into the policy's, which these tests do not expect.
PATIENT = dict(timeout=5, connect_timeout=5)


def test_redis_decisions_share_one_bucket(redis):
    a = hirate.Limiter(redis.url, capacity=3, rate=0.001, prefix="share:", **PATIENT)
    b = hirate.Limiter(redis.url, capacity=3, rate=0.001, prefix="share:", deny_cache=False,
                       **PATIENT)
    assert a.allow("k").remaining == 2
    assert b.allow("k").remaining == 1
    d = a.allow("k")
    assert (d.allowed, d.remaining, d.source, d.error) == (True, 0, "redis", None)
    assert abs(d.time - __import__("time").time()) < 60   # Redis' clock: seconds since the epoch
    assert not b.allow("k").allowed
    assert a.peek("k").remaining == 0
    a.reset("k")
    assert b.allow("k").remaining == 2
    assert a.allow("k").remaining == 1
    assert redis.command("PTTL", "share:k") > 0


def test_redis_allow_many_is_one_round_trip(redis):
    lim = hirate.Limiter(redis.url, capacity=5, rate=0.001, prefix="many:", **PATIENT)
    lim.allow("warm")   # the function library is loaded: later calls are FCALL
    before = lim._stats()
    got = lim.allow_many([("a", 2), ("b", 6), ("a", 3), ("a", 1)])
    assert [(d.allowed, d.remaining, d.source) for d in got] == [
        (True, 3, "redis"), (False, 5, "redis"), (True, 0, "redis"), (False, 0, "redis")]
    after = lim._stats()
    assert after["fcall"] - before["fcall"] == 4
    assert after["connects"] == before["connects"] == 1


def test_redis_url_with_database_and_unix_socket(tmp_path):
    from redis_server import RedisServer
    sock = str(tmp_path / "r.sock")
    server = RedisServer(["--unixsocket", sock, "--unixsocketperm", "700"])
    try:
        lim = hirate.Limiter(f"unix://{sock}?db=3", capacity=2, rate=0.001, prefix="u:",
                             **PATIENT)
        ep = lim._endpoint()
        assert (ep["host"], ep["path"], ep["where"], ep["tls"]) == (None, sock, sock, False)
        assert lim.allow("k").source == "redis"
        assert server.command("SELECT", 3) == "OK"
        tcp = hirate.Limiter(f"redis://127.0.0.1:{server.port}/3", capacity=2, rate=0.001,
                             prefix="u:", **PATIENT)
        assert tcp.allow("k").remaining == 0   # the same database, the same bucket
    finally:
        server.close()


def test_redis_limiter_attributes(redis):
    lim = hirate.Limiter(redis.url, capacity=7, rate=0.5, on_error="closed", timeout=2,
                         connect_timeout=1.5, pool_size=4)
    assert lim.url == redis.url
    assert repr(lim) == (f"<hirate.Limiter url='{redis.url}' capacity=7 rate=0.5 "
                         "on_error='closed'>")
    ep = lim._endpoint()
    assert (ep["host"], ep["port"], ep["path"], ep["timeout"]) == ("127.0.0.1", redis.port,
                                                                    None, 2.0)


# ------------------------------------------------------------------ leaks


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_growth(work, warm=10_000, measured=100_000):
    """RSS growth over `measured` calls of work(i), after `warm` of them."""
    for i in range(warm):
        work(i)
    gc.collect()
    before = rss_bytes()
    for i in range(warm, warm + measured):
        work(i)
    gc.collect()
    return rss_bytes() - before


KEYS = ["user:%03d" % i for i in range(100)]
MiB = 1 << 20


def test_100k_memory_calls_leave_rss_flat():
    lim = hirate.Limiter(capacity=50, rate=1000.0)

    def work(i):
        k = KEYS[i % 100]
        d = lim.allow(k)
        repr(d), d.retry_after, d.source, d.error, d.time
        lim.peek(k.encode(), cost=2)
        lim.allow_many([(k, 1), (bytearray(b"x"), 1)])
        if i % 10 == 0:
            lim.reset(k)
        try:   # the error path: an exception object with .code and .name each time
            lim.allow("", 1)
        except hirate.ConfigError:
            pass
        try:
            lim.allow(k, -1)
        except hirate.ConfigError:
            pass

    assert rss_growth(work) < 1 * MiB


def test_100k_limiters_and_decisions_leave_rss_flat():
    def work(i):
        with hirate.Limiter(capacity=5, rate=1.0) as lim:
            lim.allow("k")
        hirate.Decision(True, 1, 5, 0.0, 0.2, "local")

    assert rss_growth(work, warm=2_000, measured=20_000) < 1 * MiB


def test_100k_redis_decisions_leave_rss_flat(redis):
    lim = hirate.Limiter(redis.url, capacity=1_000_000, rate=1000.0, prefix="rss:",
                         timeout=5, connect_timeout=5)
    batch = [(k, 1) for k in KEYS]

    def work(i):   # 100 decisions a round trip: 100,000 after the warm-up
        lim.allow_many(batch)
        if i % 10 == 0:
            assert lim.allow(KEYS[i % 100]).source == "redis"

    assert rss_growth(work, warm=100, measured=1_000) < 1 * MiB
    assert lim._stats()["policy"] == 0
