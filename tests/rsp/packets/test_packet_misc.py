"""thread (H), replies (OK/E/empty) and the classify table."""

from __future__ import annotations

from typing import Any

import pytest
from tests.rsp.rsp_testutil import wire

from rsp.errors import MalformedPacket
from rsp.packets.breakpoints import BreakpointPacket
from rsp.packets.monitor import RRCmd
from rsp.packets.raw import TABLE, MonitorCommand, QSupported, Raw, classify
from rsp.packets.replies import ErrorReply, is_empty, is_error_reply, is_ok, parse_error_reply
from rsp.packets.resume import Resume
from rsp.packets.thread import SetThread, parse_set_thread
from rsp.threads import ALL, ThreadId


def test_set_thread(captured: dict[str, Any]) -> None:
    hg = parse_set_thread(wire(captured["hg"]))
    assert hg == SetThread("g", ThreadId(0, 0)) and hg.build() == b"Hgp0.0"
    hc = parse_set_thread(wire(captured["hc"]))
    assert hc == SetThread("c", ThreadId(None, ALL)) and hc.build() == b"Hc-1"
    with pytest.raises(MalformedPacket):
        parse_set_thread(b"Hx1")


def test_replies() -> None:
    assert is_ok(b"OK") and is_empty(b"") and not is_ok(b"")
    assert is_error_reply(b"E01") and is_error_reply(b"E.bad thing")
    assert not is_error_reply(b"E0") and not is_error_reply(b"OK")
    assert parse_error_reply(b"E0a") == ErrorReply(10, None)
    assert parse_error_reply(b"E.no") == ErrorReply(None, "no")
    assert ErrorReply(10, None).build() == b"E0a"


def test_table_prefixes_do_not_shadow_each_other() -> None:
    prefixes = [p for p, _ in TABLE]
    assert len(set(prefixes)) == len(prefixes)
    for a in prefixes:
        for b in prefixes:
            assert a == b or not b.startswith(a), f"{a!r} shadows {b!r}"


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"vCont;c:p1.-1", Resume),
        (b"c", Resume),
        (b"bs", Resume),
        (b"Z0,401000,1", BreakpointPacket),
        (b"qSupported:swbreak+", QSupported),
        (b"qRcmd,6173796e63", MonitorCommand),
        (b"qRRCmd:when:-1", RRCmd),
        (b"vCont?", Raw),
        (b"qTStatus", Raw),
        (b"", Raw),
        (b"cfoo", Raw),  # known prefix, bad syntax: passed through
    ],
)
def test_classify(body: bytes, kind: type) -> None:
    assert isinstance(classify(body), kind)


def test_classify_strict_raises() -> None:
    with pytest.raises(MalformedPacket):
        classify(b"cfoo", strict=True)


def test_classify_round_trips_captured_client_packets(captured: dict[str, Any]) -> None:
    count = 0
    for direction, text in captured["session_bodies"]:
        if direction != "c2s":
            continue
        body = wire(text)
        packet = classify(body, strict=True)
        if not isinstance(packet, Raw):
            count += 1
        assert packet.build() == body  # type: ignore[attr-defined]
    assert count > 50
