"""The fast lane (proxy/session/core.py): the same traffic, once as the link passes it
(`lane_client`/`lane_stub` first, the usual path when they decline) and once through the
usual path alone, gives the client and the stub the same bytes in the same order.

The stub here is a table of answers (a pure session test: the lane's bytes against a real
gdbserver are checked by integration/test_known_answers.py, which reads the same memory and
registers both ways)."""

from __future__ import annotations

import pytest

from proxy.capture.base import CaptureBase
from proxy.session.actions import ToClient, ToClientRaw, ToStub, ToStubRaw
from proxy.session.core import Session, SessionConfig
from rsp.framing import checksum, frame, rle_expand

from .test_core import stop_at

THREAD = b"p3a4d.3a4d"
REGS = b"".join(i.to_bytes(8, "little").hex().encode() for i in range(70))  # the `g` block


def _framed(body: bytes) -> bytes:
    """A stub's frame as it comes: run-length encoded bodies too (frame() makes none)."""
    return b"$%b#%02x" % (body, checksum(body))


def _rle(body: bytes) -> bytes:
    """gdbserver's run-length encoding of a reply: runs of five as `X*!` (4 more)."""
    out, i = bytearray(), 0
    while i < len(body):
        if body[i : i + 5] == body[i : i + 1] * 5:
            out += body[i : i + 1] + b"*!"
            i += 5
        else:
            out += body[i : i + 1]
            i += 1
    return bytes(out)


def _stub_reply(body: bytes, code: dict[int, int]) -> bytes | None:
    """gdbserver's answer, from a table (None: a packet it does not answer), run-length encoded."""
    reply = _plain_reply(body, code)
    return reply if reply is None or body.startswith(b"qSupported") else _rle(reply)


def _plain_reply(body: bytes, code: dict[int, int]) -> bytes | None:
    if body.startswith(b"qSupported"):
        return b"PacketSize=47ff;QStartNoAckMode+;QStartupWithShell+;multiprocess+;swbreak+"
    if body in (b"QStartNoAckMode",) or body[:1] in (b"H", b"Z", b"z", b"M", b"G"):
        return b"OK"
    if body == b"?" or body.startswith(b"vCont;"):
        return stop_at(0x401000, thread=THREAD)
    if body == b"g":
        return REGS
    if body[:1] == b"p":
        return b""  # gdbserver 13.1 on x86-64 has no `p`
    if body[:1] == b"m":
        addr, size = (int(x, 16) for x in body[1:].split(b","))
        return bytes(code.get(addr + i, (addr + i) & 0xFF) for i in range(size)).hex().encode()
    if body.startswith(b"qXfer:threads:read:"):
        return b'l<threads><thread id="' + THREAD + b'" handle="0000000000"/></threads>'
    return b""


class _Memory:
    """The program's memory as /proc/PID/mem shows it (proxy/host/livemem.py): a read holding
    an int3 (0xcc: a breakpoint's or a uprobe's) is not answered."""

    def __init__(self, code: dict[int, int]) -> None:
        self.code = code

    def read(self, addr: int, size: int) -> bytes | None:
        got = bytes(self.code.get(addr + i, (addr + i) & 0xFF) for i in range(size))
        return None if 0xCC in got else got


class _Masking(CaptureBase):
    """A capture that rewrites `m` replies as the uprobes capture does at its sites
    (client_view.py): here every 0xcc byte of a reply shows as 0x90."""

    filters_replies = True
    lane_reads = frozenset(b"gpHq")

    def client_reply(self, request: bytes, reply: bytes) -> bytes:
        if request[:1] != b"m" or reply[:1] == b"E":
            return reply
        data = bytes.fromhex(rle_expand(reply).decode())
        return data.replace(b"\xcc", b"\x90").hex().encode()


def _run(traffic: list[bytes | tuple[bytes, bytes]], lane: bool,
         capture: CaptureBase | None = None) -> tuple[list[tuple[str, bytes]], Session, int]:
    """Play `traffic` (bodies, or (body, raw) for a frame of its own); the client's and
    the stub's bytes in order, the session, and how many packets took the lane. The
    program's memory is local (read as /proc/PID/mem would be) once it stopped."""
    s = Session(SessionConfig(elf_path="/bin/true"))
    code: dict[int, int] = {}
    s.capture = capture
    wire: list[tuple[str, bytes]] = []
    took = 0

    def deliver(actions: list[object]) -> None:
        nonlocal took
        for a in actions:
            if isinstance(a, (ToClient, ToClientRaw)):
                wire.append(("client", frame(a.body) if isinstance(a, ToClient) else a.raw))
            elif isinstance(a, (ToStub, ToStubRaw)):
                raw = frame(a.body) if isinstance(a, ToStub) else a.raw
                wire.append(("stub", raw))
                body = raw[1:-3] if raw[:1] == b"$" else raw
                if body[:1] == b"M":  # the program's memory as the stub keeps it
                    addr, rest = body[1:].split(b",", 1)
                    for i, b in enumerate(bytes.fromhex(rest.split(b":")[1].decode())):
                        code[int(addr, 16) + i] = b
                reply = _stub_reply(body, code)
                if reply is None:
                    continue
                if lane and s.lane_stub(reply):
                    took += 1
                    wire.append(("client", _framed(reply)))
                    continue
                s.stub_packet(reply, _framed(reply))
                deliver(s.take_actions())

    for item in traffic:
        body, raw = item if isinstance(item, tuple) else (item, frame(item))
        got = s.lane_client(body, raw) if lane else None
        if got is True:
            took += 1
            deliver([ToStubRaw(raw)])
        elif got is not None:
            took += 1
            wire.append(("client", frame(got)))
        else:
            s.client_packet(body, raw)
            deliver(s.take_actions())
        if s.stopped is not None and s.known.memory_pid is None:
            # the program's memory is local from its first stop on: what the lifecycle's identity
            # proof decides for a real process (it found none here, with a capture planted)
            s.known.memory_pid = s.known.memory_link_pid = 0x3A4D
            s.known.open_memory = lambda pid: _Memory(code)
    return wire, s, took


def _step(thread: bytes = THREAD) -> list[bytes | tuple[bytes, bytes]]:
    """What gdb sends around a `stepi` and an `x`."""
    return [b"vCont;s:" + thread, b"g", b"p10", b"m401000,8", b"p7", b"m7fffffffe0b0,28", b"Hg" + thread,
            b"qXfer:threads:read::0,fff", b"m401000,8", b"qXfer:threads:read::0,fff", b"g", b"m4010cc,4"]


TRAFFIC: list[bytes | tuple[bytes, bytes]] = [
    b"qSupported:multiprocess+;swbreak+", b"QStartNoAckMode", b"?", b"Hg" + THREAD, b"g", b"p10",
    *_step(), *_step(),
    b"Z0,401000,1", b"m401000,8", b"z0,401000,1", b"m401000,8",  # breakpoints: kept in the stub, removed late
    b"M401000,2:9090", b"m401000,8", b"g",  # a write: the stop's knowledge goes
    (b"m401000,8", b"$m401000,8#zz"),  # a frame whose checksum is not one: sent framed anew
    b"m401000,ffff",  # more than the stub's packet holds: refused here
    b"Hgp3a4d.3a50", b"g", b"p10", b"Hg" + THREAD, b"g",  # another thread selected, and back
    b"m401000,0", b"mzz,1", b"g;thread:1", b"p10;thread:3a4d;",  # odd shapes
    b"qXfer:auxv:read::0,100", b"qTStatus", b"qXfer:threads:read:x:0,fff",  # other questions
    *_step(),
]


def _compare(traffic: list[bytes | tuple[bytes, bytes]],
             capture: type[CaptureBase] | None = None) -> tuple[Session, Session, int, list[tuple[str, bytes]]]:
    plain, s_plain, _ = _run(traffic, lane=False, capture=capture() if capture else None)
    laned, s_lane, took = _run(traffic, lane=True, capture=capture() if capture else None)
    assert laned == plain
    return s_plain, s_lane, took, laned


@pytest.mark.parametrize("capture", [None, _Masking], ids=["no capture", "a capture masking m replies"])
def test_the_lane_gives_both_sides_the_bytes_the_usual_path_gives(capture: type[CaptureBase] | None) -> None:
    s_plain, s_lane, took, wire = _compare(TRAFFIC, capture)
    assert took >= 25  # the lane took most reads (a lane that never opens would pass the comparison)
    assert s_lane.known.stats.memory >= 5  # reads answered from the program's memory
    masked = [raw for side, raw in wire if side == "client" and raw.startswith(b"$90cdcecf#")]
    assert bool(masked) == (capture is not None)  # the read over an int3, as the capture shows it
    for name in ("client_packets", "stub_packets", "shielded"):
        assert getattr(s_lane.stats, name) == getattr(s_plain.stats, name), name
    assert s_lane.known.stats == s_plain.known.stats
    assert s_lane.stats.shielded == 2  # the long read and `mzz,1`, refused by the usual path on both


def test_the_lane_waits_while_anything_is_under_way() -> None:
    _, s, _ = _run([b"qSupported:multiprocess+", b"QStartNoAckMode", b"?", b"Hg" + THREAD, b"g"], lane=True)
    assert s.lane_client(b"g", frame(b"g")) is True  # quiet: forwarded as it came
    assert s.lane_stub(REGS)
    for request in (b"qXfer:threads:read::0,fff", b"vCont;c:" + THREAD):  # a question in flight, a run
        s.client_packet(request, frame(request))
        s.take_actions()
        assert s.lane_client(b"g", frame(b"g")) is None, request
        assert not s.lane_stub(REGS), request  # the reply is the usual path's
        reply = _stub_reply(request, {})
        assert reply is not None
        s.stub_packet(reply, _framed(reply))
        s.take_actions()
        assert s.lane_client(b"g", frame(b"g")) is True  # quiet again
        assert s.lane_stub(REGS)
