"""What Redis refuses is an error, never an outage, in Limiter and
AsyncLimiter alike: maxclients (RefusedError), an ACL user that may not run
the script's commands (AuthError ENOPERM, not EREPLY), under every policy;
and a batch keeps every answer: allow_many with one item that an ACL key
pattern refuses gives the other items' decisions, equal to what Redis holds,
and that item's error (false, as a refusal is) in its place. A password
never shows."""

import socket

import pytest

import hirate
from redis_server import RedisServer
from test_tls import KINDS, POLICIES, make

pytestmark = pytest.mark.timeout(120)

CANARY = "Canary-acl-93d7"
SLOW = dict(timeout=5, connect_timeout=5)


def no_canary(*texts):
    for t in texts:
        assert CANARY not in t, t


@pytest.mark.parametrize("on_error", POLICIES)
@pytest.mark.parametrize("kind", KINDS)
def test_maxclients_is_refused_error_under_every_policy(kind, on_error):
    server = RedisServer(["--maxclients", "1"])
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as held:
            held.sendall(b"PING\r\n")
            assert held.recv(64) == b"+PONG\r\n"   # the one place is taken
            lim = make(kind, server.url, capacity=5, rate=1, on_error=on_error, **SLOW)
            try:
                with pytest.raises(hirate.RefusedError) as info:
                    lim.allow("k")
                e = info.value
                assert (e.code, e.name) == (hirate._hirate.EREFUSED, "EREFUSED")
                assert isinstance(e, ConnectionRefusedError)
                assert "max number of clients reached" in str(e)
                got, = lim.allow_many([("k", 1)])
                assert isinstance(got, hirate.RefusedError) and not got
                stats = lim._stats()
                assert stats["breaker_opens"] == 0 and stats["policy"] == 0
            finally:
                lim.close()
    finally:
        server.close()


@pytest.mark.parametrize("on_error", POLICIES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_user_that_may_not_get_or_set_is_noperm(kind, on_error, own_redis):
    assert own_redis.command("ACL", "SETUSER", "rl", "on", f">{CANARY}", "~*", "+@all",
                             "-get", "-set") == "OK"
    lim = make(kind, f"redis://rl:{CANARY}@127.0.0.1:{own_redis.port}", capacity=5, rate=1,
               on_error=on_error, **SLOW)
    try:
        with pytest.raises(hirate.AuthError) as info:
            lim.allow("k")
        e = info.value
        assert (e.code, e.name) == (hirate._hirate.ENOPERM, "ENOPERM")
        # Redis 7.0's words for a command a script may not run (an ERR reply).
        assert "can't run this command" in str(e)
        assert lim._stats()["breaker_opens"] == 0
        no_canary(str(e), repr(e), repr(lim))
    finally:
        lim.close()


@pytest.mark.parametrize("kind", KINDS)
def test_allow_many_keeps_every_answer_when_an_acl_refuses_one_item(kind, own_redis):
    # The user may touch the keys rl:a* only.
    assert own_redis.command("ACL", "SETUSER", "rl", "on", f">{CANARY}", "~rl:a*",
                             "+@all") == "OK"
    lim = make(kind, f"redis://rl:{CANARY}@127.0.0.1:{own_redis.port}", capacity=5,
               rate=0.001, on_error="closed", **SLOW)
    try:
        got = lim.allow_many([("a1", 2), ("b1", 1), ("a2", 5), ("a1", 1)])
        a1, b1, a2, a1_again = got
        assert [bool(r) for r in got] == [True, False, True, True]
        assert [r for r in got if r] == [a1, a2, a1_again]   # `if d:` admits the allowed
        assert isinstance(b1, hirate.AuthError) and (b1.code, b1.name) == (
            hirate._hirate.ENOPERM, "ENOPERM")
        assert "NOPERM" in str(b1)
        assert [(d.allowed, d.remaining, d.source) for d in (a1, a2, a1_again)] == [
            (True, 3, "redis"), (True, 0, "redis"), (True, 2, "redis")]
        no_canary(str(b1), repr(b1), repr(got), repr(lim))
    finally:
        lim.close()
    # What Redis holds, read by a user that may read every key: the same.
    admin = hirate.Limiter(own_redis.url, capacity=5, rate=0.001, deny_cache=False, **SLOW)
    try:
        assert admin.peek("a1").remaining == 2
        assert admin.peek("a2").remaining == 0
        assert own_redis.command("EXISTS", "rl:b1") == 0
    finally:
        admin.close()
