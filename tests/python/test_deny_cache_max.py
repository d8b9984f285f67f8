"""deny_cache_max: a reset made by another process reaches this one's deny
cache within the bound. Two real processes (multiprocessing) on one
redis-server: A's cache refuses a key whose refill takes an hour, B resets
it, A's cache still refuses it right after (the refusal it foretold), and A
is allowed again once the bound is over, by Redis, from a full bucket."""

import multiprocessing
import time

import pytest

import hirate

pytestmark = pytest.mark.timeout(60)

HOUR_RATE = 1 / 3600   # a refused key would wait ~an hour for its token


def process_a(url, bound, to_b, from_b, out):
    lim = hirate.Limiter(url, capacity=2, rate=HOUR_RATE, deny_cache_max=bound,
                         timeout=5, connect_timeout=5)
    seen = [(d.allowed, d.source) for d in (lim.allow("k") for _ in range(2))]
    armed = time.monotonic()   # the reply that foretells the refusals
    seen += [(d.allowed, d.source) for d in (lim.allow("k") for _ in range(2))]
    to_b.put("refused")
    from_b.get(timeout=30)          # B has reset "k"
    first = lim.allow("k")
    elapsed = time.monotonic() - armed
    seen.append((first.allowed, first.source, first.retry_after > 3000))
    deadline = time.monotonic() + 20  # generous: the bound is far below it
    d = first
    while not d.allowed and time.monotonic() < deadline:
        time.sleep(0.02)
        d = lim.allow("k")
    seen.append((d.allowed, d.source, d.remaining))
    out.put((seen, elapsed, lim.stats().decisions["cache"]))


def process_b(url, from_a, to_a):
    with hirate.Limiter(url, capacity=2, rate=HOUR_RATE, timeout=5, connect_timeout=5) as lim:
        lim.peek("other")           # connected before A waits for it
        from_a.get(timeout=30)
        lim.reset("k")
    to_a.put("reset")


@pytest.mark.parametrize("bound", [0.2, 1.0])
def test_a_reset_in_another_process_is_seen_within_the_bound(redis, bound):
    ctx = multiprocessing.get_context("spawn")
    a_to_b, b_to_a, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    a = ctx.Process(target=process_a, args=(redis.url, bound, a_to_b, b_to_a, out))
    b = ctx.Process(target=process_b, args=(redis.url, a_to_b, b_to_a))
    a.start()
    b.start()
    try:
        seen, elapsed, cached = out.get(timeout=50)
    finally:
        for p in (a, b):
            p.join(10)
            if p.is_alive():
                p.kill()
    # the second reply (0 left) foretells the refusals
    assert seen[:4] == [(True, "redis"), (True, "redis"), (False, "cache"), (False, "cache")]
    if elapsed < bound - 0.05:
        # right after the reset, the cache still foretells the hour-long
        # refusal: the bound, not the refill, is what lets the key through
        assert seen[4] == (False, "cache", True)
        assert cached >= 3
    elif elapsed > bound:
        # (a machine so busy that the bound was over before A asked)
        assert seen[4][:2] == (True, "redis")
    # then Redis is asked again and allows it from the full bucket the reset left
    assert seen[5] == (True, "redis", 1)


def test_deny_cache_max_is_checked_by_the_core():
    for bad in (0, 0.0001, -1, 86401, float("nan"), float("inf"), 1e300):
        with pytest.raises(hirate.ConfigError) as e:
            hirate.Limiter(capacity=1, rate=1.0, deny_cache_max=bad)
        assert e.value.name == "EOPTION"
    with pytest.raises(hirate.ConfigError, match='^deny_cache_max: "2d" is not a duration'):
        hirate.Limiter(capacity=1, rate=1.0, deny_cache_max="2d")
    with pytest.raises(hirate.ConfigError, match="^deny_cache_max must be from 1ms to 86400s, "
                                                 "got 25h$"):
        hirate.Limiter(capacity=1, rate=1.0, deny_cache_max="25h")
    with pytest.raises(TypeError, match="deny_cache_max must be a number of seconds or a str"):
        hirate.Limiter(capacity=1, rate=1.0, deny_cache_max=True)
    hirate.Limiter(capacity=1, rate=1.0, deny_cache_max="1")       # seconds, as 1 is
    hirate.Limiter(capacity=1, rate=1.0, deny_cache_max="500ms")
    hirate.Limiter(capacity=1, rate=1.0, deny_cache_max=0.001)
    hirate.Limiter(capacity=1, rate=1.0, deny_cache_max=86400)
    hirate.AsyncLimiter(capacity=1, rate=1.0, deny_cache_max=0.5)
