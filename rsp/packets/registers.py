"""Register packets: ``g`` (read all), ``G`` (write all), ``p n`` (read one),
``P n=r`` (write one). Numbers are hex; values hex in target byte order.

lldb-server with ``QThreadSuffixSupported`` takes the thread in a
``;thread:<hex tid>;`` suffix instead of relying on ``Hg``; it is kept in
`thread` and reproduced by `build`. gdbserver 13.1 answers ``p`` on x86-64
with an empty reply: read ``g`` and slice it (`rsp.regs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rsp.errors import MalformedPacket
from rsp.framing import hex_decode, is_hex, parse_hex_int, rle_expand
from rsp.packets.replies import raise_for_error

_SUFFIX = b";thread:"


def _split_thread(body: bytes) -> tuple[bytes, int | None]:
    at = body.find(_SUFFIX)
    if at < 0:
        return body, None
    tid = body[at + len(_SUFFIX) :]
    if tid.endswith(b";"):
        tid = tid[:-1]
    return body[:at], parse_hex_int(tid, body, "thread suffix")


def _suffix(thread: int | None) -> bytes:
    return b"" if thread is None else b";thread:%x;" % thread


@dataclass(frozen=True, slots=True)
class ReadRegisters:
    thread: int | None = None

    def build(self) -> bytes:
        return b"g" + _suffix(self.thread)


@dataclass(frozen=True, slots=True)
class ReadRegister:
    regnum: int
    thread: int | None = None

    def build(self) -> bytes:
        return b"p%x" % self.regnum + _suffix(self.thread)


@dataclass(frozen=True, slots=True)
class WriteRegisters:
    data: bytes  # hex text, as sent (may hold 'xx' for unavailable bytes)
    thread: int | None = None

    def build(self) -> bytes:
        return b"G" + self.data + _suffix(self.thread)


@dataclass(frozen=True, slots=True)
class WriteRegister:
    regnum: int
    value: bytes  # hex text, target byte order
    thread: int | None = None

    def build(self) -> bytes:
        return b"P%x=%b" % (self.regnum, self.value) + _suffix(self.thread)


RegisterPacket = ReadRegisters | ReadRegister | WriteRegisters | WriteRegister


def parse_register_packet(body: bytes) -> RegisterPacket:
    core, thread = _split_thread(body)
    letter, rest = core[:1], core[1:]
    if letter == b"g":
        if rest:
            raise MalformedPacket(body, "g takes no argument")
        return ReadRegisters(thread)
    if letter == b"p":
        return ReadRegister(parse_hex_int(rest, body, "register number"), thread)
    if letter == b"G":
        _check_reg_hex(rest, body)
        return WriteRegisters(rest, thread)
    if letter == b"P":
        num, eq, value = rest.partition(b"=")
        if not eq:
            raise MalformedPacket(body, "expected Pn=value")
        _check_reg_hex(value, body)
        return WriteRegister(parse_hex_int(num, body, "register number"), value, thread)
    raise MalformedPacket(body, "not a register packet")


def _check_reg_hex(text: bytes, body: bytes) -> None:
    if len(text) % 2 or not is_hex(text.replace(b"x", b"0")):
        raise MalformedPacket(body, "register data is not hex")


def parse_register_value(body: bytes) -> bytes | None:
    """The bytes of a ``p`` reply; None when the register is unavailable
    (``xx...``). Empty replies (unsupported) raise `MalformedPacket`."""
    if not body:
        raise MalformedPacket(body, "empty reply: the stub does not support 'p'")
    raise_for_error(body)
    data = rle_expand(body)
    if data.strip(b"x") == b"":
        return None
    return hex_decode(data)
