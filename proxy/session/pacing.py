"""One packet in flight to a stub that still acknowledges.

A stub that never agreed to no-ack mode may not take packets back to back.
QEMU's user-mode gdbstub (7.2) reads ONE byte after each reply it sends and
resends the reply unless that byte is ``+``: the first byte of a pipelined
packet is eaten, the stream desynchronises (batches of ~330 bytes of the
proxy's ``Z0`` set or memory-read bursts did it every time; up to 501 stale
replies in one log) and the program died of the proxy's own SIGTRAP. So
until the stub's ``QStartNoAckMode`` is answered ``OK``, a packet waits
until the reply to the one before it came; after it, packets go back to
back as before (gdbserver and lldb-server agree to no-ack at connect).
Pacing starts with the stub's qSupported reply: one that offers no
``QStartNoAckMode``, or a ``QStartNoAckMode`` not answered ``OK``, turns it
on (before qSupported the proxy's exchanges are one packet anyway).

QEMU 7.2's user mode also lets every thread that traps send its own stop
reply and then read the socket for packets, in its own loop, while another
thread's stop is being handled (QEMU 7.2.0's gdbstub/gdbstub.c, which
Debian's 1:7.2+dfsg-7+deb12u18 leaves as it is; gdb_handlesig, 3076-3121:
``put_strbuf()`` of the ``T05thread:`` report, then ``running_state = 0``
and ``while (running_state == 0) read(fd, buf, 256)`` feeding
gdb_read_byte; no lock, no other thread stopped). gdb ignores such
extra stop replies (rsp/connection.py, drop_before_ack); the session counts
them (``strays``). Where each such thread is then (the source, and the
packet logs of the corpus' tokio_app mt that hung 4 runs in 20):

* waiting for the ack of its report: ``put_packet_binary`` (657-690) reads
  ONE byte with ``recv`` and sends the report again unless it is ``+``;
* in its loop: it leaves only when ``running_state`` is not 0 after a
  read() returns, and ``running_state`` is one global: a resume packet any
  thread's loop takes sets it to 1 (``gdb_continue``, 479-490), and every
  thread that enters its loop sets it back to 0 (3105) - also one whose
  report's ack came after another thread took the proxy's resume.

A bare ``+`` (what the shell's watch sent before) releases a thread of the
second kind only while ``running_state`` is still 1: the ``+`` that acked a
late report put that thread in its loop with ``running_state`` 0, every
later ``+`` is garbage to it (gdb_read_byte, RS_IDLE), and the program
hung with the proxy waiting for a stop (seen: 88 s of ``+`` every 100 ms,
after ``vCont;c`` was acked). What releases it is a packet that resumes:
``$c#63`` (``handle_continue``: ``gdb_continue()``, no reply), which it
acknowledges with ``+``. So, while the program runs and the proxy waits for
a stop with nothing else unacknowledged, the shell's watch sends ``$c#63``
(``kick``) in a write of its own when a thread may be parked: after a stop
report the proxy did not answer (``stray``), and again after each kick that
was taken (more may be parked). The kick's fate is seen on the wire:

* a parked thread's loop takes it whole and acks it: the stub sends a ``+``
  that no packet of ours waited for (``bare_ack``);
* a thread that waits for the ack of a packet it sent (a report, or a
  reply whose ``+`` another thread read: seen, ``$OK`` five times) reads
  the kick one byte at a time and sends its packet again for each byte;
  the link acks every copy and the first ``+`` ends its wait (``reply_copy``);
* no thread reads the socket (none parked): the bytes wait there, and the
  next thread that traps reads them one by one as the ack of its report,
  sending the report again for each (5 copies; its stop is reported, not
  lost: the kick carries no ``+``, which would have let it resume).

A report identical to one seen since the last resume is such a copy (a
thread reports again only once resumed): dropped (``report``); so is any
other packet that comes while the proxy waits for a stop, up to one per
byte of the kick, and any that no resume is answered with (``OK``, data:
a reply whose ack another thread read, resent for the bytes of the
proxy's resume; seen taken for a hidden step's reply). At most one kick
is out at a time, or the bytes of several would pile up in the socket (a
report resent for each).

A thread released this way that was at a breakpoint still inserted traps
again at once (accel/tcg/cpu-exec.c, check_for_breakpoints_slow, 327-349:
the gdb breakpoint at its pc, EXCP_DEBUG) and reports again, this time as
the answer to a resume.

QEMU 7.2 builds every thread's packets in one buffer (``last_packet``, and
``str_buf`` for replies and reports: put_packet_binary, 657-690, no lock).
Two threads that write at once make one packet of both (seen: the reply
to a ``g`` that began ``T05thread:p01.529a;``; hidden.py reads such
registers again) or bytes outside any packet: ``$OK#9aread:p01.7ff2;#da``,
another thread's report whose head a reply wrote over. That thread waits
for the ack of a report the proxy never saw (no stray was counted), and the
program hung (1 run in 300 of the corpus' tokio_app mt, 1 in 60 with the
capture kept on). Such bytes (``garbled``) count as a thread that may be
parked: the kick goes, and the thread reads its ``$`` as no ack and sends
its report again, which is taken as any other. A mix may leave nothing to
see (a reply sent twice in one, ``+$010$0100...``, then a step that no
thread reported: 1 hang in about 200 runs), so one kick also goes after
QUIET_KICK of the stub's silence while the program runs.

The interrupt byte (0x03) is not a packet: it always goes at once. Two
packets get no reply at all (``R``, extended-remote's restart, and the
``qRelocInsn:LEN`` answer to gdbserver's own request): they never hold the
next one back.
"""

from __future__ import annotations

from collections import deque

from .actions import Action, ToStub, ToStubRaw, UnkeptToStub

KICK = b"$c#63"  # a bare continue: what releases a thread parked in QEMU's loop (module doc)
QUIET_KICK = 1.0  # seconds of the stub's silence while the program runs before a kick with none known parked


def _body(action: ToStub | ToStubRaw) -> bytes:
    if isinstance(action, ToStub):
        return action.body
    return action.raw[1:] if action.raw[:1] == b"$" else action.raw


def _gets_reply(action: ToStub | ToStubRaw) -> bool:
    body = _body(action)
    return not (body[:1] == b"R" or body.startswith(b"qRelocInsn:"))


def _resumes(body: bytes) -> bool:
    return body[:1] in (b"c", b"C", b"s", b"S") or body.startswith(b"vCont;")



class Pacer:
    """Holds packets for the stub while one is unanswered (see the module doc)."""

    def __init__(self) -> None:
        self.no_ack = True  # nothing is held: the stub agreed to no-ack, or not known yet
        self._busy = False  # a packet is out and its reply has not come
        self._held: deque[Action] = deque()
        self.held_total = 0  # packets that waited for an earlier reply (stats)
        self.strays = 0  # other threads' stop reports while one was handled (stats)
        self.kicks = 0  # releases sent while the program ran (stats)
        self.released = 0  # ... that a parked thread took (stats)
        self.copies = 0  # reports sent again for the bytes of a kick (stats)
        self.garbles = 0  # bytes outside any packet seen: a packet two threads wrote at once (stats)
        self._maybe_parked = False  # a thread may wait in the stub's loop (module doc)
        self._kick_out = False  # a kick went and was not seen taken or eaten
        self._copy_budget = 0  # packets that may yet come again for a kick's bytes
        # stop reports since the last resume: True for the one answered (the stop), False for
        # a stray's (its thread still waits in the stub)
        self._reports: dict[bytes, bool] = {}
        self._eater: bytes | None = None  # the report that came while a kick was out
        self._eater_copies = 0  # ... and its copies since

    def offer(self, action: Action) -> list[Action]:
        """What goes now for ``action``: itself, or nothing (held until ``answered``)."""
        if self.no_ack or not isinstance(action, (ToStub, ToStubRaw)):
            return [action]
        if isinstance(action, ToStubRaw) and action.raw[:1] != b"$":
            return [action]  # the interrupt byte, a bare ack: not packets
        if self._busy or self._held:
            self._held.append(action)
            self.held_total += 1
            return []
        return self._send(action)

    def _send(self, action: Action) -> list[Action]:
        assert isinstance(action, (ToStub, ToStubRaw))
        self._busy = _gets_reply(action)
        if _resumes(_body(action)):
            # The copies came before the stop that this resume ends (the thread sent them for
            # bytes it read before the proxy's first answer): the threads may report again.
            self._reports.clear()
            self._copy_budget = 0
            if self._eater is not None and self._eater_copies < len(KICK):
                self._maybe_parked = True  # a parked thread took part of the kick: still parked
            self._eater = None
        return [action]

    def report(self, body: bytes, waited: bool) -> bool:
        """A stop report came (``waited``: as the answer to a resume; or stale, or stray):
        False when it is a copy of one since the last resume (a thread that read bytes not
        ``+`` as the ack of its report: module doc)."""
        if self.no_ack:
            return True
        if self._kick_out:
            # A thread that traps reads the kick as its ack, one copy per byte; fewer copies:
            # a parked thread took the rest (garbage to it), counted at the next resume.
            self._kick_out = False
            self._eater, self._eater_copies = body, -1
        if body == self._eater:
            self._eater_copies += 1
        if body in self._reports:
            self.copies += 1
            if not self._reports[body]:
                self._maybe_parked = True  # a stray's thread still waits: in its loop next
            return False
        self._reports[body] = waited
        return True

    def reply_copy(self, certain: bool) -> bool:
        """A packet that is no stop report came while the program runs: True when it is a
        copy a thread sent for a byte it read instead of its ack (dropped): ``certain`` (no
        resume is answered so: ``OK``, data), or one of a kick's bytes' worth. Its thread
        may wait in the stub's loop after it."""
        if self.no_ack:
            return False
        if not certain:
            if self._copy_budget <= 0:
                return False
            self._copy_budget -= 1
        self.copies += 1
        self._kick_out = False
        self._maybe_parked = True
        return True

    def stray(self) -> None:
        """A stop report the proxy does not answer: its thread waits in the stub's loop."""
        self.strays += 1
        self._maybe_parked = True

    def garbled(self) -> None:
        """Bytes outside any packet came: a report whose head another thread's reply wrote
        over (the module doc); its thread waits for an ack or in the stub's loop."""
        self.garbles += 1
        self._maybe_parked = True

    def bare_ack(self) -> None:
        """The stub acknowledged a packet no packet of ours waited for: a parked thread took
        a kick and resumed (it may report again); others may still be parked."""
        if self._kick_out:
            self.released += 1
        self._kick_out = False
        self._copy_budget = 0  # taken whole
        self._maybe_parked = True
        self._reports.clear()

    def kick(self, quiet: float = 0.0) -> list[Action]:
        """A release for a thread parked in the stub's loop (the module doc), or nothing.
        Only while the program runs and nothing of ours waits for an ack (the caller).
        ``quiet``: seconds since the stub last sent anything; after QUIET_KICK one kick goes
        with no thread known to be parked (a packet garbled in a way that left nothing to
        see: the module doc); unseen taken, its bytes wait in the socket for the next
        thread that traps, no more goes."""
        if self.no_ack or self._kick_out or not (self._maybe_parked or quiet >= QUIET_KICK):
            return []
        self._kick_out, self._maybe_parked = True, False
        self._copy_budget = len(KICK)
        self.kicks += 1
        return [UnkeptToStub(KICK)]

    def answered(self) -> list[Action]:
        """The stub replied (or asked something back): what may go now, in order."""
        self._busy = False
        out: list[Action] = []
        while self._held and not self._busy:
            out += self._send(self._held.popleft())
        return out

    def stub_acks(self, acks: bool) -> list[Action]:
        """What the stub's qSupported reply (and its QStartNoAckMode answer) showed:
        ``acks`` turns pacing on; otherwise every held packet may go now."""
        self.no_ack = not acks
        self._busy = False
        if acks:
            return []
        out, self._held = list(self._held), deque()
        return out
