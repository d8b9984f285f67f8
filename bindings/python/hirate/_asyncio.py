"""hirate.AsyncLimiter: the limiter on the running asyncio event loop.

The C core does everything but the network I/O (hirate_io.h, through the
hooks of hirate._hirate): where to connect, the bytes that open a connection
and what their replies mean (a wrong password, a TLS mismatch, a server that
is not Redis), when a new connection may be tried, the script calls and their
replies, the circuit breaker, the deny cache and the failure policy. This
module only moves those bytes over non-blocking connections of the running
loop (a Protocol on loop.create_connection, TLS through the ssl module), so a
call that waits for Redis never blocks the loop, and no thread is involved;
it tells the core when its I/O failed, in the I/O library's words.

Over a Redis Cluster (redis+cluster://, rediss+cluster://) or a Sentinel
service (redis+sentinel://, rediss+sentinel://) every node the core names
gets a pool of its own, and an op goes in rounds: each round's legs (at most
one a node) run at once, each on a connection of its node, until the core
says every item is decided. Which node, what a redirection means, when the
map is read again, where a service's master is and when to ask its
sentinels: all the core's; no slot and no master is known here.

Without a URL the C limiter decides from memory at once, and the coroutines
call it directly.
"""

import asyncio
import collections
import dataclasses
import os
import socket
import ssl
import sys

from . import _hirate

__all__ = ["AsyncLimiter"]

# The core's defaults, shown in the signature (hirate.Limiter's are the same).
_D = _hirate.DEFAULTS


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
    """No connection could be had, or the I/O failed: a hirate code (the I/O
    library's failures mapped to ECONNECT, ETIMEDOUT, EIO or ETLS; or the
    core's own verdict on a handshake) and its words, for Op.fail()."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def _from_error(e):
    return _Failure(e.code, str(e))


def _fail(op, leg, code, why=None):
    """Op.fail, or Op.leg_fail of the leg (None: the leg-less call)."""
    if leg is None:
        op.fail(code, why)
    else:
        op.leg_fail(leg, code, why)


async def _together(coros):
    """Runs the coroutines at once, each to its end (gather would leave the
    others running when one raises), then raises the first one's exception,
    if any. Cancelled, it cancels them all, and each settles its own leg."""
    for r in await asyncio.gather(*coros, return_exceptions=True):
        if isinstance(r, BaseException):
            raise r


def _one(op):
    """The single result of op: its Decision, or its error raised."""
    r, = op.results()
    if isinstance(r, BaseException):
        raise r
    return r


def _tls_context(ep):
    """The ssl context of a rediss:// limiter, made once: the CA file or
    directory (else the system's trust store), the client certificate for
    mutual TLS, TLS 1.2 at least, and verification as
    ssl.create_default_context() does it, unless tls_verify is off."""
    try:
        ctx = ssl.create_default_context(cafile=ep["tls_ca_file"], capath=ep["tls_ca_dir"])
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if ep["tls_cert_file"] is not None:
            ctx.load_cert_chain(ep["tls_cert_file"], ep["tls_key_file"])
    except (OSError, ValueError) as e:   # ssl.SSLError is an OSError
        raise _hirate._error(_hirate.ETLS, "TLS settings: %s" % _ssl_words(e)) from None
    if not ep["tls_verify"]:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


_probe_ctx = None


def _probe_context():
    """TLS without verification, for the mismatch probe only: it asks
    whether the server speaks TLS at all, and sends no secret."""
    global _probe_ctx
    if _probe_ctx is None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        _probe_ctx = ctx
    return _probe_ctx


def _ms(seconds):
    return int(round(seconds * 1000))


def _lost_failure(exc):
    """The _Failure of a connection that ended under a call: EIO, or ETLS when
    the TLS library says the peer refused us (TLS 1.3 finishes the client's
    handshake before a server that wants a client certificate says so)."""
    if exc is None or isinstance(exc, ssl.SSLEOFError):
        return _Failure(_hirate.EIO, "Redis closed the connection")
    if isinstance(exc, ssl.SSLError):
        return _Failure(_hirate.ETLS, "receive from Redis: TLS: %s" % _ssl_words(exc))
    return _Failure(_hirate.EIO, "receive from Redis: %s" % _ssl_words(exc))


def _ssl_words(e):
    """What the TLS library said, without Python's decoration."""
    if isinstance(e, ssl.SSLCertVerificationError) and e.verify_message:
        return "certificate verify failed: %s" % e.verify_message
    if isinstance(e, ssl.SSLError) and e.reason:
        return e.reason.lower().replace("_", " ")
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


# Calls in flight on every open connection before another is opened.
PIPELINE_DEPTH = 32

# A call's future is resolved with this when its request never went and it
# must be placed on another connection (its connection failed first).
_AGAIN = object()

class _Call:
    """One op, or one leg of an op's round, on a connection: its request
    goes out in the connection's next write and its replies are read in the
    order the requests went. The connection settles the op (its replies, or
    the failure of the connection) whether or not its caller still waits;
    fut then tells the caller."""

    __slots__ = ("op", "leg", "fut", "deadline", "timeout", "cancelled")

    def __init__(self, op, leg, fut, deadline, timeout):
        self.op = op
        self.leg = leg
        self.fut = fut
        self.deadline = deadline    # loop time: its reply is due by then
        self.timeout = timeout      # seconds, for the message
        self.cancelled = False      # its caller gave up (the call still runs)

    def request(self):
        op = self.op
        return op.request if self.leg is None else op.leg_request(self.leg)

    def settle(self, failure=None):
        """Its replies came (failure None), or the connection failed it."""
        if failure is not None:
            # A caller who gave up learns nothing from an outage, and the
            # breaker learns nothing from a caller who gave up.
            code = _hirate.ECLOSED if self.cancelled else failure.code
            _fail(self.op, self.leg, code, None if self.cancelled else str(failure))
        if not self.fut.done():
            self.fut.set_result(None)


class _Conn(asyncio.Protocol):
    """One Redis connection, first opened by a Handshake (start(); it alone
    is fed then), then shared by the calls of its loop: each call's request
    goes out in the next write (one write for the calls of one loop
    iteration: at once for the first call on an idle connection, the others
    at the end of the iteration), the replies are read in order, each into
    its call's op, in the loop's own callback, so a call costs one wake-up
    of its task. The replies are matched by position, as in one batch, and
    the core's check of each reply's echoed key still guards every one."""

    def __init__(self, pool, first=None, waiter=None):
        self.pool = pool
        self.first = first    # the Handshake to send as soon as it is connected
        self.first_waiter = waiter
        self.transport = None
        self.closed = False
        self.buf = b""        # bytes read but not used yet
        self.op = None        # the Handshake being fed, while it opens
        self.waiter = None    # the handshake's future
        self.done = False     # the handshake reached IO_DONE
        self.extra = False    # bytes came after the last reply
        self.lost = None      # the _Failure that ended it, once closed
        self.sent = collections.deque()   # calls whose requests went, in order
        self.out = []         # calls whose requests go in the next write
        self.retiring = False # the core said close it: no new call, closed once idle
        self.joinable = False # a write of this loop iteration is still open (out)
        self.timer = None     # the loop's timer for the earliest deadline of its calls
        self.timer_at = 0.0   # (or of a call answered since: see _check)

    @property
    def depth(self):
        """Calls on it: sent and not yet answered, or to go in the next write."""
        return len(self.sent) + len(self.out)

    # -- asyncio.Protocol

    def connection_made(self, transport):
        self.transport = transport
        if self.first is not None:
            # At once, in this callback: a TLS 1.3 server that refuses the
            # client's certificate answers the first request with an alert
            # and closes, and a request sent later (after the server closed)
            # meets a reset that takes the alert with it.
            first, self.first = self.first, None
            self.start(first, self.first_waiter)

    def data_received(self, data):
        if self.buf:
            data = self.buf + data
            self.buf = b""
        if self.sent:
            try:
                self._feed_calls(data)
            except Exception as e:   # MemoryError and the like
                self._fail_all(_Failure(_hirate.EIO, "reading a reply: %r" % (e,)))
            return
        waiter = self.waiter
        if waiter is None or waiter.done():
            # Nobody asked (a late reply after a timeout, or bytes after the
            # last call's): the stream is out of step for good.
            self.extra = True
            self.abort()
            return
        try:
            self._feed_handshake(data)
        except Exception as e:
            self.abort()
            if not waiter.done():
                waiter.set_exception(e)

    def eof_received(self):
        return False  # close: Redis does not half-close a healthy connection

    def connection_lost(self, exc):
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        # Kept for the next call when none is waiting: a TLS 1.3 server that
        # refuses the client certificate says so right after the handshake,
        # before the first request goes out.
        self.lost = _lost_failure(exc)
        self.pool._lost(self)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(self.lost)
        self._fail_all(self.lost)

    # -- the handshake

    def _feed_handshake(self, data):
        state, used = self.op.feed(data)
        if state == _hirate.IO_MORE:
            self.buf = bytes(data[used:])
            return
        if used != len(data):
            self.extra = True   # bytes nobody asked for: never reused
        self.done = True
        self.waiter.set_result(None)

    def start(self, hs, waiter):
        """Sends the Handshake's request and feeds it the replies until it is
        done."""
        self.op = hs
        self.waiter = waiter
        self.done = False
        if self.closed:
            waiter.set_exception(self.lost or _Failure(_hirate.EIO, "the connection is closed"))
            return
        self.transport.write(hs.request)

    def finish(self):
        self.op = None
        self.waiter = None

    # -- the calls

    def submit(self, call):
        """call's request goes in this connection's next write."""
        loop = self.pool.loop
        # One timer for the connection, not one a call: it is set for the
        # earliest deadline among its calls and, when it fires, looks at
        # every call (_check). The deadlines of a single Redis' calls come
        # in the order of their calls, so it is set once per timeout, not
        # once per call.
        if self.timer is None or call.deadline < self.timer_at:
            self._arm(call.deadline)
        if not self.sent and not self.out and not self.joinable:
            # An idle connection: at once, as a lone caller's; the calls
            # made in the rest of this loop iteration join the next write.
            self.sent.append(call)
            self.transport.write(call.request())
            self.joinable = True
            loop.call_soon(self._flush)
            return
        self.out.append(call)
        if len(self.out) == 1 and not self.joinable:
            loop.call_soon(self._flush)

    def _flush(self):
        """The end of the loop iteration: the calls that joined go out."""
        self.joinable = False
        if self.closed or not self.out:
            return   # (closed: connection_lost places them elsewhere)
        out, self.out = self.out, []
        self.sent.extend(out)
        self.transport.write(b"".join([c.request() for c in out]))

    def _feed_calls(self, data):
        sent = self.sent
        while sent:
            call = sent[0]
            op, leg = call.op, call.leg
            state, used = op.feed(data) if leg is None else op.leg_feed(leg, data)
            if state == _hirate.IO_MORE:
                self.buf = bytes(data[used:])
                return
            data = data[used:]
            sent.popleft()
            if state == _hirate.IO_SEND:
                # A second pass of a leg-less op (EVAL after NOSCRIPT): its
                # request goes now, after those already sent. (A leg is done
                # at IO_DONE: its next round is the driver's.)
                sent.append(call)
                self.transport.write(call.request())
                continue
            if not self.retiring and (op.drop if leg is None else op.leg_drop(leg)):
                self.retiring = True   # the core's word: not reused
                self.pool._retire(self)
            call.settle()
        if data:
            # Bytes after every reply that was asked for: out of step.
            self.extra = True
            self._fail_all(_Failure(_hirate.EPROTO,
                                    "malformed reply from Redis: bytes after the reply"))
            return
        if self.retiring:
            self._elsewhere()
            if not sent:
                self.abort()

    def _arm(self, when):
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.pool.loop.call_at(when, self._check)
        self.timer_at = when

    def _check(self):
        """The timer: a call whose reply is not there by its deadline may
        have run, so no retry; the calls sent with it on this connection are
        in doubt too, and the connection goes, so that a late reply is never
        read as another call's answer. A call not yet sent (its op's rounds
        left it almost no time) is taken back: it times out without being
        sent. Then the timer is set for the earliest deadline left."""
        self.timer = None
        if self.closed:
            return
        now = self.pool.loop.time()
        for call in [c for c in self.out if c.deadline <= now]:
            self.out.remove(call)
            call.settle(_Failure(_hirate.ETIMEDOUT, "no reply from Redis within %d ms"
                                 % _ms(call.timeout)))
        late = next((c for c in self.sent if c.deadline <= now), None)
        if late is not None:
            self._fail_all(_Failure(_hirate.ETIMEDOUT, "no reply from Redis within %d ms"
                                    % _ms(late.timeout)))
            return
        soonest = min([c.deadline for c in self.sent] + [c.deadline for c in self.out],
                      default=None)
        if soonest is not None:
            self._arm(soonest)

    def unsend(self, call):
        """Takes call back if its request has not gone: True then."""
        try:
            self.out.remove(call)
        except ValueError:
            return False
        return True

    def _elsewhere(self):
        """The calls not yet sent go to another connection: their callers
        place them again."""
        out, self.out = self.out, []
        for call in out:
            if not call.fut.done():
                call.fut.set_result(_AGAIN)
            else:   # its caller gave up before it was sent
                _fail(call.op, call.leg, _hirate.ECLOSED)

    def _fail_all(self, failure):
        """The connection is lost or out of step: every call sent on it gets
        the failure (it may have run); those not yet sent go elsewhere."""
        sent, self.sent = self.sent, collections.deque()
        self.abort()
        if self.pool.closed:   # a call cut off by close() gets ClosedError
            failure = _Failure(_hirate.ECLOSED, "the limiter is closed")
        for call in sent:
            call.settle(failure)
        self._elsewhere()

    def abort(self):
        """Closes at once, dropping anything unsent or unread."""
        if self.closed:
            return
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
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
    """The connections of one AsyncLimiter to one node on one event loop, at
    most pool_size, shared by the loop's calls: a call goes on an idle
    connection, else pipelined on the one with the fewest calls in flight
    (a new connection is opened only while every open one already carries
    PIPELINE_DEPTH calls, or none is open). A loop's transports cannot serve
    another loop, hence one pool per loop and node (a single Redis is node
    0). When a new connection may be tried is the core's to say
    (Limiter._handshake_start(node): each node has its own backoff)."""

    def __init__(self, owner, loop, node, ep):
        self.owner = owner
        self.loop = loop
        self.node = node
        self.ep = ep            # the node's endpoint (Limiter._endpoint(node))
        self.ready = []         # open connections that take calls
        self.conns = set()      # every open connection
        self.connecting = 0     # connections being opened
        self.waiters = collections.deque()   # calls waiting for a connection
        self.closed = False
        self.closer = None

    # -- choosing a connection

    def _pick(self):
        """The connection for the next call, or None (open one, or wait for
        the one being opened): the one whose write of this loop iteration
        is still open, so that the calls of one iteration go out together;
        else an idle one; else the one with the fewest calls in flight,
        unless they all carry PIPELINE_DEPTH and there is room for one
        more (none being opened)."""
        best, depth, idle = None, 0, None
        for conn in self.ready:
            d = conn.depth
            if conn.joinable and d < PIPELINE_DEPTH:
                return conn
            if d == 0:
                idle = conn
            elif best is None or d < depth:
                best, depth = conn, d
        if idle is not None:
            return idle
        if best is not None and (depth < PIPELINE_DEPTH or self.connecting or
                                 len(self.conns) >= self.owner._pool_size):
            return best
        return None

    async def _connection(self, limit=None):
        """A connection to put a call on: a new one while the pool has room,
        else the next one opened; _Failure when none comes within the
        timeout (or within limit seconds, when that is sooner)."""
        owner = self.owner
        while True:
            if self.closed:
                raise _Failure(_hirate.ECLOSED, "the limiter is closed")
            conn = self._pick()
            if conn is not None:
                return conn
            # The first connection, or one more for calls that fill the
            # others; while one is being opened, the calls wait for it.
            if not self.connecting and len(self.conns) < owner._pool_size:
                return await self._connect()
            fut = self.loop.create_future()
            self.waiters.append(fut)
            timeout = self.ep["timeout"]
            if limit is not None and limit < timeout:
                timeout = limit
            try:
                await _wait(self.loop, timeout, fut)
            except asyncio.TimeoutError:
                raise _Failure(_hirate.ETIMEDOUT, "no Redis connection could be opened "
                               "within %g s (all %d being opened)"
                               % (timeout, owner._pool_size)) from None
            finally:
                try:
                    self.waiters.remove(fut)
                except ValueError:
                    pass
            # A connection opened (or one closed, leaving room): look again.

    def _retire(self, conn):
        """conn takes no new call (it closes once its calls are answered)."""
        try:
            self.ready.remove(conn)
        except ValueError:
            pass

    def _lost(self, conn):
        """conn is closed: its place in the pool is free."""
        self._retire(conn)
        if conn in self.conns:
            self.conns.discard(conn)
            if not self.closed:
                self.owner._dropped += 1
            self._wake()

    def _wake(self, everyone=False):
        """Tells waiting calls to look again: a connection opened (everyone),
        or one closed, leaving room for a new one."""
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                if not everyone:
                    return

    # -- opening connections

    async def _connect(self):
        self.connecting += 1
        try:
            conn = await self._open()
        except _Failure:
            self.connecting -= 1
            # Every waiting call now asks the core for a connection of its
            # own, and meets the backoff's refusal at once, instead of
            # waiting out a timeout.
            self._wake(everyone=True)
            raise
        except BaseException:
            self.connecting -= 1   # cancelled: nothing learnt about Redis
            self._wake()
            raise
        self.connecting -= 1
        if self.closed:
            conn.abort()
            raise _Failure(_hirate.ECLOSED, "the limiter is closed")
        self.conns.add(conn)
        self.ready.append(conn)
        self._wake(everyone=True)   # the calls that waited share it
        return conn

    async def _open(self):
        """A connection that passed the core's handshake, or _Failure with
        the core's verdict (during the backoff: the last failure's)."""
        ep = self.ep
        try:
            hs = self.owner._lim._handshake_start(self.node)
        except _hirate.Error as e:
            raise _from_error(e) from None
        conn = None
        try:
            state, conn = await self._exchange(hs, self.owner._ssl, ep["tls_server_name"],
                                               ep["connect_timeout"], ep["timeout"])
            if state == _hirate.IO_PROBE:
                # The failure looks like a TLS mismatch: the core asks the
                # same address again over the other transport.
                if conn is not None:
                    conn.abort()
                    conn = None
                state = await self._probe(hs, ep["probe_timeout"])
            try:
                hs.result()
            except _hirate.Error as e:
                raise _from_error(e) from None
            if conn is None or conn.extra:   # (a probe always ends in an error)
                raise _Failure(_hirate.EPROTO, "malformed reply from Redis: bytes after the "
                               "handshake's replies")
        except BaseException:
            if conn is not None:
                conn.abort()
            raise
        conn.finish()
        if ep["path"] is None:
            sock = conn.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return conn

    async def _exchange(self, hs, ctx, server_hostname, connect_timeout, timeout,
                        deadline=None):
        """Connects (TLS through ctx when it is not None) within
        connect_timeout, sends the handshake's bytes the moment the
        connection is made and feeds it the replies within timeout. Returns
        its state (IO_DONE, or IO_PROBE after a failure) and the connection
        (None when none was made). Failures go to the handshake in the I/O
        library's words. With deadline, the replies wait only until then."""
        loop = self.loop
        ep = self.ep
        fut = loop.create_future()
        factory = lambda: _Conn(self, hs, fut)   # noqa: E731
        conn = None
        until = loop.time() + connect_timeout
        try:
            if ep["path"] is not None:
                _, conn = await _within(connect_timeout,
                                        loop.create_unix_connection(factory, ep["path"]))
            else:
                sock = await self._tcp(ep["host"], ep["port"], until, connect_timeout)
                left = max(until - loop.time(), 0.001)
                kw = {} if ctx is None else dict(ssl=ctx, server_hostname=server_hostname,
                                                 ssl_handshake_timeout=left)
                try:
                    _, conn = await _within(left, loop.create_connection(factory, sock=sock,
                                                                         **kw))
                except BaseException:
                    sock.close()
                    raise
        except _Failure as f:
            why = f
        except asyncio.TimeoutError:
            # The core words what failed: "connect to ..." or, once TCP
            # is up, "TLS handshake with ..." (a plain server waits for a
            # line that never ends).
            why = _Failure(_hirate.ECONNECT if ctx is None or ep["path"] is not None
                           else _hirate.ETIMEDOUT,
                           "no answer within %d ms" % _ms(connect_timeout))
        except (ssl.SSLEOFError, ConnectionResetError) as e:
            why = _Failure(_hirate.EIO, _ssl_words(e))
        except ssl.SSLError as e:   # a certificate, a name, a protocol
            why = _Failure(_hirate.ETLS, _ssl_words(e))
        except OSError as e:
            why = _Failure(_hirate.ECONNECT, _ssl_words(e))
        else:
            why = None
        if why is not None:
            return hs.fail(why.code, str(why)), None
        if deadline is not None:
            timeout = max(deadline - loop.time(), 0.001)
        try:
            await _wait(loop, timeout, fut)
        except asyncio.TimeoutError:
            return hs.fail(_hirate.ETIMEDOUT, "no reply within %d ms" % _ms(timeout)), conn
        except _Failure as f:
            return hs.fail(f.code, str(f)), conn
        except BaseException:
            conn.abort()   # cancelled: the half-opened connection goes
            raise
        return _hirate.IO_DONE, conn

    async def _tcp(self, host, port, until, connect_timeout):
        """A connected non-blocking TCP socket to host (each of its addresses
        in turn) by the loop time until, or _Failure ECONNECT. The TLS
        handshake, if any, is the next step, so that a timeout says which
        of the two got no answer."""
        loop = self.loop
        late = _Failure(_hirate.ECONNECT, "no answer within %d ms" % _ms(connect_timeout))
        try:
            infos = await _within(max(until - loop.time(), 0.001),
                                  loop.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except asyncio.TimeoutError:
            raise late from None
        except OSError as e:
            raise _Failure(_hirate.ECONNECT, _ssl_words(e)) from None
        failure = None
        for family, kind, proto, _, addr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                await _within(max(until - loop.time(), 0.001), loop.sock_connect(sock, addr))
                return sock
            except asyncio.TimeoutError:
                sock.close()
                raise late from None
            except OSError as e:
                sock.close()
                failure = _Failure(_hirate.ECONNECT, _ssl_words(e))
            except BaseException:
                sock.close()
                raise
        raise failure or _Failure(_hirate.ECONNECT, "no address for %s" % host)

    async def _probe(self, hs, timeout):
        """The mismatch probe: a second connection over the other transport
        (TLS without verification when hs.probe_tls, else plain), the
        handshake's probe bytes on it, all within timeout; then it is
        closed."""
        deadline = self.loop.time() + timeout
        ctx = _probe_context() if hs.probe_tls else None
        conn = None
        try:
            state, conn = await self._exchange(hs, ctx, self.ep["host"], timeout, timeout,
                                               deadline)
        finally:
            if conn is not None:
                conn.abort()
        if state == _hirate.IO_PROBE:   # one probe answers the question
            state = hs.fail(_hirate.EIO, "the probe found nothing")
        return state

    # -- one call's round trip

    async def run(self, op, leg=None, clock=None):
        """Sends op's requests and feeds it the replies. On return op is
        settled: DONE, or failed with the I/O error's code and words (the
        core decides what that means for each item).

        With leg: only that leg of op's round, which is done or failed on
        return (the driver calls op.next()); clock is the op's deadline in
        a one-item list, set by its first send and shared by its rounds."""
        loop = self.loop
        timeout = self.ep["timeout"]
        while True:
            limit = None
            if clock is not None and clock[0] is not None:
                limit = clock[0] - loop.time()
                if limit <= 0:
                    op.leg_fail(leg, _hirate.ETIMEDOUT, "no reply from Redis within %d ms"
                                % _ms(timeout))
                    return
            conn = self._pick()
            if conn is None:
                try:
                    conn = await self._connection(limit)
                except _Failure as f:
                    _fail(op, leg, f.code, str(f))
                    return
                except BaseException:
                    # Cancelled before anything was sent. Settle the op
                    # without blaming Redis: an outage code would open the
                    # breaker because a caller gave up.
                    _fail(op, leg, _hirate.ECLOSED)
                    raise
            if clock is None:
                deadline = loop.time() + timeout
            else:
                if clock[0] is None:
                    clock[0] = loop.time() + timeout
                deadline = clock[0]
            call = _Call(op, leg, loop.create_future(), deadline, timeout)
            conn.submit(call)
            try:
                placed = await call.fut
            except BaseException:
                # Cancelled: a call not yet sent is taken back (nothing ran);
                # one sent stays on its connection, which reads its reply
                # when it comes (or times it out) and settles its op, so
                # that the stream stays in step for the calls sent with it.
                if conn.unsend(call):
                    _fail(op, leg, _hirate.ECLOSED)
                else:
                    call.cancelled = True
                raise
            if placed is not _AGAIN:
                return

    def close(self):
        if self.closed:
            return
        self.closed = True
        pools = self.owner._pools.get(self.loop)
        if pools is not None and pools.get(self.node) is self:
            del pools[self.node]
            if not pools:
                self.owner._pools.pop(self.loop, None)
        for conn in list(self.conns):
            conn.abort()
        self.ready.clear()
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # _connection() sees the pool closed


class _NotGiven:
    """The default of capacity and rate: not given (limits may be)."""

    def __repr__(self):
        return "<not given>"


_NOT_GIVEN = _NotGiven()


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
    loops (each gets connections of its own, at most pool_size). The URL may
    name a Redis Cluster, redis+cluster://[user:password@]host:port[,host:port...]
    (any nodes as seeds, a replica too) or rediss+cluster://... (TLS): then
    each loop has at most pool_size connections to each node. It may name a
    Redis Sentinel service, redis+sentinel://host:port[,host:port...]/service
    (the sentinels; sentinel_username and sentinel_password are theirs), and
    follows its master through failovers. Without a URL it decides from
    memory, at once.

    The limit is capacity and rate, or limits (several on one key, as
    hirate.Limiter takes them: "10/second; 1000/day", or a sequence of
    hirate.Band, (capacity, rate[, name]) tuples and strings of one limit);
    a decision of several bands is one round trip, spent in every band or
    in none, with each band's figures in Decision.bands.
    """

    def __init__(self, url=None, *, capacity=_NOT_GIVEN, rate=_NOT_GIVEN, limits=None,
                 prefix=_D["prefix"], on_error=_D["on_error"], instances=_D["instances"],
                 connect_timeout=_D["connect_timeout"], timeout=_D["timeout"],
                 deny_cache=_D["deny_cache"], max_keys=_D["max_keys"],
                 pool_size=_D["pool_size"], tls_ca_file=None, tls_ca_dir=None,
                 tls_cert_file=None, tls_key_file=None, tls_server_name=None,
                 tls_verify=_D["tls_verify"], sentinel_username=None, sentinel_password=None,
                 functions=_D["functions"], deny_cache_max=_D["deny_cache_max"]):
        # The C limiter checks every argument (and never connects itself
        # here: the hooks leave the I/O to this class). Of capacity, rate and
        # limits, those given go on, as hirate.Limiter takes them.
        limit = {name: value for name, value in
                 (("capacity", capacity), ("rate", rate), ("limits", limits))
                 if value is not _NOT_GIVEN}
        self._lim = _hirate.Limiter(
            url, **limit, prefix=prefix, on_error=on_error,
            instances=instances, connect_timeout=connect_timeout, timeout=timeout,
            deny_cache=deny_cache, max_keys=max_keys, pool_size=pool_size,
            tls_ca_file=tls_ca_file, tls_ca_dir=tls_ca_dir, tls_cert_file=tls_cert_file,
            tls_key_file=tls_key_file, tls_server_name=tls_server_name, tls_verify=tls_verify,
            sentinel_username=sentinel_username, sentinel_password=sentinel_password,
            functions=functions, deny_cache_max=deny_cache_max)
        # {loop: {node: _Pool}}; None without a URL.
        self._pools = None if self._lim.url is None else {}
        self._dropped = 0
        if self._pools is None:
            return
        # A cluster's and a Sentinel service's ops go in rounds over several
        # nodes (a Sentinel's: the sentinels and the masters they name).
        self._rounds_of_legs = self._lim.is_cluster or self._lim.is_sentinel
        ep = self._lim._endpoint()
        self._eps = {0: ep}   # by node: a node's endpoint never changes
        # One context for every node: the TLS options are the limiter's; the
        # name each connection verifies is its node's (tls_server_name).
        self._ssl = _tls_context(ep) if ep["tls"] else None
        self._pool_size = pool_size

    @classmethod
    def from_env(cls, **kwargs):
        """An AsyncLimiter on $REDIS_URL (in memory when it is unset or empty)."""
        return cls(os.environ.get("REDIS_URL") or None, **kwargs)

    # -- read-only attributes, as hirate.Limiter's

    @property
    def capacity(self):
        """The bucket size (the first band's, with several)."""
        return self._lim.capacity

    @property
    def rate(self):
        """Tokens per second (the first band's, with several)."""
        return self._lim.rate

    @property
    def bands(self):
        """(hirate.Band, ...): every band, in order, names filled in."""
        return self._lim.bands

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
        bands = self._lim.bands
        if len(bands) > 1:
            return "<hirate.AsyncLimiter url=%r bands=%r on_error=%r>" % (
                self.url, tuple(b.name for b in bands), self.on_error)
        return "<hirate.AsyncLimiter url=%r capacity=%d rate=%r on_error=%r>" % (
            self.url, self.capacity, self.rate, self.on_error)

    # -- decisions

    async def allow(self, key, cost=1):
        """Spends cost tokens from key's bucket if it holds that many."""
        if self._pools is None:
            return self._lim.allow(key, cost)
        op = self._lim._op_start([(key, cost)], True)
        if not op.done:
            await self._run(op)
        return _one(op)

    async def peek(self, key, cost=1):
        """What allow(key, cost) would decide now, without spending anything."""
        if self._pools is None:
            return self._lim.peek(key, cost)
        op = self._lim._op_start([(key, cost)], False)
        if not op.done:
            await self._run(op)
        return _one(op)

    async def allow_many(self, pairs):
        """allow() for every (key, cost) pair, in one pipelined round trip: a
        list in the same order, with each item's Decision, or the exception
        of that item's error in its place (an error is false, as a refusal
        is). A bad argument raises for the whole batch before anything is
        sent."""
        if self._pools is None:
            return self._lim.allow_many(pairs)
        op = self._lim._op_start(list(pairs), True)
        if not op.done:
            await self._run(op)
        return op.results()

    async def reset(self, key):
        """Forgets key's bucket: it is full again (in Redis, in the deny cache
        and in the local fallback)."""
        if self._pools is None:
            return self._lim.reset(key)
        op = self._lim._op_start_reset(key)
        if not op.done:
            await self._run(op)
        op.result()

    async def refund(self, key, tokens=1):
        """Gives tokens back to every band of key's bucket, each capped at its
        capacity (as Limiter.refund); the Decision is the bucket after."""
        if self._pools is None:
            return self._lim.refund(key, tokens)
        op = self._lim._op_start([(key, tokens)], _hirate.OP_REFUND)
        if not op.done:
            await self._run(op)
        return _one(op)

    async def check(self):
        """hirate.Health: one round trip on the event loop's connections to
        every Redis node decisions go to (ROLE, and whether the library or
        script is loaded), as Limiter.check(); for a readiness probe."""
        if self._pools is None:
            return self._lim.check()
        op = self._lim._op_start_check()
        if not op.done:
            await self._run(op)
        return op.health()

    async def _decide(self, pairs, spend, now_us=-1):
        """Decisions at an injected time (µs), for the shared test vectors."""
        if self._pools is None:
            return [self._lim._decide_at(key, cost, spend, now_us) for key, cost in pairs]
        op = self._lim._op_start(list(pairs), spend, now_us)
        if not op.done:
            await self._run(op)
        return op.results()

    def stats(self):
        """hirate.Stats: the core's metrics of this limiter since it was made
        (as Limiter.stats(); the round trips are those of the event loop's
        connections); after close(), as they were when it closed.
        conns_dropped counts this limiter's own connections (the event
        loop's, not the C pool's) closed after an error."""
        stats = self._lim.stats()
        if self._pools is not None:
            stats = dataclasses.replace(stats, conns_dropped=self._dropped)
        return stats

    def _stats(self):
        """The core's counters (connects: the handshakes it let start), with
        this limiter's own dropped connections (the C pool is not used by an
        AsyncLimiter)."""
        stats = self._lim._stats()
        if self._pools is not None:
            stats["conns_dropped"] = self._dropped
        return stats

    # -- the round trips of an op

    def _run(self, op):
        """A coroutine that settles op: on a single Redis its one leg on a
        connection of node 0 (the leg-less calls, which also send the EVAL
        after a NOSCRIPT on the same connection); on a cluster or a Sentinel
        service, its rounds."""
        if not self._rounds_of_legs:
            return self._pool().run(op)
        return self._rounds(op)

    async def _rounds(self, op):
        """Runs op's rounds: the legs of each at once, each on a connection
        of its node's pool, until op.next() says every item is decided. All
        rounds share one deadline, from the op's first send."""
        loop = asyncio.get_running_loop()
        clock = [None]
        while True:
            n = op.legs
            if n == 1:   # the common round: no task of its own
                await self._leg(loop, op, 0, clock)
            elif n:
                await _together([self._leg(loop, op, leg, clock) for leg in range(n)])
            if op.next() != _hirate.IO_SEND:
                return

    async def _leg(self, loop, op, leg, clock):
        try:
            pool = self._pool(op.leg_node(leg), loop)
        except _hirate.Error as e:   # closed meanwhile: no new node's pool
            op.leg_fail(leg, e.code, str(e))
            return
        await pool.run(op, leg, clock)

    # -- the pools of the running loop, one a node

    def _pool(self, node=0, loop=None):
        if loop is None:
            loop = asyncio.get_running_loop()
        pools = self._pools.get(loop)
        if pools is not None:
            pool = pools.get(node)
            if pool is not None:
                return pool
        return self._new_pool(loop, node)

    def _new_pool(self, loop, node):
        # Pools of loops that ended without shutting down their async
        # generators are forgotten here (their transports die with them).
        for pools in list(self._pools.values()):   # (another thread may add one)
            for other in list(pools.values()):
                if other.loop.is_closed():
                    other.close()
        if self._lim.closed:   # a leg after close(): no pool made to stay
            raise _hirate._error(_hirate.ECLOSED, "the limiter is closed")
        ep = self._eps.get(node)
        if ep is None:
            ep = self._eps[node] = self._lim._endpoint(node)
        pool = _Pool(self, loop, node, ep)
        self._pools.setdefault(loop, {})[node] = pool
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
        for loop, pools in list(self._pools.items()):
            for pool in list(pools.values()):
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
