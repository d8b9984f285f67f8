"""Types of hirate.django."""

from typing import Any, Callable, Iterable, Optional, Sequence, TypeVar, Union

from ._http import Limit as Limit
from ._http import Result as Result
from ._http import key_header as key_header
from ._health import Health
from ._stats import Stats

__all__ = ["RateLimitMiddleware", "limit", "exempt", "Limit", "Result", "key_header",
           "get_result", "client_ip", "reset", "areset", "peek", "apeek", "stats", "health",
           "ahealth", "close", "aclose"]

_F = TypeVar("_F", bound=Callable[..., Any])
# Django ships no type information of its own (django-stubs has it): its
# requests and responses are Any here, so that these stubs check without it.
_Request = Any
_Response = Any

def limit(
    capacity: Union[int, str],
    rate: Optional[float] = None,
    *,
    key: Optional[Callable[[_Request], Any]] = None,
    cost: Union[int, Callable[[_Request], Any]] = 1,
    scope: Optional[str] = None,
    name: Optional[str] = None,
    exempt_when: Optional[Callable[[_Request], Any]] = None,
    methods: Union[str, Iterable[str], None] = None,
    deduct_when: Optional[Callable[[Any], bool]] = None,
) -> Callable[[_F], _F]: ...
def exempt(view: _F) -> _F: ...
def get_result(request: _Request) -> Optional[Result]: ...
def client_ip(request: _Request) -> Optional[str]: ...
_Target = Union[Callable[..., Any], str, Limit, Sequence[Limit], None]
def reset(target: _Target, key: Any = None, *, address: Optional[str] = None) -> None: ...
async def areset(target: _Target, key: Any = None, *, address: Optional[str] = None) -> None: ...
def peek(target: _Target, key: Any = None, *, address: Optional[str] = None,
         cost: int = 0) -> Result: ...
async def apeek(target: _Target, key: Any = None, *, address: Optional[str] = None,
                cost: int = 0) -> Result: ...
def stats() -> Stats: ...
def health() -> Health: ...
async def ahealth() -> Health: ...
def close() -> None: ...
async def aclose() -> None: ...

class RateLimitMiddleware:
    sync_capable: bool
    async_capable: bool
    get_response: Callable[[_Request], _Response]
    def __init__(self, get_response: Callable[[_Request], _Response]) -> None: ...
    def __call__(self, request: _Request) -> _Response: ...
    async def __acall__(self, request: _Request) -> _Response: ...
    def process_view(self, request: _Request, view_func: Callable[..., Any],
                     view_args: Any, view_kwargs: Any) -> Any: ...
