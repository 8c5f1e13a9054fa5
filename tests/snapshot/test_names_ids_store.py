"""proxy.snapshot: one name per coroutine, stable ids, one snapshot per stop."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proxy" / "graph"))

from graphfix import Script, engine  # noqa: E402

from proxy.analysis.model import Inventory, Layout, SourceLoc, State  # noqa: E402
from proxy.snapshot.ids import TaskIds  # noqa: E402
from proxy.snapshot.names import display_name, layout_name, user_line  # noqa: E402
from proxy.snapshot.store import SnapshotStore  # noqa: E402
from proxy.snapshot.model import Snapshot  # noqa: E402


def test_one_name_whatever_names_the_coroutine() -> None:
    # the state machine, the resume function, the legacy closure symbol, rustc 1.63's wrapper
    for name in ("app::c::{async_fn_env#0}", "app::c::{async_fn#0}", "app::c::{{closure}}",
                 "core::future::from_generator::GenFuture<app::c::{async_fn_env#0}>"):
        assert display_name(name) == "app::c", name
    # a block: inside its function, at its line (its number says nothing to a reader)
    assert display_name("app::run::{async_fn#0}::{async_block_env#1}", 62) == "app::run::{async_block@62}"
    assert display_name("app::run::{async_fn#0}::{async_block#1}") == "app::run::{async_block#1}"
    assert display_name("app::gen::{async_fn_env#0}<u64>") == "app::gen<u64>"  # generics tell instances apart


def _inv(tmp: Path) -> Inventory:
    src = tmp / "main.rs"
    src.write_text("async fn sel() {\n    let x = 1;\n    tokio::select! {\n        a = f() => a,\n    }\n}\n")
    states = (State(0, "Unresumed", SourceLoc(str(src), 1)), State(1, "Returned", SourceLoc(str(src), 6)),
              State(3, "Suspend0", SourceLoc("/registry/tokio/src/macros/select.rs", 553)))
    blk = (State(0, "Unresumed", SourceLoc(str(src), 4)),)
    inv = Inventory(build_id=None, path=str(tmp / "prog"), pie=True, entry=0)
    inv.layouts["app::sel::{async_fn_env#0}"] = Layout("app::sel::{async_fn_env#0}", 64, 60, 1, states)
    inv.layouts["app::sel::{async_fn#0}::{async_block_env#0}"] = Layout(
        "app::sel::{async_fn#0}::{async_block_env#0}", 16, 8, 1, blk)
    return inv


def test_an_await_inside_a_macro_is_shown_at_the_macros_call(tmp_path: Path) -> None:
    inv = _inv(tmp_path)
    src = str(tmp_path / "main.rs")
    got = user_line(inv, "app::sel::{async_fn_env#0}", SourceLoc("/registry/tokio/src/macros/select.rs", 553))
    assert got == SourceLoc(src, 3)
    assert layout_name(inv, "app::sel::{async_fn#0}::{async_block_env#0}") == "app::sel::{async_block@4}"
    # futures' join!/select! are defined in futures-util's async_await/{join,select}_mod.rs
    futures_select = SourceLoc("/registry/futures-util/src/async_await/select_mod.rs", 323)
    got = user_line(inv, "app::sel::{async_fn_env#0}", futures_select)
    assert got == SourceLoc(src, 3)
    # the source cannot be read here: the DWARF line stays
    (tmp_path / "main.rs").unlink()
    from proxy.snapshot import names

    names._SOURCES.clear()
    loc = SourceLoc("/registry/tokio/src/macros/select.rs", 553)
    assert user_line(inv, "app::sel::{async_fn_env#0}", loc) == loc


def test_ids_of_tasks_found_in_memory_are_never_given_again_by_the_engine() -> None:
    e = engine()
    ids = TaskIds()
    ids.attach(e, e.highest_id)
    found = ids.of(0x5000, "app::x::{async_fn_env#0}")
    assert found == 1 and ids.of(0x5000, "app::x::{async_fn_env#0}") == 1  # stable
    s = Script()
    s.enter("a", 0x100000); s.exit(3)
    e.feed_many(s.events)
    assert [t.id for t in e.tasks()] == [2]  # the engine skipped #1
    ids.attach(e, e.highest_id)
    assert ids.of(0x6000, "app::y::{async_fn_env#0}") == 3


def test_store_keeps_a_snapshot_only_when_every_read_was_answered() -> None:
    store = SnapshotStore()
    built: list[Snapshot] = []

    def build() -> Snapshot:
        built.append(Snapshot(stop=1, tasks=()))
        return built[-1]

    missed = [True]
    first = store.get(("stop", 1), build, lambda: missed[0])
    missed[0] = False
    second = store.get(("stop", 1), build, lambda: missed[0])
    third = store.get(("stop", 1), build, lambda: missed[0])
    assert len(built) == 2 and first is not second and second is third
    assert store.get(("stop", 2), build, lambda: False) is not third  # another stop: built again
