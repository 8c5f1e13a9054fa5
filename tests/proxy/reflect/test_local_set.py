"""Where a tokio LocalSet's tasks live (sans-IO, the compiler's own types and offsets from
hyper's single_threaded, synthetic memory): a `spawn_local`'d task's cell holds its
LocalSet's shared state (`core.scheduler: Arc<local::Shared>`), and a LocalSet runs on the
thread whose stack holds the future that awaits it (`run_until`'s `RunUntil { local_set }`).
Fact (single_threaded attached late): the servers' connection tasks said nothing of their
thread; each is polled only on its server's thread."""

from __future__ import annotations

import pytest

from proxy.reflect.describers.fields import _path
from proxy.reflect.describers.io import shared_inner_type
from proxy.reflect.tokio_adapter import cell_plan, local_set_threads
from proxy.reflect.walker import Reflector
from tests.proxy.reflect.test_walker import BASE, Mem, _inv

SERVER = "hyper_single_threaded::http1_server::{async_fn_env#0}"
RUN_UNTIL = f"tokio::task::local::{{impl#4}}::run_until::{{async_fn_env#0}}<{SERVER}>"
LOCAL_SET, SHARED = BASE + 0x1000, BASE + 0x3000
CONTEXT = BASE + 0x2000  # the Rc's RcInner<Context>


def _word(mem: Mem, at: int | None, value: int) -> None:
    assert at is not None
    mem.write(at, value.to_bytes(8, "little"))


def _local_set(inv, mem: Mem, r: Reflector) -> None:  # type: ignore[no-untyped-def]
    """A LocalSet whose context's shared state is SHARED."""
    mem.write(LOCAL_SET, bytes(inv.types["tokio::task::local::LocalSet"].size))
    _word(mem, _path(r, LOCAL_SET, "tokio::task::local::LocalSet", "context", "ptr", "pointer"), CONTEXT)
    inner = shared_inner_type(r, inv.types["tokio::task::local::LocalSet"].field("context").type_name)
    assert inner is not None
    mem.write(CONTEXT, bytes(inv.types[inner].size))
    _word(mem, _path(r, CONTEXT, inner, "value", "shared", "ptr", "pointer"), SHARED)


def test_a_local_set_runs_on_the_thread_whose_stack_awaits_it() -> None:
    inv = _inv("realworld-debug", "hyper_single_threaded")
    mem = Mem()
    r = Reflector(inv, 0, mem.read)
    _local_set(inv, mem, r)
    lay = inv.layouts[RUN_UNTIL]
    st = lay.state(3)  # Suspend0: `run_until.await`, RunUntil { local_set, future }
    assert st is not None and st.awaitee is not None
    mem.write(BASE, bytes(lay.size))
    mem.write(BASE + lay.state_offset, (3).to_bytes(lay.state_size, "little"))
    _word(mem, _path(r, BASE + st.awaitee.offset, st.awaitee.type_name, "local_set"), LOCAL_SET)
    r = Reflector(inv, 0, mem.read)
    assert local_set_threads(r, {(BASE, RUN_UNTIL): 7}) == {SHARED: 7}
    # not suspended at its RunUntil (not polled yet): no LocalSet runs there
    mem.write(BASE + lay.state_offset, (0).to_bytes(lay.state_size, "little"))
    assert local_set_threads(Reflector(inv, 0, mem.read), {(BASE, RUN_UNTIL): 7}) == {}


@pytest.mark.parametrize("local", [True, False])
def test_a_spawn_local_task_names_its_local_sets_shared_state(local: bool) -> None:
    inv = _inv("realworld-debug", "hyper_single_threaded")
    prefix = "tokio::runtime::task::core::Cell<hyper_single_threaded::http1_server::{async_fn#0}::{async_block_env#1}, "
    # the block's cell on the LocalSet's Shared (a cell of the same future on the runtime's Handle exists too:
    # which comes first in the inventory's types is not fixed)
    cell = next(n for n in inv.types if n.startswith(prefix) and "tokio::task::local::Shared" in n) if local else \
        next(n for n in inv.types if n.startswith("tokio::runtime::task::core::Cell<")
             and "tokio::task::local::Shared" not in n and "current_thread::Handle" in n)
    r = Reflector(inv, 0, Mem().read)
    plan = cell_plan(r, cell)
    assert plan is not None and (plan.local is not None) == local
    header = BASE + 0x4000
    mem = Mem()
    mem.write(header, bytes(inv.types[cell].size))
    running = next(v for v in plan.enum.variants if v.name == "Running")
    assert running.discr is not None
    mem.write(header + plan.discr, running.discr.to_bytes(plan.size, "little"))
    if local:
        _word(mem, header + plan.local, SHARED)
    root = plan.root(Reflector(inv, 0, mem.read), header)
    assert root is not None and root.owner == (SHARED if local else None)


def test_a_task_header_off_its_cells_alignment_is_a_copy_not_a_task() -> None:
    """tokio pads a task cell to a cache line (`repr(align(128))` on x86-64): a cell is
    allocated there. Fact (axum's chat, release, one run in two): two headers in the main
    heap at 120 mod 128 (state 0xcc, a new task's, no owner: a user's send and receive tasks
    built there and moved into their boxes) were shown as two more tasks, not yet polled.
    DWARF's DW_AT_alignment says the cell's alignment (TypeInfo.align)."""
    inv = _inv("realworld-debug", "hyper_single_threaded")
    prefix = "tokio::runtime::task::core::Cell<hyper_single_threaded::http1_server::{async_fn#0}::{async_block_env#1}, "
    cell = next(n for n in inv.types if n.startswith(prefix))
    assert inv.types[cell].align == 128
    plan = cell_plan(Reflector(inv, 0, Mem().read), cell)
    assert plan is not None and plan.align == 128
    running = next(v for v in plan.enum.variants if v.name == "Running")
    mem = Mem()
    for header in (BASE + 0x4000, BASE + 0x8000 + 120):
        mem.write(header, bytes(inv.types[cell].size))
        mem.write(header + plan.discr, running.discr.to_bytes(plan.size, "little"))  # type: ignore[union-attr]
    r = Reflector(inv, 0, mem.read)
    assert plan.root(r, BASE + 0x4000) is not None
    assert plan.root(r, BASE + 0x8000 + 120) is None and not plan.pending(r, BASE + 0x8000 + 120)
