"""hirate.AsyncLimiter: the limiter on the running asyncio event loop.

The C core does everything but the network I/O: it checks the arguments,
answers from the deny cache, keeps the circuit breaker and the failure policy,
encodes the script calls and reads the replies (the "op" hooks of
hirate._hirate). This module only moves those bytes over non-blocking
connections of the running loop (a Protocol on loop.create_connection), so a
call that waits for Redis never blocks the loop, and no thread is involved.

Without a URL the C limiter decides from memory at once, and the coroutines
call it directly.
"""

import asyncio
import collections
import os
import random
import socket
import sys

from . import _hirate

__all__ = ["AsyncLimiter"]

# After a failed connect (or a refused AUTH/SELECT) new connections wait out
# a backoff doubling from the first to the last, each jittered by +-25%, as
# the C pool does: a wrong password must not become a storm of connections.
_BACKOFF_FIRST = 0.010
_BACKOFF_LAST = 1.0

# The longest one-line reply (to AUTH, SELECT, DEL) read: Redis' error
# messages are far shorter, and a peer that never ends its line must not
# grow the buffer without bound.
_LINE_MAX = 4096

# How SELECT's error replies are classed, as the core classes error replies
# (proto.c, hirate_proto_error_class); anything else is HIRATE_EREPLY.
_UNAVAILABLE = frozenset([b"OOM", b"BUSY", b"READONLY", b"LOADING", b"MASTERDOWN",
                          b"CLUSTERDOWN", b"TRYAGAIN", b"MISCONF", b"NOREPLICAS"])


def _error_code(line):
    """The hirate code of an error reply line such as b"-LOADING ..."."""
    word = line[1:].split(b" ", 1)[0]
    if word in _UNAVAILABLE:
        return _hirate.ESERVER
    if word in (b"WRONGPASS", b"NOAUTH"):
        return _hirate.EAUTH
    if word == b"NOPERM":
        return _hirate.ENOPERM
    return _hirate.EREPLY


if sys.version_info >= (3, 11):
    async def _within(seconds, coro):
        """coro's result, or TimeoutError after seconds (a connect). asyncio.timeout,
        unlike wait_for before 3.12, never swallows the caller's own cancellation."""
        async with asyncio.timeout(seconds):
            return await coro
else:
    def _within(seconds, coro):
        return asyncio.wait_for(coro, seconds)


def _expire(fut):
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError())


async def _wait(loop, seconds, fut):
    """fut's result, or asyncio.TimeoutError once seconds have passed. A timer
    fails fut itself: far cheaper than _within, which cancels the waiting
    task and takes the cancellation back, on every call. A caller's own
    cancellation goes through as CancelledError."""
    timer = loop.call_later(seconds, _expire, fut)
    try:
        return await fut
    finally:
        timer.cancel()


def _given(fut):
    """The connection fut was resolved with, or None (not yet, cancelled,
    timed out, or resolved with None)."""
    if fut.done() and not fut.cancelled() and fut.exception() is None:
        return fut.result()
    return None


class _Failure(Exception):
    """The I/O failed with a hirate code (ECONNECT, ETIMEDOUT, EIO, EPROTO,
    EAUTH ...): the op is failed with it, or reset() raises it."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def _handshake_kinds(request, replies):
    """What each of the handshake's commands is, for messages: ("AUTH",
    "SELECT 2"), never AUTH's arguments. The commands are RESP arrays of
    bulk strings, read by their lengths: a password may hold any byte."""
    kinds = []
    pos = 0
    for _ in range(replies):
        end = request.index(b"\r\n", pos)
        argc = int(request[pos + 1:end])
        pos = end + 2
        args = []
        for _ in range(argc):
            end = request.index(b"\r\n", pos)
            n = int(request[pos + 1:end])
            args.append(request[end + 2:end + 2 + n])
            pos = end + 4 + n
        kinds.append("AUTH" if args[0] == b"AUTH" else b" ".join(args).decode())
    return tuple(kinds)


def _results(op, failure):
    """op.results(). When a connection could not be had (failure), an error
    raised for it carries the failure's own words ("AUTH refused: ...",
    "SELECT 99 refused: ..."), as hirate.Limiter's does, not only the code's."""
    if failure is None:
        return op.results()
    try:
        return op.results()
    except _hirate.Error as e:
        if e.code != failure.code:
            raise
        raise _hirate._error(failure.code, str(failure)) from None


class _Conn(asyncio.Protocol):
    """One Redis connection. It serves one call at a time: that call sets a
    waiter and either an op (script calls) or a number of one-line replies to
    collect (the handshake, DEL). Replies are fed to the op as they arrive, in
    the loop's own callback, so a call costs one wake-up of its task."""

    def __init__(self, pool):
        self.pool = pool
        self.transport = None
        self.closed = False
        self.buf = b""        # bytes read but not used yet
        self.op = None
        self.lines = 0        # one-line replies still wanted
        self.got = None       # and those collected
        self.waiter = None    # the current call's future
        self.done = False     # the op reached OP_DONE
        self.extra = False    # bytes came after the last reply

    # -- asyncio.Protocol

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        waiter = self.waiter
        if waiter is None or waiter.done():
            # Nobody asked (a late reply after a timeout, or bytes after a
            # call ended): the stream is out of step for good.
            self.extra = True
            self.abort()
            return
        if self.buf:
            data = self.buf + data
            self.buf = b""
        try:
            if self.op is not None:
                self._feed(data)
            else:
                self._collect(data)
        except Exception as e:  # MemoryError and the like: the call fails
            self.abort()
            if not waiter.done():
                waiter.set_exception(e)

    def eof_received(self):
        return False  # close: Redis does not half-close a healthy connection

    def connection_lost(self, exc):
        self.closed = True
        self.pool._lost(self)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(_Failure(_hirate.EIO, "Redis closed the connection"))

    # -- the calls

    def _feed(self, data):
        op = self.op
        while True:
            state, used = op.feed(data)
            if state == _hirate.OP_MORE:
                self.buf = bytes(data[used:])
                return
            if used != len(data):
                # A reply nobody asked for: after DONE the connection must
                # not be reused; before a second pass (EVAL after NOSCRIPT) it
                # would be read as that pass's answer.
                self.extra = True
                if state == _hirate.OP_SEND:
                    raise _Failure(_hirate.EPROTO, "malformed reply from Redis: "
                                   "bytes after the reply")
            if state == _hirate.OP_SEND:
                self.transport.write(op.request)
                return
            self.done = True
            self.waiter.set_result(None)
            return

    def _collect(self, data):
        got = self.got
        start = 0
        while self.lines:
            end = data.find(b"\r\n", start)
            if end < 0:
                if len(data) - start > _LINE_MAX:
                    raise _Failure(_hirate.EPROTO, "malformed reply from Redis: a line "
                                   "longer than %d bytes" % _LINE_MAX)
                self.buf = bytes(data[start:])
                return
            got.append(bytes(data[start:end]))
            start = end + 2
            self.lines -= 1
        self.extra = start != len(data)
        self.waiter.set_result(got)

    def start(self, op, waiter):
        self.op = op
        self.waiter = waiter
        self.done = False
        self.transport.write(op.request)

    def ask(self, request, replies, waiter):
        """Sends request and collects its `replies` one-line replies."""
        self.op = None
        self.lines = replies
        self.got = []
        self.waiter = waiter
        self.transport.write(request)

    def finish(self):
        self.op = None
        self.waiter = None
        self.got = None

    def abort(self):
        """Closes at once, dropping anything unsent or unread."""
        if self.closed:
            return
        self.closed = True
        try:
            self.transport.abort()
        except RuntimeError:
            # The loop is closed and can no longer close its transport: end
            # the connection at least (the descriptor goes with the transport).
            sock = self.transport.get_extra_info("socket")
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.pool._lost(self)


async def _closer(pool):
    """Closes pool when the loop shuts down. The loop closes the async
    generators still open when it ends (asyncio.run, loop.shutdown_asyncgens()),
    which is the one notice a loop gives that its transports must go."""
    try:
        yield
    finally:
        pool.close()


class _Pool:
    """The connections of one AsyncLimiter on one event loop: at most
    pool_size, each owned by one call at a time. A loop's transports cannot
    serve another loop, hence one pool per loop."""

    def __init__(self, owner, loop):
        self.owner = owner
        self.loop = loop
        self.idle = []          # ready connections, most recently used last
        self.conns = set()      # every open connection
        self.connecting = 0     # connections being opened
        self.waiters = collections.deque()   # calls waiting for a connection
        self.failing = False    # the last connect failed ...
        self.code = 0           # ... with this code
        self.message = ""
        self.backoff = 0.0
        self.next_connect = 0.0
        self.closed = False
        self.closer = None

    # -- taking and giving back connections

    async def acquire(self):
        """An idle connection, a new one while the pool has room, or the next
        one given back; _Failure when none comes within the timeout."""
        owner = self.owner
        while True:
            if self.closed:
                raise _Failure(_hirate.ECLOSED, "the limiter is closed")
            idle = self.idle
            while idle:
                conn = idle.pop()
                if not conn.closed:
                    return conn
            if len(self.conns) + self.connecting < owner._pool_size:
                return await self._connect()
            fut = self.loop.create_future()
            self.waiters.append(fut)
            try:
                conn = await _wait(self.loop, owner._timeout, fut)
            except asyncio.TimeoutError:
                raise _Failure(_hirate.ETIMEDOUT, "all %d Redis connections stayed busy for "
                               "%g s" % (owner._pool_size, owner._timeout)) from None
            except BaseException:
                # Cancelled: a connection handed over meanwhile goes back.
                given = _given(fut)
                if given is not None:
                    self.release(given, True)
                raise
            finally:
                try:
                    self.waiters.remove(fut)
                except ValueError:
                    pass
            if conn is not None:
                return conn
            # None: a connection closed, so there is room to open one.

    def release(self, conn, healthy):
        conn.finish()
        if not healthy or conn.closed or self.closed:
            conn.abort()
            return
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(conn)
                return
        self.idle.append(conn)

    def _lost(self, conn):
        """conn is closed: its place in the pool is free."""
        if conn in self.conns:
            self.conns.discard(conn)
            if not self.closed:
                self.owner._dropped += 1
            try:
                self.idle.remove(conn)
            except ValueError:
                pass
            self._wake()

    def _wake(self, everyone=False):
        """Tells waiting calls that there is room for a new connection."""
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                if not everyone:
                    return

    # -- opening connections

    async def _connect(self):
        now = self.loop.time()
        if self.failing:
            if now < self.next_connect:
                # The code of the failure itself: a wrong password stays a
                # configuration error, an outage stays an outage.
                raise _Failure(self.code, "not reconnecting for %d ms after: %s"
                               % (int((self.next_connect - now) * 1000) + 1, self.message))
            # Only this caller tries; the others keep failing fast.
            self.backoff = min(self.backoff * 2, _BACKOFF_LAST)
            self.next_connect = now + self.backoff * random.uniform(0.75, 1.25)
        self.connecting += 1
        try:
            conn = await self._open()
        except _Failure as f:
            self.connecting -= 1
            if not self.failing:
                self.failing = True
                self.backoff = _BACKOFF_FIRST
                self.next_connect = (self.loop.time() +
                                     self.backoff * random.uniform(0.75, 1.25))
            self.code = f.code
            self.message = str(f)
            # Every waiting call now meets the same failure at once, as
            # calls do during the backoff, instead of waiting out a timeout.
            self._wake(everyone=True)
            raise
        except BaseException:
            self.connecting -= 1   # cancelled: nothing learnt about Redis
            self._wake()
            raise
        self.connecting -= 1
        self.failing = False
        self.backoff = 0.0
        if self.closed:
            conn.abort()
            raise _Failure(_hirate.ECLOSED, "the limiter is closed")
        self.conns.add(conn)
        return conn

    async def _open(self):
        owner = self.owner
        loop = self.loop
        owner._connects += 1
        try:
            if owner._path is not None:
                coro = loop.create_unix_connection(lambda: _Conn(self), owner._path)
            else:
                coro = loop.create_connection(lambda: _Conn(self), owner._host, owner._port)
            _, conn = await _within(owner._connect_timeout, coro)
        except asyncio.TimeoutError:
            raise _Failure(_hirate.ECONNECT, "connect to %s: timed out after %g s"
                           % (owner._where, owner._connect_timeout)) from None
        except OSError as e:
            raise _Failure(_hirate.ECONNECT, "connect to %s: %s"
                           % (owner._where, e.strerror or e)) from None
        if owner._path is None:
            sock = conn.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        request, replies = owner._handshake
        if not replies:
            return conn
        try:
            lines = await self._ask(conn, request, replies)
            for what, line in zip(owner._handshake_kinds, lines):
                if line[:1] == b"-":
                    # A refused AUTH is a wrong password, whatever the words;
                    # SELECT is classed as the core classes error replies.
                    code = _hirate.EAUTH if what == "AUTH" else _error_code(line)
                    raise _Failure(code, "%s refused: %s" % (
                        what, line[1:121].decode("utf-8", "replace")))
                if line != b"+OK":
                    raise _Failure(_hirate.EPROTO, "malformed reply from Redis: %s gave no +OK"
                                   % what)
        except BaseException:
            conn.abort()
            raise
        return conn

    async def _ask(self, conn, request, replies):
        """Sends request on conn, returns its one-line replies."""
        fut = self.loop.create_future()
        conn.ask(request, replies, fut)
        try:
            lines = await _wait(self.loop, self.owner._timeout, fut)
        except asyncio.TimeoutError:
            conn.abort()
            raise _Failure(_hirate.ETIMEDOUT, "no reply from Redis within %g s"
                           % self.owner._timeout) from None
        if conn.extra:
            conn.abort()
            raise _Failure(_hirate.EPROTO, "malformed reply from Redis: bytes after the reply")
        return lines

    # -- one decision's round trip

    async def run(self, op):
        """Sends op's requests and feeds it the replies. On return op is
        settled: DONE, or failed with the I/O error's code (the policy
        decides outages). Returns the _Failure of a connection that could
        not be had, whose message is better than the code's (see _results)."""
        try:
            conn = await self.acquire()
        except _Failure as f:
            op.fail(f.code)
            return f
        except BaseException:
            # Cancelled before anything was sent. Settle the op without
            # blaming Redis: an outage code would open the breaker because a
            # caller gave up.
            op.fail(_hirate.ECLOSED)
            raise
        healthy = False
        try:
            fut = self.loop.create_future()
            conn.start(op, fut)
            await _wait(self.loop, self.owner._timeout, fut)
            healthy = not op.drop and not conn.extra
        except asyncio.TimeoutError:
            # No reply in time (one at the very deadline would have resolved
            # fut first). The call may have run: no retry, the policy
            # decides, and this connection goes, so that its late reply is
            # never read as the answer to another call.
            op.fail(_hirate.ETIMEDOUT)
        except _Failure as f:
            if not conn.done:
                # A call cut off by close() gets ClosedError, not the policy.
                op.fail(_hirate.ECLOSED if self.closed else f.code)
        except BaseException:
            # Cancelled (or worse) mid-call: the connection goes; the op is
            # settled without blaming Redis, as above.
            if not conn.done:
                op.fail(_hirate.ECLOSED)
            raise
        finally:
            self.release(conn, healthy)

    async def reset(self, request):
        """DEL over a pooled connection; raises _Failure as hirate_reset()
        returns its codes."""
        conn = await self.acquire()
        healthy = False
        try:
            line, = await self._ask(conn, request, 1)
            if line[:1] == b":":
                healthy = True
                return
            if line[:1] == b"-":
                code = _error_code(line)
                # The server is the wrong one to talk to now.
                healthy = line[1:].split(b" ", 1)[0] not in (b"READONLY", b"LOADING",
                                                              b"MASTERDOWN")
                raise _Failure(code, "Redis replied: %s"
                               % line[1:121].decode("utf-8", "replace"))
            raise _Failure(_hirate.EPROTO, "malformed reply from Redis: DEL gave no integer")
        finally:
            self.release(conn, healthy)

    def close(self):
        if self.closed:
            return
        self.closed = True
        if self.owner._pools.get(self.loop) is self:
            del self.owner._pools[self.loop]
        for conn in list(self.conns):
            conn.abort()
        self.idle.clear()
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # acquire() sees the pool closed


class AsyncLimiter:
    """The limiter of hirate.Limiter for asyncio: the same arguments, the same
    decisions, but every call is a coroutine that waits for Redis on the
    running event loop without blocking it.

        lim = hirate.AsyncLimiter("redis://127.0.0.1:6379", capacity=10, rate=2)
        d = await lim.allow("alice")
        if not d:
            ...  # refuse; retry in d.retry_after seconds
        await lim.close()

    One AsyncLimiter may be shared by any number of tasks, and by several event
    loops (each gets connections of its own, at most pool_size). Without a URL
    it decides from memory, at once.
    """

    def __init__(self, url=None, *, capacity, rate, prefix="rl:", on_error="local",
                 instances=1, connect_timeout=0.25, timeout=0.1, deny_cache=True,
                 max_keys=1_000_000, pool_size=16):
        # The C limiter checks every argument (and never connects itself
        # here: the op hooks leave the I/O to this class).
        self._lim = _hirate.Limiter(
            url, capacity=capacity, rate=rate, prefix=prefix, on_error=on_error,
            instances=instances, connect_timeout=connect_timeout, timeout=timeout,
            deny_cache=deny_cache, max_keys=max_keys, pool_size=pool_size)
        self._pools = None if self._lim.url is None else {}
        self._connects = 0
        self._dropped = 0
        if self._pools is None:
            return
        host, port, path, self._connect_timeout, self._timeout = self._lim._endpoint()
        self._host, self._port, self._path = host, port, path
        if path is not None:
            self._where = path
        elif ":" in host:
            self._where = "[%s]:%d" % (host, port)
        else:
            self._where = "%s:%d" % (host, port)
        self._pool_size = pool_size
        # AUTH and SELECT bytes (the password is in them: never shown).
        self._handshake = self._lim._handshake()
        request, replies = self._handshake
        self._handshake_kinds = _handshake_kinds(request, replies)
        # The DEL of reset(), as hirate_reset encodes it: the prefix as bytes.
        self._prefix = self._lim.prefix.encode()

    @classmethod
    def from_env(cls, **kwargs):
        """An AsyncLimiter on $REDIS_URL (in memory when it is unset or empty)."""
        return cls(os.environ.get("REDIS_URL") or None, **kwargs)

    # -- read-only attributes, as hirate.Limiter's

    @property
    def capacity(self):
        return self._lim.capacity

    @property
    def rate(self):
        return self._lim.rate

    @property
    def prefix(self):
        return self._lim.prefix

    @property
    def on_error(self):
        return self._lim.on_error

    @property
    def url(self):
        """The Redis URL with the password replaced by ***, or None."""
        return self._lim.url

    def __repr__(self):
        return "<hirate.AsyncLimiter url=%r capacity=%d rate=%r on_error=%r>" % (
            self.url, self.capacity, self.rate, self.on_error)

    # -- decisions

    async def allow(self, key, cost=1):
        """Spends cost tokens from key's bucket if it holds that many."""
        if self._pools is None:
            return self._lim.allow(key, cost)
        op = self._lim._op_start([(key, cost)], True)
        if op.request is not None:
            return _results(op, await self._pool().run(op))[0]
        return op.results()[0]

    async def peek(self, key, cost=1):
        """What allow(key, cost) would decide now, without spending anything."""
        if self._pools is None:
            return self._lim.peek(key, cost)
        op = self._lim._op_start([(key, cost)], False)
        if op.request is not None:
            return _results(op, await self._pool().run(op))[0]
        return op.results()[0]

    async def allow_many(self, pairs):
        """allow() for every (key, cost) pair, in one pipelined round trip;
        a list of Decisions in the same order."""
        if self._pools is None:
            return self._lim.allow_many(pairs)
        op = self._lim._op_start(list(pairs), True)
        if op.request is not None:
            return _results(op, await self._pool().run(op))
        return op.results()

    async def reset(self, key):
        """Forgets key's bucket: it is full again (in Redis, in the deny cache
        and in the local fallback)."""
        if self._pools is None:
            return self._lim.reset(key)
        # What the core keeps of the key goes first, as in hirate_reset(); it
        # also checks the key and raises as reset() would.
        self._lim._reset_local(key)
        key = key.encode() if isinstance(key, str) else bytes(key)
        full = self._prefix + key
        request = b"*2\r\n$3\r\nDEL\r\n$%d\r\n%s\r\n" % (len(full), full)
        try:
            await self._pool().reset(request)
        except _Failure as f:
            raise _hirate._error(f.code, str(f)) from None

    async def _decide(self, pairs, spend, now_us=-1):
        """Decisions at an injected time (µs), for the shared test vectors."""
        if self._pools is None:
            return [self._lim._decide_at(key, cost, spend, now_us) for key, cost in pairs]
        op = self._lim._op_start(list(pairs), spend, now_us)
        if op.request is not None:
            return _results(op, await self._pool().run(op))
        return op.results()

    def _stats(self):
        """The core's counters, with this limiter's own connects and dropped
        connections (the C pool is not used by an AsyncLimiter)."""
        stats = self._lim._stats()
        if self._pools is not None:
            stats["connects"] = self._connects
            stats["conns_dropped"] = self._dropped
        return stats

    # -- the pool of the running loop

    def _pool(self):
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            pool = self._new_pool(loop)
        return pool

    def _new_pool(self, loop):
        # Pools of loops that ended without shutting down their async
        # generators are forgotten here (their transports die with them).
        for other in list(self._pools.values()):   # (another thread may add one)
            if other.loop.is_closed():
                other.close()
        pool = _Pool(self, loop)
        self._pools[loop] = pool
        # An async generator that the loop closes when it shuts down: it
        # closes this pool's connections while the loop still runs. Its first
        # step registers it with the loop and runs to the yield without
        # awaiting anything.
        pool.closer = _closer(pool)
        step = pool.closer.asend(None)
        try:
            step.send(None)
        except StopIteration:
            pass
        return pool

    # -- closing

    async def close(self):
        """Closes every connection; afterwards calls raise hirate.ClosedError.
        Closing twice is fine."""
        self._lim.close()
        if not self._pools:
            return
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, pool in list(self._pools.items()):
            if loop is current or loop.is_closed():
                pool.close()
            else:
                try:
                    loop.call_soon_threadsafe(pool.close)
                except RuntimeError:  # closed meanwhile
                    pool.close()
            if loop is current and pool.closer is not None:
                await pool.closer.aclose()

    aclose = close

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        await self.close()
