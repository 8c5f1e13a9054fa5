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
thread's stop is being handled: a resume releases whichever parked thread's
read() got it, and the others stay parked until a byte reaches them (a
tokio worker parked there while the others wait for its work: the program
hung in 1 of 2 runs of the corpus' tokio_app mt). gdb ignores such extra
stop replies (rsp/connection.py, drop_before_ack); the session counts them
(``strays``) and, while the program runs and the proxy waits for a stop
with nothing else in flight, the shell's watch (proxy/shell/link.py) sends
a bare ``+`` every tick (``kick``), each in a write of its own (sent with
the resume, the byte went to the thread that read the resume): a parked
thread's loop ignores the byte, sees the program running and returns; the
thread is then still at its breakpoint, traps again at once and reports
again, this time as the answer to a resume. A thread that was still
waiting for the ack of its report takes the byte as that ack instead, and
needs the next one. Which thread reads which byte cannot be known, so the
watch kicks every tick while the program runs, strays or not: a ``+`` is
no packet, and every reader of QEMU's socket ignores it or takes it as an
ack (counting parked threads left one parked in 1 of 5 runs).

The interrupt byte (0x03) is not a packet: it always goes at once. Two
packets get no reply at all (``R``, extended-remote's restart, and the
``qRelocInsn:LEN`` answer to gdbserver's own request): they never hold the
next one back.
"""

from __future__ import annotations

from collections import deque

from .actions import Action, ToStub, ToStubRaw


def _body(action: ToStub | ToStubRaw) -> bytes:
    if isinstance(action, ToStub):
        return action.body
    return action.raw[1:] if action.raw[:1] == b"$" else action.raw


def _gets_reply(action: ToStub | ToStubRaw) -> bool:
    body = _body(action)
    return not (body[:1] == b"R" or body.startswith(b"qRelocInsn:"))




class Pacer:
    """Holds packets for the stub while one is unanswered (see the module doc)."""

    def __init__(self) -> None:
        self.no_ack = True  # nothing is held: the stub agreed to no-ack, or not known yet
        self._busy = False  # a packet is out and its reply has not come
        self._held: deque[Action] = deque()
        self.held_total = 0  # packets that waited for an earlier reply (stats)
        self.strays = 0  # other threads' stop reports while one was handled (stats)
        self.kicks = 0  # bare `+`s sent while the program ran (stats)

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
        return [action]

    def kick(self) -> list[Action]:
        """A bare ``+`` for a thread parked in the stub's loop (the module doc), or nothing."""
        if self.no_ack:
            return []
        self.kicks += 1
        return [ToStubRaw(b"+")]

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
