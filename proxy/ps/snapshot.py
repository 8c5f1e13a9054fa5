"""One async snapshot of a `ProgramImage`, for the one-shot commands.

`take` is the only place `asyncrsp ps`/`tree` gather facts: it walks every
task's pending-future tree (reflection: the tokio adapter over the image's
heap, the threads' stacks) and derives the waits and the wait-for cycles
from it, like CPython's ``asyncio.tools`` builds its await graph once and
finds the cycles in it. The renderers only format what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.corefile.image import ProgramImage
from proxy.reflect import ReflectSource, walk_all
from proxy.reflect.tree import Root, render
from proxy.reflect.walker import Node


@dataclass(slots=True)
class PsTask:
    label: str  # "tokio#3", or "-" for a task with no runtime id
    addr: int
    name: str  # the outermost coroutine ("stuck::lock_ab")
    type_name: str
    state: str  # "suspended at FILE:LINE", "running on thread N", ...
    found_by: str
    awaits: str  # the innermost pending future ("tokio::time::Sleep (59.9 min left)")
    waits_on: list[int]  # Mutexes it waits for
    holds: list[int]  # Mutexes whose guard it holds
    tree: Node
    root: Root

    @property
    def title(self) -> str:
        return f"{self.label} {self.name}" if self.label != "-" else f"0x{self.addr:x} {self.name}"


@dataclass(slots=True)
class Cycle:
    tasks: list[PsTask]
    resources: list[int]  # resources[i]: what tasks[i] waits on, held by tasks[i+1]

    def text(self) -> str:
        parts = []
        for t, res in zip(self.tasks, self.resources):
            parts.append(f"{t.title} -> Mutex 0x{res:x} held by")
        return "cycle: " + " ".join(parts) + f" {self.tasks[0].title}"


@dataclass(slots=True)
class PsSnapshot:
    origin: str
    pid: int
    tasks: list[PsTask]
    cycles: list[Cycle]
    notes: list[str] = field(default_factory=list)
    stopped_ns: int | None = None  # live processes: how long the program was stopped
    copied: int | None = None  # bytes copied while stopped

    def tree_lines(self) -> list[str]:
        out = []
        for t in self.tasks:
            out += render(t.root, t.tree)
        return out


def _state(tree: Node) -> str:
    if tree.kind != "coroutine":
        return tree.label
    if tree.status == "running":
        return tree.detail or "running"
    if tree.status == "pending":
        return f"suspended at {tree.loc}" if tree.loc else "suspended"
    return tree.status


def _innermost(tree: Node) -> str:
    n = tree
    while n.children:
        pending = [c for c in n.children if c.status != "completed"]
        n = (pending or n.children)[-1]
    if n is tree:
        return ""
    return f"{n.label} ({n.detail})" if n.detail else n.label


def take(image: ProgramImage, src: ReflectSource) -> PsSnapshot:
    """Walk every task of `image` (see the module docstring)."""
    threads = {t.tid: dict(t.regs) for t in image.threads}
    trees, _ = walk_all(src, image.read, None, {}, threads)
    tasks = []
    for root, tree in trees:
        nodes = list(tree.iter())
        tasks.append(PsTask(
            root.label or "-", root.addr, tree.label, root.type_name, _state(tree), root.origin,
            _innermost(tree), [n.waits_on for n in nodes if n.waits_on is not None],
            [m for n in nodes for m in n.holds], tree, root))
    notes = ([src.note] if src.note else []) + list(src.stack_notes)
    snap = PsSnapshot(image.origin, image.pid, tasks, find_cycles(tasks), notes)
    stopped = image.extra.get("stopped_ns")
    copied = image.extra.get("copied")
    snap.stopped_ns = stopped if isinstance(stopped, int) else None
    snap.copied = copied if isinstance(copied, int) else None
    return snap


def find_cycles(tasks: list[PsTask]) -> list[Cycle]:
    """Cycles of "waits on a Mutex held by": each cycle once, from its first task."""
    holder = {m: t for t in tasks for m in t.holds}
    edges: dict[int, tuple[int, PsTask]] = {}  # task index -> (resource, holder)
    index = {id(t): i for i, t in enumerate(tasks)}
    for i, t in enumerate(tasks):
        for m in t.waits_on:
            h = holder.get(m)
            if h is not None and h is not t:
                edges[i] = (m, h)
                break
    cycles: list[Cycle] = []
    seen: set[int] = set()
    for start in range(len(tasks)):
        path: list[int] = []
        at: int | None = start
        while at is not None and at not in path and at not in seen:
            path.append(at)
            nxt = edges.get(at)
            at = index[id(nxt[1])] if nxt else None
        if at is not None and at in path:
            loop = path[path.index(at):]
            first = loop.index(min(loop))
            loop = loop[first:] + loop[:first]
            cycles.append(Cycle([tasks[i] for i in loop], [edges[i][0] for i in loop]))
        seen.update(path)
    return cycles
