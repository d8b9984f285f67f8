"""hirate inside real nginx: Debian's nginx with lua-nginx-module, 2 worker
processes, the nginx.conf of docs/lua.md plus the tests' own server
(test_server.conf, handlers in lua/hirate_nginx_test.lua), and a
redis-server of the tests' own.

    HIRATE_LUAJIT_CPATH=<dir with hirate/core.so built for LuaJIT> \
        python3 tests/lua/nginx/test_nginx.py [-v] [Test.name]

HIRATE_LUA_DIR points at another copy of hirate.lua and hirate/*.lua;
HIRATE_KEEP_NGINX=1 keeps nginx's prefix (config, error.log) for a look.

tests/lua/nginx/run.sh builds the module and runs this.
"""

import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import unittest
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (ROOT, Nginx, RedisServer, TrickleProxy, build_conf,  # noqa: E402
                     free_port, get, get_many, join, make_certs, redis_commands, tls_redis)

VECTORS = ROOT / "tests" / "vectors" / "token_bucket.json"
S = None   # the running servers, set up once for the module


class Servers:
    def __init__(self):
        cpath = os.environ.get("HIRATE_LUAJIT_CPATH")
        if not cpath or not os.path.exists(os.path.join(cpath, "hirate", "core.so")):
            raise RuntimeError("set HIRATE_LUAJIT_CPATH to the directory holding hirate/core.so "
                               "built for LuaJIT (tests/lua/nginx/run.sh does)")
        self.redis = None
        self.nginx = None
        self.sockdir = None
        self.trickle = None
        self.others = []   # the TLS and maxclients servers
        try:
            # A second way in, for the unix:// URL.
            self.sockdir = tempfile.mkdtemp(prefix="hirate-sock-")
            self.unix = os.path.join(self.sockdir, "redis.sock")
            self.redis = RedisServer(["--unixsocket", self.unix, "--unixsocketperm", "700"])
            # Replies one byte every 0.75 s.
            self.trickle = TrickleProxy(self.redis.port, 0.75)
            # A user with a password, for AUTH + SELECT.
            assert redis_commands(self.redis.port,
                                  ("ACL", "SETUSER", "hirate", "on", ">s3cr3t-good-canary",
                                   "~*", "+@all"))[0] == "OK"
            # A user who may touch t-acl:ok:* only (allow_many per item).
            assert redis_commands(self.redis.port,
                                  ("ACL", "SETUSER", "somekeys", "on", ">pw-somekeys",
                                   "~t-acl:ok:*", "+@all"))[0] == "OK"
            # TLS: the test CA is what nginx trusts (lua_ssl_trusted_certificate).
            self.certs = make_certs(os.path.join(self.sockdir, "certs"))
            self.tls = self.started(tls_redis(self.certs))
            self.mtls = self.started(tls_redis(self.certs, auth_clients="yes"))
            self.bad = {name: self.started(tls_redis(self.certs, name))
                        for name in ("wronghost", "expired", "selfsigned")}
            self.maxclients = self.started(tls_redis(self.certs, extra=["--maxclients", "1"]))
            tls_env = {
                "HIRATE_TEST_CERTS": self.certs,
                "HIRATE_TEST_TLS_PORT": str(self.tls.tls_port),
                "HIRATE_TEST_TLS_PLAIN_PORT": str(self.tls.port),
                "HIRATE_TEST_MTLS_PORT": str(self.mtls.tls_port),
                "HIRATE_TEST_MAXCLIENTS_PORT": str(self.maxclients.port),
                "HIRATE_TEST_MAXCLIENTS_TLS_PORT": str(self.maxclients.tls_port),
                **{f"HIRATE_TEST_{name.upper()}_PORT": str(srv.tls_port)
                   for name, srv in self.bad.items()},
            }
            # HIRATE_LUA_DIR: test another copy of hirate.lua and hirate/*.lua
            # (an installed tree, say) instead of bindings/lua.
            lua_dir = os.environ.get("HIRATE_LUA_DIR", str(ROOT / "bindings" / "lua"))
            lua_path = ";".join([os.path.join(lua_dir, "?.lua"),
                                 str(ROOT / "tests" / "lua" / "nginx" / "lua" / "?.lua"),
                                 "/usr/share/lua/5.1/?.lua", ";"])
            lua_cpath = os.path.join(cpath, "?.so") + ";;"
            env = dict(os.environ, REDIS_URL=self.redis.url,
                       HIRATE_TEST_REDIS_PORT=str(self.redis.port),
                       HIRATE_TEST_REDIS_UNIX=self.unix,
                       HIRATE_TEST_DEAD_PORT=str(free_port()),
                       HIRATE_TEST_TRICKLE_PORT=str(self.trickle.port), **tls_env)
            ca_file = os.path.join(self.certs, "ca.crt")
            self.nginx = Nginx(lambda prefix, ports: build_conf(
                prefix, ports, lua_path, lua_cpath, str(VECTORS), ca_file, tls_env), env)
            self.doc = self.nginx.ports["doc"]
            self.port = self.nginx.ports["test"]
        except BaseException:
            self.close()
            raise

    def started(self, srv):
        self.others.append(srv)
        return srv

    def close(self):
        for srv in self.others:
            srv.close()
        if self.nginx:
            keep = os.environ.get("HIRATE_KEEP_NGINX") == "1"
            if keep:
                print(f"nginx prefix kept: {self.nginx.dir}", file=sys.stderr)
            self.nginx.close(keep=keep)
        if self.redis:
            self.redis.close()
        if self.sockdir:
            shutil.rmtree(self.sockdir, ignore_errors=True)
        if self.trickle:
            self.trickle.close()


def setUpModule():
    global S
    S = Servers()


def tearDownModule():
    if S:
        S.close()


_serial = [0]


def fresh(name):
    """A key no other test (or earlier run of this one) used."""
    _serial[0] += 1
    return f"{name}-{os.getpid()}-{_serial[0]}"


def call(name, **args):
    q = "&".join(f"{k}={v}" for k, v in args.items())
    r = get(S.port, f"/call/{name}?{q}")
    assert r.status == 200, r
    return json.loads(r.body)


def decision(v):
    """A decision as the test handlers send it (numbers as strings; seconds
    as the binding gives them, us / 1e6, with "never" for math.huge)."""
    out = dict(v)
    for f in ("remaining", "limit"):
        out[f] = int(out[f])
    for f in ("retry_after", "reset_after"):
        out[f] = float("inf") if out[f] == "never" else float(out[f])
    return out


def seconds(us):
    """A vector's microseconds as the binding's seconds: the same one
    correctly rounded division."""
    return float("inf") if us == "never" else us / 1e6


class DocConfig(unittest.TestCase):
    """The nginx.conf of docs/lua.md, as written: /api/ proxied, limited,
    refunded when the upstream fails."""

    def script_calls(self):
        stats = redis_commands(S.redis.port, ("INFO", "commandstats"))[0]
        return sum(int(n) for n in re.findall(r"cmdstat_(?:fcall|evalsha|eval):calls=(\d+)",
                                               stats))

    def test_the_doc_config_gives_the_token_back_when_the_upstream_fails(self):
        bucket = "rl:api:{ip:127.0.0.1}"   # the doc's prefix, the client's address
        try:
            # Both workers' first calls made (a worker's first script call
            # may be its load of hirate's function).
            join(*get_many(S.doc, ["/api/fail"] * 8))
            before = self.script_calls()
            while True:
                time.sleep(0.2)
                now, before = before, self.script_calls()
                if now == before:
                    break
            redis_commands(S.redis.port, ("DEL", bucket))
            # More than the capacity (10), one after another: each spends its
            # token and has it back once the upstream's 503 is logged.
            rs = [get(S.doc, "/api/fail") for _ in range(14)]
            self.assertEqual([r.status for r in rs], [503] * 14)
            self.assertEqual([r.body for r in rs], [b"backend /api/fail\n"] * 14)
            # One script call for each spend and one for each refund (the
            # refunds run in timers, after the responses).
            for _ in range(500):
                if self.script_calls() - before >= 28:
                    break
                time.sleep(0.01)
            self.assertEqual(self.script_calls() - before, 28)
            # An answer of the upstream's own is not refunded.
            self.assertEqual(get(S.doc, "/api/ok").status, 200)
            time.sleep(0.2)
            self.assertEqual(self.script_calls() - before, 29)
        finally:
            redis_commands(S.redis.port, ("DEL", bucket))

    def test_the_doc_config_limits_api_and_the_headers_survive_proxy_pass(self):
        started = time.monotonic()
        first = get(S.doc, "/api/hello")
        self.assertEqual(first.status, 200, first)
        self.assertEqual(first.body, b"backend /api/hello\n")
        self.assertEqual(first.header("RateLimit-Policy"), '"10-per-5s";q=10;w=5')
        self.assertEqual(first.header("RateLimit"), '"10-per-5s";r=9;t=1')
        self.assertIsNone(first.header("Retry-After"))
        # 30 more at once: the 9 tokens left and what refilled meanwhile pass.
        rs = join(*get_many(S.doc, ["/api/x"] * 30))
        took = time.monotonic() - started
        ok = [r for r in rs if r.status == 200]
        refused = [r for r in rs if r.status == 429]
        self.assertEqual(len(ok) + len(refused), 30, [r.status for r in rs])
        self.assertGreaterEqual(len(ok), 9)
        self.assertLessEqual(len(ok), 9 + int(2 * took))
        self.assertGreater(len(refused), 0)
        for r in refused:
            t = int(r.header("Retry-After"))
            self.assertIn(t, (1,), r)   # one token at 2/s: under a second away
            self.assertEqual(r.body, b"Too many requests; retry in 1 second.\n")
            self.assertEqual(r.header("Content-Type"), "text/plain; charset=utf-8")
            self.assertEqual(r.header("RateLimit"), '"10-per-5s";r=0;t=1')


class ExactAcrossWorkers(unittest.TestCase):

    def test_concurrent_requests_over_both_workers_get_exactly_the_capacity(self):
        key = fresh("exact")
        rs = join(*get_many(S.port, [f"/limit/exact?k={key}"] * 60))
        statuses = Counter(r.status for r in rs)
        self.assertEqual(statuses, Counter({200: 20, 429: 40}))
        workers = {r.header("X-Worker") for r in rs}
        self.assertEqual(len(workers), 2, "both workers should have served requests")
        self.assertEqual({r.header("X-Hirate-Source") for r in rs if r.status == 200}, {"redis"})
        self.assertLessEqual({r.header("X-Hirate-Source") for r in rs if r.status == 429},
                             {"redis", "cache"})
        # What Redis holds agrees: nothing left. (limit{} keys a variable's
        # value as the identity "{k:<value>}", as the Python package does.)
        self.assertEqual(call("plain", op="peek", k=f"{{k:{key}}}")["value"]["remaining"], "0")
        self.assertEqual(call("plain", op="peek", k=key)["value"]["remaining"], "20")

    def test_refusals_are_answered_by_each_workers_deny_cache(self):
        key = fresh("deny")
        rs = [get(S.port, f"/limit/deny?k={key}") for _ in range(14)]
        self.assertEqual([r.status for r in rs], [200, 200] + [429] * 12)
        # The worker whose call left 0 tokens knows the bucket is empty and
        # never asks Redis again; the other one learns it from its first
        # refusal. (Capacity 2, 0.001 token/s: nothing refills meanwhile.)
        knows = rs[1].header("X-Worker")
        by_worker = defaultdict(list)
        for r in rs[2:]:
            by_worker[r.header("X-Worker")].append(r.header("X-Hirate-Source"))
        for worker, sources in by_worker.items():
            first = "cache" if worker == knows else "redis"
            self.assertEqual(sources, [first] + ["cache"] * (len(sources) - 1), worker)

    def test_a_reset_made_elsewhere_is_seen_by_every_workers_deny_cache(self):
        # deny_cache_max = 0.5 s, given in limit{}'s limiter options.
        key = fresh("reset")
        rs = [get(S.port, f"/limit/reset_seen?k={key}") for _ in range(5)]
        self.assertEqual([r.status for r in rs], [200] * 5)
        # Both workers' deny caches hold the refusal.
        deadline = time.monotonic() + 10
        cached = set()
        while len(cached) < 2 and time.monotonic() < deadline:
            r = get(S.port, f"/limit/reset_seen?k={key}")
            self.assertEqual(r.status, 429, r)
            if r.header("X-Hirate-Source") == "cache":
                cached.add(r.header("X-Worker"))
        self.assertEqual(len(cached), 2, "both workers should refuse from their deny cache")
        # Another process resets the client (the key the script keeps).
        self.assertEqual(redis_commands(S.redis.port, ("DEL", f"t-reset:{{k:{key}}}")), [1])
        # Every worker asks Redis again within the bound, and Redis' first
        # answer after the reset is that the bucket is full again.
        deadline = time.monotonic() + 10
        asked, answers = set(), []
        while len(asked) < 2 and time.monotonic() < deadline:
            r = get(S.port, f"/limit/reset_seen?k={key}")
            if r.header("X-Hirate-Source") == "redis":
                asked.add(r.header("X-Worker"))
                answers.append(r.status)
            else:
                self.assertEqual((r.status, r.header("X-Hirate-Source")), (429, "cache"))
        self.assertEqual(cached, asked)
        self.assertEqual(answers[0], 200)
        self.assertEqual(answers.count(200), min(len(answers), 5), answers)

    def test_after_function_flush_one_function_load_reloads_the_library(self):
        # Redis 7: the workers decide with FCALL of the library; the first
        # call that finds it gone loads it again, the others find it there.
        key = fresh("flush")
        get(S.port, f"/limit/exact?k={key}-warm")
        redis_commands(S.redis.port, ("FUNCTION", "FLUSH"), ("CONFIG", "RESETSTAT"))
        rs = [get(S.port, f"/limit/exact?k={key}") for _ in range(4)]
        self.assertEqual([r.status for r in rs], [200] * 4)
        self.assertEqual({r.header("X-Hirate-Source") for r in rs}, {"redis"})
        stats = redis_commands(S.redis.port, ("INFO", "commandstats"))[0]
        m = re.search(r"cmdstat_function\|load:calls=(\d+)", stats)
        self.assertIsNotNone(m, stats)
        self.assertEqual(int(m.group(1)), 1)
        self.assertEqual(5, int(re.search(r"cmdstat_fcall:calls=(\d+)", stats).group(1)))
        self.assertNotIn("cmdstat_evalsha", stats)


class Headers(unittest.TestCase):

    def test_ratelimit_headers_and_the_429_are_exact(self):
        key = fresh("hdr")
        a, b, c = (get(S.port, f"/limit/headers?k={key}") for _ in range(3))
        # capacity 2, 0.5 token/s: w = 4 s; one spent: full again in 2 s.
        self.assertEqual((a.status, a.header("RateLimit-Policy"), a.header("RateLimit")),
                         (200, '"2-per-4s";q=2;w=4', '"2-per-4s";r=1;t=2'))
        self.assertIsNone(a.header("Retry-After"))
        self.assertIsNone(a.header("X-RateLimit-Limit"))
        self.assertEqual((b.status, b.header("RateLimit")), (200, '"2-per-4s";r=0;t=4'))
        self.assertEqual(c.status, 429)
        self.assertEqual(c.header("RateLimit-Policy"), '"2-per-4s";q=2;w=4')
        self.assertEqual(c.header("RateLimit"), '"2-per-4s";r=0;t=2')
        self.assertEqual(c.header("Retry-After"), "2")
        self.assertEqual(c.header("Content-Type"), "text/plain; charset=utf-8")
        self.assertEqual(c.body, b"Too many requests; retry in 2 seconds.\n")

    def test_a_cost_above_the_capacity_is_refused_without_a_time(self):
        r = get(S.port, f"/limit/headers?k={fresh('never')}&cost=3")
        self.assertEqual(r.status, 429)
        self.assertIsNone(r.header("Retry-After"))
        self.assertEqual(r.header("RateLimit"), '"2-per-4s";r=2')
        self.assertEqual(r.body,
                         b"Too many requests; this request exceeds the limit and can never pass.\n")

    def test_the_decision_is_in_ngx_ctx_only_when_asked_for(self):
        k = fresh("ctx")
        with_ctx = get(S.port, f"/limit/headers?k={k}")
        without = get(S.port, f"/limit/memory?k={k}")
        self.assertEqual((with_ctx.status, with_ctx.header("X-Hirate-Source")), (200, "redis"))
        self.assertEqual((without.status, without.header("X-Hirate-Source")), (200, None))
        self.assertEqual(without.header("RateLimit"), '"3-per-3000s";r=2;t=1000')

    def test_legacy_headers_and_the_policy_name(self):
        r = get(S.port, f"/limit/legacy?k={fresh('legacy')}")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.header("RateLimit-Policy"), '"burst";q=2;w=4')
        self.assertEqual(r.header("RateLimit"), '"burst";r=1;t=2')
        self.assertEqual((r.header("X-RateLimit-Limit"), r.header("X-RateLimit-Remaining"),
                          r.header("X-RateLimit-Reset")), ("2", "1", "2"))

    def script_calls(self):
        stats = redis_commands(S.redis.port, ("INFO", "commandstats"))[0]
        return sum(int(n) for n in re.findall(r"cmdstat_(?:fcall|evalsha|eval):calls=(\d+)",
                                               stats))

    def test_several_limits_are_one_decision_with_headers_for_each_band(self):
        key = fresh("bands")
        before = self.script_calls()
        a, b, c = (get(S.port, f"/limit/bands?k={key}") for _ in range(3))
        # One script call a request (the deny cache is off, or it would
        # answer the third), on one key that holds both bands.
        self.assertEqual(self.script_calls() - before, 3)
        self.assertEqual(redis_commands(S.redis.port, ("KEYS", "t-bands:*"))[0],
                         [f"t-bands:{{k:{key}}}"])
        # burst: 2, 0.5 token/s (w = 4 s); daily: 3, 0.001 token/s (w = 3000 s).
        policy = '"burst";q=2;w=4, "daily";q=3;w=3000'
        self.assertEqual((a.status, a.header("RateLimit-Policy"), a.header("RateLimit")),
                         (200, policy, '"burst";r=1;t=2, "daily";r=2;t=1000'))
        self.assertEqual((b.status, b.header("RateLimit")),
                         (200, '"burst";r=0;t=4, "daily";r=1;t=2000'))
        # burst refuses; daily held the cost, which it keeps: nothing spent.
        self.assertEqual(c.status, 429)
        self.assertEqual(c.header("RateLimit-Policy"), policy)
        self.assertEqual(c.header("RateLimit"), '"burst";r=0;t=2, "daily";r=1;t=2000')
        self.assertEqual(c.header("Retry-After"), "2")
        self.assertEqual(c.body, b"Too many requests (burst); retry in 2 seconds.\n")

    def test_a_limit_string_gives_the_cores_names_and_legacy_headers_of_the_whole(self):
        r = get(S.port, f"/limit/bands_text?k={fresh('btext')}")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.header("RateLimit-Policy"), '"2-per-4s";q=2;w=4, "3-per-1000s";q=3;w=1000')
        self.assertEqual(r.header("RateLimit"), '"2-per-4s";r=1;t=2, "3-per-1000s";r=2;t=334')
        # One band's three figures: the fewest left (burst's 1 of 2), full
        # again in 2 s (not the daily band's 334 s).
        self.assertEqual((r.header("X-RateLimit-Limit"), r.header("X-RateLimit-Remaining"),
                          r.header("X-RateLimit-Reset")), ("2", "1", "2"))

    def test_a_policy_name_for_several_bands_raises(self):
        r = get(S.port, f"/limit/bands_named?k={fresh('bnamed')}&raises=1")
        self.assertIn(b"hirate.resty.limit: name: a limiter of several bands names each of them",
                      r.body)

    def test_without_headers_a_refusal_still_says_when_to_retry(self):
        key = fresh("bare")
        a, b = (get(S.port, f"/limit/bare?k={key}") for _ in range(2))
        self.assertEqual(a.status, 200)
        self.assertIsNone(a.header("RateLimit"))
        self.assertEqual(b.status, 503)
        self.assertIsNone(b.header("RateLimit"))
        self.assertEqual(b.header("Retry-After"), "4")
        self.assertEqual(b.body, b"slow down\n")


def fields(r):
    """The rate-limit headers of a response, each parsed by a Structured
    Fields parser (http_sf raises on anything a field may not be): the two
    lists as [(name, {param: int})], the others as ints."""
    import http_sf
    out = {}
    for name in ("RateLimit-Policy", "RateLimit"):
        if r.header(name) is not None:
            out[name] = [(item, dict(params)) for item, params in
                         http_sf.parse(r.header(name).encode(), tltype="list")]
    for name in ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
                 "Retry-After"):
        if r.header(name) is not None:
            item, params = http_sf.parse(r.header(name).encode(), tltype="item")
            assert type(item) is int and params == {}, (name, r.header(name))
            out[name] = item
    return out


class HeaderFields(unittest.TestCase):
    """The headers of limit{} in each case, as the Python integrations send
    them (tests/python/test_response_headers.py has the same cases)."""

    POLICY = [("2-per-60s", {"q": 2, "w": 60}), ("1000-per-86400s", {"q": 1000, "w": 86400})]

    def test_allowed_and_refused_by_one_band(self):
        key = fresh("sf1")
        a, b, c = (get(S.port, f"/limit/headers?k={key}") for _ in range(3))
        policy = [("2-per-4s", {"q": 2, "w": 4})]
        self.assertEqual((a.status, fields(a)), (200, {
            "RateLimit-Policy": policy, "RateLimit": [("2-per-4s", {"r": 1, "t": 2})]}))
        self.assertEqual((b.status, fields(b)), (200, {
            "RateLimit-Policy": policy, "RateLimit": [("2-per-4s", {"r": 0, "t": 4})]}))
        self.assertEqual((c.status, fields(c)), (429, {
            "RateLimit-Policy": policy, "RateLimit": [("2-per-4s", {"r": 0, "t": 2})],
            "Retry-After": 2}))

    def test_a_burst_refusal_leaves_the_daily_band_its_own_reset_time(self):
        key = fresh("sf2")
        a, b, c = (get(S.port, f"/limit/sf?k={key}") for _ in range(3))
        self.assertEqual((a.status, fields(a)), (200, {
            "RateLimit-Policy": self.POLICY,
            "RateLimit": [("2-per-60s", {"r": 1, "t": 30}),
                          ("1000-per-86400s", {"r": 999, "t": 87})],
            "X-RateLimit-Limit": 2, "X-RateLimit-Remaining": 1, "X-RateLimit-Reset": 30}))
        self.assertEqual(b.status, 200)
        # The daily band held the cost and spent nothing: 998 left, full in
        # 2 x 86.4 s, never "full in 0 s" nor the burst's 30 s.
        self.assertEqual((c.status, fields(c)), (429, {
            "RateLimit-Policy": self.POLICY,
            "RateLimit": [("2-per-60s", {"r": 0, "t": 30}),
                          ("1000-per-86400s", {"r": 998, "t": 173})],
            "X-RateLimit-Limit": 2, "X-RateLimit-Remaining": 0, "X-RateLimit-Reset": 30,
            "Retry-After": 30}))
        self.assertEqual(c.body, b"Too many requests (2-per-60s); retry in 30 seconds.\n")

    def test_on_error_open_sends_the_policy_and_no_ratelimit_item(self):
        key = fresh("sf3")
        for _ in range(3):
            r = get(S.port, f"/limit/sf_open?k={key}")
            self.assertEqual((r.status, fields(r)), (200, {"RateLimit-Policy": self.POLICY}))

    def test_on_error_closed_is_a_503_without_ratelimit_item(self):
        r = get(S.port, f"/limit/sf_closed?k={fresh('sf4')}")
        self.assertEqual((r.status, fields(r)), (503, {
            "RateLimit-Policy": [("2-per-60s", {"q": 2, "w": 60})], "Retry-After": 1}))
        self.assertEqual(r.body, b"The rate limit cannot be checked now; retry in 1 second.\n")

    def test_on_error_local_sends_the_local_bucket_s_own_figures(self):
        # Each worker has its own local bucket: one request, whichever answers.
        r = get(S.port, f"/limit/sf_local?k={fresh('sf5')}")
        self.assertEqual((r.status, fields(r)), (200, {
            "RateLimit-Policy": self.POLICY,
            "RateLimit": [("2-per-60s", {"r": 1, "t": 30}),
                          ("1000-per-86400s", {"r": 999, "t": 87})],
            "X-RateLimit-Limit": 2, "X-RateLimit-Remaining": 1, "X-RateLimit-Reset": 30}))


def client(name, op, **who):
    q = "&".join(f"{k}={v}" for k, v in who.items())
    r = get(S.port, f"/client/{name}?op={op}&{q}")
    assert r.status == 200, r
    return json.loads(r.body)


def remaining_becomes(name, want, **who):
    """Waits (10 s at most) until one client's bucket holds want tokens: a
    charge runs in a timer after the response. The count is exact; only
    when it lands is not."""
    deadline = time.monotonic() + 10
    while True:
        got = client(name, "peek", **who)["remaining"]
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.01)


class ClientManagement(unittest.TestCase):

    def test_a_client_reset_through_limit(self):
        # A limit keyed by address: the client named by its address.
        by = [get(S.port, "/limit/by_addr").status for _ in range(3)]
        self.assertEqual(by, [200, 200, 429])
        self.assertEqual(client("by_addr", "peek", addr="127.0.0.1"),
                         {"allowed": True, "remaining": 0})
        self.assertEqual(client("by_addr", "reset", addr="127.0.0.1"), {"ok": True})
        self.assertEqual(client("by_addr", "peek", addr="127.0.0.1"),
                         {"allowed": True, "remaining": 2})
        self.assertEqual([get(S.port, "/limit/by_addr").status for _ in range(3)],
                         [200, 200, 429])
        self.assertEqual(client("by_addr", "reset", addr="127.0.0.1"), {"ok": True})

    def test_a_client_refund_through_limit(self):
        # Spent to 0, refunded by address over the cosockets, capped at 2.
        self.assertEqual(client("by_addr", "reset", addr="127.0.0.1"), {"ok": True})
        self.assertEqual([get(S.port, "/limit/by_addr").status for _ in range(3)],
                         [200, 200, 429])
        self.assertEqual(client("by_addr", "refund", addr="127.0.0.1"),
                         {"allowed": True, "remaining": 1})
        self.assertEqual([get(S.port, "/limit/by_addr").status for _ in range(2)], [200, 429])
        self.assertEqual(client("by_addr", "refund", addr="127.0.0.1", tokens=5),
                         {"allowed": True, "remaining": 2})
        self.assertEqual([get(S.port, "/limit/by_addr").status for _ in range(3)],
                         [200, 200, 429])
        self.assertEqual(client("by_addr", "reset", addr="127.0.0.1"), {"ok": True})

    def test_a_refund_over_the_cosockets(self):
        key = fresh("refund")
        got = [decision(call("plain", op="allow", k=key, cost=c)["value"]) for c in (20, 1)]
        self.assertEqual([(d["allowed"], d["remaining"]) for d in got], [(True, 0), (False, 0)])
        d = decision(call("plain", op="refund", k=key, cost=3)["value"])
        self.assertEqual((d["allowed"], d["remaining"], d["source"]), (True, 3, "redis"))
        # What Redis holds: 3 tokens (each worker's deny cache may still
        # foretell the refusal it learnt, for deny_cache_max at most).
        got = redis_commands(S.redis.port, ("GET", f"t-exact:{key}"))[0]
        got = got.decode() if isinstance(got, bytes) else got
        self.assertEqual(math.floor(float(got.split()[0])), 3)   # and what refilled since

    def test_only_failed_logins_are_charged_exactly(self):
        k = fresh("login")
        seen = []
        for pw, left in [("ok", 3), ("bad", 2), ("ok", 2), ("ok", 2), ("bad", 1), ("bad", 0),
                         ("bad", 0), ("ok", 0)]:
            seen.append(get(S.port, f"/charged/login?k={k}&pw={pw}").status)
            self.assertEqual(remaining_becomes("login", left, k=k), left)
        # Three failures charged, then refused at the check (nothing more
        # spent), whatever the password.
        self.assertEqual(seen, [200, 401, 200, 200, 401, 401, 429, 429])
        key = f"t-login:{{k:{k}}}"
        self.assertEqual(redis_commands(S.redis.port, ("EXISTS", key))[0], 1)
        self.assertEqual(client("login", "reset", k=k), {"ok": True})
        self.assertEqual(get(S.port, f"/charged/login?k={k}&pw=ok").status, 200)

    def test_a_limit_on_post_only(self):
        k = fresh("posts")
        self.assertEqual([get(S.port, f"/limit/posts?k={k}").status for _ in range(3)],
                         [200, 200, 200])
        self.assertEqual([get(S.port, f"/limit/posts?k={k}", method="POST").status
                          for _ in range(2)], [200, 429])
        self.assertEqual(get(S.port, f"/limit/posts?k={k}").status, 200)


class Keys(unittest.TestCase):

    def address(self, name, **headers):
        r = get(S.port, f"/addr/{name}", headers=headers)
        self.assertEqual(r.status, 200, r)
        return r.body.decode().strip()

    def test_forwarded_addresses_are_believed_only_from_trusted_proxies(self):
        cases = [
            ("xff", {}, "127.0.0.1"),
            ("xff", {"X-Forwarded-For": "6.6.6.6, 1.1.1.1, 10.1.2.3"}, "1.1.1.1"),
            ("xff", {"X-Forwarded-For": "10.0.0.9, 10.0.0.8"}, "10.0.0.9"),
            ("xff", {"X-Forwarded-For": "2001:DB8:1:2:3:0:0:6"}, "2001:db8:1:2:3::6"),
            ("xff", {"X-Forwarded-For": "::ffff:192.0.2.9"}, "192.0.2.9"),
            ("xff", {"X-Forwarded-For": "not-an-address"}, "127.0.0.1"),
            # a hop that is not an address: the nearest trusted one to its right
            ("xff", {"X-Forwarded-For": "1.1.1.1, unknown, 10.0.0.5"}, "10.0.0.5"),
            # the configured header only: a Forwarded the proxy passed on is not it
            ("xff", {"Forwarded": "for=1.1.1.1"}, "127.0.0.1"),
            ("fwd", {"Forwarded": 'for=192.0.2.60;proto=http, for="[2001:db8::17]:4711"'},
             "2001:db8::17"),
            ("fwd", {"X-Forwarded-For": "1.1.1.1"}, "127.0.0.1"),
            ("untrusted", {"X-Forwarded-For": "1.1.1.1"}, "127.0.0.1"),
            ("noxff", {"X-Forwarded-For": "1.1.1.1"}, "127.0.0.1"),
            ("hops", {"X-Forwarded-For": "6.6.6.6, 1.1.1.1, 2.2.2.2"}, "1.1.1.1"),
            ("hops", {"X-Forwarded-For": "2.2.2.2"}, "127.0.0.1"),
        ]
        for name, headers, want in cases:
            with self.subTest(name=name, headers=headers):
                self.assertEqual(self.address(name, **headers), want)

    def test_the_forwarded_client_has_a_bucket_of_its_own(self):
        a = f"192.0.2.{os.getpid() % 200 + 1}"
        b = f"198.51.100.{os.getpid() % 200 + 1}"
        statuses = [get(S.port, "/limit/xff", {"X-Forwarded-For": ip}).status
                    for ip in (a, a, b)]
        self.assertEqual(statuses, [200, 429, 200])
        # IPv6 clients: one bucket per /64.
        net = f"2001:db8:{os.getpid() % 65536:x}"
        statuses = [get(S.port, "/limit/xff", {"X-Forwarded-For": ip}).status
                    for ip in (f"{net}:1::a", f"{net}:1::b", f"{net}:2::a")]
        self.assertEqual(statuses, [200, 429, 200])
        # Without trusted proxies the header is ignored: one bucket, the peer's.
        statuses = [get(S.port, "/limit/noxff", {"X-Forwarded-For": ip}).status
                    for ip in (a, b)]
        self.assertEqual(statuses, [200, 429])

    def test_header_keys_fall_back_to_the_address_and_long_values_are_digested(self):
        k = fresh("api")
        self.assertEqual([get(S.port, "/limit/apikey", {"X-API-Key": v}).status
                          for v in (k, k, k + "-other")], [200, 429, 200])
        long_value = "x" * 600 + k
        self.assertEqual([get(S.port, "/limit/apikey", {"X-API-Key": long_value}).status
                          for _ in range(2)], [200, 429])
        self.assertEqual([get(S.port, "/limit/apikey").status for _ in range(2)], [200, 429])

    def test_a_key_function_returning_nil_exempts_the_request(self):
        k = fresh("fn")
        rs = [get(S.port, f"/limit/fn?k={k}&exempt=1") for _ in range(3)]
        self.assertEqual([r.status for r in rs], [200] * 3)
        self.assertEqual({r.header("RateLimit") for r in rs}, {None})
        self.assertEqual([get(S.port, f"/limit/fn?k={k}").status for _ in range(2)], [200, 429])


class Api(unittest.TestCase):
    """The limiter's own methods through the cosocket path."""

    def test_allow_peek_reset_and_allow_many(self):
        k = fresh("many")
        v = call("many", op="many", k=k)["value"]
        self.assertEqual([(d["allowed"], d["remaining"], d["source"]) for d in v],
                         [(True, "4", "redis"), (True, "2", "redis"), (True, "0", "redis")])
        self.assertEqual(decision(call("many", op="peek", k=k, cost=3)["value"])["allowed"],
                         False)
        self.assertEqual(call("many", op="reset", k=k), {"ok": True, "value": True})
        d = decision(call("many", op="peek", k=k)["value"])
        self.assertEqual((d["allowed"], d["remaining"], d["reset_after"]), (True, 5, 0.0))

    def test_reset_returns_its_failure(self):
        # reset has no policy: Redis unreachable is nil, message, code.
        got = call("dead", op="reset", k=fresh("reset"))
        self.assertEqual((got["ok"], got["code"]), (False, "ECONNECT"), got)
        self.assertIn("127.0.0.1:", got["err"])
        got = call("tls_to_plain_open", op="reset", k=fresh("reset"))
        self.assertEqual((got["ok"], got["code"]), (False, "ETLS"), got)

    def test_argument_errors_raise_at_the_callers_line_and_name_the_method(self):
        # As the C module's errors do in plain Lua: "<caller>:<line>: bad argument ..."
        # (LuaJIT shortens a long chunk name to "...<its end>").
        handler = r"(\.\.\.)?[^:]*/lua/hirate_nginx_test\.lua:\d+: "
        cases = [
            (call("many", op="many", k=fresh("bad"), bad=1),
             "bad argument #1 to 'allow_many' (item 2: key is empty)"),
            (call("plain", op="badcost"),
             "bad argument #2 to 'allow' (cost must be an integer, got 1.5)"),
            (call("plain", op="badkey"),
             "bad argument #1 to 'peek' (key is 513 bytes; the most is 512)"),
            (call("plain", op="badclient"),
             "bad argument #2 to 'refund' (the client must be { key = <value> } or "
             "{ address = <address> }, one of them)"),
        ]
        for got, message in cases:
            self.assertRegex(got["raised"], "^" + handler + re.escape(message) + "$")

    def test_a_closed_limiter_answers_eclosed(self):
        self.assertEqual(call("plain", op="closed"),
                         {"ok": False, "err": "limiter is closed", "code": "ECLOSED"})

    def test_auth_and_select_on_new_connections(self):
        k = fresh("auth")
        d = decision(call("auth_good", k=k)["value"])
        self.assertEqual((d["allowed"], d["remaining"], d["source"]), (True, 4, "redis"))
        exists = redis_commands(S.redis.port, ("SELECT", "2"), ("EXISTS", f"t-auth:{k}"))
        self.assertEqual(exists, ["OK", 1])
        self.assertEqual(redis_commands(S.redis.port, ("EXISTS", f"t-auth:{k}")), [0])
        self.assertEqual(call("auth_good", op="tostring")["value"],
                         f"hirate.limiter(redis://hirate:***@127.0.0.1:{S.redis.port}/2, "
                         "capacity=5, rate=1)")

    def test_a_wrong_password_is_eauth_without_the_password_or_a_connection_storm(self):
        before = self.connections()
        started = time.monotonic()
        replies = [call("auth_bad", k=fresh("bad")) for _ in range(40)]
        elapsed = time.monotonic() - started
        after = self.connections()
        for r in replies:
            self.assertEqual((r["ok"], r["code"]), (False, "EAUTH"), r)
            self.assertNotIn("wrong-canary-pw", json.dumps(r))
            self.assertIn("AUTH refused: WRONGPASS", r["err"])
        self.assertNotIn("wrong-canary-pw", S.nginx.error_log())
        # 40 calls in a row; after a refusal new connections wait 10 ms, then
        # 20, 40 ... (at least 3/4 of each, jittered), up to 1 s. So within
        # `elapsed` each of the 2 workers connects at most 2 + log2(elapsed /
        # 7.5 ms) times, plus once a second past the cap; without the backoff
        # it would be 40. (The INFO that read `after` is one of the difference.)
        per_worker = 2 + math.ceil(math.log2(max(elapsed, 0.01) / 0.0075)) + int(elapsed)
        self.assertLessEqual(after - before - 1, min(2 * per_worker, 39))
        self.assertGreaterEqual(after - before - 1, 1)

    def connections(self):
        info = redis_commands(S.redis.port, ("INFO", "stats"))[0]
        # this INFO's own connection counts too
        return int(re.search(r"total_connections_received:(\d+)", info).group(1))

    def test_a_connection_that_got_readonly_is_closed_not_pooled(self):
        k = fresh("ro")
        self.assertEqual(call("readonly", k=k)["value"]["source"], "redis")
        self.assertGreaterEqual(self.db3_clients(), 1)   # pooled, idle
        # A replica (of a master that is not there) refuses the script's write.
        self.assertEqual(redis_commands(S.redis.port, ("REPLICAOF", "127.0.0.1", "1")), ["OK"])
        try:
            rs = join(*get_many(S.port, [f"/call/readonly?k={k}"] * 30))
        finally:
            redis_commands(S.redis.port, ("REPLICAOF", "NO", "ONE"))
        self.assertEqual(len({r.header("X-Worker") for r in rs}), 2)
        for r in rs:
            d = json.loads(r.body)["value"]
            self.assertEqual((d["allowed"], d["source"], d["error"]),
                             (True, "fail_open", "ESERVER"))
        # Every connection that carried a READONLY is closed, pooled or not.
        deadline = time.monotonic() + 3
        while self.db3_clients() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.db3_clients(), 0)

    @staticmethod
    def db3_clients():
        clients = redis_commands(S.redis.port, ("CLIENT", "LIST"))[0]
        return len(re.findall(r" db=3 ", clients))

    def test_while_the_breaker_is_open_there_is_no_io(self):
        first, second, tried = call("dead", op="twice", k=fresh("dead"))["value"]
        for d in (decision(first), decision(second)):
            self.assertEqual((d["allowed"], d["source"], d["error"]),
                             (False, "fail_closed", "ECONNECT"))
        self.assertEqual(tried, 1, "only the first call may try to connect")

    def test_a_reply_that_trickles_in_still_has_one_timeout(self):
        # The first byte comes at 0.75 s, within the 1 s timeout; the next
        # would come at 1.5 s. The reply's deadline ends the call at 1 s,
        # not a fresh second for each read (which would end it at 1.75 s at
        # the earliest): the bound between, with room for a loaded machine.
        r = get(S.port, f"/call/trickle?k={fresh('trickle')}")
        d = decision(json.loads(r.body)["value"])
        self.assertEqual((d["allowed"], d["source"], d["error"]), (True, "fail_open", "ETIMEDOUT"))
        self.assertLess(r.elapsed, 1.6, "the deadline should be the reply's, not each read's")
        self.assertGreater(r.elapsed, 0.9)

    def test_bad_options_raise_naming_the_option(self):
        got = call("plain", op="badopts")["value"]
        # A file that is not there, under the test's own directory.
        self.assertEqual(got.pop(),
                         f"bad argument #1 to 'new' (tls_cert_file {S.certs}/nothing.crt: "
                         "No such file or directory)")
        cannot = ("bad argument #1 to 'new' ({0} cannot be honoured inside nginx: cosockets "
                  "trust the CAs that the lua_ssl_trusted_certificate directive names (with "
                  "lua_ssl_verify_depth); name the file there and leave {0} out)")
        self.assertEqual(got, [
            'hirate.resty.limit: unknown option "keyy"',
            # A table that is not a limiter is the options of one.
            "hirate.resty.limit: limiter: bad argument #1 to 'new' (capacity is required (or "
            "limits))",
            "hirate.resty.limit: limiter must be a limiter from hirate.new or the options of "
            "one, got number",
            'hirate.resty.limit: key must be "remote_addr", "header:<name>", '
            '"var:<nginx variable>" or a function, got "cookie:x"',
            "hirate.resty.limit: cost must be a whole number from 0 to 2^53-1, got -1 (or a "
            "function that returns one)",
            "hirate.resty.limit: cost must be a number or a function that returns one, got "
            "string",
            "hirate.resty.limit: status must be an HTTP error status from 400 to 599, got 200",
            'hirate.resty.limit: name "café": a band\'s name must be printable ASCII (it is '
            "sent in headers)",
            "hirate.resty.limit: trusted_proxies: \"10.0.0.0/33\" is not an address or network "
            "(e.g. '10.0.0.0/8', '::1', 'unix')",
            "hirate.resty.limit: proxy_hops must be a whole number from 0 to 64, got 65",
            "bad argument #1 to 'new' (keepalive_timeout must be a number of seconds from 0 to "
            "86400, got -1)",
            "bad argument #1 to 'new' (backlog must be a whole number from 1 to 65535, got 0)",
            "bad argument #1 to 'new' (unknown option 'pool_sise')",
            cannot.format("tls_ca_file"),
            cannot.format("tls_ca_dir"),
            "bad argument #1 to 'new' (tls_server_name: nginx checks a certificate against a "
            "host name only, not an address such as 127.0.0.1; give the name the certificate "
            "is for as tls_server_name)",
        ])

    def test_a_unix_socket_url(self):
        d = decision(call("unix", k=fresh("unix"))["value"])
        self.assertEqual((d["allowed"], d["remaining"], d["source"]), (True, 4, "redis"))


POLICIES = ("local", "open", "closed")


def server_connections(port):
    """The connections a server has accepted, this question's own included."""
    info = redis_commands(port, ("INFO", "stats"))[0]
    return int(re.search(r"total_connections_received:(\d+)", info).group(1))


class Tls(unittest.TestCase):
    """rediss:// through cosockets: sslhandshake against the test CA that
    nginx trusts (lua_ssl_trusted_certificate), the server name given by
    tls_server_name (the certificate is for localhost)."""

    def test_exactly_the_capacity_over_tls_across_both_workers(self):
        key = fresh("exact-tls")
        rs = join(*get_many(S.port, [f"/limit/exact_tls?k={key}"] * 60))
        self.assertEqual(Counter(r.status for r in rs), Counter({200: 20, 429: 40}))
        self.assertEqual(len({r.header("X-Worker") for r in rs}), 2)
        self.assertEqual({r.header("X-Hirate-Source") for r in rs if r.status == 200}, {"redis"})
        self.assertLessEqual({r.header("X-Hirate-Source") for r in rs if r.status == 429},
                             {"redis", "cache"})
        # What Redis holds, read over the server's plain port: nothing left.
        d = call("tls_exact_plain", op="peek", k=f"{{k:{key}}}")["value"]
        self.assertEqual((d["remaining"], d["source"]), ("0", "redis"))

    def test_a_tls_and_a_plain_limiter_to_one_server_never_share_a_connection(self):
        k = fresh("share")
        got = [call(name, k=k)["value"] for name in ("tls", "tls_plain") * 2]
        self.assertEqual([(d["remaining"], d["source"]) for d in got],
                         [("4", "redis"), ("3", "redis"), ("2", "redis"), ("1", "redis")])
        # Each has connections of its own transport: had the plain limiter
        # been given a pooled TLS connection, none would be to the plain port.
        clients = redis_commands(S.tls.port, ("CLIENT", "LIST"))[0]
        ports = Counter(int(p) for p in re.findall(r" laddr=127\.0\.0\.1:(\d+) ", clients))
        self.assertGreaterEqual(ports[S.tls.tls_port], 1, clients)
        self.assertGreaterEqual(ports[S.tls.port], 2, clients)   # this CLIENT LIST's own too

    def test_tls_verify_false_checks_nothing(self):
        # A self-signed certificate, and an address for a name: both pass.
        d = decision(call("unverified", k=fresh("unverified"))["value"])
        self.assertEqual((d["allowed"], d["remaining"], d["source"]), (True, 4, "redis"))

    def test_mutual_tls(self):
        k = fresh("mtls")
        d = decision(call("mtls", k=k)["value"])
        self.assertEqual((d["allowed"], d["remaining"], d["source"]), (True, 4, "redis"))
        self.assertEqual(redis_commands(S.mtls.port, ("EXISTS", f"t-mtls:{k}")), [1])

    def test_mutual_tls_without_a_client_certificate_is_etls_under_every_policy(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                got = call(f"nocert_{policy}", k=fresh("nocert"))
                self.assertEqual(got, {"ok": False, "code": "ETLS", "err":
                                       f"TLS handshake with 127.0.0.1:{S.mtls.tls_port}: "
                                       "handshake failed"})

    def test_every_vector_over_tls(self):
        r = get(S.port, "/vectors?deny_cache=0&tls=1", timeout=60)
        self.assertEqual(r.status, 200, r)
        Vectors.check(self, json.loads(r.body), deny_cache=False)

    def test_a_bad_certificate_is_etls_under_every_policy_soon_and_with_few_connections(self):
        servers = dict(S.bad, badname=S.tls)
        for name, srv in servers.items():
            for policy in POLICIES:
                with self.subTest(cert=name, policy=policy):
                    before = server_connections(srv.port)
                    r = get(S.port, f"/call/{name}_{policy}?k={fresh('bad')}")
                    got = json.loads(r.body)
                    self.assertEqual((got["ok"], got["code"]), (False, "ETLS"), got)
                    self.assertLess(float(r.header("X-Took")), 0.5)
                    burst = call(f"{name}_{policy}", op="burst", n=10, k=fresh("bad"))
                    self.assertEqual(burst, {"ok": True, "value": ["ETLS"] * 10})
                    # The core's backoff: a few attempts, not one a call.
                    attempts = server_connections(srv.port) - before - 1
                    self.assertGreaterEqual(attempts, 1)
                    self.assertLessEqual(attempts, 4)

    def test_a_plain_tls_mismatch_is_etls_under_every_policy(self):
        for name in ("plain_to_tls", "tls_to_plain"):
            for policy in POLICIES:
                with self.subTest(case=name, policy=policy):
                    r = get(S.port, f"/call/{name}_{policy}?k={fresh('mismatch')}")
                    got = json.loads(r.body)
                    self.assertEqual((got["ok"], got["code"]), (False, "ETLS"), got)
                    scheme = "rediss://" if name == "plain_to_tls" else "redis://"
                    self.assertIn(scheme, got["err"])
                    # connect_timeout (0.5 s) and the probe, at most.
                    self.assertLess(float(r.header("X-Took")), 2.0)

    def test_maxclients_is_erefused_under_every_policy(self):
        import socket
        # The one connection the server allows, held by the test.
        with socket.create_connection(("127.0.0.1", S.maxclients.port), timeout=2) as held:
            held.sendall(b"*1\r\n$4\r\nPING\r\n")
            self.assertEqual(held.recv(7), b"+PONG\r\n")
            for policy in POLICIES:
                with self.subTest(policy=policy):
                    got = call(f"maxclients_{policy}", k=fresh("maxc"))
                    self.assertEqual((got["ok"], got["code"]), (False, "EREFUSED"), got)
                    self.assertIn("max number of clients reached", got["err"])
                    many = call(f"maxclients_{policy}", op="many", k=fresh("maxc"))["value"]
                    self.assertEqual([(d["allowed"], d["error"]) for d in many],
                                     [(False, "EREFUSED")] * 3)
                    # Over TLS the server closes during the handshake, which
                    # nginx calls "handshake failed": ETLS (docs/lua.md).
                    got = call(f"maxclients_tls_{policy}", k=fresh("maxc"))
                    self.assertEqual(got, {"ok": False, "code": "ETLS", "err":
                                           f"TLS handshake with 127.0.0.1:"
                                           f"{S.maxclients.tls_port}: handshake failed"})

    def test_allow_many_keeps_every_items_outcome_when_an_acl_refuses_one(self):
        k = fresh("acl")
        v = call("acl", op="many", acl=1, k=k)["value"]
        self.assertEqual([(d["allowed"], d["remaining"], d["source"]) for d in (v[0], v[2])],
                         [(True, "3", "redis"), (True, "2", "redis")])
        self.assertEqual((v[1]["allowed"], v[1]["error"]), (False, "ENOPERM"))
        self.assertIn("NOPERM", v[1]["message"])
        self.assertNotIn("source", v[1])
        # What Redis holds agrees.
        self.assertEqual(redis_commands(S.redis.port, ("EXISTS", f"t-acl:ok:{k}"),
                                        ("EXISTS", f"t-acl:no:{k}")), [1, 0])
        # The refused key alone: nil, message, code.
        got = call("acl", k=f"no:{k}")
        self.assertEqual((got["ok"], got["code"]), (False, "ENOPERM"), got)


class Phases(unittest.TestCase):

    @staticmethod
    def message(fname, phase):
        return (f"hirate: {fname} cannot reach Redis in the '{phase}' phase, where nginx has no "
                "cosockets; call it from rewrite, access or content (or a timer: ngx.timer.at)")

    def test_phases_without_cosockets_raise_an_error_naming_the_phase(self):
        r = get(S.port, "/phase/set")
        self.assertEqual(r.body.decode().strip(), self.message("allow", "set"))
        r = get(S.port, "/phase/header_filter")
        self.assertEqual(r.header("X-Phase-Error"), self.message("allow", "header_filter"))
        get(S.port, "/phase/log")
        want = "phase check: " + self.message("allow", "log")
        deadline = time.monotonic() + 5
        while want not in S.nginx.error_log() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertIn(want, S.nginx.error_log())

    def test_a_memory_limiter_works_in_those_phases(self):
        r = get(S.port, "/phase/set?lim=memory")
        self.assertEqual(r.body, b"no error\n")

    def test_a_timer_reaches_redis(self):
        self.assertEqual(get(S.port, "/phase/timer").body, b"redis\n")


class Vectors(unittest.TestCase):
    """tests/vectors/token_bucket.json through the cosocket path, with the
    time injected: with and without the deny cache."""

    ERROR_WORDS = {"HIRATE_ECAPACITY": "capacity must be", "HIRATE_ERATE": "rate must be",
                   "HIRATE_ERANGE": "takes over 2^53", "HIRATE_EKEY": "key ",
                   "HIRATE_ECOST": "cost must be"}

    def run_vectors(self, deny_cache):
        r = get(S.port, f"/vectors?deny_cache={deny_cache}", timeout=60)
        self.assertEqual(r.status, 200, r)
        self.check(json.loads(r.body), deny_cache)

    def check(self, got, deny_cache):
        want = json.loads(VECTORS.read_text())
        self.assertEqual(want["version"], 1)
        self.assertEqual([g["id"] for g in got], [c["id"] for c in want["cases"]])
        steps = 0
        sources = {"redis", "cache"} if deny_cache else {"redis"}
        for case, g in zip(want["cases"], got):
            if "config_error" in case:
                self.assertIn(Vectors.ERROR_WORDS[case["config_error"]], g.get("config_error", ""),
                              case["id"])
                continue
            self.assertNotIn("config_error", g, case["id"])
            config = case["config"]
            for i, (step, res) in enumerate(zip(case["steps"], g["steps"])):
                where = f"{case['id']} step {i + 1}"
                steps += 1
                if step["op"] == "reset":
                    self.assertEqual(res, {"reset": True}, where)
                elif step["op"] == "reconfigure":
                    self.assertEqual(res, {"reconfigured": True}, where)
                    config = step["config"]
                elif "expect_error" in step:
                    self.assertIn("raised", res, where)
                    self.assertIn(Vectors.ERROR_WORDS[step["expect_error"]], res["raised"], where)
                else:
                    d = decision(res)
                    source = d.pop("source")
                    self.assertIn(source, sources, where)
                    self.assertIsNone(d.pop("error", None), where)
                    if "bands" in d:
                        d["bands"] = [decision(b) for b in d["bands"]]
                        # Each band's source is the whole's.
                        self.assertEqual({b.pop("source") for b in d["bands"]}, {source}, where)
                        names = [b.pop("name") for b in d["bands"]]
                        for name, band in zip(names, config["bands"]):
                            if "name" in band:
                                self.assertEqual(name, band["name"], where)
                            else:   # the core's default
                                self.assertRegex(name, r"^[0-9]+-per-[0-9]+s$", where)
                    self.assertEqual(d, Vectors.wanted(step["expect"]), where)
        self.assertEqual(steps, sum(len(c.get("steps", [])) for c in want["cases"]))

    @staticmethod
    def wanted(expect):
        """The decision for an expect object: seconds as the binding gives
        them; in multi-band cases (a limiter made with limits) band (0-based,
        as the handler sends it) and each band's figures, band i."""
        out = dict(expect)
        out["retry_after"] = seconds(out.pop("retry_after_us"))
        out["reset_after"] = seconds(out.pop("reset_after_us"))
        if "bands" in expect:
            out.setdefault("band", 0)
            out["bands"] = [dict(Vectors.wanted(b), band=i)
                            for i, b in enumerate(expect["bands"])]
        return out

    def test_every_vector_without_the_deny_cache(self):
        self.run_vectors(0)

    def test_every_vector_with_the_deny_cache(self):
        self.run_vectors(1)


class RedisStopped(unittest.TestCase):
    """SIGSTOP: connect() still succeeds (the kernel completes it) and no
    reply ever comes; only the read timeout (1 s here) ends a call."""

    def test_workers_stay_responsive_and_each_policy_decides(self):
        tag = fresh("stop")
        # Pooled connections exist before the stop, as in production.
        for name in ("open", "closed", "local"):
            self.assertEqual(get(S.port, f"/limit/{name}?k={tag}-warm").status, 200)
        S.redis.stop()
        try:
            paths = ([f"/limit/open?k={tag}-o{i}" for i in range(6)]
                     + [f"/limit/closed?k={tag}-c{i}" for i in range(6)]
                     + [f"/limit/local?k={tag}-l" for i in range(8)])
            started = time.monotonic()
            threads, limited = get_many(S.port, paths)
            time.sleep(0.1)   # the limited requests now wait on Redis
            free = [get(S.port, "/free") for _ in range(10)]
            limited = join(threads, limited)
        finally:
            S.redis.cont()
        for r in free:
            self.assertEqual(r.status, 200)
            self.assertLess(r.elapsed, 0.5, "an unlimited request waited on Redis")
        first_limited = min(r.ended for r in limited)
        self.assertLess(max(r.ended for r in free), first_limited,
                        "the unlimited requests should finish while the limited ones wait")
        self.assertGreater(first_limited - started, 0.8, "the limited requests did not wait")
        for r in limited:
            self.assertLess(r.ended - started, 1.0 + 2.0, "a limited request outlived its timeout")
        opened, closed, local = limited[:6], limited[6:12], limited[12:]
        for r in opened:
            self.assertEqual((r.status, r.header("X-Hirate-Source"), r.header("X-Hirate-Error")),
                             (200, "fail_open", "ETIMEDOUT"))
            # No bucket stands behind the policy's figures: the policy, and
            # no RateLimit item (docs/semantics.md, "Response headers").
            self.assertEqual(fields(r), {"RateLimit-Policy": [("4-per-4000s",
                                                               {"q": 4, "w": 4000})]})
        for r in closed:
            self.assertEqual((r.status, r.header("X-Hirate-Source"), r.header("X-Hirate-Error")),
                             (503, "fail_closed", "ETIMEDOUT"))
            retry = int(r.header("Retry-After"))
            self.assertEqual(fields(r), {
                "RateLimit-Policy": [("4-per-4000s", {"q": 4, "w": 4000})],
                "Retry-After": retry})
            self.assertIn(retry, range(1, 8))
            unit = "second" if retry == 1 else "seconds"
            self.assertEqual(r.body, "The rate limit cannot be checked now; "
                                     f"retry in {retry} {unit}.\n".encode())
        # local: each worker has its own bucket of capacity 4 / 2 instances.
        by_worker = defaultdict(list)
        for r in local:
            self.assertEqual((r.header("X-Hirate-Source"), r.header("X-Hirate-Error")),
                             ("local", "ETIMEDOUT"))
            by_worker[r.header("X-Worker")].append(r.status)
            # The local bucket's own figures: capacity 2 (4 / 2 instances).
            item = fields(r)["RateLimit"]
            self.assertEqual((len(item), item[0][0]), (1, "4-per-4000s"))
            self.assertIn(item[0][1]["r"], (0, 1))
        for worker, statuses in by_worker.items():
            self.assertEqual(Counter(statuses)[200], min(2, len(statuses)), worker)
            self.assertEqual(Counter(statuses)[429], max(0, len(statuses) - 2), worker)
        # Redis is back: after the breaker's backoff the limiter uses it again.
        deadline = time.monotonic() + 15
        source = None
        while time.monotonic() < deadline:
            source = get(S.port, f"/limit/open?k={fresh('back')}").header("X-Hirate-Source")
            if source == "redis":
                break
            time.sleep(0.1)
        self.assertEqual(source, "redis")


if __name__ == "__main__":
    unittest.main()
