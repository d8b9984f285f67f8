"""Client management in hirate.flask and hirate.asgi, against a real
redis-server: one client's buckets reset and inspected by route or limit
(never by key name), deduct_when (only failed logins charged, counted
exactly), limits of some HTTP methods, and the limiter settings (deny_cache,
max_keys, pool_size) from Flask's config and from the environment for ASGI.
"""

import pytest
from fastapi import FastAPI, HTTPException
from flask import Flask, abort, request
from starlette.testclient import TestClient

from hirate import asgi
from hirate import flask as hflask

pytestmark = pytest.mark.timeout(60)


def keys(server):
    return sorted(server.command("KEYS", "*"))


def script_calls(server):
    info = server.command("INFO", "commandstats")
    if isinstance(info, bytes):
        info = info.decode()
    total = 0
    for line in info.splitlines():
        if line.startswith(("cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:")):
            total += int(line.split("calls=")[1].split(",")[0])
    return total


# ----------------------------------------------------------------- Flask

def flask_app(server, **settings):
    app = Flask(__name__)
    app.config.update(HIRATE_URL=server.url, **settings)
    limiter = hflask.RateLimiter(app, key=hflask.key_header("X-User"))

    @app.post("/login")
    @limiter.limit("3/hour", deduct_when=lambda r: r.status_code >= 400)
    def login():
        if request.args.get("pw") != "ok":
            abort(401)
        return "welcome"

    @app.route("/post", methods=["GET", "POST"])
    @limiter.limit("1/hour", methods="POST")
    def post():
        return "ok"

    @app.get("/search")
    @limiter.limit("2/hour")
    def search():
        return "found"

    return app, limiter


def test_flask_reset_and_peek_one_client_by_route(redis):
    app, limiter = flask_app(redis)
    c = app.test_client()
    alice, bob = {"X-User": "alice"}, {"X-User": "bob"}
    assert [c.get("/search", headers=alice).status_code for _ in range(3)] == [200, 200, 429]
    assert c.get("/search", headers=bob).status_code == 200
    with app.app_context():
        # By endpoint name or by view function: the client's own figures.
        seen = limiter.peek("search", key="alice")
        assert [(lim.name, d.remaining) for lim, d in seen.checks] == [("2-per-3600s", 0)]
        assert limiter.peek(app.view_functions["search"], key="bob").checks[0][1].remaining == 1
        limiter.reset("search", key="alice")
        assert limiter.peek("search", key="alice").checks[0][1].remaining == 2
        assert limiter.peek("search", key="bob").checks[0][1].remaining == 1
    # Reset outside an app context, with app=.
    assert [c.get("/search", headers=alice).status_code for _ in range(3)] == [200, 200, 429]
    limiter.reset("search", key="alice", app=app)
    assert c.get("/search", headers=alice).status_code == 200


def test_flask_reset_by_address_and_a_scope_of_its_own(redis):
    app = Flask(__name__)
    limiter = hflask.RateLimiter(app, url=redis.url)
    @app.get("/a")
    @limiter.limit("1/hour", scope="api")
    def a():
        return "a"

    c = app.test_client()
    assert [c.get("/a").status_code for _ in range(2)] == [200, 429]
    with app.app_context():
        # The limit itself names its bucket: the same numbers and scope.
        limiter.reset(hflask.Limit("1/hour", scope="api"), address="127.0.0.1")
    assert c.get("/a").status_code == 200
    with app.app_context():
        with pytest.raises(TypeError) as e:
            limiter.reset("a")
        assert str(e.value) == ("give key= (what the limit's key function returns for the "
                                "client) or address= (the client's address): one of them")
        with pytest.raises(ValueError) as e:
            limiter.reset("nope", key="x")
        assert str(e.value) == "no endpoint 'nope' in the app"


def test_flask_charges_only_failed_logins_exactly(redis):
    app, limiter = flask_app(redis)
    c = app.test_client()
    user = {"X-User": "mallory"}
    seen = []
    for pw in ["ok", "bad", "ok", "ok", "bad", "bad", "bad", "ok"]:
        r = c.post("/login?pw=" + pw, headers=user)
        seen.append((r.status_code, r.headers["RateLimit"]))
    # Three failures spend the three tokens; then every request is refused
    # at the check, before the view, whatever the password. The headers of
    # a charged response say what is left after the charge.
    assert [s for s, _ in seen] == [200, 401, 200, 200, 401, 401, 429, 429]
    assert [h.split(";r=")[1].split(";")[0] for _, h in seen] == [
        "3", "2", "2", "2", "1", "0", "0", "0"]
    with app.app_context():
        assert limiter.peek("login", key="mallory").checks[0][1].remaining == 0
        limiter.reset("login", key="mallory")
    assert c.post("/login?pw=ok", headers=user).status_code == 200


def test_flask_a_limit_of_post_only(redis):
    app, _ = flask_app(redis)
    c = app.test_client()
    user = {"X-User": "p"}
    assert [c.get("/post", headers=user).status_code for _ in range(3)] == [200, 200, 200]
    assert "RateLimit" not in c.get("/post", headers=user).headers
    assert [c.post("/post", headers=user).status_code for _ in range(2)] == [200, 429]
    assert keys(redis) == ["rl:{k:p}|ep:post|1/0.0002777777777777778@POST"]


def test_flask_limiter_settings_from_config(redis):
    app, limiter = flask_app(redis, HIRATE_DENY_CACHE=False, HIRATE_MAX_KEYS=10,
                             HIRATE_POOL_SIZE=2)
    c = app.test_client()
    state = app.extensions["hirate"][limiter]
    assert (state.options["deny_cache"], state.options["max_keys"],
            state.options["pool_size"]) == (False, 10, 2)
    assert [c.get("/search", headers={"X-User": "d"}).status_code
            for _ in range(2)] == [200, 200]
    before = script_calls(redis)
    # No deny cache: every refusal is a script call.
    assert [c.get("/search", headers={"X-User": "d"}).status_code
            for _ in range(3)] == [429, 429, 429]
    assert script_calls(redis) - before == 3


# ------------------------------------------------------------------ ASGI

def asgi_client(limiter):
    app = FastAPI()
    app.add_middleware(asgi.RateLimitMiddleware, limiter=limiter)

    @app.post("/login")
    async def login(pw: str = ""):
        if pw != "ok":
            raise HTTPException(401)
        return "welcome"

    @app.api_route("/post", methods=["GET", "POST"])
    async def post():
        return "ok"

    @app.get("/search")
    async def search():
        return "found"

    return TestClient(app)


def asgi_limiter(server, **env):
    environ = {"HIRATE_URL": server.url, **env}
    return asgi.RateLimiter.from_env(
        environ, key=asgi.key_header("X-User"),
        routes={"POST /login": asgi.Limit("3/hour", deduct_when=lambda r: r.status_code >= 400),
                "/post": asgi.Limit("1/hour", methods=["post"]),
                "/search": "2/hour"})


def test_asgi_reset_and_peek_one_client_by_route(redis):
    limiter = asgi_limiter(redis)
    with asgi_client(limiter) as c:
        alice = {"X-User": "alice"}
        assert [c.get("/search", headers=alice).status_code for _ in range(3)] == [200, 200, 429]
        seen = c.portal.call(lambda: limiter.peek("/search", key="alice"))
        assert [(lim.name, d.remaining) for lim, d in seen.checks] == [("2-per-3600s", 0)]
        c.portal.call(lambda: limiter.reset("/search", key="alice"))
        assert c.portal.call(lambda: limiter.peek("/search", key="alice")).checks[0][1] \
            .remaining == 2
        assert c.get("/search", headers=alice).status_code == 200


def test_asgi_charges_only_failed_logins_exactly(redis):
    limiter = asgi_limiter(redis)
    with asgi_client(limiter) as c:
        user = {"X-User": "mallory"}
        seen = []
        for pw in ["ok", "bad", "ok", "ok", "bad", "bad", "bad", "ok"]:
            r = c.post("/login?pw=" + pw, headers=user)
            seen.append((r.status_code, r.headers["ratelimit"]))
        assert [s for s, _ in seen] == [200, 401, 200, 200, 401, 401, 429, 429]
        assert [h.split(";r=")[1].split(";")[0] for _, h in seen] == [
            "3", "2", "2", "2", "1", "0", "0", "0"]
        assert c.portal.call(lambda: limiter.peek("POST /login", key="mallory")) \
            .checks[0][1].remaining == 0


def test_asgi_a_limit_of_post_only(redis):
    with asgi_client(asgi_limiter(redis)) as c:
        user = {"X-User": "p"}
        assert [c.get("/post", headers=user).status_code for _ in range(3)] == [200, 200, 200]
        assert [c.post("/post", headers=user).status_code for _ in range(2)] == [200, 429]
    assert keys(redis) == ["rl:{k:p}|path:/post|1/0.0002777777777777778@POST"]


def test_asgi_settings_from_the_environment(redis):
    limiter = asgi_limiter(redis, HIRATE_DENY_CACHE="false", HIRATE_MAX_KEYS="10",
                           HIRATE_POOL_SIZE="2", HIRATE_ON_ERROR="closed",
                           HIRATE_PREFIX="env:", HIRATE_EXEMPT="/health, /metrics*",
                           HIRATE_LEGACY_HEADERS="true")
    assert (limiter._options["deny_cache"], limiter._options["max_keys"],
            limiter._options["pool_size"], limiter._options["on_error"],
            limiter.legacy_headers) == (False, 10, 2, "closed", True)
    with asgi_client(limiter) as c:
        assert [c.get("/search", headers={"X-User": "e"}).status_code
                for _ in range(2)] == [200, 200]
        before = script_calls(redis)
        assert [c.get("/search", headers={"X-User": "e"}).status_code
                for _ in range(3)] == [429, 429, 429]
        assert script_calls(redis) - before == 3
    assert keys(redis) == ["env:{k:e}|path:/search|2/0.0005555555555555556"]
    # REDIS_URL when HIRATE_URL is unset; a setting given in code wins.
    other = asgi.RateLimiter.from_env({"REDIS_URL": redis.url, "HIRATE_TIMEOUT": "0.5"},
                                      timeout=0.2)
    assert (other.url, other._options["timeout"]) == (redis.url, 0.2)
    assert asgi.RateLimiter.from_env({}).url is None


def test_a_dependency_cannot_deduct_when():
    limiter = asgi.RateLimiter()
    with pytest.raises(ValueError) as e:
        limiter.limits(asgi.Limit("1/hour", deduct_when=lambda r: True))
    assert str(e.value) == ("deduct_when needs the response, which a dependency does not "
                            "see: give the limit to the middleware (routes=)")


def test_asgi_reset_through_a_dependency_with_a_scope_and_the_default_limits(redis):
    from fastapi import Depends

    limiter = asgi.RateLimiter(url=redis.url, default_limits="1/hour",
                               key=asgi.key_header("X-User"))
    quota = limiter.limit("1/hour", scope="quota")
    app = FastAPI()
    app.add_middleware(asgi.RateLimitMiddleware, limiter=limiter)
    app.add_exception_handler(asgi.RateLimitExceeded, limiter.exception_handler)

    @app.get("/q", dependencies=[Depends(quota)])
    async def q():
        return "q"

    with TestClient(app) as c:
        u = {"X-User": "u"}
        # The default limit (the middleware) and the dependency's each allow one.
        assert [c.get("/q", headers=u).status_code for _ in range(2)] == [200, 429]
        c.portal.call(lambda: limiter.reset(None, key="u"))
        # The default budget is back; the dependency's is still spent (and
        # the middleware spent the default one again before it refused).
        assert c.get("/q", headers=u).status_code == 429
        assert c.portal.call(lambda: limiter.peek(quota, key="u")).checks[0][1].remaining == 0
        assert c.portal.call(lambda: limiter.peek(None, key="u")).checks[0][1].remaining == 0
        c.portal.call(lambda: limiter.reset(quota, key="u"))
        c.portal.call(lambda: limiter.reset(None, key="u"))
        assert c.get("/q", headers=u).status_code == 200
        with pytest.raises(ValueError) as e:
            c.portal.call(lambda: limiter.reset(limiter.limit("1/hour"), key="u"))
        assert str(e.value) == ("a limit without a scope has a bucket per route: give it a "
                                "scope=, or name its routes pattern")
