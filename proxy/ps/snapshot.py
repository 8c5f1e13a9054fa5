"""One async snapshot of a `ProgramImage`, for the one-shot commands.

`take` is the only place `asyncrsp ps`/`tree` gather facts: it walks every
task's pending-future tree (reflection: the tokio adapter over the image's
heap, the threads' stacks) and derives the waits and the wait-for cycles
from it, like CPython's ``asyncio.tools`` builds its await graph once and
finds the cycles in it. The renderers only format what it returns.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from proxy.analysis.model import SourceLoc

from proxy.corefile.image import ProgramImage
from proxy.reflect import ReflectSource, walk_all
from proxy.reflect.tree import Root, _first_coroutine_below, norm, render
from proxy.reflect.walker import Node, coroutine_path


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
class Crash:
    """The thread that took the signal that ended the program, and its async frames."""

    thread: int
    signal: str  # "SIGSEGV"
    address: int | None  # the faulting address (SIGSEGV, SIGBUS)
    frames: list[tuple[str, str, str]]  # innermost first: (coroutine, "file:line" or "", task title)

    def lines(self) -> list[str]:
        at = f" at address 0x{self.address:x}" if self.address is not None else ""
        out = [f"crashed: thread {self.thread}, {self.signal}{at}"]
        if not self.frames:
            return out + ["  no async frame on its stack"]
        out.append(f"async backtrace of thread {self.thread}:")
        for i, (name, loc, task) in enumerate(self.frames):
            out.append(f"  #{i} {name}" + (f" at {loc}" if loc else "") + (f"  ({task})" if task else ""))
        return out


@dataclass(slots=True)
class PsSnapshot:
    origin: str
    pid: int
    tasks: list[PsTask]
    cycles: list[Cycle]
    notes: list[str] = field(default_factory=list)
    stopped_ns: int | None = None  # live processes: how long the program was stopped
    copied: int | None = None  # bytes copied while stopped
    crash: Crash | None = None  # a core of a program killed by a signal

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
    mark_running(src, trees)
    tasks = []
    for root, tree in trees:
        nodes = list(tree.iter())
        tasks.append(PsTask(
            root.label or "-", root.addr, tree.label, root.type_name, _state(tree), root.origin,
            _innermost(tree), [n.waits_on for n in nodes if n.waits_on is not None],
            [m for n in nodes for m in n.holds], tree, root))
    notes = ([src.note] if src.note else []) + list(src.stack_notes)
    snap = PsSnapshot(image.origin, image.pid, tasks, find_cycles(tasks), notes, crash=crash_of(image, src, tasks))
    stopped = image.extra.get("stopped_ns")
    copied = image.extra.get("copied")
    snap.stopped_ns = stopped if isinstance(stopped, int) else None
    snap.copied = copied if isinstance(copied, int) else None
    return snap


def async_frames(src: ReflectSource, key: tuple[int, str]) -> list[tuple[str, SourceLoc | None]]:
    """The coroutines executing in the resume frame of `key` on its thread's stack,
    innermost first, each at its line: the frame's own coroutine and, in optimised
    builds, the ones inlined into it (release: leaf and middle inside outer's resume)."""
    pc = src.chain_pcs.get(key)
    if pc is None or src.frames_at is None:
        return [(coroutine_path(key[1]), None)]
    try:
        frames = src.frames_at(pc)
    except Exception:  # noqa: BLE001 - a line table we cannot read: the name alone
        return [(coroutine_path(key[1]), None)]
    out = [(norm(f.function), f.loc) for f in frames if "{" in f.function and " as " not in f.function]
    return out or [(coroutine_path(key[1]), frames[-1].loc if frames else None)]


def mark_running(src: ReflectSource, trees: list[tuple[Root, Node]]) -> None:
    """A coroutine whose resume function is on a thread's stack runs there, whatever its
    ``__state`` still says (it changes only when the poll returns): mark it and the
    coroutines inlined into its frame, each with the line it is at; the innermost one's
    children are not awaited yet."""
    nodes = {(n.addr, n.type_name): n for _, t in trees for n in t.iter() if n.kind == "coroutine"}
    for tid, chain in src.stack_chains.items():
        for i, key in enumerate(chain):
            node = nodes.get(key) if key is not None else None
            if node is None or key is None:
                continue
            inner = list(reversed(async_frames(src, key)))  # outermost first: the frame's own first
            for j, (name, loc) in enumerate(inner):
                below = node if j == 0 else _first_coroutine_below(node, name)
                if below is None:
                    break
                node = below
                node.status, node.detail = "running", f"running on thread {tid}"
                node.loc = loc or node.loc
            if i == 0:
                node.children = []


def crash_of(image: ProgramImage, src: ReflectSource, tasks: list[PsTask]) -> Crash | None:
    fault = image.fault
    thread = next((t for t in image.threads if t.signal), None)
    if thread is None or fault is None or fault[0] in (signal.SIGSTOP, 0):
        return None  # gcore writes SIGSTOP: the program did not die
    try:
        name = signal.Signals(thread.signal).name
    except ValueError:
        name = f"signal {thread.signal}"
    address = fault[2] if fault[0] in (signal.SIGSEGV, signal.SIGBUS) and fault[0] == thread.signal else None
    owner = {}
    for t in tasks:
        for n in t.tree.iter():
            owner.setdefault((n.addr, n.type_name), t.title)
    frames = []
    for key in src.stack_chains.get(thread.tid, []):
        if key is None:
            continue
        for fn, loc in async_frames(src, key):
            frames.append((fn, str(loc) if loc else "", owner.get(key, "")))
    return Crash(thread.tid, name, address, frames)


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
