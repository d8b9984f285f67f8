"""hirate's metrics for Prometheus, through prometheus_client.

    import hirate, hirate.prometheus

    lim = hirate.Limiter("redis://127.0.0.1:6379", capacity=10, rate=2.0)
    hirate.prometheus.register(lim, name="api")   # in prometheus_client's REGISTRY

Each limiter is named once, and the name is the only label besides the
decision's source and the error's code: never a key, so a scrape's size
does not grow with the clients. Anything with a stats() method that returns
a hirate.Stats can be registered: a Limiter, an AsyncLimiter, or a Flask or
ASGI RateLimiter (the figures of its several limiters added up).

    hirate_decisions_total{limiter,source}    decisions of spending calls
    hirate_refused_total{limiter}             of those, the refused
    hirate_peeks_total{limiter}               decisions of peeks
    hirate_errors_total{limiter,code}         failures met, by error code
    hirate_breaker_opens_total{limiter}       outages begun
    hirate_breaker_closes_total{limiter}      outages ended
    hirate_connections_total{limiter}         connections to Redis made
    hirate_connections_dropped_total{limiter} connections closed after an error
    hirate_redis_round_trip_seconds{limiter}  a histogram of the round trips

The figures are one process' (see docs/python.md, "Metrics and logs", for
servers of several worker processes).
"""

import threading
import weakref

try:
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
    from prometheus_client.registry import REGISTRY
    from prometheus_client.utils import floatToGoString
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("hirate.prometheus needs prometheus_client, which is not installed: "
                      "pip install prometheus_client") from e

__all__ = ["LimiterCollector", "register", "unregister"]

# (family name, help, the Stats field, the label of its mapping's keys)
_COUNTERS = (
    ("hirate_decisions", "Decisions of calls that spend tokens, by who decided.",
     "decisions", "source"),
    ("hirate_refused", "Of those decisions, the refused.", "refused", None),
    ("hirate_peeks", "Decisions of peeks (nothing spent).", "peeks", None),
    ("hirate_errors", "Failures met, by hirate error code: raised ones and outages a "
     "failure policy answered for.", "errors", "code"),
    ("hirate_breaker_opens", "Outages begun: a Redis node failed and its breaker opened.",
     "breaker_opens", None),
    ("hirate_breaker_closes", "Outages ended: a Redis node answered again.",
     "breaker_closes", None),
    ("hirate_connections", "Connections to Redis made.", "connects", None),
    ("hirate_connections_dropped", "Connections to Redis closed after an error.",
     "conns_dropped", None),
)
_HISTOGRAM = ("hirate_redis_round_trip_seconds", "Redis round trips, by how long they took.")


class LimiterCollector:
    """A prometheus_client collector of named limiters: LimiterCollector(
    {"api": lim, "web": flask_rate_limiter}), then registry.register(it).
    A value is anything whose stats() returns a hirate.Stats. A scrape asks
    each for its stats() (a few microseconds, no I/O); the collector keeps
    its limiters alive, and a closed one shows its last figures."""

    def __init__(self, limiters=None):
        self._lock = threading.Lock()
        self._limiters = {}
        for name, limiter in dict(limiters or {}).items():
            self.add(name, limiter)

    def add(self, name, limiter):
        """Adds limiter under name (the value of its "limiter" label)."""
        if not isinstance(name, str) or not name:
            raise TypeError("a limiter's name must be a non-empty str, got %r" % (name,))
        if not callable(getattr(limiter, "stats", None)):
            raise TypeError("%r has no stats() method" % (limiter,))
        with self._lock:
            if name in self._limiters:
                raise ValueError("a limiter named %r is in this collector already" % name)
            self._limiters[name] = limiter

    def remove(self, name):
        """Takes the limiter of that name out (KeyError when there is none)."""
        with self._lock:
            del self._limiters[name]

    def describe(self):
        """The families without samples: a registry learns the names
        without asking any limiter."""
        return self._families([])

    def collect(self):
        with self._lock:
            named = list(self._limiters.items())
        return self._families([(name, limiter.stats()) for name, limiter in named])

    @staticmethod
    def _families(figures):
        out = []
        for family, text, field, label in _COUNTERS:
            labels = ["limiter"] + ([label] if label else [])
            c = CounterMetricFamily(family, text, labels=labels)
            for name, stats in figures:
                value = getattr(stats, field)
                if label:
                    for item, count in value.items():
                        c.add_metric([name, item], count)
                else:
                    c.add_metric([name], value)
            out.append(c)
        h = HistogramMetricFamily(*_HISTOGRAM, labels=["limiter"])
        for name, stats in figures:
            h.add_metric([name], [(floatToGoString(le), n) for le, n in stats.latency_buckets],
                         stats.latency_sum)
        out.append(h)
        return out


# The collector register() put in each registry: one a registry, since a
# registry takes each metric name from one collector only.
_registered = weakref.WeakKeyDictionary()
_registered_lock = threading.Lock()


def register(limiter, name, registry=None):
    """Exports limiter's metrics under name (its "limiter" label) from
    registry (prometheus_client's default REGISTRY when None), through the
    one LimiterCollector this function keeps there, which it returns."""
    registry = REGISTRY if registry is None else registry
    with _registered_lock:
        collector = _registered.get(registry)
        if collector is None:
            collector = LimiterCollector()
            registry.register(collector)
            _registered[registry] = collector
    collector.add(name, limiter)
    return collector


def unregister(name, registry=None):
    """Takes the limiter register() exported under name out of registry."""
    registry = REGISTRY if registry is None else registry
    with _registered_lock:
        collector = _registered.get(registry)
    if collector is None:
        raise KeyError(name)
    collector.remove(name)
