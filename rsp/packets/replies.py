"""The generic replies: ``OK``, the empty reply (unsupported packet), and
error replies ``Exx`` (two hex digits) or ``E.text`` (gdb's textual form)."""

from __future__ import annotations

from dataclasses import dataclass

from rsp.errors import MalformedPacket, StubError
from rsp.framing import is_hex

OK = b"OK"
EMPTY = b""


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """``Exx`` (`code`) or ``E.text`` (`text`)."""

    code: int | None
    text: str | None

    def build(self) -> bytes:
        if self.text is not None:
            return b"E." + self.text.encode()
        return b"E%02x" % (self.code or 0)


def is_ok(body: bytes) -> bool:
    return body == OK


def is_empty(body: bytes) -> bool:
    """The empty reply: the stub does not support the request."""
    return not body


def is_error_reply(body: bytes) -> bool:
    """``Exx`` or ``E.text``. (A bare ``E`` followed by anything else is not
    an error reply: no command's reply starts that way except by accident.)"""
    if not body.startswith(b"E"):
        return False
    return (len(body) == 3 and is_hex(body[1:])) or body.startswith(b"E.")


def parse_error_reply(body: bytes) -> ErrorReply:
    if body.startswith(b"E."):
        return ErrorReply(None, body[2:].decode("utf-8", "replace"))
    if len(body) == 3 and body.startswith(b"E") and is_hex(body[1:]):
        return ErrorReply(int(body[1:], 16), None)
    raise MalformedPacket(body, "not an error reply (Exx or E.text)")


def raise_for_error(body: bytes) -> None:
    """Raise `StubError` if `body` is an error reply."""
    if is_error_reply(body):
        err = parse_error_reply(body)
        raise StubError(body, err.code, err.text)
