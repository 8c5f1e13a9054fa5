"""The mutable await graph and the rules that fold poll events into it.

Theory of operation (DESIGN.md §4):

* A task is one coroutine object: its ``self`` pointer plus its type (the
  layout name of the resume function's site) plus a generation. ``index``
  maps ``self_ptr -> {type -> task id}`` for the current generation at each
  address (an inline child can share its parent's address when its awaitee
  offset is 0, hence the per-type map). A new generation starts when a known
  (address, type) enters as Unresumed after it has been polled, or enters
  again after it finished; a task of *another* type at the same address that
  is not running right now is superseded (its memory was reused: dropped).
* Each OS thread has a stack of poll scopes: push on entry, pop on exit. The
  parent of an entering task is the task of the nearest enclosing scope on
  the same thread; with no scope the task is a root (polled by an executor).
* The stack grows down and a scope's ``sp`` is the stack pointer at entry
  (pointing at the return address). A ``ret`` leaves with the same ``sp``.
  So an entry whose ``sp`` is at or above a scope's ``sp`` proves that scope
  has returned (its exit was missed: popped and counted), and an exit matches
  the scope with the same ``sp``. A panicked exit (``call _Unwind_Resume``)
  happens inside the frame: it matches the innermost scope of its site whose
  ``sp`` is above the event's.
* The outcome of a poll is the ``__state`` after its exit (1 Returned,
  2 Panicked, 3+N SuspendN). When the exit did not carry it, the next entry's
  ``state`` of the same task gives it, or the proxy reads it at the next stop
  (``pending_reads``/``resolve``). A Returned/Panicked child completes the
  edge from its parent; a finishing parent drops its still-pending edges and
  the children behind them (a ``select!`` loser).
* Finished tasks (Returned, Panicked, dropped) wait in a FIFO and are evicted
  past ``max_completed`` (or ``completed_ttl_ns`` of event time). The whole
  table is capped at ``max_tasks``: past it the least recently seen tasks that
  are not running are evicted as stale. Memory is therefore bounded by
  ``max_tasks`` task records plus their edges.

Bad input (seq not increasing, an unknown site) is rejected and counted,
never raised: it comes from a program's memory and a backend's guesses.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from proxy.graph.catalog import Catalog
from proxy.graph.events import EventsLost, PollEnter, PollEvent, PollExit, PollResumed
from proxy.graph.fast import slot_maker
from proxy.graph.model import PollScope, StateRead
from proxy.graph.timing import PollTiming

_scope = slot_maker(PollScope)  # one per entry: the dataclass __init__ cost twice as much

RETURNED = 1
PANICKED = 2
FIRST_SUSPEND = 3

# the phase of a task between polls (running is ``running_on is not None``)
UNRESUMED = 0
SUSPENDED = 1
FINISHED_OK = 2
FINISHED_PANIC = 3
UNKNOWN = 4


_SCALARS = (
    "id", "self_ptr", "type_key", "site", "generation", "phase", "state_value",
    "running_on", "polls", "last_thread", "first_seq", "last_seq", "parent",
    "busy_ns", "idle_ns", "last_exit_ns", "finished", "dropped", "exits_missed", "needs_state",
)


class TaskRec:
    __slots__ = (*_SCALARS, "children", "parents", "touched")

    def __init__(self, tid: int, self_ptr: int, type_key: str, site: int, gen: int, seq: int) -> None:
        self.id = tid
        self.self_ptr = self_ptr
        self.type_key = type_key
        self.site = site
        self.generation = gen
        self.phase = UNKNOWN
        self.state_value: int | None = None
        self.running_on: int | None = None
        self.polls = 0
        self.last_thread: int | None = None
        self.first_seq = seq
        self.last_seq = seq
        self.parent: int | None = None
        self.busy_ns = 0
        self.idle_ns = 0
        self.last_exit_ns: int | None = None
        self.finished = False
        self.dropped = False
        self.exits_missed = 0
        self.needs_state = False  # the outcome of the last poll is not known yet
        # created on first use: most tasks are leaves or have one parent
        self.children: set[int] | None = None
        self.parents: set[int] | None = None
        self.touched: list[int] | None = None  # children entered during the current poll

    def pack(self) -> tuple[object, ...]:
        """Flat tuples of scalars are not tracked by the garbage collector."""
        return (
            self.id, self.self_ptr, self.type_key, self.site, self.generation, self.phase,
            self.state_value, self.running_on, self.polls, self.last_thread, self.first_seq,
            self.last_seq, self.parent, self.busy_ns, self.idle_ns, self.last_exit_ns,
            self.finished, self.dropped, self.exits_missed, self.needs_state,
            tuple(self.children) if self.children else None,
            tuple(self.parents) if self.parents else None,
            tuple(self.touched) if self.touched else None,
        )

    @staticmethod
    def unpack(t: tuple[Any, ...]) -> TaskRec:
        c = TaskRec.__new__(TaskRec)
        (c.id, c.self_ptr, c.type_key, c.site, c.generation, c.phase, c.state_value,
         c.running_on, c.polls, c.last_thread, c.first_seq, c.last_seq, c.parent, c.busy_ns,
         c.idle_ns, c.last_exit_ns, c.finished, c.dropped, c.exits_missed, c.needs_state,
         children, parents, touched) = t
        c.children = set(children) if children else None
        c.parents = set(parents) if parents else None
        c.touched = list(touched) if touched else None
        return c


class EdgeRec:
    __slots__ = ("parent", "child", "callsite_addr", "await_value", "first_seq", "last_seq",
                 "completed", "dropped")

    def __init__(self, parent: int, child: int, seq: int) -> None:
        self.parent = parent
        self.child = child
        self.callsite_addr: int | None = None  # the child's return address
        self.await_value: int | None = None  # the parent's __state after it suspended
        self.first_seq = seq
        self.last_seq = seq
        self.completed = False
        self.dropped = False

    def pack(self) -> tuple[object, ...]:
        return (self.parent, self.child, self.callsite_addr, self.await_value, self.first_seq,
                self.last_seq, self.completed, self.dropped)

    @staticmethod
    def unpack(t: tuple[Any, ...]) -> EdgeRec:
        c = EdgeRec.__new__(EdgeRec)
        (c.parent, c.child, c.callsite_addr, c.await_value, c.first_seq, c.last_seq,
         c.completed, c.dropped) = t
        return c


@dataclass(slots=True)
class Limits:
    max_completed: int = 10_000
    max_tasks: int = 100_000
    completed_ttl_ns: int | None = None


@dataclass(slots=True)
class Counters:
    events: int = 0
    enters: int = 0
    exits: int = 0
    events_lost: int = 0
    rejected: int = 0
    exits_missed: int = 0
    unmatched_exits: int = 0
    tasks_seen: int = 0
    completed_evicted: int = 0
    stale_evicted: int = 0
    elided: int = 0  # finished without being recorded (Engine.elided)
    reasons: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Snapshot:
    tasks: tuple[tuple[Any, ...], ...]
    edges: tuple[tuple[Any, ...], ...]
    index: tuple[tuple[int, tuple[tuple[str, int], ...]], ...]
    addr_gen: tuple[tuple[int, int], ...]
    scopes: tuple[tuple[int, tuple[PollScope, ...]], ...]
    finished: tuple[tuple[int, int | None], ...]
    reads: tuple[StateRead, ...]
    scalars: tuple[Any, ...]
    counters: Counters
    reasons: tuple[tuple[str, int], ...]


class GraphState:
    def __init__(self, catalog: Catalog, limits: Limits) -> None:
        self.catalog = catalog
        self.limits = limits
        self.tasks: dict[int, TaskRec] = {}
        self.index: dict[int, dict[str, int]] = {}
        self.addr_gen: dict[int, int] = {}  # next generation at an address (pruned on eviction)
        self.edges: dict[tuple[int, int], EdgeRec] = {}
        self.scopes: dict[int, list[PollScope]] = {}
        self.finished: deque[tuple[int, int | None]] = deque()  # (task id, finish time)
        self.reads: dict[int, StateRead] = {}
        self.next_id = 1
        self.last_seq: int | None = None
        self.last_time: int | None = None
        self.resync_needed: set[int] | None = None  # None: complete
        self.c = Counters()
        self.timing: PollTiming | None = None  # per-poll durations (kept across rewinds by the engine)
        self.reserved: set[int] = set()  # ids the snapshot gave to tasks found in memory (kept across rewinds)

    # ---- snapshot for checkpoints -------------------------------------------------

    def snapshot(self) -> Snapshot:
        """A packed, immutable copy (tuples of scalars: invisible to the GC)."""
        return Snapshot(
            tasks=tuple(t.pack() for t in self.tasks.values()),
            edges=tuple(e.pack() for e in self.edges.values()),
            index=tuple((a, tuple(m.items())) for a, m in self.index.items()),
            addr_gen=tuple(self.addr_gen.items()),
            scopes=tuple((t, tuple(s)) for t, s in self.scopes.items()),
            finished=tuple(self.finished),
            reads=tuple(self.reads.values()),
            scalars=(self.next_id, self.last_seq, self.last_time,
                     None if self.resync_needed is None else tuple(self.resync_needed)),
            counters=copy.copy(self.c),
            reasons=tuple(self.c.reasons.items()),
        )

    @staticmethod
    def restore(snap: Snapshot, catalog: Catalog, limits: Limits) -> GraphState:
        g = GraphState(catalog, limits)
        g.tasks = {t[0]: TaskRec.unpack(t) for t in snap.tasks}
        g.edges = {(e[0], e[1]): EdgeRec.unpack(e) for e in snap.edges}
        g.index = {a: dict(m) for a, m in snap.index}
        g.addr_gen = dict(snap.addr_gen)
        g.scopes = {t: list(s) for t, s in snap.scopes}
        g.finished = deque(snap.finished)
        g.reads = {r.task: r for r in snap.reads}
        g.next_id, g.last_seq, g.last_time, resync = snap.scalars
        g.resync_needed = None if resync is None else set(resync)
        g.c = copy.copy(snap.counters)
        g.c.reasons = dict(snap.reasons)
        return g

    # ---- entry points -------------------------------------------------------------

    def apply(self, ev: PollEvent) -> bool:
        """Fold one event; False (and a counted reason) when it was rejected."""
        kind = type(ev)  # the hot path: exact types first, subclasses below
        if kind is not PollEnter and kind is not PollExit and kind is not EventsLost:
            if not isinstance(ev, (PollEnter, PollExit, EventsLost)):
                return self.reject("not an event")
            kind = PollEnter if isinstance(ev, PollEnter) else PollExit if isinstance(ev, PollExit) else EventsLost
        last = self.last_seq
        if last is not None and ev.seq <= last:
            return self.reject("seq not increasing")
        if kind is EventsLost:
            self.last_seq = ev.seq
            self.c.events_lost += max(ev.count, 0)  # type: ignore[union-attr]
            self.resync_needed = set(self.scopes) | (self.resync_needed or set())
        elif not self.catalog.has_site(ev.site):  # type: ignore[union-attr]
            return self.reject("unknown site")
        elif kind is PollEnter:
            if ev.self_ptr <= 0:
                return self.reject("null self pointer")
            self.last_seq = ev.seq
            self._enter(ev, type(ev) is PollResumed)  # type: ignore[arg-type]
        else:
            self.last_seq = ev.seq
            self._exit(ev)  # type: ignore[arg-type]
        self.c.events += 1
        if self.finished and (
            len(self.finished) > self.limits.max_completed
            or self.limits.completed_ttl_ns is not None
        ):
            self._evict_finished()
        return True

    def reject(self, reason: str) -> bool:
        self.c.rejected += 1
        self.c.reasons[reason] = self.c.reasons.get(reason, 0) + 1
        return False

    # ---- entry ----------------------------------------------------------------------

    def _enter(self, ev: PollEnter, resumed: bool = False) -> None:
        self.c.enters += 1
        if ev.time_ns is not None:
            self.last_time = ev.time_ns
        stack = self.scopes.get(ev.thread)
        if stack is None:
            stack = self.scopes[ev.thread] = []
        above: list[PollScope] = []
        if resumed:
            # in progress since before the polls above it (deeper: a lower sp), which stay
            i = len(stack)
            while i > 0 and stack[i - 1].sp < ev.sp:
                i -= 1
            above = stack[i:]
            del stack[i:]
        while stack and stack[-1].sp <= ev.sp:
            self._missed_exit(stack.pop())
        self._enter_on(ev, stack)
        if above:
            stack.extend(above)

    def _enter_on(self, ev: PollEnter, stack: list[PollScope]) -> None:
        rec = self._task_for_entry(ev, stack)
        top = stack[-1] if stack else None
        if top is not None and top.task == rec.id:
            # a second resume fn of the same object (GenFuture::poll -> inner fn)
            stack.append(_scope(ev.thread, rec.id, ev.site, ev.sp, ev.seq, ev.time_ns, True))
            return
        self._start_poll(rec, ev)
        parent = self.tasks[top.task] if top is not None else None
        if ev.parent is not None:
            # the poll it runs inside went out as no event: the backend names it
            hinted = self._task_at(*ev.parent)
            if hinted is not None and hinted is not rec:
                parent = hinted
        if parent is None:
            rec.parent = None
        else:
            self._link(parent, rec, ev)
        stack.append(_scope(ev.thread, rec.id, ev.site, ev.sp, ev.seq, ev.time_ns, False))

    def _task_at(self, self_ptr: int, site: int) -> TaskRec | None:
        at = self.index.get(self_ptr)
        tid = at.get(self.catalog.type_key(site)) if at is not None else None
        return self.tasks.get(tid) if tid is not None else None

    def _start_poll(self, rec: TaskRec, ev: PollEnter) -> None:
        if ev.state is not None:
            self._learn_prior_state(rec, ev.state)
        rec.running_on = ev.thread
        rec.last_thread = ev.thread
        rec.polls += 1
        rec.last_seq = ev.seq
        rec.touched = None
        if ev.time_ns is not None and rec.last_exit_ns is not None:
            rec.idle_ns += max(ev.time_ns - rec.last_exit_ns, 0)

    def _learn_prior_state(self, rec: TaskRec, value: int) -> None:
        """The state at entry is the outcome of the previous poll."""
        if value == 0:
            rec.phase = UNRESUMED
            rec.state_value = 0
        elif rec.needs_state or rec.phase in (UNKNOWN, SUSPENDED):
            self._outcome(rec, value)
        rec.needs_state = False
        self.reads.pop(rec.id, None)

    def _task_for_entry(self, ev: PollEnter, stack: list[PollScope]) -> TaskRec:
        key = self.catalog.type_key(ev.site)
        at = self.index.get(ev.self_ptr)
        tid = at.get(key) if at is not None else None
        if tid is not None:
            rec = self.tasks[tid]
            if not self._is_new_life(rec, ev):
                return rec
            self._supersede(rec)
        rec = self._new_task(ev, key)
        at = self.index.setdefault(ev.self_ptr, {})
        named: set[int] | None = None
        for other_key, other_id in list(at.items()):
            other = self.tasks[other_id]
            if other.running_on is None and not self._is_ancestor_on(stack, other_id):
                if named is None:
                    named = self._named_ancestors(ev)
                if other_id not in named:
                    self._supersede(other)
        at[key] = rec.id
        return rec

    def _named_ancestors(self, ev: PollEnter) -> set[int]:
        """The poll the entry names as its parent (``PollEnter.parent``: its entry
        went out as no event) and that one's ancestors by their known edges: polls
        in progress, though not on the thread's stack here (a child stored at its
        parent's address, as an awaitee at offset 0 is, must not supersede them)."""
        out: set[int] = set()
        t = self._task_at(*ev.parent) if ev.parent is not None else None
        while t is not None and t.id not in out:
            out.add(t.id)
            t = self.tasks.get(t.parent) if t.parent is not None else None
        return out

    @staticmethod
    def _is_ancestor_on(stack: list[PollScope], tid: int) -> bool:
        return any(s.task == tid for s in stack)

    @staticmethod
    def _is_new_life(rec: TaskRec, ev: PollEnter) -> bool:
        if rec.running_on is not None:
            return False
        if ev.state == 0 and rec.polls > 0:
            return True
        return rec.finished and ev.state not in (RETURNED, PANICKED)

    def _new_task(self, ev: PollEnter, key: str) -> TaskRec:
        gen = self.addr_gen.get(ev.self_ptr, 0)
        self.addr_gen[ev.self_ptr] = gen + 1
        while self.next_id in self.reserved:  # proxy.snapshot.ids: a task found in memory has it
            self.next_id += 1
        rec = TaskRec(self.next_id, ev.self_ptr, key, ev.site, gen, ev.seq)
        self.next_id += 1
        self.c.tasks_seen += 1
        self.tasks[rec.id] = rec
        if len(self.tasks) > self.limits.max_tasks:
            self._evict_stale()
        return rec

    def skip_finished(self, count: int) -> None:
        """Engine.elided: `count` tasks seen and finished, never in the table."""
        for _ in range(max(count, 0)):
            while self.next_id in self.reserved:
                self.next_id += 1
            self.next_id += 1
        self.c.tasks_seen += max(count, 0)
        self.c.elided += max(count, 0)

    def _supersede(self, rec: TaskRec) -> None:
        """The object's memory now holds another coroutine: the old one was dropped."""
        at = self.index.get(rec.self_ptr)
        if at is not None and at.get(rec.type_key) == rec.id:
            del at[rec.type_key]
        self.reads.pop(rec.id, None)
        rec.needs_state = False
        if not rec.finished:
            rec.dropped = True
            self._finish(rec)

    def _link(self, parent: TaskRec, child: TaskRec, ev: PollEnter) -> None:
        key = (parent.id, child.id)
        edge = self.edges.get(key)
        if edge is None:
            edge = self.edges[key] = EdgeRec(parent.id, child.id, ev.seq)
            if parent.children is None:
                parent.children = set()
            parent.children.add(child.id)
            if child.parents is None:
                child.parents = set()
            child.parents.add(parent.id)
        edge.last_seq = ev.seq
        edge.completed = False
        edge.dropped = False
        if ev.return_addr is not None:
            edge.callsite_addr = ev.return_addr
        child.parent = parent.id
        if parent.touched is None:
            parent.touched = [child.id]
        else:
            parent.touched.append(child.id)

    # ---- exit -----------------------------------------------------------------------

    def _exit(self, ev: PollExit) -> None:
        self.c.exits += 1
        if ev.time_ns is not None:
            self.last_time = ev.time_ns
        stack = self.scopes.get(ev.thread)
        if not stack:
            self.c.unmatched_exits += 1
            return
        scope = self._pop_matching(stack, ev)
        if scope is None:
            self.c.unmatched_exits += 1
            return
        if scope.nested:
            return  # the wrapper's own exit carries the outcome
        rec = self.tasks.get(scope.task)
        if rec is None:
            return
        self._end_poll(rec, scope, ev.time_ns, ev.seq)
        if ev.panicked:
            self._outcome(rec, PANICKED)
        elif ev.state is not None:
            self._outcome(rec, ev.state)
        elif ev.poll_result == 0:
            self._outcome(rec, RETURNED)
        else:
            if ev.poll_result == 1:
                rec.phase = SUSPENDED
                rec.state_value = None
            self._ask_state(rec)

    def _pop_matching(self, stack: list[PollScope], ev: PollExit) -> PollScope | None:
        if ev.panicked:
            i = len(stack) - 1
            while i >= 0 and not (stack[i].site == ev.site and stack[i].sp > ev.sp):
                i -= 1
        else:
            i = len(stack) - 1
            while i >= 0 and stack[i].sp < ev.sp:
                i -= 1
            if i < 0 or stack[i].sp != ev.sp or stack[i].site != ev.site:
                # scopes below the exit's sp have returned; the exit itself is unknown
                while stack and stack[-1].sp < ev.sp:
                    self._missed_exit(stack.pop())
                return None
        if i < 0:
            return None
        while len(stack) > i + 1:
            self._missed_exit(stack.pop())
        return stack.pop()

    def _end_poll(self, rec: TaskRec, scope: PollScope, time_ns: int | None, seq: int | None = None) -> None:
        rec.running_on = None
        if time_ns is not None:
            if scope.time_ns is not None:
                rec.busy_ns += max(time_ns - scope.time_ns, 0)
                if self.timing is not None and seq is not None:
                    self.timing.poll(rec.id, scope.entry_seq, seq, scope.time_ns, time_ns)
            rec.last_exit_ns = time_ns

    def _missed_exit(self, scope: PollScope) -> None:
        if scope.nested:
            return
        self.c.exits_missed += 1
        rec = self.tasks.get(scope.task)
        if rec is None:
            return
        rec.exits_missed += 1
        self._end_poll(rec, scope, None)
        self._ask_state(rec)

    def _ask_state(self, rec: TaskRec) -> None:
        rec.needs_state = True
        if rec.phase != SUSPENDED:
            rec.phase = UNKNOWN
        layout = self.catalog.layout_for(rec.site)
        if layout is not None:
            addr = rec.self_ptr + layout.state_offset
            self.reads[rec.id] = StateRead(rec.id, rec.self_ptr, addr, layout.state_size)

    # ---- outcomes -------------------------------------------------------------------

    def _outcome(self, rec: TaskRec, value: int) -> None:
        rec.needs_state = False
        self.reads.pop(rec.id, None)
        if value == RETURNED or value == PANICKED:
            rec.state_value = value
            rec.phase = FINISHED_OK if value == RETURNED else FINISHED_PANIC
            self._complete_parent_edge(rec)
            self._finish(rec)
        elif value >= FIRST_SUSPEND and self._valid_state(rec, value):
            rec.state_value = value
            rec.phase = SUSPENDED
            self._mark_await(rec, value)
        else:
            rec.phase = UNKNOWN
            rec.state_value = None
            self.reject("bad __state value")

    def _valid_state(self, rec: TaskRec, value: int) -> bool:
        return self.catalog.valid_state(rec.site, value)

    def _mark_await(self, rec: TaskRec, value: int) -> None:
        for cid in rec.touched or ():
            edge = self.edges.get((rec.id, cid))
            if edge is not None and not edge.completed:
                edge.await_value = value

    def _complete_parent_edge(self, rec: TaskRec) -> None:
        if rec.parent is not None:
            edge = self.edges.get((rec.parent, rec.id))
            if edge is not None:
                edge.completed = True
                edge.dropped = False

    def _finish(self, rec: TaskRec) -> None:
        """Returned, panicked or dropped: drop what it still awaited, queue for eviction."""
        first = not rec.finished
        rec.finished = True
        work = [rec]
        while work:
            parent = work.pop()
            for cid in parent.children or ():
                edge = self.edges.get((parent.id, cid))
                if edge is None or edge.completed or edge.dropped:
                    continue
                edge.dropped = True
                child = self.tasks.get(cid)
                if child is not None and child.parent == parent.id and not child.finished \
                        and child.running_on is None:
                    child.dropped = True
                    child.finished = True
                    self.reads.pop(child.id, None)
                    self.finished.append((child.id, self.last_time))
                    work.append(child)
        if first:
            self.finished.append((rec.id, self.last_time))

    # ---- eviction -------------------------------------------------------------------

    def _evict_finished(self) -> None:
        q = self.finished
        ttl = self.limits.completed_ttl_ns
        now = self.last_time
        while q:
            tid, t = q[0]
            old = ttl is not None and now is not None and t is not None and now - t > ttl
            if len(q) <= self.limits.max_completed and not old:
                break
            q.popleft()
            rec = self.tasks.get(tid)
            if rec is not None and rec.finished and rec.running_on is None:
                self._evict(rec)
                self.c.completed_evicted += 1

    def _evict_stale(self) -> None:
        """Past max_tasks: drop the least recently seen half that is not running."""
        idle = [r for r in self.tasks.values() if r.running_on is None]
        idle.sort(key=lambda r: r.last_seq)
        excess = len(self.tasks) - self.limits.max_tasks // 2
        for rec in idle[:max(excess, 0)]:
            self._evict(rec)
            self.c.stale_evicted += 1

    def _evict(self, rec: TaskRec) -> None:
        tid = rec.id
        del self.tasks[tid]
        self.reads.pop(tid, None)
        for cid in rec.children or ():
            self.edges.pop((tid, cid), None)
            child = self.tasks.get(cid)
            if child is not None and child.parents is not None:
                child.parents.discard(tid)
        for pid in rec.parents or ():
            self.edges.pop((pid, tid), None)
            parent = self.tasks.get(pid)
            if parent is not None and parent.children is not None:
                parent.children.discard(tid)
        at = self.index.get(rec.self_ptr)
        if at is not None and at.get(rec.type_key) == tid:
            del at[rec.type_key]
        if at is not None and not at:
            del self.index[rec.self_ptr]
            self.addr_gen.pop(rec.self_ptr, None)

    # ---- reads and resynchronisation --------------------------------------------

    def resolve(self, read: StateRead, data: bytes | None) -> bool:
        rec = self.tasks.get(read.task)
        if rec is None or self.reads.get(read.task) != read or not rec.needs_state:
            return False
        if data is None or len(data) < read.size:
            self.reads.pop(read.task, None)
            rec.needs_state = False
            return self.reject("state read failed")
        self._outcome(rec, int.from_bytes(data[: read.size], "little"))
        return True

    def resync(self, thread: int, frames: list[tuple[int, int, int]]) -> None:
        """Keep only the scopes that a real unwind still finds on the stack."""
        live = {(site, sp) for site, _self, sp in frames}
        stack = self.scopes.get(thread, [])
        kept = [s for s in stack if (s.site, s.sp) in live]
        for s in reversed(stack):
            if (s.site, s.sp) not in live:
                self._missed_exit(s)
        if kept:
            self.scopes[thread] = kept
        else:
            self.scopes.pop(thread, None)
        if self.resync_needed is not None:
            self.resync_needed.discard(thread)
            if not self.resync_needed:
                self.resync_needed = None
