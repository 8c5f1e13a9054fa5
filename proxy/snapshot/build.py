"""Build the snapshot of one stop: the one place where the sources are merged.

Theory of operation. The inputs each know part of the truth:

* the **engine** (observed polls): identity (``#N``), which coroutine polls
  which one on each thread right now (its poll scopes), poll counts and times,
  and the edges it saw complete; it knows nothing it did not see poll;
* **memory** (``proxy.reflect.walker``): each coroutine's ``__state``, its
  awaitee tree and live locals; it cannot tell that a coroutine runs (the
  state is written only when it suspends or returns);
* the **threads' stacks** (``proxy.reflect.stacks``): the futures an executor
  or a resume frame holds, and who polls whom on each thread, also with
  nothing observed (mode off, release builds, attach);
* the **pcs**: the executing line, and the coroutines inlined into the
  physical frame there (release builds);
* **runtime adapters**: every spawned task the runtime keeps;
* **earlier stops**: tasks found before that nothing above finds now.

The merge rules, each with its reason:

1. A task is keyed by (address, state-machine type): the engine's task, a stack
   frame's future and the adapter's task at that key are one task. The engine's
   id names it when it has one; else ``TaskIds`` gives it one for its life.
2. A root found somewhere is lifted to the outermost coroutine that stores it
   inline (``lift``): release builds inline parents into one resume function,
   so the observed poll may be a grandchild's.
3. A root that another root's tree holds is not a task of its own (it is a
   frame inside that task).
4. A coroutine on a thread's poll chain (engine scopes, else the stack's chain)
   **runs** there, whatever its ``__state`` says: during its first poll the
   state still reads Unresumed, and after an earlier suspend it names the old
   await. Its children on the chain are put under it (the state does not show
   them yet). The innermost one shows the thread's current line; an outer one
   the ``.await`` it polls its child at (its state when that state holds the
   child, else the frame's line, else the one suspend state whose members hold
   the child's type: never the return address inside ``maybe_done.rs``).
5. A running coroutine's children read from memory are stale (its state was
   written at its last suspend): the innermost running one has none.
6. Coroutines inlined at the pc (release builds) are matched by name below the
   innermost running one that memory holds, and run too.
7. A task seen at an earlier stop and found by nothing now is shown while its
   memory still holds it; when its memory no longer does (the slot was reused,
   the state went back to Unresumed after it was seen suspended) it is gone.
8. A task the engine saw finish is not read from memory (its slot may hold
   anything now); it counts in ``finished``.
9. Without memory (no reader, no layouts) the tree is the engine's pending edges.

Pure: memory comes through ``read`` (None = not read yet: the caller reads and
builds again); the registers and pcs come with the inputs.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.analysis.model import Frame as SrcFrame
from proxy.analysis.model import Inventory, SourceLoc
from proxy.reflect.memory import BlockReader, ReadMemory
from proxy.reflect.tree import (Root, _first_coroutine_below, ident, is_coroutine, mark_running, norm, overlay_matches,
                                running_from_frames)
from proxy.reflect.walker import Node, Reflector

from .ids import TaskIds
from .model import (
    FutureNode,
    Resource,
    Frame,
    HistoryEdge,
    PollStats,
    Snapshot,
    StateKind,
    Task,
    TaskState,
)
from .plans import parents_index, resume_fns
from .names import await_line_for, display_name, layout_name, user_line
from .waits import analyse

Key = tuple[int, str]


@dataclass(slots=True)
class EarlierStops:
    """Tasks found at earlier stops (session-owned, updated by each build)."""

    seen: dict[Key, Root] = field(default_factory=dict)
    status: dict[Key, str] = field(default_factory=dict)


@dataclass(slots=True)
class SnapshotInputs:
    inventory: Inventory | None = None
    bias: int = 0
    engine: Any = None  # proxy.graph.engine.Engine | None
    engine_origin: str = "observed"  # "seen before" when nothing observes any more (mode off)
    threads: Mapping[int, dict[str, int]] = field(default_factory=dict)  # LWP -> registers
    pcs: Mapping[int, int] = field(default_factory=dict)  # LWP -> pc at this stop
    frames_at: Callable[[int], list[SrcFrame]] | None = None  # link-time pc -> frames, inlined first
    symbol_at: Callable[[int], str | None] | None = None
    stacks: Callable[[], Any] | None = None  # -> proxy.reflect.stacks.StackFinder | None
    adapters: Sequence[Callable[[Reflector], list[Root] | None]] = ()
    now_ns: int | None = None
    earlier: EarlierStops = field(default_factory=EarlierStops)
    ids: TaskIds = field(default_factory=TaskIds)
    notes: tuple[str, ...] = ()
    memory: bool = True  # False: no memory reads at all (the tree is the engine's edges)
    source: Any = None  # the ReflectSource it came from: told what the stacks showed (stack_chains...)
    missed: Callable[[], bool] | None = None  # the caller's: a read of this pass was not answered yet

    @classmethod
    def from_source(cls, src: Any, **kw: Any) -> SnapshotInputs:
        """From a ``proxy.reflect.ReflectSource`` (inventory, bias, helpers, earlier stops)."""
        adapters = [src.discover] if getattr(src, "discover", None) is not None else []
        notes = (src.note,) if getattr(src, "note", None) else ()
        return cls(inventory=src.inventory, bias=src.bias, frames_at=src.frames_at, symbol_at=src.symbol_at,
                   stacks=src.stacks, adapters=adapters, now_ns=src.now_ns() if src.now_ns else None,
                   earlier=EarlierStops(src.seen, src.seen_status), ids=src.ids,
                   notes=notes + tuple(kw.pop("notes", ())), source=src, **kw)


def build_snapshot(inputs: SnapshotInputs, read: ReadMemory | None, stop: int = 0) -> Snapshot:
    # The build makes a few objects per node of every task and frees none of them until it
    # ends: the cyclic collector would walk the growing heap again and again for nothing
    # (a third of the build at 100,000 tasks). Nothing it makes is garbage before it returns.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _Builder(inputs, read).build(stop)
    finally:
        if enabled:
            gc.enable()


def merged_trees(src: Any, read: ReadMemory, engine: Any, pcs: Mapping[int, int],
                 threads: Mapping[int, dict[str, int]], engine_origin: str = "observed",
                 ) -> tuple[list[tuple[Root, Node]], Reflector]:
    """The merged trees as ``(Root, Node)`` before they become a Snapshot (``proxy.reflect.
    walk_all``: task threads and ``asyncrsp ps`` read them so); running nodes say
    ``running on thread N`` in their detail."""
    b = _Builder(SnapshotInputs.from_source(src, engine=engine, engine_origin=engine_origin, pcs=dict(pcs),
                                            threads=dict(threads)), read)
    if b.engine is not None:
        b.inp.ids.attach(b.engine, b.engine.highest_id)
        b._index_engine()
    trees = b._memory_trees() if b.r is not None else b._engine_trees()
    for _, tree in trees:
        for n in tree.iter():
            if id(n) in b.running:
                n.status, n.detail = "running", f"running on thread {b.running[id(n)]}"
    r = b.r if b.r is not None else src.reflector(read)
    return trees, r


class _Builder:
    def __init__(self, inp: SnapshotInputs, read: ReadMemory | None) -> None:
        self.inp = inp
        self.inv = inp.inventory
        self.engine = inp.engine
        self.notes: list[str] = list(inp.notes)
        self.r: Reflector | None = None
        if read is not None and self.inv is not None and inp.memory and self.inv.layouts:
            self.r = Reflector(self.inv, inp.bias, BlockReader(read), now_ns=inp.now_ns, symbol_at=inp.symbol_at)
            self.r.pending = inp.missed
        self.engine_ids: dict[Key, int] = {}  # unfinished engine tasks by key
        self.finished_keys: set[Key] = set()
        self.stack_keys: dict[Key, int] = {}  # futures found on a thread's stack -> the thread
        self.engine_fns: dict[Key, tuple[int, int]] = {}  # observed coroutine -> its resume fn (link-time)
        self.chains: dict[int, list[Key | None]] = {}  # LWP -> running coroutines, innermost first
        self.chain_pcs: dict[Key, int] = {}
        self.running: dict[int, int] = {}  # id(Node) -> thread
        self._pcf: list[list[SrcFrame]] | None = None
        self.frame_pcs: dict[int, list[int]] = {}  # LWP -> every unwound frame's link-time pc
        self._states: dict[tuple[Any, ...], tuple[str, TaskState]] = {}  # see _convert
        self._found: dict[str, tuple[str, ...]] = {}  # Root.origin -> Task.found_by
        self.below: dict[int, int] = {}  # id(FutureNode) -> _RUNS | _LIVE: in its subtree a coroutine...

    # ---- the whole build --------------------------------------------------------------
    def build(self, stop: int) -> Snapshot:
        eng = self.engine
        if eng is not None:
            self.inp.ids.attach(eng, eng.highest_id)
            self._index_engine()
        if eng is not None and not eng.complete:
            self.notes.insert(0, "warning: poll events were lost; the graph is incomplete until the next resync")
        if self.r is not None:
            trees = self._memory_trees()
        else:
            trees = self._engine_trees()
        if self.inp.missed is not None and self.inp.missed():
            # memory this pass asked for is not read yet: the caller reads it and builds again;
            # the tasks, their names and the wait-for graph are made in the pass that has it all
            return Snapshot(stop=stop, tasks=(), notes=tuple(self.notes), complete=False)
        tasks = []
        trees.reverse()
        while trees:  # each memory tree is let go once converted (peak memory at 100,000 tasks)
            root, node = trees.pop()
            tasks.append(self._task(root, node))
        tasks += self._finished_roots({t.id for t in tasks})
        tasks.sort(key=lambda t: (not t.live, t.id))
        waits, tasks = analyse(tasks, self.r, self.inv, self.inp.bias)
        coroutines: dict[int, tuple[int, FutureNode]] = {}
        threads: dict[int, int | None] = {}
        for t in tasks:
            for n in t.coroutines():
                if n.id is not None:
                    coroutines.setdefault(n.id, (t.id, n))
                if n.state is not None and n.state.kind is StateKind.RUNNING and n.state.thread is not None:
                    threads.setdefault(n.state.thread, t.id)
        complete = (eng is None or eng.complete) and not (self.r is not None and self.r.mem.missing)
        return Snapshot(
            stop=stop, tasks=tuple(tasks), finished=eng.finished_count() if eng is not None else 0,
            threads=threads, waits=waits, notes=tuple(dict.fromkeys(self.notes)), complete=complete,
            edges=self._history(), coroutines=coroutines,
        )

    # ---- the engine's view --------------------------------------------------------------
    def _key_of(self, t: Any) -> Key:
        lay = self.engine.catalog.layout_for(t.site)
        return (t.self_ptr, lay.type_name if lay is not None else t.type_name)

    def _index_engine(self) -> None:
        for t in self.engine.tasks():
            key = self._key_of(t)
            fn = self.engine.catalog.resume_fn(t.site)
            if fn is not None:
                self.engine_fns[key] = (fn.low_pc, fn.high_pc)
            if t.finished:
                self.finished_keys.add(key)
            else:
                self.engine_ids[key] = t.id
        for tid in self.engine.threads():
            chain: list[Key | None] = []
            for s in reversed(self.engine.scopes(tid)):
                if s.nested:
                    continue
                t = self.engine.task(s.task)
                if t is not None:
                    chain.append(self._key_of(t))
            self.chains[tid] = chain

    def _engine_trees(self) -> list[tuple[Root, Node]]:
        """Rule 9: no memory: the engine's pending edges are the tree."""
        eng = self.engine
        if eng is None:
            return []
        out = []
        for t in eng.roots():
            if t.finished:
                continue
            out.append((Root(t.self_ptr, self._key_of(t)[1], t.label, self.inp.engine_origin, t.last_thread,
                             header=f"root, thread {t.last_thread}" if t.last_thread is not None else "root"),
                        self._engine_node(t, set())))
        return out

    def _engine_node(self, t: Any, seen: set[int]) -> Node:
        key = self._key_of(t)
        st = t.state
        n = Node("coroutine", "", t.self_ptr, key[1], loc=st.loc)
        n.status = _NODE_STATUS.get(st.kind, "pending")
        if st.kind is StateKind.RUNNING:
            self.running[id(n)] = st.thread
            pc = self.inp.pcs.get(st.thread) if st.thread is not None else None
            if pc is not None:  # the innermost: the pc's line (an outer one gets its edge's below)
                n.loc = self.engine.catalog.loc_for_pc(pc)
        n.state = None if t.state_value is None else f"Suspend{t.state_value - 3}" if t.state_value >= 3 else None
        seen = seen | {t.id}
        for e in self.engine.children(t.id):
            c = self.engine.task(e.child) if e.pending else None
            if c is None or c.finished or c.parent != t.id or c.id in seen:
                continue
            child = self._engine_node(c, seen)
            n.children.append(child)
            if st.kind is StateKind.RUNNING and c.state.kind is StateKind.RUNNING:
                n.loc = self._edge_line(t, c, e)
        return n

    def _edge_line(self, parent: Any, child: Any, edge: Any) -> SourceLoc | None:
        """Rule 4 for an observed edge: the parent's .await, not the return address in library code."""
        if edge.direct_call and edge.callsite is not None:
            return edge.callsite
        got = await_line_for(self.inv, self._key_of(parent)[1], self._key_of(child)[1])
        return got or edge.loc

    def _finished_roots(self, listed: set[int]) -> list[Task]:
        """Finished tasks the engine still retains (``tasks --all``), as observed."""
        eng = self.engine
        if eng is None:
            return []
        out = []
        for t in eng.roots():
            if not t.finished or t.id in listed:
                continue
            key = self._key_of(t)
            kind = StateKind.PANICKED if t.state.kind is StateKind.PANICKED else StateKind.FINISHED
            name = layout_name(self.inv, key[1]) if self.inv is not None and key[1] in self.inv.layouts \
                else display_name(t.path)
            state = TaskState(kind)
            node = FutureNode("coroutine", name, key[0], key[1], state, "dropped" if t.dropped else "", id=t.id)
            out.append(Task(t.id, key[0], key[1], name, state, node, stats=self._stats(t.id),
                            found_by=("observed",), header="finished"))
        return out

    # ---- memory ---------------------------------------------------------------------
    def _memory_trees(self) -> list[tuple[Root, Node]]:
        r = self.r
        assert r is not None
        earlier = self.inp.earlier
        roots: dict[Key, Root] = {}
        eng = self.engine
        if eng is not None:  # rule 1: observed roots first (their ids)
            for t in eng.roots():
                if t.finished:
                    continue
                key = self._key_of(t)
                thread = f", thread {t.last_thread}" if t.last_thread is not None else ""
                roots[key] = Root(key[0], key[1], t.label, self.inp.engine_origin, t.last_thread,
                                  header=f"root{thread}")
        for root in self._stack_roots():
            roots.setdefault((root.addr, root.type_name), root)
        for discover in self.inp.adapters:
            for root in discover(r) or ():
                have = roots.setdefault((root.addr, root.type_name), root)
                if have is not root and root.label and not have.label:  # on a stack, and the runtime's task
                    roots[root.addr, root.type_name] = replace(have, label=root.label)
        if self.inp.missed is not None and self.inp.missed():
            return []  # finding the tasks needs memory not read yet: walking them now is wasted
        for key in self.finished_keys:  # rule 8
            if key not in roots:
                earlier.seen.pop(key, None)
        for key, root in earlier.seen.items():  # rule 7
            roots.setdefault(key, Root(root.addr, root.type_name, root.label, "seen before", root.thread,
                                       header="seen at an earlier stop"))
        lifted: dict[Key, Root] = {}
        for root in roots.values():  # rule 2
            addr, tname, hops = lift(r, root.addr, root.type_name)
            if hops:
                root = Root(addr, tname, "", root.origin, root.thread,
                            header=f"{root.header}; holds {root.label or 'the observed task'} inline")
            key = (root.addr, root.type_name)
            prev = lifted.get(key)
            if prev is None:
                lifted[key] = root
            elif root.origin == "stack" and "stack" not in prev.origin:
                lifted[key] = replace(prev, origin=f"{prev.origin}, stack")
            elif root.label and not prev.label:  # found on a stack first: keep the runtime's task id
                lifted[key] = replace(prev, label=root.label)
        out: list[tuple[Root, Node]] = []
        for root in lifted.values():
            key = (root.addr, root.type_name)
            r.mem.missing = False
            tree = r.walk(root.addr, root.type_name)
            if tree.kind == "coroutine" and tree.status in ("completed", "panicked"):
                earlier.seen.pop(key, None)
                continue
            if root.origin == "seen before" and _gone(tree, earlier.status.get(key)):
                if not r.mem.missing:  # every read answered: forget it for good
                    earlier.seen.pop(key, None)
                    earlier.status.pop(key, None)
                continue
            if tree.kind == "coroutine" and root.origin != "seen before":
                earlier.seen[key] = root
                earlier.status[key] = tree.status
            out.append((root, tree))
        out = _outermost(out)  # rule 3 first: one node per coroutine for the rules below
        self._pc_chains(out)
        if any(k is not None for chain in self.chains.values() for k in chain):  # (else: nothing to nest)
            out = self._nest_chains(out)
            out = _outermost(out)
        if self.running:  # (else no running tree to contain)
            out = self._contain(out)
            out = _outermost(out)
        self._overlay_pcs(out)
        self._pollers_run(out)
        _link_mutexes(out)
        return out

    def _pollers_run(self, trees: list[tuple[Root, Node]]) -> None:
        """Rule 4, upward in a tree: the coroutines above a running one poll it (all threads are
        stopped inside its poll), so they run on its thread too; each keeps the line of the
        .await its own state shows, which holds the running child."""
        for _, tree in trees:
            self._mark_above(tree, [])

    def _mark_above(self, n: Node, above: list[Node]) -> None:
        for c in n.children:
            self._mark_above(c, above + [n])
        if id(n) in self.running:
            tid = self.running[id(n)]
            for a in above:
                if a.kind == "coroutine" and id(a) not in self.running:
                    self._mark_running(a, tid)

    def _stack_roots(self) -> list[Root]:
        finder = self.inp.stacks() if self.inp.stacks is not None and self.inp.threads else None
        if finder is None or self.r is None:
            return []
        from proxy.reflect.stacks import stack_roots  # pyelftools: only with a stack finder

        found = finder.find(self.r, dict(self.inp.threads))
        self.stack_keys = {(f.addr, f.type_name): f.thread for f in found}
        self.notes += [f"note: {n}" if not n.startswith("note") else n for n in finder.notes]
        for tid, chain in finder.chains.items():  # the stack's chain is the truth when there is one
            if any(k is not None for k in chain) or tid not in self.chains:
                self.chains[tid] = list(chain)
        self.chain_pcs = dict(finder.chain_pcs)
        self.frame_pcs = dict(getattr(finder, "frame_pcs", {}))
        src = self.inp.source
        if src is not None:
            src.stack_notes, src.stack_chains, src.chain_pcs = list(finder.notes), dict(finder.chains), \
                dict(finder.chain_pcs)
        for tid, chain in self.chains.items():  # an observed scope whose poll is on no frame: stale
            pcs = self.frame_pcs.get(tid)
            if pcs:
                self.chains[tid] = [k for k in chain if k is None or k not in self.engine_fns
                                    or any(lo <= pc < hi for pc in pcs for lo, hi in [self.engine_fns[k]])]
        return stack_roots(found)

    def _nest_chains(self, trees: list[tuple[Root, Node]]) -> list[tuple[Root, Node]]:
        """Rules 4 and 5: every coroutine on a thread's poll chain runs there, under its poller."""
        r = self.r
        assert r is not None
        for tid, chain in self.chains.items():
            prev_node: Node | None = None
            for key in chain:  # innermost first
                if key is None:
                    prev_node = None
                    continue
                node = _find(trees, key)
                if node is None:
                    node = r.walk(*key)
                    if node.kind != "coroutine":
                        prev_node = None
                        continue
                    trees.append((Root(key[0], key[1], "", "stack", tid, header=f"running on thread {tid}"), node))
                if prev_node is None:
                    pass  # the innermost poller on the chain: the pc says what runs below it (rule 5)
                elif not any(n is prev_node for n in node.iter()):
                    loc = node.loc if node.status == "pending" else None
                    node.children = [prev_node]
                    trees = [(rt, t) for rt, t in trees if t is not prev_node]
                    node.loc = self._parent_line(key, prev_node) or loc
                else:
                    line = self._parent_line(key, prev_node, own_state=node.status == "pending")
                    if line is not None:
                        node.loc = line
                self._mark_running(node, tid)
                prev_node = node
        return trees

    def _pc_chains(self, trees: list[tuple[Root, Node]]) -> None:
        """Rule 4 where no poll chain is known (release builds: the coroutines are inlined into
        one physical frame, their ``self`` found on the stack but not as a poller's): the
        async frames at the thread's pc name the chain; each name is matched to the one
        future of that type found on that thread's stack (several: ambiguous, no chain)."""
        for tid, run in self._runs_at_pcs():
            if tid not in self.inp.threads or any(k is not None for k in self.chains.get(tid, [])):
                continue
            here = [n for _, tree in trees for n in tree.iter()
                    if n.kind == "coroutine" and self.stack_keys.get((n.addr, n.type_name)) == tid]
            chain: list[Key | None] = []
            for i in reversed(range(len(run.chain))):  # innermost first
                got = [n for n in here if is_coroutine(n, run.chain[i], run.fns[i] if i < len(run.fns) else "")]
                if len(got) != 1:
                    if chain:
                        break
                    continue
                chain.append((got[0].addr, got[0].type_name))
            if chain:
                self.chains[tid] = chain

    def _contain(self, trees: list[tuple[Root, Node]]) -> list[tuple[Root, Node]]:
        """Rule 4, upward: a running future stored inside another future's memory is polled by
        it (its parent's state may not show it yet: its first poll builds the child in place,
        e.g. ``join!``'s tuple). Put it under the smallest such future, which runs too."""
        inv = self.inv
        if inv is None:
            return trees
        for _ in range(16):
            moved = False
            for root, tree in list(trees):
                if tree.kind != "coroutine" or id(tree) not in self.running:
                    continue
                best: tuple[int, Root, Node] | None = None
                own = inv.layouts.get(tree.type_name)
                inside = {(n.addr, n.type_name) for n in tree.iter() if n.kind == "coroutine"}
                for other_root, other in trees:
                    lay = inv.layouts.get(other.type_name) if other is not tree else None
                    if lay is None or not (other.addr <= tree.addr < other.addr + lay.size):
                        continue
                    if (other.addr, other.type_name) in inside or (own is not None and lay.size < own.size) \
                            or not _can_hold(inv, other.type_name, tree.type_name):
                        continue  # a child at offset 0 of this one, or a future that cannot hold it
                    if best is None or lay.size < best[0]:
                        best = (lay.size, other_root, other)
                if best is None:
                    continue
                _, _, parent = best
                holder = _innermost_holder(parent, tree)
                if not any(n is tree for n in holder.iter()):
                    holder.children = [tree]
                holder.loc = self._parent_line((holder.addr, holder.type_name), tree) or holder.loc
                thread = self.running[id(tree)]
                for n in parent.iter():  # the path from parent down to the holder runs
                    if n is holder or any(m is holder for m in n.iter()):
                        if n.kind == "coroutine":
                            self._mark_running(n, thread)
                trees = [(r, t) for r, t in trees if t is not tree]
                moved = True
                break
            if not moved:
                break
        return trees

    def _parent_line(self, key: Key, child: Node, own_state: bool = False) -> SourceLoc | None:
        """The line a running parent polls ``child`` at (rule 4): the user's ``.await``. In
        order: its own resume frame's line (debug builds: the stack's poller frame), the line
        of its inlined frame at a thread's pc (release builds: the parent's resume function is
        inlined, its call into the child's poll carries the line), the one suspend state that
        holds the child's type; a line in the coroutine's own source file wins over one in a
        library's (``join!``'s states carry tokio's join.rs)."""
        if own_state:
            return None  # the state's own .await holds the child: its line is right
        home = _home_file(self.inv, key[1])
        found: list[SourceLoc] = []
        pc = self.chain_pcs.get(key)
        if pc is not None:
            frames = self._frames(pc)
            if frames and frames[-1].loc is not None:
                found.append(frames[-1].loc)
        name, own = norm(layout_name(self.inv, key[1])), ident(key[1])
        for frames in self._pc_frames():
            for f in frames:
                if f.loc is not None and "{" in f.function and " as " not in f.function and norm(f.function) == name \
                        and (not own or ident(f.function) in ("", own)):
                    found.append(f.loc)
                    break
        got = await_line_for(self.inv, key[1], child.type_name)
        if got is not None:
            found.append(got)
        for loc in found:
            if home is None or loc.file == home:
                return loc
        return found[0] if found else None

    def _frames(self, link_pc: int) -> list[SrcFrame]:
        if self.inp.frames_at is None:
            return []
        try:
            return self.inp.frames_at(link_pc)
        except Exception:  # noqa: BLE001 - no line table for this pc
            return []

    def _pc_frames(self) -> list[list[SrcFrame]]:
        got = self._pcf
        if got is None:
            pcs = dict(self.inp.pcs)
            for tid, regs in self.inp.threads.items():
                pcs.setdefault(tid, regs.get("rip", 0))
            got = [self._frames(pc - self.inp.bias) for pc in pcs.values() if pc > self.inp.bias]
            for tid, link_pcs in self.frame_pcs.items():  # the outer frames too: an inlined poller
                got += [self._frames(pc) for pc in link_pcs[1:]]
            self._pcf = got
        return got

    def _mark_running(self, node: Node, tid: int) -> None:
        node.status = "running"
        node.detail = ""
        self.running[id(node)] = tid

    def _overlay_pcs(self, trees: list[tuple[Root, Node]]) -> None:
        """Rule 6: the pc's line, and coroutines inlined at the pc."""
        for tid, run in self._runs_at_pcs():
            inner = self._innermost_running(trees, tid)

            if inner is not None:
                if self._overlay_below(inner, run, tid):
                    continue
            # No poll chain: the coroutine the pc is in. A thread runs a coroutine only when its
            # stack is inside that one's poll now: of several of that function (parked tasks of
            # the same async fn, other blocks of it: ``ident``), one held by a future on this
            # thread's stack (the first: two `c` of one join! both inlined at that pc), else the
            # only one; none when that is ambiguous (the others are parked, not running).
            found = [(tree, end) for _, tree in trees for start, end in overlay_matches(tree, run)]
            mine = [(t, e) for t, e in found if any(self.stack_keys.get((n.addr, n.type_name)) == tid
                                                    for n in t.iter() if n.kind == "coroutine"
                                                    and any(m is e for m in n.iter()))]
            if not mine and len({id(e) for _, e in found}) != 1:
                continue
            tree, end = (mine or found)[0]
            mark_running(end, run)
            for n in tree.iter():
                if n.status == "running" and id(n) not in self.running:
                    self.running[id(n)] = tid

    def _runs_at_pcs(self) -> list[tuple[int, Any]]:
        """(thread, the async frames at its pc: ``proxy.reflect.tree.Running``) of every thread
        whose pc is known (the stop's, and every thread's registers when read)."""
        pcs = dict(self.inp.pcs)
        for tid, regs in self.inp.threads.items():
            pcs.setdefault(tid, regs.get("rip", 0))
        out = []
        for tid, pc in pcs.items():
            if pc <= self.inp.bias:
                continue
            run = running_from_frames(tid, self._frames(pc - self.inp.bias), None)
            if run is not None:
                out.append((tid, run))
        return out

    def _innermost_running(self, trees: list[tuple[Root, Node]], tid: int) -> Node | None:
        chain = [k for k in self.chains.get(tid, []) if k is not None]
        return _find(trees, chain[0]) if chain else None

    def _overlay_below(self, inner: Node, run: Any, tid: int) -> bool:
        """The pc's inlined chain ends in the innermost running coroutine or below it."""
        fns = list(run.fns) + [""] * (len(run.chain) - len(run.fns))
        at = [i for i, name in enumerate(run.chain) if is_coroutine(inner, name, fns[i])]
        if not at:
            return False
        rest = list(zip(run.chain, fns))[at[0] + 1:]
        node = inner
        if rest:  # coroutines inlined into the innermost frame: stored inline below it
            tree = self.r.walk(inner.addr, inner.type_name) if self.r is not None else inner
            cur = tree
            path = []
            for name, fn in rest:
                nxt = _first_coroutine_below(cur, name, fn)
                if nxt is None:
                    break
                path.append(nxt)
                cur = nxt
            if path:
                inner.children = [path[0]]
                for p in path:
                    self._mark_running(p, tid)
                    if p is not path[-1]:
                        p.children = [path[path.index(p) + 1]]
                        p.loc = self._parent_line((p.addr, p.type_name), path[path.index(p) + 1]) or p.loc
                path[-1].children = []
                node = path[-1]
                inner.loc = self._parent_line((inner.addr, inner.type_name), path[0]) or inner.loc
        if run.loc is not None:
            node.loc = run.loc
        node.children = []  # rule 5: the coroutine at the pc runs: its state's awaitee is stale
        return True

    # ---- one task -------------------------------------------------------------------
    def _task(self, root: Root, tree: Node) -> Task:
        key = (tree.addr, tree.type_name) if tree.kind == "coroutine" else (root.addr, root.type_name)
        tid = self.engine_ids.get(key)
        if tid is None and root.label.startswith("#"):
            try:
                tid = int(root.label[1:])
            except ValueError:
                tid = None
        if tid is None:
            tid = self.inp.ids.of(*key)
        fnode = self._convert(tree)
        stack = self._stack(fnode)
        state = fnode.state or TaskState(StateKind.UNKNOWN)  # the task's state is its future's
        found = self._found.get(root.origin)
        if found is None:
            found = self._found[root.origin] = tuple(w.strip() for w in root.origin.split(","))
        stats = self._stats(tid) if self.engine is not None else None
        name = fnode.name if fnode.kind == "coroutine" else layout_name(self.inv, key[1])
        header = root.header or root.origin
        return Task(id=tid, addr=key[0], type_name=key[1], name=name, state=state, tree=fnode,
                    stack=stack, stats=stats, found_by=found, header=header)

    def _convert(self, n: Node) -> FutureNode:
        kids = tuple([self._convert(c) for c in n.children]) if n.children else ()
        if n.kind != "coroutine":
            done = _LEAF_STATES.get(n.status)  # a combinator's finished branch keeps its tag
            node = FutureNode(n.kind, n.label, n.addr, n.type_name, TaskState(done) if done else None, n.detail,
                              n.branch, kids, waits=_leaf_wait(n))
            self.below[id(node)] = self._below(kids)
            return node
        lay = self.inv.layouts.get(n.type_name) if self.inv is not None else None
        value = n.value if n.state is not None else None
        if value is None and lay is not None and n.state is not None:
            st = next((s for s in lay.states if s.name == n.state), None)
            value = st.value if st is not None else None
        thread = self.running.get(id(n))
        # name, line and state are values many coroutines share (one layout, one state): made once
        key = (n.type_name, n.loc, n.status, value, thread)
        got = self._states.get(key)
        if got is None:
            got = self._states[key] = self._state(n, value, thread)
        name, state = got
        detail = "" if n.detail.startswith("running on thread") else n.detail  # the state says it
        holds = tuple(_resource("Mutex", a) for a in n.holds) if n.holds else ()
        waits = _resource("Mutex", n.waits_on) if n.waits_on is not None else None
        node = FutureNode("coroutine", name, n.addr, n.type_name, state, detail, n.branch, kids,
                          waits=waits, holds=holds, state_value=value,
                          id=self.engine_ids.get((n.addr, n.type_name)))
        self.below[id(node)] = self._below(kids) | (_RUNS if state.kind is StateKind.RUNNING else 0) \
            | (_LIVE if state.live else 0)
        return node

    def _state(self, n: Node, value: int | None, thread: int | None) -> tuple[str, TaskState]:
        name = layout_name(self.inv, n.type_name)
        loc = user_line(self.inv, n.type_name, n.loc)  # a join!/select! await: the user's line
        if thread is not None or n.status == "running":
            state = TaskState(StateKind.RUNNING, thread, loc)
        elif n.status == "pending":
            state = TaskState(StateKind.SUSPENDED, None, loc, value - 3 if value is not None and value >= 3 else None)
        elif n.status == "not yet polled":
            state = TaskState(StateKind.UNRESUMED, None, n.loc)
        elif n.status == "completed":
            state = TaskState(StateKind.FINISHED)
        elif n.status == "panicked":
            state = TaskState(StateKind.PANICKED)
        else:
            state = TaskState(StateKind.UNKNOWN)
        return name, state

    def _below(self, kids: tuple[FutureNode, ...]) -> int:
        """_RUNS | _LIVE: a coroutine runs / is live in these subtrees (``_convert`` made them)."""
        got = 0
        for k in kids:
            got |= self.below[id(k)]
        return got

    def _next_on_path(self, n: FutureNode) -> FutureNode | None:
        """The child the logical stack goes on with: a running one, else the first one with a
        pending coroutine (through combinators)."""
        best = None
        for c in n.children:
            below = self.below[id(c)]
            if below & _RUNS:
                return c
            if best is None and below & _LIVE:
                best = c
        return best

    def _stack(self, root: FutureNode) -> tuple[Frame, ...]:
        """The logical stack: the running path, else the first pending coroutine path."""
        path: list[FutureNode] = []
        node: FutureNode | None = root
        while node is not None:
            if node.kind == "coroutine":
                path.append(node)
            node = self._next_on_path(node)
        frames = []
        res = resume_fns(self.inv)
        for level, n in enumerate(reversed(path)):
            running = n.state is not None and n.state.kind is StateKind.RUNNING
            copies = res.get(n.type_name, [])
            inlined = not copies
            if running and n.state is not None and n.state.thread is not None:  # inlined here: no frame of its own
                pcs = list(self.frame_pcs.get(n.state.thread, ()))
                stop_pc = self.inp.pcs.get(n.state.thread)
                if stop_pc is not None:
                    pcs.append(stop_pc - self.inp.bias)
                if pcs:
                    inlined = not any(lo <= pc < hi for pc in pcs for lo, hi in copies)
            frames.append(Frame(level, n.name, n.addr, n.type_name, n.state.loc if n.state else None,
                                level == 0 and running, copies[0][0] + self.inp.bias if copies else None, inlined,
                                n.state_value, n.id))
        return tuple(frames)

    def _stats(self, tid: int) -> PollStats | None:
        eng = self.engine
        t = eng.task(tid) if eng is not None else None
        if t is None:
            return None
        longest = eng.timing.longest_ns(t.id) if eng.timing.of(t.id) is not None else 0
        busy = eng.timing.busy_ns(t.id) if eng.timing.of(t.id) is not None else t.busy_ns
        return PollStats(t.polls, busy, t.idle_ns, longest, t.last_thread, t.first_seq, t.last_seq)

    def _history(self) -> tuple[HistoryEdge, ...]:
        eng = self.engine
        if eng is None:
            return ()
        names: dict[int, str] = {}

        def name(i: int) -> str:
            if i not in names:
                t = eng.task(i)
                names[i] = "?" if t is None else layout_name(self.inv, self._key_of(t)[1]) \
                    if self.inv is not None and self._key_of(t)[1] in self.inv.layouts else display_name(t.path)
            return names[i]

        out = []
        for e in eng.edges():
            status = "completed" if e.completed else "dropped" if e.dropped else "pending"
            loc = e.loc
            if not e.direct_call:
                p, c = eng.task(e.parent), eng.task(e.child)
                if p is not None and c is not None:
                    loc = await_line_for(self.inv, self._key_of(p)[1], self._key_of(c)[1]) or e.await_loc or loc
            out.append(HistoryEdge(e.parent, e.child, name(e.parent), name(e.child), loc, status,
                                   e.first_seq, e.last_seq))
        return tuple(out)


# ---- helpers ---------------------------------------------------------------------------

_NODE_STATUS = {StateKind.SUSPENDED: "pending", StateKind.RUNNING: "running", StateKind.UNRESUMED: "not yet polled",
                StateKind.FINISHED: "completed", StateKind.PANICKED: "panicked"}  # the walker's words (Node.status)
_RUNS, _LIVE = 1, 2  # ... runs / is live (not finished)


def _resource(kind: str, addr: int) -> Resource:
    return Resource(kind, addr)


_LEAF_STATES = {"completed": StateKind.FINISHED, "gone": StateKind.FINISHED, "panicked": StateKind.PANICKED,
                "not yet polled": StateKind.UNRESUMED}
_KINDS = {k.lower(): k for k in ("Mutex", "RwLock", "Semaphore", "Notify", "Barrier", "oneshot", "mpsc", "watch",
                                  "broadcast", "JoinHandle")}


_WAITS_ON = re.compile(r"waits on (\w+)(?: channel)? (0x[0-9a-f]+)")
_TASK_AT = re.compile(r"task (0x[0-9a-f]+)")


def _leaf_wait(n: Node) -> Any:
    """The resource a leaf waits on: the walker's ``waits_on`` (with ``waits_kind``), else the
    describers' convention ``waits on <Kind> 0x<addr>`` in the detail."""
    kind = getattr(n, "waits_kind", None)
    if n.waits_on is not None:
        return _resource(kind or "Mutex", n.waits_on)
    if not n.detail:
        return None
    m = _WAITS_ON.search(n.detail)
    if m:
        return _resource(_KINDS.get(m.group(1).lower(), m.group(1)), int(m.group(2), 16))
    m = _TASK_AT.match(n.detail)
    if m and n.label.endswith("JoinHandle"):
        return _resource("JoinHandle", int(m.group(1), 16))
    return None


def _can_hold(inv: Inventory, parent: str, child: str) -> bool:
    """Some state of ``parent`` stores ``child`` (its awaitee or a live local names its type)."""
    lay = inv.layouts.get(parent)
    if lay is None:
        return False
    for st in lay.states:
        for m in ([st.awaitee] if st.awaitee is not None else []) + list(st.locals):
            if child in m.type_name:
                return True
    return False


def _home_file(inv: Inventory | None, layout: str) -> str | None:
    """The source file of a coroutine (its Unresumed variant's: where it is declared)."""
    lay = inv.layouts.get(layout) if inv is not None else None
    first = lay.state(0) if lay is not None else None
    return first.loc.file if first is not None and first.loc is not None else None


def _innermost_holder(parent: Node, child: Node) -> Node:
    """The innermost coroutine of ``parent``'s tree whose memory range holds ``child``
    (by address: the tree read from memory knows each coroutine's address, not its size)."""
    best = parent
    for n in parent.iter():  # an unreadable node too: its memory holds the child (garbage above it)
        if n.kind in ("coroutine", "unreadable") and n is not child and best.addr <= n.addr <= child.addr:
            best = n
    return best


def _find(trees: list[tuple[Root, Node]], key: Key) -> Node | None:
    for _, t in trees:
        for n in t.iter():
            if n.kind == "coroutine" and (n.addr, n.type_name) == key:
                return n
    return None


def _gone(tree: Node, status_then: str | None) -> bool:
    """A task seen at an earlier stop whose memory no longer holds it: something below it is
    unreadable (the slot holds other bytes now), or it reads Unresumed after it was seen
    suspended (a coroutine never goes back to its first state)."""
    if any(n.kind == "unreadable" for n in tree.iter()):
        return True
    return tree.kind == "coroutine" and tree.status == "not yet polled" and status_then in ("pending", "running")


def _outermost(trees: list[tuple[Root, Node]]) -> list[tuple[Root, Node]]:
    """Rule 3: a root another root's tree holds is a frame of that task."""
    inner: set[Key] = set()
    for _, tree in trees:
        for n in tree.iter():
            if n is not tree and n.kind == "coroutine":
                inner.add((n.addr, n.type_name))
    return [(root, tree) for root, tree in trees if (tree.addr, tree.type_name) not in inner]


def _link_mutexes(trees: list[tuple[Root, Node]]) -> None:
    """A task waiting on a Mutex another task holds: say who holds it (the tree's leaf text)."""
    holders: dict[int, str] = {}
    for root, tree in trees:
        for n in tree.iter():
            for m in n.holds:
                holders.setdefault(m, f"task {root.label or hex(root.addr)} {layout_name(None, tree.type_name)}")
    for root, tree in trees:
        for n in tree.iter():
            if n.waits_on is not None and n.waits_on in holders and "held by" not in n.detail:
                n.detail += f", held by {holders[n.waits_on]}"


def lift(r: Reflector, addr: int, type_name: str, max_hops: int = 16) -> tuple[int, str, int]:
    """The outermost coroutine that stores this one inline (release builds inline the
    parents' resume functions, so the observed poll may be a grandchild's): step out while
    exactly one candidate parent's ``__state`` says it awaits this very child."""
    idx = parents_index(r.inv)
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
