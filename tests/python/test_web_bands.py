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
import re

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
    # Two limits of one identity: one bucket of two bands.
    monkeypatch.setenv("FLASK_HIRATE_DEFAULT_LIMITS", "100/hour;10/second")
    monkeypatch.setenv("FLASK_HIRATE_URL", redis.url)
    app2 = Flask(__name__)
    app2.config.from_prefixed_env()
    limiter2 = hflask.RateLimiter(app2, prefix="env:", **SLOW)
    assert [lim.name for lim in app2.extensions["hirate"][limiter2].default_limits] == [
        "100-per-3600s", "10-per-1s"]

    @app2.get("/")
    def index2():
        return "ok"

    r = app2.test_client().get("/")
    assert (r.headers["RateLimit-Policy"], r.headers["RateLimit"]) == (
        '"100-per-3600s";q=100;w=3600, "10-per-1s";q=10;w=1',
        '"100-per-3600s";r=99;t=36, "10-per-1s";r=9;t=1')
    assert [k for k in keys(redis) if k.startswith("env:")] == [
        "env:{ip:127.0.0.1}|app|100/%r+10/10.0" % (100 / 3600)]


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


# ------------------------------------------------------------ stacked limits
#
# Two limits on one identity and scope are the two bands of one key: one
# script call (FCALL, the server being Redis 7) decides both, all or
# nothing. Two ways to be refused: BURST_FIRST runs out of its burst (2 a
# minute) with the daily quota (3) to spare; DAILY_FIRST out of its daily
# quota (2) with the burst (3 a minute) to spare.

BURST_FIRST = ("2/minute", "3/day")
DAILY_FIRST = ("3/minute", "2/day")

SF_ITEM = re.compile(r'"((?:[^"\\]|\\["\\])*)"((?:;[a-z*][a-z0-9_.*-]*=(?:0|[1-9][0-9]{0,14}))*)')


def sf_list(value):
    """A Structured Field List of strings with integer parameters (RFC 9651),
    parsed strictly: [(string, {param: int})]. Anything else fails."""
    items, pos = [], 0
    while True:
        m = SF_ITEM.match(value, pos)
        assert m, "not a Structured Field item at %d: %r" % (pos, value)
        params = {}
        for part in m.group(2).split(";")[1:]:
            name, _, number = part.partition("=")
            assert name not in params, "parameter %r twice in %r" % (name, value)
            params[name] = int(number)
        items.append((re.sub(r'\\(["\\])', r"\1", m.group(1)), params))
        pos = m.end()
        if pos == len(value):
            return items
        sep = re.compile(r"[ \t]*,[ \t]*").match(value, pos)
        assert sep and sep.end() < len(value), "bad separator at %d: %r" % (pos, value)
        pos = sep.end()


def script_calls(server):
    stats = server.command("INFO", "commandstats")
    calls = dict(re.findall(r"^cmdstat_([\w|]+):calls=(\d+)", stats, re.M))
    return {name: int(calls.get(name, 0)) for name in ("fcall", "evalsha", "eval")}


def warm(server):
    # The first FCALL on a server without hirate's library is answered
    # "no such function" and sent again after FUNCTION LOAD: load it first,
    # so that every request below is counted alone.
    lim = hirate.Limiter(server.url, capacity=1, rate=1.0, prefix="warm:", **SLOW)
    lim.allow("up")
    lim.close()
    server.command("DEL", "warm:up")
    return script_calls(server)


def script_calls_of(server, requests):
    """Runs each (request, calls) (a callable, and the script calls it must
    make, all of them FCALL); returns the responses."""
    out = []
    before = warm(server)
    for request, calls in requests:
        out.append(request())
        after = script_calls(server)
        assert {k: after[k] - before[k] for k in after} == {"fcall": calls, "evalsha": 0,
                                                            "eval": 0}
        before = after
    return out


def four_requests(first, second):
    """Two allowed requests and a refused one through `first`, a fresh
    process of the app (`second`: its own hirate Limiters, so no deny cache
    foretells the refusal) and then `first` again: one script call for each
    of the first three, both bands decided in it; none for the fourth, whose
    refusal `first`'s deny cache foretells from the state its second
    request left."""
    return [(first, 1), (first, 1), (second, 1), (first, 0)]


def band_state(server, key, limits):
    """What each band of a key holds, read by a limiter of the same bands."""
    lim = hirate.Limiter(server.url, limits="; ".join(limits), **SLOW)
    try:
        return [b.remaining for b in lim.peek(key).bands]
    finally:
        lim.close()


def both_bands(policy, ratelimit):
    """The two RateLimit fields, parsed: {name: (q, w, r, t or None)}."""
    policies, states = sf_list(policy), sf_list(ratelimit)
    assert [n for n, _ in policies] == [n for n, _ in states]
    assert all(set(p) == {"q", "w"} for _, p in policies)
    return {n: (p["q"], p["w"], s["r"], s.get("t"))
            for (n, p), (_, s) in zip(policies, states)}


# What each of three requests is told: (status, {band: (q, w, r, t)},
# Retry-After, violated).
EXPECTED = {
    BURST_FIRST: [
        (200, {"2-per-60s": (2, 60, 1, 30), "3-per-86400s": (3, 86400, 2, 28800)}, None, None),
        (200, {"2-per-60s": (2, 60, 0, 60), "3-per-86400s": (3, 86400, 1, 57600)}, None, None),
        # The burst refuses; the daily band held the cost, spent nothing,
        # and says its own remaining and time to be full.
        (429, {"2-per-60s": (2, 60, 0, 30), "3-per-86400s": (3, 86400, 1, 57600)}, "30",
         ["2-per-60s"]),
    ],
    DAILY_FIRST: [
        (200, {"3-per-60s": (3, 60, 2, 20), "2-per-86400s": (2, 86400, 1, 43200)}, None, None),
        (200, {"3-per-60s": (3, 60, 1, 40), "2-per-86400s": (2, 86400, 0, 86400)}, None, None),
        (429, {"3-per-60s": (3, 60, 1, 40), "2-per-86400s": (2, 86400, 0, 43200)}, "43200",
         ["2-per-86400s"]),
    ],
}
# What the key holds after them: the refusal spent nothing in either band.
LEFT = {BURST_FIRST: [0, 1], DAILY_FIRST: [1, 0]}


def head(limits):
    return "+".join("%d/%r" % (s.capacity, s.rate)
                    for text in limits for s in hirate.parse_limits(text))


def check_responses(seen, limits, header):
    # The fourth request is told what the third was.
    expected = EXPECTED[limits] + EXPECTED[limits][-1:]
    assert len(seen) == len(expected)
    for (status, bands, retry_after, violated), r in zip(expected, seen):
        assert r.status_code == status
        assert both_bands(header(r, "RateLimit-Policy"), header(r, "RateLimit")) == bands
        assert header(r, "Retry-After") == retry_after
        if violated is not None:
            problem = json.loads(r.content if hasattr(r, "content") else r.data)
            assert problem["violated-policies"] == violated
            assert problem["status"] == 429
            assert problem["retry_after"] == int(retry_after)


@pytest.mark.parametrize("limits", [BURST_FIRST, DAILY_FIRST], ids=["burst", "daily"])
@pytest.mark.parametrize("written", ["decorators", "string"])
def test_flask_stacked_limits_are_one_decision(redis, limits, written):
    def make():
        app, limiter = flask_app(redis.url)

        def view():
            return "ok"

        if written == "decorators":
            view = limiter.limit(limits[0])(limiter.limit(limits[1])(view))
        else:
            view = limiter.limit("; ".join(limits))(view)
        app.add_url_rule("/s", "s", view)
        return app, limiter

    (app, limiter), (other, _) = make(), make()
    client, other_client = app.test_client(), other.test_client()
    seen = script_calls_of(redis, four_requests(lambda: client.get("/s"),
                                                lambda: other_client.get("/s")))
    check_responses(seen, limits, lambda r, name: r.headers.get(name))
    key = "{ip:127.0.0.1}|ep:s|" + head(limits)
    assert keys(redis) == ["rl:" + key]
    assert band_state(redis, key, limits) == LEFT[limits]
    state = app.extensions["hirate"][limiter]
    assert [lim.bands for lim in state.limiters.values()] == [tuple(
        hirate.Band(s.capacity, s.rate, "%d-per-%ds" % (s.capacity, s.window))
        for text in limits for s in hirate.parse_limits(text))]


@pytest.mark.parametrize("limits", [BURST_FIRST, DAILY_FIRST], ids=["burst", "daily"])
@pytest.mark.parametrize("where", ["middleware", "dependency"])
def test_asgi_stacked_limits_are_one_decision(redis, limits, where):
    def make():
        routes = {"GET /s": "; ".join(limits)} if where == "middleware" else {}
        limiter = asgi.RateLimiter(url=redis.url, routes=routes, **SLOW)
        app = FastAPI()
        app.add_middleware(asgi.RateLimitMiddleware, limiter=limiter)
        app.add_exception_handler(asgi.RateLimitExceeded, limiter.exception_handler)
        deps = [Depends(limiter.limits(*limits))] if where == "dependency" else []

        @app.get("/s", dependencies=deps)
        async def s():
            return "ok"

        return app

    with TestClient(make()) as client, TestClient(make()) as other:
        seen = script_calls_of(redis, four_requests(lambda: client.get("/s"),
                                                    lambda: other.get("/s")))
    check_responses(seen, limits, lambda r, name: r.headers.get(name))
    scope = "path:GET /s" if where == "middleware" else "route:GET /s"
    key = "{ip:testclient}|%s|%s" % (scope, head(limits))
    assert keys(redis) == ["rl:" + key]
    assert band_state(redis, key, limits) == LEFT[limits]


def test_limits_of_one_api_key_written_apart_are_one_decision(redis):
    app, limiter = flask_app(redis.url)

    @app.get("/search")
    @limiter.limit("2/minute", key=hflask.key_header("X-API-Key"), name="burst")
    @limiter.limit("3/day", key=hflask.key_header("X-API-Key"), name="daily")
    def search():
        return "ok"

    client = app.test_client()
    seen = script_calls_of(redis, [(lambda: client.get("/search", headers={"X-API-Key": "k1"}),
                                    1)])
    assert both_bands(seen[0].headers["RateLimit-Policy"], seen[0].headers["RateLimit"]) == {
        "burst": (2, 60, 1, 30), "daily": (3, 86400, 2, 28800)}
    assert keys(redis) == ["rl:{k:k1}|ep:search|" + head(BURST_FIRST)]


def test_limits_on_different_identities_peek_then_allow(redis):
    # Per address and per API key: two keys, so no one script call can
    # decide both. The first is peeked, the second allowed, then the first
    # allowed: three calls for an allowed request, and a refusal by either
    # spends nothing in the other.
    app, limiter = flask_app(redis.url)

    @app.get("/x")
    @limiter.limit("2/minute", name="per-address")
    @limiter.limit("1/day", key=hflask.key_header("X-API-Key"), name="per-key")
    def x():
        return "ok"

    client = app.test_client()
    before = warm(redis)
    r = client.get("/x", headers={"X-API-Key": "k1"})
    assert r.status_code == 200
    assert script_calls(redis)["fcall"] - before["fcall"] == 3
    r = client.get("/x", headers={"X-API-Key": "k1"})
    assert (r.status_code, r.headers["RateLimit"]) == (
        429, '"per-address";r=1;t=30, "per-key";r=0;t=86400')
    assert json.loads(r.data)["violated-policies"] == ["per-key"]
    assert keys(redis) == ["rl:{ip:127.0.0.1}|ep:x|2/%r" % (2 / 60),
                           "rl:{k:k1}|ep:x|1/%r" % (1 / 86400)]


def test_a_scope_of_your_own_groups_one_declaration_only(redis):
    # A limit string given a scope is one bucket of its bands wherever it
    # is written; a limit of that scope declared on its own keeps a bucket
    # of its own, shared by every route that declares it.
    app, limiter = flask_app(redis.url)
    api = dict(scope="api", key=hflask.key_header("X-API-Key"))

    @app.get("/a")
    @limiter.limit("2/minute; 3/day", **api)
    def a():
        return "a"

    @app.get("/b")
    @limiter.limit("2/minute; 3/day", **api)
    @limiter.limit("1/hour", **api)
    def b():
        return "b"

    @app.get("/c")
    @limiter.limit("1/hour", **api)
    def c():
        return "c"

    client = app.test_client()
    k = {"X-API-Key": "k"}
    assert client.get("/a", headers=k).headers["RateLimit"] == \
        '"2-per-60s";r=1;t=30, "3-per-86400s";r=2;t=28800'
    r = client.get("/b", headers=k)
    assert (r.status_code, r.headers["RateLimit"]) == (
        200, '"2-per-60s";r=0;t=60, "3-per-86400s";r=1;t=57600, "1-per-3600s";r=0;t=3600')
    r = client.get("/c", headers=k)
    assert (r.status_code, r.headers["RateLimit"]) == (429, '"1-per-3600s";r=0;t=3600')
    assert keys(redis) == ["rl:{k:k}|api|1/%r" % (1 / 3600),
                           "rl:{k:k}|api|" + head(BURST_FIRST)]


def test_a_cost_above_one_band_never_passes_and_spends_nothing(redis):
    app, limiter = flask_app(redis.url)

    @app.post("/bulk")
    @limiter.limit("10/minute; 3/day", cost=5)
    def bulk():
        return "ok"

    client = app.test_client()
    r = client.post("/bulk")
    assert r.status_code == 429
    assert "Retry-After" not in r.headers
    # The daily band can never hold 5: no t; the burst could, and is full.
    assert both_bands(r.headers["RateLimit-Policy"], r.headers["RateLimit"]) == {
        "10-per-60s": (10, 60, 10, 0), "3-per-86400s": (3, 86400, 3, None)}
    assert json.loads(r.data)["violated-policies"] == ["3-per-86400s"]
    key = "{ip:127.0.0.1}|ep:bulk|" + head(("10/minute", "3/day"))
    assert band_state(redis, key, ("10/minute", "3/day")) == [10, 3]


@pytest.mark.parametrize("on_error", ["local", "closed"])
def test_stacked_limits_while_redis_is_down(own_redis, on_error):
    app, limiter = flask_app(own_redis.url, on_error=on_error)

    @app.get("/s")
    @limiter.limit("2/minute; 3/day")
    def s():
        return "ok"

    client = app.test_client()
    assert client.get("/s").headers["RateLimit"] == \
        '"2-per-60s";r=1;t=30, "3-per-86400s";r=2;t=28800'
    own_redis.kill()
    r = client.get("/s")
    if on_error == "local":
        # This process' own buckets, of both bands, decide: full ones.
        assert (r.status_code, r.headers["RateLimit"]) == (
            200, '"2-per-60s";r=1;t=30, "3-per-86400s";r=2;t=28800')
        return
    # Refused by every band: the limits could not be checked. The breaker
    # tries Redis again within 125 ms: rounded up, 1 s.
    # No bucket behind the figures: no RateLimit item.
    assert (r.status_code, r.headers.get("RateLimit"), r.headers["Retry-After"]) == (
        503, None, "1")
    assert json.loads(r.data)["violated-policies"] == ["2-per-60s", "3-per-86400s"]


def test_the_core_judges_the_bands_of_stacked_limits_where_they_are_written():
    # Seventeen limits on one identity would be a limiter of 17 bands.
    many = "; ".join("%d/minute" % n for n in range(1, 17))
    limiter = hflask.RateLimiter()
    with pytest.raises(hirate.ConfigError) as e:
        limiter.limit(many)(limiter.limit("99/day")(lambda: "x"))
    assert str(e.value) == "view '<lambda>': bands must be 1 to 16 bands, got 17"
    # Limits of other identities are other limiters.
    limiter.limit(many)(limiter.limit("99/day", key=hflask.key_header("K"))(lambda: "y"))
    with pytest.raises(hirate.ConfigError) as e:
        asgi.RateLimiter(routes={"/x": [many, "99/day"]})
    assert str(e.value) == "route '/x': bands must be 1 to 16 bands, got 17"
