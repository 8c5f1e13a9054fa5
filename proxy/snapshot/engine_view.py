"""The engine's view in the snapshot: observed polls, as keys, trees and statistics.

The engine (``proxy.graph``) names tasks (``#N``), knows who polls whom on each
thread now (its poll scopes), the edges it saw and each coroutine's poll
counts and times. Here they become the build's keys and chains (rule 1), the
tree when there is no memory to read (rule 9), the finished tasks it still
retains (rule 8), the tasks' ``PollStats`` and the history edges
(``proxy.snapshot.build`` lists the rules).
"""

from __future__ import annotations

from typing import Any

from proxy.analysis.model import SourceLoc
from proxy.reflect.tree import Root
from proxy.reflect.walker import Node

from .inputs import BuildState, Key
from .model import FutureNode, HistoryEdge, PollStats, StateKind, Task, TaskState
from .names import await_line_for, display_name, layout_name


class EngineView(BuildState):
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


    def _stats(self, tid: int) -> PollStats | None:
        eng = self.engine
        t = eng.task(tid) if eng is not None else None
        if t is None:
            return None
        tt = eng.timing.of(t.id)
        longest = eng.timing.longest_ns(t.id) if tt is not None else 0
        busy = eng.timing.busy_ns(t.id) if tt is not None else t.busy_ns
        # the timing's count is the kernel's when uprobes fold polls (sampling, or only
        # graph changes recorded): the engine saw the recorded polls only
        polls = max(t.polls, tt.polls) if tt is not None else t.polls
        return PollStats(polls, busy, t.idle_ns, longest, t.last_thread, t.first_seq, t.last_seq)

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




_NODE_STATUS = {StateKind.SUSPENDED: "pending", StateKind.RUNNING: "running", StateKind.UNRESUMED: "not yet polled",
                StateKind.FINISHED: "completed", StateKind.PANICKED: "panicked"}  # the walker's words (Node.status)
