"""hirate: a distributed token-bucket rate limiter.

    import hirate

    lim = hirate.Limiter("redis://127.0.0.1:6379", capacity=10, rate=2.0)
    d = lim.allow("alice")
    if not d:
        ...  # refuse; retry in d.retry_after seconds

Without a URL the buckets live in this process; rediss:// URLs speak TLS;
redis+cluster:// names a Redis Cluster, redis+sentinel:// a Sentinel service.
Events worth a log line (Redis failing and answering again, a Sentinel
master found or moved, Redis Functions refused by a server) go to the
standard logger "hirate"; lim.stats() gives the metrics (hirate.Stats). The decisions, the
failure policies and the errors are the C core's (see docs/python.md).
Limit strings ("10/second; 1000/day") are the core's too: parse_limits.
Several limits on one key ("bands": a burst and a daily quota) are one
limiter, one decision that spends in every band or in none:

    lim = hirate.Limiter(limits="10/second; 1000/day")
    lim = hirate.Limiter(limits=[hirate.Band(10, 10.0, "burst"), (1000, 1000 / 86400)])
"""

from typing import NamedTuple as _NamedTuple
from typing import Optional as _Optional

from ._asyncio import AsyncLimiter
from ._hirate import (
    AuthError,
    BackendError,
    ClosedError,
    ConfigError,
    Decision,
    Error,
    Limiter,
    NotRedisError,
    RefusedError,
    TimeoutError,
    TLSError,
    __version__,
    function_library,
    function_name,
    script_sha1,
    script_source,
)
from ._hirate import parse_limits as _parse_limits
from ._health import Health, NodeHealth
from ._stats import Stats


class Band(_NamedTuple):
    """One limit of a limiter of several ("a band"): a bucket of capacity
    tokens refilled at rate tokens per second, and its name for headers and
    messages (None: the core's default, "<capacity>-per-<w>s", w the whole
    seconds an empty bucket takes to fill). Limiter(limits=[...]) takes
    them; Limiter.bands gives them, names filled in."""

    capacity: int
    rate: float
    name: _Optional[str] = None


class LimitSpec(_NamedTuple):
    """One limit of a limit string (docs/semantics.md, "Limit strings"):
    count per window seconds is a bucket of capacity tokens (count, or the
    burst) refilled at rate = count / window tokens per second."""

    capacity: int
    rate: float
    count: int
    window: int


def parse_limits(text):
    """parse_limits(text) -> list of LimitSpec: the limits of a limit string
    such as "100/minute", "10 per second", "1000/day burst 50", or several
    separated by ';' or ','. The C core parses; a bad string raises
    ConfigError (EOPTION) with a message that quotes the limit and names the
    wrong part; text that is not a str raises TypeError."""
    return list(map(LimitSpec._make, _parse_limits(text)))


__all__ = [
    "AsyncLimiter",
    "AuthError",
    "BackendError",
    "Band",
    "ClosedError",
    "ConfigError",
    "Decision",
    "Error",
    "Health",
    "LimitSpec",
    "Limiter",
    "NodeHealth",
    "NotRedisError",
    "RefusedError",
    "Stats",
    "TLSError",
    "TimeoutError",
    "__version__",
    "function_library",
    "function_name",
    "parse_limits",
    "script_sha1",
    "script_source",
]
