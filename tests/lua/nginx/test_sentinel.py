"""hirate.resty through Redis Sentinel, inside real nginx (Debian's, with
lua-nginx-module, 2 workers): every key exact and decided by Redis on the
master, the sentinels' own password and the master's each on its own
connections, the same over TLS (rediss+sentinel://), and SENTINEL FAILOVER
under load, after which every worker is back on Redis on the new master
within 2 s of the switch and says so in nginx's error log. The groups are
tests/support/redis_sentinel.py's (a master, a replica, three sentinels; one
of them TLS only); the handlers are written into nginx's prefix by this
file.

    HIRATE_LUAJIT_CPATH=<dir with hirate/core.so built for LuaJIT> \\
        python3 tests/lua/nginx/test_sentinel.py [-v]
"""

import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import ROOT, Nginx, get, make_certs  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "support"))
from redis_sentinel import SentinelGroup  # noqa: E402

CAPACITY = 3
MASTER_PW, SENTINEL_PW = "master-secret", "sentinel-secret"
N = None      # nginx, shared by the tests of this file
G = None      # the sentinel group, shared too (the failover test runs last)
TLS = None    # a group that speaks TLS only (rediss+sentinel://)
CERTS = None  # tests/support/make_certs.sh's material; nginx trusts its CA

# The handlers: one limiter per worker and per service, database, prefix,
# capacity and sentinel password, made on first use. The passwords come from
# the environment, never the request (nginx logs a request line beside a
# message). /allow answers each call's outcome with the worker's pid and
# whether that worker's limiter already knew a second master (master_changes
# 2) before the call.
HANDLERS = r"""
local hirate = require "hirate"
local json = require "dkjson"

local M = {}
local limiters = {}

-- redis+sentinel://:pw@host:port,... and rediss+sentinel://... (by address:
-- a cosocket resolves no name without a resolver)
local groups = { plain = os.getenv("HIRATE_TEST_SENTINELS"),
    tls = os.getenv("HIRATE_TEST_TLS_SENTINELS") }
local passwords = { ok = os.getenv("HIRATE_TEST_SENTINEL_PW"), bad = "bad-sentinel-pw-4711" }

local function limiter()
    local args = ngx.req.get_uri_args()
    local capacity = tonumber(args.capacity) or 3
    local group = args.group or "plain"
    local url = groups[group] .. "/" .. (args.service or "mymaster")
        .. (args.db and "/" .. args.db or "")
    local spw = args.spw or "ok"
    local id = table.concat({ url, args.prefix, capacity, spw }, "\n")
    local lim = limiters[id]
    if not lim then
        lim = hirate.new { url = url, prefix = args.prefix, capacity = capacity,
            rate = 0.001, deny_cache = false, timeout = tonumber(args.timeout) or 1,
            connect_timeout = 0.5, sentinel_password = passwords[spw],
            -- the certificates are for localhost; the sentinels name the
            -- master by address
            tls_server_name = group == "tls" and "localhost" or nil }
        limiters[id] = lim
    end
    return lim, args
end

local function say(v)
    ngx.header["Content-Type"] = "application/json"
    ngx.say(json.encode(v))
end

function M.allow()
    local lim, args = limiter()
    local out = {}
    for i = 1, tonumber(args.times) or 1 do
        local moved = lim:_stats().master_changes == 2
        local d, err, code = lim:allow(args.key)
        if d then
            out[i] = { allowed = d.allowed, remaining = d.remaining, source = d.source,
                error = d.error, moved = moved }
        else
            out[i] = { error = code, message = err }
        end
    end
    say({ pid = ngx.worker.pid(), out = out })
end

function M.stats()
    say(limiter():_stats())
end

return M
"""


def conf(prefix, ports, lua_path, lua_cpath, ca_file):
    main = [
        "daemon off;",
        "master_process on;",
        "worker_processes 2;",
        f"pid {prefix}/nginx.pid;",
        # info: the core's Sentinel lines are INFO.
        f"error_log {prefix}/error.log info;",
        "worker_shutdown_timeout 1s;",
        "env HIRATE_TEST_SENTINELS;",
        "env HIRATE_TEST_SENTINEL_PW;",
        "env HIRATE_TEST_TLS_SENTINELS;",
        "load_module /usr/lib/nginx/modules/ndk_http_module.so;",
        "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;",
        "events { worker_connections 1024; }",
    ]
    if os.geteuid() == 0:
        main.append("user root;")
    os.makedirs(os.path.join(prefix, "lua"), exist_ok=True)
    with open(os.path.join(prefix, "lua", "hirate_sentinel_test.lua"), "w") as f:
        f.write(HANDLERS)
    locations = "\n".join(
        f"        location = /{name} {{ content_by_lua_block "
        f"{{ require('hirate_sentinel_test').{name}() }} }}"
        for name in ("allow", "stats"))
    return "\n".join(main) + f"""
http {{
    access_log off;
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
    lua_socket_log_errors off;
    lua_ssl_trusted_certificate {ca_file};
    lua_package_path "{lua_path};{prefix}/lua/?.lua;;";
    lua_package_cpath "{lua_cpath}";
    server {{
        listen 127.0.0.1:{ports['test']} reuseport;
{locations}
    }}
}}
"""


def with_password(group_url):
    """The sentinels of a group's URL, by address, with the master's password
    (the harness' URL has none), without the service."""
    u = re.sub(r"^(rediss?\+sentinel://)", rf"\1:{MASTER_PW}@", group_url)
    return u.replace("localhost", "127.0.0.1").rsplit("/", 1)[0]


def setUpModule():
    global N, G, TLS, CERTS
    cpath = os.environ.get("HIRATE_LUAJIT_CPATH")
    if not cpath or not os.path.exists(os.path.join(cpath, "hirate", "core.so")):
        raise RuntimeError("set HIRATE_LUAJIT_CPATH to the directory holding hirate/core.so "
                           "built for LuaJIT (tests/lua/nginx/run.sh does)")
    lua_dir = os.environ.get("HIRATE_LUA_DIR", str(ROOT / "bindings" / "lua"))
    lua_path = ";".join([os.path.join(lua_dir, "?.lua"), "/usr/share/lua/5.1/?.lua"])
    lua_cpath = os.path.join(cpath, "?.so") + ";;"
    CERTS = tempfile.mkdtemp(prefix="hirate-certs-")
    make_certs(CERTS)
    try:
        G = SentinelGroup(replicas=1, sentinels=3, password=MASTER_PW,
                          sentinel_password=SENTINEL_PW)
        TLS = SentinelGroup(replicas=1, sentinels=3, password=MASTER_PW,
                            sentinel_password=SENTINEL_PW, tls=CERTS)
        env = dict(os.environ, HIRATE_TEST_SENTINEL_PW=SENTINEL_PW,
                   HIRATE_TEST_SENTINELS=with_password(G.url),
                   HIRATE_TEST_TLS_SENTINELS=with_password(TLS.url))
        ca_file = os.path.join(CERTS, "ca.crt")
        N = Nginx(lambda prefix, ports: conf(prefix, ports, lua_path, lua_cpath, ca_file),
                  env, port_names=("test",))
    except BaseException:
        tearDownModule()
        raise


def tearDownModule():
    if N:
        keep = os.environ.get("HIRATE_KEEP_NGINX") == "1"
        if keep:
            print(f"nginx prefix kept: {N.dir}", file=sys.stderr)
        N.close(keep=keep)
    for g in (G, TLS):
        if g:
            g.stop()
    if CERTS:
        shutil.rmtree(CERTS, ignore_errors=True)


def call(path, timeout=10, **args):
    r = get(N.ports["test"], f"/{path}?{urllib.parse.urlencode(args)}", timeout=timeout)
    if r.status != 200:
        raise AssertionError(f"{path} {args}: {r.status} {r.body!r}\n{N.error_log()[-3000:]}")
    return json.loads(r.body)


class SentinelTest(unittest.TestCase):
    # unittest runs a class's tests in the order of their names: the
    # failover, which moves the master, last.

    def test_a_every_key_gets_exactly_its_capacity_from_the_master(self):
        master = G.master.port
        for k in [f"k{i}" for i in range(60)]:
            r = call("allow", prefix="x:", key=k, times=CAPACITY + 1)
            self.assertEqual([{"allowed": i < CAPACITY, "remaining": max(CAPACITY - 1 - i, 0),
                               "source": "redis", "moved": False}
                              for i in range(CAPACITY + 1)], r["out"], k)
        self.assertEqual("1", G.cli(master, "EXISTS", "x:k0").strip())
        self.assertEqual("1", G.cli(master, "EXISTS", "x:k59").strip())

    def test_b_a_database_is_selected_on_the_master(self):
        # The master's handshake selects db 3; a sentinel's selects nothing
        # (a sentinel has no SELECT: the call would fail if it were sent).
        r = call("allow", db=3, prefix="db:", key="k", times=1)
        self.assertEqual("redis", r["out"][0]["source"], r)
        self.assertEqual("1", G.cli(G.master.port, "-n", "3", "EXISTS", "db:k").strip())

    def test_c_a_wrong_sentinel_password_is_eauth(self):
        for spw in ("bad", "none"):
            r = call("allow", prefix="w:", key="k", spw=spw)
            self.assertEqual("EAUTH", r["out"][0].get("error"), r)
            self.assertNotIn("bad-sentinel-pw-4711", r["out"][0]["message"])
            self.assertNotIn(MASTER_PW, r["out"][0]["message"])

    def test_d_an_unknown_service_is_ereply(self):
        r = call("allow", service="nosuch", prefix="u:", key="k")
        out = r["out"][0]
        self.assertEqual("EREPLY", out.get("error"), r)
        self.assertRegex(out["message"],
                         r"^sentinel 127\.0\.0\.1:\d+ knows no master named 'nosuch'$")

    def test_z_sentinel_failover_under_load(self):
        prefix = "f:"
        args = dict(prefix=prefix, capacity=10 ** 6, timeout=0.5)
        # Both workers make their limiter and find the master.
        old = G.master
        pids = set()
        for i in range(40):
            r = call("allow", key=f"warm{i}", **args)
            self.assertEqual("redis", r["out"][0]["source"])
            pids.add(r["pid"])
        self.assertEqual(2, len(pids), "both workers should have served")

        seen = []   # (ended, pid, key, outcome)
        failures = []
        stop = threading.Event()

        def load(n):
            i = 0
            while not stop.is_set():
                i += 1
                key = f"l{n}_{i}"
                try:
                    r = call("allow", key=key, **args)
                except Exception as e:   # reported below
                    failures.append(e)
                    return
                seen.append((time.monotonic(), r["pid"], key, r["out"][0]))

        threads = [threading.Thread(target=load, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.3)
            G.failover()
            new, switched = G.wait_switch(old, 30)
            # Until every worker is back, or the bound is far behind.
            deadline = switched + 10
            while time.monotonic() < deadline:
                back = self._back(seen, switched)
                if set(back) >= pids:
                    break
                time.sleep(0.05)
        finally:
            stop.set()
            for t in threads:
                t.join()
        self.assertEqual([], failures)
        self.assertNotEqual(old.port, new.port)
        back = self._back(seen, switched)
        self.assertEqual(pids, set(back), f"workers back on redis on the new master: {back}")
        sources = [o.get("source") for _, _, _, o in seen]
        print(f"\nSENTINEL FAILOVER in nginx: every worker back on redis on the new master "
              + ", ".join(f"{at - switched:.3f} s" for at, _ in back.values())
              + f" after the switch ({len(seen)} requests: {sources.count('redis')} redis, "
              f"{sources.count('local')} local)", file=sys.stderr)
        for pid, (at, key) in back.items():
            # The issue's bound. A worker asks the sentinels every 0.5 s, and
            # at once when the demoted master answers READONLY: the 2 s
            # leave more than a second for a slow machine.
            self.assertLessEqual(at - switched, 2.0, f"worker {pid}")
            # The call that came back left its bucket on the new master.
            self.assertEqual("1", G.cli(new.port, "EXISTS", prefix + key).strip(), key)
        self.assertEqual([], [o for _, _, _, o in seen if "message" in o])
        log = N.error_log()

        def workers_saying(line):
            """The pids of the [info] lines of the error log that end in line
            (nginx may add the request after a comma)."""
            return sorted(int(p) for p in re.findall(
                r"^\S+ \S+ \[info\] (\d+)#\d+: .*" + re.escape(line) + r"(?:,|$)", log, re.M))

        # Every worker found the master (every limiter of it says so once)
        # and then, once, that it moved: only this limiter was in use.
        found = workers_saying(f"hirate: sentinel: the master of 'mymaster' is "
                               f"127.0.0.1:{old.port}")
        self.assertEqual(pids, set(found), log[-3000:])
        moved = workers_saying(f"hirate: sentinel: the master of 'mymaster' moved from "
                               f"127.0.0.1:{old.port} to 127.0.0.1:{new.port}")
        self.assertEqual(sorted(pids), moved, log[-3000:])
        for secret in (SENTINEL_PW, MASTER_PW, "bad-sentinel-pw-4711"):
            self.assertNotIn(secret, log)

    def test_e_every_key_exact_over_tls(self):
        # rediss+sentinel://: TLS to the sentinels and to the master, each
        # on its own pool, the names checked against nginx's trusted CA.
        self.assertTrue(TLS.url.startswith("rediss+sentinel://localhost:"), TLS.url)
        for k in [f"t{i}" for i in range(20)]:
            r = call("allow", group="tls", prefix="tls:", key=k, times=CAPACITY + 1)
            self.assertEqual([{"allowed": i < CAPACITY, "remaining": max(CAPACITY - 1 - i, 0),
                               "source": "redis", "moved": False}
                              for i in range(CAPACITY + 1)], r["out"], k)
        self.assertEqual("1", TLS.cli(TLS.master.port, "EXISTS", "tls:t0").strip())

    @staticmethod
    def _back(seen, switched):
        """{worker pid: (when, key)}: each worker's first call after the
        switch that was decided by Redis with the new master known before it
        started."""
        back = {}
        for ended, pid, key, o in list(seen):
            if ended >= switched and pid not in back and o.get("moved") \
                    and o.get("source") == "redis":
                back[pid] = (ended, key)
        return back


if __name__ == "__main__":
    unittest.main()
