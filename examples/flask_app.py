"""A Flask app whose limits hold across every worker and machine that shares
one Redis.

    REDIS_URL=redis://127.0.0.1:6379 gunicorn -w 2 --preload 'examples.flask_app:app'

(from the repository's root; without REDIS_URL each process keeps buckets of
its own). Then:

    curl -i localhost:8000/report          # 5 at once, then one every 12 s
    curl -i -H 'X-API-Key: k1' localhost:8000/search

Settings come from FLASK_-prefixed environment variables too (Flask's
from_prefixed_env): behind a reverse proxy, set
FLASK_HIRATE_TRUSTED_PROXIES="127.0.0.1, 10.0.0.0/8" so that clients are
told apart by X-Forwarded-For; FLASK_HIRATE_TIMEOUT=0.05 tightens the Redis
command timeout (seconds).
"""

import os

from flask import Flask, request

from hirate.flask import Limit, RateLimiter, key_header

app = Flask(__name__)
app.config["REDIS_URL"] = os.environ.get("REDIS_URL") or None
app.config.from_prefixed_env()  # FLASK_HIRATE_TIMEOUT=0.05 -> HIRATE_TIMEOUT

# Routes without limits of their own share one budget per client: bursts of
# 100, 10 requests a second sustained.
limiter = RateLimiter(app, default_limits=[Limit(100, 10, name="default")])


@app.get("/")
def index():
    return {"hello": "world", "worker": os.getpid()}


@app.get("/report")
@limiter.limit(5, 1 / 12, name="report")
def report():
    # Expensive work goes here; each client gets 5 at once, then one every 12 s.
    return {"report": "ready", "worker": os.getpid()}


# Per API key (by address when a request has none): bursts of 10 at 1 a
# second, and at most 1000 a day. A request must pass both.
@app.get("/search")
@limiter.limit(10, 1, key=key_header("X-API-Key"), name="burst")
@limiter.limit(1000, 1000 / 86400, key=key_header("X-API-Key"), name="daily")
def search():
    return {"query": request.args.get("q", ""), "results": []}


@app.get("/health")
@limiter.exempt
def health():
    return {"ok": True}
