"""redis-py's side of the Sentinel failover measurement (bench/suite/suite.py,
phase failover; bench/peers/README.md, "Following a failover"):

    python failover.py --url redis+sentinel://H:P[,H:P...]/SERVICE --prefix fo:py: [--interval-ms 10]

redis-py's Sentinel client as its documentation shows it,
`Sentinel([(host, port), ...]).master_for(service)`, every option its
default, running hirate's own script (lua/token_bucket.lua) through
`register_script` (EVALSHA, and on NOSCRIPT SCRIPT LOAD then EVALSHA again).
One decision on a key of its own each ("rl:" + PREFIX + sequence number,
capacity 10, rate 0.001/s, so each key lives 1,000 s), a sleep of
--interval-ms between decisions, until SIGTERM. One line per decision on
stdout, flushed:

    SEQ UNIX_NS OK WHAT

UNIX_NS the wall-clock time when the call returned (time.time_ns()), OK 1
when the script answered and 0 when the call raised, WHAT "redis" or the
exception's class name.
"""

import argparse
import os
import signal
import sys
import time

from redis.sentinel import Sentinel

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))


def sentinels_of(url):
    """([(host, port)], service) of a redis+sentinel://H:P,H:P/SERVICE URL."""
    if not url.startswith("redis+sentinel://"):
        sys.exit("failover.py: --url: expected redis+sentinel://H:P[,H:P...]/SERVICE")
    hosts, _, service = url[len("redis+sentinel://"):].partition("/")
    out = []
    for h in hosts.split(","):
        host, _, port = h.rpartition(":")
        out.append((host, int(port)))
    return out, service.split("/")[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--prefix", default="fo:py:")
    ap.add_argument("--interval-ms", type=float, default=10)
    a = ap.parse_args()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    addrs, service = sentinels_of(a.url)
    master = Sentinel(addrs).master_for(service)
    with open(os.path.join(ROOT, "lua", "token_bucket.lua"), "rb") as f:
        script = master.register_script(f.read())
    seq = 0
    out = sys.stdout
    while not stop:
        try:
            script(keys=["rl:%s%d" % (a.prefix, seq)], args=[10, "0.001", 1, 1])
            ok, what = 1, "redis"
        except Exception as e:  # every failure is data here
            ok, what = 0, type(e).__name__
        out.write("%d %d %d %s\n" % (seq, time.time_ns(), ok, what))
        out.flush()
        seq += 1
        time.sleep(a.interval_ms / 1000)


if __name__ == "__main__":
    main()
