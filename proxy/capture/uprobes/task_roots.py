"""A tokio task's poll seen at its coroutine's root entry, not at a probe of its own (pure).

Under ``--wakes`` each task type's ``raw::poll<T, S>`` was a wake site (OP_POLL: the
scheduling delay closed, the thread's running task set, the task bound to its coroutine):
3 of the 6 spawn and wake traps a request on the axum service. The task's future lives in
its cell at an offset the types give (``Cell<T, S>.core.stage``'s ``Running`` variant, one
field wrappers unwrapped: ``proxy/reflect/tokio_adapter.py``), and its poll enters the
future's resume function as the thread's first poll (a root entry, a trap the capture takes
anyway). So for each task type whose future is a coroutine the inventory knows, the BPF
program is told (map ``task_roots``): the resume function's entry at depth 0 is that task's
poll, its header at ``self - offset``, checked by the header's vtable pointer (one 8-byte
read: a coroutine of that type polled at depth 0 outside a task, under ``block_on`` or a
hand-written future's poll, is not taken for one). The task-poll site is then not planted.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.analysis.model import Inventory


@dataclass(frozen=True, slots=True)
class TaskRoot:
    fn: int  # the future's resume function (index into inv.resume_fns)
    offset: int  # the future's self - the task's header
    vt_off: int  # the header's vtable field
    vtable: int  # link address of the task type's vtable (its `poll` slot, the first field)


def task_roots(inv: Inventory) -> dict[int, TaskRoot]:
    """Task-poll function (link address) -> how its task's poll is seen at its root entry,
    for the task types where the layout says so; the others keep their task-poll site."""
    from proxy.reflect.tokio_adapter import HEADER, cell_plan, check
    from proxy.reflect.walker import Reflector

    if not inv.task_polls or check(inv) is not None:
        return {}
    h = inv.types.get(HEADER)
    f = h.field("vtable") if h is not None else None
    if f is None:
        return {}
    r = Reflector(inv, 0, lambda addr, size: None)
    fn_of = {}
    for i, rf in enumerate(inv.resume_fns):
        if rf.layout_name and not getattr(rf, "wrapper", ""):
            fn_of.setdefault(rf.layout_name, []).append(i)
    vt_of: dict[str, list[int]] = {}
    for slot, cell in inv.task_vtables.items():
        vt_of.setdefault(cell, []).append(slot)
    out: dict[int, TaskRoot] = {}
    for addr, cell in inv.task_polls.items():
        plan = cell_plan(r, cell)
        vts = vt_of.get(cell, [])
        if plan is None or len(vts) != 1:
            continue
        running = [v for v in plan.enum.variants if v.name == "Running" and v.fields]
        if len(running) != 1:
            continue
        from proxy.reflect.describers.combinators import unwrap

        off, ftype = unwrap(r, plan.stage + running[0].fields[0].offset, running[0].fields[0].type_name)
        fns = fn_of.get(ftype, [])
        if len(fns) != 1:
            continue
        out[addr] = TaskRoot(fns[0], off, f.offset, vts[0])
    return out
