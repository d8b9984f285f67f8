#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/.

The replies are real: captured from redis-server 7.0.15 running
lua/token_bucket.lua (EVALSHA on a fresh server, EVAL, a drained bucket, a
cost above the capacity, a peek, injected times), plus the error replies a
server sends (NOSCRIPT, OOM, WRONGPASS, NOPERM, READONLY, BUSY, LOADING,
MOVED). The structured inputs of fuzz_key and fuzz_options follow the layout
their sources describe. Run it again after changing a layout; the files are
small and named after what they hold.
"""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# rl:k, capacity 10, rate 1 (what fuzz_proto's call expects)
K_ALLOW = (b"*8\r\n:1\r\n:9\r\n:0\r\n:1000000\r\n$1\r\n9\r\n:1796051131884698\r\n"
           b":1796051131884698\r\n$4\r\nrl:k\r\n")
K_DRAINED = (b"*8\r\n:1\r\n:0\r\n:0\r\n:9949978\r\n$20\r\n0.050022000000000233\r\n"
             b":1796051131934720\r\n:1796051131934720\r\n$4\r\nrl:k\r\n")
K_REFUSED = (b"*8\r\n:0\r\n:0\r\n:4899656\r\n:9899656\r\n$20\r\n0.050022000000000233\r\n"
             b":1796051131934720\r\n:1796051131985042\r\n$4\r\nrl:k\r\n")
K_NEVER = (b"*8\r\n:0\r\n:0\r\n:-1\r\n:9849251\r\n$20\r\n0.050022000000000233\r\n"
           b":1796051131934720\r\n:1796051132035447\r\n$4\r\nrl:k\r\n")
K_PEEK = (b"*8\r\n:1\r\n:0\r\n:0\r\n:9798872\r\n$20\r\n0.050022000000000233\r\n"
          b":1796051131934720\r\n:1796051132085826\r\n$4\r\nrl:k\r\n")
# rl:a and rl:b at the injected time 5000000000 (what fuzz_op's calls expect)
A_ALLOW = (b"*8\r\n:1\r\n:9\r\n:0\r\n:1000000\r\n$1\r\n9\r\n:5000000000\r\n"
           b":5000000000\r\n$4\r\nrl:a\r\n")
B_ALLOW = (b"*8\r\n:1\r\n:7\r\n:0\r\n:30000000\r\n$1\r\n7\r\n:5000000000\r\n"
           b":5000000000\r\n$4\r\nrl:b\r\n")
A_REFUSED = (b"*8\r\n:0\r\n:0\r\n:1000000\r\n:10000000\r\n$1\r\n0\r\n:5000000000\r\n"
             b":5000000000\r\n$4\r\nrl:a\r\n")

NOSCRIPT = b"-NOSCRIPT No matching script. Please use EVAL.\r\n"
ERRORS = {
    "oom": b"-OOM command not allowed when used memory > 'maxmemory'. script: "
           b"bf7eb1cab054b7abbffb8d23317d200559ba3a4d, on @user_script:108.\r\n",
    "wrongpass": b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    "noperm": b"-NOPERM this user has no permissions to run the 'evalsha' command\r\n",
    "readonly": b"-READONLY You can't write against a read only replica. script: "
                b"bf7eb1cab054b7abbffb8d23317d200559ba3a4d, on @user_script:108.\r\n",
    "busy": b"-BUSY Redis is busy running a script. You can only call SCRIPT KILL or "
            b"SHUTDOWN NOSAVE.\r\n",
    "loading": b"-LOADING Redis is loading the dataset in memory\r\n",
    "moved": b"-MOVED 3999 127.0.0.1:6381\r\n",
    "err": b"-ERR user_script:1: Script attempted to access nonexistent global variable\r\n",
}
SCALARS = {
    "ok": b"+OK\r\n", "int": b":1\r\n", "nil-bulk": b"$-1\r\n", "nil-array": b"*-1\r\n",
    "empty-array": b"*0\r\n", "bulk": b"$5\r\nhello\r\n",
    "nested": b"*2\r\n*1\r\n:1\r\n:2\r\n",
    "huge-array": b"*4294967295\r\n", "huge-bulk": b"$1073741824\r\n",
    "bad-bulk-length": b"$-2\r\n",
}


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def proto():
    for name, data in [("allow", K_ALLOW), ("drained", K_DRAINED), ("refused", K_REFUSED),
                       ("never", K_NEVER), ("peek", K_PEEK), ("noscript", NOSCRIPT),
                       ("pipelined", K_ALLOW + K_DRAINED + K_REFUSED),
                       ("noscript-then-reply", NOSCRIPT + K_ALLOW),
                       ("cut-mid-bulk", K_DRAINED[:60])]:
        write("fuzz_proto", name, data)
    for name, data in ERRORS.items():
        write("fuzz_proto", "error-" + name, data)
    for name, data in SCALARS.items():
        write("fuzz_proto", name, data)


def op():
    for name, data in [("a", A_ALLOW), ("a-refused", A_REFUSED), ("a-b", A_ALLOW + B_ALLOW),
                       ("noscript-a", NOSCRIPT + A_ALLOW),
                       ("noscript-twice-a-b", NOSCRIPT + NOSCRIPT + A_ALLOW + B_ALLOW),
                       ("noscript-after-eval", NOSCRIPT + NOSCRIPT),
                       ("a-then-extra", A_ALLOW + b"+OK\r\n"),
                       ("wrong-key", B_ALLOW + A_ALLOW),
                       ("closed-mid-reply", A_ALLOW[:40]),
                       ("oom-then-b", ERRORS["oom"] + B_ALLOW),
                       ("noperm", ERRORS["noperm"] + ERRORS["noperm"]),
                       ("readonly", ERRORS["readonly"]),
                       ("garbage", b"*8\r\n:1\r\n?what\r\n")]:
        write("fuzz_op", name, data)


def url():
    for i, u in enumerate([b"redis://127.0.0.1:6379", b"redis://localhost", b"redis://[::1]:6380/2",
                           b"redis://:s3cr3t@10.0.0.1:7000/15", b"redis://rl:p%40ss@host/1",
                           b"redis://user@host", b"redis://h:0", b"redis://h:65536",
                           b"redis://h/x", b"redis://h?db=1", b"rediss://h", b"http://h",
                           b"unix:///run/redis.sock", b"unix://:pw@/tmp/r.sock?db=3",
                           b"unix://relative.sock", b"unix:///a?db=x",
                           b"redis://[::1", b"redis://%zz:pw@h", b""]):
        write("fuzz_url", "%02d" % i, u)


def key_input(flags, prefix, cost, key, now=None):
    data = bytes([flags, len(prefix)]) + prefix + struct.pack("<q", cost)
    if flags & 8:
        data += struct.pack("<Q", now << 11)
    return data + key


def key():
    seeds = {
        "plain": key_input(4, b"rl:", 1, b"alice"),
        "empty-key": key_input(4, b"rl:", 1, b""),
        "nul-crlf-key": key_input(4, b"rl:", 1, b"a\0b\r\n%s%n{x}"),
        "longest-key": key_input(4, b"rl:", 3, b"k" * 512),
        "too-long-key": key_input(4, b"rl:", 3, b"k" * 513),
        "null-key": key_input(5, b"rl:", 1, b"x"),
        "negative-cost": key_input(0, b"rl:", -1, b"alice"),
        "cost-2^53": key_input(0, b"rl:", 1 << 53, b"alice"),
        "cost-above-capacity": key_input(0, b"", 101, b"alice"),
        "peek": key_input(6, b"", 100, b"bob"),
        "longest-prefix": key_input(4, b"p" * 64, 1, b"k"),
        "too-long-prefix": key_input(4, b"p" * 65, 1, b"k"),
        "injected-time": key_input(12, b"t:", 2, b"k", 1700000000000000),
    }
    for name, data in seeds.items():
        write("fuzz_key", name, data)


def options():
    # present (2 bytes), capacity (sel + value), rate (sel + value), the
    # fields `present` names, then decision steps: start time, and per step
    # sel, dt, cost.
    def cap_small(n): return bytes([1, n])
    def rate_frac(a, b): return bytes([1, a, b])
    def step(sel, dt, cost): return bytes([sel]) + struct.pack("<qq", dt, cost)
    start = struct.pack("<Q", 1 << 40)
    seeds = {
        "defaults": struct.pack("<H", 0) + cap_small(10) + rate_frac(2, 0) + start +
                    step(3, 0, 4) + step(3, 0, 7) + step(3, 100000, 7) + step(11, 0, 10),
        "nan-rate": struct.pack("<H", 0) + cap_small(10) + bytes([2, 0]),
        "inf-rate": struct.pack("<H", 0) + cap_small(10) + bytes([2, 1]),
        "zero-capacity": struct.pack("<H", 0) + bytes([1, 0]) + rate_frac(1, 0),
        "capacity-2^53": struct.pack("<H", 0) + bytes([2, 3]) + rate_frac(1, 0),
        "slowest-rate": struct.pack("<H", 0) + cap_small(10) + bytes([3, 3]) + start +
                        step(3, 0, 10) + step(3, 1000, 1),
        "below-slowest-rate": struct.pack("<H", 0) + cap_small(10) + bytes([3, 2]),
        "bad-timeout": struct.pack("<H", 2) + cap_small(10) + rate_frac(1, 0) + bytes([0]),
        "max-keys-huge": struct.pack("<H", 8) + cap_small(10) + rate_frac(1, 0) + bytes([12]),
        "long-prefix": struct.pack("<H", 1024) + cap_small(10) + rate_frac(1, 0) +
                       bytes([65]) + b"p" * 65,
        "url-local-share": struct.pack("<H", 32 | 4096) + cap_small(10) + rate_frac(1, 0) +
                           bytes([1]) + struct.pack("<I", 100000) + bytes([0]),
        "bad-url": struct.pack("<H", 4096) + cap_small(10) + rate_frac(1, 0) + bytes([1]),
        "backoff-reversed": struct.pack("<H", 64 | 128) + cap_small(10) + rate_frac(1, 0) +
                            bytes([14, 0]),
    }
    for name, data in seeds.items():
        write("fuzz_options", name, data)


if __name__ == "__main__":
    proto()
    op()
    url()
    key()
    options()
    sys.exit(0)
