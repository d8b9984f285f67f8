"""hirate.Stats: a limiter's metrics, as Limiter.stats() and
AsyncLimiter.stats() give them (the C core counts them; see hirate.h,
hirate_stats)."""

import dataclasses
from typing import Dict, Tuple

from . import _hirate


@dataclasses.dataclass(frozen=True)
class Stats:
    """The metrics of a limiter since it was made (or, summed with +, of
    several). Every figure only grows.

    decisions        {source: count} of the calls that spend (allow,
                     allow_many's items), by who decided: "redis", "local",
                     "cache", "fail_open", "fail_closed" (every source, 0
                     included)
    refused          how many of those were refused
    peeks            decisions of peek(), any source (not in decisions)
    errors           {code: count}: the failures met, by the name of
                     hirate's error code ("ETIMEDOUT", "ECONNECT", "EKEY"
                     ...; every code, 0 included), one a call or a batch's
                     item: those raised (a bad key or cost, a wrong
                     password) and the outages a failure policy answered for
                     (which are in decisions too, as "local", "fail_open" or
                     "fail_closed")
    breaker_opens    outages begun: times a Redis node failed and its
                     breaker opened (not once per failed probe)
    breaker_closes   outages ended: times a probe found it answering again
    connects         connections to Redis made
    conns_dropped    connections closed after an error
    latency_buckets  the Redis round trips by how long they took, as
                     ((upper_bound_seconds, count), ...): CUMULATIVE, each
                     count is of the round trips that took at most that
                     bound (Prometheus' "le"); the bounds are the core's,
                     0.0001 ... 1.0, and the last is (inf, latency_count)
    latency_sum      seconds, all those round trips together
    latency_count    how many round trips
    """

    decisions: Dict[str, int]
    refused: int
    peeks: int
    errors: Dict[str, int]
    breaker_opens: int
    breaker_closes: int
    connects: int
    conns_dropped: int
    latency_buckets: Tuple[Tuple[float, int], ...]
    latency_sum: float
    latency_count: int

    @classmethod
    def zero(cls):
        """The figures of no limiter: every count 0."""
        return _hirate._empty_stats()

    def __add__(self, other):
        """The figures of two limiters together (e.g. the several a web
        integration makes): every count added, bucket by bucket."""
        if not isinstance(other, Stats):
            return NotImplemented
        if [b for b, _ in self.latency_buckets] != [b for b, _ in other.latency_buckets]:
            raise ValueError("the latency buckets of these Stats have different bounds")
        fields = {}
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, dict):
                fields[f.name] = {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}
            elif f.name == "latency_buckets":
                fields[f.name] = tuple((le, n + m) for (le, n), (_, m) in zip(a, b))
            else:
                fields[f.name] = a + b
        return Stats(**fields)

    @classmethod
    def sum(cls, many):
        """The figures of every Stats in the iterable many added up (zero()
        for none)."""
        total = cls.zero()
        for s in many:
            total = total + s
        return total
