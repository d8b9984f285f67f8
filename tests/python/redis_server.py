"""A throwaway redis-server for the Python tests.

The server is our own child process on a free loopback port with its own
temporary directory, so SIGSTOP, SIGKILL and restarts reach exactly it, and
nothing is left behind when a test fails.
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time


def free_port():
    """A loopback port the kernel considers free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """redis-server on 127.0.0.1:<port>. `extra` are more config arguments,
    e.g. ["--requirepass", "s3cr3t"]."""

    def __init__(self, extra=()):
        self.extra = list(extra)
        self.dir = tempfile.mkdtemp(prefix="hirate-redis-")
        self.port = None
        self.proc = None
        self.start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def start(self, port=None):
        """Starts the server, on `port` if given (a restart keeps its port)."""
        for _ in range(5):
            self.port = port or free_port()
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", self.dir,
                 "--logfile", os.path.join(self.dir, "redis.log"), *self.extra],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if self.command("PING") in ("PONG", "NOAUTH"):
                        return
                except OSError:
                    pass
                time.sleep(0.02)
            self.proc.kill()
            self.proc.wait()
            if port:
                break
        raise RuntimeError("redis-server did not start (is it installed and on PATH?)")

    def command(self, *args, timeout=2.0):
        """Sends one command, returns its reply decoded loosely: str for
        simple/bulk strings, int, list, None; an error reply as its first
        word ("NOAUTH", "ERR" ...)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            req = b"*%d\r\n" % len(args)
            for a in args:
                a = a if isinstance(a, bytes) else str(a).encode()
                req += b"$%d\r\n%s\r\n" % (len(a), a)
            s.sendall(req)
            f = s.makefile("rb")
            return _read_reply(f)

    def stop(self):
        """SIGSTOP: the server hangs with its sockets open."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def cont(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self):
        """SIGKILL: connections are refused until restart()."""
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    def restart(self):
        self.kill()
        self.start(self.port)

    def close(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _read_reply(f):
    line = f.readline()
    if not line:
        raise ConnectionError("redis closed the connection")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        return rest.split(b" ", 1)[0].decode()
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)[:-2]
        return data.decode(errors="replace")
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_reply(f) for _ in range(n)]
    raise ValueError(f"unexpected reply {line!r}")
