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


Action = ToStub | ToStubRaw | ToClient | ToClientRaw | SetNoAck | Notice | Close | AfterSend
