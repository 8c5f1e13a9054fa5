"""futures' own executor (``futures::executor::LocalPool``, futures 0.3): its spawned tasks.

A LocalPool keeps every spawned future in a ``FuturesUnordered<LocalFutureObj<'static,
()>>``: one heap ``Task`` per future, holding ``Option<LocalFutureObj>`` by value. A
``LocalFutureObj`` is ``{ future: *mut dyn Future, drop_fn: unsafe fn(*mut dyn Future) }``
(futures-task ``future_obj.rs``); for ``spawn_local(fut)`` the object is a ``Box<F>`` and
``drop_fn`` is ``<Box<F> as UnsafeFutureObj<T>>::drop``, a static function the analysis
lists (``Inventory.future_obj_drops``). The pool itself is a local of the thread that runs
it and has no static anchor; its tasks have one: that word. A hit is a task when the fat
pointer beside it (before or after it: the field order is the compiler's) names, through
its vtable's ``poll`` slot, a coroutine's resume function, and that coroutine is still
pending (a finished future is dropped: its ``Option`` is ``None``, the pointer 0).

Checked on futures 0.3.31 (trixie), debug and release.
"""

from __future__ import annotations

from proxy.analysis.model import Inventory

from ..tree import Root
from ..walker import Reflector

POLL_SLOT = 24  # a dyn vtable: drop, size, align, then the trait's methods (Future::poll)


class FutureObjAdapter:
    name = "futures-executor"

    def __init__(self, inv: Inventory, bias: int) -> None:
        self.inv = inv
        self.bias = bias
        self.vt_off = 0
        self.targets: dict[int, None] = {a + bias: None for a in inv.future_obj_drops}
        self.note = None if self.targets else "no futures LocalPool tasks in this program (no LocalFutureObj)"

    def roots(self, r: Reflector, hits: dict[int, None]) -> list[Root]:
        roots = []
        for at in sorted(hits):
            for fat in (at + 8, at - 16):  # drop_fn first, or the fat pointer first
                root = self._root(r, fat)
                if root is not None:
                    roots.append(root)
                    break
        return roots

    def _root(self, r: Reflector, fat: int) -> Root | None:
        data, vtable = r.mem.word(fat), r.mem.word(fat + 8)
        if not data or not vtable:
            return None
        poll = r.mem.word(vtable + POLL_SLOT)
        fn = self.inv.resume_fn_at(poll - self.bias) if poll and poll > self.bias else None
        layout = self.inv.layouts.get(fn.layout_name) if fn is not None and fn.layout_name else None
        if layout is None:
            return None
        value = r.mem.u(data + layout.state_offset, layout.state_size)
        if value is None or value in (1, 2) or layout.state(value) is None:
            return None  # unreadable, finished, or not this coroutine (a stale copy)
        return Root(data, layout.type_name, "", "futures-executor",
                    header="spawned task (LocalPool), LocalFutureObj 0x%x" % fat)
