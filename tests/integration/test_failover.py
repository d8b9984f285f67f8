"""The invariants across a Sentinel failover, from three languages at once.

The workers of test_invariants.py (4 C threads, 3 Python threads sharing a
hirate.Limiter and 2 in a child forked from it, one Lua 5.4 process) spend
from ONE key (capacity 50, 20 tokens a second, costs 1 to 3, on_error
"closed") through a redis+sentinel:// URL: a master, a replica and three
redis-sentinel processes of tests/support/redis_sentinel.py. After 2.5 s of
load the master is made to go, in one run by SENTINEL FAILOVER, in another by
kill -9; the workers run on for the rest of their 10 s. Every worker logs
each decision (HIRATE_LOG_DECISIONS=1: its source, Redis' time, and the
limiter's master_changes counter before and after the call), so each
admission is known to come from the old master (the counter was 1 after the
call), from the promoted one (it was 2 before), or from either (it moved
during the call: counted as the old master's, the generous side).

What must hold:

- Every window of admitted decisions holds at most capacity + rate * span
  plus the calls of unknown outcome whose interval meets it (a call the
  policy answered after a failure may have run), as in test_invariants.py,
  EXCEPT across the failover, where two masters may both admit (the two
  windows of docs/semantics.md, "What a failover can cost"): there the
  bound is capacity counted once more for the switch (the promoted
  replica's copy holds at most the capacity) plus what the old master
  admitted after the failover began, until it was demoted or died. That
  last term also covers the refill of the old master's copy while both
  masters took writes, which a bare 2 * capacity + rate * span would leave
  out. check_invariants.check_windows takes exactly that allowance, and
  only for windows that meet the failover: from the moment SENTINEL
  FAILOVER was sent (or the master killed) to the later of the switch and
  the old master's last admission. Each master's own admissions keep the
  plain bound with no allowance at all.
- Every thread of every worker decides on the new master (source "redis",
  master_changes 2 before the call) within 2 s of the switch, and only by
  Redis from then on (or by the deny cache, which answers a refusal Redis
  gave). The switch is the moment the harness saw every sentinel name the
  new master, whose ROLE says master (SentinelGroup.wait_switch); the first
  decision's time is Redis' own (this host's clock). No slack is added to the
  2 s; the harness asks every 10 ms, so its mark is later than the moment
  the last sentinel switched by that and the time of its queries at most.
- master_changes is exactly 2 at the end in every worker: the first master
  found, then the new one; nothing flapped back.
- The promoted replica already had the function library (replicated): it
  got FCALL from every worker, and no FUNCTION LOAD, no EVALSHA, no EVAL.

    HIRATE_INTEGRATION_BUILD=<build dir of tests/integration> \\
        python3 tests/integration/test_failover.py

The build dir is test_invariants.py's (tests/integration/run.sh makes it);
HIRATE_INVARIANTS_WORKERS chooses workers as there.
"""

import os
import sys
import tempfile
import time
import unittest
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(HERE))

import check_invariants  # noqa: E402
from check_invariants import Failover  # noqa: E402
from test_invariants import CAPACITY, RATE, TIMEOUT_MS, Phase, report  # noqa: E402

SECONDS = 10.0       # each run's load, in all
LEAD = 2.5           # load before the master goes
SWITCH_TIMEOUT = 30  # seconds the sentinels may take to promote the replica
BOUND_US = 2_000_000  # the target: on the new master within 2 s


def wall_us(monotonic):
    """A time.monotonic() reading as microseconds of this host's clock."""
    return time.time_ns() // 1000 - int((time.monotonic() - monotonic) * 1e6)


def commandstats(info):
    """INFO commandstats as {command: calls}."""
    calls = {}
    for line in info.splitlines():
        if line.startswith("cmdstat_"):
            name, _, fields = line[len("cmdstat_"):].partition(":")
            calls[name] = int(dict(f.split("=", 1) for f in fields.strip().split(","))["calls"])
    return calls


class FailoverAllowance(unittest.TestCase):
    """check_windows' failover allowance on histories whose verdict is known
    (capacity 5, no refill to speak of)."""

    CAP, RATE = 5, 1e-6

    def verdict(self, admitted, failover=None, possible=()):
        return check_invariants.check_windows(admitted, list(possible), self.CAP, self.RATE,
                                              failover)

    def test_the_allowance_is_capacity_plus_the_old_masters_admissions_after_the_start(self):
        old = [(t, 1) for t in range(0, 5)] + [(11, 1), (12, 1)]   # 2 after the start
        new = [(t, 1) for t in range(20, 25)]
        fo = Failover(start_us=10, end_us=30, old_admitted=[(11, 1), (12, 1)])
        self.assertFalse(self.verdict(old + new).ok)
        v = self.verdict(old + new, fo)
        self.assertTrue(v.ok, v.message)
        self.assertAlmostEqual(v.failover_excess, 7, places=6)
        # One token more than the allowance is a violation.
        self.assertFalse(self.verdict(old + new + [(26, 1)], fo).ok)

    def test_old_admissions_before_the_start_earn_nothing(self):
        fo = Failover(start_us=10, end_us=30, old_admitted=[(3, 1), (4, 1)])
        admitted = [(t, 1) for t in range(0, 5)] + [(t, 1) for t in range(20, 27)]
        self.assertFalse(self.verdict(admitted, fo).ok)

    def test_windows_outside_the_failover_keep_the_plain_bound(self):
        fo = Failover(start_us=10, end_us=30, old_admitted=[])
        self.assertFalse(self.verdict([(t, 1) for t in range(40, 46)], fo).ok)
        self.assertFalse(self.verdict([(t, 1) for t in range(0, 6)], fo).ok)
        self.assertTrue(self.verdict([(t, 1) for t in range(40, 45)], fo).ok)

    def test_unknown_outcomes_still_count(self):
        fo = Failover(start_us=10, end_us=30, old_admitted=[])
        admitted = [(t, 1) for t in range(0, 5)] + [(t, 1) for t in range(20, 27)]
        self.assertFalse(self.verdict(admitted, fo).ok)
        self.assertTrue(self.verdict(admitted, fo, [(15, 16, 2, "EIO")]).ok)


class InvariantsAcrossAFailover(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="hirate-failover-")
        cls.saved = os.environ.get("HIRATE_LOG_DECISIONS")
        os.environ["HIRATE_LOG_DECISIONS"] = "1"

    @classmethod
    def tearDownClass(cls):
        if cls.saved is None:
            os.environ.pop("HIRATE_LOG_DECISIONS", None)
        else:
            os.environ["HIRATE_LOG_DECISIONS"] = cls.saved
        cls.tmp.cleanup()

    def run_failover(self, how):
        # Imported here: the allowance's tests above need no servers.
        from redis_sentinel import SentinelGroup

        group = SentinelGroup(replicas=1, sentinels=3, down_after_ms=1000)
        try:
            self.check_failover(group, how)
        finally:
            group.stop()

    def check_failover(self, group, how):
        key = f"failover-{how}"
        marks = {}

        def make_the_master_go():
            time.sleep(LEAD)
            old = group.master
            replica = group.replicas[0]
            # What the replica executed until now (FUNCTION LOAD among it:
            # replicated as itself), to subtract from what it did as master.
            marks["before"] = commandstats(group.cli(replica.port, "INFO", "commandstats"))
            marks["replica"] = replica
            marks["start_us"] = time.time_ns() // 1000
            if how == "failover":
                group.failover()
            else:
                group.kill_master()
            new, seen = group.wait_switch(old, SWITCH_TIMEOUT)
            marks["switch_us"] = wall_us(seen)
            marks["old"], marks["new"] = old, new

        phase = Phase(group.url, self.tmp.name, key, RATE, SECONDS, drain=False,
                      timeout_ms=TIMEOUT_MS)
        try:
            status = phase.run(timeout=SECONDS + 60, during=make_the_master_go)
        finally:
            phase.kill()
        self.assertEqual(status, dict.fromkeys(status, 0), "a worker failed (see stderr)")
        self.assertNotEqual(marks["old"].port, marks["new"].port)
        self.assertEqual(marks["new"].port, marks["replica"].port)
        start, switch = marks["start_us"], marks["switch_us"]

        logs = check_invariants.parse(phase.logs.values())
        self.assertEqual(sorted(logs.summaries), sorted(phase.logs))
        for name, s in logs.summaries.items():
            self.assertEqual(s["errors"], 0, name)
            self.assertIn("master_changes", s,
                          f"{name}: its limiter's _stats() has no master_changes")
            self.assertEqual(s["master_changes"], 2,
                             f"{name}: the first master, then the new one: {s}")
        # The D lines are every decision: their admissions are the A lines.
        by_redis = [d for d in logs.decisions if d.source == "redis"]
        self.assertEqual(sorted((d.time_us, d.cost) for d in by_redis if d.allowed),
                         sorted(logs.admitted))
        for name, s in logs.summaries.items():
            self.assertEqual(sum(1 for d in logs.decisions if d.name == name), s["decisions"])

        # Each admission's master.
        old, new, either = [], [], []
        for d in by_redis:
            if d.allowed:
                where = (new if d.mc_before >= 2 else old if d.mc_after <= 1 else either)
                where.append((d.time_us, d.cost))
        old_after_start = [(t, c) for t, c in old + either if t >= start]
        end = max([switch] + [t for t, _ in old + either])

        # Every thread on the new master within the bound, and Redis's from then on.
        threads = defaultdict(list)
        for d in logs.decisions:
            threads[(d.name, d.thread)].append(d)
        delays = {}
        for (name, thread), ds in sorted(threads.items()):
            first = next((i for i, d in enumerate(ds)
                          if d.source == "redis" and d.mc_before >= 2), None)
            self.assertIsNotNone(first, f"{name} thread {thread} never decided on the new master")
            delays[(name, thread)] = ds[first].time_us - switch
            others = sorted({d.source for d in ds[first:]} - {"redis", "cache"})
            self.assertEqual(others, [], f"{name} thread {thread} after it was on the new master")
            self.assertTrue(any(d.source == "redis" and d.mc_after == 1 for d in ds[:first]),
                            f"{name} thread {thread} never decided on the old master")
        worst = max(delays, key=delays.get)

        # The windows: each master's alone with the plain bound, all of them
        # with the failover's allowance.
        unknown = logs.possible + [(t, t, c, "either") for t, c in either]
        v_old = check_invariants.check_windows(old, unknown, CAPACITY, RATE)
        v_new = check_invariants.check_windows(new, unknown, CAPACITY, RATE)
        fo = Failover(start, end, old_after_start)
        v = check_invariants.check_windows(logs.admitted, logs.possible, CAPACITY, RATE, fo)
        report(f"{how} after {LEAD:g} s of {SECONDS:g}, capacity {CAPACITY}, {RATE:g} tokens/s",
               logs, ("ok: " if v.ok else "VIOLATED: ") + v.message
               + f"; {len(logs.possible)} calls of unknown outcome; admitted by the old master "
               f"{len(old)} ({len(old_after_start)} after the start), by the new {len(new)}, "
               f"by either {len(either)}; the allowance covered {v.failover_excess:g}; the "
               f"switch {(switch - start) / 1e6:.3f} s after the start; the last thread on the "
               f"new master {delays[worst] / 1e6:+.3f} s from the switch ({worst[0]} "
               f"thread {worst[1]})")
        self.assertTrue(v_old.ok, "the old master alone: " + v_old.message)
        self.assertTrue(v_new.ok, "the new master alone: " + v_new.message)
        self.assertTrue(v.ok, v.message)
        for (name, thread), delay in sorted(delays.items()):
            self.assertLessEqual(delay, BOUND_US,
                                 f"{name} thread {thread}: first decision on the new master "
                                 f"{delay / 1e6:.3f} s after the switch")
        # Not vacuous: both masters admitted from the key.
        self.assertTrue(old and new, (len(old), len(new)))
        # The promoted replica had the function library (it is replicated):
        # since the failover began it got FCALL and nothing else, no FUNCTION
        # LOAD, no EVALSHA after a "Function not found". As a replica it got
        # the scripts' effects, never an FCALL, so each call the workers made
        # there is one of its FCALLs.
        after = commandstats(group.cli(marks["new"].port, "INFO", "commandstats"))
        since = {k: after.get(k, 0) - marks["before"].get(k, 0)
                 for k in ("fcall", "function|load", "evalsha", "eval")}
        on_new = sum(1 for d in by_redis if d.mc_before >= 2)
        self.assertGreaterEqual(since["fcall"], on_new, since)
        self.assertEqual(since, dict(since, **{"function|load": 0, "evalsha": 0, "eval": 0}))
        return logs

    def test_sentinel_failover_under_load(self):
        self.run_failover("failover")

    def test_kill_9_of_the_master_under_load(self):
        self.run_failover("kill")


if __name__ == "__main__":
    unittest.main()
