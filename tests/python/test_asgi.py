"""hirate.asgi end to end: FastAPI apps under Starlette's TestClient against a
real redis-server, through hirate.AsyncLimiter (the event loop's own
connections). `redis` is the shared server, emptied per test; `own_redis`
is a test's own, which it kills.

Each TestClient runs as a context manager: one event loop for the whole
test, and the app's lifespan, whose shutdown closes the limiter.
The rates are slow (0.1 token/s and below): every count and header is exact.
"""

import asyncio
import threading

import pytest
from fastapi import Depends, FastAPI, WebSocket
from fastapi.responses import PlainTextResponse
from starlette.testclient import TestClient

import hirate
from hirate.asgi import (Limit, RateLimiter, RateLimitExceeded, RateLimitMiddleware,
                         key_header)

# A hang fails the test instead of stalling the run.
pytestmark = pytest.mark.timeout(60)

SLOW = dict(connect_timeout=5.0, timeout=5.0)


def app_with(limiter, middleware=True):
    app = FastAPI()
    if middleware:
        app.add_middleware(RateLimitMiddleware, limiter=limiter)
    return app


def get(client, path, **kwargs):
    r = client.get(path, **kwargs)
    return r.status_code, r.headers.get("ratelimit"), r.headers.get("retry-after")


def keys(server):
    return sorted(server.command("KEYS", "*"))


# ---------------------------------------------------------------- middleware

def test_middleware_route_limit_counts_down_with_exact_headers(redis):
    limiter = RateLimiter(url=redis.url, routes={"/limited": Limit(3, 0.1)}, **SLOW)
    app = app_with(limiter)

    @app.get("/limited")
    async def limited():
        return {"ok": True}

    with TestClient(app) as client:
        seen = []
        for _ in range(4):
            r = client.get("/limited")
            seen.append((r.status_code, r.headers["ratelimit-policy"], r.headers["ratelimit"],
                         r.headers.get("retry-after")))
        body = client.get("/limited")
    policy = '"3-per-30s";q=3;w=30'
    assert seen == [
        (200, policy, '"3-per-30s";r=2;t=10', None),
        (200, policy, '"3-per-30s";r=1;t=20', None),
        (200, policy, '"3-per-30s";r=0;t=30', None),
        (429, policy, '"3-per-30s";r=0;t=10', "10"),
    ]
    assert body.headers["content-type"] == "application/problem+json"
    assert body.json() == {
        "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "title": "Too many requests",
        "status": 429,
        "detail": "Too many requests; retry in 10 seconds.",
        "violated-policies": ["3-per-30s"],
        "retry_after": 10,
    }
    assert keys(redis) == ["rl:{ip:testclient}|path:/limited|3/0.1"]


def test_patterns_defaults_and_exempt_paths(redis):
    limiter = RateLimiter(
        url=redis.url, default_limits=[(2, 0.1)],
        routes={"POST /login": Limit(1, 0.01, name="login"),
                "GET /api/*": [Limit(3, 0.1, name="api")],
                "/api/health": []},
        exempt=["/docs*"], **SLOW)
    app = app_with(limiter)

    @app.post("/login")
    async def login():
        return "in"

    @app.get("/login")
    async def login_form():
        return "form"

    @app.get("/api/{name}")
    async def api(name: str):
        return name

    @app.get("/other")
    async def other():
        return "other"

    with TestClient(app) as client:
        assert client.post("/login").status_code == 200
        r = client.post("/login")
        assert (r.status_code, r.headers["ratelimit"], r.headers["retry-after"]) == (
            429, '"login";r=0;t=100', "100")
        # GET /login is no POST: the default budget, shared with /other.
        assert get(client, "/login") == (200, '"2-per-20s";r=1;t=10', None)
        assert get(client, "/other") == (200, '"2-per-20s";r=0;t=20', None)
        assert get(client, "/other")[0] == 429
        # /api/* is one bucket for every path under it, HEAD included (a GET
        # route answers HEAD); /api/health is exempt.
        assert get(client, "/api/a") == (200, '"api";r=2;t=10', None)
        assert get(client, "/api/b") == (200, '"api";r=1;t=20', None)
        r = client.head("/api/c")
        assert (r.status_code, r.headers["ratelimit"]) == (405, '"api";r=0;t=30')
        for _ in range(3):
            assert get(client, "/api/health") == (200, None, None)
        assert get(client, "/docs") == (200, None, None)
    assert keys(redis) == ["rl:{ip:testclient}|app|2/0.1",
                           "rl:{ip:testclient}|path:GET /api/*|3/0.1",
                           "rl:{ip:testclient}|path:POST /login|1/0.01"]


def test_text_body_legacy_headers_and_headers_off(redis):
    limiter = RateLimiter(url=redis.url, routes={"/t": Limit(1, 0.05)}, body="text",
                          legacy_headers=True, headers=False, **SLOW)
    app = app_with(limiter)

    @app.get("/t")
    async def t():
        return "t"

    with TestClient(app) as client:
        r = client.get("/t")
        assert "ratelimit" not in r.headers
        assert (r.headers["x-ratelimit-limit"], r.headers["x-ratelimit-remaining"],
                r.headers["x-ratelimit-reset"]) == ("1", "0", "20")
        r = client.get("/t")
        assert (r.status_code, r.headers["content-type"], r.text) == (
            429, "text/plain; charset=utf-8", "Too many requests; retry in 20 seconds.\n")
        assert r.headers["retry-after"] == "20"


def test_async_key_function_and_on_refused(redis):
    async def user(request):
        await asyncio.sleep(0)
        return request.headers.get("x-user")

    async def refused(request, result):
        return PlainTextResponse("wait %ds" % result.retry_after, status_code=429,
                                 headers={"X-Why": ",".join(result.violated)})

    limiter = RateLimiter(url=redis.url, key=user, on_refused=refused,
                          routes={"/x": Limit(1, 0.1, name="x")}, **SLOW)
    app = app_with(limiter)

    @app.get("/x")
    async def x():
        return "x"

    with TestClient(app) as client:
        assert get(client, "/x", headers={"X-User": "ann"})[0] == 200
        r = client.get("/x", headers={"X-User": "ann"})
        assert (r.status_code, r.text, r.headers["x-why"], r.headers["retry-after"],
                r.headers["ratelimit"]) == (429, "wait 10s", "x", "10", '"x";r=0;t=10')
        assert get(client, "/x", headers={"X-User": "bob"})[0] == 200
        assert get(client, "/x")[0] == 200   # no user: by address
    assert keys(redis) == ["rl:{ip:testclient}|path:/x|1/0.1", "rl:{k:ann}|path:/x|1/0.1",
                           "rl:{k:bob}|path:/x|1/0.1"]


def test_client_address_behind_trusted_proxies(redis):
    limiter = RateLimiter(url=redis.url, default_limits=[(1, 0.1)],
                          trusted_proxies=["10.0.0.0/8"], **SLOW)
    app = app_with(limiter)

    @app.get("/")
    async def index():
        return "ok"

    xff = {"X-Forwarded-For": "6.6.6.6, 198.51.100.1"}
    with TestClient(app, client=("10.0.0.2", 4000)) as proxy:
        assert proxy.get("/", headers=xff).status_code == 200
        assert proxy.get("/", headers={"X-Forwarded-For": "198.51.100.1"}).status_code == 429
        assert proxy.get("/", headers={"X-Forwarded-For": "2001:db8::1"}).status_code == 200
    with TestClient(app, client=("203.0.113.9", 4000)) as spoofer:
        assert spoofer.get("/", headers=xff).status_code == 200
        assert spoofer.get("/", headers={"X-Forwarded-For": "5.5.5.5"}).status_code == 429
    assert keys(redis) == ["rl:{ip:198.51.100.1}|app|1/0.1",
                           "rl:{ip:2001:db8::/64}|app|1/0.1",
                           "rl:{ip:203.0.113.9}|app|1/0.1"]


def test_websockets_pass_through(redis):
    limiter = RateLimiter(url=redis.url, default_limits=[(1, 0.1)], **SLOW)
    app = app_with(limiter)

    @app.websocket("/ws")
    async def ws(websocket: WebSocket):
        await websocket.accept()
        await websocket.send_text("hi")
        await websocket.close()

    with TestClient(app) as client:
        for _ in range(3):
            with client.websocket_connect("/ws") as s:
                assert s.receive_text() == "hi"
    assert keys(redis) == []


def test_disabled_and_one_limiter_per_set_of_bands(redis):
    off = RateLimiter(url=redis.url, default_limits=[(1, 0.1)], enabled=False)
    app = app_with(off)

    @app.get("/")
    async def index():
        return "ok"

    with TestClient(app) as client:
        assert [get(client, "/") for _ in range(3)] == [(200, None, None)] * 3

    limiter = RateLimiter(url=redis.url, default_limits=[(5, 0.1)],
                          routes={"/a": [Limit(5, 0.1, scope="s"), Limit(9, 0.1)]}, **SLOW)
    app = app_with(limiter)

    @app.get("/a")
    async def a():
        return "a"

    @app.get("/b")
    async def b():
        return "b"

    with TestClient(app) as client:
        for path in ("/a", "/b", "/a", "/b"):
            assert client.get(path).status_code == 200
        # Other scopes, other decisions: one limiter of one band each.
        assert sorted(limiter._limiters) == [((5, 0.1),), ((9, 0.1),)]
        made = list(limiter._limiters.values())
    # The app's shutdown closed them.
    assert limiter._limiters == {}
    with pytest.raises(hirate.ClosedError):
        asyncio.run(made[0].allow("x"))


# ---------------------------------------------------------------- dependency

def test_dependency_adds_headers_and_refuses_with_an_exception(redis):
    limiter = RateLimiter(url=redis.url, **SLOW)
    app = app_with(limiter, middleware=False)

    @app.get("/items/{item_id}", dependencies=[Depends(limiter.limit(2, 0.1))])
    async def item(item_id: int):
        return {"item": item_id}

    with TestClient(app) as client:
        r = client.get("/items/1")
        assert (r.status_code, r.json(), r.headers["ratelimit-policy"],
                r.headers["ratelimit"]) == (200, {"item": 1}, '"2-per-20s";q=2;w=20',
                                            '"2-per-20s";r=1;t=10')
        # Every item is one route: one bucket.
        assert get(client, "/items/2") == (200, '"2-per-20s";r=0;t=20', None)
        r = client.get("/items/3")
        assert (r.status_code, r.headers["ratelimit"], r.headers["retry-after"]) == (
            429, '"2-per-20s";r=0;t=10', "10")
        # FastAPI's own answer to an HTTPException: the problem as its detail.
        assert r.json() == {"detail": {
            "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
            "title": "Too many requests",
            "status": 429,
            "detail": "Too many requests; retry in 10 seconds.",
            "violated-policies": ["2-per-20s"],
            "retry_after": 10,
        }}
    assert keys(redis) == ["rl:{ip:testclient}|route:GET /items/{item_id}|2/0.1"]


def test_dependency_exception_handler_answers_as_the_middleware(redis):
    limiter = RateLimiter(url=redis.url, **SLOW)
    app = app_with(limiter, middleware=False)
    app.add_exception_handler(RateLimitExceeded, limiter.exception_handler)

    @app.get("/x")
    async def x(result=Depends(limiter.limit(1, 0.1, name="x"))):
        return {"remaining": result.checks[0][1].remaining}

    with TestClient(app) as client:
        assert client.get("/x").json() == {"remaining": 0}
        r = client.get("/x")
        assert (r.status_code, r.headers["content-type"], r.headers["retry-after"],
                r.headers["ratelimit"]) == (429, "application/problem+json", "10",
                                            '"x";r=0;t=10')
        assert r.json()["violated-policies"] == ["x"]


@pytest.mark.parametrize("small_first", [True, False])
def test_dependency_stacked_limits_a_refusal_spends_nothing(redis, small_first):
    limiter = RateLimiter(url=redis.url, **SLOW)
    app = app_with(limiter, middleware=False)
    small, big = Limit(1, 0.1, name="small"), Limit(5, 0.01, name="big", key=key_header("k"))
    order = [small, big] if small_first else [big, small]

    @app.get("/s", dependencies=[Depends(limiter.limits(*order))])
    async def s():
        return "s"

    def line(items):
        return ", ".join(items[lim.name] for lim in order)

    with TestClient(app) as client:
        r = client.get("/s", headers={"k": "K"})
        assert r.status_code == 200
        assert r.headers["ratelimit"] == line({"small": '"small";r=0;t=10',
                                               "big": '"big";r=4;t=100'})
        for _ in range(3):
            r = client.get("/s", headers={"k": "K"})
            assert r.status_code == 429
            # big held the cost, spent nothing: its own time to be full.
            assert r.headers["ratelimit"] == line({"small": '"small";r=0;t=10',
                                                   "big": '"big";r=4;t=100'})
    check = hirate.Limiter(redis.url, capacity=5, rate=0.01, **SLOW)
    assert check.peek(b"{k:K}|route:GET /s|5/0.01").remaining == 4


def test_middleware_and_dependency_send_one_item_each(redis):
    limiter = RateLimiter(url=redis.url, default_limits=[Limit(10, 0.1, name="app")], **SLOW)
    app = app_with(limiter)

    @app.get("/both", dependencies=[Depends(limiter.limit(2, 0.1, name="route"))])
    async def both():
        return "both"

    with TestClient(app) as client:
        r = client.get("/both")
        assert r.headers.get_list("ratelimit") == ['"route";r=1;t=10', '"app";r=9;t=10']
        assert r.headers.get_list("ratelimit-policy") == ['"route";q=2;w=20',
                                                          '"app";q=10;w=100']


# ---------------------------------------------------------- when Redis fails

def policy_client(server, on_error):
    limiter = RateLimiter(url=server.url, on_error=on_error, routes={"/p": Limit(3, 0.1)},
                          **SLOW)
    app = app_with(limiter)

    @app.get("/p")
    async def p():
        return "p"

    return TestClient(app)


def test_on_error_local_decides_from_memory(own_redis):
    with policy_client(own_redis, "local") as client:
        assert get(client, "/p") == (200, '"3-per-30s";r=2;t=10', None)
        own_redis.kill()
        assert get(client, "/p") == (200, '"3-per-30s";r=2;t=10', None)
        assert get(client, "/p") == (200, '"3-per-30s";r=1;t=20', None)
        assert get(client, "/p") == (200, '"3-per-30s";r=0;t=30', None)
        assert get(client, "/p") == (429, '"3-per-30s";r=0;t=10', "10")


def test_on_error_open_allows(own_redis):
    own_redis.kill()
    with policy_client(own_redis, "open") as client:
        for _ in range(5):
            # No bucket behind the policy's figures: no RateLimit item.
            assert get(client, "/p") == (200, None, None)


def test_on_error_closed_answers_503(own_redis):
    own_redis.kill()
    with policy_client(own_redis, "closed") as client:
        r = client.get("/p")
        assert (r.status_code, r.headers.get("ratelimit"), r.headers["retry-after"]) == (
            503, None, "1")
        assert r.json()["type"] == (
            "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity")


def test_a_hung_redis_does_not_block_the_event_loop(own_redis):
    # While one request waits for a SIGSTOPped Redis, the same event loop
    # serves others; no timing is assumed, only the order of events.
    waiting = threading.Event()

    def key(request):
        if request.headers.get("x-mark"):
            waiting.set()   # the marked request is about to ask Redis
        return None

    limiter = RateLimiter(url=own_redis.url, key=key, routes={"/limited": Limit(5, 0.1)},
                          exempt=["/health"], connect_timeout=10.0, timeout=10.0)
    app = app_with(limiter)

    @app.get("/limited")
    async def limited():
        return "limited"

    @app.get("/health")
    async def health():
        return "up"

    with TestClient(app) as client:
        assert client.get("/limited").status_code == 200   # a pooled connection
        own_redis.stop()
        try:
            got = []
            t = threading.Thread(
                target=lambda: got.append(client.get("/limited", headers={"X-Mark": "1"})))
            t.start()
            assert waiting.wait(30)
            for _ in range(20):
                assert client.get("/health").status_code == 200
                assert t.is_alive(), "the hung call ended before the others were served"
        finally:
            own_redis.cont()
        t.join(30)
    # Redis answered once it went on: the waiting request was decided there.
    assert (got[0].status_code, got[0].headers["ratelimit"]) == (200, '"5-per-50s";r=3;t=20')


# ------------------------------------------------------------- bad setups

@pytest.mark.parametrize("kwargs,error,message", [
    (dict(routes={"login": Limit(1, 1)}), ValueError, "the path must start with '/'"),
    (dict(routes={"FETCH /x": Limit(1, 1)}), ValueError, "'FETCH' is not an HTTP method"),
    (dict(routes={"/a*b": Limit(1, 1)}), ValueError, "'*' may only end the path"),
    (dict(routes={"/x": 10}), TypeError, "limits for route '/x' must be a Limit, a limit "
     "string, a (capacity, rate) pair or a list of them, got 10"),
    (dict(routes={"/x": []}, exempt=["/x"]), ValueError, "name the same paths"),
    (dict(body="html"), ValueError, "body must be 'json' or 'text', got 'html'"),
    (dict(on_error="maybe"), hirate.ConfigError, "on_error"),
    (dict(url="localhost:6379"), hirate.ConfigError, ""),
])
def test_bad_settings_are_named(kwargs, error, message):
    with pytest.raises(error) as e:
        RateLimiter(**kwargs)
    assert message in str(e.value)


def test_the_password_is_never_shown():
    limiter = RateLimiter(url="redis://app:canary-0xdeadbeef@127.0.0.1:1/2")
    assert limiter.url == "redis://app:***@127.0.0.1:1/2"
    assert repr(limiter) == "<hirate.asgi.RateLimiter url='redis://app:***@127.0.0.1:1/2' " \
        "on_error='local'>"
    assert "canary-0xdeadbeef" not in repr(vars(limiter))


def test_middleware_takes_a_limiter_or_its_arguments():
    with pytest.raises(TypeError, match="not both"):
        RateLimitMiddleware(None, limiter=RateLimiter(), default_limits=[(1, 1)])
    assert RateLimitMiddleware(None, default_limits=[(1, 1)]).limiter.default_limits[0].name \
        == "1-per-1s"
    with pytest.raises(ValueError, match="needs at least one limit"):
        RateLimiter().limits()
