"""tokio-console's columns for ``top``: SCHED (woken, not polled yet: total and longest), WAKES,
SELF-WAKES, and a task's scheduling-delay histogram (``top TASK``), from the kernel's fold
(proxy.origins)."""

from __future__ import annotations

from typing import Any

from proxy.origins.records import HIST, WakeStats

from proxy.graph.timing import fmt_ns as fmt


class WakeColumns:
    head = ("SCHED", "SCHED MAX", "WAKES", "SELF")

    def __init__(self, by_future: dict[int, WakeStats]) -> None:
        self.by_future = by_future

    def of(self, task: Any) -> WakeStats | None:
        return self.by_future.get(getattr(task, "self_ptr", None) or getattr(task, "addr", 0))

    def cells(self, task: Any) -> tuple[str, ...]:
        w = self.of(task)
        if w is None:
            return ("-", "-", "-", "-")
        return (fmt(w.sched_ns), fmt(w.sched_max), str(w.wakes), str(w.self_wakes))

    def notes(self) -> list[str]:
        return ["SCHED: time from a wake to the poll it caused, summed (SCHED MAX the longest); WAKES, SELF: "
                "wakes of the task since the capture began, those from inside its own poll (tokio-console's)"]

    def histogram(self, task: Any) -> list[str]:
        w = self.of(task)
        if w is None:
            return ["scheduling delays: no wake of this task seen"]
        lines = [f"scheduling delays ({w.sched_n} wakes polled; {w.wakes} wakes, {w.self_wakes} self-wakes; "
                 f"total {fmt(w.sched_ns)}, longest {fmt(w.sched_max)}):"]
        peak = max(w.hist) or 1
        for b, n in enumerate(w.hist):
            if not n:
                continue
            low = 0 if b == 0 else 1 << (b + 9)
            high = "inf" if b == HIST - 1 else fmt(1 << (b + 10))
            lines.append(f"  {fmt(low):>7} .. {high:<7} {n:6d} " + "#" * round(n * 40 / peak))
        return lines
