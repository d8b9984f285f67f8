"""hirate.prometheus: the families and samples a scrape gets (parsed back
from prometheus_client's text exposition), labels that never hold a key,
register() and LimiterCollector, the web integrations as one limiter each,
and the message when prometheus_client is missing."""

import asyncio
import math
import subprocess
import sys

import pytest

import hirate

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import hirate.prometheus  # noqa: E402

pytestmark = pytest.mark.timeout(60)

FAMILIES = {
    "hirate_decisions": "counter", "hirate_refused": "counter", "hirate_peeks": "counter",
    "hirate_errors": "counter", "hirate_breaker_opens": "counter",
    "hirate_breaker_closes": "counter", "hirate_connections": "counter",
    "hirate_connections_dropped": "counter", "hirate_redis_round_trip_seconds": "histogram",
}
LE = ["0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05",
      "0.1", "0.25", "0.5", "1.0", "+Inf"]


def scrape(registry):
    """{(sample name, frozenset of labels): value} of one scrape, and the
    families' types."""
    text = generate_latest(registry).decode()
    samples, types = {}, {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            samples[s.name, frozenset(s.labels.items())] = s.value
    return samples, types, text


def sample(samples, name, **labels):
    return samples[name, frozenset(labels.items())]


def test_a_scrape_has_every_family_and_the_exact_figures():
    reg = CollectorRegistry()
    lim = hirate.Limiter(capacity=3, rate=1e-6)
    hirate.prometheus.register(lim, name="api", registry=reg)
    for _ in range(5):
        lim.allow("k")
    lim.peek("k")
    with pytest.raises(hirate.ConfigError):
        lim.allow("")
    samples, types, _ = scrape(reg)
    assert types == FAMILIES
    assert sample(samples, "hirate_decisions_total", limiter="api", source="local") == 5
    for source in ("redis", "cache", "fail_open", "fail_closed"):
        assert sample(samples, "hirate_decisions_total", limiter="api", source=source) == 0
    assert sample(samples, "hirate_refused_total", limiter="api") == 2
    assert sample(samples, "hirate_peeks_total", limiter="api") == 1
    assert sample(samples, "hirate_errors_total", limiter="api", code="EKEY") == 1
    assert sample(samples, "hirate_errors_total", limiter="api", code="ETIMEDOUT") == 0
    for name in ("breaker_opens", "breaker_closes", "connections", "connections_dropped"):
        assert sample(samples, "hirate_%s_total" % name, limiter="api") == 0
    assert sample(samples, "hirate_redis_round_trip_seconds_count", limiter="api") == 0
    # every code is there from the start (rate() sees the first error)
    assert len([k for k in samples if k[0] == "hirate_errors_total"]) == 21


def test_the_histogram_is_the_round_trips_cumulative(own_redis):
    reg = CollectorRegistry()
    lim = hirate.Limiter(own_redis.url, capacity=100, rate=1.0, timeout=5, connect_timeout=5)
    hirate.prometheus.register(lim, name="redis", registry=reg)
    for _ in range(20):
        lim.allow("k")
    stats = lim.stats()
    samples, _, _ = scrape(reg)
    buckets = [sample(samples, "hirate_redis_round_trip_seconds_bucket", limiter="redis", le=le)
               for le in LE]
    assert buckets == [n for _, n in stats.latency_buckets]
    assert buckets == sorted(buckets) and buckets[-1] == stats.latency_count > 0
    assert sample(samples, "hirate_redis_round_trip_seconds_count",
                  limiter="redis") == stats.latency_count
    assert math.isclose(sample(samples, "hirate_redis_round_trip_seconds_sum", limiter="redis"),
                        stats.latency_sum)
    assert sample(samples, "hirate_connections_total", limiter="redis") == 1
    assert sample(samples, "hirate_decisions_total", limiter="redis", source="redis") == 20


def test_labels_never_hold_a_key():
    reg = CollectorRegistry()
    lim = hirate.Limiter(capacity=1, rate=1e-6)
    hirate.prometheus.register(lim, name="api", registry=reg)
    lim.allow("first")
    before, _, _ = scrape(reg)
    for i in range(1000):
        lim.allow("client-%d" % i)
    after, _, text = scrape(reg)
    assert set(after) == set(before)   # as many series for 1 key as for 1001
    assert "client-" not in text and "first" not in text
    assert sample(after, "hirate_decisions_total", limiter="api", source="local") == 1001


def test_register_keeps_one_collector_a_registry():
    reg = CollectorRegistry()
    a, b = hirate.Limiter(capacity=1, rate=1.0), hirate.Limiter(capacity=1, rate=1.0)
    c1 = hirate.prometheus.register(a, name="a", registry=reg)
    c2 = hirate.prometheus.register(b, name="b", registry=reg)
    assert c1 is c2
    a.allow("k")
    samples, _, _ = scrape(reg)
    assert sample(samples, "hirate_decisions_total", limiter="a", source="local") == 1
    assert sample(samples, "hirate_decisions_total", limiter="b", source="local") == 0
    with pytest.raises(ValueError, match="'a' is in this collector already"):
        hirate.prometheus.register(b, name="a", registry=reg)
    hirate.prometheus.unregister("a", registry=reg)
    samples, _, _ = scrape(reg)
    assert {dict(k[1])["limiter"] for k in samples} == {"b"}
    with pytest.raises(KeyError):
        hirate.prometheus.unregister("a", registry=reg)
    with pytest.raises(TypeError):
        hirate.prometheus.register(object(), name="x", registry=reg)
    with pytest.raises(TypeError):
        hirate.prometheus.register(a, name="", registry=reg)


def test_a_collector_of_its_own_and_a_closed_limiter():
    lim = hirate.Limiter(capacity=1, rate=1e-6)
    alim = hirate.AsyncLimiter(capacity=1, rate=1e-6)
    collector = hirate.prometheus.LimiterCollector({"sync": lim, "async": alim})
    reg = CollectorRegistry()
    reg.register(collector)
    lim.allow("k")
    lim.allow("k")
    asyncio.run(alim.allow("k"))
    lim.close()
    samples, _, _ = scrape(reg)
    assert sample(samples, "hirate_decisions_total", limiter="sync", source="local") == 2
    assert sample(samples, "hirate_refused_total", limiter="sync") == 1
    assert sample(samples, "hirate_decisions_total", limiter="async", source="local") == 1


def test_describe_asks_no_limiter():
    class Watched:
        asked = 0

        def stats(self):
            Watched.asked += 1
            return hirate.Stats.zero()

    reg = CollectorRegistry()   # auto_describe: describe(), else collect()
    hirate.prometheus.register(Watched(), name="w", registry=reg)
    assert Watched.asked == 0
    scrape(reg)
    assert Watched.asked == 1


def test_without_prometheus_client_the_import_says_what_to_install():
    code = ("import sys; sys.modules['prometheus_client'] = None\n"
            "try:\n    import hirate.prometheus\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out == ("hirate.prometheus needs prometheus_client, which is not installed: "
                   "pip install prometheus_client\n")
