"""gdbserver's trace buffer, as ``qTBuffer`` returns it: a sans-IO decoder.

Theory of operation: the buffer is a sequence of frames, little-endian and
packed (gdbserver 13.1 ``tracepoint.cc``; research §10)::

    frame := i16 tpnum | u32 data_size | blocks[data_size]
    block := 'R' regs[registers_size]            (the ``g`` block; PC = TP address)
           | 'M' u64 addr | u16 len | bytes[len]  (one per ``trace`` op)
           | 'V' i32 tsv | i64 value
           | 'S' u16 len | bytes                  (static tracepoints)
    EOB   := 00 00 00 00 00 00                    (tpnum 0, size 0)

The drain reads the buffer in chunks of at most 9208 bytes; a frame may
straddle two chunks. `FrameDecoder.feed(chunk)` keeps the incomplete tail
and returns the frames completed so far; `finish()` says whether the data
ended cleanly (an EOB, or nothing left over). Frames are committed even
when some of their blocks could not be allocated (a full buffer): a frame
may hold fewer blocks than its actions asked for, which the consumer must
accept. The ``R`` block's size depends on the target description (use
``len(g reply) / 2``); a decoder built without it refuses ``R`` blocks.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from rsp.errors import MalformedPacket

_HEADER = struct.Struct("<hI")
_M_HEAD = struct.Struct("<QH")
_V_BLOCK = struct.Struct("<iq")
_S_HEAD = struct.Struct("<H")
EOB = b"\x00" * _HEADER.size


@dataclass(frozen=True, slots=True)
class MemoryBlock:
    addr: int
    data: bytes

    def encode(self) -> bytes:
        return b"M" + _M_HEAD.pack(self.addr, len(self.data)) + self.data


@dataclass(frozen=True, slots=True)
class VariableBlock:
    number: int
    value: int

    def encode(self) -> bytes:
        return b"V" + _V_BLOCK.pack(self.number, self.value)


@dataclass(frozen=True, slots=True)
class RegisterBlock:
    data: bytes

    def encode(self) -> bytes:
        return b"R" + self.data


@dataclass(frozen=True, slots=True)
class StaticBlock:
    data: bytes

    def encode(self) -> bytes:
        return b"S" + _S_HEAD.pack(len(self.data)) + self.data


Block = MemoryBlock | VariableBlock | RegisterBlock | StaticBlock


@dataclass(frozen=True, slots=True)
class TraceFrame:
    tracepoint: int  # the 16-bit signed number gdbserver stored
    blocks: tuple[Block, ...]

    def encode(self) -> bytes:
        body = b"".join(b.encode() for b in self.blocks)
        return _HEADER.pack(self.tracepoint, len(body)) + body

    def memory(self) -> list[MemoryBlock]:
        return [b for b in self.blocks if isinstance(b, MemoryBlock)]

    def variables(self) -> dict[int, int]:
        return {b.number: b.value for b in self.blocks if isinstance(b, VariableBlock)}


def encode_buffer(frames: Iterable[TraceFrame]) -> bytes:
    """The buffer gdbserver would hold for `frames` (tests, benchmarks)."""
    return b"".join(f.encode() for f in frames) + EOB


class FrameDecoder:
    def __init__(self, registers_size: int | None = None) -> None:
        self.registers_size = registers_size
        self._pending = bytearray()
        self.ended = False  # saw the EOB
        self.frames = 0
        self.bytes = 0
        self.consumed = 0  # bytes of complete frames: where the next read may start

    def feed(self, chunk: bytes) -> list[TraceFrame]:
        """Frames completed by `chunk` (bytes after the EOB are ignored)."""
        if self.ended:
            return []
        self.bytes += len(chunk)
        buf = self._pending
        buf += chunk
        out: list[TraceFrame] = []
        pos = 0
        view = bytes(buf)
        while len(view) - pos >= _HEADER.size:
            num, size = _HEADER.unpack_from(view, pos)
            if num == 0 and size == 0:
                self.ended = True
                self.consumed += pos
                pos = len(view)
                break
            end = pos + _HEADER.size + size
            if end > len(view):
                break
            out.append(TraceFrame(num, tuple(self._blocks(view, pos + _HEADER.size, end))))
            pos = end
        if not self.ended:
            self.consumed += pos
        del buf[:pos]
        self.frames += len(out)
        return out

    def finish(self) -> int:
        """Bytes left over that form no complete frame (0 after a clean end)."""
        return 0 if self.ended else len(self._pending)

    def _blocks(self, data: bytes, pos: int, end: int) -> Iterable[Block]:
        while pos < end:
            kind = data[pos]
            pos += 1
            if kind == 0x4D:  # 'M'
                addr, n = _need(data, pos, end, _M_HEAD)
                pos += _M_HEAD.size
                yield MemoryBlock(addr, _take(data, pos, n, end))
                pos += n
            elif kind == 0x56:  # 'V'
                num, val = _need(data, pos, end, _V_BLOCK)
                pos += _V_BLOCK.size
                yield VariableBlock(num, val)
            elif kind == 0x52:  # 'R'
                if self.registers_size is None:
                    raise MalformedPacket(data[pos - 1:pos + 16], "R block but the register block size is unknown")
                yield RegisterBlock(_take(data, pos, self.registers_size, end))
                pos += self.registers_size
            elif kind == 0x53:  # 'S'
                (n,) = _need(data, pos, end, _S_HEAD)
                pos += _S_HEAD.size
                yield StaticBlock(_take(data, pos, n, end))
                pos += n
            else:
                raise MalformedPacket(data[pos - 1:pos + 16], f"unknown trace block type {kind:#04x}")


def _need(data: bytes, pos: int, end: int, st: struct.Struct) -> tuple[int, ...]:
    if pos + st.size > end:
        raise MalformedPacket(data[pos:end], "trace block header runs past its frame")
    return st.unpack_from(data, pos)


def _take(data: bytes, pos: int, n: int, end: int) -> bytes:
    if pos + n > end:
        raise MalformedPacket(data[pos:end], "trace block runs past its frame")
    return data[pos:pos + n]


def decode_buffer(data: bytes, registers_size: int | None = None) -> list[TraceFrame]:
    """All frames of a complete buffer image."""
    return FrameDecoder(registers_size).feed(data)


__all__ = ["MemoryBlock", "VariableBlock", "RegisterBlock", "StaticBlock", "Block", "TraceFrame",
           "FrameDecoder", "decode_buffer", "encode_buffer", "EOB"]
