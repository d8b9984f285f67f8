"""A program that uses hirate's public API as an application would, with
every annotation: tests/python/test_stubs.py type-checks it with
`mypy --strict` (the stubs must accept what users write, such as a return
inside `with`) and runs it."""

import asyncio
from typing import Optional

import flask

import hirate
import hirate.flask


def spend(key: str) -> bool:
    with hirate.Limiter(capacity=2, rate=1.0, timeout="100ms") as lim:
        d: hirate.Decision = lim.allow(key)
        return d.allowed  # a return inside `with`: __exit__ does not swallow


def wait_for(lim: hirate.Limiter, key: str) -> Optional[float]:
    d = lim.peek(key, 3)
    return None if d.allowed else d.retry_after


def limits() -> list[int]:
    return [spec.capacity for spec in hirate.parse_limits("10/s; 1000/day")]


def banded() -> int:
    lim = hirate.Limiter(limits=[hirate.Band(10, 10.0, "burst"), (1000, 1000 / 86400)],
                         connect_timeout=0.25, deny_cache_max="2s")
    try:
        return lim.allow(b"alice", 2).remaining
    except hirate.ConfigError as e:
        raise SystemExit(e.name) from e
    finally:
        lim.close()


async def spend_async(key: str) -> int:
    async with hirate.AsyncLimiter(capacity=5, rate=1.0, timeout=0.1) as lim:
        d = await lim.allow(key)
        return d.remaining


def ready() -> bool:
    health: hirate.Health = hirate.Limiter(capacity=1, rate=1.0).check()
    latencies = [n.latency for n in health.nodes if n.latency is not None]
    return health.ok and latencies == []  # in memory: no node to ask


def app() -> flask.Flask:
    web = flask.Flask(__name__)
    limiter = hirate.flask.RateLimiter(web, default_limits="100/minute")

    @web.get("/")
    @limiter.limit("5/second")
    def index() -> str:
        return "ok"

    return web


def main() -> None:
    assert spend("k") is True
    lim = hirate.Limiter(capacity=2, rate=1.0)
    assert wait_for(lim, "k") == float("inf")  # 3 tokens never fit in 2
    assert limits() == [10, 1000]
    assert banded() == 8
    assert asyncio.run(spend_async("k")) == 4
    assert ready() is True
    assert app().test_client().get("/").status_code == 200
    print("ok")


if __name__ == "__main__":
    main()
