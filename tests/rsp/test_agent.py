from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsp.agent import (
    OPERAND_SIZE,
    Op,
    Opcode,
    assemble,
    disassemble,
    parse_x_expression,
    x_expression,
)
from rsp.errors import LocalProtocolError, MalformedPacket


def test_always_false_condition_matches_the_research_packets() -> None:
    # DESIGN.md / research: "Z0,ADDR,1;X3,220027" is const8 0; end
    code = assemble([Op(Opcode.const8, 0), Opcode.end])
    assert x_expression(code) == b"X3,220027"
    assert parse_x_expression(b"X3,220027") == code


def test_collect_self_and_fs_base() -> None:
    code = assemble([Op(Opcode.reg, 5), Op(Opcode.const8, 16), Opcode.trace,
                     Op(Opcode.reg, 58), Op(Opcode.setv, 2), Op(Opcode.tracev, 2), Opcode.end])
    assert code.hex() == "26000522100c26003a2d00022e000227"
    assert disassemble(code)[3] == Op(Opcode.reg, 58)


def test_printf() -> None:
    op = Op(Opcode.printf, 1, b"x=%d\n")
    assert disassemble(op.encode()) == [op]


@pytest.mark.parametrize("code", [b"\x31", b"\x26\x00", b"\x34\x01\x00\x05ab"])
def test_disassemble_errors(code: bytes) -> None:
    with pytest.raises(MalformedPacket):
        disassemble(code)


def test_assemble_errors() -> None:
    with pytest.raises(LocalProtocolError):
        assemble([Op(Opcode.const8, 256)])
    with pytest.raises(LocalProtocolError):
        assemble([Op(Opcode.add, 1)])


def _op(opcode: Opcode, data: st.DataObject) -> Op:
    if opcode == Opcode.printf:
        return Op(opcode, data.draw(st.integers(0, 255)), data.draw(st.binary(max_size=20).filter(lambda b: b"\0" not in b)))
    size = OPERAND_SIZE.get(opcode, 0)
    return Op(opcode, data.draw(st.integers(0, (1 << 8 * size) - 1)) if size else None)


@given(st.data())
def test_round_trip(data: st.DataObject) -> None:
    ops = [_op(o, data) for o in data.draw(st.lists(st.sampled_from(list(Opcode)), max_size=20))]
    code = assemble(ops)
    assert disassemble(code) == ops
    assert parse_x_expression(x_expression(code)) == code


def test_tracev_action_from_the_tracepoint_research() -> None:
    # research/gdbserver-tracepoints.md: QTDP action "X4,2e000127" = tracev 1; end
    assert disassemble(parse_x_expression(b"X4,2e000127")) == [Op(Opcode.tracev, 1), Op(Opcode.end)]
