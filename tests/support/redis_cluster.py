"""A throwaway Redis Cluster for the tests of every language.

    from redis_cluster import RedisCluster           # tests/support on sys.path
    c = RedisCluster(masters=3, replicas=1, tls=None)  # tls: make_certs dir -> TLS-only ports
                     # masters >= 3 (redis-cli --cluster create wants that many)
                     # full_coverage=True: Redis' default cluster-require-full-coverage yes
    c.url            # "redis+cluster://127.0.0.1:P1,127.0.0.1:P2" (rediss+cluster://localhost:... with tls)
    c.nodes          # [Node(port, pid, role "master"/"replica", id, slots [(lo, hi)...])]
    c.master_of(slot) / c.replica_of(node) / c.kill(node) / c.pause(node) / c.resume(node)
    c.keyslot(key)   # CLUSTER KEYSLOT, Redis' own answer
    c.migrate_slot(slot, src, dst, keys=True)   # SETSLOT IMPORTING/MIGRATING + MIGRATE + NODE
    c.wait_failover(old_master, timeout)        # until a replica took over its slots
    c.stop()

Every node is our own redis-server child on free loopback ports (client
port and cluster bus port both chosen free, so no port + 10000 clash), with
its own directory under one temporary directory, so SIGKILL and SIGSTOP reach
exactly it and nothing is left behind: stop() runs at interpreter exit too.
Unlike Redis' default, the nodes do not require full coverage (see
_spawn). The cluster is built by `redis-cli --cluster create`, and the constructor
returns only once every node says cluster_state:ok, every node agrees on who
owns which slots, and every replica's link to its master is up.

The command line form is for tests in other languages (tests/support/
cluster_harness.c):

    python3 tests/support/redis_cluster.py start --masters 3 --replicas 1 [--tls DIR]

prints one JSON line {"url":..., "nodes":[{"port":..,"pid":..,"role":..,"id":..,
"slots":[[lo,hi]...]}...], "dir":...} and then reads commands on stdin, one a
line, answering each with one line, "ok [words]" or "err <message>":

    nodes                      ok N, then N lines
                               "port pid role id master-id|- lo-hi,lo-hi|- alive|paused|dead"
    kill PORT / pause PORT / resume PORT
    keyslot xHEX...            ok SLOT...  (keys hex-encoded after an "x", so any
                               bytes pass, the empty key as "x")
    where xHEX...              ok PORT...  the live master holding each key, 0: none
    config NAME VALUE          CONFIG SET on every live node
    stats                      ok CALLS REJECTED  (INFO commandstats summed, see stats())
    resetstats                 CONFIG RESETSTAT on every live node
    migrate SLOT SRC DST       SRC, DST: ports of masters; moves the slot's keys too
    begin SLOT SRC DST         IMPORTING on DST, MIGRATING on SRC (ASK from now on)
    move SLOT SRC DST [N]      MIGRATE up to N (default all) of the slot's keys
    finish SLOT DST            SETSLOT NODE on every master
    settle [TIMEOUT]           waits as the start does: every live node ok, agreeing
    failover PORT TIMEOUT      waits for a replica of PORT's node to own its slots: ok NEWPORT
    stop                       stops the cluster (so does end of input, or SIGTERM)
"""

import argparse
import atexit
import binascii
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

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from redis_server import free_port, make_certs  # noqa: E402  (shared with the one-server tests)

__all__ = ["RedisCluster", "Node", "ReplyError", "make_certs"]

NODE_TIMEOUT_MS = 1000


class ReplyError(Exception):
    """An error reply from a node; str() is the whole message."""


class Node:
    """One cluster node. port/pid are fixed; role, id, master_id and slots
    are refreshed from CLUSTER NODES (RedisCluster.refresh)."""

    def __init__(self, port, bus_port, directory):
        self.port = port
        self.bus_port = bus_port
        self.dir = directory
        self.proc = None
        self.pid = None
        self.role = None        # "master" / "replica"
        self.id = None
        self.master_id = None   # a replica's master, else None
        self.slots = []         # [(lo, hi)] a master owns
        self.last_slots = []    # its slots when it was killed or paused
        self.alive = True       # False after kill()
        self.paused = False     # True between pause() and resume()

    def __repr__(self):
        return (f"Node(port={self.port}, pid={self.pid}, role={self.role!r}, "
                f"id={self.id!r}, slots={self.slots!r})")

    def to_json(self):
        return {"port": self.port, "pid": self.pid, "role": self.role, "id": self.id,
                "master_id": self.master_id, "slots": [list(r) for r in self.slots]}


_live = set()


@atexit.register
def _stop_all():
    for c in list(_live):
        c.stop()


class RedisCluster:
    def __init__(self, masters=3, replicas=1, tls=None, die_with_parent=False,
                 full_coverage=False):
        self.masters = masters
        self.full_coverage = full_coverage
        self.replicas = replicas
        self.tls = pathlib.Path(tls) if tls else None
        self.die_with_parent = die_with_parent
        self.dir = tempfile.mkdtemp(prefix="hirate-cluster-")
        self.nodes = []
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
        scheme = "rediss+cluster" if self.tls else "redis+cluster"
        return f"{scheme}://" + ",".join(f"{host}:{n.port}" for n in self.nodes)

    def _tls_args(self):
        t = self.tls
        return ["--tls-cert-file", str(t / "server.crt"), "--tls-key-file", str(t / "server.key"),
                "--tls-ca-cert-file", str(t / "ca.crt"), "--tls-auth-clients", "no",
                "--tls-cluster", "yes", "--tls-replication", "yes"]

    def _spawn(self, node):
        ports = (["--port", "0", "--tls-port", str(node.port), *self._tls_args()] if self.tls
                 else ["--port", str(node.port)])
        args = ["redis-server", *ports, "--bind", "127.0.0.1",
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                "--cluster-port", str(node.bus_port),
                # A replica takes over however long ago it last heard its
                # master: the tests kill masters right after writing.
                "--cluster-replica-validity-factor", "0",
                # Redis' default (yes) stops every shard while one has no
                # master, between a master's failure and its replica's
                # promotion; the tests want the healthy shards to serve on,
                # as most deployments do. full_coverage=True: Redis' default.
                "--cluster-require-full-coverage", "yes" if self.full_coverage else "no",
                # Replicas sync at once (the default waits 5 s for more replicas).
                "--repl-diskless-sync-delay", "0",
                "--save", "", "--appendonly", "no", "--dir", node.dir,
                "--logfile", os.path.join(node.dir, "redis.log")]
        preexec = _die_with_parent if self.die_with_parent else None
        node.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=preexec)
        node.pid = node.proc.pid

    def _start(self):
        total = self.masters * (1 + self.replicas)
        for i in range(total):
            d = os.path.join(self.dir, f"node{i}")
            os.mkdir(d)
            self.nodes.append(Node(0, 0, d))
        for attempt in range(5):
            used = set()
            for n in self.nodes:
                n.port = _free_port_not_in(used)
                n.bus_port = _free_port_not_in(used)
                self._spawn(n)
            if self._wait_all(lambda n: self.command(n, "PING") == "PONG", 5, raise_=False):
                break
            # A port taken between free_port() and bind(): again, with others,
            # and no nodes.conf of the failed try.
            for n in self.nodes:
                self._reap(n)
                shutil.rmtree(n.dir, ignore_errors=True)
                os.mkdir(n.dir)
        else:
            raise RuntimeError("redis-server did not start in cluster mode "
                               f"(see the logs under {self.dir})")
        cli = ["redis-cli", *self._cli_tls(), "--cluster", "create",
               *[f"127.0.0.1:{n.port}" for n in self.nodes],
               "--cluster-replicas", str(self.replicas), "--cluster-yes"]
        r = subprocess.run(cli, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {r.stdout}{r.stderr}")
        self.wait_stable(30)

    def _cli_tls(self):
        return ["--tls", "--cacert", str(self.tls / "ca.crt")] if self.tls else []

    def _wait_all(self, check, timeout, raise_=True):
        deadline = time.monotonic() + timeout
        while True:
            try:
                if all(check(n) for n in self.nodes if n.alive and not n.paused):
                    return True
            except (OSError, ReplyError):
                pass
            if time.monotonic() > deadline:
                if raise_:
                    raise TimeoutError("the cluster did not settle "
                                       f"(see the logs under {self.dir})")
                return False
            time.sleep(0.05)

    def wait_stable(self, timeout=30):
        """Until every live node says cluster_state:ok, all agree on the
        owners of all 16384 slots and on every node's role and master, and
        every replica's link is up."""
        def settled():
            views = set()
            for n in self.nodes:
                if not n.alive or n.paused:
                    continue
                if "cluster_state:ok" not in self.command(n, "CLUSTER", "INFO"):
                    return False
                view = _parse_nodes(self.command(n, "CLUSTER", "NODES"))
                owners = tuple(sorted((tuple(v["slots"]), v["id"]) for v in view.values()
                                      if v["role"] == "master" and v["slots"]))
                if sum(hi - lo + 1 for ranges, _ in owners for lo, hi in ranges) != 16384:
                    return False
                # Roles too: a node that just met the others may still take a
                # replica for a master without slots.
                roles = tuple(sorted((v["id"], v["role"], v["master_id"]) for v in view.values()))
                views.add((owners, roles))
                info = self.command(n, "INFO", "replication")
                if _role_from_info(info) == "slave" and "master_link_status:up" not in info:
                    return False
            return len(views) == 1
        deadline = time.monotonic() + timeout
        while True:
            try:
                if settled():
                    break
            except (OSError, ReplyError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster did not settle (see the logs under {self.dir})")
            time.sleep(0.05)
        self.refresh()

    # ----------------------------------------------------------------- talking

    def _connect(self, node, timeout):
        s = socket.create_connection(("127.0.0.1", node.port), timeout=timeout)
        if not self.tls:
            return s
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx.wrap_socket(s)

    def command(self, node, *args, timeout=2.0):
        """One command on a fresh connection to node. Replies: str for
        simple and bulk strings, int, list, None; an error reply raises
        ReplyError."""
        return self.pipeline(node, [args], timeout=timeout)[0]

    def pipeline(self, node, commands, timeout=2.0, errors=False):
        """Several commands on one connection, sent at once; their replies in
        order. An error reply raises ReplyError after all are read, or with
        errors=True is returned as a ReplyError in its place."""
        with self._connect(node, timeout) as s:
            s.sendall(b"".join(_encode(c) for c in commands))
            f = s.makefile("rb")
            replies = [_read_reply(f) for _ in commands]
        for r in replies:
            if isinstance(r, ReplyError) and not errors:
                raise r
        return replies

    def refresh(self):
        """Updates every node's role, id, master_id and slots. A live node's
        role and master are its own word (its "myself" line), the slots a
        live master's view; a dead or stopped node is as the others see it."""
        views, selves = [], {}
        for n in self.nodes:
            if not n.alive or n.paused:
                continue
            try:
                text = self.command(n, "CLUSTER", "NODES")
            except (OSError, ReplyError):
                continue
            mine = _parse_nodes(text)
            me = next(v for v in mine.values() if v["myself"])
            selves[n.port] = me
            # A master's view first: SETSLOT NODE reaches the masters at
            # once, the replicas by gossip.
            (views.insert(0, mine) if me["role"] == "master" else views.append(mine))
        if not views:
            raise RuntimeError("no cluster node answers")
        by_port = {v["port"]: v for v in views[0].values()}
        for n in self.nodes:
            v = by_port.get(n.port)
            if v:
                n.id, n.role, n.master_id, n.slots = v["id"], v["role"], v["master_id"], v["slots"]
            me = selves.get(n.port)
            if me:
                n.id, n.role, n.master_id = me["id"], me["role"], me["master_id"]
        return self.nodes

    # ----------------------------------------------------------------- queries

    def node(self, port):
        return next(n for n in self.nodes if n.port == port)

    def master_of(self, slot):
        """The master owning slot now (as the live nodes tell)."""
        self.refresh()
        for n in self.nodes:
            if n.role == "master" and any(lo <= slot <= hi for lo, hi in n.slots):
                return n
        raise LookupError(f"no master owns slot {slot}")

    def replica_of(self, node):
        """A live replica of master node (None if it has none)."""
        self.refresh()
        return next((n for n in self.nodes
                     if n.alive and n.role == "replica" and n.master_id == node.id), None)

    def keyslot(self, key):
        """Redis' own slot of key (str or bytes)."""
        return self.keyslots([key])[0]

    def keyslots(self, keys):
        """Redis' own slots of many keys, in one pipeline."""
        n = next(n for n in self.nodes if n.alive and not n.paused)
        return self.pipeline(n, [("CLUSTER", "KEYSLOT", k) for k in keys], timeout=10)

    def where(self, keys):
        """For each key, the live master that holds it (EXISTS), or None."""
        found = [None] * len(keys)
        for n in self.nodes:
            if n.alive and not n.paused and n.role == "master":
                # A key of another master's slot answers MOVED (or ASK): not here.
                replies = self.pipeline(n, [("EXISTS", k) for k in keys], timeout=10, errors=True)
                for i, r in enumerate(replies):
                    if r == 1 and found[i] is None:
                        found[i] = n
        return found

    def _live(self):
        return [n for n in self.nodes if n.alive and not n.paused]

    def config_set(self, name, value):
        """CONFIG SET on every live node."""
        for n in self._live():
            self.command(n, "CONFIG", "SET", name, value)

    def stats(self):
        """(calls, rejected_calls) summed over every command of INFO
        commandstats of the live nodes; a MOVED or ASK answer is a rejected
        call of the command it refused."""
        calls = rejected = 0
        for n in self._live():
            for line in self.command(n, "INFO", "commandstats").splitlines():
                if line.startswith("cmdstat_"):
                    fields = dict(kv.split("=", 1) for kv in line.split(":", 1)[1].split(","))
                    calls += int(fields.get("calls", 0))
                    rejected += int(fields.get("rejected_calls", 0))
        return calls, rejected

    def reset_stats(self):
        for n in self._live():
            self.command(n, "CONFIG", "RESETSTAT")

    # ----------------------------------------------------------------- faults

    def kill(self, node):
        """SIGKILL (its peers see it fail after the node timeout)."""
        node.last_slots = list(node.slots) or node.last_slots
        if node.proc and node.proc.poll() is None:
            os.kill(node.pid, signal.SIGCONT)
            node.proc.kill()
            node.proc.wait()
        node.alive = False
        node.paused = False

    def pause(self, node):
        """SIGSTOP: the node hangs with its sockets open."""
        node.last_slots = list(node.slots) or node.last_slots
        os.kill(node.pid, signal.SIGSTOP)
        node.paused = True

    def resume(self, node):
        os.kill(node.pid, signal.SIGCONT)
        node.paused = False

    def wait_failover(self, old_master, timeout=10):
        """Waits until another node (its replica) is a master owning all the
        slots old_master owned when it was killed or paused, and every live
        node says cluster_state:ok; returns the new master."""
        slots = list(old_master.last_slots or old_master.slots)
        if not slots:
            raise ValueError(f"{old_master!r} owns no slots")
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.refresh()
                new = next((n for n in self.nodes if n is not old_master and n.alive
                            and not n.paused and n.role == "master"
                            and _covers(n.slots, slots)), None)
                if new and all("cluster_state:ok" in self.command(n, "CLUSTER", "INFO")
                               for n in self.nodes if n.alive and not n.paused):
                    return new
            except (OSError, ReplyError, RuntimeError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no replica of {old_master.port} took over in {timeout} s")
            time.sleep(0.05)

    # -------------------------------------------------------------- resharding

    def begin_migration(self, slot, src, dst):
        """IMPORTING on dst, MIGRATING on src: from now on src answers ASK
        for the slot's keys it no longer holds."""
        self.command(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.id)
        self.command(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id)

    def move_keys(self, slot, src, dst, count=None):
        """MIGRATEs up to count (None: all) of the slot's keys from src to
        dst; returns how many moved."""
        moved = 0
        while count is None or moved < count:
            batch = 100 if count is None else min(100, count - moved)
            keys = self.command(src, "CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            # Over TLS the source's MIGRATE connection is TLS too (tls-cluster).
            self.command(src, "MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys,
                         timeout=10)
            moved += len(keys)
        return moved

    def finish_migration(self, slot, dst):
        """SETSLOT NODE dst on dst first, then on every other live master
        (a master left out would learn it from gossip, later)."""
        self.command(dst, "CLUSTER", "SETSLOT", slot, "NODE", dst.id)
        for n in self.nodes:
            if n is not dst and n.alive and not n.paused and n.role == "master":
                self.command(n, "CLUSTER", "SETSLOT", slot, "NODE", dst.id)
        self.refresh()

    def migrate_slot(self, slot, src, dst, keys=True):
        """Moves slot from master src to master dst, as redis-cli --cluster
        reshard does: IMPORTING/MIGRATING, MIGRATE of its keys (keys=False:
        the caller moves them, or there are none), then SETSLOT NODE."""
        self.begin_migration(slot, src, dst)
        if keys:
            self.move_keys(slot, src, dst)
        self.finish_migration(slot, dst)

    # ------------------------------------------------------------------ ending

    def _reap(self, node):
        if node.proc and node.proc.poll() is None:
            try:
                os.kill(node.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            node.proc.kill()
        if node.proc:
            node.proc.wait()

    def stop(self):
        """Kills every node and removes the cluster's directory."""
        for n in self.nodes:
            self._reap(n)
            n.alive = False
        shutil.rmtree(self.dir, ignore_errors=True)
        _live.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# ------------------------------------------------------------------ helpers


def _die_with_parent():
    # Linux: the node gets SIGKILL when the harness process dies, however it
    # dies (SIGKILL of a test runner included), so no node outlives it.
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _free_port_not_in(used):
    while True:
        p = free_port()
        if p not in used:
            used.add(p)
            return p


def _covers(ranges, wanted):
    return all(any(a <= lo and hi <= b for a, b in ranges) for lo, hi in wanted)


def _role_from_info(info):
    for line in info.splitlines():
        if line.startswith("role:"):
            return line[5:].strip()
    return None


def _parse_nodes(text):
    """CLUSTER NODES → {id: {id, port, role, master_id, slots, myself, failed}}."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) < 8:
            continue
        addr = f[1].split("@")[0]
        port = int(addr.rsplit(":", 1)[1]) if ":" in addr else 0
        flags = f[2].split(",")
        slots = []
        for s in f[8:]:
            if s.startswith("["):
                continue  # a migration in progress, not ownership
            lo, _, hi = s.partition("-")
            slots.append((int(lo), int(hi or lo)))
        out[f[0]] = {"id": f[0], "port": port,
                     "role": "master" if "master" in flags else "replica",
                     "master_id": None if f[3] == "-" else f[3],
                     "slots": sorted(slots), "myself": "myself" in flags,
                     "failed": "fail" in flags or "fail?" in flags}
    return out


def _encode(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def _read_reply(f):
    line = f.readline()
    if not line:
        raise ConnectionError("the node closed the connection")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        return ReplyError(rest.decode(errors="replace"))
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        return f.read(n + 2)[:-2].decode(errors="surrogateescape")
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_reply(f) for _ in range(n)]
    raise ValueError(f"unexpected reply {line!r}")


# --------------------------------------------------------------------- CLI


def _unhex(word):
    return binascii.unhexlify(word[1:] if word.startswith("x") else word)


def _serve(c, infile, out):
    """The command channel of the CLI: one line in, one answer out."""
    def say(s):
        out.write(s + "\n")
        out.flush()

    for line in infile:
        words = line.split()
        if not words:
            continue
        cmd, args = words[0], words[1:]
        try:
            if cmd == "stop":
                say("ok")
                return
            elif cmd == "nodes":
                c.refresh()
                lines = [f"ok {len(c.nodes)}"]
                for n in c.nodes:
                    slots = ",".join(f"{lo}-{hi}" for lo, hi in n.slots) or "-"
                    state = "dead" if not n.alive else "paused" if n.paused else "alive"
                    lines.append(f"{n.port} {n.pid} {n.role} {n.id} {n.master_id or '-'} {slots} {state}")
                say("\n".join(lines))
            elif cmd in ("kill", "pause", "resume"):
                getattr(c, cmd)(c.node(int(args[0])))
                say("ok")
            elif cmd == "keyslot":
                keys = [_unhex(a) for a in args]
                say("ok " + " ".join(str(s) for s in c.keyslots(keys)))
            elif cmd == "where":
                found = c.where([_unhex(a) for a in args])
                say("ok " + " ".join(str(n.port if n else 0) for n in found))
            elif cmd == "config":
                c.config_set(args[0], " ".join(args[1:]))
                say("ok")
            elif cmd == "stats":
                calls, rejected = c.stats()
                say(f"ok {calls} {rejected}")
            elif cmd == "resetstats":
                c.reset_stats()
                say("ok")
            elif cmd == "settle":
                c.wait_stable(float(args[0]) if args else 30)
                say("ok")
            elif cmd == "migrate":
                c.migrate_slot(int(args[0]), c.node(int(args[1])), c.node(int(args[2])))
                say("ok")
            elif cmd == "begin":
                c.begin_migration(int(args[0]), c.node(int(args[1])), c.node(int(args[2])))
                say("ok")
            elif cmd == "move":
                count = int(args[3]) if len(args) > 3 else None
                say(f"ok {c.move_keys(int(args[0]), c.node(int(args[1])), c.node(int(args[2])), count)}")
            elif cmd == "finish":
                c.finish_migration(int(args[0]), c.node(int(args[1])))
                say("ok")
            elif cmd == "failover":
                old = c.node(int(args[0]))
                new = c.wait_failover(old, float(args[1]) if len(args) > 1 else 10)
                say(f"ok {new.port}")
            else:
                say(f"err unknown command {cmd}")
        except Exception as e:  # the channel answers every line, whatever failed
            say("err " + " ".join(f"{type(e).__name__}: {e}".split()))


def main(argv=None):
    p = argparse.ArgumentParser(description="A throwaway Redis Cluster on loopback.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start a cluster, print it as JSON, serve commands on stdin")
    s.add_argument("--masters", type=int, default=3)
    s.add_argument("--replicas", type=int, default=1)
    s.add_argument("--tls", metavar="DIR", help="make_certs.sh's directory (made if missing): TLS-only ports")
    s.add_argument("--full-coverage", action="store_true",
                   help="cluster-require-full-coverage yes (Redis' default; the harness' is no)")
    a = p.parse_args(argv)

    def on_signal(signum, frame):
        raise SystemExit(128 + signum)  # atexit stops the cluster
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)

    if a.tls:
        make_certs(a.tls)
    c = RedisCluster(masters=a.masters, replicas=a.replicas, tls=a.tls, die_with_parent=True,
                     full_coverage=a.full_coverage)
    try:
        print(json.dumps({"url": c.url, "nodes": [n.to_json() for n in c.nodes], "dir": c.dir}),
              flush=True)
        _serve(c, sys.stdin, sys.stdout)
    finally:
        c.stop()


if __name__ == "__main__":
    main()
