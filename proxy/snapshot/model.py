"""The program's async state at one stop: small frozen values every renderer reads.

Built by ``proxy.snapshot.build`` (the one place where observed polls, memory,
thread stacks, runtime adapters and earlier stops are merged); read by the
monitor commands, the osdata tables, the JSON document, task threads and
``asyncrsp ps``. Nothing here reads memory or knows where a fact came from,
beyond the ``found_by`` words and the evidence strings it carries.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.analysis.model import SourceLoc
from proxy.graph.model import StateKind, TaskState  # one vocabulary of states (the engine's too)

__all__ = ["StateKind", "TaskState"]  # re-exported: renderers import them from here


@dataclass(frozen=True, slots=True)
class Resource:
    """A synchronisation object a task holds or waits on, by its address."""

    kind: str  # Mutex | RwLock | Semaphore | JoinHandle | oneshot | mpsc | watch | broadcast | Notify | Barrier
    addr: int

    def __str__(self) -> str:
        return f"{self.kind} 0x{self.addr:x}"


# _MANY: FutureNode and Frame are made per coroutine of every task (700,000 of them at 100,000
# tasks): a frozen dataclass's __init__ (object.__setattr__ per field) costs 4.5x a plain one, so
# these two are plain slotted classes, read-only by convention (nothing assigns to them after
# they are made), compared by identity.
@dataclass(slots=True, eq=False)  # read-only by convention: see _MANY
class FutureNode:
    """One pending future of a task's tree."""

    kind: str  # coroutine | combinator | leaf | unreadable | truncated
    name: str  # coroutine: its display name (names.py); else the combinator or leaf's label
    addr: int
    type_name: str = ""
    state: TaskState | None = None  # coroutines only
    detail: str = ""
    branch: str | None = None
    children: tuple[FutureNode, ...] = ()
    waits: Resource | None = None  # what this leaf (or `lock()` coroutine) waits on
    holds: tuple[Resource, ...] = ()  # guards held in this coroutine's live locals
    state_value: int | None = None  # coroutines: the raw __state read at this stop
    id: int | None = None  # coroutines the poll observation knows: their id (#N)

    def iter(self) -> Iterator[FutureNode]:
        stack = [self]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(reversed(n.children))


@dataclass(slots=True, eq=False)  # read-only by convention: see _MANY
class Frame:
    """One frame of a task's logical stack (innermost first)."""

    level: int
    name: str
    addr: int  # the coroutine's address (its `self`)
    type_name: str
    loc: SourceLoc | None  # executing line (level 0 of a running task) or the .await line
    executing: bool
    resume_fn: int | None = None  # runtime low_pc of its resume function (None: none out of line)
    inlined: bool = False  # its resume function is inlined into the next outer frame's
    state_value: int | None = None
    id: int | None = None  # observed coroutine id


@dataclass(frozen=True, slots=True)
class PollStats:
    polls: int
    busy_ns: int
    idle_ns: int
    longest_ns: int
    last_thread: int | None
    first_seq: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class Hold:
    task: int
    resource: Resource
    evidence: str


@dataclass(frozen=True, slots=True)
class Wait:
    task: int
    resource: Resource
    evidence: str
    wakers: tuple[int, ...] | None = None  # tasks that can wake it (None: memory does not tell)
    external: bool = False  # woken from outside any task (a timer, I/O, a closed channel)


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str  # cycle | blocked | unwakeable
    tasks: tuple[int, ...]
    text: str
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WaitGraph:
    holds: tuple[Hold, ...] = ()
    waits: tuple[Wait, ...] = ()
    findings: tuple[Finding, ...] = ()


class TaskParts(Protocol):
    """What makes a task's heavier values on demand (``proxy.snapshot.build``'s builder): its
    pending-future tree and logical stack (pure: from the merged tree), and the snapshot's
    wait-for graph (it may read memory: made again until every read is answered)."""

    def tree_of(self, raw: Any) -> FutureNode: ...

    def stack_of(self, raw: Any) -> tuple[Frame, ...]: ...

    def graph(self) -> tuple[WaitGraph, Mapping[int, tuple[tuple[Hold, ...], tuple[Wait, ...]]]]: ...

    def coroutines(self) -> Mapping[int, tuple[int, FutureNode]]: ...

    def thread_stack(self, tid: int) -> tuple[tuple[str, SourceLoc | None, tuple[int, str]], ...]: ...

    def timing(self) -> Any: ...

    def locals_of(self, node: FutureNode) -> Locals: ...


class Task:
    """One task of the stop. Its identity, name and state are made with the snapshot; its tree,
    logical stack and what it holds and waits on are made when first asked (``TaskParts``): at
    100,000 tasks, ``tasks --group`` needs every task's line but no tree, ``tree TASK`` one
    tree, ``deadlocks`` the wait-for graph. A value once made is kept; nothing else changes.
    Read-only by convention, like ``FutureNode`` (see _MANY): nothing assigns to a task's
    values after it is made (``replace`` makes a copy)."""

    __slots__ = ("id", "addr", "type_name", "name", "state", "stats", "found_by", "parent", "header", "spawned_at",
                 "_tree", "_stack", "_holds", "_waits", "_parts", "_raw")

    def __init__(self, id: int, addr: int, type_name: str, name: str, state: TaskState,  # noqa: A002
                 tree: FutureNode | None = None, stack: tuple[Frame, ...] | None = None,
                 stats: PollStats | None = None, found_by: tuple[str, ...] = (), parent: int | None = None,
                 holds: tuple[Hold, ...] | None = None, waits: tuple[Wait, ...] | None = None, header: str = "",
                 spawned_at: SourceLoc | None = None, *, parts: TaskParts | None = None, raw: Any = None) -> None:
        if tree is None and parts is None:
            raise TypeError("a Task needs its tree or the parts that make it")
        self.id = id
        self.addr = addr
        self.type_name = type_name
        self.name = name
        self.state = state
        self.stats = stats
        self.found_by = found_by
        self.parent = parent
        self.header = header
        self.spawned_at = spawned_at
        self._parts = parts
        self._raw = raw
        self._tree = tree
        self._stack = stack if stack is not None or parts is not None else ()
        self._holds = holds if holds is not None or parts is not None else ()
        self._waits = waits if waits is not None or parts is not None else ()

    def __repr__(self) -> str:
        return f"Task({self.label} {self.name} {self.state})"

    @property
    def tree(self) -> FutureNode:
        """The pending-future tree (the root is the task's outermost future)."""
        got = self._tree
        if got is None:
            assert self._parts is not None
            got = self._parts.tree_of(self._raw)
            self._tree = got
            if self._stack is None:
                self._stack = self._parts.stack_of(self._raw)
            self._raw = None  # (both made: the parts' tree is let go, peak memory)
        return got

    @property
    def stack(self) -> tuple[Frame, ...]:
        """The logical stack, innermost first (what ``bt`` and task threads show)."""
        got = self._stack
        if got is None:
            assert self._parts is not None
            got = self._stack = self._parts.stack_of(self._raw)
        return got

    @property
    def holds(self) -> tuple[Hold, ...]:
        if self._holds is not None:
            return self._holds
        assert self._parts is not None
        return self._parts.graph()[1].get(self.id, ((), ()))[0]

    @property
    def waits(self) -> tuple[Wait, ...]:
        if self._waits is not None:
            return self._waits
        assert self._parts is not None
        return self._parts.graph()[1].get(self.id, ((), ()))[1]

    @property
    def label(self) -> str:
        return f"#{self.id}"

    @property
    def live(self) -> bool:
        return self.state.live

    @property
    def location(self) -> SourceLoc | None:
        """Where it runs or waits: the line of the innermost coroutine of the task's own crate
        (a library's coroutines below it, such as tokio's ``Mutex::lock``, are how it waits,
        not where), else the innermost's."""
        f = self.frame
        return f.loc if f is not None else self.state.loc

    @property
    def frame(self) -> Frame | None:
        """The frame ``location`` names."""
        crate = self.name.split("::", 1)[0]
        for f in self.stack:
            if f.name.split("::", 1)[0] == crate:
                return f
        return self.stack[0] if self.stack else None

    def coroutines(self) -> Iterator[FutureNode]:
        return (n for n in self.tree.iter() if n.kind == "coroutine")

    def with_graph(self, holds: tuple[Hold, ...], waits: tuple[Wait, ...]) -> Task:
        """This task with what it holds and waits on."""
        return self.replace(holds=holds, waits=waits)

    def replace(self, **kw: Any) -> Task:
        """A copy with some values changed (its parts shared: what is not given is made as before)."""
        values: dict[str, Any] = {k: getattr(self, k) for k in _TASK_VALUES}
        values.update(tree=self._tree, stack=self._stack, holds=self._holds, waits=self._waits)
        values.update(kw)
        return Task(**values, parts=self._parts, raw=self._raw)


_TASK_VALUES = ("id", "addr", "type_name", "name", "state", "stats", "found_by", "parent", "header", "spawned_at")


@dataclass(frozen=True, slots=True)
class Local:
    """A local live across an ``.await``, its value decoded from memory at this stop."""

    name: str
    type_name: str
    value: str

    def __str__(self) -> str:
        return f"{self.name}: {self.type_name} = {self.value}"


@dataclass(frozen=True, slots=True)
class Locals:
    """The locals of a coroutine at its suspend point (``state``: the layout's name of it)."""

    state: str
    loc: SourceLoc | None
    values: tuple[Local, ...]
    suspended: bool = True  # False: no suspend point (``why`` says its state): nothing is live
    why: str = ""


@dataclass(frozen=True, slots=True)
class HistoryEdge:
    """An await edge the poll observation saw (pending, completed or dropped)."""

    parent: int
    child: int
    parent_name: str
    child_name: str
    loc: SourceLoc | None
    status: str  # pending | completed | dropped
    first_seq: int
    last_seq: int


class Snapshot:
    """The stop's async state. ``waits`` (the wait-for graph) and ``coroutines`` are made when
    first asked, by the parts that made the tasks (``TaskParts``). Read-only by convention."""

    __slots__ = ("stop", "tasks", "finished", "threads", "notes", "complete", "edges", "_waits", "_coroutines",
                 "_parts", "__weakref__")

    def __init__(self, stop: int, tasks: tuple[Task, ...], finished: int = 0,
                 threads: Mapping[int, int | None] | None = None, waits: WaitGraph | None = None,
                 notes: tuple[str, ...] = (), complete: bool = True, edges: tuple[HistoryEdge, ...] = (),
                 coroutines: Mapping[int, tuple[int, FutureNode]] | None = None, *,
                 parts: TaskParts | None = None) -> None:
        self.stop = stop
        self.tasks = tasks
        self.finished = finished  # finished coroutine instances since the start (observed), not listed
        self.threads = threads if threads is not None else {}  # LWP -> task running on it
        self.notes = notes
        self.complete = complete
        self.edges = edges
        self._parts = parts
        self._waits = waits if waits is not None or parts is not None else WaitGraph()
        self._coroutines = coroutines if coroutines is not None or parts is not None else {}

    @property
    def waits(self) -> WaitGraph:
        if self._waits is not None:
            return self._waits
        assert self._parts is not None
        return self._parts.graph()[0]

    @property
    def coroutines(self) -> Mapping[int, tuple[int, FutureNode]]:
        """Observed coroutine id -> (its task's id, its node)."""
        got = self._coroutines
        if got is None:
            assert self._parts is not None
            got = self._coroutines = self._parts.coroutines()
        return got

    def bind(self, read: Any) -> None:
        """The question now asking: what is made on demand reads memory through ``read``
        (the session's read for this question)."""
        bind = getattr(self._parts, "bind", None)
        if bind is not None:
            bind(read)

    def live(self) -> list[Task]:
        return [t for t in self.tasks if t.live]

    @property
    def timing(self) -> Any:
        """The observed tasks' poll timing at this stop (proxy.snapshot.timing.StopTiming; None:
        nothing observes the program)."""
        return self._parts.timing() if self._parts is not None else None

    def locals_of(self, node: FutureNode) -> Locals:
        """The locals live at ``node``'s suspend point, with their values read at this stop
        (raises ``LookupError`` saying why there are none to show)."""
        if self._parts is None:
            raise LookupError("memory cannot be read in this session")
        return self._parts.locals_of(node)

    def thread_stack(self, tid: int) -> tuple[tuple[str, SourceLoc | None, tuple[int, str]], ...]:
        """The coroutines on thread ``tid``'s own stack, innermost first: (name, line, (address,
        type)) (a crashed thread's async backtrace: ``asyncrsp ps``)."""
        return self._parts.thread_stack(tid) if self._parts is not None else ()

    def on_thread(self, tid: int) -> Task | None:
        task = self.threads.get(tid)
        return None if task is None else self.by_id(task)

    def by_id(self, task: int) -> Task | None:
        for t in self.tasks:
            if t.id == task:
                return t
        return None

    def task(self, ref: str | int) -> Task | None:
        """A task by id (``3``, ``"#3"``), by its address, or by any coroutine inside it."""
        found = self.locate(ref)
        return found[0] if found is not None else None

    def locate(self, ref: str | int) -> tuple[Task, FutureNode] | None:
        """The task and the coroutine node a reference names (the task's own root node
        when it names the task)."""
        text = str(ref).strip()
        try:
            if text.lower().startswith("0x"):
                addr = int(text, 16)
                for t in self.tasks:
                    if t.addr == addr:
                        return t, t.tree
                for t in self.tasks:
                    for n in t.coroutines():
                        if n.addr == addr:
                            return t, n
                return None
            num = int(text.removeprefix("#"), 10)
        except ValueError:
            return None
        t = self.by_id(num)
        if t is not None:
            return t, t.tree
        got = self.coroutines.get(num)
        if got is not None:
            owner = self.by_id(got[0])
            if owner is not None:
                return owner, got[1]
        return None
