"""A tiny, self-contained RSP client for driving a real stub directly.

It exists so the register-safety tests can talk to gdbserver *without* going
through gdb (which always sends ``xmlRegisters=i386``) and without going
through asyncrsp (whose behaviour is what the tests check).  It is
deliberately simple: blocking pipes, one packet in flight, no-ack mode as soon
as the stub agrees.  It does expand gdbserver's run-length encoding and
``}``-escapes, because stop replies carry register values.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from typing import IO


class RspError(Exception):
    """The stub sent something this driver does not understand."""


def checksum(body: bytes) -> bytes:
    return b"%02x" % (sum(body) % 256)


def frame(body: bytes) -> bytes:
    return b"$" + body + b"#" + checksum(body)


def decode(body: bytes) -> bytes:
    """Undo `}` escapes and `*` run-length encoding of a received packet body."""
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c == 0x7D:  # '}': next byte xor 0x20
            out.append(body[i + 1] ^ 0x20)
            i += 2
        elif c == 0x2A and out:  # '*': repeat previous byte (n - 29) times
            out.extend(out[-1:] * (body[i + 1] - 29))
            i += 2
        else:
            out.append(c)
            i += 1
    return bytes(out)


@dataclass(frozen=True)
class StopReply:
    body: bytes

    @property
    def kind(self) -> str:
        return chr(self.body[0])

    def field(self, name: str) -> str | None:
        m = re.search(rb"(?:^T..|;)" + name.encode() + rb":([^;]*);", self.body)
        return m.group(1).decode() if m else None

    @property
    def thread(self) -> str | None:
        return self.field("thread")


class RspClient:
    """One blocking RSP conversation over a pair of byte streams."""

    def __init__(self, rfile: IO[bytes], wfile: IO[bytes]) -> None:
        self._r = rfile
        self._w = wfile
        self._ack = True
        self.console: list[bytes] = []  # decoded 'O' packets

    # -- framing ---------------------------------------------------------
    def _read_packet(self) -> bytes:
        while True:
            c = self._r.read(1)
            if not c:
                raise RspError("stub closed the connection")
            if c == b"$":
                break
            # '+' / '-' acks and stray bytes before a packet are skipped.
        body = bytearray()
        while (c := self._r.read(1)) != b"#":
            if not c:
                raise RspError("stub closed the connection mid-packet")
            body += c
        cs = self._r.read(2)
        if cs != checksum(bytes(body)):
            raise RspError(f"bad checksum {cs!r} for {bytes(body)[:60]!r}")
        if self._ack:
            self._w.write(b"+")
            self._w.flush()
        return decode(bytes(body))

    def send(self, body: bytes) -> None:
        self._w.write(frame(body))
        self._w.flush()

    def request(self, body: bytes) -> bytes:
        """Send one packet and return the first reply that is not console output."""
        self.send(body)
        while True:
            reply = self._read_packet()
            if reply.startswith(b"O") and reply != b"OK" and _is_hex(reply[1:]):
                self.console.append(bytes.fromhex(reply[1:].decode()))
                continue
            return reply

    # -- conversation helpers -------------------------------------------
    def handshake(self, features: bytes) -> bytes:
        """qSupported with exactly `features`, then no-ack mode."""
        reply = self.request(b"qSupported:" + features)
        if self.request(b"QStartNoAckMode") == b"OK":
            self._ack = False
        return reply

    def resume(self, action: bytes) -> StopReply:
        return StopReply(self.request(b"vCont;" + action))


def _is_hex(b: bytes) -> bool:
    return len(b) % 2 == 0 and all(c in b"0123456789abcdefABCDEF" for c in b)


GDB_FEATURES = (b"multiprocess+;swbreak+;hwbreak+;qRelocInsn+;fork-events+;"
                b"vfork-events+;exec-events+;vContSupported+;QThreadEvents+;no-resumed+")
"""What gdb 13.1 sends in qSupported, minus xmlRegisters=i386."""


@dataclass
class SpawnedStub:
    proc: subprocess.Popen[bytes]
    client: RspClient

    def close(self) -> str:
        """End the stub and return its stderr (where the inferior's stdout goes)."""
        assert self.proc.stdin is not None and self.proc.stderr is not None
        try:
            self.proc.stdin.close()  # gdbserver exits when its connection closes
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.stderr.read().decode(errors="replace")


def spawn_gdbserver(argv: list[str], gdbserver: str = "gdbserver") -> SpawnedStub:
    """`gdbserver - PROG ARGS`: RSP on the pipes; the inferior's stdout goes to stderr."""
    proc = subprocess.Popen([gdbserver, "-", *argv], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    return SpawnedStub(proc, RspClient(proc.stdout, proc.stdin))


def monotonic() -> float:
    return time.monotonic()


@dataclass(frozen=True)
class CycleResult:
    stops: int          # stops at the breakpoint that were resumed
    final: bytes        # the last stop reply (W.. when the program exited)
    output: str         # the stub's stderr, with the inferior's stdout in it
    seconds: float


def breakpoint_cycle(argv: list[str], address: int | list[int], *, xml_registers: bool,
                     gdbserver: str = "gdbserver", max_stops: int = 100_000) -> CycleResult:
    """Run `argv` under gdbserver with a plain Z0 at `address`, stepping over it
    the way gdb does (z0, vCont;s:thread, Z0, vCont;c) at every hit.

    `xml_registers` decides whether qSupported carries ``xmlRegisters=i386``
    (what stock gdb always sends) — the switch for gdbserver 13.1's XSAVE
    write-back (research/gdbserver-xsave-corruption.md §2.1)."""
    stub = spawn_gdbserver(argv, gdbserver)
    c = stub.client
    features = GDB_FEATURES + (b";xmlRegisters=i386" if xml_registers else b"")
    start = monotonic()
    stops = 0
    try:
        c.handshake(features)
        c.request(b"?")
        addresses = [address] if isinstance(address, int) else address
        for a in addresses:
            if c.request(b"Z0,%x,1" % a) != b"OK":
                raise RspError(f"Z0 at {a:#x} refused")
        stop = c.resume(b"c")
        while stop.kind == "T" and stops < max_stops:
            thread = stop.thread
            pc = _stop_pc(c, stop)
            if thread is None or pc not in addresses:
                break  # a signal (SIGSEGV...) or a stop we did not plant: report it
            stops += 1
            z = b"0,%x,1" % pc
            c.request(b"z" + z)
            stop = c.resume(b"s:" + thread.encode())
            if stop.kind != "T":
                break
            c.request(b"Z" + z)
            stop = c.resume(b"c")
    finally:
        seconds = monotonic() - start
        output = stub.close()
    return CycleResult(stops, stop.body, output, seconds)


def _stop_pc(c: RspClient, stop: StopReply) -> int | None:
    """rip of the stopped thread, from the stop reply's expedited `10:` register."""
    raw = stop.field("10")
    if raw is None:
        return None
    return int.from_bytes(bytes.fromhex(raw), "little")
