"""What the session core asks its shell to do. Nouns, frozen and slotted."""

from __future__ import annotations

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


Action = ToStub | ToStubRaw | ToClient | ToClientRaw | SetNoAck | Notice | Close
