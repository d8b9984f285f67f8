"""The rate-limit headers of every case, as Flask and ASGI send them, each
parsed by a real Structured Fields parser (http_sf): allowed, refused, a
burst limit stacked on a daily one and refused by the burst (the daily band
reports its own reset time), and the failure policies' decisions while
Redis is down (no RateLimit item where no bucket stands behind the figures;
the local bucket's true figures). The values are the core's
(hirate_response_format); docs/semantics.md, "Response headers", says why.
The rates are slow: every figure is exact.
"""

import json

import http_sf
import pytest
from fastapi import Depends, FastAPI
from flask import Flask
from starlette.testclient import TestClient

from hirate import asgi
from hirate import flask as hflask

pytestmark = pytest.mark.timeout(60)

LISTS = ("RateLimit-Policy", "RateLimit")
INTS = ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After")


def parsed(headers):
    """{header: value} of the rate-limit headers: the two lists as
    [(name, {param: int})], the others as ints, each parsed by http_sf
    (which raises on anything a Structured Field may not be)."""
    out = {}
    for name in LISTS + INTS:
        value = headers.get(name)
        if value is None:
            continue
        if name in LISTS:
            out[name] = [(item, dict(params)) for item, params in
                         http_sf.parse(value.encode("ascii"), tltype="list")]
        else:
            item, params = http_sf.parse(value.encode("ascii"), tltype="item")
            assert isinstance(item, int) and not isinstance(item, bool) and params == {}
            out[name] = item
    return out


def flask_client(url, limits, on_error="local"):
    app = Flask(__name__)
    limiter = hflask.RateLimiter(app, url=url, on_error=on_error, legacy_headers=True,
                                 connect_timeout=5.0, timeout=5.0)

    @app.get("/r")
    @limiter.limit(limits)
    def r():
        return "ok"

    client = app.test_client()

    def request():
        resp = client.get("/r")
        body = json.loads(resp.data) if resp.status_code != 200 else None
        return resp.status_code, parsed(resp.headers), body

    return request, lambda: None


def asgi_client(url, limits, on_error="local", dependency=False):
    limiter = asgi.RateLimiter(url=url, on_error=on_error, legacy_headers=True,
                               routes={} if dependency else {"/r": limits},
                               connect_timeout=5.0, timeout=5.0)
    app = FastAPI()
    if dependency:
        app.add_exception_handler(asgi.RateLimitExceeded, limiter.exception_handler)

        @app.get("/r", dependencies=[Depends(limiter.limit(limits))])
        async def r():
            return "ok"
    else:
        app.add_middleware(asgi.RateLimitMiddleware, limiter=limiter)

        @app.get("/r")
        async def r2():
            return "ok"

    client = TestClient(app)
    client.__enter__()

    def request():
        resp = client.get("/r")
        body = resp.json() if resp.status_code != 200 else None
        return resp.status_code, parsed(resp.headers), body

    return request, lambda: client.__exit__(None, None, None)


MAKERS = {
    "flask": flask_client,
    "asgi": asgi_client,
    "asgi-dependency": lambda *a, **k: asgi_client(*a, dependency=True, **k),
}


@pytest.fixture(params=sorted(MAKERS))
def make(request):
    closers = []

    def made(*args, **kwargs):
        call, close = MAKERS[request.param](*args, **kwargs)
        closers.append(close)
        return call

    yield made
    for close in closers:
        close()


def test_allowed_then_refused(redis, make):
    call = make(redis.url, "2/minute")
    policy = [("2-per-60s", {"q": 2, "w": 60})]
    assert call() == (200, {
        "RateLimit-Policy": policy, "RateLimit": [("2-per-60s", {"r": 1, "t": 30})],
        "X-RateLimit-Limit": 2, "X-RateLimit-Remaining": 1, "X-RateLimit-Reset": 30}, None)
    assert call()[:2] == (200, {
        "RateLimit-Policy": policy, "RateLimit": [("2-per-60s", {"r": 0, "t": 60})],
        "X-RateLimit-Limit": 2, "X-RateLimit-Remaining": 0, "X-RateLimit-Reset": 60})
    status, headers, body = call()
    assert (status, headers) == (429, {
        "RateLimit-Policy": policy, "RateLimit": [("2-per-60s", {"r": 0, "t": 30})],
        "X-RateLimit-Limit": 2, "X-RateLimit-Remaining": 0, "X-RateLimit-Reset": 30,
        "Retry-After": 30})
    detail = "Too many requests; retry in 30 seconds."
    assert body in ({"type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
                     "title": "Too many requests", "status": 429, "detail": detail,
                     "violated-policies": ["2-per-60s"], "retry_after": 30},)


def test_a_burst_refusal_leaves_the_daily_band_its_own_reset_time(redis, make):
    call = make(redis.url, "2/minute; 1000/day")
    policy = [("2-per-60s", {"q": 2, "w": 60}), ("1000-per-86400s", {"q": 1000, "w": 86400})]
    call()
    call()
    status, headers, body = call()
    # The daily band held the cost and spent nothing: 998 left, full in
    # 2 x 86.4 s, never "full in 0 s" nor the burst's 30 s.
    assert (status, headers) == (429, {
        "RateLimit-Policy": policy,
        "RateLimit": [("2-per-60s", {"r": 0, "t": 30}), ("1000-per-86400s", {"r": 998, "t": 173})],
        "X-RateLimit-Limit": 2, "X-RateLimit-Remaining": 0, "X-RateLimit-Reset": 30,
        "Retry-After": 30})
    assert body["detail"] == "Too many requests (2-per-60s); retry in 30 seconds."
    assert body["violated-policies"] == ["2-per-60s"]


def test_on_error_open_sends_the_policy_and_no_ratelimit_item(own_redis, make):
    call = make(own_redis.url, "2/minute; 1000/day", on_error="open")
    own_redis.kill()
    for _ in range(3):
        assert call() == (200, {"RateLimit-Policy": [
            ("2-per-60s", {"q": 2, "w": 60}), ("1000-per-86400s", {"q": 1000, "w": 86400})]},
            None)


def test_on_error_closed_is_a_503_without_ratelimit_item(own_redis, make):
    call = make(own_redis.url, "2/minute", on_error="closed")
    own_redis.kill()
    status, headers, body = call()
    # The breaker asks Redis again within 125 ms: rounded up, 1 s.
    assert (status, headers) == (503, {"RateLimit-Policy": [("2-per-60s", {"q": 2, "w": 60})],
                                       "Retry-After": 1})
    assert (body["type"], body["title"], body["detail"]) == (
        "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity",
        "Rate limit unavailable", "The rate limit cannot be checked now; retry in 1 second.")


def test_on_error_local_sends_the_local_bucket_s_own_figures(own_redis, make):
    call = make(own_redis.url, "2/minute; 1000/day", on_error="local")
    own_redis.kill()
    policy = [("2-per-60s", {"q": 2, "w": 60}), ("1000-per-86400s", {"q": 1000, "w": 86400})]
    assert call() == (200, {
        "RateLimit-Policy": policy,
        "RateLimit": [("2-per-60s", {"r": 1, "t": 30}), ("1000-per-86400s", {"r": 999, "t": 87})],
        "X-RateLimit-Limit": 2, "X-RateLimit-Remaining": 1, "X-RateLimit-Reset": 30}, None)
    call()
    status, headers, _ = call()
    assert (status, headers["RateLimit"], headers["Retry-After"]) == (
        429, [("2-per-60s", {"r": 0, "t": 30}), ("1000-per-86400s", {"r": 998, "t": 173})], 30)
