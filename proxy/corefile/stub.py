"""A read-only RSP stub that serves a `ProgramImage` (a core file).

Theory of operation
-------------------
h11-style and sans-IO: `receive_data(bytes)` feeds the client's bytes,
`data_to_send()` takes the replies. The proxy talks to it as to any upstream
stub (proxy/shell/corestub.py puts it behind a trio stream), so every
`monitor async` command, reflection and the JSON document work unchanged.

What it serves: the threads (``qfThreadInfo``, ``qXfer:threads``), each
thread's registers (``g``/``p`` in the block of the core's CPU,
proxy/arch/core.py: `rsp.regs.AMD64_LINUX_NOXML` or `rsp.regs.AARCH64_LINUX`,
with the matching ``target.xml``), memory (``m``/``x``: the core's segments,
then the mapped files; a partial read answers the bytes that exist, as
gdbserver does), ``qXfer:auxv`` and ``qXfer:exec-file`` from the core.
The stop reply (``?``) names the first thread of the core (the kernel puts
the thread that took the fatal signal first) with its signal.

Read-only: a resume, a write or a breakpoint is answered ``E.<text>``, which
gdb shows as "Remote failure reply" / "Cannot insert breakpoint" and stays
stopped; ``k``/``D`` answer OK (nothing runs, nothing to take out).
Unknown packets get the empty reply (unsupported), as the protocol asks.
"""

from __future__ import annotations

from rsp.connection import Connection
from rsp.errors import MalformedPacket
from rsp.framing import escape_binary, hex_encode, parse_hex_int
from rsp.packets.memory import parse_read_memory
from rsp.packets.qxfer import build_qxfer_reply
from rsp.reader import Interrupt, Packet

from .image import ProgramImage

PACKET_SIZE = 0x4000
MAX_READ = (PACKET_SIZE - 8) // 2
READ_ONLY = b"E.asyncrsp: a core file is read-only: it cannot run, step, or be written"
NO_BREAKPOINTS = b"E.asyncrsp: a core file is read-only: no breakpoints"
FEATURES = (
    f"PacketSize={PACKET_SIZE:x};QStartNoAckMode+;qXfer:features:read+;qXfer:auxv:read+;"
    "qXfer:exec-file:read+;qXfer:threads:read+;vContSupported+"
).encode()


class CoreStub:
    def __init__(self, image: ProgramImage) -> None:
        self.image = image
        self.conn = Connection()
        self.layout = image.arch.core.layout
        self.tdesc = {k: v.encode() for k, v in image.arch.core.target_xml().items()}
        self.selected = image.threads[0].tid
        self.closed = False  # after k / D / vKill

    # -- the sans-IO surface
    def receive_data(self, data: bytes) -> None:
        self.conn.feed(data)
        while (ev := self.conn.next_event()) is not None:
            if isinstance(ev, Packet):
                reply = self.answer(ev.body)
                self.conn.send_packet(reply)
                if ev.body == b"QStartNoAckMode":
                    self.conn.set_no_ack()
            elif isinstance(ev, Interrupt):
                pass  # nothing runs: the stop reply of the refused resume was already sent

    def data_to_send(self) -> bytes:
        return self.conn.data_to_send()

    # -- answers
    def answer(self, body: bytes) -> bytes:
        try:
            return self._answer(body)
        except (MalformedPacket, ValueError, IndexError):
            return b"E01"

    def _answer(self, body: bytes) -> bytes:
        head = body[:1]
        if body.startswith(b"qSupported"):
            return FEATURES
        if body == b"QStartNoAckMode":
            return b"OK"
        if body == b"?":
            return self._stop_reply()
        if body in (b"qfThreadInfo", b"qsThreadInfo"):
            if body == b"qsThreadInfo":
                return b"l"
            return b"m" + b",".join(b"%x" % t.tid for t in self.image.threads)
        if body == b"qC":
            return b"QC%x" % self.selected
        if body == b"qAttached":
            return b"1"
        if body.startswith(b"qXfer:"):
            return self._qxfer(body)
        if head == b"H":
            return self._set_thread(body[2:])
        if head == b"T":
            return b"OK" if self._thread(body[1:]) is not None else b"E01"
        if body == b"g":
            return self._g(self.selected)
        if head == b"p":
            return self._p(body[1:])
        if head in (b"m", b"x"):
            return self._read(body)
        if head in (b"M", b"X", b"G", b"P") or body.startswith(b"QTDP"):
            return READ_ONLY
        if head in (b"Z", b"z"):
            return NO_BREAKPOINTS if head == b"Z" else b"OK"
        if head in (b"c", b"C", b"s", b"S") or (body.startswith(b"vCont;")) or body.startswith(b"vRun"):
            return READ_ONLY
        if body == b"vCont?":
            return b"vCont;c;C;s;S"
        if head in (b"k", b"D") or body.startswith(b"vKill"):
            self.closed = True
            return b"OK"
        if body.startswith(b"qSymbol"):
            return b"OK"
        return b""

    def _stop_reply(self) -> bytes:
        t = self.image.threads[0]
        self.selected = t.tid
        return b"T%02xthread:%x;" % (t.signal & 0xFF, t.tid)

    def _thread(self, text: bytes):  # type: ignore[no-untyped-def]
        if text in (b"-1", b"0", b""):
            return self.image.threads[0]
        return self.image.thread(parse_hex_int(text.split(b".")[-1].lstrip(b"p") or b"0"))

    def _set_thread(self, text: bytes) -> bytes:
        t = self._thread(text)
        if t is None:
            return b"E01"
        self.selected = t.tid
        return b"OK"

    def _g(self, tid: int) -> bytes:
        t = self.image.thread(tid) or self.image.threads[0]
        return t.g

    def _p(self, text: bytes) -> bytes:
        regnum = parse_hex_int(text.split(b";")[0])
        try:
            reg = self.layout.by_regnum(regnum)
        except KeyError:
            return b"E01"
        g = self._g(self.selected)
        return g[2 * reg.offset:2 * (reg.offset + reg.size)]

    def _read(self, body: bytes) -> bytes:
        req = parse_read_memory(body)
        if req.length == 0:
            return b"OK" if req.binary else b""
        data = self.image.read_raw(req.addr, min(req.length, MAX_READ))
        if not data:
            return b"E14"  # EFAULT, gdbserver's answer for unreadable memory
        # `x` without the `b` prefix: lldb's form (its `x0,0` probe is answered OK above);
        # gdb >= 16 sends `x` only to a stub that offers binary-upload+, which this one does not
        return escape_binary(data) if req.binary else hex_encode(data)

    def _qxfer(self, body: bytes) -> bytes:
        parts = body.split(b":", 4)
        if len(parts) != 5 or parts[2] != b"read":
            return b""
        obj, annex, where = parts[1], parts[3], parts[4]
        off, _, length = where.partition(b",")
        offset, size = parse_hex_int(off), parse_hex_int(length)
        data = self._object(obj, annex)
        if data is None:
            return b"E00" if obj == b"features" else b""
        return build_qxfer_reply(data, offset, size, max_body=PACKET_SIZE - 8)

    def _object(self, obj: bytes, annex: bytes) -> bytes | None:
        if obj == b"features":
            return self.tdesc.get(annex.decode(errors="replace"))
        if obj == b"auxv":
            return self.image.auxv
        if obj == b"exec-file":
            return (self.image.exec_file or "").encode()
        if obj == b"threads":
            rows = "".join(f'<thread id="{t.tid:x}"/>' for t in self.image.threads)
            return f'<?xml version="1.0"?>\n<threads>{rows}</threads>\n'.encode()
        return None
