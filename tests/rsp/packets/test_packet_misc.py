"""thread (H), replies (OK/E/empty) and the request table (rsp.packets.requests)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.rsp.rsp_testutil import wire

from rsp.errors import MalformedPacket
from rsp.packets.breakpoints import BreakpointPacket
from rsp.packets.monitor import RRCmd
from rsp.packets.requests import TABLE, Kind, MonitorCommand, QSupported, Raw, classify, kind_of
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


def test_table_rows_do_not_shadow_each_other() -> None:
    texts = [text for text, *_ in TABLE]
    assert len(set(texts)) == len(texts)
    for a, a_exact, *_ in TABLE:
        for b, *_ in TABLE:
            # a prefix row matching another row's text would take its packets
            assert a == b or a_exact or not b.startswith(a), f"{a!r} shadows {b!r}"


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"m401000,8", Kind.READ), (b"p10", Kind.READ), (b"g", Kind.READ),
        (b"M401000,1:cc", Kind.WRITE), (b"Gabcd", Kind.WRITE),
        (b"vCont;s:p1.1;c", Kind.RESUME), (b"c", Kind.RESUME), (b"C05", Kind.RESUME), (b"bs", Kind.RESUME),
        (b"vCont?", Kind.VCONT_QUERY), (b"vContX", None), (b"bx", None),
        (b"Z0,401000,1", Kind.BREAKPOINT), (b"z1,401000,1", Kind.BREAKPOINT),
        (b"Z2,601000,8", Kind.WATCHPOINT), (b"Z9,1,1", None),
        (b"Hgp1.1", Kind.SELECT_G), (b"Hc-1", Kind.SELECT_C),
        (b"?", Kind.STOP_QUERY), (b"?x", None), (b"vStopped", Kind.VSTOPPED),
        (b"qSupported:swbreak+", Kind.QSUPPORTED), (b"QNonStop:1", Kind.NON_STOP),
        (b"QStartNoAckMode", Kind.NO_ACK), (b"!", Kind.EXTENDED),
        (b"qRcmd,6173796e63", Kind.MONITOR), (b"qRRCmd:when:-1", Kind.RR_COMMAND),
        (b"qXfer:features:read:target.xml:0,fff", Kind.QXFER),
        (b"D;1a2b", Kind.LEAVE), (b"k", Kind.LEAVE), (b"vKill;1a2b", Kind.LEAVE),
        (b"vRun;2f62696e", Kind.NEW_PROCESS), (b"vAttach;1a2b", Kind.NEW_PROCESS), (b"R00", Kind.NEW_PROCESS),
        (b"qTStatus", None), (b"qSymbol::", None), (b"T1", None), (b"", None),
    ],
)
def test_kind_of(body: bytes, kind: Kind | None) -> None:
    assert kind_of(body) is kind


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
