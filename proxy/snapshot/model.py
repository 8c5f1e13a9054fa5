"""The program's async state at one stop: small frozen values every renderer reads.

Built by ``proxy.snapshot.build`` (the one place where observed polls, memory,
thread stacks, runtime adapters and earlier stops are merged); read by the
monitor commands, the osdata tables, the JSON document, task threads and
``asyncrsp ps``. Nothing here reads memory or knows where a fact came from,
beyond the ``found_by`` words and the evidence strings it carries.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class Task:
    id: int
    addr: int
    type_name: str
    name: str
    state: TaskState
    tree: FutureNode
    stack: tuple[Frame, ...] = ()
    stats: PollStats | None = None
    found_by: tuple[str, ...] = ()
    parent: int | None = None
    holds: tuple[Hold, ...] = ()
    waits: tuple[Wait, ...] = ()
    header: str = ""  # what the task line says of it besides its state ("on the stack of thread 7")
    spawned_at: SourceLoc | None = None

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
        """This task with what it holds and waits on (``dataclasses.replace`` costs a third of
        the wait-for graph's loop at 100,000 tasks)."""
        return Task(self.id, self.addr, self.type_name, self.name, self.state, self.tree, self.stack, self.stats,
                    self.found_by, self.parent, holds, waits, self.header, self.spawned_at)


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


@dataclass(frozen=True, slots=True)
class Snapshot:
    stop: int
    tasks: tuple[Task, ...]
    finished: int = 0  # finished coroutine instances since the start (observed), not listed
    threads: Mapping[int, int | None] = field(default_factory=dict)  # LWP -> task running on it
    waits: WaitGraph = WaitGraph()
    notes: tuple[str, ...] = ()
    complete: bool = True
    edges: tuple[HistoryEdge, ...] = ()
    coroutines: Mapping[int, tuple[int, FutureNode]] = field(default_factory=dict)  # id -> (task, node)

    def live(self) -> list[Task]:
        return [t for t in self.tasks if t.live]

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
