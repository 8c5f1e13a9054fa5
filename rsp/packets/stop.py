"""Stop replies: what the stub says when the program stops (or exits).

Forms (``AA`` is two hex digits):

* ``SAA``                     signal AA
* ``TAA n1:r1;n2:r2;...``     signal AA with pairs. A hex ``n`` is a register
  number and ``r`` its value in target byte order; otherwise ``n`` is a
  keyword: ``thread``, ``core``, or a stop *reason* (``watch``, ``rwatch``,
  ``awatch`` with an address, ``swbreak``, ``hwbreak``, ``library``,
  ``replaylog``, ``syscall_entry``/``syscall_return`` with a number,
  ``fork``/``vfork``/``clone`` with the child's thread id, ``vforkdone``,
  ``exec`` with a hex path, ``create``, ``no_resumed``). lldb-server adds
  ``reason:breakpoint``/``trace``/``signal``/... plus ``threads``,
  ``thread-pcs``, ``name``, ``jstopinfo``, ``metype``/``medata``.
* ``WAA[;process:pid]``       exit with status AA
* ``XAA[;process:pid]``       killed by signal AA
* ``wAA;tid``                 a thread exited (with QThreadEvents)
* ``N``                       no resumed threads left
* ``OXX...``                  console output (hex), not itself a stop

A gdbserver ``T`` reply ends every pair with ``;``; `build` reproduces the
trailing separator or its absence, so a parsed reply round-trips exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rsp.errors import LocalProtocolError, MalformedPacket
from rsp.framing import hex_decode, hex_encode, is_hex, rle_expand
from rsp.threads import ThreadId

STOP_KINDS = frozenset("STWXNOw")

# Keys of a T reply that name the stop reason (gdb's and lldb's).
REASONS = frozenset(
    {
        "watch",
        "rwatch",
        "awatch",
        "swbreak",
        "hwbreak",
        "library",
        "replaylog",
        "syscall_entry",
        "syscall_return",
        "fork",
        "vfork",
        "vforkdone",
        "clone",
        "exec",
        "create",
        "no_resumed",
    }
)

SIGTRAP = 5
_REASON_KEYS = {r.encode(): r for r in REASONS}


@dataclass(frozen=True, slots=True)
class StopReply:
    kind: str
    signal: int | None = None
    thread: ThreadId | None = None
    registers: dict[int, bytes] = field(default_factory=dict, hash=False, compare=True)
    reason: str | None = None
    reason_value: bytes = b""
    other: tuple[tuple[bytes, bytes], ...] = ()
    exit_code: int | None = None
    pid: int | None = None
    output: bytes | None = None
    trailing_semicolon: bool = True
    code_digits: int = 2  # gdbserver writes W/X/w codes with %x, not %02x

    @property
    def is_breakpoint_trap(self) -> bool:
        """A software breakpoint hit: ``T05`` with ``swbreak`` (gdbserver when
        the client asked for ``swbreak+``) or lldb-server's
        ``reason:breakpoint``. A ``T05`` with no reason at all is ambiguous
        (a step, a breakpoint without swbreak, a SIGTRAP): look at `reason`."""
        if self.kind != "T" or self.signal != SIGTRAP:
            return False
        return self.reason in ("swbreak", "breakpoint")

    @property
    def is_exit(self) -> bool:
        return self.kind in ("W", "X")

    @property
    def core(self) -> int | None:
        for key, value in self.other:
            if key == b"core" and is_hex(value):
                return int(value, 16)
        return None

    def pc(self, regnum: int) -> int | None:
        """The expedited register `regnum` as a little-endian integer
        (x86-64's rip is register 16), or None if absent or unavailable."""
        return self.register_value(regnum)

    def register_value(self, regnum: int) -> int | None:
        raw = self.registers.get(regnum)
        if raw is None or not is_hex(raw):
            return None
        return int.from_bytes(hex_decode(raw), "little")

    def build(self) -> bytes:
        kind = self.kind
        if kind in ("S", "T"):
            head = b"%b%02x" % (kind.encode(), _need(self.signal, "signal"))
            if kind == "S":
                return head
            pairs = b";".join(k + b":" + v for k, v in self.other)
            if pairs and self.trailing_semicolon:
                pairs += b";"
            return head + pairs
        if kind in ("W", "X"):
            code = self.exit_code if kind == "W" else self.signal
            body = kind.encode() + b"%0*x" % (self.code_digits, _need(code, "exit status"))
            if self.pid is not None:
                body += b";process:%x" % self.pid
            return body
        if kind == "w":
            body = b"w%0*x" % (self.code_digits, _need(self.exit_code, "exit status"))
            if self.thread is not None:
                body += b";" + self.thread.format(multiprocess=True)
            return body
        if kind == "N":
            return b"N"
        if kind == "O":
            return b"O" + hex_encode(self.output or b"")
        raise LocalProtocolError(f"unknown stop reply kind {kind!r}")


def _need(value: int | None, what: str) -> int:
    if value is None:
        raise LocalProtocolError(f"stop reply needs a {what}")
    return value


def _parse_code(body: bytes) -> int:
    code = body[1:3]
    if len(code) != 2 or not is_hex(code):
        raise MalformedPacket(body, "expected two hex digits after the stop reply letter")
    return int(code, 16)


def is_stop_reply(body: bytes) -> bool:
    """Is `body` a stop reply (S, T, W, X, w or N; not console output ``O``)?
    A cheap check of the shape, for routing replies."""
    if not body:
        return False
    kind = body[0]
    if kind == 0x4E:  # 'N'
        return len(body) == 1
    if kind in b"ST":
        return len(body) >= 3 and is_hex(body[1:3])
    if kind in b"WXw":
        return len(body) >= 2 and is_hex(body[1:].partition(b";")[0])
    return False


def is_console_output(body: bytes) -> bool:
    """``O`` + hex text (but not ``OK``)."""
    return body.startswith(b"O") and body != b"OK" and is_hex(body[1:])


def parse_stop_reply(body: bytes) -> StopReply:
    """Parse a stop reply. gdbserver run-length encodes register values in
    ``T`` replies (``06:20e7f*"7f0* ;``): the body is expanded first, so
    `build` gives the expanded body (forward `Packet.raw` to keep the wire
    bytes)."""
    if not body:
        raise MalformedPacket(body, "empty stop reply")
    if b"*" in body:
        body = rle_expand(body)
    kind = chr(body[0])
    if kind == "T":
        return _parse_t(body)
    if kind == "S":
        if len(body) != 3:
            raise MalformedPacket(body, "S stop reply has extra data")
        return StopReply("S", signal=_parse_code(body))
    if kind in ("W", "X"):
        return _parse_exit(body, kind)
    if kind == "w":
        return _parse_thread_exit(body)
    if kind == "N" and len(body) == 1:
        return StopReply("N")
    if kind == "O" and is_console_output(body):
        return StopReply("O", output=hex_decode(body[1:]))
    raise MalformedPacket(body, "not a stop reply")


def _parse_var_code(body: bytes) -> tuple[int, int, bytes]:
    """(code, digits, rest) for W/X/w, whose code gdbserver writes with %x
    (``W0;process:4211``, captured from gdbserver 13.1), not two digits."""
    code, _, rest = body[1:].partition(b";")
    if not is_hex(code):
        raise MalformedPacket(body, "expected a hex status after the stop reply letter")
    return int(code, 16), len(code), (b";" + rest if _ else b"")


def _parse_exit(body: bytes, kind: str) -> StopReply:
    code, digits, rest = _parse_var_code(body)
    pid = None
    if rest:
        if not rest.startswith(b";process:") or not is_hex(rest[9:]):
            raise MalformedPacket(body, "expected ';process:<pid>' after the exit status")
        pid = int(rest[9:], 16)
    if kind == "W":
        return StopReply("W", exit_code=code, pid=pid, code_digits=digits)
    return StopReply("X", signal=code, pid=pid, code_digits=digits)


def _parse_thread_exit(body: bytes) -> StopReply:
    code, digits, rest = _parse_var_code(body)
    thread = None
    if rest:
        if not rest.startswith(b";"):
            raise MalformedPacket(body, "expected ';<thread>' after the exit status")
        thread = ThreadId.parse(rest[1:])
    return StopReply("w", exit_code=code, thread=thread, code_digits=digits)


def _parse_t(body: bytes) -> StopReply:
    signal = _parse_code(body)
    rest = body[3:]
    trailing = rest.endswith(b";")
    items = rest[:-1].split(b";") if trailing else (rest.split(b";") if rest else [])
    registers: dict[int, bytes] = {}
    pairs: list[tuple[bytes, bytes]] = []
    thread = None
    reason = None
    reason_value = b""
    for item in items:
        key, colon, value = item.partition(b":")
        if not colon:
            raise MalformedPacket(body, f"stop reply item {item!r} has no ':'")
        pairs.append((key, value))
        if is_hex(key):
            registers[int(key, 16)] = value
        elif key == b"thread":
            thread = ThreadId.parse(value)
        elif key == b"reason" and reason is None:  # lldb-server
            reason = value.decode("ascii", "replace")
        elif reason is None and key in _REASON_KEYS:
            reason = _REASON_KEYS[key]
            reason_value = value
    return StopReply(
        "T",
        signal=signal,
        thread=thread,
        registers=registers,
        reason=reason,
        reason_value=reason_value,
        other=tuple(pairs),
        trailing_semicolon=trailing,
    )
