"""hirate.django end to end: Django's test Client (sync requests, on
hirate.Limiter) and AsyncClient (async requests, on hirate.AsyncLimiter)
against a real redis-server (the shared `redis`, emptied per test, or
`own_redis` when a test kills it), the settings given per test with
override_settings. Every response's rate-limit headers are parsed by a
Structured Fields parser (http_sf).

The rates are slow (0.1 token/s and below), so that the few milliseconds a
test takes never refill a whole token: every count and header is exact.
"""

import asyncio
import json

import django
import pytest
from django.conf import settings

if not settings.configured:
    settings.configure(
        SECRET_KEY="hirate-tests", ALLOWED_HOSTS=["testserver"], ROOT_URLCONF=__name__,
        MIDDLEWARE=["hirate.django.RateLimitMiddleware"], USE_TZ=True,
        # Generous I/O timeouts: a loaded CI machine must not turn a decision
        # into a fallback. The on_error tests kill Redis, which refuses at once.
        HIRATE_CONNECT_TIMEOUT=5.0, HIRATE_TIMEOUT=5.0)
    django.setup()

from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.http import HttpResponse, JsonResponse  # noqa: E402
import django.test  # noqa: E402
import http_sf  # noqa: E402
from django.test import override_settings  # noqa: E402
from django.urls import include, path  # noqa: E402
from django.utils.decorators import method_decorator  # noqa: E402
from django.views import View  # noqa: E402

import hirate  # noqa: E402
import hirate.django as hd  # noqa: E402
from hirate.django import exempt, get_result, key_header, limit  # noqa: E402

# A hang fails the test instead of stalling the run.
pytestmark = pytest.mark.timeout(60)


# ------------------------------------------------------------------ the views

@limit(3, 0.1)
def limited(request):
    return HttpResponse("ok")


@limit(3, 0.1)
async def alimited(request):
    return HttpResponse("ok")


@limit(1, 0.01, name="once")
def once(request):
    return HttpResponse("ok")


@limit(10, 1, key=key_header("X-API-Key"), name="burst")
@limit(1000, 1000 / 86400, key=key_header("X-API-Key"), name="daily")
def search(request):
    return JsonResponse({"results": []})


@limit("2/minute; 3/day")
def export(request):
    return JsonResponse({"export": "started"})


@limit(2, 0.01, name="per-ip")
@limit(5, 0.01, key=key_header("X-API-Key"), name="per-key")
async def mixed(request):
    return HttpResponse("ok")


@limit(5, 0.01, cost=lambda request: int(request.GET.get("n", "1")))
def costly(request):
    return HttpResponse("ok")


@limit(1, 0.01, exempt_when=lambda request: request.headers.get("X-Internal") == "yes")
def internal(request):
    return HttpResponse("ok")


@limit(2, 0.01)
def result_view(request):
    result = get_result(request)
    return JsonResponse({"allowed": result.allowed,
                         "remaining": [d.remaining for _, d in result.checks]})


@limit(2, 0.01, methods="POST", name="posts")
def posted(request):
    return HttpResponse("ok")


@limit(3, 0.01, name="failed-logins", deduct_when=lambda response: response.status_code == 401)
def login(request):
    ok = request.POST.get("password") == "right"
    return HttpResponse("welcome" if ok else "no", status=200 if ok else 401)


@limit(3, 0.01, name="failed-logins", deduct_when=lambda response: response.status_code == 401)
async def alogin(request):
    ok = request.POST.get("password") == "right"
    return HttpResponse("welcome" if ok else "no", status=200 if ok else 401)


def index(request):
    return HttpResponse("index")


async def aindex(request):
    return HttpResponse("aindex")


@exempt
def health(request):
    return HttpResponse("healthy")


class Report(View):
    @method_decorator(limit(2, 0.01, name="report"))
    def dispatch(self, request, *args, **kwargs):
        return super().dispatch(request, *args, **kwargs)

    def get(self, request):
        return HttpResponse("report")


class Plain(View):
    def get(self, request):
        return HttpResponse("plain")


def user_key(request):
    return request.headers.get("X-User")


def custom_refusal(request, result):
    r = HttpResponse("slow down, %s" % ",".join(result.violated), status=result.status)
    r["Retry-After"] = "999"
    return r


api = ([path("a", index), path("b", aindex), path("own", once)], "api")
internal_ns = ([path("status", index)], "internal")

urlpatterns = [
    path("limited", limited), path("alimited", alimited), path("once", once),
    path("search", search), path("export", export), path("mixed", mixed),
    path("costly", costly), path("internal", internal), path("result", result_view),
    path("", index), path("aindex", aindex), path("health", health),
    path("report", Report.as_view()), path("plain", limit(1, 0.01)(Plain.as_view())),
    path("api/", include(api)), path("internal/", include(internal_ns)),
    path("posted", posted), path("login", login), path("alogin", alogin),
]

VIEW = "rl:{ip:127.0.0.1}|view:test_django."


# --------------------------------------------------------------- helpers

def check_fields(response):
    """Every rate-limit header of a response parses as the Structured Field
    it must be (http_sf raises on anything else): the two lists of named
    items with integer parameters, the others integers; RateLimit names only
    limits that RateLimit-Policy has."""
    lists = {}
    for name, params in (("RateLimit-Policy", {"q", "w"}), ("RateLimit", {"r", "t"})):
        value = response.get(name)
        if value is None:
            continue
        items = http_sf.parse(value.encode("ascii"), tltype="list")
        for item, got in items:
            assert isinstance(item, str) and set(got) <= params, (name, value)
            assert all(type(v) is int and v >= 0 for v in got.values()), (name, value)
        lists[name] = [item for item, _ in items]
    if "RateLimit" in lists:
        assert set(lists["RateLimit"]) <= set(lists.get("RateLimit-Policy", ())), lists
    for name in ("Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining",
                 "X-RateLimit-Reset"):
        value = response.get(name)
        if value is not None:
            item, params = http_sf.parse(value.encode("ascii"), tltype="item")
            assert type(item) is int and item >= 0 and params == {}, (name, value)
    return response


class Client(django.test.Client):
    """Django's test client, every response's headers checked."""

    def request(self, **request):
        return check_fields(super().request(**request))


class AsyncClient(django.test.AsyncClient):
    async def request(self, **request):
        return check_fields(await super().request(**request))


def get(client, url, **extra):
    r = client.get(url, **extra)
    return r.status_code, r.headers.get("RateLimit"), r.headers.get("Retry-After")


def arun(*requests):
    """Runs each (method, path, extra) on one AsyncClient, on one event loop;
    [(status, RateLimit, Retry-After)]."""
    async def main():
        client = AsyncClient()
        out = []
        for method, url, extra in requests:
            r = await getattr(client, method)(url, **extra)
            out.append((r.status_code, r.headers.get("RateLimit"), r.headers.get("Retry-After")))
        return out
    return asyncio.run(main())


def keys(server):
    return sorted(server.command("KEYS", "*"))


def made():
    """The classes of the limiters the middleware made, by their bands."""
    return sorted((cls.__name__, bands) for cls, bands in hd._state.limiters)


@pytest.fixture
def at(redis):
    """Settings on the shared server; more with at(**settings)."""
    stack = []

    def apply(**more):
        o = override_settings(**{"HIRATE_URL": redis.url, **more})
        o.enable()
        stack.append(o)

    apply()
    yield apply
    while stack:
        stack.pop().disable()


# --------------------------------------------------------------- counting

def test_a_sync_view_counts_down_with_exact_headers_on_a_limiter(at, redis):
    client = Client()
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
    assert keys(redis) == [VIEW + "limited|3/0.1"]
    assert made() == [("Limiter", ((3, 0.1),))]


def test_an_async_view_counts_down_on_an_async_limiter(at, redis):
    assert arun(*[("get", "/alimited", {})] * 4) == [
        (200, '"3-per-30s";r=2;t=10', None),
        (200, '"3-per-30s";r=1;t=20', None),
        (200, '"3-per-30s";r=0;t=30', None),
        (429, '"3-per-30s";r=0;t=10', "10"),
    ]
    assert keys(redis) == [VIEW + "alimited|3/0.1"]
    assert made() == [("AsyncLimiter", ((3, 0.1),))]


def test_sync_and_async_requests_spend_one_bucket_in_redis(at, redis):
    client = Client()
    assert get(client, "/limited") == (200, '"3-per-30s";r=2;t=10', None)
    # The same sync view, served by the async handler (ASGI).
    assert arun(("get", "/limited", {})) == [(200, '"3-per-30s";r=1;t=20', None)]
    assert get(client, "/limited") == (200, '"3-per-30s";r=0;t=30', None)
    assert arun(("get", "/limited", {})) == [(429, '"3-per-30s";r=0;t=10', "10")]
    assert made() == [("AsyncLimiter", ((3, 0.1),)), ("Limiter", ((3, 0.1),))]


def test_without_a_url_sync_and_async_requests_share_the_process_memory(at):
    at(HIRATE_URL=None)
    client = Client()
    assert get(client, "/alimited") == (200, '"3-per-30s";r=2;t=10', None)
    assert arun(("get", "/alimited", {}), ("get", "/alimited", {})) == [
        (200, '"3-per-30s";r=1;t=20', None), (200, '"3-per-30s";r=0;t=30', None)]
    assert get(client, "/alimited")[0] == 429
    assert made() == [("Limiter", ((3, 0.1),))]
    assert hd.stats().decisions["local"] >= 4


def test_the_429_body_is_problem_json_with_the_retry_time(at):
    client = Client()
    assert client.get("/once").status_code == 200
    r = client.get("/once")
    assert r.status_code == 429
    assert r["Content-Type"] == "application/problem+json"
    assert r["Retry-After"] == "100"
    assert json.loads(r.content) == {
        "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "title": "Too many requests",
        "status": 429,
        "detail": "Too many requests; retry in 100 seconds.",
        "violated-policies": ["once"],
        "retry_after": 100,
    }


def test_a_text_body_and_legacy_headers(at):
    at(HIRATE_BODY="text", HIRATE_LEGACY_HEADERS=True)
    client = Client()
    r = client.get("/once")
    assert (r["X-RateLimit-Limit"], r["X-RateLimit-Remaining"], r["X-RateLimit-Reset"]) == (
        "1", "0", "100")
    r = client.get("/once")
    assert (r.status_code, r["Content-Type"], r.content) == (
        429, "text/plain; charset=utf-8", b"Too many requests; retry in 100 seconds.\n")
    assert (r["X-RateLimit-Remaining"], r["X-RateLimit-Reset"], r["Retry-After"]) == (
        "0", "100", "100")


def test_headers_can_be_turned_off(at):
    at(HIRATE_HEADERS=False)
    client = Client()
    r = client.get("/once")
    assert (r.status_code, r.get("RateLimit"), r.get("RateLimit-Policy")) == (200, None, None)
    r = client.get("/once")
    assert (r.status_code, r.get("RateLimit"), r["Retry-After"]) == (429, None, "100")


def test_cost_per_request_and_a_cost_that_can_never_pass(at):
    client = Client()
    assert get(client, "/costly?n=3") == (200, '"5-per-500s";r=2;t=300', None)
    assert get(client, "/costly?n=3") == (429, '"5-per-500s";r=2;t=100', "100")
    r = client.get("/costly?n=6")
    assert (r.status_code, r["RateLimit"], r.get("Retry-After")) == (
        429, '"5-per-500s";r=2', None)
    assert json.loads(r.content)["detail"] == (
        "Too many requests; this request exceeds the limit and can never pass.")


def test_get_result_gives_the_view_its_requests_decisions(at):
    client = Client()
    assert json.loads(client.get("/result").content) == {"allowed": True, "remaining": [1]}
    assert json.loads(client.get("/result").content) == {"allowed": True, "remaining": [0]}
    assert client.get("/result").status_code == 429


# ------------------------------------------------------- default limits

def test_default_limits_are_one_budget_for_views_without_limits(at, redis):
    at(HIRATE_DEFAULT_LIMITS="3/30s")
    client = Client()
    assert get(client, "/") == (200, '"3-per-30s";r=2;t=10', None)
    assert arun(("get", "/aindex", {})) == [(200, '"3-per-30s";r=1;t=20', None)]
    assert get(client, "/aindex") == (200, '"3-per-30s";r=0;t=30', None)
    assert get(client, "/") == (429, '"3-per-30s";r=0;t=10', "10")
    # Exempt views and views with limits of their own do not spend it.
    assert get(client, "/health") == (200, None, None)
    assert get(client, "/limited") == (200, '"3-per-30s";r=2;t=10', None)
    assert keys(redis) == ["rl:{ip:127.0.0.1}|app|3/0.1", VIEW + "limited|3/0.1"]


def test_default_limits_as_a_list_of_limits_and_pairs(at):
    at(HIRATE_DEFAULT_LIMITS=[hd.Limit(2, 0.01, name="default"), (100, 1)])
    r = Client().get("/")
    assert r["RateLimit-Policy"] == '"default";q=2;w=200, "100-per-100s";q=100;w=100'
    assert r["RateLimit"] == '"default";r=1;t=100, "100-per-100s";r=99;t=1'


def test_namespace_limits_and_exempt_namespaces(at, redis):
    at(HIRATE_DEFAULT_LIMITS="100/100s", HIRATE_NAMESPACE_LIMITS={"api": "2/200s"},
       HIRATE_EXEMPT_NAMESPACES=["internal"])
    client = Client()
    # One budget for every view of the namespace, sync or async.
    assert get(client, "/api/a") == (200, '"2-per-200s";r=1;t=100', None)
    assert get(client, "/api/b") == (200, '"2-per-200s";r=0;t=200', None)
    assert get(client, "/api/a") == (429, '"2-per-200s";r=0;t=100', "100")
    # A view with limits of its own in it passes both.
    r = client.get("/api/own")
    assert (r.status_code, r["RateLimit"]) == (429, '"once";r=1;t=0, "2-per-200s";r=0;t=100')
    assert get(client, "/internal/status") == (200, None, None)
    assert get(client, "/") == (200, '"100-per-100s";r=99;t=1', None)
    assert keys(redis) == ["rl:{ip:127.0.0.1}|app|100/1.0",
                           "rl:{ip:127.0.0.1}|ns:api|2/0.01"]


def test_class_based_views_through_dispatch_or_as_view(at, redis):
    at(HIRATE_DEFAULT_LIMITS="100/100s")
    client = Client()
    assert get(client, "/report") == (200, '"report";r=1;t=100', None)
    assert get(client, "/report") == (200, '"report";r=0;t=200', None)
    assert get(client, "/report")[0] == 429
    assert get(client, "/plain") == (200, '"1-per-100s";r=0;t=100', None)
    assert get(client, "/plain")[0] == 429
    assert keys(redis) == [VIEW + "Plain|1/0.01", VIEW + "Report|2/0.01"]


def test_disabled(at):
    at(HIRATE_ENABLED=False, HIRATE_DEFAULT_LIMITS="1/100s")
    client = Client()
    for _ in range(3):
        assert get(client, "/once") == (200, None, None)
        assert get(client, "/") == (200, None, None)


# ------------------------------------------------------- stacked limits

def test_stacked_limits_on_one_identity_are_one_decision(at, redis):
    client = Client()
    r = client.get("/search", HTTP_X_API_KEY="k1")
    assert r["RateLimit-Policy"] == '"burst";q=10;w=10, "daily";q=1000;w=86400'
    assert r["RateLimit"] == '"burst";r=9;t=1, "daily";r=999;t=87'
    assert keys(redis) == ["rl:{k:k1}|view:test_django.search|10/1.0+1000/0.011574074074074073"]
    client.post("/export")
    client.post("/export")
    r = client.post("/export")
    assert (r.status_code, r["Retry-After"], r["RateLimit"]) == (
        429, "30", '"2-per-60s";r=0;t=30, "3-per-86400s";r=1;t=57600')
    assert json.loads(r.content)["violated-policies"] == ["2-per-60s"]


def test_stacked_limits_on_two_identities_spend_nothing_on_a_refusal(at, redis):
    # per-ip (2) is refused at the third request: per-key keeps its 3.
    seen = arun(*[("get", "/mixed", {"headers": {"X-API-Key": "k%d" % (i % 2)}})
                  for i in range(3)])
    assert seen == [
        (200, '"per-ip";r=1;t=100, "per-key";r=4;t=100', None),
        (200, '"per-ip";r=0;t=200, "per-key";r=4;t=100', None),
        (429, '"per-ip";r=0;t=100, "per-key";r=4;t=100', "100"),
    ]
    # The refused request spent nothing of k0's bucket: one request's worth.
    with hirate.Limiter(redis.url, capacity=5, rate=0.01) as lim:
        assert lim.peek("{k:k0}|view:test_django.mixed|5/0.01").remaining == 4


# ----------------------------------------------------------------- keys

def test_key_header_gives_each_api_key_a_bucket(at, redis):
    client = Client()
    for k in ("a", "b", "a"):
        client.get("/search", HTTP_X_API_KEY=k)
    assert get(client, "/search", HTTP_X_API_KEY="a")[1] == '"burst";r=7;t=3, "daily";r=997;t=260'
    client.get("/search")  # no key: by address
    assert len(keys(redis)) == 3


def test_a_key_function_from_its_dotted_path(at, redis):
    at(HIRATE_KEY="test_django.user_key")
    client = Client()
    assert get(client, "/once", HTTP_X_USER="alice")[0] == 200
    assert get(client, "/once", HTTP_X_USER="alice")[0] == 429
    assert get(client, "/once", HTTP_X_USER="bob")[0] == 200
    assert get(client, "/once")[0] == 200       # None: the client's address
    assert keys(redis) == ["rl:{ip:127.0.0.1}|view:test_django.once|1/0.01",
                           "rl:{k:alice}|view:test_django.once|1/0.01",
                           "rl:{k:bob}|view:test_django.once|1/0.01"]


async def async_user_key(request):
    await asyncio.sleep(0)
    return request.headers.get("X-User")


def test_an_async_key_function_under_asgi(at, redis):
    at(HIRATE_KEY=async_user_key)
    assert arun(("get", "/once", {"headers": {"X-User": "alice"}}),
                ("get", "/once", {"headers": {"X-User": "alice"}}),
                ("get", "/once", {"headers": {"X-User": "bob"}})) == [
        (200, '"once";r=0;t=100', None), (429, '"once";r=0;t=100', "100"),
        (200, '"once";r=0;t=100', None)]
    assert keys(redis) == ["rl:{k:alice}|view:test_django.once|1/0.01",
                           "rl:{k:bob}|view:test_django.once|1/0.01"]


@limit(5, 0.01, cost=lambda request: asyncio.sleep(0, int(request.GET["n"])),
       exempt_when=lambda request: asyncio.sleep(0, "free" in request.GET))
async def async_costly(request):
    return HttpResponse("ok")


urlpatterns.append(path("async_costly", async_costly))


def test_async_cost_and_exempt_when_under_asgi(at):
    assert arun(("get", "/async_costly?n=4", {}), ("get", "/async_costly?n=2", {}),
                ("get", "/async_costly?n=2&free", {}), ("get", "/async_costly?n=1", {})) == [
        (200, '"5-per-500s";r=1;t=400', None), (429, '"5-per-500s";r=1;t=100', "100"),
        (200, None, None), (200, '"5-per-500s";r=0;t=500', None)]


def test_a_key_setting_that_cannot_be_imported_says_which(at):
    at(HIRATE_KEY="test_django.no_such_key")
    with pytest.raises(ImproperlyConfigured, match="HIRATE_KEY: .*no_such_key"):
        hd.RateLimitMiddleware(lambda request: None)


def test_exempt_when(at):
    client = Client()
    for _ in range(3):
        assert get(client, "/internal", HTTP_X_INTERNAL="yes") == (200, None, None)
    assert get(client, "/internal")[0] == 200
    assert get(client, "/internal")[0] == 429


def test_forwarded_for_is_believed_only_from_trusted_proxies(at, redis):
    at(HIRATE_TRUSTED_PROXIES="10.0.0.0/8")
    client = Client()
    xff = "6.6.6.6, 198.51.100.1"
    client.get("/once", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR=xff)
    client.get("/once", REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR=xff)
    assert keys(redis) == ["rl:{ip:198.51.100.1}|view:test_django.once|1/0.01",
                           "rl:{ip:203.0.113.9}|view:test_django.once|1/0.01"]
    r = client.get("/once", REMOTE_ADDR="10.0.0.3", HTTP_X_FORWARDED_FOR="7.7.7.7, 198.51.100.1")
    assert r.status_code == 429


def test_proxy_hops_and_the_forwarded_header(at, redis):
    at(HIRATE_PROXY_HOPS=1, HIRATE_FORWARDED_HEADER="Forwarded")
    client = Client()
    client.get("/once", REMOTE_ADDR="10.0.0.2",
               HTTP_FORWARDED='for=6.6.6.6, for="[2001:db8::17]:443"')
    assert keys(redis) == ["rl:{ip:2001:db8::/64}|view:test_django.once|1/0.01"]


def test_client_ip(at):
    at(HIRATE_TRUSTED_PROXIES=["10.0.0.0/8"])
    from django.test import RequestFactory
    rf = RequestFactory()
    xff = "6.6.6.6, 198.51.100.1"
    assert hd.client_ip(rf.get("/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR=xff)) == (
        "198.51.100.1")
    assert hd.client_ip(rf.get("/", REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR=xff)) == (
        "203.0.113.9")


# ------------------------------------------------ methods and deduct_when

def test_a_limit_of_some_methods(at, redis):
    at(HIRATE_DEFAULT_LIMITS="100/100s")
    client = Client()
    # GET: the view's limits are POST's alone, and it has limits: none apply.
    assert get(client, "/posted") == (200, None, None)
    assert client.post("/posted")["RateLimit"] == '"posts";r=1;t=100'
    assert client.post("/posted")["RateLimit"] == '"posts";r=0;t=200'
    assert client.post("/posted").status_code == 429
    assert get(client, "/posted") == (200, None, None)
    assert keys(redis) == [VIEW + "posted|2/0.01@POST"]


@pytest.mark.parametrize("path", ["/login", "/alogin"])
def test_only_failed_logins_are_charged(at, path):
    def send(password):
        return "post", path, {"data": {"password": password}}

    def seen(responses):
        return [(r.status_code, r.get("RateLimit")) for r in responses]

    async def arequests(*requests):
        client = AsyncClient()
        return [await client.post(p, **extra) for _, p, extra in requests]

    requests = [send("right"), send("wrong"), send("right"), send("wrong"), send("wrong"),
                send("right")]
    if path == "/login":
        client = Client()
        responses = [client.post(p, **extra) for _, p, extra in requests]
    else:
        responses = asyncio.run(arequests(*requests))
    assert seen(responses) == [
        (200, '"failed-logins";r=3;t=0'),      # checked (3 left), not charged
        (401, '"failed-logins";r=2;t=100'),    # charged after the response
        (200, '"failed-logins";r=2;t=100'),
        (401, '"failed-logins";r=1;t=200'),
        (401, '"failed-logins";r=0;t=300'),
        (429, '"failed-logins";r=0;t=100'),    # the third failure spent the last
    ]


# ---------------------------------------------------- one client's buckets

def test_reset_and_peek_one_clients_buckets(at):
    at(HIRATE_DEFAULT_LIMITS="2/200s", HIRATE_NAMESPACE_LIMITS={"api": "1/100s"})
    client = Client()
    client.get("/once")
    client.get("/")
    client.get("/api/a")
    assert hd.peek(once, address="127.0.0.1").ratelimit_header() == '"once";r=0;t=100'
    assert hd.peek(None, address="127.0.0.1").ratelimit_header() == '"2-per-200s";r=1;t=100'
    assert hd.peek("api", address="127.0.0.1").ratelimit_header() == '"1-per-100s";r=0;t=100'
    assert hd.peek(index, address="127.0.0.1").ratelimit_header() == '"2-per-200s";r=1;t=100'
    assert hd.peek(health, address="127.0.0.1").checks == ()
    assert hd.peek(once, address="10.9.9.9").ratelimit_header() == '"once";r=1;t=0'
    hd.reset(once, address="127.0.0.1")
    hd.reset("api", address="127.0.0.1")
    assert get(client, "/once") == (200, '"once";r=0;t=100', None)
    assert get(client, "/api/a") == (200, '"1-per-100s";r=0;t=100', None)
    assert get(client, "/")[1] == '"2-per-200s";r=0;t=200'   # not reset
    # By key, for limits keyed by a key function.
    client.get("/search", HTTP_X_API_KEY="k1")
    assert hd.peek(search, key="k1").ratelimit_header() == '"burst";r=9;t=1, "daily";r=999;t=87'
    hd.reset(search, key="k1")
    assert hd.peek(search, key="k1").ratelimit_header() == '"burst";r=10;t=0, "daily";r=1000;t=0'


def test_areset_and_apeek_on_async_limiters(at):
    async def main():
        client = AsyncClient()
        await client.get("/alimited")
        before = (await hd.apeek(alimited, address="127.0.0.1")).ratelimit_header()
        await hd.areset(alimited, address="127.0.0.1")
        after = (await hd.apeek(alimited, address="127.0.0.1")).ratelimit_header()
        return before, after

    assert asyncio.run(main()) == ('"3-per-30s";r=2;t=10', '"3-per-30s";r=3;t=0')
    assert ("AsyncLimiter", ((3, 0.1),)) in made()


def test_bad_targets_say_what_a_target_is(at):
    with pytest.raises(ValueError, match="no namespace 'nope' in HIRATE_NAMESPACE_LIMITS"):
        hd.reset("nope", address="127.0.0.1")
    with pytest.raises(TypeError, match="give key= .* or address="):
        hd.reset(once)
    with pytest.raises(ValueError, match="a limit without a scope has a bucket per view"):
        hd.reset(hd.Limit(1, 1), address="127.0.0.1")
    with pytest.raises(TypeError, match="a target is a view, a namespace, None"):
        hd.peek(42, address="127.0.0.1")


# ------------------------------------------------------------- refusals

def test_on_refused_makes_the_response_and_headers_are_added(at):
    at(HIRATE_ON_REFUSED=custom_refusal)
    client = Client()
    client.get("/once")
    r = client.get("/once")
    assert (r.status_code, r.content, r["Retry-After"], r["RateLimit"]) == (
        429, b"slow down, once", "999", '"once";r=0;t=100')


def test_an_async_on_refused_is_awaited(at):
    async def refusal(request, result):
        return HttpResponse("async refusal", status=result.status)

    at(HIRATE_ON_REFUSED=refusal)

    async def main():
        client = AsyncClient()
        await client.get("/once")
        r = await client.get("/once")
        return r.status_code, r.content, r["Retry-After"]

    assert asyncio.run(main()) == (429, b"async refusal", "100")


def test_a_views_own_ratelimit_items_stay(at):
    def view_with_items(request):
        r = HttpResponse("x")
        r["RateLimit"] = '"upstream";r=5;t=1'
        return r

    limited_view = limit(1, 0.01, name="mine")(view_with_items)
    from django.test import RequestFactory
    request = RequestFactory().get("/")
    mw = hd.RateLimitMiddleware(lambda req: limited_view(req))
    assert mw.process_view(request, limited_view, (), {}) is None
    assert mw(request)["RateLimit"] == '"upstream";r=5;t=1, "mine";r=0;t=100'


# ---------------------------------------------------------- Redis fails

@pytest.fixture
def policy(own_redis):
    def apply(on_error):
        o = override_settings(HIRATE_URL=own_redis.url, HIRATE_ON_ERROR=on_error)
        o.enable()
        return o
    made = []
    yield lambda on_error: made.append(apply(on_error))
    for o in made:
        o.disable()


def test_on_error_local_decides_from_memory(policy, own_redis):
    policy("local")
    client = Client()
    assert get(client, "/limited") == (200, '"3-per-30s";r=2;t=10', None)
    own_redis.kill()
    # This process' own bucket, full, decides while Redis is down.
    assert get(client, "/limited") == (200, '"3-per-30s";r=2;t=10', None)
    assert get(client, "/limited") == (200, '"3-per-30s";r=1;t=20', None)
    assert get(client, "/limited") == (200, '"3-per-30s";r=0;t=30', None)
    assert get(client, "/limited") == (429, '"3-per-30s";r=0;t=10', "10")


def test_on_error_local_decides_from_memory_under_asgi(policy, own_redis):
    policy("local")
    assert arun(("get", "/alimited", {})) == [(200, '"3-per-30s";r=2;t=10', None)]
    own_redis.kill()
    # This process' own bucket, full, decides while Redis is down.
    assert arun(*[("get", "/alimited", {})] * 4) == [
        (200, '"3-per-30s";r=2;t=10', None), (200, '"3-per-30s";r=1;t=20', None),
        (200, '"3-per-30s";r=0;t=30', None), (429, '"3-per-30s";r=0;t=10', "10")]


def test_on_error_open_allows(policy, own_redis):
    policy("open")
    own_redis.kill()
    client = Client()
    # No bucket behind the policy's figures: no RateLimit item.
    assert [get(client, "/limited") for _ in range(5)] == [(200, None, None)] * 5
    assert arun(*[("get", "/alimited", {})] * 5) == [(200, None, None)] * 5


@pytest.mark.parametrize("path", ["/limited", "/alimited"])
def test_on_error_closed_answers_503(policy, own_redis, path):
    policy("closed")
    own_redis.kill()
    if path == "/limited":
        r = Client().get(path)
    else:
        async def main():
            return await AsyncClient().get(path)
        r = asyncio.run(main())
    # The breaker tries Redis again within 125 ms: rounded up, 1 s. No
    # bucket behind the policy's figures: no RateLimit item.
    assert (r.status_code, r.get("RateLimit"), r["Retry-After"]) == (503, None, "1")
    assert json.loads(r.content) == {
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
        with override_settings(HIRATE_URL=url, HIRATE_ON_ERROR="open"):
            with pytest.raises(hirate.AuthError) as e:
                Client().get("/limited")
            state = hd._state
            shown = str(e.value) + repr(state) + repr(state.limiters) + repr(vars(state))
            assert "canary-0xdeadbeef" not in shown
            assert repr(state) == ("<hirate.django state url='redis://:***@127.0.0.1:%d' "
                                   "on_error='open'>" % server.port)
    finally:
        server.close()


# ------------------------------------------------------- other backends

def test_tls_url_and_limiter_options(tls_redis, certs):
    with override_settings(HIRATE_URL=tls_redis.url,
                           HIRATE_LIMITER_OPTIONS={"tls_ca_file": str(certs / "ca.crt")}):
        before = hd.stats().decisions["redis"]
        assert get(Client(), "/limited") == (200, '"3-per-30s";r=2;t=10', None)
        assert arun(("get", "/limited", {})) == [(200, '"3-per-30s";r=1;t=20', None)]
        assert hd.stats().decisions["redis"] == before + 2


def test_a_cluster_url(cluster):
    with override_settings(HIRATE_URL=cluster.url, HIRATE_PREFIX="dj:"):
        client = Client()
        assert [get(client, "/limited")[0] for _ in range(4)] == [200, 200, 200, 429]
        assert arun(("get", "/limited", {})) == [(429, '"3-per-30s";r=0;t=10', "10")]
    key = "dj:{ip:127.0.0.1}|view:test_django.limited|3/0.1"
    assert cluster.command(cluster.master_of(cluster.keyslot(key)), "EXISTS", key) == 1


def test_a_sentinel_url(sentinel):
    with override_settings(HIRATE_URL=sentinel.url):
        client = Client()
        assert [get(client, "/limited")[0] for _ in range(2)] == [200, 200]
        assert arun(("get", "/limited", {})) == [(200, '"3-per-30s";r=0;t=30', None)]
    key = "rl:{ip:127.0.0.1}|view:test_django.limited|3/0.1"
    assert sentinel.command(sentinel.master, "EXISTS", key) == 1


# ---------------------------------------------------------------- stats

def test_stats_add_up_every_limiter_and_never_go_back(at):
    before = hd.stats()
    client = Client()
    for _ in range(4):
        client.get("/limited")
    arun(("get", "/alimited", {}), ("get", "/search", {}))
    s = hd.stats()
    # The refusal is the deny cache's: the bucket was seen empty.
    assert {k: v - before.decisions[k] for k, v in s.decisions.items()} == {
        "redis": 5, "cache": 1, "local": 0, "fail_open": 0, "fail_closed": 0}
    assert s.refused - before.refused == 1
    hd.close()
    assert hd.stats().decisions == s.decisions
    at(HIRATE_PREFIX="other:")   # a new state: the old one's figures stay
    assert hd.stats().decisions == s.decisions
    client.get("/limited")
    assert hd.stats().decisions["redis"] == s.decisions["redis"] + 1


def test_health_checks_the_redis_the_limiters_use(policy, own_redis):
    policy("local")
    h = hd.health()   # before any request: a limiter of its own asks
    assert (bool(h), h.error, [n.addr for n in h.nodes], h.nodes[0].role) == (
        True, None, ["127.0.0.1:%d" % own_redis.port], "master")
    assert get(Client(), "/limited")[0] == 200
    h = asyncio.run(hd.ahealth())
    assert (bool(h), [(n.addr, n.role, n.loaded) for n in h.nodes]) == (
        True, [("127.0.0.1:%d" % own_redis.port, "master", True)])
    own_redis.kill()
    for h in (hd.health(), asyncio.run(hd.ahealth())):
        assert (bool(h), h.error, [(n.ok, n.error) for n in h.nodes]) == (
            False, "ECONNECT", [(False, "ECONNECT")])
    # The first check made a limiter of its own; the later ones used those
    # the requests made.
    assert made() == [("AsyncLimiter", ((1, 1.0),)), ("Limiter", ((1, 1.0),)),
                      ("Limiter", ((3, 0.1),))]


def test_health_without_redis_is_ok_with_no_node():
    with override_settings(HIRATE_URL=None):
        for h in (hd.health(), asyncio.run(hd.ahealth())):
            assert (bool(h), h.error, h.nodes) == (True, None, ())
        assert made() == [("Limiter", ((1, 1.0),))]


def test_the_module_exports_its_figures_to_prometheus(at):
    from prometheus_client import CollectorRegistry, generate_latest

    import hirate.prometheus
    registry = CollectorRegistry()
    hirate.prometheus.register(hd, name="web", registry=registry)
    before = hd.stats()
    client = Client()
    for _ in range(2):
        client.get("/once")

    def metric(sample):
        text = generate_latest(registry).decode()
        return next(float(line.split()[-1]) for line in text.splitlines()
                    if line.startswith(sample))

    assert metric('hirate_refused_total{limiter="web"}') == before.refused + 1
    assert metric('hirate_decisions_total{limiter="web",source="redis"}') == (
        before.decisions["redis"] + 1)


def test_the_deny_cache_setting(at):
    at(HIRATE_DENY_CACHE=False)
    before = hd.stats()
    client = Client()
    for _ in range(4):
        client.get("/limited")
    s = hd.stats()
    assert {k: v - before.decisions[k] for k, v in s.decisions.items()} == {
        "redis": 4, "cache": 0, "local": 0, "fail_open": 0, "fail_closed": 0}


# ------------------------------------------------------------ bad setups

@pytest.mark.parametrize("setting, value, error, message", [
    ("HIRATE_ON_ERROR", "sometimes", hirate.ConfigError, "on_error"),
    ("HIRATE_URL", "http://127.0.0.1:6379", hirate.ConfigError,
     "invalid Redis URL: it must start with redis://"),
    ("HIRATE_BODY", "xml", ValueError, "HIRATE_BODY must be 'json' or 'text', got 'xml'"),
    ("HIRATE_TRUSTED_PROXIES", ["proxy"], ValueError, 'trusted_proxies: "proxy" is not an address'),
    ("HIRATE_DEFAULT_LIMITS", "1000/dai", hirate.ConfigError,
     "HIRATE_DEFAULT_LIMITS: limit '1000/dai': unknown unit 'dai'"),
    ("HIRATE_DEFAULT_LIMITS", [10], TypeError, "a limit must be a hirate Limit, a limit string"),
    ("HIRATE_LIMITER_OPTIONS", {"prefix": "x"}, ValueError,
     "HIRATE_LIMITER_OPTIONS: 'prefix' has a setting or a limit of its own"),
    ("HIRATE_LIMITER_OPTIONS", {"pool_size": 2}, ValueError,
     "HIRATE_LIMITER_OPTIONS: 'pool_size' has a setting or a limit of its own"),
    ("HIRATE_POOL_SIZE", 0, hirate.ConfigError, "pool_size"),
    ("HIRATE_MAX_KEYS", 0, hirate.ConfigError, "max_keys"),
    ("HIRATE_EXEMPT_NAMESPACES", ["api"], ValueError,
     "namespace 'api' has limits: it cannot be exempt too"),
])
def test_bad_settings_fail_when_the_middleware_is_made(setting, value, error, message):
    extra = {"HIRATE_NAMESPACE_LIMITS": {"api": "1/s"}} if setting.endswith("NAMESPACES") else {}
    with override_settings(**{setting: value}, **extra):
        with pytest.raises(error, match=message):
            hd.RateLimitMiddleware(lambda request: None)


def test_limits_without_the_middleware_refuse_to_run(at):
    at(MIDDLEWARE=[])
    with pytest.raises(ImproperlyConfigured, match="RateLimitMiddleware did not see this"):
        Client().get("/limited")
    with pytest.raises(ImproperlyConfigured, match="RateLimitMiddleware did not see this"):
        arun(("get", "/alimited", {}))
    assert Client().get("/").status_code == 200
    at(HIRATE_ENABLED=False)   # limits off: a view may be called as it is
    assert Client().get("/limited").status_code == 200
    from django.test import RequestFactory
    assert limited(RequestFactory().get("/limited")).content == b"ok"


def test_the_middleware_twice_decides_once(at):
    at(MIDDLEWARE=["hirate.django.RateLimitMiddleware"] * 2)
    assert get(Client(), "/limited") == (200, '"3-per-30s";r=2;t=10', None)


def test_exempt_and_limited_at_once_is_refused():
    def view(request):
        return HttpResponse("x")

    limited_view = limit(1, 1)(view)
    with pytest.raises(ValueError, match="view 'test_exempt_and_limited_at_once_is_refused"
                                         ".<locals>.view' has limits: it cannot be exempt"):
        exempt(limited_view)

    def other(request):
        return HttpResponse("y")

    exempt(other)
    with pytest.raises(ValueError, match="is exempt: it cannot have limits too"):
        limit(1, 1)(other)
    with pytest.raises(TypeError, match="decorate Plain.as_view"):
        limit(1, 1)(Plain)
