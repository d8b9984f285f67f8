"""Errors: every kind of bad argument gets the right exception class and a
message naming the problem; the exception classes and their codes; a
password never shows; and what each failure policy answers while Redis is
killed or hangs, and that the limiter comes back to Redis by itself."""

import builtins
import math
import pickle
import time

import pytest

import hirate
from hirate import _hirate
from redis_server import RedisServer

pytestmark = pytest.mark.timeout(60)

# ------------------------------------------------------- exception classes


def test_exception_classes_and_their_builtin_bases():
    assert issubclass(hirate.Error, Exception)
    assert issubclass(hirate.ConfigError, hirate.Error) and issubclass(hirate.ConfigError,
                                                                        ValueError)
    assert issubclass(hirate.BackendError, hirate.Error)
    assert issubclass(hirate.BackendError, ConnectionError)
    assert issubclass(hirate.TimeoutError, hirate.BackendError)
    assert issubclass(hirate.TimeoutError, builtins.TimeoutError)
    assert issubclass(hirate.AuthError, hirate.BackendError)
    assert issubclass(hirate.AuthError, PermissionError)
    assert issubclass(hirate.ClosedError, hirate.Error) and issubclass(hirate.ClosedError,
                                                                        ValueError)
    assert hirate.ConfigError.__module__ == "hirate"
    # Misconfigurations that Redis or the network reveal are BackendErrors,
    # raised under every policy, as AuthError always was.
    assert issubclass(hirate.TLSError, hirate.BackendError)
    assert issubclass(hirate.RefusedError, hirate.BackendError)
    assert issubclass(hirate.RefusedError, ConnectionRefusedError)
    assert issubclass(hirate.NotRedisError, hirate.BackendError)
    for cls in (hirate.TLSError, hirate.RefusedError, hirate.NotRedisError):
        assert cls.__module__ == "hirate"


@pytest.mark.parametrize("cls", [hirate.Error, hirate.ConfigError, hirate.BackendError,
                                 hirate.TimeoutError, hirate.AuthError, hirate.ClosedError,
                                 hirate.TLSError, hirate.RefusedError, hirate.NotRedisError])
def test_an_error_is_false_as_a_refusal_is(cls):
    # In allow_many's results `if d:` admits only the allowed items.
    assert not cls("x")
    assert bool(_hirate._error(_hirate.EAUTH, "no")) is False


@pytest.mark.parametrize("name,cls", [
    ("EINVAL", hirate.ConfigError), ("ECAPACITY", hirate.ConfigError),
    ("ERATE", hirate.ConfigError), ("ECOST", hirate.ConfigError),
    ("EKEY", hirate.ConfigError), ("ERANGE", hirate.ConfigError),
    ("EURL", hirate.ConfigError), ("EOPTION", hirate.ConfigError),
    ("ECONNECT", hirate.BackendError), ("EIO", hirate.BackendError),
    ("EPROTO", hirate.BackendError), ("ESERVER", hirate.BackendError),
    ("EREPLY", hirate.BackendError), ("ETIMEDOUT", hirate.TimeoutError),
    ("EAUTH", hirate.AuthError), ("ENOPERM", hirate.AuthError),
    ("ECLOSED", hirate.ClosedError), ("ENOMEM", MemoryError),
    ("ETLS", hirate.TLSError), ("EREFUSED", hirate.RefusedError),
    ("ENOTREDIS", hirate.NotRedisError),
])
def test_each_code_has_its_class(name, cls):
    code = getattr(_hirate, name)
    e = _hirate._error(code, "what went wrong")
    assert type(e) is cls
    assert str(e) == "what went wrong"
    if cls is not MemoryError:
        assert (e.code, e.name) == (code, name)


def test_an_exception_pickles_with_its_code():
    with pytest.raises(hirate.ConfigError) as info:
        hirate.Limiter(capacity=0, rate=1)
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is hirate.ConfigError
    assert (again.code, again.name, str(again)) == (info.value.code, "ECAPACITY",
                                                    str(info.value))


# ------------------------------------------------------------ bad options

INF, NAN = math.inf, math.nan


@pytest.mark.parametrize("kw,name,message", [
    (dict(capacity=0), "ECAPACITY", "capacity must be a whole number from 1 to 2^53-1, got 0"),
    (dict(capacity=-5), "ECAPACITY", "got -5"),
    (dict(capacity=NAN), "ECAPACITY", "got nan"),
    (dict(capacity=INF), "ECAPACITY", "got inf"),
    (dict(capacity=2 ** 53), "ECAPACITY", "got 9007199254740992"),
    (dict(capacity=2 ** 80), "ECAPACITY", "got 1208925819614629174706176"),
    (dict(capacity=1.5), "ECAPACITY", "got 1.5"),
    (dict(rate=0), "ERATE", "rate must be a finite number of tokens per second above 0, got 0"),
    (dict(rate=-1.0), "ERATE", "got -1"),
    (dict(rate=NAN), "ERATE", "got nan"),
    (dict(rate=INF), "ERATE", "got inf"),
    (dict(rate=10 ** 400), "ERATE", "got inf"),
    (dict(capacity=2 ** 53 - 1, rate=1e-6), "ERANGE", "to refill"),
    (dict(url=""), "EURL", "invalid Redis URL: it is empty"),
    (dict(url="http://127.0.0.1"), "EURL", "must start with redis://, rediss://, unix://, redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel://"),
    (dict(url="redis://127.0.0.1:0"), "EURL", "the port must be a number from 1 to 65535"),
    (dict(url="redis://127.0.0.1:99999"), "EURL", "the port must be"),
    (dict(url="redis://127.0.0.1", tls_ca_file="/etc/hosts"), "EOPTION",
     "tls_ca_file is set, but the URL is not rediss:// (TLS)"),
    (dict(url="redis://127.0.0.1", tls_verify=False), "EOPTION",
     "tls_verify is off, but the URL is not rediss:// (TLS)"),
    (dict(url="rediss://127.0.0.1", tls_cert_file="/etc/hosts"), "EOPTION",
     "tls_cert_file and tls_key_file go together"),
    (dict(url="rediss://127.0.0.1", tls_server_name=""), "EOPTION",
     "tls_server_name must be 1 to 4095 bytes, got 0"),
    (dict(url="rediss://127.0.0.1", tls_ca_file="a\0b"), "EOPTION",
     "tls_ca_file must not contain a NUL character"),
    (dict(url="redis://127.0.0.1\x00x"), "EURL", "url must not contain a NUL character"),
    (dict(on_error="sometimes"), "EOPTION",
     'on_error must be "local", "open" or "closed", got "sometimes"'),
    (dict(prefix="p" * 65), "EOPTION", "prefix is 65 bytes; the most is 64"),
    (dict(prefix="a\x00b"), "EOPTION", "prefix must not contain a NUL character"),
    (dict(timeout=0), "EOPTION", "timeout must be from 0.001 to 60 seconds, got 0"),
    (dict(timeout=-1.0), "EOPTION", "timeout must be from 0.001 to 60 seconds, got -1"),
    (dict(timeout="0ms"), "EOPTION", "timeout must be from 1ms to 60s, got 0ms"),
    (dict(deny_cache_max="25h"), "EOPTION", "deny_cache_max must be from 1ms to 86400s, got 25h"),
    (dict(timeout="soon"), "EOPTION", 'timeout: "soon" is not a duration'),
    (dict(timeout=61), "EOPTION", "got 61"),
    (dict(timeout=NAN), "EOPTION", "got nan"),
    (dict(connect_timeout=INF), "EOPTION", "connect_timeout must be from 0.001 to 60 seconds"),
    (dict(pool_size=0), "EOPTION", "pool_size must be from 1 to 1024, got 0"),
    (dict(pool_size=1025), "EOPTION", "pool_size must be from 1 to 1024, got 1025"),
    (dict(pool_size=2 ** 40), "EOPTION", "pool_size is out of range"),
    (dict(max_keys=0), "EOPTION", "max_keys must be from 1 to 4000000000, got 0"),
    (dict(max_keys=-1), "EOPTION", "max_keys must be from 1 to 4000000000, got -1"),
    (dict(instances=0), "EOPTION", "instances must be from 1 to 100000, got 0"),
])
def test_bad_option_values_raise_config_error(kw, name, message):
    args = dict(capacity=10, rate=1.0)
    args.update(kw)
    url = args.pop("url", None)
    with pytest.raises(hirate.ConfigError) as info:
        hirate.Limiter(url, **args)
    assert info.value.name == name
    assert info.value.code == getattr(_hirate, name)
    assert message in str(info.value)


@pytest.mark.parametrize("kw,message", [
    (dict(capacity="10"), "capacity must be an int, not str"),
    (dict(capacity=True), "capacity must be an int, not bool"),
    (dict(capacity=None), "capacity must be an int, not NoneType"),
    (dict(rate="1"), "rate must be a number, not str"),
    (dict(rate=True), "rate must be a number, not bool"),
    (dict(url=b"redis://127.0.0.1"), "url must be a str, not bytes"),
    (dict(url=6379), "url must be a str, not int"),
    (dict(prefix=b"rl:"), "prefix must be a str, not bytes"),
    (dict(on_error=1), "on_error must be a str, not int"),
    (dict(timeout=b"1"),
     "timeout must be a number of seconds or a str with a unit ('100ms'), not bytes"),
    (dict(pool_size=1.5), "pool_size must be an int, not float"),
    (dict(max_keys="many"), "max_keys must be an int, not str"),
    (dict(instances=None), "instances must be an int, not NoneType"),
    (dict(url="rediss://127.0.0.1", tls_ca_file=5), "tls_ca_file must be a str or os.PathLike"),
    (dict(url="rediss://127.0.0.1", tls_server_name=b"x"), "tls_server_name must be a str"),
    (dict(colour="blue"), "keyword argument"),
])
def test_bad_option_types_raise_type_error(kw, message):
    args = dict(capacity=10, rate=1.0)
    args.update(kw)
    url = args.pop("url", None)
    with pytest.raises(TypeError) as info:
        hirate.Limiter(url, **args)
    assert message in str(info.value)


def test_capacity_and_rate_are_required_keywords():
    with pytest.raises(TypeError, match="missing required keyword argument 'capacity'"):
        hirate.Limiter(rate=1)
    with pytest.raises(TypeError, match="missing required keyword argument 'rate'"):
        hirate.Limiter(capacity=1)
    with pytest.raises(TypeError):
        hirate.Limiter(None, 10, 1.0)


# -------------------------------------------------------------- bad calls

LIM = hirate.Limiter(capacity=10, rate=1.0)


@pytest.mark.parametrize("call,name,message", [
    (lambda: LIM.allow(""), "EKEY", "key is empty"),
    (lambda: LIM.allow(b""), "EKEY", "key is empty"),
    (lambda: LIM.allow("k" * 513), "EKEY", "key is 513 bytes; the most is 512"),
    (lambda: LIM.allow("é" * 257), "EKEY", "key is 514 bytes; the most is 512"),
    (lambda: LIM.peek(bytearray(1000)), "EKEY", "key is 1000 bytes"),
    (lambda: LIM.allow("k", -1), "ECOST", "cost must be a whole number from 0 to 2^53-1, got -1"),
    (lambda: LIM.allow("k", 2 ** 53), "ECOST", "got 9007199254740992"),
    (lambda: LIM.allow("k", 2 ** 64), "ECOST", "got 18446744073709551616"),
    (lambda: LIM.peek("k", cost=-(2 ** 70)), "ECOST", "got -1180591620717411303424"),
    (lambda: LIM.reset(""), "EKEY", "key is empty"),
    (lambda: LIM.allow_many([("ok", 1), ("", 1)]), "EKEY", "key is empty"),
    (lambda: LIM.allow_many([("a", -1), ("b" * 600, 1)]), "ECOST", "got -1"),
    (lambda: LIM._decide_at("k", 1, True, -5), "EINVAL", "must not be negative"),
])
def test_bad_call_values_raise_config_error(call, name, message):
    with pytest.raises(hirate.ConfigError) as info:
        call()
    assert info.value.name == name
    assert message in str(info.value)


@pytest.mark.parametrize("call,message", [
    (lambda: LIM.allow(5), "key must be str or bytes, not int"),
    (lambda: LIM.allow(None), "key must be str or bytes, not NoneType"),
    (lambda: LIM.allow("k", True), "cost must be an int, not bool"),
    (lambda: LIM.allow("k", 1.0), "cost must be an int, not float"),
    (lambda: LIM.allow("k", "1"), "cost must be an int, not str"),
    (lambda: LIM.allow(), "allow() missing required argument 'key'"),
    (lambda: LIM.allow("k", 1, 2), "allow() takes at most 2 arguments (3 given)"),
    (lambda: LIM.allow("k", weight=1), "allow() got an unexpected keyword argument 'weight'"),
    (lambda: LIM.peek("k", key="j"), "peek() got multiple values for argument 'key'"),
    (lambda: LIM.reset(1.5), "key must be str or bytes, not float"),
    (lambda: LIM.allow_many(5), "allow_many() needs an iterable of (key, cost) pairs, not int"),
    (lambda: LIM.allow_many(["k"]), "items must be (key, cost) tuples, item 0 is str"),
    (lambda: LIM.allow_many([("k",)]), "item 0 is tuple"),
    (lambda: LIM.allow_many([("k", 1), ("j", False)]), "cost must be an int, not bool"),
])
def test_bad_call_types_raise_type_error(call, message):
    with pytest.raises(TypeError) as info:
        call()
    assert message in str(info.value)


def test_a_type_error_in_a_batch_decides_nothing():
    lim = hirate.Limiter(capacity=2, rate=0.001)
    with pytest.raises(TypeError):
        lim.allow_many([("a", 1), ("a", 1), (None, 1)])
    assert lim.peek("a").remaining == 2


def test_a_bad_value_in_a_batch_raises_before_anything_is_decided():
    # An argument error is the caller's bug, raised for the whole call with
    # the core's words, as allow() would; no other item was spent.
    lim = hirate.Limiter(capacity=2, rate=0.001)
    with pytest.raises(hirate.ConfigError, match="key is empty"):
        lim.allow_many([("a", 1), ("", 1), ("a", 1)])
    with pytest.raises(hirate.ConfigError, match="got -1"):
        lim.allow_many([("a", 1), ("a", -1)])
    assert lim.peek("a").remaining == 2


def test_a_bad_call_changes_nothing():
    lim = hirate.Limiter(capacity=2, rate=0.001)
    with pytest.raises(hirate.ConfigError):
        lim.allow("k", -1)
    assert lim.allow("k", 2).allowed


# --------------------------------------------------------------- passwords

CANARY = "Canary-pw-7f3a9e"


def assert_no_canary(*texts):
    for t in texts:
        assert CANARY not in t, t
        assert CANARY.lower() not in t.lower()


def test_the_password_never_shows(capfd, caplog):
    server = RedisServer(["--requirepass", "the-real-one"])
    try:
        url = f"redis://:{CANARY}@127.0.0.1:{server.port}"
        lim = hirate.Limiter(url, capacity=5, rate=1, on_error="open", timeout=5,
                             connect_timeout=5)
        seen = [repr(lim), str(lim), lim.url]
        assert lim.url == f"redis://:***@127.0.0.1:{server.port}"
        with pytest.raises(hirate.AuthError) as info:
            lim.allow("k")   # a wrong password is returned, never hidden by the policy
        e = info.value
        assert e.name == "EAUTH" and "WRONGPASS" in str(e)
        seen += [str(e), repr(e), repr(e.args), str(e.__dict__)]
        for call in (lambda: lim.peek("k"), lambda: lim.reset("k")):
            with pytest.raises(hirate.AuthError) as info:
                call()
            seen += [str(info.value), repr(info.value)]
        got, = lim.allow_many([("k", 1)])   # the error in the item's place
        assert isinstance(got, hirate.AuthError) and got.name == "EAUTH"
        seen += [str(got), repr(got)]
        user = hirate.Limiter(f"redis://someone:{CANARY}@127.0.0.1:{server.port}/2",
                              capacity=5, rate=1)
        seen += [repr(user), user.url]
        assert user.url == f"redis://someone:***@127.0.0.1:{server.port}/2"
        sock = hirate.Limiter(f"unix://:{CANARY}@/tmp/nothing-here.sock", capacity=5, rate=1,
                              connect_timeout=0.05)
        seen += [repr(sock), repr(sock.allow("k"))]
        assert sock.url == "unix://:***@/tmp/nothing-here.sock"
        for bad in (f"redis://:{CANARY}@127.0.0.1:0", f"redis://:{CANARY}@",
                    f"redis://u:{CANARY}%zz@127.0.0.1", f"http://:{CANARY}@127.0.0.1"):
            with pytest.raises(hirate.ConfigError) as info:
                hirate.Limiter(bad, capacity=5, rate=1)
            seen += [str(info.value), repr(info.value)]
        server.kill()   # the failure messages while it is down
        down = hirate.Limiter(f"redis://:{CANARY}@127.0.0.1:{server.port}", capacity=5,
                              rate=1, on_error="closed")
        seen.append(repr(down.allow("k")))
        with pytest.raises(hirate.BackendError) as info:
            down.reset("k")
        seen += [str(info.value), repr(info.value)]
    finally:
        server.close()
    out, err = capfd.readouterr()
    assert_no_canary(*seen, out, err, caplog.text)


# ----------------------------------------------- when Redis fails: policies

WANT_SOURCE = {"local": "local", "open": "fail_open", "closed": "fail_closed"}


def policy_limiter(server, on_error):
    # 0.5 s: short enough for the hang to show, long enough for a busy machine
    return hirate.Limiter(server.url, capacity=5, rate=0.001, on_error=on_error,
                          prefix="pol:", timeout=0.5, connect_timeout=0.5)


def back_on_redis(lim, key, deadline_s=15.0):
    """Calls until Redis decides again (the breaker probes after its
    backoff); returns that decision."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        d = lim.allow(key, 0)
        if d.source == "redis":
            return d
        time.sleep(0.05)
    pytest.fail("the limiter did not come back to Redis within %g s" % deadline_s)


def check_policy_decision(d, on_error, error, spent_before):
    assert d.source == WANT_SOURCE[on_error]
    assert d.error == error
    assert d.limit == 5
    if on_error == "open":
        assert (d.allowed, d.remaining, d.retry_after) == (True, 4, 0.0)
    elif on_error == "closed":
        assert not d.allowed and d.remaining == 0
        assert 0 < d.retry_after <= 6.25   # until Redis is tried again (backoff <= 5 s +25%)
        assert d.retry_after == d.reset_after
    else:
        # the local fallback's own bucket, which knows nothing of Redis' spends
        assert d.allowed and d.remaining == 4 - spent_before


@pytest.mark.parametrize("on_error", ["local", "open", "closed"])
def test_policy_while_redis_is_killed(own_redis, on_error):
    lim = policy_limiter(own_redis, on_error)
    assert lim.allow("k").source == "redis"
    own_redis.kill()
    t = time.monotonic()
    first = lim.allow("k")
    check_policy_decision(first, on_error, first.error, 0)
    assert first.error in ("EIO", "ECONNECT")   # the pooled connection broke, or a new one failed
    second = lim.allow("k")
    check_policy_decision(second, on_error, second.error, 1)
    assert second.error in ("EIO", "ECONNECT")
    assert time.monotonic() - t < 1.0   # refused at once, no timeout to wait out
    own_redis.start(own_redis.port)
    d = back_on_redis(lim, "k")
    assert d.error is None and d.remaining == 5   # a new server: the bucket is full
    assert lim.allow("k").remaining == 4
    assert lim._stats()["breaker_opens"] >= 1


@pytest.mark.parametrize("on_error", ["local", "open", "closed"])
def test_policy_while_redis_hangs(own_redis, on_error):
    lim = policy_limiter(own_redis, on_error)
    assert lim.allow("k").source == "redis"
    own_redis.stop()   # SIGSTOP: connections open, nothing answers
    try:
        t = time.monotonic()
        d = lim.allow("k")
        took = time.monotonic() - t
        check_policy_decision(d, on_error, "ETIMEDOUT", 0)
        assert took < 3.0   # bounded by the 0.5 s timeout, with room for a busy machine
        t = time.monotonic()
        d = lim.allow("k")   # the breaker is open: the policy answers without waiting
        check_policy_decision(d, on_error, "ETIMEDOUT", 1)
        assert time.monotonic() - t < 0.1
    finally:
        own_redis.cont()
    d = back_on_redis(lim, "k")
    assert d.error is None
    assert lim._stats()["policy"] >= 2


def test_reset_while_redis_is_down_raises_backend_error(own_redis):
    lim = policy_limiter(own_redis, "local")
    own_redis.kill()
    with pytest.raises(hirate.BackendError) as info:
        lim.reset("k")
    assert info.value.name in ("ECONNECT", "EIO")
    assert "connect" in str(info.value) or "Redis" in str(info.value)


def test_a_hang_during_reset_is_a_timeout_error(own_redis):
    lim = policy_limiter(own_redis, "local")
    lim.allow("k")
    own_redis.stop()
    try:
        with pytest.raises(hirate.TimeoutError) as info:
            lim.reset("k")
        assert isinstance(info.value, builtins.TimeoutError)
        assert info.value.name == "ETIMEDOUT"
    finally:
        own_redis.cont()


def test_a_missing_permission_is_auth_error():
    server = RedisServer()
    try:
        assert server.command("ACL", "SETUSER", "rl", "on", ">pw", "~rl:*", "&*",
                              "+@all") == "OK"
        lim = hirate.Limiter(f"redis://rl:pw@127.0.0.1:{server.port}", capacity=5, rate=1,
                             prefix="other:", on_error="open", timeout=5, connect_timeout=5)
        with pytest.raises(hirate.AuthError) as info:
            lim.allow("k")
        assert info.value.name == "ENOPERM"
        ok = hirate.Limiter(f"redis://rl:pw@127.0.0.1:{server.port}", capacity=5, rate=1,
                            timeout=5, connect_timeout=5)
        assert ok.allow("k").source == "redis"
    finally:
        server.close()


# Durations: a str with a unit, or a number of seconds, read by the core.
@pytest.mark.parametrize("given,seconds", [
    (dict(timeout="250ms", connect_timeout="0.5"), (0.25, 0.5)),
    (dict(timeout="0.25s", connect_timeout="2s"), (0.25, 2.0)),
    (dict(timeout=0.25, connect_timeout=2), (0.25, 2.0)),
    (dict(timeout="1500us", connect_timeout="1m"), (0.002, 60.0)),
])
def test_durations_are_a_str_with_a_unit_or_seconds(given, seconds):
    lim = hirate.Limiter("redis://127.0.0.1:1", capacity=1, rate=1, deny_cache_max="2m",
                         **given)
    ep = lim._endpoint()
    assert (ep["timeout"], ep["connect_timeout"]) == seconds


def test_each_item_of_a_batch_has_its_own_message(redis):
    """Two items that Redis refuses in two ways in one round trip: each has
    its reply's own words (hirate_allow_many_msgs), not the other's."""
    redis.command("RPUSH", "rl:a list", "x")
    redis.command("SET", "rl:not a bucket", "1 x")
    lim = hirate.Limiter(redis.url, capacity=5, rate=1)
    ok, wrongtype, corrupt = lim.allow_many([("fine", 1), ("a list", 1), ("not a bucket", 1)])
    assert ok.allowed
    assert (type(wrongtype), wrongtype.name) == (hirate.BackendError, "EREPLY")
    assert str(wrongtype).startswith("Redis replied: WRONGTYPE ")
    assert (type(corrupt), corrupt.name) == (hirate.BackendError, "EREPLY")
    assert str(corrupt) == "Redis replied: ERR hirate: bucket state is corrupt"
