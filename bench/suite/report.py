#!/usr/bin/env python3
"""Writes docs/benchmarks.md and the charts from one results file, so that
the figures in the text and in the charts are the same figures.

    report.py --results docs/benchmarks.json --out docs/benchmarks.md --img docs/img \\
        [--c-dir DIR] [--facts FILE]

bench/run.sh calls it at the end of a run with --c-dir (the C benchmarks'
sections, targets and summary, as bench/run.sh wrote them) and --facts (the
machine, the command, the date): those are merged into the results file
first, which is then rewritten; everything below reads only that file. Run
without them, it renders the results file as it is.
"""

import argparse
import json
import math
import os
import sys
from pathlib import Path

LANG_ORDER = ["C", "Go", "Node", "Python", "OpenResty"]
# Chart colours: hirate in one strong colour, the others muted by language.
HIRATE_COLOUR = "#d9480f"
LANG_COLOUR = {"C": "#5c7cfa", "Go": "#20c997", "Node": "#82c91e", "Python": "#fab005",
               "OpenResty": "#be4bdb"}
# What is not a limiter (redis-benchmark, nginx without a limit): a reference.
REFERENCE_COLOUR = "#ced4da"


# ---- merging a run's pieces into the results file ------------------------------------------

def read_facts(path):
    facts = {}
    for line in Path(path).read_text().splitlines():
        if "\t" in line:
            k, v = line.split("\t", 1)
            facts[k] = v
    return facts


def read_c(d):
    d = Path(d)
    out = {}
    for name, key in (("sections.md", "sections_md"), ("targets.md", "targets_md")):
        p = d / name
        if p.exists():
            out[key] = p.read_text().strip()
    p = d / "summary.txt"
    if p.exists():
        summary = {}
        for line in p.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                try:
                    summary[parts[0]] = float(parts[1])
                except ValueError:
                    summary[parts[0]] = parts[1]
        out["summary"] = summary
    p = d / "skipped"
    if p.exists():
        out["skipped"] = p.read_text().strip()
    return out


# ---- number formats ----------------------------------------------------------------------------

def plural(n, word):
    return "%s %s%s" % (grp(n), word, "" if n == 1 else "s")


def grp(x):
    return "{:,.0f}".format(x)


def rate_s(x):
    if x >= 1e6:
        return "%.2f M" % (x / 1e6)
    return grp(x)


def us_s(x):
    if x is None:
        return "–"
    if x < 10:
        return "%.2f" % x
    if x < 100:
        return "%.1f" % x
    return grp(x)


def med(s, key):
    v = s.get(key)
    return v["median"] if v else None


def spread(s, key, f):
    v = s.get(key)
    if not v:
        return ""
    if f(v["min"]) == f(v["max"]):
        return f(v["min"])
    return "%s–%s" % (f(v["min"]), f(v["max"]))


def demote(md, top):
    """md with its headings moved so that the highest is at level top (they
    sit below a heading of this page)."""
    levels = [len(l) - len(l.lstrip("#")) for l in md.splitlines()
              if l.startswith("#") and l.lstrip("#").startswith(" ")]
    if not levels:
        return md
    shift = top - min(levels)
    out = []
    for l in md.splitlines():
        n = len(l) - len(l.lstrip("#"))
        if n and l[n:].startswith(" "):
            l = "#" * min(6, max(1, n + shift)) + l[n:]
        out.append(l)
    return "\n".join(out)


# ---- the Markdown ------------------------------------------------------------------------------

class Doc:
    def __init__(self, res):
        self.res = res
        self.lines = []
        self.cs = {c["id"]: c for c in res["contenders"]}
        self.ordered = sorted(res["contenders"], key=lambda c: LANG_ORDER.index(c["lang"]))

    def w(self, text=""):
        self.lines.append(text)

    def label(self, c, bold_hirate=True):
        if c["hirate"] and bold_hirate:
            return "**%s**" % c["label"]
        return c["label"]

    def missing(self, c):
        return "missing (%s)" % c["reason"]

    # -- header

    def header(self):
        r, f = self.res, self.res.get("facts", {})
        v = {k[2:]: x for k, x in f.items() if k.startswith("v.")}
        v.update({k: x for k, x in r.get("versions", {}).items() if x})
        self.w("# Benchmarks")
        self.w()
        self.w("Written by `bench/run.sh` (`make bench`) from one run's results, "
               "`%s`; the text and the charts are drawn from that one file, and nothing here is "
               "typed by hand. Rerun `make bench` to refresh this page (`make bench QUICK=1` is "
               "a short check that writes to `bench/out/quick/` instead)."
               % f.get("results_path", "docs/benchmarks.json"))
        self.w()
        if r.get("mode") == "quick":
            self.w("**Quick mode: one short round. These figures show that the suite works; "
                   "they are not measurements to quote.**")
            self.w()
        self.w("- Command: `%s`%s" % (f.get("command", "?"), f.get("build_note", "")))
        secs = float(f.get("seconds", "nan"))
        took = ("%.0f minutes" % (secs / 60) if secs >= 90 else "%.0f seconds" % secs) \
            if secs == secs else "?"
        self.w("- Date: %s; hirate %s, commit %s; %s mode, %s"
               % (f.get("date", "?"), f.get("hirate", "?"), f.get("commit", "?"),
                  r.get("mode"), took))
        self.w("- Machine: %s, %s CPU cores, %s, %s, %s, clock source %s"
               % (f.get("cpu", "?"), f.get("ncpu", "?"), f.get("mem", "?"), f.get("kernel", "?"),
                  f.get("virt", "?"), f.get("clocksource", "?")))
        self.w("- Load average (1, 5, 15 min) before: %s; after: %s. %s"
               % (f.get("load_before", "?"), f.get("load_after", "?"), f.get("busy_note", "")))

        def ver(name, key=None, rt=None):
            x = v.get(key or name)
            if x:
                return "%s %s" % (name, x)
            if rt and not r.get("runtimes"):
                return "%s: not set up in this run" % name
            why = (r.get("runtimes", {}).get(rt) or {}).get("reason") if rt else None
            return "%s: missing%s" % (name, " (%s)" % why if why else "")

        parts = [ver("redis-server"), ver("hiredis"), ver("gcc"), ver("valgrind"),
                 ver("Python", rt="python"), ver("redis-py", "redis", "python"),
                 ver("limits", rt="python"), ver("matplotlib", rt="python"),
                 ver("Go", rt="go"), ver("go-redis", rt="go"), ver("redis_rate", rt="go"),
                 ver("Node", rt="node"), ver("ioredis", rt="node"),
                 ver("rate-limiter-flexible", rt="node"), ver("nginx", rt="nginx"),
                 ver("lua-nginx-module", rt="nginx"), ver("LuaJIT", rt="lua"),
                 ver("Lua", rt="lua"), ver("wrk", rt="nginx")]
        self.w("- Software: " + ", ".join(parts))
        self.w()

    # -- the comparison

    def method(self):
        r = self.res
        p = r["params"]
        self.w("## hirate next to its peers")
        self.w()
        self.w("Every contender does the same work against the same redis-server (started "
               "for the run, on loopback): a token bucket of capacity %d refilled at %g per "
               "second, cost 1 per decision, on **one hot key** (mostly refused once the "
               "burst is spent) and on **%s keys drawn uniformly** (almost every decision "
               "allowed, and a fresh key), from **one client** and from **8 concurrent** ones "
               "(threads, goroutines, asyncio tasks, promises or HTTP connections: what is "
               "idiomatic for each). %s: each round runs every contender "
               "once per workload, in an order reversed every other round, %.2g s measured "
               "after %.2g s of warm-up, on an emptied server; each figure is the median over "
               "rounds, the spread is min–max. Client CPU is the process's own CPU time "
               "(getrusage, `time.process_time`, `process.cpuUsage`, Go's "
               "`syscall.Getrusage`; for OpenResty the nginx processes') over the measured "
               "seconds, divided by the decisions made in them; server µs per call is "
               "`INFO commandstats` (the script's own time in Redis). Latency is each "
               "library call's wall time (for `hirate_allow_many` the call that carries 16 "
               "decisions, for redis-benchmark its pipelined request, for OpenResty the whole "
               "HTTP request as wrk sees it)."
               % (p["capacity"], p["rate"], grp(p["cold_keys"]),
                  plural(p["rounds"], "interleaved round"), p["seconds"], p["warmup"]))
        self.w()
        self.w("The window limiters get the same long-run rate and burst: rate-limiter-"
               "flexible %d points per %d s, limits %d per %d s, redis_rate "
               "`Limit{Rate: %d, Burst: %d, Period: %d s}`. Every client has a %d ms command "
               "timeout and a 250 ms connect timeout where its library has one. The harnesses "
               "and their protocol are in `bench/peers/` (README there)."
               % (p["capacity"], p["capacity"] / p["rate"], p["capacity"],
                  p["capacity"] / p["rate"], p["capacity"], p["capacity"],
                  p["capacity"] / p["rate"], p["timeout_ms"]))
        self.w()
        self.w("hirate answers the hot key's refusals from its deny cache, without a round "
               "trip (exactly: it refuses only what Redis would refuse); "
               "`hirate_allow, deny cache off` shows the same client when every decision goes "
               "to Redis.")
        self.w()
        for name, alt in (("bench-throughput.png", "Decisions per second"),
                          ("bench-cpu.png", "Client CPU per decision"),
                          ("bench-latency.png", "Latency, p50 and p99"),
                          ("bench-outage.png", "While Redis is stopped"),
                          ("bench-memory.png", "Redis memory per key")):
            if name in self.res.get("charts", {}).get("files", []):
                self.w("![%s](img/%s)" % (alt, name))
                self.w()
        if self.res.get("charts", {}).get("reason"):
            self.w("Charts: not drawn (%s)." % self.res["charts"]["reason"])
            self.w()

    def speed_tables(self):
        r = self.res
        self.w("### Decisions per second, latency and client CPU")
        self.w()
        for sc in r["scenarios"]:
            self.w("#### %s" % sc["label"])
            self.w()
            self.w("| | contender | decisions/s | spread | p50 µs | p99 µs | client CPU µs "
                   "per decision | server µs per call |")
            self.w("|---|---|---:|---:|---:|---:|---:|---:|")
            for c in self.ordered:
                if "speed" not in c["phases"]:
                    continue
                if c["status"] != "ok":
                    self.w("| %s | %s | %s | | | | | |" % (c["lang"], self.label(c),
                                                           self.missing(c)))
                    continue
                s = r["speed"].get(c["id"], {}).get(sc["id"])
                if not s or "rate" not in s:
                    why = (s or {}).get("failures", ["not run"])[0]
                    self.w("| %s | %s | failed (%s) | | | | | |" % (c["lang"], self.label(c), why))
                    continue
                rate = rate_s(med(s, "rate"))
                if c["hirate"]:
                    rate = "**%s**" % rate
                errs = ""
                if s.get("errors"):
                    errs = " (%s errors: %s)" % (grp(s["errors"]), s.get("error"))
                self.w("| %s | %s | %s%s | %s | %s | %s | %s | %s |" % (
                    c["lang"], self.label(c), rate, errs, spread(s, "rate", rate_s),
                    us_s(med(s, "p50_us")), us_s(med(s, "p99_us")), us_s(med(s, "cpu_us")),
                    us_s(med(s, "server_us_per_call"))))
            self.w()
        notes = [c for c in self.ordered if c.get("note") and c["status"] == "ok"]
        if notes:
            self.w("Notes: " + "; ".join("%s: %s" % (c["label"], c["note"]) for c in notes) + ".")
            self.w()

    def beyond(self):
        r = self.res
        p = r["params"]
        a, o = p["atomic"], p["outage"]
        self.w("### Beyond speed: the concurrency test, a stopped Redis, memory per key")
        self.w()
        self.w("- **Concurrency test**: %d requests released together (threads, goroutines, "
               "tasks, promises or HTTP connections) on one fresh key, capacity %d, rate %g/s "
               "(nothing refills): it holds when exactly %d are admitted and none fails "
               "(timeouts %d ms here, so that a burst of new connections is not taken for a "
               "failure)." % (a["requests"], a["capacity"], a["rate"], a["capacity"],
                              a["timeout_ms"]))
        self.w("- **Redis stopped** (`SIGSTOP`: connections stay open, nothing answers): every "
               "harness connects and decides once, then the server is stopped and each makes "
               "%d decisions in a row on a fresh key of capacity %d; latency is each "
               "decision's (the first, which meets the outage, apart). \"limits\" means "
               "exactly %d admitted and none failed. OpenResty's figures are whole HTTP "
               "requests from a Python client: the unlimited location's show what that costs."
               % (o["calls"], o["capacity"], o["capacity"]))
        self.w("- **Memory**: one decision on each of %s keys (capacity %d, rate %g/s, so that "
               "no key expires before it is counted), on an emptied server: `used_memory` "
               "growth per key, Redis keys per limited key, and `MEMORY USAGE` of a key "
               "written (the median of 20 random ones)."
               % (grp(p["memory_keys"]), p["capacity"], p["memory_rate"]))
        self.w()
        self.w("| | contender | concurrency test: admitted of %d | Redis stopped: first "
               "decision µs | then µs per decision (median) | admitted of %d | what it does "
               "| bytes per key (`used_memory`) | `MEMORY USAGE` | keys |"
               % (a["requests"], o["calls"]))
        self.w("|---|---|---|---:|---:|---:|---|---:|---:|---:|")
        for c in self.ordered:
            phases = set(c["phases"]) - {"speed"}
            if not phases:
                continue
            if c["status"] != "ok":
                self.w("| %s | %s | %s | | | | | | | |" % (c["lang"], self.label(c),
                                                          self.missing(c)))
                continue
            cells = []
            at = r["atomic"].get(c["id"])
            if "atomic" not in phases:
                cells.append("–")
            elif not at or "error_run" in at:
                cells.append("failed (%s)" % (at or {}).get("error_run", "not run"))
            else:
                t = "%d%s" % (at["admitted"], " ✓" if at["holds"] else " ✗")
                if at["errors"]:
                    t += " (%d failed: %s)" % (at["errors"], at["error"])
                cells.append(t)
            ou = r["outage"].get(c["id"])
            if "outage" not in phases:
                cells += ["–"] * 4
            elif not ou or "error_run" in ou:
                cells += ["failed (%s)" % (ou or {}).get("error_run", "not run"), "", "", ""]
            else:
                what = {"limits": "still limits", "error": "every call fails",
                        "allowed all": "allows everything", "refused all": "refuses everything",
                        "no limit": "no limit", "mixed": "mixed"}[ou["verdict"]]
                if ou["verdict"] == "error" and ou.get("error"):
                    what += " (`%s`)" % ou["error"].replace("|", "/")[:80]
                if c["hirate"] and ou.get("sources"):
                    what += " (%s)" % ", ".join("%s %d" % kv for kv in sorted(ou["sources"].items()))
                cells += [us_s(ou["first_us"]), us_s(ou["after_first_median_us"]),
                          "%d" % ou["admitted"] if c["limiter"] else "–", what]
            me = r["memory"].get(c["id"])
            if "memory" not in phases:
                cells += ["–"] * 3
            elif not me or "error_run" in me:
                cells += ["failed (%s)" % (me or {}).get("error_run", "not run"), "", ""]
            else:
                cells += ["%.0f" % me["bytes_per_key"],
                          "%s" % me.get("memory_usage", "–"),
                          "%.2g" % me["redis_keys_per_key"]]
            self.w("| %s | %s | %s |" % (c["lang"], self.label(c), " | ".join(cells)))
        self.w()
        keys = {cid: m.get("sample_key") for cid, m in r["memory"].items() if m.get("sample_key")}
        if keys:
            self.w("Keys as each library writes them: " + ", ".join(
                "%s `%s`" % (self.cs[cid]["short"].split(": ", 1)[-1], k)
                for cid, k in keys.items() if cid in self.cs) + ".")
            self.w()

    def section(self, key, title, present="runs"):
        """The results of phase `key` under its heading, or None when it has
        none, or was not run (which the page then says)."""
        t = self.res.get(key) or {}
        if not t.get(present):
            return None
        self.w("## " + title)
        self.w()
        if t.get("reason"):
            self.w("Not run in this run: %s." % t["reason"])
            self.w()
            return None
        return t

    def tls(self):
        t = self.section("tls", "Over TLS")
        if t is None:
            return
        p = self.res["params"]
        srv = t.get("server", {})
        cipher = srv.get("driver_cipher") or {}
        self.w("The same work (capacity %d, %g per second, cost 1) on the workloads where every "
               "decision is a round trip, %s keys drawn uniformly, from one client and from 8 "
               "concurrent (on the hot key hirate's deny cache answers most decisions without "
               "one, which would hide what TLS costs). Each contender runs over **TLS**, "
               "against a second redis-server %s that speaks only TLS (`redis-server %s`, "
               "certificates from %s, the chain and the name `localhost` verified by every "
               "client against the test CA), and over plain **TCP** against the plain "
               "redis-server of the sections above, in the same %s (%.2g s measured after "
               "%.2g s of warm-up, each server emptied before every run). The driver's own "
               "connection negotiated %s. hirate and redis-py use OpenSSL (hirate the "
               "system's libssl, redis-py Python's `ssl`); go-redis uses Go's `crypto/tls`. "
               "The ratio columns are TLS over TCP for the same contender: what TLS costs it "
               "per decision."
               % (p["capacity"], p["rate"], grp(p["cold_keys"]), srv.get("version", ""),
                  srv.get("options", "--tls-port P"), srv.get("certificates", "?"),
                  plural(p["rounds"], "interleaved round"), p["seconds"], p["warmup"],
                  "%s, %s" % (cipher.get("protocol"), cipher.get("name")) if cipher
                  else "an unknown cipher"))
        self.w()
        if "bench-tls.png" in self.res.get("charts", {}).get("files", []):
            self.w("![Over TLS and over TCP](img/bench-tls.png)")
            self.w()
        runs = t["runs"]
        for sc in t["scenarios"]:
            self.w("#### %s" % sc["label"])
            self.w()
            self.w("| | contender | over | decisions/s | spread | p50 µs | p99 µs | client CPU "
                   "µs per decision | server µs per call | TLS/TCP decisions/s | TLS/TCP CPU "
                   "per decision |")
            self.w("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
            for r in runs:
                name = "**%s**" % r["label"] if r["hirate"] else r["label"]
                over = "TLS" if r["transport"] == "tls" else "TCP"
                if r["status"] != "ok":
                    self.w("| %s | %s | %s | missing (%s) | | | | | | | |"
                           % (r["lang"], name, over, r["reason"]))
                    continue
                s = t["speed"].get(r["id"], {}).get(sc["id"])
                if not s or "rate" not in s:
                    why = (s or {}).get("failures", ["not run"])[0]
                    self.w("| %s | %s | %s | failed (%s) | | | | | | | |"
                           % (r["lang"], name, over, why.replace("|", "/")))
                    continue
                rate = rate_s(med(s, "rate"))
                if r["hirate"]:
                    rate = "**%s**" % rate
                errs = ""
                if s.get("errors"):
                    errs = " (%s errors: %s)" % (grp(s["errors"]), s.get("error"))
                ratio_r = ratio_c = ""
                if r["transport"] == "tls":
                    plain = t["speed"].get(r["base"] + "@tcp", {}).get(sc["id"]) or {}
                    if med(plain, "rate"):
                        ratio_r = "%.2f" % (med(s, "rate") / med(plain, "rate"))
                    if med(plain, "cpu_us"):
                        ratio_c = "%.2f" % (med(s, "cpu_us") / med(plain, "cpu_us"))
                self.w("| %s | %s | %s | %s%s | %s | %s | %s | %s | %s | %s | %s |" % (
                    r["lang"], name, over, rate, errs, spread(s, "rate", rate_s),
                    us_s(med(s, "p50_us")), us_s(med(s, "p99_us")), us_s(med(s, "cpu_us")),
                    us_s(med(s, "server_us_per_call")), ratio_r, ratio_c))
            self.w()
        summary = self.res.get("c_benchmarks", {}).get("summary", {})
        plain, tls = summary.get("calls_ir_hirate"), summary.get("calls_ir_hirate_tls")
        if plain and tls:
            self.w("Client instructions per `hirate_allow` under callgrind (`bench_calls`, "
                   "below): %s over TCP, %s over TLS (%s more: encrypting the call and "
                   "decrypting the reply, and the TLS record layer, in libssl and libcrypto)."
                   % (grp(plain), grp(tls), grp(tls - plain)))
            self.w()

    def cluster(self):
        t = self.section("cluster", "Redis Cluster")
        if t is None:
            return
        p, srv, shape = t["params"], t.get("server", {}), t["shape"]
        f = t.get("facts")
        if f:
            self.w("Measured in a run of its own, after the rest of this page: `%s` on %s, "
                   "commit %s, %s mode; load average before %s, after %s. %s"
                   % (f.get("command", "?"), f.get("date", "?"), f.get("commit", "?"),
                      t.get("mode", "?"), f.get("load_before", "?"), f.get("load_after", "?"),
                      f.get("busy_note", "")))
            self.w()
        ncpu = t.get("ncpu") or "?"
        nodes = shape["masters"] * (1 + shape["replicas"])
        self.w("**This machine has %s CPU cores, and during every cluster run it runs %d "
               "redis-servers (%d masters, and %d replicas that apply every write their master "
               "sends them) plus the client being measured, all on those %s cores.** A real "
               "cluster gives each master a machine of its own; here the servers and the "
               "client take CPU from one another, and the columns *masters' CPU* and "
               "*replicas' CPU* show how much each group got (cores' worth over the run)."
               % (ncpu, nodes, shape["masters"], shape["masters"] * shape["replicas"], ncpu))
        self.w()
        v = t.get("versions", {})
        self.w("The cluster: %d masters with %d replica each, redis-server %s (`%s`), started "
               "for the run on loopback by `tests/support/redis_cluster.py`, the slots split "
               "evenly (%s). Every contender runs against it with the cluster's URL "
               "(hirate: `%s`, its hosts the seeds; redis-py: `RedisCluster` with the same "
               "seeds; go-redis: `ClusterClient` with them as `Addrs`) and against the one "
               "redis-server of the sections above, in the same %s (%.2g s measured after "
               "%.2g s of warm-up, the masters emptied and their statistics reset before "
               "every run). The work: capacity %d, %g per second, cost 1, on %s keys drawn "
               "uniformly, 8 concurrent (threads or goroutines) each calling back to back, "
               "a %d ms command timeout for every client (six servers on %s cores can hold a "
               "call past 100 ms). The batch clients send 16 decisions per call: "
               "`hirate_allow_many` (split by node inside the core and sent to the nodes at "
               "once), redis-py's pipeline (`transaction=False`, which `RedisCluster` groups "
               "by node) and go-redis' `Pipelined` (which `ClusterClient` splits by node and "
               "runs at once); their latency is the call's, 16 decisions. hirate and redis-py "
               "run hirate's script; go-redis runs the seed article's own script, as the "
               "article has it (the same reads and writes: `TIME`, `HMGET`, `HSET`, "
               "`PEXPIRE`). Versions: redis-py %s, go-redis %s."
               % (shape["masters"], shape["replicas"], srv.get("version", "?"),
                  srv.get("options", "?"),
                  ", ".join("%s" % ",".join("%d-%d" % tuple(r) for r in m["slots"])
                            for m in srv.get("masters", [])),
                  "redis+cluster://127.0.0.1:P1,...", plural(p["rounds"], "interleaved round"),
                  p["seconds"], p["warmup"], p["capacity"], p["rate"],
                  grp(t["scenario"]["keys"]), t["timeout_ms"], ncpu, v.get("redis", "?"),
                  v.get("go-redis", "?")))
        self.w()
        self.w("The ceiling of the servers themselves, the same EVALSHA of hirate's script: "
               "`redis-benchmark -c %d -P 16` on the one server; on the cluster "
               "`redis-benchmark --cluster -c %d -P 16` from one seed (its clients spread "
               "over the masters, each on keys of a slot of its master through `{tag}`), and "
               "the sum of %d plain `redis-benchmark -c %d -P 16` run at once, one per master, "
               "each on keys of a hash tag of that master's slots (`rl:{tag}:user:` + 12 "
               "digits, tags %s). They run with capacity 1e9 and rate 1e6/s, so that every "
               "call is allowed and writes its bucket whichever keys they draw: the work of "
               "the contenders' allowed decisions. Their p50 and p99 are those of a pipelined "
               "request (of several processes, the slowest's)."
               % (t["rb_clients"], t["rb_clients"], shape["masters"], t["rb_clients"],
                  ", ".join("`%s`" % tag for _, tag in srv.get("tags", []))))
        self.w()
        self.w("#### %s" % t["scenario"]["label"])
        self.w()
        self.w("| | contender | against | decisions/s | spread | p50 µs | p99 µs | client CPU "
               "µs per decision | server µs per call | masters' CPU µs per call | masters' CPU, "
               "cores | replicas' CPU, cores | cluster / one Redis |")
        self.w("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        sc = t["scenario"]["id"]
        for r in t["runs"]:
            name = "**%s**" % r["label"] if r["hirate"] else r["label"]
            where = "cluster" if r["target"] == "cluster" else "one Redis"
            if r["status"] != "ok":
                self.w("| %s | %s | %s | missing (%s) | | | | | | | | | |"
                       % (r["lang"], name, where, r["reason"]))
                continue
            s = t["speed"].get(r["id"], {}).get(sc)
            if not s or "rate" not in s:
                why = (s or {}).get("failures", ["not run"])[0]
                self.w("| %s | %s | %s | failed (%s) | | | | | | | | | |"
                       % (r["lang"], name, where, why.replace("|", "/")))
                continue
            rate = rate_s(med(s, "rate"))
            if r["hirate"]:
                rate = "**%s**" % rate
            errs = ""
            if s.get("errors"):
                errs = " (%s errors: %s)" % (grp(s["errors"]), s.get("error"))
            ratio = ""
            if r["target"] == "cluster":
                one = t["speed"].get(r["base"] + "@redis", {}).get(sc) or {}
                if med(one, "rate"):
                    ratio = "%.2f" % (med(s, "rate") / med(one, "rate"))
            cpu = "" if not r["limiter"] else us_s(med(s, "cpu_us"))
            self.w("| %s | %s | %s | %s%s | %s | %s | %s | %s | %s | %s | %.2f | %s | %s |" % (
                r["lang"], name, where, rate, errs, spread(s, "rate", rate_s),
                us_s(med(s, "p50_us")), us_s(med(s, "p99_us")), cpu,
                us_s(med(s, "server_us_per_call")), us_s(s.get("masters_us_per_call")),
                s.get("masters_cores", 0),
                "%.2f" % s["replicas_cores"] if r["target"] == "cluster" else "–", ratio))
        self.w()
        moved = [(r["label"], t["speed"][r["id"]][sc].get("rejected_calls"))
                 for r in t["runs"] if r["target"] == "cluster" and r["id"] in t["speed"]
                 and t["speed"][r["id"]][sc].get("rejected_calls")]
        self.w("Client CPU is the harness process's own CPU time over the measured seconds "
               "per decision (for redis-benchmark: not a limiter, left out). Server µs per "
               "call is EVALSHA's `usec_per_call` over all masters (the script's own time); "
               "masters' CPU µs per call is all the masters' CPU time (`used_cpu_user + "
               "used_cpu_sys`, `INFO cpu`) over the EVALSHA calls they ran, both over the "
               "whole run: what a decision costs them, reading and replying and feeding the "
               "replicas included, however busy the machine; the cores columns are each "
               "group's CPU time over the run, warm-up and start included. %s"
               % ("Calls the masters answered with a redirection (`rejected_calls` of "
                  "EVALSHA, summed over rounds, warm-up included: the clients' first calls, "
                  "before they had the slot map): %s." % "; ".join(
                      "%s %s" % (lab, grp(n)) for lab, n in moved) if moved else
                  "No call was answered with a redirection (`rejected_calls` of EVALSHA: 0)."))
        self.w()
        for line in cluster_machine_lines(self.res):
            self.w(line)
        self.w()

    def phase_facts(self, t):
        """The line that says a section was measured in a run of its own."""
        f = t.get("facts")
        if f:
            self.w("Measured in a run of its own: `%s` on %s, commit %s, %s mode; machine: "
                   "%s, %s CPU cores, %s, %s; load average before %s, after %s. %s"
                   % (f.get("command", "?"), f.get("date", "?"), f.get("commit", "?"),
                      t.get("mode", "?"), f.get("cpu", "?"), f.get("ncpu", "?"),
                      f.get("mem", "?"), f.get("virt", "?"), f.get("load_before", "?"),
                      f.get("load_after", "?"), f.get("busy_note", "")))
            self.w()

    def functions(self):
        t = self.section("functions", "Redis Functions: FCALL, EVALSHA and EVAL")
        if t is None:
            return
        self.phase_facts(t)
        p, srv = t["params"], t.get("server", {})
        size = next((s.get("script_bytes") for by in t["speed"].values() for s in by.values()
                     if s.get("script_bytes")), None)
        self.w("The same token-bucket decision made five ways against the same redis-server "
               "%s (`%s`, no persistence), in the same %s (%.2g s measured after %.2g s of "
               "warm-up, the server emptied before every run, its statistics reset with "
               "`CONFIG RESETSTAT` after the warm-up): `bench/bench_functions.c`, one process "
               "per run. Every call is allowed and writes its bucket (capacity %s, rate %s/s, "
               "cost 1) on %s keys drawn uniformly. The raw ways are hiredis against hirate's "
               "own Lua: `FCALL` of `hirate_function_library()` (loaded with `FUNCTION LOAD`), "
               "`EVALSHA` of `hirate_script_source()` (loaded with `SCRIPT LOAD`), and `EVAL` "
               "sending the whole script (%s bytes) with every call; then `hirate_allow` (and "
               "`hirate_allow_many` for 16 at once) with `functions = 1` and `functions = 0`. "
               "Server µs per call is `usec_per_call` of `cmdstat_fcall`, `cmdstat_evalsha` or "
               "`cmdstat_eval` of `INFO commandstats` over the measured seconds (the median "
               "over rounds): the time Redis spent in the command itself, the script's run "
               "included, without reading the request or writing the reply."
               % (srv.get("version", "?"), srv.get("url", "?").rsplit(":", 1)[0] + ":P",
                  plural(p["rounds"], "interleaved round"), p["seconds"], p["warmup"],
                  grp(p["capacity"]), grp(p["rate"]), grp(t["keys"]),
                  grp(size) if size else "?"))
        self.w()
        for sc in t["scenarios"]:
            self.w("#### %s" % sc["label"])
            self.w()
            self.w("| | way | decisions/s | spread | p50 µs | p99 µs | client CPU µs per "
                   "decision | server µs per call | vs FCALL (server µs) | commands the "
                   "server ran |")
            self.w("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
            base = (t["speed"].get("fcall", {}).get(sc["id"]) or {})
            for r in t["runs"]:
                s = t["speed"].get(r["id"], {}).get(sc["id"])
                name = "**%s**" % r["label"] if r["hirate"] else r["label"]
                if not s or "rate" not in s:
                    why = (s or {}).get("failures", ["not run"])[0]
                    self.w("| %s | %s | failed (%s) | | | | | | | |"
                           % (r["lang"], name, why.replace("|", "/")))
                    continue
                rate = rate_s(med(s, "rate"))
                if r["hirate"]:
                    rate = "**%s**" % rate
                vs = ""
                if med(base, "server_us_per_call") and med(s, "server_us_per_call"):
                    vs = "%.2f" % (med(s, "server_us_per_call") / med(base, "server_us_per_call"))
                cmds = ", ".join("%s %s" % (k.upper(), grp(n))
                                 for k, n in s.get("commands", {}).items() if n)
                self.w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                    r["lang"], name, rate, spread(s, "rate", rate_s), us_s(med(s, "p50_us")),
                    us_s(med(s, "p99_us")), us_s(med(s, "cpu_us")),
                    us_s(med(s, "server_us_per_call")), vs, cmds or "–"))
            self.w()
        self.w("One call at a time, a decision is one round trip whose time is mostly the "
               "client and the server waking each other up; on a shared machine that varies "
               "from run to run by several times whatever the command (the spread column), so "
               "compare the ways there by their server µs per call, which does not depend on "
               "it, and by the pipelined table.")
        self.w()
        self.w("The last column sums `INFO commandstats` over the measured seconds of every "
               "round: which command each way's decisions were (the warm-up, which loads the "
               "library or the script, is before the reset). The figures compare the ways "
               "within this run; a server on a machine of its own would be faster in all of "
               "them alike.")
        self.w()
        for r in t["runs"]:
            if not r["hirate"]:
                continue
            ks = [x["hirate_counters"] for by in [t["speed"].get(r["id"], {})]
                  for sc in t["scenarios"] for x in (by.get(sc["id"]) or {}).get("raw", [])
                  if x.get("hirate_counters")]
            if ks:
                tot = {k: sum(x[k] for x in ks) for k in ("fcall", "function_loads",
                                                           "evalsha", "eval")}
                self.w("- %s: hirate's own counters over its %s, warm-up included: FCALL %s, "
                       "FUNCTION LOAD %s, EVALSHA %s, EVAL %s."
                       % (r["label"], plural(len(ks), "run"), grp(tot["fcall"]),
                          grp(tot["function_loads"]), grp(tot["evalsha"]), grp(tot["eval"])))
        self.w()

    def bands(self):
        t = self.section("bands", "Two limits on one identity")
        if t is None:
            return
        self.phase_facts(t)
        p, srv, v = t["params"], t.get("server", {}), t.get("versions", {})
        self.w("A request limited by two rules at once, `%s` on one identity (a burst and a "
               "daily quota): every contender decides both for each request, on 100,000 keys "
               "drawn uniformly (so that every decision needs Redis), with 1 client and with 8 "
               "concurrent ones, in %s (%.2g s measured after %.2g s of warm-up, in an order "
               "reversed every other round), on one redis-server %s of the suite's own (`%s`, "
               "no persistence), emptied and its statistics reset (`CONFIG RESETSTAT`) before "
               "every run. Each figure is the median over the rounds."
               % (t["limits"], plural(p["rounds"], "interleaved round"), p["seconds"],
                  p["warmup"], srv.get("version", "?"),
                  srv.get("url", "?").rsplit(":", 1)[0] + ":P"))
        self.w()
        self.w("- **hirate** decides both limits in one call: one key holds both bands and one "
               "script call decides them, all or nothing (`hirate_allow_bands` of a limiter "
               "made with `limits = \"%s\"`, which also gives each band's own figures for "
               "headers; `hirate.Limiter(url, limits=...)` in Python)." % t["limits"])
        self.w("- **Flask-Limiter's way**: limits %s (the library Flask-Limiter is built on) "
               "with its Redis storage and Flask-Limiter's default strategy, the fixed window: "
               "`parse_many` of the same string, then one `hit` per limit in Flask-Limiter's "
               "order, stopping at the first refusal (its default `fail_on_first_breach`). Each "
               "hit is a script call that waits for its reply before the next is sent, and a "
               "request the second limit refuses stays charged in the first. Python %s, "
               "redis-py %s, threads sharing one storage."
               % (v.get("limits") or "?", v.get("Python") or "?", v.get("redis") or "?"))
        self.w("- **rate-limiter-flexible** %s: `RateLimiterUnion` of two `RateLimiterRedis` "
               "(one per limit, `points` the count and `duration` the window), both on one "
               "ioredis %s client, Node %s, the concurrent clients being promises in flight on "
               "it. The union consumes in both limiters at once, two script calls sent "
               "together, and spends in both even when one refuses."
               % (v.get("rate-limiter-flexible") or "?", v.get("ioredis") or "?",
                  v.get("Node") or "?"))
        self.w()
        peers = [r for r in t["runs"] if not r["hirate"]]
        for sc in t["scenarios"]:
            self.w("#### %s" % sc["label"])
            self.w()
            self.w("| | contender | decisions/s | spread | × the best peer | p50 µs | p99 µs | "
                   "client CPU µs per decision | script calls (round trips) per decision | "
                   "commands run inside the scripts per decision | server reads per "
                   "decision | server µs per decision |")
            self.w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            best = max([med(t["speed"].get(r["id"], {}).get(sc["id"]) or {}, "rate") or 0
                        for r in peers] or [0])
            for r in t["runs"]:
                name = "**%s**" % r["label"] if r["hirate"] else r["label"]
                if r["status"] != "ok":
                    self.w("| %s | %s | missing (%s) | | | | | | | | | |"
                           % (r["lang"], name, r["reason"]))
                    continue
                s = t["speed"].get(r["id"], {}).get(sc["id"]) or {}
                if "rate" not in s:
                    why = (s.get("failures") or ["not run"])[0]
                    self.w("| %s | %s | failed (%s) | | | | | | | | | |"
                           % (r["lang"], name, why.replace("|", "/")))
                    continue
                rate = rate_s(med(s, "rate"))
                ratio = "%.2f" % (med(s, "rate") / best) if best else "–"
                calls = "%.2f" % med(s, "calls_per_decision") \
                    if med(s, "calls_per_decision") is not None else "–"
                by = ", ".join("%s %s" % (k.upper(), grp(n))
                               for k, n in sorted(s.get("commands", {}).items()))
                if r["hirate"]:
                    rate, ratio, calls = "**%s**" % rate, "**%s**" % ratio, "**%s**" % calls
                inner = med(s, "inner_per_decision")
                reads = med(s, "reads_per_decision")
                self.w("| %s | %s | %s | %s | %s | %s | %s | %s | %s (%s) | %s | %s | %s |" % (
                    r["lang"], name, rate, spread(s, "rate", rate_s), ratio,
                    us_s(med(s, "p50_us")), us_s(med(s, "p99_us")), us_s(med(s, "cpu_us")),
                    calls, by or "none", "%.2f" % inner if inner is not None else "–",
                    "%.2f" % reads if reads is not None else "–",
                    us_s(med(s, "server_us_per_decision"))))
            self.w()
        self.w("How the calls are counted, by the server and not by assumption: over each "
               "harness's whole run, warm-up included, `INFO commandstats` counts every "
               "command the server ran, and the harness counts every decision it made "
               "(`calls_total`). A script call (`FCALL`, `EVALSHA`, `EVAL`) is one request "
               "and one reply, a round trip: their sum over the decisions is the round-trip "
               "column, and its parenthesis the calls summed over the rounds. `INFO "
               "commandstats` also counts, under their own names, the commands each script "
               "runs inside (`redis.call`): the next column, the server's work per decision, "
               "not round trips. A connection's setup (`HELLO`, `SCRIPT LOAD`, `FUNCTION "
               "LOAD`, `INFO`, `CLIENT`) is counted apart and left out. Server reads per "
               "decision is `total_reads_processed` (`INFO stats`) over the decisions: how "
               "many times the server read requests from a client's socket. With one client "
               "that waits for each reply it is the round trips that client waited for, one "
               "after the other; requests sent together (the union's two calls, or Node's "
               "promises on one connection) can arrive in one read. Server µs per decision is "
               "the script calls' own time (`usec` of those commands, their scripts' inside "
               "included) over the decisions.")
        self.w()
        counted = False
        for r in t["runs"]:
            if not r["hirate"]:
                continue
            ks = [(sc["label"], (t["speed"].get(r["id"], {}).get(sc["id"]) or {}))
                  for sc in t["scenarios"]]
            ks = [(lab, s) for lab, s in ks if s.get("hirate_counters")]
            if ks:
                counted = True
                self.w("- %s: hirate's own counters over its runs, warm-up included: %s." % (
                    r["short"], "; ".join(
                        "%s: FCALL %s, EVALSHA %s, EVAL %s for %s decisions (deny cache "
                        "answers %s)" % (lab, grp(s["hirate_counters"]["fcall"]),
                                         grp(s["hirate_counters"]["evalsha"]),
                                         grp(s["hirate_counters"]["eval"]),
                                         grp(s["calls_total"]),
                                         grp(s["hirate_counters"]["cache_hits"]))
                        for lab, s in ks)))
        if counted:
            self.w()
        for line in bands_machine_lines(t, self.res):
            self.w(line)
        self.w()
        for line in bands_round_lines(t):
            self.w(line)
        self.w()

    def failover(self):
        t = self.section("failover", "Sentinel failover", present="clients")
        if t is None:
            return
        self.phase_facts(t)
        p, v = t["params"], t.get("versions", {})
        self.w("How long each client takes to decide on the new master after the master dies "
               "(`kill -9`) or after `SENTINEL FAILOVER`. Each run starts a Sentinel group of "
               "its own on loopback (`tests/support/redis_sentinel.py`: a master, %s, %d "
               "sentinels, quorum 2, `down-after-milliseconds` %d), starts the clients side by "
               "side on it, each making one decision every %d ms on a key of its own (a new "
               "key each time, capacity 10, rate 0.001/s), and once each has made %d decisions "
               "on the master, makes the fault. The promotion is the moment the replica "
               "answers `ROLE` as master (asked every 10 ms); the switch is the moment every "
               "sentinel names it as the master (`SENTINEL GET-MASTER-ADDR-BY-NAME`, asked "
               "every 10 ms after the promotion: what `tests/support/redis_sentinel.py`'s "
               "`wait_switch` sees, and what hirate's target of 2 s counts from). A decision "
               "is on the new master when the new master holds its key; the first one after "
               "the promotion is the time below, from the switch, from the promotion and from "
               "the fault (below zero: before every sentinel had switched). Decisions that "
               "answered after the promotion but whose keys the new master does not hold were "
               "made on the old master and are lost with it (a demoted master resyncs from "
               "the new one); failed decisions raised an error (redis-py, go-redis) or were "
               "decided without Redis (hirate's local fallback, its default `on_error`). %s "
               "per fault, the median and min–max."
               % (plural(p["replicas"], "replica"), p["sentinels"], p["down_after_ms"],
                  p["interval_ms"], p["ready_decisions"], plural(p["runs"], "run")))
        self.w()
        self.w("Each client has its library's documented defaults and nothing else: hirate "
               "`hirate_allow` with a `redis+sentinel://S1,S2,S3/mymaster` URL "
               "(`bench/peers/c/failover_c.c`); redis-py %s `Sentinel([(host, port), ...])"
               ".master_for('mymaster')` with `register_script` of hirate's script "
               "(`bench/peers/python/failover.py`); go-redis %s `redis.NewFailoverClient(&"
               "redis.FailoverOptions{MasterName, SentinelAddrs})` with `redis.NewScript(...)"
               ".Run` of hirate's script (`bench/peers/go/failover/main.go`)."
               % (v.get("redis") or "?", v.get("go-redis") or "?"))
        self.w()
        def f2(x):
            # Seconds to the hundredth; a time just below zero is not "-0.00".
            return "%.2f" % (0.0 if abs(x) < 0.005 else x)

        def span(v):
            # "min to max": an en dash between negative numbers reads as a minus.
            lo, hi = f2(v["min"]), f2(v["max"])
            return lo if lo == hi else "%s to %s" % (lo, hi)

        for kind, title in (("kill", "`kill -9` of the master"),
                            ("failover", "`SENTINEL FAILOVER`")):
            s = t.get("summary", {}).get(kind)
            if not s:
                continue
            self.w("#### %s" % title)
            self.w()
            sw = s.get("promoted_s")
            ag = s.get("agreed_s")
            if sw and ag:
                self.w("From the fault to the promotion: %s s (%s); to the switch: %s s (%s). "
                       "%d of %d runs completed."
                       % (f2(sw["median"]), span(sw), f2(ag["median"]), span(ag),
                          s["good"], s["runs"]))
                self.w()
            self.w("| | client | first decision on the new master, s after the switch | "
                   "spread | s after the promotion | s after the fault | spread | lost on the "
                   "old master | failed or decided without Redis |")
            self.w("|---|---|---:|---:|---:|---:|---:|---:|---:|")
            for c in t["clients"]:
                name = "**%s**" % c["label"] if c["hirate"] else c["label"]
                if c["status"] != "ok":
                    self.w("| %s | %s | missing (%s) | | | | | | |" % (c["lang"], name,
                                                                     c["reason"]))
                    continue
                e = s.get(c["id"]) or {}
                if not e.get("from_switch_s"):
                    why = (" (%s)" % e["error"].replace("|", "/").replace("\n", " ")
                           if e.get("error") else "")
                    self.w("| %s | %s | not back in %d of %d runs%s | | | | | %s | %s |"
                           % (c["lang"], name, e.get("runs", 0) - e.get("back", 0),
                              e.get("runs", 0), why, grp(e.get("lost", 0)),
                              grp(e.get("failed", 0))))
                    continue
                sw_m = f2(e["from_switch_s"]["median"])
                if c["hirate"]:
                    sw_m = "**%s**" % sw_m
                miss = "" if e["back"] == e["runs"] else " (not back in %d of %d runs)" % (
                    e["runs"] - e["back"], e["runs"])
                self.w("| %s | %s | %s%s | %s | %s | %s | %s | %s | %s |" % (
                    c["lang"], name, sw_m, miss, span(e["from_switch_s"]),
                    f2(e["from_promotion_s"]["median"]),
                    f2(e["from_fault_s"]["median"]), span(e["from_fault_s"]),
                    grp(e["lost"]), grp(e["failed"])))
            self.w()
        runs = [r for r in t.get("runs", []) if "error_run" not in r]
        hc = [c["id"] for c in t["clients"] if c["hirate"]]
        for cid in hc:
            rows = [(r["kind"], r["round"], (r["clients"].get(cid) or {}).get("counters"))
                    for r in runs]
            rows = [x for x in rows if x[2]]
            if rows:
                self.w("hirate's counters at the end of each run (`hirate_counters_get`): %s."
                       % "; ".join("%s %d: %s" % (
                           "kill" if k == "kill" else "failover", n,
                           ", ".join("%s %s" % (name, grp(v)) for name, v in c.items()))
                           for k, n, c in rows))
                self.w()
        self.w("Lost and failed decisions are summed over the runs, from the promotion to "
               "each client's first decision on the new master. The times are those of the "
               "clients' calls returning, read to the millisecond; the promotion and the "
               "switch are seen within about 10 ms plus the time of the driver's own "
               "questions.")
        self.w()

    def pieces(self):
        r = self.res
        self.w("## The bindings' own benchmarks")
        self.w()
        self.w("Each binding's benchmark, run as it is by the suite (each starts its own "
               "redis-server) and kept as the table it prints.")
        self.w()
        titles = {"bench/python/bench_sync.py": "Python, synchronous (`bench/python/bench_sync.py`)",
                  "bench/python/bench_async.py": "Python, asyncio (`bench/python/bench_async.py`)",
                  "bench/lua/run.sh": "Lua 5.4 and LuaJIT (`bench/lua/run.sh`)",
                  "bench/nginx/run.sh": "OpenResty through nginx and wrk (`bench/nginx/run.sh`)"}
        if not r.get("pieces"):
            self.w("Not run in this run.")
            self.w()
        for name, e in r.get("pieces", {}).items():
            self.w("### %s" % titles.get(name, name))
            self.w()
            if e["status"] == "ok":
                self.w("Command: `%s`." % e["command"])
                self.w()
                self.w(demote(e["markdown"], 4))
            else:
                self.w("%s (%s)." % (e["status"].capitalize(), e["reason"]))
            self.w()

    def c_sections(self):
        cb = self.res.get("c_benchmarks", {})
        self.w("## hirate alone: the C benchmarks")
        self.w()
        if cb.get("sections_md"):
            self.w(cb["sections_md"])
        else:
            self.w("Not run in this run (%s)." % cb.get("skipped", "no C results"))
        self.w()

    # -- targets

    def targets(self):
        self.w("## Targets")
        self.w()
        cb = self.res.get("c_benchmarks", {})
        if cb.get("targets_md"):
            self.w(cb["targets_md"])
        for line in goal_lines(self.res):
            self.w(line)
        self.w()

    # -- concurrent callers

    CONCURRENT_WHAT = {
        "c/hirate": "`hirate_allow`, threads sharing one limiter",
        "c/hirate-batch": "`hirate_allow_many`, 16 per call, threads sharing one limiter",
        "py/hirate": "`hirate.Limiter`, threads",
        "py/hirate-async": "`hirate.AsyncLimiter`, asyncio tasks on one loop",
        "node/rlf": "rate-limiter-flexible `RateLimiterRedis` on ioredis, promises",
        "go/redis_rate": "go-redis/redis_rate v10, goroutines",
        "py/redis-py": "redis-py, pure-Python parser, `register_script`, threads",
        "py/redis-py-hiredis": "redis-py[hiredis], `register_script`, threads",
    }

    def concurrent(self):
        r = self.res
        res = r.get("concurrent")
        if not res:
            return
        p = r["params"]
        cs = {c["id"]: c for c in r.get("contenders", [])}
        self.w("## Concurrent callers")
        self.w()
        self.w("Many callers sharing one client: threads sharing one `hirate_limiter` (C) or "
               "`hirate.Limiter`, asyncio tasks sharing one `AsyncLimiter`, and the peers' "
               "own idiom, on %s keys drawn uniformly, the workload of the comparison above "
               "(capacity %d, rate %g/s). hirate's blocking client pipelines a call that finds "
               "no connection idle behind the requests in flight on one of them (its thread "
               "reads its own reply in turn), and `AsyncLimiter` sends the calls of one loop "
               "iteration in one write; ioredis pipelines the commands of concurrent promises "
               "on one connection. `hirate_allow_many` (16 decisions a call) is the ceiling "
               "hirate's own calls can reach. %s of %.2g s each after %.2g s of warm-up, "
               "interleaved; medians, spread min–max."
               % (grp(p["cold_keys"]), p["capacity"], p["rate"],
                  plural(p["rounds"], "round").capitalize(), p["seconds"], p["warmup"]))
        self.w()
        self.w("`make bench` runs it with the rest; alone, after `make bench` has built "
               "`build-bench` and its contenders (`bench/suite/install.py`):")
        self.w()
        self.w("```sh norun")
        self.w("build-bench/suite/venv/bin/python bench/suite/suite.py --build build-bench \\")
        self.w("    --setup build-bench/suite/setup.json --out build-bench/concurrent.json \\")
        self.w("    --phases concurrent --rounds %d --seconds %g --warmup %g"
               % (p["rounds"], p["seconds"], p["warmup"]))
        self.w("python3 bench/suite/report.py --results build-bench/concurrent.json --out - "
               "--img - --section concurrent")
        self.w("```")
        self.w()
        for sc in r.get("concurrent_scenarios", []):
            self.w("#### %s" % sc["label"])
            self.w()
            self.w("| | contender | decisions/s | spread | p50 µs | p99 µs | client CPU µs "
                   "per decision | of `hirate_allow_many` |")
            self.w("|---|---|---:|---:|---:|---:|---:|---:|")
            ceiling = med(res.get("c/hirate-batch", {}).get(sc["id"]) or {}, "rate")
            for cid in res:
                s = res[cid].get(sc["id"])
                c = cs.get(cid, {"lang": cid.split("/")[0], "hirate": cid.split("/")[1]
                                 .startswith("hirate")})
                what = self.CONCURRENT_WHAT.get(cid, c.get("label", cid))
                if c.get("hirate"):
                    what = "**%s**" % what
                if not s or "rate" not in s:
                    why = (s or {}).get("failures", ["not run"])[0]
                    self.w("| %s | %s | failed (%s) | | | | | |" % (c["lang"], what, why))
                    continue
                rate = med(s, "rate")
                errs = ""
                if s.get("errors"):
                    errs = " (%s errors: %s)" % (grp(s["errors"]), s.get("error"))
                self.w("| %s | %s | %s%s | %s | %s | %s | %s | %s |" % (
                    c["lang"], what, rate_s(rate), errs, spread(s, "rate", rate_s),
                    us_s(med(s, "p50_us")), us_s(med(s, "p99_us")), us_s(med(s, "cpu_us")),
                    "%.2f×" % (rate / ceiling) if ceiling else "–"))
            self.w()

    def render(self):
        self.header()
        if any(self.res.get(k) for k in ("speed", "atomic", "outage", "memory")):
            self.method()
            self.speed_tables()
            self.beyond()
        self.concurrent()
        self.tls()
        self.cluster()
        self.functions()
        self.bands()
        self.failover()
        self.pieces()
        self.c_sections()
        self.targets()
        return "\n".join(self.lines).rstrip() + "\n"


# ---- the goals of the comparison ---------------------------------------------------------------

def goal_lines(res):
    """The comparison's goals, each Met or Not met with its figures."""
    if not res.get("contenders"):
        return ["- **Not measured**: hirate next to its peers (the comparison was not run "
                "in this run)."]
    cs = {c["id"]: c for c in res["contenders"]}
    sp = res.get("speed", {})
    scen = res["scenarios"]
    out = []

    def fig(cid, sc, key):
        s = sp.get(cid, {}).get(sc)
        return med(s, key) if s else None

    def rng(cid, sc, key):
        v = (sp.get(cid, {}).get(sc) or {}).get(key)
        return (v["min"], v["max"]) if v else None

    def ok(cid):
        return cid in cs and cs[cid]["status"] == "ok" and cid in sp

    def ahead(mine, lang):
        others = [c["id"] for c in res["contenders"] if c["lang"] == lang and not c["hirate"]
                  and c["limiter"] and "speed" in c["phases"] and ok(c["id"])]
        absent = [c for c in res["contenders"] if c["lang"] == lang and not c["hirate"] and
                  c["limiter"] and "speed" in c["phases"] and not ok(c["id"])]
        if not ok(mine):
            return None, "%s was not measured (%s)" % (cs[mine]["label"] if mine in cs else mine,
                                                      cs.get(mine, {}).get("reason") or "no results")
        lost, detail, close = [], [], []
        for sc in scen:
            r0, c0 = fig(mine, sc["id"], "rate"), fig(mine, sc["id"], "cpu_us")
            if r0 is None:
                lost.append("%s: no figure" % sc["label"])
                continue
            best_rate = max(((fig(o, sc["id"], "rate") or 0), o) for o in others) if others \
                else (0, None)
            best_cpu = min(((fig(o, sc["id"], "cpu_us") or math.inf), o) for o in others) \
                if others else (math.inf, None)
            detail.append("%s: %s/s and %s µs CPU per decision, against at best %s/s (%s) and "
                          "%s µs (%s)" % (sc["label"], rate_s(r0), us_s(c0),
                                          rate_s(best_rate[0]),
                                          cs[best_rate[1]]["short"] if best_rate[1] else "–",
                                          us_s(best_cpu[0]),
                                          cs[best_cpu[1]]["short"] if best_cpu[1] else "–"))
            if r0 <= best_rate[0]:
                lost.append("%s: fewer decisions/s than %s" % (sc["label"],
                                                               cs[best_rate[1]]["short"]))
            if c0 >= best_cpu[0]:
                lost.append("%s: more CPU per decision than %s" % (sc["label"],
                                                                   cs[best_cpu[1]]["short"]))
            # Ahead by the medians, but not by every round: say so.
            if best_rate[1]:
                mine_r, theirs_r = rng(mine, sc["id"], "rate"), rng(best_rate[1], sc["id"], "rate")
                if r0 > best_rate[0] and mine_r and theirs_r and mine_r[0] <= theirs_r[1]:
                    close.append("%s, decisions/s: %s–%s against %s–%s" % (
                        sc["label"], rate_s(mine_r[0]), rate_s(mine_r[1]),
                        rate_s(theirs_r[0]), rate_s(theirs_r[1])))
            if best_cpu[1]:
                mine_c, theirs_c = rng(mine, sc["id"], "cpu_us"), rng(best_cpu[1], sc["id"],
                                                                      "cpu_us")
                if c0 < best_cpu[0] and mine_c and theirs_c and mine_c[1] >= theirs_c[0]:
                    close.append("%s, CPU µs per decision: %s–%s against %s–%s" % (
                        sc["label"], us_s(mine_c[0]), us_s(mine_c[1]), us_s(theirs_c[0]),
                        us_s(theirs_c[1])))
        if absent:
            detail.append("not measured: " + ", ".join("%s (%s)" % (c["label"], c["reason"])
                                                       for c in absent))
        text = "; ".join(detail)
        if close:
            text += (". Ahead by the medians but not in every round (the spreads overlap, "
                     "min–max): " + "; ".join(close))
        return lost, text

    for mine, lang, what in (("c/hirate", "C", "hirate's C path (`hirate_allow`)"),
                             ("py/hirate", "Python", "hirate's Python `Limiter`"),
                             ("py/hirate-async", "Python", "hirate's Python `AsyncLimiter`")):
        lost, detail = ahead(mine, lang)
        goal = "%s ahead of every %s contender on decisions/s and on client CPU per decision" \
            % (what, lang)
        if lost is None:
            out.append("- **Not measured**: %s: %s." % (goal, detail))
        elif not lost:
            out.append("- **Met**: %s, in all four workloads (medians). %s." % (goal, detail))
        else:
            out.append("- **Not met**: %s. Where not: %s. The figures: %s." % (
                goal, "; ".join(lost), detail))

    # Batches against the server's ceiling.
    if ok("c/hirate-batch") and ok("c/redis-benchmark"):
        parts, short = [], []
        for sc in scen:
            a, b = fig("c/hirate-batch", sc["id"], "rate"), fig("c/redis-benchmark", sc["id"],
                                                                 "rate")
            if a is None or b is None:
                short.append(sc["label"])
                continue
            parts.append("%s: %s/s against %s/s, %.2f×" % (sc["label"], rate_s(a), rate_s(b),
                                                            a / b))
            if a / b < 0.9:
                short.append("%s (%.2f×)" % (sc["label"], a / b))
        goal = ("`hirate_allow_many` (16 per call) within 10% of `redis-benchmark -P 16` with "
                "the same script call, at the same concurrency (1 thread against `-c 1`, 8 "
                "against `-c 8`)")
        note = (" On the hot key most of hirate's decisions come from its deny cache, without "
                "a round trip, so those ratios say little about the server; the 100,000-key "
                "rows are the comparison.")
        if not short:
            out.append("- **Met**: %s: %s.%s" % (goal, "; ".join(parts), note))
        else:
            # What was measured next to the shortfall; no cause is claimed
            # beyond it.
            why = []
            for sc in scen:
                a, b = fig("c/hirate-batch", sc["id"], "rate"), fig("c/redis-benchmark",
                                                                     sc["id"], "rate")
                if a is None or b is None or a / b >= 0.9:
                    continue
                why.append("%s: Redis spent %s µs per call under hirate and %s under "
                           "redis-benchmark; the client %s and %s µs of CPU per decision" % (
                               sc["label"],
                               us_s(fig("c/hirate-batch", sc["id"], "server_us_per_call")),
                               us_s(fig("c/redis-benchmark", sc["id"], "server_us_per_call")),
                               us_s(fig("c/hirate-batch", sc["id"], "cpu_us")),
                               us_s(fig("c/redis-benchmark", sc["id"], "cpu_us"))))
            out.append("- **Not met**: %s: %s. Short in: %s.%s What was measured next to it: "
                       "%s. Both keep 16 calls in flight per connection; the client's threads "
                       "and the single-threaded server share %s cores." % (
                           goal, "; ".join(parts), ", ".join(short), note, "; ".join(why),
                           res.get("facts", {}).get("ncpu", "the machine's")))
    else:
        out.append("- **Not measured**: the batch path against redis-benchmark (%s)." % ", ".join(
            "%s: %s" % (cid, cs.get(cid, {}).get("reason") or "no results")
            for cid in ("c/hirate-batch", "c/redis-benchmark") if not ok(cid)))

    # The concurrency test in every language hirate has.
    at = res.get("atomic", {})
    rows, bad = [], []
    for cid in ("c/hirate", "py/hirate", "py/hirate-async", "resty/hirate"):
        c = cs.get(cid)
        if not c:
            continue
        r = at.get(cid)
        if c["status"] != "ok" or not r or "error_run" in r:
            bad.append("%s: not measured (%s)" % (c["short"], c.get("reason") or
                                                  (r or {}).get("error_run", "not run")))
            continue
        rows.append("%s %d of %d" % (c["short"], r["admitted"], r["requests"]))
        if not r["holds"]:
            bad.append("%s admitted %d, %d failed" % (c["short"], r["admitted"], r["errors"]))
    peers_bad = [cs[cid]["short"] for cid, r in at.items()
                 if not cs[cid]["hirate"] and "holds" in r and not r["holds"]]
    peers_note = (" Every contender measured held it too." if not peers_bad else
                  " Contenders that did not: %s." % ", ".join(peers_bad))
    goal = ("the concurrency test (%d at once on one key of capacity %d: exactly %d admitted) "
            "in every language" % (res["params"]["atomic"]["requests"],
                                   res["params"]["atomic"]["capacity"],
                                   res["params"]["atomic"]["capacity"]))
    if not bad and rows:
        out.append("- **Met**: %s: %s.%s Plain Lua (outside nginx) is not in this test." % (
            goal, ", ".join(rows), peers_note))
    else:
        out.append("- **Not met**: %s: %s.%s" % (goal, "; ".join(rows + bad), peers_note))

    # Still limiting, in microseconds, while Redis is stopped.
    ou = res.get("outage", {})
    free = ou.get("resty/free", {}).get("after_first_median_us")
    mine, theirs, bad = [], [], []
    for cid, r in ou.items():
        c = cs[cid]
        if "verdict" not in r or not c["limiter"]:
            continue
        t = r["after_first_median_us"]
        # OpenResty's figures are HTTP requests: what the limit adds is the
        # difference from the unlimited location.
        own = t - free if c["lang"] == "OpenResty" and free is not None else t
        fast = own < 1000
        if c["hirate"]:
            mine.append("%s %s µs%s" % (c["short"], us_s(t), " per HTTP request (the location "
                                          "without a limit: %s µs)" % us_s(free)
                                          if c["lang"] == "OpenResty" and free is not None
                                          else ""))
            if r["verdict"] != "limits" or not fast:
                bad.append("%s: %s, %s µs per decision" % (c["short"], r["verdict"], us_s(t)))
        else:
            theirs.append("%s: %s, %s µs" % (c["short"], r["verdict"], us_s(t)))
            if r["verdict"] == "limits" and fast:
                bad.append("%s also limits in microseconds" % c["short"])
    goal = ("still limiting while Redis is stopped (%d decisions on a capacity-%d key: exactly "
            "%d admitted), in microseconds per decision after the first, unlike any contender"
            % (res["params"]["outage"]["calls"], res["params"]["outage"]["capacity"],
               res["params"]["outage"]["capacity"]))
    if not mine:
        out.append("- **Not measured**: %s." % goal)
    elif not bad:
        out.append("- **Met**: %s. hirate (median per decision after the first, which waits "
                   "out the %d ms timeout): %s. The contenders: %s." % (
                       goal, res["params"]["timeout_ms"], "; ".join(mine), "; ".join(theirs)))
    else:
        out.append("- **Not met**: %s: %s. hirate: %s. The contenders: %s." % (
            goal, "; ".join(bad), "; ".join(mine), "; ".join(theirs)))
    out += tls_goal_lines(res)
    out += cluster_goal_lines(res)
    out += bands_goal_lines(res)
    out += failover_goal_lines(res)
    return out


def bands_fig(t, rid, sc, key="rate"):
    s = (t.get("speed", {}).get(rid) or {}).get(sc)
    return med(s, key) if s else None


def bands_machine_lines(t, res):
    """What the machine's cores did during the bands runs: measured, per scenario."""
    ncpu = t.get("ncpu") or "?"
    parts = []
    for sc in t["scenarios"]:
        rows = []
        for r in t["runs"]:
            if r["status"] != "ok":
                continue
            srv, mach = bands_fig(t, r["id"], sc["id"], "server_cores"), \
                bands_fig(t, r["id"], sc["id"], "machine_cores")
            if srv is None or mach is None:
                continue
            rows.append("%s %.2f and %.2f" % (r["short"], srv, mach))
        if rows:
            parts.append("%s: %s" % (sc["label"], "; ".join(rows)))
    if not parts:
        return []
    return ["What this %s-core machine does to the figures: the client, the single-threaded "
            "redis-server and every other process share the cores. With 1 client a decision "
            "takes many times the server's own time for it (p50 µs against server µs per "
            "decision above): the rest is the client's CPU and the two processes waking each "
            "other up, once per round trip. With 8 concurrent clients the client's threads "
            "and the server compete for the same cores. Cores' worth of the server's CPU "
            "(`INFO cpu`) and of the whole machine's (`/proc/stat`, other processes' "
            "included) over each run, the medians over the rounds: %s. The ratios are those "
            "of this run on this machine; they are not a forecast for a machine where the "
            "server has a core of its own."
            % (ncpu, ". ".join(parts))]


def bands_round_lines(t):
    """Each round's decisions/s of every contender, with the machine's busy
    cores over that run: the figures behind the medians and their spread."""
    out = []
    for sc in t["scenarios"]:
        rows, worst = [], 1.0
        for r in t["runs"]:
            raw = [x for x in ((t.get("speed", {}).get(r["id"]) or {}).get(sc["id"]) or {})
                   .get("raw", []) if "error_run" not in x and x.get("decisions")]
            if not raw:
                continue
            rates = [x["decisions"] / x["wall_s"] for x in raw]
            worst = max(worst, max(rates) / min(rates))
            rows.append("%s %s" % (r["short"], ", ".join(
                "%s (%s)" % (rate_s(v), "%.2f" % x["machine_cores"] if "machine_cores" in x
                             else "?") for v, x in zip(rates, raw))))
        if rows:
            out.append("- %s, round by round, decisions/s (the machine's busy cores over that "
                       "run): %s. A contender's fastest round was up to %.1f times its "
                       "slowest." % (sc["label"], "; ".join(rows), worst))
    return out


def bands_goal_lines(res):
    """Issue 14's target for two limits on one identity: one round trip per
    hirate decision, and at least 1.8 times the next best's decisions/s."""
    t = res.get("bands") or {}
    if not t.get("runs"):
        return []
    if t.get("reason"):
        return ["- **Not measured**: two limits on one identity (%s)." % t["reason"]]
    peers = [r for r in t["runs"] if not r["hirate"] and r["status"] == "ok"]
    out = []
    for r in t["runs"]:
        if not r["hirate"]:
            continue
        goal = ("two limits on one identity (`%s`), %s: one round trip per decision, and at "
                "least 1.8 times the next best's decisions/s" % (t["limits"], r["short"]))
        if r["status"] != "ok":
            out.append("- **Not measured**: %s (%s)." % (goal, r["reason"]))
            continue
        parts, short = [], []
        for sc in t["scenarios"]:
            mine = bands_fig(t, r["id"], sc["id"])
            calls = bands_fig(t, r["id"], sc["id"], "calls_per_decision")
            if mine is None or calls is None:
                short.append("%s: no figure" % sc["label"])
                continue
            best = max(((bands_fig(t, x["id"], sc["id"]) or 0, x) for x in peers),
                       key=lambda b: b[0], default=(0, None))
            ratio = mine / best[0] if best[0] else math.inf
            pc = bands_fig(t, best[1]["id"], sc["id"], "calls_per_decision") if best[1] else None
            parts.append("%s: %.2f script calls per decision, %s decisions/s, %.2f× %s (%s/s, "
                         "%s script calls per decision)"
                         % (sc["label"], calls, rate_s(mine), ratio,
                            best[1]["short"] if best[1] else "–",
                            rate_s(best[0]), "%.2f" % pc if pc is not None else "?"))
            if round(calls, 2) != 1.0:
                short.append("%s: %.2f script calls per decision" % (sc["label"], calls))
            if ratio < 1.8:
                short.append("%s: %.2f×" % (sc["label"], ratio))
        if not short:
            out.append("- **Met**: %s: %s." % (goal, "; ".join(parts)))
        else:
            # What was measured next to the shortfall; no cause is claimed
            # beyond it.
            why = []
            for sc in t["scenarios"]:
                mine = bands_fig(t, r["id"], sc["id"])
                best = max(((bands_fig(t, x["id"], sc["id"]) or 0, x) for x in peers),
                           key=lambda b: b[0], default=(0, None))
                if mine is None or not best[1] or mine / best[0] >= 1.8:
                    continue
                f = [(x, bands_fig(t, x["id"], sc["id"], "server_us_per_decision"),
                      bands_fig(t, x["id"], sc["id"], "cpu_us"),
                      bands_fig(t, x["id"], sc["id"], "reads_per_decision"))
                     for x in (r, best[1])]
                why.append("%s: %s" % (sc["label"], "; ".join(
                    "%s %s server µs, %s client CPU µs and %s server reads per decision"
                    % (x["short"], us_s(a), us_s(b), "%.2f" % c if c is not None else "?")
                    for x, a, b, c in f)))
            out.append("- **Not met**: %s: %s. Short in: %s. What was measured next to it: "
                       "%s." % (goal, "; ".join(parts), "; ".join(short), "; ".join(why)))
    return out


def failover_goal_lines(res):
    """Issue 13's target for a failover: hirate's decisions on the new master
    within 2 s of the switch, in every run; the peers' figures beside it."""
    t = res.get("failover") or {}
    if not t.get("clients") or t.get("reason"):
        return []
    hc = next((c for c in t["clients"] if c["hirate"]), None)
    runs = [r for r in t.get("runs", []) if "error_run" not in r]
    if not hc or not runs:
        return ["- **Not measured**: decisions on the new master within 2 s of a Sentinel "
                "switch (%s)." % (hc["reason"] if hc and hc.get("reason") else "no run completed")]
    def sec(x):
        return "%.2f" % (0.0 if abs(x) < 0.005 else x)

    parts, worst, missing = [], None, 0
    for kind, what in (("kill", "after `kill -9` of the master"),
                       ("failover", "after `SENTINEL FAILOVER`")):
        xs = [(r["clients"].get(hc["id"]) or {}).get("from_switch_s") for r in runs
              if r["kind"] == kind]
        got = [x for x in xs if x is not None]
        missing += len(xs) - len(got)
        if got:
            worst = max(got + ([worst] if worst is not None else []))
            peers = []
            for c in t["clients"]:
                if c["hirate"] or c["status"] != "ok":
                    continue
                e = (t.get("summary", {}).get(kind) or {}).get(c["id"]) or {}
                if e.get("from_switch_s"):
                    peers.append("%s %s s" % (c["label"].split(" `")[0],
                                              sec(e["from_switch_s"]["median"])))
            parts.append("at most %s s %s (%s; the others' medians: %s)" % (
                sec(max(got)), what, plural(len(got), "run"), ", ".join(peers) or "none"))
    line = ("hirate's first decision on the new master came, after the switch, %s (target: "
            "within 2 s of the switch)" % "; ".join(parts))
    if missing == 0 and worst is not None and worst <= 2:
        return ["- **Met**: %s." % line]
    return ["- **Not met**: %s%s." % (line, "; in %s it never came back within %d s"
                                      % (plural(missing, "run"), t["params"]["give_up_s"])
                                      if missing else "")]


def cluster_fig(t, rid, key):
    s = t.get("speed", {}).get(rid, {}).get(t["scenario"]["id"]) or {}
    return med(s, key) if key in ("rate", "cpu_us", "p50_us", "p99_us") else s.get(key)


def cluster_cores(t, rid):
    """Median cores' worth over the run of (masters, replicas, client, the whole
    machine or None) for one cluster run."""
    s = t["speed"][rid][t["scenario"]["id"]]
    good = [x for x in s.get("raw", []) if "error_run" not in x and x.get("wall_s")]
    c = sorted(x["cpu_s"] / x.get("process_wall_s", x["wall_s"]) for x in good)
    return (s.get("masters_cores", 0.0), s.get("replicas_cores", 0.0),
            c[len(c) // 2] if c else 0.0, s.get("machine_cores"))


def cluster_machine_lines(res):
    """Where the CPU went in the cluster runs: how busy the machine was."""
    t = res.get("cluster") or {}
    ncpu = t.get("ncpu")
    rows = []
    for r in t.get("runs", []):
        if r["target"] != "cluster" or r["status"] != "ok":
            continue
        s = t["speed"].get(r["id"], {}).get(t["scenario"]["id"]) or {}
        if "rate" not in s:
            continue
        m, rep, client, machine = cluster_cores(t, r["id"])
        ours = m + rep + client
        row = "%s: masters %.2f, replicas %.2f, client %.2f" % (r["short"], m, rep, client)
        if machine is not None:
            row += ", other processes %.2f, of %s" % (max(0.0, machine - ours), ncpu)
        rows.append(row)
    if not rows:
        return []
    return ["Where the machine's CPU went in the cluster runs (medians over rounds, cores' "
            "worth; other processes: the whole machine's busy time, `/proc/stat`, less the "
            "servers' and the client's): " + "; ".join(rows) + ". What the client, the "
            "replicas and the other processes use is taken from the masters, which do the "
            "decisions' work."]


def cluster_goal_lines(res):
    """The cluster comparison's two goals, each Met or Not met with its figures."""
    t = res.get("cluster") or {}
    if not t.get("runs"):
        return []
    runs = {r["id"]: r for r in t["runs"]}
    goal_peers = ("on the cluster, hirate ahead of redis-py's `RedisCluster` and go-redis' "
                  "`ClusterClient` on decisions/s, 100,000 keys, 8 concurrent: single calls "
                  "(`hirate_allow`, `hirate.Limiter`) against theirs, batches "
                  "(`hirate_allow_many`) against their pipelines")
    goal_ceiling = ("`hirate_allow_many` on the cluster reaches at least 90% of the "
                    "redis-benchmark ceiling for the same script (`redis-benchmark --cluster`, "
                    "or the sum of per-node runs; the higher of the two is taken)")
    if t.get("reason"):
        return ["- **Not measured**: %s: %s." % (g, t["reason"]) for g in (goal_peers,
                                                                         goal_ceiling)]

    def fig(rid, key="rate"):
        return cluster_fig(t, rid, key)

    def why_not(rid):
        r = runs.get(rid)
        if not r:
            return "not in this run"
        if r["status"] != "ok":
            return r["reason"]
        if not fig(rid):
            s = t.get("speed", {}).get(rid, {}).get(t["scenario"]["id"]) or {}
            return (s.get("failures") or ["no results"])[0]
        return None

    out = []
    pairs = [("c/hirate@cluster", ["py/redis-py@cluster", "go/article@cluster"]),
             ("py/hirate@cluster", ["py/redis-py@cluster", "go/article@cluster"]),
             ("c/hirate-batch@cluster", ["py/redis-py-pipeline@cluster",
                                         "go/article-pipeline@cluster"])]
    lost, detail, absent = [], [], []
    for m, peers in pairs:
        if why_not(m):
            absent.append("%s: %s" % (m, why_not(m)))
            continue
        theirs = []
        for o in peers:
            if why_not(o):
                absent.append("%s: %s" % (o, why_not(o)))
                continue
            theirs.append("%s %s/s" % (runs[o]["short"], rate_s(fig(o))))
            if fig(m) <= fig(o):
                lost.append("%s behind %s" % (runs[m]["short"], runs[o]["short"]))
        detail.append("%s %s/s against %s" % (runs[m]["short"], rate_s(fig(m)),
                                                "; ".join(theirs) or "–"))
    text = "; ".join(detail)
    if absent:
        text += "; not measured: " + "; ".join(sorted(set(absent)))
    if lost:
        out.append("- **Not met**: %s. Where not: %s. The figures (medians): %s." % (
            goal_peers, "; ".join(lost), text))
    elif absent:
        out.append("- **Not measured**: %s (not every one of them ran): %s." % (goal_peers, text))
    else:
        out.append("- **Met**: %s (medians): %s." % (goal_peers, text))

    rbc, rbn = "c/redis-benchmark@cluster", "c/redis-benchmark-nodes@cluster"
    configs = ("c/hirate-batch@cluster", "c/hirate-batch48@cluster", "c/hirate-batch48x16@cluster")
    mine = [x for x in configs if not why_not(x)]
    miss = [x for x in (rbc, rbn) if why_not(x)]
    if not mine or len(miss) == 2:
        out.append("- **Not measured**: %s: %s." % (goal_ceiling, "; ".join(
            "%s: %s" % (x, why_not(x)) for x in miss + [x for x in configs if x not in mine])))
        return out
    # hirate's best configuration: a caller picks the batch size.
    hb = max(mine, key=fig)
    h = fig(hb)
    ceil = {x: fig(x) for x in (rbc, rbn) if x not in miss}
    top = max(ceil, key=ceil.get)
    ratio = h / ceil[top]
    parts = ["%.2f of %s (%s/s)" % (h / v, runs[x]["label"], rate_s(v)) for x, v in ceil.items()]
    one = ""
    base = runs[hb]["base"]
    if not why_not(base + "@redis") and not why_not("c/redis-benchmark@redis"):
        one = (" On the one Redis the same client makes %s/s against `redis-benchmark -c %d "
               "-P 16`'s %s/s, %.2f." % (
                   rate_s(fig(base + "@redis")), t["rb_clients"],
                   rate_s(fig("c/redis-benchmark@redis")),
                   fig(base + "@redis") / fig("c/redis-benchmark@redis")))
    line = "%s: hirate's best, %s, makes %s/s, %s.%s" % (
        goal_ceiling, runs[hb]["label"], rate_s(h), "; ".join(parts), one)
    if ratio >= 0.9:
        out.append("- **Met**: %s" % line)
        return out
    mh, rh, ch, xh = cluster_cores(t, hb)
    mt, rt, cc, xt = cluster_cores(t, top)
    ncpu = t.get("ncpu")
    sp = t["speed"]
    uh = sp[hb][t["scenario"]["id"]].get("masters_us_per_call")
    ut = sp[top][t["scenario"]["id"]].get("masters_us_per_call")
    others = ""
    if xh is not None and xt is not None:
        others = ", other processes %.2f and %.2f" % (max(0.0, xh - mh - rh - ch),
                                                      max(0.0, xt - mt - rt - cc))
    text = ("- **Not met**: %s What stands in the way, on this %s-core machine running six "
            "servers and the client: the masters got %.2f cores under hirate and %.2f under "
            "%s (replicas %.2f and %.2f, the client %.2f and %.2f%s)."
            % (line, ncpu, mh, mt, runs[top]["label"], rh, rt, ch, cc, others))
    if uh and ut:
        # At the ceiling's CPU for the masters, at hirate's own cost per call.
        at = min(ceil[top], ceil[top] * ut / uh) if uh >= ut else ceil[top]
        share = max(0.0, min(1.0, (at - h) / (ceil[top] - h)))
        text += (" Per call the masters spent %s µs of CPU under hirate and %s µs under "
                 "redis-benchmark (%.2f times): with the CPU the masters had under "
                 "redis-benchmark, hirate's calls would make %s/s, %.2f of the ceiling. So "
                 "%.0f%% of the shortfall is the masters' share of this machine (what the "
                 "client, the replicas and the other processes took from them) and %.0f%% "
                 "is what a call costs a master under hirate's load: about %s calls in "
                 "flight at each master (%d threads, %d decisions a call split over %d "
                 "masters) against redis-benchmark's %s (%d connections, 16 each); the "
                 "fewer a master finds to read at once, the more each costs it."
                 % (us_s(uh), us_s(ut), uh / ut, rate_s(at), at / ceil[top], 100 * share,
                    100 * (1 - share),
                    grp(runs[hb].get("threads", 8) * runs[hb].get("batch_size", 16)
                        / t["shape"]["masters"]),
                    runs[hb].get("threads", 8), runs[hb].get("batch_size", 16),
                    t["shape"]["masters"],
                    grp(t["rb_clients"] * 16 / (1 if top == rbn else t["shape"]["masters"])),
                    t["rb_clients"] * (t["shape"]["masters"] if top == rbn else 1)))
    out.append(text)
    return out


def tls_goal_lines(res):
    """The TLS comparison's two goals, each Met or Not met with its figures."""
    t = res.get("tls") or {}
    if not t.get("runs"):
        return []
    runs = {r["id"]: r for r in t["runs"]}
    sp = t.get("speed", {})
    goal_cost = ("`hirate_allow` over TLS keeps at least 75% of its decisions/s over plain TCP "
                 "(TLS costs it under 25%), 1 client and 8 concurrent, on 100,000 keys")
    goal_peers = ("over TLS, hirate (`hirate_allow` and `hirate.Limiter`) ahead of redis-py "
                  "(`ssl=True`) and go-redis (`TLSConfig`) on decisions/s and on client CPU per "
                  "decision, 1 client and 8 concurrent, on 100,000 keys")
    if t.get("reason"):
        return ["- **Not measured**: %s: %s." % (g, t["reason"]) for g in (goal_cost, goal_peers)]

    def fig(rid, sc, key):
        return med(sp.get(rid, {}).get(sc) or {}, key)

    def why_not(rid):
        r = runs.get(rid)
        if not r:
            return "not in this run"
        if r["status"] != "ok":
            return r["reason"]
        for sc in t["scenarios"]:
            s = sp.get(rid, {}).get(sc["id"]) or {}
            if "rate" not in s:
                return (s.get("failures") or ["no results"])[0]
        return None

    out = []
    # The cost of TLS to hirate's C client.
    missing = [(rid, why_not(rid)) for rid in ("c/hirate@tls", "c/hirate@tcp") if why_not(rid)]
    if missing:
        out.append("- **Not measured**: %s: %s." % (goal_cost, "; ".join(
            "%s: %s" % ("over TLS" if rid.endswith("@tls") else "over TCP", why)
            for rid, why in missing)))
    else:
        parts, short, why = [], [], []
        for sc in t["scenarios"]:
            a, b = fig("c/hirate@tls", sc["id"], "rate"), fig("c/hirate@tcp", sc["id"], "rate")
            ca, cb = fig("c/hirate@tls", sc["id"], "cpu_us"), fig("c/hirate@tcp", sc["id"],
                                                                  "cpu_us")
            parts.append("%s: %s/s over TLS against %s/s over TCP, %.2f×; client CPU %s µs "
                         "per decision against %s (%+.2f µs)" % (
                             sc["label"], rate_s(a), rate_s(b), a / b, us_s(ca), us_s(cb),
                             ca - cb))
            if a / b < 0.75:
                short.append("%s (%.2f×)" % (sc["label"], a / b))
                why.append("%s: p50 %s µs over TLS against %s over TCP, Redis %s µs per call "
                           "against %s" % (
                               sc["label"], us_s(fig("c/hirate@tls", sc["id"], "p50_us")),
                               us_s(fig("c/hirate@tcp", sc["id"], "p50_us")),
                               us_s(fig("c/hirate@tls", sc["id"], "server_us_per_call")),
                               us_s(fig("c/hirate@tcp", sc["id"], "server_us_per_call"))))
        py = []
        if not why_not("py/hirate@tls") and not why_not("py/hirate@tcp"):
            for sc in t["scenarios"]:
                a, b = fig("py/hirate@tls", sc["id"], "rate"), fig("py/hirate@tcp", sc["id"],
                                                                    "rate")
                py.append("%s %.2f×" % (sc["label"], a / b))
        pynote = " `hirate.Limiter`, the same client under Python: %s." % ", ".join(py) \
            if py else ""
        if not short:
            out.append("- **Met**: %s: %s.%s" % (goal_cost, "; ".join(parts), pynote))
        else:
            out.append("- **Not met**: %s: %s. Short in: %s. What was measured next to it: %s; "
                       "the client and both servers share %s cores, and the server encrypts "
                       "and decrypts too.%s" % (
                           goal_cost, "; ".join(parts), ", ".join(short), "; ".join(why),
                           res.get("facts", {}).get("ncpu", "the machine's"), pynote))

    # hirate against the peers, all over TLS.
    mine = [rid for rid in ("c/hirate@tls", "py/hirate@tls")]
    peers = [rid for rid in ("py/redis-py@tls", "go/article@tls")]
    absent = [(rid, why_not(rid)) for rid in mine + peers if why_not(rid)]
    lost, detail = [], []
    for m in mine:
        if why_not(m):
            continue
        for sc in t["scenarios"]:
            r0, c0 = fig(m, sc["id"], "rate"), fig(m, sc["id"], "cpu_us")
            theirs = []
            for o in peers:
                if why_not(o):
                    continue
                r1, c1 = fig(o, sc["id"], "rate"), fig(o, sc["id"], "cpu_us")
                theirs.append("%s %s/s, %s µs" % (runs[o]["short"], rate_s(r1), us_s(c1)))
                if r0 <= r1:
                    lost.append("%s, %s: fewer decisions/s than %s" % (
                        runs[m]["short"], sc["label"], runs[o]["short"]))
                if c0 >= c1:
                    lost.append("%s, %s: more CPU per decision than %s" % (
                        runs[m]["short"], sc["label"], runs[o]["short"]))
            detail.append("%s, %s: %s/s and %s µs CPU per decision, against %s" % (
                runs[m]["short"], sc["label"], rate_s(r0), us_s(c0), "; ".join(theirs) or "–"))
    text = "; ".join(detail)
    if absent:
        text += "%snot measured: %s" % ("; " if text else "", "; ".join(
            "%s over TLS: %s" % (runs[rid]["short"] if rid in runs else rid, why)
            for rid, why in absent))
    if lost:
        out.append("- **Not met**: %s. Where not: %s. The figures: %s." % (
            goal_peers, "; ".join(lost), text))
    elif absent:
        out.append("- **Not measured**: %s (not every one of them ran): %s." % (goal_peers, text))
    else:
        out.append("- **Met**: %s (medians): %s." % (goal_peers, text))
    return out


# ---- the charts ---------------------------------------------------------------------------------

def charts(res, img):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return {"files": [], "reason": "matplotlib is not installed: %s" % e}
    if not res.get("contenders"):
        return {"files": [], "reason": "the contenders were not run"}
    os.makedirs(img, exist_ok=True)
    plt.rcParams.update({"font.size": 9, "axes.titlesize": 10, "figure.dpi": 100})
    cs = sorted(res["contenders"], key=lambda c: LANG_ORDER.index(c["lang"]))
    files = []

    def save(fig, path):
        fig.savefig(path)
        plt.close(fig)
        # A palette of 256 colours draws these charts alike at a third of
        # the bytes, which the README loads.
        try:
            from PIL import Image
            with Image.open(path) as im:
                small = im.convert("RGB").quantize(colors=256)
            small.save(path, optimize=True)
        except ImportError:
            pass

    def colour(c):
        if c["hirate"]:
            return HIRATE_COLOUR
        return LANG_COLOUR[c["lang"]] if c["limiter"] else REFERENCE_COLOUR

    def legend(fig, rows):
        from matplotlib.patches import Patch
        langs = [l for l in LANG_ORDER if any(c["lang"] == l and not c["hirate"] and
                                              c["limiter"] for c in rows)]
        handles = [Patch(color=HIRATE_COLOUR, label="hirate")]
        handles += [Patch(color=LANG_COLOUR[l], label=l) for l in langs]
        if any(not c["limiter"] for c in rows):
            handles.append(Patch(color=REFERENCE_COLOUR, label="reference, not a limiter"))
        fig.legend(handles=handles, loc="upper center", ncol=len(handles), frameon=False,
                   bbox_to_anchor=(0.5, 0.965))

    def common_xlim(axes, values, room):
        """One log scale for all panels, so that bars compare across them."""
        pos = [v for v in values if v and v > 0]
        if not pos:
            return
        lo = 10 ** math.floor(math.log10(min(pos) / 1.5))
        for ax in axes:
            ax.set_xlim(lo, max(pos) * room)

    def stamp(fig):
        f = res.get("facts", {})
        fig.text(0.995, 0.005, "hirate %s, %s; %s, %s cores; %s mode" % (
            f.get("hirate", "?"), f.get("date", "?"), f.get("cpu", "?"), f.get("ncpu", "?"),
            res.get("mode")), ha="right", va="bottom", fontsize=7, color="#666")

    def per_scenario(name, key, xlabel, title, fmt):
        rows = [c for c in cs if c["status"] == "ok" and "speed" in c["phases"]
                and c["id"] in res["speed"]]
        if not rows:
            return
        fig, axes = plt.subplots(2, 2, figsize=(13, 0.32 * len(rows) * 2 + 2.6), sharey=True)
        every = []
        for ax, sc in zip(axes.flat, res["scenarios"]):
            ys, vals, lo, hi, cols = [], [], [], [], []
            for i, c in enumerate(rows):
                s = res["speed"][c["id"]].get(sc["id"], {})
                v = s.get(key)
                ys.append(i)
                cols.append(colour(c))
                if v:
                    vals.append(v["median"])
                    lo.append(v["median"] - v["min"])
                    hi.append(v["max"] - v["median"])
                else:
                    vals.append(0)
                    lo.append(0)
                    hi.append(0)
            ax.barh(ys, vals, xerr=[lo, hi], color=cols, error_kw={"elinewidth": 0.8,
                                                                    "capsize": 2})
            ax.set_xscale("log")
            ax.set_title(sc["label"])
            ax.set_xlabel(xlabel)
            ax.grid(axis="x", which="both", alpha=0.25)
            every += [v + h for v, h in zip(vals, hi)] + [v for v in vals if v > 0]
            for y, v, h in zip(ys, vals, hi):
                if v > 0:
                    ax.text((v + h) * 1.1, y, fmt(v), va="center", fontsize=7)
                else:
                    ax.text(0.02, y, "failed", va="center", fontsize=7, color="#c00",
                            transform=ax.get_yaxis_transform())
        common_xlim(axes.flat, every, 12)
        legend(fig, rows)
        axes[0][0].set_yticks(range(len(rows)))
        axes[0][0].set_yticklabels([c["short"] for c in rows])
        axes[1][0].set_yticklabels([c["short"] for c in rows])
        axes[0][0].invert_yaxis()
        fig.suptitle(title, fontsize=12)
        stamp(fig)
        fig.tight_layout(rect=(0, 0.02, 1, 0.95))
        save(fig, os.path.join(img, name))
        files.append(name)

    p = res["params"]
    per_scenario("bench-throughput.png", "rate", "decisions per second (log scale)",
                 "Decisions per second: capacity %d, rate %g/s (median of %s, min–max)"
                 % (p["capacity"], p["rate"], plural(p["rounds"], "round")), rate_s)
    per_scenario("bench-cpu.png", "cpu_us", "client CPU µs per decision (log scale; less is "
                 "better)", "Client CPU per decision", us_s)

    # Latency: p50 bars, p99 marks.
    rows = [c for c in cs if c["status"] == "ok" and "speed" in c["phases"]
            and c["id"] in res["speed"]]
    if rows:
        fig, axes = plt.subplots(2, 2, figsize=(13, 0.32 * len(rows) * 2 + 2.6), sharey=True)
        every = []
        for ax, sc in zip(axes.flat, res["scenarios"]):
            p50 = [med(res["speed"][c["id"]].get(sc["id"], {}), "p50_us") or 0 for c in rows]
            p99 = [med(res["speed"][c["id"]].get(sc["id"], {}), "p99_us") or 0 for c in rows]
            every += p50 + p99
            ax.barh(range(len(rows)), p50, color=[colour(c) for c in rows], label="p50")
            ax.scatter(p99, range(len(rows)), marker="|", s=120, color="#222", label="p99",
                       zorder=3)
            ax.set_xscale("log")
            ax.set_title(sc["label"])
            ax.set_xlabel("µs per call (log scale): bar p50, mark p99")
            ax.grid(axis="x", which="both", alpha=0.25)
        axes[0][0].set_yticks(range(len(rows)))
        axes[0][0].set_yticklabels([c["short"] for c in rows])
        axes[1][0].set_yticklabels([c["short"] for c in rows])
        axes[0][0].invert_yaxis()
        common_xlim(axes.flat, every, 2)
        legend(fig, rows)
        fig.suptitle("Latency per call: bar p50, mark p99", fontsize=12)
        stamp(fig)
        fig.tight_layout(rect=(0, 0.02, 1, 0.95))
        save(fig, os.path.join(img, "bench-latency.png"))
        files.append("bench-latency.png")

    # While Redis is stopped.
    ou = res.get("outage", {})
    rows = [c for c in cs if c["id"] in ou and "verdict" in ou[c["id"]]]
    if rows:
        fig, ax = plt.subplots(figsize=(11, 0.38 * len(rows) + 1.6))
        vals = [ou[c["id"]]["after_first_median_us"] for c in rows]
        ax.barh(range(len(rows)), vals, color=[colour(c) for c in rows])
        ax.set_xscale("log")
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([c["short"] for c in rows])
        ax.invert_yaxis()
        ax.set_xlim(right=max(vals) * 1000)   # room for the labels
        ax.grid(axis="x", which="both", alpha=0.25)
        ax.set_xlabel("µs per decision after the first, median (log scale)")
        for i, (c, v) in enumerate(zip(rows, vals)):
            r = ou[c["id"]]
            what = {"limits": "still limits", "error": "every call fails",
                    "allowed all": "allows everything", "refused all": "refuses everything",
                    "no limit": "no limit", "mixed": "mixed"}[r["verdict"]]
            txt = "%s µs — %s" % (us_s(v), what)
            if c["limiter"]:
                txt += ", %d of %d admitted" % (r["admitted"], r["calls"])
            ax.text(v * 1.15, i, txt, va="center", fontsize=8)
        fig.suptitle("Redis stopped (SIGSTOP): %d decisions on a key of capacity %d, %d ms "
                     "timeouts" % (p["outage"]["calls"], p["outage"]["capacity"],
                                   p["timeout_ms"]), fontsize=12)
        legend(fig, rows)
        stamp(fig)
        fig.tight_layout(rect=(0, 0.03, 1, 0.92))
        save(fig, os.path.join(img, "bench-outage.png"))
        files.append("bench-outage.png")

    # Over TLS and over TCP, each contender's pair of bars side by side.
    t = res.get("tls") or {}
    bases = []
    for r in t.get("runs", []):
        if r["status"] == "ok" and r["base"] not in [b["base"] for b in bases] and \
                any(sp.get("rate") for sp in t.get("speed", {}).get(r["id"], {}).values()):
            bases.append(r)
    if bases:
        from matplotlib.patches import Patch
        fig, axes = plt.subplots(2, len(t["scenarios"]), figsize=(13, 0.55 * len(bases) * 2 + 3),
                                 sharey=True, squeeze=False)
        for row, (key, xlabel, fmt) in enumerate((
                ("rate", "decisions per second (log scale)", rate_s),
                ("cpu_us", "client CPU µs per decision (log scale; less is better)", us_s))):
            every = []
            for col, sc in enumerate(t["scenarios"]):
                ax = axes[row][col]
                for i, b in enumerate(bases):
                    for k, (tr, dy) in enumerate((("tls", -0.2), ("tcp", 0.2))):
                        v = (t["speed"].get("%s@%s" % (b["base"], tr), {}).get(sc["id"]) or
                             {}).get(key)
                        c = {"hirate": b["hirate"], "lang": b["lang"], "limiter": True}
                        if not v:
                            ax.text(0.02, i + dy, "%s: failed" % tr.upper(), va="center",
                                    fontsize=7, color="#c00", transform=ax.get_yaxis_transform())
                            continue
                        m = v["median"]
                        ax.barh(i + dy, m, height=0.38, color=colour(c),
                                alpha=1.0 if tr == "tls" else 0.45,
                                hatch=None if tr == "tls" else "//",
                                xerr=[[m - v["min"]], [v["max"] - m]],
                                error_kw={"elinewidth": 0.8, "capsize": 2})
                        ax.text(v["max"] * 1.1, i + dy, "%s %s" % (tr.upper(), fmt(m)),
                                va="center", fontsize=7)
                        every += [m, v["max"]]
                ax.set_xscale("log")
                ax.set_title(sc["label"])
                ax.set_xlabel(xlabel)
                ax.grid(axis="x", which="both", alpha=0.25)
            common_xlim(axes[row], every, 4)
        axes[0][0].set_yticks(range(len(bases)))
        axes[0][0].set_yticklabels([b["short"] for b in bases])
        axes[0][0].invert_yaxis()
        handles = [Patch(color=HIRATE_COLOUR, label="hirate")]
        handles += [Patch(color=LANG_COLOUR[l], label=l) for l in LANG_ORDER
                    if any(b["lang"] == l and not b["hirate"] for b in bases)]
        handles += [Patch(facecolor="#888", label="over TLS"),
                    Patch(facecolor="#888", alpha=0.45, hatch="//", label="over TCP")]
        fig.legend(handles=handles, loc="upper center", ncol=len(handles), frameon=False,
                   bbox_to_anchor=(0.5, 0.955))
        fig.suptitle("Over TLS and over plain TCP: capacity %d, rate %g/s (median of %s, "
                     "min–max)" % (p["capacity"], p["rate"], plural(p["rounds"], "round")),
                     fontsize=12)
        stamp(fig)
        fig.tight_layout(rect=(0, 0.02, 1, 0.93))
        save(fig, os.path.join(img, "bench-tls.png"))
        files.append("bench-tls.png")

    me = res.get("memory", {})
    rows = [c for c in cs if c["id"] in me and "bytes_per_key" in me[c["id"]]]
    if rows:
        fig, ax = plt.subplots(figsize=(9, 0.34 * len(rows) + 1.6))
        vals = [me[c["id"]]["bytes_per_key"] for c in rows]
        ax.barh(range(len(rows)), vals, color=[colour(c) for c in rows])
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([c["short"] for c in rows])
        ax.invert_yaxis()
        ax.set_xlim(right=max(vals) * 1.25)
        for i, v in enumerate(vals):
            ax.text(v + max(vals) * 0.01, i, "%.0f" % v, va="center", fontsize=8)
        ax.set_xlabel("bytes of Redis used_memory per limited key (%s keys)"
                      % grp(p["memory_keys"]))
        fig.suptitle("Redis memory per key after one decision", fontsize=12)
        legend(fig, rows)
        stamp(fig)
        fig.tight_layout(rect=(0, 0.03, 1, 0.93))
        save(fig, os.path.join(img, "bench-memory.png"))
        files.append("bench-memory.png")
    return {"files": files}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", required=True)
    ap.add_argument("--out", required=True, help="the Markdown page to write")
    ap.add_argument("--img", required=True, help="the directory of the charts")
    ap.add_argument("--c-dir", help="the C benchmarks' output (bench/run.sh)")
    ap.add_argument("--facts", help="the run's facts, one tab-separated pair a line")
    ap.add_argument("--cluster-facts", help="the facts of a run of the cluster phase alone "
                    "(bench/run.sh BUILD cluster): kept with the cluster's results")
    ap.add_argument("--phase-facts", action="append", default=[], metavar="PHASE=FILE",
                    help="the facts of a run of one phase alone (bench/run.sh BUILD PHASE: "
                    "cluster, functions, bands or failover): kept with that phase's results")
    ap.add_argument("--keep-charts", action="store_true",
                    help="draw no charts: keep those the results file names")
    ap.add_argument("--section", choices=("concurrent",),
                    help="print only this section of the page, from --results (a run of "
                    "that phase alone), and write nothing")
    args = ap.parse_args()
    path = Path(args.results)
    res = json.loads(path.read_text()) if path.exists() else None
    if res is None:
        sys.exit("report.py: %s does not exist" % path)
    if args.section:
        doc = Doc(res)
        getattr(doc, args.section)()
        sys.stdout.write("\n".join(doc.lines).rstrip() + "\n")
        return
    if args.c_dir:
        res["c_benchmarks"] = read_c(args.c_dir)
    if args.facts:
        res["facts"] = read_facts(args.facts)
    if args.cluster_facts and res.get("cluster"):
        res["cluster"]["facts"] = read_facts(args.cluster_facts)
    for pf in args.phase_facts:
        phase, _, fpath = pf.partition("=")
        if res.get(phase):
            res[phase]["facts"] = read_facts(fpath)
    if not (args.keep_charts and "charts" in res):
        res["charts"] = charts(res, args.img)
    if args.c_dir or args.facts or args.cluster_facts or args.phase_facts:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=1) + "\n")
        tmp.replace(path)
    out = Path(args.out)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(Doc(res).render())
    tmp.replace(out)


if __name__ == "__main__":
    main()
