"""Read a ``--log-packets`` file back: the packets of each direction, and what
a tracepoint capture's drains held.

The log (proxy/shell/link.py ``PacketLog``) has one line per chunk of bytes:
``SECONDS DIR BYTES`` where DIR is ``c>`` (from the client), ``c<`` (to the
client), ``s<`` (to the stub) or ``s>`` (from the stub), and BYTES is the
chunk's Python ``repr``. Chunks split packets anywhere, so each direction is
fed through its own `rsp.reader.PacketReader`.

`trace_hits` answers the question a lost tracepoint hit raises: for each
tracepoint the proxy defined (``QTDP:N:ADDR``), how many frames the stub's
``qTBuffer`` replies held, and how many of its stops were at that address
(gdbserver 13.1 reports a tracepoint hit as a breakpoint stop now and then
under load, and the proxy hides and records it: docs/tracepoints.md). Frames
plus stops is every hit the proxy could have seen.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rsp.framing import rle_expand, unescape_binary
from rsp.packets.stop import is_stop_reply, parse_stop_reply
from rsp.packets.trace import parse_qtbuffer_reply
from rsp.reader import Notification, Packet, PacketReader
from rsp.tracebuf import FrameDecoder, TraceFrame

DIRECTIONS = ("c>", "c<", "s<", "s>")
_LINE = re.compile(r"\s*([\d.]+) (\S\S) (b'.*'|b\".*\")$")
_QTDP = re.compile(rb"QTDP:([0-9a-f]+):([0-9a-f]+):")
_QTBUFFER = re.compile(rb"qTBuffer:([0-9a-f]+),([0-9a-f]+)")


@dataclass(frozen=True, slots=True)
class Logged:
    seconds: float
    direction: str  # one of DIRECTIONS
    body: bytes  # as on the wire (escaped, maybe run-length encoded)
    notification: bool = False


def read_log(lines: Iterable[str]) -> Iterator[Logged]:
    """The packets and notifications of a packet log, in the log's order.
    Lines that are not byte chunks of the four directions (``s!`` notes) are
    skipped; checksums are not checked (the proxy checked them)."""
    readers = {d: PacketReader(check_checksums=False, max_packet=1 << 26) for d in DIRECTIONS}
    for line in lines:
        m = _LINE.match(line.rstrip("\n"))
        if m is None or m.group(2) not in readers:
            continue
        t, d = float(m.group(1)), m.group(2)
        for ev in readers[d].feed(ast.literal_eval(m.group(3))):
            if isinstance(ev, (Packet, Notification)):
                yield Logged(t, d, ev.body, isinstance(ev, Notification))


def exchanges(packets: Iterable[Logged], side: str = "s") -> Iterator[tuple[Logged, Logged]]:
    """(request, reply) pairs on one side (``s``: proxy and stub; ``c``:
    client and proxy): each packet sent gets the next packet back, in order.
    Notifications are not replies; they are left out."""
    out, back = f"{side}<", f"{side}>"
    if side == "c":
        out, back = back, out
    waiting: list[Logged] = []
    for p in packets:
        if p.notification:
            continue
        if p.direction == out:
            waiting.append(p)
        elif p.direction == back and waiting:
            yield waiting.pop(0), p


@dataclass
class TraceHits:
    tracepoints: dict[int, int] = field(default_factory=dict)  # number -> address
    frames: Counter[int] = field(default_factory=Counter)  # number -> frames in the drains
    stops: Counter[int] = field(default_factory=Counter)  # number -> stub stops at its address
    drains: int = 0

    def hits(self, number: int) -> int:
        return self.frames[number] + self.stops[number]

    def table(self) -> str:
        rows = [f"{'tracepoint':>10} {'address':>18} {'frames':>8} {'stops':>6} {'hits':>8}"]
        for n, addr in sorted(self.tracepoints.items()):
            rows.append(f"{n:>10} {addr:#18x} {self.frames[n]:>8} {self.stops[n]:>6} {self.hits(n):>8}")
        rows.append(f"{self.drains} drains; frames {sum(self.frames.values())}, stops at tracepoints "
                    f"{sum(self.stops.values())}")
        return "\n".join(rows)


def drained_frames(packets: Iterable[Logged], hits: TraceHits | None = None) -> Iterator[TraceFrame]:
    """The frames of the stub's ``qTBuffer`` replies in buffer order (the order gdbserver
    wrote them: hit order), and the tracepoints defined (``QTDP:N:ADDR``) into
    ``hits.tracepoints``. The proxy drains after a ``qTStatus``: its reads start where the
    last drain's complete frames ended (a frame cut by the last read is read again) and
    follow each other; a read out of that order is not decoded."""
    hits = hits if hits is not None else TraceHits()
    decoder: FrameDecoder | None = None
    next_offset = 0
    for req, rep in exchanges(packets):
        m = _QTDP.match(req.body)
        if m:
            hits.tracepoints[int(m.group(1), 16)] = int(m.group(2), 16)
            continue
        if req.body == b"qTStatus":
            decoder = None  # a drain starts: its reads follow
            continue
        m = _QTBUFFER.match(req.body)
        if m is None:
            continue
        offset = int(m.group(1), 16)
        if decoder is None:
            decoder, next_offset = FrameDecoder(), offset
            hits.drains += 1
        if offset != next_offset:
            continue
        data = parse_qtbuffer_reply(unescape_binary(rle_expand(rep.body)))
        if data:
            next_offset += len(data)
            yield from decoder.feed(data)


def trace_hits(packets: Iterable[Logged], pc_register: int = 0x10) -> TraceHits:
    """Frames per tracepoint in the stub's ``qTBuffer`` replies (`drained_frames`), and the
    stub's stops (replies and ``%Stop`` notifications) whose pc (`pc_register`, rip on
    x86-64) is a tracepoint's address."""
    hits = TraceHits()
    packets = list(packets)
    for fr in drained_frames(packets, hits):
        hits.frames[fr.tracepoint] += 1
    addresses = {addr: n for n, addr in hits.tracepoints.items()}
    for p in packets:
        if p.direction != "s>":
            continue
        body = p.body[5:] if p.notification and p.body.startswith(b"Stop:") else p.body
        if not body.startswith(b"T") or not is_stop_reply(body):
            continue
        sr = parse_stop_reply(rle_expand(body))
        text = sr.registers.get(pc_register)  # hex digits, target byte order
        pc = int.from_bytes(bytes.fromhex(text.decode()), "little") if text else None
        if pc in addresses:
            hits.stops[addresses[pc]] += 1
    return hits


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="packet-log", description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path, help="a file written by asyncrsp serve --log-packets")
    ap.add_argument("--packets", action="store_true", help="print every packet, one line each")
    args = ap.parse_args(argv)
    with args.log.open(encoding="latin-1") as fh:
        packets = list(read_log(fh))
    if args.packets:
        for p in packets:
            mark = "%" if p.notification else "$"
            print(f"{p.seconds:10.6f} {p.direction} {mark}{p.body[:200]!r}")
    print(trace_hits(packets).table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
