"""hirate for ASGI apps (FastAPI, Starlette): a middleware and a FastAPI
dependency, both on hirate.AsyncLimiter, so waiting for Redis never blocks
the event loop.

    from fastapi import Depends, FastAPI
    from hirate.asgi import RateLimiter, RateLimitMiddleware, key_header

    limiter = RateLimiter(url="redis://127.0.0.1:6379",
                          default_limits="100/10s",
                          routes={"POST /login": "5/minute", "/health": []})
    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, limiter=limiter)

    search_limits = limiter.limit("10/second; 1000/day", key=key_header("X-API-Key"))

    @app.get("/search", dependencies=[Depends(search_limits)])
    async def search(): ...

The middleware limits by path before any routing (default limits, per-path
limits, exempt paths); the dependency limits one route and adds the headers
to its response. A refusal is a 429 (503 when on_error="closed" refused
because Redis is down) with Retry-After; the middleware answers it with a
problem+json body, the dependency raises RateLimitExceeded.
"""

import json

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from . import AsyncLimiter as _AsyncLimiter
from . import Limiter as _Limiter
from . import Stats as _Stats
from . import _hirate

from ._http import LIMITER_OPTIONS, METHODS as _METHODS, SETTINGS, ClientIP, Limit, Result
from ._http import charges, check_limits, check_scope, checks_of, client_buckets, declare
from ._http import charge_async, decide_async, from_environ, ident_for_ip, ident_for_key, identity, key_header
from ._http import new_limiter, plan, refund_async, _check_cost
from ._http import maybe_await as _maybe_await, scope_part as _scope_part

_D = _hirate.DEFAULTS   # the core's defaults, shown in the signature

__all__ = ["RateLimiter", "RateLimitMiddleware", "RateLimitExceeded", "Limit", "Result",
           "ResponseStart", "key_header"]

_LISTS = frozenset([b"ratelimit", b"ratelimit-policy"])


class ResponseStart:
    """What a deduct_when(response) of the middleware sees: the response's
    status_code and headers (a Starlette Headers), as the app starts it,
    before its body."""

    __slots__ = ("status_code", "headers")

    def __init__(self, message):
        self.status_code = message["status"]
        self.headers = Headers(raw=list(message.get("headers", ())))


class _Pattern:
    """A routes/exempt entry: "[METHOD ]/path", where a path ending in "*"
    matches every path that starts with what comes before the "*". Paths
    are matched against the request's whole path (scope["path"])."""

    __slots__ = ("text", "method", "path", "prefix", "limits", "scope")

    def __init__(self, text, limits):
        if not isinstance(text, str):
            raise TypeError("a route pattern must be a str, got %s" % type(text).__name__)
        method, _, path = text.strip().rpartition(" ")
        method = method.strip().upper() or None
        if method is not None and method not in _METHODS:
            raise ValueError("route pattern %r: %r is not an HTTP method" % (text, method))
        if not path.startswith("/"):
            raise ValueError("route pattern %r: the path must start with '/'" % text)
        if "*" in path[:-1]:
            raise ValueError("route pattern %r: '*' may only end the path" % text)
        self.text = text
        self.method = method
        self.prefix = path.endswith("*")
        self.path = path[:-1] if self.prefix else path
        self.limits = limits
        self.scope = check_scope("path:" + _scope_part(text.strip()), "route pattern")

    def matches(self, method, path):
        # A GET route answers HEAD too: a HEAD must not escape its limits.
        if self.method is not None and self.method != method and not (
                self.method == "GET" and method == "HEAD"):
            return False
        return path.startswith(self.path) if self.prefix else path == self.path

    def rank(self):
        # The most specific pattern wins: an exact path before a prefix, a
        # longer prefix before a shorter one, a method before any method.
        return (not self.prefix, len(self.path), self.method is not None)


def _as_limits(value, where):
    # One limit (a Limit, a (capacity, rate) pair, a limit string such as
    # "10/second; 1000/day"), or a list of them.
    if isinstance(value, tuple) and len(value) == 2 and not any(
            isinstance(v, (Limit, tuple, list, str)) for v in value):
        value = [value]  # one pair, not a list of them
    if not isinstance(value, (str, Limit)) and not hasattr(value, "__iter__"):
        raise TypeError("limits for %s must be a Limit, a limit string, a (capacity, rate) "
                        "pair or a list of them, got %r" % (where, value))
    return check_limits(value, where)


class RateLimitExceeded(HTTPException):
    """Raised by a refusing dependency. FastAPI answers it as an
    HTTPException (status, Retry-After and the rate-limit headers, and
    {"detail": <problem>}); register limiter.exception_handler for it to
    answer as the middleware does (the problem itself, or on_refused's
    response)."""

    def __init__(self, result, headers, detail):
        super().__init__(status_code=result.status, detail=detail, headers=dict(headers))
        self.result = result


class RateLimiter:
    """Limits, settings and the AsyncLimiters (one per distinct set of bands,
    made on first use) that RateLimitMiddleware and the limit() dependencies
    share.

    url              Redis URL; None: in memory (each process has its own
                     buckets)
    default_limits   a limit string ("100/hour; 10/second"), or Limits, limit
                     strings and (capacity, rate) pairs, for every path no
                     routes pattern matches; one budget per client across all
                     of them (scope "app")
    routes           {pattern: limits (as default_limits)} for the
                     middleware: "/login",
                     "POST /login", "/api/*"; the most specific matching
                     pattern decides, and an empty list exempts its paths
    exempt           patterns that get no default limits (routes {p: []})
    key              callable(request) -> str | bytes | int | None (or a
                     coroutine function): the default identity of a client;
                     None (default) is its address
    on_error         "local" (default), "open" or "closed": what decides
                     while Redis is down
    headers          send RateLimit-Policy and RateLimit (True)
    legacy_headers   also X-RateLimit-Limit, -Remaining and -Reset (False)
    trusted_proxies, proxy_hops, forwarded_header, ipv6_subnet
                     how the client's address is found (see ClientIP)
    prefix, instances, connect_timeout, timeout, sentinel_username,
    sentinel_password, functions, deny_cache, deny_cache_max, max_keys,
    pool_size
                     passed to every hirate.AsyncLimiter

    RateLimiter.from_env() takes every setting from the environment
    (HIRATE_URL, else REDIS_URL; HIRATE_DEFAULT_LIMITS, HIRATE_ROUTES, ...),
    as Flask takes them from app.config.
    body             "json" (problem+json, default) or "text": the
                     middleware's refusal body
    on_refused       callable(request, result) returning the refusal's
                     Response (or any ASGI app; a coroutine function is
                     awaited); the rate-limit headers and Retry-After are
                     added unless it set them
    enabled          False turns every limit off
    """

    def __init__(self, *, url=None, default_limits=(), routes=None, exempt=(), key=None,
                 on_error=_D["on_error"], headers=True, legacy_headers=False,
                 trusted_proxies=(), proxy_hops=0, forwarded_header=_D["forwarded_header"],
                 ipv6_subnet=_D["ipv6_subnet"], prefix=_D["prefix"],
                 instances=_D["instances"], connect_timeout=_D["connect_timeout"],
                 timeout=_D["timeout"], body="json", on_refused=None, enabled=True,
                 sentinel_username=None, sentinel_password=None, functions=_D["functions"],
                 deny_cache=_D["deny_cache"], deny_cache_max=_D["deny_cache_max"],
                 max_keys=_D["max_keys"], pool_size=_D["pool_size"]):
        url = url or None
        self.default_limits = _as_limits(default_limits, "default_limits")
        patterns = []
        for text, limits in (routes or {}).items():
            patterns.append(_Pattern(text, _as_limits(limits, "route %r" % (text,))))
        if isinstance(exempt, str):
            exempt = [exempt]
        for text in exempt:
            patterns.append(_Pattern(text, []))
        seen = {}
        for p in patterns:
            spot = (p.method, p.path, p.prefix)
            if spot in seen:
                raise ValueError("route patterns %r and %r name the same paths"
                                 % (seen[spot], p.text))
            seen[spot] = p.text
        self._patterns = sorted(patterns, key=_Pattern.rank, reverse=True)
        if key is not None and not callable(key):
            raise TypeError("key must be a callable(request) or None, got %s"
                            % type(key).__name__)
        self.key = key
        self.headers = bool(headers)
        self.legacy_headers = bool(legacy_headers)
        if body not in ("json", "text"):
            raise ValueError("body must be 'json' or 'text', got %r" % (body,))
        self.body = body
        if on_refused is not None and not callable(on_refused):
            raise TypeError("on_refused must be a callable(request, result), got %s"
                            % type(on_refused).__name__)
        self.on_refused = on_refused
        self.enabled = bool(enabled)
        self.client_ip = ClientIP(trusted_proxies, proxy_hops, forwarded_header, ipv6_subnet)
        self._options = dict(prefix=prefix, on_error=on_error, instances=instances,
                             connect_timeout=connect_timeout, timeout=timeout,
                             functions=functions, deny_cache=deny_cache,
                             deny_cache_max=deny_cache_max, max_keys=max_keys,
                             pool_size=pool_size)
        assert set(self._options) == set(LIMITER_OPTIONS)
        # The sentinels' credentials, as the URL's password, stay out of
        # self._options (see below).
        sentinel = dict(sentinel_username=sentinel_username,
                        sentinel_password=sentinel_password)
        # The core checks the URL and every option, with messages naming the
        # problem: a bad setting fails here, not at the first request.
        probe = _Limiter(url, capacity=1, rate=1.0, **self._options, **sentinel)
        self.url = probe.url  # the password replaced by ***
        probe.close()
        # The URL with its password, and the sentinels' password, are kept in
        # this closure only, out of reprs and of vars() dumps.
        self._new_limiter = lambda bands: new_limiter(_AsyncLimiter, url, bands,
                                                      self._options, sentinel)
        self._limiters = {}
        # The figures of the limiters close() closed, so that stats() never
        # go back; those being closed count until they are in there.
        self._retired = _Stats.zero()
        self._closing = []

    @classmethod
    def from_env(cls, environ=None, prefix="HIRATE_", **settings):
        """A RateLimiter of the settings in environment variables, each
        <prefix><NAME> (HIRATE_URL, else REDIS_URL; HIRATE_DEFAULT_LIMITS,
        HIRATE_ROUTES, HIRATE_EXEMPT, HIRATE_ON_ERROR, HIRATE_DENY_CACHE,
        HIRATE_MAX_KEYS, HIRATE_POOL_SIZE ...: the names of the Flask
        settings), read as JSON when they parse (true, 5, ["10.0.0.0/8"],
        {"POST /login": "5/minute"}), else as the string. Settings given
        here win; key and on_refused can only be given here."""
        import os
        environ = os.environ if environ is None else environ
        names = [n for n in SETTINGS if n not in settings] + [
            n for n in ("routes", "exempt") if n not in settings]
        found = from_environ(environ, prefix, names)
        if "url" not in found and "url" not in settings and environ.get("REDIS_URL"):
            found["url"] = environ["REDIS_URL"]
        for name in ("trusted_proxies", "exempt"):
            if isinstance(found.get(name), str):
                found[name] = [v.strip() for v in found[name].split(",") if v.strip()]
        return cls(**found, **settings)

    def __repr__(self):
        return "<hirate.asgi.RateLimiter url=%r on_error=%r>" % (
            self.url, self._options["on_error"])

    # -- limiters

    def _limiter(self, bands):
        lim = self._limiters.get(bands)
        if lim is None:
            # No await between the lookup and the store: one per set of
            # bands even with many tasks on the loop.
            lim = self._new_limiter(bands)
            self._limiters[bands] = lim
        return lim

    async def close(self):
        """Closes the AsyncLimiters (new ones are made if a request comes
        after). RateLimitMiddleware calls it when the app shuts down."""
        limiters, self._limiters = list(self._limiters.values()), {}
        self._closing += limiters
        for lim in limiters:
            await lim.close()
            self._retired += lim.stats()
            self._closing.remove(lim)

    aclose = close

    def stats(self):
        """hirate.Stats: the metrics of this RateLimiter's AsyncLimiters (one
        per distinct set of limits) added up, those closed by close()
        included, so no figure goes back."""
        return _Stats.sum([self._retired, *(lim.stats() for lim in self._closing),
                           *(lim.stats() for lim in list(self._limiters.values()))])

    async def health(self):
        """hirate.Health: AsyncLimiter.check() of this RateLimiter's Redis
        (every node decisions go to: its role, whether the script is
        loaded, the round trip), for a readiness probe; without Redis, ok
        with no node."""
        lim = next(iter(self._limiters.values()), None) or self._limiter(((1, 1.0),))
        return await lim.check()

    # -- the client

    def client_address(self, request):
        """The client's address as the proxy settings read it (a Request or
        an ASGI scope)."""
        scope = request.scope if isinstance(request, Request) else request
        client = scope.get("client")
        name = self.client_ip.header.lower().encode("latin-1")
        values = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == name]
        return self.client_ip.resolve(client[0] if client else None, values)

    # -- deciding

    async def check(self, request, applied):
        """The Result of [(Limit, scope)] for a request (None when every
        limit is exempt for it)."""
        checked = await self._check(request, applied)
        return None if checked is None else checked[0]

    async def _check(self, request, applied):
        """(Result, charge) of [(Limit, scope)] for a request, charge an
        async callable(response) -> Result that charges the limits with
        deduct_when (None when there are none or the request is refused);
        None when every limit is exempt."""
        address = None
        decided, calls = [], []
        for group in plan(applied, self.key):
            if group.exempt_when is not None and await _maybe_await(
                    group.exempt_when(request)):
                continue
            keyfunc = group.keyfunc
            value = await _maybe_await(keyfunc(request)) if keyfunc is not None else None
            if value is None:
                if address is None:
                    address = self.client_ip.key(self.client_address(request)) or "unknown"
                ident = ident_for_ip(address)
            else:
                ident = ident_for_key(value)
            cost = group.limits[0].cost
            if callable(cost):
                cost = _check_cost(await _maybe_await(cost(request)))
            decided.append(group)
            calls.append((self._limiter(group.bands), group.bucket_key(ident), cost,
                          group.deduct_when is None))
        if not calls:
            return None
        decisions = await decide_async(calls)
        result = Result(checks_of(decided, decisions, len(applied)))
        pending = charges(decided, calls)
        if not pending or not result.allowed:
            return result, None

        async def charge(response):
            out = await charge_async(pending, decisions, response)
            return Result(checks_of(decided, out, len(applied)))

        return result, charge

    def _applied(self, method, path):
        for p in self._patterns:
            if p.matches(method, path):
                return [(lim, lim.scope or p.scope) for lim in p.limits
                        if lim.applies_to(method)]
        return [(lim, lim.scope or "app") for lim in self.default_limits
                if lim.applies_to(method)]

    # -- one client's buckets, outside a request

    def _targets(self, target):
        if target is None:
            return [(lim, lim.scope or "app") for lim in self.default_limits]
        if isinstance(target, str):
            for p in self._patterns:
                if p.text == target:
                    return [(lim, lim.scope or p.scope) for lim in p.limits]
            raise ValueError("no routes pattern %r" % (target,))
        limits = getattr(target, "hirate_limits", None)
        if limits is None:
            limits = [target] if isinstance(target, Limit) else target
        if (not isinstance(limits, (list, tuple)) or not limits
                or not all(isinstance(lim, Limit) for lim in limits)):
            raise TypeError("a target is a routes pattern, None (the default limits), a "
                            "limit() dependency or Limits with a scope, got %r" % (target,))
        if any(lim.scope is None for lim in limits):
            raise ValueError("a limit without a scope has a bucket per route: give it a "
                             "scope=, or name its routes pattern")
        return [(lim, lim.scope) for lim in limits]

    def _client_calls(self, target, key, address):
        applied = self._targets(target)
        ident = identity(self.client_ip, key, address)
        groups, calls = client_buckets(applied, self.key, ident, self._limiter)
        return groups, applied, calls

    async def reset(self, target, key=None, *, address=None):
        """Forgets one client's buckets of a route or limit (they are full
        again): target is a routes pattern ("POST /login"), None for the
        default limits, or a limit() dependency or Limits with a scope of
        their own; the client is key= (what the limit's key function
        returns for it) or address= (its address, for limits keyed by
        address)."""
        for lim, bucket in self._client_calls(target, key, address)[2]:
            await lim.reset(bucket)

    async def refund(self, target, key=None, *, address=None, tokens=1):
        """Gives tokens back to one client's buckets of a route or limit
        (target and client as for reset), e.g. after the work the request
        paid for failed: every limit's bucket, each capped at its capacity.
        A Result of the buckets after. A request refused between the spend
        and the refund stays refused (docs/semantics.md, "Refunds")."""
        groups, applied, calls = self._client_calls(target, key, address)
        return Result(checks_of(groups, await refund_async(calls, tokens), len(applied)))

    async def peek(self, target, key=None, *, address=None, cost=0):
        """A Result of one client's buckets of a route or limit (target and
        client as for reset), spending nothing: each limit's Decision for
        cost (0: the bucket as it is)."""
        groups, applied, calls = self._client_calls(target, key, address)
        decisions = [await lim.peek(bucket, cost) for lim, bucket in calls]
        return Result(checks_of(groups, decisions, len(applied)))

    # -- refusals

    def refusal(self, result):
        """The default refusal Response for a Result."""
        headers = dict(result.headers(self.headers, self.legacy_headers))
        if self.body == "json":
            return Response(json.dumps(result.problem()), status_code=result.status,
                            headers=headers, media_type="application/problem+json")
        return Response(result.text(), status_code=result.status, headers=headers,
                        media_type="text/plain")

    async def _refusal_app(self, request, result):
        if self.on_refused is None:
            return self.refusal(result)
        return await _maybe_await(self.on_refused(request, result))

    async def exception_handler(self, request, exc):
        """An exception handler for RateLimitExceeded that answers as the
        middleware does: app.add_exception_handler(RateLimitExceeded,
        limiter.exception_handler)."""
        response = await self._refusal_app(request, exc.result)
        if isinstance(response, Response):
            for name, value in exc.result.headers(self.headers, self.legacy_headers):
                if name.lower() not in response.headers:
                    response.headers[name] = value
        return response

    # -- the FastAPI dependency

    def limit(self, capacity, rate=None, *, key=None, cost=1, scope=None, name=None,
              exempt_when=None, methods=None):
        """A FastAPI dependency for a limit, Depends(limiter.limit(5, 1)), or
        for the limits of a limit string, limiter.limit("5/minute") or
        limiter.limit("10/second; 1000/day") (see Limit for the other
        arguments). scope=None gives the route a bucket of its own. It adds
        the headers to the route's response (when the route returns data,
        not a Response of its own) and raises RateLimitExceeded to refuse."""
        return self.limits(*declare(capacity, rate, key=key, cost=cost, scope=scope,
                                    name=name, exempt_when=exempt_when, methods=methods))

    def limits(self, *limits):
        """A FastAPI dependency for several limits that must all pass; a
        refusal spends nothing on the others (Limits, limit strings or
        (capacity, rate) pairs)."""
        checked = _as_limits(list(limits), "a dependency")
        if not checked:
            raise ValueError("limits() needs at least one limit")
        if any(lim.deduct_when is not None for lim in checked):
            raise ValueError("deduct_when needs the response, which a dependency does not "
                             "see: give the limit to the middleware (routes=)")

        async def rate_limit(request: Request, response: Response):
            if not self.enabled:
                return None
            route_scope = None
            applied = []
            for lim in checked:
                if not lim.applies_to(request.method):
                    continue
                if lim.scope is None and route_scope is None:
                    route_scope = _route_scope(request)
                applied.append((lim, lim.scope or route_scope))
            result = await self.check(request, applied) if applied else None
            if result is None:
                return None
            headers = result.headers(self.headers, self.legacy_headers)
            if not result.allowed:
                detail = result.problem() if self.body == "json" else result.detail()
                raise RateLimitExceeded(result, headers, detail)
            for name, value in headers:
                response.headers.append(name, value)
            return result

        rate_limit.hirate_limits = checked   # what reset() and peek() take
        return rate_limit


def _route_scope(request):
    route = request.scope.get("route")
    path = getattr(route, "path", None)
    if path is None:
        endpoint = request.scope.get("endpoint")
        path = getattr(endpoint, "__qualname__", None)
        if path is None:
            raise RuntimeError("a limit with scope=None needs the route it runs in; "
                               "give it a scope=")
    methods = getattr(route, "methods", None)
    text = "%s %s" % (",".join(sorted(methods)), path) if methods else path
    return check_scope("route:" + _scope_part(text), "route scope")


class RateLimitMiddleware:
    """Pure ASGI middleware: app.add_middleware(RateLimitMiddleware,
    limiter=limiter), or with RateLimiter's arguments instead of a limiter.
    HTTP requests only (websockets and lifespan pass through; at shutdown
    the limiter's connections are closed)."""

    def __init__(self, app, /, limiter=None, **options):
        if limiter is None:
            limiter = RateLimiter(**options)
        elif options:
            raise TypeError("give RateLimitMiddleware a limiter or its arguments, not both "
                            "(%s)" % ", ".join(sorted(options)))
        self.app = app
        self.limiter = limiter

    async def __call__(self, scope, receive, send):
        limiter = self.limiter
        if scope["type"] == "lifespan":
            async def send_closing(message):
                if message["type"] == "lifespan.shutdown.complete":
                    await limiter.close()
                await send(message)
            return await self.app(scope, receive, send_closing)
        if scope["type"] != "http" or not limiter.enabled:
            return await self.app(scope, receive, send)
        applied = limiter._applied(scope["method"], scope["path"])
        if not applied:
            return await self.app(scope, receive, send)
        request = Request(scope)  # no receive: a key function cannot eat the body
        checked = await limiter._check(request, applied)
        if checked is None:
            return await self.app(scope, receive, send)
        result, charge = checked

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                now = result
                if charge is not None:
                    # The limits with deduct_when: charged for this response;
                    # the headers say what is left after it.
                    now = await charge(ResponseStart(message))
                extra = [(n.lower().encode("latin-1"), v.encode("latin-1"))
                         for n, v in now.headers(limiter.headers, limiter.legacy_headers)]
                headers = list(message.get("headers", ()))
                have = {k.lower() for k, _ in headers}
                pairs = {(k.lower(), v) for k, v in headers}
                # RateLimit and RateLimit-Policy are lists that may be split
                # over several fields: a dependency's items and ours both go.
                # Other headers already there (an on_refused hook's) win.
                headers += [(k, v) for k, v in extra
                            if (k, v) not in pairs and (k in _LISTS or k not in have)]
                message = dict(message, headers=headers)
            await send(message)

        if result.allowed:
            return await self.app(scope, receive, send_with_headers)
        response = await limiter._refusal_app(request, result)
        await response(scope, receive, send_with_headers)

