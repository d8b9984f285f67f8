"""hirate's metrics and log lines inside real nginx: Debian's nginx with
lua-nginx-module running examples/openresty/nginx.conf (4 workers, the
figures of every worker summed at /metrics by hirate.metrics), against a
redis-server of the test's own, reached as an ACL user with a password.

    HIRATE_LUAJIT_CPATH=<dir with hirate/core.so built for LuaJIT> \
        python3 tests/lua/nginx/test_metrics.py [-v] [Test.name]

HIRATE_LUA_DIR points at another copy of hirate.lua and hirate/*.lua;
HIRATE_KEEP_NGINX=1 keeps nginx's prefix (config, error.log) for a look.
"""

import os
import re
import sys
import time
import unittest
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import ROOT, Nginx, RedisServer, get, redis_commands, replace_once  # noqa: E402

EXAMPLE = ROOT / "examples" / "openresty" / "nginx.conf"
DOC = ROOT / "docs" / "lua.md"
PASSWORD = "metrics-canary-pw-31"
WORKERS = 4

# The test's own location, added to the example's server: a decision of
# the example's limiter that spends nothing, with who decided and which
# worker answered.
DECIDE = """
        location = /t/decide {
            content_by_lua_block {
                local d, err = api_limit.limiter:allow("t:" .. ngx.var.arg_k, 0)
                ngx.header["X-Source"] = d and d.source or err
                ngx.header["X-Error"] = d and d.error
                ngx.say("decided")
            }
        }
"""


def build_conf(prefix, ports, lua_path, lua_cpath):
    """The example, pointed at the test's port, paths and prefix, with the
    worker's pid on every response (X-Worker) and the test's location."""
    conf = EXAMPLE.read_text()
    conf = replace_once(conf, "error_log /var/log/nginx/error.log info;",
                        f"error_log {prefix}/error.log info;", "the example")
    conf = replace_once(conf, "listen 8080;",
                        f"listen 127.0.0.1:{ports['api']} reuseport;\n"
                        "        add_header X-Worker $pid always;", "the example")
    # An hour's refill, so that no token comes back while the test runs.
    conf = replace_once(conf, 'limits = "10/minute"', 'limits = "10/hour"', "the example")
    at = "        location = /metrics {"
    conf = replace_once(conf, at, DECIDE + at, "the example")
    conf = re.sub(r'lua_package_path\s+"[^"]*";', f'lua_package_path "{lua_path}";', conf)
    conf = re.sub(r'lua_package_cpath\s+"[^"]*";', f'lua_package_cpath "{lua_cpath}";', conf)
    main = ["daemon off;", "master_process on;", f"pid {prefix}/nginx.pid;",
            "worker_shutdown_timeout 1s;"]
    if os.geteuid() == 0:
        main.append("user root;")
    http_head = "\n".join(f"    {d}" for d in [
        "access_log off;",
        f"client_body_temp_path {prefix}/tmp/body;",
        f"proxy_temp_path {prefix}/tmp/proxy;",
        f"fastcgi_temp_path {prefix}/tmp/fastcgi;",
        f"uwsgi_temp_path {prefix}/tmp/uwsgi;",
        f"scgi_temp_path {prefix}/tmp/scgi;",
        "lua_socket_log_errors off;",
    ])
    conf = replace_once(conf, "http {\n", "http {\n" + http_head + "\n", "the example")
    return "\n".join(main) + "\n" + conf


def parse(text):
    """The Prometheus text as {(name, frozenset of labels): value}; every
    sample line must parse."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r'(\w+)\{([^}]*)\} (\S+)', line)
        assert m, line
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def series(samples, name, **labels):
    return samples[(name, frozenset(dict(limiter="api", **labels).items()))]


def info(port, section):
    return redis_commands(port, ("INFO", section))[0]


def calls(port, command):
    """How many times Redis ran command, and how many of those failed."""
    m = re.search(rf"cmdstat_{command}:calls=(\d+),.*,failed_calls=(\d+)",
                  info(port, "commandstats"))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


class Case(unittest.TestCase):
    """Each test: a fresh redis-server and a fresh nginx running the
    example, so that every count starts at 0."""

    def setUp(self):
        cpath = os.environ.get("HIRATE_LUAJIT_CPATH")
        if not cpath or not os.path.exists(os.path.join(cpath, "hirate", "core.so")):
            raise RuntimeError("set HIRATE_LUAJIT_CPATH to the directory holding hirate/core.so "
                               "built for LuaJIT (tests/lua/nginx/run.sh does)")
        lua_dir = os.environ.get("HIRATE_LUA_DIR", str(ROOT / "bindings" / "lua"))
        lua_path = ";".join([os.path.join(lua_dir, "?.lua"), "/usr/share/lua/5.1/?.lua", ";"])
        lua_cpath = os.path.join(cpath, "?.so") + ";;"
        self.redis = RedisServer()
        self.addCleanup(self.redis.close)
        assert redis_commands(self.redis.port, ("ACL", "SETUSER", "app", "on", f">{PASSWORD}",
                                                "~*", "+@all"))[0] == "OK"
        self.connections_before = self.connections()
        env = dict(os.environ,
                   REDIS_URL=f"redis://app:{PASSWORD}@127.0.0.1:{self.redis.port}")
        self.nginx = Nginx(lambda prefix, ports: build_conf(prefix, ports, lua_path, lua_cpath),
                           env, port_names=("api",))
        self.addCleanup(self.close_nginx)
        self.port = self.nginx.ports["api"]

    def close_nginx(self):
        keep = os.environ.get("HIRATE_KEEP_NGINX") == "1"
        if keep:
            print(f"nginx prefix kept: {self.nginx.dir}", file=sys.stderr)
        self.nginx.close(keep=keep)

    def connections(self):
        """Connections redis-server received, this INFO's own too."""
        m = re.search(r"total_connections_received:(\d+)", info(self.redis.port, "stats"))
        return int(m.group(1))

    def scrape(self):
        r = get(self.port, "/metrics")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.header("Content-Type"), "text/plain; version=0.0.4")
        return r.body.decode()


class DocShowsTheExample(unittest.TestCase):

    def test_docs_lua_md_shows_examples_openresty_nginx_conf_as_it_is(self):
        text = DOC.read_text()
        m = re.search(r"^## Metrics and logs\n(.*?)(?=^## |\Z)", text, re.S | re.M)
        self.assertIsNotNone(m, "docs/lua.md has no '## Metrics and logs' section")
        blocks = re.findall(r"^```nginx\n(.*?)^```", m.group(1), re.S | re.M)
        self.assertIn(EXAMPLE.read_text(), blocks)


class SummedOverWorkers(Case):

    def test_metrics_are_every_workers_summed_exactly(self):
        rs = [get(self.port, f"/api/{i}") for i in range(40)]
        # nginx's connections: not the second INFO's own (nor any below)
        received = self.connections() - self.connections_before - 1
        self.assertEqual(Counter(r.status for r in rs), Counter({200: 10, 429: 30}))
        workers = {r.header("X-Worker") for r in rs}
        self.assertGreater(len(workers), 1, "the kernel gave every request to one worker")
        text = self.scrape()
        if os.environ.get("HIRATE_DEBUG"):
            print(text, info(self.redis.port, "commandstats"), file=sys.stderr)
        self.assertNotIn(PASSWORD, text)
        self.assertNotIn("127.0.0.1", text)   # no key (the client's address) is a label
        s = parse(text)
        # Each request was one decision: by Redis (an FCALL that ran) or by
        # the deny cache of the worker that had seen Redis refuse. The first
        # FCALL found no library: it failed, and went again after FUNCTION
        # LOAD.
        fcalls, failed = calls(self.redis.port, "fcall")
        self.assertEqual((failed, calls(self.redis.port, "function\\|load")), (1, (1, 0)))
        self.assertGreaterEqual(fcalls - failed, 10)
        self.assertEqual(series(s, "hirate_decisions_total", source="redis"), fcalls - failed)
        self.assertEqual(series(s, "hirate_decisions_total", source="cache"),
                         40 - (fcalls - failed))
        for src in ("local", "fail_open", "fail_closed"):
            self.assertEqual(series(s, "hirate_decisions_total", source=src), 0, src)
        self.assertEqual(series(s, "hirate_refused_total"), 30)
        self.assertEqual(series(s, "hirate_peeks_total"), 0)
        errors = {dict(k[1])["code"]: v for k, v in s.items() if k[0] == "hirate_errors_total"}
        self.assertEqual(len(errors), 21)
        self.assertEqual(set(errors.values()), {0})
        self.assertEqual(series(s, "hirate_breaker_opens_total"), 0)
        self.assertEqual(series(s, "hirate_breaker_closes_total"), 0)
        # Every connection Redis received from nginx (each with its AUTH),
        # and none dropped.
        self.assertEqual(series(s, "hirate_connections_total"), received)
        self.assertEqual(series(s, "hirate_connections_total"),
                         calls(self.redis.port, "auth")[0])
        self.assertEqual(series(s, "hirate_connections_dropped_total"), 0)
        # The histogram: the core's bounds, cumulative, +Inf the count.
        les = ["0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025",
               "0.05", "0.1", "0.25", "0.5", "1", "+Inf"]
        buckets = [series(s, "hirate_redis_round_trip_seconds_bucket", le=le) for le in les]
        self.assertEqual(buckets, sorted(buckets))
        count = series(s, "hirate_redis_round_trip_seconds_count")
        self.assertEqual(buckets[-1], count)
        # A round trip each FCALL (the failed one's too); a handshake is none.
        self.assertEqual(count, fcalls)
        self.assertGreater(series(s, "hirate_redis_round_trip_seconds_sum"), 0)


class Ready(Case):
    """The example's /ready: lim:check() over cosockets."""

    def test_ready_while_redis_answers_and_503_once_it_is_gone(self):
        port = self.redis.port
        r = get(self.port, "/ready")
        self.assertEqual((r.status, r.body.decode()), (200, f"127.0.0.1:{port} master ok \n"))
        self.assertEqual(calls(port, "role"), (1, 0))
        self.assertEqual(calls(port, "function\\|list"), (1, 0))
        r = get(self.port, "/api/x")   # the library loads with the first decision
        self.assertEqual(r.status, 200)
        self.redis.kill()
        r = get(self.port, "/ready")
        self.assertEqual(r.status, 503)
        self.assertRegex(r.body.decode(),
                         rf"^127\.0\.0\.1:{port} - ECONNECT .*127\.0\.0\.1:{port}.*\n$")
        self.assertNotIn(PASSWORD, r.body.decode())


class LogsOfAnOutage(Case):
    """SIGSTOP: connect() still succeeds and no reply comes; the example's
    limiter (on_error "local", timeout 0.1 s) decides from each worker's
    bucket until Redis answers again."""

    def decide(self, tag):
        r = get(self.port, f"/t/decide?k={tag}")
        self.assertEqual(r.status, 200, r)
        self.sources[r.header("X-Source")] += 1
        if r.header("X-Error"):
            self.errors[r.header("X-Error")] += 1
        return r.header("X-Worker"), r.header("X-Source")

    def until(self, want, tag, enough=1, timeout=30):
        """Requests until each of the workers has answered `want` (a set of
        sources) `enough` times; returns the workers' pids."""
        seen = defaultdict(int)
        deadline = time.monotonic() + timeout
        n = 0
        while time.monotonic() < deadline:
            n += 1
            pid, source = self.decide(f"{tag}-{n}")
            if source in want:
                seen[pid] += 1
            if len(seen) == WORKERS and min(seen.values()) >= enough:
                return set(seen)
        self.fail(f"not every worker answered {want} {enough} times within {timeout} s: "
                  f"{dict(seen)}")

    def test_one_warning_and_one_info_per_worker_per_outage_and_no_password(self):
        self.sources, self.errors = Counter(), Counter()
        workers = self.until({"redis"}, "before")
        self.redis.stop()
        try:
            self.assertEqual(self.until({"local"}, "during", enough=3), workers)
        finally:
            self.redis.cont()
        self.assertEqual(self.until({"redis"}, "after"), workers)
        log = self.nginx.error_log()
        self.assertNotIn(PASSWORD, log)
        where = f"Redis at 127.0.0.1:{self.redis.port}"
        warnings, infos = Counter(), Counter()
        for line in log.splitlines():
            m = re.search(r" \[(\w+)\] (\d+)#\d+: .*?hirate: (Redis at .*?)(, client: |$)", line)
            if not m:
                continue
            level, pid, msg = m.group(1), m.group(2), m.group(3)
            if msg.startswith(where + " failed ("):
                self.assertEqual(level, "warn", line)
                # A pooled connection's read, or a new one's handshake.
                self.assertRegex(msg, re.escape(where) + r" failed \((handshake with \S+: )?"
                                 r"receive: timeout\): the 'local' policy decides until it "
                                 r"answers again$")
                warnings[pid] += 1
            elif msg.startswith(where + " answers again"):
                self.assertEqual(level, "info", line)
                self.assertRegex(msg, re.escape(where) + r" answers again, after \d+\.\d s$")
                infos[pid] += 1
        self.assertEqual(warnings, Counter({pid: 1 for pid in workers}), log[-3000:])
        self.assertEqual(infos, Counter({pid: 1 for pid in workers}), log[-3000:])
        # The breaker opened once and closed once in each worker.
        s = parse(self.scrape())
        self.assertEqual(series(s, "hirate_breaker_opens_total"), WORKERS)
        self.assertEqual(series(s, "hirate_breaker_closes_total"), WORKERS)
        # Every decision the test saw, by source, and the failures behind
        # the policy's.
        self.assertEqual(set(self.sources), {"redis", "local"})
        for src in ("redis", "local", "cache", "fail_open", "fail_closed"):
            self.assertEqual(series(s, "hirate_decisions_total", source=src), self.sources[src])
        errors = {dict(k[1])["code"]: v for k, v in s.items() if k[0] == "hirate_errors_total"}
        self.assertEqual({k: v for k, v in errors.items() if v}, dict(self.errors))
        self.assertEqual(set(self.errors), {"ETIMEDOUT"})


if __name__ == "__main__":
    unittest.main()
