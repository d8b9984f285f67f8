"""Types of hirate._hirate, the C extension (import the public names from hirate)."""

import builtins
import os
from typing import (Final, Iterable, List, Literal, Mapping, Optional, Sequence, Tuple, TypedDict,
                    Union, final)
from typing_extensions import disjoint_base

from . import Band
from ._health import Health
from ._stats import Stats

_Key = Union[str, bytes, bytearray, memoryview]
_Band = Union[Band, Tuple[int, float], Tuple[int, float, Optional[str]], str]
_Limits = Union[str, Sequence[_Band]]
_Path = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

__version__: Final[str]

IO_MORE: Final[int]
IO_SEND: Final[int]
IO_DONE: Final[int]
IO_PROBE: Final[int]
OP_REFUND: Final[int]
IO_REPLY_MAX: Final[int]
ERRMSG_SIZE: Final[int]
KEY_MAX: Final[int]
# What a Limiter is made with for an argument not given (seconds for
# durations), and the client address rules' ipv6_subnet.
DEFAULTS: Final[Mapping[str, Union[str, int, float, bool]]]
HEADERS_RATELIMIT: Final[int]
HEADERS_LEGACY: Final[int]
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
        band: int = ...,
        bands: Optional[Sequence["Decision"]] = ...,
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
    @property
    def band(self) -> int: ...
    @property
    def bands(self) -> Tuple["Decision", ...]: ...
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
    @property
    def legs(self) -> int: ...
    def feed(self, data: Union[bytes, bytearray, memoryview]) -> Tuple[int, int]: ...
    def fail(self, code: int, why: Optional[str] = ...) -> None: ...
    def leg_node(self, leg: int, /) -> int: ...
    def leg_request(self, leg: int, /) -> Optional[bytes]: ...
    def leg_feed(
        self, leg: int, data: Union[bytes, bytearray, memoryview], /
    ) -> Tuple[int, int]: ...
    def leg_fail(self, leg: int, code: int, why: Optional[str] = ...) -> None: ...
    def leg_drop(self, leg: int, /) -> bool: ...
    def next(self) -> int: ...
    def results(self) -> list[_Result]: ...
    def result(self) -> None: ...
    def health(self) -> Health: ...

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

@disjoint_base
class Limiter:
    """url: redis://[user:password@]host[:port][/db], rediss://... (TLS),
    unix:///path[?db=N], or a Redis Cluster:
    redis+cluster://[user:password@]host:port[,host:port...] (seeds: any
    nodes, a replica too; pool_size is per node) and rediss+cluster://...
    (TLS), or a Redis Sentinel service:
    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]
    (the sentinels; user and password are the master's) and
    rediss+sentinel://... (TLS); None: in memory."""

    def __new__(
        cls,
        url: Optional[str] = ...,
        *,
        capacity: int = ...,
        rate: float = ...,
        limits: Optional[_Limits] = ...,
        prefix: str = ...,
        on_error: str = ...,
        instances: int = ...,
        connect_timeout: Union[float, str] = ...,
        timeout: Union[float, str] = ...,
        deny_cache: bool = ...,
        max_keys: int = ...,
        pool_size: int = ...,
        tls_ca_file: Optional[_Path] = ...,
        tls_ca_dir: Optional[_Path] = ...,
        tls_cert_file: Optional[_Path] = ...,
        tls_key_file: Optional[_Path] = ...,
        tls_server_name: Optional[str] = ...,
        tls_verify: bool = ...,
        sentinel_username: Optional[str] = ...,
        sentinel_password: Optional[str] = ...,
        functions: bool = ...,
        deny_cache_max: Union[float, str] = ...,
    ) -> "Limiter": ...
    @classmethod
    def from_env(
        cls,
        *,
        capacity: int = ...,
        rate: float = ...,
        limits: Optional[_Limits] = ...,
        prefix: str = ...,
        on_error: str = ...,
        instances: int = ...,
        connect_timeout: Union[float, str] = ...,
        timeout: Union[float, str] = ...,
        deny_cache: bool = ...,
        max_keys: int = ...,
        pool_size: int = ...,
        tls_ca_file: Optional[_Path] = ...,
        tls_ca_dir: Optional[_Path] = ...,
        tls_cert_file: Optional[_Path] = ...,
        tls_key_file: Optional[_Path] = ...,
        tls_server_name: Optional[str] = ...,
        tls_verify: bool = ...,
        sentinel_username: Optional[str] = ...,
        sentinel_password: Optional[str] = ...,
        functions: bool = ...,
        deny_cache_max: Union[float, str] = ...,
    ) -> "Limiter": ...
    @property
    def capacity(self) -> int: ...
    @property
    def rate(self) -> float: ...
    @property
    def bands(self) -> Tuple[Band, ...]: ...
    @property
    def prefix(self) -> str: ...
    @property
    def url(self) -> Optional[str]: ...
    @property
    def on_error(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def is_cluster(self) -> bool: ...
    @property
    def is_sentinel(self) -> bool: ...
    def allow(self, key: _Key, cost: int = 1) -> Decision: ...
    def peek(self, key: _Key, cost: int = 1) -> Decision: ...
    def reset(self, key: _Key) -> None: ...
    def refund(self, key: _Key, tokens: int = 1) -> Decision: ...
    def allow_many(self, pairs: Iterable[Tuple[_Key, int]]) -> list[_Result]: ...
    def close(self) -> None: ...
    def stats(self) -> Stats: ...
    def check(self) -> Health: ...
    def _op_start_check(self) -> Op: ...
    def __enter__(self) -> "Limiter": ...
    def __exit__(self, *exc: object) -> None: ...
    def _op_start(
        self, pairs: Iterable[Tuple[_Key, int]], spend: int, now_us: int = ...
    ) -> Op: ...
    def _decide_at(self, key: _Key, cost: int, spend: int, now_us: int) -> Decision: ...
    def _op_start_reset(self, key: _Key) -> Op: ...
    def _endpoint(self, node: int = ...) -> _Endpoint: ...
    def _handshake_start(self, node: int = ...) -> Handshake: ...
    def _stats(self) -> dict[str, int]: ...

def script_source() -> str: ...
def script_sha1() -> str: ...
def function_library() -> str: ...
def function_name() -> str: ...
def parse_limits(text: str, /) -> list[Tuple[int, float, int, int]]: ...
def refill_seconds(capacity: int, rate: float, /) -> int: ...
def response(
    limits: Sequence[Tuple[str, int, float, Decision]], flags: int, /
) -> Tuple[int, Optional[int], List[Tuple[str, str]], Optional[str], Optional[str],
           Optional[str]]: ...
def _error(code: int, message: str) -> BaseException: ...

CLIENT_TEXT_MAX: Final[int]

@final
class ClientRules:
    header: Final[str]
    uses_header: Final[bool]
    hops: Final[int]
    ipv6_subnet: Final[int]
    def __new__(
        cls,
        trusted_proxies: Sequence[Union[str, bytes]],
        proxy_hops: float = ...,
        header: Optional[Union[str, bytes]] = ...,
        ipv6_subnet: float = ...,
    ) -> "ClientRules": ...
    def resolve(self, peer: Optional[Union[str, bytes]],
                header_values: Sequence[Union[str, bytes]] = ..., /) -> Optional[str]: ...
    def key(self, address: Optional[Union[str, bytes]], /) -> Optional[str]: ...

def ident_for_ip(key: Optional[Union[str, bytes]], /) -> bytes: ...
def ident_for_key(value: Union[str, bytes], /) -> bytes: ...
def bucket_key(ident: Union[str, bytes], scope: Optional[Union[str, bytes]],
               head: Optional[Union[str, bytes]], /) -> bytes: ...
def _empty_stats() -> Stats: ...
