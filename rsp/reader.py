"""Turn a byte stream into protocol events.

Theory of operation
-------------------
The stream is a sequence of:

* ``+`` / ``-``: acknowledgement of the last packet (absent in no-ack mode);
* ``\\x03``: an interrupt request (client to stub only);
* ``$body#cs`` packets and ``%body#cs`` notifications.

Anything else between packets is junk: it is skipped and counted in
`PacketReader.junk_bytes`. Inside a body a raw ``#`` can never appear:
binary data escapes it as ``}`` ``\\x03``, so the first ``#`` after ``$``
always ends the body. That makes framing a `bytes.find` job, which is what
the hot path does when whole packets arrive in one chunk (the common case).

The reader keeps only an undecoded tail between calls. It has three states:

* READY: between packets, looking at the next byte;
* the tail buffer holds an incomplete ``$...`` (waiting for ``#`` and two
  checksum digits);
* DISCARD: an oversized packet is being skipped without buffering it.
  Its end is its ``#`` plus two checksum digits, or a new ``$`` if the
  sender gave up on it. It then produces one `BadPacket` carrying
  `PacketTooLarge` with the body's full size.

Feeding the same stream with any split gives the same events (the tests
check byte-at-a-time and random splits against one whole chunk).

Bodies are returned exactly as on the wire (still escaped, still
run-length encoded): a proxy forwards `raw` unchanged, and the typed
parsers in `rsp.packets` decode what they need.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

from rsp.errors import ChecksumMismatch, PacketTooLarge, RemoteProtocolError

__all__ = [
    "Ack",
    "Nack",
    "Interrupt",
    "Packet",
    "Notification",
    "BadPacket",
    "Event",
    "PacketReader",
]


@dataclass(frozen=True, slots=True)
class Ack:
    """``+``: the peer received our last packet intact."""


@dataclass(frozen=True, slots=True)
class Nack:
    """``-``: the peer wants our last packet again."""


@dataclass(frozen=True, slots=True)
class Interrupt:
    """``\\x03``: the client asks the stub to stop the program."""


@dataclass(frozen=True, slots=True)
class Packet:
    """``$body#cs``. `body` is exactly the bytes between ``$`` and ``#``;
    `raw` is the whole framed packet, for verbatim forwarding."""

    body: bytes
    raw: bytes


@dataclass(frozen=True, slots=True)
class Notification:
    """``%body#cs``: an asynchronous notification (``Stop:...``)."""

    body: bytes
    raw: bytes


@dataclass(frozen=True, slots=True)
class BadPacket:
    """A packet that could not be accepted (checksum, size). `raw` is the
    framed bytes (for an oversized packet, only its first bytes)."""

    raw: bytes
    error: RemoteProtocolError


Event = Union[Ack, Nack, Interrupt, Packet, Notification, BadPacket]

ACK = Ack()
NACK = Nack()
INTERRUPT = Interrupt()

_START = re.compile(rb"[$%+\-\x03]")
_RESYNC = re.compile(rb"[#$]")
_HEXVAL = {c: int(chr(c), 16) for c in b"0123456789abcdefABCDEF"}
_RAW_KEEP = 64  # how much of an oversized packet BadPacket.raw keeps

_DOLLAR, _PERCENT, _PLUS, _MINUS, _CTRL_C, _HASH = b"$%+-\x03#"


class PacketReader:
    """Incremental packet reader: `feed` bytes, get `Event`s."""

    def __init__(self, *, max_packet: int = 1 << 20, check_checksums: bool = True) -> None:
        self.max_packet = max_packet
        self.check_checksums = check_checksums
        self.junk_bytes = 0
        self._tail = b""
        # An incomplete packet whose '#' has not arrived: grown in place, so a
        # large packet arriving in many chunks is not copied again each time.
        self._open: bytearray | None = None
        self._open_seen = False
        # DISCARD state: set while skipping an oversized packet.
        self._discarding = False
        self._discard_head = b""
        self._discard_size = 0
        self._discard_cs_left = -1  # >= 0 once its '#' was seen: digits still to skip

    @property
    def idle(self) -> bool:
        """Nothing held from earlier bytes: the next byte starts afresh."""
        return not self._tail and self._open is None and not self._discarding

    def feed(self, data: bytes) -> list[Event]:
        """Consume `data`; return every event it completes, in order."""
        events: list[Event] = []
        if self._open is not None:
            if b"#" not in data and len(self._open) + len(data) - 1 <= self.max_packet:
                self._open += data
                return events
            buf = bytes(self._open) + data
            self._open = None
        elif self._tail:
            buf = self._tail + data
        else:
            buf = bytes(data)
        self._open_seen = False
        pos = 0
        if self._discarding:
            pos = self._discard(buf, 0, events)
        end = len(buf)
        while pos < end:
            c = buf[pos]
            if c == _DOLLAR or c == _PERCENT:
                new_pos = self._packet(buf, pos, events)
                if new_pos < 0:
                    break  # incomplete packet: keep it as the tail
                pos = new_pos
            elif c == _PLUS:
                events.append(ACK)
                pos += 1
            elif c == _MINUS:
                events.append(NACK)
                pos += 1
            elif c == _CTRL_C:
                events.append(INTERRUPT)
                pos += 1
            else:
                pos = self._skip_junk(buf, pos)
        if pos >= end:
            self._tail = b""
        elif self._open_seen:
            self._open = bytearray(buf[pos:])
            self._tail = b""
        else:
            self._tail = buf[pos:]
        return events

    def _skip_junk(self, buf: bytes, pos: int) -> int:
        found = _START.search(buf, pos)
        stop = len(buf) if found is None else found.start()
        self.junk_bytes += stop - pos
        return stop

    def _packet(self, buf: bytes, pos: int, events: list[Event]) -> int:
        """Handle a packet starting at `pos`. Returns the position after it,
        or -1 if it is incomplete (then nothing is consumed)."""
        hash_at = buf.find(b"#", pos + 1)
        if hash_at < 0:
            if len(buf) - pos - 1 > self.max_packet:
                self._start_discard(buf, pos)
                return self._discard(buf, pos + 1, events)
            self._open_seen = True
            return -1
        if hash_at - pos - 1 > self.max_packet:
            self._start_discard(buf, pos)
            return self._discard(buf, pos + 1, events)
        if hash_at + 3 > len(buf):
            return -1
        body = buf[pos + 1 : hash_at]
        raw = buf[pos : hash_at + 3]
        if self.check_checksums:
            hi = _HEXVAL.get(buf[hash_at + 1])
            lo = _HEXVAL.get(buf[hash_at + 2])
            calculated = sum(body) & 0xFF
            if hi is None or lo is None:
                events.append(BadPacket(raw, ChecksumMismatch(raw, None, calculated)))
                return hash_at + 3
            if (hi << 4 | lo) != calculated:
                events.append(BadPacket(raw, ChecksumMismatch(raw, hi << 4 | lo, calculated)))
                return hash_at + 3
        if buf[pos] == _DOLLAR:
            events.append(Packet(body, raw))
        else:
            events.append(Notification(body, raw))
        return hash_at + 3

    # -- DISCARD state: skipping an oversized packet ------------------------

    def _start_discard(self, buf: bytes, pos: int) -> None:
        self._discarding = True
        self._discard_head = buf[pos : pos + min(_RAW_KEEP, self.max_packet + 1)]
        self._discard_size = 0
        self._discard_cs_left = -1

    def _discard(self, buf: bytes, pos: int, events: list[Event]) -> int:
        """Skip the oversized packet's bytes from `pos`; return where the
        stream continues (len(buf) if the packet has not ended yet)."""
        if self._discard_cs_left >= 0:
            return self._discard_checksum(buf, pos, events)
        found = _RESYNC.search(buf, pos)
        if found is None:
            self._discard_size += len(buf) - pos
            return len(buf)
        self._discard_size += found.start() - pos
        if buf[found.start()] == _DOLLAR:
            self._finish_discard(events)
            return found.start()
        self._discard_cs_left = 2
        return self._discard_checksum(buf, found.start() + 1, events)

    def _discard_checksum(self, buf: bytes, pos: int, events: list[Event]) -> int:
        take = min(self._discard_cs_left, len(buf) - pos)
        self._discard_cs_left -= take
        if self._discard_cs_left == 0:
            self._finish_discard(events)
        return pos + take

    def _finish_discard(self, events: list[Event]) -> None:
        error = PacketTooLarge(self._discard_size, self.max_packet)
        events.append(BadPacket(self._discard_head, error))
        self._discarding = False
        self._discard_head = b""
        self._discard_size = 0
        self._discard_cs_left = -1
