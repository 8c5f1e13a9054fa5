"""Agent expressions: the bytecode gdbserver evaluates for breakpoint
conditions (``Z0,addr,kind;Xlen,bytes``) and tracepoint actions (``QTDP``
``X`` collect actions).

Opcodes and operand sizes follow the GDB manual, "Bytecode Descriptions".
Operands are big-endian; ``reg``, ``getv``/``setv``/``tracev``,
``if_goto``/``goto``, ``const16``, ``trace16`` take 2 bytes, ``const8``,
``ext``, ``zero_ext``, ``trace_quick``, ``pick`` 1 byte, ``const32`` 4,
``const64`` 8; ``printf`` takes a 1-byte argument count then a string
(2-byte length including its terminating NUL, then the bytes).

Example - record 16 bytes at rdi (x86-64 register 5) and the thread's
fs_base (register 58) through trace state variable 2::

    assemble([Op(Opcode.reg, 5), Op(Opcode.const8, 16), Op(Opcode.trace),
              Op(Opcode.reg, 58), Op(Opcode.setv, 2), Op(Opcode.tracev, 2),
              Op(Opcode.end)])
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from rsp.errors import LocalProtocolError, MalformedPacket


class Opcode(enum.IntEnum):
    float = 0x01
    add = 0x02
    sub = 0x03
    mul = 0x04
    div_signed = 0x05
    div_unsigned = 0x06
    rem_signed = 0x07
    rem_unsigned = 0x08
    lsh = 0x09
    rsh_signed = 0x0A
    rsh_unsigned = 0x0B
    trace = 0x0C
    trace_quick = 0x0D
    log_not = 0x0E
    bit_and = 0x0F
    bit_or = 0x10
    bit_xor = 0x11
    bit_not = 0x12
    equal = 0x13
    less_signed = 0x14
    less_unsigned = 0x15
    ext = 0x16
    ref8 = 0x17
    ref16 = 0x18
    ref32 = 0x19
    ref64 = 0x1A
    ref_float = 0x1B
    ref_double = 0x1C
    ref_long_double = 0x1D
    l_to_d = 0x1E
    d_to_l = 0x1F
    if_goto = 0x20
    goto = 0x21
    const8 = 0x22
    const16 = 0x23
    const32 = 0x24
    const64 = 0x25
    reg = 0x26
    end = 0x27
    dup = 0x28
    pop = 0x29
    zero_ext = 0x2A
    swap = 0x2B
    getv = 0x2C
    setv = 0x2D
    tracev = 0x2E
    tracenz = 0x2F
    trace16 = 0x30
    pick = 0x32
    rot = 0x33
    printf = 0x34


OPERAND_SIZE: dict[Opcode, int] = {
    Opcode.trace_quick: 1,
    Opcode.ext: 1,
    Opcode.zero_ext: 1,
    Opcode.const8: 1,
    Opcode.pick: 1,
    Opcode.if_goto: 2,
    Opcode.goto: 2,
    Opcode.const16: 2,
    Opcode.reg: 2,
    Opcode.getv: 2,
    Opcode.setv: 2,
    Opcode.tracev: 2,
    Opcode.trace16: 2,
    Opcode.const32: 4,
    Opcode.const64: 8,
}


@dataclass(frozen=True, slots=True)
class Op:
    """One instruction. `arg` is the operand (an unsigned int) for opcodes
    that take one; for ``printf`` it is the argument count and `text` the
    format string (without its NUL)."""

    opcode: Opcode
    arg: int | None = None
    text: bytes | None = None

    def encode(self) -> bytes:
        code = bytes((self.opcode,))
        if self.opcode == Opcode.printf:
            if self.arg is None or self.text is None or not 0 <= self.arg <= 255:
                raise LocalProtocolError("printf needs an argument count and a format string")
            fmt = self.text + b"\x00"
            return code + bytes((self.arg,)) + len(fmt).to_bytes(2, "big") + fmt
        size = OPERAND_SIZE.get(self.opcode, 0)
        if size == 0:
            if self.arg is not None:
                raise LocalProtocolError(f"{self.opcode.name} takes no operand")
            return code
        if self.arg is None or not 0 <= self.arg < 1 << (8 * size):
            raise LocalProtocolError(f"{self.opcode.name} needs an operand of {size} bytes")
        return code + self.arg.to_bytes(size, "big")


def assemble(ops: Iterable[Op | Opcode]) -> bytes:
    """Bytecode for `ops` (a bare `Opcode` is an instruction without operand)."""
    return b"".join((op if isinstance(op, Op) else Op(op)).encode() for op in ops)


def disassemble(code: bytes) -> list[Op]:
    ops = []
    pos = 0
    while pos < len(code):
        try:
            opcode = Opcode(code[pos])
        except ValueError:
            raise MalformedPacket(code, f"unknown agent opcode {code[pos]:#04x} at {pos}") from None
        op, pos = _decode_one(code, opcode, pos + 1)
        ops.append(op)
    return ops


def _decode_one(code: bytes, opcode: Opcode, pos: int) -> tuple[Op, int]:
    if opcode == Opcode.printf:
        if pos + 3 > len(code):
            raise MalformedPacket(code, "truncated printf")
        nargs = code[pos]
        length = int.from_bytes(code[pos + 1 : pos + 3], "big")
        text = code[pos + 3 : pos + 3 + length]
        if length == 0 or len(text) != length or not text.endswith(b"\x00"):
            raise MalformedPacket(code, "printf string is truncated or not NUL-terminated")
        return Op(opcode, nargs, text[:-1]), pos + 3 + length
    size = OPERAND_SIZE.get(opcode, 0)
    if pos + size > len(code):
        raise MalformedPacket(code, f"{opcode.name} operand runs past the end")
    arg = int.from_bytes(code[pos : pos + size], "big") if size else None
    return Op(opcode, arg), pos + size


def x_expression(code: bytes) -> bytes:
    """The ``X<len>,<hex bytes>`` form used in Z conditions and QTDP actions."""
    return b"X%x,%b" % (len(code), code.hex().encode())


def parse_x_expression(text: bytes) -> bytes:
    if not text.startswith(b"X"):
        raise MalformedPacket(text, "agent expression must start with X")
    length, comma, data = text[1:].partition(b",")
    try:
        code = bytes.fromhex(data.decode("ascii")) if comma else b""
        size = int(length, 16)
    except ValueError:
        raise MalformedPacket(text, "agent expression is not Xlen,hex") from None
    if not comma or len(code) != size:
        raise MalformedPacket(text, "agent expression length does not match its bytes")
    return code
