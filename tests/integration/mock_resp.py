"""A tiny scripted RESP server: what a real Redis will not send, for the
spot checks of the Python and Lua bindings (tests/python/test_faults.py,
tests/lua/faults_spec.lua). The C fault matrix has its own, fuller one
(tests/support/mock_server.c).

It answers the n-th command it reads (over all connections) as the n-th
play of its script says, and every later one as the last play. A PING (the
handshake's proof that the server is Redis) is answered +PONG and is not a
command of the script:

    good        the hirate script's reply for the key of the call, allowed
                with 4 of 5 tokens left (an EVALSHA's key is its 4th word; a
                DEL is answered :1)
    huge-array  *4294967295            an array no client should allocate
    neg-bulk    $-2                    a bulk length below -1
    status      +OK                    a status where an array belongs
    deep        *1 nested 100000 times
    garbage     ?what                  an unknown type byte
    cut         half a reply, then the connection closes

    python3 mock_resp.py PLAY[,PLAY...]     prints its port, serves until
                                            killed
"""

import socket
import sys
import threading

TS = b"1700000000000000"

REPLIES = {
    "huge-array": b"*4294967295\r\n",
    "neg-bulk": b"$-2\r\n",
    "status": b"+OK\r\n",
    "deep": b"*1\r\n" * 100000,
    "garbage": b"?what\r\n",
}


def read_command(f):
    """One RESP command (an array of bulk strings) as a list of bytes, or
    None at the end of the stream."""
    line = f.readline()
    if not line:
        return None
    if not line.startswith(b"*"):
        raise ValueError(f"not a RESP command: {line!r}")
    words = []
    for _ in range(int(line[1:])):
        n = int(f.readline()[1:])
        words.append(f.read(n + 2)[:-2])
    return words


def good_reply(words):
    if words[0].upper() == b"DEL":
        return b":1\r\n"
    key = words[3]
    return (b"*8\r\n:1\r\n:4\r\n:0\r\n:1000000000\r\n$1\r\n4\r\n:" + TS + b"\r\n:" + TS +
            b"\r\n$%d\r\n%s\r\n" % (len(key), key))


class MockRedis:
    """The server, in threads of this process; `port` is where it listens."""

    def __init__(self, script):
        self.script = list(script)
        self.commands = []          # every command read, in order
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}"
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn, conn.makefile("rb") as f:
            while True:
                try:
                    words = read_command(f)
                except (OSError, ValueError):
                    return
                if words is None:
                    return
                if words == [b"PING"]:
                    try:
                        conn.sendall(b"+PONG\r\n")
                    except OSError:
                        return
                    continue
                with self.lock:
                    play = self.script[min(len(self.commands), len(self.script) - 1)]
                    self.commands.append(words)
                try:
                    if play == "good":
                        conn.sendall(good_reply(words))
                    elif play == "cut":
                        conn.sendall(b"*8\r\n:1\r\n:4\r\n$4000\r\nxx")
                        conn.shutdown(socket.SHUT_RDWR)
                        return
                    else:
                        conn.sendall(REPLIES[play])
                except OSError:
                    return

    def close(self):
        if not self.closed:
            self.closed = True
            self.sock.close()


def main(argv):
    if len(argv) != 2 or not all(p == "good" or p == "cut" or p in REPLIES
                                 for p in argv[1].split(",")):
        print(__doc__, file=sys.stderr)
        return 2
    server = MockRedis(argv[1].split(","))
    print(server.port, flush=True)
    threading.Event().wait()   # until killed: the test that started it does that
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
