"""Read a task's pending-future tree from memory (DESIGN.md §4, "Reflection").

``Reflector(inventory, bias, read).walk(addr, type_name)`` returns a ``Node``
tree: a coroutine reads its ``__state``, picks that variant and recurses into
its ``__awaitee`` by type; ``GenFuture<T>`` (rustc 1.63) is transparent;
``Pin<P>`` is transparent; ``Box<T>`` and ``&mut T`` are followed;
``Box<dyn Future>`` is followed through its vtable (the ``poll`` slot is the
concrete type's resume function, else the ``drop_in_place<T>`` symbol of the
drop slot names T); combinators and leaves come from ``describers``.

Bounds: ``max_depth`` nodes deep, ``max_nodes`` per walk, cycle detection on
(address, type), and the byte budget of the ``BlockReader``. Garbage (a state
value the layout does not have, a pointer into nowhere, a vtable that names
nothing) ends the branch in an ``unreadable`` node; nothing raises.
"""

from __future__ import annotations

import re

from proxy.analysis.model import Inventory, Layout, TypeInfo

from .memory import BlockReader, Budget, ReadMemory
from .node import Node, _pointee, short_type, coroutine_path, missing_or_unreadable, unreadable

__all__ = ["Node", "Reflector", "coroutine_path", "missing_or_unreadable", "unreadable"]

MAX_DEPTH = 48
MAX_NODES = 2000

_MUTEX_GUARD = re.compile(r"tokio::sync::mutex::(Owned)?MutexGuard<|async_lock::mutex::MutexGuard<")
_MUTEX_LOCK = re.compile(r"tokio::sync::mutex::\{impl#\d+\}::lock(<.*>)?$")


class Reflector:
    def __init__(self, inventory: Inventory, bias: int, read: ReadMemory | BlockReader, *,
                 max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES,
                 now_ns: int | None = None, symbol_at=None) -> None:  # type: ignore[no-untyped-def]
        from .describers import DESCRIBERS

        self.inv = inventory
        self.bias = bias
        self.mem = read if isinstance(read, BlockReader) else BlockReader(read)
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.now_ns = now_ns  # CLOCK_MONOTONIC of the target's host (a Sleep's time left)
        self.symbol_at = symbol_at  # link-time addr -> demangled symbol name (vtables)
        self.describers = DESCRIBERS
        self._nodes = 0
        self.task_names: dict[int, str] = {}  # task header address -> label (JoinHandle)
        # the I/O handle the innermost enclosing coroutine borrows as `self` (its fd, its type):
        # a Readiness leaf holds only the driver's ScheduledIo, which has no fd (describers.readiness)
        self.io_handle: tuple[int, str] | None = None
        self._describers: dict[str, list] = {}  # type name -> its describers, in order  # type: ignore[type-arg]
        self._plans: dict[tuple[str, int], tuple[tuple, tuple]] = {}  # (layout, state) -> Reflector._plan

    # -- entry ---------------------------------------------------------------------------
    def walk(self, addr: int, type_name: str) -> Node:
        self._nodes = 0
        try:
            return self._walk(addr, type_name, 0, frozenset())
        except Budget as e:
            return Node("unreadable", f"<unreadable: {e}>", addr, type_name)

    def child(self, addr: int, type_name: str, depth: int, seen: frozenset[tuple[int, str]]) -> Node:
        """For describers: walk a sub-future."""
        return self._walk(addr, type_name, depth + 1, seen)

    def layout(self, type_name: str) -> Layout | None:
        return self.inv.layouts.get(type_name)

    def type(self, type_name: str) -> TypeInfo | None:
        return self.inv.types.get(type_name)

    # -- the walk ------------------------------------------------------------------------
    def _walk(self, addr: int, type_name: str, depth: int, seen: frozenset[tuple[int, str]]) -> Node:
        if depth > self.max_depth or self._nodes >= self.max_nodes:
            return Node("truncated", f"{short_type(type_name)} ...", addr, type_name, detail="too deep")
        key = (addr, type_name)
        if key in seen:
            return Node("unreadable", f"<unreadable: cycle at 0x{addr:x}>", addr, type_name)
        seen = seen | {key}
        self._nodes += 1
        if addr <= 0 or addr >= 1 << 47:
            return unreadable(addr, type_name, "bad address")
        layout = self.inv.layouts.get(type_name)
        if layout is not None:
            return self._coroutine(addr, layout, depth, seen)
        fns = self._describers.get(type_name)
        if fns is None:  # the describers whose prefix the type has: looked up once per type
            fns = self._describers[type_name] = [fn for prefix, fn in self.describers if type_name.startswith(prefix)]
        for fn in fns:
            node = fn(self, addr, type_name, depth, seen)
            if node is not None:
                return node
        return self._generic(addr, type_name, depth, seen)

    def _coroutine(self, addr: int, layout: Layout, depth: int, seen: frozenset[tuple[int, str]]) -> Node:
        path = coroutine_path(layout.type_name)
        value = self.mem.u(addr + layout.state_offset, layout.state_size)
        if value is None:
            return missing_or_unreadable(self, addr, layout.type_name, path)
        st = layout.state(value)
        if st is None:
            return unreadable(addr, layout.type_name, f"{path}: __state {value} is not a state")
        node = Node("coroutine", path, addr, layout.type_name, loc=st.loc, state=st.name, value=value)
        if value == 0:
            node.status = "not yet polled"
        elif value == 1:
            node.status = "completed"
        elif value == 2:
            node.status = "panicked"
        else:
            plan = self._plans.get((layout.type_name, value))
            if plan is None:
                plan = self._plans[layout.type_name, value] = self._plan(st.locals, path)
            if plan[0]:
                self._mutexes(node, addr, plan[0], path)
            if st.awaitee is not None:
                outer = self.io_handle
                self.io_handle = (self._io_handle(addr, plan[1]) if plan[1] else None) or outer
                try:
                    node.children.append(self._walk(addr + st.awaitee.offset, st.awaitee.type_name, depth + 1, seen))
                finally:
                    self.io_handle = outer
        return node

    def _plan(self, locals_, path: str):  # type: ignore[no-untyped-def]
        """(the locals ``_mutexes`` reads, the locals ``_io_handle`` reads) of one state: most
        states have none, and the same few states are met once per task."""
        locks = tuple(m for m in locals_ if _MUTEX_GUARD.match(m.type_name)
                      or (m.name == "self" and _MUTEX_LOCK.match(path)))
        return locks, tuple(m for m in locals_ if m.type_name in self.inv.fd_offsets)

    def _io_handle(self, addr: int, locals_) -> tuple[int, str] | None:  # type: ignore[no-untyped-def]
        """(fd, handle type) of a ``self: &TcpStream``-like local (``Inventory.fd_offsets``)."""
        for m in locals_:
            off = self.inv.fd_offsets.get(m.type_name)
            if off is None:
                continue
            p = self.mem.word(addr + m.offset)
            fd = self.mem.u(p + off, 4) if p else None
            if fd is not None:
                return (fd - (1 << 32) if fd >= 1 << 31 else fd), short_type(m.type_name.lstrip("&"))
        return None

    def _mutexes(self, node: Node, addr: int, locals_, path: str) -> None:  # type: ignore[no-untyped-def]
        """Live ``MutexGuard`` locals (held locks) and ``Mutex::lock``'s own ``self``."""
        for m in locals_:
            if _MUTEX_GUARD.match(m.type_name):
                t = self.type(m.type_name)
                f = (t.field("lock") or t.field("__0")) if t is not None else None  # async-lock: MutexGuard(&Mutex)
                p = self.mem.word(addr + m.offset + f.offset) if f is not None else None
                if p:
                    node.holds += (p,)
            elif m.name == "self" and _MUTEX_LOCK.match(path):
                p = self.mem.word(addr + m.offset)
                if p:
                    node.waits_on = p
                    node.detail = f"waits on Mutex 0x{p:x}"

    def _generic(self, addr: int, type_name: str, depth: int, seen: frozenset[tuple[int, str]]) -> Node:
        t = self.inv.types.get(type_name)
        if t is None:
            return Node("leaf", short_type(type_name), addr, type_name)
        if type_name.startswith("core::future::from_generator::GenFuture<") or type_name.startswith(
                "core::pin::Pin<"):
            inner = t.fields[0] if t.fields else None  # __0 / pointer: transparent
            if inner is not None:
                return self._walk(addr + inner.offset, inner.type_name, depth, seen)
        if t.kind == "struct" and {f.name for f in t.fields} >= {"pointer", "vtable"}:
            return self._dyn(addr, t, depth, seen)
        if t.kind == "pointer" and t.pointee:
            target = self.mem.word(addr)
            if target is None:
                return missing_or_unreadable(self, addr, type_name, short_type(type_name))
            return self._walk(target, t.pointee, depth, seen)
        if type_name.startswith("alloc::boxed::Box<") and t.fields:
            ptr = self.type(t.fields[0].type_name)
            target = self.mem.word(addr + t.fields[0].offset)
            pointee = _pointee(self, ptr)
            if target is None:
                return missing_or_unreadable(self, addr, type_name, short_type(type_name))
            if pointee:
                return self._walk(target, pointee, depth, seen)
        return Node("leaf", short_type(type_name), addr, type_name)

    def _dyn(self, addr: int, t: TypeInfo, depth: int, seen: frozenset[tuple[int, str]]) -> Node:
        """``Box<dyn Future>``: (data, vtable); vtable = [drop, size, align, poll, ...]."""
        pf, vf = t.field("pointer"), t.field("vtable")
        assert pf is not None and vf is not None
        data, vtable = self.mem.word(addr + pf.offset), self.mem.word(addr + vf.offset)
        if data is None or vtable is None:
            return missing_or_unreadable(self, addr, t.name, short_type(t.name))
        slots = self.mem.read(vtable, 32)
        if slots is None:
            return missing_or_unreadable(self, vtable, t.name, f"{short_type(t.name)} vtable")
        drop, size, _align, poll = (int.from_bytes(slots[i:i + 8], "little") for i in range(0, 32, 8))
        fn = self.inv.resume_fn_at(poll - self.bias) if poll > self.bias else None
        if fn is not None and fn.layout_name and fn.layout_name in self.inv.layouts:
            return self._walk(data, fn.layout_name, depth, seen)
        polled = self.inv.future_polls.get(poll - self.bias)  # a wrapper future's own poll
        if polled is not None and polled in self.inv.types:
            return self._walk(data, polled, depth, seen)
        concrete = self._drop_type(drop)
        if concrete:
            if concrete in self.inv.layouts or concrete in self.inv.types:
                return self._walk(data, concrete, depth, seen)
            return Node("leaf", short_type(concrete), data, concrete, detail=f"dyn, {size} bytes")
        return unreadable(addr, t.name, f"vtable 0x{vtable:x} names no known type")

    def _drop_type(self, drop: int) -> str | None:
        if self.symbol_at is None or drop <= self.bias:
            return None
        name = self.symbol_at(drop - self.bias)
        m = re.match(r"core::ptr::drop_in_place<(.*)>$", name or "")
        return m.group(1) if m else None
