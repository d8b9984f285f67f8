"""hirate: a distributed token-bucket rate limiter.

    import hirate

    lim = hirate.Limiter("redis://127.0.0.1:6379", capacity=10, rate=2.0)
    d = lim.allow("alice")
    if not d:
        ...  # refuse; retry in d.retry_after seconds

Without a URL the buckets live in this process. The decisions, the failure
policies and the errors are the C core's (see docs/python.md).
"""

from ._hirate import (
    AuthError,
    BackendError,
    ClosedError,
    ConfigError,
    Decision,
    Error,
    Limiter,
    TimeoutError,
    __version__,
    script_sha1,
    script_source,
)

try:
    from ._asyncio import AsyncLimiter
except ModuleNotFoundError as e:  # pragma: no cover - a tree without the asyncio module
    if e.name != __name__ + "._asyncio":
        raise

__all__ = [
    "AsyncLimiter",
    "AuthError",
    "BackendError",
    "ClosedError",
    "ConfigError",
    "Decision",
    "Error",
    "Limiter",
    "TimeoutError",
    "__version__",
    "script_sha1",
    "script_source",
]
