"""Requests per second through nginx locations limited by hirate, by the same
limit written by hand (bench/nginx/handwritten.lua), and by nothing; wrk on
loopback. Prints a markdown table.

    HIRATE_LUAJIT_CPATH=<dir with hirate/core.so for LuaJIT> \
        python3 bench/nginx/bench.py [--seconds 3] [--rounds 3] [--connections 16]

bench/nginx/run.sh builds the module and runs this. One nginx worker and one
wrk thread, so that nginx, wrk and Redis have a core between them on a small
machine; the rounds are interleaved and each figure is the median of its
rounds, so that a noisy neighbour hurts every location alike. Next to the
requests per second, the CPU time nginx's worker spent per request (from
/proc), which other processes on a shared machine disturb far less.
"""

import argparse
import glob
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "lua" / "nginx"))

from harness import Nginx, RedisServer, get  # noqa: E402

# name, what it is, limited?
LOCATIONS = [
    ("free", "no limit", False),
    ("floor", "no limit, but an access handler that reads the client address and sets "
              "two headers (what any Lua limit by address pays)", False),
    ("memory", "hirate, in memory (no URL)", False),
    ("hirate", "hirate, Redis: every request allowed", False),
    ("hand", "hand-written EVALSHA, Redis: every request allowed", False),
    ("hirate_deny", "hirate, Redis: one key over its limit (deny cache)", True),
    ("hand_deny", "hand-written EVALSHA, Redis: one key over its limit", True),
]

CONF = r"""
daemon off;
master_process @MASTER@;
worker_processes 1;
pid @DIR@/nginx.pid;
error_log @DIR@/error.log warn;
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
env REDIS_URL;
env HIRATE_BENCH_REDIS_PORT;
@USER@
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path @DIR@/tmp/body;
    proxy_temp_path @DIR@/tmp/proxy;
    fastcgi_temp_path @DIR@/tmp/fastcgi;
    uwsgi_temp_path @DIR@/tmp/uwsgi;
    scgi_temp_path @DIR@/tmp/scgi;
    lua_package_path "@LUA_DIR@/?.lua;@HERE@/?.lua;/usr/share/lua/5.1/?.lua;;";
    lua_package_cpath "@LUA_CPATH@/?.so;;";

    init_worker_by_lua_block {
        local hirate = require "hirate"
        local url = os.getenv("REDIS_URL")
        require("handwritten").init("@SCRIPT@")
        bench = {
            memory = { limiter = hirate.new{ capacity = 1000000000, rate = 1000000 } },
            hirate = { limiter = hirate.new{ url = url, capacity = 1000000000, rate = 1000000,
                                             prefix = "rl:bench:" } },
            hirate_deny = { limiter = hirate.new{ url = url, capacity = 1, rate = 0.001,
                                                  prefix = "rl:bench-deny:" } },
        }
    }

    server {
        listen 127.0.0.1:@PORT@;
        location = /free { content_by_lua_block { ngx.say("ok") } }
        location = /floor {
            access_by_lua_block {
                local ident = "ip:" .. ngx.var.remote_addr
                ngx.header["RateLimit-Policy"] = "policy"
                ngx.header["RateLimit"] = "state"
            }
            content_by_lua_block { ngx.say("ok") }
        }
        location = /memory {
            access_by_lua_block { require("hirate.resty").limit(bench.memory) }
            content_by_lua_block { ngx.say("ok") }
        }
        location = /hirate {
            access_by_lua_block { require("hirate.resty").limit(bench.hirate) }
            content_by_lua_block { ngx.say("ok") }
        }
        location = /hirate_deny {
            access_by_lua_block { require("hirate.resty").limit(bench.hirate_deny) }
            content_by_lua_block { ngx.say("ok") }
        }
        location = /hand {
            access_by_lua_block {
                require("handwritten").limit("127.0.0.1", @REDIS_PORT@, "rl:hand:",
                                             1000000000, 1000000, ngx.var.remote_addr)
            }
            content_by_lua_block { ngx.say("ok") }
        }
        location = /hand_deny {
            access_by_lua_block {
                require("handwritten").limit("127.0.0.1", @REDIS_PORT@, "rl:hand-deny:",
                                             1, 0.001, ngx.var.remote_addr)
            }
            content_by_lua_block { ngx.say("ok") }
        }
    }
}
"""


def conf(prefix, ports, redis_port, lua_dir, lua_cpath, master="on"):
    text = CONF
    for k, v in {"@MASTER@": master, "@DIR@": prefix, "@PORT@": ports["http"],
                 "@REDIS_PORT@": redis_port,
                 "@LUA_DIR@": lua_dir, "@LUA_CPATH@": lua_cpath, "@HERE@": HERE,
                 "@SCRIPT@": ROOT / "lua" / "token_bucket.lua",
                 "@USER@": "user root;" if os.geteuid() == 0 else ""}.items():
        text = text.replace(k, str(v))
    return text


def worker_cpu(master):
    """CPU seconds (user + system) the master's workers have used."""
    total = 0
    with open(f"/proc/{master}/task/{master}/children") as f:
        children = f.read().split()
    for pid in children:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])   # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def wrk(port, name, seconds, connections, master):
    cpu0 = worker_cpu(master)
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency",
                          "-s", str(HERE / "count.lua"), f"http://127.0.0.1:{port}/{name}"],
                         capture_output=True, text=True, timeout=seconds + 60)
    cpu = worker_cpu(master) - cpu0
    for line in out.stdout.splitlines():
        if line.startswith("HIRATE-BENCH "):
            r = json.loads(line[len("HIRATE-BENCH "):])
            r["cpu_us"] = cpu * 1e6 / max(1, r["requests"])
            return r
    raise RuntimeError(f"wrk gave no result for /{name}:\n{out.stdout}\n{out.stderr}")


def instructions(name, requests, redis_port, lua_dir, cpath, env):
    """Instructions nginx executes per request of /name, counted by callgrind
    over `requests` requests on one keep-alive connection, after 300 to warm
    up (JIT traces, pools, the script cache). Unlike time, a count does not
    depend on what else the machine runs."""
    nginx = None
    try:
        nginx = Nginx(lambda prefix, ports: conf(prefix, ports, redis_port, lua_dir, cpath,
                                                 master="off"),
                      env, port_names=("http",), start_timeout=120,
                      wrapper=["valgrind", "--tool=callgrind", "--callgrind-out-file=%q{CG_OUT}"])
        conn = http.client.HTTPConnection("127.0.0.1", nginx.ports["http"], timeout=60)

        def hit(n):
            for _ in range(n):
                conn.request("GET", f"/{name}")
                r = conn.getresponse()
                r.read()
                assert r.status in (200, 429), (name, r.status)

        hit(300)
        subprocess.run(["callgrind_control", "-z", str(nginx.proc.pid)], check=True,
                       capture_output=True)
        hit(requests)
        subprocess.run(["callgrind_control", "-d", str(nginx.proc.pid)], check=True,
                       capture_output=True)
        conn.close()
        totals = []
        for dump in glob.glob(env["CG_OUT"] + ".*"):
            with open(dump) as f:
                for line in f:
                    if line.startswith(("totals:", "summary:")):
                        totals.append(int(line.split()[1]))
        return max(totals) / requests
    finally:
        if nginx:
            nginx.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=3, help="per location and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--instructions", type=int, default=2000, metavar="N",
                    help="requests per location under callgrind (0: skip that pass)")
    args = ap.parse_args()
    cpath = os.environ.get("HIRATE_LUAJIT_CPATH")
    if not cpath or not os.path.exists(os.path.join(cpath, "hirate", "core.so")):
        sys.exit("set HIRATE_LUAJIT_CPATH to the directory holding hirate/core.so for LuaJIT "
                 "(bench/nginx/run.sh does)")
    lua_dir = os.environ.get("HIRATE_LUA_DIR", str(ROOT / "bindings" / "lua"))

    redis = nginx = None
    try:
        redis = RedisServer()
        env = dict(os.environ, REDIS_URL=redis.url)
        nginx = Nginx(lambda prefix, ports: conf(prefix, ports, redis.port, lua_dir, cpath), env,
                      port_names=("http",))
        port = nginx.ports["http"]
        for name, _, limited in LOCATIONS:   # warm up: pools, scripts, deny caches
            for _ in range(3):
                r = get(port, f"/{name}")
                assert r.status in (200, 429), (name, r)
        results = {name: [] for name, _, _ in LOCATIONS}
        for _ in range(args.rounds):
            for name, _, _ in LOCATIONS:
                results[name].append(wrk(port, name, args.seconds, args.connections,
                                         nginx.proc.pid))
        errors = nginx.error_log().count("[error]")
        nginx.close()
        nginx = None
        ir = {}
        if args.instructions:
            with tempfile.TemporaryDirectory(prefix="hirate-callgrind-") as cg:
                cg_env = dict(env, CG_OUT=os.path.join(cg, "cg.out"))
                for name, _, _ in LOCATIONS:
                    ir[name] = instructions(name, args.instructions, redis.port, lua_dir,
                                            cpath, cg_env)
    finally:
        if nginx:
            nginx.close()
        if redis:
            redis.close()

    def rps(name):
        return statistics.median(r["requests"] / r["seconds"] for r in results[name])

    def pct(name, field):
        return statistics.median(r[field] for r in results[name])

    print(f"nginx {nginx_version()}, 1 worker; wrk 1 thread, {args.connections} connections, "
          f"{args.seconds} s x {args.rounds} interleaved rounds (median); Redis on loopback\n")
    print("| location | requests/s | nginx CPU µs/request | nginx instructions/request | "
          "p50 µs | p99 µs | statuses |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, what, _ in LOCATIONS:
        statuses = {}
        for r in results[name]:
            for s, n in r["statuses"].items():
                statuses[s] = statuses.get(s, 0) + n
        total = sum(statuses.values())
        shares = ", ".join(f"{s}: {100 * n / total:.1f}%" for s, n in sorted(statuses.items()))
        count = f"{ir[name]:,.0f}" if name in ir else "-"
        print(f"| {what} | {rps(name):,.0f} | {pct(name, 'cpu_us'):.1f} | {count} | "
              f"{pct(name, 'p50_us'):,.0f} | {pct(name, 'p99_us'):,.0f} | {shares} |")
    print()
    def cpu(name):
        return pct(name, "cpu_us")

    print(f"- hirate / hand-written, allowed: {rps('hirate') / rps('hand'):.2f}x the requests/s, "
          f"{cpu('hirate') / cpu('hand'):.2f}x the CPU per request")
    print(f"- hirate / hand-written, mostly refused: {rps('hirate_deny') / rps('hand_deny'):.2f}x "
          f"the requests/s, {cpu('hirate_deny') / cpu('hand_deny'):.2f}x the CPU per request")
    print(f"- hirate in memory / no limit: {rps('memory') / rps('free'):.3f} of the requests/s; "
          f"+{cpu('memory') - cpu('free'):.1f} µs CPU per request")
    if ir:
        print(f"- instructions, hirate / hand-written: allowed {ir['hirate'] / ir['hand']:.2f}, "
              f"mostly refused {ir['hirate_deny'] / ir['hand_deny']:.2f}; hirate in memory: "
              f"{ir['memory'] / ir['free']:.2f}x no limit, {ir['memory'] / ir['floor']:.3f}x "
              "the floor")
    socket_errors = sum(r["socket_errors"] for rs in results.values() for r in rs)
    print(f"- wrk socket errors: {socket_errors}; [error] lines in nginx's log: {errors}")


def nginx_version():
    out = subprocess.run(["nginx", "-v"], capture_output=True, text=True)
    return out.stderr.strip().split("/")[-1]


if __name__ == "__main__":
    main()
