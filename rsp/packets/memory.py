"""Memory packets.

* ``m addr,length`` - read, reply hex (``Exx`` on error);
* ``x addr,length`` - binary read: lldb's form replies with the raw
  escaped bytes; GDB 16's form replies ``b`` + escaped bytes (gdbserver 13.1
  does not support ``x`` at all and answers empty). ``x0,0`` probes support
  (lldb: ``OK``);
* ``M addr,length:hex`` - write hex; ``X addr,length:binary`` - write
  escaped binary. Both answer ``OK``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rsp.errors import LocalProtocolError, MalformedPacket, StubError
from rsp.framing import escape_binary, hex_decode, hex_encode, parse_hex_int, rle_expand, unescape_binary
from rsp.packets.replies import raise_for_error


@dataclass(frozen=True, slots=True)
class ReadMemory:
    addr: int
    length: int
    binary: bool = False

    def build(self) -> bytes:
        return b"%b%x,%x" % (b"x" if self.binary else b"m", self.addr, self.length)


@dataclass(frozen=True, slots=True)
class WriteMemory:
    addr: int
    data: bytes
    binary: bool = False

    def build(self) -> bytes:
        if self.binary:
            return b"X%x,%x:%b" % (self.addr, len(self.data), escape_binary(self.data))
        return b"M%x,%x:%b" % (self.addr, len(self.data), hex_encode(self.data))


def _addr_len(text: bytes, body: bytes) -> tuple[int, int]:
    addr, comma, length = text.partition(b",")
    if not comma:
        raise MalformedPacket(body, "expected addr,length")
    return parse_hex_int(addr, body, "address"), parse_hex_int(length, body, "length")


def parse_read_memory(body: bytes) -> ReadMemory:
    if body[:1] not in (b"m", b"x"):
        raise MalformedPacket(body, "expected m or x")
    addr, length = _addr_len(body[1:], body)
    return ReadMemory(addr, length, binary=body[:1] == b"x")


def parse_write_memory(body: bytes) -> WriteMemory:
    if body[:1] not in (b"M", b"X"):
        raise MalformedPacket(body, "expected M or X")
    head, colon, payload = body[1:].partition(b":")
    if not colon:
        raise MalformedPacket(body, "expected addr,length:data")
    addr, length = _addr_len(head, body)
    binary = body[:1] == b"X"
    data = unescape_binary(payload) if binary else hex_decode(payload)
    if len(data) != length:
        raise MalformedPacket(body, f"length {length} but {len(data)} bytes of data")
    return WriteMemory(addr, data, binary)


def parse_memory_reply(body: bytes, *, binary: bool = False, b_prefix: bool = False) -> bytes:
    """The bytes of a memory read reply (run-length expanded).

    `binary`: the reply to ``x`` (escaped bytes); with `b_prefix` GDB 16's
    form, which starts with ``b``. Raises `StubError` for ``Exx`` / ``E.msg``
    and `MalformedPacket` for bad hex. Note that for ``x`` an ``E`` reply
    is ambiguous with data that starts with ``E``: lldb's stubs accept that
    ambiguity (binary replies of 3 bytes starting with E are rare); we treat
    ``Exx`` as an error as they do.
    """
    raise_for_error(body)
    data = rle_expand(body)
    if not binary:
        return hex_decode(data)
    if b_prefix:
        if not data.startswith(b"b"):
            raise MalformedPacket(body, "binary memory reply must start with 'b'")
        data = data[1:]
    return unescape_binary(data)


def build_memory_reply(data: bytes, *, binary: bool = False, b_prefix: bool = False) -> bytes:
    if not binary:
        return hex_encode(data)
    if not data and not b_prefix:
        raise LocalProtocolError("an empty binary reply is the 'unsupported' reply")
    return (b"b" if b_prefix else b"") + escape_binary(data)


def memory_bytes(reply: bytes) -> bytes | None:
    """An `m` (or `g`) reply's bytes; None for an error, empty or garbage reply."""
    if not reply:
        return None
    try:
        return parse_memory_reply(reply)
    except (MalformedPacket, StubError):
        return None
