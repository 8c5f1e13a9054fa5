"""Reflection: read every task's pending-future tree from memory at a stop.

Observed polls see only coroutines that exist as code and run while the
proxy watches; reflection reads the state machines themselves (DESIGN.md §4),
so it also works for release builds (coroutines inlined into their parent),
for tasks stuck since before the proxy attached, and with no probe planted
(``--mode off``). Pure: memory comes from the monitor's ``read`` callable
(None = not read yet; the session reads and runs the command again).

* ``walker``: ``Reflector.walk(addr, type) -> Node``, bounded.
* ``describers``: combinators (join!/select!/MaybeDone/Timeout, futures' join_all/
  select/FuturesUnordered) and leaves (Sleep, JoinHandle, Mutex/semaphore, Notify,
  oneshot, mpsc, pending, yield_now, I/O Readiness with its fd).
* ``tree``: rendering, and the overlay of the threads' running coroutines.
* ``tokio_adapter``: optional (``--tokio-adapter``) discovery of tokio's tasks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from proxy.analysis.model import Frame, Inventory

from .memory import BlockReader, ReadMemory
from .stacks import StackFinder, parse_g, stack_roots
from .tree import Root, Running, overlay, render, running_from_frames
from .walker import Node, Reflector, coroutine_path

__all__ = ["ReflectSource", "reflect_tree", "reflect_tasks", "Node", "Reflector", "Root", "coroutine_path",
           "async_frames_between"]


@dataclass(slots=True)
class ReflectSource:
    """What reflection needs about the program; one per session."""

    inventory: Inventory
    bias: int
    symbol_at: Callable[[int], str | None] | None = None  # link-time addr -> demangled name
    frames_at: Callable[[int], list[Frame]] | None = None  # link-time pc -> frames, inlined first
    now_ns: Callable[[], int] | None = None  # the target host's CLOCK_MONOTONIC (local targets)
    discover: Callable[[Reflector], "list[Root] | None"] | None = None  # runtime adapter
    note: str | None = None  # e.g. why the adapter is off
    seen: dict[tuple[int, str], Root] = field(default_factory=dict)  # tasks found at earlier stops
    seen_status: dict[tuple[int, str], str] = field(default_factory=dict)  # their walk's status then
    stacks: Callable[[], "StackFinder | None"] | None = None  # built on first use (stacks.py)
    stack_notes: list[str] = field(default_factory=list)  # what the last stack discovery could not do
    stack_chains: dict[int, list[tuple[int, str] | None]] = field(default_factory=dict)  # stacks.StackFinder.chains
    chain_pcs: dict[tuple[int, str], int] = field(default_factory=dict)  # stacks.StackFinder.chain_pcs

    def reflector(self, read: ReadMemory | BlockReader) -> Reflector:
        return Reflector(self.inventory, self.bias, read, now_ns=self.now_ns() if self.now_ns else None,
                         symbol_at=self.symbol_at)


def _engine_roots(engine, src: ReflectSource, origin: str = "observed") -> list[Root]:  # type: ignore[no-untyped-def]
    out = []
    if engine is None:
        return out
    for t in engine.roots():
        if t.finished:
            continue
        layout = engine.catalog.layout_for(t.site)
        if layout is None:
            continue
        thread = f", thread {t.last_thread}" if t.last_thread is not None else ""
        out.append(Root(t.self_ptr, layout.type_name, t.label, origin, t.last_thread,
                        header=f"root{thread}"))
    return out


def _running(engine, src: ReflectSource, pcs: dict[int, int]) -> list[Running]:  # type: ignore[no-untyped-def]
    out = []
    for thread, pc in pcs.items():
        if src.frames_at is None or pc <= src.bias:
            continue
        try:
            frames = src.frames_at(pc - src.bias)
        except Exception:  # a line table we cannot read: no overlay, not an error
            continue
        addr = None
        if engine is not None:  # the observed innermost scope pins the physical frame's task
            scope = engine.current_scope(thread)
            t = engine.task(scope.task) if scope is not None else None
            addr = t.self_ptr if t is not None else None
        run = running_from_frames(thread, frames, None)
        if run is not None:
            out.append(run if addr is None else Running(run.thread, run.chain, run.loc, None))
    return out


def thread_regs(raw: dict[int, bytes] | None) -> dict[int, dict[str, int]]:
    """The session's `g` replies per thread -> register dicts (unparsable ones left out)."""
    out = {}
    for tid, reply in (raw or {}).items():
        regs = parse_g(reply)
        if regs is not None:
            out[tid] = regs
    return out


def _stack_roots(src: ReflectSource, r: Reflector, threads: dict[int, dict[str, int]]) -> list[Root]:
    finder = src.stacks() if src.stacks is not None and threads else None
    if finder is None:
        return []
    found = finder.find(r, threads)
    src.stack_notes = list(finder.notes)
    src.stack_chains = dict(finder.chains)
    src.chain_pcs = dict(finder.chain_pcs)
    return stack_roots(found)


def collect_roots(src: ReflectSource, r: Reflector, engine,  # type: ignore[no-untyped-def]
                  threads: dict[int, dict[str, int]] | None = None, engine_origin: str = "observed") -> list[Root]:
    roots: dict[tuple[int, str], Root] = {}
    for root in _engine_roots(engine, src, engine_origin):
        roots[root.addr, root.type_name] = root
    for root in _stack_roots(src, r, threads or {}):
        roots.setdefault((root.addr, root.type_name), root)
    if src.discover is not None:
        for root in src.discover(r) or ():
            have = roots.setdefault((root.addr, root.type_name), root)
            if have is not root and root.label and not have.label:  # on a stack, and the runtime's task
                roots[root.addr, root.type_name] = replace(have, label=root.label)
    if engine is not None:  # the engine saw these finish: their memory may hold anything now
        for t in engine.roots():
            layout = engine.catalog.layout_for(t.site) if t.finished else None
            if layout is not None and (t.self_ptr, layout.type_name) not in roots:
                src.seen.pop((t.self_ptr, layout.type_name), None)
    for (addr, tname), root in src.seen.items():
        roots.setdefault((addr, tname), Root(root.addr, root.type_name, root.label, "seen before", root.thread,
                                             header="seen at an earlier stop"))
    return list(roots.values())


def _parents_index(inv: Inventory) -> dict[str, list[tuple[str, int, int]]]:
    """child layout -> [(parent layout, state value, child offset in parent)] for inline awaits."""
    idx: dict[str, list[tuple[str, int, int]]] = {}
    for lay in inv.layouts.values():
        for st in lay.states:
            a = st.awaitee
            if a is None:
                continue
            child, off = a.type_name, a.offset
            t = inv.types.get(child)
            if child not in inv.layouts and t is not None and child.startswith(
                    "core::future::from_generator::GenFuture<") and t.fields:
                child, off = t.fields[0].type_name, off + t.fields[0].offset  # rustc 1.63
            if child in inv.layouts:
                idx.setdefault(child, []).append((lay.type_name, st.value, off))
    return idx


def lift(r: Reflector, addr: int, type_name: str, max_hops: int = 16) -> tuple[int, str, int]:
    """The outermost coroutine that stores this one inline (release builds inline the
    parents' resume functions, so the observed poll may be a grandchild's): step out while
    exactly one candidate parent's ``__state`` says it awaits this very child."""
    idx = getattr(r.inv, "_reflect_parents", None)
    if idx is None:
        idx = _parents_index(r.inv)
        try:
            r.inv._reflect_parents = idx  # type: ignore[attr-defined]
        except AttributeError:
            pass
    hops = 0
    while hops < max_hops:
        found = []
        for parent, value, off in idx.get(type_name, ()):
            lay = r.inv.layouts[parent]
            p = addr - off
            if p <= 0:
                continue
            if r.mem.u(p + lay.state_offset, lay.state_size) == value:
                found.append((p, parent))
        if len(set(found)) != 1:
            break
        addr, type_name = found[0]
        hops += 1
    return addr, type_name, hops


def coroutine_path_to(r: Reflector, outer: tuple[int, str], inner: tuple[int, str]) -> list[Node] | None:
    """The coroutine nodes from ``outer`` down to ``inner`` (both included) in outer's tree
    read from memory: the coroutines stored inline between two observed frames (release
    builds inline their resume functions into the outer one's). None when the tree does not
    hold ``inner`` (memory not read yet, a parent whose ``__state`` is stale, garbage)."""
    return _path_in(r.walk(*outer), inner)


def _path_in(tree: Node, inner: tuple[int, str]) -> list[Node] | None:
    def find(n: Node, path: list[Node]) -> list[Node] | None:
        if n.kind == "coroutine":
            path = path + [n]
            if (n.addr, n.type_name) == inner and len(path) > 1:
                return path
        for c in n.children:
            got = find(c, path)
            if got is not None:
                return got
        return None

    if tree.kind != "coroutine" or (tree.addr, tree.type_name) == inner:
        return None
    return find(tree, [])


def async_frames_between(src: ReflectSource, read: ReadMemory, chain: list[tuple[int, str]],  # type: ignore[no-untyped-def]
                         engine=None, pcs: dict[int, int] | None = None,
                         threads: dict[int, dict[str, int]] | None = None) -> tuple[list[list[Node]], list[Node]]:
    """For a logical backtrace's observed coroutines (innermost first, (address, layout)):
    ``between[i]`` lists the coroutines stored inline between frame i and frame i+1,
    innermost first, then frame i+1's own node (its ``.await`` line, from the layout); it
    is empty when frame i+1's tree does not hold frame i. ``above``: the coroutines that
    hold the outermost frame inline (``lift``), innermost first; when it is not inline (a
    ``Box<dyn Future>`` child, LTO builds inlining the parent into the executor), the task
    trees of ``walk_all`` (the threads' stacks, the adapter) are searched for it."""
    r = src.reflector(read)
    between: list[list[Node]] = []
    for inner, outer in zip(chain, chain[1:]):
        path = coroutine_path_to(r, outer, inner)
        between.append(list(reversed(path[:-1])) if path else [])
    above: list[Node] = []
    if chain:
        addr, tname, hops = lift(r, *chain[-1])
        if hops:
            path = coroutine_path_to(r, (addr, tname), chain[-1])
            above = list(reversed(path[:-1])) if path else []
        if not above and threads:
            trees, _ = walk_all(src, read, engine, dict(pcs or {}), threads)
            for _, tree in trees:
                path = _path_in(tree, chain[-1])
                if path:
                    above = list(reversed(path[:-1]))
                    break
    return between, above


def walk_all(src: ReflectSource, read: ReadMemory, engine, pcs: dict[int, int],  # type: ignore[no-untyped-def]
             threads: dict[int, dict[str, int]] | None = None,
             engine_origin: str = "observed") -> tuple[list[tuple[Root, Node]], Reflector]:
    """Every root's tree. ``engine_origin``: how the engine's tasks are marked ("seen
    before" when nothing observes any more, mode off)."""
    r = src.reflector(read)
    src.stack_chains = {}
    src.chain_pcs = {}
    roots = collect_roots(src, r, engine, threads, engine_origin)
    for tid, regs in (threads or {}).items():  # every thread's pc marks what runs there
        pcs.setdefault(tid, regs.get("rip", 0))
    lifted: dict[tuple[int, str], Root] = {}
    for root in roots:
        addr, tname, hops = lift(r, root.addr, root.type_name)
        if hops:
            root = Root(addr, tname, "", root.origin, root.thread,
                        header=f"{root.header}; holds {root.label or 'the observed task'} inline")
        key = (root.addr, root.type_name)
        prev = lifted.get(key)
        if prev is None:
            lifted[key] = root
        elif root.origin == "stack" and "stack" not in prev.origin:  # seen, and on a stack now
            lifted[key] = replace(prev, origin=f"{prev.origin}, stack")
        elif root.label and not prev.label:  # found on a stack first: keep the runtime's task id
            lifted[key] = replace(prev, label=root.label)
    out = []
    for root in lifted.values():
        key = (root.addr, root.type_name)
        r.mem.missing = False
        tree = r.walk(root.addr, root.type_name)
        if tree.kind == "coroutine" and tree.status in ("completed", "panicked"):
            src.seen.pop(key, None)
            continue
        if root.origin == "seen before" and _gone(tree, src.seen_status.get(key)):
            # Nothing at this stop says the task still exists (no poll, not on a stack, not in
            # the runtime's list) and its memory does not hold it any more: it completed and
            # was freed (a heap slot reused), its stack frame returned, or it was moved. Not
            # corruption: a task found at this stop still shows garbage as <unreadable ...>.
            # Left out silently, like a task seen completing.
            if not r.mem.missing:  # every read of its walk answered: forget it for good
                src.seen.pop(key, None)
                src.seen_status.pop(key, None)
            continue
        if tree.kind == "coroutine" and root.origin != "seen before":
            src.seen[key] = root
            src.seen_status[key] = tree.status
        out.append((root, tree))
    out = _outermost(_nest_stack_chains(out, src.stack_chains, src))
    for run in _running(engine, src, pcs):
        for _, tree in out:
            if overlay(tree, run):
                break
    _link_mutexes(out)
    return out, r


def _gone(tree: Node, status_then: str | None) -> bool:
    """A task seen at an earlier stop whose memory no longer holds it: its ``__state`` is
    no state of its layout or something below it is unreadable (the slot holds other
    bytes now), or it reads ``Unresumed`` after it was seen suspended (a coroutine never
    goes back to its first state)."""
    if any(n.kind == "unreadable" for n in tree.iter()):
        return True
    return tree.kind == "coroutine" and tree.status == "not yet polled" and status_then in ("pending", "running")


def _nest_stack_chains(trees: list[tuple[Root, Node]], chains: dict[int, list[tuple[int, str] | None]],
                       src: ReflectSource | None = None) -> list[tuple[Root, Node]]:
    """A coroutine polled by another one on a thread's stack is its child now, even when the
    parent's ``__state`` does not say so yet (its first poll, or a new await since its last
    suspend): put the child's tree under the parent, marked running. The parent's ``.await``
    line is then the one its own frame is at (its ``__state`` still names the await it last
    suspended at: nested's ``run`` at ``looped().await`` showed ``a(i).await``'s line)."""
    for tid, chain in chains.items():
        for inner, outer in zip(chain, chain[1:]):
            if inner is None or outer is None:
                continue
            nodes = {(n.addr, n.type_name): n for _, t in trees for n in t.iter() if n.kind == "coroutine"}
            parent = nodes.get(outer)
            child = next(((rt, t) for rt, t in trees if (t.addr, t.type_name) == inner), None)
            if parent is None or child is None or child[1] is parent:
                continue
            if any((n.addr, n.type_name) == inner for n in parent.iter()):
                continue  # the parent's state already shows it
            parent.status, parent.detail = "running", f"running on thread {tid}"
            parent.children = [child[1]]
            loc = _frame_line(src, outer)
            if loc is not None:
                parent.loc = loc
            trees = [x for x in trees if x is not child]
    return trees


def _frame_line(src: ReflectSource | None, key: tuple[int, str]):  # type: ignore[no-untyped-def]
    """The source line of the resume frame that polls ``key`` (its own function's line:
    the outermost of the frames at that pc, the physical one), or None."""
    pc = src.chain_pcs.get(key) if src is not None else None
    if pc is None or src is None or src.frames_at is None:
        return None
    try:
        frames = src.frames_at(pc)
    except Exception:  # a line table we cannot read: keep the state's line  # noqa: BLE001
        return None
    return frames[-1].loc if frames else None


def _outermost(trees: list[tuple[Root, Node]]) -> list[tuple[Root, Node]]:
    """Drop a root that another root's tree holds (a frame's coroutine inside its task)."""
    inner: set[tuple[int, str]] = set()
    for _, tree in trees:
        for n in tree.iter():
            if n is not tree and n.kind == "coroutine":
                inner.add((n.addr, n.type_name))
    return [(root, tree) for root, tree in trees if (tree.addr, tree.type_name) not in inner]


def _link_mutexes(trees: list[tuple[Root, Node]]) -> None:
    """A task waiting on a Mutex another task holds: say who holds it."""
    holders: dict[int, str] = {}
    for root, tree in trees:
        for n in tree.iter():
            for m in n.holds:
                holders.setdefault(m, f"task {root.label or hex(root.addr)} {tree.label}")
    for root, tree in trees:
        for n in tree.iter():
            if n.waits_on is not None and n.waits_on in holders:
                n.detail += f", held by {holders[n.waits_on]}"


def reflect_tree(src: ReflectSource, read: ReadMemory, engine=None, pcs=None,  # type: ignore[no-untyped-def]
                 only: int | None = None, threads: dict[int, dict[str, int]] | None = None) -> str:
    trees, _ = walk_all(src, read, engine, dict(pcs or {}), threads)
    if only is not None:
        trees = [(root, t) for root, t in trees if root.addr == only]
    if not trees:
        hint = src.note or (None if src.discover is not None else
                            "tasks are found by observing polls, or with --tokio-adapter without them")
        return "no pending tasks" + (f" ({hint})" if hint else "")
    lines: list[str] = [f"note: {src.note}"] if src.note else []
    lines += [f"note: {n}" for n in src.stack_notes]
    for root, tree in trees:
        lines += render(root, tree)
    return "\n".join(lines)


TASK_COLUMNS = ("TASK", "ADDRESS", "STATE", "FOUND BY", "ASYNC FN")


def reflect_tasks(src: ReflectSource, read: ReadMemory, engine=None, pcs=None,  # type: ignore[no-untyped-def]
                  threads: dict[int, dict[str, int]] | None = None, engine_origin: str = "observed") -> str:
    rows = reflect_task_rows(src, read, engine, pcs, threads, engine_origin)
    if not rows:
        return "no tasks found by reflection" + (f" ({src.note})" if src.note else "")
    return table([TASK_COLUMNS, *rows])


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def reflect_task_rows(src: ReflectSource, read: ReadMemory, engine=None, pcs=None,  # type: ignore[no-untyped-def]
                      threads: dict[int, dict[str, int]] | None = None,
                      engine_origin: str = "observed") -> list[tuple[str, ...]]:
    """One row per task read from memory (TASK_COLUMNS)."""
    trees, _ = walk_all(src, read, engine, dict(pcs or {}), threads, engine_origin)
    rows = []
    for root, tree in trees:
        if tree.kind != "coroutine":
            state = tree.label
        elif tree.status == "running":
            state = f"Running ({tree.detail})"
        elif tree.status == "pending":
            state = f"Suspended at {tree.loc}" if tree.loc else "Suspended"
        else:
            state = tree.status
        rows.append((root.label or "-", f"0x{root.addr:x}", state, root.origin, tree.label))
    return rows
