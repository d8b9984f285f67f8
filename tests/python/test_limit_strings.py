"""Limit strings (docs/semantics.md, "Limit strings") through
hirate.parse_limits: every case of tests/vectors/limit_strings.json, the
file the C core and the other languages check too. A valid text gives
exactly its limits, the rate the very same double as the file's (and as
count / window); an invalid one raises ConfigError, EOPTION, with exactly
the core's message. Then what only Python can get wrong: the type of the
argument, a NUL inside it, and the LimitSpec tuple itself."""

import json
import pathlib
import pickle

import pytest

import hirate
from hirate import _hirate

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = json.loads((ROOT / "tests" / "vectors" / "limit_strings.json").read_text(encoding="utf-8"))
VALID = DOC["valid"]
INVALID = DOC["invalid"]


def test_the_file_has_its_cases():
    assert len(VALID) >= 20 and len(INVALID) >= 20


@pytest.mark.parametrize("case", VALID, ids=lambda c: repr(c["text"]))
def test_a_valid_string_gives_exactly_its_limits(case):
    got = hirate.parse_limits(case["text"])
    want = [hirate.LimitSpec(w["capacity"], w["rate"], w["count"], w["window_s"])
            for w in case["limits"]]
    assert got == want
    for g, w in zip(got, case["limits"]):
        assert type(g) is hirate.LimitSpec
        assert [type(v) for v in g] == [int, float, int, int]
        assert g.rate == w["rate"]                  # the same double, not a near one
        assert g.rate == g.count / g.window
        assert (g.capacity, g.count, g.window) == (w["capacity"], w["count"], w["window_s"])


@pytest.mark.parametrize("case", INVALID, ids=lambda c: repr(c["text"])[:40])
def test_an_invalid_string_raises_the_cores_message(case):
    with pytest.raises(hirate.ConfigError) as info:
        hirate.parse_limits(case["text"])
    e = info.value
    assert type(e) is hirate.ConfigError and isinstance(e, ValueError)
    assert (e.code, e.name) == (_hirate.EOPTION, "EOPTION")
    assert str(e) == case["error"]


@pytest.mark.parametrize("value", [None, 10, 1.5, b"10/second", bytearray(b"1/s"),
                                   ["10/second"]], ids=lambda v: type(v).__name__)
def test_text_that_is_not_a_str_raises_type_error_naming_its_type(value):
    with pytest.raises(TypeError) as info:
        hirate.parse_limits(value)
    assert str(info.value) == f"text must be a str, not {type(value).__name__}"


def test_a_nul_is_refused_not_read_as_the_end():
    # The core reads a C string: "10/s\0..." would be "10/s" without this.
    with pytest.raises(hirate.ConfigError) as info:
        hirate.parse_limits("10/s\0; 1/d")
    assert (info.value.code, info.value.name) == (_hirate.EOPTION, "EOPTION")
    assert str(info.value) == "text must not contain a NUL character"


def test_a_quote_shows_each_byte_that_is_not_printable_ascii_as_a_question_mark():
    # The core quotes 60 bytes of the limit and 39 of the rest, each byte
    # outside printable ASCII as "?": "é" is two of them.
    text = "1/s x" + "\u00e9" * 40
    with pytest.raises(hirate.ConfigError) as info:
        hirate.parse_limits(text)
    assert str(info.value) == ("limit '1/s x" + "?" * 55 + "...': unexpected 'x"
                               + "?" * 38 + "' after the window")


def test_the_extension_returns_plain_tuples_that_the_package_names():
    assert _hirate.parse_limits("100/minute burst 20") == [(20, 100 / 60, 100, 60)]
    spec = hirate.parse_limits(text="100/minute burst 20")[0]
    assert spec == (20, 100 / 60, 100, 60)
    assert spec._fields == ("capacity", "rate", "count", "window")
    assert spec._asdict() == {"capacity": 20, "rate": 100 / 60, "count": 100, "window": 60}
    assert repr(spec) == ("LimitSpec(capacity=20, rate=1.6666666666666667, count=100, "
                          "window=60)")
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert "LimitSpec" in hirate.__all__ and "parse_limits" in hirate.__all__


def test_a_spec_makes_the_limiter_it_describes():
    spec = hirate.parse_limits("10/5s")[0]
    with hirate.Limiter(capacity=spec.capacity, rate=spec.rate) as lim:
        assert lim.allow("k", 10).allowed
        assert not lim.allow("k").allowed
        assert lim.capacity == 10 and lim.rate == 2.0
