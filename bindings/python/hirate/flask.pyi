"""Types of hirate.flask."""

from typing import Any, Callable, Iterable, Optional, Sequence, Tuple, TypeVar, Union

from flask import Flask, Request, Response

from ._http import Limit as Limit
from ._http import Result as Result
from ._http import key_header as key_header
from ._health import Health
from ._stats import Stats

__all__ = ["RateLimiter", "Limit", "Result", "key_header", "current_result"]

_T = TypeVar("_T")
_LimitSpec = Union[Limit, str, Tuple[int, float]]

def current_result() -> Optional[Result]: ...

class RateLimiter:
    key: Optional[Callable[[Request], Any]]
    on_refused: Optional[Callable[[Request, Result], Any]]
    def __init__(
        self,
        app: Optional[Flask] = None,
        *,
        url: Optional[str] = ...,
        default_limits: Union[_LimitSpec, Iterable[_LimitSpec]] = ...,
        key: Optional[Callable[[Request], Any]] = None,
        on_error: str = ...,
        headers: bool = ...,
        legacy_headers: bool = ...,
        trusted_proxies: Union[str, Iterable[str]] = ...,
        proxy_hops: int = ...,
        forwarded_header: str = ...,
        ipv6_subnet: int = ...,
        prefix: str = ...,
        instances: int = ...,
        connect_timeout: Union[float, str] = ...,
        timeout: Union[float, str] = ...,
        body: str = ...,
        on_refused: Optional[Callable[[Request, Result], Any]] = None,
        enabled: bool = ...,
        sentinel_username: Optional[str] = ...,
        sentinel_password: Optional[str] = ...,
        functions: bool = ...,
        deny_cache: bool = ...,
        deny_cache_max: float = ...,
        max_keys: int = ...,
        pool_size: int = ...,
    ) -> None: ...
    def init_app(self, app: Flask) -> None: ...
    def close(self, app: Optional[Flask] = None) -> None: ...
    def stats(self, app: Optional[Flask] = None) -> Stats: ...
    def health(self, app: Optional[Flask] = None) -> Health: ...
    def limit(
        self,
        capacity: Union[int, str],
        rate: Optional[float] = None,
        *,
        key: Optional[Callable[[Request], Any]] = None,
        cost: Union[int, Callable[[Request], int]] = 1,
        scope: Optional[str] = None,
        name: Optional[str] = None,
        exempt_when: Optional[Callable[[Request], bool]] = None,
        methods: Union[str, Iterable[str], None] = None,
        deduct_when: Optional[Callable[[Response], bool]] = None,
    ) -> Callable[[_T], _T]: ...
    def exempt(self, obj: _T) -> _T: ...
    def client_ip(self, req: Optional[Request] = None) -> Optional[str]: ...
    def reset(self, target: Union[str, Callable[..., Any], Limit, Sequence[Limit]],
              key: Union[str, bytes, int, None] = None, *, address: Optional[str] = None,
              app: Optional[Flask] = None) -> None: ...
    def refund(self, target: Union[str, Callable[..., Any], Limit, Sequence[Limit]],
               key: Union[str, bytes, int, None] = None, *, address: Optional[str] = None,
               tokens: int = 1, app: Optional[Flask] = None) -> Result: ...
    def peek(self, target: Union[str, Callable[..., Any], Limit, Sequence[Limit]],
             key: Union[str, bytes, int, None] = None, *, address: Optional[str] = None,
             cost: int = 0, app: Optional[Flask] = None) -> Result: ...
