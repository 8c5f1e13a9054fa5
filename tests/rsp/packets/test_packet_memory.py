from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.rsp.rsp_testutil import wire

from rsp.errors import MalformedPacket, StubError
from rsp.packets.memory import (
    ReadMemory,
    WriteMemory,
    build_memory_reply,
    parse_memory_reply,
    parse_read_memory,
    parse_write_memory,
)


def test_requests() -> None:
    assert parse_read_memory(b"m7fffffffe700,40") == ReadMemory(0x7FFFFFFFE700, 0x40)
    assert parse_read_memory(b"x1000,4") == ReadMemory(0x1000, 4, binary=True)
    assert parse_write_memory(b"M1000,2:cc90") == WriteMemory(0x1000, b"\xcc\x90")
    assert parse_write_memory(b"X1000,1:}\x03") == WriteMemory(0x1000, b"#", binary=True)


@pytest.mark.parametrize("body", [b"m1000", b"mzz,1", b"M1000,2:cc", b"X1000,2:a", b"M1,1"])
def test_malformed(body: bytes) -> None:
    with pytest.raises(MalformedPacket):
        (parse_read_memory if body[:1] in b"mx" else parse_write_memory)(body)


def test_captured_rle_reply(captured: dict[str, Any]) -> None:
    data = parse_memory_reply(wire(captured["m_reply_rle"]))
    assert len(data) == 0x40


def test_error_reply_raises() -> None:
    with pytest.raises(StubError) as info:
        parse_memory_reply(b"E14")
    assert info.value.code == 0x14
    with pytest.raises(StubError):
        parse_memory_reply(b"E.memory unreadable")


def test_binary_replies() -> None:
    data = b"#$}*ok"
    assert parse_memory_reply(build_memory_reply(data, binary=True), binary=True) == data
    gdb16 = build_memory_reply(data, binary=True, b_prefix=True)
    assert gdb16.startswith(b"b")
    assert parse_memory_reply(gdb16, binary=True, b_prefix=True) == data


@given(st.integers(0, 2**64 - 1), st.binary(min_size=1, max_size=64), st.booleans())
def test_round_trip(addr: int, data: bytes, binary: bool) -> None:
    read = ReadMemory(addr, len(data), binary)
    assert parse_read_memory(read.build()) == read
    write = WriteMemory(addr, data, binary)
    assert parse_write_memory(write.build()) == write
