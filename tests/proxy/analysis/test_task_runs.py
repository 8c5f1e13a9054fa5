"""async-task's ``RawTask<F, T, S, M>::run`` names each spawned future's type F
(``Inventory.task_runs``); the adapter walks a task from F. F's own type must be among the
reflected types: async-std's ``SupportTaskLocals<F>`` (what ``task::spawn`` hands to
async-executor 1.14 as it is, no async block around it) has its poll inlined into ``run``
in a release build, so no out-of-line poll collects it and no awaitee names it.

Real binary: async-std's own a-chat example (Debian sid's async-std 1.13.2, async-executor
1.14), the gauntlet's release build, where every spawned task showed as a bare
``SupportTaskLocals`` leaf before."""

from __future__ import annotations

from tests.proxy.analysis.corpus_util import corpus_binary


def test_every_spawned_futures_type_is_reflected(inventory_of) -> None:  # type: ignore[no-untyped-def]
    inv = inventory_of(corpus_binary("realworld-release", "async_std_a_chat"))
    spawned = {f for f in inv.task_runs.values() if f.startswith("async_std::task::builder::SupportTaskLocals<")}
    assert any("broker_loop" in f for f in spawned), sorted(spawned)
    for f in spawned:
        t = inv.types.get(f)
        assert t is not None and {x.name for x in t.fields} == {"tag", "future"}, f
    broker = next(f for f in spawned if "SupportTaskLocals<async_std_a_chat::server::broker_loop::" in f)
    future = next(x for x in inv.types[broker].fields if x.name == "future")
    assert future.type_name in inv.layouts  # the coroutine the wrapper holds: walked from there
