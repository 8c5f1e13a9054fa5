"""Classify a client command by its prefix, through one table.

`classify` returns the typed object for the packets the proxy needs to
understand and `Raw` for everything else (pass-through). The table is one
tuple of (prefix, parser); no prefix in it is a prefix of another, so the
order cannot matter and no entry can silently shadow another (a unit test
checks this). A known prefix with bad syntax also becomes `Raw` unless
``strict=True``: a proxy forwards what it cannot parse and lets the stub
answer.

This is for packets a *client* sends. Replies are understood in the
context of the request they answer (`rsp.packets.stop`, `.replies`...).
"""

from __future__ import annotations

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

# One table. Keys are disjoint prefixes (see tests/rsp/packets/test_raw.py).
TABLE: tuple[tuple[bytes, Parser], ...] = (
    (b"vCont;", _resume),
    (b"c", _resume),
    (b"C", _resume),
    (b"s", _resume),
    (b"S", _resume),
    (b"bc", _resume),
    (b"bs", _resume),
    (b"Z", parse_breakpoint),
    (b"z", parse_breakpoint),
    (b"m", parse_read_memory),
    (b"x", parse_read_memory),
    (b"M", parse_write_memory),
    (b"X", parse_write_memory),
    (b"g", parse_register_packet),
    (b"G", parse_register_packet),
    (b"p", parse_register_packet),
    (b"P", parse_register_packet),
    (b"H", parse_set_thread),
    (b"qSupported", _qsupported),
    (b"qXfer:", parse_qxfer),
    (QRCMD, _qrcmd),
    (QRRCMD, _rrcmd),
)

_BY_FIRST: dict[int, tuple[tuple[bytes, Parser], ...]] = {}
for _prefix, _parser in TABLE:
    _BY_FIRST[_prefix[0]] = _BY_FIRST.get(_prefix[0], ()) + ((_prefix, _parser),)


def lookup(body: bytes) -> Parser | None:
    """The parser whose prefix starts `body` (at most one can)."""
    if not body:
        return None
    for prefix, parser in _BY_FIRST.get(body[0], ()):
        if body.startswith(prefix):
            return parser
    return None


def classify(body: bytes, *, strict: bool = False) -> object:
    """The typed form of client command `body`, or `Raw(body)`."""
    parser = lookup(body)
    if parser is None:
        return Raw(body)
    try:
        return parser(body)
    except MalformedPacket:
        if strict:
            raise
        return Raw(body)
