"""hirate._http: what Flask and ASGI share. The client's address behind
proxies (spoofed headers, hop counts, IPv6, malformed values), limits and
their bucket keys, and the RateLimit headers computed from real decisions
(an in-memory hirate.Limiter at injected times, so every value is exact).
"""

import math

import pytest

import hirate
from hirate._http import (KEY_MAX, ClientIP, Limit, Result, check_limits, decide_sync,
                          ident_for_ip, ident_for_key, key_header, refill_seconds)

# ------------------------------------------------------------- client address

TRUSTED = ["10.0.0.0/8", "2001:db8:ffff::/48"]

# (rule, peer, X-Forwarded-For field values, expected client)
XFF_TRUSTED_CASES = [
    ("no header: the peer", "203.0.113.7", [], "203.0.113.7"),
    ("an untrusted peer's header is ignored (spoofed)",
     "203.0.113.7", ["198.51.100.1"], "203.0.113.7"),
    ("an untrusted peer's header is ignored even when it names a proxy",
     "203.0.113.7", ["10.0.0.1"], "203.0.113.7"),
    ("a trusted peer: the rightmost address", "10.0.0.2", ["198.51.100.1"], "198.51.100.1"),
    ("trusted proxies on the right are skipped",
     "10.0.0.2", ["198.51.100.1, 10.1.2.3, 10.0.0.9"], "198.51.100.1"),
    ("entries left of the first untrusted one are the client's own (spoofed)",
     "10.0.0.2", ["1.1.1.1, 2.2.2.2, 198.51.100.1"], "198.51.100.1"),
    ("several header fields are one list, in order",
     "10.0.0.2", ["1.1.1.1", "198.51.100.1, 10.0.0.5"], "198.51.100.1"),
    ("every hop trusted: the leftmost one", "10.0.0.2", ["10.0.0.3, 10.0.0.4"], "10.0.0.3"),
    ("whitespace around entries", "10.0.0.2", ["  198.51.100.1  ,10.0.0.5 "], "198.51.100.1"),
    ("an address with a port", "10.0.0.2", ["198.51.100.1:4711"], "198.51.100.1"),
    ("IPv6 peer and client", "2001:db8:ffff::1", ["2001:db8:1:2::abcd"], "2001:db8:1:2::abcd"),
    ("IPv6 in brackets with a port", "10.0.0.2", ["[2001:db8::17]:4711"], "2001:db8::17"),
    ("IPv6 written long is normalised",
     "10.0.0.2", ["2001:0DB8:0000:0000:0000:0000:0000:0017"], "2001:db8::17"),
    ("an IPv4-mapped IPv6 peer is its IPv4 address",
     "::ffff:10.0.0.2", ["198.51.100.1"], "198.51.100.1"),
    ("an IPv4-mapped client is its IPv4 address",
     "10.0.0.2", ["::ffff:198.51.100.1"], "198.51.100.1"),
    ("garbage ends the walk at the nearest known address",
     "10.0.0.2", ["198.51.100.1, not-an-ip"], "10.0.0.2"),
    ("garbage behind a trusted hop ends at that hop",
     "10.0.0.2", ["198.51.100.1, <script>, 10.0.0.7"], "10.0.0.7"),
    ("'unknown' is not an address", "10.0.0.2", ["unknown"], "10.0.0.2"),
    ("an empty entry is malformed", "10.0.0.2", ["198.51.100.1,,"], "10.0.0.2"),
    ("an empty field is malformed", "10.0.0.2", [""], "10.0.0.2"),
    ("a bad port is malformed", "10.0.0.2", ["198.51.100.1:http"], "10.0.0.2"),
    ("an unclosed bracket is malformed", "10.0.0.2", ["[2001:db8::1"], "10.0.0.2"),
    ("an address out of range is malformed", "10.0.0.2", ["256.1.1.1"], "10.0.0.2"),
    ("a peer that is not an address is kept as it is",
     "testclient", ["198.51.100.1"], "testclient"),
]


@pytest.mark.parametrize("rule,peer,values,expected", XFF_TRUSTED_CASES,
                         ids=[c[0] for c in XFF_TRUSTED_CASES])
def test_xff_with_trusted_proxies(rule, peer, values, expected):
    assert ClientIP(TRUSTED).resolve(peer, values) == expected


# (rule, hops, peer, X-Forwarded-For field values, expected client)
XFF_HOPS_CASES = [
    ("one proxy: the rightmost address", 1, "192.0.2.1", ["198.51.100.1"], "198.51.100.1"),
    ("extra left entries are ignored (spoofed)",
     1, "192.0.2.1", ["6.6.6.6, 7.7.7.7, 198.51.100.1"], "198.51.100.1"),
    ("two proxies: the second from the right",
     2, "192.0.2.1", ["6.6.6.6, 198.51.100.1, 192.0.2.50"], "198.51.100.1"),
    ("fewer hops than proxies: the peer (did not come through them)",
     2, "192.0.2.1", ["198.51.100.1"], "192.0.2.1"),
    ("no header: the peer", 1, "192.0.2.1", [], "192.0.2.1"),
    ("a malformed client hop: the nearest proxy to its right",
     2, "192.0.2.1", ["garbage, 192.0.2.50"], "192.0.2.50"),
    ("a malformed proxy hop: the peer",
     2, "192.0.2.1", ["198.51.100.1, garbage"], "192.0.2.1"),
    ("a peer on a Unix socket", 1, None, ["198.51.100.1"], "198.51.100.1"),
    ("IPv6 client", 1, "::1", ["2001:db8::5"], "2001:db8::5"),
]


@pytest.mark.parametrize("rule,hops,peer,values,expected", XFF_HOPS_CASES,
                         ids=[c[0] for c in XFF_HOPS_CASES])
def test_xff_with_proxy_hops(rule, hops, peer, values, expected):
    assert ClientIP(proxy_hops=hops).resolve(peer, values) == expected


def test_without_configuration_headers_are_never_believed():
    ip = ClientIP()
    assert ip.resolve("203.0.113.7", ["198.51.100.1"]) == "203.0.113.7"
    assert ip.resolve("10.0.0.2", ["198.51.100.1"]) == "10.0.0.2"
    assert ip.resolve(None, ["198.51.100.1"]) is None


def test_hops_with_trusted_proxies_require_a_trusted_peer():
    ip = ClientIP(["10.0.0.0/8"], proxy_hops=1)
    assert ip.resolve("10.0.0.2", ["6.6.6.6, 198.51.100.1"]) == "198.51.100.1"
    assert ip.resolve("203.0.113.7", ["6.6.6.6, 198.51.100.1"]) == "203.0.113.7"


def test_unix_socket_peers_are_trusted_only_when_configured():
    assert ClientIP(["10.0.0.0/8"]).resolve(None, ["198.51.100.1"]) is None
    assert ClientIP(["unix"]).resolve(None, ["198.51.100.1"]) == "198.51.100.1"
    # "unix" trusts no TCP peer.
    assert ClientIP(["unix"]).resolve("10.0.0.2", ["198.51.100.1"]) == "10.0.0.2"


def test_a_single_address_is_a_network_of_one():
    ip = ClientIP(["10.0.0.2", "::1"])
    assert ip.resolve("10.0.0.2", ["198.51.100.1"]) == "198.51.100.1"
    assert ip.resolve("10.0.0.3", ["198.51.100.1"]) == "10.0.0.3"
    assert ip.resolve("::1", ["198.51.100.1"]) == "198.51.100.1"


# (rule, Forwarded field values, expected client), from a trusted peer 10.0.0.2
FORWARDED_CASES = [
    ("for= of the only element", ['for=198.51.100.1'], "198.51.100.1"),
    ("parameter names are case-insensitive", ['For=198.51.100.1;Proto=https'], "198.51.100.1"),
    ("quoted IPv6 with a port (RFC 7239 section 6)",
     ['for="[2001:db8:cafe::17]:4711"'], "2001:db8:cafe::17"),
    ("the rightmost untrusted element",
     ['for=6.6.6.6, for=198.51.100.1;by=10.0.0.2, for=10.0.0.9'], "198.51.100.1"),
    ("elements over several fields", ['for=6.6.6.6', 'for=198.51.100.1'], "198.51.100.1"),
    ("commas and semicolons inside quotes do not split",
     ['for=198.51.100.1;host="a,b;c", for=10.0.0.9'], "198.51.100.1"),
    ("an obfuscated identifier is not an address", ['for=_hidden'], "10.0.0.2"),
    ("'unknown' is not an address", ['for=unknown'], "10.0.0.2"),
    ("an element without for= is malformed", ['for=198.51.100.1, proto=https'], "10.0.0.2"),
    ("an unterminated quote is malformed", ['for=198.51.100.1, for="10.0.0.9'], "10.0.0.2"),
    ("garbage", ['%%%'], "10.0.0.2"),
]


@pytest.mark.parametrize("rule,values,expected", FORWARDED_CASES,
                         ids=[c[0] for c in FORWARDED_CASES])
def test_forwarded_header(rule, values, expected):
    ip = ClientIP(["10.0.0.0/8"], header="Forwarded")
    assert ip.resolve("10.0.0.2", values) == expected


def test_forwarded_from_an_untrusted_peer_is_ignored():
    ip = ClientIP(["10.0.0.0/8"], header="forwarded")
    assert ip.resolve("203.0.113.7", ["for=198.51.100.1"]) == "203.0.113.7"


def test_forwarded_with_hops():
    ip = ClientIP(proxy_hops=1, header="Forwarded")
    assert ip.resolve("192.0.2.1", ['for=6.6.6.6, for=198.51.100.1']) == "198.51.100.1"


def test_ipv6_clients_share_a_bucket_per_subnet():
    assert ClientIP().key("2001:db8:1:2:aaaa:bbbb:cccc:dddd") == "2001:db8:1:2::/64"
    assert ClientIP(ipv6_subnet=48).key("2001:db8:1:2::9") == "2001:db8:1::/48"
    assert ClientIP(ipv6_subnet=128).key("2001:db8:1:2::9") == "2001:db8:1:2::9"
    assert ClientIP().key("198.51.100.1") == "198.51.100.1"
    assert ClientIP().key("testclient") == "testclient"
    assert ClientIP().key(None) is None


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(trusted_proxies=["10.0.0.0/33"]), ValueError,
     'trusted_proxies: "10.0.0.0/33" is not an address or network'),
    (dict(trusted_proxies=["proxy.local"]), ValueError,
     'trusted_proxies: "proxy.local" is not an address or network'),
    (dict(proxy_hops=-1), ValueError, "proxy_hops must be a whole number from 0 to 64, got -1"),
    (dict(proxy_hops=True), TypeError, "proxy_hops must be an int, got bool"),
    (dict(header="X-Real-IP"), ValueError,
     "header must be 'X-Forwarded-For' or 'Forwarded', got \"X-Real-IP\""),
    (dict(ipv6_subnet=0), ValueError, "ipv6_subnet must be a prefix length from 1 to 128"),
])
def test_bad_proxy_settings_are_named(kwargs, error, message):
    with pytest.raises(error) as e:
        ClientIP(**kwargs)
    assert message in str(e.value)


def test_a_comma_separated_string_is_not_one_network():
    # A single string is one entry; hirate.flask splits config strings.
    assert ClientIP("10.0.0.0/8").resolve("10.0.0.2", ["198.51.100.1"]) == "198.51.100.1"


# ------------------------------------------------------------- limits and keys

@pytest.mark.parametrize("capacity,rate,seconds", [
    (5, 2, 3),           # 2.5 s, rounded up
    (10, 1, 10),
    (5, 1 / 60, 300),
    (3, 0.3, 10),        # the core's arithmetic, not 3/0.3 = 10.000000000000002
    (1, 1e6, 1),         # 1 µs, rounded up to a whole second
    (100, 1 / 3, 300),
])
def test_refill_seconds(capacity, rate, seconds):
    assert refill_seconds(capacity, rate) == seconds


@pytest.mark.parametrize("capacity,rate", [(3, 0.3), (7, 1 / 3), (12345, 7.7), (9, 0.07)])
def test_refill_seconds_is_a_drained_buckets_reset_after(capacity, rate):
    lim = hirate.Limiter(capacity=capacity, rate=rate)
    d = lim._decide_at("k", capacity, True, 1_000_000)
    assert refill_seconds(capacity, rate) == math.ceil(d.reset_after)


def test_limit_default_name_and_window():
    lim = Limit(10, 0.5)
    assert (lim.name, lim.window, lim.capacity, lim.rate) == ("10-per-20s", 20, 10, 0.5)
    assert repr(lim) == "Limit(10, 0.5, name='10-per-20s')"
    # a whole float is a capacity, as hirate.Limiter takes it
    assert (Limit(2.0, 1).capacity, type(Limit(2.0, 1).capacity)) == (2, int)


@pytest.mark.parametrize("args,kwargs,error,message", [
    ((0, 1), {}, hirate.ConfigError, "capacity must be a whole number from 1 to 2^53-1, got 0"),
    ((2**53, 1), {}, hirate.ConfigError, "capacity must be a whole number from 1 to 2^53-1"),
    ((True, 1), {}, TypeError, "capacity must be an int, not bool"),
    ((1.5, 1), {}, hirate.ConfigError, "capacity must be a whole number from 1 to 2^53-1, got 1.5"),
    ((5, 0), {}, hirate.ConfigError, "rate must be a finite number of tokens per second above 0"),
    ((5, float("nan")), {}, hirate.ConfigError, "rate must be a finite number"),
    ((5, float("inf")), {}, hirate.ConfigError, "rate must be a finite number"),
    ((5, "2"), {}, TypeError, "rate must be a number, not str"),
    (("5/minute", 2), {}, TypeError, "a limit string holds its own rate: Limit('5/minute')"),
    ((5, None), {}, TypeError, "a Limit needs a rate: Limit(capacity, rate), or a limit string"),
    ((5, b"2"), {}, TypeError, "rate must be a number, not bytes"),
    ((2**52, 1e-6), {}, hirate.ConfigError, "takes over 2^53 us to refill"),
    ((5, 1), dict(cost=-1), hirate.ConfigError,
     "cost must be a whole number from 0 to 2^53-1, got -1"),
    ((5, 1), dict(cost=2**53), hirate.ConfigError,
     "cost must be a whole number from 0 to 2^53-1, got 9007199254740992"),
    ((5, 1), dict(cost=2**70), hirate.ConfigError,
     "cost must be a whole number from 0 to 2^53-1, got 1180591620717411303424"),
    ((5, 1), dict(cost=True), TypeError, "cost must be an int or a callable, got bool"),
    ((5, 1), dict(scope=""), ValueError, "scope must not be empty"),
    ((5, 1), dict(scope="a|b"), ValueError, "scope 'a|b' contains '|'"),
    ((5, 1), dict(scope="x" * 201), ValueError, "is longer than 200 bytes"),
    # Names are the core's to judge, as it judges a band's.
    ((5, 1), dict(name="caf\u00e9"), hirate.ConfigError,
     "name 'caf\u00e9': a band's name must be printable ASCII (it is sent in headers)"),
    ((5, 1), dict(name=""), hirate.ConfigError,
     "name '': a band's name must be 1 to 64 bytes, got 0"),
    ((5, 1), dict(name="n" * 65), hirate.ConfigError, "a band's name must be 1 to 64 bytes, got 65"),
    ((5, 1), dict(name=5), TypeError, "name must be a str, got int"),
    ((5, 1), dict(key="X-API-Key"), TypeError, "key must be a callable(request) or None"),
])
def test_bad_limits_are_named(args, kwargs, error, message):
    with pytest.raises(error) as e:
        Limit(*args, **kwargs)
    assert message in str(e.value)


def test_limits_on_one_route_need_distinct_names_and_buckets():
    with pytest.raises(ValueError, match="two limits on view 'f' are both named 'x'"):
        check_limits([Limit(5, 1, name="x"), Limit(6, 1, name="x")], "view 'f'")
    with pytest.raises(ValueError, match="every request would spend that bucket twice"):
        check_limits([Limit(5, 1), Limit(5, 1.0, name="again")], "view 'f'")
    assert [lim.name for lim in check_limits([(5, 1), Limit(5, 0.5)], "x")] == [
        "5-per-5s", "5-per-10s"]


def test_bucket_keys_hold_scope_capacity_rate_and_identity_as_hash_tag():
    assert Limit(5, 2).bucket_key("ep:index", b"ip:10.0.0.1") == b"{ip:10.0.0.1}|ep:index|5/2.0"
    assert Limit(5, 1 / 3).bucket_key("app", b"k:alice") == b"{k:alice}|app|5/0.3333333333333333"
    # Every limit of one identity shares its tag, so a Redis Cluster keeps
    # them on one node, whatever braces the identity or the scope holds.
    for ident in (b"k:alice", b"k:a}b", b"k:{x}"):
        keys = [Limit(5, 2).bucket_key("a", ident),
                Limit(9, 1).bucket_key("route:GET /items/{item_id}", ident)]
        tags = [k[k.index(b"{") + 1:k.index(b"}", k.index(b"{") + 1)] for k in keys]
        want = ident[:ident.index(b"}")] if b"}" in ident else ident
        assert tags[0] == tags[1] == want


def test_identities_of_keys_and_addresses_never_meet():
    # A key function returning an address does not share the address' bucket.
    assert ident_for_key("10.0.0.1") != ident_for_ip("10.0.0.1")
    assert ident_for_key("alice") == b"k:alice"
    assert ident_for_key(b"\x00\xff") == b"k:\x00\xff"
    assert ident_for_key(42) == b"k:42"
    assert ident_for_ip(None) == b"ip:unknown"
    with pytest.raises(TypeError, match="must return str, bytes, int or None, got float"):
        ident_for_key(1.5)


def test_long_identities_are_hashed_to_fit_the_key_limit():
    lim = Limit(5, 2)
    long_ident = ident_for_key("x" * 1000)
    key = lim.bucket_key("app", long_ident)
    assert key == (b"{#" + __import__("hashlib").sha256(long_ident).hexdigest().encode()
                   + b"}|app|5/2.0")
    assert len(key) <= KEY_MAX
    # The longest identity that fits is kept as it is.
    fits = b"k:" + b"y" * (KEY_MAX - len(b"{}|app|5/2.0") - 2)
    assert lim.bucket_key("app", fits) == b"{" + fits + b"}|app|5/2.0"
    assert len(lim.bucket_key("app", fits + b"y")) == len(b"{#}|app|5/2.0") + 64
    # And a hirate.Limiter takes every one of them.
    hirate.Limiter(capacity=5, rate=2).allow(key)


def test_key_header_reads_the_header_or_falls_back_to_the_address():
    class Req:
        headers = {"X-API-Key": "k-123"}

    class Bare:
        headers = {}

    key = key_header("X-API-Key")
    assert key(Req()) == "k-123"
    assert key(Bare()) is None
    assert key.__name__ == "key_header('X-API-Key')"


# --------------------------------------------------------------- the headers

def decide(capacity, rate, steps):
    """Decisions of an in-memory limiter at injected times: steps are
    (t_us, cost, spend)."""
    lim = hirate.Limiter(capacity=capacity, rate=rate)
    return [lim._decide_at("k", cost, spend, t) for t, cost, spend in steps]


def test_headers_of_an_allowed_request():
    lim = Limit(5, 2)
    d = decide(5, 2, [(0, 1, True)])[0]      # 4 left, full again in 0.5 s
    result = Result([(lim, d)])
    assert (result.allowed, result.status, result.retry_after) == (True, 200, None)
    assert result.headers() == [
        ("RateLimit-Policy", '"5-per-3s";q=5;w=3'),
        ("RateLimit", '"5-per-3s";r=4;t=1'),
    ]
    assert result.headers(ratelimit=False, legacy=True) == [
        ("X-RateLimit-Limit", "5"), ("X-RateLimit-Remaining", "4"), ("X-RateLimit-Reset", "1")]


def test_headers_of_a_refusal_round_up_and_agree_with_retry_after():
    lim = Limit(2, 0.4, name="burst")
    # Two spent at 0; at 1 s the bucket holds 0.4: one token is 1.5 s away.
    steps = [(0, 1, True), (0, 1, True), (1_000_000, 1, True)]
    d = decide(2, 0.4, steps)[-1]
    assert (d.allowed, d.retry_after) == (False, 1.5)
    result = Result([(lim, d)])
    assert (result.allowed, result.status, result.retry_after) == (False, 429, 2)
    assert result.violated == ["burst"]
    assert result.headers(legacy=True) == [
        ("RateLimit-Policy", '"burst";q=2;w=5'),
        ("RateLimit", '"burst";r=0;t=2'),
        ("X-RateLimit-Limit", "2"), ("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "2"),
        ("Retry-After", "2"),
    ]
    assert result.problem() == {
        "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "title": "Too many requests",
        "status": 429,
        "detail": "Too many requests; retry in 2 seconds.",
        "violated-policies": ["burst"],
        "retry_after": 2,
    }
    assert result.text() == "Too many requests; retry in 2 seconds.\n"


def test_a_whole_second_is_not_rounded_further():
    lim = Limit(1, 1)
    d = decide(1, 1, [(0, 1, True), (0, 1, True)])[-1]
    assert d.retry_after == 1.0
    assert Result([(lim, d)]).headers()[-1] == ("Retry-After", "1")


def test_several_limits_are_several_named_items():
    burst, daily = Limit(2, 0.4, name="burst"), Limit(100, 100 / 86400, name="daily")
    refused = decide(2, 0.4, [(0, 2, True), (0, 1, True)])[-1]
    fine = decide(100, 100 / 86400, [(0, 1, False)])[-1]   # a peek: nothing spent
    result = Result([(burst, refused), (daily, fine)])
    assert result.headers() == [
        ("RateLimit-Policy", '"burst";q=2;w=5, "daily";q=100;w=86400'),
        # A refusal's t is when the request could pass each limit: now for
        # the one that has the tokens, so Retry-After is never earlier.
        ("RateLimit", '"burst";r=0;t=3, "daily";r=100;t=0'),
        ("Retry-After", "3"),
    ]
    assert result.violated == ["burst"]


def test_names_are_structured_field_strings():
    lim = Limit(5, 2, name='a "quoted" \\ name')
    d = decide(5, 2, [(0, 1, True)])[0]
    assert Result([(lim, d)]).policy_header() == '"a \\"quoted\\" \\\\ name";q=5;w=3'


def test_a_cost_above_the_capacity_never_passes():
    lim = Limit(5, 2)
    d = decide(5, 2, [(0, 6, True)])[0]
    assert math.isinf(d.retry_after)
    result = Result([(lim, d)])
    assert (result.allowed, result.status, result.retry_after) == (False, 429, None)
    # No t and no Retry-After: there is no time to wait for.
    assert result.headers() == [
        ("RateLimit-Policy", '"5-per-3s";q=5;w=3'),
        ("RateLimit", '"5-per-3s";r=5'),
    ]
    assert result.problem()["retry_after"] is None
    assert result.detail() == ("Too many requests; this request exceeds the limit and "
                               "can never pass.")


def test_legacy_headers_describe_the_tightest_limit():
    a, b = Limit(10, 1, name="a"), Limit(3, 1, name="b")
    da = decide(10, 1, [(0, 1, True)])[0]   # 9 left
    db = decide(3, 1, [(0, 1, True)])[0]    # 2 left
    legacy = dict(Result([(a, da), (b, db)]).headers(ratelimit=False, legacy=True))
    assert legacy == {"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "2",
                      "X-RateLimit-Reset": "1"}


# ---------------------------------------------------- several limits, one request

def test_decide_sync_one_limit_is_one_allow():
    lim = hirate.Limiter(capacity=2, rate=1e-3)
    assert [d.remaining for d in decide_sync([(lim, "k", 1, True)])] == [1]
    assert lim.peek("k").remaining == 1


def test_decide_sync_a_refusal_spends_nothing_on_the_others():
    small = hirate.Limiter(capacity=1, rate=1e-3)
    big = hirate.Limiter(capacity=5, rate=1e-3)
    for order in ([(small, "k", 1, True), (big, "k", 1, True)],
                  [(big, "k", 1, True), (small, "k", 1, True)]):
        small.reset("k")
        big.reset("k")
        first = decide_sync(order)
        assert [d.allowed for d in first] == [True, True]
        second = decide_sync(order)
        assert sorted(d.allowed for d in second) == [False, True]
        assert big.peek("k").remaining == 4, "the refusal spent the other limit"
        assert small.peek("k").remaining == 0


# ------------------------------------------------------ stacked limits as bands

def test_limits_of_one_identity_scope_and_cost_are_one_group():
    from hirate._http import plan

    def user(request):
        return "u"

    def costly(request):
        return 3

    a, b = Limit("10/second"), Limit("1000/day")
    c = Limit("5/minute", key=key_header("X-API-Key"))
    d = Limit("50/hour", key=key_header("x-api-key"))   # the same header: one identity
    e = Limit("7/minute", key=user)
    f = Limit("8/minute", cost=2)
    g = Limit("9/minute", cost=costly)
    shared = Limit.parse("2/second; 20/day", scope="api")
    apart = Limit("3/second", scope="api")
    applied = [(a, "ep:x"), (c, "ep:x"), (b, "ep:x"), (d, "ep:x"), (e, "ep:x"), (f, "ep:x"),
               (g, "ep:x"), (Limit("4/second"), "bp:y"), (shared[0], "api"), (apart, "api"),
               (shared[1], "api")]
    groups = plan(applied)
    assert [(g.positions, g.scope) for g in groups] == [
        ([0, 2], "ep:x"), ([1, 3], "ep:x"), ([4], "ep:x"), ([5], "ep:x"), ([6], "ep:x"),
        ([7], "bp:y"), ([8, 10], "api"), ([9], "api")]
    first = groups[0]
    assert first.bands == ((10, 10.0, "10-per-1s"), (1000, 1000 / 86400, "1000-per-86400s"))
    assert first.bucket_key(b"ip:10.0.0.1") == \
        b"{ip:10.0.0.1}|ep:x|10/10.0+1000/0.011574074074074073"
    # One limit: the limiter of its capacity and rate, and the key of today.
    assert groups[2].bands == ((7, 7 / 60),)
    assert groups[2].bucket_key(b"k:u") == e.bucket_key("ep:x", b"k:u")
    # A limit without a key function has the default one: the address, or
    # the limiter's key.
    assert [g.positions for g in plan([(a, "s"), (e, "s")])] == [[0], [1]]
    assert [g.positions for g in plan([(a, "s"), (e, "s")], default_key=user)] == [[0, 1]]


def test_the_headers_of_bands_are_each_band_s_own_figures():
    from hirate._http import Group, checks_of

    burst, daily = Limit(2, 0.4, name="burst"), Limit(100, 100 / 86400, name="daily")
    group = Group("s", None, None, None)
    group._add(0, burst)
    group._add(1, daily)
    lim = hirate.Limiter(limits=list(group.bands))
    steps = [lim._decide_at("k", 1, True, t) for t in (0, 0, 1_000_000)]
    refused = steps[-1]
    assert (refused.allowed, refused.band) == (False, 0)
    result = Result(checks_of([group], [refused], 2))
    assert result.headers() == [
        ("RateLimit-Policy", '"burst";q=2;w=5, "daily";q=100;w=86400'),
        # daily held the cost and spent nothing: 98 left, full again in
        # 2 tokens' time (1728 s), less the second that passed.
        ("RateLimit", '"burst";r=0;t=2, "daily";r=98;t=1727'),
        ("Retry-After", "2"),
    ]
    assert result.violated == ["burst"]


def test_decide_sync_only_peeks_at_the_calls_charged_later():
    spent = hirate.Limiter(capacity=5, rate=1e-3)
    later = hirate.Limiter(capacity=5, rate=1e-3)
    out = decide_sync([(later, "k", 2, False), (spent, "k", 1, True)])
    assert [(d.allowed, d.remaining) for d in out] == [(True, 5), (True, 4)]
    assert (later.peek("k").remaining, spent.peek("k").remaining) == (5, 4)
    # Only calls charged later: nothing is spent.
    assert [d.remaining for d in decide_sync([(later, "k", 5, False)])] == [5]
    assert later.peek("k").remaining == 5


def test_a_limit_of_some_methods_has_a_bucket_of_its_own():
    every, post = Limit(5, 1.0), Limit(5, 1.0, methods=["post", "get"])
    assert post.methods == frozenset(["POST", "GET", "HEAD"])
    assert (every.applies_to("DELETE"), post.applies_to("head"), post.applies_to("PUT")) == (
        True, True, False)
    assert every.bucket_key("s", b"ip:1") == b"{ip:1}|s|5/1.0"
    assert post.bucket_key("s", b"ip:1") == b"{ip:1}|s|5/1.0@GET,HEAD,POST"
    with pytest.raises(ValueError) as e:
        Limit(5, 1.0, methods="FETCH")
    assert str(e.value) == "methods: 'FETCH' is not an HTTP method"
    # One limit on every method and one on POST with the same numbers: two
    # buckets, not one spent twice.
    assert len(check_limits([Limit(5, 1.0), Limit(5, 1.0, methods="POST", name="p")], "v")) == 2
