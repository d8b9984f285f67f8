"""A Django project whose limits hold across every worker and machine that
shares one Redis.

    REDIS_URL=redis://127.0.0.1:6379 gunicorn -w 2 --preload examples.django_project.wsgi
    REDIS_URL=redis://127.0.0.1:6379 uvicorn examples.django_project.asgi:application --workers 2

(from the repository's root; without REDIS_URL each process keeps buckets of
its own). Under gunicorn (WSGI) the middleware decides on hirate.Limiter,
under uvicorn (ASGI) on hirate.AsyncLimiter. Then:

    curl -i localhost:8000/report          # 5 at once, then one every 12 s
    curl -i -H 'X-API-Key: k1' localhost:8000/search

Behind a reverse proxy, set HIRATE_TRUSTED_PROXIES below (e.g. "127.0.0.1,
10.0.0.0/8") so that clients are told apart by X-Forwarded-For;
HIRATE_TIMEOUT=0.05 in the environment tightens the Redis command timeout
(seconds).
"""

import os

from hirate.django import Limit

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "an-example-secret-key")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "examples.django_project.urls"
INSTALLED_APPS = []
MIDDLEWARE = [
    "django.middleware.common.CommonMiddleware",
    "hirate.django.RateLimitMiddleware",
]
USE_TZ = True

HIRATE_URL = os.environ.get("REDIS_URL") or None
# Views without limits of their own share one budget per client: bursts of
# 100, 10 requests a second sustained.
HIRATE_DEFAULT_LIMITS = [Limit(100, 10, name="default")]
HIRATE_TIMEOUT = float(os.environ.get("HIRATE_TIMEOUT", "0.1"))
HIRATE_CONNECT_TIMEOUT = float(os.environ.get("HIRATE_CONNECT_TIMEOUT", "0.25"))
