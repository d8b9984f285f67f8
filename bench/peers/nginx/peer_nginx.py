"""The OpenResty contenders of the side-by-side benchmark, behind the harness
protocol of bench/peers/README.md (bench/suite/suite.py drives them):

    HIRATE_LUAJIT_CPATH=<dir with hirate/core.so for LuaJIT> \\
        python3 peer_nginx.py speed|atomic|outage|fill --impl free|hand|hirate --url redis://HOST:PORT [...]

    free    a location with no limit: what nginx and wrk cost without one
    hand    the same limit written by hand, bench/nginx/handwritten.lua: a
            cosocket from a keepalive pool, EVALSHA of hirate's script, EVAL
            after NOSCRIPT, 429 when refused, the request let through when
            Redis fails
    hirate  hirate.resty.limit{} (the access_by_lua helper) on a limiter from
            hirate.new{url = ...}, made per worker in init_worker_by_lua

Each run starts Debian's nginx (lua-nginx-module) in a temporary prefix on a
free loopback port (tests/lua/nginx/harness.py's Nginx), with the key taken
from the query (?k=user:NNNNNN), and stops it at the end. A decision is an
HTTP request: 200 allowed, 429 refused. speed: wrk, one thread, --concurrency
connections, keys drawn by bench/peers/nginx/wrk_keys.lua; one nginx worker,
so that wrk, nginx and Redis share the cores as the other contenders' client
and server do; cpu_s is the nginx processes' CPU time (/proc) over wrk's run,
p50/p99 are wrk's (whole HTTP requests). atomic: two workers, the requests
from as many threads released together. outage and fill: one request at a
time from this process.
"""

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "bench" / "peers"))
from protocol import die, emit, rate_arg  # noqa: E402
HANDWRITTEN = ROOT / "bench" / "nginx" / "handwritten.lua"
NGINX_HARNESS = ROOT / "tests" / "lua" / "nginx" / "harness.py"
MODULES = "/usr/lib/nginx/modules"

CONF = r"""
daemon off;
master_process on;
worker_processes @WORKERS@;
pid @DIR@/nginx.pid;
error_log @DIR@/error.log error;
worker_shutdown_timeout 1s;
load_module @MODULES@/ndk_http_module.so;
load_module @MODULES@/ngx_http_lua_module.so;
@USER@
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path @DIR@/tmp/body;
    proxy_temp_path @DIR@/tmp/proxy;
    fastcgi_temp_path @DIR@/tmp/fastcgi;
    uwsgi_temp_path @DIR@/tmp/uwsgi;
    scgi_temp_path @DIR@/tmp/scgi;
    lua_socket_log_errors off;
    lua_package_path "@LUA_DIR@/?.lua;@HAND_DIR@/?.lua;/usr/share/lua/5.1/?.lua;;";
    lua_package_cpath "@LUA_CPATH@/?.so;;";

    init_worker_by_lua_block {
        peer = {}
        if "@IMPL@" == "hirate" then
            local hirate = require "hirate"
            peer.limit = { limiter = hirate.new{ url = "@URL@", capacity = @CAPACITY@,
                                                 rate = @RATE@, timeout = @TIMEOUT@,
                                                 connect_timeout = 0.25 },
                           key = "var:arg_k" }
        elseif "@IMPL@" == "hand" then
            require("handwritten").init("@SCRIPT@")
        end
    }

    server {
        listen 127.0.0.1:@PORT@ reuseport;
        # harness.Nginx starts once both of its ports answer; only one is used.
        listen 127.0.0.1:@TEST_PORT@;
        location = /free { content_by_lua_block { ngx.say("ok") } }
        location = /hirate {
            access_by_lua_block { require("hirate.resty").limit(peer.limit) }
            content_by_lua_block { ngx.say("ok") }
        }
        location = /hand {
            access_by_lua_block {
                require("handwritten").limit("@REDIS_HOST@", @REDIS_PORT@, "rl:", @CAPACITY@,
                                             @RATE@, ngx.var.arg_k)
            }
            content_by_lua_block { ngx.say("ok") }
        }
    }
}
"""


def start_nginx(c, workers):
    if not NGINX_HARNESS.exists():
        die("%s is not in this checkout" % NGINX_HARNESS.relative_to(ROOT))
    if c.impl == "hand" and not HANDWRITTEN.exists():
        die("%s is not in this checkout" % HANDWRITTEN.relative_to(ROOT))
    cpath = os.environ.get("HIRATE_LUAJIT_CPATH")
    if c.impl == "hirate" and not (cpath and os.path.exists(os.path.join(cpath, "hirate",
                                                                          "core.so"))):
        die("set HIRATE_LUAJIT_CPATH to the directory holding hirate/core.so for LuaJIT")
    sys.path.insert(0, str(NGINX_HARNESS.parent))
    from harness import Nginx

    u = urlparse(c.url)
    if u.scheme != "redis" or not u.hostname or not u.port:
        die("--url: expected redis://HOST:PORT, got %r" % c.url)
    values = {"@WORKERS@": workers, "@MODULES@": MODULES, "@IMPL@": c.impl, "@URL@": c.url,
              "@CAPACITY@": c.capacity, "@RATE@": rate_arg(c.rate),
              "@TIMEOUT@": c.timeout_ms / 1000.0, "@SCRIPT@": ROOT / "lua" / "token_bucket.lua",
              "@REDIS_HOST@": u.hostname, "@REDIS_PORT@": u.port,
              "@LUA_DIR@": ROOT / "bindings" / "lua", "@HAND_DIR@": HANDWRITTEN.parent,
              "@LUA_CPATH@": cpath or "", "@USER@": "user root;" if os.geteuid() == 0 else ""}

    def build(prefix, ports):
        text = CONF.replace("@DIR@", prefix).replace("@PORT@", str(ports["doc"]))
        text = text.replace("@TEST_PORT@", str(ports["test"]))
        for k, v in values.items():
            text = text.replace(k, str(v))
        return text

    return Nginx(build, dict(os.environ))


def nginx_cpu(nginx):
    """CPU seconds (user + system) of the nginx master and its workers."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[2] is the process group; [11], [12] utime and stime.
        if int(fields[2]) == nginx.proc.pid:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


class Client:
    """Requests on one kept-alive connection; reconnects after a failure."""

    def __init__(self, port, timeout=10):
        self.port, self.timeout, self.conn = port, timeout, None

    def get(self, path):
        """The status, or the exception the request met."""
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                       timeout=self.timeout)
            self.conn.request("GET", path)
            r = self.conn.getresponse()
            r.read()
            return r.status
        except (OSError, http.client.HTTPException) as e:
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            return e


def outcome(status):
    if status == 200:
        return True
    if status == 429:
        return False
    return status if isinstance(status, BaseException) else RuntimeError("HTTP %s" % status)


def tally(outcomes):
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    return {"admitted": sum(1 for o in outcomes if o is True),
            "refused": sum(1 for o in outcomes if o is False),
            "errors": len(errors),
            "error": "%s: %s" % (type(errors[0]).__name__, errors[0]) if errors else None}


def wrk(port, c, seconds, connections):
    out = subprocess.run(
        ["wrk", "-t1", "-c%d" % connections, "-d%ds" % seconds, "--latency", "-s",
         str(HERE / "wrk_keys.lua"), "http://127.0.0.1:%d/%s" % (port, c.impl), "--",
         str(c.keys), str(c.seed)],
        capture_output=True, text=True, timeout=seconds + 60)
    for line in out.stdout.splitlines():
        if line.startswith("PEER-NGINX "):
            return json.loads(line[len("PEER-NGINX "):])
    die("wrk gave no result:\n%s\n%s" % (out.stdout, out.stderr))


def run_speed(c):
    nginx = start_nginx(c, workers=1)
    try:
        port = nginx.ports["doc"]
        client = Client(port)
        # Warm-up: the worker's limiter, its connections, the script cache,
        # LuaJIT's traces; wrk runs whole seconds only, so requests from here.
        deadline = time.monotonic() + c.warmup
        n = 0
        while time.monotonic() < deadline or n < 50:
            client.get("/%s?k=user:%06d" % (c.impl, n % c.keys))
            n += 1
        seconds = max(1, round(c.seconds))
        cpu0 = nginx_cpu(nginx)
        r = wrk(port, c, seconds, c.concurrency)
        cpu = nginx_cpu(nginx) - cpu0
        statuses = {int(k): v for k, v in r["statuses"].items()}
        allowed, refused = statuses.get(200, 0), statuses.get(429, 0)
        other = sum(v for k, v in statuses.items() if k not in (200, 429))
        error = None
        if other or r["socket_errors"]:
            error = "statuses %s, %d socket errors" % (statuses, r["socket_errors"])
        emit({"decisions": allowed + refused, "allowed": allowed,
              "errors": other + r["socket_errors"], "p50_us": r["p50_us"],
              "p99_us": r["p99_us"], "cpu_s": cpu, "wall_s": r["seconds"], "error": error})
    finally:
        nginx.close()


def run_atomic(c):
    nginx = start_nginx(c, workers=2)
    try:
        from harness import get_many

        threads, out = get_many(nginx.ports["doc"], ["/%s?k=%s" % (c.impl, c.key)] * c.requests,
                                timeout=10)
        for t in threads:
            t.join()
        outcomes = [o if isinstance(o, BaseException) else outcome(o.status) for o in out]
        emit(dict(requests=c.requests, **tally(outcomes)))
    finally:
        nginx.close()


def run_outage(c):
    nginx = start_nginx(c, workers=1)
    try:
        client = Client(nginx.ports["doc"])
        # The warm-up key is the test key's own: harnesses run side by side
        # on one server, and each library stores its own kind of value.
        first = outcome(client.get("/%s?k=%s-warmup" % (c.impl, c.key)))
        if isinstance(first, BaseException):
            die("the warm-up request failed: %s" % first)
        emit({"ready": True})
        if not sys.stdin.readline():
            die("stdin closed before the go line")
        outcomes, lat_us = [], []
        for _ in range(c.calls):
            t0 = time.perf_counter_ns()
            outcomes.append(outcome(client.get("/%s?k=%s" % (c.impl, c.key))))
            lat_us.append((time.perf_counter_ns() - t0) / 1e3)
        emit(dict(calls=c.calls, lat_us=lat_us, **tally(outcomes)))
    finally:
        nginx.close()


def run_fill(c):
    nginx = start_nginx(c, workers=1)
    try:
        client = Client(nginx.ports["doc"])
        t = tally([outcome(client.get("/%s?k=user:%06d" % (c.impl, i)))
                   for i in range(c.keys)])
        emit({"keys": c.keys, "admitted": t["admitted"], "errors": t["errors"],
              "error": t["error"]})
    finally:
        nginx.close()


def main():
    # A driver that gives up on this run sends SIGTERM: leave through the
    # finally clauses, which stop nginx.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = argparse.ArgumentParser(description="an OpenResty contender of hirate's benchmark "
                                "suite (bench/peers/README.md)")
    p.add_argument("mode", choices=("speed", "atomic", "outage", "fill"))
    p.add_argument("--impl", required=True, choices=("free", "hand", "hirate"))
    p.add_argument("--url", required=True)
    p.add_argument("--key", default="fresh")
    p.add_argument("--keys", type=int, default=100000)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--timeout-ms", type=int, default=100)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--warmup", type=float, default=0.3)
    p.add_argument("--rate", type=float, default=10.0)
    p.add_argument("--capacity", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    c = p.parse_args()
    if min(c.keys, c.concurrency, c.requests, c.calls, c.timeout_ms, c.capacity) < 1 or \
            not c.rate > 0:
        die("a count or the rate is out of range")
    {"speed": run_speed, "atomic": run_atomic, "outage": run_outage, "fill": run_fill}[c.mode](c)


if __name__ == "__main__":
    main()
