"""The stop's poll timing: what ``top`` and the timing columns of ``tasks`` show.

The engine's ``PollTiming`` (proxy/graph/timing.py) as it is at the snapshot's
stop (the snapshot is made again whenever the engine folds another event): each
observed task's polls with both timestamps, busy time with the capture's cost per
event subtracted, its longest poll and idle time, the last polls' durations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TaskTiming:
    """One observed task's timing at this stop (``timed``: it has a poll with both timestamps)."""

    id: int
    label: str
    self_ptr: int  # its coroutine's address
    path: str  # the engine's name of its coroutine
    type_name: str
    idle_ns: int
    timed: bool = False
    polls: int = 0
    busy_ns: int = 0
    longest_ns: int = 0


class StopTiming:
    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._t = engine.timing

    def __bool__(self) -> bool:
        """Some poll was timed."""
        return bool(self._t.tasks)

    def cost(self) -> tuple[int, str]:
        """(ns per event subtracted, where the figure comes from)."""
        return self._t.cost()  # type: ignore[no-any-return]

    @property
    def sampled(self) -> str | None:
        """What was sampled, when polls were."""
        return self._t.sampled  # type: ignore[no-any-return]

    def of(self, task: int) -> TaskTiming | None:
        """The timing of the engine's task ``task`` (None: not an observed task)."""
        return self._made(self._engine.task(task))

    def task(self, ref: str) -> TaskTiming | None:
        """An observed task by ``#ID`` or address."""
        return self._made(self._engine.task(ref))

    def ranked(self) -> list[TaskTiming]:
        """Every timed task, the most busy first."""
        t = self._t
        out = [self._made(task) for task in self._engine.tasks() if t.of(task.id) is not None]
        out.sort(key=lambda x: (-x.busy_ns, x.id))  # type: ignore[union-attr]
        return out  # type: ignore[return-value]

    def durations(self, task: int) -> list[int]:
        """The last poll durations of ``task`` (at most ``SAMPLES``), cost subtracted (ns)."""
        return self._t.durations(task)  # type: ignore[no-any-return]

    def _made(self, task: Any) -> TaskTiming | None:
        if task is None:
            return None
        t = self._t
        tt = t.of(task.id)
        if tt is None:
            return TaskTiming(task.id, task.label, task.self_ptr, task.path, task.type_name, task.idle_ns)
        return TaskTiming(task.id, task.label, task.self_ptr, task.path, task.type_name, task.idle_ns, True,
                          tt.polls, t.busy_ns(task.id), t.longest_ns(task.id))
