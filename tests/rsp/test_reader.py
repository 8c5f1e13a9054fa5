"""PacketReader: a table of streams, each run whole, one byte at a time,
and at random splits (hypothesis); plus a real captured session."""

from __future__ import annotations

from typing import Any

import pytest
from tests.rsp.rsp_testutil import framed, wire
from hypothesis import given, settings
from hypothesis import strategies as st

from rsp.errors import ChecksumMismatch, PacketTooLarge
from rsp.framing import escape_binary, frame
from rsp.reader import (
    Ack,
    BadPacket,
    Event,
    Interrupt,
    Nack,
    Notification,
    Packet,
    PacketReader,
)

OK = Packet(b"OK", b"$OK#9a")
BIN = escape_binary(b"#12 \x00$}*")

CASES: list[tuple[str, bytes, list[Event], int]] = [
    ("ack nack interrupt", b"+-\x03", [Ack(), Nack(), Interrupt()], 0),
    ("one packet", b"$OK#9a", [OK], 0),
    ("ack then packet", b"+$OK#9a", [Ack(), OK], 0),
    ("two packets", b"$OK#9a$OK#9a", [OK, OK], 0),
    ("empty body", b"$#00", [Packet(b"", b"$#00")], 0),
    ("uppercase checksum", b"$m0,1#FA", [Packet(b"m0,1", b"$m0,1#FA")], 0),
    (
        "notification",
        b"%Stop:T05#" + b"%02x" % (sum(b"Stop:T05") & 0xFF),
        [Notification(b"Stop:T05", b"%Stop:T05#" + b"%02x" % (sum(b"Stop:T05") & 0xFF))],
        0,
    ),
    ("junk between packets", b"xyz$OK#9a\r\n+", [OK, Ack()], 5),
    ("interrupt between packets", b"$OK#9a\x03$OK#9a", [OK, Interrupt(), OK], 0),
    (
        "bad checksum",
        b"$OK#00+",
        [BadPacket(b"$OK#00", ChecksumMismatch(b"$OK#00", 0, 0x9A)), Ack()],
        0,
    ),
    (
        "checksum not hex",
        b"$OK#zz$OK#9a",
        [BadPacket(b"$OK#zz", ChecksumMismatch(b"$OK#zz", None, 0x9A)), OK],
        0,
    ),
    ("escaped binary body", frame(b"l" + BIN), [Packet(b"l" + BIN, frame(b"l" + BIN))], 0),
    ("rle body kept as sent", framed(b"0* "), [Packet(b"0* ", framed(b"0* "))], 0),
    ("incomplete packet waits", b"$OK#9", [], 0),
]


def feed_whole(stream: bytes, **kw: Any) -> tuple[list[Event], PacketReader]:
    reader = PacketReader(**kw)
    return reader.feed(stream), reader


def feed_bytewise(stream: bytes, **kw: Any) -> tuple[list[Event], PacketReader]:
    reader = PacketReader(**kw)
    events: list[Event] = []
    for i in range(len(stream)):
        events += reader.feed(stream[i : i + 1])
    return events, reader


@pytest.mark.parametrize("feeder", [feed_whole, feed_bytewise])
@pytest.mark.parametrize(("name", "stream", "expected", "junk"), CASES, ids=[c[0] for c in CASES])
def test_table(feeder: Any, name: str, stream: bytes, expected: list[Event], junk: int) -> None:
    events, reader = feeder(stream)
    assert events == expected
    assert reader.junk_bytes == junk


def _all_streams() -> bytes:
    return b"".join(c[1] for c in CASES[:-1])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(_all_streams())), max_size=20))
def test_random_splits_give_same_events(cuts: list[int]) -> None:
    stream = _all_streams()
    expected, _ = feed_whole(stream)
    reader = PacketReader()
    events: list[Event] = []
    last = 0
    for cut in sorted(cuts) + [len(stream)]:
        events += reader.feed(stream[last:cut])
        last = cut
    assert events == expected


def test_oversized_packet_resyncs() -> None:
    stream = b"$" + b"x" * 20 + b"#00+$OK#9a"
    for events, _ in (feed_whole(stream, max_packet=8), feed_bytewise(stream, max_packet=8)):
        assert events == [BadPacket(b"$" + b"x" * 8, PacketTooLarge(20, 8)), Ack(), OK]


def test_oversized_packet_abandoned_for_a_new_one() -> None:
    # A sender that gives up mid-packet and starts a new '$': resync there.
    stream = b"$" + b"y" * 30 + b"$OK#9a"
    for events, _ in (feed_whole(stream, max_packet=8), feed_bytewise(stream, max_packet=8)):
        assert events == [BadPacket(b"$" + b"y" * 8, PacketTooLarge(30, 8)), OK]


def test_oversized_packet_is_not_buffered() -> None:
    reader = PacketReader(max_packet=1000)
    reader.feed(b"$" + b"z" * 5000)
    assert len(reader._tail) == 0 and reader._open is None  # noqa: SLF001


def test_packet_at_limit_is_accepted() -> None:
    body = b"a" * 8
    assert feed_bytewise(frame(body), max_packet=8)[0] == [Packet(body, frame(body))]


def test_checksums_off_accepts_anything() -> None:
    events, _ = feed_whole(b"$OK#00", check_checksums=False)
    assert events == [Packet(b"OK", b"$OK#00")]


def test_large_packet_in_many_chunks() -> None:
    body = b"ab" * 300_000
    raw = frame(body)
    reader = PacketReader()
    events: list[Event] = []
    for i in range(0, len(raw), 4096):
        events += reader.feed(raw[i : i + 4096])
    assert events == [Packet(body, raw)]


def _session_stream(captured: dict[str, Any], direction: str) -> tuple[bytes, list[bytes]]:
    bodies = [wire(b) for d, b in captured["session_bodies"] if d == direction and b != "\x03"]
    return b"".join(framed(b) + b"+" for b in bodies), bodies


@pytest.mark.parametrize("direction", ["c2s", "s2c"])
def test_captured_gdb_gdbserver_session(captured: dict[str, Any], direction: str) -> None:
    stream, bodies = _session_stream(captured, direction)
    for events, reader in (feed_whole(stream), feed_bytewise(stream)):
        assert [e.body for e in events if isinstance(e, Packet)] == bodies
        assert reader.junk_bytes == 0
