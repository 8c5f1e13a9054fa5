"""Errors raised by the `rsp` package.

Every error carries the data that explains it, so a caller can log or act
on it without parsing a message::

    Exception
     +-- ProtocolError                 anything wrong with the protocol itself
     |    +-- RemoteProtocolError      the peer sent something we cannot accept
     |    |    +-- ChecksumMismatch    a packet's checksum does not match its body
     |    |    +-- PacketTooLarge      a packet body exceeds the reader's limit
     |    |    +-- MalformedPacket     a packet's body does not parse
     |    |    +-- TooManyRetransmits  the peer NAKed the same packet too often
     |    +-- LocalProtocolError       we tried to build something illegal
     +-- StubError                     a well-formed ``Exx`` / ``E.text`` reply:
                                       not a protocol fault, the request failed

A `RemoteProtocolError` inside a packet (checksum, size) is non-fatal: the
reader reports it as a `BadPacket` event and keeps going. A
`MalformedPacket` raised by a `parse_*` function concerns one packet only;
the caller decides whether to pass it through, answer an error, or give up.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class of every protocol violation."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the protocol."""


class LocalProtocolError(ProtocolError):
    """We were asked to build something the protocol cannot express."""


class ChecksumMismatch(RemoteProtocolError):
    """A packet's two-digit checksum does not match the sum of its body."""

    def __init__(self, raw: bytes, checksum: int | None, calculated: int) -> None:
        shown = "not hex" if checksum is None else f"{checksum:02x}"
        super().__init__(
            f"checksum mismatch: packet says {shown}, body sums to {calculated:02x}: {raw[:80]!r}"
        )
        self.raw = raw
        self.checksum = checksum
        self.calculated = calculated

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ChecksumMismatch)
            and (self.raw, self.checksum, self.calculated)
            == (other.raw, other.checksum, other.calculated)
        )

    def __hash__(self) -> int:
        return hash((self.raw, self.checksum, self.calculated))


class PacketTooLarge(RemoteProtocolError):
    """A packet body is longer than the reader accepts."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"packet body of {size} bytes exceeds the limit of {limit}")
        self.size = size
        self.limit = limit

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PacketTooLarge) and (self.size, self.limit) == (
            other.size,
            other.limit,
        )

    def __hash__(self) -> int:
        return hash((self.size, self.limit))


class MalformedPacket(RemoteProtocolError):
    """A packet body does not have the syntax its kind requires."""

    def __init__(self, body: bytes, why: str) -> None:
        super().__init__(f"malformed packet {body[:80]!r}: {why}")
        self.body = body
        self.why = why

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MalformedPacket) and (self.body, self.why) == (
            other.body,
            other.why,
        )

    def __hash__(self) -> int:
        return hash((self.body, self.why))


class TooManyRetransmits(RemoteProtocolError):
    """The peer rejected (``-``) the same packet more often than we retry."""

    def __init__(self, raw: bytes, attempts: int) -> None:
        super().__init__(f"peer NAKed {raw[:80]!r} {attempts} times; giving up")
        self.raw = raw
        self.attempts = attempts


class StubError(Exception):
    """The peer answered a request with an error reply (``Exx`` or ``E.text``).

    Not a protocol fault: the request was understood and failed (unreadable
    memory, unknown register). `code` is the two hex digits, `text` the
    message of the ``E.text`` form.
    """

    def __init__(self, body: bytes, code: int | None, text: str | None) -> None:
        super().__init__(f"stub replied {body[:80]!r}")
        self.body = body
        self.code = code
        self.text = text
