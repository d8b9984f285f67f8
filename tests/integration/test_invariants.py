"""Invariants under load, across languages: at once, for about ten seconds,

    c           4 threads of one C process (load_worker.c)
    python      3 threads sharing a sync hirate.Limiter (load_worker.py)
    python-fork 2 threads in a child forked from that process after its
                limiter had connected
    lua         a Lua 5.4 process (load_worker.lua, plain require "hirate")

spend from ONE Redis key (capacity 50, 20 tokens a second, costs 1 to 3,
on_error "closed" so that no local bucket admits anything). Every admitted
decision is logged with the Redis time it was made at and its cost; a call
the policy answered (a timeout, say) is logged as possibly admitted over its
interval. check_invariants.py then verifies that every window [t1, t2] of
admitted decisions holds at most capacity + rate * (t2 - t1), plus the
possibly admitted. The same must hold when Redis hangs for half a second in
the middle of a run (calls time out, the breaker opens, the policy answers,
Redis decides again). A phase with a rate too small to refill anything must
admit exactly the capacity. The window bound is checked once more with every
worker on rediss:// (a TLS port, the certificates of
tests/support/make_certs.sh, the CA given to each worker as
HIRATE_TLS_CA_FILE).

    HIRATE_INTEGRATION_BUILD=<build dir of tests/integration> \\
        python3 tests/integration/test_invariants.py

The build dir holds load_worker, lua-5.4/hirate/core.so and py/hirate
(tests/integration/run.sh makes it). HIRATE_LOAD_SECONDS changes the ten
seconds; HIRATE_INVARIANTS_WORKERS (e.g. "c,lua") runs only some of the
workers ("python" brings "python-fork" with it).
"""

import os
import select
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
sys.path.insert(0, str(HERE))

import check_invariants  # noqa: E402
from redis_server import RedisServer, free_port  # noqa: E402

CAPACITY = 50
RATE = 20.0
NO_REFILL = 1e-6          # a millionth of a token a second
SECONDS = float(os.environ.get("HIRATE_LOAD_SECONDS", "10"))
# Generous: a decision under load on a busy 2-core machine must come from
# Redis, not from the policy. The checker copes with timeouts all the same.
TIMEOUT_MS = 2000


def build_dir():
    d = os.environ.get("HIRATE_INTEGRATION_BUILD")
    if not d or not os.access(os.path.join(d, "load_worker"), os.X_OK):
        raise RuntimeError("set HIRATE_INTEGRATION_BUILD to the build directory of "
                           "tests/integration (tests/integration/run.sh does)")
    return Path(d)


class Phase:
    """The four workers on one key, started together; their logs in tmp."""

    def __init__(self, url, tmp, key, rate, seconds, drain, timeout_ms=TIMEOUT_MS, ca_file=None):
        build = build_dir()
        env = dict(os.environ, PYTHONPATH=str(build / "py"),
                   LUA_PATH=f"{ROOT}/bindings/lua/?.lua;;",
                   LUA_CPATH=f"{build}/lua-5.4/?.so;;")
        env.pop("HIRATE_TLS_CA_FILE", None)
        if ca_file:
            env["HIRATE_TLS_CA_FILE"] = ca_file
        common = [url, "inv:", key, str(CAPACITY), repr(rate), str(seconds)]
        tail = [str(int(drain)), str(timeout_ms)]
        chosen = os.environ.get("HIRATE_INVARIANTS_WORKERS", "c,python,lua").split(",")
        names = [n for n in ("c", "python", "python-fork", "lua")
                 if n in chosen or (n == "python-fork" and "python" in chosen)]
        self.logs = {name: str(Path(tmp) / f"{key}.{name}.log") for name in names}
        self.expect_ready = set(self.logs)
        logs, cmds = self.logs, {}
        if "c" in logs:
            cmds["c"] = [str(build / "load_worker"), "c", *common, "4", *tail, logs["c"]]
        if "python" in logs:
            cmds["python"] = [sys.executable, str(HERE / "load_worker.py"), "python", *common,
                              "3", *tail, logs["python"], "python-fork", "2",
                              logs["python-fork"]]
        if "lua" in logs:
            cmds["lua"] = ["lua5.4", str(HERE / "load_worker.lua"), "lua", *common, "1", *tail,
                           logs["lua"]]
        self.procs = {}
        try:
            for name, cmd in cmds.items():
                self.procs[name] = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                                    stdout=subprocess.PIPE, env=env)
        except BaseException:
            self.kill()
            raise

    def run(self, timeout, during=None):
        """Waits until every worker is ready, starts them together, calls
        during() if given, and waits for the workers to finish; returns
        {process: exit status}."""
        ready, pending = set(), {p.stdout.fileno(): (name, p) for name, p in self.procs.items()}
        buffers = dict.fromkeys(pending, b"")
        deadline = time.monotonic() + 60
        while ready != self.expect_ready:
            left = deadline - time.monotonic()
            if left <= 0 or not pending:
                raise AssertionError(f"workers not ready: {sorted(self.expect_ready - ready)}")
            readable, _, _ = select.select(list(pending), [], [], left)
            for fd in readable:
                chunk = os.read(fd, 4096)
                if not chunk:
                    del pending[fd]
                    continue
                buffers[fd] += chunk
                *lines, buffers[fd] = buffers[fd].split(b"\n")
                for line in lines:
                    if line.startswith(b"ready "):
                        ready.add(line[6:].decode())
        for name, p in self.procs.items():
            # The Python process and its child read three bytes each.
            p.stdin.write(b"go\ngo\n" if name == "python" else b"go\n")
            p.stdin.close()
        if during:
            during()
        status = {}
        end = time.monotonic() + timeout
        for name, p in self.procs.items():
            status[name] = p.wait(timeout=max(1, end - time.monotonic()))
        return status

    def kill(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
            for f in (p.stdin, p.stdout):
                if f and not f.closed:
                    f.close()


def report(title, logs, extra):
    lines = [f"{title}:", f"  {'process':<12} {'threads':>7} {'decisions':>9} {'redis':>7} "
             f"{'cache':>7} {'policy':>6} {'admitted':>8} {'cost':>5}"]
    for name, s in sorted(logs.summaries.items()):
        lines.append(f"  {name:<12} {s['threads']:>7} {s['decisions']:>9} {s['redis']:>7} "
                     f"{s['cache']:>7} {s['policy']:>6} {s['admitted']:>8} "
                     f"{s['admitted_cost']:>5}")
    lines.append("  " + extra)
    print("\n".join(lines), file=sys.stderr)


class InvariantsUnderLoad(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.redis = RedisServer()
        cls.tmp = tempfile.TemporaryDirectory(prefix="hirate-invariants-")

    @classmethod
    def tearDownClass(cls):
        cls.redis.close()
        cls.tmp.cleanup()

    def run_phase(self, key, rate, seconds, drain, timeout_ms=TIMEOUT_MS, during=None):
        phase = Phase(self.redis.url, self.tmp.name, key, rate, seconds, drain, timeout_ms)
        try:
            status = phase.run(timeout=seconds + 90, during=during)
        finally:
            phase.kill()
        self.assertEqual(status, dict.fromkeys(status, 0), "a worker failed (see stderr)")
        logs = check_invariants.parse(phase.logs.values())
        self.assertEqual(sorted(logs.summaries), sorted(phase.logs))
        for name, s in logs.summaries.items():
            self.assertEqual(s["errors"], 0, name)
            # Each process took part: Redis decided some of its calls.
            self.assertGreater(s["redis"], 0, f"{name} never reached Redis: {s}")
        return logs

    def test_every_window_admits_at_most_capacity_plus_refill(self):
        logs = self.run_phase("load", RATE, SECONDS, drain=False)
        v = check_invariants.check_windows(logs.admitted, logs.possible, CAPACITY, RATE)
        report(f"{SECONDS:g} s on one key, capacity {CAPACITY}, {RATE:g} tokens/s", logs,
               ("ok: " if v.ok else "VIOLATED: ") + v.message
               + f"; {len(logs.possible)} calls of unknown outcome")
        self.assertTrue(v.ok, v.message)
        # Not vacuous: the key was drained and its refill taken again and
        # again (about capacity + rate * SECONDS; half the refill is plenty
        # of room for a machine that stalls the workers).
        self.assertGreaterEqual(v.admitted_cost, CAPACITY + RATE * SECONDS / 2)
        self.assertGreater(v.windows, CAPACITY)

    def test_a_hang_mid_run_leaves_every_window_within_the_bound(self):
        # Redis stops for half a second while the workers run, with a 100 ms
        # timeout: calls time out, the breaker opens, each worker's policy
        # answers (logged as possibly admitted), and Redis decides again
        # after SIGCONT. Some timed-out calls ran when Redis woke up, unseen
        # by anyone: the bound must hold all the same.
        resumed = []

        def hang():
            time.sleep(1.5)
            self.redis.stop()
            try:
                time.sleep(0.5)
            finally:
                self.redis.cont()
                resumed.append(time.time_ns() // 1000)

        logs = self.run_phase("hang", RATE, 4.0, drain=False, timeout_ms=100, during=hang)
        v = check_invariants.check_windows(logs.admitted, logs.possible, CAPACITY, RATE)
        report(f"Redis stopped for 0.5 s, capacity {CAPACITY}, {RATE:g} tokens/s", logs,
               ("ok: " if v.ok else "VIOLATED: ") + v.message
               + f"; {len(logs.possible)} logged calls of unknown outcome")
        self.assertTrue(v.ok, v.message)
        # Every process met the outage and logged it; Redis admitted again after.
        for name, s in logs.summaries.items():
            self.assertGreater(s["policy"], 0, f"{name} never met the hang: {s}")
        self.assertTrue(logs.possible)
        self.assertGreater(max(t for t, _ in logs.admitted), resumed[0])

    def test_without_refill_exactly_the_capacity_is_admitted(self):
        logs = self.run_phase("drain", NO_REFILL, min(SECONDS, 5.0), drain=True)
        ok, got, maybe, message = check_invariants.check_exact(logs.admitted, logs.possible,
                                                               CAPACITY)
        report(f"no refill, capacity {CAPACITY}", logs, ("ok: " if ok else "VIOLATED: ")
               + message)
        self.assertTrue(ok, message)
        if maybe == 0:
            self.assertEqual(got, CAPACITY)
        # Redis agrees: the bucket holds less than a token.
        stored = self.redis.command("GET", "inv:drain")
        self.assertIsNotNone(stored)
        self.assertLess(float(stored.split()[0]), 1.0, stored)


class TLSRedisServer(RedisServer):
    """RedisServer with a TLS port as well (its plain port stays, for
    command()), the certificates of tests/support/make_certs.sh in certs."""

    def __init__(self, certs):
        self.certs = certs
        self.tls_port = free_port()
        super().__init__(extra=[
            "--tls-port", str(self.tls_port),
            "--tls-cert-file", os.path.join(certs, "server.crt"),
            "--tls-key-file", os.path.join(certs, "server.key"),
            "--tls-ca-cert-file", os.path.join(certs, "ca.crt"),
            "--tls-auth-clients", "no"])

    @property
    def tls_url(self):
        return f"rediss://localhost:{self.tls_port}"


class InvariantsOverTLS(unittest.TestCase):
    """The window bound once more, every worker on rediss://."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="hirate-invariants-tls-")
        cls.certs = os.path.join(cls.tmp.name, "certs")
        subprocess.run(["sh", str(ROOT / "tests" / "support" / "make_certs.sh"), cls.certs],
                       check=True)
        cls.redis = TLSRedisServer(cls.certs)

    @classmethod
    def tearDownClass(cls):
        cls.redis.close()
        cls.tmp.cleanup()

    def test_every_window_admits_at_most_capacity_plus_refill_over_tls(self):
        phase = Phase(self.redis.tls_url, self.tmp.name, "tls", RATE, SECONDS, False,
                      ca_file=os.path.join(self.certs, "ca.crt"))
        try:
            status = phase.run(timeout=SECONDS + 90)
        finally:
            phase.kill()
        self.assertEqual(status, dict.fromkeys(status, 0), "a worker failed (see stderr)")
        logs = check_invariants.parse(phase.logs.values())
        self.assertEqual(sorted(logs.summaries), sorted(phase.logs))
        for name, s in logs.summaries.items():
            self.assertEqual(s["errors"], 0, name)
            self.assertGreater(s["redis"], 0, f"{name} never reached Redis over TLS: {s}")
        v = check_invariants.check_windows(logs.admitted, logs.possible, CAPACITY, RATE)
        report(f"over TLS: {SECONDS:g} s on one key, capacity {CAPACITY}, {RATE:g} tokens/s",
               logs, ("ok: " if v.ok else "VIOLATED: ") + v.message
               + f"; {len(logs.possible)} calls of unknown outcome")
        self.assertTrue(v.ok, v.message)
        self.assertGreaterEqual(v.admitted_cost, CAPACITY + RATE * SECONDS / 2)
        # The bucket is in the TLS server (read on its plain port).
        self.assertIsNotNone(self.redis.command("GET", "inv:tls"))


if __name__ == "__main__":
    unittest.main()
