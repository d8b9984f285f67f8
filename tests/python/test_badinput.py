"""The bad-input sweep through the Python API (Limiter, AsyncLimiter, and
the Limit of the Flask and ASGI integrations):

- every number option (capacity, rate, timeout, connect_timeout) and every
  cost at NaN, +-inf, negative, zero, 1e308 and 2^53, and of wrong types:
  each raises the documented class (ConfigError with its .name, or
  TypeError) with a message that names the value, or is accepted when the
  rules accept it (a rate of 1e308, a cost of 0);
- keys that are empty, 1 MiB (str, bytes, bytearray, memoryview), a str
  with no UTF-8 form, or of wrong types: refused the same way on the memory
  and the Redis backend, and nothing spent;
- keys that are valid although they look dangerous (NUL, CRLF, cluster hash
  tags, printf directives, bytes that are not UTF-8): each stored byte for
  byte under the prefix in Redis, in a bucket of its own.
"""

import asyncio
import math

import pytest

import hirate

pytestmark = pytest.mark.timeout(60)

NAN, INF = math.nan, math.inf
MIB = 1 << 20

CAP = "capacity must be a whole number from 1 to 2^53-1, got "
RATE = "rate must be a finite number of tokens per second above 0, got "
COST = "cost must be a whole number from 0 to 2^53-1, got "


def seconds(name):
    return f"{name} must be from 0.001 to 60 seconds, got "


# ------------------------------------------------------------------ options

# (option, value, error name, the whole message)
BAD_OPTION_VALUES = [
    ("capacity", NAN, "ECAPACITY", CAP + "nan"),
    ("capacity", INF, "ECAPACITY", CAP + "inf"),
    ("capacity", -INF, "ECAPACITY", CAP + "-inf"),
    ("capacity", -1, "ECAPACITY", CAP + "-1"),
    ("capacity", 0, "ECAPACITY", CAP + "0"),
    ("capacity", 1e308, "ECAPACITY", CAP + "1e+308"),
    ("capacity", 2 ** 53, "ECAPACITY", CAP + "9007199254740992"),
    ("capacity", 0.5, "ECAPACITY", CAP + "0.5"),
    ("rate", NAN, "ERATE", RATE + "nan"),
    ("rate", INF, "ERATE", RATE + "inf"),
    ("rate", -INF, "ERATE", RATE + "-inf"),
    ("rate", -1, "ERATE", RATE + "-1"),
    ("rate", 0, "ERATE", RATE + "0"),
    ("rate", -0.0, "ERATE", RATE + "-0"),
    ("rate", -1e308, "ERATE", RATE + "-1e+308"),
    ("rate", 1e-308, "ERANGE",
     "capacity 10 at rate 1e-308 takes over 2^53 us to refill; raise the rate or lower the "
     "capacity"),
]
for _name in ("timeout", "connect_timeout"):
    BAD_OPTION_VALUES += [
        (_name, NAN, "EOPTION", seconds(_name) + "nan"),
        (_name, INF, "EOPTION", seconds(_name) + "inf"),
        (_name, -INF, "EOPTION", seconds(_name) + "-inf"),
        (_name, -1, "EOPTION", seconds(_name) + "-1"),
        (_name, 0, "EOPTION", seconds(_name) + "0"),
        (_name, 1e308, "EOPTION", seconds(_name) + "1e+308"),
        (_name, 2 ** 53, "EOPTION", seconds(_name) + "9007199254740992"),
    ]

SECONDS_OR_STR = "must be a number of seconds or a str with a unit ('100ms'), not "
BAD_OPTION_TYPES = [
    ("capacity", "10", "capacity must be an int, not str"),
    ("capacity", None, "capacity must be an int, not NoneType"),
    ("capacity", True, "capacity must be an int, not bool"),
    ("capacity", b"10", "capacity must be an int, not bytes"),
    ("rate", "1", "rate must be a number, not str"),
    ("rate", None, "rate must be a number, not NoneType"),
    ("rate", False, "rate must be a number, not bool"),
    ("timeout", b"0.1", "timeout " + SECONDS_OR_STR + "bytes"),
    ("timeout", True, "timeout " + SECONDS_OR_STR + "bool"),
    ("connect_timeout", None, "connect_timeout " + SECONDS_OR_STR + "NoneType"),
]

LIMITERS = [hirate.Limiter, hirate.AsyncLimiter]


@pytest.mark.parametrize("cls", LIMITERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("option,value,name,message", BAD_OPTION_VALUES,
                         ids=lambda v: repr(v)[:20])
def test_a_bad_number_option_raises_config_error_naming_it(cls, option, value, name, message):
    kw = dict(capacity=10, rate=1.0)
    kw[option] = value
    with pytest.raises(hirate.ConfigError) as info:
        cls("redis://127.0.0.1:1", **kw)   # nothing connects: the options are checked first
    assert (info.value.name, str(info.value)) == (name, message)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("cls", LIMITERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("option,value,message", BAD_OPTION_TYPES, ids=lambda v: repr(v)[:20])
def test_an_option_of_a_wrong_type_raises_type_error_naming_it(cls, option, value, message):
    kw = dict(capacity=10, rate=1.0)
    kw[option] = value
    with pytest.raises(TypeError) as info:
        cls(**kw)
    assert str(info.value) == message


@pytest.mark.parametrize("rate", [1e308, float(2 ** 53), 2 ** 53])
def test_huge_finite_rates_are_valid_and_refill_within_a_microsecond(rate):
    lim = hirate.Limiter(capacity=5, rate=rate)
    assert lim._decide_at("k", 5, True, 1000).remaining == 0
    d = lim._decide_at("k", 1, True, 1000)
    assert (d.allowed, d.retry_after_us, d.reset_after_us) == (False, 1, 1)
    assert lim._decide_at("k", 5, True, 1001).allowed


def test_the_largest_capacity_is_valid_with_a_rate_that_refills_it_in_time():
    lim = hirate.Limiter(capacity=2 ** 53 - 1, rate=1e9)
    assert lim.allow("k", 2 ** 53 - 1).remaining == 0
    with pytest.raises(hirate.ConfigError) as info:
        hirate.Limiter(capacity=2 ** 53 - 1, rate=1)
    assert info.value.name == "ERANGE"
    assert str(info.value).startswith("capacity 9007199254740991 at rate 1 takes over 2^53 us")


# The limits of the web integrations (hirate.flask.Limit is hirate.asgi.Limit)
# are checked when they are made, by hirate.Limiter's rules, classes and
# messages.
WEB_LIMITS = [
    (dict(capacity=NAN), hirate.ConfigError, CAP + "nan"),
    (dict(capacity=INF), hirate.ConfigError, CAP + "inf"),
    (dict(capacity=1e308), hirate.ConfigError, CAP + "1e+308"),
    (dict(capacity=-1), hirate.ConfigError, CAP + "-1"),
    (dict(capacity=0), hirate.ConfigError, CAP + "0"),
    (dict(capacity=2 ** 53), hirate.ConfigError, CAP + "9007199254740992"),
    (dict(capacity=b"5"), TypeError, "capacity must be an int, not bytes"),
    (dict(capacity=True), TypeError, "capacity must be an int, not bool"),
    (dict(rate=NAN), hirate.ConfigError, RATE + "nan"),
    (dict(rate=INF), hirate.ConfigError, RATE + "inf"),
    (dict(rate=-INF), hirate.ConfigError, RATE + "-inf"),
    (dict(rate=-1), hirate.ConfigError, RATE + "-1"),
    (dict(rate=0), hirate.ConfigError, RATE + "0"),
    (dict(rate=1e-308), hirate.ConfigError,
     "capacity 5 at rate 1e-308 takes over 2^53 us to refill; raise the rate or lower the "
     "capacity"),
    (dict(rate=b"1"), TypeError, "rate must be a number, not bytes"),
    (dict(cost=NAN), TypeError, "cost must be an int or a callable, got float"),
    (dict(cost=INF), TypeError, "cost must be an int or a callable, got float"),
    (dict(cost=-1), hirate.ConfigError, COST + "-1"),
    (dict(cost=2 ** 53), hirate.ConfigError, COST + "9007199254740992"),
    (dict(cost="1"), TypeError, "cost must be an int or a callable, got str"),
]


@pytest.mark.parametrize("kw,cls,message", WEB_LIMITS, ids=lambda v: repr(v)[:24])
def test_a_bad_web_limit_raises_naming_the_problem(kw, cls, message):
    pytest.importorskip("flask")
    from hirate.asgi import Limit as AsgiLimit
    from hirate.flask import Limit
    assert Limit is AsgiLimit
    args = dict(capacity=5, rate=1.0)
    args.update(kw)
    cost = args.pop("cost", 1)
    with pytest.raises(cls) as info:
        Limit(args["capacity"], args["rate"], cost=cost)
    assert type(info.value) is cls
    assert str(info.value) == message


# -------------------------------------------------------------------- calls

@pytest.fixture(params=["memory", "redis"])
def lim(request):
    """A limiter on each backend; for Redis, the session's emptied server."""
    if request.param == "memory":
        limiter = hirate.Limiter(capacity=5, rate=0.001)
    else:
        server = request.getfixturevalue("redis")
        limiter = hirate.Limiter(server.url, capacity=5, rate=0.001, prefix="bad:",
                                 on_error="closed", timeout=5, connect_timeout=5)
    yield limiter
    limiter.close()


# (key, exception class, error name or None, the whole message)
BAD_KEYS = [
    ("", hirate.ConfigError, "EKEY", "key is empty"),
    (b"", hirate.ConfigError, "EKEY", "key is empty"),
    (bytearray(), hirate.ConfigError, "EKEY", "key is empty"),
    ("k" * 513, hirate.ConfigError, "EKEY", "key is 513 bytes; the most is 512"),
    ("k" * MIB, hirate.ConfigError, "EKEY", "key is 1048576 bytes; the most is 512"),
    (b"\0" * MIB, hirate.ConfigError, "EKEY", "key is 1048576 bytes; the most is 512"),
    (bytearray(MIB), hirate.ConfigError, "EKEY", "key is 1048576 bytes; the most is 512"),
    (memoryview(b"k" * MIB), hirate.ConfigError, "EKEY", "key is 1048576 bytes; the most is 512"),
    ("é" * (MIB // 2), hirate.ConfigError, "EKEY", "key is 1048576 bytes; the most is 512"),
    ("\udcff", UnicodeEncodeError, None,
     "'utf-8' codec can't encode character '\\udcff' in position 0: surrogates not allowed"),
    (5, TypeError, None, "key must be str or bytes, not int"),
    (None, TypeError, None, "key must be str or bytes, not NoneType"),
    (1.5, TypeError, None, "key must be str or bytes, not float"),
    (NAN, TypeError, None, "key must be str or bytes, not float"),
    (["k"], TypeError, None, "key must be str or bytes, not list"),
    (memoryview(b"abcdef")[::2], BufferError, None,
     "memoryview: underlying buffer is not C-contiguous"),
]

# (cost, exception class, error name or None, the whole message)
BAD_COSTS = [
    (-1, hirate.ConfigError, "ECOST", COST + "-1"),
    (-(2 ** 63), hirate.ConfigError, "ECOST", COST + "-9223372036854775808"),
    (2 ** 53, hirate.ConfigError, "ECOST", COST + "9007199254740992"),
    (2 ** 64, hirate.ConfigError, "ECOST", COST + "18446744073709551616"),
    (NAN, TypeError, None, "cost must be an int, not float"),
    (INF, TypeError, None, "cost must be an int, not float"),
    (-INF, TypeError, None, "cost must be an int, not float"),
    (1e308, TypeError, None, "cost must be an int, not float"),
    (1.0, TypeError, None, "cost must be an int, not float"),
    ("1", TypeError, None, "cost must be an int, not str"),
    (True, TypeError, None, "cost must be an int, not bool"),
    (None, TypeError, None, "cost must be an int, not NoneType"),
]


def calls(lim, key, cost=1):
    """Every call of the API that takes this key and cost, as thunks; reset,
    which takes no cost, when the key is the bad argument."""
    out = [lambda: lim.allow(key, cost), lambda: lim.peek(key, cost),
           lambda: lim.allow_many([("fine", 1), (key, cost)])]
    if key != "k":
        out.append(lambda: lim.reset(key))
    return out


def check_raises(fn, cls, name, message):
    with pytest.raises(cls) as info:
        fn()
    assert type(info.value) is cls
    assert str(info.value) == message
    if name:
        assert info.value.name == name


@pytest.mark.parametrize("key,cls,name,message", BAD_KEYS, ids=lambda v: repr(v)[:16])
def test_a_bad_key_raises_naming_the_problem_and_spends_nothing(lim, key, cls, name, message):
    for fn in calls(lim, key):
        check_raises(fn, cls, name, message)
    assert lim.peek("k").remaining == 5


@pytest.mark.parametrize("cost,cls,name,message", BAD_COSTS, ids=lambda v: repr(v)[:16])
def test_a_bad_cost_raises_naming_the_problem_and_spends_nothing(lim, cost, cls, name, message):
    for fn in calls(lim, "k", cost):
        check_raises(fn, cls, name, message)
    assert lim.peek("k").remaining == 5


def test_a_cost_of_zero_and_one_above_the_capacity_are_decisions_not_errors(lim):
    d = lim.allow("k", 0)
    assert (d.allowed, d.remaining, d.retry_after) == (True, 5, 0.0)
    d = lim.allow("k", 2 ** 53 - 1)
    assert (d.allowed, d.remaining, d.retry_after, d.retry_after_us) == (False, 5, INF, None)


def test_the_async_limiter_refuses_bad_keys_and_costs_alike():
    async def sweep():
        lim = hirate.AsyncLimiter(capacity=5, rate=0.001)
        for key, cls, name, message in BAD_KEYS:
            for fn in (lambda: lim.allow(key), lambda: lim.peek(key), lambda: lim.reset(key),
                       lambda: lim.allow_many([(key, 1)])):
                with pytest.raises(cls) as info:
                    await fn()
                assert str(info.value) == message
                assert getattr(info.value, "name", None) == name
        for cost, cls, name, message in BAD_COSTS:
            with pytest.raises(cls) as info:
                await lim.allow("k", cost)
            assert str(info.value) == message
        assert (await lim.peek("k")).remaining == 5
        await lim.close()

    asyncio.run(sweep())


# ------------------------------------------------- valid keys that look odd

ODD_KEYS = [
    ("NUL inside", b"a\0b"),
    ("NUL inside, another byte after it", b"a\0c"),
    ("the bytes before that NUL", b"a"),
    ("a lone NUL", b"\0"),
    ("CRLF", b"a\r\nb"),
    ("a RESP command after CRLF", b"x\r\n*1\r\n$8\r\nFLUSHALL\r\n"),
    ("a cluster hash tag", b"{user1}:a"),
    ("the same hash tag, another key", b"{user1}:b"),
    ("empty braces", b"{}"),
    ("printf directives", b"%s%n%p%b"),
    ("bytes that are not UTF-8", b"\xff\xfe\xfd"),
    ("an overlong NUL", b"\xc0\x80"),
    ("512 bytes", b"\xff" * 512),
]


def test_odd_keys_are_stored_byte_for_byte_under_the_prefix_and_never_collide(redis):
    prefix = "{py}\r\n:"
    lim = hirate.Limiter(redis.url, capacity=5, rate=0.001, prefix=prefix, on_error="closed",
                         timeout=5, connect_timeout=5)
    for what, key in ODD_KEYS:
        d = lim.allow(key)
        assert (d.allowed, d.remaining, d.source) == (True, 4, "redis"), what
        assert redis.command("PTTL", prefix.encode() + key) > 0, what
    # One bucket each: every one still holds 4, and Redis holds exactly these
    # keys (the FLUSHALL after the CRLF never ran).
    for what, key in ODD_KEYS:
        assert lim.peek(key).remaining == 4, what
    assert redis.command("DBSIZE") == len(ODD_KEYS)
    # A str is its UTF-8 bytes: "é" is the bucket of b"\xc3\xa9".
    lim.allow("é", 2)
    assert lim.peek(b"\xc3\xa9").remaining == 3
    assert redis.command("EXISTS", prefix.encode() + "é".encode()) == 1
    # reset finds the very same bytes.
    lim.reset(b"a\0b")
    assert redis.command("EXISTS", prefix.encode() + b"a\0b") == 0
    assert redis.command("EXISTS", prefix.encode() + b"a\0c") == 1
    lim.close()


def test_odd_keys_have_buckets_of_their_own_in_memory():
    lim = hirate.Limiter(capacity=5, rate=0.001)
    for what, key in ODD_KEYS:
        assert lim.allow(key).remaining == 4, what
    for what, key in ODD_KEYS:
        assert lim.peek(key).remaining == 4, what
    assert lim._stats()["memory_keys"] == len(ODD_KEYS)
