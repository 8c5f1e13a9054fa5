"""Trace packets: the tracepoint experiment (GDB manual, "Tracepoint Packets").

* ``QTinit`` - clear tracepoints, trace state variables without a getter and
  the buffer; ``QTStart`` / ``QTStop``; all answer ``OK``.
* ``QTDP:N:ADDR:E|D:STEP:PASS[:Xlen,cond][-]`` - define tracepoint N (hex);
  a trailing ``-`` says action packets follow. ``QTDP:-N:ADDR:ACTIONS[-]``
  - its actions: ``Xlen,hex`` agent expressions, ``Rmask`` registers,
  ``M basereg,offset,len`` memory (gdbserver 13.1 ignores the base
  register: use ``X``). Several actions may be concatenated with no
  separator; gdbserver stops parsing at a ``:``.
* ``QTDV:N:VALUE:BUILTIN:NAME_HEX`` - define a trace state variable.
* ``QTBuffer:size:N`` (``-1`` = default), ``QTBuffer:circular:0|1``.
* ``QTFrame:N`` selects a frame (``ffffffff`` leaves tfind mode; ``-1``
  selects frame 0 in gdbserver 13.1).
* ``qTStatus`` -> ``T0|T1;tnotrun:0|tstop:HEXMSG:N|tfull:0|...;tframes:X;...``
  (hex fields, ``username``/``notes`` hex-encoded text).
* ``qTBuffer:OFFSET,LEN`` -> hex data, ``l`` at the end, ``E01`` past it.
* ``qTV:N`` -> ``V<hex value>`` or ``U`` (unknown).

gdbserver 13.1 facts that constrain how these are used are in
``research/gdbserver-tracepoints.md``: never number a tracepoint 0 (its
frames look like the end of the buffer), numbers are truncated to 16 bits,
exactly two QTDP packets per tracepoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rsp.errors import LocalProtocolError, MalformedPacket
from rsp.framing import hex_decode, hex_encode, is_hex, parse_hex_int
from rsp.packets.replies import raise_for_error

QTINIT = b"QTinit"
QTSTART = b"QTStart"
QTSTOP = b"QTStop"
QTSTATUS = b"qTStatus"
LEAVE_TFIND = b"QTFrame:ffffffff"
MAX_TP_NUMBER = 0x7FFF  # frames carry a 16-bit signed number
TIMESTAMP_TSV = 1  # gdbserver's builtin trace_timestamp: CLOCK_MONOTONIC µs
QTBUFFER_CHUNK = 9208  # the most bytes one qTBuffer reply carries ((PBUFSIZ - 16) / 2)


# ---------------------------------------------------------------- tracepoints
@dataclass(frozen=True, slots=True)
class Tracepoint:
    """A tracepoint definition: the header packet and one action packet."""

    number: int
    addr: int
    actions: tuple[bytes, ...] = ()  # each "Xlen,hex" or "Rmask" (already formatted)
    enabled: bool = True
    step: int = 0
    pass_count: int = 0
    condition: bytes | None = None  # agent bytecode of the condition
    # A fast tracepoint (gdbserver's in-process agent): the length of the
    # instruction its jump replaces (``:F<len>``, 5 or more on x86-64).
    fast: int | None = None

    def packets(self) -> tuple[bytes, ...]:
        """Exactly two packets (research rule 3): the header with a trailing
        ``-`` and all actions concatenated in one packet without it. A
        tracepoint without actions is the header alone, without ``-``."""
        if not 1 <= self.number <= MAX_TP_NUMBER:
            raise LocalProtocolError(f"tracepoint number {self.number} outside 1..0x7fff")
        head = b"QTDP:%x:%x:%b:%x:%x" % (
            self.number, self.addr, b"E" if self.enabled else b"D", self.step, self.pass_count)
        if self.fast is not None:
            head += b":F%x" % self.fast
        if self.condition is not None:
            head += b":X%x,%b" % (len(self.condition), hex_encode(self.condition))
        if not self.actions:
            return (head,)
        for a in self.actions:
            if b":" in a or b"-" in a[-1:]:
                raise LocalProtocolError(f"action {a!r} would end the action list early")
        return (head + b"-", b"QTDP:-%x:%x:%b" % (self.number, self.addr, b"".join(self.actions)))


@dataclass(frozen=True, slots=True)
class TracepointPacket:
    """One parsed QTDP packet: a header (`actions` is None) or an action packet."""

    number: int
    addr: int
    more: bool  # trailing '-'
    enabled: bool | None = None
    step: int | None = None
    pass_count: int | None = None
    condition: bytes | None = None
    actions: tuple[bytes, ...] | None = None
    fast: int | None = None


def parse_qtdp(body: bytes) -> TracepointPacket:
    if not body.startswith(b"QTDP:"):
        raise MalformedPacket(body, "expected QTDP:")
    rest = body[5:]
    more = rest.endswith(b"-")
    if more:
        rest = rest[:-1]
    if rest.startswith(b"-"):
        num, sep, rest = rest[1:].partition(b":")
        addr, sep2, actions = rest.partition(b":")
        if not sep or not sep2:
            raise MalformedPacket(body, "QTDP action packet needs -N:ADDR:ACTIONS")
        return TracepointPacket(parse_hex_int(num, body), parse_hex_int(addr, body), more,
                                actions=split_actions(actions, body))
    parts = rest.split(b":", 5)
    if len(parts) < 5 or parts[2] not in (b"E", b"D"):
        raise MalformedPacket(body, "QTDP header needs N:ADDR:E|D:STEP:PASS")
    cond = None
    fast = None
    tail = parts[5] if len(parts) == 6 else b""
    if tail.startswith(b"F"):
        flen, _, tail = tail[1:].partition(b":")
        fast = parse_hex_int(flen, body)
    if tail:
        if not tail.startswith(b"X"):
            raise MalformedPacket(body, "QTDP condition must be Xlen,hex")
        cond = _x_bytes(tail, body)
    return TracepointPacket(parse_hex_int(parts[0], body), parse_hex_int(parts[1], body), more,
                            enabled=parts[2] == b"E", step=parse_hex_int(parts[3], body),
                            pass_count=parse_hex_int(parts[4], body), condition=cond, fast=fast)


def split_actions(text: bytes, body: bytes | None = None) -> tuple[bytes, ...]:
    """Concatenated actions -> each action's text (``X`` and ``R`` actions)."""
    out = []
    pos = 0
    while pos < len(text):
        kind = text[pos:pos + 1]
        if kind == b"X":
            comma = text.find(b",", pos)
            if comma < 0:
                raise MalformedPacket(body or text, "X action without a length")
            n = parse_hex_int(text[pos + 1:comma], body or text, "X length")
            end = comma + 1 + 2 * n
            if end > len(text):
                raise MalformedPacket(body or text, "X action runs past the packet")
            out.append(text[pos:end])
            pos = end
        elif kind == b"R":
            end = pos + 1
            while end < len(text) and text[end:end + 1] in b"0123456789abcdefABCDEF":
                end += 1
            out.append(text[pos:end])
            pos = end
        else:
            raise MalformedPacket(body or text, f"unknown tracepoint action {kind!r}")
    return tuple(out)


def _x_bytes(text: bytes, body: bytes) -> bytes:
    length, comma, data = text[1:].partition(b",")
    code = hex_decode(data)
    if not comma or parse_hex_int(length, body) != len(code):
        raise MalformedPacket(body, "agent expression length does not match its bytes")
    return code


# ------------------------------------------------------- trace state variables
@dataclass(frozen=True, slots=True)
class StateVariable:
    number: int
    initial: int = 0
    builtin: bool = False
    name: str = ""

    def build(self) -> bytes:
        val = self.initial & 0xFFFFFFFFFFFFFFFF
        return b"QTDV:%x:%x:%d:%b" % (self.number, val, int(self.builtin), hex_encode(self.name.encode()))


def parse_qtdv(body: bytes) -> StateVariable:
    parts = body.split(b":")
    if len(parts) != 5 or parts[0] != b"QTDV" or parts[3] not in (b"0", b"1"):
        raise MalformedPacket(body, "expected QTDV:N:VALUE:BUILTIN:NAME")
    val = parse_hex_int(parts[2], body)
    if val >= 1 << 63:
        val -= 1 << 64
    return StateVariable(parse_hex_int(parts[1], body), val, parts[3] == b"1",
                         hex_decode(parts[4]).decode("utf-8", "replace"))


def parse_tsv_list_entry(body: bytes) -> StateVariable:
    """One ``qTfV``/``qTsV`` reply entry: ``N:VALUE:BUILTIN:NAME_HEX``."""
    return parse_qtdv(b"QTDV:" + body)


def parse_qtv_reply(body: bytes) -> int | None:
    """``qTV:N`` -> the value (``V``) or None (``U``: unknown)."""
    raise_for_error(body)
    if body == b"U":
        return None
    if body.startswith(b"V") and is_hex(body[1:]):
        v = int(body[1:], 16)
        return v - (1 << 64) if v >= 1 << 63 else v
    raise MalformedPacket(body, "expected V<value> or U")


# ------------------------------------------------------------------- buffer
def build_qtbuffer_size(size: int) -> bytes:
    """``QTBuffer:size:N``. gdbserver 13.1 mishandles >= 2**31 and exits when
    malloc fails: keep it within 1..0x7fffffff."""
    if size == -1:
        return b"QTBuffer:size:-1"
    if not 1 <= size <= 0x7FFFFFFF:
        raise LocalProtocolError(f"trace buffer size {size} outside 1..0x7fffffff")
    return b"QTBuffer:size:%x" % size


def build_qtbuffer_read(offset: int, length: int = QTBUFFER_CHUNK) -> bytes:
    return b"qTBuffer:%x,%x" % (offset, length)


def parse_qtbuffer_reply(body: bytes) -> bytes | None:
    """Buffer bytes, or None at the end (``l``). ``E01`` past the end raises."""
    if body == b"l":
        return None
    raise_for_error(body)
    return hex_decode(body)


def build_qtframe(n: int | None) -> bytes:
    """Select frame `n`; None leaves tfind mode (``ffffffff``, never ``-1``)."""
    return LEAVE_TFIND if n is None else b"QTFrame:%x" % n


# ------------------------------------------------------------------- status
@dataclass(frozen=True, slots=True)
class TraceStatus:
    running: bool
    stop_reason: str | None = None  # "tnotrun", "tstop", "tfull", "tdisconnected", "tpasscount", "terror"
    stop_detail: str = ""  # tstop's message (decoded), terror's text, tpasscount's number
    frames: int | None = None  # tframes
    created: int | None = None  # tcreated (> frames: a circular buffer dropped frames)
    free: int | None = None
    size: int | None = None
    circular: bool = False
    disconnected: bool = False
    start_time: int | None = None  # CLOCK_MONOTONIC µs in gdbserver 13.1
    stop_time: int | None = None
    extra: tuple[tuple[str, str], ...] = field(default=())

    @property
    def lost(self) -> int:
        """Frames a circular buffer overwrote (tcreated - tframes)."""
        if self.frames is None or self.created is None:
            return 0
        return max(self.created - self.frames, 0)

    def build(self) -> bytes:
        parts = [b"T1" if self.running else b"T0"]
        if self.stop_reason is not None:
            if self.stop_reason == "tstop":
                parts.append(b"tstop:%b:0" % hex_encode(self.stop_detail.encode()))
            else:
                parts.append(b"%b:%b" % (self.stop_reason.encode(), self.stop_detail.encode() or b"0"))
        for name, val in (("tframes", self.frames), ("tcreated", self.created), ("tfree", self.free),
                          ("tsize", self.size)):
            if val is not None:
                parts.append(b"%b:%x" % (name.encode(), val))
        parts.append(b"circular:%d" % self.circular)
        parts.append(b"disconn:%d" % self.disconnected)
        if self.start_time is not None:
            parts.append(b"starttime:%x" % self.start_time)
        if self.stop_time is not None:
            parts.append(b"stoptime:%x" % self.stop_time)
        for k, v in self.extra:
            parts.append(b"%b:%b" % (k.encode(), v.encode()))
        return b";".join(parts)


# gdbserver 13.1's own reply when no experiment ever ran: what the client
# sees while the proxy's experiment is hidden (research §8, option A).
NOT_RUN_STATUS = (b"T0;tnotrun:0;tframes:0;tcreated:0;tfree:500000;tsize:500000;circular:0;"
                  b"disconn:0;starttime:0;stoptime:0;username:;notes::")

_STOP_REASONS = ("tnotrun", "tstop", "tfull", "tdisconnected", "tpasscount", "terror")


def parse_qtstatus_reply(body: bytes) -> TraceStatus:
    raise_for_error(body)
    if body[:2] not in (b"T0", b"T1"):
        raise MalformedPacket(body, "expected T0 or T1")
    running = body[:2] == b"T1"
    reason: str | None = None
    detail = ""
    nums: dict[str, int] = {}
    extra: list[tuple[str, str]] = []
    for item in body[3:].split(b";") if len(body) > 2 else []:
        key, _, val = item.partition(b":")
        name = key.decode("ascii", "replace")
        if name in _STOP_REASONS:
            reason = name
            if name == "tstop":
                msg = val.partition(b":")[0]
                detail = hex_decode(msg).decode("utf-8", "replace") if is_hex(msg) else ""
            else:
                detail = val.decode("ascii", "replace")
        elif name in ("tframes", "tcreated", "tfree", "tsize", "circular", "disconn",
                      "starttime", "stoptime") and is_hex(val):
            nums[name] = int(val, 16)
        elif name:
            extra.append((name, val.decode("ascii", "replace")))
    return TraceStatus(running, reason, detail, nums.get("tframes"), nums.get("tcreated"),
                       nums.get("tfree"), nums.get("tsize"), bool(nums.get("circular")),
                       bool(nums.get("disconn")), nums.get("starttime"), nums.get("stoptime"),
                       tuple(extra))


def is_trace_packet(body: bytes) -> bool:
    """A packet that belongs to the trace experiment (hidden from the client
    while the proxy runs its own: research rule 1)."""
    return body.startswith(_TRACE_PREFIXES)


# Every trace packet of the GDB manual; not a bare "qT"/"QT" prefix, which
# would also catch qThreadExtraInfo, QThreadEvents, QThreadSuffixSupported.
_TRACE_PREFIXES = (
    b"qTStatus", b"qTfP", b"qTsP", b"qTfV", b"qTsV", b"qTV:", b"qTP:", b"qTBuffer",
    b"qTMinFTPILen", b"qTfSTM", b"qTsSTM", b"qTSTMat",
    b"QTinit", b"QTDP", b"QTDV", b"QTStart", b"QTStop", b"QTFrame", b"QTBuffer",
    b"QTDisconnected", b"QTNotes", b"QTro", b"QTEnable", b"QTDisable", b"QTSave",
    b"qXfer:traceframe-info:", b"qXfer:statictrace:",
)


__all__ = [
    "Tracepoint", "TracepointPacket", "parse_qtdp", "split_actions", "StateVariable", "parse_qtdv",
    "parse_tsv_list_entry", "parse_qtv_reply", "build_qtbuffer_size", "build_qtbuffer_read",
    "parse_qtbuffer_reply", "build_qtframe", "TraceStatus", "parse_qtstatus_reply", "NOT_RUN_STATUS",
    "is_trace_packet", "QTINIT", "QTSTART", "QTSTOP", "QTSTATUS", "LEAVE_TFIND", "MAX_TP_NUMBER",
    "TIMESTAMP_TSV", "QTBUFFER_CHUNK",
]
