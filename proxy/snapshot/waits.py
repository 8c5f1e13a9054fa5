"""The wait-for graph of a snapshot: who holds what, who waits on what, who can wake whom.

Theory of operation. Each live task's tree is cut at its **frontier**: going
down from the task's future, the first node that waits on a resource (a
``Mutex::lock`` coroutine, a ``Notified``, a channel receive, a JoinHandle)
is one wait, and nothing below it counts (a lock's own semaphore acquire is
the same wait). Every other leaf is a timer, I/O, a yield or a future the
walker does not know: something outside the tasks may wake it.

A task is **blocked** when it does not run and every leaf of its frontier
is a wait whose possible wakers memory tells:

* a Mutex: the tasks whose live ``MutexGuard`` locals hold it;
* a JoinHandle: its task (the future in the task's cell); a finished task's
  handle is ready, so it is not a wait;
* a channel (oneshot, mpsc) and a Notify: the other tasks whose live locals
  hold a pointer to it (the channel's ``Arc``, the Notify or its ``Arc``).
  Its ``Arc`` strong count says whether every handle was found: a handle held
  where no task's locals are (a thread's stack, a static) makes it unknown. A
  Notify's Arc is a guess (16 bytes before it): counts no live Arc has (0, or
  huge: a Notify that is a field further in, watch's ``notify_tx``) make it
  unknown too.
  A channel whose senders are all dropped (strong count 1: only the
  receiver) wakes its receiver: not a wait. A Notify stored inside the
  waiting task's own future can be reached by no other task;
* ``core::future::pending``: nothing, ever.

Anything else (a Semaphore permit, an RwLock, a Barrier, a watch or broadcast
channel, garbage) is "unknown" and the task is not reported. From the blocked
tasks: the **stuck** ones are the largest set whose every waker is itself
stuck (fixpoint); among them, cycles of waits are reported as cycles, a task
with no waker at all as "nothing can wake", the rest as blocked behind them.
"""

from __future__ import annotations

from typing import Any

from proxy.analysis.model import Inventory

from .plans import local_spans
from .model import Finding, FutureNode, Hold, Resource, StateKind, Task, Wait, WaitGraph

_CHANNELS = ("oneshot", "mpsc")
CELL_SPAN = 4096  # a task cell's future lies this close after its header
# tokio 1.24's cell: Header (0x30), then Core { scheduler, task_id, stage }: the running future
# starts 0x38 after the header (checked on the corpus, debug and release); a finished task's
# cell holds no future there, and the next cell's future is further than this
STAGE_SPAN = 0x60


def analyse(tasks: list[Task], r: Any, inv: Inventory | None, bias: int) -> tuple[WaitGraph, list[Task]]:
    """The graph, and the tasks with what each holds and waits on."""
    graph, per_task = wait_graph(tasks, r, inv, bias)
    return graph, [t.with_graph(*per_task[t.id]) if t.id in per_task else t for t in tasks]


def wait_graph(tasks: list[Task], r: Any, inv: Inventory | None, bias: int,
               ) -> tuple[WaitGraph, dict[int, tuple[tuple[Hold, ...], tuple[Wait, ...]]]]:
    """The graph, and task id -> (what it holds, what it waits on) for the tasks in it."""
    holds: dict[int, list[Hold]] = {}
    coros: dict[int, list[FutureNode]] = {}  # live task -> its coroutines (the holds here, the locals' words)
    for t in tasks:
        if not t.live:
            continue
        cs = coros[t.id] = _coroutines(t.tree)
        for n in cs:
            for res in n.holds:
                at = f" at {n.state.loc}" if n.state is not None and n.state.loc is not None else ""
                holds.setdefault(t.id, []).append(Hold(t.id, res, f"a live guard in {n.name}{at}"))
    holders: dict[Resource, list[int]] = {}
    for tid, hs in holds.items():
        for h in hs:
            holders.setdefault(h.resource, []).append(tid)
    ctx = _Context(tasks, r, inv, bias, holders)
    ctx.coros = coros
    ctx.guards = {(h.task, h.resource): h.evidence for hs in holds.values() for h in hs}
    waits: dict[int, list[Wait]] = {}
    blocked: dict[int, set[int]] = {}  # task -> the tasks that can wake it
    frontiers = [(t, _frontier(t.tree)) for t in tasks
                 if t.live and t.state.kind is not StateKind.RUNNING]
    for _, front in frontiers:  # the words whose holders are asked for: the shared resources waited on
        for leaf, _parent in front:
            if leaf.waits is not None:
                ctx.wanted.update(_shared_words(leaf.waits))
    ctx.wanted.discard(0)
    for t, front in frontiers:
        ws, others = [], False
        for leaf, parent in front:
            if leaf.waits is not None:
                ws.append(ctx.wait(t, leaf, parent))
            elif _never(leaf):
                ws.append(Wait(t.id, Resource("pending", leaf.addr), f"{leaf.name} never completes", (), False))
            else:
                others = True
        waits[t.id] = ws
        if ws and not others and all(w.wakers is not None and not w.external for w in ws):
            blocked[t.id] = {k for w in ws for k in (w.wakers or ()) if k != t.id}  # waking itself: no waker
    findings = _findings(tasks, blocked, waits, holders)
    per_task = {tid: (tuple(holds.get(tid, ())), tuple(waits.get(tid, ()))) for tid in set(waits) | set(holds)}
    graph = WaitGraph(tuple(h for hs in holds.values() for h in hs), tuple(w for ws in waits.values() for w in ws),
                      tuple(findings))
    return graph, per_task


def _coroutines(root: FutureNode) -> list[FutureNode]:
    """The coroutines of a tree, preorder (one loop, no generator per node)."""
    out = []
    stack = [root]
    while stack:
        n = stack.pop()
        if n.kind == "coroutine":
            out.append(n)
        if n.children:
            stack.extend(reversed(n.children))
    return out


def _frontier(root: FutureNode) -> list[tuple[FutureNode, FutureNode | None]]:
    """(leaf, nearest coroutine above it) of the pending frontier, left to right: going down,
    a finished subtree is skipped, and the first node that waits on a resource, or has no
    children, is a leaf of it."""
    out: list[tuple[FutureNode, FutureNode | None]] = []
    stack: list[tuple[FutureNode, FutureNode | None]] = [(root, None)]
    while stack:  # (one loop, not a generator per level: it visits every node of every task)
        n, parent = stack.pop()
        if n.state is not None and n.state.kind in _DONE:
            continue
        if n.waits is not None or not n.children:
            out.append((n, parent))
            continue
        above = n if n.kind == "coroutine" else parent
        stack.extend([(c, above) for c in reversed(n.children)])
    return out


_DONE = (StateKind.FINISHED, StateKind.PANICKED)


def _never(n: FutureNode) -> bool:
    return n.name.startswith("core::future::pending") or "never completes" in n.detail


class _Context:
    def __init__(self, tasks: list[Task], r: Any, inv: Inventory | None, bias: int,
                 holders: dict[Resource, list[int]]) -> None:
        self.tasks = tasks
        self.r = r
        self.inv = inv
        self.bias = bias
        self.holders = holders
        self._by_addr = {t.addr: t for t in tasks}
        self._index: dict[int, list[int]] | None = None
        self.guards: dict[tuple[int, Resource], str] = {}
        self.wanted: set[int] = set()  # the words whose holders ``_holders`` may ask for
        self._spans: dict[tuple[str, int | None], tuple[tuple[int, int], ...]] = {}  # plans.local_spans, here
        self._plans: dict[tuple[tuple[int, str, int | None], ...], Any] = {}  # task shape -> merged spans (words)
        self.coros: dict[int, list[FutureNode]] = {}  # live task id -> its coroutines, preorder
        self._evs: dict[tuple[Any, ...], str] = {}  # see wait
        self._pats: list[tuple[int, bytes]] | None = None  # the wanted words as bytes (few: searched with find)
        self._said: dict[tuple[Any, ...], tuple[str, tuple[int, ...] | None, bool]] = {}
        self._held: dict[tuple[int, int | None], tuple[tuple[int, ...], frozenset[int]]] = {}

    def wait(self, t: Task, leaf: FutureNode, parent: FutureNode | None) -> Wait:
        res = leaf.waits
        assert res is not None
        who = parent or leaf
        ev = self._evs.get((who.name, who.state, res))
        if ev is None:  # one text per (coroutine name, state, resource): shared by its waiters
            at = f" at {who.state.loc}" if who.state is not None and who.state.loc is not None else ""
            ev = self._evs[who.name, who.state, res] = f"{who.name} awaits {res}{at}"
        if res.kind == "Mutex":
            hs = [h for h in self.holders.get(res, []) if h != t.id] or self.holders.get(res, [])
            if not hs:
                return Wait(t.id, res, ev + "; no live task's guard holds it (unknown holder)", None)
            why = "; ".join(f"#{h} holds it ({self.guards[(h, res)]})" for h in hs if (h, res) in self.guards)
            return Wait(t.id, res, ev + "; held by " + ", ".join(f"#{h}" for h in hs) + (f": {why}" if why else ""),
                        tuple(hs))
        if res.kind == "JoinHandle":
            return self._join(t, res, ev)
        if res.kind in _CHANNELS:
            return self._shared(t, res, ev, arc=res.addr, what="sender")
        if res.kind == "Notify":
            if self._inside(t, res.addr):
                return Wait(t.id, res, ev + f"; the Notify lives inside this task's own future (0x{t.addr:x}):"
                            " no other task can reach it", ())
            return self._shared(t, res, ev, arc=res.addr - _ARC_DATA, what="reference", also=res.addr)
        return Wait(t.id, res, ev + "; who can wake it: unknown", None)

    def _join(self, t: Task, res: Resource, ev: str) -> Wait:
        target = self._task_of_header(res.addr)
        if target is None:
            return Wait(t.id, res, ev + "; its task is not among the tasks found (unknown)", None)
        if not target.live:
            return Wait(t.id, res, ev + f"; its task {target.label} finished: the handle is ready", (), True)
        return Wait(t.id, res, ev + f"; wakes when {target.label} {target.name} finishes", (target.id,))

    def _task_of_header(self, header: int) -> Task | None:
        """The task a JoinHandle's header belongs to: the runtime adapter's (it says the header),
        else the future of the header's cell by its layout (``tokio_adapter.task_future``), else
        the task of the spawned type (the vtable's ``raw::poll<T, S>`` symbol names T) stored in
        the cell, right after the header."""
        for t in self.tasks:
            if f"header 0x{header:x}" in t.header:
                return t
        if self.r is None:
            return None
        from proxy.reflect.tokio_adapter import task_future

        got = task_future(self.r, self.inv, self.bias, header)
        if got is not None:
            return self._by_addr.get(got[0])
        from proxy.reflect.describers.tasks import spawned_type

        h = self.inv.types.get("tokio::runtime::task::core::Header") if self.inv is not None else None
        f = h.field("vtable") if h is not None else None
        vt = self.r.mem.word(header + (f.offset if f is not None else 16))
        spawned = spawned_type(self.r, self.r.mem.word(vt)) if vt else None
        if spawned is not None:  # v0 symbols carry T
            from .names import display_name

            want = {spawned, display_name(spawned)}
            near = [t for t in self.tasks if (t.type_name in want or t.name in want)
                    and header < t.addr < header + CELL_SPAN]
        else:  # legacy symbols do not: the future right after the header (Core's stage payload)
            near = [t for t in self.tasks if header < t.addr <= header + STAGE_SPAN]
        return min(near, key=lambda t: t.addr) if near else None

    def _inside(self, t: Task, addr: int) -> bool:
        lay = self.inv.layouts.get(t.type_name) if self.inv is not None else None
        size = lay.size if lay is not None else 0
        return t.addr <= addr < t.addr + size

    def _shared(self, t: Task, res: Resource, ev: str, *, arc: int, what: str, also: int | None = None) -> Wait:
        """Wakers: the other live tasks whose locals point at it; complete only when the Arc's
        strong count matches (1 for the waiter's own handle + one per other holder). Every
        waiter on one resource gets the same finding: made once, its text shared (100,000
        waiters on one Notify are 100,000 equal strings otherwise)."""
        if self.r is None:
            return Wait(t.id, res, ev + "; memory not read (unknown)", None)
        holders = self._holders(arc, also)  # every live task whose locals point at it, the waiter too
        mine_too = t.id in holders[1]
        named_me = t.id if t.id in holders[0][:9] else None  # the waiter is left out of the names
        key = (ev, res, arc, what, mine_too, named_me)
        got = self._said.get(key)
        if got is None:
            got = self._said[key] = self._shared_text(t, res, ev, arc, what, holders, mine_too)
        return Wait(t.id, res, got[0], got[1], got[2])

    def _shared_text(self, t: Task, res: Resource, ev: str, arc: int, what: str,
                     holders: tuple[tuple[int, ...], frozenset[int]], mine_too: bool,
                     ) -> tuple[str, tuple[int, ...] | None, bool]:
        assert self.r is not None
        n_others = len(holders[0]) - (1 if mine_too else 0)
        strong = self.r.mem.word(arc)
        weak = self.r.mem.word(arc + 8)
        if strong is None or weak is None:
            return ev + f"; its Arc at 0x{arc:x} is unreadable (unknown)", None, False
        # a Notify's Arc is a guess (the Notify at the start of an Arc's data); a Notify that is a
        # field further in (watch's Shared.notify_tx) has other fields there, often 0. A live
        # ArcInner's counts are both >= 1 (the strongs hold one weak): anything else is no Arc
        # header, and "strong count 0" must not read as "nobody else holds it" (a weak count that
        # `Arc::get_mut` has locked, usize::MAX, reads unknown too: the safe side)
        if not (0 < strong <= 1 << 32 and 0 < weak <= 1 << 32):
            return (ev + f"; no live Arc header at 0x{arc:x} (strong {strong}, weak {weak}): who holds it"
                    " is unknown"), None, False
        if res.kind in _CHANNELS and strong <= 1:
            return ev + "; every sender is dropped: the receive ends", (), True
        mine = 1 if res.kind in _CHANNELS else 0  # the waiter's own receiver holds one
        hidden = strong - mine - n_others
        first = [o for o in holders[0][:9] if o != t.id][:8]
        named = (", ".join(f"#{o}" for o in first) + (f" and {n_others - len(first)} more" if n_others > len(first)
                                                          else "")) or "no other task"
        if hidden > 0:
            return (ev + f"; {what}s held by {named} and {hidden} more outside any task's"
                    f" locals (Arc strong count {strong}): unknown", None, False)
        # the wakers: the holders, one tuple shared by every waiter on it (a waiter among them
        # can wake only itself, which changes nothing: it is blocked)
        return ev + f"; {what}s held by {named} (Arc strong count {strong})", holders[0], False

    def _holders(self, arc: int, also: int | None) -> tuple[tuple[int, ...], frozenset[int]]:
        key = (arc, also)
        got = self._held.get(key)
        if got is None:
            index = self.index()
            ids = sorted(set(index.get(arc, ())) | (set(index.get(also, ())) if also is not None else set()))
            got = self._held[key] = (tuple(ids), frozenset(ids))
        return got

    @property
    def _patterns(self) -> list[tuple[int, bytes]]:
        if self._pats is None or len(self._pats) != len(self.wanted):
            self._pats = [(w, w.to_bytes(8, "little")) for w in sorted(self.wanted) if 0 < w < 1 << 64]
        return self._pats

    def index(self) -> dict[int, list[int]]:
        """word -> the live tasks whose live locals hold it, for the ``wanted`` words (built once:
        one pass over every task, so that a resource's holders cost a lookup, not a pass, at
        100,000 tasks; only the wanted words: every pointer of every local is millions)."""
        if self._index is None:
            self._index = {}
            for o in self.tasks:
                if o.live:
                    for w in self.words(o):
                        self._index.setdefault(w, []).append(o.id)
        return self._index

    def words(self, t: Task) -> set[int]:
        """The ``wanted`` pointer-sized words in the live locals of every coroutine of a task.
        A task's coroutines are mostly stored inline in one another: their locals' spans are
        merged into a few ranges (one plan per task shape: the coroutines' types, states and
        offsets), each read and searched once; a hit counts where it lies in a span, aligned
        to the span's start, as if each span were searched alone."""
        got: set[int] = set()
        if self.inv is None or self.r is None or not self.wanted:
            return got
        read, wanted = self.r.mem.read, self.wanted
        pats = self._patterns
        few = pats if len(pats) <= 8 else None  # a few words: searched in C
        base = t.addr
        cs = self.coros.get(t.id)
        shape = tuple([(n.addr - base, n.type_name, n.state_value) for n in (cs if cs is not None else t.coroutines())])
        plan = self._plans.get(shape)
        if plan is None:
            plan = self._plans[shape] = self._plan(shape)
        for start, size, spans in plan:
            data = read(base + start, size)
            if data is None or len(data) < size:  # (a part unreadable: each span alone, as it can be)
                for lo, hi in spans:
                    part = read(base + start + lo, hi - lo)
                    if part:
                        self._search(part, ((0, len(part)),), few, wanted, got)
                continue
            self._search(data, spans, few, wanted, got)
        return got

    @staticmethod
    def _search(data: bytes, spans: tuple[tuple[int, int], ...], few: list[tuple[int, bytes]] | None,
                wanted: set[int], got: set[int]) -> None:
        if few is None:
            view = memoryview(data)
            for lo, hi in spans:
                got.update(wanted.intersection(view[lo:hi].cast("Q")))
            return
        for w, pat in few:
            if w in got:
                continue
            at = data.find(pat)
            while at >= 0:
                if any(lo <= at and at + 8 <= hi and not (at - lo) & 7 for lo, hi in spans):
                    got.add(w)
                    break
                at = data.find(pat, at + 1)

    def _plan(self, shape: tuple[tuple[int, str, int | None], ...]
              ) -> tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]:
        """(start, size, spans relative to start) of the merged ranges of a task shape's locals."""
        assert self.inv is not None
        spans = sorted((rel + off, rel + off + size) for rel, layout, value in shape
                       for off, size in self._local_spans(layout, value) if size > 0)
        out: list[tuple[int, int, tuple[tuple[int, int], ...]]] = []
        group: list[tuple[int, int]] = []
        end = 0
        for lo, hi in spans:
            if group and (lo > end or end - group[0][0] + (hi - end) > 1 << 16):
                out.append(_merged(group))
                group = []
            if not group:
                end = hi
            group.append((lo, hi))
            end = max(end, hi)
        if group:
            out.append(_merged(group))
        return tuple(out)

    def _local_spans(self, layout: str, value: int | None) -> tuple[tuple[int, int], ...]:
        key = (layout, value)
        got = self._spans.get(key)
        if got is None:
            assert self.inv is not None
            got = self._spans[key] = local_spans(self.inv, layout, value)
        return got


def _merged(group: list[tuple[int, int]]) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    start = group[0][0]
    end = max(hi for _, hi in group)
    return start, end - start, tuple((lo - start, hi - start) for lo, hi in group)


_ARC_DATA = 16  # an Arc's data follows its strong and weak counts


def _shared_words(res: Resource) -> tuple[int, ...]:
    """The words ``_Context._shared`` asks the holders of, for a wait on ``res``."""
    if res.kind in _CHANNELS:
        return (res.addr,)
    if res.kind == "Notify":
        return (res.addr - _ARC_DATA, res.addr)
    return ()


def _findings(tasks: list[Task], blocked: dict[int, set[int]], waits: dict[int, list[Wait]],
              holders: dict[Resource, list[int]]) -> list[Finding]:
    stuck = set(blocked)
    changed = True
    while changed:  # the largest set whose every waker is stuck too
        changed = False
        for t in list(stuck):
            if not blocked[t] <= stuck:
                stuck.discard(t)
                changed = True
    names = {t.id: f"#{t.id} {t.name}" for t in tasks}
    out: list[Finding] = []
    in_cycle: set[int] = set()
    for start in sorted(stuck):
        if start in in_cycle:
            continue
        cyc = _cycle_from(start, blocked, stuck)
        if cyc is None or any(c in in_cycle for c in cyc):
            continue
        in_cycle.update(cyc)
        parts = [names[cyc[0]]]
        evidence = []
        for a, b in zip(cyc, cyc[1:] + cyc[:1]):
            w = next((w for w in waits[a] if w.wakers and b in w.wakers), None)
            parts.append(f"{w.resource if w else '?'} held by {names[b] if b != cyc[0] else f'#{b}'}")
            if w is not None:
                evidence.append(f"#{a}: {w.evidence}")
        out.append(Finding("cycle", tuple(cyc), "cycle: " + " -> ".join(parts), tuple(evidence)))
    for t in sorted(stuck - in_cycle):
        ws = waits[t]
        if not blocked[t]:
            text = "nothing can wake: " + names[t] + " -> " + ", ".join(str(w.resource) for w in ws)
            out.append(Finding("unwakeable", (t,), text, tuple(f"#{t}: {w.evidence}" for w in ws)))
        else:
            behind = sorted(blocked[t])
            text = (f"blocked: {names[t]} -> " + ", ".join(str(w.resource) for w in ws)
                    + " -> " + ", ".join(names[b] + (" (in a cycle)" if b in in_cycle else "") for b in behind))
            out.append(Finding("blocked", (t,), text, tuple(f"#{t}: {w.evidence}" for w in ws)))
    return out


def _cycle_from(start: int, edges: dict[int, set[int]], within: set[int]) -> list[int] | None:
    """A shortest cycle through ``start`` (BFS over wakers inside ``within``), or None."""
    prev: dict[int, int] = {}
    frontier = [start]
    seen = {start}
    while frontier:
        nxt = []
        for a in frontier:
            for b in sorted(edges.get(a, ())):
                if b not in within:
                    continue
                if b == start and a != start:
                    path = [a]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return list(reversed(path))
                if b not in seen:
                    seen.add(b)
                    prev[b] = a
                    nxt.append(b)
        frontier = nxt
    return None
