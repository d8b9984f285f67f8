"""hirate.Health: what Limiter.check() and AsyncLimiter.check() found (the
C core asks; see hirate.h, hirate_check)."""

import dataclasses
from typing import Any, Dict, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class NodeHealth:
    """One Redis node that decisions go to, as the check found it.

    addr        "host:port", or the unix socket's path
    ok          decisions can go to it
    error       None, or the name of the error a decision would meet there
                ("ECONNECT", "ETIMEDOUT", "EAUTH", "ESERVER" for a replica
                or a loading server, ...)
    message     that error's words ("" when ok); never a password
    role        ROLE's first word ("master", "slave"), or None when the node
                did not answer or an ACL denies ROLE
    functions   True: decisions go there as FCALL; False: as EVALSHA; None:
                unknown
    loaded      True: hirate's function library (or script) is loaded there;
                False: not yet (the next decision loads it, so the node is
                still healthy); None: unknown
    latency     the round trip in seconds, or None without an answer
    """

    addr: str
    ok: bool
    error: Optional[str]
    message: str
    role: Optional[str]
    functions: Optional[bool]
    loaded: Optional[bool]
    latency: Optional[float]

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Health:
    """The outcome of a check: ok when every node is (a limiter without
    Redis has no node and is ok); error is the first failing node's."""

    ok: bool
    error: Optional[str]
    nodes: Tuple[NodeHealth, ...]

    def __bool__(self) -> bool:
        return self.ok

    def as_dict(self) -> Dict[str, Any]:
        """The check as JSON-ready data, e.g. for a readiness endpoint."""
        return {"ok": self.ok, "error": self.error,
                "nodes": [n.as_dict() for n in self.nodes]}

    @classmethod
    def _of(cls, error, nodes):
        """From the core's figures: error a code's name or None; each node
        (addr, error, message, role, functions, loaded, latency_us), with
        -1 and "" for what is unknown."""
        def known(v):
            return None if v < 0 else bool(v)
        return cls(ok=error is None, error=error, nodes=tuple(
            NodeHealth(addr=addr, ok=err is None, error=err, message=msg, role=role or None,
                       functions=known(functions), loaded=known(loaded),
                       latency=None if us < 0 else us / 1e6)
            for addr, err, msg, role, functions, loaded, us in nodes))
