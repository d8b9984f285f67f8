"""The examples under real servers, as docs/python.md runs them: gunicorn
with 2 workers and --preload serving examples/flask_app.py, uvicorn with 2
workers serving examples/fastapi_app.py, both on a redis-server of the
test's own. Concurrent clients (threads, http.client) hit an expensive route
of capacity 5: exactly 5 pass across the workers, the rest get 429.

Each server runs in a session of its own and is stopped (its whole process
group) when the test ends, also when it fails.
"""

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from redis_server import free_port

# A hang fails the test (and its fixtures still stop the servers).
pytestmark = pytest.mark.timeout(180)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
REQUESTS = 24
THREADS = 8


def request(port, method, path, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def workers_of(pid):
    """The pids of a process' children (the server's workers)."""
    with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
        return [int(p) for p in f.read().split()]


class Server:
    def __init__(self, argv, redis_url):
        self.port = free_port()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("HIRATE_", "FLASK_HIRATE_"))}
        # Generous Redis timeouts, as the examples' docstrings say how: a
        # loaded CI machine must not turn decisions into local fallbacks.
        env.update(REDIS_URL=redis_url, PYTHONUNBUFFERED="1",
                   FLASK_HIRATE_TIMEOUT="5", FLASK_HIRATE_CONNECT_TIMEOUT="5",
                   HIRATE_TIMEOUT="5", HIRATE_CONNECT_TIMEOUT="5")
        self.log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                     "hirate-server-%d.log" % self.port), "a+")
        self.log.truncate(0)   # a log of an earlier run on this port
        self.proc = subprocess.Popen(
            [sys.executable, "-m"] + [a.replace("PORT", str(self.port)) for a in argv],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
            stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, marker, workers):
        """Until `workers` workers have logged `marker` (each is serving) and
        the server answers."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if (self.output().count(marker) >= workers
                        and request(self.port, "GET", "/health")[0] == 200):
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("the server did not start:\n" + self.output())

    def output(self):
        # The server's processes share this file's offset, which the seek
        # moves: the file is opened for appending (O_APPEND), so that they
        # write at its end whatever the offset is.
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # any worker left behind
        except ProcessLookupError:
            pass
        self.log.close()
        os.unlink(self.log.name)


@pytest.fixture
def server(own_redis):
    started = []

    def start(argv, marker, workers):
        s = Server(argv, own_redis.url)
        started.append(s)
        s.wait_ready(marker, workers)
        return s

    yield start
    for s in started:
        s.stop()


def hammer(port, path):
    """REQUESTS concurrent GETs from THREADS threads: [(status, headers, body)]."""
    results = []
    lock = threading.Lock()
    todo = list(range(REQUESTS))

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                todo.pop()
            r = request(port, "GET", path)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == REQUESTS
    return results


def check_exactly_capacity(results):
    statuses = sorted(s for s, _, _ in results)
    assert statuses == [200] * 5 + [429] * (REQUESTS - 5)
    remaining = sorted(h["ratelimit"] for s, h, _ in results if s == 200)
    # Each allowed request saw its own count: 4, 3, 2, 1, 0 left.
    assert [item.split(";")[1] for item in remaining] == ["r=0", "r=1", "r=2", "r=3", "r=4"]
    for s, h, body in results:
        assert h["ratelimit-policy"] == '"report";q=5;w=60'
        if s == 429:
            assert 1 <= int(h["retry-after"]) <= 12
            assert json.loads(body)["violated-policies"] == ["report"]


def check_both_workers_answer(s):
    """Both workers serve (so the 5 above were counted across them): GET /
    answers with the worker's pid."""
    seen = set()
    for _ in range(3):
        seen |= {json.loads(body)["worker"] for _, _, body in hammer(s.port, "/")}
        if len(seen) == 2:
            break
    # (uvicorn's children include multiprocessing's resource tracker.)
    assert len(seen) == 2 and seen <= set(workers_of(s.proc.pid))


def test_gunicorn_two_workers_preload(server, own_redis):
    s = server(["gunicorn", "-w", "2", "--preload", "-b", "127.0.0.1:PORT",
                "examples.flask_app:app"], "Booting worker", 2)
    check_exactly_capacity(hammer(s.port, "/report"))
    assert own_redis.command("KEYS", "*") == ["rl:{ip:127.0.0.1}|ep:report|5/0.08333333333333333"]
    # The other routes: default limits, stacked limits per API key, exempt.
    status, headers, _ = request(s.port, "GET", "/")
    assert (status, headers["ratelimit"]) == (200, '"default";r=99;t=1')
    status, headers, _ = request(s.port, "GET", "/search?q=x", {"X-API-Key": "k1"})
    assert (status, headers["ratelimit"]) == (200, '"burst";r=9;t=1, "daily";r=999;t=87')
    status, headers, _ = request(s.port, "GET", "/health")
    assert (status, "ratelimit" in headers) == (200, False)
    check_both_workers_answer(s)


def test_uvicorn_two_workers(server, own_redis):
    s = server(["uvicorn", "examples.fastapi_app:app", "--workers", "2", "--host",
                "127.0.0.1", "--port", "PORT"], "Application startup complete", 2)
    check_exactly_capacity(hammer(s.port, "/report"))
    assert own_redis.command("KEYS", "*") == [
        "rl:{ip:127.0.0.1}|path:GET /report|5/0.08333333333333333"]
    status, headers, _ = request(s.port, "GET", "/")
    assert (status, headers["ratelimit"]) == (200, '"default";r=99;t=1')
    status, headers, _ = request(s.port, "GET", "/search?q=x", {"X-API-Key": "k1"})
    assert (status, headers["ratelimit"]) == (200, '"burst";r=9;t=1, "daily";r=999;t=87')
    status, headers, _ = request(s.port, "GET", "/health")
    assert (status, "ratelimit" in headers) == (200, False)
    check_both_workers_answer(s)
