#!/usr/bin/env python3
"""hirate next to its peers, on one machine and one redis-server.

    python3 bench/suite/suite.py --build BUILD --setup BUILD/suite/setup.json \\
        --out RESULTS.json [--quick] [--rounds R] [--seconds S] [--warmup W]

bench/run.sh runs this after the C benchmarks and bench/suite/install.py
(which installs the contenders and writes setup.json). It starts one
redis-server of its own and drives every contender through the harness
protocol of bench/peers/README.md:

  speed    the same work for each: capacity 100, rate 10/s, cost 1; one hot
           key, and 100,000 keys drawn uniformly ("cold"); 1 client, and 8
           concurrent (threads, goroutines, tasks or connections). Rounds are
           interleaved: each round runs every contender once per scenario, in
           an order reversed every other round, so that drift in the machine's
           speed falls on all alike; each figure is the median over rounds,
           with min..max. The server is emptied (FLUSHALL) before every run.
  atomic   100 requests released together on one fresh key, capacity 10, a
           rate so small that nothing refills: exactly 10 may pass.
  outage   every contender's harness at once, connected; then SIGSTOP to the
           server, 20 decisions each on a fresh capacity-10 key, SIGCONT.
  memory   one decision on each of 10,000 keys (2,000 in quick mode),
           capacity 100, rate 0.01/s: used_memory growth per key and
           MEMORY USAGE of keys written.
  tls      hirate_allow, hirate.Limiter, redis-py and go-redis (the seed
           article) over TLS, on a second redis-server that speaks only TLS
           (certificates from tests/support/make_certs.sh), and each over
           plain TCP on the first, interleaved in the same rounds: the
           100,000-key workloads, 1 client and 8 concurrent.
  cluster  hirate (hirate_allow, hirate_allow_many, hirate.Limiter), redis-py
           (RedisCluster, register_script of hirate's script; pipelines) and
           go-redis (ClusterClient, the seed article; pipelines) against a
           Redis Cluster of 3 masters and 3 replicas on this machine
           (tests/support/redis_cluster.py), and each against the one
           redis-server of the other phases, interleaved in the same rounds:
           100,000 keys, 8 concurrent; next to redis-benchmark --cluster and
           the sum of per-node redis-benchmark runs of the same EVALSHA, the
           ceiling of the cluster itself. --merge writes only this phase's
           results into an existing results file (bench/run.sh BUILD cluster).
  bands    one identity limited by two rules ("10/second; 1000/day"): hirate's
           one decision of both (hirate_allow_bands with limits, and
           hirate.Limiter(limits=...) where the installed hirate has it), next
           to Flask-Limiter's way (limits' FixedWindowRateLimiter on Redis, one
           hit per limit) and rate-limiter-flexible's RateLimiterUnion of two
           RateLimiterRedis; 100,000 keys, 1 client and 8 concurrent,
           interleaved rounds. The round trips per decision are counted by
           the server (INFO commandstats: the script calls; total_reads_processed),
           not assumed. Alone: bench/run.sh BUILD bands.
  pieces   bench/python, bench/lua and bench/nginx, the bindings' own
           benchmarks, run as they are and kept as the markdown they print.

A contender whose runtime is missing (setup.json) is reported as missing with
the reason; a run that fails is kept with its error. Everything goes into one
JSON file, from which bench/suite/report.py writes docs/benchmarks.md and the
charts. Progress goes to stderr.
"""

import argparse
import json
import os
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "peers"))
from protocol import rate_arg  # noqa: E402  (the same digits the harnesses send)

T0 = time.monotonic()

CAPACITY, RATE = 100, 10.0
COLD_KEYS = 100_000
CONCURRENCY = (1, 8)
TIMEOUT_MS = 100
ATOMIC = {"requests": 100, "capacity": 10, "rate": 0.001}
# A burst of 100 new connections can take longer than a 100 ms timeout on a
# busy machine: the atomic test gives every client 1 s, so that it measures
# the limit and not the connect.
ATOMIC_TIMEOUT_MS = 1000
OUTAGE = {"calls": 20, "capacity": 10, "rate": 0.001}
# The memory test's rate: small, so that no key expires before it is
# measured (hirate's live only until their bucket is full again).
MEMORY_RATE = 0.01

SCENARIOS = [
    {"id": "hot-1", "keys": 1, "concurrency": 1, "label": "1 hot key, 1 client"},
    {"id": "cold-1", "keys": COLD_KEYS, "concurrency": 1, "label": "100,000 keys, 1 client"},
    {"id": "hot-8", "keys": 1, "concurrency": 8, "label": "1 hot key, 8 concurrent"},
    {"id": "cold-8", "keys": COLD_KEYS, "concurrency": 8, "label": "100,000 keys, 8 concurrent"},
]


def step(msg):
    sys.stderr.write("[bench %4ds] %s\n" % (time.monotonic() - T0 + START_OFFSET, msg))
    sys.stderr.flush()


START_OFFSET = float(os.environ.get("BENCH_ELAPSED", "0"))
_TTY = sys.stderr.isatty()


def progress(msg):
    """A progress line: rewritten in place on a terminal, one line each otherwise."""
    if _TTY:
        sys.stderr.write("\r\033[K  " + msg)
    else:
        sys.stderr.write("  " + msg + "\n")
    sys.stderr.flush()


def progress_done():
    if _TTY:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


# ---- the contenders ---------------------------------------------------------------------

class Contender:
    def __init__(self, id, short, lang, label, runtime, impl, hirate=False, limiter=True,
                 phases=("speed", "atomic", "outage", "memory"), needs=(), note=None):
        self.id, self.short, self.lang, self.label = id, short, lang, label
        self.runtime, self.impl, self.hirate = runtime, impl, hirate
        self.limiter = limiter
        # Not a limiter: speed only (and, for the unlimited nginx location,
        # the outage, as the HTTP cost next to the limited locations').
        self.phases = set(phases if limiter else ("speed",) + (("outage",) if runtime == "nginx"
                                                               else ()))
        self.needs = needs          # files of other pieces this contender uses
        self.note = note
        self.reason = None          # why it is missing, if it is
        self.argv, self.env = None, None

    def to_json(self):
        return {"id": self.id, "short": self.short, "lang": self.lang, "label": self.label, "hirate": self.hirate,
                "limiter": self.limiter, "phases": sorted(self.phases),
                "status": "missing" if self.reason else "ok", "reason": self.reason,
                "note": self.note}


def contenders():
    C = Contender
    NGINX = "tests/lua/nginx/harness.py"
    return [
        C("c/hiredis", "C: hiredis loop", "C",
          "plain hiredis EVALSHA loop (`redisCommandArgv`, hirate's script)", "c", "hiredis",
          note="the floor for any client: one round trip per decision, nothing else"),
        C("c/hirate", "C: hirate_allow", "C", "`hirate_allow`", "c", "hirate", hirate=True),
        C("c/hirate-nocache", "C: hirate_allow, no deny cache", "C",
          "`hirate_allow`, deny cache off", "c", "hirate-nocache", hirate=True,
          phases=("speed",), note="every decision a round trip, as for the others"),
        C("c/hirate-batch", "C: hirate_allow_many", "C", "`hirate_allow_many`, 16 per call",
          "c", "hirate-batch", hirate=True, phases=("speed",)),
        C("c/redis-benchmark", "C: redis-benchmark -P 16", "C",
          "`redis-benchmark -P 16`, EVALSHA of hirate's script", "redis-benchmark", None,
          limiter=False, note="the ceiling of the server itself, not a limiter"),
        C("go/article", "Go: seed article", "Go",
          "seed article: go-redis v9 `Script.Run` of its own script", "go", "article"),
        C("go/redis_rate", "Go: redis_rate", "Go", "go-redis/redis_rate v10 (GCRA)", "go",
          "redis_rate"),
        C("node/rlf", "Node: rate-limiter-flexible", "Node",
          "rate-limiter-flexible `RateLimiterRedis` on ioredis", "node", "rlf"),
        C("node/rlf-insured", "Node: rate-limiter-flexible + insurance", "Node",
          "rate-limiter-flexible with an in-memory `insuranceLimiter`", "node", "rlf-insured",
          phases=("outage",), note="the same as rate-limiter-flexible while Redis is up"),
        C("py/redis-py", "Python: redis-py script", "Python",
          "redis-py `register_script` of hirate's script, threads", "python", "redis-py"),
        C("py/redis-py-hiredis", "Python: redis-py[hiredis] script", "Python",
          "redis-py with its hiredis parser (`redis[hiredis]`), `register_script` of hirate's "
          "script, threads", "python", "redis-py-hiredis"),
        C("py/redis-py-async", "Python: redis-py asyncio script", "Python",
          "redis-py asyncio `register_script`, tasks", "python", "redis-py-async"),
        C("py/limits-moving", "Python: limits moving window", "Python",
          "limits, moving window (Redis)", "python", "limits-moving"),
        C("py/limits-sliding", "Python: limits sliding window", "Python",
          "limits, sliding window counter (Redis)", "python", "limits-sliding"),
        C("py/hirate", "Python: hirate.Limiter", "Python", "`hirate.Limiter`, threads", "python",
          "hirate", hirate=True),
        C("py/hirate-async", "Python: hirate.AsyncLimiter", "Python",
          "`hirate.AsyncLimiter`, tasks", "python", "hirate-async", hirate=True),
        C("resty/free", "OpenResty: no limit", "OpenResty", "nginx location without a limit",
          "nginx", "free", limiter=False, needs=(NGINX,),
          note="what nginx and the HTTP client cost without a limit"),
        C("resty/hand", "OpenResty: hand-written EVALSHA", "OpenResty",
          "hand-written cosocket EVALSHA (`bench/nginx/handwritten.lua`)", "nginx", "hand",
          needs=(NGINX, "bench/nginx/handwritten.lua")),
        C("resty/hirate", "OpenResty: hirate.resty", "OpenResty", "`hirate.resty.limit{}`",
          "nginx", "hirate", hirate=True, needs=(NGINX, "bindings/lua/hirate/resty.lua")),
    ]


def resolve(cs, build, setup):
    """Fills each contender's command, or the reason it cannot run."""
    rt = setup.get("runtimes", {})
    for c in cs:
        missing = [n for n in c.needs if not (ROOT / n).exists()]
        if missing:
            c.reason = "%s not in this checkout" % ", ".join(missing)
            continue
        env = dict(os.environ)
        if c.runtime == "c":
            exe = build / "bench" / "peer_c"
            if not exe.exists():
                c.reason = "%s is not built" % exe
                continue
            c.argv = [str(exe)]
        elif c.runtime == "redis-benchmark":
            exe = shutil.which("redis-benchmark")
            if not exe:
                c.reason = "redis-benchmark not found (apt-get install redis-tools)"
                continue
            c.argv = [exe]
        else:
            r = rt.get(c.runtime if c.runtime != "nginx" else "nginx", {})
            if not r.get("ok"):
                c.reason = r.get("reason") or "%s was not set up" % c.runtime
                continue
            if c.runtime == "go":
                c.argv = [r["binary"]]
            elif c.runtime == "node":
                c.argv = [r["node"], str(ROOT / "bench" / "peers" / "node" / "harness.js")]
                env["NODE_PATH"] = r["node_path"]
            elif c.runtime == "python":
                if c.impl == "hirate-async" and not setup["versions"].get("hirate.AsyncLimiter"):
                    c.reason = "the installed hirate has no AsyncLimiter"
                    continue
                c.argv = [r["python"], str(ROOT / "bench" / "peers" / "python" / "harness.py")]
            elif c.runtime == "nginx":
                c.argv = [sys.executable, str(ROOT / "bench" / "peers" / "nginx" /
                                              "peer_nginx.py")]
                env["HIRATE_LUAJIT_CPATH"] = rt["lua"]["luajit_cpath"]
        c.env = env


# ---- a redis-server of our own -------------------------------------------------------------

def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Redis:
    """redis-server on a free loopback port in a temporary directory, and a
    minimal RESP client for the driver's own commands. With tls (a directory
    of tests/support/make_certs.sh's certificates) the server speaks only TLS
    (--port 0 --tls-port P, no client certificates asked), and so does the
    driver's client."""

    def __init__(self, work, tls=None):
        self.dir = tempfile.mkdtemp(prefix="redis-", dir=work)
        self.proc = None
        self.sock = None
        self.tls = None
        if tls:
            import ssl
            self.tls = ssl.create_default_context(cafile=os.path.join(tls, "ca.crt"))
        # A port outside the ephemeral range, so that no client's own
        # connection can take it.
        lo, hi = 32768, 60999
        try:
            lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        except (OSError, ValueError):
            pass
        span = (10000, lo - 1) if lo > 11024 else (hi + 1, 65535)
        import random
        for _ in range(20):
            port = random.randint(*span)
            if self._taken(port):
                continue
            listen = ["--port", str(port)]
            if tls:
                listen = ["--port", "0", "--tls-port", str(port),
                          "--tls-cert-file", os.path.join(tls, "server.crt"),
                          "--tls-key-file", os.path.join(tls, "server.key"),
                          "--tls-ca-cert-file", os.path.join(tls, "ca.crt"),
                          "--tls-auth-clients", "no"]
            # setpriv: the kernel stops the server should this process die
            # without its cleanup.
            guard = ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []
            self.proc = subprocess.Popen(
                guard + ["redis-server"] + listen + ["--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.dir, "--logfile",
                 os.path.join(self.dir, "redis.log")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and self.proc.poll() is None:
                if self._answers(port):
                    self.port = port
                    # The certificate names localhost (and 127.0.0.1): the
                    # name a client checks is the URL's host.
                    self.url = ("rediss://localhost:%d" if tls else "redis://127.0.0.1:%d") % port
                    return
                time.sleep(0.05)
            self.close()
        raise RuntimeError("could not start redis-server (see %s/redis.log)" % self.dir)

    @staticmethod
    def _taken(port):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    def _connect(self, port, timeout):
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        if self.tls:
            s = self.tls.wrap_socket(s, server_hostname="localhost")
        return s

    def _answers(self, port):
        try:
            with self._connect(port, 0.5) as s:
                s.sendall(resp("PING"))
                return s.recv(16).startswith(b"+PONG")
        except OSError:   # ssl.SSLError too
            return False

    def cmd(self, *args):
        if self.sock is None:
            self.sock = self._connect(self.port, 30)
            self.file = self.sock.makefile("rb")
        self.sock.sendall(resp(*args))
        return self._read()

    def _read(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError("redis: " + rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)[:-2]
            return data.decode(errors="replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise RuntimeError("redis: unexpected reply %r" % line)

    def info(self, section):
        out = {}
        for line in self.cmd("INFO", section).splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                out[k] = v
        return out

    def fresh(self):
        """An empty server with its command statistics zeroed."""
        self.cmd("FLUSHALL", "SYNC")
        self.cmd("CONFIG", "RESETSTAT")

    def script_stats(self):
        """Calls and microseconds of the commands clients sent (INFO
        commandstats), without the driver's own."""
        calls = usec = 0
        own = {"info", "config", "flushall", "ping", "script", "memory", "randomkey",
               "dbsize", "client", "hello", "select", "auth", "command"}
        for k, v in self.info("commandstats").items():
            name = k.removeprefix("cmdstat_").split("|")[0]
            if name in own:
                continue
            f = dict(x.split("=") for x in v.split(","))
            calls += int(f["calls"])
            usec += int(f["usec"])
        return calls, usec

    def stop(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def cont(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self):
        if self.sock:
            self.sock.close()
            self.sock = None
        if self.proc and self.proc.poll() is None:
            # SIGCONT first: a stopped server keeps SIGTERM pending forever.
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


# ---- running one harness -------------------------------------------------------------------

class RunError(Exception):
    pass


def harness(c, mode, args, timeout):
    """Runs c's harness in mode; its JSON object, or RunError."""
    argv = c.argv + [mode, "--impl", c.impl] + [str(a) for a in args]
    p = subprocess.Popen(argv, env=c.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM first: the nginx harness stops its nginx on it.
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
        raise RunError("no answer within %d s" % timeout)
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise
    lines = [l for l in stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        # Not the carets under a traceback's line: they say nothing alone.
        tail = [l for l in stderr.strip().splitlines() if l.strip(" ^~")][-2:]
        raise RunError("exit %d: %s" % (p.returncode, " / ".join(tail) or "no output"))
    return json.loads(lines[-1])


def redis_benchmark(c, redis, sc, seconds, calib):
    """redis-benchmark -P 16 with EVALSHA of hirate's script, as a harness run.
    -n is set from the previous run's rate so that a run lasts about `seconds`."""
    sha = redis.sha
    clients = sc["concurrency"]
    n = max(2000, int(calib.get(sc["id"], 5000 * clients) * seconds))
    argv = c.argv + ["-h", "127.0.0.1", "-p", str(redis.port), "-c", str(clients), "-P", "16",
                     "-n", str(n), "--csv"]
    if sc["keys"] > 1:
        argv += ["-r", str(sc["keys"]), "EVALSHA", sha, "1", "rl:user:__rand_int__"]
    else:
        argv += ["EVALSHA", sha, "1", "rl:user:000000"]
    argv += [str(CAPACITY), rate_arg(RATE), "1", "1"]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=seconds * 20 + 60)
    except subprocess.TimeoutExpired:
        raise RunError("redis-benchmark ran too long")
    wall = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = [l for l in p.stdout.splitlines() if l.startswith('"EVALSHA')]
    if p.returncode != 0 or not rows:
        raise RunError("redis-benchmark: exit %d: %s" % (p.returncode, p.stderr.strip()[-200:]))
    head = [h.strip('"') for h in p.stdout.splitlines()[0].split(",")]
    row = dict(zip(head, (v.strip('"') for v in rows[0].split(","))))
    rps = float(row["rps"])
    calib[sc["id"]] = rps
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"decisions": n, "allowed": None, "errors": 0,
            "p50_us": float(row["p50_latency_ms"]) * 1e3,
            "p99_us": float(row["p99_latency_ms"]) * 1e3,
            "cpu_s": cpu, "wall_s": n / rps, "process_wall_s": wall, "error": None}


# ---- statistics ------------------------------------------------------------------------------

def summarize(runs):
    """Median and min..max over the good runs of: decisions/s, p50, p99, client
    CPU µs per decision, server µs per call."""
    good = [r for r in runs if "error_run" not in r and r.get("decisions")]
    out = {"runs": len(runs), "good": len(good)}
    bad = [r["error_run"] for r in runs if "error_run" in r]
    if bad:
        out["failures"] = bad
    series = {
        "rate": [r["decisions"] / r["wall_s"] for r in good],
        "p50_us": [r["p50_us"] for r in good],
        "p99_us": [r["p99_us"] for r in good],
        "cpu_us": [r["cpu_s"] / r["decisions"] * 1e6 for r in good],
        "server_us_per_call": [r["server_us_per_call"] for r in good
                               if r.get("server_us_per_call") is not None],
        "allowed_share": [r["allowed"] / r["decisions"] for r in good
                          if r.get("allowed") is not None],
    }
    for k, v in series.items():
        if v:
            out[k] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
    errors = sum(r.get("errors", 0) for r in good)
    if errors:
        out["errors"] = errors
        out["error"] = next((r["error"] for r in good if r.get("error")), None)
    return out


# ---- the phases --------------------------------------------------------------------------------

def interleaved(runs, scenarios, p, what, run_one):
    """Every run (objects with an id) once per scenario in each of p.rounds
    rounds, in an order reversed every other round; run_one(run, sc, rnd)
    gives one harness result (or raises RunError). The summaries by run id
    and scenario id."""
    total = len(runs) * len(scenarios) * p.rounds
    done = 0
    raw = {r.id: {sc["id"]: [] for sc in scenarios} for r in runs}
    t_start = time.monotonic()
    for rnd in range(p.rounds):
        order = runs if rnd % 2 == 0 else runs[::-1]
        for sc in scenarios:
            for run in order:
                done += 1
                eta = ""
                if done > 1:
                    left = (time.monotonic() - t_start) / (done - 1) * (total - done + 1)
                    eta = ", about %dm%02ds left" % (left // 60, left % 60)
                progress("%s: round %d/%d, %s: %s (%d/%d%s)" % (
                    what, rnd + 1, p.rounds, sc["label"], run.id, done, total, eta))
                try:
                    r = run_one(run, sc, rnd)
                    r["round"] = rnd + 1
                except RunError as e:
                    r = {"error_run": str(e), "round": rnd + 1}
                raw[run.id][sc["id"]].append(r)
    progress_done()
    out = {}
    for run in runs:
        out[run.id] = {}
        for sc in scenarios:
            s = summarize(raw[run.id][sc["id"]])
            s["raw"] = raw[run.id][sc["id"]]
            out[run.id][sc["id"]] = s
    return out


def speed_run(c, redis, sc, rnd, p, extra=()):
    """One speed run of harness c against redis, with its server-side figures."""
    redis.fresh()
    r = harness(c, "speed", [
        "--url", redis.url, "--keys", sc["keys"], "--concurrency", sc["concurrency"],
        "--seconds", p.seconds, "--warmup", p.warmup, "--capacity", CAPACITY, "--rate",
        rate_arg(RATE), "--seed", rnd + 1, "--timeout-ms", TIMEOUT_MS] + list(extra),
        timeout=p.seconds + p.warmup + 60)
    calls, usec = redis.script_stats()
    if calls:
        r["server_us_per_call"] = usec / calls
    r["redis_calls"] = calls
    return r


def phase_speed(cs, redis, p, results):
    runnable = [c for c in cs if not c.reason and "speed" in c.phases]
    calib = {}
    step("peers: %d rounds x %d scenarios x %d contenders, %.2g s each after %.2g s of "
         "warm-up (%s)" % (p.rounds, len(SCENARIOS), len(runnable), p.seconds, p.warmup,
                           redis.url))

    def one(c, sc, rnd):
        if c.runtime != "redis-benchmark":
            return speed_run(c, redis, sc, rnd, p)
        redis.fresh()
        r = redis_benchmark(c, redis, sc, p.seconds, calib)
        calls, usec = redis.script_stats()
        if calls:
            r["server_us_per_call"] = usec / calls
        r["redis_calls"] = calls
        return r

    results["speed"].update(interleaved(runnable, SCENARIOS, p, "peers", one))


# The concurrent-callers phase: the clients that share one limiter (or client)
# among many callers, at 8 and 50 of them, on 100,000 keys: how far their
# calls share round trips.
CONCURRENT_SCENARIOS = [
    {"id": "cold-8", "keys": COLD_KEYS, "concurrency": 8, "label": "100,000 keys, 8 concurrent"},
    {"id": "cold-50", "keys": COLD_KEYS, "concurrency": 50,
     "label": "100,000 keys, 50 concurrent"},
]
CONCURRENT_IDS = ("c/hirate", "c/hirate-batch", "py/hirate", "py/hirate-async", "node/rlf",
                  "go/redis_rate", "py/redis-py", "py/redis-py-hiredis")


def phase_concurrent(cs, redis, p, results):
    by_id = {c.id: c for c in cs}
    runnable = [by_id[i] for i in CONCURRENT_IDS if i in by_id and not by_id[i].reason]
    step("concurrent callers: %d rounds x %d scenarios x %d contenders, %.2g s each after "
         "%.2g s of warm-up" % (p.rounds, len(CONCURRENT_SCENARIOS), len(runnable), p.seconds,
                                p.warmup))
    results["concurrent"] = interleaved(
        runnable, CONCURRENT_SCENARIOS, p, "concurrent",
        lambda c, sc, rnd: speed_run(c, redis, sc, rnd, p))
    results["concurrent_scenarios"] = CONCURRENT_SCENARIOS


def phase_atomic(cs, redis, p, results):
    runnable = [c for c in cs if not c.reason and "atomic" in c.phases]
    step("concurrency test: %d requests at once on one fresh key, capacity %d, rate %g/s, "
         "for %d contenders" % (ATOMIC["requests"], ATOMIC["capacity"], ATOMIC["rate"],
                                len(runnable)))
    for i, c in enumerate(runnable):
        progress("concurrency test: %s (%d/%d)" % (c.id, i + 1, len(runnable)))
        try:
            r = harness(c, "atomic", [
                "--url", redis.url, "--key", "atomic:" + c.id.replace("/", "-"),
                "--requests", ATOMIC["requests"], "--capacity", ATOMIC["capacity"],
                "--rate", rate_arg(ATOMIC["rate"]), "--timeout-ms", ATOMIC_TIMEOUT_MS],
                timeout=120)
            r["holds"] = r["admitted"] == ATOMIC["capacity"] and r["errors"] == 0
        except RunError as e:
            r = {"error_run": str(e)}
        results["atomic"][c.id] = r
    progress_done()


def phase_outage(cs, redis, p, results):
    """Every contender's harness at once: connected, then Redis stopped."""
    runnable = [c for c in cs if not c.reason and "outage" in c.phases]
    by_id = {c.id: c for c in runnable}
    step("outage: %d contenders connect, redis-server gets SIGSTOP, %d decisions each on a "
         "fresh capacity-%d key, then SIGCONT" % (len(runnable), OUTAGE["calls"],
                                                  OUTAGE["capacity"]))
    redis.fresh()
    procs, errs = {}, {}
    for c in runnable:
        argv = c.argv + ["outage", "--impl", c.impl, "--url", redis.url,
                         "--key", "outage:" + c.id.replace("/", "-"),
                         "--calls", str(OUTAGE["calls"]), "--capacity", str(OUTAGE["capacity"]),
                         "--rate", rate_arg(OUTAGE["rate"]), "--timeout-ms", str(TIMEOUT_MS)]
        # stderr to a file: a chatty client must not block on a full pipe.
        errs[c.id] = tempfile.TemporaryFile(mode="w+")
        procs[c.id] = subprocess.Popen(argv, env=c.env, cwd=ROOT, stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=errs[c.id],
                                       text=True, start_new_session=True)
    out = {}
    try:
        # Ready: each has made one decision against the live server.
        deadline = time.monotonic() + 60
        waiting = dict(procs)
        while waiting and time.monotonic() < deadline:
            r, _, _ = select.select([pr.stdout for pr in waiting.values()], [], [], 1)
            for cid, pr in list(waiting.items()):
                if pr.stdout in r:
                    line = pr.stdout.readline()
                    if line.startswith('{"ready"') or line.startswith('{"ready'):
                        del waiting[cid]
                    elif not line:
                        del waiting[cid]
                        pr.wait()
                        out[cid] = {"error_run": "exit %d before ready: %s" % (
                            pr.returncode, tail(errs[cid]))}
        for cid in waiting:
            out[cid] = {"error_run": "not ready within 60 s"}
        ready = [cid for cid in procs if cid not in out]
        progress("outage: %d harnesses ready; SIGSTOP" % len(ready))
        redis.stop()
        stopped_at = time.monotonic()
        for cid in ready:
            procs[cid].stdin.write("go\n")
            procs[cid].stdin.flush()
        for cid in ready:
            left = max(1.0, stopped_at + 180 - time.monotonic())
            try:
                stdout, _ = procs[cid].communicate(timeout=left)
                lines = [l for l in stdout.splitlines() if l.startswith("{")]
                out[cid] = json.loads(lines[-1]) if lines else {
                    "error_run": "exit %d: %s" % (procs[cid].returncode, tail(errs[cid]))}
            except subprocess.TimeoutExpired:
                out[cid] = {"error_run": "still deciding after 180 s"}
        progress_done()
    finally:
        redis.cont()
        for pr in procs.values():
            if pr.poll() is None:
                os.killpg(pr.pid, signal.SIGKILL)
            pr.wait()
        for f in errs.values():
            f.close()
    for cid, r in out.items():
        if "lat_us" in r:
            lat = sorted(r["lat_us"])
            r["median_us"] = statistics.median(lat)
            r["max_us"] = lat[-1]
            r["first_us"] = r["lat_us"][0]
            r["after_first_median_us"] = statistics.median(r["lat_us"][1:]) \
                if len(lat) > 1 else lat[0]
            r["verdict"] = outage_verdict(r, by_id[cid].limiter)
        results["outage"][cid] = r
    # The server works again.
    redis.cmd("PING")


def outage_verdict(r, limiter=True):
    cap, calls = OUTAGE["capacity"], r["calls"]
    if not limiter:
        return "no limit"
    if r["errors"] == calls:
        return "error"
    if r["admitted"] == calls:
        return "allowed all"
    if r["admitted"] == cap and r["errors"] == 0:
        return "limits"
    if r["admitted"] == 0 and r["errors"] == 0:
        return "refused all"
    return "mixed"


def tail(f):
    """The last two lines of a harness's stderr file."""
    f.seek(0)
    return " / ".join([l for l in f.read().strip().splitlines() if l.strip()][-2:])


def phase_memory(cs, redis, p, results):
    runnable = [c for c in cs if not c.reason and "memory" in c.phases]
    step("memory: one decision on each of %s keys per contender, used_memory and MEMORY USAGE"
         % format(p.memory_keys, ","))
    for i, c in enumerate(runnable):
        progress("memory: %s (%d/%d)" % (c.id, i + 1, len(runnable)))
        redis.fresh()
        before = int(redis.info("memory")["used_memory"])
        try:
            r = harness(c, "fill", ["--url", redis.url, "--keys", p.memory_keys,
                                    "--capacity", CAPACITY, "--rate", rate_arg(MEMORY_RATE),
                                    "--timeout-ms", 1000], timeout=300)
        except RunError as e:
            results["memory"][c.id] = {"error_run": str(e)}
            continue
        # The harness's connections hold buffers until the server has seen
        # them close.
        deadline = time.monotonic() + 3
        while int(redis.info("clients")["connected_clients"]) > 1 and \
                time.monotonic() < deadline:
            time.sleep(0.02)
        after = int(redis.info("memory")["used_memory"])
        nkeys = redis.cmd("DBSIZE")
        usage = []
        for _ in range(20):
            k = redis.cmd("RANDOMKEY")
            if k is None:
                break
            u = redis.cmd("MEMORY", "USAGE", k, "SAMPLES", "0")
            if u is not None:
                usage.append((u, k))
        usage.sort()
        r["bytes_per_key"] = (after - before) / p.memory_keys
        r["redis_keys"] = nkeys
        r["redis_keys_per_key"] = nkeys / p.memory_keys
        if usage:
            r["memory_usage"] = usage[len(usage) // 2][0]
            r["sample_key"] = usage[len(usage) // 2][1]
        results["memory"][c.id] = r
    progress_done()


# ---- over TLS --------------------------------------------------------------------------------

# The TLS comparison: each of these contenders over TLS, on a redis-server
# that speaks only TLS, and over plain TCP, on the plain server of the other
# phases, in the same interleaved rounds. Only the workloads where every
# decision is a round trip: on the hot key hirate's deny cache answers most
# decisions without one, which would hide what TLS costs.
TLS_SCENARIOS = [sc for sc in SCENARIOS if sc["keys"] > 1]
TLS_LABELS = {
    "c/hirate": "`hirate_allow`, `tls_ca_file`",
    "py/hirate": "`hirate.Limiter(..., tls_ca_file=...)`, threads",
    "py/redis-py": "redis-py `register_script`, `ssl=True` (a rediss:// URL) with "
                   "`ssl_ca_certs`, threads",
    "go/article": "seed article: go-redis v9 `Script.Run`, `TLSConfig` with the CA in "
                  "`RootCAs`",
}


class TlsRun:
    def __init__(self, c, transport):
        self.c, self.transport = c, transport
        self.id = "%s@%s" % (c.id, transport)

    def to_json(self):
        c = self.c
        return {"id": self.id, "base": c.id, "transport": self.transport, "lang": c.lang,
                "hirate": c.hirate, "short": c.short,
                "label": TLS_LABELS[c.id] if self.transport == "tls" else c.label,
                "status": "missing" if c.reason else "ok", "reason": c.reason}


def make_certs(work):
    """tests/support/make_certs.sh's certificates in a directory of work: its
    path, or RunError."""
    script = ROOT / "tests" / "support" / "make_certs.sh"
    if not script.exists():
        raise RunError("tests/support/make_certs.sh is not in this checkout")
    d = os.path.join(work, "certs")
    try:
        pr = subprocess.run(["sh", str(script), d], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise RunError("make_certs.sh ran for more than 120 s")
    if pr.returncode != 0:
        raise RunError("make_certs.sh: exit %d: %s" % (pr.returncode, pr.stderr.strip()[-200:]))
    return d


def phase_tls(cs, redis, p, results, work):
    runs = [TlsRun(c, t) for cid in TLS_LABELS for c in cs if c.id == cid
            for t in ("tls", "tcp")]
    out = results["tls"]
    out.update(scenarios=TLS_SCENARIOS, runs=[r.to_json() for r in runs], speed={},
               plain_url=redis.url)
    runnable = [r for r in runs if not r.c.reason]
    if not runnable:
        out["reason"] = "none of %s was run" % ", ".join(TLS_LABELS)
        return
    try:
        certs = make_certs(work)
        tls = Redis(work, tls=certs)
    except (RunError, RuntimeError) as e:
        out["reason"] = str(e)
        step("tls: not run: %s" % e)
        return
    try:
        tls.cmd("SCRIPT", "LOAD", (ROOT / "lua" / "token_bucket.lua").read_bytes())
        cipher = tls.sock.cipher()
        out["server"] = {"url": tls.url, "version": tls.info("server").get("redis_version"),
                         "driver_cipher": {"name": cipher[0], "protocol": cipher[1]}
                         if cipher else None,
                         "certificates": "tests/support/make_certs.sh (RSA 2048)",
                         "options": "--port 0 --tls-port %d --tls-auth-clients no" % tls.port}
        ca = os.path.join(certs, "ca.crt")
        step("tls: %d rounds x %d scenarios x %d runs (%d contenders over TLS on %s and over "
             "TCP on %s), %.2g s each" % (p.rounds, len(TLS_SCENARIOS), len(runnable),
                                          len(runnable) // 2, tls.url, redis.url, p.seconds))

        def one(run, sc, rnd):
            if run.transport == "tls":
                return speed_run(run.c, tls, sc, rnd, p, ["--tls-ca-file", ca])
            return speed_run(run.c, redis, sc, rnd, p)

        out["speed"] = interleaved(runnable, TLS_SCENARIOS, p, "tls", one)
    finally:
        tls.close()


# ---- Redis Cluster ---------------------------------------------------------------------------

# The cluster comparison: every decision a round trip (100,000 keys), 8
# concurrent clients, the work split over three masters.
CLUSTER_SCENARIO = {"id": "cold-8", "keys": COLD_KEYS, "concurrency": 8,
                    "label": "100,000 keys, 8 concurrent"}
CLUSTER_SHAPE = {"masters": 3, "replicas": 1}
# A busy 2-core machine running six servers can hold a call past 100 ms; a
# timeout there would measure the scheduler, not the client.
CLUSTER_TIMEOUT_MS = 1000
# redis-benchmark's own default: enough calls in flight to keep every server
# busy, the ceiling.
RB_CLIENTS = 50


def cluster_contenders():
    """(contender, label against one Redis, label against the cluster, batch)."""
    C = Contender
    return [
        (C("c/hirate", "C: hirate_allow", "C", None, "c", "hirate", hirate=True),
         "`hirate_allow`, 8 threads sharing one limiter",
         "`hirate_allow`, 8 threads sharing one limiter (pools per node)", False),
        (C("c/hirate-batch", "C: hirate_allow_many", "C", None, "c", "hirate-batch",
           hirate=True),
         "`hirate_allow_many`, 16 per call, 8 threads",
         "`hirate_allow_many`, 16 per call, 8 threads (each call split by node, the nodes' "
         "parts sent at once)", True),
        # 48 a call: about 16 a master, the depth of redis-benchmark -P 16 on
        # each connection.
        (C("c/hirate-batch48", "C: hirate_allow_many, 48 per call", "C", None, "c",
           "hirate-batch", hirate=True),
         "`hirate_allow_many`, 48 per call, 8 threads",
         "`hirate_allow_many`, 48 per call (about 16 per master), 8 threads", True),
        # As many threads as a node's pool has connections (16 by default):
        # more calls in flight at each master.
        (C("c/hirate-batch48x16", "C: hirate_allow_many, 48 per call, 16 threads", "C", None,
           "c", "hirate-batch", hirate=True),
         None, "`hirate_allow_many`, 48 per call, 16 threads", True),
        (C("py/hirate", "Python: hirate.Limiter", "Python", None, "python", "hirate",
           hirate=True),
         "`hirate.Limiter`, 8 threads", "`hirate.Limiter`, 8 threads", False),
        (C("py/redis-py", "Python: redis-py script", "Python", None, "python", "redis-py"),
         "redis-py `register_script` of hirate's script, 8 threads",
         "redis-py `RedisCluster`, `register_script` of hirate's script, 8 threads", False),
        (C("py/redis-py-pipeline", "Python: redis-py pipeline", "Python", None, "python",
           "redis-py-pipeline"),
         "redis-py pipelines of 16 EVALSHA of hirate's script, 8 threads",
         "redis-py `RedisCluster` pipelines of 16 EVALSHA of hirate's script, 8 threads", True),
        (C("go/article", "Go: seed article", "Go", None, "go", "article"),
         "seed article: go-redis v9 `Client`, `Script.Run` of its own script, 8 goroutines",
         "seed article on go-redis v9 `ClusterClient`, `Script.Run` of its own script, "
         "8 goroutines", False),
        (C("go/article-pipeline", "Go: seed article, pipelined", "Go", None, "go",
           "article-pipeline"),
         "go-redis v9 `Pipelined`, 16 `EvalSha` of the article's script, 8 goroutines",
         "go-redis v9 `ClusterClient.Pipelined`, 16 `EvalSha` of the article's script, "
         "8 goroutines", True),
        (C("c/redis-benchmark", "C: redis-benchmark -P 16", "C", None, "redis-benchmark",
           None, limiter=False),
         "`redis-benchmark -c %d -P 16`, EVALSHA of hirate's script" % RB_CLIENTS,
         "`redis-benchmark --cluster -c %d -P 16`, EVALSHA of hirate's script" % RB_CLIENTS,
         True),
        (C("c/redis-benchmark-nodes", "C: redis-benchmark per node", "C", None,
           "redis-benchmark", None, limiter=False),
         None,
         "the sum of per-node `redis-benchmark -c %d -P 16`, one per master at once, each on "
         "keys of its own slots, EVALSHA of hirate's script" % RB_CLIENTS, True),
    ]


# Threads and decisions per call of the batch clients other than 8 and 16,
# given to the harness ahead of the protocol's options (peer_c takes the
# first of a repeated option).
CLUSTER_BATCH = {"c/hirate-batch48": (8, 48), "c/hirate-batch48x16": (16, 48)}


class ClusterRun:
    def __init__(self, c, target, label, batch):
        self.c, self.target, self.label, self.batch = c, target, label, batch
        self.id = "%s@%s" % (c.id, target)
        self.threads, self.size = CLUSTER_BATCH.get(c.id, (8, 16 if batch else 1))
        self.extra = [] if c.id not in CLUSTER_BATCH else [
            "--concurrency", self.threads, "--batch", self.size]

    def to_json(self):
        c = self.c
        return {"id": self.id, "base": c.id, "target": self.target, "lang": c.lang,
                "hirate": c.hirate, "limiter": c.limiter, "short": c.short,
                "label": self.label, "batch": self.batch, "threads": self.threads,
                "batch_size": self.size,
                "status": "missing" if c.reason else "ok", "reason": c.reason}


def start_cluster():
    """A cluster of CLUSTER_SHAPE from tests/support/redis_cluster.py, or RunError."""
    support = ROOT / "tests" / "support"
    if not (support / "redis_cluster.py").exists():
        raise RunError("tests/support/redis_cluster.py is not in this checkout")
    sys.path.insert(0, str(support))
    try:
        from redis_cluster import RedisCluster
        return RedisCluster(masters=CLUSTER_SHAPE["masters"], replicas=CLUSTER_SHAPE["replicas"],
                            die_with_parent=True)
    except (RuntimeError, TimeoutError, OSError) as e:
        raise RunError("the cluster did not start: %s" % e)


def machine_busy():
    """CPU seconds the whole machine has been busy (every process, /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            v = f.readline().split()[1:]
        return (int(v[0]) + int(v[1]) + int(v[2]) + int(v[5]) + int(v[6]) + int(v[7])) / \
            os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def note_machine(r, busy0, wall):
    busy1 = machine_busy()
    if busy0 is not None and busy1 is not None:
        r["machine_cores"] = (busy1 - busy0) / wall


def info_fields(text):
    return dict(l.split(":", 1) for l in text.splitlines() if ":" in l and not l.startswith("#"))


def cpu_of(info_cpu):
    f = info_fields(info_cpu)
    return float(f["used_cpu_user"]) + float(f["used_cpu_sys"])


def evalsha_stats(info_stats):
    """(calls, usec, rejected, failed) of the script's calls in an INFO
    commandstats text: EVALSHA's (the peers', hirate's with functions off)
    and FCALL's (hirate's by default) together."""
    fields = info_fields(info_stats)
    total = [0, 0, 0, 0]
    for name in ("cmdstat_evalsha", "cmdstat_fcall"):
        f = fields.get(name)
        if not f:
            continue
        kv = dict(x.split("=") for x in f.split(","))
        for i, k in enumerate(("calls", "usec", "rejected_calls", "failed_calls")):
            total[i] += int(kv.get(k, 0))
    return tuple(total)


class ClusterTarget:
    """The cluster's side of one run: emptied, statistics reset, and after
    the run its EVALSHA count and script time (masters) and each node's CPU."""

    def __init__(self, cl):
        self.cl = cl
        # A node redis-cli has not yet made a replica shows as a master
        # without slots for a moment: until every one has its role.
        want = CLUSTER_SHAPE["masters"]
        deadline = time.monotonic() + 20
        while True:
            cl.refresh()
            self.masters = [n for n in cl.nodes if n.role == "master" and n.slots]
            self.replicas = [n for n in cl.nodes if n not in self.masters]
            if (len(self.masters) == want and all(n.role == "replica" for n in self.replicas)) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.url = cl.url

    def before(self):
        for n in self.masters:
            self.cl.command(n, "FLUSHALL", "SYNC", timeout=30)
        self.cl.reset_stats()
        self.cpu0 = {n.port: cpu_of(self.cl.command(n, "INFO", "cpu")) for n in self.cl.nodes}
        self.busy0 = machine_busy()
        self.t0 = time.monotonic()

    def after(self, r):
        wall = time.monotonic() - self.t0
        note_machine(r, self.busy0, wall)
        busy = {n.port: cpu_of(self.cl.command(n, "INFO", "cpu")) - self.cpu0[n.port]
                for n in self.cl.nodes}
        calls = usec = rejected = failed = 0
        per_master = []
        for n in self.masters:
            c, u, rj, f = evalsha_stats(self.cl.command(n, "INFO", "commandstats"))
            calls, usec, rejected, failed = calls + c, usec + u, rejected + rj, failed + f
            per_master.append(c)
        if calls:
            r["server_us_per_call"] = usec / calls
        r["redis_calls"] = calls
        r["redis_calls_per_master"] = per_master
        r["rejected_calls"] = rejected
        r["failed_calls"] = failed
        # Cores' worth of CPU each group used over the run (warm-up and
        # start included: they load the machine too).
        r["masters_cpu_s"] = sum(busy[n.port] for n in self.masters)
        r["masters_cores"] = r["masters_cpu_s"] / wall
        r["replicas_cores"] = sum(busy[n.port] for n in self.replicas) / wall
        r["run_wall_s"] = wall
        return r


class SingleTarget:
    """The one redis-server of the other phases, with the same figures."""

    def __init__(self, redis):
        self.redis = redis
        self.url = redis.url

    def before(self):
        self.redis.fresh()
        self.cpu0 = cpu_of(self.redis.cmd("INFO", "cpu"))
        self.busy0 = machine_busy()
        self.t0 = time.monotonic()

    def after(self, r):
        wall = time.monotonic() - self.t0
        note_machine(r, self.busy0, wall)
        c, u, rj, f = evalsha_stats(self.redis.cmd("INFO", "commandstats"))
        if c:
            r["server_us_per_call"] = u / c
        cpu = cpu_of(self.redis.cmd("INFO", "cpu")) - self.cpu0
        r.update(redis_calls=c, rejected_calls=rj, failed_calls=f, masters_cpu_s=cpu,
                 masters_cores=cpu / wall, replicas_cores=0.0, run_wall_s=wall)
        return r


def rb_csv(p):
    """redis-benchmark --csv's row of the EVALSHA test, as a dict; or RunError.
    (With --cluster the header follows a list of the masters.)"""
    lines = p.stdout.splitlines()
    head = next((l for l in lines if l.startswith('"test"')), None)
    rows = [l for l in lines if l.startswith('"EVALSHA')]
    if p.returncode != 0 or not rows or not head:
        raise RunError("redis-benchmark: exit %d: %s" % (
            p.returncode, (p.stderr.strip() or p.stdout.strip())[-200:]))
    head = [h.strip('"') for h in head.split(",")]
    return dict(zip(head, (v.strip('"') for v in rows[0].split(","))))


# The ceiling's own arguments: every call allowed and writing its bucket
# whichever keys redis-benchmark draws (with --cluster it draws from fewer),
# the work of the contenders' allowed decisions.
RB_CAPACITY, RB_RATE = 1000000000, 1e6


def rb_argv(exe, port, n, key, sha, cluster=False):
    return [exe, "-h", "127.0.0.1", "-p", str(port)] + (["--cluster"] if cluster else []) + \
        ["-c", str(RB_CLIENTS), "-P", "16", "-n", str(n), "-r", str(COLD_KEYS), "--csv",
         "EVALSHA", sha, "1", key, str(RB_CAPACITY), rate_arg(RB_RATE), "1", "1"]


def rb_run(c, what, targets, sha, seconds, calib):
    """redis-benchmark -c RB_CLIENTS -P 16 of hirate's script, as a harness
    run. targets: [(port, key, cluster)], one redis-benchmark each, run at
    once, their requests per second summed: one server; the cluster from one
    seed with --cluster (its clients spread over the masters, each on keys
    of a slot of its master, {tag}); or one plain run per master, each on
    keys of a hash tag of that master's slots. -n is set from the previous
    run's rate so that a run lasts about `seconds`."""
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    share = len(targets)
    n = max(2000, int(calib.get(what, 20000 / seconds) * seconds / share))
    procs = [subprocess.Popen(rb_argv(c.argv[0], port, n, key, sha, cluster),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for port, key, cluster in targets]
    outs = []
    for pr in procs:
        try:
            out, err = pr.communicate(timeout=seconds * 20 + 60)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
                q.wait()
            raise RunError("redis-benchmark ran too long")
        outs.append(subprocess.CompletedProcess(pr.args, pr.returncode, out, err))
    wall = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = [rb_csv(o) for o in outs]
    rps = sum(float(r["rps"]) for r in rows)
    calib[what] = rps
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"decisions": n * share, "allowed": None, "errors": 0,
            # Of several processes, the slowest one's.
            "p50_us": max(float(r["p50_latency_ms"]) for r in rows) * 1e3,
            "p99_us": max(float(r["p99_latency_ms"]) for r in rows) * 1e3,
            "per_node_rps": [float(r["rps"]) for r in rows] if share > 1 else None,
            "cpu_s": cpu, "wall_s": n * share / rps, "process_wall_s": wall, "error": None}


def slot_tags(cl, masters):
    """For each master, a short hash tag whose slot it owns: [(port, tag)]."""
    cands = ["t%d" % i for i in range(200)]
    slots = cl.keyslots(["{%s}" % t for t in cands])
    out = []
    for m in masters:
        tag = next((t for t, sl in zip(cands, slots)
                    if any(lo <= sl <= hi for lo, hi in m.slots)), None)
        if tag is None:
            raise RunError("no hash tag found for the master on port %d (slots %s)"
                           % (m.port, m.slots))
        out.append((m.port, tag))
    return out


def phase_cluster(build, setup, redis, p, results):
    entries = cluster_contenders()
    resolve([e[0] for e in entries], build, setup)
    if p.only:
        only = set(p.only.split(","))
        entries = [e for e in entries if e[0].id in only]
    runs = []
    for c, single, clustered, batch in entries:
        if single:
            runs.append(ClusterRun(c, "redis", single, batch))
        runs.append(ClusterRun(c, "cluster", clustered, batch))
    out = results["cluster"]
    out.update(scenario=CLUSTER_SCENARIO, runs=[r.to_json() for r in runs], speed={},
               shape=CLUSTER_SHAPE, timeout_ms=CLUSTER_TIMEOUT_MS, rb_clients=RB_CLIENTS,
               params={"rounds": p.rounds, "seconds": p.seconds, "warmup": p.warmup,
                       "capacity": CAPACITY, "rate": RATE},
               mode="quick" if p.quick else "full", ncpu=os.cpu_count(),
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               versions=setup.get("versions", {}), single_url=redis.url)
    for c, *_ in entries:
        if c.reason:
            step("cluster: missing: %s (%s)" % (c.id, c.reason))
    runnable = [r for r in runs if not r.c.reason]
    if not runnable:
        out["reason"] = "none of the cluster's contenders can run"
        return
    step("cluster: starting %d masters and %d replicas (tests/support/redis_cluster.py)"
         % (CLUSTER_SHAPE["masters"], CLUSTER_SHAPE["masters"] * CLUSTER_SHAPE["replicas"]))
    try:
        cl = start_cluster()
    except RunError as e:
        out["reason"] = str(e)
        step("cluster: not run: %s" % e)
        return
    try:
        ct = ClusterTarget(cl)
        script = (ROOT / "lua" / "token_bucket.lua").read_bytes()
        for n in cl.nodes:
            if cl.command(n, "SCRIPT", "LOAD", script) != redis.sha:
                raise RunError("SCRIPT LOAD on port %d named another SHA1" % n.port)
        tags = slot_tags(cl, ct.masters)
        version = info_fields(cl.command(ct.masters[0], "INFO", "server")).get("redis_version")
        out["server"] = {"url": cl.url, "version": version,
                         "masters": [{"port": n.port, "slots": n.slots} for n in ct.masters],
                         "replicas": len(ct.replicas), "tags": tags,
                         "options": "--cluster-enabled yes --cluster-node-timeout 1000, "
                                    "created by `redis-cli --cluster create "
                                    "--cluster-replicas 1`"}
        st = SingleTarget(redis)
        calib = {}
        step("cluster: %d rounds x %d runs (%s), %.2g s each, on %s and on %s"
             % (p.rounds, len(runnable), CLUSTER_SCENARIO["label"], p.seconds, cl.url,
                redis.url))

        def one(run, sc, rnd):
            tgt = ct if run.target == "cluster" else st
            c = run.c
            nodes = tags if c.id.endswith("nodes") else None
            if c.runtime == "redis-benchmark":
                if run.target == "redis":
                    what, targets = "redis", [(redis.port, "rl:user:__rand_int__", False)]
                elif c.id.endswith("nodes"):
                    what, targets = "nodes", [(port, "rl:{%s}:user:__rand_int__" % tag, False)
                                              for port, tag in tags]
                else:
                    what, targets = "cluster", [(ct.masters[0].port,
                                                 "rl:{tag}:user:__rand_int__", True)]
                if what not in calib:
                    # Calibration, not kept: -n for about p.seconds.
                    rb_run(c, what, targets, redis.sha, min(p.seconds, 0.2), calib)
                tgt.before()
                r = rb_run(c, what, targets, redis.sha, p.seconds, calib)
            else:
                tgt.before()
                r = harness(c, "speed", run.extra + [
                    "--url", tgt.url, "--keys", sc["keys"], "--concurrency", sc["concurrency"],
                    "--seconds", p.seconds, "--warmup", p.warmup, "--capacity", CAPACITY,
                    "--rate", rate_arg(RATE), "--seed", rnd + 1,
                    "--timeout-ms", CLUSTER_TIMEOUT_MS], timeout=p.seconds + p.warmup + 60)
            return tgt.after(r)

        out["speed"] = interleaved(runnable, [CLUSTER_SCENARIO], p, "cluster", one)
        for rid, by in out["speed"].items():
            raw = [x for x in by[CLUSTER_SCENARIO["id"]]["raw"] if "error_run" not in x]
            for x in raw:
                # The masters' CPU per call they ran, both over the whole
                # run: what a decision costs them, however busy the machine.
                if x.get("redis_calls") and "masters_cpu_s" in x:
                    x["masters_us_per_call"] = x["masters_cpu_s"] / x["redis_calls"] * 1e6
            for k in ("masters_cores", "replicas_cores", "machine_cores", "masters_us_per_call"):
                v = [x[k] for x in raw if k in x]
                if v:
                    by[CLUSTER_SCENARIO["id"]][k] = statistics.median(v)
            for k in ("rejected_calls", "failed_calls"):
                by[CLUSTER_SCENARIO["id"]][k] = sum(x.get(k, 0) for x in raw)
    except (RunError, OSError) as e:
        out["reason"] = str(e)
        step("cluster: stopped: %s" % e)
    finally:
        cl.stop()


# ---- Redis Functions: FCALL against EVALSHA against EVAL -----------------------------------

# bench_functions' ways of making the same decision (its --mode), in the
# order of the page.
FUNCTION_RUNS = [
    ("fcall", "C", False, "hiredis `FCALL` of hirate's function library (`FUNCTION LOAD` first)"),
    ("evalsha", "C", False, "hiredis `EVALSHA` of hirate's script (`SCRIPT LOAD` first)"),
    ("eval", "C", False, "hiredis `EVAL` of hirate's script, its whole text in every call"),
    ("hirate", "C", True, "`hirate_allow` / `hirate_allow_many`, `functions = 1` (FCALL)"),
    ("hirate-evalsha", "C", True,
     "`hirate_allow` / `hirate_allow_many`, `functions = 0` (EVALSHA)"),
]
FUNCTION_SCENARIOS = [
    {"id": "one", "depth": 1, "label": "1 client, one call at a time"},
    {"id": "pipe16", "depth": 16,
     "label": "1 client, 16 calls at once (a hiredis pipeline; `hirate_allow_many` of 16)"},
]
FUNCTION_KEYS = 10_000


class FunctionRun:
    def __init__(self, mode, lang, hirate, label):
        self.id, self.lang, self.hirate, self.label = mode, lang, hirate, label

    def to_json(self):
        return {"id": self.id, "lang": self.lang, "hirate": self.hirate, "label": self.label}


def run_json(argv, timeout):
    """Runs a program that prints one JSON line; that object, or RunError."""
    try:
        pr = subprocess.run([str(a) for a in argv], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise RunError("no answer within %d s" % timeout)
    lines = [l for l in pr.stdout.splitlines() if l.startswith("{")]
    if pr.returncode != 0 or not lines:
        tail = [l for l in pr.stderr.strip().splitlines() if l.strip()][-2:]
        raise RunError("exit %d: %s" % (pr.returncode, " / ".join(tail) or "no output"))
    return json.loads(lines[-1])


def phase_functions(build, redis, p, results):
    # Twice the rounds of half the length: one call at a time, a run's
    # figures swing with how the client and the server happen to be
    # scheduled, and more rounds give the median more to stand on.
    p = argparse.Namespace(**dict(vars(p), rounds=p.rounds * 2, seconds=p.seconds / 2))
    out = results["functions"]
    exe = build / "bench" / "bench_functions"
    runs = [FunctionRun(*r) for r in FUNCTION_RUNS]
    out.update(runs=[r.to_json() for r in runs], scenarios=FUNCTION_SCENARIOS, speed={},
               keys=FUNCTION_KEYS,
               params={"rounds": p.rounds, "seconds": p.seconds, "warmup": p.warmup,
                       "capacity": 1000000000, "rate": 1e6},
               mode="quick" if p.quick else "full", ncpu=os.cpu_count(),
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               server={"url": redis.url, "version": redis.info("server").get("redis_version")})
    if not exe.exists():
        out["reason"] = "%s is not built" % exe
        step("functions: not run: %s" % out["reason"])
        return
    step("functions: %d rounds x %d ways x %d scenarios, %.2g s each, on %s"
         % (p.rounds, len(runs), len(FUNCTION_SCENARIOS), p.seconds, redis.url))

    def one(run, sc, rnd):
        redis.fresh()
        return run_json([exe, "--url", redis.url, "--mode", run.id, "--depth", sc["depth"],
                         "--seconds", p.seconds, "--warmup", p.warmup, "--keys", FUNCTION_KEYS,
                         "--seed", rnd + 1], timeout=p.seconds + p.warmup + 60)

    out["speed"] = interleaved(runs, FUNCTION_SCENARIOS, p, "functions", one)
    for by in out["speed"].values():
        for s in by.values():
            raw = [x for x in s["raw"] if "error_run" not in x]
            # What the server ran over the measured seconds, summed over rounds:
            # which commands each way's decisions were.
            s["commands"] = {k: sum(x["commandstats"][k]["calls"] for x in raw)
                             for k in ("fcall", "evalsha", "eval", "function|load",
                                       "script|load")}
            if raw:
                s["script_bytes"] = raw[0]["script_bytes"]


# ---- two limits on one identity: one decision against one hit per limit -----------------------

# The request of issue 14: one identity limited by two rules at once.
BAND_LIMITS = "10/second; 1000/day"
# Every decision a round trip: 100,000 keys, 1 client and 8 concurrent, the
# scenarios of the TLS comparison (on one hot key hirate's deny cache would
# answer most decisions without Redis).
BAND_SCENARIOS = [sc for sc in SCENARIOS if sc["keys"] > 1]
# (id, lang, hirate, runtime, impl, short, label)
BAND_RUNS = [
    ("c/hirate", "C", True, "c", "hirate", "C: hirate_allow_bands",
     "`hirate_allow_bands`, one limiter of both limits (`limits`), threads sharing it"),
    ("py/hirate", "Python", True, "python", "hirate", "Python: hirate.Limiter",
     "`hirate.Limiter(url, limits=...)`, threads sharing it"),
    ("py/limits-stack", "Python", False, "python", "limits-stack",
     "Python: limits, a hit per limit",
     "Flask-Limiter's way: limits `FixedWindowRateLimiter.hit` per limit, `RedisStorage`, "
     "threads"),
    ("node/rlf-union", "Node", False, "node", "rlf-union",
     "Node: rate-limiter-flexible union",
     "rate-limiter-flexible `RateLimiterUnion` of two `RateLimiterRedis`, one ioredis client, "
     "concurrent promises"),
]
# The commands that start a script; every other command the statistics
# count is either a connection's setup or a command a script ran inside.
SCRIPT_CALLS = ("fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval", "eval_ro")
# Connections' setup and the driver's own: not decisions.
SETUP_COMMANDS = ("info", "config", "flushall", "ping", "script", "function", "client", "hello",
                  "select", "auth", "command", "memory", "dbsize", "randomkey", "readonly",
                  "cluster")


class BandRun:
    def __init__(self, id, lang, hirate, runtime, impl, short, label):
        self.c = Contender(id, short, lang, label, runtime, impl, hirate=hirate)
        self.id, self.lang, self.hirate, self.label = id, lang, hirate, label
        self.short = short

    def to_json(self):
        return {"id": self.id, "lang": self.lang, "hirate": self.hirate, "label": self.label,
                "short": self.short,
                "impl": self.c.impl, "status": "missing" if self.c.reason else "ok",
                "reason": self.c.reason}


def server_counts(redis):
    """The server's counts since the last CONFIG RESETSTAT, in one INFO (the
    driver's one read): calls and µs by command, reads, its CPU seconds."""
    f = info_fields(redis.cmd("INFO", "commandstats", "stats", "cpu"))
    cmds = {}
    for k, v in f.items():
        if k.startswith("cmdstat_"):
            kv = dict(x.split("=") for x in v.split(","))
            cmds[k.removeprefix("cmdstat_")] = {"calls": int(kv["calls"]),
                                                "usec": int(kv["usec"]),
                                                "failed": int(kv.get("failed_calls", 0))}
    return {"commands": cmds, "reads": int(f.get("total_reads_processed", 0)) - 1,
            "cpu_s": float(f["used_cpu_user"]) + float(f["used_cpu_sys"])}


def band_figures(r, before_cpu, counts):
    """Adds to a harness result the server's figures per decision: script
    calls (the round trips), the commands the scripts ran inside, reads."""
    calls = r.get("calls_total")
    cmds = counts["commands"]
    script = {k: v["calls"] for k, v in cmds.items() if k in SCRIPT_CALLS and v["calls"]}
    setup = {k: v["calls"] for k, v in cmds.items()
             if k.split("|")[0] in SETUP_COMMANDS and k not in SCRIPT_CALLS}
    inner = {k: v["calls"] for k, v in cmds.items()
             if k not in script and k not in setup and v["calls"]}
    r.update(commands=script, inner_commands=inner, setup_commands=setup,
             server_reads=counts["reads"], server_cpu_s=counts["cpu_s"] - before_cpu)
    if calls:
        r["calls_per_decision"] = sum(script.values()) / calls
        r["inner_per_decision"] = sum(inner.values()) / calls
        r["reads_per_decision"] = counts["reads"] / calls
        # The script calls' own time (their scripts' commands included).
        r["server_us_per_decision"] = sum(cmds[k]["usec"] for k in script) / calls
    return r


def phase_bands(build, setup, redis, p, results):
    out = results["bands"]
    runs = [BandRun(*r) for r in BAND_RUNS]
    resolve([r.c for r in runs], build, setup)
    for r in runs:
        if r.id == "py/hirate" and not r.c.reason and \
                not setup.get("versions", {}).get("hirate.Limiter(limits)"):
            r.c.reason = "the installed hirate.Limiter takes no limits="
    if p.only:
        only = set(p.only.split(","))
        runs = [r for r in runs if r.id in only]
    out.update(runs=[r.to_json() for r in runs], scenarios=BAND_SCENARIOS, speed={},
               limits=BAND_LIMITS,
               params={"rounds": p.rounds, "seconds": p.seconds, "warmup": p.warmup,
                       "timeout_ms": TIMEOUT_MS},
               mode="quick" if p.quick else "full", ncpu=os.cpu_count(),
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               versions={k: setup.get("versions", {}).get(k)
                         for k in ("Python", "redis", "limits", "Node", "ioredis",
                                   "rate-limiter-flexible", "hirate")},
               server={"url": redis.url, "version": redis.info("server").get("redis_version")})
    for r in runs:
        if r.c.reason:
            step("bands: missing: %s (%s)" % (r.id, r.c.reason))
    runnable = [r for r in runs if not r.c.reason]
    if not runnable:
        out["reason"] = "none of the contenders can run"
        step("bands: not run: %s" % out["reason"])
        return
    step('bands: "%s" on one key, %d rounds x %d scenarios x %d contenders, %.2g s each after '
         "%.2g s of warm-up (%s)" % (BAND_LIMITS, p.rounds, len(BAND_SCENARIOS), len(runnable),
                                     p.seconds, p.warmup, redis.url))

    def one(run, sc, rnd):
        redis.fresh()
        cpu0 = cpu_of(redis.cmd("INFO", "cpu"))
        busy0, t0 = machine_busy(), time.monotonic()
        # CONFIG RESETSTAT again: the driver's INFO is not counted.
        redis.cmd("CONFIG", "RESETSTAT")
        r = harness(run.c, "speed", [
            "--url", redis.url, "--keys", sc["keys"], "--concurrency", sc["concurrency"],
            "--seconds", p.seconds, "--warmup", p.warmup, "--limits", BAND_LIMITS,
            "--seed", rnd + 1, "--timeout-ms", TIMEOUT_MS], timeout=p.seconds + p.warmup + 60)
        wall = time.monotonic() - t0
        note_machine(r, busy0, wall)
        band_figures(r, cpu0, server_counts(redis))
        # Cores' worth of the server's CPU over the harness's whole run.
        r["server_cores"] = r["server_cpu_s"] / wall
        r["run_wall_s"] = wall
        return r

    out["speed"] = interleaved(runnable, BAND_SCENARIOS, p, "bands", one)
    for by in out["speed"].values():
        for s in by.values():
            raw = [x for x in s["raw"] if "error_run" not in x]
            for k in ("calls_per_decision", "inner_per_decision", "reads_per_decision",
                      "server_us_per_decision", "server_cores", "machine_cores"):
                v = [x[k] for x in raw if x.get(k) is not None]
                if v:
                    s[k] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
            # Summed over the rounds: what the server was sent, and ran.
            for k in ("commands", "inner_commands", "setup_commands"):
                tot = {}
                for x in raw:
                    for name, n in x.get(k, {}).items():
                        tot[name] = tot.get(name, 0) + n
                s[k] = tot
            s["calls_total"] = sum(x.get("calls_total", 0) for x in raw)
            cnt = [x["hirate_counters"] for x in raw if x.get("hirate_counters")]
            if cnt:
                s["hirate_counters"] = {k: sum(x[k] for x in cnt) for k in cnt[0]}


# ---- Sentinel: following a failover ----------------------------------------------------------

FAILOVER = {"runs": 3, "interval_ms": 10, "down_after_ms": 1000, "replicas": 1, "sentinels": 3,
            # Each client makes this many decisions on the master before the fault.
            "ready_decisions": 20,
            # How long after the promotion a client may take before it is
            # reported as not back.
            "give_up_s": 30}


def failover_clients(build, setup):
    """[(id, lang, hirate, label, argv or None, reason or None)]."""
    rt = setup.get("runtimes", {})
    py, go = rt.get("python", {}), rt.get("go", {})
    c = build / "bench" / "failover_c"
    out = [("c/hirate", "C", True, "hirate `hirate_allow`, `redis+sentinel://` URL",
            [str(c)] if c.exists() else None, None if c.exists() else "%s is not built" % c),
           ("py/redis-py", "Python", False,
            "redis-py `Sentinel(...).master_for(...)`, `register_script` of hirate's script",
            [py.get("python"), str(ROOT / "bench" / "peers" / "python" / "failover.py")]
            if py.get("ok") else None, None if py.get("ok") else py.get("reason")),
           ("go/go-redis", "Go", False,
            "go-redis `NewFailoverClient`, `NewScript(...).Run` of hirate's script",
            [go["failover"], "--script", str(ROOT / "lua" / "token_bucket.lua")]
            if go.get("ok") and go.get("failover") else None,
            None if go.get("ok") and go.get("failover") else
            go.get("reason") or "the Go failover client was not built")]
    return out


class FailoverClient:
    """One client process and the decisions it reports: [(seq, t_monotonic, ok, what)]."""

    def __init__(self, cid, argv, url, prefix, interval_ms):
        import threading
        self.id, self.prefix = cid, prefix
        self.lines = []
        self.err = []
        self.counters = None
        # Its wall-clock times, read as this process' monotonic clock.
        self.offset = time.time_ns() - time.monotonic_ns()
        self.proc = subprocess.Popen(argv + ["--url", url, "--prefix", prefix, "--interval-ms",
                                             str(interval_ms)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                     start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.ereader = threading.Thread(target=lambda: self.err.extend(self.proc.stderr),
                                        daemon=True)
        self.ereader.start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("# "):
                # A client's own counters, at its end (hirate's).
                self.counters = dict(kv.split("=", 1) for kv in line[2:].split() if "=" in kv)
                continue
            f = line.split()
            if len(f) == 4:
                self.lines.append((int(f[0]), (int(f[1]) - self.offset) / 1e9, f[2] == "1",
                                   f[3]))

    def ok_count(self):
        return sum(1 for l in list(self.lines) if l[2])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.reader.join(timeout=5)
        self.ereader.join(timeout=5)


def keys_on(g, node, keys):
    """For each key, whether node holds it (EXISTS through one redis-cli)."""
    if not keys:
        return []
    pr = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(node.port)],
                        input="".join("EXISTS %s\n" % k for k in keys), capture_output=True,
                        text=True, timeout=60)
    got = pr.stdout.split()
    if len(got) != len(keys):
        raise RunError("EXISTS of %d keys on port %d: %d answers" % (len(keys), node.port,
                                                                     len(got)))
    return [x == "1" for x in got]


def on_new_master(g, new, c, promoted):
    """The first decision of c after the promotion that the new master holds:
    (its time, the decisions of c after the promotion that reached Redis but
    are not on the new master, those made while the client could not reach
    Redis), or None for the first when there is none."""
    after = [l for l in list(c.lines) if l[1] > promoted]
    oks = [l for l in after if l[2]]
    held = keys_on(g, new, ["rl:%s%d" % (c.prefix, l[0]) for l in oks])
    first = next((l for l, h in zip(oks, held) if h), None)
    lost = sum(1 for l, h in zip(oks, held) if not h and (first is None or l[0] < first[0]))
    failed = sum(1 for l in after if not l[2] and (first is None or l[0] < first[0]))
    return (first[1] if first else None), lost, failed


def failover_once(kind, clients, p, rnd):
    """One Sentinel group, every client on it, one fault: the run's figures."""
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from redis_sentinel import ReplyError, SentinelGroup
    F = FAILOVER
    g = SentinelGroup(replicas=F["replicas"], sentinels=F["sentinels"],
                      down_after_ms=F["down_after_ms"], die_with_parent=True)
    procs = []
    try:
        old = g.master
        (replica,) = [n for n in g.replicas]
        procs = [FailoverClient(cid, argv, g.url, "fo:%s:" % cid.split("/")[1], F["interval_ms"])
                 for cid, argv in clients]
        # A client that exits (it cannot run here) is reported with its
        # words; the others go on.
        deadline = time.monotonic() + 20
        while any(c.ok_count() < F["ready_decisions"] and c.proc.poll() is None for c in procs):
            if time.monotonic() > deadline:
                raise RunError("not every client was deciding on the master within 20 s: %s"
                               % ", ".join("%s %d" % (c.id, c.ok_count()) for c in procs))
            time.sleep(0.05)
        gone = {}
        for c in procs:
            if c.proc.poll() is not None:
                c.stop()
                gone[c.id] = "exited (%d) before the fault: %s" % (
                    c.proc.returncode, "".join(c.err[-2:]).strip()[-300:] or "no message")
        procs = [c for c in procs if c.id not in gone]
        if not procs:
            raise RunError("; ".join("%s %s" % kv for kv in gone.items()))
        t_fault = time.monotonic()
        if kind == "kill":
            g.kill(old)
        else:
            g.failover()
        # The promotion: the replica's own ROLE, asked every 10 ms.
        deadline = t_fault + F["give_up_s"]
        while True:
            try:
                if g.command(replica, "ROLE", timeout=1.0)[0] == "master":
                    t_promoted = time.monotonic()
                    break
            except (OSError, ReplyError):
                pass   # it is busy being promoted: ask again
            if time.monotonic() > deadline:
                raise RunError("the replica was not promoted within %d s" % F["give_up_s"])
            time.sleep(0.01)
        new, t_agreed = g.wait_switch(old, timeout=F["give_up_s"])
        if new.port != replica.port:
            raise RunError("the sentinels named port %d, not the promoted replica's %d"
                           % (new.port, replica.port))
        # Until every client's latest decision is on the new master, checked
        # every 200 ms, then half a second more.
        back = {}
        deadline = t_promoted + F["give_up_s"]
        while len(back) < len(procs) and time.monotonic() < deadline:
            time.sleep(0.2)
            for c in procs:
                if c.id in back:
                    continue
                oks = [l for l in list(c.lines) if l[2] and l[1] > t_promoted]
                if oks and keys_on(g, new, ["rl:%s%d" % (c.prefix, oks[-1][0])])[0]:
                    back[c.id] = True
        time.sleep(0.5)
        for c in procs:
            c.stop()
        r = {"kind": kind, "round": rnd + 1, "old_port": old.port, "new_port": new.port,
             "promoted_s": t_promoted - t_fault, "agreed_s": t_agreed - t_fault, "clients": {}}
        for c in procs:
            first, lost, failed = on_new_master(g, new, c, t_promoted)
            e = {"decisions": len(c.lines), "lost": lost, "failed": failed,
                 "counters": {k: int(x) for k, x in (c.counters or {}).items()} or None,
                 "stderr": "".join(c.err[-2:]).strip()[-300:] or None}
            if first is None:
                e["error"] = "no decision on the new master within %d s of the promotion" \
                    % F["give_up_s"]
            else:
                e["from_fault_s"] = first - t_fault
                e["from_promotion_s"] = first - t_promoted
                e["from_switch_s"] = first - t_agreed
            r["clients"][c.id] = e
        for cid, why in gone.items():
            r["clients"][cid] = {"error": why}
        return r
    finally:
        for c in procs:
            c.stop()
        g.stop()


def phase_failover(build, setup, p, results):
    out = results["failover"]
    F = dict(FAILOVER, runs=1 if p.quick else FAILOVER["runs"])
    cl = failover_clients(build, setup)
    v = setup.get("versions", {})
    out.update(params=F, clients=[{"id": i, "lang": l, "hirate": h, "label": lab,
                                   "status": "ok" if a else "missing", "reason": why}
                                  for i, l, h, lab, a, why in cl],
               runs=[], mode="quick" if p.quick else "full", ncpu=os.cpu_count(),
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               versions={k: v.get(k) for k in ("redis", "go-redis", "redis-server")})
    for i, _, _, _, a, why in cl:
        if not a:
            step("failover: missing: %s (%s)" % (i, why))
    clients = [(i, a) for i, _, _, _, a, _ in cl if a]
    if not (ROOT / "tests" / "support" / "redis_sentinel.py").exists():
        out["reason"] = "tests/support/redis_sentinel.py is not in this checkout"
    elif not shutil.which("redis-sentinel"):
        out["reason"] = "redis-sentinel not found (apt-get install redis-sentinel)"
    elif not clients:
        out["reason"] = "none of the failover clients can run"
    if out.get("reason"):
        step("failover: not run: %s" % out["reason"])
        return
    step("failover: %d runs each of kill -9 and SENTINEL FAILOVER, %s side by side"
         % (F["runs"], ", ".join(i for i, _ in clients)))
    for kind in ("kill", "failover"):
        for rnd in range(F["runs"]):
            progress("failover: %s, run %d/%d" % (kind, rnd + 1, F["runs"]))
            try:
                r = failover_once(kind, clients, p, rnd)
            except (RunError, RuntimeError, TimeoutError, OSError) as e:
                r = {"kind": kind, "round": rnd + 1, "error_run": str(e)}
                step("failover: %s run %d failed: %s" % (kind, rnd + 1, e))
            out["runs"].append(r)
    progress_done()
    summary = {}
    for kind in ("kill", "failover"):
        good = [r for r in out["runs"] if r["kind"] == kind and "error_run" not in r]
        s = {"runs": len([r for r in out["runs"] if r["kind"] == kind]), "good": len(good)}
        for k in ("promoted_s", "agreed_s"):
            if good:
                xs = [r[k] for r in good]
                s[k] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
        for cid, _ in clients:
            es = [r["clients"][cid] for r in good if cid in r["clients"]]
            c = {"runs": len(es), "back": sum(1 for e in es if "from_switch_s" in e),
                 "lost": sum(e.get("lost", 0) for e in es),
                 "failed": sum(e.get("failed", 0) for e in es)}
            errs = [e["error"] for e in es if e.get("error")]
            if errs:
                c["error"] = errs[0]
            for k in ("from_fault_s", "from_promotion_s", "from_switch_s"):
                xs = [e[k] for e in es if k in e]
                if xs:
                    c[k] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
            s[cid] = c
        summary[kind] = s
    out["summary"] = summary


# ---- the pieces: the bindings' own benchmarks ----------------------------------------------

def pieces(build, setup, quick):
    """(name, path that must exist, argv, env, why it cannot run or None)."""
    rt = setup.get("runtimes", {})
    py = rt.get("python", {})
    lua = rt.get("lua", {})
    out = []
    for script, args in (("bench/python/bench_sync.py",
                          ["--rounds", "1", "--seconds", "0.2"] if quick else []),
                         ("bench/python/bench_async.py",
                          ["--rounds", "1", "--decisions", "500"] if quick else [])):
        why = None if py.get("ok") else "the bench venv is missing: %s" % py.get("reason")
        out.append((script, script, [py.get("python"), str(ROOT / script)] + args, None, why))
    env = dict(os.environ)
    if quick:
        env.update(BENCH_LUA_ROUNDS="1", BENCH_LUA_SECONDS="0.3")
    why = None if lua.get("ok") else "hirate's Lua module is missing: %s" % lua.get("reason")
    out.append(("bench/lua/run.sh", "bench/lua/run.sh",
                [str(ROOT / "bench/lua/run.sh"), lua.get("dir") or ""], env, why))
    env = dict(os.environ, HIRATE_BENCH_BUILD=lua.get("dir") or "")
    ng = rt.get("nginx", {})
    why = None if ng.get("ok") else ng.get("reason")
    out.append(("bench/nginx/run.sh", "bench/nginx/run.sh",
                [str(ROOT / "bench/nginx/run.sh")] +
                (["--seconds", "1", "--rounds", "1"] if quick else []), env, why))
    return out


def phase_pieces(build, setup, p, results):
    for name, path, argv, env, why in pieces(build, setup, p.quick):
        entry = {"command": " ".join([name] + argv[2 if name.endswith(".py") else 1:])}
        if p.quick and not p.pieces:
            # They take minutes even when short (bench/nginx counts
            # instructions): a quick run would not stay quick.
            entry.update(status="skipped", reason="quick mode; `make bench` runs them, "
                         "or BENCH_PIECES=1 with QUICK=1")
        elif not (ROOT / path).exists():
            entry.update(status="missing", reason="%s is not in this checkout" % path)
        elif why:
            entry.update(status="missing", reason=why)
        else:
            step("piece: %s" % entry["command"])
            t0 = time.monotonic()
            try:
                pr = subprocess.run(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                    capture_output=True, text=True, timeout=900)
                if pr.returncode == 0 and pr.stdout.strip():
                    entry.update(status="ok", markdown=pr.stdout.strip())
                else:
                    lines = [l for l in pr.stderr.strip().splitlines() if l.strip()][-3:]
                    entry.update(status="failed", reason="exit %d: %s" % (
                        pr.returncode, " / ".join(lines) or "no output"))
            except subprocess.TimeoutExpired:
                entry.update(status="failed", reason="ran for more than 900 s")
            entry["seconds"] = round(time.monotonic() - t0, 1)
        if entry["status"] not in ("ok", "skipped"):
            step("piece: %s: %s (%s)" % (name, entry["status"], entry["reason"]))
        results["pieces"][name] = entry


# ---- main ------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="the CMake build with bench/peer_c")
    ap.add_argument("--setup", required=True, help="setup.json from bench/suite/install.py")
    ap.add_argument("--out", required=True, help="the results JSON to write")
    ap.add_argument("--quick", action="store_true", help="one short round: a check, not figures")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--warmup", type=float)
    ap.add_argument("--memory-keys", type=int)
    ap.add_argument("--only", help="contender ids to run, comma-separated (default: all)")
    ap.add_argument("--phases",
                    default="speed,concurrent,atomic,outage,memory,tls,cluster,functions,bands,"
                    "failover,pieces")
    ap.add_argument("--merge", action="store_true",
                    help="write this run's results of the phases run alone (cluster, "
                    "functions, bands, failover) into --out, keeping the rest of it")
    ap.add_argument("--pieces", action="store_true",
                    help="run the bindings' own benchmarks in quick mode too")
    p = ap.parse_args()
    p.rounds = p.rounds or (1 if p.quick else 5)
    p.seconds = p.seconds or (0.25 if p.quick else 1.0)
    p.warmup = p.warmup if p.warmup is not None else (0.1 if p.quick else 0.3)
    p.memory_keys = p.memory_keys or (2000 if p.quick else 10000)
    phases = set(p.phases.split(","))
    build = Path(p.build).resolve()
    setup = json.loads(Path(p.setup).read_text())

    cs = contenders()
    resolve(cs, build, setup)
    if p.only:
        only = set(p.only.split(","))
        unknown = only - {c.id for c in cs} - {e[0].id for e in cluster_contenders()} - \
            {r[0] for r in BAND_RUNS}
        if unknown:
            sys.exit("suite.py: --only: unknown contenders %s" % ", ".join(sorted(unknown)))
        cs = [c for c in cs if c.id in only]
    for c in cs:
        if c.reason:
            step("missing: %s (%s)" % (c.id, c.reason))

    results = {
        "schema": 1,
        "mode": "quick" if p.quick else "full",
        "params": {"rounds": p.rounds, "seconds": p.seconds, "warmup": p.warmup,
                   "capacity": CAPACITY, "rate": RATE, "cold_keys": COLD_KEYS,
                   "concurrency": list(CONCURRENCY), "timeout_ms": TIMEOUT_MS,
                   "atomic": dict(ATOMIC, timeout_ms=ATOMIC_TIMEOUT_MS), "outage": OUTAGE,
                   "memory_keys": p.memory_keys, "memory_rate": MEMORY_RATE,
                   "phases": sorted(phases)},
        "scenarios": SCENARIOS,
        "contenders": [c.to_json() for c in cs],
        "versions": setup.get("versions", {}),
        "runtimes": {k: {"ok": v.get("ok"), "reason": v.get("reason")}
                     for k, v in setup.get("runtimes", {}).items()},
        "speed": {}, "atomic": {}, "outage": {}, "memory": {}, "tls": {}, "cluster": {},
        "functions": {}, "bands": {}, "failover": {}, "pieces": {}, "concurrent": {},
    }
    work = tempfile.mkdtemp(prefix="hirate-suite-")
    redis = None
    try:
        redis = Redis(work)
        script = (ROOT / "lua" / "token_bucket.lua").read_bytes()
        redis.sha = redis.cmd("SCRIPT", "LOAD", script)
        results["redis"] = {"version": redis.info("server").get("redis_version"),
                            "script_sha1": redis.sha}
        if "speed" in phases:
            phase_speed(cs, redis, p, results)
        if "concurrent" in phases:
            phase_concurrent(cs, redis, p, results)
        if "atomic" in phases:
            phase_atomic(cs, redis, p, results)
        if "outage" in phases:
            phase_outage(cs, redis, p, results)
        if "memory" in phases:
            phase_memory(cs, redis, p, results)
        if "tls" in phases:
            phase_tls(cs, redis, p, results, work)
        if "cluster" in phases:
            phase_cluster(build, setup, redis, p, results)
        if "functions" in phases:
            phase_functions(build, redis, p, results)
        if "bands" in phases:
            phase_bands(build, setup, redis, p, results)
    finally:
        if redis:
            redis.close()
        shutil.rmtree(work, ignore_errors=True)
    if "failover" in phases:
        phase_failover(build, setup, p, results)
    if "pieces" in phases:
        phase_pieces(build, setup, p, results)
    Path(p.out).parent.mkdir(parents=True, exist_ok=True)
    if p.merge:
        # Only the results of the phases run change: the page's other
        # sections keep the figures of the run they came from.
        old = json.loads(Path(p.out).read_text()) if Path(p.out).exists() else dict(
            results, cluster={}, functions={}, bands={}, failover={}, scenarios=[],
            contenders=[], speed={}, pieces={})
        for k in ("cluster", "functions", "bands", "failover", "concurrent"):
            if k in phases:
                old[k] = results[k]
        if "concurrent" in phases:
            old["concurrent_scenarios"] = CONCURRENT_SCENARIOS
        results = old
    tmp = Path(str(p.out) + ".tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    tmp.replace(p.out)
    step("peers: results in %s" % p.out)


if __name__ == "__main__":
    main()
