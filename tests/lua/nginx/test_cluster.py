"""hirate.resty over a Redis Cluster, inside real nginx (Debian's, with
lua-nginx-module, 2 workers): every key exact and decided by Redis, a batch
over every node in the caller's order, and a master killed while requests
run. The clusters are tests/support/redis_cluster.py's (3 masters, each with
a replica); the handlers are lua/hirate_cluster_test.lua.

    HIRATE_LUAJIT_CPATH=<dir with hirate/core.so built for LuaJIT> \\
        python3 tests/lua/nginx/test_cluster.py [-v]

tests/lua/nginx/run.sh builds the module and runs this.
"""

import json
import os
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
from redis_cluster import RedisCluster  # noqa: E402

CAPACITY = 3
N = None       # nginx, shared by the tests of this file
CERTS = None   # tests/support/make_certs.sh's material; nginx trusts its CA


def conf(prefix, ports, lua_path, lua_cpath, ca_file):
    main = [
        "daemon off;",
        "master_process on;",
        "worker_processes 2;",
        f"pid {prefix}/nginx.pid;",
        f"error_log {prefix}/error.log warn;",
        "worker_shutdown_timeout 1s;",
        "load_module /usr/lib/nginx/modules/ndk_http_module.so;",
        "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;",
        "events { worker_connections 1024; }",
    ]
    if os.geteuid() == 0:
        main.append("user root;")
    locations = "\n".join(
        f"        location = /{name} {{ content_by_lua_block "
        f"{{ require('hirate_cluster_test').{name}() }} }}"
        for name in ("allow", "many", "stats"))
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
    lua_package_path "{lua_path}";
    lua_package_cpath "{lua_cpath}";
    server {{
        listen 127.0.0.1:{ports['test']} reuseport;
{locations}
    }}
}}
"""


def setUpModule():
    global N, CERTS
    cpath = os.environ.get("HIRATE_LUAJIT_CPATH")
    if not cpath or not os.path.exists(os.path.join(cpath, "hirate", "core.so")):
        raise RuntimeError("set HIRATE_LUAJIT_CPATH to the directory holding hirate/core.so "
                           "built for LuaJIT (tests/lua/nginx/run.sh does)")
    lua_dir = os.environ.get("HIRATE_LUA_DIR", str(ROOT / "bindings" / "lua"))
    lua_path = ";".join([os.path.join(lua_dir, "?.lua"),
                         str(ROOT / "tests" / "lua" / "nginx" / "lua" / "?.lua"),
                         "/usr/share/lua/5.1/?.lua", ";"])
    lua_cpath = os.path.join(cpath, "?.so") + ";;"
    CERTS = tempfile.mkdtemp(prefix="hirate-certs-")
    make_certs(CERTS)
    ca_file = os.path.join(CERTS, "ca.crt")
    N = Nginx(lambda prefix, ports: conf(prefix, ports, lua_path, lua_cpath, ca_file),
              dict(os.environ), port_names=("test",))


def tearDownModule():
    if N:
        keep = os.environ.get("HIRATE_KEEP_NGINX") == "1"
        if keep:
            print(f"nginx prefix kept: {N.dir}", file=sys.stderr)
        N.close(keep=keep)
    if CERTS:
        shutil.rmtree(CERTS, ignore_errors=True)


def call(path, **args):
    r = get(N.ports["test"], f"/{path}?{urllib.parse.urlencode(args)}")
    if r.status != 200:
        raise AssertionError(f"{path} {args}: {r.status} {r.body!r}\n{N.error_log()[-3000:]}")
    return json.loads(r.body)


def keys_by_master(c, prefix, keys):
    """{master port: [key, ...]} by Redis' own CLUSTER KEYSLOT of the full key."""
    out = {}
    slots = c.keyslots([(prefix + k).encode() for k in keys])
    c.refresh()
    masters = [n for n in c.nodes if n.role == "master"]
    for k, slot in zip(keys, slots):
        owner = next(n for n in masters if any(lo <= slot <= hi for lo, hi in n.slots))
        out.setdefault(owner.port, []).append(k)
    return out


class ClusterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = RedisCluster(masters=3, replicas=1)

    @classmethod
    def tearDownClass(cls):
        cls.c.stop()

    def test_every_key_gets_exactly_its_capacity_from_redis(self):
        keys = [f"k{i}" for i in range(300)]
        self.assertEqual(3, len(keys_by_master(self.c, "x:", keys)))   # every master
        for k in keys:
            out = call("allow", url=self.c.url, prefix="x:", key=k, times=CAPACITY + 1)
            self.assertEqual([{"allowed": i < CAPACITY, "remaining": max(CAPACITY - 1 - i, 0),
                               "source": "redis"} for i in range(CAPACITY + 1)], out, k)

    def test_allow_many_across_the_nodes_in_order(self):
        keys = [f"m{i}" for i in range(24)]
        by_master = keys_by_master(self.c, "y:", keys)
        self.assertEqual(3, len(by_master))
        items = ",".join(f"{k}:{i % 3 + 1}" for i, k in enumerate(keys))
        first = call("many", url=self.c.url, prefix="y:", items=items)
        second = call("many", url=self.c.url, prefix="y:", items=items)
        for i, k in enumerate(keys):
            cost = i % 3 + 1
            self.assertEqual({"allowed": True, "remaining": CAPACITY - cost, "source": "redis"},
                             first[i], k)
            again = 2 * cost <= CAPACITY
            self.assertEqual({"allowed": again,
                              "remaining": CAPACITY - 2 * cost if again else CAPACITY - cost,
                              "source": "redis"}, second[i], k)

    def test_several_limits_on_every_node_are_one_decision(self):
        keys = [f"b{i}" for i in range(30)]
        self.assertEqual(3, len(keys_by_master(self.c, "b:", keys)))   # every master
        # 3 and 2 per 1000 s: the second band refuses the third call, which
        # the first band held (and keeps: nothing was spent).
        want = [
            {"allowed": True, "remaining": 1, "source": "redis", "band": 2,
             "bands": [{"allowed": True, "remaining": 2}, {"allowed": True, "remaining": 1}]},
            {"allowed": True, "remaining": 0, "source": "redis", "band": 2,
             "bands": [{"allowed": True, "remaining": 1}, {"allowed": True, "remaining": 0}]},
            {"allowed": False, "remaining": 0, "source": "redis", "band": 2,
             "bands": [{"allowed": True, "remaining": 1}, {"allowed": False, "remaining": 0}]},
        ]
        for k in keys:
            out = call("allow", url=self.c.url, prefix="b:", key=k, times=3,
                       limits="3/1000s; 2/1000s")
            self.assertEqual(want, out, k)
        # allow_many across the nodes: the whole's figures and band.
        out = call("many", url=self.c.url, prefix="b:", items=",".join(f"{k}:1" for k in keys),
                   limits="3/1000s; 2/1000s")
        self.assertEqual([{"allowed": False, "remaining": 0, "source": "redis", "band": 2}] * 30,
                         out)

    def test_a_replica_as_the_only_seed(self):
        replica = next(n for n in self.c.nodes if n.role == "replica")
        url = f"redis+cluster://127.0.0.1:{replica.port}"
        for k in [f"r{i}" for i in range(30)]:
            out = call("allow", url=url, prefix="z:", key=k, times=CAPACITY + 1)
            self.assertEqual(["redis"] * (CAPACITY + 1), [d["source"] for d in out], k)
            self.assertEqual([True] * CAPACITY + [False], [d["allowed"] for d in out], k)


class TlsClusterTest(unittest.TestCase):
    """rediss+cluster://: nginx verifies every node's certificate against a
    host name (lua_ssl_trusted_certificate), so the nodes, which the cluster
    names by address, need tls_server_name; and a cosocket resolves no name
    without a resolver, so the seed is given by address too."""

    @classmethod
    def setUpClass(cls):
        cls.c = RedisCluster(masters=3, replicas=1, tls=CERTS)

    @classmethod
    def tearDownClass(cls):
        cls.c.stop()

    def test_every_key_exact_over_tls(self):
        self.assertTrue(self.c.url.startswith("rediss+cluster://localhost:"), self.c.url)
        url = self.c.url.replace("localhost", "127.0.0.1")
        keys = [f"t{i}" for i in range(60)]
        self.assertEqual(3, len(keys_by_master(self.c, "tls:", keys)))
        for k in keys:
            out = call("allow", url=url, prefix="tls:", key=k, times=CAPACITY + 1,
                       server_name="localhost")
            self.assertEqual([{"allowed": i < CAPACITY, "remaining": max(CAPACITY - 1 - i, 0),
                               "source": "redis"} for i in range(CAPACITY + 1)], out, k)


class FailoverTest(unittest.TestCase):
    """SIGKILL of a master while requests run: the keys of the healthy
    shards stay decided by Redis throughout; the dead shard's keys go to the
    policy (local) until its replica is promoted, then back to Redis."""

    def test_a_killed_master(self):
        c = RedisCluster(masters=3, replicas=1)
        try:
            self._run(c)
        finally:
            c.stop()

    def _run(self, c):
        # With full coverage required (Redis' default) every node answers
        # CLUSTERDOWN while a slot has no master, healthy shards too: their
        # keys could not stay with Redis whatever the client did.
        c.config_set("cluster-require-full-coverage", "no")
        prefix = "f:"
        by_master = keys_by_master(c, prefix, [f"f{i}" for i in range(60)])
        victim = c.node(sorted(by_master)[0])
        dead_keys = by_master[victim.port]
        healthy_keys = [k for p, ks in by_master.items() if p != victim.port for k in ks]
        args = dict(url=c.url, prefix=prefix, capacity=10 ** 6, timeout=0.5)

        seen = []

        def source(k):
            d = call("allow", key=k, **args)[0]
            seen.append((round(time.monotonic() - killed_at, 3), k, d))
            return d.get("source")

        killed_at = time.monotonic()

        # Both workers learn the map and open their connections.
        for k in dead_keys[:4] + healthy_keys[:8]:
            self.assertEqual("redis", source(k))

        promoted = {}

        def wait():
            promoted["node"] = c.wait_failover(victim, timeout=30)
            promoted["at"] = time.monotonic()

        killed_at = time.monotonic()
        c.kill(victim)
        waiter = threading.Thread(target=wait)
        waiter.start()
        healthy_seen = []
        dead_sources = []
        back_at = None
        streak = 0
        i = 0
        deadline = killed_at + 45
        while time.monotonic() < deadline:
            i += 1
            h = healthy_keys[i % len(healthy_keys)]
            healthy_seen.append(source(h))
            s = source(dead_keys[i % len(dead_keys)])
            dead_sources.append(s)
            if "at" in promoted and s == "redis":
                streak += 1
                if streak == 1:
                    back_at = time.monotonic()
                if streak >= 20:   # both workers, several keys: back for good
                    break
            else:
                streak = 0
                back_at = None
            time.sleep(0.01)
        waiter.join()
        self.assertIn("at", promoted, "no replica took over")
        self.assertEqual({"redis"}, set(healthy_seen),
                         [x for x in seen if x[1] in healthy_keys and x[2].get("source") != "redis"][:5])
        self.assertIn("local", dead_sources)   # the dead shard went to the policy
        self.assertIsNotNone(back_at, f"the dead shard's keys did not come back to redis: "
                             f"{dead_sources[-10:]}")
        after = max(0.0, back_at - promoted["at"])
        print(f"\nfailover: promoted {promoted['at'] - killed_at:.2f} s after the SIGKILL; "
              f"the dead shard's keys back to source redis {after:.2f} s after the promotion "
              f"({back_at - killed_at:.2f} s after the SIGKILL); {len(healthy_seen)} requests "
              f"on healthy shards, all source redis", file=sys.stderr)
        # The core refreshes its map once a failure marks it stale, at most
        # once per interval: the promoted master is found within seconds.
        self.assertLess(after, 10.0)


if __name__ == "__main__":
    unittest.main()
