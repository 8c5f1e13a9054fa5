"""The program's async state at one stop (DESIGN.md §2, "the snapshot").

Built at most once per stop from the engine (observed polls), reflection
(memory), the threads' stacks, runtime adapters and earlier stops; every
command, table and document renders it. Pure: memory comes through the
caller's ``read``.

* ``model``: the frozen values (Snapshot, Task, TaskState, FutureNode, Frame, PollStats,
  Resource, Hold, Wait, Finding, WaitGraph, HistoryEdge);
* ``build``: ``build_snapshot(SnapshotInputs, read)``: the merge rules, with their reasons
  (its parts: ``inputs``, ``engine_view``, ``merge``, ``convert``; ``plans``: per-layout facts);
* ``names``: one name and one line per coroutine;
* ``waits``: the wait-for graph, cycles and tasks nothing can wake;
* ``ids``: stable task ids across stops; ``store``: one snapshot per stop.
"""

from typing import Any

from .ids import TaskIds
from .model import (
    Finding,
    Frame,
    FutureNode,
    HistoryEdge,
    Hold,
    PollStats,
    Resource,
    Snapshot,
    StateKind,
    Task,
    TaskState,
    Wait,
    WaitGraph,
)
from .store import SnapshotStore

__all__ = ["EarlierStops", "SnapshotInputs", "build_snapshot", "TaskIds", "Finding", "Frame", "FutureNode",
           "HistoryEdge", "Hold", "PollStats", "Resource", "Snapshot", "StateKind", "Task", "TaskState",
           "Wait", "WaitGraph", "SnapshotStore"]


def __getattr__(name: str) -> Any:  # the builder imports reflection (pyelftools): only when used
    if name in ("EarlierStops", "SnapshotInputs", "build_snapshot"):
        from . import build

        return getattr(build, name)
    raise AttributeError(name)
