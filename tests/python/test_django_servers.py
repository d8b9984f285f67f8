"""examples/django_project under real servers, as docs/python.md runs it:
gunicorn with 2 workers and --preload (WSGI: the middleware on hirate.Limiter) and uvicorn
with 2 workers (ASGI: on hirate.AsyncLimiter), each on a redis-server of the
test's own. Concurrent clients hit a route of capacity 5: exactly 5 pass
across both workers, the rest get 429. (The helpers are test_servers'.)
"""

import pytest

from test_servers import check_both_workers_answer, check_exactly_capacity, hammer, request
from test_servers import server  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(180)

REPORT = "rl:{ip:127.0.0.1}|view:examples.django_project.views.report|5/0.08333333333333333"


def check_the_other_routes(s):
    # Default limits, stacked limits per API key (an async view), exempt.
    status, headers, _ = request(s.port, "GET", "/")
    assert (status, headers["ratelimit"]) == (200, '"default";r=99;t=1')
    status, headers, _ = request(s.port, "GET", "/search?q=x", {"X-API-Key": "k1"})
    assert (status, headers["ratelimit"]) == (200, '"burst";r=9;t=1, "daily";r=999;t=87')
    status, headers, _ = request(s.port, "GET", "/health")
    assert (status, "ratelimit" in headers) == (200, False)


def test_gunicorn_two_workers(server, own_redis):  # noqa: F811
    s = server(["gunicorn", "-w", "2", "--preload", "-b", "127.0.0.1:PORT",
                "examples.django_project.wsgi"], "Booting worker", 2)
    check_exactly_capacity(hammer(s.port, "/report"))
    assert own_redis.command("KEYS", "*") == [REPORT]
    check_the_other_routes(s)
    check_both_workers_answer(s)


def test_uvicorn_two_workers(server, own_redis):  # noqa: F811
    s = server(["uvicorn", "examples.django_project.asgi:application", "--workers", "2",
                "--host", "127.0.0.1", "--port", "PORT"], "Application startup complete", 2)
    check_exactly_capacity(hammer(s.port, "/report"))
    assert own_redis.command("KEYS", "*") == [REPORT]
    check_the_other_routes(s)
    check_both_workers_answer(s)
