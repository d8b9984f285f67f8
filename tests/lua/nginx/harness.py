"""Real nginx for the OpenResty tests: Debian's nginx with lua-nginx-module,
2 workers on free loopback ports in a temporary prefix, configured with the
nginx.conf that docs/lua.md shows plus the tests' own server
(test_server.conf), and a redis-server of its own (tests/python/redis_server.py).

Everything started here is a child in its own process group and is stopped
by close(), also when a test fails or the run is interrupted.
"""

import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))

from redis_server import RedisServer, free_port  # noqa: E402

DOC = ROOT / "docs" / "lua.md"
MODULES = "/usr/lib/nginx/modules"


def doc_snippet():
    """The nginx.conf of docs/lua.md: the first nginx code block of its
    "## nginx.conf" section."""
    text = DOC.read_text()
    m = re.search(r"^## nginx\.conf\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        raise AssertionError(f"{DOC} has no '## nginx.conf' section")
    block = re.search(r"^```nginx\n(.*?)^```", m.group(1), re.S | re.M)
    if not block:
        raise AssertionError(f"the nginx.conf section of {DOC} has no ```nginx block")
    return block.group(1)


def replace_once(text, old, new, where="the docs/lua.md nginx.conf"):
    """Replaces exactly one occurrence: if the doc changes shape, the test
    says which line it no longer finds instead of testing something else."""
    n = text.count(old)
    if n != 1:
        raise AssertionError(f"{where} should contain {old!r} exactly once (found {n})")
    return text.replace(old, new)


def build_conf(prefix, ports, lua_path, lua_cpath, vectors, ca_file, env_names=()):
    """The doc's nginx.conf, pointed at the test's ports, paths, backend and
    test CA (ca_file), with the tests' server added to its http block;
    env_names are more variables the workers may read."""
    conf = doc_snippet()
    conf = replace_once(conf, "lua_ssl_trusted_certificate /etc/ssl/certs/ca-certificates.crt;",
                        f"lua_ssl_trusted_certificate {ca_file};")
    conf = replace_once(conf, "worker_processes auto;", "worker_processes 2;")
    conf = replace_once(conf, "listen 8080;", f"listen 127.0.0.1:{ports['doc']} reuseport;")
    conf = replace_once(conf, "proxy_pass http://127.0.0.1:9000;",
                        f"proxy_pass http://127.0.0.1:{ports['test']};")
    conf = re.sub(r'lua_package_path\s+"[^"]*";', f'lua_package_path "{lua_path}";', conf)
    conf = re.sub(r'lua_package_cpath\s+"[^"]*";', f'lua_package_cpath "{lua_cpath}";', conf)
    for need in (f'lua_package_path "{lua_path}";', f'lua_package_cpath "{lua_cpath}";'):
        if need not in conf:
            raise AssertionError("the docs/lua.md nginx.conf should set lua_package_path "
                                 "and lua_package_cpath")
    main = [
        "daemon off;",
        "master_process on;",
        f"pid {prefix}/nginx.pid;",
        f"error_log {prefix}/error.log info;",
        "worker_shutdown_timeout 1s;",
        "env HIRATE_TEST_REDIS_PORT;",
        "env HIRATE_TEST_REDIS_UNIX;",
        "env HIRATE_TEST_DEAD_PORT;",
        "env HIRATE_TEST_TRICKLE_PORT;",
        *(f"env {name};" for name in env_names),
    ]
    if os.geteuid() == 0:
        main.append("user root;")   # workers read the checkout and the temp prefix
    http_head = "\n".join(f"    {d}" for d in [
        "access_log off;",
        f"client_body_temp_path {prefix}/tmp/body;",
        f"proxy_temp_path {prefix}/tmp/proxy;",
        f"fastcgi_temp_path {prefix}/tmp/fastcgi;",
        f"uwsgi_temp_path {prefix}/tmp/uwsgi;",
        f"scgi_temp_path {prefix}/tmp/scgi;",
        # Cosocket timeouts are expected here (a stopped Redis); hirate logs
        # the outage once, when the breaker opens.
        "lua_socket_log_errors off;",
    ])
    conf = replace_once(conf, "http {\n", "http {\n" + http_head + "\n")
    test_server = (HERE / "test_server.conf").read_text()
    test_server = test_server.replace("@TEST_PORT@", str(ports["test"]))
    test_server = test_server.replace("@VECTORS@", vectors)
    if "@" in re.sub(r"#.*", "", test_server):
        raise AssertionError("test_server.conf has a placeholder harness.py does not fill")
    end = conf.rstrip().rfind("}")
    conf = conf[:end] + test_server + "}\n"
    return "\n".join(main) + "\n" + conf


class Nginx:
    """nginx -p <temp prefix> with the configuration conf_builder(prefix,
    ports) writes; ports maps each of port_names to a free port, and nginx
    is up when all of them accept."""

    def __init__(self, conf_builder, env, port_names=("doc", "test"), wrapper=(),
                 start_timeout=10):
        self.dir = tempfile.mkdtemp(prefix="hirate-nginx-")
        os.makedirs(os.path.join(self.dir, "tmp"))
        self.ports = {name: free_port() for name in port_names}
        self.conf = os.path.join(self.dir, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(conf_builder(self.dir, self.ports))
        # wrapper: a command to run nginx under (valgrind, for the benchmark).
        self.proc = subprocess.Popen(
            [*wrapper, "nginx", "-p", self.dir, "-c", self.conf, "-e", self.error_log_path],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace")
                self.close()
                raise RuntimeError(f"nginx exited at start: {err}\n{self.error_log()}")
            if all(_accepts(p) for p in self.ports.values()):
                return
            time.sleep(0.05)
        self.close()
        raise RuntimeError(f"nginx did not listen within {start_timeout} s:\n"
                           + self.error_log())

    @property
    def error_log_path(self):
        return os.path.join(self.dir, "error.log")

    def error_log(self):
        try:
            with open(self.error_log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def close(self, keep=False):
        """Stops the master and its workers (the whole process group)."""
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGQUIT)
                self.proc.wait(timeout=5)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        if self.proc:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if self.proc.stderr:
                self.proc.stderr.close()
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def _accepts(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Response:
    def __init__(self, status, headers, body, started, ended):
        self.status = status
        self.headers = headers          # lower-case name -> value
        self.body = body
        self.started = started
        self.ended = ended

    @property
    def elapsed(self):
        return self.ended - self.started

    def header(self, name):
        return self.headers.get(name.lower())

    def __repr__(self):
        return f"<{self.status} {self.headers} {self.body[:200]!r}>"


def get(port, path, headers=None, timeout=10, method="GET"):
    """One GET (or another method) on a connection of its own (so the kernel
    spreads requests over both workers through reuseport)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    started = time.monotonic()
    try:
        conn.request(method, path, headers=dict(headers or {}, Connection="close"))
        r = conn.getresponse()
        body = r.read()
        ended = time.monotonic()
        names = {}
        for k, v in r.getheaders():
            names[k.lower()] = v
        return Response(r.status, names, body, started, ended)
    finally:
        conn.close()


def get_many(port, paths, headers=None, timeout=10):
    """The GETs at once, one thread each, released together; responses in
    the order of paths."""
    out = [None] * len(paths)
    gate = threading.Barrier(len(paths))

    def one(i, p):
        gate.wait()
        try:
            out[i] = get(port, p, headers, timeout)
        except Exception as e:   # reported by the caller's assertions
            out[i] = e

    threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(paths)]
    for t in threads:
        t.start()
    return threads, out


def join(threads, out):
    for t in threads:
        t.join()
    for r in out:
        if isinstance(r, Exception):
            raise r
    return out


def make_certs(directory):
    """The TLS test material (tests/support/make_certs.sh) in directory."""
    subprocess.run(["sh", str(ROOT / "tests" / "support" / "make_certs.sh"), directory],
                   check=True, stdout=subprocess.DEVNULL)
    return directory


def tls_redis(certs, cert="server", auth_clients="no", extra=()):
    """A RedisServer with a TLS port as well (.tls_port) that presents
    certs/<cert>.crt; .port stays plain."""
    port = free_port()
    srv = RedisServer(["--tls-port", str(port),
                       "--tls-cert-file", os.path.join(certs, f"{cert}.crt"),
                       "--tls-key-file", os.path.join(certs, f"{cert}.key"),
                       "--tls-ca-cert-file", os.path.join(certs, "ca.crt"),
                       "--tls-auth-clients", auth_clients, *extra])
    srv.tls_port = port
    return srv


class TrickleProxy:
    """A TCP proxy in front of a real server that passes requests on at once
    and hands each reply byte to the client `delay` seconds after the last:
    a trickling reply, which a real server does not send on its own."""

    def __init__(self, target_port, delay):
        self.target_port = target_port
        self.delay = delay
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pipe, args=(client, server, 0), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, self.delay),
                             daemon=True).start()

    def _pipe(self, src, dst, delay):
        try:
            src.settimeout(None)
            while not self.closed.is_set():
                data = src.recv(65536)
                if not data:
                    break
                if not delay:
                    dst.sendall(data)
                    continue
                for i in range(len(data)):
                    time.sleep(delay)
                    dst.sendall(data[i:i + 1])
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self):
        self.closed.set()
        self.listener.close()


def redis_commands(port, *commands, timeout=2.0):
    """Sends commands on one connection (so SELECT holds for those after it)
    and returns their replies, decoded as redis_server.py decodes them."""
    from redis_server import _read_reply
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        req = b""
        for args in commands:
            req += b"*%d\r\n" % len(args)
            for a in args:
                a = a if isinstance(a, bytes) else str(a).encode()
                req += b"$%d\r\n%s\r\n" % (len(a), a)
        s.sendall(req)
        f = s.makefile("rb")
        return [_read_reply(f) for _ in commands]


__all__ = ["RedisServer", "Nginx", "TrickleProxy", "build_conf", "doc_snippet", "get",
           "make_certs", "tls_redis",
           "get_many", "join", "redis_commands", "free_port", "ROOT"]
