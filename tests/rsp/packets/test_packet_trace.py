from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsp.agent import Op, Opcode, assemble, x_expression
from rsp.errors import LocalProtocolError, MalformedPacket, StubError
from rsp.packets.trace import (
    NOT_RUN_STATUS,
    StateVariable,
    Tracepoint,
    TraceStatus,
    build_qtbuffer_read,
    build_qtbuffer_size,
    build_qtframe,
    is_trace_packet,
    parse_qtbuffer_reply,
    parse_qtdp,
    parse_qtdv,
    parse_qtstatus_reply,
    parse_qtv_reply,
    parse_tsv_list_entry,
    split_actions,
)


def test_two_packets_per_tracepoint_as_in_the_research() -> None:
    # research rule 3: header with '-', then ONE action packet with all
    # actions concatenated and no trailing '-'
    tp = Tracepoint(1, 0x401126, actions=(b"R1", b"X4,2e000127"))
    assert tp.packets() == (b"QTDP:1:401126:E:0:0-", b"QTDP:-1:401126:R1X4,2e000127")


def test_tracepoint_without_actions_is_one_packet() -> None:
    assert Tracepoint(2, 0x10, enabled=False).packets() == (b"QTDP:2:10:D:0:0",)


def test_condition() -> None:
    cond = assemble([Op(Opcode.const8, 0), Opcode.end])
    (head,) = Tracepoint(3, 0x10, condition=cond).packets()
    assert head == b"QTDP:3:10:E:0:0:X3,220027"
    assert parse_qtdp(head).condition == cond


@pytest.mark.parametrize("number", [0, 0x8000, 0x10001])
def test_numbers_outside_16_bits_are_refused(number: int) -> None:
    # 0 writes frames that look like the end of the buffer; >= 0x8000 is truncated
    with pytest.raises(LocalProtocolError):
        Tracepoint(number, 0x10, actions=(b"R1",)).packets()


def test_gdb_style_action_packets_parse() -> None:
    p = parse_qtdp(b"QTDP:-1:401126:X4,2e000127-")
    assert p.number == 1 and p.more and p.actions == (b"X4,2e000127",)
    with pytest.raises(MalformedPacket):
        parse_qtdp(b"QTDP:-1:401126")
    with pytest.raises(MalformedPacket):
        split_actions(b"X5,2e000127")
    with pytest.raises(MalformedPacket):
        split_actions(b"Q12")


_codes = st.binary(min_size=1, max_size=40).map(x_expression)
_actions = st.lists(st.one_of(_codes, st.integers(1, 2**64 - 1).map(lambda m: b"R%x" % m)),
                    min_size=1, max_size=5)


def test_fast_tracepoint_header() -> None:
    """``:F<len>`` before the condition, as gdb sends it for `ftrace`
    (gdbserver cmd_qtdp reads the optional fields in any order)."""
    cond = assemble([Op(Opcode.const8, 1), Opcode.end])
    head, _ = Tracepoint(4, 0x401186, (b"X4,2e000127",), fast=5, condition=cond).packets()
    assert head == b"QTDP:4:401186:E:0:0:F5:X3,220127-"
    assert (parse_qtdp(head).fast, parse_qtdp(head).condition) == (5, cond)


@given(st.integers(1, 0x7FFF), st.integers(0, 2**64 - 1), _actions, st.booleans(),
       st.integers(0, 255), st.integers(0, 255), st.none() | st.binary(min_size=1, max_size=20),
       st.none() | st.integers(5, 15))
def test_qtdp_round_trip(num: int, addr: int, actions: list[bytes], enabled: bool, step: int,
                         passes: int, cond: bytes | None, fast: int | None) -> None:
    tp = Tracepoint(num, addr, tuple(actions), enabled, step, passes, cond, fast)
    head, acts = tp.packets()
    h = parse_qtdp(head)
    a = parse_qtdp(acts)
    assert (h.number, h.addr, h.more, h.enabled, h.step, h.pass_count, h.condition, h.fast) == (
        num, addr, True, enabled, step, passes, cond, fast)
    assert (a.number, a.addr, a.more, a.actions) == (num, addr, False, tuple(actions))


@given(st.integers(1, 0xFFFF), st.integers(-(2**63), 2**63 - 1), st.booleans(),
       st.text(max_size=12))
def test_qtdv_round_trip(num: int, value: int, builtin: bool, name: str) -> None:
    v = StateVariable(num, value, builtin, name)
    assert parse_qtdv(v.build()) == v


def test_tsv_list_entry_of_the_builtin_timestamp() -> None:
    assert parse_tsv_list_entry(b"1:0:1:74726163655f74696d657374616d70") == StateVariable(
        1, 0, True, "trace_timestamp")


def test_status_replies_seen_on_gdbserver_13() -> None:
    s = parse_qtstatus_reply(NOT_RUN_STATUS)
    assert not s.running and s.stop_reason == "tnotrun" and s.frames == 0 and s.size == 0x500000
    full = parse_qtstatus_reply(b"T0;tfull:0;tframes:5;tcreated:5;tfree:a;tsize:c8;circular:0;"
                                b"disconn:0;starttime:0;stoptime:5f5e100;username:;notes::")
    assert full.stop_reason == "tfull" and full.frames == 5 and full.free == 10 and full.lost == 0
    circ = parse_qtstatus_reply(b"T1;tnotrun:0;tframes:5;tcreated:64;tfree:0;tsize:c8;circular:1")
    assert circ.running and circ.circular and circ.lost == 0x64 - 5
    stop = parse_qtstatus_reply(b"T0;tstop:6869:0;tframes:3")
    assert stop.stop_reason == "tstop" and stop.stop_detail == "hi"
    with pytest.raises(MalformedPacket):
        parse_qtstatus_reply(b"X1")
    with pytest.raises(StubError):
        parse_qtstatus_reply(b"E01")


@given(st.booleans(), st.sampled_from(["tnotrun", "tstop", "tfull", None]), st.integers(0, 2**32),
       st.integers(0, 2**32), st.booleans(), st.none() | st.integers(0, 2**60))
def test_status_round_trip(running: bool, reason: str | None, frames: int, created: int,
                           circular: bool, start: int | None) -> None:
    detail = "" if reason in ("tstop", None) else "0"
    s = TraceStatus(running, reason, detail, frames, created, 7, 9, circular, False, start, None)
    assert parse_qtstatus_reply(s.build()) == s


def test_buffer_packets() -> None:
    assert build_qtbuffer_size(0x10000) == b"QTBuffer:size:10000"
    assert build_qtbuffer_size(-1) == b"QTBuffer:size:-1"
    for bad in (0, 0x80000000):  # gdbserver 13.1 misbehaves at >= 2**31
        with pytest.raises(LocalProtocolError):
            build_qtbuffer_size(bad)
    assert build_qtbuffer_read(0x2400) == b"qTBuffer:2400,23f8"
    assert parse_qtbuffer_reply(b"l") is None
    assert parse_qtbuffer_reply(b"0100") == b"\x01\x00"
    with pytest.raises(StubError):
        parse_qtbuffer_reply(b"E01")
    # -1 selects frame 0 in gdbserver 13.1: leaving tfind mode is ffffffff
    assert build_qtframe(None) == b"QTFrame:ffffffff"
    assert build_qtframe(3) == b"QTFrame:3"


def test_qtv() -> None:
    assert parse_qtv_reply(b"V5f") == 0x5F
    assert parse_qtv_reply(b"Vffffffffffffffff") == -1
    assert parse_qtv_reply(b"U") is None


@pytest.mark.parametrize("body,yes", [
    (b"qTStatus", True), (b"QTinit", True), (b"qTfP", True), (b"QTFrame:0", True),
    (b"qXfer:traceframe-info:read::0,fff", True), (b"qTBuffer:0,10", True),
    (b"qThreadExtraInfo,1", False), (b"qfThreadInfo", False), (b"qXfer:features:read:a:0,1", False)])
def test_is_trace_packet(body: bytes, yes: bool) -> None:
    assert is_trace_packet(body) is yes
