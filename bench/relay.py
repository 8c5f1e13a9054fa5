"""A plain relay: the floor any forwarding proxy pays on the wire (a wakeup, a read and
a write per packet, nothing read), for bench/bench_exchange.py's `relay` way.

    python -m bench.relay HOST:PORT     # prints "relay: listening on 127.0.0.1:N"

Accepts one client, connects to HOST:PORT, and copies bytes both ways until either
side closes. Blocking sockets and one poll, as a small C relay would do it.
"""

from __future__ import annotations

import os
import select
import socket
import sys


def main(argv: list[str]) -> int:
    host, port = argv[0].rsplit(":", 1)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    print(f"relay: listening on 127.0.0.1:{listener.getsockname()[1]}", flush=True)
    client, _ = listener.accept()
    stub = socket.create_connection((host, int(port)))
    for sock in (client, stub):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    peer = {client.fileno(): stub, stub.fileno(): client}
    poll = select.poll()
    for fd in peer:
        poll.register(fd, select.POLLIN)
    while True:
        for fd, _event in poll.poll():
            data = os.read(fd, 65536)
            if not data:
                return 0
            peer[fd].sendall(data)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
