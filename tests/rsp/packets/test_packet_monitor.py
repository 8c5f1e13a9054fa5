from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.rsp.rsp_testutil import wire

from rsp.errors import LocalProtocolError, MalformedPacket
from rsp.framing import hex_decode
from rsp.packets.monitor import (
    RRCmd,
    build_console_output,
    build_qrcmd,
    parse_qrcmd,
    parse_rrcmd,
)
from rsp.packets.stop import parse_stop_reply


def test_captured_monitor_help(captured: dict[str, Any]) -> None:
    assert parse_qrcmd(wire(captured["qrcmd_help"])) == "help"
    text = b"".join(hex_decode(wire(o)[1:]) for o in captured["qrcmd_help_output"])
    assert text.startswith(b"The following monitor commands are supported:")


def test_console_output_is_an_o_stop() -> None:
    body = build_console_output("tasks: 3\n")
    assert parse_stop_reply(body).output == b"tasks: 3\n"
    with pytest.raises(LocalProtocolError):
        build_console_output("")


@given(st.text(max_size=50))
def test_qrcmd_round_trip(text: str) -> None:
    assert parse_qrcmd(build_qrcmd(text)) == text


def test_rr_old_format() -> None:
    # rr before 2024: every field hex (GdbCommandHandler.cc, gdb_escape)
    cmd = parse_rrcmd(b"qRRCmd:" + b"checkpoint".hex().encode() + b":" + b"main.c:3".hex().encode())
    assert cmd == RRCmd("checkpoint", None, ("main.c:3",)) and cmd.legacy
    assert parse_rrcmd(cmd.build()) == cmd


def test_rr_new_format() -> None:
    # rr 2024+: name in clear, decimal tid of gdb's selected thread (-1: none)
    assert parse_rrcmd(b"qRRCmd:when:-1") == RRCmd("when", -1)
    cmd = parse_rrcmd(b"qRRCmd:seek-ticks:4242:" + b"1000".hex().encode())
    assert cmd == RRCmd("seek-ticks", 4242, ("1000",))
    assert cmd.build() == b"qRRCmd:seek-ticks:4242:" + b"1000".hex().encode()


@pytest.mark.parametrize("body", [b"qRRCmd:", b"qRRCmd:when", b"qRRCmd:when:x1", b"qRcmd,zz", b"qRRCmd:when:1:zz"])
def test_malformed(body: bytes) -> None:
    with pytest.raises(MalformedPacket):
        parse_rrcmd(body) if body.startswith(b"qRR") else parse_qrcmd(body)


names = st.sampled_from(["when", "when-ticks", "when-tid", "checkpoint", "delete checkpoint", "elapsed-time"])


@given(names, st.one_of(st.none(), st.integers(-1, 2**31)), st.lists(st.text(max_size=8), max_size=3))
def test_rr_round_trip(name: str, thread: int | None, args: list[str]) -> None:
    cmd = RRCmd(name, thread, tuple(args))
    assert parse_rrcmd(cmd.build()) == cmd
