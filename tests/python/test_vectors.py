"""The shared test vectors (tests/vectors/token_bucket.json) through the
Python API: every case, on the memory backend and on a real redis-server
(with and without the deny cache; through Redis Functions, FCALL, and with
functions=False through EVALSHA), with the time injected through
Limiter._decide_at. Every field a vector gives is compared exactly, and the
float fields must be the very same numbers in seconds. A case of several
bands ({"bands": [...]}) is a Limiter(limits=[(capacity, rate[, name]), ...]),
and each band's figures (Decision.bands) are compared too; a "reconfigure"
step goes on with a new limiter of the step's config and the same prefix
(Redis only: a memory backend's bands cannot change under it)."""

import json
import math
import pathlib

import pytest

import hirate

VECTORS = pathlib.Path(__file__).resolve().parents[1] / "vectors" / "token_bucket.json"
DOC = json.loads(VECTORS.read_text(encoding="utf-8"))
assert DOC["version"] == 1, "a vector file of a version this runner does not know"
CASES = DOC["cases"]


def key_bytes(spec):
    """A vector key in any of its three spellings. JSON strings stay str, so
    that the str path (UTF-8) is what they exercise."""
    if isinstance(spec, str):
        return spec
    if "hex" in spec:
        return bytes.fromhex(spec["hex"])
    return (spec["repeat"] * spec["times"]).encode("utf-8")


def rate_of(value):
    return float(value)   # "nan", "inf", "-inf" and numbers alike


def short(error_name):
    assert error_name.startswith("HIRATE_")
    return error_name[len("HIRATE_"):]


# "/evalsha": functions=False, the script by EVALSHA; else FCALL of the
# function library (Redis 7).
BACKENDS = ["memory", "redis", "redis+cache", "redis/evalsha", "redis+cache/evalsha"]


def limit_of(cfg):
    """The limiter arguments of a vector config: capacity and rate, or the
    bands as limits=[(capacity, rate[, name]), ...]."""
    if "bands" in cfg:
        return dict(limits=[(b["capacity"], rate_of(b["rate"]))
                            + ((b["name"],) if "name" in b else ()) for b in cfg["bands"]])
    return dict(capacity=cfg["capacity"], rate=rate_of(cfg["rate"]))


def first_capacity(cfg):
    return cfg["bands"][0]["capacity"] if "bands" in cfg else cfg["capacity"]


def make(backend, case, url, cfg=None):
    cfg = case["config"] if cfg is None else cfg
    kw = dict(limit_of(cfg), prefix=f"vec:{case['id']}:")
    if backend == "memory":
        return hirate.Limiter(**kw)
    # A slow CI machine must not turn into a fallback: generous timeouts,
    # and a policy that would show up as a wrong source.
    return hirate.Limiter(url, connect_timeout=5, timeout=5, on_error="closed",
                          deny_cache=backend.startswith("redis+cache"),
                          functions=not backend.endswith("/evalsha"), **kw)


def check_path(backend, lim, where):
    """Every call went the backend's way: FCALL only, or EVALSHA only."""
    s = lim._stats()
    if backend == "memory":
        assert s["fcall"] + s["evalsha"] + s["eval"] == 0, where
    elif backend.endswith("/evalsha"):
        assert (s["fcall"], s["function_loads"]) == (0, 0), where
    else:
        assert (s["evalsha"], s["eval"]) == (0, 0), where
    return s["fcall"] + s["evalsha"]


def check_figures(d, want, t, where):
    """A decision's (or a band's) figures are exactly the vector's."""
    retry = None if want["retry_after_us"] == "never" else want["retry_after_us"]
    got = dict(allowed=d.allowed, remaining=d.remaining, retry_after_us=d.retry_after_us,
               reset_after_us=d.reset_after_us, limit=d.limit, time_us=d.time_us,
               error=d.error)
    assert got == dict(allowed=want["allowed"], remaining=want["remaining"],
                       retry_after_us=retry, reset_after_us=want["reset_after_us"],
                       limit=want["limit"], time_us=t, error=None), where
    assert bool(d) is want["allowed"], where
    assert d.retry_after == (math.inf if retry is None else retry / 1e6), where
    assert d.reset_after == want["reset_after_us"] / 1e6, where
    assert d.time == t / 1e6, where


def check_step(backend, lim, case, i, step):
    where = f"[{backend}] case {case['id']}, step {i}"
    key = key_bytes(step["key"])
    t = step["t_us"]
    if step["op"] == "reset":
        assert lim.reset(key) is None, where
        return None
    spend = hirate._hirate.OP_REFUND if step["op"] == "refund" else step["op"] == "allow"
    cost = step.get("cost", 1)
    if "expect_error" in step:
        with pytest.raises(hirate.ConfigError) as info:
            lim._decide_at(key, cost, spend, t)
        assert info.value.name == short(step["expect_error"]), where
        assert info.value.code == getattr(hirate._hirate, info.value.name), where
        assert str(info.value), where + ": an error without a message"
        return None
    want = step["expect"]
    d = lim._decide_at(key, cost, spend, t)
    check_figures(d, want, t, where)
    assert d.band == want.get("band", 0), where
    if "bands" in want:
        assert len(d.bands) == len(want["bands"]), where
        for j, (b, wb) in enumerate(zip(d.bands, want["bands"])):
            check_figures(b, wb, t, f"{where}, band {j}")
            assert (b.band, b.source, b.bands) == (j, d.source, (b,)), where
    else:
        assert d.bands == (d,), where
    expected_source = "local" if backend == "memory" else "redis"
    if backend.startswith("redis+cache") and not d.allowed and d.source == "cache":
        return "cache"   # the deny cache answered, with Redis' own values
    assert d.source == expected_source, where
    return d.source


def check_bands(lim, cfg, where):
    """The limiter holds the config's bands, in order, names as given."""
    bands = cfg["bands"] if "bands" in cfg else [cfg]
    assert [(b.capacity, b.rate) for b in lim.bands] == [
        (b["capacity"], rate_of(b["rate"])) for b in bands], where
    for b, want in zip(lim.bands, bands):
        if "name" in want:
            assert b.name == want["name"], where
    assert lim.capacity == first_capacity(cfg), where


def skipped(backend, case):
    """A case that changes a key's bands runs on Redis only."""
    return backend == "memory" and case.get("redis_only", False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_vector_case(backend, redis):
    steps = cache_hits = calls = band_steps = reconfigures = 0
    for case in CASES:
        cfg = case["config"]
        if "config_error" in case:
            with pytest.raises(hirate.ConfigError) as info:
                make(backend, case, redis.url)
            assert info.value.name == short(case["config_error"]), case["id"]
            assert str(info.value), case["id"]
            continue
        if skipped(backend, case):
            continue
        lim = make(backend, case, redis.url)
        try:
            check_bands(lim, cfg, case["id"])
            for i, step in enumerate(case["steps"]):
                steps += 1
                if step["op"] == "reconfigure":
                    # The same prefix, so the keys already in Redis stay.
                    calls += check_path(backend, lim, case["id"])
                    lim.close()
                    lim = make(backend, case, redis.url, step["config"])
                    check_bands(lim, step["config"], f"{case['id']}, step {i}")
                    reconfigures += 1
                    continue
                cache_hits += check_step(backend, lim, case, i, step) == "cache"
                band_steps += "bands" in step.get("expect", {})
            calls += check_path(backend, lim, case["id"])
        finally:
            lim.close()
    assert steps == sum(len(c.get("steps", ())) for c in CASES if not skipped(backend, c))
    assert band_steps > 50   # cases of several bands, each band's figures checked
    assert (reconfigures > 0) is (backend != "memory")
    assert (calls > 0) is (backend != "memory")
    if backend.startswith("redis+cache"):
        assert cache_hits > 20, "the deny cache answered no refusal"
    else:
        assert cache_hits == 0
    if backend != "memory":
        # The script's only write is SET ... PX: every key it left has a TTL,
        # and each is under the prefix the runner chose.
        keys = redis.command("KEYS", "*")
        assert keys and all(k.startswith("vec:") for k in keys), keys
        # (counted inside Redis: some keys are bytes that are not UTF-8)
        without_ttl = redis.command("EVAL", "local n = 0 for _, k in ipairs(redis.call("
                                    "'KEYS', '*')) do if redis.call('PTTL', k) <= 0 then "
                                    "n = n + 1 end end return n", 0)
        assert without_ttl == 0

def test_the_vectors_cover_every_error_they_name():
    named = {c.get("config_error") for c in CASES} | {
        s.get("expect_error") for c in CASES for s in c.get("steps", ())}
    assert named - {None} == {"HIRATE_ECAPACITY", "HIRATE_ERATE", "HIRATE_ERANGE",
                              "HIRATE_ECOST", "HIRATE_EKEY"}
