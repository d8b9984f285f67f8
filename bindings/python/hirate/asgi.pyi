"""Types of hirate.asgi."""

from typing import Any, Awaitable, Callable, Iterable, Mapping, Optional, Sequence, Tuple, Union

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ._http import Limit as Limit
from ._http import Result as Result
from ._http import key_header as key_header
from ._health import Health
from ._stats import Stats

__all__ = ["RateLimiter", "RateLimitMiddleware", "RateLimitExceeded", "Limit", "Result",
           "ResponseStart", "key_header"]

_LimitSpec = Union[Limit, str, Tuple[int, float]]
_Limits = Union[_LimitSpec, Iterable[_LimitSpec]]

class ResponseStart:
    status_code: int
    headers: Headers
    def __init__(self, message: Mapping[str, Any]) -> None: ...

_Dependency = Callable[[Request, Response], Awaitable[Optional[Result]]]
_Target = Union[str, None, Limit, Sequence[Limit], _Dependency]

class RateLimitExceeded(HTTPException):
    result: Result
    def __init__(self, result: Result, headers: Iterable[Tuple[str, str]], detail: Any) -> None: ...

class RateLimiter:
    url: Optional[str]
    default_limits: Sequence[Limit]
    key: Optional[Callable[[Request], Any]]
    headers: bool
    legacy_headers: bool
    body: str
    on_refused: Optional[Callable[[Request, Result], Any]]
    enabled: bool
    def __init__(
        self,
        *,
        url: Optional[str] = None,
        default_limits: _Limits = (),
        routes: Optional[Mapping[str, _Limits]] = None,
        exempt: Union[str, Iterable[str]] = (),
        key: Optional[Callable[[Request], Any]] = None,
        on_error: str = "local",
        headers: bool = True,
        legacy_headers: bool = False,
        trusted_proxies: Union[str, Iterable[str]] = (),
        proxy_hops: int = 0,
        forwarded_header: str = "X-Forwarded-For",
        ipv6_subnet: int = 64,
        prefix: str = "rl:",
        instances: int = 1,
        connect_timeout: Union[float, str] = 0.25,
        timeout: Union[float, str] = 0.1,
        body: str = "json",
        on_refused: Optional[Callable[[Request, Result], Any]] = None,
        enabled: bool = True,
        sentinel_username: Optional[str] = None,
        sentinel_password: Optional[str] = None,
        functions: bool = True,
        deny_cache: bool = True,
        deny_cache_max: float = 1.0,
        max_keys: int = 1_000_000,
        pool_size: int = 16,
    ) -> None: ...
    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, prefix: str = "HIRATE_",
                 **settings: Any) -> "RateLimiter": ...
    async def reset(self, target: _Target, key: Union[str, bytes, int, None] = None, *,
                    address: Optional[str] = None) -> None: ...
    async def refund(self, target: _Target, key: Union[str, bytes, int, None] = None, *,
                     address: Optional[str] = None, tokens: int = 1) -> Result: ...
    async def peek(self, target: _Target, key: Union[str, bytes, int, None] = None, *,
                   address: Optional[str] = None, cost: int = 0) -> Result: ...
    async def close(self) -> None: ...
    def stats(self) -> Stats: ...
    async def health(self) -> Health: ...
    async def aclose(self) -> None: ...
    def client_address(self, request: Union[Request, Scope]) -> Optional[str]: ...
    async def check(self, request: Request,
                    applied: Sequence[Tuple[Limit, str]]) -> Optional[Result]: ...
    def refusal(self, result: Result) -> Response: ...
    async def exception_handler(self, request: Request, exc: Exception) -> Response: ...
    def limit(
        self,
        capacity: Union[int, str],
        rate: Optional[float] = None,
        *,
        key: Optional[Callable[[Request], Any]] = None,
        cost: Union[int, Callable[[Request], Any]] = 1,
        scope: Optional[str] = None,
        name: Optional[str] = None,
        exempt_when: Optional[Callable[[Request], Any]] = None,
        methods: Union[str, Iterable[str], None] = None,
    ) -> Callable[[Request, Response], Awaitable[Optional[Result]]]: ...
    def limits(self, *limits: _LimitSpec) -> Callable[[Request, Response],
                                                      Awaitable[Optional[Result]]]: ...

class RateLimitMiddleware:
    app: ASGIApp
    limiter: RateLimiter
    def __init__(self, app: ASGIApp, /, limiter: Optional[RateLimiter] = None,
                 **options: Any) -> None: ...
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None: ...
