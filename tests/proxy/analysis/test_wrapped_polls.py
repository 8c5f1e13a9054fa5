"""A coroutine inlined into its wrapper's poll (tracing's ``Instrumented<F>``, around every task
tokio spawns under ``tokio_unstable``): the wrapper's poll is probed for it (``ResumeFn.wrapper``).

The console build of the server benchmark's axum service (bench/server, console-subscriber) has
no resume function of its own for its connection task's async block: it is inlined into
``Instrumented<F>::poll``, so no capture saw a connection task there before."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.analysis.inventory import WRAPPERS, _field_offset, _shifted_layout
from proxy.analysis.model import Field, Layout, Member, SourceLoc, State, TypeInfo

ENV = "app::conn::{async_block_env#0}"
WRAPPED = f"tracing::instrument::Instrumented<{ENV}>"


def _types() -> dict[str, TypeInfo]:
    md = f"core::mem::manually_drop::ManuallyDrop<{ENV}>"
    return {WRAPPED: TypeInfo(WRAPPED, "struct", 104, (Field("inner", 40, 64, md), Field("span", 0, 40, "tracing::span::Span"))),
            "tracing::span::Span": TypeInfo("tracing::span::Span", "struct", 40, (Field("inner", 0, 40, "X"),)),
            "Twice": TypeInfo("Twice", "struct", 128, (Field("a", 0, 64, ENV), Field("b", 64, 64, ENV))),
            "Outer": TypeInfo("Outer", "struct", 112, (Field("w", 8, 104, WRAPPED),))}


def test_where_the_coroutine_sits_in_its_wrapper() -> None:
    t = _types()
    assert _field_offset(t, WRAPPED, ENV) == 40  # through ManuallyDrop (repr(transparent))
    assert _field_offset(t, "Outer", ENV) == 48  # a field of a field
    assert _field_offset(t, "Twice", ENV) is None  # two places: not one coroutine to stand for
    assert _field_offset(t, "tracing::span::Span", ENV) is None


def test_the_shifted_layout_reads_the_same_bytes_through_the_wrapper() -> None:
    aw = Member("__awaitee", 16, 8, "X")
    lay = Layout(ENV, 64, 8, 1, (State(0, "Unresumed", None), State(3, "Suspend0", SourceLoc("a.rs", 3), aw,
                                                                        (Member("n", 24, 4, "u32"),))))
    s = _shifted_layout(lay, WRAPPED, 40, 104)
    assert (s.type_name, s.size, s.state_offset, s.state_size) == (WRAPPED, 104, 48, 1)
    st = s.state(3)
    assert st is not None and st.awaitee == Member("__awaitee", 56, 8, "X") and st.locals == (Member("n", 64, 4, "u32"),)
    assert st.loc == SourceLoc("a.rs", 3)


from bench.server import build_server  # noqa: E402

CONSOLE = build_server.binary("console")


@pytest.mark.skipif(build_server.missing("console") is not None, reason=str(build_server.missing("console")))
def test_the_console_builds_connection_task_is_probed_through_instrumented_poll(tmp_path: Path) -> None:
    """Its async block is inlined into Instrumented<F>::poll: that poll is its resume function,
    self the Instrumented (span at 0, the block at 40), ``__state`` read at 40 + the block's."""
    import capstone

    from proxy.analysis.elf import open_elf
    from proxy.analysis.inventory import build_inventory

    inv = build_inventory(CONSOLE, cache_dir=tmp_path)
    (fn,) = [f for f in inv.resume_fns if f.wrapper and "handle_connection" in f.wrapper]
    assert fn.wrapper.startswith(WRAPPERS) and fn.name.startswith("axum::serve::handle_connection::")
    assert fn.layout_name == fn.wrapper and fn.self_in == "rdi" and fn.rets
    inner = [c for c in inv.inlined if c.parent_low_pc == fn.low_pc and "handle_connection" in c.name]
    assert inner and inner[0].layout_name is not None
    lay, in_lay = inv.layouts[fn.layout_name], inv.layouts[inner[0].layout_name]
    assert lay.state_offset == in_lay.state_offset + 40 and len(lay.states) == len(in_lay.states)
    # the code reads the state there, through self (rdi, kept in a callee-saved register)
    elf = open_elf(CONSOLE)
    code = elf.read(fn.low_pc, fn.high_pc - fn.low_pc)
    assert code is not None
    ops = [i.op_str for i in capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64).disasm(code, fn.low_pc)]
    assert any("byte ptr [r" in o and f"+ {lay.state_offset:#x}]" in o for o in ops)
    # no other resume function of it: its polls are seen once
    assert not [f for f in inv.resume_fns if not f.wrapper and "handle_connection" in f.name]
