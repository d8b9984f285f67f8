"""A throwaway redis-server for the Python tests.

The server is our own child process on a free loopback port with its own
temporary directory, so SIGSTOP, SIGKILL and restarts reach exactly it, and
nothing is left behind when a test fails. With `tls` it listens for TLS only
(`--port 0 --tls-port P`), with certificates from make_certs().
"""

import os
import pathlib
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def make_certs(directory):
    """The test CA, server, client and bad certificates
    (tests/support/make_certs.sh) in directory; returns it as a Path."""
    subprocess.run(["sh", str(ROOT / "tests" / "support" / "make_certs.sh"), str(directory)],
                   check=True)
    return pathlib.Path(directory)


def free_port():
    """A loopback port the kernel considers free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """redis-server on 127.0.0.1:<port>. `extra` are more config arguments,
    e.g. ["--requirepass", "s3cr3t"]. `tls`: the directory of make_certs(),
    and `cert` the name of the server's certificate there ("server",
    "wronghost", "expired", "selfsigned"); `auth_clients` asks clients for
    a certificate (mutual TLS)."""

    def __init__(self, extra=(), tls=None, cert="server", auth_clients=False):
        self.extra = list(extra)
        self.tls = pathlib.Path(tls) if tls else None
        if self.tls:
            self.extra = ["--tls-cert-file", str(self.tls / f"{cert}.crt"),
                          "--tls-key-file", str(self.tls / f"{cert}.key"),
                          "--tls-ca-cert-file", str(self.tls / "ca.crt"),
                          "--tls-auth-clients", "yes" if auth_clients else "no", *self.extra]
        self.dir = tempfile.mkdtemp(prefix="hirate-redis-")
        self.port = None
        self.proc = None
        self.start()

    @property
    def url(self):
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}"

    def _connect(self, timeout):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        if not self.tls:
            return s
        # The harness' own connection: it trusts the test CA and shows the
        # client certificate, but checks nothing, as the bad servers need.
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.load_cert_chain(str(self.tls / "client.crt"), str(self.tls / "client.key"))
        return ctx.wrap_socket(s)

    def start(self, port=None):
        """Starts the server, on `port` if given (a restart keeps its port)."""
        for _ in range(5):
            self.port = port or free_port()
            ports = (["--port", "0", "--tls-port", str(self.port)] if self.tls
                     else ["--port", str(self.port)])
            self.proc = subprocess.Popen(
                ["redis-server", *ports, "--bind", "127.0.0.1",
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
        with self._connect(timeout) as s:
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
