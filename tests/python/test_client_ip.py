"""Client identity (docs/semantics.md, "Client addresses and keys") through
hirate's ClientIP, ident_for_ip and bucket keys: every case of
tests/vectors/client_ip.json, the file the C core and Lua check too. The
rules are the core's; the answers are the same in every language."""

import json
import pathlib

import pytest

import hirate
from hirate import _hirate
from hirate._http import ClientIP, _bucket_key, ident_for_ip

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = json.loads((ROOT / "tests" / "vectors" / "client_ip.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", DOC["resolve"], ids=lambda c: c["rule"])
def test_a_request_gives_its_client_identity_and_bucket_key(case):
    ip = ClientIP(**case["config"])
    address = ip.resolve(case["peer"], case["values"])
    assert address == case["address"]
    key = ip.key(address)
    assert key == case["key"]
    ident = ident_for_ip(key)
    assert ident == case["ident"].encode()
    assert _bucket_key(case["scope"], ident, case["head"]) == case["bucket_key"].encode()


@pytest.mark.parametrize("case", DOC["bucket_keys"], ids=lambda c: c["rule"])
def test_an_identity_gives_its_bucket_key(case):
    scope = case["scope"]
    head = None if scope is None else case["head"].encode()
    got = _hirate.bucket_key(case["ident"].encode(), None if scope is None else scope.encode(), head)
    assert got == case["bucket_key"].encode()
    if scope is not None:
        assert _bucket_key(scope, case["ident"].encode(), case["head"]) == got


@pytest.mark.parametrize("case", DOC["errors"], ids=lambda c: c["error"][:40])
def test_a_bad_config_raises_the_cores_message(case):
    with pytest.raises(hirate.ConfigError) as info:
        ClientIP(**case["config"])
    assert (info.value.code, str(info.value)) == (_hirate.EOPTION, case["error"])
