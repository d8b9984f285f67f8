"""The Python workers of the invariants-under-load test (test_invariants.py):
threads sharing one synchronous hirate.Limiter, and the same limiter used by
a child made with os.fork() after it had connected.

    load_worker.py NAME URL PREFIX KEY CAPACITY RATE SECONDS THREADS DRAIN TIMEOUT_MS LOG \
        [CHILD_NAME CHILD_THREADS CHILD_LOG]

With the CHILD_* arguments the process forks once the limiter holds a
connection; the parent runs as NAME, the child as CHILD_NAME. Each prints
"ready <name>", waits for its own "go\\n" on stdin (the two read the same
pipe, three bytes each), calls allow() with costs 1 to 3 until SECONDS have
passed (or, with DRAIN 1, until a decision shows the bucket empty), and
writes its log in load_worker.c's format:

    A <time_us> <cost>                  admitted, at Redis' time
    P <start_us> <end_us> <cost> <err>  the policy answered a failure: the
                                        call may have run during its interval
                                        (time.time_ns, the clock Redis' TIME
                                        reads on this host)
    S <name> <counter>=<n> ...

With HIRATE_TLS_CA_FILE set, a rediss:// URL is verified against that CA
(the invariants' run over TLS). With HIRATE_LOG_DECISIONS=1 (the failover
test, test_failover.py) the log also gets load_worker.c's line for every
decision, with the limiter's master_changes counter before and after it:

    D <name> <thread> <source> <time_us|-> <allowed> <cost> <mc_before> <mc_after>
"""

import os
import random
import sys
import threading
import time

import hirate

LOG_DECISIONS = os.environ.get("HIRATE_LOG_DECISIONS") == "1"


def master_changes(lim):
    """The core's counter ("-" where this build's _stats() lacks it)."""
    return lim._stats().get("master_changes", "-")


def run(name, lim, key, seconds, threads, drain, log_path):
    deadline = time.monotonic() + seconds
    drained = threading.Event()
    results = []
    lock = threading.Lock()

    def hammer(seed, thread):
        rnd = random.Random(seed)
        events = []
        counts = dict(decisions=0, admitted=0, admitted_cost=0, refused=0, redis=0, cache=0,
                      policy=0)
        errors = []
        while time.monotonic() < deadline and not (drain and drained.is_set()):
            cost = rnd.randint(1, 3)
            mc1 = master_changes(lim) if LOG_DECISIONS else None
            start = time.time_ns() // 1000
            try:
                d = lim.allow(key, cost)
            except hirate.Error as e:   # a configuration error: the test fails
                errors.append(f"{e.name}: {e}")
                break
            end = time.time_ns() // 1000
            if LOG_DECISIONS:
                t = d.time_us if d.source == "redis" else "-"
                events.append(f"D {name} {thread} {d.source} {t} {int(d.allowed)} {cost} {mc1} "
                              f"{master_changes(lim)}")
            counts["decisions"] += 1
            src = d.source if d.source in ("redis", "cache") else "policy"
            counts[src] += 1
            if d.error is not None:
                events.append(f"P {start} {end} {cost} {d.error}")
            elif d.allowed:
                counts["admitted"] += 1
                counts["admitted_cost"] += cost
                events.append(f"A {d.time_us} {cost}")
            else:
                counts["refused"] += 1
                if drain and d.remaining == 0:
                    drained.set()
            # A short pause, so that the threads contend without taking the
            # whole of a shared machine's CPU.
            time.sleep(rnd.uniform(0.0002, 0.0008))
        with lock:
            results.append((events, counts, errors))

    workers = [threading.Thread(target=hammer, args=(f"{name}/{os.getpid()}/{i}", i))
               for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()

    total = dict.fromkeys(results[0][1], 0)
    errors = []
    with open(log_path, "w") as log:
        for events, counts, errs in results:
            for line in events:
                log.write(line + "\n")
            for k, v in counts.items():
                total[k] += v
            errors += errs
        fields = " ".join(f"{k}={v}" for k, v in total.items())
        mc = master_changes(lim) if LOG_DECISIONS else "-"
        mc = "" if mc == "-" else f" master_changes={mc}"
        log.write(f"S {name} threads={threads} {fields} errors={int(bool(errors))}{mc}\n")
    for e in errors:
        print(f"load_worker.py {name}: {e}", file=sys.stderr)
    return 1 if errors else 0


def wait_for_go(name):
    # One write: a parent and its child share this pipe, and print() may
    # split a line in two writes that the other's line could come between.
    os.write(1, f"ready {name}\n".encode())
    # Unbuffered: a parent and its child read the same pipe, three bytes each.
    if os.read(0, 3) != b"go\n":
        print(f"load_worker.py {name}: no start signal", file=sys.stderr)
        sys.exit(2)


def main(argv):
    if len(argv) not in (12, 15):
        print(__doc__, file=sys.stderr)
        return 2
    (name, url, prefix, key, capacity, rate, seconds, threads, drain, timeout_ms,
     log_path) = argv[1:12]
    timeout = int(timeout_ms) / 1000
    tls = {}
    if os.environ.get("HIRATE_TLS_CA_FILE"):
        tls["tls_ca_file"] = os.environ["HIRATE_TLS_CA_FILE"]
    lim = hirate.Limiter(url, capacity=int(capacity), rate=float(rate), prefix=prefix,
                         on_error="closed", timeout=timeout, connect_timeout=timeout, **tls)
    args = (key, float(seconds))
    drain = drain == "1"
    if len(argv) == 12:
        wait_for_go(name)
        return run(name, lim, *args, int(threads), drain, log_path)

    child_name, child_threads, child_log = argv[12:]
    # The limiter connects before the fork, so the child inherits a pooled
    # connection it must never use (it opens its own).
    assert lim.peek(key + ":before-fork", 0).source == "redis"
    pid = os.fork()
    if pid == 0:
        status = 2
        try:
            wait_for_go(child_name)
            status = run(child_name, lim, *args, int(child_threads), drain, child_log)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    wait_for_go(name)
    status = run(name, lim, *args, int(threads), drain, log_path)
    _, child_status = os.waitpid(pid, 0)
    lim.close()
    return status or (0 if os.waitstatus_to_exitcode(child_status) == 0 else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
