"""Types of hirate.django."""

from typing import Any, Awaitable, Callable, Optional, TypeVar, Union

from django.http import HttpRequest, HttpResponseBase

from ._http import Limit as Limit
from ._http import Result as Result
from ._http import key_header as key_header
from ._stats import Stats

__all__ = ["RateLimitMiddleware", "limit", "exempt", "Limit", "Result", "key_header",
           "get_result", "client_ip", "stats", "close", "aclose"]

_F = TypeVar("_F", bound=Callable[..., Any])
_Response = Union[HttpResponseBase, Awaitable[HttpResponseBase]]

def limit(
    capacity: Union[int, str],
    rate: Optional[float] = None,
    *,
    key: Optional[Callable[[HttpRequest], Any]] = None,
    cost: Union[int, Callable[[HttpRequest], Any]] = 1,
    scope: Optional[str] = None,
    name: Optional[str] = None,
    exempt_when: Optional[Callable[[HttpRequest], Any]] = None,
) -> Callable[[_F], _F]: ...
def exempt(view: _F) -> _F: ...
def get_result(request: HttpRequest) -> Optional[Result]: ...
def client_ip(request: HttpRequest) -> Optional[str]: ...
def stats() -> Stats: ...
def close() -> None: ...
async def aclose() -> None: ...

class RateLimitMiddleware:
    sync_capable: bool
    async_capable: bool
    get_response: Callable[[HttpRequest], _Response]
    def __init__(self, get_response: Callable[[HttpRequest], _Response]) -> None: ...
    def __call__(self, request: HttpRequest) -> _Response: ...
    def process_view(self, request: HttpRequest, view_func: Callable[..., Any],
                     view_args: Any, view_kwargs: Any) -> Any: ...
