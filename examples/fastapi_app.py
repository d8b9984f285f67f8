"""A FastAPI app whose limits hold across every worker and machine that
shares one Redis, on the event loop (hirate.AsyncLimiter never blocks it).

    REDIS_URL=redis://127.0.0.1:6379 uvicorn examples.fastapi_app:app --workers 2

(from the repository's root; without REDIS_URL each process keeps buckets of
its own). Then:

    curl -i localhost:8000/report          # 5 at once, then one every 12 s
    curl -i -H 'X-API-Key: k1' localhost:8000/search

Behind a reverse proxy, set HIRATE_TRUSTED_PROXIES to its addresses
("127.0.0.1, 10.0.0.0/8") so that clients are told apart by X-Forwarded-For.
(uvicorn itself already rewrites the client's address from X-Forwarded-For
for the peers of its --forwarded-allow-ips, 127.0.0.1 by default.)
HIRATE_TIMEOUT and HIRATE_CONNECT_TIMEOUT (seconds) tune the Redis timeouts.
"""

import os

from fastapi import Depends, FastAPI

from hirate.asgi import Limit, RateLimiter, RateLimitExceeded, RateLimitMiddleware, key_header


def env_seconds(name, default):
    value = os.environ.get(name)
    return float(value) if value else default


limiter = RateLimiter(
    url=os.environ.get("REDIS_URL") or None,
    trusted_proxies=[p for p in os.environ.get("HIRATE_TRUSTED_PROXIES", "").split(",")
                     if p.strip()],
    timeout=env_seconds("HIRATE_TIMEOUT", 0.1),
    connect_timeout=env_seconds("HIRATE_CONNECT_TIMEOUT", 0.25),
    # Paths that no pattern below matches share one budget per client:
    # bursts of 100, 10 requests a second sustained.
    default_limits=[Limit(100, 10, name="default")],
    routes={
        # Expensive: 5 at once, then one every 12 s, per client.
        "GET /report": Limit(5, 1 / 12, name="report"),
        # /search has its limits in its dependency; /health has none.
        "/search": [],
        "/health": [],
    },
)

app = FastAPI()
app.add_middleware(RateLimitMiddleware, limiter=limiter)
# A refusing dependency answers as the middleware does (problem+json).
app.add_exception_handler(RateLimitExceeded, limiter.exception_handler)


@app.get("/")
async def index():
    return {"hello": "world", "worker": os.getpid()}


@app.get("/report")
async def report():
    return {"report": "ready", "worker": os.getpid()}


# Per API key (by address when a request has none): bursts of 10 at 1 a
# second, and at most 1000 a day. A request must pass both; the dependency
# adds the RateLimit headers to the response.
search_limits = limiter.limits(
    Limit(10, 1, key=key_header("X-API-Key"), name="burst"),
    Limit(1000, 1000 / 86400, key=key_header("X-API-Key"), name="daily"),
)


@app.get("/search", dependencies=[Depends(search_limits)])
async def search(q: str = ""):
    return {"query": q, "results": []}


@app.get("/health")
async def health():
    return {"ok": True}
