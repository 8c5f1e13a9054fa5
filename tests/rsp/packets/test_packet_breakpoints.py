from __future__ import annotations

from typing import Any

import pytest
from tests.rsp.rsp_testutil import wire
from hypothesis import given
from hypothesis import strategies as st

from rsp.errors import LocalProtocolError, MalformedPacket
from rsp.packets.breakpoints import BreakpointPacket, parse_breakpoint


def test_captured(captured: dict[str, Any]) -> None:
    bp = parse_breakpoint(wire(captured["z0_insert"]))
    assert bp == BreakpointPacket(True, 0, 0x555555555151, 1)
    assert bp.removal().build() == b"z0,555555555151,1"


def test_conditions_kept_raw() -> None:
    body = b"Z0,401000,1;X3,220027;cmds:0,X3,220027"
    bp = parse_breakpoint(body)
    assert bp.conditions == b";X3,220027;cmds:0,X3,220027" and bp.build() == body
    assert bp.key == (0, 0x401000, 1)


@pytest.mark.parametrize("body", [b"Z0,1", b"Zx,1,1", b"Z0,zz,1", b"Z10,1,1", b"Q0,1,1"])
def test_malformed(body: bytes) -> None:
    with pytest.raises(MalformedPacket):
        parse_breakpoint(body)


def test_build_refuses_bad_conditions() -> None:
    with pytest.raises(LocalProtocolError):
        BreakpointPacket(True, 0, 1, 1, b"X3,220027").build()


@given(st.booleans(), st.integers(0, 4), st.integers(0, 2**64 - 1), st.integers(0, 16),
       st.sampled_from([b"", b";X3,220027", b";X2,2201;cmds:1,X1,00"]))
def test_round_trip(insert: bool, type_: int, addr: int, kind: int, cond: bytes) -> None:
    bp = BreakpointPacket(insert, type_, addr, kind, cond)
    assert parse_breakpoint(bp.build()) == bp
