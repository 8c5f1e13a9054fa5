"""One side of an RSP link: acknowledgements, no-ack mode, retransmission.

Theory of operation
-------------------
`receive_data` feeds the `PacketReader` and handles the link layer itself:

* a good `Packet` is acknowledged with ``+`` (unless in no-ack mode) and
  returned;
* a `BadPacket` (checksum mismatch, oversized) is answered with ``-`` so the
  peer sends it again (unless in no-ack mode) and returned, for logging;
* an `Ack` forgets the last packet we sent; a `Nack` sends it again, at most
  `max_retransmits` times in a row, then `TooManyRetransmits` is raised and
  the connection refuses further use. Neither is returned;
* `Interrupt` and `Notification` are returned (notifications are never
  acknowledged: the client answers them with ``vStopped``);
* with ``drop_before_ack`` (the proxy's side towards a stub), a packet that
  arrives while the last packet we sent still waits for its ``+`` is stale:
  it is acknowledged and returned as a `StalePacket`, never as a `Packet`.
  That is gdb's own rule (remote.c putpkt_binary: "Packet instead of Ack,
  ignoring it"), and QEMU 7.2's user-mode gdbstub depends on it: every
  thread that hits a breakpoint sends its own stop reply for one resume, and
  the extra ones arrive while the client waits for the ack of its next
  request. Taking them as replies shifts every later reply by one.
* with ``bare_acks`` (the same side), an `Ack` that comes while nothing of
  ours waits for one is returned: QEMU 7.2's user mode acknowledges a
  packet that a thread parked in its loop read and took (a release the
  proxy sent as bytes of their own, `send_unkept`), and that ack is the
  only sign the release found a thread.

Outgoing bytes accumulate until `data_to_send` takes them, h11-style: the
caller owns the socket. In no-ack mode (after ``QStartNoAckMode`` was
answered ``OK``, which the caller observes and reports with `set_no_ack`)
nothing is acknowledged, nothing is kept for retransmission, and the
reader stops verifying checksums (gdb does not check them either then).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rsp.errors import LocalProtocolError, TooManyRetransmits
from rsp.framing import frame
from rsp.reader import Ack, BadPacket, Event, Nack, Packet, PacketReader

__all__ = ["Connection", "StalePacket"]


@dataclass(frozen=True, slots=True)
class StalePacket:
    """A packet received instead of the ack of ours: acknowledged, ignored."""

    body: bytes
    raw: bytes


class Connection:
    """Link-layer state of one end of an RSP connection."""

    max_retransmits = 8

    def __init__(self, *, max_packet: int = 1 << 20, drop_before_ack: bool = False,
                 bare_acks: bool = False) -> None:
        self.reader = PacketReader(max_packet=max_packet)
        self.drop_before_ack = drop_before_ack
        self.bare_acks = bare_acks
        self.stale = 0  # packets dropped by drop_before_ack, for statistics
        self.stale_since_send = 0  # ... since our last packet went
        self._pending: deque[Event] = deque()
        self.no_ack = False
        self._out = bytearray()
        self._last_sent: bytes | None = None
        self._nacks = 0
        self._broken: Exception | None = None
        self.retransmits = 0  # total, for statistics

    def set_no_ack(self) -> None:
        """Stop acknowledging and retransmitting, from now on."""
        self.no_ack = True
        self.reader.check_checksums = False
        self._last_sent = None

    def receive_data(self, data: bytes) -> list[Event | StalePacket]:
        """Feed bytes from the peer; return the events the caller must see."""
        self.feed(data)
        out: list[Event | StalePacket] = []
        while (event := self.next_event()) is not None:
            out.append(event)
        return out

    def feed(self, data: bytes) -> None:
        """Feed bytes from the peer; take the events one at a time with
        `next_event`, sending in between: whether a packet is stale
        (``drop_before_ack``) depends on what was sent before it is taken,
        as it does for gdb, which reads the next packet only once it has
        sent its next request."""
        self._check_usable()
        self._pending.extend(self.reader.feed(data))

    def lone_packet(self, data: bytes) -> bytes | None:
        """The body of `data` when it is exactly one whole ``$body#cs`` packet
        that `feed` would hand over as it is (no-ack mode, nothing held from
        earlier bytes or events, the connection usable, the packet not oversized);
        None otherwise. Nothing is consumed: the caller passes `data` on verbatim,
        or feeds it as usual. The body ends at the first ``#``, as the reader's;
        the checksum is not judged (no-ack mode takes any, as the reader does)."""
        n = len(data)
        if (n < 4 or data[0] != 0x24 or data.find(b"#", 1) != n - 3 or not self.no_ack or self._pending
                or self._broken is not None or n - 4 > self.reader.max_packet or not self.reader.idle):
            return None
        return data[1:-3]

    def next_event(self) -> Event | StalePacket | None:
        """The next event the caller must see, or None when all are taken."""
        while self._pending:
            event = self._pending.popleft()
            if self.no_ack:
                if not isinstance(event, (Ack, Nack)):
                    return event
            elif isinstance(event, Packet):
                self._out += b"+"
                if self.drop_before_ack and self._last_sent is not None:
                    self.stale += 1
                    self.stale_since_send += 1
                    return StalePacket(event.body, event.raw)
                return event
            elif isinstance(event, Ack):
                if self._last_sent is None and self.bare_acks:
                    return event
                self._last_sent = None
                self._nacks = 0
            elif isinstance(event, Nack):
                self._retransmit()
            else:
                if isinstance(event, BadPacket):
                    self._out += b"-"
                return event
        return None

    def _retransmit(self) -> None:
        if self._last_sent is None:
            return  # a '-' for nothing we remember (e.g. before no-ack): ignore
        self._nacks += 1
        if self._nacks > self.max_retransmits:
            self._broken = TooManyRetransmits(self._last_sent, self._nacks)
            raise self._broken
        self.retransmits += 1
        self._out += self._last_sent

    def send_packet(self, body: bytes) -> None:
        """Frame `body` and queue it."""
        self.send_raw(frame(body))

    def send_raw(self, raw: bytes) -> None:
        """Queue already-framed bytes verbatim (forwarding a `Packet.raw`)."""
        self._check_usable()
        self._out += raw
        if not self.no_ack:
            self._last_sent = raw
            self._nacks = 0
            self.stale_since_send = 0

    def lost_to_stale(self) -> bool:
        """Our last packet is not acknowledged and the peer sent packets since: a peer that
        reads one byte after each of its packets and resends unless it is ``+`` (QEMU 7.2's
        user-mode gdbstub, a thread whose report's ack another thread read) ate it byte by
        byte, resending its report for each. gdb resends a packet not acknowledged within
        its remotetimeout; the caller resends it (``retransmit``) once the peer is quiet."""
        return self._last_sent is not None and self.stale_since_send > 0

    def retransmit(self) -> None:
        """Queue our last, unacknowledged packet again."""
        if self._last_sent is not None:
            self.retransmits += 1
            self.stale_since_send = 0
            self._out += self._last_sent

    def send_unkept(self, raw: bytes) -> None:
        """Queue framed bytes that may never be acknowledged: not kept for retransmission,
        and they do not make the next packet from the peer stale."""
        self._check_usable()
        self._out += raw

    def awaits_ack(self) -> bool:
        """A packet of ours waits for the peer's ``+``."""
        return self._last_sent is not None

    def send_interrupt(self) -> None:
        """Queue the interrupt byte (never acknowledged, never resent)."""
        self._check_usable()
        self._out += b"\x03"

    def has_data_to_send(self) -> bool:
        return bool(self._out)

    def data_to_send(self) -> bytes:
        """Take everything queued so far."""
        data = bytes(self._out)
        self._out.clear()
        return data

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise LocalProtocolError(f"connection is unusable after: {self._broken}")
