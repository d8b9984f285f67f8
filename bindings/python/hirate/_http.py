"""What hirate.flask and hirate.asgi share: limits, bucket keys, the client's
address behind proxies, and the rate-limit response headers.

Nothing here does I/O or imports a web framework; both integrations turn a
request into a peer address and header values, ask their limiters, and hand
the decisions to a Result, which knows the headers and the refusal body.
"""

import asyncio
import inspect
import numbers

from . import _hirate
from ._hirate import bucket_key as _bucket, ident_for_ip as _ident_for_ip
from ._hirate import ident_for_key as _ident_for_key

# The core's defaults: the settings below show them, and restate none.
_D = _hirate.DEFAULTS

__all__ = ["Limit", "Result", "ClientIP", "key_header", "refill_seconds"]

METHODS = frozenset(["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE",
                     "CONNECT"])

# From hirate.h: a key is at most HIRATE_KEY_MAX bytes.
KEY_MAX = _hirate.KEY_MAX
# A scope is written into every key, before the client's identity; keeping it
# short leaves the identity room enough not to need hashing.
SCOPE_MAX = 200

_SCOPE_SEP = "|"


# ---------------------------------------------------------------------------
# Settings
#
# What the integrations are configured with, by name: (the suffix of the
# config key or environment variable, HIRATE_<suffix>, and the default).
# Flask reads app.config, hirate.asgi the environment (RateLimiter.from_env),
# each from this one table.

SETTINGS = {
    "url": ("URL", None),
    "default_limits": ("DEFAULT_LIMITS", ()),
    "on_error": ("ON_ERROR", _D["on_error"]),
    "headers": ("HEADERS", True),
    "legacy_headers": ("LEGACY_HEADERS", False),
    "trusted_proxies": ("TRUSTED_PROXIES", ()),
    "proxy_hops": ("PROXY_HOPS", 0),
    "forwarded_header": ("FORWARDED_HEADER", _D["forwarded_header"]),
    "ipv6_subnet": ("IPV6_SUBNET", _D["ipv6_subnet"]),
    "prefix": ("PREFIX", _D["prefix"]),
    "instances": ("INSTANCES", _D["instances"]),
    "connect_timeout": ("CONNECT_TIMEOUT", _D["connect_timeout"]),
    "timeout": ("TIMEOUT", _D["timeout"]),
    "sentinel_username": ("SENTINEL_USERNAME", None),
    "sentinel_password": ("SENTINEL_PASSWORD", None),
    "functions": ("FUNCTIONS", _D["functions"]),
    "deny_cache": ("DENY_CACHE", _D["deny_cache"]),
    "deny_cache_max": ("DENY_CACHE_MAX", _D["deny_cache_max"]),
    "max_keys": ("MAX_KEYS", _D["max_keys"]),
    "pool_size": ("POOL_SIZE", _D["pool_size"]),
    "body": ("BODY", "json"),
    "enabled": ("ENABLED", True),
}

# The settings every hirate Limiter of an integration is made with.
LIMITER_OPTIONS = ("prefix", "on_error", "instances", "connect_timeout", "timeout",
                   "functions", "deny_cache", "deny_cache_max", "max_keys", "pool_size")


def env_value(text):
    """An environment variable's value as a setting: JSON when it parses
    (true, 5, 0.5, ["10.0.0.0/8"], {"/login": "5/minute"}), else the string
    itself ("redis://...", "5/minute"), as Flask's from_prefixed_env reads
    them."""
    import json
    try:
        return json.loads(text)
    except ValueError:
        return text


def from_environ(environ, prefix, names):
    """{name: value} of the settings among names whose variable,
    prefix + suffix, is set in environ."""
    out = {}
    for name in names:
        suffix = SETTINGS[name][0] if name in SETTINGS else name.upper()
        if prefix + suffix in environ:
            out[name] = env_value(environ[prefix + suffix])
    return out


# ---------------------------------------------------------------------------
# Limits


def _core_limit(capacity, rate):
    """(capacity, rate, default name, w) as the core has them: a whole float
    capacity is an int, the numbers are checked by the core itself (a bad
    limit fails where it is declared, with hirate.Limiter's very class and
    message, not at its first request), and the name is the core's default,
    "<capacity>-per-<w>s", w being hirate_refill_seconds(capacity, rate):
    the "w" of RateLimit-Policy."""
    probe = _hirate.Limiter(capacity=capacity, rate=rate)
    capacity, rate = probe.capacity, probe.rate
    name = probe.bands[0].name
    probe.close()
    return capacity, rate, name, _hirate.refill_seconds(capacity, rate)


def _core_name(capacity, rate, name):
    """A name the core takes for a band (the headers send it)."""
    if not isinstance(name, str):
        raise TypeError("name must be a str, got %s" % type(name).__name__)
    try:
        _hirate.Limiter(limits=[(capacity, rate, name)]).close()
    except _hirate.ConfigError as e:
        # The core's message, said of this name rather than of bands[0].
        raise _hirate._error(e.code, "name %r: %s" % (
            name, str(e).partition("bands[0]: ")[2] or e)) from None
    return name


def refill_seconds(capacity, rate):
    """Whole seconds an empty bucket of capacity takes to fill at rate,
    rounded up: the "w" of RateLimit-Policy, the core's
    (hirate_refill_seconds)."""
    return _core_limit(capacity, rate)[3]


def _check_cost(cost):
    if callable(cost):
        return cost
    if isinstance(cost, bool) or not isinstance(cost, numbers.Integral):
        raise TypeError("cost must be an int or a callable, got %s" % type(cost).__name__)
    return _hirate.check_cost(cost)


def check_scope(scope, what="scope"):
    """A scope is written into bucket keys before a "|": it may not hold one,
    so that no scope and identity can spell another pair's key."""
    if not isinstance(scope, str):
        raise TypeError("%s must be a str, got %s" % (what, type(scope).__name__))
    if not scope:
        raise ValueError("%s must not be empty" % what)
    if _SCOPE_SEP in scope:
        raise ValueError("%s %r contains %r, which separates the parts of a key; "
                         "choose another scope" % (what, scope, _SCOPE_SEP))
    if len(scope.encode("utf-8", "surrogatepass")) > SCOPE_MAX:
        raise ValueError("%s %r is longer than %d bytes" % (what, scope[:40] + "...",
                                                            SCOPE_MAX))
    return scope


class Limit:
    """One rate limit: a bucket of `capacity` tokens refilled at `rate` tokens
    per second, per client, per scope. Limit("5/minute") is the limit string
    (the core's grammar, hirate.parse_limits) for the same pair.

    key         callable(request) -> str | bytes | int | None: whose bucket the
                request spends from; None (or key=None) means the client's
                address (see ClientIP)
    cost        tokens a request spends: an int, or callable(request) -> int
    scope       which requests share the bucket: None is the route (Flask
                endpoint, ASGI path pattern or route) the limit is declared on;
                a string shares the bucket among every declaration of the
                same limits with that scope
    name        the policy's name in the RateLimit headers; by default the
                core's "<capacity>-per-<w>s", w being the whole seconds an
                empty bucket takes to fill
    exempt_when callable(request) -> bool: True lets the request pass this
                limit untouched
    methods     the HTTP methods the limit applies to ("POST", or a list);
                None: every method. GET includes HEAD. Limits of other
                methods are other buckets
    deduct_when callable(response) -> bool: charge the request only when
                it returns True for the response; the request is checked
                (without spending) before the view runs and charged after
                (docs/python.md, "Charging some responses")
    """

    __slots__ = ("capacity", "rate", "key", "cost", "scope", "name", "window",
                 "exempt_when", "methods", "deduct_when", "_head", "_decl")

    def __init__(self, capacity, rate=None, *, key=None, cost=1, scope=None, name=None,
                 exempt_when=None, methods=None, deduct_when=None):
        if isinstance(capacity, str):
            if rate is not None:
                raise TypeError("a limit string holds its own rate: Limit(%r) without a "
                                "rate, or Limit(capacity, rate)" % capacity)
            specs = _parse_limits(capacity)
            if len(specs) != 1:
                raise _hirate._error(
                    _hirate.EOPTION,
                    "a Limit is one limit, and %r holds %d: give the string to limit() "
                    "or as default_limits, or make one Limit of each" % (capacity, len(specs)))
            capacity, rate = specs[0].capacity, specs[0].rate
        elif rate is None:
            raise TypeError("a Limit needs a rate: Limit(capacity, rate), or a limit string "
                            "such as Limit('5/minute')")
        self.capacity, self.rate, default_name, self.window = _core_limit(capacity, rate)
        if key is not None and not callable(key):
            raise TypeError("key must be a callable(request) or None, got %s"
                            % type(key).__name__)
        self.key = key
        self.cost = _check_cost(cost)
        self.scope = None if scope is None else check_scope(scope)
        self.name = (default_name if name is None
                     else _core_name(self.capacity, self.rate, name))
        if exempt_when is not None and not callable(exempt_when):
            raise TypeError("exempt_when must be a callable(request) or None, got %s"
                            % type(exempt_when).__name__)
        self.exempt_when = exempt_when
        self.methods = _check_methods(methods)
        if deduct_when is not None and not callable(deduct_when):
            raise TypeError("deduct_when must be a callable(response) or None, got %s"
                            % type(deduct_when).__name__)
        self.deduct_when = deduct_when
        # capacity and rate are part of every key: two limits of one scope
        # with other numbers must never read each other's buckets; nor
        # may limits of other methods.
        self._head = "%d/%r" % (self.capacity, self.rate)
        if self.methods is not None:
            self._head += "@" + ",".join(sorted(self.methods))
        # The limits of one declaration ("10/second; 1000/day") share this.
        self._decl = self

    @classmethod
    def parse(cls, text, **options):
        """The Limits of a limit string, "5/minute" or several, "10/second;
        1000/day", each with the options of Limit (key, cost, scope,
        exempt_when; a name only for a string of one limit). The limits of
        one string are one declaration: with a scope of their own too, they
        are decided together (see docs/python.md)."""
        if not isinstance(text, str):
            raise TypeError("a limit string must be a str, got %s" % type(text).__name__)
        specs = _parse_limits(text)
        if options.get("name") is not None and len(specs) > 1:
            raise ValueError("name= names one limit, and %r holds %d: declare each "
                             "limit on its own to name it" % (text, len(specs)))
        out = [cls(spec.capacity, spec.rate, **options) for spec in specs]
        for lim in out:
            lim._decl = out[0]
        return out

    @classmethod
    def of(cls, spec):
        """The Limits of a spec: a Limit, a (capacity, rate) pair or a limit
        string, as a list."""
        if isinstance(spec, cls):
            return [spec]
        if isinstance(spec, str):
            return cls.parse(spec)
        if (isinstance(spec, (tuple, list)) and len(spec) == 2
                and not any(isinstance(v, str) for v in spec)):
            return [cls(*spec)]
        raise TypeError("a limit must be a hirate Limit, a limit string such as '5/minute' "
                        "or a (capacity, rate) pair, got %r" % (spec,))

    def bucket_key(self, scope, ident):
        """The key (bytes) of this limit's bucket in `scope` for `ident`, as
        made by ident_for_key or ident_for_ip. The prefix of the hirate
        Limiter comes before it. The identity comes first, as the key's
        Redis Cluster hash tag "{ident}": every limit of one client is on
        one node, whatever braces a scope (a route template) holds."""
        return _bucket_key(scope, ident, self._head)

    def applies_to(self, method):
        """Whether the limit counts a request of this HTTP method."""
        return self.methods is None or method.upper() in self.methods

    def cost_for(self, request):
        cost = self.cost
        if callable(cost):
            cost = _check_cost(cost(request))
            if callable(cost):
                raise TypeError("a cost callable must return an int, not a callable")
        return cost

    def __repr__(self):
        return "Limit(%d, %r, name=%r%s)" % (
            self.capacity, self.rate, self.name,
            "" if self.scope is None else ", scope=%r" % self.scope)


def _check_methods(methods):
    if methods is None:
        return None
    if isinstance(methods, str):
        methods = [methods]
    try:
        names = [m.strip().upper() for m in methods]
    except (TypeError, AttributeError):
        raise TypeError("methods must be a method name or a list of them, got %r"
                        % (methods,)) from None
    for m in names:
        if m not in METHODS:
            raise ValueError("methods: %r is not an HTTP method" % m)
    if not names:
        raise ValueError("methods must name at least one method (None: every method)")
    out = set(names)
    if "GET" in out:
        out.add("HEAD")  # a GET route answers HEAD: a HEAD must not escape the limit
    return frozenset(out)


def declare(capacity, rate=None, **options):
    """The Limits of one limit() call: limit(capacity, rate, ...) or
    limit("10/second; 1000/day", ...)."""
    if isinstance(capacity, str):
        if rate is not None:
            raise TypeError("a limit string holds its own rate: limit(%r) without a rate, "
                            "or limit(capacity, rate)" % capacity)
        return Limit.parse(capacity, **options)
    return [Limit(capacity, rate, **options)]


def _parse_limits(text):
    from . import parse_limits  # the package's: LimitSpec tuples
    return parse_limits(text)


def _bucket_key(scope, ident, head):
    # The core's rule (hirate_bucket_key): "{ident}|scope|head", a long
    # identity hashed to "#" and its SHA-256.
    return _bucket(ident, ("%s" % (scope,)).encode("utf-8", "surrogatepass"),
                   ("%s" % (head,)).encode("utf-8", "surrogatepass"))


def check_limits(limits, where):
    """A list of Limits from Limits, (capacity, rate) pairs and limit strings
    (one spec, or an iterable of them), checked for names that would repeat
    in one response and for limits that would spend one bucket twice. A bad
    limit string raises the core's ConfigError, its message prefixed with
    `where`."""
    if isinstance(limits, (str, Limit)):
        limits = [limits]
    out = []
    for spec in limits:
        try:
            out += Limit.of(spec)
        except _hirate.ConfigError as e:
            if not isinstance(spec, str):
                raise
            raise _hirate._error(e.code, "%s: %s" % (where, e)) from None
    names = set()
    buckets = set()
    for lim in out:
        if lim.name in names:
            raise ValueError("two limits on %s are both named %r; give one another name="
                             % (where, lim.name))
        names.add(lim.name)
        bucket = (lim.scope, lim.capacity, lim.rate, lim.key, lim.methods)
        if bucket in buckets:
            raise ValueError("%r on %s repeats a limit with the same scope, capacity, rate "
                             "and key: every request would spend that bucket twice"
                             % (lim, where))
        buckets.add(bucket)
    # The limits that will be one decision are bands of one limiter: the
    # core judges them now (how many, their names), not at a request.
    for group in plan([(lim, "") for lim in out]):
        if len(group.limits) > 1:
            try:
                _hirate.Limiter(limits=list(group.bands)).close()
            except _hirate.ConfigError as e:
                raise _hirate._error(e.code, "%s: %s" % (where, e)) from None
    return out


# ---------------------------------------------------------------------------
# Identities


def ident_for_key(value):
    """The identity bytes for what a key function returned (not None)."""
    if isinstance(value, (str, bytes)):
        return _ident_for_key(value)
    if isinstance(value, (bytearray, memoryview)):
        return _ident_for_key(bytes(value))
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return _ident_for_key(str(int(value)))
    raise TypeError("a key function must return str, bytes, int or None, got %s"
                    % type(value).__name__)


def ident_for_ip(address):
    """The identity bytes for a client address (a str from ClientIP.key)."""
    return _ident_for_ip(address or None)


class _HeaderKey:
    # key_header's key functions: equal for one header name, so that limits
    # written each with key_header("X-API-Key") are of one identity.
    __slots__ = ("header", "__name__", "__qualname__")

    def __init__(self, header):
        self.header = header
        self.__name__ = self.__qualname__ = "key_header(%r)" % header

    def __call__(self, request):
        value = request.headers.get(self.header)
        return value if value else None

    def __eq__(self, other):
        return isinstance(other, _HeaderKey) and self.header.lower() == other.header.lower()

    def __hash__(self):
        return hash((_HeaderKey, self.header.lower()))

    def __repr__(self):
        return self.__name__


def key_header(name):
    """A key function: the value of the request header `name`, e.g.
    key_header("X-API-Key"). A request without it is limited by its client
    address instead, in buckets of their own (the identities cannot meet).
    The value is stored in the Redis key as sent; hash secrets in a key
    function of your own if Redis' readers must not see them. Two of them
    for one header are equal: one identity."""
    if not isinstance(name, str) or not name:
        raise TypeError("key_header needs a header name, e.g. key_header('X-API-Key')")
    return _HeaderKey(name)


# ---------------------------------------------------------------------------
# The client's address


class ClientIP:
    """Which address a request comes from.

    Without configuration it is the socket peer. Headers that proxies add
    (X-Forwarded-For by default, or Forwarded, RFC 7239) are believed only
    when the peer is a proxy of ours:

    trusted_proxies  addresses or networks ("10.0.0.0/8", "::1", and "unix"
                     for a peer on a Unix socket). When the peer is one, the
                     header is walked from the right, skipping addresses
                     that are trusted proxies too; the first other address
                     is the client.
    proxy_hops       the number of proxies in front of the app (each appends
                     the address it saw): the client is the proxy_hops-th
                     address from the right, whatever a client put to the
                     left of it. With trusted_proxies as well, the peer must
                     also be one of them.

    A hop that is not an address ("unknown", garbage) ends the walk: the
    client is then the nearest address to its right (a proxy of ours), never
    a value the client could have chosen. A request with fewer hops than
    proxy_hops did not come through the proxies: its peer is the client.
    IPv4-mapped IPv6 addresses are read as IPv4.

    The rules are the core's (hirate.h, "Client identity"), the same in
    every language; this class checks the types of its options.
    """

    __slots__ = ("_rules", "header", "hops", "ipv6_subnet", "uses_header")

    def __init__(self, trusted_proxies=(), proxy_hops=0, header=_D["forwarded_header"],
                 ipv6_subnet=_D["ipv6_subnet"]):
        if isinstance(trusted_proxies, str):
            trusted_proxies = [trusted_proxies]
        # ipaddress objects are given by their text.
        entries = [e if isinstance(e, (str, bytes)) else str(e) for e in trusted_proxies]
        if isinstance(proxy_hops, bool) or not isinstance(proxy_hops, numbers.Integral):
            raise TypeError("proxy_hops must be an int, got %s" % type(proxy_hops).__name__)
        if isinstance(ipv6_subnet, bool) or not isinstance(ipv6_subnet, numbers.Integral):
            raise TypeError("ipv6_subnet must be an int, got %s" % type(ipv6_subnet).__name__)
        if not isinstance(header, str):
            raise TypeError("header must be a str, got %s" % type(header).__name__)
        rules = _hirate.ClientRules(entries, float(proxy_hops), header, float(ipv6_subnet))
        self._rules = rules
        self.header, self.hops = rules.header, rules.hops
        self.ipv6_subnet, self.uses_header = rules.ipv6_subnet, rules.uses_header

    def resolve(self, peer, header_values=()):
        """The client's address as a string, from the socket peer (a str, or
        None for a Unix socket) and the configured header's field values in
        the order they came. None when there is no peer and nothing to
        believe."""
        return self._rules.resolve(peer, header_values)

    def key(self, address):
        """The identity of an address for bucket keys: IPv6 addresses by
        their /ipv6_subnet network (a host of one /64 can use all of it)."""
        return self._rules.key(address)


# ---------------------------------------------------------------------------
# Deciding several limits
#
# The limits of one request are first gathered into groups: limits with the
# same identity (key function), scope, cost and exempt_when are the bands of
# one bucket, one key, one hirate.Limiter of those bands: one decision, one
# round trip, spent in every band or in none (the core's rule). A limit with
# a scope of its own shares its bucket with every route that names that
# scope, whose other limits may differ: it is grouped only with the limits
# of its own declaration (one limit string), which go everywhere together.
#
# Groups (different identities, scopes or costs) are decided so that a
# refusal spends nothing: peek at every group but the last; if one refuses,
# peek at the last too (for its headers) and refuse. Otherwise allow the
# last (a refusal there spends nothing either), then allow the others. One
# group is one allow. Only a race, another request draining a peeked bucket
# between the peek and the allow, can leave the groups allowed before it
# spent; the request is refused then. hirate.flask (decide_sync) and
# hirate.asgi (its async twin) follow this.


def _token(value):
    # A group's parts are compared by value where they can be hashed (an
    # int cost, key_header's keys), else by identity.
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return value


class Group:
    """The limits of one request that are one decision: `limits` (in the
    order declared) at `positions` of the request's limits, in `scope`,
    whose identity `keyfunc` gives (None: the client's address)."""

    __slots__ = ("limits", "positions", "scope", "keyfunc", "exempt_when", "deduct_when",
                 "bands", "_head")

    def __init__(self, scope, keyfunc, exempt_when, deduct_when=None):
        self.limits, self.positions = [], []
        self.scope, self.keyfunc, self.exempt_when = scope, keyfunc, exempt_when
        self.deduct_when = deduct_when

    def _add(self, pos, lim):
        self.limits.append(lim)
        self.positions.append(pos)
        # The limiter's bands; a limiter of one band is one of capacity
        # and rate, whatever its limit is called.
        self.bands = (((lim.capacity, lim.rate),) if len(self.limits) == 1 else
                      tuple((b.capacity, b.rate, b.name) for b in self.limits))
        # Every band's numbers are in the key: other bands, other buckets.
        self._head = "+".join(b._head for b in self.limits)

    def bucket_key(self, ident):
        """The bucket's key: one limit's is Limit.bucket_key; several have
        every limit's numbers, in order, joined by "+"."""
        return _bucket_key(self.scope, ident, self._head)

    def cost_for(self, request):
        return self.limits[0].cost_for(request)


def plan(applied, default_key=None):
    """The Groups of a request's limits, [(Limit, scope)], in the order of
    their first limits."""
    groups, index = [], {}
    for pos, (lim, scope) in enumerate(applied):
        keyfunc = lim.key if lim.key is not None else default_key
        if lim.scope is not None:
            same = ("declaration", id(lim._decl))
        else:
            same = (_token(keyfunc), scope, _token(lim.cost), _token(lim.exempt_when),
                    lim.methods, _token(lim.deduct_when))
        group = index.get(same)
        if group is None:
            group = index[same] = Group(scope, keyfunc, lim.exempt_when, lim.deduct_when)
            groups.append(group)
        group._add(pos, lim)
    return groups


def band_decisions(group, decision):
    """Each limit's own Decision in a group's decision (Decision.bands)."""
    n = len(group.limits)
    if n == 1:
        return (decision,)
    bands = decision.bands
    if len(bands) == n:
        return bands
    # The call gave the whole's figures only: each band reports them.
    return (decision,) * n


def checks_of(groups, decisions, n):
    """(Limit, Decision) for each of the n limits of a request that was
    decided, in the order they were declared."""
    out = [None] * n
    for group, decision in zip(groups, decisions):
        for pos, lim, d in zip(group.positions, group.limits, band_decisions(group, decision)):
            out[pos] = (lim, d)
    return [c for c in out if c is not None]


def new_limiter(cls, url, bands, options, sentinel):
    """A hirate.Limiter or AsyncLimiter (cls) of a Group's bands."""
    if len(bands) == 1:
        (capacity, rate), = bands
        return cls(url, capacity=capacity, rate=rate, **options, **sentinel)
    return cls(url, limits=list(bands), **options, **sentinel)


def decide_sync(calls):
    """Decisions for [(limiter, key, cost, spend), ...], one a group, in the
    order above; a call with spend False (a group charged after the
    response, deduct_when) is only peeked at. A call without spend
    spends."""
    order = decide_order(calls)
    out = [None] * len(calls)
    for i in order.peeks:
        lim, key, cost = calls[i][:3]
        out[i] = lim.peek(key, cost)
    if order.last is None:
        return out
    lim, key, cost = calls[order.last][:3]
    if not all(out[i].allowed for i in order.peeks):
        out[order.last] = lim.peek(key, cost)
        return out
    out[order.last] = lim.allow(key, cost)
    if not out[order.last].allowed:
        return out
    for i in order.then:
        lim, key, cost = calls[i][:3]
        out[i] = lim.allow(key, cost)
        if not out[i].allowed:
            break
    return out


class decide_order:
    """How calls are decided: `peeks` first (every call but the last that
    spends), then `last` (None when none spends) allowed, or only peeked at
    when a peek refused, then `then` (the other calls that spend) allowed."""

    __slots__ = ("peeks", "last", "then")

    def __init__(self, calls):
        spending = [i for i, c in enumerate(calls) if len(c) < 4 or c[3]]
        self.last = spending[-1] if spending else None
        self.peeks = [i for i in range(len(calls)) if i != self.last]
        self.then = spending[:-1]


def identity(client_ip, key=None, address=None):
    """The identity bytes of a client, outside a request: key is what a key
    function returns for it, address its address (as ClientIP resolves it);
    one of the two."""
    if (key is None) == (address is None):
        raise TypeError("give key= (what the limit's key function returns for the client) "
                        "or address= (the client's address): one of them")
    if key is not None:
        return ident_for_key(key)
    return ident_for_ip(client_ip.key(address))


def client_buckets(applied, default_key, ident, limiter_for):
    """The Groups of [(Limit, scope)] and, for each, (limiter, bucket key)
    of one client's identity (identity()): what reset() and peek() of an
    integration act on, limiter_for(bands) being its limiter of a Group's
    bands."""
    groups = plan(applied, default_key)
    return groups, [(limiter_for(g.bands), g.bucket_key(ident)) for g in groups]


def refund_sync(calls, tokens):
    """Gives tokens back to each (limiter, bucket key) of client_buckets(),
    in order: their Decisions, the buckets after (the core caps each band at
    its capacity). For an AsyncLimiter, refund_async."""
    return [lim.refund(bucket, tokens) for lim, bucket in calls]


async def refund_async(calls, tokens):
    """refund_sync for AsyncLimiters: one refund after the other, in order."""
    return [await lim.refund(bucket, tokens) for lim, bucket in calls]


def charges(groups, calls):
    """[(position, group, (limiter, key, cost))] of the calls that are
    charged after the response (deduct_when)."""
    return [(i, g, c[:3]) for i, (g, c) in enumerate(zip(groups, calls))
            if len(c) > 3 and not c[3]]


def charge_sync(pending, decisions, response):
    """Charges the deferred calls whose deduct_when says so for response; a
    charge allowed replaces the check's decision (the headers then say what
    the bucket holds after it). A charge that finds the bucket short (other
    requests spent it between the check and the charge) spends nothing.
    Returns the decisions."""
    out = list(decisions)
    for i, group, (lim, key, cost) in pending:
        if not out[i].allowed or not group.deduct_when(response):
            continue
        d = lim.allow(key, cost)
        if d.allowed:
            out[i] = d
    return out


# ---------------------------------------------------------------------------
# Results and headers


class Result:
    """The outcome of the limits of one request.

    checks       a tuple of (Limit, Decision) in the order the limits were
                 declared, each Decision that limit's own (a band's, of
                 limits decided together: Decision.bands); a refused
                 request spent nothing, so their remaining is what the
                 bucket holds, and a limit that held the cost says allowed
    allowed      every limit passed
    retry_after  for a refusal, whole seconds until it could pass (rounded
                 up), or None when it never can (a cost above a capacity);
                 None when allowed
    status       200 when allowed; 429 when refused; 503 when every refusal
                 came from on_error="closed" while Redis was down (the
                 client did nothing wrong: the limit could not be checked)
    violated     the names of the limits that refused

    The headers, status, wait and texts are the core's
    (hirate_response_format), as every integration sends them.
    """

    __slots__ = ("checks", "allowed", "retry_after", "status", "violated", "_headers",
                 "_type", "_title", "_detail")

    def __init__(self, checks):
        self.checks = tuple(checks)
        self.violated = [lim.name for lim, d in self.checks if not d.allowed]
        self.allowed = not self.violated
        if not self.checks:
            self.status, self.retry_after, self._headers = 200, None, []
            self._type = self._title = self._detail = None
            return
        (self.status, self.retry_after, self._headers, self._type, self._title,
         self._detail) = _hirate.response(
             [(lim.name, lim.capacity, lim.rate, d) for lim, d in self.checks],
             _hirate.HEADERS_RATELIMIT | _hirate.HEADERS_LEGACY)

    def _value(self, name):
        for header, value in self._headers:
            if header == name:
                return value
        return None

    def policy_header(self):
        """RateLimit-Policy: "name";q=<capacity>;w=<seconds to refill from
        empty>, one item per limit."""
        return self._value("RateLimit-Policy") or ""

    def ratelimit_header(self):
        """RateLimit: "name";r=<remaining>;t=<seconds>, one item per limit
        whose figures are a bucket's (none for a decision of on_error
        "open" or "closed"); "" when no limit has one."""
        return self._value("RateLimit") or ""

    def headers(self, ratelimit=True, legacy=False):
        """The response headers as a list of (name, value): RateLimit-Policy
        and RateLimit; X-RateLimit-Limit, -Remaining and -Reset when legacy;
        Retry-After on a refusal that can pass some day (docs/semantics.md,
        "Response headers")."""
        out = []
        for name, value in self._headers:
            if name.startswith("RateLimit"):
                if ratelimit:
                    out.append((name, value))
            elif name.startswith("X-RateLimit"):
                if legacy:
                    out.append((name, value))
            else:
                out.append((name, value))
        return out

    def detail(self):
        """The refusal in words, e.g. "Too many requests; retry in 2
        seconds." (None when allowed)."""
        return self._detail

    def problem(self):
        """The default JSON body of a refusal (RFC 9457 problem details, with
        the problem types of the RateLimit headers draft)."""
        return {
            "type": self._type,
            "title": self._title,
            "status": self.status,
            "detail": self._detail,
            "violated-policies": list(self.violated),
            "retry_after": self.retry_after,
        }

    def text(self):
        """The default plain-text body of a refusal."""
        return self._detail + "\n"

    def __repr__(self):
        return "<hirate Result %s%s %s>" % (
            "allowed" if self.allowed else "refused",
            "" if self.allowed else " retry_after=%r" % self.retry_after,
            self.ratelimit_header())


# ---------------------------------------------------------------------------
# Deciding on AsyncLimiters


async def decide_async(calls):
    """decide_sync on AsyncLimiters (a call a group of limits, (limiter,
    key, cost[, spend])), in decide_order, with the peeks (and then the
    other allows) in flight together."""
    order = decide_order(calls)
    out = [None] * len(calls)
    peeked = await asyncio.gather(*(calls[i][0].peek(calls[i][1], calls[i][2])
                                    for i in order.peeks))
    for i, d in zip(order.peeks, peeked):
        out[i] = d
    if order.last is None:
        return out
    lim, key, cost = calls[order.last][:3]
    if not all(out[i].allowed for i in order.peeks):
        out[order.last] = await lim.peek(key, cost)
        return out
    out[order.last] = await lim.allow(key, cost)
    if not out[order.last].allowed:
        return out
    spent = await asyncio.gather(*(calls[i][0].allow(calls[i][1], calls[i][2])
                                   for i in order.then))
    for i, d in zip(order.then, spent):
        out[i] = d
    return out


async def charge_async(pending, decisions, response):
    """charge_sync on AsyncLimiters."""
    out = list(decisions)
    for i, group, (lim, key, cost) in pending:
        if not out[i].allowed or not group.deduct_when(response):
            continue
        d = await lim.allow(key, cost)
        if d.allowed:
            out[i] = d
    return out


# ---------------------------------------------------------------------------
# Settings and scopes, as every integration reads them


def scope_part(text):
    """A route, view or blueprint name as part of a scope: "%" and "|" are
    escaped, so that every name maps to a scope of its own."""
    return text.replace("%", "%25").replace("|", "%7C")


def as_list(value, what):
    """A setting's list: a list, or a str of comma-separated items."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    try:
        return list(value)
    except TypeError:
        raise TypeError("%s must be a list, got %s" % (what, type(value).__name__)) from None


def as_limits(value, where):
    """A limit string ("100/hour; 10/second"), a Limit, or a list of them and
    of (capacity, rate) pairs (JSON config gives lists), checked."""
    if not isinstance(value, (str, Limit)):
        value = as_list(value, where)
    return check_limits(value, where)


async def maybe_await(value):
    """value, awaited when it is awaitable (a key or cost function may be a
    coroutine under ASGI)."""
    if inspect.isawaitable(value):
        return await value
    return value
