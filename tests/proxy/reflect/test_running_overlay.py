"""The running overlay matches a thread's pc to one coroutine, not to any of its fn (sans-IO).

tk_sync (multi-thread, capture on, release): main's thread was inside the poll of `run`'s
block at line 149 while the block `run` spawned at line 132 sat parked in the heap; both norm
to `tk_sync::run`, and the parked one was drawn running, its children dropped."""

from __future__ import annotations

from proxy.analysis.model import Frame, SourceLoc
from proxy.reflect.tree import ident, is_coroutine, mark_running, overlay_matches, running_from_frames
from proxy.reflect.walker import Node

LINE = SourceLoc("tk_sync.rs", 155)


def _block(n: int, addr: int) -> Node:
    sleep = Node("leaf", "tokio::time::Sleep", addr + 64)
    return Node("coroutine", f"tk_sync::run::{{async_block@{130 + n}}}", addr,
                f"tk_sync::run::{{async_fn#0}}::{{async_block_env#{n}}}", children=[sleep])


def test_ident_names_one_coroutine() -> None:
    assert ident("tk_sync::run::{async_fn#0}::{async_block#1}") == \
        ident("tk_sync::run::{async_fn#0}::{async_block_env#1}")
    assert ident("tk_sync::run::{async_fn#0}::{async_block#0}") != \
        ident("tk_sync::run::{async_fn#0}::{async_block_env#1}")
    assert ident("a::f::{async_fn_env#0}<u64>") == ident("a::f::{async_fn#0}<u64>") == "a::f::{async_fn#0}"
    assert ident("a::f::{{closure}}") == ""  # rustc 1.63's names carry no number: norm only


def test_a_parked_block_of_the_same_fn_is_not_running() -> None:
    parked, polled = _block(1, 0x1000), _block(0, 0x2000)
    frames = [Frame("tk_sync::run::{async_fn#0}::{async_block#0}", LINE)]
    run = running_from_frames(7, frames)
    assert run is not None and run.chain == ("tk_sync::run",)
    assert not overlay_matches(parked, run)
    assert parked.status == "pending" and parked.children  # untouched: still awaiting its Sleep
    got = overlay_matches(polled, run)
    assert got
    mark_running(got[0][1], run)
    assert polled.status == "running" and polled.detail == "running on thread 7" and polled.loc == LINE


def test_a_name_without_a_number_still_matches_by_fn() -> None:
    node = Node("coroutine", "rt::a", 0x10, "rt::a::{async_fn_env#0}")
    assert is_coroutine(node, "rt::a", "")
    assert is_coroutine(node, "rt::a", "rt::a::{async_fn#0}")
    assert not is_coroutine(node, "rt::a", "rt::a::{async_fn#1}")
