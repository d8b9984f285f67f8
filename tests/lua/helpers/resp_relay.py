"""One round trip to Redis for the Lua tests, which have no sockets of their
own: sends the bytes on stdin over one new connection to 127.0.0.1:<port>,
reads one whole reply for each command in them, and writes the replies'
bytes, exactly as Redis sent them, to stdout.

    python3 resp_relay.py <port> < request > replies

The Lua tests drive the no-I/O op hooks (lim:_op_start, op:feed) through it,
as the OpenResty path drives them through a cosocket.
"""

import socket
import sys


def skip_value(buf, pos):
    """The end of the RESP value starting at buf[pos], or None when buf does
    not hold all of it yet."""
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        return None
    kind, head, end = buf[pos:pos + 1], buf[pos + 1:eol], eol + 2
    if kind in (b"+", b"-", b":"):
        return end
    if kind == b"$":
        n = int(head)
        if n < 0:
            return end
        return end + n + 2 if len(buf) >= end + n + 2 else None
    if kind == b"*":
        for _ in range(max(int(head), 0)):
            end = skip_value(buf, end)
            if end is None:
                return None
        return end
    raise ValueError("not RESP: %r" % buf[pos:pos + 20])


def count_values(buf):
    n, pos = 0, 0
    while pos < len(buf):
        pos = skip_value(buf, pos)
        if pos is None:
            raise ValueError("the request ends inside a command")
        n += 1
    return n


def main():
    port = int(sys.argv[1])
    request = sys.stdin.buffer.read()
    want = count_values(request)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        buf, pos, got = b"", 0, 0
        while got < want:
            end = skip_value(buf, pos) if pos < len(buf) else None
            if end is None:
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
                continue
            pos, got = end, got + 1
    sys.stdout.buffer.write(buf)


if __name__ == "__main__":
    main()
