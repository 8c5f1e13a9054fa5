"""proxy/shell/link.py's receive side: a socket's pump waits first and
reads once (`_receive`); the capture loop sleeps while there is no capture
that needs it (no tick every CAPTURE_TICK); the pumps' poll window leaves
the capture loop its turns."""

from __future__ import annotations

import socket
import threading

import trio
import trio.testing

from proxy.capture.base import CaptureBase
from proxy.session.core import Session, SessionConfig
from proxy.shell.link import CAPTURE_TICK, STUB_WATCH, Link, _receive, _socket_fd
from rsp.framing import frame


def _stream(sock: socket.socket) -> trio.SocketStream:
    return trio.SocketStream(trio.socket.from_stdlib_socket(sock))


async def test_a_socket_pump_gets_what_came_and_sees_the_close() -> None:
    a, b = socket.socketpair()
    stream = _stream(a)
    fd = _socket_fd(stream)
    assert fd == a.fileno()
    b.sendall(b"$g#67")
    assert await _receive(stream, fd) == b"$g#67"
    async with trio.open_nursery() as nursery:
        got: list[bytes] = []

        async def read() -> None:
            got.append(await _receive(stream, fd))

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert not got  # nothing there: it waits
        b.sendall(b"$p10#c1")
    assert got == [b"$p10#c1"]
    b.close()
    assert await _receive(stream, fd) == b""
    await stream.aclose()


async def test_another_kind_of_stream_is_read_with_receive_some() -> None:
    left, right = trio.testing.memory_stream_pair()
    assert _socket_fd(left) is None
    await right.send_all(b"$g#67")
    assert await _receive(left, None) == b"$g#67"
    await right.aclose()
    assert await _receive(left, None) == b""


async def _until(stream: trio.SocketStream, end: bytes) -> bytes:
    got = b""
    with trio.fail_after(5):
        while not got.endswith(end):
            got += await stream.receive_some(100)
    return got


async def test_packets_pass_and_the_capture_loop_sleeps_without_a_capture() -> None:
    client_end, client_proxy = socket.socketpair()
    stub_end, stub_proxy = socket.socketpair()
    session = Session(SessionConfig(elf_path="/bin/true"))
    ticks = []
    session.tick = lambda now: ticks.append(now)  # type: ignore[method-assign]
    link = Link(session, _stream(client_proxy), _stream(stub_proxy))
    client, stub = _stream(client_end), _stream(stub_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        await client.send_all(frame(b"m1000,4"))
        assert await _until(stub, frame(b"m1000,4")) == frame(b"m1000,4")
        await stub.send_all(b"+" + frame(b"01020304"))
        assert await _until(client, frame(b"01020304")) == b"+" + frame(b"01020304")
        await trio.sleep(4 * CAPTURE_TICK)
        assert ticks == []  # no capture: nothing to tick
        await client.aclose()
        with trio.fail_after(5):
            await link.closed.wait()
        nursery.cancel_scope.cancel()
    await stub.aclose()


class _Polled(CaptureBase):
    """A backend that wants its loop (a `poll` of its own), counting the polls."""

    def __init__(self) -> None:
        super().__init__()
        self.polls = 0

    def poll(self) -> bool | None:
        self.polls += 1
        return None


def test_a_backend_with_no_hook_of_its_own_needs_no_ticks() -> None:
    assert not CaptureBase().ticks()
    assert _Polled().ticks()
    from proxy.capture.breakpoints import BreakpointCapture
    from proxy.capture.tracepoints import TracepointCapture

    assert not BreakpointCapture.ticks(object.__new__(BreakpointCapture))  # its events come at hidden stops
    assert TracepointCapture.ticks(object.__new__(TracepointCapture))  # drains before its buffer fills


def _peer(sock: socket.socket, stop: threading.Event, client: bool, counts: list[int]) -> None:
    """The client asks `m` again at each reply; the stub answers each `m`
    (no-ack: none of the two acks)."""
    sock.settimeout(5)
    buf = b""
    if client:
        sock.sendall(frame(b"m1000,4"))
    while not stop.is_set():
        try:
            data = sock.recv(4096)
        except (TimeoutError, OSError):
            return
        if not data:
            return
        buf += data
        while b"#" in buf and len(buf) >= buf.index(b"#") + 3:
            end = buf.index(b"#") + 3
            buf = buf[end:]
            counts[0] += 1
            if not stop.is_set():
                sock.sendall(frame(b"m1000,4") if client else frame(b"01020304"))


async def test_packets_in_a_row_leave_the_capture_loop_its_turns() -> None:
    """The pumps' poll window handles packets outside trio while they come
    back to back; the capture loop must still run when it is due."""
    client_end, client_proxy = socket.socketpair()
    stub_end, stub_proxy = socket.socketpair()
    session = Session(SessionConfig(elf_path="/bin/true"))
    cap = _Polled()
    session.capture = cap  # type: ignore[assignment]
    link = Link(session, _stream(client_proxy), _stream(stub_proxy))
    link.cconn.set_no_ack()
    link.sconn.set_no_ack()
    stop = threading.Event()
    counts = [0]
    peers = [threading.Thread(target=_peer, args=(s, stop, c, counts)) for s, c in ((client_end, True),
                                                                                     (stub_end, False))]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        for t in peers:
            t.start()
        # the window starts once packets flow (on a loaded machine the first round trip
        # through a fresh session can take longer than the whole window)
        with trio.move_on_after(30):
            while counts[0] < 10:
                await trio.sleep(CAPTURE_TICK / 4)
        flowed, polls = counts[0], cap.polls
        await trio.sleep(20 * CAPTURE_TICK)
        stop.set()
        nursery.cancel_scope.cancel()
    client_proxy.close()
    stub_proxy.close()
    for t in peers:
        t.join()
    client_end.close()
    stub_end.close()
    assert counts[0] - flowed > 100  # packets flowed back to back in the window
    assert cap.polls - polls >= 5  # the loop's turns (one each CAPTURE_TICK: ~20 here; a starved loop got none)


async def test_bytes_outside_any_packet_from_a_stub_that_acks_are_told_to_the_session() -> None:
    """QEMU 7.2 writes every thread's packets through one buffer: a reply written over another
    thread's report leaves its tail outside any packet (``read:p01.7ff2;#da``, seen). The stub's
    watch tells the session (proxy/session/pacing.py: its thread may wait), once per lot."""
    client_end, client_proxy = socket.socketpair()
    stub_end, stub_proxy = socket.socketpair()
    session = Session(SessionConfig(elf_path="/bin/true"))
    told: list[int] = []
    session.stub_garbled = lambda: told.append(1)  # type: ignore[method-assign]
    link = Link(session, _stream(client_proxy), _stream(stub_proxy))
    stub = _stream(stub_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        await trio.sleep(3 * STUB_WATCH)
        assert told == []
        await stub.send_all(b"read:p01.7ff2;#da")
        await trio.sleep(3 * STUB_WATCH)
        assert told == [1]
        nursery.cancel_scope.cancel()
    await stub.aclose()
