"""Procedures: the proxy's own conversations with the stub.

A procedure is a generator that yields `Exchange`s (request bodies sent back
to back) and receives the list of their replies. The session core runs one
at a time while the client's packets wait; capture backends write their
install / drain / uninstall steps as procedures too, so they never touch a
socket themselves.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Exchange:
    """Requests a procedure sends back to back; it receives their replies."""

    bodies: tuple[bytes, ...]
    resume: bool = False  # the last body resumes the program: its reply is a stop reply


Procedure = Generator[Exchange, list[bytes], None]




# What a capture backend may answer when it sees a client packet first
# (re-exported by proxy.capture.base, which documents them).
@dataclass(frozen=True, slots=True)
class Reply:
    """Answer the client's packet with `body`; nothing goes upstream."""

    body: bytes


@dataclass(frozen=True, slots=True)
class Forward:
    """Handle `body` instead of the client's packet (rewritten, then forwarded)."""

    body: bytes


@dataclass(frozen=True, slots=True)
class Handover:
    """The client wants the facility this backend uses: switch to breakpoints
    capture first (uninstalling this one), then handle the packet."""

    reason: str


Verdict = Reply | Forward | Handover
__all__ = ["Exchange", "Forward", "Handover", "Procedure", "Reply", "Verdict"]
