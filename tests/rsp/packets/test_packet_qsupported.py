from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.rsp.rsp_testutil import wire

from rsp.errors import MalformedPacket
from rsp.packets.qsupported import (
    Feature,
    build_qsupported_reply,
    build_qsupported_request,
    get,
    packet_size,
    parse_qsupported_reply,
    parse_qsupported_request,
    with_feature,
    without,
)


def test_gdb_request(captured: dict[str, Any]) -> None:
    body = wire(captured["gdb_qsupported_request"])
    features = parse_qsupported_request(body)
    assert get(features, "xmlRegisters") == Feature("xmlRegisters", "i386")
    assert get(features, "swbreak") == Feature("swbreak", "+")
    assert build_qsupported_request(features) == body
    # what the proxy sends gdbserver 13.1 (DESIGN §3 rule 11)
    stripped = build_qsupported_request(without(features, "xmlRegisters"))
    assert stripped == wire(captured["gdb_qsupported_request_noxml"])


def test_lldb_request_has_commas_in_value(captured: dict[str, Any]) -> None:
    body = wire(captured["lldb_qsupported_request"])
    features = parse_qsupported_request(body)
    assert features[0] == Feature("xmlRegisters", "i386,arm,mips,arc")
    assert get(features, "swbreak") is None  # lldb never asks for swbreak
    assert build_qsupported_request(features) == body


def test_gdbserver_reply(captured: dict[str, Any]) -> None:
    body = wire(captured["gdbserver_qsupported_reply"])
    features = parse_qsupported_reply(body)
    assert packet_size(features) == 0x47FF
    assert get(features, "qXfer:features:read") == Feature("qXfer:features:read", "+")
    assert get(features, "ConditionalBreakpoints") is not None
    assert build_qsupported_reply(features) == body
    edited = without(without(features, "ConditionalBreakpoints"), "BreakpointCommands")
    edited = with_feature(edited, Feature("qXfer:osdata:read", "+"))
    edited = with_feature(edited, Feature("qXfer:asyncrsp:read", "+"))
    assert get(edited, "ConditionalBreakpoints") is None
    assert edited[-1].name == "qXfer:asyncrsp:read"
    assert len(edited) == len(features) - 1


def test_bare_request_and_trailing_separator() -> None:
    assert parse_qsupported_request(b"qSupported") == []
    assert parse_qsupported_reply(b"PacketSize=1000;") == [Feature("PacketSize", "1000")]


@pytest.mark.parametrize("body", [b"qSupportedX", b"qSupported:bare", b"qSupported:=x"])
def test_malformed(body: bytes) -> None:
    with pytest.raises(MalformedPacket):
        parse_qsupported_request(body)


names = st.text(st.sampled_from("abcXYZ:_-."), min_size=1, max_size=12).filter(
    lambda s: s[-1] not in "+-?"
)
values = st.one_of(st.sampled_from(["+", "-", "?"]), st.text(st.sampled_from("0123abc,=i"), max_size=10))


@given(st.lists(st.builds(Feature, names, values), max_size=8))
def test_round_trip(features: list[Feature]) -> None:
    assert parse_qsupported_request(build_qsupported_request(features)) == features
    body = build_qsupported_reply(features)
    assert parse_qsupported_reply(body) == features
