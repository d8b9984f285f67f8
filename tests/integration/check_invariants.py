"""Checks the merged decision logs of the invariants-under-load test.

Each worker (load_worker.c, load_worker.py, load_worker.lua) writes lines:

    A <time_us> <cost>                  a call Redis admitted, at Redis' time
    P <start_us> <end_us> <cost> <err>  a call the failure policy answered: it
                                        may have run in Redis at any moment of
                                        [start_us, end_us] (end_us may be inf)
    S <name> <key>=<value> ...          the worker's counts
    D <name> <thread> <source> <time_us|-> <allowed> <cost> <mc_before> <mc_after>
                                        one decision (HIRATE_LOG_DECISIONS=1
                                        only, for the failover test): its
                                        source, Redis' time when Redis made
                                        it, and the limiter's master_changes
                                        counter before and after the call

The token bucket promises, for every window [t1, t2] of Redis time:

    admitted cost in [t1, t2]  <=  capacity + rate * (t2 - t1)

since the bucket held at most `capacity` at t1 and gained at most
rate * (t2 - t1) since. A call whose outcome is unknown (a timeout: it may
have run) is counted as admitted in every window its interval meets. It is
enough to check the windows that begin and end at admitted decisions: any
other window holds the same admissions in a shorter span, or fewer.

Across a Sentinel failover (test_failover.py) two masters may admit from
the same key: the old one on its own copy until it is demoted (or dies), the
promoted one from the copy it had replicated, which holds at most
`capacity`. For a window that meets the failover (from the moment it began to
the moment no call admitted on the old master any more), the bound is
therefore

    capacity + rate * (t2 - t1)  +  capacity  +  old-master admissions in
                                                 [max(t1, start), t2]

(the old master's admissions before the start and the new master's after it
are two buckets, each within capacity plus its refill; what the old master
admitted after the start comes on top). check_windows takes that allowance
only when given a Failover, and only for windows that meet its interval;
every other window keeps the bound above.

    python3 check_invariants.py CAPACITY RATE LOG...     prints the verdict
"""

import math
import sys
from dataclasses import dataclass, field

# Far below a token; the script's arithmetic is exact to the last bit of a
# double, which this only absorbs when comparing against a float bound.
EPSILON = 1e-6


@dataclass
class Decision:
    """A D line: one decision of one thread of one worker."""
    name: str
    thread: int
    source: str
    time_us: object   # int: Redis' time (source "redis"); None otherwise
    allowed: bool
    cost: int
    mc_before: object  # int, or None when the worker could not read the counter
    mc_after: object


@dataclass
class Logs:
    admitted: list = field(default_factory=list)   # (time_us, cost)
    possible: list = field(default_factory=list)   # (start_us, end_us, cost, error)
    summaries: dict = field(default_factory=dict)  # name -> {key: int}
    decisions: list = field(default_factory=list)  # Decision, in each thread's order


@dataclass
class Failover:
    """The failover allowance of check_windows: windows meeting
    [start_us, end_us] may hold capacity more, plus the cost the old master
    admitted in the window at or after start_us (old_admitted: (time_us,
    cost) of those admissions)."""
    start_us: int
    end_us: int
    old_admitted: list


def _int_or_none(s):
    return None if s == "-" else int(s)


def parse(paths):
    """Reads and merges the logs; raises ValueError naming a malformed line."""
    logs = Logs()
    for path in paths:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                parts = line.split()
                try:
                    if parts[0] == "A" and len(parts) == 3:
                        logs.admitted.append((int(parts[1]), int(parts[2])))
                    elif parts[0] == "P" and len(parts) == 5:
                        end = math.inf if parts[2] == "inf" else int(parts[2])
                        logs.possible.append((int(parts[1]), end, int(parts[3]), parts[4]))
                    elif parts[0] == "D" and len(parts) == 9:
                        logs.decisions.append(Decision(
                            parts[1], int(parts[2]), parts[3], _int_or_none(parts[4]),
                            parts[5] == "1", int(parts[6]), _int_or_none(parts[7]),
                            _int_or_none(parts[8])))
                    elif parts[0] == "S" and len(parts) >= 2:
                        logs.summaries[parts[1]] = {
                            k: int(v) for k, v in (p.split("=", 1) for p in parts[2:])}
                    else:
                        raise ValueError
                except (ValueError, IndexError):
                    raise ValueError(f"{path}:{number}: malformed line {line!r}") from None
    return logs


@dataclass
class Verdict:
    ok: bool
    windows: int            # windows checked
    admitted_cost: int
    possible_cost: int
    worst: tuple            # (excess, t1, t2, admitted, bound): the tightest window
    message: str
    # With a Failover: the most that a window held beyond its bound plus
    # its possibly admitted, which the failover allowance covered (0: none
    # was needed).
    failover_excess: float = 0.0


def check_windows(admitted, possible, capacity, rate, failover=None):
    """Every window [t1, t2] between admitted decisions: admitted cost at most
    capacity + rate * (t2 - t1) + the cost of the possibly admitted calls
    whose interval meets the window (+ the allowance of a Failover for the
    windows that meet it)."""
    by_time = {}
    for t, cost in admitted:
        by_time[t] = by_time.get(t, 0) + cost
    times = sorted(by_time)
    prefix = [0]
    for t in times:
        prefix.append(prefix[-1] + by_time[t])
    worst = (-math.inf, None, None, 0, 0.0)
    windows = 0
    violation = None
    failover_excess = 0.0
    for i, t1 in enumerate(times):
        for j in range(i, len(times)):
            t2 = times[j]
            windows += 1
            got = prefix[j + 1] - prefix[i]
            bound = capacity + rate * (t2 - t1) / 1e6
            if got - bound > worst[0]:
                worst = (got - bound, t1, t2, got, bound)
            if got > bound + EPSILON:
                maybe = sum(c for a, b, c, _ in possible if a <= t2 and b >= t1)
                if got > bound + maybe + EPSILON and failover is not None and \
                        t1 <= failover.end_us and t2 >= failover.start_us:
                    lo = max(t1, failover.start_us)
                    extra = capacity + sum(c for t, c in failover.old_admitted if lo <= t <= t2)
                    failover_excess = max(failover_excess, got - bound - maybe)
                    maybe += extra
                if got > bound + maybe + EPSILON and violation is None:
                    violation = (t1, t2, got, bound, maybe)
    total = prefix[-1]
    possible_cost = sum(c for _, _, c, _ in possible)
    if violation:
        t1, t2, got, bound, maybe = violation
        message = (f"window [{t1}, {t2}] us ({(t2 - t1) / 1e6:.6f} s) admitted cost {got}, "
                   f"more than capacity + rate * span = {bound:.6f}"
                   + (f" plus {maybe} possibly admitted" if maybe else "")
                   + (" (with the failover allowance)" if failover is not None
                      and t1 <= failover.end_us and t2 >= failover.start_us else ""))
    else:
        message = (f"{windows} windows hold; the tightest admitted {worst[3]} against a bound "
                   f"of {worst[4]:.6f}" if times else "nothing was admitted")
    return Verdict(violation is None, windows, total, possible_cost, worst, message,
                   failover_excess)


def check_exact(admitted, possible, capacity):
    """Without refill: exactly the capacity admitted, give or take the calls
    whose outcome is unknown (admitted <= capacity <= admitted + possible)."""
    got = sum(c for _, c in admitted)
    maybe = sum(c for _, _, c, _ in possible)
    ok = got <= capacity <= got + maybe
    if maybe == 0:
        message = f"admitted cost {got}, capacity {capacity}"
    else:
        message = f"admitted cost {got} + up to {maybe} unknown, capacity {capacity}"
    return ok, got, maybe, message


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    capacity, rate = int(argv[1]), float(argv[2])
    logs = parse(argv[3:])
    v = check_windows(logs.admitted, logs.possible, capacity, rate)
    print(("ok: " if v.ok else "VIOLATED: ") + v.message)
    return 0 if v.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
