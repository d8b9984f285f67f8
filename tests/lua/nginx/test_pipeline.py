"""pipeline = true in real nginx (Debian's, lua-nginx-module, 2 workers)
against a redis-server of its own: the calls of concurrent requests in a
worker share one connection. Exact counts under concurrency, a Redis that
stalls mid-pipeline (SIGSTOP) with no reply ever handed to another call,
requests whose clients go away while they wait, a Redis killed and
restarted, and a reload under load after which the old workers exit.

    HIRATE_LUAJIT_CPATH=<dir with hirate/core.so built for LuaJIT> \\
        python3 tests/lua/nginx/test_pipeline.py [-v] [Test.name]
"""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import ROOT, Nginx, RedisServer, get, get_many, join  # noqa: E402

LUA_DIR = os.environ.get("HIRATE_LUA_DIR", str(ROOT / "bindings" / "lua"))
LUA_CPATH = os.environ["HIRATE_LUAJIT_CPATH"]
TIMEOUT = 0.5

CONF = r"""
daemon off;
master_process on;
worker_processes 2;
pid @DIR@/nginx.pid;
error_log @DIR@/error.log info;
worker_shutdown_timeout 30s;
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
env HIRATE_TEST_REDIS_PORT;
@USER@
events { worker_connections 1024; }
http {
    access_log off;
    lua_shared_dict seen 64k;
    lua_socket_log_errors off;
    client_body_temp_path @DIR@/tmp/body;
    proxy_temp_path @DIR@/tmp/proxy;
    fastcgi_temp_path @DIR@/tmp/fastcgi;
    uwsgi_temp_path @DIR@/tmp/uwsgi;
    scgi_temp_path @DIR@/tmp/scgi;
    lua_package_path "@LUA_DIR@/?.lua;/usr/share/lua/5.1/?.lua;;";
    lua_package_cpath "@LUA_CPATH@/?.so;;";
    init_worker_by_lua_block {
        local hirate = require "hirate"
        local url = "redis://127.0.0.1:" .. os.getenv("HIRATE_TEST_REDIS_PORT")
        pipe = hirate.new{ url = url, pipeline = true, capacity = 50, rate = 0.001,
                           timeout = @TIMEOUT@, on_error = "open", prefix = "rl:pipe:" }
        idle = hirate.new{ url = url, capacity = 50, rate = 0.001, keepalive_timeout = 0.5,
                           prefix = "rl:idle:" }
    }
    server {
        listen 127.0.0.1:@PORT@ reuseport;
        # hirate.new's error for ?url= with pipeline = true (or ?p=).
        location = /refused {
            content_by_lua_block {
                local p = ngx.var.arg_p and ngx.var.arg_p or true
                local ok, err = pcall(require("hirate").new, { url = ngx.unescape_uri(ngx.var.arg_url),
                    pipeline = p, capacity = 1, rate = 1 })
                ngx.print(ok and "made" or err)
            }
        }
        location = /allow {
            content_by_lua_block {
                local d, err, code = pipe:allow(ngx.var.arg_k)
                if not d then
                    ngx.header["X-Error"] = code
                else
                    ngx.header["X-Allowed"] = tostring(d.allowed)
                    ngx.header["X-Source"] = d.source
                    ngx.header["X-Error"] = d.error
                end
                ngx.header["X-Worker"] = ngx.worker.pid()
                ngx.say("decided")
            }
        }
        location = /idle {
            content_by_lua_block {
                local d, err, code = idle:allow(ngx.var.arg_k)
                ngx.header["X-Allowed"] = d and tostring(d.allowed)
                ngx.header["X-Source"] = d and d.source
                ngx.say("decided")
            }
        }
        location = /peek {
            content_by_lua_block {
                local d, err, code = pipe:peek(ngx.var.arg_k)
                ngx.header["X-Source"] = d and d.source
                ngx.header["X-Remaining"] = d and d.remaining
                ngx.header["X-Error"] = d and d.error or code
                ngx.say("peeked")
            }
        }
        # A request that is ended when its client goes away (499), also
        # while it waits for its reply; "seen" counts those that called.
        location = /abort {
            lua_check_client_abort on;
            content_by_lua_block {
                ngx.shared.seen:incr("calls", 1, 0)
                local d = pipe:allow(ngx.var.arg_k)
                ngx.say(d and tostring(d.allowed) or "nil")
            }
        }
        location = /seen {
            content_by_lua_block { ngx.print(ngx.shared.seen:get("calls") or 0) }
        }
    }
}
"""


class PipelineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.redis = RedisServer()
        cls.env = dict(os.environ, HIRATE_TEST_REDIS_PORT=str(cls.redis.port))

        def build(prefix, ports):
            conf = CONF
            for k, v in {"@DIR@": prefix, "@PORT@": str(ports["doc"]), "@LUA_DIR@": LUA_DIR,
                         "@LUA_CPATH@": LUA_CPATH, "@TIMEOUT@": str(TIMEOUT),
                         "@USER@": "user root;" if os.geteuid() == 0 else ""}.items():
                conf = conf.replace(k, v)
            return conf

        cls.nginx = Nginx(build, cls.env, port_names=("doc",))
        cls.port = cls.nginx.ports["doc"]

    @classmethod
    def tearDownClass(cls):
        cls.nginx.close(keep=os.environ.get("HIRATE_KEEP_NGINX") == "1")
        cls.redis.close()

    def setUp(self):
        self.redis.command("FLUSHALL")

    def burst(self, paths):
        return join(*get_many(self.port, paths))

    def test_cluster_and_sentinel_refused(self):
        for url, what in (("redis%2Bcluster://127.0.0.1:1", "a Redis Cluster"),
                          ("redis%2Bsentinel://127.0.0.1:1/mymaster", "a Sentinel service")):
            r = get(self.port, f"/refused?url={url}")
            self.assertEqual(r.body.decode(),
                             "bad argument #1 to 'new' "
                             "(pipeline = true shares one connection to one Redis server, "
                             f"and this URL names {what}: leave pipeline out (each request "
                             "takes a pooled connection of the node the core names))")
        r = get(self.port, "/refused?url=redis://127.0.0.1:1&p=yes")
        self.assertEqual(r.body.decode(), "bad argument #1 "
                         "to 'new' (pipeline must be true or false, got string)")

    def test_one_key_exactly_capacity(self):
        rs = self.burst(["/allow?k=one"] * 120)
        self.assertEqual(Counter(r.header("x-allowed") for r in rs),
                         Counter({"true": 50, "false": 70}))
        # Refusals after the first may come from the deny cache.
        self.assertEqual({r.header("x-source") for r in rs if r.header("x-allowed") == "true"},
                         {"redis"})
        self.assertEqual(len({r.header("x-worker") for r in rs}), 2)

    def clients(self):
        info = self.redis.command("INFO", "clients")
        if isinstance(info, bytes):
            info = info.decode()
        return int(re.search(r"connected_clients:(\d+)", info).group(1))

    def test_an_idle_connection_closes_after_keepalive_timeout(self):
        self.burst(["/allow?k=warm"] * 8)
        before = self.clients()
        rs = self.burst(["/idle?k=idle"] * 40)
        self.assertEqual(Counter(r.header("x-allowed") for r in rs), Counter({"true": 40}))
        self.assertGreater(self.clients(), before)
        # Idle for keepalive_timeout (0.5 s): each worker's connection of
        # that limiter closes, and the next calls open a new one.
        for _ in range(400):
            if self.clients() == before:
                break
            time.sleep(0.025)
        self.assertEqual(self.clients(), before)
        rs = self.burst(["/idle?k=idle"] * 20)
        self.assertEqual(Counter(r.header("x-allowed") for r in rs),
                         Counter({"true": 10, "false": 10}))
        self.assertEqual({r.header("x-source") for r in rs if r.header("x-allowed") == "true"},
                         {"redis"})

    def test_many_keys_each_exactly_capacity(self):
        paths = [f"/allow?k=key{i % 4}" for i in range(240)]
        rs = self.burst(paths)
        per_key = Counter((p, r.header("x-allowed")) for p, r in zip(paths, rs))
        for i in range(4):
            self.assertEqual(per_key[(f"/allow?k=key{i}", "true")], 50)
            self.assertEqual(per_key[(f"/allow?k=key{i}", "false")], 10)

    def test_stalled_redis_each_waiter_times_out_and_policy_answers(self):
        self.burst(["/allow?k=warm"] * 8)   # both workers' connections are open
        os.kill(self.redis.proc.pid, signal.SIGSTOP)
        try:
            rs = self.burst(["/allow?k=stall"] * 24)
        finally:
            os.kill(self.redis.proc.pid, signal.SIGCONT)
        self.assertEqual(Counter((r.status, r.header("x-allowed"), r.header("x-source"))
                                 for r in rs), Counter({(200, "true", "fail_open"): 24}))
        self.assertEqual({r.header("x-error") for r in rs} - {"EOPEN"}, {"ETIMEDOUT"})
        # Redis answers again: the next requests are decided by it, exactly.
        self.assert_recovers("after-stall")
        rs = self.burst(["/allow?k=exact-after-stall"] * 60)
        self.assertEqual(Counter(r.header("x-allowed") for r in rs),
                         Counter({"true": 50, "false": 10}))
        self.assertEqual({r.header("x-source") for r in rs if r.header("x-allowed") == "true"},
                         {"redis"})

    def test_no_reply_goes_to_another_call(self):
        # Eight buckets, each with a remaining of its own; peeks spend nothing,
        # so every peek Redis answers must say its own key's figure, through
        # stalls longer than the timeout (calls time out with replies still
        # due) and shorter ones (replies late, still in time).
        keys = [f"own{i}" for i in range(8)]
        for i, k in enumerate(keys):
            self.burst([f"/allow?k={k}"] * (i + 1))
        expected = {k: str(49 - i) for i, k in enumerate(keys)}
        self.assertEqual({k: get(self.port, f"/peek?k={k}").header("x-remaining") for k in keys},
                         expected)
        stop = threading.Event()
        seen = []

        def load(n):
            i = n
            while not stop.is_set():
                k = keys[i % len(keys)]
                i += 1
                seen.append((k, get(self.port, f"/peek?k={k}")))

        threads = [threading.Thread(target=load, args=(n,)) for n in range(12)]
        for t in threads:
            t.start()
        try:
            for pause in (0.3, 0.05, 0.8, 0.2, 0.8):
                time.sleep(0.3)
                os.kill(self.redis.proc.pid, signal.SIGSTOP)
                time.sleep(pause)
                os.kill(self.redis.proc.pid, signal.SIGCONT)
            time.sleep(0.3)
        finally:
            os.kill(self.redis.proc.pid, signal.SIGCONT)
            stop.set()
            for t in threads:
                t.join()
        answered = [(k, r) for k, r in seen if r.header("x-source") == "redis"]
        failed = [r for k, r in seen if r.header("x-source") != "redis"]
        self.assertEqual([(k, r.header("x-remaining")) for k, r in answered
                          if r.header("x-remaining") != expected[k]], [])
        self.assertEqual({(r.header("x-source"), r.header("x-error")) for r in failed}
                         - {("fail_open", "EOPEN")}, {("fail_open", "ETIMEDOUT")})
        self.assertGreater(len(answered), 100)

    def test_clients_gone_while_waiting(self):
        self.burst(["/allow?k=warm"] * 8)
        n = 10
        self.assertEqual(get(self.port, "/seen").body, b"0")
        os.kill(self.redis.proc.pid, signal.SIGSTOP)
        socks = []
        try:
            for _ in range(n):
                s = socket.create_connection(("127.0.0.1", self.port))
                s.sendall(b"GET /abort?k=gone HTTP/1.1\r\nHost: t\r\n\r\n")
                socks.append(s)
            for _ in range(400):   # every request has called allow and waits
                if get(self.port, "/seen").body == str(n).encode():
                    break
                time.sleep(0.01)
            for s in socks:
                s.close()
            time.sleep(0.1)
        finally:
            os.kill(self.redis.proc.pid, signal.SIGCONT)
        self.assertEqual(get(self.port, "/seen").body, str(n).encode())
        self.assert_recovers("after-gone")
        # Every call was written before its client went: Redis spent n tokens,
        # and the connection carries on with every reply where it belongs.
        self.assertEqual(get(self.port, "/peek?k=gone").header("x-remaining"), str(50 - n))
        rs = self.burst(["/allow?k=gone"] * 60)
        self.assertEqual(Counter(r.header("x-allowed") for r in rs),
                         Counter({"true": 50 - n, "false": 10 + n}))
        log = self.nginx.error_log()
        for bad in ("[alert]", "[crit]", "[emerg]", "runtime error"):
            self.assertNotIn(bad, log)

    def assert_recovers(self, key):
        for _ in range(200):
            rs = self.burst([f"/allow?k={key}"] * 4)
            if {r.header("x-source") for r in rs} == {"redis"}:
                return
            time.sleep(0.05)
        self.fail(f"Redis never decided again: {rs}")

    def test_killed_then_restarted_redis(self):
        self.burst(["/allow?k=warm"] * 8)
        self.redis.kill()
        rs = self.burst(["/allow?k=dead"] * 16)
        self.assertEqual({(r.status, r.header("x-source")) for r in rs}, {(200, "fail_open")})
        self.assertTrue({r.header("x-error") for r in rs} <= {"EIO", "ECONNECT", "EOPEN"},
                        {r.header("x-error") for r in rs})
        self.redis.restart()
        self.assert_recovers("after-restart")
        rs = self.burst(["/allow?k=fresh"] * 60)
        self.assertEqual(Counter(r.header("x-allowed") for r in rs),
                         Counter({"true": 50, "false": 10}))

    def test_reload_under_load(self):
        stop = threading.Event()
        results, errors = [], []

        def load():
            while not stop.is_set():
                try:
                    results.append(get(self.port, "/allow?k=reload", timeout=10))
                except Exception as e:   # noqa: BLE001
                    errors.append(e)

        old = {r.header("x-worker") for r in self.burst(["/allow?k=before"] * 16)}
        self.assertEqual(len(old), 2)
        threads = [threading.Thread(target=load) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        subprocess.run(["nginx", "-p", self.nginx.dir, "-c", self.nginx.conf, "-s", "reload"],
                       check=True, env=self.env, stderr=subprocess.DEVNULL)
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertGreater(len(results), 50)
        self.assertEqual({(r.status, r.header("x-source")) for r in results}
                         - {(200, "cache")}, {(200, "redis")})
        allowed = Counter(r.header("x-allowed") for r in results)
        self.assertEqual(allowed["true"], 50)
        self.assertEqual(allowed["false"], len(results) - 50)
        # The old workers exit: their pipelined connections close once idle
        # (nginx would wait worker_shutdown_timeout, 30 s, for them).
        for _ in range(200):
            if not any(os.path.exists(f"/proc/{pid}") for pid in old):
                break
            time.sleep(0.05)
        self.assertEqual([pid for pid in old if os.path.exists(f"/proc/{pid}")], [])
        self.assertEqual({r.header("x-worker") for r in results[-8:]} & old, set())


if __name__ == "__main__":
    unittest.main()
