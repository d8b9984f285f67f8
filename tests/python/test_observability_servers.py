"""An outage under real servers: gunicorn (2 workers, --preload) serving
examples/flask_app.py and uvicorn (2 workers) serving
examples/fastapi_app.py, on a redis-server of the test's own with a
password. The app configures logging (as docs/python.md says to); Redis
hangs (SIGSTOP) while requests keep coming, then comes back. The server's
output holds, for each worker, exactly one WARNING when the outage began
and one INFO when Redis answered again, with the real port and never the
password; and each worker's /metrics shows its own breaker's figures."""

import http.client
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from redis_server import RedisServer, free_port

pytestmark = pytest.mark.timeout(240)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PASSWORD = "s3cr3t-pw"
LINE = re.compile(r"^(\d+) (WARNING|INFO) hirate: (.*)$", re.M)

# The apps as the examples are, with logging configured and the hirate
# figures of each worker on /metrics, followed by a line naming the worker.
FLASK_APP = '''
import logging, os
logging.basicConfig(level=logging.INFO, format="%(process)d %(levelname)s %(name)s: %(message)s")
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
import hirate.prometheus
from examples.flask_app import app, limiter
hirate.prometheus.register(limiter, name="web")

@app.get("/metrics")
@limiter.exempt
def metrics():
    body = generate_latest() + b"# worker %d\\n" % os.getpid()
    return body, {"Content-Type": CONTENT_TYPE_LATEST}
'''
ASGI_APP = '''
import logging, os
logging.basicConfig(level=logging.INFO, format="%(process)d %(levelname)s %(name)s: %(message)s")
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response
import hirate.prometheus
from examples.fastapi_app import app as limited, limiter
hirate.prometheus.register(limiter, name="api")

async def app(scope, receive, send):   # /metrics outside the limits
    if scope["type"] == "http" and scope["path"] == "/metrics":
        body = generate_latest() + b"# worker %d\\n" % os.getpid()
        return await Response(body, media_type=CONTENT_TYPE_LATEST)(scope, receive, send)
    return await limited(scope, receive, send)
'''


def request(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


class Server:
    def __init__(self, argv, redis_url, app_dir):
        self.port = free_port()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("HIRATE_", "FLASK_HIRATE_"))}
        # Short Redis timeouts, so that the outage is quick to see: each
        # request during it waits at most 0.2 s for Redis.
        env.update(REDIS_URL=redis_url, PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join([app_dir, ROOT]),
                   FLASK_HIRATE_TIMEOUT="0.2", FLASK_HIRATE_CONNECT_TIMEOUT="0.5",
                   HIRATE_TIMEOUT="0.2", HIRATE_CONNECT_TIMEOUT="0.5")
        self.log = open(os.path.join(app_dir, "server-%d.log" % self.port), "a+")
        self.log.truncate(0)   # a log of an earlier run on this port
        self.proc = subprocess.Popen(
            [sys.executable, "-m"] + [a.replace("PORT", str(self.port)) for a in argv],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
            stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, marker, workers):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if (self.output().count(marker) >= workers
                        and request(self.port, "/health")[0] == 200):
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

    def records(self):
        """[(pid, level, message)] of the logger hirate."""
        return [(int(p), lvl, msg) for p, lvl, msg in LINE.findall(self.output())]

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log.close()


def hammer_until(port, done, seconds=30, threads=6):
    """GET / from several threads until done() or the deadline; how many."""
    stop = threading.Event()
    count = [0]
    lock = threading.Lock()

    def worker():
        while not stop.is_set():
            try:
                request(port, "/")
            except OSError:
                pass
            with lock:
                count[0] += 1

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    deadline = time.monotonic() + seconds
    try:
        while not done() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in ts:
            t.join(15)
    return done()


@pytest.fixture
def pw_redis():
    server = RedisServer(extra=["--requirepass", PASSWORD])
    yield server
    server.close()


@pytest.fixture
def serve(pw_redis, tmp_path):
    started = []

    def start(argv, app, marker):
        (tmp_path / "obs_app.py").write_text(app)
        s = Server(argv, f"redis://:{PASSWORD}@127.0.0.1:{pw_redis.port}", str(tmp_path))
        started.append(s)
        s.wait_ready(marker, 2)
        return s

    yield start
    for s in started:
        s.stop()


def outage(s, redis):
    """Both workers decide through Redis; Redis hangs while requests keep
    coming, until both workers have warned (and a little more, so that
    failed probes happen); then it is back, until both have said so."""
    def pids(level):
        return {pid for pid, lvl, _ in s.records() if lvl == level}

    assert hammer_until(s.port, lambda: False, seconds=1.0) is False   # warm: both connect
    assert s.records() == []
    redis.stop()
    try:
        assert hammer_until(s.port, lambda: len(pids("WARNING")) == 2), s.output()
        hammer_until(s.port, lambda: False, seconds=1.5)   # more calls, failed probes
    finally:
        redis.cont()
    assert hammer_until(s.port, lambda: len(pids("INFO")) == 2), s.output()
    hammer_until(s.port, lambda: False, seconds=1.0)   # calls after: nothing more to say


def check_one_pair_per_worker(s, port, policy="local"):
    recs = s.records()
    by_pid = {}
    for pid, lvl, msg in recs:
        by_pid.setdefault(pid, []).append((lvl, msg))
    assert len(by_pid) == 2, s.output()
    for pid, got in by_pid.items():
        assert [lvl for lvl, _ in got] == ["WARNING", "INFO"], s.output()
        assert re.fullmatch(r"Redis at 127\.0\.0\.1:%d failed \(.+\): the '%s' policy "
                            r"decides until it answers again" % (port, policy), got[0][1])
        assert re.fullmatch(r"Redis at 127\.0\.0\.1:%d answers again, after \d+\.\d s" % port,
                            got[1][1])
    assert PASSWORD not in s.output()
    return set(by_pid)


def metrics_of_workers(s, name):
    """{pid: {sample: value}} of the workers' /metrics, asked until both
    answered (each scrape is one worker's)."""
    seen = {}
    deadline = time.monotonic() + 30
    while len(seen) < 2 and time.monotonic() < deadline:
        status, body = request(s.port, "/metrics")
        assert status == 200
        text = body.decode()
        values = dict(re.findall(r'^(hirate_\w+)\{limiter="%s"\} (\S+)$' % name, text, re.M))
        seen[int(re.search(r"^# worker (\d+)$", text, re.M).group(1))] = values
    return seen


def check_metrics(seen, workers):
    """Each worker's scrape shows its own limiters' one outage."""
    assert set(seen) == workers
    for values in seen.values():
        assert values["hirate_breaker_opens_total"] == "1.0"
        assert values["hirate_breaker_closes_total"] == "1.0"


def test_gunicorn_two_workers_log_one_outage_each(serve, pw_redis):
    s = serve(["gunicorn", "-w", "2", "--preload", "-b", "127.0.0.1:PORT", "obs_app:app"],
              FLASK_APP, "Booting worker")
    outage(s, pw_redis)
    workers = check_one_pair_per_worker(s, pw_redis.port)
    check_metrics(metrics_of_workers(s, "web"), workers)


def test_uvicorn_two_workers_log_one_outage_each(serve, pw_redis):
    s = serve(["uvicorn", "obs_app:app", "--workers", "2", "--host", "127.0.0.1", "--port",
               "PORT"], ASGI_APP, "Application startup complete")
    outage(s, pw_redis)
    workers = check_one_pair_per_worker(s, pw_redis.port)
    check_metrics(metrics_of_workers(s, "api"), workers)
