"""Sharing a limiter: many threads on one key get exactly the capacity,
calls on a Redis limiter let other threads run, close() waits for the calls
in flight, and a limiter made before fork() works in the children."""

import os
import threading
import time

import pytest

import hirate

pytestmark = pytest.mark.timeout(120)


def hammer(lim, key, threads, calls):
    """threads threads, released together, each calling allow(key) calls
    times; returns every decision."""
    barrier = threading.Barrier(threads)
    results = [[] for _ in range(threads)]
    errors = []

    def run(i):
        try:
            barrier.wait()
            for _ in range(calls):
                results[i].append(lim.allow(key))
        except BaseException as e:   # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    return [d for r in results for d in r]


def test_64_threads_on_one_key_in_memory_get_exactly_the_capacity():
    lim = hirate.Limiter(capacity=100, rate=0.001)
    got = hammer(lim, "hot", 64, 5)
    assert len(got) == 320
    assert sum(d.allowed for d in got) == 100
    assert sorted(d.remaining for d in got if d.allowed) == list(range(100))


def test_64_threads_on_one_key_in_redis_get_exactly_the_capacity(redis):
    lim = hirate.Limiter(redis.url, capacity=100, rate=0.001, prefix="thr:", on_error="closed",
                         timeout=10, connect_timeout=5)
    got = hammer(lim, "hot", 64, 5)
    assert len(got) == 320
    assert [d.error for d in got if d.error] == []   # no timeout turned into a refusal
    assert {d.source for d in got} <= {"redis", "cache"}
    assert sum(d.allowed for d in got) == 100
    assert sorted(d.remaining for d in got if d.allowed) == list(range(100))
    assert float(redis.command("GET", "thr:hot").split()[0]) < 1   # stored: drained
    assert lim._stats()["connects"] <= 16   # the pool's bound


def test_a_redis_call_lets_other_threads_run(own_redis):
    lim = hirate.Limiter(own_redis.url, capacity=5, rate=1, timeout=2.0, on_error="open")
    lim.allow("k")   # connected
    own_redis.stop()
    started, done = threading.Event(), threading.Event()
    out = []

    def call():
        started.set()
        out.append(lim.allow("k"))   # waits out the 2 s timeout
        done.set()

    t = threading.Thread(target=call)
    try:
        t.start()
        started.wait()
        time.sleep(0.3)   # had the call kept the GIL, this thread could not wake before it ends
        assert not done.is_set(), "the main thread ran only after the Redis call returned"
        t.join()
    finally:
        own_redis.cont()
    assert out[0].source == "fail_open" and out[0].error == "ETIMEDOUT"


def test_close_waits_for_the_calls_in_flight(own_redis):
    lim = hirate.Limiter(own_redis.url, capacity=5, rate=1, timeout=1.0, on_error="closed",
                         pool_size=4)
    lim.allow("k")
    own_redis.stop()
    out, errors = [], []

    def call():
        try:
            out.append(lim.allow("k"))
        except hirate.ClosedError as e:
            errors.append(e)

    ts = [threading.Thread(target=call) for _ in range(4)]
    try:
        for t in ts:
            t.start()
        time.sleep(0.2)   # the calls are waiting on the stopped server
        lim.close()       # returns only once none of them can touch the limiter
        for t in ts:
            t.join()
    finally:
        own_redis.cont()
    assert len(out) + len(errors) == 4
    assert all(d.source == "fail_closed" for d in out)
    with pytest.raises(hirate.ClosedError):
        lim.allow("k")


def test_close_races_calls_without_harm(redis):
    lim = hirate.Limiter(redis.url, capacity=1_000_000, rate=1, prefix="race:")
    stop = threading.Event()
    counts = {"ok": 0, "closed": 0}

    def run():
        while not stop.is_set():
            try:
                lim.allow("k")
                counts["ok"] += 1
            except hirate.ClosedError:
                counts["closed"] += 1
                return

    ts = [threading.Thread(target=run) for _ in range(8)]
    for t in ts:
        t.start()
    time.sleep(0.2)
    lim.close()
    stop.set()
    for t in ts:
        t.join()
    assert counts["ok"] > 0 and counts["closed"] == 8


def wait_child(pid):
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def in_children(n, work):
    """Runs work() in n forked children at once; returns what each wrote."""
    pipes, pids = [], []
    for _ in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:   # the child: never return into pytest
            code = 1
            try:
                os.close(r)
                os.write(w, repr(work()).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        pipes.append(r)
        pids.append(pid)
    out = []
    for r, pid in zip(pipes, pids):
        with os.fdopen(r, "rb") as f:
            data = f.read()
        assert wait_child(pid) == 0
        out.append(eval(data.decode()))   # noqa: S307 - our own children's repr of ints
    return out


def test_a_limiter_made_before_fork_works_in_4_children(redis):
    lim = hirate.Limiter(redis.url, capacity=20, rate=0.001, prefix="fork:", on_error="closed",
                         timeout=5, connect_timeout=5)
    assert lim.peek("k").source == "redis"   # the parent holds a connection now

    def child():
        got = [lim.allow("k") for _ in range(10)]
        assert all(d.source in ("redis", "cache") and d.error is None for d in got), got
        return sum(d.allowed for d in got)

    allowed = in_children(4, child)
    assert sum(allowed) == 20
    # The parent's connection was left intact by the children.
    d = lim.allow("k")
    assert (d.allowed, d.source in ("redis", "cache"), d.error) == (False, True, None)
    assert lim.peek("k", 0).source == "redis"
    assert lim._stats()["connects"] == 1


def test_a_memory_limiter_is_copied_into_each_child():
    lim = hirate.Limiter(capacity=5, rate=0.001)
    lim.allow("k", 2)
    assert in_children(2, lambda: lim.allow("k", 3).remaining) == [0, 0]
    assert lim.peek("k").remaining == 3   # the children spent their own copies
