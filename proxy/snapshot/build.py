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
   the state went back to Unresumed after it was seen suspended) it is gone. Any
   task whose root's state value is none of its coroutine's states is gone too
   (dropped unfinished, its slot reused: the engine saw it poll, never return).
8. A task the engine saw finish is not read from memory (its slot may hold
   anything now); it counts in ``finished``.
9. Without memory (no reader, no layouts) the tree is the engine's pending edges.

Pure: memory comes through ``read`` (None = not read yet: the caller reads and
builds again); the registers and pcs come with the inputs.

Where each part lives: ``inputs`` (what a build is given, what it gathers),
``engine_view`` (rules 1, 8 and 9 on the engine's side, poll statistics, the
history edges), ``merge`` (rules 1-7 on memory, stacks and pcs), ``convert`` (the
frozen values of one task), ``waits`` (the wait-for graph); this module runs
them in order. At scale (100,000 tasks) the costs are one walk per task and
one conversion per node: every per-layout fact is made once (``plans``). The rules run once, here, for every task (the task list needs
them: rule 3 decides what is a task, rule 7 what is gone); what a command asks
of a task beyond its identity, name and state (its tree, its logical stack,
the wait-for graph) is made from their result when first asked, and kept: the
builder stays with the snapshot as its ``TaskParts``.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from proxy.analysis.model import SourceLoc
from proxy.reflect.memory import Budget, ReadMemory

from .convert import Convert
from .engine_view import EngineView
from .inputs import EarlierStops, SnapshotInputs
from .locals import locals_of
from .merge import Merge
from .model import FutureNode, Hold, Locals, Snapshot, Task, Wait, WaitGraph
from .timing import StopTiming
from .waits import wait_graph

__all__ = ["Budget", "EarlierStops", "SnapshotInputs", "build_snapshot", "paused_gc"]


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic collector off while a snapshot is built or read: both make a few objects per
    node of every task and free none of them until they end, and each full collection would
    walk the whole snapshot again for nothing (a third of the build, and 60% of ``tasks
    --group``'s logical stacks, at 100,000 tasks). Nothing they make is a cycle (the snapshot
    holds its builder, which holds the snapshot weakly): refcounts free it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def build_snapshot(inputs: SnapshotInputs, read: ReadMemory | None, stop: int = 0) -> Snapshot:
    with paused_gc():
        return _Builder(inputs, read).build(stop)



class _Builder(EngineView, Merge, Convert):
    """Builds the snapshot, then stays with it as its ``TaskParts``: the merged trees are final
    once ``build`` returns; each task's tree and stack, and the wait-for graph, are made from
    them when first asked."""

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
        tasks = [self._task(root, node) for root, node in trees]
        tasks += self._finished_roots({t.id for t in tasks})
        tasks.sort(key=lambda t: (not t.live, t.id))
        threads: dict[int, int | None] = {}
        for t in tasks if self.running else ():  # (else no coroutine runs on a thread)
            raw = t._raw  # noqa: SLF001 - this builder's own merged tree
            for n in raw.iter() if raw is not None else ():
                if id(n) in self.running:
                    self.kept.append(n)  # (``running`` is keyed by id: these stay while it is used)
                    if n.kind == "coroutine":
                        threads.setdefault(self.running[id(n)], t.id)
        complete = (eng is None or eng.complete) and not (self.r is not None and self.r.mem.missing)
        snap = Snapshot(
            stop=stop, tasks=tuple(tasks), finished=eng.finished_count() if eng is not None else 0,
            threads=threads, notes=tuple(dict.fromkeys(self.notes)), complete=complete,
            edges=self._history(), parts=self,
        )
        # The tasks and the snapshot hold this builder; it holds the snapshot weakly: no cycle,
        # so the old stop's snapshot is freed when dropped, not at the next full collection
        # (at 100,000 tasks that doubled the peak). The graph is made while a command holds it.
        self._snap = weakref.ref(snap)
        return snap

    @property
    def tasks(self) -> tuple[Task, ...]:
        snap = self._snap() if self._snap is not None else None
        return snap.tasks if snap is not None else ()

    # ---- TaskParts: what the snapshot makes on demand -----------------------------------------

    def graph(self) -> tuple[WaitGraph, dict[int, tuple[tuple[Hold, ...], tuple[Wait, ...]]]]:
        """The wait-for graph of the snapshot's tasks (``waits.wait_graph``), kept once every
        read it made was answered; else made again for the next question (after ``bind``)."""
        got = self._graph
        if got is not None and (got[2] or got[3] is self._bound):
            return got[0], got[1]
        r = self.r
        if r is not None:
            r.mem.missing = False
        with paused_gc():
            graph, per_task = wait_graph(list(self.tasks), r, self.inv, self.inp.bias)
        self._graph = (graph, per_task, r is None or not r.mem.missing, self._bound)
        return graph, per_task

    def coroutines(self) -> dict[int, tuple[int, FutureNode]]:
        out: dict[int, tuple[int, FutureNode]] = {}
        for t in self.tasks if self.engine is not None or self.running else ():  # (else no coroutine has an id)
            for n in t.coroutines():
                if n.id is not None:
                    out.setdefault(n.id, (t.id, n))
        return out

    def timing(self) -> StopTiming | None:
        return StopTiming(self.engine) if self.engine is not None else None

    def locals_of(self, node: FutureNode) -> Locals:
        return locals_of(node, self.inv, self.engine, self._bound)

    def thread_stack(self, tid: int) -> tuple[tuple[str, SourceLoc | None, tuple[int, str]], ...]:
        """The coroutines on thread ``tid``'s own stack (its unwound frames, not the observed
        polls), innermost first, each at its line: each resume frame's coroutine and, in
        optimised builds, the ones inlined into it (release: leaf and middle inside outer's
        resume); with the coroutine's key (address, type)."""
        out: list[tuple[str, SourceLoc | None, tuple[int, str]]] = []
        for key in self.stack_chains.get(tid, ()):
            if key is not None:
                out += [(name, loc, key) for name, loc in self._frame_coroutines(key)]
        return tuple(out)

    def _frame_coroutines(self, key: tuple[int, str]) -> list[tuple[str, SourceLoc | None]]:
        from proxy.reflect.tree import norm
        from proxy.reflect.walker import coroutine_path

        pc = self.chain_pcs.get(key)
        frames_at = self.inp.frames_at
        if pc is None or frames_at is None:
            return [(coroutine_path(key[1]), None)]
        try:
            frames = frames_at(pc)
        except Exception:  # noqa: BLE001 - a line table we cannot read: the name alone
            return [(coroutine_path(key[1]), None)]
        out = [(norm(f.function), f.loc) for f in frames if "{" in f.function and " as " not in f.function]
        return out or [(coroutine_path(key[1]), frames[-1].loc if frames else None)]

    def bind(self, read: ReadMemory | None) -> None:
        """Later questions at the same stop read through their own ``read``."""
        if self.r is not None and read is not None:
            self.r.mem.rebind(read)
        self._bound = read
