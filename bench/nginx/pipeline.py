"""Requests per second through a Redis-backed hirate limit{} in nginx, with
each request on a pooled cosocket of its own (pipeline = false) and with the
calls of concurrent requests sharing one pipelined connection per worker
(pipeline = true): wrk on loopback, 1 and 2 workers, 16 and 64 connections,
the two configurations interleaved round by round, median of the rounds.
Prints a markdown table.

    HIRATE_LUAJIT_CPATH=<dir with hirate/core.so for LuaJIT> \\
        python3 bench/nginx/pipeline.py [--seconds 3] [--rounds 5]

bench/nginx/run.sh builds hirate.core for LuaJIT in build-bench/nginx; this
takes the same HIRATE_LUAJIT_CPATH (build-bench/nginx/lua-luajit).
"""

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import ROOT, Nginx, RedisServer, wrk  # noqa: E402

CONF = r"""
daemon off;
master_process on;
worker_processes @WORKERS@;
pid @DIR@/nginx.pid;
error_log @DIR@/error.log warn;
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
env REDIS_URL;
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
        bench = {}
        for _, p in ipairs({ false, true }) do
            bench[p and "pipelined" or "per_request"] = {
                limiter = hirate.new{ url = url, pipeline = p, capacity = 1000000000,
                                      rate = 1000000, prefix = "rl:bench:" } }
        end
    }
    server {
        listen 127.0.0.1:@PORT@ reuseport;
        location ~ ^/(per_request|pipelined)$ {
            set $config $1;
            access_by_lua_block { require("hirate.resty").limit(bench[ngx.var.config]) }
            content_by_lua_block { ngx.say("ok") }
        }
    }
}
"""

CONFIGS = ["per_request", "pipelined"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    lua_dir = os.environ.get("HIRATE_LUA_DIR", str(ROOT / "bindings" / "lua"))
    cpath = os.environ["HIRATE_LUAJIT_CPATH"]
    redis = RedisServer()
    env = dict(os.environ, REDIS_URL=redis.url)
    rows = []
    try:
        for workers in (1, 2):
            def build(prefix, ports, workers=workers):
                text = CONF
                for k, v in {"@WORKERS@": workers, "@DIR@": prefix, "@PORT@": ports["http"],
                             "@LUA_DIR@": lua_dir, "@LUA_CPATH@": cpath, "@HERE@": HERE,
                             "@USER@": "user root;" if os.geteuid() == 0 else ""}.items():
                    text = text.replace(k, str(v))
                return text
            nginx = Nginx(build, env, port_names=("http",))
            try:
                port = nginx.ports["http"]
                for c in (16, 64):
                    for name in CONFIGS:   # warm up: JIT, connections
                        wrk(port, name, 1, c, nginx.proc.pid)
                rps = {(c, n): [] for c in (16, 64) for n in CONFIGS}
                p50 = {(c, n): [] for c in (16, 64) for n in CONFIGS}
                for r in range(args.rounds):
                    for c in (16, 64):
                        order = CONFIGS if r % 2 == 0 else CONFIGS[::-1]
                        for name in order:
                            res = wrk(port, name, args.seconds, c, nginx.proc.pid)
                            non200 = {k: v for k, v in res["statuses"].items() if k != "200"}
                            if non200:
                                raise RuntimeError(f"/{name}: statuses {res['statuses']}")
                            rps[(c, name)].append(res["requests"] / res["seconds"])
                            p50[(c, name)].append(res["p50_us"])
                for c in (16, 64):
                    a = statistics.median(rps[(c, "per_request")])
                    b = statistics.median(rps[(c, "pipelined")])
                    rows.append((workers, c, a, b, statistics.median(p50[(c, "per_request")]),
                                 statistics.median(p50[(c, "pipelined")])))
            finally:
                nginx.close()
    finally:
        redis.close()
    print(f"{args.rounds} rounds of {args.seconds} s, interleaved; medians\n")
    print("| workers | connections | per-request req/s | pipelined req/s | ratio "
          "| per-request p50 µs | pipelined p50 µs |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for w, c, a, b, pa, pb in rows:
        print(f"| {w} | {c} | {a:,.0f} | {b:,.0f} | {b / a:.2f}x | {pa:,.0f} | {pb:,.0f} |")


if __name__ == "__main__":
    main()
