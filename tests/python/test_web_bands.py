"""Limit strings and stacked limits in hirate.flask and hirate.asgi, end to
end against a real redis-server (the shared `redis`, emptied per test).

Limit strings ("5/minute", "10/second; 1000/day") are accepted wherever a
limit is: Limit, limit(), default_limits, the ASGI routes and app.config;
a bad one raises the core's ConfigError, naming the wrong part.

The rates are slow (a token a minute and below), so that the few
milliseconds a test takes never refill a whole token: every count and
header is exact.
"""

import json

import pytest
from fastapi import Depends, FastAPI
from flask import Flask
from starlette.testclient import TestClient

import hirate
from hirate import asgi, flask as hflask
from hirate._http import Limit

pytestmark = pytest.mark.timeout(60)

SLOW = dict(connect_timeout=5.0, timeout=5.0)

PER_MINUTE = 5 / 60          # the rate of "5/minute", as the core parses it
PER_DAY = 1000 / 86400


def keys(server):
    return sorted(server.command("KEYS", "*"))


def flask_app(url, **kwargs):
    app = Flask(__name__)
    app.testing = True
    limiter = hflask.RateLimiter(app, url=url, **{**SLOW, **kwargs})
    return app, limiter


# ------------------------------------------------------------ limit strings

@pytest.mark.parametrize("text,capacity,rate,name,window", [
    ("5/minute", 5, PER_MINUTE, "5-per-60s", 60),
    ("100 per hour", 100, 100 / 3600, "100-per-3600s", 3600),
    ("1000/day", 1000, PER_DAY, "1000-per-86400s", 86400),
    ("10/5s", 10, 2.0, "10-per-5s", 5),
    ("100/minute burst 20", 20, 100 / 60, "20-per-12s", 12),
])
def test_a_limit_string_is_the_core_s_capacity_and_rate(text, capacity, rate, name, window):
    lim = Limit(text)
    assert (lim.capacity, lim.rate, lim.name, lim.window) == (capacity, rate, name, window)
    spec, = hirate.parse_limits(text)
    assert (lim.capacity, lim.rate) == (spec.capacity, spec.rate)
    named = Limit(text, name="n", key=str, cost=2, scope="s")
    assert (named.name, named.key, named.cost, named.scope) == ("n", str, 2, "s")


def test_a_bad_limit_string_raises_the_core_s_message():
    with pytest.raises(hirate.ConfigError) as e:
        Limit("5/fortnight")
    assert (e.value.name, str(e.value)) == (
        "EOPTION", "limit '5/fortnight': unknown unit 'fortnight' (second, minute, hour or day)")
    with pytest.raises(hirate.ConfigError) as e:
        Limit("10/second; 1000/day")
    assert (e.value.name, str(e.value)) == (
        "EOPTION", "a Limit is one limit, and '10/second; 1000/day' holds 2: give the string "
        "to limit() or as default_limits, or make one Limit of each")
    with pytest.raises(ValueError, match=r"name= names one limit, and '10/s; 1/d' holds 2"):
        Limit.parse("10/s; 1/d", name="x")


# (where the string goes, how a bad one is reported)
BAD = "limit '1000/dai': unknown unit 'dai' (second, minute, hour or day)"


def test_a_bad_string_in_flask_is_named_where_it_is_written():
    limiter = hflask.RateLimiter()
    with pytest.raises(hirate.ConfigError) as e:
        limiter.limit("10/second; 1000/dai")
    assert str(e.value) == BAD
    with pytest.raises(hirate.ConfigError) as e:
        hflask.RateLimiter(default_limits="10/second; 1000/dai")
    assert str(e.value) == "default_limits: " + BAD
    with pytest.raises(hirate.ConfigError) as e:
        hflask.RateLimiter(default_limits=["10/second", "1000/dai"])
    assert str(e.value) == "default_limits: " + BAD
    app = Flask(__name__)
    app.config["HIRATE_DEFAULT_LIMITS"] = "10/second;1000/dai"
    with pytest.raises(hirate.ConfigError) as e:
        hflask.RateLimiter(app)
    assert str(e.value) == "default_limits: limit '1000/dai': unknown unit 'dai' " \
        "(second, minute, hour or day)"
    with pytest.raises(TypeError, match="a limit string holds its own rate"):
        limiter.limit("5/minute", 1)


def test_a_bad_string_in_asgi_is_named_where_it_is_written():
    with pytest.raises(hirate.ConfigError) as e:
        asgi.RateLimiter(routes={"POST /login": "10/second; 1000/dai"})
    assert str(e.value) == "route 'POST /login': " + BAD
    with pytest.raises(hirate.ConfigError) as e:
        asgi.RateLimiter(default_limits=["1000/dai"])
    assert str(e.value) == "default_limits: " + BAD
    with pytest.raises(hirate.ConfigError) as e:
        asgi.RateLimiter().limit("10/second; 1000/dai")
    assert str(e.value) == BAD
    with pytest.raises(hirate.ConfigError) as e:
        asgi.RateLimiter().limits("5/minute", "1000/dai")
    assert str(e.value) == "a dependency: " + BAD


def test_flask_route_limit_string(redis):
    app, limiter = flask_app(redis.url)

    @app.post("/login")
    @limiter.limit("5/minute")
    def login():
        return "in"

    client = app.test_client()
    seen = [client.post("/login") for _ in range(6)]
    assert [r.status_code for r in seen] == [200] * 5 + [429]
    assert seen[0].headers["RateLimit-Policy"] == '"5-per-60s";q=5;w=60'
    assert seen[0].headers["RateLimit"] == '"5-per-60s";r=4;t=12'
    assert seen[-1].headers["Retry-After"] == "12"
    assert keys(redis) == ["rl:{ip:127.0.0.1}|ep:login|5/%r" % PER_MINUTE]


@pytest.mark.parametrize("setting", ["5/minute", ["5/minute"], Limit("5/minute"),
                                     [[5, PER_MINUTE]]])
def test_flask_default_limits_as_strings(redis, setting):
    app, limiter = flask_app(redis.url, default_limits=setting)

    @app.get("/")
    def index():
        return "ok"

    r = app.test_client().get("/")
    assert (r.status_code, r.headers["RateLimit"]) == (200, '"5-per-60s";r=4;t=12')
    assert keys(redis) == ["rl:{ip:127.0.0.1}|app|5/%r" % PER_MINUTE]


def test_flask_default_limits_from_config_and_environment(redis, monkeypatch):
    app = Flask(__name__)
    app.config.update(HIRATE_URL=redis.url, HIRATE_DEFAULT_LIMITS="5/minute",
                      HIRATE_TIMEOUT=5.0, HIRATE_CONNECT_TIMEOUT=5.0)
    hflask.RateLimiter(app)

    @app.get("/")
    def index():
        return "ok"

    assert app.test_client().get("/").headers["RateLimit"] == '"5-per-60s";r=4;t=12'
    # Flask's own reading of the environment: FLASK_HIRATE_... variables.
    monkeypatch.setenv("FLASK_HIRATE_DEFAULT_LIMITS", "3 per hour")
    monkeypatch.setenv("FLASK_HIRATE_URL", redis.url)
    app2 = Flask(__name__)
    app2.config.from_prefixed_env()
    limiter2 = hflask.RateLimiter(app2, **SLOW)
    assert app2.extensions["hirate"][limiter2].default_limits[0].name == "3-per-3600s"

    @app2.get("/")
    def index2():
        return "ok"

    assert app2.test_client().get("/").headers["RateLimit"] == '"3-per-3600s";r=2;t=1200'


def test_asgi_routes_defaults_and_dependency_as_strings(redis):
    limiter = asgi.RateLimiter(url=redis.url, default_limits="3 per hour",
                               routes={"POST /login": "5/minute"}, **SLOW)
    app = FastAPI()
    app.add_middleware(asgi.RateLimitMiddleware, limiter=limiter)

    @app.post("/login")
    async def login():
        return "in"

    @app.get("/other")
    async def other():
        return "other"

    @app.get("/dep", dependencies=[Depends(limiter.limit("2/minute", name="dep"))])
    async def dep():
        return "dep"

    with TestClient(app) as client:
        r = client.post("/login")
        assert (r.status_code, r.headers["ratelimit-policy"], r.headers["ratelimit"]) == (
            200, '"5-per-60s";q=5;w=60', '"5-per-60s";r=4;t=12')
        r = client.get("/other")
        assert r.headers["ratelimit"] == '"3-per-3600s";r=2;t=1200'
        r = client.get("/dep")
        assert r.headers.get_list("ratelimit") == ['"dep";r=1;t=30', '"3-per-3600s";r=1;t=2400']
    assert keys(redis) == ["rl:{ip:testclient}|app|3/%r" % (3 / 3600),
                           "rl:{ip:testclient}|path:POST /login|5/%r" % PER_MINUTE,
                           "rl:{ip:testclient}|route:GET /dep|2/%r" % (2 / 60)]
