"""Monitor commands: gdb's ``qRcmd`` and rr's ``qRRCmd``.

* ``qRcmd,<hex text>``: gdb's ``monitor TEXT``. The stub may send any
  number of ``O<hex>`` console-output packets, then ``OK`` (or ``Exx``, or a
  hex reply for stubs that answer directly).
* ``qRRCmd``: rr's own commands (``when``, ``checkpoint``...), sent by the
  Python that ``rr gdbinit`` defines, through ``maint packet``. The format
  changed in 2024 (rr 5.8, with lldb support):

  - old: ``qRRCmd:<hex name>[:<hex arg>]...`` - every field hex-encoded;
  - new: ``qRRCmd:<name>:<tid>[:<hex arg>]...`` - the name in clear text and
    the decimal thread id gdb has selected (-1 when none).

  Both answer with the hex-encoded text of the result (ending in a newline).
  Told apart by the name field: all of rr's command names contain letters
  past 'f' or '-' (``when``, ``checkpoint``...), so a name field made only of
  hex digits, of even length, is the old hex form.

Monitor text is data, never code: nothing here evaluates it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rsp.errors import LocalProtocolError, MalformedPacket
from rsp.framing import hex_decode, hex_encode, is_hex

QRCMD = b"qRcmd,"
QRRCMD = b"qRRCmd:"


def _decode_text(data: bytes, body: bytes) -> str:
    try:
        return hex_decode(data).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket(body, "monitor text is not UTF-8") from None


def parse_qrcmd(body: bytes) -> str:
    """The command text of ``qRcmd,<hex>``."""
    if not body.startswith(QRCMD):
        raise MalformedPacket(body, "not a qRcmd packet")
    return _decode_text(body[len(QRCMD) :], body)


def build_qrcmd(text: str) -> bytes:
    return QRCMD + hex_encode(text.encode())


def build_console_output(text: str | bytes) -> bytes:
    """An ``O`` packet carrying `text` to the user's console."""
    data = text.encode() if isinstance(text, str) else text
    if not data:
        raise LocalProtocolError("an empty O packet would read as a stop reply 'O'")
    return b"O" + hex_encode(data)


def build_hex_reply(text: str) -> bytes:
    """A monitor reply sent as one hex packet (rr's qRRCmd answers)."""
    return hex_encode(text.encode())


@dataclass(frozen=True, slots=True)
class RRCmd:
    """An rr command. `thread` is None for the old format."""

    name: str
    thread: int | None
    args: tuple[str, ...] = ()

    @property
    def legacy(self) -> bool:
        return self.thread is None

    def build(self) -> bytes:
        fields: list[bytes]
        if self.thread is None:
            fields = [hex_encode(self.name.encode())]
        else:
            if not self.name or ":" in self.name or _looks_hex(self.name.encode()):
                raise LocalProtocolError(f"rr command name {self.name!r} is ambiguous or bad")
            fields = [self.name.encode(), b"%d" % self.thread]
        fields += [hex_encode(a.encode()) for a in self.args]
        return QRRCMD + b":".join(fields)


def _looks_hex(name: bytes) -> bool:
    return len(name) % 2 == 0 and is_hex(name)


def parse_rrcmd(body: bytes) -> RRCmd:
    if not body.startswith(QRRCMD):
        raise MalformedPacket(body, "not a qRRCmd packet")
    fields = body[len(QRRCMD) :].split(b":")
    if not fields[0]:
        raise MalformedPacket(body, "qRRCmd without a command name")
    if _looks_hex(fields[0]):
        return RRCmd(_decode_text(fields[0], body), None, _args(fields[1:], body))
    if len(fields) < 2:
        raise MalformedPacket(body, "qRRCmd (2024 format) needs name:tid")
    try:
        thread = int(fields[1], 10)
    except ValueError:
        raise MalformedPacket(body, f"qRRCmd thread id {fields[1]!r} is not decimal") from None
    return RRCmd(fields[0].decode("ascii", "replace"), thread, _args(fields[2:], body))


def _args(fields: Sequence[bytes], body: bytes) -> tuple[str, ...]:
    return tuple(_decode_text(f, body) for f in fields)
