"""hirate.flask end to end: Flask's test client against a real redis-server
(the shared `redis`, emptied per test, or `own_redis` when a test kills it).

The rates are slow (0.1 token/s and below), so that the few milliseconds a
test takes never refill a whole token: every count and header is exact.
"""

import json

import pytest
from flask import Blueprint, Flask

import hirate
from hirate.flask import Limit, RateLimiter, current_result, key_header

# A hang fails the test instead of stalling the run.
pytestmark = pytest.mark.timeout(60)

# Generous I/O timeouts: a loaded CI machine must not turn a decision into a
# fallback. The on_error tests kill Redis, which refuses at once.
SLOW = dict(connect_timeout=5.0, timeout=5.0)


def make_app(url, **kwargs):
    app = Flask(__name__)
    app.testing = True
    limiter = RateLimiter(app, url=url, **{**SLOW, **kwargs})
    return app, limiter


def get(client, path, **kwargs):
    r = client.get(path, **kwargs)
    return r.status_code, r.headers.get("RateLimit"), r.headers.get("Retry-After")


def keys(server):
    return sorted(server.command("KEYS", "*"))


# ------------------------------------------------------------------ counting

def test_a_route_limit_counts_down_with_exact_headers(redis):
    app, limiter = make_app(redis.url)

    @app.get("/limited")
    @limiter.limit(3, 0.1)
    def limited():
        return "ok"

    client = app.test_client()
    seen = []
    for _ in range(4):
        r = client.get("/limited")
        seen.append((r.status_code, r.headers["RateLimit-Policy"], r.headers["RateLimit"],
                     r.headers.get("Retry-After")))
    policy = '"3-per-30s";q=3;w=30'
    assert seen == [
        (200, policy, '"3-per-30s";r=2;t=10', None),
        (200, policy, '"3-per-30s";r=1;t=20', None),
        (200, policy, '"3-per-30s";r=0;t=30', None),
        (429, policy, '"3-per-30s";r=0;t=10', "10"),
    ]
    assert keys(redis) == ["rl:{ip:127.0.0.1}|ep:limited|3/0.1"]
    assert 0 < redis.command("TTL", "rl:{ip:127.0.0.1}|ep:limited|3/0.1") <= 30


def test_the_429_body_is_problem_json_with_the_retry_time(redis):
    app, limiter = make_app(redis.url)

    @app.get("/once")
    @limiter.limit(1, 0.01, name="once")
    def once():
        return "ok"

    client = app.test_client()
    assert client.get("/once").status_code == 200
    r = client.get("/once")
    assert r.status_code == 429
    assert r.mimetype == "application/problem+json"
    assert r.headers["Retry-After"] == "100"
    assert json.loads(r.data) == {
        "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "title": "Too many requests",
        "status": 429,
        "detail": "Too many requests; retry in 100 seconds.",
        "violated-policies": ["once"],
        "retry_after": 100,
    }


def test_a_text_body_and_legacy_headers(redis):
    app, limiter = make_app(redis.url, body="text", legacy_headers=True)

    @app.get("/t")
    @limiter.limit(1, 0.05)
    def t():
        return "ok"

    client = app.test_client()
    r = client.get("/t")
    assert (r.headers["X-RateLimit-Limit"], r.headers["X-RateLimit-Remaining"],
            r.headers["X-RateLimit-Reset"]) == ("1", "0", "20")
    r = client.get("/t")
    assert r.status_code == 429
    assert r.mimetype == "text/plain"
    assert r.data == b"Too many requests; retry in 20 seconds.\n"
    assert (r.headers["X-RateLimit-Remaining"], r.headers["X-RateLimit-Reset"],
            r.headers["Retry-After"]) == ("0", "20", "20")


def test_headers_can_be_turned_off(redis):
    app, limiter = make_app(redis.url, headers=False)

    @app.get("/q")
    @limiter.limit(1, 0.05)
    def q():
        return "ok"

    client = app.test_client()
    r = client.get("/q")
    assert "RateLimit" not in r.headers and "RateLimit-Policy" not in r.headers
    r = client.get("/q")
    assert (r.status_code, r.headers["Retry-After"]) == (429, "20")


def test_cost_per_request_and_a_cost_that_can_never_pass(redis):
    app, limiter = make_app(redis.url)

    @app.get("/bulk")
    @limiter.limit(10, 0.1, cost=lambda request: int(request.args.get("n", "1")))
    def bulk():
        return "ok"

    client = app.test_client()
    assert get(client, "/bulk?n=4") == (200, '"10-per-100s";r=6;t=40', None)
    assert get(client, "/bulk?n=0") == (200, '"10-per-100s";r=6;t=40', None)
    r = client.get("/bulk?n=11")
    assert (r.status_code, r.headers["RateLimit"], r.headers.get("Retry-After")) == (
        429, '"10-per-100s";r=6', None)
    assert json.loads(r.data)["retry_after"] is None
    assert get(client, "/bulk?n=6")[:2] == (200, '"10-per-100s";r=0;t=100')


def test_current_result_is_the_requests_decisions(redis):
    app, limiter = make_app(redis.url)

    @app.get("/me")
    @limiter.limit(4, 0.1)
    def me():
        result = current_result()
        return {"remaining": result.checks[0][1].remaining, "source": result.checks[0][1].source}

    @app.get("/free")
    def free():
        return {"result": current_result() is None}

    client = app.test_client()
    assert client.get("/me").json == {"remaining": 3, "source": "redis"}
    assert client.get("/free").json == {"result": True}


# ------------------------------------------------- defaults, exempt, blueprints

def test_default_limits_are_one_budget_for_routes_without_limits(redis):
    app, limiter = make_app(redis.url, default_limits=[Limit(2, 0.1)])

    @app.get("/a")
    def a():
        return "a"

    @app.get("/b")
    def b():
        return "b"

    @app.get("/health")
    @limiter.exempt
    def health():
        return "up"

    @app.get("/own")
    @limiter.limit(5, 0.1)
    def own():
        return "own"

    client = app.test_client()
    assert get(client, "/a") == (200, '"2-per-20s";r=1;t=10', None)
    assert get(client, "/b") == (200, '"2-per-20s";r=0;t=20', None)
    assert get(client, "/a") == (429, '"2-per-20s";r=0;t=10', "10")
    # An exempt route: never limited, no headers.
    for _ in range(3):
        r = client.get("/health")
        assert (r.status_code, r.headers.get("RateLimit")) == (200, None)
    # A route with a limit of its own does not spend the default budget.
    assert get(client, "/own") == (200, '"5-per-50s";r=4;t=10', None)
    # A path that is no route is not limited.
    assert client.get("/nowhere").status_code == 404
    assert keys(redis) == ["rl:{ip:127.0.0.1}|app|2/0.1", "rl:{ip:127.0.0.1}|ep:own|5/0.1"]


def test_default_limits_from_app_config(redis):
    app = Flask(__name__)
    app.config.update(HIRATE_URL=redis.url, HIRATE_DEFAULT_LIMITS=[[1, 0.1]],
                      HIRATE_TIMEOUT=5.0, HIRATE_CONNECT_TIMEOUT=5.0)
    RateLimiter(app)

    @app.get("/")
    def index():
        return "ok"

    client = app.test_client()
    assert get(client, "/") == (200, '"1-per-10s";r=0;t=10', None)
    assert get(client, "/")[0] == 429
    assert keys(redis) == ["rl:{ip:127.0.0.1}|app|1/0.1"]


def test_redis_url_from_config_and_the_constructor_wins(redis, own_redis):
    app = Flask(__name__)
    app.config.update(REDIS_URL=redis.url, HIRATE_PREFIX="web:")
    limiter = RateLimiter(app, **SLOW)

    @app.get("/")
    @limiter.limit(2, 0.1)
    def index():
        return "ok"

    app.test_client().get("/")
    assert keys(redis) == ["web:{ip:127.0.0.1}|ep:index|2/0.1"]

    app2 = Flask(__name__)
    app2.config.update(REDIS_URL=redis.url, HIRATE_URL=redis.url)
    limiter2 = RateLimiter(url=own_redis.url, **SLOW)
    limiter2.init_app(app2)  # the app-factory way

    @app2.get("/")
    @limiter2.limit(2, 0.1)
    def index2():
        return "ok"

    app2.test_client().get("/")
    assert keys(own_redis) == ["rl:{ip:127.0.0.1}|ep:index2|2/0.1"]


def test_blueprint_limits_and_exempt_blueprints(redis):
    app, limiter = make_app(redis.url, default_limits=[(1, 0.1)])
    api = Blueprint("api", __name__, url_prefix="/api")
    internal = Blueprint("internal", __name__, url_prefix="/internal")

    @api.get("/x")
    def x():
        return "x"

    @api.get("/y")
    def y():
        return "y"

    @internal.get("/z")
    def z():
        return "z"

    v2 = Blueprint("v2", __name__, url_prefix="/v2")

    @v2.get("/w")
    def w():
        return "w"

    limiter.limit(2, 0.1)(api)
    limiter.limit(1, 0.05, name="v2")(v2)
    limiter.exempt(internal)
    api.register_blueprint(v2)
    app.register_blueprint(api)
    app.register_blueprint(internal)
    client = app.test_client()
    # The blueprint's routes share its bucket.
    assert get(client, "/api/x") == (200, '"2-per-20s";r=1;t=10', None)
    assert get(client, "/api/y") == (200, '"2-per-20s";r=0;t=20', None)
    assert get(client, "/api/x")[0] == 429
    assert [client.get("/internal/z").status_code for _ in range(3)] == [200, 200, 200]
    # A nested blueprint's routes pass its limits and its parent's.
    r = client.get("/api/v2/w")
    assert (r.status_code, r.headers["RateLimit"]) == (
        429, '"v2";r=1;t=0, "2-per-20s";r=0;t=10')
    assert keys(redis) == ["rl:{ip:127.0.0.1}|bp:api|2/0.1"]


def test_disabled(redis):
    app, limiter = make_app(redis.url, enabled=False)

    @app.get("/")
    @limiter.limit(1, 0.1)
    def index():
        return "ok"

    client = app.test_client()
    assert [get(client, "/") for _ in range(3)] == [(200, None, None)] * 3
    assert keys(redis) == []


# ------------------------------------------------------------------ stacking

@pytest.mark.parametrize("small_first", [True, False])
def test_stacked_limits_all_must_pass_and_a_refusal_spends_nothing(redis, small_first):
    app, limiter = make_app(redis.url)
    small = limiter.limit(1, 0.1, name="small")
    big = limiter.limit(5, 0.01, name="big")

    def view():
        return "ok"

    view = (small(big(view)) if small_first else big(small(view)))
    app.add_url_rule("/s", "s", view)
    client = app.test_client()
    r = client.get("/s")
    items = {"small": '"small";r=0;t=10', "big": '"big";r=4;t=100'}
    order = ["small", "big"] if small_first else ["big", "small"]
    assert r.status_code == 200
    assert r.headers["RateLimit"] == ", ".join(items[n] for n in order)
    assert r.headers["RateLimit-Policy"] == ", ".join(
        {"small": '"small";q=1;w=10', "big": '"big";q=5;w=500'}[n] for n in order)
    for _ in range(3):
        r = client.get("/s")
        # big held the cost and spent nothing: its own figures, 4 left and
        # 100 s until it is full.
        assert r.status_code == 429
        assert r.headers["RateLimit"] == ", ".join(items[n] for n in order)
        assert r.headers["Retry-After"] == "10"
        assert json.loads(r.data)["violated-policies"] == ["small"]
    # One identity, one scope: one key holds both bands, in the order
    # written, and the refusals spent nothing in the big one.
    heads = {"small": (1, 0.1, "small"), "big": (5, 0.01, "big")}
    bands = [heads[n] for n in order]
    key = "{ip:127.0.0.1}|ep:s|" + "+".join("%d/%r" % b[:2] for b in bands)
    assert keys(redis) == ["rl:" + key]
    check = hirate.Limiter(redis.url, limits=bands, **SLOW)
    assert [b.remaining for b in check.peek(key).bands] == [
        {"small": 0, "big": 4}[n] for n in order]


def test_one_hirate_limiter_per_set_of_bands(redis):
    app, limiter = make_app(redis.url)

    @app.get("/a")
    @limiter.limit(5, 0.1, name="a1")
    @limiter.limit(5, 0.1, scope="shared", name="a2")
    @limiter.limit(9, 0.1, name="a3")
    def a():
        return "a"

    @app.get("/b")
    @limiter.limit(5, 0.1)
    def b():
        return "b"

    client = app.test_client()
    for path in ("/a", "/b", "/a", "/b"):
        assert client.get(path).status_code == 200
    state = app.extensions["hirate"][limiter]
    # a1 and a3 are one identity in one scope: one limiter of two bands;
    # a2 (a scope of its own) and /b's limit share the limiter of (5, 0.1).
    assert sorted(state.limiters) == [((5, 0.1),), ((5, 0.1, "a1"), (9, 0.1, "a3"))]
    assert keys(redis) == ["rl:{ip:127.0.0.1}|ep:a|5/0.1+9/0.1",
                           "rl:{ip:127.0.0.1}|ep:b|5/0.1",
                           "rl:{ip:127.0.0.1}|shared|5/0.1"]


def test_routes_and_limits_never_share_buckets(redis):
    app, limiter = make_app(redis.url)

    @app.get("/a")
    @limiter.limit(1, 0.1)
    def a():
        return "a"

    @app.get("/b")
    @limiter.limit(1, 0.1)
    def b():
        return "b"

    @app.get("/c")
    @limiter.limit(1, 0.05)
    def c():
        return "c"

    @app.get("/d1")
    @limiter.limit(2, 0.1, scope="together")
    def d1():
        return "d1"

    @app.get("/d2")
    @limiter.limit(2, 0.1, scope="together")
    def d2():
        return "d2"

    client = app.test_client()
    assert [client.get(p).status_code for p in ("/a", "/b", "/c")] == [200, 200, 200]
    assert [client.get(p).status_code for p in ("/a", "/b", "/c")] == [429, 429, 429]
    # A named scope is one bucket for every route that names it.
    assert [client.get(p).status_code for p in ("/d1", "/d2", "/d1")] == [200, 200, 429]
    assert keys(redis) == [
        "rl:{ip:127.0.0.1}|ep:a|1/0.1",
        "rl:{ip:127.0.0.1}|ep:b|1/0.1",
        "rl:{ip:127.0.0.1}|ep:c|1/0.05",
        "rl:{ip:127.0.0.1}|together|2/0.1",
    ]


# ---------------------------------------------------------------------- keys

def test_key_header_gives_each_api_key_a_bucket(redis):
    app, limiter = make_app(redis.url)

    @app.get("/api")
    @limiter.limit(1, 0.1, key=key_header("X-API-Key"))
    def api():
        return "ok"

    client = app.test_client()
    assert get(client, "/api", headers={"X-API-Key": "alpha"})[0] == 200
    assert get(client, "/api", headers={"X-API-Key": "alpha"})[0] == 429
    assert get(client, "/api", headers={"X-API-Key": "beta"})[0] == 200
    # Without the header: the client's address, a bucket of its own.
    assert get(client, "/api")[0] == 200
    assert get(client, "/api")[0] == 429
    assert keys(redis) == [
        "rl:{ip:127.0.0.1}|ep:api|1/0.1",
        "rl:{k:alpha}|ep:api|1/0.1",
        "rl:{k:beta}|ep:api|1/0.1",
    ]


def test_a_callable_key_for_the_logged_in_user(redis):
    users = {"t-1": 42, "t-2": 7}

    def user(request):
        return users.get(request.headers.get("Authorization", "").removeprefix("Bearer "))

    app, limiter = make_app(redis.url, key=user)

    @app.get("/me")
    @limiter.limit(1, 0.1)
    def me():
        return "me"

    client = app.test_client()
    assert get(client, "/me", headers={"Authorization": "Bearer t-1"})[0] == 200
    assert get(client, "/me", headers={"Authorization": "Bearer t-1"})[0] == 429
    assert get(client, "/me", headers={"Authorization": "Bearer t-2"})[0] == 200
    assert get(client, "/me")[0] == 200  # anonymous: by address
    assert keys(redis) == ["rl:{ip:127.0.0.1}|ep:me|1/0.1", "rl:{k:42}|ep:me|1/0.1",
                           "rl:{k:7}|ep:me|1/0.1"]


def test_a_long_key_is_hashed(redis):
    app, limiter = make_app(redis.url)

    @app.get("/api")
    @limiter.limit(1, 0.1, key=key_header("X-API-Key"))
    def api():
        return "ok"

    client = app.test_client()
    assert get(client, "/api", headers={"X-API-Key": "k" * 600})[0] == 200
    assert get(client, "/api", headers={"X-API-Key": "k" * 600})[0] == 429
    assert get(client, "/api", headers={"X-API-Key": "k" * 601})[0] == 200
    found = keys(redis)
    assert len(found) == 2
    head, tail = "rl:{#", "}|ep:api|1/0.1"
    assert all(k.startswith(head) and k.endswith(tail) and len(k) == len(head + tail) + 64
               for k in found)


def test_exempt_when(redis):
    app, limiter = make_app(redis.url)

    @app.get("/x")
    @limiter.limit(1, 0.1, exempt_when=lambda request: request.headers.get("X-Admin") == "1")
    def x():
        return "x"

    client = app.test_client()
    assert get(client, "/x")[0] == 200
    assert get(client, "/x")[0] == 429
    assert get(client, "/x", headers={"X-Admin": "1"}) == (200, None, None)


# -------------------------------------------------------------- client address

def test_forwarded_for_is_believed_only_from_trusted_proxies(redis):
    app, limiter = make_app(redis.url, trusted_proxies="10.0.0.0/8, ::1")

    @app.get("/")
    @limiter.limit(1, 0.1)
    def index():
        return "ok"

    client = app.test_client()
    via_proxy = {"REMOTE_ADDR": "10.0.0.2"}
    spoofer = {"REMOTE_ADDR": "203.0.113.9"}
    xff = {"X-Forwarded-For": "6.6.6.6, 198.51.100.1"}
    assert client.get("/", headers=xff, environ_base=via_proxy).status_code == 200
    assert client.get("/", headers=xff, environ_base=via_proxy).status_code == 429
    # The spoofer's own header is ignored: it is limited by its own address.
    assert client.get("/", headers=xff, environ_base=spoofer).status_code == 200
    assert client.get("/", headers={"X-Forwarded-For": "1.2.3.4"},
                      environ_base=spoofer).status_code == 429
    # IPv6 clients by /64.
    v6 = {"X-Forwarded-For": "2001:db8:1:2::1"}
    assert client.get("/", headers=v6, environ_base={"REMOTE_ADDR": "::1"}).status_code == 200
    v6 = {"X-Forwarded-For": "2001:db8:1:2::2"}
    assert client.get("/", headers=v6, environ_base={"REMOTE_ADDR": "::1"}).status_code == 429
    assert keys(redis) == ["rl:{ip:198.51.100.1}|ep:index|1/0.1",
                           "rl:{ip:2001:db8:1:2::/64}|ep:index|1/0.1",
                           "rl:{ip:203.0.113.9}|ep:index|1/0.1"]
    with app.test_request_context("/", headers=xff, environ_base=via_proxy):
        assert limiter.client_ip() == "198.51.100.1"


def test_proxy_hops(redis):
    app, limiter = make_app(redis.url, proxy_hops=1)

    @app.get("/")
    @limiter.limit(1, 0.1)
    def index():
        return "ok"

    client = app.test_client()
    xff = {"X-Forwarded-For": "6.6.6.6, 198.51.100.1"}
    assert client.get("/", headers=xff).status_code == 200
    xff = {"X-Forwarded-For": "7.7.7.7, 198.51.100.1"}   # a new spoofed left part
    assert client.get("/", headers=xff).status_code == 429
    assert keys(redis) == ["rl:{ip:198.51.100.1}|ep:index|1/0.1"]


def test_two_limiters_on_one_app_each_add_their_items(redis):
    app, outer = make_app(redis.url, prefix="outer:", default_limits=[Limit(9, 0.1, name="o")])
    inner = RateLimiter(app, url=redis.url, prefix="inner:", **SLOW)

    @app.get("/x")
    @inner.limit(2, 0.1, name="i")
    def x():
        return "x"

    r = app.test_client().get("/x")
    assert r.headers.getlist("RateLimit") == ['"i";r=1;t=10', '"o";r=8;t=10']
    assert keys(redis) == ["inner:{ip:127.0.0.1}|ep:x|2/0.1", "outer:{ip:127.0.0.1}|app|9/0.1"]


# ---------------------------------------------------------- custom refusals

def test_on_refused_makes_the_response_and_headers_are_added(redis):
    def refused(request, result):
        return {"error": "slow down", "wait": result.retry_after,
                "path": request.path}, 429, {"Retry-After": "999"}

    app, limiter = make_app(redis.url, on_refused=refused)

    @app.get("/x")
    @limiter.limit(1, 0.1)
    def x():
        return "x"

    client = app.test_client()
    client.get("/x")
    r = client.get("/x")
    assert r.status_code == 429
    assert r.json == {"error": "slow down", "wait": 10, "path": "/x"}
    assert r.headers["RateLimit"] == '"1-per-10s";r=0;t=10'
    assert r.headers["Retry-After"] == "999"  # the hook's own header wins


# ---------------------------------------------------------- when Redis fails

def policy_app(server, on_error):
    app, limiter = make_app(server.url, on_error=on_error)

    @app.get("/p")
    @limiter.limit(3, 0.1)
    def p():
        return "p"

    return app


def test_on_error_local_decides_from_memory(own_redis):
    client = policy_app(own_redis, "local").test_client()
    assert get(client, "/p") == (200, '"3-per-30s";r=2;t=10', None)
    own_redis.kill()
    # This process' own bucket, full, decides while Redis is down.
    assert get(client, "/p") == (200, '"3-per-30s";r=2;t=10', None)
    assert get(client, "/p") == (200, '"3-per-30s";r=1;t=20', None)
    assert get(client, "/p") == (200, '"3-per-30s";r=0;t=30', None)
    assert get(client, "/p") == (429, '"3-per-30s";r=0;t=10', "10")


def test_on_error_open_allows(own_redis):
    client = policy_app(own_redis, "open").test_client()
    own_redis.kill()
    for _ in range(5):
        # No bucket behind the policy's figures: no RateLimit item.
        assert get(client, "/p") == (200, None, None)


def test_on_error_closed_answers_503(own_redis):
    client = policy_app(own_redis, "closed").test_client()
    own_redis.kill()
    r = client.get("/p")
    # The breaker tries Redis again within 125 ms: rounded up, 1 s.
    assert (r.status_code, r.headers.get("RateLimit"), r.headers["Retry-After"]) == (
        503, None, "1")
    assert json.loads(r.data) == {
        "type": "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity",
        "title": "Rate limit unavailable",
        "status": 503,
        "detail": "The rate limit cannot be checked now; retry in 1 second.",
        "violated-policies": ["3-per-30s"],
        "retry_after": 1,
    }


def test_a_wrong_password_is_an_error_not_a_policy_decision():
    from redis_server import RedisServer
    server = RedisServer(["--requirepass", "right-pass"])
    try:
        url = "redis://:canary-0xdeadbeef@127.0.0.1:%d" % server.port
        app, limiter = make_app(url, on_error="open")

        @app.get("/")
        @limiter.limit(1, 0.1)
        def index():
            return "ok"

        with pytest.raises(hirate.AuthError) as e:
            app.test_client().get("/")
        state = app.extensions["hirate"][limiter]
        shown = str(e.value) + repr(state) + repr(state.limiters) + repr(vars(state))
        assert "canary-0xdeadbeef" not in shown
        assert repr(state) == ("<hirate.flask app state url='redis://:***@127.0.0.1:%d' "
                               "on_error='open'>" % server.port)
    finally:
        server.close()


# ------------------------------------------------------------- bad setups

def test_bad_settings_fail_at_init_app():
    with pytest.raises(hirate.ConfigError, match="on_error"):
        RateLimiter(Flask(__name__), on_error="sometimes")
    with pytest.raises(hirate.ConfigError):
        RateLimiter(Flask(__name__), url="http://127.0.0.1:6379")
    with pytest.raises(ValueError, match="body must be 'json' or 'text', got 'xml'"):
        RateLimiter(Flask(__name__), body="xml")
    with pytest.raises(ValueError, match='trusted_proxies: "proxy" is not an address'):
        RateLimiter(Flask(__name__), trusted_proxies=["proxy"])
    with pytest.raises(TypeError, match="a limit must be a hirate Limit, a limit string"):
        RateLimiter(default_limits=[10])


def test_exempt_and_limited_at_once_is_refused():
    limiter = RateLimiter()

    def view():
        return "x"

    limiter.limit(1, 1)(view)
    with pytest.raises(ValueError, match="view 'view' has limits: it cannot be exempt too"):
        limiter.exempt(view)

    def other():
        return "y"

    limiter.exempt(other)
    with pytest.raises(ValueError, match="view 'other' is exempt: it cannot have limits too"):
        limiter.limit(1, 1)(other)


def test_a_limiter_not_set_up_on_the_app_says_so():
    limiter = RateLimiter()
    app = Flask(__name__)
    with app.app_context():
        with pytest.raises(RuntimeError, match="call init_app"):
            limiter.close()
