"""``qXfer``: reading and writing named objects in chunks.

``qXfer:object:read:annex:offset,length`` is answered ``m<data>`` (more to
come) or ``l<data>`` (last chunk), the data binary-escaped: a bare ``#`` in
a payload would end the packet early (an osdata table with ``#12`` in it
does exactly that). ``qXfer:object:write:annex:offset:data`` carries
escaped data and is answered with the hex count written.
"""

from __future__ import annotations

from dataclasses import dataclass

from rsp.errors import LocalProtocolError, MalformedPacket
from rsp.framing import escape_binary, parse_hex_int, rle_expand, unescape_binary

PREFIX = b"qXfer:"


@dataclass(frozen=True, slots=True)
class QXferRead:
    object: str
    annex: str
    offset: int
    length: int

    def build(self) -> bytes:
        _check_names(self.object, self.annex)
        return b"qXfer:%b:read:%b:%x,%x" % (
            self.object.encode(),
            self.annex.encode(),
            self.offset,
            self.length,
        )


@dataclass(frozen=True, slots=True)
class QXferWrite:
    object: str
    annex: str
    offset: int
    data: bytes

    def build(self) -> bytes:
        _check_names(self.object, self.annex)
        return b"qXfer:%b:write:%b:%x:%b" % (
            self.object.encode(),
            self.annex.encode(),
            self.offset,
            escape_binary(self.data),
        )


def _check_names(obj: str, annex: str) -> None:
    if ":" in obj or ":" in annex:
        raise LocalProtocolError(f"qXfer object/annex may not hold ':' ({obj!r}, {annex!r})")


def parse_qxfer(body: bytes) -> QXferRead | QXferWrite:
    if not body.startswith(PREFIX):
        raise MalformedPacket(body, "not a qXfer packet")
    parts = body[len(PREFIX) :].split(b":", 4)
    if len(parts) < 4:
        raise MalformedPacket(body, "expected qXfer:object:read|write:annex:...")
    obj, op, annex = (p.decode("utf-8", "replace") for p in parts[:3])
    if op == "read":
        if len(parts) != 4:
            raise MalformedPacket(body, "qXfer read: too many ':' fields")
        offset, comma, length = parts[3].partition(b",")
        if not comma:
            raise MalformedPacket(body, "qXfer read needs offset,length")
        return QXferRead(
            obj, annex, parse_hex_int(offset, body, "offset"), parse_hex_int(length, body, "length")
        )
    if op == "write":
        if len(parts) != 5:
            raise MalformedPacket(body, "qXfer write needs offset:data")
        return QXferWrite(
            obj, annex, parse_hex_int(parts[3], body, "offset"), unescape_binary(parts[4])
        )
    raise MalformedPacket(body, f"qXfer operation {op!r} is neither read nor write")


def build_qxfer_reply(
    data: bytes, offset: int, length: int, *, max_body: int | None = None
) -> bytes:
    """The reply to a read of `data` at `offset` for `length` bytes:
    ``l`` when the chunk reaches the end of `data`, else ``m``. With
    `max_body`, the chunk is shortened until its escaped form fits (the
    client asks again from where this one ends)."""
    if offset > len(data):
        return b"E00"  # gdbserver answers an offset past the end with an error
    chunk = data[offset : offset + length]
    escaped = escape_binary(chunk)
    if max_body is not None:
        while len(escaped) + 1 > max_body and chunk:
            chunk = chunk[: max(0, len(chunk) - (len(escaped) + 1 - max_body))]
            escaped = escape_binary(chunk)
    last = offset + len(chunk) >= len(data)
    return (b"l" if last else b"m") + escaped


def parse_qxfer_reply(body: bytes) -> tuple[bool, bytes]:
    """(is_last, data) from an ``m``/``l`` reply (run-length expanded and
    un-escaped). Error and empty replies raise `MalformedPacket`."""
    if body[:1] not in (b"m", b"l"):
        raise MalformedPacket(body, "qXfer reply must start with 'm' or 'l'")
    return body[:1] == b"l", unescape_binary(rle_expand(body[1:]))
