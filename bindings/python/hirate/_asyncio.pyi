import os
from types import TracebackType
from typing import Iterable, List, Optional, Sequence, Tuple, Type, TypeVar, Union

from . import Band, Decision, Error
from ._health import Health
from ._stats import Stats

__all__ = ["AsyncLimiter"]

_Key = Union[str, bytes, bytearray, memoryview]
_Path = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
_Self = TypeVar("_Self", bound="AsyncLimiter")
_Band = Union[Band, Tuple[int, float], Tuple[int, float, Optional[str]], str]
_Limits = Union[str, Sequence[_Band]]

class AsyncLimiter:
    """url: redis://, rediss:// (TLS), unix:///path, or a Redis Cluster:
    redis+cluster://[user:password@]host:port[,host:port...] (seeds: any
    nodes, a replica too; pool_size is per node and event loop) and
    rediss+cluster://... (TLS); None: in memory."""

    def __init__(
        self,
        url: Optional[str] = None,
        *,
        capacity: int = ...,
        rate: float = ...,
        limits: Optional[_Limits] = None,
        prefix: str = "rl:",
        on_error: str = "local",
        instances: int = 1,
        connect_timeout: Union[float, str] = 0.25,
        timeout: Union[float, str] = 0.1,
        deny_cache: bool = True,
        max_keys: int = 1_000_000,
        pool_size: int = 16,
        tls_ca_file: Optional[_Path] = None,
        tls_ca_dir: Optional[_Path] = None,
        tls_cert_file: Optional[_Path] = None,
        tls_key_file: Optional[_Path] = None,
        tls_server_name: Optional[str] = None,
        tls_verify: bool = True,
        sentinel_username: Optional[str] = None,
        sentinel_password: Optional[str] = None,
        functions: bool = True,
        deny_cache_max: Union[float, str] = 1.0,
    ) -> None: ...
    @classmethod
    def from_env(
        cls: Type[_Self],
        *,
        capacity: int = ...,
        rate: float = ...,
        limits: Optional[_Limits] = None,
        prefix: str = "rl:",
        on_error: str = "local",
        instances: int = 1,
        connect_timeout: Union[float, str] = 0.25,
        timeout: Union[float, str] = 0.1,
        deny_cache: bool = True,
        max_keys: int = 1_000_000,
        pool_size: int = 16,
        tls_ca_file: Optional[_Path] = None,
        tls_ca_dir: Optional[_Path] = None,
        tls_cert_file: Optional[_Path] = None,
        tls_key_file: Optional[_Path] = None,
        tls_server_name: Optional[str] = None,
        tls_verify: bool = True,
        sentinel_username: Optional[str] = None,
        sentinel_password: Optional[str] = None,
        functions: bool = True,
        deny_cache_max: Union[float, str] = 1.0,
    ) -> _Self: ...
    @property
    def capacity(self) -> int: ...
    @property
    def rate(self) -> float: ...
    @property
    def bands(self) -> Tuple[Band, ...]: ...
    @property
    def prefix(self) -> str: ...
    @property
    def on_error(self) -> str: ...
    @property
    def url(self) -> Optional[str]: ...
    async def allow(self, key: _Key, cost: int = 1) -> Decision: ...
    async def peek(self, key: _Key, cost: int = 1) -> Decision: ...
    async def allow_many(
        self, pairs: Iterable[Tuple[_Key, int]]
    ) -> List[Union[Decision, Error, MemoryError]]: ...
    async def reset(self, key: _Key) -> None: ...
    async def refund(self, key: _Key, tokens: int = 1) -> Decision: ...
    def stats(self) -> Stats: ...
    async def check(self) -> Health: ...
    async def close(self) -> None: ...
    async def aclose(self) -> None: ...
    async def __aenter__(self: _Self) -> _Self: ...
    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None: ...
