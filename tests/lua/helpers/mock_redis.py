"""tests/integration/mock_resp.py for the Lua specs, with a PING answered
+PONG by the "good" play: every new connection opens with the core's
handshake, whose PING is the server's first command there, so a script
reads "good,<fault>,good" (the PING, the call that meets the fault, and
Redis again on the next connection).

    python3 mock_redis.py PLAY[,PLAY...]     as mock_resp.py
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "integration"))

import mock_resp  # noqa: E402

_good_reply = mock_resp.good_reply


def good_reply(words):
    if words[0].upper() == b"PING":
        return b"+PONG\r\n"
    return _good_reply(words)


mock_resp.good_reply = good_reply

if __name__ == "__main__":
    sys.exit(mock_resp.main(sys.argv))
