from __future__ import annotations

import pytest

from rsp.connection import Connection, StalePacket
from rsp.errors import LocalProtocolError, TooManyRetransmits
from rsp.framing import frame
from rsp.reader import Ack, BadPacket, Interrupt, Notification, Packet


def test_good_packet_is_acked_and_returned() -> None:
    conn = Connection()
    assert conn.receive_data(b"$OK#9a") == [Packet(b"OK", b"$OK#9a")]
    assert conn.data_to_send() == b"+"
    assert conn.data_to_send() == b""


def test_bad_checksum_is_nacked_and_reported() -> None:
    conn = Connection()
    events = conn.receive_data(b"$OK#00")
    assert len(events) == 1 and isinstance(events[0], BadPacket)
    assert conn.data_to_send() == b"-"
    # the peer resends it correctly
    assert conn.receive_data(b"$OK#9a") == [Packet(b"OK", b"$OK#9a")]
    assert conn.data_to_send() == b"+"


def test_nack_retransmits_last_packet() -> None:
    conn = Connection()
    conn.send_packet(b"g")
    assert conn.data_to_send() == b"$g#67"
    assert conn.receive_data(b"-") == []
    assert conn.data_to_send() == b"$g#67"
    assert conn.receive_data(b"+") == []
    assert conn.receive_data(b"-") == []  # nothing left to resend after the ack
    assert conn.data_to_send() == b""
    assert conn.retransmits == 1


def test_too_many_nacks_raise_and_break_the_connection() -> None:
    conn = Connection()
    conn.send_packet(b"g")
    with pytest.raises(TooManyRetransmits):
        conn.receive_data(b"-" * (Connection.max_retransmits + 1))
    with pytest.raises(LocalProtocolError):
        conn.send_packet(b"g")


def test_forwarded_raw_is_retransmitted_verbatim() -> None:
    conn = Connection()
    raw = b'$T0506:0*,;#' + b"%02x" % (sum(b'T0506:0*,;') & 0xFF)
    conn.send_raw(raw)
    conn.data_to_send()
    conn.receive_data(b"-")
    assert conn.data_to_send() == raw


def test_no_ack_mode() -> None:
    conn = Connection()
    conn.set_no_ack()
    assert conn.receive_data(b"$OK#00") == [Packet(b"OK", b"$OK#00")]  # checksums unchecked
    conn.send_packet(b"g")
    conn.receive_data(b"-")
    assert conn.data_to_send() == b"$g#67"  # no '+', no retransmission


def test_interrupt_and_notification_pass_through_unacked() -> None:
    conn = Connection()
    body = b"Stop:T05"
    raw = b"%" + body + b"#%02x" % (sum(body) & 0xFF)
    assert conn.receive_data(b"\x03" + raw) == [Interrupt(), Notification(body, raw)]
    assert conn.data_to_send() == b""
    conn.send_interrupt()
    assert conn.data_to_send() == b"\x03"


def test_packet_before_the_ack_of_ours_is_stale_like_gdb() -> None:
    """QEMU 7.2 user mode sends a stop reply per thread that hit a breakpoint
    for one resume (captured: `$T05thread:p01.4bd;#9f+$<g block>` right after
    the proxy's `g`). gdb acknowledges a packet that comes instead of the ack
    of its request and ignores it; the proxy's stub side does the same, and
    decides per event, after sending what the previous event made it send."""
    conn = Connection(drop_before_ack=True)
    stale, reply = frame(b"T05thread:p01.4bd;"), frame(b"00112233")
    conn.feed(frame(b"T05thread:p01.4bc;") + stale + b"+" + reply)
    first = conn.next_event()
    assert first == Packet(b"T05thread:p01.4bc;", frame(b"T05thread:p01.4bc;"))
    conn.send_packet(b"g")  # the session's answer to the first stop goes out first
    assert conn.next_event() == StalePacket(b"T05thread:p01.4bd;", stale)
    assert conn.next_event() == Packet(b"00112233", reply)  # after the '+': the g reply
    assert conn.next_event() is None
    assert conn.stale == 1
    assert conn.data_to_send() == b"+" + frame(b"g") + b"++"  # every packet acknowledged


def test_unkept_bytes_and_the_acks_nothing_waited_for() -> None:
    """A release of a thread parked in QEMU 7.2's user-mode loop (proxy/session/pacing.py) is
    sent unkept: never resent, and a packet after it is no stale one (the thread that traps
    next may read its bytes as the ack of its report, sending the report once per byte).
    The ack a parked thread sends when it takes it is returned (bare_acks); the ack of a
    packet of ours is not."""
    conn = Connection(drop_before_ack=True, bare_acks=True)
    conn.send_unkept(frame(b"c"))
    assert conn.data_to_send() == frame(b"c") and not conn.awaits_ack()
    assert conn.receive_data(b"-") == [] and conn.data_to_send() == b""  # nothing to resend
    report = frame(b"T05thread:p01.7;")
    assert conn.receive_data(report) == [Packet(b"T05thread:p01.7;", report)]
    assert conn.receive_data(b"+") == [Ack()]  # for nothing of ours
    conn.send_packet(b"g")
    assert conn.awaits_ack()
    assert conn.receive_data(b"+") == [] and not conn.awaits_ack()
    assert Connection().receive_data(b"+") == []  # without bare_acks: never returned


def test_without_drop_before_ack_every_packet_is_returned() -> None:
    """The client side keeps every packet (a gdbserver-like stub would not drop them)."""
    conn = Connection()
    conn.send_packet(b"OK")
    events = conn.receive_data(frame(b"g"))
    assert events == [Packet(b"g", frame(b"g"))]


def test_a_lone_packet_is_one_whole_packet_the_reader_would_give_as_it_is() -> None:
    c = Connection()
    assert c.lone_packet(b"$m10,4#fd") is None  # ack mode: its '+' is owed
    c.set_no_ack()
    assert c.lone_packet(b"$m10,4#fd") == b"m10,4"
    assert c.lone_packet(b"$#00") == b""
    assert c.lone_packet(b"$m10,4#zz") == b"m10,4"  # no-ack mode judges no checksum, as the reader
    # anything else is the usual path's: two packets, an ack or interrupt around it, a
    # notification, a packet whose first '#' is not the end, a part of one
    for data in (b"$g#67$g#67", b"+$g#67", b"$g#67\x03", b"%Stop:T05#00", b"$g#6", b"$a#b#00", b"g#67", b""):
        assert c.lone_packet(data) is None, data
    c.feed(b"$m10")  # a packet's first part is held: the next bytes are not a packet alone
    assert c.lone_packet(b"$g#67") is None
    c.feed(b",4#fd")
    assert [e.body for e in iter(c.next_event, None)] == [b"m10,4"]  # type: ignore[union-attr]
    assert c.lone_packet(b"$g#67") == b"g"
    c.feed(b"$g#67")  # an event not taken yet: the order of packets is the reader's
    assert c.lone_packet(b"$g#67") is None


def test_a_lone_packet_larger_than_the_reader_takes_is_not_one() -> None:
    c = Connection(max_packet=8)
    c.set_no_ack()
    assert c.lone_packet(frame(b"m" + b"1" * 7)) == b"m" + b"1" * 7
    assert c.lone_packet(frame(b"m" + b"1" * 8)) is None
