"""hirate.AsyncLimiter on uvloop, the event loop that asyncio applications
run for speed (uvicorn picks it when it is installed): every test of
test_asyncio.py and test_asyncio_batch.py, and the AsyncLimiter half of
test_tls.py (uvloop has a TLS implementation of its own), run again with
uvloop's loop in place of asyncio's. The tests are the same functions; only
the loop differs."""

import asyncio
import types

import pytest
import uvloop

from test_asyncio import *  # noqa: F401,F403 (the tests, collected again here)
from test_asyncio_batch import *  # noqa: F401,F403
import test_tls

pytestmark = pytest.mark.timeout(120)


def _async_only(fn):
    """fn, a test of test_tls.py parametrized over KINDS, for AsyncLimiter
    alone (Limiter runs on the core's own TLS: no event loop)."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    marks = [m for m in fn.pytestmark if not (m.name == "parametrize" and m.args[0] == "kind")]
    copy.pytestmark = marks + [pytest.mark.parametrize("kind", ["AsyncLimiter"]).mark]
    return copy


# The module fixtures of test_tls.py, and those of its tests that run both kinds.
bad_servers, mtls_server = test_tls.bad_servers, test_tls.mtls_server
for _name, _fn in vars(test_tls).copy().items():
    if _name.startswith("test_") and any(m.name == "parametrize" and m.args[0] == "kind"
                                         for m in getattr(_fn, "pytestmark", [])):
        globals()[_name] = _async_only(_fn)


@pytest.fixture(autouse=True)
def _uvloop():
    """Every loop a test makes (asyncio.run, asyncio.new_event_loop) is uvloop's."""
    before = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(before)


def test_the_loops_here_are_uvloops():
    loop = asyncio.new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
