#!/usr/bin/python3
"""Writes tests/vectors/token_bucket.json from the cases below, or checks it.

    /usr/bin/python3 tests/vectors/generate.py           # (re)write the file
    /usr/bin/python3 tests/vectors/generate.py --check   # fail if it drifted

The cases (config and steps) are authored here; the expected decision of every
step is computed by the reference model in this file, never written by hand.
The model is an independent transcription of lua/token_bucket.lua: Python
floats are IEEE doubles, and every expression below performs the script's
operations in the script's order, so it gives the script's doubles bit for bit.
It decides one bucket or several bands on one key (docs/semantics.md,
"Several limits"); one band is the one-bucket model, figure for figure.
"reconfigure" steps change the limiter over the same stored keys, as a
deploy that changes the limits does (those cases are redis_only).

--check does four things and exits non-zero if any fails:
  1. validates token_bucket.json against token_bucket.schema.json (jsonschema);
  2. checks what a schema cannot say: unique ids, sizes, how each decision's
     figures hang together (the whole and its bands), coverage counts;
  3. replays the file's own cases through the model and compares every field
     (so a hand edit to an expectation is reported by case, step and field);
  4. regenerates the file from the cases here and compares it byte for byte
     (so a hand edit to an input, or a case added only to the file, fails too).
Both modes also run HAND_CHECKS: a handful of expectations worked out by hand
(in comments) that the model must reproduce.
"""

import argparse
import difflib
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VECTORS = os.path.join(HERE, "token_bucket.json")
SCHEMA = os.path.join(HERE, "token_bucket.schema.json")

EXACT = 2**53 - 1            # HIRATE_EXACT_MAX: the last integer a double counts exactly
KEY_MAX = 512                # HIRATE_KEY_MAX
ID_MAX = 48                  # "vec:" + id + ":" must fit HIRATE_PREFIX_MAX (64)
NEVER = "never"              # C: HIRATE_NEVER; the script: -1
S = 1_000_000                # one second in µs
MIN = 60 * S
HOUR = 60 * MIN
DAY = 24 * HOUR
EPOCH = 1_700_000_000 * S    # a Redis TIME of November 2023, in µs


# --------------------------------------------------------------------------
# The reference model: lua/token_bucket.lua, operation for operation.
# --------------------------------------------------------------------------

def config_error(capacity, rate):
    """The error hirate_limiter_new returns for this config, or None.
    Each config-error case breaks exactly one rule, so the order of the
    checks is not part of the contract."""
    if not (isinstance(capacity, int) and 1 <= capacity <= EXACT):
        return "HIRATE_ECAPACITY"
    # NaN fails "rate > 0"; inf fails "rate < inf".
    if not (rate > 0 and rate < math.inf):
        return "HIRATE_ERATE"
    # Script: if not (capacity * 1000000 / rate <= EXACT) then error.
    if not (float(capacity) * 1000000.0 / rate <= float(EXACT)):
        return "HIRATE_ERANGE"
    return None


def call_error(key, cost):
    """The error of one allow/peek call, or None (each error step breaks one rule)."""
    if not (0 <= cost <= EXACT):
        return "HIRATE_ECOST"
    if not (1 <= len(key) <= KEY_MAX):
        return "HIRATE_EKEY"
    return None


def level_at(s, t0, now, r, rate):
    """What a call at now + r computes from the stored state (s, t0), before
    min(capacity, .) (script: level_at)."""
    elapsed = (now - t0) + r
    if elapsed < 0:
        elapsed = 0.0
    return s + elapsed * rate / 1000000.0


def until_level(s, t0, now, target, rate):
    """Microseconds until the stored state (s, t0) holds target (script:
    until_level): the least r with level_at(s, t0, now, r) >= target."""
    level = level_at(s, t0, now, 0.0, rate)
    if level >= target:
        return 0
    # math.ceil returns a Python int; Lua's returns a double. It is below 2^53
    # (the ERANGE rule bounds it), so float() is exact and r stays a double.
    r = float(math.ceil((target - level) * 1000000.0 / rate))
    if t0 > now:
        r = r + (t0 - now)
    for _ in range(64):
        if level_at(s, t0, now, r, rate) >= target:
            break
        r = r + 1.0
    for _ in range(64):
        if r <= 1 or level_at(s, t0, now, r - 1.0, rate) < target:
            break
        r = r - 1.0
    return int(r)


class Model:
    """One limiter: its bands (capacity, rate) plus the *stored* state of each key.

    self.store maps key bytes to a tuple of (tokens, ts), one per band in
    order, as last written by a spend, the only write (Redis: one key holding
    "tokens ts tokens ts ..."; one band writes today's "tokens ts"). The
    refilled levels used to answer a call are local values, stored only when
    the call spends. A limiter made with other bands over the same store (a
    reconfigure) reads stored band i as its band i; bands the key lacks are
    full at now, stored bands beyond its count are ignored and dropped at its
    next write (docs/semantics.md, "Several limits")."""

    def __init__(self, bands, store=None):
        # (the capacity as a double, as an integer for limit, the rate)
        self.bands = [(float(capacity), capacity, rate) for capacity, rate in bands]
        self.store = {} if store is None else store

    def reset(self, key):
        self.store.pop(key, None)

    def decide(self, key, now_us, cost, spend):
        """The whole's decision (a dict) and each band's (a list of dicts).
        spend: True spends the cost when it passes, False peeks, "refund"
        gives the cost back (script: mode "2")."""
        if spend == "refund":
            return self.refund(key, now_us, cost)
        now = float(now_us)
        c = float(cost)
        stored = self.store.get(key, ())
        held = []                       # per band: [tokens, ts, level, ok, retry]
        for i, (cap, _, rate) in enumerate(self.bands):
            # The stored state; a missing key or band is a full bucket at now.
            tokens, ts = stored[i] if i < len(stored) else (cap, now)
            # Lua's math.min(capacity, x): the first argument unless x < it.
            x = level_at(tokens, ts, now, 0.0, rate)
            level = x if x < cap else cap
            ok, retry = False, 0
            if c > cap:
                retry = NEVER
            elif level >= c:
                ok = True
            else:
                retry = until_level(tokens, ts, now, c, rate)
            held.append([tokens, ts, level, ok, retry])
        allowed = all(h[3] for h in held)
        if allowed and spend and c > 0:
            for h in held:
                h[0] = h[2] - c
                if now > h[1]:
                    h[1] = now
                h[2] = h[0]
            self.store[key] = tuple((h[0], h[1]) for h in held)
        per = []
        for (cap, limit, rate), (tokens, ts, level, ok, retry) in zip(self.bands, held):
            per.append({
                "allowed": ok,
                "remaining": int(math.floor(level)),
                "retry_after_us": retry,
                "reset_after_us": until_level(tokens, ts, now, cap, rate),
                "limit": limit,
            })
        # The whole: band is the refusing band that waits longest when
        # refused, the band with the fewest left when allowed; the first of
        # equals either way (a later band replaces it only if strictly more).
        band = None
        if allowed:
            for i, p in enumerate(per):
                if band is None or p["remaining"] < per[band]["remaining"]:
                    band = i
            retry = 0
        else:
            for i, p in enumerate(per):
                if p["allowed"]:
                    continue
                if band is None or longer(p["retry_after_us"], per[band]["retry_after_us"]):
                    band = i
            retry = per[band]["retry_after_us"]
        whole = {
            "allowed": allowed,
            "remaining": min(p["remaining"] for p in per),
            "retry_after_us": retry,
            "reset_after_us": max(p["reset_after_us"] for p in per),
            "limit": per[band]["limit"],
        }
        return whole, band, per


    def refund(self, key, now_us, cost):
        """Each band gets cost back, capped at its capacity (script: refund).
        A band already full is left as stored; the key is written when a band
        changed, every band of it as the script writes them."""
        now = float(now_us)
        c = float(cost)
        stored = self.store.get(key, ())
        held, changed = [], False
        for i, (cap, _, rate) in enumerate(self.bands):
            tokens, ts = stored[i] if i < len(stored) else (cap, now)
            x = level_at(tokens, ts, now, 0.0, rate)
            level = x if x < cap else cap
            if c > 0 and level < cap:
                y = level + c
                tokens = y if y < cap else cap      # math.min(capacity, level + cost)
                if now > ts:
                    ts = now
                level = tokens
                changed = True
            held.append((tokens, ts, level))
        if changed:
            self.store[key] = tuple((h[0], h[1]) for h in held)
        per = [{
            "allowed": True,
            "remaining": int(math.floor(level)),
            "retry_after_us": 0,
            "reset_after_us": until_level(tokens, ts, now, cap, rate),
            "limit": limit,
        } for (cap, limit, rate), (tokens, ts, level) in zip(self.bands, held)]
        band = None
        for i, p in enumerate(per):
            if band is None or p["remaining"] < per[band]["remaining"]:
                band = i
        whole = {
            "allowed": True,
            "remaining": min(p["remaining"] for p in per),
            "retry_after_us": 0,
            "reset_after_us": max(p["reset_after_us"] for p in per),
            "limit": per[band]["limit"],
        }
        return whole, band, per


def longer(a, b):
    """Whether wait a is strictly longer than wait b ("never" beats any number)."""
    if a == NEVER:
        return b != NEVER
    return b != NEVER and a > b


# --------------------------------------------------------------------------
# The file format: keys and rates as JSON can hold them.
# --------------------------------------------------------------------------

def key_to_json(key):
    """An authored key -> its JSON spelling: a str is written as a JSON string
    (its UTF-8 bytes), Repeat as {"repeat": s, "times": n}, bytes as {"hex": ...}."""
    if isinstance(key, Repeat):
        return {"repeat": key.unit, "times": key.times}
    if isinstance(key, bytes):
        return {"hex": key.hex()}
    assert isinstance(key, str) and "\0" not in key
    return key


def key_from_json(j):
    if isinstance(j, str):
        return j.encode("utf-8")
    if "hex" in j:
        return bytes.fromhex(j["hex"])
    return (j["repeat"] * j["times"]).encode("utf-8")


def rate_to_json(rate):
    if math.isnan(rate):
        return "nan"
    if math.isinf(rate):
        return "inf" if rate > 0 else "-inf"
    return rate


def rate_from_json(j):
    """A number, or one of the strings "nan", "inf", "-inf" (float() reads those)."""
    return float(j)


# --------------------------------------------------------------------------
# Authoring helpers.
# --------------------------------------------------------------------------

class Repeat:
    """A key of one string repeated: {"repeat": unit, "times": times}."""
    def __init__(self, unit, times):
        self.unit, self.times = unit, times


class After:
    """A time computed from an earlier step's answer: that step's t_us plus
    its `field` (retry_after_us or reset_after_us; band i's own with band=i)
    plus delta. Resolved when the file is generated; the file holds the
    absolute number."""
    def __init__(self, field, delta=0, step=-1, band=None):
        self.field, self.delta, self.step, self.band = field, delta, step, band


def allow(t, key, cost=1):
    return {"t": t, "op": "allow", "key": key, "cost": cost}


def peek(t, key, cost=1):
    return {"t": t, "op": "peek", "key": key, "cost": cost}


def reset(t, key):
    return {"t": t, "op": "reset", "key": key}


def refund(t, key, tokens=1):
    """Give tokens back to every band of key (hirate_refund); cost holds them."""
    return {"t": t, "op": "refund", "key": key, "cost": tokens}


def reconfigure(t, config):
    """From this step on, a new limiter of config over the same store (the
    same prefix: the keys already in Redis stay)."""
    return {"t": t, "op": "reconfigure", "config": config}


def one_band(capacity, rate):
    """The config of one bucket: {"capacity", "rate"}."""
    return {"capacity": capacity, "rate": rate_to_json(rate)}


def bands(*spec):
    """The config of several bands: each (capacity, rate) or (capacity, rate, name)."""
    out = []
    for b in spec:
        j = {"capacity": b[0], "rate": rate_to_json(b[1])}
        if len(b) > 2:
            j["name"] = b[2]
        out.append(j)
    return {"bands": out}


def case(cid, rule, capacity, rate, steps=()):
    return {"id": cid, "rule": rule, "config": one_band(capacity, rate), "steps": list(steps)}


def bands_case(cid, rule, config, steps=()):
    """A case of any config (bands(...) or one_band(...)), reconfigure steps allowed."""
    return {"id": cid, "rule": rule, "config": config, "steps": list(steps)}


THIRD = 1 / 3                 # the double nearest 1/3: 0.3333333333333333 round-trips

# --------------------------------------------------------------------------
# The cases. Ids are stable: rename one only with every runner's consent.
# --------------------------------------------------------------------------

CASES = [
    # ---------------------------------------------------------------- basics
    case("first-use-is-full",
         "A key never seen before is a full bucket at the time of its first call.",
         10, 1.0, [
             peek(0, "alice"),
             allow(0, "alice"),
             allow(5 * S, "bob"),
             peek(5 * S, "alice"),
             allow(5 * S, "alice"),
         ]),
    case("burst-drains-to-empty",
         "Up to capacity calls pass at once; the next is refused until a token refills.",
         5, 1.0, [
             allow(0, "k"), allow(0, "k"), allow(0, "k"), allow(0, "k"), allow(0, "k"),
             allow(0, "k"),
             allow(0, "k"),
             allow(250_000, "k"),
             allow(999_999, "k"),
             allow(S, "k"),
             allow(S, "k"),
         ]),
    case("partial-refill-counts-whole-tokens",
         "Tokens refill continuously at rate per second; remaining reports whole tokens.",
         10, 1.0, [
             allow(0, "k", 10),
             peek(1_500_000, "k"),
             allow(1_500_000, "k"),
             allow(1_500_000, "k"),
             allow(2 * S, "k"),
             peek(4_250_000, "k", 3),
         ]),
    case("refill-is-linear-in-time",
         "The level after an empty bucket grows by rate * elapsed, read at several times.",
         100, 10.0, [
             allow(0, "k", 100),
             peek(100_000, "k"),
             peek(S, "k"),
             peek(2_550_000, "k"),
             peek(9_990_000, "k"),
             peek(9_999_999, "k"),
             peek(10 * S, "k"),
         ]),
    case("full-refill-caps-at-capacity",
         "Refill stops at capacity: a long idle bucket holds capacity tokens, not more.",
         10, 2.0, [
             allow(0, "k", 10),
             peek(5 * S, "k"),
             peek(HOUR, "k"),
             allow(HOUR, "k", 10),
             allow(HOUR, "k"),
             peek(HOUR + 5 * S, "k", 10),
         ]),
    case("capacity-one",
         "A bucket of one token alternates between allowing and refusing at the rate.",
         1, 2.0, [
             allow(0, "k"),
             allow(0, "k"),
             allow(499_999, "k"),
             allow(500_000, "k"),
             allow(750_000, "k"),
             allow(S, "k"),
         ]),
    case("cost-takes-several-tokens",
         "A cost above one spends that many tokens at once and needs that many to pass.",
         10, 1.0, [
             allow(0, "k", 4),
             allow(0, "k", 4),
             allow(0, "k", 4),
             allow(0, "k", 2),
             allow(S, "k", 2),
             allow(2 * S, "k", 2),
         ]),

    # ------------------------------------------------------ retry and reset
    case("retry-after-is-the-least-wait",
         "retry_after_us is the least wait after which the same cost passes: one µs sooner it is refused.",
         10, 1.0, [
             allow(0, "k", 10),
             allow(200_000, "k", 3),
             peek(After("retry_after_us", -1), "k", 3),
             allow(After("retry_after_us", 0, step=1), "k", 3),
         ]),
    case("reset-after-is-the-time-to-full",
         "reset_after_us is the least wait until the bucket is full; one µs sooner it is not.",
         10, 1.0, [
             allow(0, "k", 7),
             peek(300_000, "k"),
             peek(After("reset_after_us", -1), "k"),
             peek(After("reset_after_us", 0, step=1), "k"),
         ]),

    # ---------------------------------------------------- fractional rates
    case("rate-one-tenth",
         "A rate of 0.1 per second refills one token in ten seconds, in double arithmetic.",
         3, 0.1, [
             allow(0, "k", 3),
             allow(S, "k"),
             peek(After("retry_after_us", -1), "k"),
             allow(After("retry_after_us", 0, step=1), "k"),
             allow(15 * S, "k"),
             peek(25 * S, "k"),
             peek(After("reset_after_us", -1), "k"),
             peek(After("reset_after_us", 0, step=5), "k"),
         ]),
    case("rate-one-third",
         "A rate of 1/3 per second (the nearest double) refills one token in three seconds.",
         3, THIRD, [
             allow(0, "k", 3),
             allow(S, "k"),
             peek(After("retry_after_us", -1), "k"),
             allow(After("retry_after_us", 0, step=1), "k"),
             peek(4 * S, "k"),
             peek(7_500_000, "k", 2),
             allow(9 * S, "k", 2),
             peek(After("reset_after_us", -1), "k"),
             peek(After("reset_after_us", 0, step=6), "k"),
         ]),
    case("fractional-level-is-kept-exactly",
         "A spend stores the fractional level exactly; later refills start from it.",
         5, THIRD, [
             allow(0, "k", 5),
             allow(3_100_000, "k"),
             allow(6_200_001, "k"),
             allow(9_300_002, "k"),
             peek(9_300_002, "k"),
             allow(11 * S, "k"),
             peek(12_345_678, "k"),
             allow(20 * S, "k", 3),
             peek(After("reset_after_us", 0), "k"),
         ]),

    # ---------------------------------------------------------- high rates
    case("rate-one-million",
         "At 10^6 tokens per second one token refills every microsecond.",
         100, 1e6, [
             allow(0, "k", 100),
             allow(0, "k"),
             allow(1, "k"),
             allow(1, "k"),
             peek(50, "k"),
             allow(50, "k", 49),
             peek(100, "k"),
             peek(1_000, "k"),
             allow(1_000, "k", 100),
         ]),
    case("rate-above-one-per-microsecond",
         "A rate above 10^6 per second refills more than one token per microsecond.",
         1000, 2.5e6, [
             allow(0, "k", 1000),
             peek(1, "k"),
             allow(1, "k", 3),
             allow(2, "k", 3),
             peek(2, "k"),
             peek(400, "k"),
         ]),

    # ------------------------------------------------------ large capacity
    case("capacity-one-billion",
         "A capacity of 10^9 counts single tokens exactly.",
         1_000_000_000, 1000.0, [
             allow(0, "k", 999_999_999),
             allow(0, "k", 2),
             allow(0, "k"),
             allow(0, "k"),
             allow(1_000, "k"),
             peek(DAY, "k", 1_000_000_000),
             allow(DAY, "k", 1_000_000_000),
             allow(DAY + 1, "k", 1_000_000_000),
             peek(DAY + S, "k"),
         ]),
    case("capacity-max-exact",
         "The largest capacity, 2^53-1, is accepted when it refills in at most 2^53-1 µs.",
         EXACT, 1e6, [
             peek(0, "k", EXACT),
             allow(0, "k", EXACT - 1),
             allow(0, "k"),
             allow(0, "k"),
             allow(7, "k", 7),
             peek(S, "k"),
         ]),

    # -------------------------------------------------------------- refunds
    case("refund-after-spending",
         "A refund gives spent tokens back: the next calls can spend them again.",
         5, 1.0, [
             allow(0, "k", 3),
             refund(0, "k", 2),
             allow(0, "k", 4),
             allow(0, "k"),
             refund(0, "k"),
             allow(0, "k"),
         ]),
    case("refund-capped-at-capacity",
         "A refund never fills a bucket past its capacity, however many tokens it gives.",
         5, 1.0, [
             allow(0, "k", 2),
             refund(0, "k", 10),
             allow(0, "k", 5),
             allow(0, "k"),
             refund(500_000, "k", EXACT),
             peek(500_000, "k", 5),
         ]),
    case("refund-on-a-fresh-key",
         "A key never seen is full; a refund leaves it full and stores nothing.",
         5, 1.0, [
             refund(0, "new", 3),
             peek(0, "new"),
             allow(0, "new", 5),
             allow(0, "new"),
         ]),
    bands_case("refund-in-every-band",
               "A refund gives the tokens to every band, each capped at its own capacity.",
               bands((5, 1.0, "burst"), (8, 8 / DAY * S, "daily")), [
                   allow(0, "k", 3),
                   refund(0, "k"),
                   allow(2 * S, "k", 2),
                   refund(4 * S, "k", 2),
                   refund(4 * S, "k", 100),
                   allow(4 * S, "k", 5),
                   allow(4 * S, "k"),
                   refund(5 * S, "fresh", 2),
               ]),
    case("refund-then-refused-then-allowed",
         "A refund adds to the refilled level; once spent, the wait is the refill's again.",
         3, 1.0, [
             allow(0, "k", 3),
             allow(0, "k"),
             refund(500_000, "k"),
             allow(500_000, "k"),
             allow(500_000, "k"),
             allow(After("retry_after_us", -1), "k"),
             allow(After("retry_after_us", 0, step=4), "k"),
             peek(After("reset_after_us", 0), "k"),
         ]),
    case("refund-of-zero-reports-the-bucket",
         "A refund of 0 gives nothing and reports the bucket; a negative refund is HIRATE_ECOST.",
         3, 1.0, [
             allow(0, "k", 2),
             refund(0, "k", 0),
             refund(0, "k", -1),
             refund(0, "k", EXACT + 1),
             allow(0, "k"),
             allow(0, "k"),
         ]),
    case("refund-with-the-clock-backwards",
         "A refund at a time before the stored one refills nothing and keeps the later time.",
         10, 1.0, [
             allow(10 * S, "k", 10),
             refund(8 * S, "k", 4),
             peek(8 * S, "k"),
             peek(11 * S, "k"),
         ]),

    # ----------------------------------------------------------------- peek
    case("peek-spends-nothing",
         "A peek answers like allow but spends nothing, however often it is repeated.",
         3, 1.0, [
             peek(0, "k"), peek(0, "k"), peek(0, "k"), peek(0, "k"),
             allow(0, "k"),
             peek(0, "k"), peek(0, "k"),
             allow(0, "k", 2),
             peek(0, "k"),
             peek(100, "k"),
         ]),
    case("peek-answers-for-a-cost",
         "A peek with a cost says whether that cost would pass now and, if not, when.",
         10, 1.0, [
             allow(0, "k", 8),
             peek(0, "k", 2),
             peek(0, "k", 3),
             allow(0, "k", 3),
             peek(0, "k", 10),
             peek(0, "k", 11),
             allow(0, "k", 2),
             peek(2_500_000, "k", 2),
         ]),
    case("peek-stores-nothing",
         "A peek leaves the stored state as it was: a later call refills from the last spend's time.",
         10, 1.0, [
             # Spend at 10 s; peek at 14 s; then a call at 12 s (clock back).
             # Had the peek stored (4, 14 s), the 12 s call would see 4 tokens
             # (no refill backwards); it sees 0 + 2 s * 1 = 2.
             allow(10 * S, "k", 10),
             peek(14 * S, "k"),
             peek(12 * S, "k"),
             allow(12 * S, "k", 3),
             allow(12 * S, "k", 2),
             peek(13 * S, "k"),
         ]),

    # ---------------------------------------------------------------- costs
    case("cost-equal-to-capacity",
         "A cost equal to capacity passes only when the bucket is full.",
         7, 1.0, [
             allow(0, "k", 7),
             allow(3 * S, "k", 7),
             allow(After("retry_after_us", -1), "k", 7),
             allow(After("retry_after_us", 0, step=1), "k", 7),
             peek(14 * S, "k", 7),
         ]),
    case("cost-above-capacity-never-passes",
         "A cost above capacity is refused with retry_after never and spends nothing.",
         5, 1.0, [
             allow(0, "k", 6),
             peek(0, "k", 6),
             allow(0, "k", 5),
             allow(0, "k", 6),
             allow(DAY, "k", 6),
             allow(DAY, "k", EXACT),
             allow(DAY, "k", 5),
         ]),
    case("cost-zero-is-allowed",
         "A cost of 0 is always allowed, even on an empty bucket, and spends nothing.",
         2, 1.0, [
             allow(0, "k", 0),
             allow(0, "k", 2),
             allow(0, "k", 0),
             allow(0, "k", 0),
             allow(0, "k"),
             peek(0, "k", 0),
             allow(500_000, "k", 0),
         ]),
    case("cost-zero-stores-nothing",
         "An allow of cost 0 stores nothing, so it does not move the bucket's time.",
         10, 1.0, [
             # Spend at 10 s, cost 0 at 15 s, then a call at 12 s. Had the cost
             # 0 call stored (5, 15 s), the 12 s call would see 5 tokens; it
             # sees 0 + 2 s * 1 = 2.
             allow(10 * S, "k", 10),
             allow(15 * S, "k", 0),
             peek(12 * S, "k"),
             allow(12 * S, "k", 3),
             allow(12 * S, "k", 2),
         ]),

    # -------------------------------------------------------------- refusal
    case("refusal-changes-nothing",
         "A refused call stores nothing: neither the level nor the time moves.",
         10, 1.0, [
             # Spend at 10 s; refused at 14 s (cost 5 > 4); then a call at 12 s.
             # Had the refusal stored (4, 14 s) the 12 s call would see 4; it
             # sees 2.
             allow(10 * S, "k", 10),
             allow(14 * S, "k", 5),
             peek(12 * S, "k"),
             allow(12 * S, "k", 3),
             allow(12 * S, "k", 2),
             allow(12 * S, "k"),
         ]),
    case("refusals-repeated-cost-nothing",
         "Any number of refusals leaves the bucket where a single later call finds it.",
         4, THIRD, [
             allow(0, "k", 4),
             allow(S, "k"), allow(1_500_000, "k"), allow(2 * S, "k"),
             allow(2_500_000, "k"), allow(2_999_999, "k"),
             peek(3_000_001, "k"),
             allow(3_000_001, "k"),
             allow(3_000_001, "k"),
             peek(12_000_001, "k", 4),
         ]),

    # ---------------------------------------------------------------- clock
    case("clock-backwards-refills-nothing",
         "A call at a time before the stored time refills nothing.",
         10, 1.0, [
             allow(10 * S, "k", 10),
             allow(5 * S, "k"),
             peek(9 * S, "k"),
             peek(10 * S, "k"),
             allow(11 * S, "k"),
             allow(10_500_000, "k"),
         ]),
    case("clock-backwards-keeps-later-time",
         "A spend at a time before the stored time keeps the later time in the state.",
         10, 1.0, [
             # Spend 5 at 10 s; spend 1 at 8 s: allowed from 5 tokens, stored as
             # (4, 10 s). At 12 s: 4 + 2 = 6. Had it stored 8 s: 4 + 4 = 8.
             allow(10 * S, "k", 5),
             allow(8 * S, "k"),
             peek(12 * S, "k"),
             allow(12 * S, "k", 6),
             allow(12 * S, "k"),
         ]),
    case("idle-for-days",
         "After days of idleness a slow bucket is full, and an exact refill time is kept.",
         60, 1 / 60, [
             allow(0, "k", 60),
             peek(MIN, "k"),
             peek(3 * DAY, "k"),
             allow(3 * DAY, "k", 60),
             peek(3 * DAY + HOUR, "k"),
             peek(3 * DAY + HOUR, "k", 61),
             allow(30 * DAY, "k", 59),
             peek(After("reset_after_us", 0), "k"),
         ]),
    case("epoch-scale-times",
         "Times at Redis TIME scale (about 1.7 * 10^15 µs) refill exactly like small ones.",
         10, 1.0, [
             peek(EPOCH, "k"),
             allow(EPOCH, "k", 10),
             allow(EPOCH + 1, "k"),
             allow(EPOCH + 999_999, "k"),
             allow(EPOCH + 1_000_000, "k"),
             peek(EPOCH + 3_333_333, "k"),
             allow(EPOCH + DAY, "k", 10),
             peek(EPOCH + DAY + 123_456, "k"),
         ]),

    # ----------------------------------------------------------------- keys
    case("keys-are-independent",
         "Each key has its own bucket; spending one never touches another.",
         2, 1.0, [
             allow(0, "a"), allow(0, "a"), allow(0, "a"),
             allow(0, "b"),
             peek(0, "a"), peek(0, "b"), peek(0, "c"),
             allow(0, "user:1"), allow(0, "user:1"),
             peek(0, "user:10"), peek(0, "user:1"),
             allow(0, "A"), peek(0, "a"),
             allow(500_000, "b"), allow(500_000, "b"),
             peek(S, "a"), peek(S, "b"), peek(S, "A"),
         ]),
    case("keys-are-byte-strings",
         "A key is its bytes, NUL included: keys differing after a NUL or in one byte are distinct.",
         1, 1.0, [
             allow(0, b"a\x00b"),
             allow(0, b"a"),
             allow(0, b"a\x00c"),
             allow(0, b"a\x00b"),
             allow(0, b"\x00"),
             allow(0, b"\xff\xfe"),
             allow(0, b"a\x00"),
             peek(0, b"a"),
             peek(0, b"a\x00b"),
         ]),
    case("key-with-punctuation-and-utf8",
         "Keys may hold ':', braces, spaces and UTF-8; each such key is its own bucket.",
         2, 1.0, [
             allow(0, "user:{42}:login"),
             allow(0, "user:{42}:login"),
             allow(0, "user:{42}:login"),
             allow(0, "user:{42}"),
             allow(0, "a key with spaces"),
             allow(0, "  "),
             allow(0, "café ☕ 東京 🚀"),
             allow(0, "café ☕ 東京 🚀"),
             allow(0, "café ☕ 東京 🚀"),
             peek(0, "cafe ☕ 東京 🚀"),
             allow(0, "rl:user:{42}:login"),
             allow(0, "*?[]\\\"'\t\n%s%d"),
         ]),
    case("key-of-512-bytes-is-accepted",
         "A key of exactly HIRATE_KEY_MAX (512) bytes is valid and distinct from its 511-byte prefix.",
         3, 1.0, [
             allow(0, Repeat("k", 512)),
             allow(0, Repeat("k", 512), 2),
             allow(0, Repeat("k", 512)),
             peek(0, Repeat("k", 511)),
             allow(0, Repeat("é", 256)),
             peek(0, Repeat("é", 256)),
         ]),

    # ---------------------------------------------------------------- reset
    case("reset-forgets-the-key",
         "A reset makes the key's bucket full again, leaves other keys alone and is harmless on unknown keys.",
         3, 1.0, [
             allow(0, "a", 3),
             allow(0, "b", 2),
             allow(0, "a"),
             reset(0, "a"),
             peek(0, "a"),
             peek(0, "b"),
             allow(0, "a", 3),
             reset(0, "never-used"),
             peek(0, "never-used"),
             reset(0, "a"),
             reset(0, "a"),
             allow(500_000, "a", 3),
             peek(500_000, "b"),
         ]),
    case("reset-forgets-the-time",
         "After a reset the stored time is gone too: an earlier time starts a new full bucket.",
         10, 1.0, [
             allow(100 * S, "k", 10),
             reset(100 * S, "k"),
             allow(50 * S, "k", 10),
             peek(51 * S, "k"),
         ]),

    # ------------------------------------------------- per-call validation
    case("cost-negative-is-an-error",
         "A negative cost is HIRATE_ECOST for allow and peek, and changes nothing.",
         3, 1.0, [
             allow(0, "k", -1),
             peek(0, "k", -1),
             allow(0, "k", -(2**53)),
             peek(0, "k"),
             allow(0, "k"),
             allow(0, "k", -5),
             peek(0, "k"),
         ]),
    case("cost-two-pow-53-is-an-error",
         "A cost of 2^53 is HIRATE_ECOST; 2^53-1 is valid (and here above capacity: never).",
         3, 1.0, [
             allow(0, "k", 2**53),
             peek(0, "k", 2**53),
             allow(0, "k", EXACT),
             peek(0, "k", EXACT),
             allow(0, "k", 3),
             allow(0, "k", 2**53),
             peek(0, "k"),
         ]),
    case("key-empty-is-an-error",
         "An empty key is HIRATE_EKEY for allow and peek, and changes nothing.",
         2, 1.0, [
             allow(0, ""),
             peek(0, ""),
             allow(0, "", 0),
             allow(0, "k"),
             allow(0, ""),
             peek(0, "k"),
         ]),
    case("key-of-513-bytes-is-an-error",
         "A key longer than HIRATE_KEY_MAX (512 bytes) is HIRATE_EKEY, counting bytes not characters.",
         2, 1.0, [
             allow(0, Repeat("k", 513)),
             peek(0, Repeat("k", 513)),
             allow(0, Repeat("k", 4096)),
             allow(0, Repeat("k", 512)),
             peek(0, Repeat("k", 512)),
             allow(0, Repeat("\u00e9k", 171)),       # 342 characters, 513 bytes
             allow(0, Repeat("\u00e9", 257)),
         ]),

    # ----------------------------------------------- config validation
    case("config-capacity-zero", "A capacity of 0 is HIRATE_ECAPACITY.", 0, 1.0),
    case("config-capacity-negative", "A negative capacity is HIRATE_ECAPACITY.", -1, 1.0),
    case("config-capacity-two-pow-53", "A capacity of 2^53 is HIRATE_ECAPACITY.", 2**53, 1e6),
    case("config-rate-zero", "A rate of 0 is HIRATE_ERATE.", 10, 0.0),
    case("config-rate-negative-zero", "A rate of -0.0 is HIRATE_ERATE.", 10, -0.0),
    case("config-rate-negative", "A negative rate is HIRATE_ERATE.", 10, -1.0),
    case("config-rate-nan", "A NaN rate is HIRATE_ERATE.", 10, math.nan),
    case("config-rate-inf", "An infinite rate is HIRATE_ERATE.", 10, math.inf),
    case("config-rate-negative-inf", "A rate of -inf is HIRATE_ERATE.", 10, -math.inf),
    case("config-fill-time-too-large",
         "A bucket that takes over 2^53-1 µs to fill (10^9 tokens at 0.1/s) is HIRATE_ERANGE.",
         1_000_000_000, 0.1),
    case("config-rate-subnormal",
         "A rate so small that the fill time overflows to infinity is HIRATE_ERANGE.",
         1, 5e-324),
    case("config-fill-time-just-over-limit",
         "Capacity 1 at the rate one ulp below the limit fills in 2^53 µs: HIRATE_ERANGE.",
         1, 1.1102230246251565e-10),
    case("config-fill-time-at-limit",
         "Capacity 1 at the slowest valid rate fills in exactly 2^53-1 µs: accepted and exact.",
         1, 1.1102230246251567e-10, [
             allow(0, "k"),
             allow(0, "k"),
             peek(DAY * 365 * 100, "k"),
             peek(EXACT, "k"),
             allow(EXACT - 1, "k"),
             allow(EXACT, "k"),
         ]),
    # ------------------------------------------------------ several bands
    # A config of "bands": every decision also carries "band" (the band
    # behind limit) and "bands" (each band's own figures).
    bands_case("bands-burst-band-refuses",
               "With a burst and a daily band, the burst band refuses once it is empty; the daily band held the cost.",
               bands((5, 1.0, "burst"), (100, 100 / 86400, "daily")), [
                   allow(0, "k", 5),
                   allow(0, "k"),
                   peek(After("retry_after_us", -1), "k"),
                   allow(After("retry_after_us", 0, step=1), "k"),
                   allow(3 * S, "k", 2),
                   peek(3 * S, "k"),
               ]),
    bands_case("bands-daily-band-refuses",
               "With a burst and a daily band, the daily band refuses once its quota is spent, while the burst band holds the cost.",
               bands((5, 1.0, "burst"), (8, 8 / 86400, "daily")), [
                   allow(0, "k", 5),
                   allow(5 * S, "k", 3),
                   allow(10 * S, "k"),
                   peek(After("retry_after_us", -1), "k"),
                   allow(After("retry_after_us", 0, step=2), "k"),
                   peek(After("retry_after_us", 0, step=2), "k"),
               ]),
    bands_case("bands-cost-above-one-capacity-is-never",
               "A cost above one band's capacity is refused with never, even where every other band holds it; never outweighs any wait.",
               bands((10, 1.0), (3, 1.0)), [
                   allow(0, "k", 5),
                   peek(0, "k", 4),
                   allow(0, "k", 3),
                   allow(0, "k", 8),
                   allow(0, "k", 4),
                   allow(S, "k"),
                   allow(DAY, "k", 4),
               ]),
    bands_case("bands-one-refills-while-another-stays-empty",
               "Each band refills at its own rate: a fast band is full again while a slow one still refuses.",
               bands((2, 10.0, "fast"), (4, 4 / 60, "slow")), [
                   allow(0, "k", 2),
                   allow(200_000, "k", 2),
                   peek(S, "k"),
                   allow(5 * S, "k"),
                   allow(After("retry_after_us", 0, step=2), "k"),
                   peek(After("retry_after_us", 0, step=2), "k"),
                   peek(After("reset_after_us", 0), "k", 2),
               ]),
    bands_case("bands-peek-spends-nothing",
               "A peek of several bands answers like allow, per band, and spends nothing in any band.",
               bands((3, 1.0), (5, 0.1)), [
                   peek(0, "k"),
                   peek(0, "k", 3),
                   allow(0, "k", 3),
                   peek(0, "k"),
                   peek(0, "k"),
                   peek(0, "k", 3),
                   peek(0, "k", 6),
                   allow(S, "k"),
                   peek(S, "k"),
               ]),
    bands_case("bands-reset-fills-every-band",
               "A reset makes every band of the key full again and leaves other keys alone.",
               bands((3, 1.0), (10, 10 / 3600)), [
                   allow(0, "a", 3),
                   allow(0, "b", 2),
                   allow(0, "a"),
                   reset(0, "a"),
                   peek(0, "a", 3),
                   peek(0, "b"),
                   allow(0, "a", 3),
                   reset(0, "never-used"),
                   peek(0, "never-used"),
               ]),
    bands_case("bands-cost-zero",
               "A cost of 0 passes every band, even empty ones, and stores nothing in any band.",
               bands((2, 1.0), (3, 1 / 60)), [
                   allow(0, "k", 2),
                   allow(0, "k", 0),
                   allow(0, "k"),
                   peek(0, "k", 0),
                   # Had the cost 0 call at 10 s stored (2, 10 s) in band 0,
                   # the call at 1 s would see 2 there; it sees 0 + 1 s * 1 = 1.
                   allow(10 * S, "k", 0),
                   peek(S, "k"),
                   allow(S, "k"),
               ]),
    bands_case("bands-three",
               "Three bands (second, minute, hour): each refuses in its turn, and the longest wait names the band.",
               bands((3, 3.0, "second"), (10, 10 / 60, "minute"), (12, 12 / 3600, "hour")), [
                   allow(0, "k", 3),
                   allow(S, "k", 3),
                   allow(2 * S, "k", 3),
                   allow(3 * S, "k", 3),
                   allow(MIN, "k", 3),
                   allow(MIN + 500_000, "k", 3),
                   allow(2 * MIN, "k"),
                   peek(2 * MIN, "k", 4),
                   peek(After("reset_after_us", 0), "k", 12),
               ]),
    bands_case("bands-ties-name-the-first-band",
               "band is the refusing band that waits longest, else the band with the fewest whole tokens left; of equals, the first.",
               bands((3, 0.5), (2, 1.0)), [
                   allow(0, "k", 2),
                   allow(0, "k", 2),
                   allow(0, "k"),
                   peek(1_500_000, "k"),
                   peek(0, "k", 4),
                   peek(0, "k", 3),
                   peek(1_500_000, "k", 2),
               ]),
    bands_case("bands-equal-bands-name-the-first",
               "Two equal bands tie in every figure: band is always 0.",
               bands((4, 1.0, "a"), (4, 1.0, "b")), [
                   allow(0, "k", 4),
                   allow(0, "k"),
                   peek(0, "k", 5),
                   allow(2 * S, "k"),
               ]),
    bands_case("bands-refusal-keeps-the-band-that-held",
               "A refused call spends nothing in the bands that held its cost: a later call finds them as they were.",
               bands((10, 1.0, "burst"), (10, 10 / 3600, "hourly")), [
                   # Spend 10 at 10 s; refused at 14 s (the burst band holds 3 of
                   # its 4, the hourly band has 0.01); a call at 12 s then finds
                   # the burst band at 0 + 2 s * 1 = 2. Had the refusal spent 3
                   # there (1 at 14 s) it would find 1.
                   allow(10 * S, "k", 10),
                   allow(14 * S, "k", 3),
                   peek(12 * S, "k"),
                   peek(14 * S, "k", 4),
                   allow(After("retry_after_us", 0, step=1), "k", 3),
               ]),
    bands_case("bands-one-band-as-a-list",
               "A bands config of one band decides as capacity and rate do, with band 0.",
               bands((10, 1.0)), [
                   allow(0, "k", 4),
                   peek(0, "k", 7),
                   allow(S, "k", 7),
                   allow(S, "k"),
                   peek(After("reset_after_us", 0), "k"),
               ]),
    bands_case("bands-keys-are-independent",
               "Each key has its own bands; spending one key's never touches another's.",
               bands((2, 1.0), (3, 1 / 60)), [
                   allow(0, "a", 2),
                   allow(0, "b"),
                   peek(0, "a"),
                   peek(0, "b", 2),
                   peek(0, "c", 2),
               ]),

    # ------------------------------------- bands on keys that already exist
    # "reconfigure": from that step on a new limiter of the given config runs
    # over the same keys (the same prefix). Such cases are redis_only: a
    # memory backend's bands cannot change under it.
    bands_case("reconfigure-capacity-raised",
               "100/minute raised to 200/minute: the stored level is kept and refills at the new rate to the new capacity.",
               one_band(100, 100 / 60), [
                   allow(0, "k", 100),
                   allow(30 * S, "k"),
                   reconfigure(30 * S, one_band(200, 200 / 60)),
                   peek(30 * S, "k"),
                   peek(45 * S, "k"),
                   allow(45 * S, "k", 99),
                   peek(After("reset_after_us", 0), "k", 200),
               ]),
    bands_case("reconfigure-capacity-lowered",
               "A lowered capacity caps a stored level above it at once; a level below it is kept.",
               one_band(10, 1.0), [
                   allow(0, "k", 2),
                   reconfigure(0, one_band(5, 1.0)),
                   peek(0, "k"),
                   allow(0, "k"),
                   allow(0, "k", 3),
                   reconfigure(0, one_band(10, 1.0)),
                   peek(0, "k"),
                   peek(S, "k"),
               ]),
    bands_case("reconfigure-band-added-at-the-end",
               "A band added at the end starts full on an existing key; the first band keeps its state.",
               bands((10, 1.0, "burst")), [
                   allow(0, "k", 6),
                   reconfigure(0, bands((10, 1.0, "burst"), (20, 20 / 3600, "hourly"))),
                   peek(0, "k"),
                   allow(0, "k", 4),
                   peek(2 * S, "k"),
                   allow(2 * S, "k", 2),
               ]),
    bands_case("reconfigure-band-removed-from-the-end",
               "A stored band beyond the limiter's count is ignored, kept by a peek and dropped by the next spend.",
               bands((10, 1.0), (3, 3 / 60)), [
                   allow(0, "k", 3),
                   allow(0, "k"),
                   reconfigure(0, bands((10, 1.0))),
                   peek(0, "k"),
                   reconfigure(0, bands((10, 1.0), (3, 3 / 60))),
                   peek(0, "k"),
                   reconfigure(0, bands((10, 1.0))),
                   allow(0, "k"),
                   reconfigure(0, bands((10, 1.0), (3, 3 / 60))),
                   peek(0, "k"),
               ]),
    bands_case("reconfigure-one-band-key-to-two-and-back",
               "A key written by one bucket is band 0 of a two-band limiter, and back: one bucket reads band 0 and writes only it.",
               one_band(10, 1.0), [
                   allow(0, "k", 4),
                   reconfigure(0, bands((10, 1.0), (5, 5 / 60))),
                   peek(0, "k"),
                   allow(0, "k", 2),
                   reconfigure(S, one_band(10, 1.0)),
                   peek(S, "k"),
                   allow(S, "k"),
                   reconfigure(S, bands((10, 1.0), (5, 5 / 60))),
                   peek(S, "k"),
               ]),

    bands_case("config-bands-second-capacity-zero",
               "A band's capacity of 0 is HIRATE_ECAPACITY, whichever band it is.",
               bands((10, 1.0), (0, 1.0))),
    bands_case("config-bands-third-rate-nan",
               "A band's NaN rate is HIRATE_ERATE, whichever band it is.",
               bands((10, 1.0), (5, 1.0), (5, math.nan))),
    bands_case("config-bands-fill-time-too-large",
               "A band that takes over 2^53-1 µs to fill is HIRATE_ERANGE, whichever band it is.",
               bands((10, 1.0), (1_000_000_000, 0.1))),
]

# --------------------------------------------------------------------------
# Expectations worked out by hand; the model must agree with every one.
# (case id, step index, the fields checked)
# --------------------------------------------------------------------------

HAND_CHECKS = [
    # capacity 10, rate 1/s, first call: full, so 10 - 1 = 9 remain, and the
    # missing token takes 1 s: reset_after = ceil(1 * 1e6 / 1) = 1000000.
    ("first-use-is-full", 1,
     {"allowed": True, "remaining": 9, "retry_after_us": 0, "reset_after_us": 1_000_000, "limit": 10}),
    # A peek at a fresh key: 10 tokens, already full.
    ("first-use-is-full", 0, {"allowed": True, "remaining": 10, "reset_after_us": 0}),
    # capacity 5 after five spends at t=0: level 0; one token takes 1 s,
    # the whole bucket 5 s.
    ("burst-drains-to-empty", 5,
     {"allowed": False, "remaining": 0, "retry_after_us": 1_000_000, "reset_after_us": 5_000_000}),
    # At 0.25 s the level is 0.25: a token needs 0.75 s more.
    ("burst-drains-to-empty", 7, {"allowed": False, "retry_after_us": 750_000}),
    # At 999999 µs the level is 0.999999: one µs short.
    ("burst-drains-to-empty", 8, {"allowed": False, "retry_after_us": 1}),
    # Spend 10 at t=0, peek at t=1.5 s: level 1.5, remaining 1, and full
    # after (10 - 1.5) s = 8500000 µs.
    ("partial-refill-counts-whole-tokens", 1,
     {"allowed": True, "remaining": 1, "retry_after_us": 0, "reset_after_us": 8_500_000}),
    # Then spend 1 at 1.5 s: 0.5 left, remaining 0, full in 9.5 s.
    ("partial-refill-counts-whole-tokens", 2,
     {"allowed": True, "remaining": 0, "reset_after_us": 9_500_000}),
    # Refused at 1.5 s with 0.5 tokens: half a second to go.
    ("partial-refill-counts-whole-tokens", 3, {"allowed": False, "retry_after_us": 500_000}),
    # capacity 10 rate 2/s, idle an hour after emptying: 10, not 7200.
    ("full-refill-caps-at-capacity", 2, {"remaining": 10, "reset_after_us": 0}),
    # rate 10/s, empty at 0: at 2.55 s the level is 25.5, so 25, full in
    # (100 - 25.5) / 10 s = 7.45 s.
    ("refill-is-linear-in-time", 3, {"remaining": 25, "reset_after_us": 7_450_000}),
    # 10^6/s: emptied at 0, the token of 1 µs spent at 1 µs, so at 50 µs the
    # level is 49 * 1e6 / 1e6 = 49, full 51 µs later.
    ("rate-one-million", 4, {"allowed": True, "remaining": 49, "reset_after_us": 51}),
    # rate 0.1/s, empty at 0, at 1 s: the double 0.1 is 0.1000000000000000055...,
    # so 1e6 * 0.1 is 100000.0000000000055... and rounds to 100000.0; the level
    # is 100000 / 1e6 = 0.1 (the double). The missing 0.9 token at 0.1/s takes
    # 9 s: ceil((1 - 0.1) * 1e6 / 0.1) = 9000000, and 0.1 + 9000000 * 0.1 / 1e6
    # = 0.1 + 0.9 = 1.0 in doubles, while 8999999 µs gives less than 1.
    ("rate-one-tenth", 1, {"allowed": False, "remaining": 0, "retry_after_us": 9_000_000}),
    # A cost above capacity: never, nothing spent, bucket full.
    ("cost-above-capacity-never-passes", 0,
     {"allowed": False, "remaining": 5, "retry_after_us": NEVER, "reset_after_us": 0, "limit": 5}),
    # Cost 0 on an empty bucket of 2 at 1/s: allowed, 0 left, full in 2 s.
    ("cost-zero-is-allowed", 2,
     {"allowed": True, "remaining": 0, "retry_after_us": 0, "reset_after_us": 2_000_000}),
    # The refusal at 14 s stored nothing: at 12 s the level is 2, not 4.
    ("refusal-changes-nothing", 2, {"remaining": 2, "reset_after_us": 8_000_000}),
    # Spend 5 at 10 s, spend 1 at 8 s (4 left, time kept at 10 s), at 12 s: 6.
    ("clock-backwards-keeps-later-time", 2, {"remaining": 6}),
    # 10^9 at 1000/s: 1 token left at 0; 2 need one more: 1 ms.
    ("capacity-one-billion", 1, {"allowed": False, "remaining": 1, "retry_after_us": 1_000}),
    # Bands. Burst 5 at 1/s, daily 8 a day: at 10 s the burst band holds
    # 2 + 5 = 7, capped at 5 (full); the daily band, spent to 0.0005 at 5 s,
    # lacks the token: refused by band 1 alone, the burst band's held.
    ("bands-daily-band-refuses", 2,
     {"allowed": False, "band": 1, "limit": 8, "remaining": 0,
      "bands": [{"allowed": True, "remaining": 5, "retry_after_us": 0, "reset_after_us": 0},
                {"allowed": False, "remaining": 0}]}),
    # Cost 5 over bands of 10 and 3: band 0 holds it, band 1 never can: the
    # whole is never, named by band 1, nothing spent (10 and 3 remain, full).
    ("bands-cost-above-one-capacity-is-never", 0,
     {"allowed": False, "retry_after_us": NEVER, "band": 1, "limit": 3, "remaining": 3,
      "reset_after_us": 0,
      "bands": [{"allowed": True, "remaining": 10, "retry_after_us": 0},
                {"allowed": False, "retry_after_us": NEVER}]}),
    # Bands 3 at 0.5/s and 2 at 1/s after a spend of 2: 1 and 0. Cost 2:
    # band 0 lacks 1 token (2 s at 0.5/s), band 1 lacks 2 (2 s at 1/s): a tie,
    # so band 0 names it, with its limit 3.
    ("bands-ties-name-the-first-band", 1,
     {"allowed": False, "retry_after_us": 2_000_000, "band": 0, "limit": 3}),
    # At 1.5 s the bands hold 1.75 and 1.5: one whole token each, a tie: band 0.
    ("bands-ties-name-the-first-band", 3, {"allowed": True, "remaining": 1, "band": 0, "limit": 3}),
    # The refusal at 14 s spent nothing in the burst band: at 12 s it holds
    # 0 + 2 s * 1 = 2.
    ("bands-refusal-keeps-the-band-that-held", 2, {"bands": [{"allowed": True, "remaining": 2}]}),
    # 100/min to 200/min with 49 stored at 30 s: 49 kept, limit 200, full
    # after (200 - 49) / (200/60) s = 45.3 s; at 45 s 49 + 15 * 200/60 = 99.
    ("reconfigure-capacity-raised", 3, {"remaining": 49, "limit": 200, "reset_after_us": 45_300_000}),
    ("reconfigure-capacity-raised", 4, {"remaining": 99}),
    # 8 stored, capacity lowered to 5: capped at once, full.
    ("reconfigure-capacity-lowered", 2, {"remaining": 5, "reset_after_us": 0, "limit": 5}),
    # A band added at the end is full on the existing key.
    ("reconfigure-band-added-at-the-end", 2,
     {"bands": [{"remaining": 4}, {"remaining": 20, "reset_after_us": 0}]}),
    # The one-band spend at step 7 dropped the stored band 1: full again.
    ("reconfigure-band-removed-from-the-end", 9,
     {"allowed": True, "bands": [{"remaining": 6}, {"remaining": 3, "reset_after_us": 0}]}),
    # A peek does not write: stored band 1 is still empty at step 5.
    ("reconfigure-band-removed-from-the-end", 5, {"allowed": False, "band": 1}),
    # Refunds. 5 at 1/s, 3 spent at 0 (2 left), 2 back: 4, full in 1 s.
    ("refund-after-spending", 1,
     {"allowed": True, "remaining": 4, "retry_after_us": 0, "reset_after_us": 1_000_000}),
    # 3 left, 10 back: capped at 5, full.
    ("refund-capped-at-capacity", 1, {"allowed": True, "remaining": 5, "reset_after_us": 0}),
    ("refund-on-a-fresh-key", 0, {"allowed": True, "remaining": 5, "reset_after_us": 0}),
    # Empty at 0, 0.5 refilled at 0.5 s, 1 back: 1.5; spend 1: 0.5, so the
    # next token is 0.5 s away.
    ("refund-then-refused-then-allowed", 3, {"allowed": True, "remaining": 0}),
    ("refund-then-refused-then-allowed", 4, {"allowed": False, "retry_after_us": 500_000}),
    # Burst 5 at 1/s, daily 8 a day: 3 spent at 0, 1 back: 3 and 6.
    ("refund-in-every-band", 1,
     {"allowed": True, "remaining": 3, "band": 0,
      "bands": [{"remaining": 3}, {"remaining": 6}]}),
    ("refund-of-zero-reports-the-bucket", 1, {"allowed": True, "remaining": 1}),
    ("refund-of-zero-reports-the-bucket", 2, "HIRATE_ECOST"),
    # Emptied at 10 s; 4 back at 8 s: 0 + 4, time kept at 10 s; at 11 s, 5.
    ("refund-with-the-clock-backwards", 3, {"remaining": 5}),
    # Errors.
    ("cost-negative-is-an-error", 0, "HIRATE_ECOST"),
    ("key-empty-is-an-error", 0, "HIRATE_EKEY"),
    ("key-of-513-bytes-is-an-error", 0, "HIRATE_EKEY"),
    ("key-of-513-bytes-is-an-error", 5, "HIRATE_EKEY"),     # 171 * (2 + 1) bytes
    ("config-fill-time-too-large", None, "HIRATE_ERANGE"),  # 1e9 * 1e6 / 0.1 = 1e16 > 2^53
    ("config-fill-time-at-limit", None, None),
    ("config-rate-nan", None, "HIRATE_ERATE"),
]


# --------------------------------------------------------------------------
# Generation.
# --------------------------------------------------------------------------

def config_bands(config):
    """A JSON config -> its bands as a list of (capacity, rate)."""
    if "bands" in config:
        return [(b["capacity"], rate_from_json(b["rate"])) for b in config["bands"]]
    return [(config["capacity"], rate_from_json(config["rate"]))]


def config_error_of(config):
    """The error hirate_limiter_new returns for a JSON config, or None: the
    first band's that has one (each error case breaks one rule of one band)."""
    for capacity, rate in config_bands(config):
        err = config_error(capacity, rate)
        if err:
            return err
    return None


def is_multi(config):
    """A config of bands: its decisions carry "band" and "bands"."""
    return "bands" in config


class Runner:
    """Runs a case's JSON steps, in order, through the model."""

    def __init__(self, config):
        self.config = config
        self.model = Model(config_bands(config))

    def step(self, s):
        """One JSON step -> ("expect", decision), ("expect_error", name) or None."""
        op = s["op"]
        if op == "reconfigure":
            assert config_error_of(s["config"]) is None
            self.config = s["config"]
            self.model = Model(config_bands(s["config"]), self.model.store)
            return None
        key = key_from_json(s["key"])
        if op == "reset":
            self.model.reset(key)
            return None
        cost = s.get("cost", 1)
        e = call_error(key, cost)
        if e:
            return ("expect_error", e)
        spend = "refund" if op == "refund" else op == "allow"
        whole, band, per = self.model.decide(key, s["t_us"], cost, spend)
        if is_multi(self.config):
            whole["band"] = band
            whole["bands"] = per
        return ("expect", whole)


def resolve_time(t, steps_out):
    if not isinstance(t, After):
        return t
    ref = steps_out[t.step]
    e = ref["expect"] if t.band is None else ref["expect"]["bands"][t.band]
    value = e[t.field]
    assert isinstance(value, int), "After() needs a numeric %s" % t.field
    return ref["t_us"] + value + t.delta


def build_case(c):
    """Authored case -> the JSON object, with expectations from the model."""
    out = {"id": c["id"], "rule": c["rule"], "config": c["config"]}
    err = config_error_of(c["config"])
    if err:
        assert not c["steps"], "%s: a config error case has no steps" % c["id"]
        out["config_error"] = err
        return out
    assert c["steps"], "%s: a valid config needs steps" % c["id"]
    if any(s["op"] == "reconfigure" for s in c["steps"]):
        out["redis_only"] = True
    runner = Runner(c["config"])
    steps = []
    for s in c["steps"]:
        step = {"t_us": resolve_time(s["t"], steps), "op": s["op"]}
        if s["op"] == "reconfigure":
            step["config"] = s["config"]
        else:
            step["key"] = key_to_json(s["key"])
            if s["op"] != "reset" and s["cost"] != 1:
                step["cost"] = s["cost"]
        got = runner.step(step)
        if got:
            step[got[0]] = got[1]
        steps.append(step)
    out["steps"] = steps
    return out


def build_document():
    return {
        "version": 1,
        "description": (
            "hirate token bucket: the contract every implementation satisfies (C memory "
            "backend, the Redis script with an injected time, Python, Lua). Generated by "
            "tests/vectors/generate.py from its case list and reference model; do not edit "
            "by hand. Format: tests/vectors/token_bucket.schema.json."),
        "cases": [build_case(c) for c in CASES],
    }


def dumps(doc):
    """Stable, readable JSON: one step per line."""
    def one(v):
        return json.dumps(v, ensure_ascii=False, separators=(", ", ": "))
    lines = ["{",
             '  "version": %s,' % one(doc["version"]),
             '  "description": %s,' % one(doc["description"]),
             '  "cases": [']
    for ci, c in enumerate(doc["cases"]):
        lines.append("    {")
        fields = ['      "id": %s' % one(c["id"]),
                  '      "rule": %s' % one(c["rule"]),
                  '      "config": %s' % one(c["config"])]
        if c.get("redis_only"):
            fields.append('      "redis_only": true')
        if "config_error" in c:
            fields.append('      "config_error": %s' % one(c["config_error"]))
        else:
            body = ",\n".join("        " + one(s) for s in c["steps"])
            fields.append('      "steps": [\n%s\n      ]' % body)
        lines.append(",\n".join(fields))
        lines.append("    }" + ("," if ci + 1 < len(doc["cases"]) else ""))
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Checks.
# --------------------------------------------------------------------------

def fail(errors, msg):
    errors.append(msg)


# Coverage the file must keep: (what, at least how many).
COVERAGE = [
    ("cases", 25),
    ("steps", 150),
    ("multi-band cases", 12),
    ("reconfigure cases", 5),
    ("multi-band refusals naming band 0", 1),
    ("multi-band refusals naming band 1", 1),
    ("multi-band refusals naming band 2", 1),
    ("multi-band allows naming band 1", 1),
    ("refusals of never while another band held the cost", 1),
    ("refusals tied between bands", 1),
    ("allows tied between bands", 1),
    ("multi-band peeks", 3),
    ("multi-band costs of 0", 1),
    ("multi-band resets", 1),
    ("refunds", 12),
    ("multi-band refunds", 2),
    ("refunds capped at capacity", 2),
]


def check_properties(doc, errors):
    """What the schema cannot say. Returns the number of steps."""
    ids = set()
    seen = dict.fromkeys((what for what, _ in COVERAGE), 0)
    seen["cases"] = len(doc["cases"])
    for c in doc["cases"]:
        cid = c["id"]
        if cid in ids:
            fail(errors, "duplicate id %s" % cid)
        ids.add(cid)
        steps = c.get("steps", [])
        config = c["config"]
        reconfigures = [s for s in steps if s["op"] == "reconfigure"]
        if bool(c.get("redis_only")) != bool(reconfigures):
            fail(errors, "%s: redis_only must be true exactly when a case reconfigures" % cid)
        if is_multi(config) or any(is_multi(s["config"]) for s in reconfigures):
            seen["multi-band cases"] += 1
        if reconfigures:
            seen["reconfigure cases"] += 1
        for i, s in enumerate(steps):
            seen["steps"] += 1
            if s["op"] == "reconfigure":
                config = s["config"]
                continue
            if s["op"] == "reset" and is_multi(config):
                seen["multi-band resets"] += 1
            if s["op"] == "refund":
                seen["refunds"] += 1
                seen["multi-band refunds"] += is_multi(config)
            e = s.get("expect")
            if not e:
                continue
            where = "%s step %d" % (cid, i)
            caps = [cap for cap, _ in config_bands(config)]
            if not (is_multi(config) == ("band" in e) == ("bands" in e)):
                fail(errors, "%s: band and bands are there exactly when the config has bands" % where)
                continue
            per = e.get("bands", [e])          # one bucket: the whole is its band
            if len(per) != len(caps):
                fail(errors, "%s: %d bands, the config has %d" % (where, len(per), len(caps)))
                continue
            for b, (p, cap) in enumerate(zip(per, caps)):
                at = where if "bands" not in e else "%s band %d" % (where, b)
                if not 0 <= p["remaining"] <= cap:
                    fail(errors, "%s: remaining outside 0..capacity" % at)
                if p["allowed"] != (p["retry_after_us"] == 0):
                    fail(errors, "%s: retry_after_us must be 0 exactly when allowed" % at)
                if (p["reset_after_us"] == 0) != (p["remaining"] == cap):
                    fail(errors, "%s: reset_after_us is 0 exactly when full" % at)
                if p["limit"] != cap:
                    fail(errors, "%s: limit must be the capacity" % at)
            if s["op"] == "refund":
                if not e["allowed"]:
                    fail(errors, "%s: a refund is always allowed" % where)
                seen["refunds capped at capacity"] += any(
                    p["remaining"] == cap for p, cap in zip(per, caps))
            if "bands" not in e:
                continue
            band = e["band"]
            if not 0 <= band < len(per):
                fail(errors, "%s: band %d outside the config's bands" % (where, band))
                continue
            refusing = [p for p in per if not p["allowed"]]
            if (e["allowed"] != (not refusing) or e["remaining"] != min(p["remaining"] for p in per)
                    or e["reset_after_us"] != max(p["reset_after_us"] for p in per)
                    or e["limit"] != per[band]["limit"]):
                fail(errors, "%s: the whole is not its bands' allowed, least remaining, "
                     "longest reset and band's limit" % where)
            if e["allowed"]:
                ties = [p for p in per if p["remaining"] == per[band]["remaining"]]
                if e["retry_after_us"] != 0 or per[band]["remaining"] != e["remaining"]:
                    fail(errors, "%s: an allowed band is the one with the fewest left" % where)
                seen["allows tied between bands"] += len(ties) > 1
                seen["multi-band allows naming band 1"] += band == 1
            else:
                longest = per[band]["retry_after_us"]
                ties = [p for p in refusing if p["retry_after_us"] == longest]
                if (per[band]["allowed"] or e["retry_after_us"] != longest
                        or any(longer(p["retry_after_us"], longest) for p in refusing)):
                    fail(errors, "%s: a refusal's band is the refusing one that waits longest" % where)
                seen["refusals tied between bands"] += len(ties) > 1
                key = "multi-band refusals naming band %d" % band
                if key in seen:
                    seen[key] += 1
                if longest == NEVER and len(refusing) < len(per):
                    seen["refusals of never while another band held the cost"] += 1
            seen["multi-band peeks"] += s["op"] == "peek"
            seen["multi-band costs of 0"] += s.get("cost", 1) == 0
    for what, least in COVERAGE:
        if seen[what] < least:
            fail(errors, "only %d %s (at least %d wanted)" % (seen[what], what, least))
    return seen["steps"]


def replay(doc, errors):
    """Run the file's own inputs through the model; report every difference."""
    for c in doc["cases"]:
        cid = c["id"]
        err = config_error_of(c["config"])
        if err != c.get("config_error"):
            fail(errors, "%s: config_error: file %r, model %r" % (cid, c.get("config_error"), err))
        if err:
            continue
        runner = Runner(c["config"])
        for i, s in enumerate(c.get("steps", [])):
            if s["op"] == "reconfigure" and config_error_of(s["config"]):
                fail(errors, "%s step %d: reconfigure to a config that is an error" % (cid, i))
                break
            got = runner.step(s)
            if got is None:
                continue
            kind, value = got
            model_error = value if kind == "expect_error" else None
            if model_error or "expect_error" in s:
                if s.get("expect_error") != model_error:
                    fail(errors, "%s step %d: expect_error: file %r, model %r"
                         % (cid, i, s.get("expect_error"), model_error))
                continue
            compare_decision(errors, "%s step %d" % (cid, i), s.get("expect", {}), value)


FIELDS = ("allowed", "remaining", "retry_after_us", "reset_after_us", "limit")


def compare_decision(errors, where, want, got):
    for field in FIELDS + ("band",):
        if want.get(field) != got.get(field):
            fail(errors, "%s: %s: file %r, model %r" % (where, field, want.get(field), got.get(field)))
    wb, gb = want.get("bands"), got.get("bands")
    if (wb is None) != (gb is None) or (wb is not None and len(wb) != len(gb)):
        fail(errors, "%s: bands: file %r, model %r" % (where, wb, gb))
        return
    for b, (w, g) in enumerate(zip(wb or [], gb or [])):
        for field in FIELDS:
            if w.get(field) != g[field]:
                fail(errors, "%s: bands[%d].%s: file %r, model %r"
                     % (where, b, field, w.get(field), g[field]))


def check_hand(doc, errors):
    by_id = {c["id"]: c for c in doc["cases"]}
    for cid, idx, want in HAND_CHECKS:
        c = by_id.get(cid)
        if c is None:
            fail(errors, "hand check names unknown case %s" % cid)
            continue
        if idx is None:
            if c.get("config_error") != want:
                fail(errors, "hand check %s: config_error %r, by hand %r"
                     % (cid, c.get("config_error"), want))
            continue
        s = c["steps"][idx]
        if isinstance(want, str):
            if s.get("expect_error") != want:
                fail(errors, "hand check %s step %d: expect_error %r, by hand %r"
                     % (cid, idx, s.get("expect_error"), want))
            continue
        expect = s.get("expect", {})
        for field, value in want.items():
            if field == "bands":
                got_bands = expect.get("bands", [])
                for b, band_want in enumerate(value):
                    for f, v in band_want.items():
                        got = got_bands[b].get(f) if b < len(got_bands) else None
                        if got != v:
                            fail(errors, "hand check %s step %d: bands[%d].%s is %r, by hand %r"
                                 % (cid, idx, b, f, got, v))
                continue
            got = expect.get(field)
            if got != value:
                fail(errors, "hand check %s step %d: %s is %r, by hand %r"
                     % (cid, idx, field, got, value))


def check_schema(doc, errors):
    import jsonschema
    with open(SCHEMA, encoding="utf-8") as f:
        schema = json.load(f)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    for e in sorted(cls(schema).iter_errors(doc), key=lambda e: list(e.absolute_path)):
        path = "/".join(str(p) for p in e.absolute_path)
        fail(errors, "schema: at /%s: %s" % (path, e.message))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="verify token_bucket.json instead of writing it")
    args = ap.parse_args()

    fresh_doc = build_document()
    fresh = dumps(fresh_doc)
    errors = []
    if not args.check:
        check_schema(fresh_doc, errors)
        check_properties(fresh_doc, errors)
        check_hand(fresh_doc, errors)
        if errors:
            print("\n".join(errors), file=sys.stderr)
            print("not written: %d problems" % len(errors), file=sys.stderr)
            return 1
        with open(VECTORS, "w", encoding="utf-8") as f:
            f.write(fresh)
        nsteps = sum(len(c.get("steps", [])) for c in fresh_doc["cases"])
        print("wrote %s: %d cases, %d steps" % (VECTORS, len(fresh_doc["cases"]), nsteps))
        return 0

    with open(VECTORS, encoding="utf-8") as f:
        text = f.read()
    try:
        doc = json.loads(text)
    except ValueError as e:
        print("%s: not JSON: %s" % (VECTORS, e), file=sys.stderr)
        return 1
    nsteps = 0
    check_schema(doc, errors)
    if not errors:                      # the rest assumes the schema's shape
        nsteps = check_properties(doc, errors)
        replay(doc, errors)
        check_hand(doc, errors)
    if text != fresh:
        diff = difflib.unified_diff(text.splitlines(), fresh.splitlines(),
                                    "token_bucket.json (file)", "token_bucket.json (generate.py)",
                                    lineterm="", n=1)
        errors.append("the file differs from what generate.py writes "
                      "(run it without --check to rewrite):\n" + "\n".join(list(diff)[:60]))
    if errors:
        print("\n".join(errors), file=sys.stderr)
        print("token_bucket.json: %d problems" % len(errors), file=sys.stderr)
        return 1
    print("token_bucket.json: %d cases, %d steps, schema, model and hand checks agree"
          % (len(doc["cases"]), nsteps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
