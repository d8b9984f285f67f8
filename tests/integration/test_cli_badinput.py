"""The bad-input sweep through the hirate command-line tool, table-driven:
every number option at 0, negative, NaN, +-inf, 1e308 and 2^53, wrong types
(words, hex, blanks, a missing value), and keys that are empty, too long,
or hold CRLF, braces, printf directives and bytes that are not UTF-8. A bad
value exits 2 with exactly the message that names it on stderr and nothing
on stdout; a valid one decides (exit 0 allowed, 1 refused). Odd keys are
stored byte for byte under the prefix in a redis-server of the test's own,
one bucket each.

    HIRATE_INTEGRATION_BUILD=<build dir of tests/integration> \\
        python3 tests/integration/test_cli_badinput.py

(or HIRATE_CLI=<the hirate tool>). What argv itself cannot carry never
reaches the tool: a NUL byte, or a single argument over 128 KiB (the
kernel's limit; a 1 MiB key fails at exec with E2BIG). The largest key
argv can carry is refused by the tool like any key over 512 bytes.
"""

import errno
import os
import subprocess
import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))

from redis_server import RedisServer  # noqa: E402

REDIS = None


def setUpModule():
    global REDIS
    REDIS = RedisServer()


def tearDownModule():
    if REDIS:
        REDIS.close()


def tool():
    path = os.environ.get("HIRATE_CLI")
    if not path and os.environ.get("HIRATE_INTEGRATION_BUILD"):
        path = os.path.join(os.environ["HIRATE_INTEGRATION_BUILD"], "hirate", "core", "cli",
                            "hirate")
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError("set HIRATE_INTEGRATION_BUILD (tests/integration/run.sh does) or "
                           "HIRATE_CLI to the hirate tool")
    return path


def hirate(*args, url=None):
    """Runs the tool; returns (exit status, stdout, stderr) as bytes."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    if url:
        env["REDIS_URL"] = url
    p = subprocess.run([tool(), *args], capture_output=True, env=env, timeout=60)
    return p.returncode, p.stdout, p.stderr


def allow(*options, key="k", capacity="5", rate="1"):
    return hirate("allow", "--capacity", capacity, "--rate", rate, *options, key)


# The core's words for a text that is not a duration.
NOT_A_DURATION = ("is not a duration (a number and a unit: 250us, 100ms, 0.25s, 2m, 1h; "
                  "a number alone is seconds)")

# (what, args of allow(), the one line on stderr)
REFUSED = [
    # capacity: a whole number from 1 to 2^53-1
    ("capacity 0", dict(capacity="0"), "capacity must be a whole number from 1 to 2^53-1, got 0"),
    ("capacity -1", dict(capacity="-1"),
     "capacity must be a whole number from 1 to 2^53-1, got -1"),
    ("capacity 2^53", dict(capacity="9007199254740992"),
     "capacity must be a whole number from 1 to 2^53-1, got 9007199254740992"),
    ("capacity beyond int64", dict(capacity="99999999999999999999"),
     "--capacity: 99999999999999999999 is out of range"),
    ("capacity 1e308", dict(capacity="1e308"), '--capacity: "1e308" is not a whole number'),
    ("capacity NaN", dict(capacity="nan"), '--capacity: "nan" is not a whole number'),
    ("capacity inf", dict(capacity="inf"), '--capacity: "inf" is not a whole number'),
    ("capacity -inf", dict(capacity="-inf"), '--capacity: "-inf" is not a whole number'),
    ("capacity 2.5", dict(capacity="2.5"), '--capacity: "2.5" is not a whole number'),
    ("capacity in hex", dict(capacity="0x10"), '--capacity: "0x10" is not a whole number'),
    ("capacity with a blank", dict(capacity=" 5"), '--capacity: " 5" is not a whole number'),
    ("capacity empty", dict(capacity=""), '--capacity: "" is not a whole number'),
    ("capacity a word", dict(capacity="ten"), '--capacity: "ten" is not a whole number'),
    # rate: a finite number above 0
    ("rate 0", dict(rate="0"), "rate must be a finite number of tokens per second above 0, got 0"),
    ("rate -1", dict(rate="-1"),
     "rate must be a finite number of tokens per second above 0, got -1"),
    ("rate -0", dict(rate="-0"),
     "rate must be a finite number of tokens per second above 0, got -0"),
    ("rate NaN", dict(rate="nan"), '--rate: "nan" is not a number'),
    ("rate inf", dict(rate="inf"), '--rate: "inf" is not a number'),
    ("rate -inf", dict(rate="-inf"), '--rate: "-inf" is not a number'),
    ("rate 1e309", dict(rate="1e309"), "--rate: 1e309 is out of range"),
    ("rate -1e308", dict(rate="-1e308"),
     "rate must be a finite number of tokens per second above 0, got -1e+308"),
    ("rate 1e-300: over 2^53 us to refill", dict(rate="1e-300"),
     "capacity 5 at rate 1e-300 takes over 2^53 us to refill; raise the rate or lower the "
     "capacity"),
    ("rate 1e-308, below the least normal double", dict(rate="1e-308"),
     "--rate: 1e-308 is out of range"),
    ("rate in hex", dict(rate="0x10"), '--rate: "0x10" is not a number'),
    ("rate empty", dict(rate=""), '--rate: "" is not a number'),
    # cost: a whole number from 0 to 2^53-1
    ("cost -1", dict(options=("--cost", "-1")),
     "cost must be a whole number from 0 to 2^53-1, got -1"),
    ("cost 2^53", dict(options=("--cost", "9007199254740992")),
     "cost must be a whole number from 0 to 2^53-1, got 9007199254740992"),
    ("cost 1e308", dict(options=("--cost", "1e308")), '--cost: "1e308" is not a whole number'),
    ("cost NaN", dict(options=("--cost", "nan")), '--cost: "nan" is not a whole number'),
    ("cost inf", dict(options=("--cost", "inf")), '--cost: "inf" is not a whole number'),
    ("cost 1.5", dict(options=("--cost", "1.5")), '--cost: "1.5" is not a whole number'),
    # timeouts: durations, 1 ms to 60 s; a number alone is seconds
    ("timeout 0", dict(options=("--timeout", "0")),
     "timeout must be from 0.001 to 60 seconds, got 0"),
    ("timeout 0ms", dict(options=("--timeout", "0ms")), "timeout must be from 1ms to 60s, got 0ms"),
    ("timeout -1", dict(options=("--timeout", "-1")), 'timeout: "-1" ' + NOT_A_DURATION),
    ("timeout 60001ms", dict(options=("--timeout", "60001ms")),
     "timeout must be from 1ms to 60s, got 60001ms"),
    ("timeout 61", dict(options=("--timeout", "61")),
     "timeout must be from 0.001 to 60 seconds, got 61"),
    ("timeout 2^53", dict(options=("--timeout", "9007199254740992")),
     'timeout: "9007199254740992" has more than 15 digits'),
    ("timeout 1e308", dict(options=("--timeout", "1e308")),
     'timeout: "1e308" ' + NOT_A_DURATION),
    ("timeout NaN", dict(options=("--timeout", "nan")), 'timeout: "nan" ' + NOT_A_DURATION),
    ("timeout inf", dict(options=("--timeout", "inf")), 'timeout: "inf" ' + NOT_A_DURATION),
    ("connect timeout 0", dict(options=("--connect-timeout", "0")),
     "connect_timeout must be from 0.001 to 60 seconds, got 0"),
    ("connect timeout -inf", dict(options=("--connect-timeout", "-inf")),
     'connect_timeout: "-inf" ' + NOT_A_DURATION),
    ("connect timeout 2m", dict(options=("--connect-timeout", "2m")),
     "connect_timeout must be from 1ms to 60s, got 2m"),
    # keys: 1 to 512 bytes
    ("an empty key", dict(key=""), "key is empty"),
    ("a key of 513 bytes", dict(key="k" * 513), "key is 513 bytes; the most is 512"),
    ("the longest key argv can carry (128 KiB - 1)", dict(key="k" * (128 * 1024 - 1)),
     "key is 131071 bytes; the most is 512"),
    # other options
    ("a policy that is not one", dict(options=("--on-error", "sometimes")),
     '--on-error: on_error must be "local", "open" or "closed", got "sometimes"'),
    ("a prefix of 65 bytes", dict(options=("--prefix", "p" * 65)),
     "prefix is 65 bytes; the most is 64"),
    ("a URL with port 0", dict(options=("--url", "redis://127.0.0.1:0")),
     "invalid Redis URL: the port must be a number from 1 to 65535"),
    ("a URL with port 2^53", dict(options=("--url", "redis://127.0.0.1:9007199254740992")),
     "invalid Redis URL: the port must be a number from 1 to 65535"),
]


class BadValues(unittest.TestCase):

    def test_each_bad_value_exits_2_naming_the_problem(self):
        for what, kw, message in REFUSED:
            with self.subTest(what):
                options = kw.pop("options", ())
                try:
                    rc, out, err = allow(*options, **kw)
                finally:
                    kw["options"] = options
                self.assertEqual((rc, out, err.decode()), (2, b"", f"hirate: {message}\n"))

    def test_a_missing_value_or_an_unknown_option_exits_2(self):
        self.assertEqual(hirate("allow", "k", "--rate", "1", "--capacity"),
                         (2, b"", b"hirate: missing value for --capacity\n"
                                  b"Try 'hirate --help'.\n"))
        self.assertEqual(hirate("allow", "k", "--capacity", "5", "--rate", "1", "--weight=2"),
                         (2, b"", b"hirate: unknown option --weight\nTry 'hirate --help'.\n"))
        self.assertEqual(hirate("allow", "--capacity", "5", "--rate", "1"),
                         (2, b"", b"hirate: allow needs a KEY\n"))

    def test_a_password_in_a_mistyped_url_option_is_not_printed(self):
        rc, out, err = hirate("allow", "k", "--capacity", "5", "--rate", "1",
                              "--urll=redis://:s3cr3t-canary@127.0.0.1")
        self.assertEqual((rc, out), (2, b""))
        self.assertNotIn(b"s3cr3t-canary", err)
        self.assertIn(b"unknown option --urll", err)

    def test_what_argv_cannot_carry_never_reaches_the_tool(self):
        with self.assertRaises(ValueError):        # "embedded null byte"
            allow(key="a\0b")
        with self.assertRaises(OSError) as info:   # a 1 MiB argument
            allow(key="k" * (1 << 20))
        self.assertEqual(info.exception.errno, errno.E2BIG)


class ValidExtremes(unittest.TestCase):

    def test_numbers_at_the_edges_that_the_rules_accept(self):
        # rate 1e308 and 2^53: finite and above 0; a drained bucket is full
        # again within a microsecond.
        for rate in ("1e308", "9007199254740992"):
            self.assertEqual(allow("--cost", "5", rate=rate)[0], 0)
        # capacity 2^53-1 at a rate that refills it within 2^53 us
        rc, out, _ = allow(capacity="9007199254740991", rate="1e9")
        self.assertEqual((rc, out.split()[:2]), (0, [b"allowed", b"remaining=9007199254740990"]))
        # cost 0 passes and spends nothing; a cost above the capacity never does
        self.assertEqual(allow("--cost", "0")[:2],
                         (0, b"allowed  remaining=5 limit=5 reset_after=0.000s source=local\n"))
        self.assertEqual(allow("--cost", "6", "--json")[:2],
                         (1, b'{"allowed":false,"remaining":5,"limit":5,"retry_after":null,'
                             b'"reset_after":0,"source":"local"}\n'))
        # timeouts at their bounds
        self.assertEqual(allow("--timeout", "60s", "--connect-timeout", "1ms")[0], 0)


# Valid keys (keys are bytes), each in a bucket of its own in Redis.
ODD_KEYS = [
    ("CRLF", b"a\r\nb"),
    ("a RESP command after CRLF", b"x\r\n*1\r\n$8\r\nFLUSHALL\r\n"),
    ("a cluster hash tag", b"{user1}:a"),
    ("the same hash tag, another key", b"{user1}:b"),
    ("empty braces", b"{}"),
    ("printf directives", b"%s%n%p"),
    ("bytes that are not UTF-8", b"\xff\xfe\xfd"),
    ("a lone continuation byte", b"\x80"),
    ("512 bytes", b"\xff" * 512),
]


class OddKeys(unittest.TestCase):

    def test_odd_keys_are_stored_byte_for_byte_and_never_collide(self):
        REDIS.command("FLUSHALL")
        prefix = b"{cli}\r\n:"
        base = ("--capacity", "5", "--rate", "0.001", "--prefix", os.fsdecode(prefix))
        for what, key in ODD_KEYS:
            with self.subTest(what):
                rc, out, err = hirate("allow", *base, "--json", os.fsdecode(key), url=REDIS.url)
                self.assertEqual((rc, err), (0, b""))
                self.assertIn(b'"remaining":4,', out)
                self.assertIn(b'"source":"redis"', out)
                self.assertGreater(REDIS.command("PTTL", prefix + key), 0)
        # One bucket each: every key still holds 4, and Redis holds exactly
        # these keys (the FLUSHALL after the CRLF never ran).
        for what, key in ODD_KEYS:
            with self.subTest(what):
                rc, out, _ = hirate("peek", *base, "--json", os.fsdecode(key), url=REDIS.url)
                self.assertEqual(rc, 0)
                self.assertIn(b'"remaining":4,', out)
        self.assertEqual(REDIS.command("DBSIZE"), len(ODD_KEYS))
        # reset finds the same bytes
        self.assertEqual(hirate("reset", "--prefix", os.fsdecode(prefix),
                                os.fsdecode(b"\xff\xfe\xfd"), url=REDIS.url),
                         (0, b"reset\n", b""))
        self.assertEqual(REDIS.command("EXISTS", prefix + b"\xff\xfe\xfd"), 0)
        self.assertEqual(REDIS.command("DBSIZE"), len(ODD_KEYS) - 1)


if __name__ == "__main__":
    unittest.main()
