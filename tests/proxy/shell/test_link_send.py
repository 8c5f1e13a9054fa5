"""proxy/shell/link.py `_send_now`: a packet written to the socket at once,
without trio's checkpoints; what the socket does not take goes through
`send_all`, in order."""

from __future__ import annotations

import socket

import trio

from proxy.shell.link import _send_now


async def test_a_packet_goes_out_at_once_and_what_the_socket_leaves_follows_in_order() -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(a))
    lock = trio.Lock()
    assert _send_now(stream, lock, b"$g#67") == b""
    assert b.recv(100) == b"$g#67"
    big = bytes(range(256)) * 4096  # 1 MiB: more than the socket takes
    rest = _send_now(stream, lock, big)
    assert 0 < len(rest) < len(big)
    got = bytearray()

    async def drain() -> None:
        b.setblocking(False)
        while len(got) < len(big):
            await trio.lowlevel.wait_readable(b)
            got.extend(b.recv(1 << 20))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        async with lock:
            await stream.send_all(rest)
    assert bytes(got) == big
    await stream.aclose()
    b.close()


async def test_a_send_under_way_keeps_the_packet_for_send_all() -> None:
    a, b = socket.socketpair()
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(a))
    lock = trio.Lock()
    async with lock:  # another task is in send_all: writing now would cut into its bytes
        assert _send_now(stream, lock, b"$g#67") == b"$g#67"
    b.close()
    assert _send_now(stream, lock, b"$g#67") == b""  # the peer is gone: dropped, the pump sees the close
    await stream.aclose()
    assert _send_now(stream, lock, b"$g#67") == b""
