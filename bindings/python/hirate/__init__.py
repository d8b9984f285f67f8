"""hirate: a distributed token-bucket rate limiter.

    import hirate

    lim = hirate.Limiter("redis://127.0.0.1:6379", capacity=10, rate=2.0)
    d = lim.allow("alice")
    if not d:
        ...  # refuse; retry in d.retry_after seconds

Without a URL the buckets live in this process; rediss:// URLs speak TLS;
redis+cluster:// names a Redis Cluster, redis+sentinel:// a Sentinel service.
Events worth a log line (a Sentinel master found or moved, Redis Functions
refused by a server) go to the standard logger "hirate". The decisions, the
failure policies and the errors are the C core's (see docs/python.md).
"""

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

__all__ = [
    "AsyncLimiter",
    "AuthError",
    "BackendError",
    "ClosedError",
    "ConfigError",
    "Decision",
    "Error",
    "Limiter",
    "NotRedisError",
    "RefusedError",
    "TLSError",
    "TimeoutError",
    "__version__",
    "function_library",
    "function_name",
    "script_sha1",
    "script_source",
]
