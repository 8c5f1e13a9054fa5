"""A client's request: its kind from one table, and its typed form on demand.

`kind_of(body)` names what a client packet asks (`Kind`) without building
anything: one look-up by the first byte, then a few prefix tests. A proxy
dispatches on the kind (the session's one route table is keyed by it) and
forwards everything else untouched, so a packet it has no reason to read
costs no object. `classify(body)` gives the typed object for the kinds that
have one (`Resume`, `BreakpointPacket`, `QSupported`...) and `Raw` for the
rest; a known prefix with bad syntax also becomes `Raw` unless
``strict=True``: a proxy forwards what it cannot parse and lets the stub
answer.

The table: one row a packet family, (text, exact, kind, parser). A row
either names the whole packet (exact: ``?``, ``vCont?``) or a prefix; no
prefix is a prefix of another row's text, so the order of the rows cannot
matter and no row silently shadows another (tests/rsp/packets/test_requests.py
checks it).

This is for packets a *client* sends. Replies are understood in the
context of the request they answer (`rsp.packets.stop`, `.replies`...).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from rsp.errors import MalformedPacket
from rsp.packets.breakpoints import parse_breakpoint
from rsp.packets.memory import parse_read_memory, parse_write_memory
from rsp.packets.monitor import QRCMD, QRRCMD, RRCmd, parse_qrcmd, parse_rrcmd
from rsp.packets.qsupported import Feature, parse_qsupported_request
from rsp.packets.qxfer import parse_qxfer
from rsp.packets.registers import parse_register_packet
from rsp.packets.resume import Resume, parse_resume
from rsp.packets.thread import parse_set_thread


class Kind(enum.Enum):
    """What a client packet asks."""

    READ = "read"  # m x g p: memory and registers
    WRITE = "write"  # M X G P
    RESUME = "resume"  # vCont; c C s S bc bs
    BREAKPOINT = "breakpoint"  # Z0 Z1 z0 z1: software and hardware breakpoints
    WATCHPOINT = "watchpoint"  # Z2-Z4 z2-z4
    SELECT_G = "select-g"  # Hg: the thread of later register and memory requests
    SELECT_C = "select-c"  # Hc: the thread of legacy resumes
    STOP_QUERY = "stop-query"  # ?
    VSTOPPED = "vstopped"  # vStopped (non-stop)
    VCONT_QUERY = "vcont-query"  # vCont?
    QSUPPORTED = "qsupported"
    NON_STOP = "non-stop"  # QNonStop:
    NO_ACK = "no-ack"  # QStartNoAckMode
    EXTENDED = "extended"  # !
    MONITOR = "monitor"  # qRcmd,
    RR_COMMAND = "rr-command"  # qRRCmd: (rr's own)
    QXFER = "qxfer"  # qXfer:
    LEAVE = "leave"  # D k vKill
    NEW_PROCESS = "new-process"  # vRun; vAttach; R


@dataclass(frozen=True, slots=True)
class Raw:
    """A packet passed through unparsed."""

    body: bytes

    def build(self) -> bytes:
        return self.body


@dataclass(frozen=True, slots=True)
class QSupported:
    """A client's ``qSupported`` request."""

    features: tuple[Feature, ...]

    def build(self) -> bytes:
        from rsp.packets.qsupported import build_qsupported_request

        return build_qsupported_request(self.features)


@dataclass(frozen=True, slots=True)
class MonitorCommand:
    """``qRcmd,<hex>``: gdb's ``monitor`` text."""

    text: str

    def build(self) -> bytes:
        from rsp.packets.monitor import build_qrcmd

        return build_qrcmd(self.text)


def _resume(body: bytes) -> Resume:
    resume = parse_resume(body)
    if resume is None:
        raise MalformedPacket(body, "not a resume packet")
    return resume


def _qsupported(body: bytes) -> QSupported:
    if body != b"qSupported" and not body.startswith(b"qSupported:"):
        raise MalformedPacket(body, "not qSupported")
    return QSupported(tuple(parse_qsupported_request(body)))


def _qrcmd(body: bytes) -> MonitorCommand:
    return MonitorCommand(parse_qrcmd(body))


def _rrcmd(body: bytes) -> RRCmd:
    return parse_rrcmd(body)


Parser = Callable[[bytes], object]
Row = tuple[bytes, bool, Kind, "Parser | None"]

# One table: (text, exact, kind, parser). Prefix rows are disjoint (see the module's docstring).
TABLE: tuple[Row, ...] = (
    (b"m", False, Kind.READ, parse_read_memory),
    (b"x", False, Kind.READ, parse_read_memory),
    (b"g", False, Kind.READ, parse_register_packet),
    (b"p", False, Kind.READ, parse_register_packet),
    (b"M", False, Kind.WRITE, parse_write_memory),
    (b"X", False, Kind.WRITE, parse_write_memory),
    (b"G", False, Kind.WRITE, parse_register_packet),
    (b"P", False, Kind.WRITE, parse_register_packet),
    (b"vCont;", False, Kind.RESUME, _resume),
    (b"c", False, Kind.RESUME, _resume),
    (b"C", False, Kind.RESUME, _resume),
    (b"s", False, Kind.RESUME, _resume),
    (b"S", False, Kind.RESUME, _resume),
    (b"bc", True, Kind.RESUME, _resume),
    (b"bs", True, Kind.RESUME, _resume),
    (b"Z0", False, Kind.BREAKPOINT, parse_breakpoint),
    (b"Z1", False, Kind.BREAKPOINT, parse_breakpoint),
    (b"z0", False, Kind.BREAKPOINT, parse_breakpoint),
    (b"z1", False, Kind.BREAKPOINT, parse_breakpoint),
    (b"Z2", False, Kind.WATCHPOINT, parse_breakpoint),
    (b"Z3", False, Kind.WATCHPOINT, parse_breakpoint),
    (b"Z4", False, Kind.WATCHPOINT, parse_breakpoint),
    (b"z2", False, Kind.WATCHPOINT, parse_breakpoint),
    (b"z3", False, Kind.WATCHPOINT, parse_breakpoint),
    (b"z4", False, Kind.WATCHPOINT, parse_breakpoint),
    (b"Hg", False, Kind.SELECT_G, parse_set_thread),
    (b"Hc", False, Kind.SELECT_C, parse_set_thread),
    (b"?", True, Kind.STOP_QUERY, None),
    (b"vStopped", True, Kind.VSTOPPED, None),
    (b"vCont?", True, Kind.VCONT_QUERY, None),
    (b"qSupported", False, Kind.QSUPPORTED, _qsupported),
    (b"QNonStop:", False, Kind.NON_STOP, None),
    (b"QStartNoAckMode", True, Kind.NO_ACK, None),
    (b"!", True, Kind.EXTENDED, None),
    (QRCMD, False, Kind.MONITOR, _qrcmd),
    (QRRCMD, False, Kind.RR_COMMAND, _rrcmd),
    (b"qXfer:", False, Kind.QXFER, parse_qxfer),
    (b"D", False, Kind.LEAVE, None),
    (b"k", False, Kind.LEAVE, None),
    (b"vKill", False, Kind.LEAVE, None),
    (b"vRun;", False, Kind.NEW_PROCESS, None),
    (b"vAttach;", False, Kind.NEW_PROCESS, None),
    (b"R", False, Kind.NEW_PROCESS, None),
)

_BY_FIRST: dict[int, tuple[Row, ...]] = {}
for _row in TABLE:
    _BY_FIRST[_row[0][0]] = _BY_FIRST.get(_row[0][0], ()) + (_row,)


def row_of(body: bytes) -> Row | None:
    """The table's row for client packet `body` (at most one matches)."""
    if not body:
        return None
    for row in _BY_FIRST.get(body[0], ()):
        if body == row[0] if row[1] else body.startswith(row[0]):
            return row
    return None


def kind_of(body: bytes) -> Kind | None:
    """What client packet `body` asks, or None for a packet no row names (forwarded as it is)."""
    if not body:
        return None
    for text, exact, kind, _ in _BY_FIRST.get(body[0], ()):
        if body == text if exact else body.startswith(text):
            return kind
    return None


def classify(body: bytes, *, strict: bool = False) -> object:
    """The typed form of client command `body`, or `Raw(body)`."""
    row = row_of(body)
    if row is None or row[3] is None:
        return Raw(body)
    try:
        return row[3](body)
    except MalformedPacket:
        if strict:
            raise
        return Raw(body)
