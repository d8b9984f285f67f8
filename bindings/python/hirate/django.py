"""hirate for Django: a middleware, view decorators and HIRATE_* settings.

    # settings.py
    MIDDLEWARE = [..., "hirate.django.RateLimitMiddleware"]
    HIRATE_URL = "redis://127.0.0.1:6379"
    HIRATE_DEFAULT_LIMITS = "100/10s"

    # views.py
    from hirate.django import exempt, key_header, limit

    @limit("5/minute")                   # 5 at once, then one every 12 s
    def login(request): ...

    @limit("10/second; 1000/day", key=key_header("X-API-Key"))
    async def search(request): ...

    @exempt
    def health(request): ...

The middleware decides every limited request once its view is known
(process_view): the view's own limits, its URL namespaces' limits, or the
default limits. It runs in the mode Django gives it: under WSGI (sync) on
hirate.Limiter, under ASGI (async) on hirate.AsyncLimiter, so waiting for
Redis never blocks the event loop. Every response of a limited request
carries the RateLimit-Policy and RateLimit headers; a refusal is a 429 (503
when on_error="closed" refused because Redis is down) with Retry-After and a
problem+json body.
"""

import functools
import json
import threading

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings as _django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.http import HttpResponse
from django.utils.module_loading import import_string

from . import AsyncLimiter as _AsyncLimiter
from . import Limiter as _Limiter
from . import Stats as _Stats
from ._http import LIMITER_OPTIONS, SETTINGS, ClientIP, Limit, Result, charge_async
from ._http import charge_sync, charges, check_limits, check_scope, checks_of, client_buckets
from ._http import declare
from ._http import _check_cost, decide_async, decide_sync, ident_for_ip, ident_for_key
from ._http import identity, key_header, new_limiter, plan
from ._http import as_limits as _as_limits, as_list as _as_list, maybe_await as _maybe_await
from ._http import scope_part as _scope_part

__all__ = ["RateLimitMiddleware", "limit", "exempt", "Limit", "Result", "key_header",
           "get_result", "client_ip", "reset", "areset", "peek", "apeek", "stats", "health",
           "ahealth", "close", "aclose"]

# Setting -> (settings.py name, default): hirate._http's SETTINGS, as
# HIRATE_<NAME>, and Django's own.
_SETTINGS = {name: ("HIRATE_" + suffix, default) for name, (suffix, default) in SETTINGS.items()}
_SETTINGS.update({
    "namespace_limits": ("HIRATE_NAMESPACE_LIMITS", {}),
    "exempt_namespaces": ("HIRATE_EXEMPT_NAMESPACES", ()),
    "key": ("HIRATE_KEY", None),
    "on_refused": ("HIRATE_ON_REFUSED", None),
    "limiter_options": ("HIRATE_LIMITER_OPTIONS", {}),
})

# A view carries its limits in attributes, which functools.wraps (and
# method_decorator) copy to the decorators above it; so limit() works
# whichever side of @login_required it is written.
_ATTR_LIMITS = "_hirate_limits"
_ATTR_EXEMPT = "_hirate_exempt"
_ATTR_GUARD = "_hirate_guard"
# On the request: its Result, its charges after the response (deduct_when),
# and that the middleware saw it.
_REQ_RESULT = "_hirate_result"
_REQ_PENDING = "_hirate_pending"
_REQ_SEEN = "_hirate_seen"

_LISTS = ("RateLimit", "RateLimit-Policy")


def _callable_setting(value, setting):
    """A callable, or the dotted path of one (as MIDDLEWARE names classes)."""
    if value is None or callable(value):
        return value
    if isinstance(value, str):
        try:
            return import_string(value)
        except ImportError as e:
            raise ImproperlyConfigured("%s: %s" % (setting, e)) from None
    raise TypeError("%s must be a callable or its dotted path, got %s"
                    % (setting, type(value).__name__))


class _State:
    """What the settings say, and one hirate.Limiter (sync requests) and one
    hirate.AsyncLimiter (async requests) per distinct set of bands (a
    Group's), made at first use and shared by every thread; and the figures
    of those closed (retired), so that stats() never go back."""

    def __init__(self, settings):
        url = settings["url"] or None
        self.enabled = bool(settings["enabled"])
        self.headers = bool(settings["headers"])
        self.legacy_headers = bool(settings["legacy_headers"])
        if settings["body"] not in ("json", "text"):
            raise ValueError("HIRATE_BODY must be 'json' or 'text', got %r"
                             % (settings["body"],))
        self.body = settings["body"]
        self.key = _callable_setting(settings["key"], "HIRATE_KEY")
        self.on_refused = _callable_setting(settings["on_refused"], "HIRATE_ON_REFUSED")
        self.client_ip = ClientIP(_as_list(settings["trusted_proxies"], "HIRATE_TRUSTED_PROXIES"),
                                  settings["proxy_hops"], settings["forwarded_header"],
                                  settings["ipv6_subnet"])
        self.default_limits = _as_limits(settings["default_limits"], "HIRATE_DEFAULT_LIMITS")
        namespaces = settings["namespace_limits"]
        if not isinstance(namespaces, dict):
            raise TypeError("HIRATE_NAMESPACE_LIMITS must be a dict {namespace: limits}, got %s"
                            % type(namespaces).__name__)
        self.namespace_limits = {
            ns: _as_limits(limits, "namespace %r" % (ns,)) for ns, limits in namespaces.items()}
        self.exempt_namespaces = frozenset(_as_list(settings["exempt_namespaces"],
                                                    "HIRATE_EXEMPT_NAMESPACES"))
        both = self.exempt_namespaces.intersection(self.namespace_limits)
        if both:
            raise ValueError("namespace %r has limits: it cannot be exempt too" % min(both))
        extra = settings["limiter_options"]
        if not isinstance(extra, dict):
            raise TypeError("HIRATE_LIMITER_OPTIONS must be a dict of hirate.Limiter "
                            "arguments, got %s" % type(extra).__name__)
        self.options = {name: settings[name] for name in LIMITER_OPTIONS}
        taken = sorted(set(extra) & (set(self.options) | {
            "url", "capacity", "rate", "limits", "sentinel_username", "sentinel_password"}))
        if taken:
            raise ValueError("HIRATE_LIMITER_OPTIONS: %r has a setting or a limit of its own "
                             "(HIRATE_%s)" % (taken[0], taken[0].upper()))
        self.options.update(extra)
        # The sentinels' credentials, as the URL's password, stay out of
        # self.options (see below).
        sentinel = dict(sentinel_username=settings["sentinel_username"],
                        sentinel_password=settings["sentinel_password"])
        # The core checks the URL and every option, with messages naming the
        # problem: a bad setting fails when the middleware is made, not at a
        # request.
        probe = _Limiter(url, capacity=1, rate=1.0, **self.options, **sentinel)
        self.shown_url = probe.url  # the password replaced by ***
        probe.close()
        # The URL with its password, and the sentinels' password, are kept in
        # this closure only, out of reprs and of vars() dumps.
        self.new_limiter = lambda cls, bands: new_limiter(cls, url, bands, self.options,
                                                          sentinel)
        # Without Redis every decision is this process' memory, at once: one
        # hirate.Limiter for sync and async requests alike, so that both
        # spend the same buckets.
        self.in_memory = url is None
        self.limiters = {}     # {(class, bands): limiter}
        self.lock = threading.Lock()
        self.retired = _Stats.zero()

    def limiter(self, cls, bands):
        lim = self.limiters.get((cls, bands))
        if lim is None:
            with self.lock:
                lim = self.limiters.get((cls, bands))
                if lim is None:
                    lim = self.new_limiter(cls, bands)
                    self.limiters[(cls, bands)] = lim
        return lim

    def __repr__(self):
        return "<hirate.django state url=%r on_error=%r>" % (
            self.shown_url, self.options["on_error"])

    def _take(self):
        with self.lock:
            taken, self.limiters = self.limiters, {}
        return list(taken.values())

    def close(self):
        """Closes the Limiters; the AsyncLimiters are forgotten (their
        connections close with their event loops)."""
        for lim in self._take():
            if isinstance(lim, _Limiter):
                lim.close()
            with self.lock:
                self.retired += lim.stats()

    async def aclose(self):
        for lim in self._take():
            if isinstance(lim, _Limiter):
                lim.close()
            else:
                await lim.close()
            with self.lock:
                self.retired += lim.stats()

    def stats(self):
        with self.lock:
            return _Stats.sum([self.retired, *(lim.stats() for lim in self.limiters.values())])

    def health_limiter(self, cls):
        # Every limiter of the state has the same URL, so one check is every
        # node's; before the first request, a limiter of its own asks.
        cls = _Limiter if self.in_memory else cls
        with self.lock:
            lim = next((lim for (c, _), lim in self.limiters.items() if c is cls), None)
        return lim or self.limiter(cls, ((1, 1.0),))


_state = None
_state_lock = threading.Lock()


def _read_settings():
    settings = {}
    for name, (setting, default) in _SETTINGS.items():
        if hasattr(_django_settings, setting):
            settings[name] = getattr(_django_settings, setting)
        elif name == "url" and hasattr(_django_settings, "REDIS_URL"):
            settings[name] = _django_settings.REDIS_URL
        else:
            settings[name] = default
    return settings


def _get_state():
    global _state
    state = _state
    if state is None:
        with _state_lock:
            state = _state
            if state is None:
                state = _state = _State(_read_settings())
    return state


def _settings_changed(setting, **kwargs):
    # override_settings() in tests: the next request reads the settings
    # again; the figures so far stay in stats().
    global _state, _retired
    if not (setting.startswith("HIRATE_") or setting == "REDIS_URL"):
        return
    with _state_lock:
        old, _state = _state, None
    if old is not None:
        old.close()
        with _state_lock:
            _retired += old.stats()


_retired = _Stats.zero()   # the figures of the states replaced
setting_changed.connect(_settings_changed)


def stats():
    """hirate.Stats: the metrics of every limiter the middleware made (one
    per distinct set of limits, sync and async) added up, those closed
    included, so no figure goes back. Any thread may ask."""
    with _state_lock:
        retired, state = _retired, _state
    return retired if state is None else retired + state.stats()


def health():
    """hirate.Health: Limiter.check() of the Redis the middleware's limiters
    use (every node decisions go to: its role, whether the script is loaded,
    the round trip), for a readiness probe; without Redis, ok with no node.
    In an async view, await ahealth()."""
    return _get_state().health_limiter(_Limiter).check()


async def ahealth():
    """hirate.Health, as health(), over the async limiters' connections."""
    lim = _get_state().health_limiter(_AsyncLimiter)
    h = lim.check()
    return h if isinstance(lim, _Limiter) else await h


def close():
    """Closes the hirate Limiters (they are made again if another request
    comes); the AsyncLimiters are forgotten, their connections closing with
    their event loops (aclose() closes them now)."""
    if _state is not None:
        _state.close()


async def aclose():
    """Closes the hirate Limiters and AsyncLimiters now."""
    if _state is not None:
        await _state.aclose()


def get_result(request):
    """The hirate Result of a request (its limits' decisions), or None when
    no limit applied to it."""
    return getattr(request, _REQ_RESULT, None)


def client_ip(request):
    """The client's address as the proxy settings read it."""
    ip = _get_state().client_ip
    meta = "HTTP_" + ip.header.upper().replace("-", "_")
    value = request.META.get(meta)
    return ip.resolve(request.META.get("REMOTE_ADDR") or None, [value] if value else [])


# ---------------------------------------------------------------------------
# One client's buckets, outside a request


def _targets(state, target):
    """[(Limit, scope)] of a target: a view (its own limits, else the
    default limits it gets), a namespace of HIRATE_NAMESPACE_LIMITS, None
    for the default limits, or Limits with a scope of their own."""
    if target is None:
        return _default_limits(state)
    if isinstance(target, str):
        if target not in state.namespace_limits:
            raise ValueError("no namespace %r in HIRATE_NAMESPACE_LIMITS" % (target,))
        return _namespace_limits(state, target)
    limits = [target] if isinstance(target, Limit) else target
    if (isinstance(limits, (list, tuple)) and limits
            and all(isinstance(lim, Limit) for lim in limits)):
        if any(lim.scope is None for lim in limits):
            raise ValueError("a limit without a scope has a bucket per view: name the view "
                             "instead")
        return [(lim, lim.scope) for lim in limits]
    if callable(target) and not isinstance(target, type):
        limits, is_exempt, path = _marks(target)
        if limits:
            return _view_limits(limits, path)
        return [] if is_exempt else _default_limits(state)
    raise TypeError("a target is a view, a namespace, None (the default limits) or Limits "
                    "with a scope, got %r" % (target,))


def _client_calls(cls, target, key, address):
    state = _get_state()
    applied = _targets(state, target)
    ident = identity(state.client_ip, key, address)
    cls = _Limiter if state.in_memory else cls
    groups, calls = client_buckets(applied, state.key, ident,
                                   lambda bands: state.limiter(cls, bands))
    return groups, applied, calls


def reset(target, key=None, *, address=None):
    """Forgets one client's buckets of a view, a namespace or limits (they
    are full again): target is a view (as urls.py routes it), a namespace
    of HIRATE_NAMESPACE_LIMITS, None for the default limits, or Limits with
    a scope of their own; the client is key= (what the limit's key function
    returns for it) or address= (its address, for limits keyed by
    address). On hirate.Limiter; areset() is the coroutine, on
    hirate.AsyncLimiter."""
    for lim, bucket in _client_calls(_Limiter, target, key, address)[2]:
        lim.reset(bucket)


async def areset(target, key=None, *, address=None):
    """reset() for async code, on hirate.AsyncLimiter."""
    for lim, bucket in _client_calls(_AsyncLimiter, target, key, address)[2]:
        if isinstance(lim, _Limiter):
            lim.reset(bucket)
        else:
            await lim.reset(bucket)


def peek(target, key=None, *, address=None, cost=0):
    """A Result of one client's buckets of a view, a namespace or limits
    (target and client as for reset), spending nothing: each limit's
    Decision for cost (0: the bucket as it is). apeek() is the coroutine."""
    groups, applied, calls = _client_calls(_Limiter, target, key, address)
    decisions = [lim.peek(bucket, cost) for lim, bucket in calls]
    return Result(checks_of(groups, decisions, len(applied)))


async def apeek(target, key=None, *, address=None, cost=0):
    """peek() for async code, on hirate.AsyncLimiter."""
    groups, applied, calls = _client_calls(_AsyncLimiter, target, key, address)
    decisions = []
    for lim, bucket in calls:
        d = lim.peek(bucket, cost)
        decisions.append(d if isinstance(lim, _Limiter) else await d)
    return Result(checks_of(groups, decisions, len(applied)))


# ---------------------------------------------------------------------------
# Decorators


def _view_name(view):
    return getattr(view, "__qualname__", None) or getattr(view, "__name__", None) or repr(view)


def _guarded(view):
    """The view, wrapped (once) so that it refuses to run without the
    middleware: limits that nobody checks must not pass silently (unless
    HIRATE_ENABLED is False: then a view may be called as it is, e.g. with
    RequestFactory)."""
    if getattr(view, _ATTR_GUARD, False):
        return view

    def check(args):
        request = args[0] if args else None
        if (hasattr(request, "META") and not getattr(request, _REQ_SEEN, False)
                and _get_state().enabled):
            raise ImproperlyConfigured(
                "view %r has hirate limits, and hirate.django.RateLimitMiddleware did not see "
                "this request: add it to MIDDLEWARE" % _view_name(view))

    if iscoroutinefunction(view):
        @functools.wraps(view)
        async def wrapper(*args, **kwargs):
            check(args)
            return await view(*args, **kwargs)
    else:
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            check(args)
            return view(*args, **kwargs)
    setattr(wrapper, _ATTR_GUARD, True)
    return wrapper


def limit(capacity, rate=None, *, key=None, cost=1, scope=None, name=None, exempt_when=None,
          methods=None, deduct_when=None):
    """A decorator that adds a limit to a view: limit(capacity, rate, ...),
    or a limit string, limit("5/minute") or several, limit("10/second;
    1000/day") (see Limit for the other arguments). Stacked limits must all
    pass; a refusal spends nothing on the others. scope=None gives the view
    a bucket of its own. methods limits only requests of those HTTP
    methods; deduct_when(response) charges only the responses it returns
    True for (checked before the view, charged after). A class-based view
    is limited through View.as_view() or method_decorator(limit(...),
    name="dispatch")."""
    new = declare(capacity, rate, key=key, cost=cost, scope=scope, name=name,
                  exempt_when=exempt_when, methods=methods, deduct_when=deduct_when)
    # method_decorator applies the decorator again at every request (to the
    # bound dispatch): the limits alone are checked once.
    alone = []

    def decorator(view):
        if isinstance(view, type):
            raise TypeError("limit() decorates a view function, not the class %s: decorate "
                            "%s.as_view(), or its dispatch with method_decorator"
                            % (view.__name__, view.__name__))
        if not callable(view):
            raise TypeError("limit() decorates a view function, not %s" % type(view).__name__)
        where = "view %r" % _view_name(view)
        if getattr(view, _ATTR_EXEMPT, False):
            raise ValueError("%s is exempt: it cannot have limits too" % where)
        # Decorators run bottom-up: putting this one first keeps the limits
        # in the order they are written.
        below = list(getattr(view, _ATTR_LIMITS, ()))
        if below:
            limits = check_limits(new + below, where)
        else:
            if not alone:
                alone.append(check_limits(new, where))
            limits = alone[0]
        wrapper = _guarded(view)
        setattr(wrapper, _ATTR_LIMITS, limits)
        return wrapper

    return decorator


def exempt(view):
    """A decorator: the view gets no default limits."""
    if getattr(view, _ATTR_LIMITS, None):
        raise ValueError("view %r has limits: it cannot be exempt too" % _view_name(view))
    setattr(view, _ATTR_EXEMPT, True)
    return view


# ---------------------------------------------------------------------------
# The middleware


def _marks(view_func):
    """(limits, exempt, the view's dotted path) of a resolved view; a
    class-based view's are on its dispatch (method_decorator)."""
    cls = getattr(view_func, "view_class", None)
    holders = [view_func] + ([getattr(cls, "dispatch", None)] if cls is not None else [])
    limits = next((getattr(h, _ATTR_LIMITS) for h in holders
                   if getattr(h, _ATTR_LIMITS, None)), ())
    is_exempt = any(getattr(h, _ATTR_EXEMPT, False) for h in holders)
    named = cls if cls is not None else view_func
    if isinstance(named, functools.partial):
        named = named.func
    path = "%s.%s" % (getattr(named, "__module__", "?"), _view_name(named))
    return limits, is_exempt, path


def _view_limits(limits, path):
    return [(lim, lim.scope or check_scope("view:" + _scope_part(path), "view scope"))
            for lim in limits]


def _namespace_limits(state, ns):
    return [(lim, lim.scope or check_scope("ns:" + _scope_part(ns), "namespace scope"))
            for lim in state.namespace_limits.get(ns, ())]


def _default_limits(state):
    return [(lim, lim.scope or "app") for lim in state.default_limits]


def _applied(state, request, view_func):
    """[(Limit, scope)] for a request, each scope checked."""
    limits, is_exempt, path = _marks(view_func)
    found = _view_limits(limits, path)
    match = getattr(request, "resolver_match", None)
    namespaces = match.namespaces if match is not None else []
    for i in range(len(namespaces)):
        ns = ":".join(namespaces[:i + 1])
        found += _namespace_limits(state, ns)
        is_exempt = is_exempt or ns in state.exempt_namespaces
    if not found and not is_exempt:
        found = _default_limits(state)
    return [(lim, scope) for lim, scope in found if lim.applies_to(request.method)]


def _refusal(state, result):
    if state.body == "json":
        return HttpResponse(json.dumps(result.problem()), status=result.status,
                            content_type="application/problem+json")
    return HttpResponse(result.text(), status=result.status,
                        content_type="text/plain; charset=utf-8")


def _add_headers(state, result, response):
    for name, value in result.headers(state.headers, state.legacy_headers):
        have = response.get(name)
        if have is None:
            response[name] = value
        elif name in _LISTS and have != value:
            # Lists: the items already there (a view's, a proxy's) stay.
            response[name] = have + ", " + value
        # Other headers already there (an on_refused hook's) win.
    return response


class RateLimitMiddleware:
    """The middleware: "hirate.django.RateLimitMiddleware" in MIDDLEWARE,
    after any middleware that a key function relies on (e.g.
    AuthenticationMiddleware for request.user). It reads the HIRATE_*
    settings when it is made (a bad one raises then) and again after
    override_settings()."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        _get_state()
        # Django calls process_view in the handler's mode, and this
        # middleware in its own (the same, unless a sync-only middleware
        # sits below it under ASGI: then Django runs both in a thread).
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)
            self.process_view = self._process_view_async

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self.__acall__(request)
        response = self.get_response(request)
        pending = getattr(request, _REQ_PENDING, None)
        if pending is not None:
            # The limits with deduct_when: charged now, for this response;
            # the headers (and get_result) say what is left after it.
            calls, decided, decisions, n = pending
            decisions = charge_sync(calls, decisions, response)
            setattr(request, _REQ_RESULT, Result(checks_of(decided, decisions, n)))
        return self._finish(request, response)

    async def __acall__(self, request):
        response = await self.get_response(request)
        pending = getattr(request, _REQ_PENDING, None)
        if pending is not None:
            calls, decided, decisions, n = pending
            if _get_state().in_memory:
                decisions = charge_sync(calls, decisions, response)
            else:
                decisions = await charge_async(calls, decisions, response)
            setattr(request, _REQ_RESULT, Result(checks_of(decided, decisions, n)))
        return self._finish(request, response)

    def _finish(self, request, response):
        result = getattr(request, _REQ_RESULT, None)
        if result is None:
            return response
        return _add_headers(_get_state(), result, response)

    def _decided(self, request, state, decided, calls, decisions, n):
        """The refusal of a decided request, or None to go on."""
        result = Result(checks_of(decided, decisions, n))
        setattr(request, _REQ_RESULT, result)
        pending = charges(decided, calls)
        if pending and result.allowed:
            setattr(request, _REQ_PENDING, (pending, decided, decisions, n))
        return result

    def _start(self, request, view_func):
        """(state, applied) for a request whose limits are to be decided,
        else None."""
        request_seen = getattr(request, _REQ_SEEN, False)
        setattr(request, _REQ_SEEN, True)
        if request_seen:
            return None  # the middleware twice in MIDDLEWARE: one decision
        state = _get_state()
        if not state.enabled:
            return None
        applied = _applied(state, request, view_func)
        return (state, applied) if applied else None

    def process_view(self, request, view_func, view_args, view_kwargs):
        """Decides the request's limits (on hirate.Limiter; an instance
        made for async requests decides on hirate.AsyncLimiter): None to go
        on, or the refusal."""
        started = self._start(request, view_func)
        if started is None:
            return None
        state, applied = started
        address = None
        decided, calls = [], []
        for group in plan(applied, state.key):
            if group.exempt_when is not None and group.exempt_when(request):
                continue
            value = group.keyfunc(request) if group.keyfunc is not None else None
            if value is None:
                if address is None:
                    address = state.client_ip.key(client_ip(request)) or "unknown"
                ident = ident_for_ip(address)
            else:
                ident = ident_for_key(value)
            decided.append(group)
            calls.append((state.limiter(_Limiter, group.bands), group.bucket_key(ident),
                          group.cost_for(request), group.deduct_when is None))
        if not calls:
            return None
        result = self._decided(request, state, decided, calls, decide_sync(calls),
                               len(applied))
        if result.allowed:
            return None
        if state.on_refused is not None:
            return state.on_refused(request, result)
        return _refusal(state, result)

    async def _process_view_async(self, request, view_func, view_args, view_kwargs):
        started = self._start(request, view_func)
        if started is None:
            return None
        state, applied = started
        address = None
        decided, calls = [], []
        for group in plan(applied, state.key):
            if group.exempt_when is not None and await _maybe_await(
                    group.exempt_when(request)):
                continue
            keyfunc = group.keyfunc
            value = await _maybe_await(keyfunc(request)) if keyfunc is not None else None
            if value is None:
                if address is None:
                    address = state.client_ip.key(client_ip(request)) or "unknown"
                ident = ident_for_ip(address)
            else:
                ident = ident_for_key(value)
            cost = group.limits[0].cost
            if callable(cost):
                cost = _check_cost(await _maybe_await(cost(request)))
            decided.append(group)
            calls.append((state.limiter(_Limiter if state.in_memory else _AsyncLimiter,
                                        group.bands), group.bucket_key(ident), cost,
                          group.deduct_when is None))
        if not calls:
            return None
        decisions = decide_sync(calls) if state.in_memory else await decide_async(calls)
        result = self._decided(request, state, decided, calls, decisions, len(applied))
        if result.allowed:
            return None
        if state.on_refused is not None:
            return await _maybe_await(state.on_refused(request, result))
        return _refusal(state, result)
