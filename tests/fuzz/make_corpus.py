#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/.

The replies are real: captured from redis-server 7.0.15 running
lua/token_bucket.lua (EVALSHA on a fresh server, EVAL, a drained bucket, a
cost above the capacity, a peek, injected times), plus the error replies a
server sends (NOSCRIPT, OOM, WRONGPASS, NOPERM, READONLY, BUSY, LOADING,
MOVED). The handshake replies (fuzz_handshake) are redis-server 7.0.15's to AUTH,
SELECT and PING, and what other servers send first (an SSH banner, an HTTP
error, a TLS alert). The structured inputs of fuzz_key and fuzz_options
follow the layout their sources describe. Run it again after changing a layout; the files are
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


# A 3-master CLUSTER SLOTS reply of redis-server 7.0.15 (ids shortened).
CLUSTER_SLOTS = (b"*3\r\n"
                 b"*4\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7100\r\n$4\r\nid-a\r\n"
                 b"*3\r\n$9\r\n127.0.0.1\r\n:7103\r\n$4\r\nid-d\r\n"
                 b"*4\r\n:5461\r\n:10922\r\n*3\r\n$9\r\n127.0.0.1\r\n:7101\r\n$4\r\nid-b\r\n"
                 b"*3\r\n$9\r\n127.0.0.1\r\n:7104\r\n$4\r\nid-e\r\n"
                 b"*3\r\n:10923\r\n:16383\r\n*3\r\n$0\r\n\r\n:7102\r\n$4\r\nid-c\r\n")


def cluster():
    """fuzz_cluster: a settings byte (1 item, spending), then the replies."""
    seeds = {
        "a-and-map": A_ALLOW + CLUSTER_SLOTS,
        "moved-then-a": b"-MOVED 15495 127.0.0.1:2\r\n" + CLUSTER_SLOTS + A_ALLOW,
        "ask-then-ok-a": b"-ASK 15495 127.0.0.1:7102\r\n" + CLUSTER_SLOTS + b"+OK\r\n" + A_ALLOW,
        "moved-empty-host": b"-MOVED 15495 :7102\r\n" + CLUSTER_SLOTS + A_ALLOW,
        "moved-v6": b"-MOVED 15495 [::1]:7102\r\n" + CLUSTER_SLOTS + A_ALLOW,
        "clusterdown": b"-CLUSTERDOWN The cluster is down\r\n" + b"-ERR cluster support disabled\r\n",
        "tryagain": b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n" + CLUSTER_SLOTS,
        "noscript-a": NOSCRIPT + CLUSTER_SLOTS + A_ALLOW,
        "bad-map": A_ALLOW + b"*1\r\n*3\r\n:9\r\n:1\r\n*0\r\n",
    }
    for name, data in seeds.items():
        write("fuzz_cluster", name, b"\x04" + data)


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
    # The TLS options (present bit 8192, after the URL): which are set, to
    # what (2 bits each: 0 a file that serves, 1 a missing one, 2 ""), then
    # tls_verify when bit 32 of `which` says so.
    def tls(url, which, kind=0, verify=None):
        data = struct.pack("<H", 4096 | 8192) if url is not None else struct.pack("<H", 8192)
        data += cap_small(10) + rate_frac(1, 0)
        if url is not None:
            data += bytes([url])
        data += bytes([which, kind])
        if verify is not None:
            data += bytes([verify])
        return data
    seeds.update({
        "tls-rediss-every-file": tls(3, 0x1f),
        "tls-option-with-redis-url": tls(0, 0x01),
        "tls-option-with-unix-url": tls(2, 0x10),
        "tls-missing-ca-file": tls(3, 0x01, kind=1),
        "tls-missing-key": tls(3, 0x0c, kind=0x40),
        "tls-empty-server-name": tls(3, 0x10, kind=2),
        "tls-cert-without-key": tls(3, 0x04),
        "tls-verify-0-with-redis-url": tls(0, 0x20, verify=0),
        "tls-verify-2": tls(3, 0x20, verify=6),
        "tls-verify-0-rediss": tls(3, 0x20, verify=0),
        "tls-options-in-memory": tls(None, 0x3f, verify=0),
    })
    for name, data in seeds.items():
        write("fuzz_options", name, data)


DENIED = (b"-DENIED Redis is running in protected mode because protected mode is enabled and no "
          b"password is set for the default user. In this mode connections are only accepted "
          b"from the loopback interface. If you want to connect from external computers to "
          b"Redis you may adopt one of the following solutions: 1) Just disable protected mode "
          b"sending the command 'CONFIG SET protected-mode no' from the loopback interface by "
          b"connecting to Redis from the same host the server is running, however MAKE SURE "
          b"Redis is not publicly accessible from internet if you do so. Use CONFIG REWRITE to "
          b"make this change permanent. 2) Alternatively you can just disable the protected "
          b"mode by editing the Redis configuration file, and setting the protected mode "
          b"option to 'no', and then restarting the server. 3) If you started the server "
          b"manually just for testing, restart it with the '--protected-mode no' option. 4) "
          b"Setup a an authentication password for the default user. NOTE: You only need to do "
          b"one of the above things in order for the server to start accepting connections "
          b"from the outside.\r\n")


def handshake_input(url, fail, first, second=b"", early=False):
    # settings: URL (0 user+password+db, 1 password, 2 none, 3 rediss), the
    # failure code's index (0 EIO, 1 ETIMEDOUT, 2 ECONNECT, 3 ETLS, 4 ECLOSED),
    # whether the connection fails before sending; then where the probe's
    # reply starts.
    return (bytes([url | fail << 2 | early << 5]) + struct.pack("<H", len(first)) + first +
            second)


def handshake():
    ok, pong = b"+OK\r\n", b"+PONG\r\n"
    seeds = {
        "auth-select-ping": handshake_input(0, 0, ok + ok + pong),
        "auth-ping": handshake_input(1, 0, ok + pong),
        "ping": handshake_input(2, 0, pong),
        "rediss-auth-select-ping": handshake_input(3, 0, ok + ok + pong),
        "wrongpass": handshake_input(0, 0, ERRORS["wrongpass"]),
        "noauth": handshake_input(2, 0, b"-NOAUTH Authentication required.\r\n"),
        "auth-without-password-set": handshake_input(1, 0, (
            b"-ERR AUTH <password> called without any password configured for the default "
            b"user. Are you sure your configuration is correct?\r\n")),
        "select-out-of-range": handshake_input(0, 0, ok + b"-ERR DB index is out of range\r\n"),
        "noperm-ping": handshake_input(0, 0, ok + ok + (
            b"-NOPERM this user has no permissions to run the 'ping' command\r\n")),
        "noperm-select": handshake_input(0, 0, ok + (
            b"-NOPERM this user has no permissions to run the 'select' command\r\n") + pong),
        "maxclients": handshake_input(2, 0, b"-ERR max number of clients reached\r\n"),
        "denied": handshake_input(2, 0, DENIED),
        "loading": handshake_input(2, 0, b"-LOADING Redis is loading the dataset in memory\r\n"),
        "ssh": handshake_input(2, 0, b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n"),
        "http": handshake_input(2, 0, b"HTTP/1.1 400 Bad Request\r\nServer: nginx/1.22.1\r\n"
                                      b"Content-Length: 0\r\nConnection: close\r\n\r\n"),
        # A TLS server's answer to plain bytes: an alert record (fatal,
        # protocol_version / handshake_failure), or a ServerHello's start.
        "tls-alert": handshake_input(2, 0, bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46])),
        "tls-alert-handshake": handshake_input(2, 0, bytes([0x15, 0x03, 0x01, 0x00, 0x02,
                                                            0x02, 0x28])),
        "tls-server-hello": handshake_input(2, 0, bytes([0x16, 0x03, 0x03, 0x00, 0x7a, 0x02,
                                                         0x00, 0x00, 0x76, 0x03, 0x03])),
        # No bytes at all, then the probe over the other transport answers.
        "reset-then-probe-pong": handshake_input(2, 0, b"", pong),
        "reset-then-probe-silence": handshake_input(2, 0, b"", b""),
        "tls-timeout-then-probe-pong": handshake_input(3, 1, b"", pong, early=True),
        "tls-timeout-then-probe-denied": handshake_input(3, 1, b"", DENIED, early=True),
        "tls-timeout-then-probe-tls-alert": handshake_input(
            3, 1, b"", bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46]), early=True),
        "tls-refused": handshake_input(3, 3, b"", early=True),
        "connect-refused": handshake_input(2, 2, b"", early=True),
        "plain-reset-then-probe-pong": handshake_input(0, 0, b"", ok + ok + pong),
        "cancelled": handshake_input(0, 4, ok),
        "cut-mid-reply": handshake_input(0, 0, ok + ok + b"+PO"),
        "pong-then-extra": handshake_input(2, 0, pong + b"+OK\r\n"),
        "resp3-hello-shape": handshake_input(2, 0, b"%1\r\n+server\r\n+redis\r\n"),
        "huge-bulk": handshake_input(2, 0, b"$1073741824\r\n"),
        "deep-array": handshake_input(2, 0, b"*1\r\n" * 200),
    }
    for name, data in seeds.items():
        write("fuzz_handshake", name, data)


if __name__ == "__main__":
    handshake()
    proto()
    op()
    cluster()
    url()
    key()
    options()
    sys.exit(0)
