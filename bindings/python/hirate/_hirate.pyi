"""Types of hirate._hirate, the C extension (import the public names from hirate)."""

import builtins
import os
from typing import Final, Iterable, Literal, Optional, Tuple, TypedDict, Union, final

_Key = Union[str, bytes, bytearray, memoryview]
_Path = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

__version__: Final[str]

IO_MORE: Final[int]
IO_SEND: Final[int]
IO_DONE: Final[int]
IO_PROBE: Final[int]
IO_REPLY_MAX: Final[int]
ERRMSG_SIZE: Final[int]
KEY_MAX: Final[int]
PREFIX_MAX: Final[int]
EXACT_MAX: Final[int]

EINVAL: Final[int]
ECAPACITY: Final[int]
ERATE: Final[int]
ECOST: Final[int]
EKEY: Final[int]
ERANGE: Final[int]
EURL: Final[int]
EOPTION: Final[int]
ENOMEM: Final[int]
ECONNECT: Final[int]
ETIMEDOUT: Final[int]
EIO: Final[int]
EPROTO: Final[int]
ESERVER: Final[int]
EAUTH: Final[int]
ENOPERM: Final[int]
EREPLY: Final[int]
ECLOSED: Final[int]
ETLS: Final[int]
EREFUSED: Final[int]
ENOTREDIS: Final[int]

class Error(Exception):
    code: Optional[int]
    name: Optional[str]
    def __bool__(self) -> Literal[False]: ...

class ConfigError(Error, ValueError): ...
class BackendError(Error, ConnectionError): ...
class TimeoutError(BackendError, builtins.TimeoutError): ...
class AuthError(BackendError, PermissionError): ...
class ClosedError(Error, ValueError): ...
class TLSError(BackendError): ...
class RefusedError(BackendError, ConnectionRefusedError): ...
class NotRedisError(BackendError): ...

_Result = Union[Decision, Error, MemoryError]

@final
class Decision:
    def __new__(
        cls,
        allowed: bool,
        remaining: int,
        limit: int,
        retry_after: float,
        reset_after: float,
        source: str,
        error: Optional[str] = ...,
        time: float = ...,
    ) -> "Decision": ...
    @property
    def allowed(self) -> bool: ...
    @property
    def remaining(self) -> int: ...
    @property
    def limit(self) -> int: ...
    @property
    def retry_after(self) -> float: ...
    @property
    def reset_after(self) -> float: ...
    @property
    def retry_after_us(self) -> Optional[int]: ...
    @property
    def reset_after_us(self) -> int: ...
    @property
    def source(self) -> str: ...
    @property
    def error(self) -> Optional[str]: ...
    @property
    def time(self) -> float: ...
    @property
    def time_us(self) -> int: ...
    def __bool__(self) -> bool: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Op:
    @property
    def request(self) -> Optional[bytes]: ...
    @property
    def drop(self) -> bool: ...
    @property
    def done(self) -> bool: ...
    def feed(self, data: Union[bytes, bytearray, memoryview]) -> Tuple[int, int]: ...
    def fail(self, code: int, why: Optional[str] = ...) -> None: ...
    def results(self) -> list[_Result]: ...
    def result(self) -> None: ...

@final
class Handshake:
    @property
    def request(self) -> Optional[bytes]: ...
    @property
    def probe_tls(self) -> bool: ...
    @property
    def state(self) -> int: ...
    def feed(self, data: Union[bytes, bytearray, memoryview]) -> Tuple[int, int]: ...
    def fail(self, code: int, why: Optional[str] = ...) -> int: ...
    def result(self) -> None: ...

class _Endpoint(TypedDict):
    host: Optional[str]
    port: int
    path: Optional[str]
    where: str
    connect_timeout: float
    timeout: float
    probe_timeout: float
    tls: bool
    tls_verify: bool
    tls_ca_file: Optional[str]
    tls_ca_dir: Optional[str]
    tls_cert_file: Optional[str]
    tls_key_file: Optional[str]
    tls_server_name: Optional[str]

class Limiter:
    def __new__(
        cls,
        url: Optional[str] = ...,
        *,
        capacity: int,
        rate: float,
        prefix: str = ...,
        on_error: str = ...,
        instances: int = ...,
        connect_timeout: float = ...,
        timeout: float = ...,
        deny_cache: bool = ...,
        max_keys: int = ...,
        pool_size: int = ...,
        tls_ca_file: Optional[_Path] = ...,
        tls_ca_dir: Optional[_Path] = ...,
        tls_cert_file: Optional[_Path] = ...,
        tls_key_file: Optional[_Path] = ...,
        tls_server_name: Optional[str] = ...,
        tls_verify: bool = ...,
    ) -> "Limiter": ...
    @classmethod
    def from_env(
        cls,
        *,
        capacity: int,
        rate: float,
        prefix: str = ...,
        on_error: str = ...,
        instances: int = ...,
        connect_timeout: float = ...,
        timeout: float = ...,
        deny_cache: bool = ...,
        max_keys: int = ...,
        pool_size: int = ...,
        tls_ca_file: Optional[_Path] = ...,
        tls_ca_dir: Optional[_Path] = ...,
        tls_cert_file: Optional[_Path] = ...,
        tls_key_file: Optional[_Path] = ...,
        tls_server_name: Optional[str] = ...,
        tls_verify: bool = ...,
    ) -> "Limiter": ...
    @property
    def capacity(self) -> int: ...
    @property
    def rate(self) -> float: ...
    @property
    def prefix(self) -> str: ...
    @property
    def url(self) -> Optional[str]: ...
    @property
    def on_error(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def allow(self, key: _Key, cost: int = 1) -> Decision: ...
    def peek(self, key: _Key, cost: int = 1) -> Decision: ...
    def reset(self, key: _Key) -> None: ...
    def allow_many(self, pairs: Iterable[Tuple[_Key, int]]) -> list[_Result]: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Limiter": ...
    def __exit__(self, *exc: object) -> bool: ...
    def _op_start(
        self, pairs: Iterable[Tuple[_Key, int]], spend: bool, now_us: int = ...
    ) -> Op: ...
    def _decide_at(self, key: _Key, cost: int, spend: bool, now_us: int) -> Decision: ...
    def _op_start_reset(self, key: _Key) -> Op: ...
    def _endpoint(self) -> _Endpoint: ...
    def _handshake_start(self) -> Handshake: ...
    def _stats(self) -> dict[str, int]: ...

def script_source() -> str: ...
def script_sha1() -> str: ...
def _error(code: int, message: str) -> BaseException: ...
