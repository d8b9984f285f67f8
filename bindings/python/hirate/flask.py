"""hirate for Flask: rate limits on routes, blueprints and the whole app.

    from flask import Flask
    from hirate.flask import RateLimiter, Limit, key_header

    app = Flask(__name__)
    app.config["HIRATE_URL"] = "redis://127.0.0.1:6379"
    limiter = RateLimiter(app, default_limits="100/10s")

    @app.post("/login")
    @limiter.limit("5/minute")           # 5 at once, then one every 12 s
    def login(): ...

    @app.get("/search")
    @limiter.limit("10/second; 1000/day", key=key_header("X-API-Key"))
    def search(): ...

Every response of a limited request carries the RateLimit-Policy and
RateLimit headers; a refusal is a 429 (503 when on_error="closed" refused
because Redis is down) with Retry-After and a problem+json body. The buckets
live in Redis when a URL is configured, shared by every worker and machine.
"""

import json
import threading
import weakref

from flask import Blueprint, current_app, request

from . import Limiter as _Limiter
from . import Stats as _Stats
from ._http import LIMITER_OPTIONS, SETTINGS, ClientIP, Limit, Result, charge_sync, charges
from ._http import check_limits, check_scope, checks_of, client_buckets, decide_sync, declare
from ._http import ident_for_ip, ident_for_key, identity, key_header, plan, refund_sync
from ._http import new_limiter as _new_limiter
from ._http import as_limits as _as_limits, as_list as _as_list, scope_part as _scope_part

__all__ = ["RateLimiter", "Limit", "Result", "key_header", "current_result"]

_UNSET = object()

# Constructor argument -> (app.config key, default): hirate._http's
# SETTINGS, as HIRATE_<NAME>. An argument given to the constructor wins over
# app.config, which wins over the default.
_SETTINGS = {name: ("HIRATE_" + suffix, default) for name, (suffix, default) in SETTINGS.items()}

# A view function carries its limits in an attribute, {RateLimiter: [Limit]},
# which functools.wraps copies to the decorators above it; so a limit works
# whichever side of @app.route (or of @login_required ...) it is written.
_ATTR_LIMITS = "_hirate_limits"
_ATTR_EXEMPT = "_hirate_exempt"     # {RateLimiter: True}


def _mark(obj, attr):
    marks = getattr(obj, attr, None)
    if marks is None:
        marks = {}
        setattr(obj, attr, marks)
    return marks


def current_result():
    """The hirate Result of the current request (its limits' decisions), or
    None when no limit applied to it."""
    results = request.environ.get("hirate.results")
    return results[-1][1] if results else None


class _app_context:
    """app.app_context() when an app is given, else nothing (the current
    one is used)."""

    def __init__(self, app):
        self.ctx = app.app_context() if app is not None else None

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.push()

    def __exit__(self, *exc):
        if self.ctx is not None:
            self.ctx.pop()


def _route_scope(lim, scope):
    return lim.scope if lim.scope is not None else check_scope(scope, "route scope")


class _AppState:
    """What one app uses: its settings, and one hirate.Limiter per distinct
    set of bands (a Group's), made at its first request and shared by all
    threads; and the figures of those it closed (retired), so that its
    stats() never go back."""

    def __init__(self, settings):
        url = settings["url"] or None
        self.enabled = bool(settings["enabled"])
        self.headers = bool(settings["headers"])
        self.legacy_headers = bool(settings["legacy_headers"])
        if settings["body"] not in ("json", "text"):
            raise ValueError("body must be 'json' or 'text', got %r" % (settings["body"],))
        self.body = settings["body"]
        self.client_ip = ClientIP(_as_list(settings["trusted_proxies"], "trusted_proxies"),
                                  settings["proxy_hops"], settings["forwarded_header"],
                                  settings["ipv6_subnet"])
        self.default_limits = _as_limits(settings["default_limits"], "default_limits")
        self.options = {name: settings[name] for name in LIMITER_OPTIONS}
        # The sentinels' credentials, as the URL's password, stay out of
        # self.options (see below).
        sentinel = dict(sentinel_username=settings["sentinel_username"],
                        sentinel_password=settings["sentinel_password"])
        # The core checks the URL and every option, with messages naming the
        # problem: a bad setting fails here, at startup, not at a request.
        probe = _Limiter(url, capacity=1, rate=1.0, **self.options, **sentinel)
        self.shown_url = probe.url  # the password replaced by ***
        probe.close()
        # The URL with its password, and the sentinels' password, are kept in
        # this closure only, out of reprs and of vars() dumps.
        self.new_limiter = lambda bands: _new_limiter(_Limiter, url, bands, self.options,
                                                      sentinel)
        self.limiters = {}
        self.lock = threading.Lock()
        self.retired = _Stats.zero()

    def limiter(self, bands):
        lim = self.limiters.get(bands)
        if lim is None:
            with self.lock:
                lim = self.limiters.get(bands)
                if lim is None:
                    lim = self.new_limiter(bands)
                    self.limiters[bands] = lim
        return lim

    def __repr__(self):
        return "<hirate.flask app state url=%r on_error=%r>" % (
            self.shown_url, self.options["on_error"])

    def close(self):
        with self.lock:
            for lim in self.limiters.values():
                lim.close()
                self.retired += lim.stats()
            self.limiters.clear()

    def stats(self):
        with self.lock:
            return _Stats.sum([self.retired, *(lim.stats() for lim in self.limiters.values())])

    def health(self):
        # Every limiter of the app has the same URL, so one check is every
        # node's; before the first request, a limiter of its own asks.
        lim = next(iter(list(self.limiters.values())), None) or self.limiter(((1, 1.0),))
        return lim.check()


class RateLimiter:
    """The Flask extension. Give it the app now or later (init_app, for app
    factories); each setting comes from the argument, else from app.config,
    else its default:

    url              HIRATE_URL, else REDIS_URL; None: in memory (each
                     process has its own buckets)
    default_limits   HIRATE_DEFAULT_LIMITS: a limit string ("100/hour;
                     10/second"), or a list of Limits, limit strings and
                     (capacity, rate) pairs, for every route that has no
                     limit of its own and is not exempt; by default one
                     budget per client across all of them (scope "app")
    key              callable(request) -> str | bytes | int | None: the
                     default identity of a client; None (default) is its
                     address
    on_error         HIRATE_ON_ERROR: "local" (default), "open" or "closed":
                     what decides while Redis is down
    headers          HIRATE_HEADERS: send RateLimit-Policy and RateLimit (True)
    legacy_headers   HIRATE_LEGACY_HEADERS: also X-RateLimit-Limit,
                     -Remaining and -Reset (False)
    trusted_proxies  HIRATE_TRUSTED_PROXIES: networks whose X-Forwarded-For
                     is believed (a list, or a comma-separated string)
    proxy_hops       HIRATE_PROXY_HOPS: proxies in front of the app (0)
    forwarded_header HIRATE_FORWARDED_HEADER: "X-Forwarded-For" or "Forwarded"
    ipv6_subnet      HIRATE_IPV6_SUBNET: IPv6 clients share a bucket per
                     network of this prefix length (64)
    prefix, instances, connect_timeout, timeout, sentinel_username,
    sentinel_password, functions, deny_cache, deny_cache_max, max_keys,
    pool_size
                     HIRATE_PREFIX ... HIRATE_SENTINEL_USERNAME,
                     HIRATE_SENTINEL_PASSWORD, HIRATE_FUNCTIONS,
                     HIRATE_DENY_CACHE, HIRATE_DENY_CACHE_MAX, HIRATE_MAX_KEYS,
                     HIRATE_POOL_SIZE: passed to every hirate.Limiter
    body             HIRATE_BODY: "json" (problem+json, default) or "text"
    on_refused       callable(request, result) returning the refusal's
                     response (any value a view may return); the rate-limit
                     headers and Retry-After are added unless it set them
    enabled          HIRATE_ENABLED: False turns every limit off
    """

    def __init__(self, app=None, *, url=_UNSET, default_limits=_UNSET, key=None,
                 on_error=_UNSET, headers=_UNSET, legacy_headers=_UNSET,
                 trusted_proxies=_UNSET, proxy_hops=_UNSET, forwarded_header=_UNSET,
                 ipv6_subnet=_UNSET, prefix=_UNSET, instances=_UNSET,
                 connect_timeout=_UNSET, timeout=_UNSET, body=_UNSET, on_refused=None,
                 enabled=_UNSET, sentinel_username=_UNSET, sentinel_password=_UNSET,
                 functions=_UNSET, deny_cache=_UNSET, deny_cache_max=_UNSET,
                 max_keys=_UNSET, pool_size=_UNSET):
        given = dict(url=url, default_limits=default_limits, on_error=on_error,
                     headers=headers, legacy_headers=legacy_headers,
                     trusted_proxies=trusted_proxies, proxy_hops=proxy_hops,
                     forwarded_header=forwarded_header, ipv6_subnet=ipv6_subnet,
                     prefix=prefix, instances=instances, connect_timeout=connect_timeout,
                     timeout=timeout, body=body, enabled=enabled,
                     sentinel_username=sentinel_username,
                     sentinel_password=sentinel_password, functions=functions,
                     deny_cache=deny_cache, deny_cache_max=deny_cache_max,
                     max_keys=max_keys, pool_size=pool_size)
        self._given = {k: v for k, v in given.items() if v is not _UNSET}
        if "default_limits" in self._given:
            # Checked now, so that a wrong limit fails where it is written.
            _as_limits(self._given["default_limits"], "default_limits")
        if key is not None and not callable(key):
            raise TypeError("key must be a callable(request) or None, got %s"
                            % type(key).__name__)
        if on_refused is not None and not callable(on_refused):
            raise TypeError("on_refused must be a callable(request, result), got %s"
                            % type(on_refused).__name__)
        self.key = key
        self.on_refused = on_refused
        self._apps = weakref.WeakSet()   # those set up, for stats()
        self._blueprint_limits = {}
        self._blueprint_exempt = set()
        if app is not None:
            self.init_app(app)

    # -- setup

    def init_app(self, app):
        settings = {}
        for name, (config_key, default) in _SETTINGS.items():
            if name in self._given:
                settings[name] = self._given[name]
            elif config_key in app.config:
                settings[name] = app.config[config_key]
            elif name == "url" and "REDIS_URL" in app.config:
                settings[name] = app.config["REDIS_URL"]
            else:
                settings[name] = default
        states = app.extensions.setdefault("hirate", {})
        old = states.get(self)
        states[self] = new = _AppState(settings)
        self._apps.add(app)
        if old is not None:
            old.close()  # set up again: new settings, the same hooks
            new.retired = old.stats()
            return
        app.before_request(self._before_request)
        app.after_request(self._after_request)

    def _state(self, app=None):
        state = (app or current_app).extensions.get("hirate", {}).get(self)
        if state is None:
            raise RuntimeError("this hirate RateLimiter is not set up on the app: "
                               "call init_app(app) first")
        return state

    def close(self, app=None):
        """Closes the app's hirate Limiters (they are made again if another
        request comes). Without an app, the current app's."""
        self._state(app).close()

    def stats(self, app=None):
        """hirate.Stats: the metrics of the app's hirate Limiters (one per
        distinct set of limits) added up, those closed by close() included,
        so no figure goes back. Without an app, of every app this
        RateLimiter is set up on (usually one); that needs no app context,
        so a metrics thread may ask."""
        if app is not None:
            return self._state(app).stats()
        states = [a.extensions.get("hirate", {}).get(self) for a in list(self._apps)]
        return _Stats.sum(state.stats() for state in states if state is not None)

    def health(self, app=None):
        """hirate.Health: Limiter.check() of the app's Redis (every node
        decisions go to: its role, whether the script is loaded, the round
        trip), for a readiness probe; without Redis, ok with no node. Without
        an app, of the current app."""
        return self._state(app).health()

    # -- decorators

    def limit(self, capacity, rate=None, *, key=None, cost=1, scope=None, name=None,
              exempt_when=None, methods=None, deduct_when=None):
        """A decorator that adds a limit to a view function or a Blueprint:
        limit(capacity, rate, ...), or a limit string, limit("5/minute") or
        several, limit("10/second; 1000/day") (see Limit for the other
        arguments). Stacked limits must all pass; a refusal spends nothing
        on the others. A limit on a view function may go above or below
        @app.route. scope=None gives the route (or the blueprint, all of its
        routes together) a bucket of its own. methods limits only requests
        of those HTTP methods; deduct_when(response) charges only the
        responses it returns True for (checked before the view, charged
        after)."""
        new = declare(capacity, rate, key=key, cost=cost, scope=scope, name=name,
                      exempt_when=exempt_when, methods=methods, deduct_when=deduct_when)

        def decorator(obj):
            if isinstance(obj, Blueprint):
                where = "blueprint %r" % obj.name
                if obj.name in self._blueprint_exempt:
                    raise ValueError("%s is exempt: it cannot have limits too" % where)
                limits = new + self._blueprint_limits.get(obj.name, [])
                self._blueprint_limits[obj.name] = check_limits(limits, where)
                return obj
            if not callable(obj):
                raise TypeError("limit() decorates a view function or a Blueprint, not %s"
                                % type(obj).__name__)
            where = "view %r" % getattr(obj, "__name__", obj)
            if self in getattr(obj, _ATTR_EXEMPT, ()):
                raise ValueError("%s is exempt: it cannot have limits too" % where)
            marks = _mark(obj, _ATTR_LIMITS)
            # Decorators run bottom-up: putting this one first keeps the
            # limits in the order they are written.
            marks[self] = check_limits(new + marks.get(self, []), where)
            return obj

        return decorator

    def exempt(self, obj):
        """A decorator: the view function (or every route of the Blueprint)
        gets no default limits."""
        if isinstance(obj, Blueprint):
            if obj.name in self._blueprint_limits:
                raise ValueError("blueprint %r has limits: it cannot be exempt too"
                                 % obj.name)
            self._blueprint_exempt.add(obj.name)
            return obj
        if getattr(obj, _ATTR_LIMITS, {}).get(self):
            raise ValueError("view %r has limits: it cannot be exempt too"
                             % getattr(obj, "__name__", obj))
        _mark(obj, _ATTR_EXEMPT)[self] = True
        return obj

    # -- the client

    def client_ip(self, req=None):
        """The client's address as the app's proxy settings read it."""
        req = req if req is not None else request
        state = self._state()
        header = state.client_ip.header
        return state.client_ip.resolve(req.remote_addr, req.headers.getlist(header))

    # -- per request

    def _limits_of(self, state, endpoint, method=None):
        """[(Limit, scope)] of an endpoint (for a request of method, or of
        any method when None), each scope checked."""
        view = current_app.view_functions.get(endpoint)
        found = [(lim, _route_scope(lim, "ep:" + _scope_part(endpoint)))
                 for lim in getattr(view, _ATTR_LIMITS, {}).get(self, ())]
        exempt = self in getattr(view, _ATTR_EXEMPT, ())
        # The blueprints of the endpoint, innermost first, as
        # request.blueprints names them: "parent.child", then "parent".
        bp = endpoint.rpartition(".")[0]
        while bp:
            # A nested blueprint is registered as "parent.child"; its own
            # name (which cannot hold a dot) is the last part.
            own = bp.rpartition(".")[2]
            found += [(lim, _route_scope(lim, "bp:" + _scope_part(bp)))
                      for lim in self._blueprint_limits.get(own, ())]
            exempt = exempt or own in self._blueprint_exempt
            bp = bp.rpartition(".")[0]
        if not found and not exempt and endpoint != "static":
            found = [(lim, lim.scope or "app") for lim in state.default_limits]
        if method is not None:
            found = [(lim, scope) for lim, scope in found if lim.applies_to(method)]
        return found

    def _limits_for(self, state):
        """[(Limit, scope)] for the current request."""
        endpoint = request.endpoint
        if endpoint is None:
            return []  # no route matched: 404 or 405 answer without the view
        return self._limits_of(state, endpoint, request.method)

    def _before_request(self):
        state = self._state()
        if not state.enabled:
            return None
        applied = self._limits_for(state)
        if not applied:
            return None
        address = None
        decided, calls = [], []
        for group in plan(applied, self.key):
            if group.exempt_when is not None and group.exempt_when(request):
                continue
            value = group.keyfunc(request) if group.keyfunc is not None else None
            if value is None:
                if address is None:
                    address = state.client_ip.key(self.client_ip()) or "unknown"
                ident = ident_for_ip(address)
            else:
                ident = ident_for_key(value)
            decided.append(group)
            calls.append((state.limiter(group.bands), group.bucket_key(ident),
                          group.cost_for(request), group.deduct_when is None))
        if not calls:
            return None
        decisions = decide_sync(calls)
        result = Result(checks_of(decided, decisions, len(applied)))
        # The request's own environ, not g: an app context can outlive a
        # request (tests hold one around several).
        request.environ.setdefault("hirate.results", []).append((self, result))
        pending = charges(decided, calls)
        if pending and result.allowed:
            # Charged in _after_request, when the response is known.
            request.environ.setdefault("hirate.pending", []).append(
                (self, pending, decided, decisions, len(applied)))
        if result.allowed:
            return None
        if self.on_refused is not None:
            return current_app.make_response(self.on_refused(request, result))
        if state.body == "json":
            return current_app.response_class(
                json.dumps(result.problem()), status=result.status,
                mimetype="application/problem+json")
        return current_app.response_class(result.text(), status=result.status,
                                          mimetype="text/plain")

    # -- one client's buckets, outside a request

    def _targets(self, state, target):
        """[(Limit, scope)] of a target: an endpoint name ("login",
        "api.search"), a view function, or Limits with a scope of their
        own."""
        if isinstance(target, str):
            if target not in current_app.view_functions:
                raise ValueError("no endpoint %r in the app" % target)
            return self._limits_of(state, target)
        if isinstance(target, Limit) or (isinstance(target, (list, tuple)) and target
                                         and all(isinstance(t, Limit) for t in target)):
            limits = [target] if isinstance(target, Limit) else list(target)
            if any(lim.scope is None for lim in limits):
                raise ValueError("a Limit without a scope has a bucket per route: name the "
                                 "route's endpoint instead")
            return [(lim, lim.scope) for lim in limits]
        if callable(target):
            endpoints = [ep for ep, view in current_app.view_functions.items()
                         if view is target]
            if not endpoints:
                raise ValueError("view %r is not a route of the app"
                                 % getattr(target, "__name__", target))
            return [pair for ep in endpoints for pair in self._limits_of(state, ep)]
        raise TypeError("a target is an endpoint name, a view function or a Limit with a "
                        "scope, got %r" % (target,))

    def _client_calls(self, target, key, address, app):
        state = self._state(app)
        applied = self._targets(state, target)
        ident = identity(state.client_ip, key, address)
        groups, calls = client_buckets(applied, self.key, ident, state.limiter)
        return groups, applied, calls

    def reset(self, target, key=None, *, address=None, app=None):
        """Forgets one client's buckets of a route or limit (they are full
        again): target is an endpoint name ("login"), a view function, or a
        Limit with a scope of its own; the client is key= (what the limit's
        key function returns for it) or address= (its address, for limits
        keyed by address). Needs an app context (or app=)."""
        with _app_context(app):
            for lim, bucket in self._client_calls(target, key, address, app)[2]:
                lim.reset(bucket)

    def refund(self, target, key=None, *, address=None, tokens=1, app=None):
        """Gives tokens back to one client's buckets of a route or limit
        (target and client as for reset), e.g. after the work the request
        paid for failed: every limit's bucket, each capped at its capacity.
        A Result of the buckets after. A request refused between the spend
        and the refund stays refused (docs/semantics.md, "Refunds")."""
        with _app_context(app):
            groups, applied, calls = self._client_calls(target, key, address, app)
            return Result(checks_of(groups, refund_sync(calls, tokens), len(applied)))

    def peek(self, target, key=None, *, address=None, cost=0, app=None):
        """A Result of one client's buckets of a route or limit (target and
        client as for reset), spending nothing: each limit's Decision for
        cost (0: the bucket as it is)."""
        with _app_context(app):
            groups, applied, calls = self._client_calls(target, key, address, app)
            decisions = [lim.peek(bucket, cost) for lim, bucket in calls]
            return Result(checks_of(groups, decisions, len(applied)))

    def _after_request(self, response):
        mine = [r for ext, r in request.environ.get("hirate.results", ()) if ext is self]
        if not mine:
            return response
        state = self._state()
        for ext, pending, decided, decisions, n in request.environ.get("hirate.pending", ()):
            if ext is self:
                # The limits with deduct_when: charged now, for this response;
                # the headers (and current_result) say what is left after it.
                mine[0] = Result(checks_of(decided, charge_sync(pending, decisions, response),
                                           n))
                results = request.environ["hirate.results"]
                for i, (owner, _) in enumerate(results):
                    if owner is self:
                        results[i] = (self, mine[0])
                        break
        for name, value in mine[0].headers(state.headers, state.legacy_headers):
            have = response.headers.getlist(name)
            if value in have:
                continue
            if name in ("RateLimit", "RateLimit-Policy"):
                # Lists that may be split over several fields: the items of
                # other limiters (another RateLimiter, a proxy) stay.
                response.headers.add(name, value)
            elif not have:  # an on_refused hook's own value wins
                response.headers[name] = value
        return response
