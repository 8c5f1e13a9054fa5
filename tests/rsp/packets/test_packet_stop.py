from __future__ import annotations

from typing import Any

import pytest
from tests.rsp.rsp_testutil import wire
from hypothesis import given
from hypothesis import strategies as st

from rsp.errors import MalformedPacket
from rsp.packets.stop import (
    StopReply,
    is_console_output,
    is_stop_reply,
    parse_stop_reply,
)
from rsp.threads import ThreadId


def test_captured_swbreak_stop(captured: dict[str, Any]) -> None:
    # gdbserver 13.1 run-length encodes the expedited registers.
    reply = parse_stop_reply(wire(captured["stop_swbreak_rle"]))
    assert reply.kind == "T" and reply.signal == 5
    assert reply.reason == "swbreak" and reply.is_breakpoint_trap
    assert reply.thread == ThreadId(0x4211, 0x4211)
    assert reply.pc(16) == 0x7FFFF7FCC060
    assert reply.register_value(7) == 0x7FFFFFFFE468  # rsp
    assert reply.core == 1
    assert set(reply.registers) == {6, 7, 16}


def test_captured_step_stop_has_no_reason(captured: dict[str, Any]) -> None:
    reply = parse_stop_reply(wire(captured["stop_step"]))
    assert reply.reason is None and not reply.is_breakpoint_trap


def test_captured_exit_uses_short_code(captured: dict[str, Any]) -> None:
    body = wire(captured["stop_exit_multiprocess"])
    assert body == b"W0;process:4211"  # %x, not two digits
    reply = parse_stop_reply(body)
    assert (reply.kind, reply.exit_code, reply.pid) == ("W", 0, 0x4211)
    assert reply.build() == body and is_stop_reply(body)


@pytest.mark.parametrize(
    "body",
    [
        b"S05",
        b"T0506:0000000000000000;07:20e8ffffff7f0000;thread:p1.2;core:0;",
        b"T05thread:1a;reason:breakpoint;threads:1a,1b;",
        b"T05watch:7fff0010;thread:3;",
        b"T05swbreak:;thread:p1.1;",
        b"T11thread:p1.2",
        b"W00",
        b"X09;process:10",
        b"w00;p1.2",
        b"N",
        b"O48656c6c6f0a",
    ],
)
def test_round_trip_exact(body: bytes) -> None:
    assert parse_stop_reply(body).build() == body


def test_lldb_breakpoint_reason() -> None:
    reply = parse_stop_reply(b"T05thread:1a;reason:breakpoint;")
    assert reply.reason == "breakpoint" and reply.is_breakpoint_trap


def test_watch_reason_value() -> None:
    reply = parse_stop_reply(b"T05watch:7fff0010;thread:3;")
    assert (reply.reason, reply.reason_value) == ("watch", b"7fff0010")
    assert not reply.is_breakpoint_trap


def test_unavailable_register_has_no_value() -> None:
    assert parse_stop_reply(b"T0510:xxxxxxxxxxxxxxxx;").pc(16) is None


def test_ok_is_not_output() -> None:
    assert not is_console_output(b"OK") and is_console_output(b"O41")
    assert not is_stop_reply(b"OK") and not is_stop_reply(b"O41")
    with pytest.raises(MalformedPacket):
        parse_stop_reply(b"OK")


@pytest.mark.parametrize("body", [b"", b"T5", b"Tzz", b"T05abc", b"S05x", b"W", b"Wq", b"E01", b"X01;pid:3"])
def test_malformed(body: bytes) -> None:
    with pytest.raises(MalformedPacket):
        parse_stop_reply(body)


hexbytes = st.binary(min_size=1, max_size=16).map(lambda b: b.hex().encode())
keys = st.one_of(
    st.integers(min_value=0, max_value=200).map(lambda n: b"%02x" % n),
    st.sampled_from([b"thread", b"core", b"swbreak", b"watch", b"library", b"create"]),
)


@given(
    st.integers(min_value=0, max_value=255),
    st.lists(st.tuples(keys, hexbytes), max_size=8, unique_by=lambda kv: kv[0]),
    st.booleans(),
)
def test_t_reply_round_trip(signal: int, pairs: list[tuple[bytes, bytes]], trailing: bool) -> None:
    pairs = [(k, b"p1.2" if k == b"thread" else v) for k, v in pairs]
    reply = StopReply("T", signal=signal, other=tuple(pairs), trailing_semicolon=trailing)
    body = reply.build()
    again = parse_stop_reply(body)
    assert again.build() == body
    assert again.other == tuple(pairs)


@given(st.sampled_from("WX"), st.integers(0, 255), st.one_of(st.none(), st.integers(1, 2**22)))
def test_exit_round_trip(kind: str, code: int, pid: int | None) -> None:
    reply = StopReply(kind, exit_code=code if kind == "W" else None,
                      signal=code if kind == "X" else None, pid=pid)
    assert parse_stop_reply(reply.build()) == reply
