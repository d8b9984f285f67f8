"""What the Python side of the peer harness protocol shares
(bench/peers/README.md): the harnesses' JSON lines and exit on bad usage,
and how a rate is written on a command line, so that every contender, and
redis-benchmark, is given the very same number."""

import json
import os
import sys


def die(msg):
    """Exits with status 2 and msg, named by the running harness."""
    sys.stderr.write("%s: %s\n" % (os.path.basename(sys.argv[0]), msg))
    sys.exit(2)


def emit(obj):
    """One JSON line on stdout, flushed: the suite reads it at once."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def rate_arg(rate):
    """The rate in the fewest digits that read back exactly, as hirate sends it."""
    for prec in range(1, 18):
        s = "%.*g" % (prec, rate)
        if float(s) == rate:
            return s
    return repr(rate)
