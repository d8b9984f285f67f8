"""Types of hirate._http, shared by hirate.flask and hirate.asgi."""

from typing import (Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence,
                    Tuple, Union)

from . import Decision, Limiter

__all__ = ["Limit", "Result", "ClientIP", "key_header", "refill_seconds"]

KEY_MAX: int
SCOPE_MAX: int
METHODS: FrozenSet[str]
SETTINGS: Dict[str, Tuple[str, Any]]
LIMITER_OPTIONS: Tuple[str, ...]

def env_value(text: str) -> Any: ...
def from_environ(environ: Mapping[str, str], prefix: str,
                 names: Iterable[str]) -> Dict[str, Any]: ...

_KeyValue = Union[str, bytes, bytearray, memoryview, int, None]
_KeyFunc = Callable[[Any], Any]
_CostFunc = Callable[[Any], Any]

def refill_seconds(capacity: int, rate: float) -> int: ...
def check_scope(scope: str, what: str = ...) -> str: ...
_LimitSpec = Union["Limit", str, Tuple[int, float]]

def check_limits(limits: Union[_LimitSpec, Iterable[_LimitSpec]], where: str) -> List["Limit"]: ...
def declare(capacity: Union[int, str], rate: Optional[float] = None,
            **options: Any) -> List["Limit"]: ...
def ident_for_key(value: Union[str, bytes, bytearray, memoryview, int]) -> bytes: ...
def ident_for_ip(address: Optional[str]) -> bytes: ...
def key_header(name: str) -> Callable[[Any], Optional[str]]: ...
_Call = Union[Tuple[Any, Union[str, bytes], int, bool], Tuple[Any, Union[str, bytes], int]]

def decide_sync(calls: Sequence[_Call]) -> List[Decision]: ...

class decide_order:
    peeks: List[int]
    last: Optional[int]
    then: List[int]
    def __init__(self, calls: Sequence[_Call]) -> None: ...

def identity(client_ip: "ClientIP", key: Any = None, address: Optional[str] = None) -> bytes: ...
def client_buckets(applied: Sequence[Tuple["Limit", str]], default_key: Optional[_KeyFunc],
                   ident: bytes, limiter_for: Callable[[Tuple[Tuple[Any, ...], ...]], Any]
                   ) -> Tuple[List["Group"], List[Tuple[Any, bytes]]]: ...
def refund_sync(calls: Sequence[Tuple[Any, bytes]], tokens: int) -> List[Decision]: ...
async def refund_async(calls: Sequence[Tuple[Any, bytes]], tokens: int) -> List[Decision]: ...
def charges(groups: Sequence["Group"], calls: Sequence[_Call]
            ) -> List[Tuple[int, "Group", Tuple[Any, Union[str, bytes], int]]]: ...
def charge_sync(pending: Sequence[Tuple[int, "Group", Tuple[Any, Union[str, bytes], int]]],
                decisions: Sequence[Decision], response: Any) -> List[Decision]: ...

class Group:
    limits: List["Limit"]
    positions: List[int]
    scope: str
    keyfunc: Optional[_KeyFunc]
    exempt_when: Optional[Callable[[Any], Any]]
    deduct_when: Optional[Callable[[Any], Any]]
    bands: Tuple[Tuple[Any, ...], ...]
    def __init__(self, scope: str, keyfunc: Optional[_KeyFunc],
                 exempt_when: Optional[Callable[[Any], Any]],
                 deduct_when: Optional[Callable[[Any], Any]] = None) -> None: ...
    def bucket_key(self, ident: bytes) -> bytes: ...
    def cost_for(self, request: Any) -> int: ...

def plan(applied: Sequence[Tuple["Limit", str]],
         default_key: Optional[_KeyFunc] = None) -> List[Group]: ...
def band_decisions(group: Group, decision: Decision) -> Tuple[Decision, ...]: ...
def checks_of(groups: Sequence[Group], decisions: Sequence[Decision],
              n: int) -> List[Tuple["Limit", Decision]]: ...
def new_limiter(cls: Any, url: Optional[str], bands: Tuple[Tuple[Any, ...], ...],
                options: Dict[str, Any], sentinel: Dict[str, Any]) -> Any: ...

class Limit:
    capacity: int
    rate: float
    key: Optional[_KeyFunc]
    cost: Union[int, _CostFunc]
    scope: Optional[str]
    name: str
    window: int
    exempt_when: Optional[Callable[[Any], Any]]
    methods: Optional[FrozenSet[str]]
    deduct_when: Optional[Callable[[Any], Any]]
    def __init__(
        self,
        capacity: Union[int, str],
        rate: Optional[float] = None,
        *,
        key: Optional[_KeyFunc] = None,
        cost: Union[int, _CostFunc] = 1,
        scope: Optional[str] = None,
        name: Optional[str] = None,
        exempt_when: Optional[Callable[[Any], Any]] = None,
        methods: Union[str, Iterable[str], None] = None,
        deduct_when: Optional[Callable[[Any], Any]] = None,
    ) -> None: ...
    @classmethod
    def parse(
        cls,
        text: str,
        *,
        key: Optional[_KeyFunc] = None,
        cost: Union[int, _CostFunc] = 1,
        scope: Optional[str] = None,
        name: Optional[str] = None,
        exempt_when: Optional[Callable[[Any], Any]] = None,
        methods: Union[str, Iterable[str], None] = None,
        deduct_when: Optional[Callable[[Any], Any]] = None,
    ) -> List["Limit"]: ...
    @classmethod
    def of(cls, spec: _LimitSpec) -> List["Limit"]: ...
    def bucket_key(self, scope: str, ident: bytes) -> bytes: ...
    def applies_to(self, method: str) -> bool: ...
    def cost_for(self, request: Any) -> int: ...

class ClientIP:
    hops: int
    header: str
    ipv6_subnet: int
    uses_header: bool
    def __init__(
        self,
        trusted_proxies: Union[str, Iterable[Any]] = (),
        proxy_hops: int = 0,
        header: str = "X-Forwarded-For",
        ipv6_subnet: int = 64,
    ) -> None: ...
    def resolve(self, peer: Optional[str], header_values: Sequence[str] = ()) -> Optional[str]: ...
    def key(self, address: Optional[str]) -> Optional[str]: ...

class Result:
    checks: Tuple[Tuple[Limit, Decision], ...]
    allowed: bool
    retry_after: Optional[int]
    status: int
    violated: List[str]
    def __init__(self, checks: Iterable[Tuple[Limit, Decision]]) -> None: ...
    def policy_header(self) -> str: ...
    def ratelimit_header(self) -> str: ...
    def headers(self, ratelimit: bool = True, legacy: bool = False) -> List[Tuple[str, str]]: ...
    def detail(self) -> Optional[str]: ...
    def problem(self) -> Dict[str, Any]: ...
    def text(self) -> str: ...

async def decide_async(calls: Sequence[_Call]) -> List[Decision]: ...
async def charge_async(pending: Sequence[Tuple[int, "Group", Tuple[Any, Union[str, bytes], int]]],
                       decisions: Sequence[Decision], response: Any) -> List[Decision]: ...
def scope_part(text: str) -> str: ...
def as_list(value: Any, what: str) -> List[Any]: ...
def as_limits(value: Any, where: str) -> List["Limit"]: ...
async def maybe_await(value: Any) -> Any: ...
