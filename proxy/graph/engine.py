"""The await-graph engine: the public face of ``proxy.graph``.

Theory of operation: ``feed()`` folds capture events (``proxy.graph.events``)
into a ``GraphState`` (the rules live in ``proxy.graph.state``) and appends
each accepted event to an event log. The graph at any moment is the fold of
the log up to a cursor (DESIGN.md §6):

* ``rewind_to(seq)`` restores the newest checkpoint at or before ``seq`` and
  refolds the logged entries up to ``seq``; the entries after it stay in the
  log as a redo tail. ``forward_to(seq)`` refolds more of that tail.
* Feeding an event while a redo tail exists either replays it (the event is
  the logged one under the cursor: the same history) or truncates the tail
  and appends (a new history).
* ``resolve_read`` and ``resync_thread`` change the graph outside the event
  stream; they are logged too, anchored after the last event folded, so a
  refold reproduces them.

The log is bounded: a checkpoint (a copy of the state) is taken every
``checkpoint_every`` entries and at most ``max_checkpoints`` are kept; the
log holds only the entries since the oldest checkpoint, so at most
``checkpoint_every * max_checkpoints`` entries (defaults: 25,000 x 4 =
100,000 entries, ~300 bytes each: ~30 MB) and the rewind horizon is at
least ``checkpoint_every * (max_checkpoints - 1)`` entries back.
``rewind_to`` a seq older than the oldest checkpoint raises
``RewindUnavailable``. ``keep_log=False`` turns all of this off. A
checkpoint copies the task table (~3 µs a task), which costs about 1 µs per
event with 10,000 retained tasks at the default interval.

What the log holds is what the capture fed. Uprobe capture in full mode
feeds only the events that change the graph (a new instance, edge, state or
thread, a completion: ``proxy/capture/uprobes/capture.py``), with the repeat
polls counted in the kernel and given to ``timing`` as totals at stops; a
refold then reproduces the graph, not those polls. Nothing needs more:
rewinding the program needs a stub that executes in reverse (rr), and
uprobes capture only runs on a live process. The other backends feed every
poll.

The engine is pure: no I/O, no clocks (times come from the events).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from proxy.analysis.model import SourceLoc
from proxy.graph.catalog import Catalog
from proxy.graph.events import EventsLost, PollEnter, PollEvent, PollExit, PollResumed
from proxy.graph.model import (
    BtFrame,
    Edge,
    EngineStats,
    PollScope,
    StateKind,
    StateRead,
    Task,
    TaskState,
)
from proxy.graph.polls import PollLog
from proxy.graph.timing import PollTiming
from proxy.graph.state import (
    FINISHED_OK,
    FINISHED_PANIC,
    SUSPENDED,
    UNRESUMED,
    EdgeRec,
    GraphState,
    Limits,
    Snapshot,
    TaskRec,
)

__all__ = ["Catalog", "Engine", "RewindUnavailable"]


class RewindUnavailable(ValueError):
    """The requested seq is older than what the bounded log retains."""


@dataclass(frozen=True, slots=True)
class _Resolved:
    seq: int  # anchor: the last event folded before this entry
    read: StateRead
    data: bytes | None


@dataclass(frozen=True, slots=True)
class _Resynced:
    seq: int
    thread: int
    frames: tuple[tuple[int, int, int], ...]


_Packed = tuple[int | str | bool | None, ...]
_LogEntry = _Packed | _Resolved | _Resynced
"""Events are logged as flat tuples of ints: the garbage collector stops tracking
such tuples, which keeps a 100,000-entry log from slowing every collection."""


def _pack(ev: PollEvent) -> _Packed:
    kind = type(ev)  # exact types first (the hot path), subclasses below
    if kind is PollEnter or (kind is not PollExit and isinstance(ev, PollEnter)):
        return (3 if isinstance(ev, PollResumed) else 0, ev.seq, ev.thread, ev.site, ev.self_ptr,  # type: ignore[union-attr]
                ev.sp, ev.return_addr, ev.state, ev.time_ns, ev.parent)  # type: ignore[union-attr]
    if kind is PollExit or isinstance(ev, PollExit):
        return (1, ev.seq, ev.thread, ev.site, ev.sp, ev.state, ev.self_ptr, ev.poll_result,
                ev.panicked, ev.time_ns)
    return (2, ev.seq, ev.count, ev.reason)


def _unpack(t: _Packed) -> PollEvent:
    args: Any = t[1:]
    if t[0] == 0:
        return PollEnter(*args)
    if t[0] == 3:
        return PollResumed(*args)
    if t[0] == 1:
        return PollExit(*args)
    return EventsLost(*args)


def _entry_seq(entry: _LogEntry) -> int:
    if isinstance(entry, tuple):
        seq = entry[1]
        assert isinstance(seq, int)
        return seq
    return entry.seq


@dataclass(slots=True)
class _Checkpoint:
    index: int  # absolute log index: the state after entries [0, index)
    last_seq: int | None
    state: Snapshot


_PHASE_KIND = {
    UNRESUMED: StateKind.UNRESUMED,
    SUSPENDED: StateKind.SUSPENDED,
    FINISHED_OK: StateKind.FINISHED,
    FINISHED_PANIC: StateKind.PANICKED,
}


class Engine:
    def __init__(
        self,
        catalog: Catalog,
        *,
        max_completed: int = 10_000,
        max_tasks: int = 100_000,
        completed_ttl_ns: int | None = None,
        keep_log: bool = True,
        checkpoint_every: int = 25_000,
        max_checkpoints: int = 4,
    ) -> None:
        self.catalog = catalog
        self._limits = Limits(max_completed, max(max_tasks, 2), completed_ttl_ns)
        self._g = GraphState(catalog, self._limits)
        self.timing = PollTiming()  # outside the checkpoints: a refold does not count twice
        self._g.timing = self.timing
        self.polls = PollLog()  # the recorded polls and the stops (the timeline), outside the checkpoints too
        self._g.polls = self.polls
        self._reserved: set[int] = set()
        self._keep_log = keep_log
        self._every = max(checkpoint_every, 1)
        self._max_cp = max(max_checkpoints, 1)
        self._log: list[_LogEntry] = []
        self._base = 0  # absolute index of _log[0]
        self._cursor = 0  # absolute index of the next entry to fold
        self._cps = [_Checkpoint(0, None, self._g.snapshot())]

    def stop_log(self) -> None:
        """Turn the event log off from here on (``keep_log=False``): the graph
        stays, the log and its checkpoints go, ``rewind_to`` raises. For a
        capture that can never be rewound (uprobes: a live process only)."""
        self._keep_log = False
        self._log = []
        self._base = self._cursor = 0
        self._cps = self._cps[-1:]

    # ---- feeding ------------------------------------------------------------------

    def feed(self, event: PollEvent) -> None:
        """Fold one event (events come in seq order; bad ones are counted, not raised)."""
        if not self._keep_log:
            self._g.apply(event)
            return
        end = self._base + len(self._log)
        if self._cursor < end:
            if self._log[self._cursor - self._base] == _pack(event):
                self._g.apply(event)
                self._cursor += 1
                return
            self._truncate_tail()
        if self._g.apply(event):
            # _append inlined (the capture's hot path): log, then a checkpoint when due
            self._log.append(_pack(event))
            self._cursor += 1
            if self._cursor - self._cps[-1].index >= self._every:
                self._checkpoint()

    def feeders(self) -> tuple[Callable[..., bool], Callable[..., bool]] | None:
        """(enter, exit): ``feed`` of a ``PollEnter`` / ``PollExit`` with the event's
        fields given one by one (``GraphState.enter``/``exit``: no event object, no
        dispatch on its type; uprobe capture's ``Decoder.fold`` decodes records
        straight into them), valid until the state is replaced (a rewind). None
        when every event must go through ``feed``: the event log is on (it keeps
        event objects), or ``feed`` is watched (overridden by a subclass, or
        replaced on the instance)."""
        if self._keep_log or type(self).feed is not Engine.feed or "feed" in self.__dict__:
            return None
        return self._g.enter, self._g.exit

    def feed_many(self, events: Iterable[PollEvent]) -> None:
        for ev in events:
            self.feed(ev)

    def resolve_read(self, read: StateRead, data: bytes | None) -> None:
        """Give the bytes of a ``pending_reads()`` entry (None: the read failed)."""
        if self._g.resolve(read, data):
            self._record(_Resolved(self._anchor(), read, data))

    def resync_thread(self, thread: int, resume_frames: list[tuple[int, int, int]]) -> None:
        """Drop the scopes of ``thread`` that a real unwind no longer finds.

        ``resume_frames``: (site, self_ptr or 0, sp at entry) of every resume
        function on the thread's stack, innermost first; ``sp`` is the stack
        pointer that pointed at the frame's return address (CFA - 8 on x86-64).
        """
        frames = tuple(resume_frames)
        self._g.resync(thread, list(frames))
        self._record(_Resynced(self._anchor(), thread, frames))

    def forget_thread(self, thread: int) -> None:
        """The thread exited: its scopes are gone (exits missed)."""
        self.resync_thread(thread, [])

    def reserve_ids(self, ids: set[int]) -> None:
        """Task ids given elsewhere (proxy.snapshot.ids: tasks found in memory): never hand
        them out. The set is shared, so ids added to it later are skipped too."""
        self._reserved = ids
        self._g.reserved = ids

    def elided(self, count: int) -> None:
        """`count` coroutines were created and completed inside one poll of their
        parent without being recorded (uprobe capture's full mode, CFG_ELIDE): each
        takes the task id it would have had and counts as seen and finished, so the
        ids and the finished count stay those of every poll recorded. Not in the
        event log (uprobe capture keeps none)."""
        self._g.skip_finished(count)

    def polled_unseen(self, unseen: dict[int, int]) -> None:
        """At a stop: `unseen` = task id -> the polls of it that went out as no event so far
        (uprobe capture that samples: the kernel counts every poll, records some). A task
        polled unseen since the last call may have ended in such a poll: its ``__state`` is
        read at this stop (``pending_reads``); Returned or Panicked finish it, and a state
        its memory cannot hold after a poll (Unresumed, or not one of its type's: the slot
        was freed or holds a new coroutine) drops it (``EngineStats.ended_unseen``).
        Without this such a task stayed live until a new coroutine's first poll at its
        address, shown from memory that was no longer its own. Not in the event log
        (uprobe capture keeps none)."""
        self._g.polled_unseen(unseen)

    def forget_idle(self, sites: set[int]) -> int:
        """Forget the live coroutines of these resume functions (runtime low_pc) that are
        not polling now, with their edges (the finished ones stay: they were seen
        finishing): what the graph knew of them is stale
        (uprobe capture's full mode took their probes out for a while: they may have
        completed, or been polled again, unseen). The ids are not handed out again;
        a coroutine polled later is a new task. Not in the event log (uprobe
        capture keeps none). The number forgotten."""
        g = self._g
        gone = [r for r in g.tasks.values() if r.site in sites and r.running_on is None and not r.finished]
        for r in gone:
            g._evict(r)  # noqa: SLF001 - the graph's own eviction
        return len(gone)

    @property
    def highest_id(self) -> int:
        return self._g.next_id - 1

    def finished_count(self) -> int:
        """Coroutine instances seen finishing since the start (retained or evicted)."""
        return self._g.c.tasks_seen - sum(1 for r in self._g.tasks.values() if not r.finished)

    # ---- time travel ----------------------------------------------------------------

    @property
    def cursor_seq(self) -> int | None:
        return self._g.last_seq

    @property
    def oldest_rewind_seq(self) -> int | None:
        """The oldest seq ``rewind_to`` can reach (None: back to the empty graph)."""
        return self._cps[0].last_seq if self._keep_log else self._g.last_seq

    def rewind_to(self, seq: int) -> None:
        """Make the graph the fold of the logged entries with seq <= ``seq``."""
        if not self._keep_log:
            raise RewindUnavailable("the event log is off")
        cp = None
        for c in self._cps:
            if c.last_seq is None or c.last_seq <= seq:
                cp = c
        if cp is None:
            raise RewindUnavailable(
                f"seq {seq} is older than the oldest retained checkpoint (seq {self._cps[0].last_seq})"
            )
        self._g = GraphState.restore(cp.state, self.catalog, self._limits)
        self._g.timing = self.timing
        self._g.polls = self.polls
        self._g.reserved = self._reserved
        self._cursor = cp.index
        self.forward_to(seq)

    def forward_to(self, seq: int) -> None:
        """Refold logged entries after the cursor up to ``seq`` (the same history)."""
        end = self._base + len(self._log)
        while self._cursor < end:
            entry = self._log[self._cursor - self._base]
            if _entry_seq(entry) > seq:
                break
            self._fold(entry)
            self._cursor += 1

    def _fold(self, entry: _LogEntry) -> None:
        if isinstance(entry, _Resolved):
            self._g.resolve(entry.read, entry.data)
        elif isinstance(entry, _Resynced):
            self._g.resync(entry.thread, list(entry.frames))
        else:
            self._g.apply(_unpack(entry))

    def _anchor(self) -> int:
        return self._g.last_seq if self._g.last_seq is not None else -1

    def _record(self, entry: _LogEntry) -> None:
        if not self._keep_log:
            return
        if self._cursor < self._base + len(self._log):
            self._truncate_tail()
        self._append(entry)

    def _append(self, entry: _LogEntry) -> None:
        self._log.append(entry)
        self._cursor += 1
        if self._cursor - self._cps[-1].index >= self._every:
            self._checkpoint()

    def _checkpoint(self) -> None:
        self._cps.append(_Checkpoint(self._cursor, self._g.last_seq, self._g.snapshot()))
        if len(self._cps) > self._max_cp:
            del self._cps[0]
            drop = self._cps[0].index - self._base
            del self._log[:drop]
            self._base += drop

    def _truncate_tail(self) -> None:
        del self._log[self._cursor - self._base:]
        while len(self._cps) > 1 and self._cps[-1].index > self._cursor:
            self._cps.pop()

    # ---- scopes and reads -----------------------------------------------------------

    def current_scope(self, thread: int) -> PollScope | None:
        stack = self._g.scopes.get(thread)
        return stack[-1] if stack else None

    def scopes(self, thread: int) -> list[PollScope]:
        """The poll scopes of a thread, outermost first."""
        return list(self._g.scopes.get(thread, ()))

    def threads(self) -> list[int]:
        return sorted(t for t, s in self._g.scopes.items() if s)

    def pending_reads(self) -> list[StateRead]:
        return list(self._g.reads.values())

    @property
    def complete(self) -> bool:
        return self._g.resync_needed is None

    def threads_to_resync(self) -> list[int]:
        return sorted(self._g.resync_needed or ())

    # ---- queries --------------------------------------------------------------------

    def tasks(self) -> list[Task]:
        return [self._task(r) for r in sorted(self._g.tasks.values(), key=lambda r: r.id)]

    def task(self, ref: str | int) -> Task | None:
        """A task by id (``12``, ``"#12"``, ``"12"``) or by address (``"0x7f..."``)."""
        rec = self._find(ref)
        return self._task(rec) if rec is not None else None

    def node_at(self, self_ptr: int, site: int) -> int | None:
        """The id of the coroutine the engine holds at `self_ptr` for resume function `site`."""
        at = self._g.index.get(self_ptr)
        return at.get(self.catalog.type_key(site)) if at is not None else None

    def roots(self) -> list[Task]:
        return [t for t in self.tasks() if t.parent is None]

    def children(self, task: int) -> list[Edge]:
        rec = self._g.tasks.get(task)
        if rec is None:
            return []
        edges = (self._g.edges.get((task, c)) for c in rec.children or ())
        return sorted((self._edge(e) for e in edges if e is not None), key=lambda e: e.first_seq)

    def edges(self, *, parent: int | None = None, completed: bool | None = None) -> list[Edge]:
        """Edges, optionally of one parent; completed=True/False keeps only those."""
        if parent is not None:
            found = self.children(parent)
        else:
            found = sorted((self._edge(e) for e in self._g.edges.values()), key=lambda e: e.first_seq)
        if completed is None:
            return found
        return [e for e in found if e.completed == completed]

    def backtrace(self, thread: int, pc: int | None = None) -> list[BtFrame]:
        """The logical async backtrace: innermost running coroutine -> its root.

        ``pc``: the thread's pc at the stop, for the innermost frame's line.
        """
        stack = [s for s in self._g.scopes.get(thread, ()) if not s.nested]
        frames: list[BtFrame] = []
        child: int | None = None
        for level, scope in enumerate(reversed(stack)):
            rec = self._g.tasks.get(scope.task)
            if rec is None:
                break
            if child is None:
                loc = self.catalog.loc_for_pc(pc) if pc is not None else None
            else:
                edge = self._g.edges.get((rec.id, child))
                loc = self._edge(edge).loc if edge is not None else None
            frames.append(BtFrame(level, rec.id, self._path(rec), rec.self_ptr, loc, child is None))
            child = rec.id
        return frames

    def stats(self) -> EngineStats:
        g = self._g
        c = g.c
        live = sum(1 for r in g.tasks.values() if not r.finished)
        return EngineStats(
            events=c.events, enters=c.enters, exits=c.exits, events_lost=c.events_lost,
            rejected=c.rejected, rejected_reasons=tuple(sorted(c.reasons.items())),
            exits_missed=c.exits_missed, unmatched_exits=c.unmatched_exits,
            tasks_seen=c.tasks_seen, tasks_retained=len(g.tasks), tasks_live=live,
            completed_evicted=c.completed_evicted, stale_evicted=c.stale_evicted,
            edges=len(g.edges), pending_reads=len(g.reads), complete=self.complete,
            log_entries=len(self._log), oldest_rewind_seq=self.oldest_rewind_seq,
            last_seq=g.last_seq, log_kept=self._keep_log, ended_unseen=c.ended_unseen,
        )

    def loc_of(self, task: Task) -> SourceLoc | None:
        """Where a task is: its suspend point, else the resume fn's declaration."""
        if task.state.loc is not None:
            return task.state.loc
        fn = self.catalog.resume_fn(task.site)
        return fn.decl if fn is not None else None

    # ---- snapshots ------------------------------------------------------------------

    def _find(self, ref: str | int) -> TaskRec | None:
        tasks = self._g.tasks
        if isinstance(ref, int):
            return tasks.get(ref)
        text = ref.strip()
        try:
            if text.lower().startswith("0x"):
                return self._find_addr(int(text, 16))
            return tasks.get(int(text.removeprefix("#"), 10))
        except ValueError:
            return None

    def _find_addr(self, addr: int) -> TaskRec | None:
        at = self._g.index.get(addr, {})
        cands = [self._g.tasks[t] for t in at.values() if t in self._g.tasks]
        if not cands:
            cands = [r for r in self._g.tasks.values() if r.self_ptr == addr]
        return max(cands, key=lambda r: (r.last_seq, r.id), default=None)

    def _path(self, rec: TaskRec) -> str:
        fn = self.catalog.resume_fn(rec.site)
        return fn.path if fn is not None else f"0x{rec.site:x}"

    def _state(self, rec: TaskRec) -> TaskState:
        if rec.running_on is not None:
            return TaskState(StateKind.RUNNING, thread=rec.running_on)
        kind = _PHASE_KIND.get(rec.phase, StateKind.UNKNOWN)
        if kind is StateKind.SUSPENDED:
            v = rec.state_value
            return TaskState(kind, loc=self.catalog.state_loc(rec.site, v), suspend_index=v - 3 if v is not None else None)
        return TaskState(kind)

    def _task(self, r: TaskRec) -> Task:
        return Task(
            id=r.id, self_ptr=r.self_ptr, type_name=r.type_key, path=self._path(r),
            generation=r.generation, state=self._state(r), state_value=r.state_value,
            polls=r.polls, last_thread=r.last_thread, first_seq=r.first_seq,
            last_seq=r.last_seq, parent=r.parent, site=r.site, busy_ns=r.busy_ns,
            idle_ns=r.idle_ns, exits_missed=r.exits_missed, dropped=r.dropped,
        )

    def _edge(self, e: EdgeRec) -> Edge:
        callsite = (
            self.catalog.loc_for_return_address(e.callsite_addr)
            if e.callsite_addr is not None else None
        )
        parent = self._g.tasks.get(e.parent)
        await_loc = (
            self.catalog.state_loc(parent.site, e.await_value) if parent is not None else None
        )
        direct = True
        if parent is not None and e.callsite_addr is not None:
            fn = self.catalog.resume_fn(parent.site)
            if fn is not None:
                direct = parent.site <= e.callsite_addr < parent.site + (fn.high_pc - fn.low_pc)
        return Edge(e.parent, e.child, callsite, await_loc, e.first_seq, e.last_seq,
                    e.completed, e.dropped, direct)
