from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsp.errors import MalformedPacket
from rsp.tracebuf import (
    EOB,
    FrameDecoder,
    MemoryBlock,
    RegisterBlock,
    StaticBlock,
    TraceFrame,
    VariableBlock,
    decode_buffer,
    encode_buffer,
)

REGS = 560  # gdbserver 13.1 x86-64 g block without xmlRegisters


def test_frame_from_the_research() -> None:
    # research §10: "01003e020000 52+560 bytes 56 01000000 8181c88200000000"
    raw = bytes.fromhex("01003e020000") + b"R" + bytes(REGS) + bytes.fromhex("56010000008181c88200000000") + EOB
    (frame,) = decode_buffer(raw, REGS)
    assert frame.tracepoint == 1
    assert frame.variables() == {1: 0x82C88181}
    assert isinstance(frame.blocks[0], RegisterBlock)


def test_memory_block_keeps_the_evaluated_address() -> None:
    f = TraceFrame(3, (MemoryBlock(0x7FFF0010, b"\x03\x00"), VariableBlock(2, -5)))
    (back,) = decode_buffer(encode_buffer([f]))
    assert back == f
    assert back.memory()[0].addr == 0x7FFF0010


def test_frames_straddle_chunks_and_bytes_after_eob_are_ignored() -> None:
    frames = [TraceFrame(i + 1, (VariableBlock(1, i), MemoryBlock(i, b"ab"))) for i in range(50)]
    raw = encode_buffer(frames) + b"stale bytes after the end"
    dec = FrameDecoder()
    out = []
    for i in range(0, len(raw), 7):
        out += dec.feed(raw[i:i + 7])
    assert out == frames and dec.ended and dec.finish() == 0


def test_truncated_frame_with_fewer_blocks_is_accepted() -> None:
    # a full buffer commits a frame even when some blocks failed to allocate
    f = TraceFrame(1, ())
    assert decode_buffer(encode_buffer([f])) == [f]


def test_incomplete_tail_is_reported() -> None:
    raw = encode_buffer([TraceFrame(1, (VariableBlock(1, 1),))])
    dec = FrameDecoder()
    assert dec.feed(raw[:10]) == []
    assert dec.finish() == 10


@pytest.mark.parametrize("raw", [
    bytes.fromhex("0100020000005800"),  # unknown block type
    bytes.fromhex("010005000000") + b"V" + b"\0\0\0\0",  # V block past the frame
    bytes.fromhex("010001000000") + b"R",  # R without a register size
])
def test_garbage(raw: bytes) -> None:
    with pytest.raises(MalformedPacket):
        decode_buffer(raw)


_block = st.one_of(
    st.builds(MemoryBlock, st.integers(0, 2**64 - 1), st.binary(max_size=40)),
    st.builds(VariableBlock, st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1)),
    st.builds(RegisterBlock, st.binary(min_size=16, max_size=16)),
    st.builds(StaticBlock, st.binary(max_size=20)),
)
# tpnum 0 is not a valid tracepoint number (its empty frames look like the EOB)
_frame = st.builds(TraceFrame, st.integers(-(2**15), 2**15 - 1).filter(bool), st.tuples(_block, _block) | st.tuples(_block))


@given(st.lists(_frame, max_size=20), st.integers(1, 64))
def test_round_trip_in_any_chunking(frames: list[TraceFrame], chunk: int) -> None:
    raw = encode_buffer(frames)
    dec = FrameDecoder(16)
    out = []
    for i in range(0, len(raw), chunk):
        out += dec.feed(raw[i:i + chunk])
    assert out == frames
    assert dec.ended


@given(st.lists(_frame, min_size=1, max_size=20), st.integers(1, 64), st.integers(0, 19))
def test_consumed_is_where_a_later_read_continues(frames: list[TraceFrame], chunk: int, cut: int) -> None:
    """A drain that stops at the end marker, then a read from `consumed` of
    the same linear buffer after more frames were appended (over the old
    marker), gives exactly the new frames."""
    first, more = frames[:cut % len(frames) + 1], frames[cut % len(frames) + 1:]
    dec = FrameDecoder(16)
    raw = encode_buffer(first)
    for i in range(0, len(raw), chunk):
        dec.feed(raw[i:i + chunk])
    assert dec.ended and dec.consumed == len(raw) - 6
    later = encode_buffer(first + more)[dec.consumed:]
    assert decode_buffer(later, 16) == more
