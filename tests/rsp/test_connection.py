from __future__ import annotations

import pytest

from rsp.connection import Connection
from rsp.errors import LocalProtocolError, TooManyRetransmits
from rsp.reader import BadPacket, Interrupt, Notification, Packet


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
