"""The interface between the session core and a capture backend.

Theory of operation: the session plants the backend's probes like any other
hidden probe. At a hit it asks the backend which packets to read *in the
same exchange* as the step-over (`reads`: they go back to back ahead of
`z0` and `vCont;s`, so a capture costs no extra round trip), then hands the
replies to `hit`, where the backend emits `proxy.graph.events` into the
engine. Everything here is sync and pure; the backend never talks to the
stub itself.
"""

from __future__ import annotations

from typing import Protocol

from proxy.session.probes import Probe
from rsp.packets.stop import StopReply


class Capture(Protocol):
    name: str

    def plan(self, path: str | None, runtime_entry: int | None) -> list[Probe]:
        """The probes to plant for the program at `path` (PIE bias from AT_ENTRY)."""
        ...

    def reads(self, probe: Probe, thread: int, stop: StopReply) -> tuple[bytes, ...]:
        """Request bodies to send before the step-over at a hit."""
        ...

    def hit(self, probe: Probe, thread: int, stop: StopReply, replies: list[bytes]) -> None:
        """The replies to `reads`, in order; emit engine events."""
        ...

    def stats_lines(self) -> list[str]:
        ...
