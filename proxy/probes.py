"""Hidden probes: resolved addresses and their hit counts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rsp.threads import ThreadId


@dataclass(frozen=True, slots=True)
class Probe:
    name: str  # the symbol (demangled where possible)
    addr: int  # runtime address (load bias applied)
    kind: str = "count"  # "count" (--probe), "entry" / "exit" (a capture backend's)
    site: int = 0  # for entry/exit: the resume function's runtime low_pc
    code: bytes = b""  # the program's bytes at addr (from the file): lets the session emulate it


@dataclass(slots=True)
class ProbeStats:
    total: int = 0
    per_probe: Counter[str] = field(default_factory=Counter)
    per_thread: Counter[int] = field(default_factory=Counter)

    def hit(self, probe: Probe, thread: ThreadId | None) -> None:
        self.total += 1
        self.per_probe[probe.name] += 1
        self.per_thread[thread.tid if thread is not None else 0] += 1

    def add(self, probe: Probe, n: int) -> None:
        """`n` hits counted elsewhere (a capture backend that counts probes itself)."""
        self.total += n
        self.per_probe[probe.name] += n

    def by_probe(self) -> list[tuple[str, int]]:
        return sorted(self.per_probe.items())
