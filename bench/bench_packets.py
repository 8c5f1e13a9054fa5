"""What one forwarded packet costs in the proxy, against the bare cost of
reading and framing it (the part any RSP forwarder pays).

    .venv/bin/python -m bench.bench_packets [--rounds 5] [--count 20000]

Each round, interleaved: ``baseline`` - the client's request and the stub's
reply each read from the wire (rsp.reader.PacketReader: framing, checksum)
and framed again for the other side; ``session`` - the same bytes read the
same way and passed through the session core (proxy.session.core.Session:
the classification, the shield's checks, the breakpoint table, the actions
out) as the link does. The traffic: what gdb sends most while stepping and
reading - `m` reads (16 bytes), `g` with its 560-byte reply, `p` reads,
`Hg` - replayed on a session whose program was planted and stopped. Prints
microseconds per request/reply pair for each, and the ratio; the load
average, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable


from proxy.session.core import Session, SessionConfig
from rsp.framing import frame
from rsp.reader import Packet, PacketReader

REGS = b"00" * 280  # a `g` reply of gdbserver's amd64 layout without xmlRegisters
TRAFFIC = [
    (b"m7fffffffe0d0,10", b"00112233445566778899aabbccddeeff"),
    (b"g", REGS),
    (b"p10", b"7051555555550000"),
    (b"Hg0", b"OK"),
    (b"m555555555169,1", b"55"),
    (b"qfThreadInfo", b"m2a4f"),
]


def _wire() -> list[tuple[bytes, bytes]]:
    return [(frame(req), frame(rep)) for req, rep in TRAFFIC]


def _replay(count: int, on_client: Callable[[bytes, bytes], object],
            on_stub: Callable[[bytes, bytes], object]) -> float:
    """Read `count` request/reply pairs from the wire, each packet handed on: µs per pair."""
    client, stub = PacketReader(), PacketReader()
    pairs = _wire()
    t0 = time.perf_counter()
    for i in range(count):
        req, rep = pairs[i % len(pairs)]
        for reader, data, handle in ((client, req, on_client), (stub, rep, on_stub)):
            for ev in reader.feed(data):
                if isinstance(ev, Packet):
                    handle(ev.body, data)
    return (time.perf_counter() - t0) / count * 1e6


def baseline(count: int) -> float:
    """Each packet framed again for the other side (what any forwarder does)."""
    return _replay(count, lambda body, raw: frame(body), lambda body, raw: frame(body))


def _stopped_session() -> Session:
    s = Session(SessionConfig(elf_path="/bin/true"))
    s.client_packet(b"?", frame(b"?"))
    s.take_actions()
    s.stub_packet(b"T05thread:2a4f;", frame(b"T05thread:2a4f;"))
    s.take_actions()
    return s


def session(count: int) -> float:
    """Each packet through the session core, as the link passes it."""
    s = _stopped_session()

    def client(body: bytes, raw: bytes) -> None:
        s.client_packet(body, raw)
        s.take_actions()

    def stub(body: bytes, raw: bytes) -> None:
        s.stub_packet(body, raw)
        s.take_actions()

    return _replay(count, client, stub)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--count", type=int, default=20000)
    a = p.parse_args(argv)
    base, sess = [], []
    for _ in range(a.rounds):
        base.append(baseline(a.count))
        sess.append(session(a.count))
    b, s = statistics.median(base), statistics.median(sess)
    print(f"load average {os.getloadavg()[0]:.1f}; {a.rounds} rounds of {a.count} request/reply pairs (medians)")
    print(f"{'baseline (read + frame)':<28} {b:8.1f} us/pair")
    print(f"{'session core':<28} {s:8.1f} us/pair   {s / b:.2f}x  (+{s - b:.1f} us/pair)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
