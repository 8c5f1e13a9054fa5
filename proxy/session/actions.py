"""What the session core asks its shell to do. Nouns, frozen and slotted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ToStub:
    """Send a packet body upstream (the shell frames it)."""

    body: bytes


@dataclass(frozen=True, slots=True)
class ToStubRaw:
    """Forward already-framed bytes upstream unchanged (or the 0x03 byte)."""

    raw: bytes


@dataclass(frozen=True, slots=True)
class UnkeptToStub:
    """Framed bytes for the stub that no ack may ever come for (a parked thread's release,
    pacing.py): not kept for retransmission; the stub's ack, if it comes, is reported."""

    raw: bytes


@dataclass(frozen=True, slots=True)
class SignalProgram:
    """Interrupt a program of this host with a signal sent to its process alone (``kill(pid,
    sig)``), where a 0x03 to the stub would make it signal the program's whole process group:
    gdbserver 13.1 answers 0x03 with ``kill(-pgid, SIGINT)``, which also kills the program's
    untraced children (a vfork child running /bin/true died of it, 128 + 2, when a capture drain
    came at that moment). The stub sees the same SIGINT stop either way. A shell that cannot
    send it sends the 0x03 instead."""

    pid: int
    signal: int


@dataclass(frozen=True, slots=True)
class ToClient:
    body: bytes


@dataclass(frozen=True, slots=True)
class ToClientRaw:
    raw: bytes


@dataclass(frozen=True, slots=True)
class SetNoAck:
    """Switch one side of the link to no-ack mode (after the OK went out)."""

    side: str  # "client" | "stub"


@dataclass(frozen=True, slots=True)
class Notice:
    """A one-line message for the user (stderr of the proxy)."""

    text: str


@dataclass(frozen=True, slots=True)
class Close:
    """End the session after flushing what is queued. `keep_stub`: only the
    client's side ends; the stub link (and the capture in the program) stay
    for the next client (a stub that accepts another one, core.client_closed)."""

    reason: str
    keep_stub: bool = False


@dataclass(frozen=True, slots=True)
class AfterSend:
    """Run ``work`` once what is queued before it has been sent: what the answer does not
    need (a cold analysis's cache write: ~25 ms of the axum debug build's first answer). A
    shell that does not run it loses nothing the session needs."""

    work: Callable[[], object]


Action = ToStub | ToStubRaw | UnkeptToStub | SignalProgram | ToClient | ToClientRaw | SetNoAck | Notice | Close | AfterSend
