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
from proxy.graph.model import PollScope, StateRead
from proxy.graph.polls import PollLog
from proxy.graph.timing import PollTiming

_tuple = tuple.__new__  # _tuple(PollScope, (fields...)): one per entry, the cheapest way to build it

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
    ended_unseen: int = 0  # read at a stop as no longer there after polls no event told of (resolve)
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
    # the common exit (of the innermost poll) matched inline; False: by `_pop_matching`
    # alone (tests/proxy/capture/uprobes/test_uprobes_fold.py compares the two)
    shortcuts = True

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
        self.polls: PollLog | None = None  # the recorded polls, for the timeline (kept across rewinds)
        self.reserved: set[int] = set()  # ids the snapshot gave to tasks found in memory (kept across rewinds)
        self.unseen: dict[int, int] = {}  # task id -> its polls no event told of, at the last `polled_unseen`
        self.asked_unseen: set[int] = set()  # tasks whose state `polled_unseen` asked for (until read)
        self._keys = catalog.type_keys  # site -> task type (only the catalog's sites)
        # finished tasks past this many: evict (with a time to live: whenever there are some)
        self._evict_past = limits.max_completed if limits.completed_ttl_ns is None else 0

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
        if kind is PollEnter or kind is PollResumed or (kind is not PollExit and isinstance(ev, PollEnter)):
            return self.enter(ev.seq, ev.thread, ev.site, ev.self_ptr, ev.sp,  # type: ignore[union-attr]
                              ev.return_addr, ev.state, ev.time_ns, ev.parent,  # type: ignore[union-attr]
                              kind is PollResumed)
        if kind is PollExit or isinstance(ev, PollExit):
            return self.exit(ev.seq, ev.thread, ev.site, ev.sp, ev.state,  # type: ignore[union-attr]
                             ev.self_ptr, ev.poll_result, ev.panicked, ev.time_ns)  # type: ignore[union-attr]
        if isinstance(ev, EventsLost):
            return self.lost(ev.seq, ev.count)
        return self.reject("not an event")

    def lost(self, seq: int, count: int) -> bool:
        """An ``EventsLost``: every thread's scopes are in doubt until resynchronised."""
        last = self.last_seq
        if last is not None and seq <= last:
            return self.reject("seq not increasing")
        self.last_seq = seq
        self.c.events_lost += max(count, 0)
        self.resync_needed = set(self.scopes) | (self.resync_needed or set())
        self.c.events += 1
        if len(self.finished) > self._evict_past:
            self._evict_finished()
        return True

    def reject(self, reason: str) -> bool:
        self.c.rejected += 1
        self.c.reasons[reason] = self.c.reasons.get(reason, 0) + 1
        return False

    # ---- entry ----------------------------------------------------------------------
    # `enter` and `exit` take an event's fields one by one: `apply` unpacks an event
    # object into them, and uprobe capture decodes its records straight into them
    # (`Decoder.fold`: no event object, no dispatch on its type). The common cases
    # (a known task entered at the thread's root or under the innermost poll; an exit
    # of the innermost poll) run inline; the rest calls out to the helpers below.

    def enter(self, seq: int, thread: int, site: int, self_ptr: int, sp: int, return_addr: int | None = None,
              state: int | None = None, time_ns: int | None = None, parent: tuple[int, int] | None = None,
              resumed: bool = False) -> bool:
        """A ``PollEnter`` (a ``PollResumed`` with `resumed`); False when rejected."""
        last = self.last_seq
        if last is not None and seq <= last:
            return self.reject("seq not increasing")
        key = self._keys.get(site)
        if key is None:
            return self.reject("unknown site")
        if self_ptr <= 0:
            return self.reject("null self pointer")
        self.last_seq = seq
        c = self.c
        c.enters += 1
        if time_ns is not None:
            self.last_time = time_ns
        stack = self.scopes.get(thread)
        if stack is None:
            stack = self.scopes[thread] = []
        above: list[PollScope] | None = None
        if resumed:
            # in progress since before the polls above it (deeper: a lower sp), which stay
            i = len(stack)
            while i > 0 and stack[i - 1].sp < sp:
                i -= 1
            above = stack[i:]
            del stack[i:]
        while stack and stack[-1].sp <= sp:
            self._missed_exit(stack.pop())
        # the task at this address and of this type, unless the entry starts a new life of it
        at = self.index.get(self_ptr)
        tid = at.get(key) if at is not None else None
        rec = self.tasks[tid] if tid is not None else None
        if rec is not None and rec.running_on is None and (
                (state == 0 and rec.polls > 0) or (rec.finished and state != RETURNED and state != PANICKED)):
            self._supersede(rec)
            rec = None
        if rec is None:
            rec = self._new_task_at(self_ptr, site, key, seq, stack, parent)
        top = stack[-1] if stack else None
        if top is not None and top.task == rec.id:
            # a second resume fn of the same object (GenFuture::poll -> inner fn)
            stack.append(_tuple(PollScope, (thread, rec.id, site, sp, seq, time_ns, True)))
        else:
            if state is not None:  # the state at entry is the outcome of the previous poll
                if state == 0:
                    rec.phase = UNRESUMED
                    rec.state_value = 0
                elif state >= FIRST_SUSPEND and state == rec.state_value and rec.phase == SUSPENDED:
                    # the state its last poll left (a repeat poll): all _outcome would do
                    if rec.touched:
                        self._mark_await(rec, state)
                elif rec.needs_state or rec.phase == SUSPENDED or rec.phase == UNKNOWN:
                    self._outcome(rec, state)
                rec.needs_state = False
                if self.reads:
                    self.reads.pop(rec.id, None)
            rec.running_on = thread
            rec.last_thread = thread
            rec.polls += 1
            rec.last_seq = seq
            rec.touched = None
            if time_ns is not None and rec.last_exit_ns is not None and time_ns > rec.last_exit_ns:
                rec.idle_ns += time_ns - rec.last_exit_ns
            up = self.tasks.get(top.task) if top is not None else None  # gone: finished while in a poll elsewhere
            if parent is not None:
                # the poll it runs inside went out as no event: the backend names it
                hinted = self._task_at(*parent)
                if hinted is not None and hinted is not rec:
                    up = hinted
            if up is None:
                rec.parent = None
            else:
                self._link(up, rec, seq, return_addr)
            stack.append(_tuple(PollScope, (thread, rec.id, site, sp, seq, time_ns, False)))
        if above:
            stack.extend(above)
        c.events += 1
        if len(self.finished) > self._evict_past:
            self._evict_finished()
        return True

    def _task_at(self, self_ptr: int, site: int) -> TaskRec | None:
        at = self.index.get(self_ptr)
        tid = at.get(self.catalog.type_key(site)) if at is not None else None
        return self.tasks.get(tid) if tid is not None else None

    def _new_task_at(self, self_ptr: int, site: int, key: str, seq: int, stack: list[PollScope],
                     parent: tuple[int, int] | None) -> TaskRec:
        """A new task at `self_ptr`; the other types' tasks there that are not running
        and not polls around this one are superseded (the memory was reused)."""
        rec = self._new_task(self_ptr, site, key, seq)
        at = self.index.setdefault(self_ptr, {})
        named: set[int] | None = None
        for _other_key, other_id in list(at.items()):
            other = self.tasks[other_id]
            if other.running_on is None and not self._is_ancestor_on(stack, other_id):
                if named is None:
                    named = self._named_ancestors(parent)
                if other_id not in named:
                    self._supersede(other)
        at[key] = rec.id
        return rec

    def _named_ancestors(self, parent: tuple[int, int] | None) -> set[int]:
        """The poll the entry names as its parent (``PollEnter.parent``: its entry
        went out as no event) and that one's ancestors by their known edges: polls
        in progress, though not on the thread's stack here (a child stored at its
        parent's address, as an awaitee at offset 0 is, must not supersede them)."""
        out: set[int] = set()
        t = self._task_at(*parent) if parent is not None else None
        while t is not None and t.id not in out:
            out.add(t.id)
            t = self.tasks.get(t.parent) if t.parent is not None else None
        return out

    @staticmethod
    def _is_ancestor_on(stack: list[PollScope], tid: int) -> bool:
        return any(s.task == tid for s in stack)

    def _new_task(self, self_ptr: int, site: int, key: str, seq: int) -> TaskRec:
        gen = self.addr_gen.get(self_ptr, 0)
        self.addr_gen[self_ptr] = gen + 1
        while self.next_id in self.reserved:  # proxy.snapshot.ids: a task found in memory has it
            self.next_id += 1
        rec = TaskRec(self.next_id, self_ptr, key, site, gen, seq)
        self.next_id += 1
        self.c.tasks_seen += 1
        self.tasks[rec.id] = rec
        if len(self.tasks) > self.limits.max_tasks:
            self._evict_stale()
        return rec

    def skip_finished(self, count: int) -> None:
        """Engine.elided: `count` tasks seen and finished, never in the table."""
        if count <= 0:
            return
        if self.reserved:
            for _ in range(count):
                while self.next_id in self.reserved:
                    self.next_id += 1
                self.next_id += 1
        else:
            self.next_id += count
        self.c.tasks_seen += count
        self.c.elided += count

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

    def _link(self, parent: TaskRec, child: TaskRec, seq: int, return_addr: int | None) -> None:
        key = (parent.id, child.id)
        edge = self.edges.get(key)
        if edge is None:
            edge = self.edges[key] = EdgeRec(parent.id, child.id, seq)
            if parent.children is None:
                parent.children = set()
            parent.children.add(child.id)
            if child.parents is None:
                child.parents = set()
            child.parents.add(parent.id)
        edge.last_seq = seq
        edge.completed = False
        edge.dropped = False
        if return_addr is not None:
            edge.callsite_addr = return_addr
        child.parent = parent.id
        if parent.touched is None:
            parent.touched = [child.id]
        else:
            parent.touched.append(child.id)

    # ---- exit -----------------------------------------------------------------------

    def exit(self, seq: int, thread: int, site: int, sp: int, state: int | None = None,
             self_ptr: int | None = None, poll_result: int | None = None, panicked: bool = False,
             time_ns: int | None = None) -> bool:
        """A ``PollExit``; False when rejected."""
        last = self.last_seq
        if last is not None and seq <= last:
            return self.reject("seq not increasing")
        if site not in self._keys:
            return self.reject("unknown site")
        self.last_seq = seq
        c = self.c
        c.exits += 1
        if time_ns is not None:
            self.last_time = time_ns
        stack = self.scopes.get(thread)
        if not stack:
            scope = None
        elif self.shortcuts and not panicked and stack[-1].sp == sp and stack[-1].site == site:
            scope = stack.pop()  # the innermost poll returns (what _pop_matching finds first)
        else:
            scope = self._pop_matching(stack, site, sp, panicked)
        if scope is None:
            c.unmatched_exits += 1
        elif not scope.nested:  # a wrapper's inner fn: the wrapper's own exit carries the outcome
            rec = self.tasks.get(scope.task)
            if rec is not None:
                rec.running_on = None
                if time_ns is not None:
                    t0 = scope.time_ns
                    if t0 is not None:
                        if time_ns > t0:
                            rec.busy_ns += time_ns - t0
                        if self.timing is not None:
                            self.timing.poll(rec.id, scope.entry_seq, seq, t0, time_ns)
                        polls = self.polls
                        if polls is not None:
                            polls.add(rec.id, thread, scope.site, rec.self_ptr, scope.entry_seq, seq, t0, time_ns)
                    rec.last_exit_ns = time_ns
                if panicked:
                    self._outcome(rec, PANICKED)
                elif state is not None:
                    if state >= FIRST_SUSPEND and state == rec.state_value and rec.phase == SUSPENDED \
                            and not rec.needs_state:
                        # suspended where it was (a repeat poll): all _outcome would do
                        if rec.touched:
                            self._mark_await(rec, state)
                    else:
                        self._outcome(rec, state)
                elif poll_result == 0:
                    self._outcome(rec, RETURNED)
                else:
                    if poll_result == 1:
                        rec.phase = SUSPENDED
                        rec.state_value = None
                    self._ask_state(rec)
        c.events += 1
        if len(self.finished) > self._evict_past:
            self._evict_finished()
        return True

    def _pop_matching(self, stack: list[PollScope], site: int, sp: int, panicked: bool) -> PollScope | None:
        if panicked:
            i = len(stack) - 1
            while i >= 0 and not (stack[i].site == site and stack[i].sp > sp):
                i -= 1
        else:
            i = len(stack) - 1
            while i >= 0 and stack[i].sp < sp:
                i -= 1
            if i < 0 or stack[i].sp != sp or stack[i].site != site:
                # scopes below the exit's sp have returned; the exit itself is unknown
                while stack and stack[-1].sp < sp:
                    self._missed_exit(stack.pop())
                return None
        if i < 0:
            return None
        while len(stack) > i + 1:
            self._missed_exit(stack.pop())
        return stack.pop()

    def _missed_exit(self, scope: PollScope) -> None:
        if scope.nested:
            return
        self.c.exits_missed += 1
        rec = self.tasks.get(scope.task)
        if rec is None:
            return
        rec.exits_missed += 1
        rec.running_on = None  # the poll's end, at an unknown time
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
        if self.reads:
            self.reads.pop(rec.id, None)
        if value == RETURNED or value == PANICKED:
            rec.state_value = value
            rec.phase = FINISHED_OK if value == RETURNED else FINISHED_PANIC
            self._complete_parent_edge(rec)
            self._finish(rec)
        elif value >= FIRST_SUSPEND and (value == rec.state_value or self.catalog.valid_state(rec.site, value)):
            # (a state_value of 3+ was checked when it was set: the same again needs no check)
            rec.state_value = value
            rec.phase = SUSPENDED
            if rec.touched:
                self._mark_await(rec, value)
        else:
            rec.phase = UNKNOWN
            rec.state_value = None
            self.reject("bad __state value")

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
        unseen = rec.id in self.asked_unseen
        self.asked_unseen.discard(rec.id)
        value = int.from_bytes(data[: read.size], "little") if data is not None and len(data) >= read.size else None
        if rec.running_on is None and rec.polls > 0 and (
                (value is None and unseen) or value == 0
                or (value is not None and value >= FIRST_SUSPEND and value != rec.state_value
                    and not self.catalog.valid_state(rec.site, value))):
            # Read at a stop, not polling now, and polled before: a coroutine never goes back
            # to Unresumed, and its state is always one of its type's. Its memory holds
            # something else now (freed, or a new coroutine not polled yet), or is no longer
            # mapped (freed, the heap trimmed: for a task polled unseen, `polled_unseen`; a
            # failed read of another may be the stub's): it ended in a poll no event told of
            # (sampled out), and was dropped.
            self.c.ended_unseen += 1
            self._supersede(rec)
            return True
        if value is None:
            self.reads.pop(read.task, None)
            rec.needs_state = False
            return self.reject("state read failed")
        self._outcome(rec, value)
        return True

    def polled_unseen(self, unseen: dict[int, int]) -> None:
        """Engine.polled_unseen: ask the state of the tasks polled unseen since the last call."""
        last = self.unseen
        self.asked_unseen &= self.reads.keys()  # (the others were answered)
        for tid, n in unseen.items():
            if n > last.get(tid, 0):
                rec = self.tasks.get(tid)
                if rec is not None and not rec.finished and rec.running_on is None and not rec.needs_state:
                    self._ask_state(rec)
                    self.asked_unseen.add(tid)
        self.unseen = dict(unseen)

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
