"""The line of the innermost coroutine running on a thread that is inside a sync function it
called (sans-IO): tokio's tinydb (examples/tinydb.rs) stopped at a breakpoint in
handle_request, called at line 129 of the connection's block (spawned at 117): `bt` gave
117, the block's first line, for the frame that runs the call at 129."""

from __future__ import annotations


from proxy.analysis.model import Frame, Inventory, Layout, Member, SourceLoc, State
from proxy.reflect.walker import Node
from proxy.snapshot.inputs import SnapshotInputs
from proxy.snapshot.merge import Merge

SRC = "/src/tinydb.rs"
BLOCK = "tinydb::main::{async_block#0}::{async_block_env#1}"


def _merge(frames_at) -> Merge:  # type: ignore[no-untyped-def]
    inv = Inventory(build_id=None, path="/prog", pie=True, entry=0)
    inv.layouts[BLOCK] = Layout(BLOCK, 64, 60, 8, (State(0, "Unresumed", SourceLoc(SRC, 117)),
                                                  State(3, "Suspend0", SourceLoc(SRC, 126))))
    m = Merge(SnapshotInputs(inventory=inv, bias=0, frames_at=frames_at), None)
    return m


def test_the_innermost_running_coroutine_is_at_its_own_frames_call() -> None:
    at_call = [Frame("tinydb::main::{async_block#0}::{async_block#1}", SourceLoc(SRC, 129))]
    m = _merge(lambda pc: at_call if pc == 0x5123 else [])
    key = (0x7000, BLOCK)
    m.chains = {7: [key]}
    m.chain_pcs = {key: 0x5123}
    node = Node("coroutine", "tinydb::main::{async_block@84}::{async_block@117}", 0x7000, BLOCK)
    node.loc = SourceLoc(SRC, 117)
    m.r = type("R", (), {"walk": staticmethod(lambda addr, t: node)})()  # type: ignore[assignment]
    m._nest_chains([])
    assert node.loc == SourceLoc(SRC, 129) and node.status == "running"


def test_a_frame_line_of_another_file_is_not_the_coroutines() -> None:
    """Inlined at that pc, a library's line (the call's callee inlined) is not the block's."""
    m = _merge(lambda pc: [Frame("core::ptr::drop", SourceLoc("/rustlib/ptr.rs", 500))])
    key = (0x7000, BLOCK)
    m.chain_pcs = {key: 0x5123}
    assert m._own_frame_line(key) is None


def test_a_thread_in_a_sync_fn_runs_what_is_inlined_at_the_call_in_its_resume_frame() -> None:
    """axum's chat, release: stopped in check_username (a sync fn), called at main.rs:82 by
    websocket(), which is inlined into axum's on_upgrade block (the physical resume frame).
    The pc (in check_username) has no async frame: the call's pc in the innermost resume
    frame says what runs, websocket included, at 82 (it was shown at its old `.await`, 79)."""
    blk = "axum::ws::on_upgrade::{async_block#0}"
    ws = SourceLoc("/src/chat.rs", 82)
    frames = {0x9000: [Frame("axum_chat::check_username", SourceLoc("/src/chat.rs", 149))],
              0x5123: [Frame("axum_chat::websocket::{async_fn#0}", ws, inlined=True),
                       Frame(blk, SourceLoc("/axum/ws.rs", 376))]}
    inv = Inventory(build_id=None, path="/prog", pie=True, entry=0)
    m = Merge(SnapshotInputs(inventory=inv, bias=0, pcs={7: 0x9000}, frames_at=lambda pc: frames.get(pc, [])), None)
    key = (0x7000, "axum::ws::on_upgrade::{async_block_env#0}")
    m.chains = {7: [key]}
    m.chain_pcs = {key: 0x5123}
    ((tid, run),) = m._runs_at_pcs()
    assert tid == 7 and run.chain == ("axum::ws::on_upgrade", "axum_chat::websocket") and run.loc == ws
    m.chain_pcs = {}  # no resume frame known: nothing is said to run
    assert m._runs_at_pcs() == []


def test_a_frame_named_by_its_symbol_is_the_coroutine_named_by_its_impl_block() -> None:
    """axum's chat, release, stopped in check_username: the resume frame at the call is out of
    line and named by its symbol, `axum::extract::ws::WebSocketUpgrade<F>::on_upgrade::
    {{closure}}`; the task's coroutine by its DWARF type, `axum::extract::ws::{impl#1}::
    on_upgrade::{async_block#0}<..>`. `{impl#1}` is that one segment: websocket, inlined at the
    call, runs at 82 (it was shown awaiting at its old `.await`, 79: the names did not match)."""
    from proxy.reflect.tree import Root, same_fn

    blk_t = "axum::extract::ws::{impl#1}::on_upgrade::{async_block_env#0}<axum::F, axum_chat::websocket>"
    ws_t = "axum_chat::websocket::{async_fn_env#0}"
    frames = {0x9000: [Frame("axum_chat::check_username", SourceLoc("/src/chat.rs", 149))],
              0x5123: [Frame("axum_chat::websocket::{{closure}}", SourceLoc("/src/chat.rs", 82), inlined=True),
                       Frame("axum::extract::ws::WebSocketUpgrade<F>::on_upgrade::{{closure}}",
                             SourceLoc("/axum/ws.rs", 376))]}
    inv = Inventory(build_id=None, path="/prog", pie=True, entry=0)
    m = Merge(SnapshotInputs(inventory=inv, bias=0, pcs={7: 0x9000}, frames_at=lambda pc: frames.get(pc, [])), None)
    blk = Node("coroutine", "axum::extract::ws::{impl#1}::on_upgrade::{async_block@376}<axum::F, axum_chat::websocket>",
               0x7000, blk_t)
    ws = Node("coroutine", "axum_chat::websocket", 0x7010, ws_t)
    ws.loc = SourceLoc("/src/chat.rs", 79)
    blk.children = [ws]
    m.chains = {7: [(0x7000, blk_t)]}
    m.chain_pcs = {(0x7000, blk_t): 0x5123}
    m.r = type("R", (), {"walk": staticmethod(lambda addr, t: blk)})()  # type: ignore[assignment]
    m._overlay_pcs([(Root(0x7000, blk_t), blk)])
    assert ws.loc == SourceLoc("/src/chat.rs", 82) and ws.status == "running"
    assert same_fn("a::{impl#3}::f", "a::T<U::V>::f") and not same_fn("a::{impl#3}::f", "a::T::g")
    assert not same_fn("a::{impl#3}::f", "a::f")


def test_a_closure_inside_a_coroutine_is_a_sync_function() -> None:
    """tokio-tungstenite's server stopped in its `try_for_each` closure, called inside
    handle_connection's `future::select(..).await` at server.rs:69. The closure's symbol,
    `handle_connection::{{closure}}::{{closure}}`, reads like an async block of
    handle_connection; it is no resume function (the inventory's), so it is a sync function:
    handle_connection runs at 69, its call (the closure's line 52 was shown as its line).
    Release: the closure inlined (named by its symbol all the same) into TryForEach's poll,
    out of line (no resume function), or into the resume function: at 69 too. A coroutine
    inlined there (the inventory's `inlined`) stays one."""
    from proxy.analysis.model import CoroutineKind, Era, ResumeFn

    src, env = "/src/server.rs", "t::handle_connection::{async_fn_env#0}"
    resume = ResumeFn(0x5000, 0x6000, "", "t::handle_connection::{async_fn#0}", "t::handle_connection",
                      CoroutineKind.ASYNC_FN, Era.MODERN, SourceLoc(src, 37), ())
    inv = Inventory(build_id=None, path="/prog", pie=True, entry=0, resume_fns=[resume])
    at69 = Frame("t::handle_connection::{{closure}}", SourceLoc(src, 69))
    frames = {0x9000: [Frame("t::handle_connection::{{closure}}::{{closure}}", SourceLoc(src, 52))],
              0x5123: [at69],
              0x5200: [Frame("t::handle_connection::{{closure}}::{{closure}}", SourceLoc(src, 52), inlined=True),
                       Frame("<futures_util::TryForEach<S, F> as core::future::Future>::poll",
                             SourceLoc("/futures/try_for_each.rs", 80), inlined=True), at69],
              0x9100: [Frame("t::handle_connection::{{closure}}::{{closure}}", SourceLoc(src, 52), inlined=True),
                       Frame("<futures_util::TryForEach<S, F> as core::future::Future>::poll",
                             SourceLoc("/futures/try_for_each.rs", 61))]}
    key = (0x7000, env)
    for pc in (0x9000, 0x5200, 0x9100):
        m = Merge(SnapshotInputs(inventory=inv, bias=0, pcs={7: pc}, frames_at=lambda p: frames.get(p, [])), None)
        m.chains = {7: [key]}
        m.chain_pcs = {key: 0x5123}
        ((tid, run),) = m._runs_at_pcs()
        assert tid == 7 and run.chain == ("t::handle_connection",) and run.loc == SourceLoc(src, 69), (hex(pc), run)

    from proxy.reflect.tree import coroutine_frames

    inner = Frame("t::handle_connection::{{closure}}::{{closure}}", SourceLoc(src, 58), inlined=True)
    assert coroutine_frames([inner, at69], True, ["t::handle_connection::{async_fn#0}::{async_block#0}"]) == [True, True]
    assert coroutine_frames([inner, at69], True, []) == [False, True]


def test_rustc_1_63s_generator_is_named_not_known_as_a_resume_function() -> None:
    """rustc 1.63: the resume functions are GenFuture's polls; the generator's own closure (the
    pc's function, tokio_app's `c` after its sleep) is no resume function yet is the coroutine:
    by name, as before (the old-debug tokio_app's `bt` showed c at its `.await`, not at 34)."""
    from proxy.analysis.model import CoroutineKind, Era, ResumeFn

    src, env = "/src/tokio_app.rs", "tokio_app::c::{async_fn_env#0}"
    gen = ResumeFn(0x5000, 0x5100, "", "core::future::from_generator::GenFuture<T>::poll", "tokio_app::c",
                   CoroutineKind.ASYNC_FN, Era.GENFUTURE, SourceLoc(src, 31), ())
    inv = Inventory(build_id=None, path="/prog", pie=True, entry=0, resume_fns=[gen])
    frames = {0x9000: [Frame("tokio_app::c::{{closure}}", SourceLoc(src, 34))]}
    m = Merge(SnapshotInputs(inventory=inv, bias=0, pcs={7: 0x9000}, frames_at=lambda p: frames.get(p, [])), None)
    m.chains = {7: [(0x7000, env)]}
    ((tid, run),) = m._runs_at_pcs()
    assert run.chain == ("tokio_app::c",) and run.loc == SourceLoc(src, 34)


def test_a_coroutine_inlined_at_the_call_is_found_in_its_awaitee_slot_in_the_parents_first_poll() -> None:
    """axum's chat, release, a breakpoint in check_username, one run in two: on_upgrade's
    block ran its first poll (the upgrade was there at once), so its state still read
    Unresumed and memory held nothing below it; websocket, inlined at the call, was not drawn
    (the block itself at websocket's line, 82). The child is built into its awaitee slot
    before it is polled: the one slot of the parent's layout that holds a coroutine of that
    name is read. Two slots that could: none (no guess)."""
    from proxy.reflect.memory import BlockReader
    from proxy.reflect.tree import Root
    from proxy.reflect.walker import Reflector

    blk_t = "axum::extract::ws::{impl#1}::on_upgrade::{async_block_env#0}<axum::F, axum_chat::websocket>"
    ws_t = "axum_chat::websocket::{async_fn_env#0}"
    inv = Inventory(build_id=None, path="/prog", pie=True, entry=0)
    inv.layouts[ws_t] = Layout(ws_t, 64, 60, 8, (State(0, "Unresumed", SourceLoc("/src/chat.rs", 62)),
                                                 State(3, "Suspend0", SourceLoc("/src/chat.rs", 79))))
    inv.layouts[blk_t] = Layout(blk_t, 0x100, 0xF8, 8, (
        State(0, "Unresumed", SourceLoc("/axum/ws.rs", 359)),
        State(3, "Suspend0", SourceLoc("/axum/ws.rs", 376), Member("__awaitee", 0x80, 64, ws_t))))
    frames = {0x9000: [Frame("axum_chat::check_username", SourceLoc("/src/chat.rs", 149))],
              0x5123: [Frame("axum_chat::websocket::{{closure}}", SourceLoc("/src/chat.rs", 82), inlined=True),
                       Frame("axum::extract::ws::WebSocketUpgrade<F>::on_upgrade::{{closure}}",
                             SourceLoc("/axum/ws.rs", 376))]}
    zeros = BlockReader(lambda addr, n: bytes(n))  # both first polls: every state reads Unresumed
    m = Merge(SnapshotInputs(inventory=inv, bias=0, pcs={7: 0x9000}, frames_at=lambda pc: frames.get(pc, [])), None)
    m.r = Reflector(inv, 0, zeros)
    blk = m.r.walk(0x7000, blk_t)
    m.chains = {7: [(0x7000, blk_t)]}
    m.chain_pcs = {(0x7000, blk_t): 0x5123}
    m._overlay_pcs([(Root(0x7000, blk_t), blk)])
    (ws,) = blk.children
    assert (ws.label, ws.addr, ws.status, ws.loc) == ("axum_chat::websocket", 0x7080, "running", SourceLoc("/src/chat.rs", 82))
    # another state's slot could hold a websocket too: which one is unknown, none is drawn
    inv.layouts[blk_t] = Layout(blk_t, 0x100, 0xF8, 8, inv.layouts[blk_t].states + (
        State(4, "Suspend1", SourceLoc("/axum/ws.rs", 380), Member("__awaitee", 0xC0, 64, ws_t)),))
    m.r = Reflector(inv, 0, zeros)
    blk = m.r.walk(0x7000, blk_t)
    m._overlay_pcs([(Root(0x7000, blk_t), blk)])
    assert blk.children == [] and blk.loc == SourceLoc("/src/chat.rs", 82)
