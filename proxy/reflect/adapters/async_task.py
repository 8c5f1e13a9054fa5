"""async-task's tasks (smol's async-executor, async-std through async-global-executor).

A task is one allocation (async-task 4.x, ``raw.rs``): a ``Header<M> { state,
awaiter, vtable: &'static TaskVTable, metadata, .. }`` first, then the
scheduler ``S``, then the future ``F`` (or its output once it finished). The
offset of ``F`` is computed by async-task at compile time and kept in the
static ``TaskLayout`` that ``TaskVTable.layout_info`` points at: read from
there, never computed here. Each ``(F, T, S, M)`` has its own static
``TaskVTable`` whose ``run`` slot holds ``RawTask<F, T, S, M>::run``: the
analysis names F from that function (``Inventory.task_run_slots``).

``state`` bits (async-task ``state.rs``): SCHEDULED 1, RUNNING 2, COMPLETED 4,
CLOSED 8. A task whose state says COMPLETED or CLOSED holds no pending future.

Executors wrap the spawned future in an async block of their own
(async-executor's ``spawn_inner``: a guard, then ``future.await``): the root is
the future that block awaits, so the task reads as the user's async fn.

Checked on async-task 4.7.1 (trixie: smol 2.0 / async-executor 1.13, async-std
1.13 / async-global-executor 2.4), debug and release.
"""

from __future__ import annotations

import re

from proxy.analysis.model import Inventory

from ..tree import Root
from ..walker import Reflector, coroutine_path

VTABLE = "async_task::raw::TaskVTable"
LAYOUT = "async_task::raw::TaskLayout"
HEADER = "async_task::header::Header<"
RUNNING, COMPLETED, CLOSED = 2, 4, 8
# async blocks of executors around the spawned future (their one await is the user's future)
EXECUTOR_BLOCKS = ("async_executor::", "async_global_executor::", "async_std::")
_PIN_BOX = re.compile(r"^core::pin::Pin<alloc::boxed::Box<(.*), alloc::alloc::Global>>$")


def check(inv: Inventory) -> str | None:
    """Why this program's async-task layout is not one the adapter reads (None: it is)."""
    if not inv.task_run_slots:
        return "no async-task tasks in this program (not smol/async-std, or no debug info)"
    vt, lay = inv.types.get(VTABLE), inv.types.get(LAYOUT)
    if vt is None or vt.field("run") is None or vt.field("layout_info") is None:
        return f"unsupported async-task layout: {VTABLE} has no 'run' or 'layout_info' field"
    if lay is None or lay.field("offset_f") is None:
        return f"unsupported async-task layout: {LAYOUT} has no 'offset_f' field"
    if header_type(inv) is None:
        return f"unsupported async-task layout: no {HEADER}M> with 'state' and 'vtable' fields"
    return None


def header_type(inv: Inventory):  # type: ignore[no-untyped-def]
    for name, t in inv.types.items():
        if name.startswith(HEADER) and t.field("state") is not None and t.field("vtable") is not None:
            return t
    return None


class AsyncTaskAdapter:
    name = "async-task"

    def __init__(self, inv: Inventory, bias: int) -> None:
        self.inv = inv
        self.note = check(inv)
        self.targets: dict[int, str] = {}
        self.vt_off = 0
        if self.note is not None:
            return
        vt, lay, h = inv.types[VTABLE], inv.types[LAYOUT], header_type(inv)
        run, info, off_f = vt.field("run"), vt.field("layout_info"), lay.field("offset_f")
        assert run is not None and info is not None and off_f is not None and h is not None
        self.targets = {slot - run.offset + bias: fut for slot, fut in inv.task_run_slots.items()}
        self.vt_off = h.field("vtable").offset
        self.state_off = h.field("state").offset
        self.info_off, self.off_f = info.offset, off_f.offset

    def roots(self, r: Reflector, hits: dict[int, str]) -> list[Root]:
        roots = []
        for header, fut in sorted(hits.items()):
            root = self._root(r, header, fut)
            if root is not None:
                roots.append(root)
        return roots

    def _root(self, r: Reflector, header: int, fut: str) -> Root | None:
        state = r.mem.word(header + self.state_off)
        vt = r.mem.word(header + self.vt_off)
        info = r.mem.word(vt + self.info_off) if vt is not None else None
        off = r.mem.word(info + self.off_f) if info is not None else None
        if state is None or off is None or off > 1 << 20 or state & (COMPLETED | CLOSED):
            return None  # unreadable, garbage, or no pending future any more
        addr, tname = header + off, fut
        m = _PIN_BOX.match(tname)
        if m:  # large futures are boxed by the executor: the task holds the Box
            p = r.mem.word(addr)
            if not p:
                return None
            addr, tname = p, m.group(1)
        addr, tname = _unwrap_executor(r, addr, tname)
        running = " (running now)" if state & RUNNING else ""
        return Root(addr, tname, "", "async-task runtime",
                    header=f"spawned task, header 0x{header:x}{running}")


def _unwrap_executor(r: Reflector, addr: int, tname: str) -> tuple[int, str]:
    """The future an executor's own async block awaits (its ``__awaitee``), when it awaits one."""
    for _ in range(3):
        layout = r.layout(tname)
        if layout is None or not coroutine_path(tname).startswith(EXECUTOR_BLOCKS):
            break
        value = r.mem.u(addr + layout.state_offset, layout.state_size)
        st = layout.state(value) if value is not None else None
        if st is None or st.awaitee is None:
            break
        inner = st.awaitee.type_name
        got = _PIN_BOX.match(inner)
        if got:
            p = r.mem.word(addr + st.awaitee.offset)
            if not p:
                break
            addr, tname = p, got.group(1)
        else:
            addr, tname = addr + st.awaitee.offset, inner
    return addr, tname
