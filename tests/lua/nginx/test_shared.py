"""The in-memory table shared by every nginx worker (shared = true), in real
nginx: Debian's nginx with lua-nginx-module running the nginx.conf of
docs/lua.md's "One table for every worker" with 4 workers, without Redis.
Many concurrent requests on one key, spread over all 4 workers, are allowed
exactly the capacity; a worker killed with SIGKILL blocks nobody and the one
nginx starts in its place decides on the same table; a reload gives the new
workers a new table.

    HIRATE_LUAJIT_CPATH=<dir with hirate/core.so built for LuaJIT> \\
        python3 tests/lua/nginx/test_shared.py [-v] [Test.name]

HIRATE_LUA_DIR points at another copy of hirate.lua and hirate/*.lua;
HIRATE_KEEP_NGINX=1 keeps nginx's prefix (config, error.log) for a look.
"""

import os
import re
import signal
import sys
import time
import unittest
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import ROOT, Nginx, get, get_many, join, replace_once  # noqa: E402

DOC = ROOT / "docs" / "lua.md"
WORKERS = 4

# Added to the doc's init_by_lua_block: nothing. To its http block: a limiter
# of each worker's own (for the contrast), and the test's locations.
OWN = """
    init_worker_by_lua_block {
        own_limit = require("hirate").new{ capacity = 5, rate = 0.001 }
    }
"""

TEST_SERVER = """
    server {
        listen 127.0.0.1:@TEST_PORT@ reuseport;
        add_header X-Worker $pid always;

        # The doc's proxy_pass goes here.
        location / {
            content_by_lua_block { ngx.say("backend") }
        }

        # One decision of the doc's limiter (or of each worker's own) on k.
        location = /t/allow {
            content_by_lua_block {
                local lim = ngx.var.arg_lim == "own" and own_limit or login_limit.limiter
                local d, err = lim:allow(ngx.var.arg_k)
                ngx.header["X-Allowed"] = d and tostring(d.allowed) or err
                ngx.header["X-Source"] = d and d.source
                ngx.say("decided")
            }
        }

        # Each band's remaining tokens of k, spending nothing.
        location = /t/peek {
            content_by_lua_block {
                local d = login_limit.limiter:peek(ngx.var.arg_k)
                ngx.say(d.bands[1].remaining, " ", d.bands[2].remaining, " ", d.band)
            }
        }

        # shared = true anywhere but init_by_lua*.
        location = /t/shared_here {
            content_by_lua_block {
                local ok, err = pcall(require("hirate").new,
                                      { capacity = 1, rate = 1, shared = true })
                ngx.say(ok and "made" or err)
            }
        }
    }
"""


def doc_snippet():
    """The nginx.conf of docs/lua.md's "### One table for every worker"."""
    text = DOC.read_text()
    m = re.search(r"^### One table for every worker\n(.*?)(?=^#+ |\Z)", text, re.S | re.M)
    if not m:
        raise AssertionError(f"{DOC} has no '### One table for every worker' section")
    block = re.search(r"^```nginx\n(.*?)^```", m.group(1), re.S | re.M)
    if not block:
        raise AssertionError("that section of docs/lua.md has no ```nginx block")
    return block.group(1)


def build_conf(prefix, ports, lua_path, lua_cpath):
    where = "the docs/lua.md shared nginx.conf"
    conf = doc_snippet()
    conf = replace_once(conf, "worker_processes 4;", f"worker_processes {WORKERS};", where)
    conf = replace_once(conf, "listen 8080;",
                        f"listen 127.0.0.1:{ports['doc']} reuseport;\n"
                        "        add_header X-Worker $pid always;", where)
    conf = replace_once(conf, "proxy_pass http://127.0.0.1:9000;",
                        f"proxy_pass http://127.0.0.1:{ports['test']};", where)
    # An hour's and a day's refill, so that no token comes back while the
    # test runs: the first band (40) binds, the second keeps 10.
    conf = replace_once(conf, 'limits = "10/minute; 100/day"', 'limits = "40/hour; 50/day"',
                        where)
    conf = re.sub(r'lua_package_path\s+"[^"]*";', f'lua_package_path "{lua_path}";', conf)
    conf = re.sub(r'lua_package_cpath\s+"[^"]*";', f'lua_package_cpath "{lua_cpath}";', conf)
    main = ["daemon off;", "master_process on;", f"pid {prefix}/nginx.pid;",
            f"error_log {prefix}/error.log info;", "worker_shutdown_timeout 1s;"]
    if os.geteuid() == 0:
        main.append("user root;")
    http_head = "\n".join(f"    {d}" for d in [
        "access_log off;",
        f"client_body_temp_path {prefix}/tmp/body;",
        f"proxy_temp_path {prefix}/tmp/proxy;",
        f"fastcgi_temp_path {prefix}/tmp/fastcgi;",
        f"uwsgi_temp_path {prefix}/tmp/uwsgi;",
        f"scgi_temp_path {prefix}/tmp/scgi;",
    ])
    conf = replace_once(conf, "http {\n", "http {\n" + http_head + "\n" + OWN, where)
    end = conf.rstrip().rfind("}")
    conf = conf[:end] + TEST_SERVER.replace("@TEST_PORT@", str(ports["test"])) + "}\n"
    return "\n".join(main) + "\n" + conf


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


class SharedAcrossWorkers(unittest.TestCase):

    def setUp(self):
        cpath = os.environ.get("HIRATE_LUAJIT_CPATH")
        if not cpath or not os.path.exists(os.path.join(cpath, "hirate", "core.so")):
            raise RuntimeError("set HIRATE_LUAJIT_CPATH to the directory holding hirate/core.so "
                               "built for LuaJIT (tests/lua/nginx/run.sh does)")
        lua_dir = os.environ.get("HIRATE_LUA_DIR", str(ROOT / "bindings" / "lua"))
        lua_path = ";".join([os.path.join(lua_dir, "?.lua"), "/usr/share/lua/5.1/?.lua", ";"])
        lua_cpath = os.path.join(cpath, "?.so") + ";;"
        self.nginx = Nginx(lambda prefix, ports: build_conf(prefix, ports, lua_path, lua_cpath),
                           dict(os.environ))
        self.addCleanup(self.close_nginx)
        self.doc = self.nginx.ports["doc"]
        self.test = self.nginx.ports["test"]

    def close_nginx(self):
        keep = os.environ.get("HIRATE_KEEP_NGINX") == "1"
        if keep:
            print(f"nginx prefix kept: {self.nginx.dir}", file=sys.stderr)
        self.nginx.close(keep=keep)

    def allow_many(self, key, n, lim="login"):
        """n concurrent decisions on key, each on a connection of its own:
        (how many were allowed, the workers that answered)."""
        rs = join(*get_many(self.test, [f"/t/allow?lim={lim}&k={key}"] * n))
        self.assertEqual({r.status for r in rs}, {200}, rs[:3])
        self.assertEqual({r.header("X-Source") for r in rs}, {"local"})
        return (sum(r.header("X-Allowed") == "true" for r in rs),
                {int(r.header("X-Worker")) for r in rs})

    def peek(self, key):
        return get(self.test, f"/t/peek?k={key}").body.decode().strip()

    def workers(self):
        """The worker pids, from enough requests to meet every one."""
        rs = join(*get_many(self.test, ["/"] * 200))
        return {int(r.header("X-Worker")) for r in rs}

    def test_the_doc_config_allows_exactly_the_capacity_across_all_4_workers(self):
        rs = join(*get_many(self.doc, ["/login"] * 200))
        self.assertEqual(Counter(r.status for r in rs), Counter({200: 40, 429: 160}))
        self.assertEqual(len({r.header("X-Worker") for r in rs}), WORKERS,
                         "every worker should have served requests")
        self.assertEqual({r.body for r in rs if r.status == 200}, {b"backend\n"})

    def test_one_key_over_every_worker_gets_exactly_the_capacity_of_every_band(self):
        allowed, workers = self.allow_many("one", 300)
        self.assertEqual(allowed, 40)
        self.assertEqual(len(workers), WORKERS)
        # The first band is empty, the second kept its 10: both were spent
        # together, 40 times, by whichever worker decided.
        self.assertEqual(self.peek("one"), "0 10 1")
        allowed, _ = self.allow_many("one", 50)
        self.assertEqual(allowed, 0)

    def test_a_limiter_of_each_workers_own_allows_the_capacity_in_each(self):
        allowed, workers = self.allow_many("own", 400, lim="own")
        self.assertEqual(len(workers), WORKERS)
        self.assertEqual(allowed, 5 * WORKERS)

    def test_shared_outside_init_by_lua_raises(self):
        r = get(self.test, "/t/shared_here")
        self.assertEqual(r.status, 200)
        self.assertTrue(r.body.decode().rstrip("\n").endswith(
            "bad argument #1 to 'new' (shared = true shares the buckets with the workers nginx "
            "forks after the limiter is made: make it in init_by_lua*, not in content)"),
            r.body)

    def test_a_killed_worker_blocks_nobody_and_its_successor_shares_the_table(self):
        allowed, workers = self.allow_many("kill", 25)
        self.assertEqual(allowed, 25)
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive(victim) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(alive(victim))
        # nginx forks a new worker from the master: 4 again, on one table.
        now = self.workers()
        while len(now) < WORKERS and time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.workers()
        self.assertEqual(len(now), WORKERS)
        self.assertNotIn(victim, now)
        allowed, workers = self.allow_many("kill", 100)
        self.assertEqual(allowed, 15)
        self.assertEqual(workers, now)
        self.assertEqual(self.peek("kill"), "0 10 1")
        alerts = [line for line in self.nginx.error_log().splitlines()
                  if "[alert]" in line or "[emerg]" in line]
        self.assertEqual(len(alerts), 1, alerts)
        self.assertIn(f"worker process {victim} exited on signal 9", alerts[0])

    def shared_mappings(self, pid):
        """The sizes of pid's shared anonymous mappings (nginx's own zones
        and hirate's tables)."""
        sizes = []
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if line.rstrip().endswith("/dev/zero (deleted)"):
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    sizes.append(hi - lo)
        return sorted(sizes)

    def test_a_reload_gives_the_new_workers_a_new_table(self):
        allowed, old = self.allow_many("reload", 60)
        self.assertEqual(allowed, 40)
        master = self.nginx.proc.pid
        before = self.shared_mappings(master)
        # The table of 100,000 keys of 2 bands: a mapping of 56 to 57 MB.
        self.assertEqual(len([n for n in before if 56e6 <= n <= 57e6]), 1, before)
        os.kill(master, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in old) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(any(alive(p) for p in old))
        allowed, new = self.allow_many("reload", 60)
        self.assertEqual(allowed, 40)
        self.assertEqual(len(new), WORKERS)
        self.assertFalse(new & old)
        # The master closed its old Lua state, and the old table with it.
        self.assertEqual(self.shared_mappings(master), before)


if __name__ == "__main__":
    unittest.main()
