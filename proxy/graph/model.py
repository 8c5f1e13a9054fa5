"""The await graph as the queries see it: small frozen snapshots.

The engine keeps its own mutable records (``proxy.graph.state``); every query
returns these immutable values, so a renderer can never change the graph.
Task ids are small integers assigned in order of first sight and shown as
``#N``; they are stable for the whole session (and across a rewind, which
refolds the same events in the same order).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from proxy.analysis.model import SourceLoc


class StateKind(str, enum.Enum):
    """A coroutine's or a task's state: the one vocabulary of the engine's graph and the stop's
    snapshot (``proxy.snapshot`` reads these); the value is the word every command prints."""

    RUNNING = "running"  # on a thread's stack now (also during its first poll)
    SUSPENDED = "suspended"  # __state = SuspendN
    UNRESUMED = "not yet polled"
    FINISHED = "finished"  # Returned
    PANICKED = "panicked"
    UNKNOWN = "unknown"  # memory unreadable, no layout, or nothing observed yet


@dataclass(frozen=True, slots=True)
class TaskState:
    kind: StateKind
    thread: int | None = None  # RUNNING: the OS thread (LWP)
    loc: SourceLoc | None = None  # the line it runs at, or the .await it waits at
    suspend_index: int | None = None  # SUSPENDED: N of SuspendN (None: not read yet)

    @property
    def live(self) -> bool:
        return self.kind not in (StateKind.FINISHED, StateKind.PANICKED)

    @property
    def word(self) -> str:
        """The state without its line: "running on thread N" ("running" when no thread is known:
        a blocking-pool closure that was started), "suspended", ..."""
        if self.kind is StateKind.RUNNING and self.thread is not None:
            return f"running on thread {self.thread}"
        return self.kind.value

    def __str__(self) -> str:
        at = f" at {self.loc}" if self.loc is not None else ""
        if self.kind is StateKind.RUNNING:
            return f"{self.word}{at}"
        if self.kind is StateKind.SUSPENDED:
            return f"suspended{at}"
        return self.kind.value


@dataclass(frozen=True, slots=True)
class Task:
    id: int
    self_ptr: int
    type_name: str  # the state-machine type (layout name), or the resume fn's name
    path: str  # the async fn / block path, e.g. "rt::a"
    generation: int  # 0 for the first task seen at this address, then 1, 2, ...
    state: TaskState
    state_value: int | None  # the last known __state discriminant
    polls: int
    last_thread: int | None
    first_seq: int
    last_seq: int
    parent: int | None  # the task id of the latest poller; None for a root
    site: int  # runtime low_pc of the resume function
    busy_ns: int = 0  # time inside polls (0 when events carry no time)
    idle_ns: int = 0  # time between polls
    exits_missed: int = 0
    dropped: bool = False  # its owner finished (or its memory was reused) while it was pending

    @property
    def label(self) -> str:
        return f"#{self.id}"

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def finished(self) -> bool:
        return self.dropped or self.state.kind in (StateKind.FINISHED, StateKind.PANICKED)


@dataclass(frozen=True, slots=True)
class Edge:
    parent: int
    child: int
    callsite: SourceLoc | None  # from the child's return address (the .await in the parent)
    await_loc: SourceLoc | None  # from the parent's suspend state after it returned Pending
    first_seq: int
    last_seq: int
    completed: bool  # the child returned Ready (or panicked) to this parent
    dropped: bool = False  # the parent finished while this child was still pending
    # The child's return address lies in the parent's own resume function. When
    # it does not (join!/select!/Box<dyn Future> poll the child from library
    # code), the return address names tokio's maybe_done.rs, not the .await.
    direct_call: bool = True

    @property
    def loc(self) -> SourceLoc | None:
        if self.callsite is not None and (self.direct_call or self.await_loc is None):
            return self.callsite
        return self.await_loc

    @property
    def pending(self) -> bool:
        return not self.completed and not self.dropped


class PollScope(NamedTuple):
    """One resume-function activation on one OS thread.

    A named tuple, not a frozen dataclass as the rest: the engine builds one per
    entry, and ``tuple.__new__`` with the fields is ~5x cheaper than a frozen
    dataclass (even filled slot by slot, ``proxy.graph.fast``): ~0.5 µs an entry
    on uprobe capture's consumer (``bench/bench_consumer.py``)."""

    thread: int
    task: int  # task id
    site: int
    sp: int  # stack pointer at entry (points at the return address)
    entry_seq: int
    time_ns: int | None = None
    nested: bool = False  # a second resume fn of the same task (a GenFuture wrapper's inner fn)


@dataclass(frozen=True, slots=True)
class BtFrame:
    level: int  # 0 = innermost
    task: int
    path: str
    self_ptr: int
    loc: SourceLoc | None
    executing: bool  # True: the line being executed; False: the .await being waited on


@dataclass(frozen=True, slots=True)
class StateRead:
    """A ``__state`` the proxy should read at the next stop (an exit carried none)."""

    task: int
    self_ptr: int
    addr: int
    size: int


@dataclass(frozen=True, slots=True)
class EngineStats:
    events: int
    enters: int
    exits: int
    events_lost: int  # as reported by EventsLost records
    rejected: int
    rejected_reasons: tuple[tuple[str, int], ...]
    exits_missed: int  # scopes popped because a later sp proved they had returned
    unmatched_exits: int  # exits of scopes never entered (attach mid-poll)
    tasks_seen: int
    tasks_retained: int
    tasks_live: int
    completed_evicted: int
    stale_evicted: int
    edges: int
    pending_reads: int
    complete: bool  # False after EventsLost until every thread is resynchronised
    log_entries: int
    oldest_rewind_seq: int | None
    last_seq: int | None
    log_kept: bool = True  # False: the event log is off (Engine(keep_log=False), Engine.stop_log)
    ended_unseen: int = 0  # tasks read at a stop as gone after polls no event told of (Engine.polled_unseen)
