"""One task's frozen values from its merged tree: ``Task``, ``FutureNode``s, the logical stack.

A merged tree (``proxy.reflect.walker.Node``s, marked running by the merge)
becomes the snapshot's values: each coroutine's display name, state and the
user's line (``names``), each leaf's wait (the walker's ``waits_on`` or the
describers' ``waits on <Kind> 0x..``), and the logical stack: the running path,
else the first pending one. Values many coroutines share (a layout's name, a
state at one line) are made once per build.
"""

from __future__ import annotations

import re
from typing import Any

from proxy.reflect.tree import Root
from proxy.reflect.walker import Node

from .inputs import BuildState, Key
from .model import Frame, FutureNode, Resource, StateKind, Task, TaskState
from .names import layout_name, user_line
from .plans import resume_fns


class Convert(BuildState):
    def _task_key(self, root: Root, tree: Node) -> Key:
        return (tree.addr, tree.type_name) if tree.kind == "coroutine" else (root.addr, root.type_name)

    def _task_id(self, root: Root, tree: Node) -> int:
        key = self._task_key(root, tree)
        tid = self.engine_ids.get(key)
        if tid is None and root.label.startswith("#"):
            try:
                tid = int(root.label[1:])
            except ValueError:
                tid = None
        return tid if tid is not None else self.inp.ids.of(*key)

    def _task(self, root: Root, tree: Node) -> Task:
        """The task of a merged tree: its identity, name and state now; its tree and stack when
        asked (``tree_of``, ``stack_of``; the tree is final once the merge is done)."""
        key = self._task_key(root, tree)
        tid = self._task_id(root, tree)
        if tree.kind == "coroutine":
            name, state, _ = self._coroutine(tree)
        else:  # the task's state is its future's
            done = _TASK_LEAF_STATES.get(tree.status)
            name = tree.label if tree.kind == "leaf" else layout_name(self.inv, key[1])
            state = TaskState(done) if done else _UNKNOWN
        found = self._found.get(root.origin)
        if found is None:
            found = self._found[root.origin] = tuple(w.strip() for w in root.origin.split(","))
        stats = self._stats(tid) if self.engine is not None else None
        header = root.header or root.origin
        return Task(id=tid, addr=key[0], type_name=key[1], name=name, state=state, stats=stats, found_by=found,
                    header=header, parts=self, raw=tree)  # type: ignore[arg-type]

    def tree_of(self, n: Node) -> FutureNode:
        """A merged tree's frozen values (``TaskParts.tree_of``)."""
        kids = tuple([self.tree_of(c) for c in n.children]) if n.children else ()
        if n.kind != "coroutine":
            done = _LEAF_STATES.get(n.status)  # a combinator's finished branch keeps its tag
            return FutureNode(n.kind, n.label, n.addr, n.type_name, TaskState(done) if done else None,
                              self._held_by(n, n.detail), n.branch, kids, waits=_leaf_wait(n))
        name, state, value = self._coroutine(n)
        detail = self._held_by(n, "" if n.detail.startswith("running on thread") else n.detail)  # the state says it
        holds = tuple(_resource("Mutex", a) for a in n.holds) if n.holds else ()
        waits = _resource("Mutex", n.waits_on) if n.waits_on is not None else None
        return FutureNode("coroutine", name, n.addr, n.type_name, state, detail, n.branch, kids,
                          waits=waits, holds=holds, state_value=value,
                          id=self.engine_ids.get((n.addr, n.type_name)))

    def _coroutine(self, n: Node) -> tuple[str, TaskState, int | None]:
        """A coroutine node's display name, state and raw ``__state``: the one rule the tree, the
        stack and the task line share."""
        value = n.value if n.state is not None else None
        if value is None and n.state is not None:
            lay = self.inv.layouts.get(n.type_name) if self.inv is not None else None
            st = next((s for s in lay.states if s.name == n.state), None) if lay is not None else None
            value = st.value if st is not None else None
        thread = self.running.get(id(n))
        # name, line and state are values many coroutines share (one layout, one state): made once
        key = (n.type_name, n.loc, n.status, value, thread)
        got = self._states.get(key)
        if got is None:
            got = self._states[key] = self._state(n, value, thread)
        return got[0], got[1], value

    def _held_by(self, n: Node, detail: str) -> str:
        """The detail of a node that waits on a Mutex a task holds, naming that task."""
        holder = self.mutex_holders.get(n.waits_on) if n.waits_on is not None else None
        if holder is None or "held by" in detail:
            return detail
        h_root, h_tree = holder
        held = f"held by task #{self._task_id(h_root, h_tree)} {layout_name(None, h_tree.type_name)}"
        return f"{detail}, {held}" if detail else held

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

    def _flags(self, n: Node, memo: dict[int, int]) -> int:
        """_RUNS | _LIVE: a coroutine runs / is live (not finished) in ``n``'s subtree (its own
        state counts for a coroutine; a leaf's does not)."""
        got = 0
        for c in n.children:
            got |= self._flags(c, memo)
        if n.kind == "coroutine":
            if n.status == "running" or id(n) in self.running:
                got |= _RUNS | _LIVE
            elif n.status not in ("completed", "panicked"):
                got |= _LIVE
        memo[id(n)] = got
        return got

    def stack_of(self, tree: Node) -> tuple[Frame, ...]:
        """The logical stack (``TaskParts.stack_of``): the running path, else the first path of
        pending coroutines (through combinators); innermost first."""
        memo: dict[int, int] = {}
        path: list[Node] = []
        node: Node | None = tree
        while node is not None:
            if node.kind == "coroutine":
                path.append(node)
            kids = node.children
            if len(kids) == 1 and kids[0].kind == "coroutine" and kids[0].status not in ("completed", "panicked"):
                node = kids[0]  # (one live child: the path goes on there, whatever runs below it)
                continue
            best = None
            for c in kids:  # the child the stack goes on with
                below = memo.get(id(c))
                if below is None:
                    below = self._flags(c, memo)
                if below & _RUNS:
                    best = c
                    break
                if best is None and below & _LIVE:
                    best = c
            node = best
        frames = []
        res = resume_fns(self.inv)
        for level, n in enumerate(reversed(path)):
            name, state, value = self._coroutine(n)
            running = state.kind is StateKind.RUNNING
            copies = res.get(n.type_name, [])
            inlined = not copies
            if running and state.thread is not None:  # inlined here: no frame of its own
                pcs = list(self.frame_pcs.get(state.thread, ()))
                stop_pc = self.inp.pcs.get(state.thread)
                if stop_pc is not None:
                    pcs.append(stop_pc - self.inp.bias)
                if pcs:
                    inlined = not any(lo <= pc < hi for pc in pcs for lo, hi in copies)
            frames.append(Frame(level, name, n.addr, n.type_name, state.loc, level == 0 and running,
                                copies[0][0] + self.inp.bias if copies else None, inlined, value,
                                self.engine_ids.get((n.addr, n.type_name))))
        return tuple(frames)


_UNKNOWN = TaskState(StateKind.UNKNOWN)
_RUNS, _LIVE = 1, 2  # ... runs / is live (not finished)


def _resource(kind: str, addr: int) -> Resource:
    return Resource(kind, addr)


_LEAF_STATES = {"completed": StateKind.FINISHED, "gone": StateKind.FINISHED, "panicked": StateKind.PANICKED,
                "not yet polled": StateKind.UNRESUMED}
# A task whose future is a leaf (a spawn_blocking closure) also runs or waits to run; in a
# tree such a leaf's detail says it ("running on the blocking pool").
_TASK_LEAF_STATES = {**_LEAF_STATES, "running": StateKind.RUNNING}
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
