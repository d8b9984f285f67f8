"""Checks the merged decision logs of the invariants-under-load test.

Each worker (load_worker.c, load_worker.py, load_worker.lua) writes lines:

    A <time_us> <cost>                  a call Redis admitted, at Redis' time
    P <start_us> <end_us> <cost> <err>  a call the failure policy answered: it
                                        may have run in Redis at any moment of
                                        [start_us, end_us] (end_us may be inf)
    S <name> <key>=<value> ...          the worker's counts

The token bucket promises, for every window [t1, t2] of Redis time:

    admitted cost in [t1, t2]  <=  capacity + rate * (t2 - t1)

since the bucket held at most `capacity` at t1 and gained at most
rate * (t2 - t1) since. A call whose outcome is unknown (a timeout: it may
have run) is counted as admitted in every window its interval meets. It is
enough to check the windows that begin and end at admitted decisions: any
other window holds the same admissions in a shorter span, or fewer.

    python3 check_invariants.py CAPACITY RATE LOG...     prints the verdict
"""

import math
import sys
from dataclasses import dataclass, field

# Far below a token; the script's arithmetic is exact to the last bit of a
# double, which this only absorbs when comparing against a float bound.
EPSILON = 1e-6


@dataclass
class Logs:
    admitted: list = field(default_factory=list)   # (time_us, cost)
    possible: list = field(default_factory=list)   # (start_us, end_us, cost, error)
    summaries: dict = field(default_factory=dict)  # name -> {key: int}


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


def check_windows(admitted, possible, capacity, rate):
    """Every window [t1, t2] between admitted decisions: admitted cost at most
    capacity + rate * (t2 - t1) + the cost of the possibly admitted calls
    whose interval meets the window."""
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
                if got > bound + maybe + EPSILON and violation is None:
                    violation = (t1, t2, got, bound, maybe)
    total = prefix[-1]
    possible_cost = sum(c for _, _, c, _ in possible)
    if violation:
        t1, t2, got, bound, maybe = violation
        message = (f"window [{t1}, {t2}] us ({(t2 - t1) / 1e6:.6f} s) admitted cost {got}, "
                   f"more than capacity + rate * span = {bound:.6f}"
                   + (f" plus {maybe} possibly admitted" if maybe else ""))
    else:
        message = (f"{windows} windows hold; the tightest admitted {worst[3]} against a bound "
                   f"of {worst[4]:.6f}" if times else "nothing was admitted")
    return Verdict(violation is None, windows, total, possible_cost, worst, message)


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
