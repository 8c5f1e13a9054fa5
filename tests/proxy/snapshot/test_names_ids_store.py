"""proxy.snapshot: one name per coroutine, stable ids, one snapshot per stop."""

from __future__ import annotations

from pathlib import Path

from proxy.analysis.model import Inventory, Layout, SourceLoc, State
from proxy.snapshot.ids import TaskIds
from proxy.snapshot.names import display_name, layout_name, user_line
from proxy.snapshot.store import SnapshotStore
from proxy.snapshot.model import Snapshot
from tests.proxy.graph.graphfix import Script, engine


def test_one_name_whatever_names_the_coroutine() -> None:
    # the state machine, the resume function, the legacy closure symbol, rustc 1.63's wrapper
    for name in ("app::c::{async_fn_env#0}", "app::c::{async_fn#0}", "app::c::{{closure}}",
                 "core::future::from_generator::GenFuture<app::c::{async_fn_env#0}>"):
        assert display_name(name) == "app::c", name
    # a block: inside its function, at its line (its number says nothing to a reader)
    assert display_name("app::run::{async_fn#0}::{async_block_env#1}", 62) == "app::run::{async_block@62}"
    assert display_name("app::run::{async_fn#0}::{async_block#1}") == "app::run::{async_block#1}"
    assert display_name("app::gen::{async_fn_env#0}<u64>") == "app::gen<u64>"  # generics tell instances apart


def test_a_coroutine_among_the_generic_arguments_is_another_one() -> None:
    """Only a segment outside ``<..>`` is the coroutine's own; a coroutine type among its
    generic arguments is named the same way (async-std's a-chat: a block of a generic fn
    spawned with an async fn's future, or with another fn's block, was shown as
    ``spawn_and_log_error::{async_block_env#0}<app::connection_loop>`` and
    ``spawn_and_log_error::{async_block_env#0}<app::broker_loop::{async_block@180}>``, the
    outer block's line given to the inner one)."""
    outer = "app::spawn_and_log_error::{async_block_env#0}"
    assert display_name(f"{outer}<app::connection_loop::{{async_fn_env#0}}>", 180) == \
        "app::spawn_and_log_error::{async_block@180}<app::connection_loop>"
    assert display_name(f"{outer}<app::broker_loop::{{async_fn#0}}::{{async_block_env#0}}>", 180) == \
        "app::spawn_and_log_error::{async_block@180}<app::broker_loop::{async_block#0}>"
    # a wrapper type around one: async-std's block_on of accept_loop, under async-executor's run
    assert display_name("ex::run::{async_fn_env#0}<(), a::SupportTaskLocals<app::accept_loop::{async_fn_env#0}<&str>>>") \
        == "ex::run<(), a::SupportTaskLocals<app::accept_loop<&str>>>"
    assert display_name("a::W<T>::f<app::x::{async_fn_env#0}>") == "a::W<T>::f<app::x::{async_fn_env#0}>"  # not one group
    # tokio-tungstenite: a closure of an async fn among the arguments, `->` no bracket
    assert display_name("t::server_handshake::{async_fn_env#0}<t::NoCallback, t::accept::{async_fn#0}::"
                        "{closure_env#0}<S>, fn() -> u8>") == "t::server_handshake<t::NoCallback, t::accept::{closure_env#0}<S>, fn() -> u8>"


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


def test_store_keeps_one_snapshot_a_stop() -> None:
    store = SnapshotStore()
    built: list[Snapshot] = []

    def build() -> Snapshot:
        built.append(Snapshot(stop=1, tasks=()))
        return built[-1]

    first = store.get(("stop", 1), build)
    assert store.get(("stop", 1), build) is first and store.held(("stop", 1)) is first and len(built) == 1
    second = store.get(("stop", 2), build)  # another stop: built again, the old one let go
    assert second is not first and store.held(("stop", 1)) is None and len(built) == 2


def test_a_block_inside_a_block_names_the_outer_one_by_its_line_too(tmp_path: Path) -> None:
    """tokio's echo-tcp (examples/echo-tcp.rs): `#[tokio::main]` makes main's body a block
    (line 33, the attribute) and the task spawned inside it is another block (line 60);
    rustc names the inner state machine `main::{async_block#0}::{async_block_env#1}`, and
    the outer block's number says nothing to a reader."""
    src = str(tmp_path / "echo-tcp.rs")
    inv = Inventory(build_id=None, path=str(tmp_path / "prog"), pie=True, entry=0)
    for name, line in (("app::main::{async_block_env#0}", 33), ("app::main::{async_block#0}::{async_block_env#1}", 60)):
        inv.layouts[name] = Layout(name, 16, 8, 1, (State(0, "Unresumed", SourceLoc(src, line)),))
    assert layout_name(inv, "app::main::{async_block_env#0}") == "app::main::{async_block@33}"
    assert layout_name(inv, "app::main::{async_block#0}::{async_block_env#1}") == \
        "app::main::{async_block@33}::{async_block@60}"
    # a block among the generic arguments: by its own line too
    wrap = "app::wrap::{async_block_env#0}<app::main::{async_block#0}::{async_block_env#1}>"
    inv.layouts[wrap] = Layout(wrap, 16, 8, 1, (State(0, "Unresumed", SourceLoc("main.rs", 180)),))
    fn_arg = "app::wrap::{async_block_env#0}<app::conn::{async_fn_env#0}>"  # not an async fn: a block
    inv.layouts[fn_arg] = Layout(fn_arg, 16, 8, 1, (State(0, "Unresumed", SourceLoc("main.rs", 180)),))
    assert layout_name(inv, fn_arg) == "app::wrap::{async_block@180}<app::conn>"
    assert layout_name(inv, "app::wrap::{async_block_env#0}<app::main::{async_block#0}::{async_block_env#1}>") == \
        "app::wrap::{async_block@180}<app::main::{async_block@33}::{async_block@60}>"
    # the outer layout unknown: its number stays
    assert layout_name(inv, "app::other::{async_block#2}::{async_block_env#3}") == "app::other::{async_block#2}::{async_block#3}"


def test_a_select_in_a_block_a_proc_macro_made_is_shown_at_its_call(tmp_path: Path) -> None:
    """tokio's graceful-shutdown (examples/graceful-shutdown.rs): `#[tokio::main]` makes main's
    body a block whose every variant is at the attribute's line, so its Returned line does not
    end the body; main's `select!` (43) was shown at tokio's select.rs:746. The body ends before
    the next fn after its last own `.await`: handle_connection's select! (78) is not in it."""
    src = tmp_path / "graceful-shutdown.rs"
    lines = [""] * 90
    lines[33] = "#[tokio::main]"
    lines[34] = "async fn main() -> Result<(), Box<dyn Error>> {"
    lines[35] = "    let listener = TcpListener::bind(\"127.0.0.1:6142\").await?;"
    lines[42] = "        tokio::select! {"
    lines[70] = "    tracker.wait().await;"
    lines[76] = "async fn handle_connection(mut socket: TcpStream) {"
    lines[77] = "    tokio::select! {"
    src.write_text("\n".join(lines) + "\n")
    at = SourceLoc(str(src), 34)
    states = (State(0, "Unresumed", at), State(1, "Returned", at), State(2, "Panicked", at),
              State(3, "Suspend0", SourceLoc(str(src), 36)),
              State(4, "Suspend1", SourceLoc("/registry/tokio/src/macros/select.rs", 746)),
              State(5, "Suspend2", SourceLoc(str(src), 71)))
    inv = Inventory(build_id=None, path=str(tmp_path / "prog"), pie=True, entry=0)
    inv.layouts["app::main::{async_block_env#0}"] = Layout("app::main::{async_block_env#0}", 64, 60, 1, states)
    got = user_line(inv, "app::main::{async_block_env#0}", SourceLoc("/registry/tokio/src/macros/select.rs", 746))
    assert got == SourceLoc(str(src), 43)
