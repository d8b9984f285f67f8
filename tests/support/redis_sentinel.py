"""A throwaway Redis Sentinel group for the tests of every language.

    from redis_sentinel import SentinelGroup          # tests/support on sys.path
    g = SentinelGroup(replicas=1, sentinels=3, tls=None, password=None,
                      sentinel_password=None, acl=None, down_after_ms=1000)
    g.url        # "redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/mymaster"
                 # (rediss+sentinel://localhost:... with tls=make_certs dir: TLS-only ports)
    g.service    # "mymaster"
    g.master     # Node(port, pid, role) — the current master (asked of the servers)
    g.replicas, g.sentinels      # lists of Node
    g.cli(port, *args)           # redis-cli against a node (with the right password/TLS), stdout str
    g.failover()                 # SENTINEL FAILOVER on a sentinel; returns the old master Node
    g.kill_master()              # kill -9 of the master; returns it
    g.wait_switch(old, timeout)  # until every sentinel names a new master whose ROLE is master;
                                 # returns (new Node, time.monotonic() when the switch was seen)
    g.stop()

One master, `replicas` replicas (`replicaof` it) and `sentinels` sentinels
(`redis-sentinel <conf>`, each monitoring the master as "mymaster" with a
quorum of 2, or 1 when there is a single sentinel), every one our own child
on a free loopback port with its own directory under one temporary
directory, so SIGKILL reaches exactly it and nothing is left behind: stop()
runs at interpreter exit too. `password` is the data nodes' requirepass (and
masterauth, so a demoted master syncs from the new one; the sentinels get it
as `sentinel auth-pass`); `sentinel_password` the sentinels' own requirepass
(they use it with each other too). `acl`: a list of ACL SETUSER rule strings,
"name on >pw ~* +@all -function", set on every data node (ACLs are not
replicated). With `tls` (make_certs.sh's directory) every node, sentinels
included, listens for TLS only (port 0, tls-port), replication and the
sentinels' own links are TLS (tls-replication yes) and the URL names
localhost, as the certificate does.

The constructor returns only once every sentinel sees the master, all its
replicas (link up) and all the other sentinels, so a failover works at once.

The command line form is for tests in other languages (tests/support/
sentinel_harness.c):

    python3 tests/support/redis_sentinel.py start [--replicas 1] [--sentinels 3] [--tls DIR]
        [--password PW] [--sentinel-password PW] [--acl RULES]... [--down-after-ms MS]

prints one JSON line {"url":..., "service":..., "master":{"port":..,"pid":..},
"replicas":[{"port":..,"pid":..}...], "sentinels":[...], "dir":...} and then
reads commands on stdin, one a line, answering each with one JSON line
({"error": "..."} when the command failed):

    failover                   SENTINEL FAILOVER; the old master {"port","pid"}
    kill-master                SIGKILL of the master; it, {"port","pid"}
    wait-switch PORT TIMEOUT   until every live sentinel names a master other than
                               PORT that says ROLE master: {"port","pid","seconds"},
                               seconds the CLOCK_MONOTONIC time the switch was seen
                               (Python's time.monotonic(), C's clock_gettime)
    master                     the current master {"port","pid"}
    kill PORT                  SIGKILL of any node (a sentinel too): {"port","pid"}
    settle [TIMEOUT]           waits as the start does (every sentinel sees the master,
                               its live replicas with their links up, the other
                               sentinels): {}
    cli PORT ARG...            redis-cli against a node: {"out": its stdout}
    stop                       {} and stops the group (so does end of input, or SIGTERM)
"""

import argparse
import atexit
import json
import os
import pathlib
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from redis_server import free_port, make_certs  # noqa: E402  (shared with the one-server tests)
from redis_cluster import (ReplyError, _die_with_parent, _encode,  # noqa: E402
                           _free_port_not_in, _read_reply)

__all__ = ["SentinelGroup", "Node", "ReplyError", "make_certs"]

SERVICE = "mymaster"
# How long a failover may take before a sentinel gives it up (and, twice
# that, before it tries again): Redis' default is 3 minutes; the promotion of
# a loopback replica takes about a second.
FAILOVER_TIMEOUT_MS = 5000


class Node:
    """One redis-server or redis-sentinel. port/pid are fixed; role is
    "master", "replica", "sentinel", or "dead" once killed."""

    def __init__(self, port, directory, kind):
        self.port = port
        self.dir = directory
        self.kind = kind        # "data" or "sentinel"
        self.proc = None
        self.pid = None
        self.role = "sentinel" if kind == "sentinel" else None
        self.alive = True

    def __repr__(self):
        return f"Node(port={self.port}, pid={self.pid}, role={self.role!r})"

    def to_json(self):
        return {"port": self.port, "pid": self.pid}


_live = set()


@atexit.register
def _stop_all():
    for g in list(_live):
        g.stop()


class SentinelGroup:
    def __init__(self, replicas=1, sentinels=3, tls=None, password=None,
                 sentinel_password=None, acl=None, down_after_ms=1000, die_with_parent=False):
        self.nreplicas = replicas
        self.nsentinels = sentinels
        self.tls = pathlib.Path(tls) if tls else None
        self.password = password
        self.sentinel_password = sentinel_password
        self.acl = list(acl or [])
        self.down_after_ms = down_after_ms
        self.die_with_parent = die_with_parent
        self.service = SERVICE
        self.dir = tempfile.mkdtemp(prefix="hirate-sentinel-")
        self.data = []          # the master first, as started; roles change with failovers
        self.sentinels = []
        _live.add(self)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    # ---------------------------------------------------------------- building

    @property
    def url(self):
        host = "localhost" if self.tls else "127.0.0.1"
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        return (f"{scheme}://" + ",".join(f"{host}:{s.port}" for s in self.sentinels)
                + f"/{self.service}")

    def _tls_lines(self):
        t = self.tls
        return [f"tls-cert-file {t / 'server.crt'}", f"tls-key-file {t / 'server.key'}",
                f"tls-ca-cert-file {t / 'ca.crt'}", "tls-auth-clients no",
                "tls-replication yes"]

    def _common_lines(self, node):
        ports = ["port 0", f"tls-port {node.port}", *self._tls_lines()] if self.tls \
            else [f"port {node.port}"]
        return [*ports, "bind 127.0.0.1", f"dir {node.dir}",
                f"logfile {os.path.join(node.dir, 'redis.log')}"]

    def _data_conf(self, node, master_port):
        lines = self._common_lines(node) + [
            'save ""', "appendonly no",
            # Replicas sync at once (the default waits 5 s for more replicas).
            "repl-diskless-sync-delay 0"]
        if self.password:
            lines += [f"requirepass {self.password}", f"masterauth {self.password}"]
        if master_port:
            lines.append(f"replicaof 127.0.0.1 {master_port}")
        return lines

    def _sentinel_conf(self, node, master_port):
        quorum = 2 if self.nsentinels >= 2 else 1
        lines = self._common_lines(node) + [
            f"sentinel monitor {self.service} 127.0.0.1 {master_port} {quorum}",
            f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
            f"sentinel failover-timeout {self.service} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {self.service} 1"]
        if self.password:
            lines.append(f"sentinel auth-pass {self.service} {self.password}")
        if self.sentinel_password:
            # The sentinels authenticate to each other with their own requirepass.
            lines.append(f"requirepass {self.sentinel_password}")
        return lines

    def _spawn(self, node, lines):
        conf = os.path.join(node.dir, "node.conf")
        with open(conf, "w") as f:   # a sentinel rewrites its own conf: ours, in its dir
            f.write("\n".join(lines) + "\n")
        binary = "redis-sentinel" if node.kind == "sentinel" else "redis-server"
        preexec = _die_with_parent if self.die_with_parent else None
        node.proc = subprocess.Popen([binary, conf], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=preexec)
        node.pid = node.proc.pid
        node.alive = True

    def _wait_up(self, nodes, timeout):
        deadline = time.monotonic() + timeout
        pending = list(nodes)
        while pending:
            n = pending[0]
            if n.proc.poll() is not None:
                return False
            try:
                if self.command(n, "PING", timeout=0.5) == "PONG":
                    pending.pop(0)
                    continue
            except (OSError, ReplyError):
                pass
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def _start_nodes(self, nodes, lines_of, timeout=5):
        """Spawns nodes on fresh free ports until all answer PING (a port taken
        between free_port() and bind(): again, with another)."""
        for _ in range(5):
            for n in nodes:
                n.port = _free_port_not_in(self._used)
                self._spawn(n, lines_of(n))
            if self._wait_up(nodes, timeout):
                return
            for n in nodes:
                self._reap(n)
                shutil.rmtree(n.dir, ignore_errors=True)
                os.mkdir(n.dir)
        raise RuntimeError(f"{nodes[0].kind} nodes did not start (see the logs under {self.dir})")

    def _start(self):
        self._used = set()
        for i in range(1 + self.nreplicas):
            d = os.path.join(self.dir, f"redis{i}")
            os.mkdir(d)
            self.data.append(Node(0, d, "data"))
        for i in range(self.nsentinels):
            d = os.path.join(self.dir, f"sentinel{i}")
            os.mkdir(d)
            self.sentinels.append(Node(0, d, "sentinel"))
        master = self.data[0]
        self._start_nodes([master], lambda n: self._data_conf(n, None))
        if self.data[1:]:
            self._start_nodes(self.data[1:], lambda n: self._data_conf(n, master.port))
        for n in self.data:
            for rule in self.acl:
                self.command(n, "ACL", "SETUSER", *rule.split())
        self._start_nodes(self.sentinels, lambda n: self._sentinel_conf(n, master.port))
        self.wait_settled(30)

    def wait_settled(self, timeout=30):
        """Until every live replica's link is up and every live sentinel names
        the same master, sees it as a plain master, every live replica (link
        ok) and every other live sentinel: then a failover can start at once."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._settled():
                    break
            except (OSError, ReplyError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the sentinels did not settle (see the logs under {self.dir})")
            time.sleep(0.05)
        self.refresh()

    def _settled(self):
        self.refresh()
        masters = [n for n in self.data if n.alive and n.role == "master"]
        if len(masters) != 1:
            return False
        master = masters[0]
        replicas = {n.port for n in self.data if n.alive and n is not master}
        for n in self.data:
            if n.alive and n is not master:
                info = self.command(n, "INFO", "replication")
                if "master_link_status:up" not in info \
                        or f"master_port:{master.port}\r" not in info:
                    return False
        others = len([s for s in self.sentinels if s.alive]) - 1
        for s in self.sentinels:
            if not s.alive:
                continue
            m = _pairs(self.command(s, "SENTINEL", "MASTER", self.service))
            if int(m["port"]) != master.port or m["flags"] != "master":
                return False
            if int(m["num-other-sentinels"]) != others:
                return False
            seen = {int(r["port"]) for r in map(_pairs, self.command(
                        s, "SENTINEL", "REPLICAS", self.service))
                    if r["flags"] == "slave" and r.get("master-link-status") == "ok"
                    and int(r.get("master-port", 0)) == master.port}
            if not replicas <= seen:
                return False
            peers = [_pairs(p) for p in self.command(s, "SENTINEL", "SENTINELS", self.service)]
            if len([p for p in peers if p["flags"] == "sentinel"]) != others:
                return False
        return True

    # ----------------------------------------------------------------- talking

    def _connect(self, node, timeout):
        s = socket.create_connection(("127.0.0.1", node.port), timeout=timeout)
        if not self.tls:
            return s
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx.wrap_socket(s)

    def _password_of(self, node):
        return self.sentinel_password if node.kind == "sentinel" else self.password

    def command(self, node, *args, timeout=2.0):
        """One command on a fresh connection to node, authenticated as the
        group's default user. Replies: str for simple and bulk strings, int,
        list, None; an error reply raises ReplyError."""
        pw = self._password_of(node)
        cmds = ([("AUTH", pw)] if pw else []) + [args]
        with self._connect(node, timeout) as s:
            s.sendall(b"".join(_encode(c) for c in cmds))
            f = s.makefile("rb")
            replies = [_read_reply(f) for _ in cmds]
        for r in replies:
            if isinstance(r, ReplyError):
                raise r
        return replies[-1]

    def node(self, port):
        for n in self.data + self.sentinels:
            if n.port == port:
                return n
        raise ValueError(f"no node on port {port}")

    def cli(self, port, *args):
        """redis-cli against the node on port, with its password and TLS;
        its stdout."""
        n = self.node(port)
        pw = self._password_of(n)
        argv = ["redis-cli", "-h", "127.0.0.1", "-p", str(port)]
        if self.tls:
            argv += ["--tls", "--cacert", str(self.tls / "ca.crt")]
        if pw:
            argv += ["-a", pw, "--no-auth-warning"]
        r = subprocess.run([*argv, *map(str, args)], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=30)
        return r.stdout

    def refresh(self):
        """Every live data node's role, its own word (ROLE)."""
        for n in self.data:
            if not n.alive:
                n.role = "dead"
                continue
            try:
                role = self.command(n, "ROLE", timeout=1.0)[0]
                n.role = "master" if role == "master" else "replica"
            except (OSError, ReplyError):
                n.role = None

    @property
    def master(self):
        """The live data node that says ROLE master; when more than one does
        (a demoted master before its sentinels reconfigured it), the one the
        sentinels name."""
        self.refresh()
        masters = [n for n in self.data if n.alive and n.role == "master"]
        if len(masters) > 1:
            named = self._named()
            masters = [n for n in masters if n.port == named] or masters
        if not masters:
            raise RuntimeError("no data node says it is the master")
        return masters[0]

    @property
    def replicas(self):
        m = self.master
        return [n for n in self.data if n.alive and n is not m]

    def _named(self):
        """The port the first live sentinel that answers names as master."""
        for s in self.sentinels:
            if s.alive:
                try:
                    addr = self.command(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
                    return int(addr[1])
                except (OSError, ReplyError, TypeError):
                    continue
        return None

    # ----------------------------------------------------------------- faults

    def failover(self, timeout=30):
        """SENTINEL FAILOVER on a live sentinel; returns the old master. A
        sentinel that cannot start one yet (a failover in progress, no replica
        fit to promote yet, such as a just demoted master still syncing) is
        asked again until timeout."""
        old = self.master
        deadline = time.monotonic() + timeout
        while True:
            for s in self.sentinels:
                if not s.alive:
                    continue
                try:
                    self.command(s, "SENTINEL", "FAILOVER", self.service)
                    return old
                except (OSError, ReplyError) as e:
                    last = e
            if time.monotonic() > deadline:
                raise TimeoutError(f"no sentinel started a failover in {timeout} s: {last}")
            time.sleep(0.1)

    def kill(self, node):
        """SIGKILL of any node."""
        if node.proc and node.proc.poll() is None:
            node.proc.kill()
            node.proc.wait()
        node.alive = False
        if node.kind == "data":
            node.role = "dead"
        return node

    def kill_master(self):
        return self.kill(self.master)

    def wait_switch(self, old, timeout=30):
        """Until every live sentinel names one master other than old (a Node or
        a port) and that node says ROLE master; returns (the new master,
        time.monotonic() when that was first seen)."""
        old_port = old if isinstance(old, int) else old.port
        deadline = time.monotonic() + timeout
        while True:
            try:
                named = set()
                for s in self.sentinels:
                    if s.alive:
                        addr = self.command(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                                            self.service, timeout=1.0)
                        named.add(int(addr[1]))
                if len(named) == 1 and old_port not in named:
                    new = self.node(named.pop())
                    if self.command(new, "ROLE", timeout=1.0)[0] == "master":
                        seen = time.monotonic()
                        self.refresh()
                        return new, seen
            except (OSError, ReplyError, TypeError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the sentinels named no new master in {timeout} s")
            time.sleep(0.01)

    # ------------------------------------------------------------------ ending

    def _reap(self, node):
        if node.proc and node.proc.poll() is None:
            node.proc.kill()
        if node.proc:
            node.proc.wait()

    def stop(self):
        """Kills every node and removes the group's directory."""
        for n in self.sentinels + self.data:
            self._reap(n)
            n.alive = False
        shutil.rmtree(self.dir, ignore_errors=True)
        _live.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _pairs(flat):
    """A sentinel's flat [field, value, ...] reply as a dict."""
    if not isinstance(flat, list):
        raise ValueError(f"not a field list: {flat!r}")
    return dict(zip(flat[::2], flat[1::2]))


# --------------------------------------------------------------------- CLI


def _serve(g, infile, out):
    """The command channel of the CLI: one line in, one JSON line out."""
    def say(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    for line in infile:
        words = line.split()
        if not words:
            continue
        cmd, args = words[0], words[1:]
        try:
            if cmd == "stop":
                say({})
                return
            elif cmd == "failover":
                say(g.failover().to_json())
            elif cmd == "kill-master":
                say(g.kill_master().to_json())
            elif cmd == "kill":
                say(g.kill(g.node(int(args[0]))).to_json())
            elif cmd == "wait-switch":
                new, seen = g.wait_switch(int(args[0]), float(args[1]) if len(args) > 1 else 30)
                say({**new.to_json(), "seconds": seen})
            elif cmd == "master":
                say(g.master.to_json())
            elif cmd == "settle":
                g.wait_settled(float(args[0]) if args else 30)
                say({})
            elif cmd == "cli":
                say({"out": g.cli(int(args[0]), *args[1:])})
            else:
                say({"error": f"unknown command {cmd}"})
        except Exception as e:  # the channel answers every line, whatever failed
            say({"error": " ".join(f"{type(e).__name__}: {e}".split())})


def main(argv=None):
    p = argparse.ArgumentParser(description="A throwaway Redis Sentinel group on loopback.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start a group, print it as JSON, serve commands on stdin")
    s.add_argument("--replicas", type=int, default=1)
    s.add_argument("--sentinels", type=int, default=3)
    s.add_argument("--tls", metavar="DIR", help="make_certs.sh's directory (made if missing): TLS-only ports")
    s.add_argument("--password", help="the data nodes' requirepass (the sentinels' auth-pass)")
    s.add_argument("--sentinel-password", help="the sentinels' own requirepass")
    s.add_argument("--acl", action="append", default=[], metavar="RULES",
                   help='"name on >pw ~* +@all -function": ACL SETUSER on every data node')
    s.add_argument("--down-after-ms", type=int, default=1000)
    a = p.parse_args(argv)

    def on_signal(signum, frame):
        raise SystemExit(128 + signum)  # atexit stops the group
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)

    if a.tls:
        make_certs(a.tls)
    g = SentinelGroup(replicas=a.replicas, sentinels=a.sentinels, tls=a.tls,
                      password=a.password, sentinel_password=a.sentinel_password,
                      acl=a.acl, down_after_ms=a.down_after_ms, die_with_parent=True)
    try:
        print(json.dumps({"url": g.url, "service": g.service, "master": g.master.to_json(),
                          "replicas": [n.to_json() for n in g.replicas],
                          "sentinels": [n.to_json() for n in g.sentinels], "dir": g.dir}),
              flush=True)
        _serve(g, sys.stdin, sys.stdout)
    finally:
        g.stop()


if __name__ == "__main__":
    main()
