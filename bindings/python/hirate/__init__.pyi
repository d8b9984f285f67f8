from typing import NamedTuple as _NamedTuple
from typing import Optional

from ._asyncio import AsyncLimiter as AsyncLimiter
from ._hirate import AuthError as AuthError
from ._hirate import BackendError as BackendError
from ._hirate import ClosedError as ClosedError
from ._hirate import ConfigError as ConfigError
from ._hirate import Decision as Decision
from ._hirate import Error as Error
from ._hirate import Limiter as Limiter
from ._hirate import NotRedisError as NotRedisError
from ._hirate import RefusedError as RefusedError
from ._hirate import TimeoutError as TimeoutError
from ._hirate import TLSError as TLSError
from ._hirate import __version__ as __version__
from ._hirate import function_library as function_library
from ._hirate import function_name as function_name
from ._hirate import script_sha1 as script_sha1
from ._hirate import script_source as script_source
from ._health import Health as Health
from ._health import NodeHealth as NodeHealth
from ._stats import Stats as Stats

class Band(_NamedTuple):
    capacity: int
    rate: float
    name: Optional[str] = None

class LimitSpec(_NamedTuple):
    capacity: int
    rate: float
    count: int  # type: ignore[assignment]  # a field, shadowing tuple.count as at run time
    window: int

def parse_limits(text: str) -> list[LimitSpec]: ...

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
