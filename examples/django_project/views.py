import os

from django.http import JsonResponse

from hirate.django import exempt, key_header, limit


def index(request):
    return JsonResponse({"hello": "world", "worker": os.getpid()})


@limit(5, 1 / 12, name="report")
def report(request):
    # Expensive work goes here; each client gets 5 at once, then one every 12 s.
    return JsonResponse({"report": "ready", "worker": os.getpid()})


# Per API key (by address when a request has none): bursts of 10 at 1 a
# second, and at most 1000 a day. A request must pass both. An async view:
# under ASGI it never blocks the event loop.
@limit(10, 1, key=key_header("X-API-Key"), name="burst")
@limit(1000, 1000 / 86400, key=key_header("X-API-Key"), name="daily")
async def search(request):
    return JsonResponse({"query": request.GET.get("q", ""), "results": []})


@exempt
def health(request):
    return JsonResponse({"ok": True})
