"""The merge of memory, the threads' stacks, the pcs and earlier stops: rules 1-7.

``proxy.snapshot.build`` lists the rules with their reasons; here is their
code: the roots found by every source keyed and lifted (rules 1-2), each
walked once, a root inside another's tree made a frame of it (rule 3), the
poll chains of the threads nested and marked running (rules 4-5), the
coroutines inlined at the pcs (rule 6), tasks of earlier stops kept while
memory still holds them (rule 7).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proxy.analysis.model import Frame as SrcFrame
from proxy.analysis.model import Era, Inventory, SourceLoc
from proxy.reflect.tree import (Root, _first_coroutine_below, coroutine_frames, ident, is_coroutine, mark_running, norm,
                                overlay_matches, running_from_frames)
from proxy.reflect.walker import Node, Reflector

from .inputs import BuildState, Key
from .names import await_line_for, layout_name
from .plans import parents_index


class Merge(BuildState):
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
        homes: dict[int, int] | None = None
        for discover in self.inp.adapters:
            for root in discover(r) or ():
                if root.owner is not None:  # a task of a one-thread executor: the thread running it
                    if homes is None:
                        from proxy.reflect.tokio_adapter import local_set_threads

                        homes = local_set_threads(r, self.stack_keys)
                    home = homes.get(root.owner)
                    if home is not None:
                        root = replace(root, thread=home, header=f"{root.header}, local to thread {home}")
                have = roots.setdefault((root.addr, root.type_name), root)
                if have is not root and root.label and not have.label:  # on a stack, and the runtime's task
                    roots[root.addr, root.type_name] = replace(have, label=root.label)
        for key in self.finished_keys:  # rule 8
            if key not in roots:
                earlier.seen.pop(key, None)
        for key, root in earlier.seen.items():  # rule 7
            if key not in roots:  # (most were found again: no Root made for them)
                roots[key] = Root(root.addr, root.type_name, root.label, "seen before", root.thread,
                                  header="seen at an earlier stop")
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
            if tree.kind == "coroutine" and tree.status in ("completed", "panicked") or slot_reused(r, root):
                earlier.seen.pop(key, None)
                earlier.status.pop(key, None)
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
        self._link_mutexes(out)
        return out

    def _link_mutexes(self, trees: list[tuple[Root, Node]]) -> None:
        """A task waiting on a Mutex another task holds: remember the holder's tree, so that the
        leaf says who holds it by the holder's snapshot id (``Convert``: ids are final only there;
        the runtime's own task id, ``tokio#3``, is another number than the ``#4`` every command
        shows)."""
        for root, tree in trees:
            stack = [tree]
            while stack:  # preorder (the outermost holder named first), without a generator per node
                n = stack.pop()
                for m in n.holds:
                    self.mutex_holders.setdefault(m, (root, tree))
                if n.children:
                    stack.extend(reversed(n.children))

    def _pollers_run(self, trees: list[tuple[Root, Node]]) -> None:
        """Rule 4, upward in a tree: the coroutines above a running one poll it (all threads are
        stopped inside its poll), so they run on its thread too; each keeps the line of the
        .await its own state shows, which holds the running child."""
        if not self.running:
            return
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
        self.stack_chains = dict(finder.chains)
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
                    # the innermost poller on the chain: the pc says what runs below it (rule 5);
                    # its line is where its own frame is now (a sync fn it called: tokio's tinydb
                    # stopped in handle_request showed its block's first line, not the call's)
                    node.loc = self._own_frame_line(key) or node.loc
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

    def _own_frame_line(self, key: Key) -> SourceLoc | None:
        """The line a coroutine's own resume frame is at (the call out of it), in its own source
        file: the innermost frame inlined at that pc that is of that file."""
        pc = self.chain_pcs.get(key)
        home = _home_file(self.inv, key[1])
        if pc is None or home is None:
            return None
        own = [f.loc for f in self._frames(pc) if f.loc is not None and f.loc.file == home]
        return own[-1] if own else None

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
                pcs.setdefault(tid, regs.get("rip", regs.get("pc", 0)))  # x86-64's name, AArch64's
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
            pcs.setdefault(tid, regs.get("rip", regs.get("pc", 0)))  # x86-64's name, AArch64's
        out = []
        for tid, pc in pcs.items():
            if pc <= self.inp.bias:
                continue
            link = pc - self.inp.bias
            frames = self._frames(link)
            run = running_from_frames(tid, frames, None, self._coroutine_frames(link, frames))
            if run is None:
                # the thread is in a sync function (a breakpoint in it): what runs is at the call
                # in the innermost resume frame, with the coroutines inlined there (release:
                # axum's chat stopped in check_username showed websocket, inlined into
                # on_upgrade's block, at its old `.await` 79, not running the call at 82)
                inner = next((k for k in self.chains.get(tid, []) if k is not None), None)
                call = self.chain_pcs.get(inner) if inner is not None else None
                run = running_from_frames(tid, self._frames(call), None) if call is not None else None
            if run is not None:
                out.append((tid, run))
        return out

    def _coroutine_frames(self, link: int, frames: list[SrcFrame]) -> list[bool] | None:
        """Which frames at a pc are coroutines, by the inventory (``tree.coroutine_frames``)."""
        if self.inv is None or not self.inv.resume_fns or _genfuture_era(self.inv):
            return None  # nothing known, or rustc 1.63's (its generator's own fn is no resume fn): by name
        here = [c.name for c in self.inv.inlined if any(lo <= link < hi for lo, hi in c.ranges)]
        return coroutine_frames(frames, self.inv.resume_fn_at(link) is not None, here)

    def _in_awaitee_slot(self, parent: Node, name: str, fn: str) -> Node | None:
        """A coroutine inlined at the pc below ``parent`` that ``parent``'s state in memory does
        not hold: read from the one awaitee slot of ``parent``'s layout that holds a coroutine of
        that name. The child is built into that slot before its first poll, the parent's state
        is written only when it suspends: in the parent's first poll it still reads Unresumed
        (after an earlier suspend, that `.await`'s). Fact (axum's chat, release, a breakpoint
        in check_username, one run in two): on_upgrade's block in its first poll, websocket
        inlined into it, was drawn running at websocket's line with no websocket below it."""
        lay = self.inv.layouts.get(parent.type_name) if self.inv is not None else None
        if lay is None or self.r is None or parent.kind != "coroutine":
            return None
        slots = {(st.awaitee.offset, st.awaitee.type_name) for st in lay.states
                 if st.awaitee is not None and st.awaitee.type_name in self.inv.layouts}  # type: ignore[union-attr]
        hits = []
        for off, tname in sorted(slots):
            node = self.r.walk(parent.addr + off, tname)
            if is_coroutine(node, name, fn) and node.status not in ("completed", "panicked"):
                hits.append(node)
        return hits[0] if len(hits) == 1 else None

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
                nxt = _first_coroutine_below(cur, name, fn) or self._in_awaitee_slot(cur, name, fn)
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


# ---- helpers ---------------------------------------------------------------------------

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


def slot_reused(r: Reflector, root: Root) -> bool:
    """Rule 7 for every root: the root's memory holds a value that is none of its coroutine's
    states, so the coroutine is not there any more (a live one's state always is one): a
    task dropped unfinished, its slot freed and reused. The engine saw it poll and never
    return, so it still counted it alive. Fact (hyper's single_threaded, release, capture on):
    each client thread's connection task, pending when its LocalSet was dropped with the
    thread's runtime, was shown as a live task of state "unknown", its tree unreadable
    (`__state 115 is not a state`). A value not read (an unanswered read) says nothing."""
    lay = r.inv.layouts.get(root.type_name)
    if lay is None:
        return False
    value = r.mem.u(root.addr + lay.state_offset, lay.state_size)
    return value is not None and lay.state(value) is None


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
    for _, tree in trees:  # (a plain loop, not Node.iter: it visits every node of every task)
        stack = list(tree.children)
        while stack:
            n = stack.pop()
            if n.kind == "coroutine":
                inner.add((n.addr, n.type_name))
            if n.children:
                stack.extend(n.children)
    return [(root, tree) for root, tree in trees if (tree.addr, tree.type_name) not in inner]


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


def _genfuture_era(inv: Inventory) -> bool:
    """rustc 1.63's program: its resume functions are GenFuture's polls (once per inventory)."""
    got = getattr(inv, "_genfuture_era", None)
    if got is None:
        got = any(f.era is Era.GENFUTURE for f in inv.resume_fns)
        try:
            inv._genfuture_era = got  # type: ignore[attr-defined]
        except AttributeError:
            pass
    return got  # type: ignore[no-any-return]
