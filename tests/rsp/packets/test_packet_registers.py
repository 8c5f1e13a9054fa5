from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsp.errors import MalformedPacket, StubError
from rsp.packets.registers import (
    ReadRegister,
    ReadRegisters,
    WriteRegister,
    WriteRegisters,
    parse_register_packet,
    parse_register_value,
)


@pytest.mark.parametrize(
    ("body", "packet"),
    [
        (b"g", ReadRegisters()),
        (b"g;thread:4a2f;", ReadRegisters(0x4A2F)),
        (b"p10", ReadRegister(16)),
        (b"p10;thread:4a2f;", ReadRegister(16, 0x4A2F)),
        (b"G0011", WriteRegisters(b"0011")),
        (b"P10=5011400000000000", WriteRegister(16, b"5011400000000000")),
        (b"P10=5011400000000000;thread:1;", WriteRegister(16, b"5011400000000000", 1)),
    ],
)
def test_parse_and_build(body: bytes, packet: object) -> None:
    parsed = parse_register_packet(body)
    assert parsed == packet
    assert parsed.build() == body


@pytest.mark.parametrize("body", [b"gx", b"pzz", b"P10", b"G001", b"P10=zz", b"p10;thread:q;"])
def test_malformed(body: bytes) -> None:
    with pytest.raises(MalformedPacket):
        parse_register_packet(body)


def test_register_value() -> None:
    assert parse_register_value(b"5011400000000000") == bytes.fromhex("5011400000000000")
    assert parse_register_value(b"xxxxxxxx") is None
    assert parse_register_value(b"0*\"00") == b"\x00" * 4  # RLE: "0" + 5 more, then "00"
    with pytest.raises(MalformedPacket):
        parse_register_value(b"")  # gdbserver 13.1 x86-64: 'p' unsupported
    with pytest.raises(StubError):
        parse_register_value(b"E01")


@given(st.integers(0, 4096), st.binary(min_size=1, max_size=32), st.one_of(st.none(), st.integers(1, 2**32)))
def test_round_trip(regnum: int, value: bytes, thread: int | None) -> None:
    for packet in (ReadRegister(regnum, thread), WriteRegister(regnum, value.hex().encode(), thread),
                   ReadRegisters(thread), WriteRegisters(value.hex().encode(), thread)):
        assert parse_register_packet(packet.build()) == packet
