"""The reflection walker on real corpus layouts over synthetic memory (sans-IO).

Memory is a dict of pages; the layouts are the debug/release tokio_app's own
DWARF (built by integration/corpus/build.py), so the offsets are the
compiler's, not the test's.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "integration" / "corpus"))

import build  # noqa: E402

from proxy.analysis.inventory import build_inventory  # noqa: E402
from proxy.reflect.memory import BLOCK, BlockReader  # noqa: E402
from proxy.reflect.walker import Reflector, coroutine_path  # noqa: E402


def _inv(config: str, program: str = "tokio_app"):  # type: ignore[no-untyped-def]
    got = build.build(configs=[config], programs=[program]).get((config, program))
    if not isinstance(got, Path):
        pytest.skip(f"{program} ({config}) not built: {got}")
    return build_inventory(got)


class Mem:
    """Sparse memory: unmapped pages read as None (an E reply)."""

    def __init__(self) -> None:
        self.bytes: dict[int, int] = {}
        self.mapped: set[int] = set()
        self.reads = 0

    def write(self, addr: int, data: bytes) -> None:
        for i, b in enumerate(data):
            self.bytes[addr + i] = b
            self.mapped.add((addr + i) // BLOCK)

    def read(self, addr: int, size: int) -> bytes | None:
        self.reads += 1
        if any(p not in self.mapped for p in range(addr // BLOCK, (addr + size - 1) // BLOCK + 1)):
            return None
        return bytes(self.bytes.get(addr + i, 0) for i in range(size))


BASE = 0x5000_0000


def _chain(inv, mem: Mem) -> None:  # type: ignore[no-untyped-def]
    """run -> a -> b -> c -> Sleep, stored inline as rustc does."""
    addr = BASE
    for name in ("run", "a", "b", "c"):
        lay = inv.layouts[f"tokio_app::{name}::{{async_fn_env#0}}"]
        st = lay.state(3)
        mem.write(addr + lay.state_offset, (3).to_bytes(lay.state_size, "little"))
        addr += st.awaitee.offset


def test_inline_chain_reads_each_state_once_per_block() -> None:
    inv = _inv("release")
    mem = Mem()
    _chain(inv, mem)
    tree = Reflector(inv, 0, mem.read).walk(BASE, "tokio_app::run::{async_fn_env#0}")
    labels = [n.label for n in tree.iter()]
    assert labels == ["tokio_app::run", "tokio_app::a", "tokio_app::b", "tokio_app::c", "tokio::time::Sleep"]
    assert [n.loc.line for n in tree.iter() if n.kind == "coroutine"] == [70, 22, 29, 33]
    assert mem.reads <= 2  # everything inline: the same block(s)


def test_state_not_in_the_layout_is_unreadable() -> None:
    inv = _inv("release")
    mem = Mem()
    _chain(inv, mem)
    a = inv.layouts["tokio_app::a::{async_fn_env#0}"]
    run = inv.layouts["tokio_app::run::{async_fn_env#0}"]
    a_addr = BASE + run.state(3).awaitee.offset
    mem.write(a_addr + a.state_offset, bytes([0xEE]))
    tree = Reflector(inv, 0, mem.read).walk(BASE, run.type_name)
    leaf = tree.children[0]
    assert leaf.kind == "unreadable" and "__state 238 is not a state" in leaf.label


def test_unmapped_memory_is_unreadable_not_an_error() -> None:
    inv = _inv("release")
    tree = Reflector(inv, 0, Mem().read).walk(BASE, "tokio_app::run::{async_fn_env#0}")
    assert tree.kind == "unreadable" and "unreadable" in tree.label


@pytest.mark.parametrize("config", ["debug", "release", "old-release"])
def test_random_bytes_never_raise(config: str) -> None:
    """Every layout over random memory: the walk ends, bounded, without an exception."""
    inv = _inv(config)
    rnd = random.Random(1)
    mem = Mem()
    for page in range(0x400):  # 4 MiB of random heap around BASE, plus pointers into it
        mem.write(BASE + page * BLOCK, bytes(rnd.randrange(256) for _ in range(64)))
    for name in inv.layouts:
        for start in range(3):
            r = Reflector(inv, 0, BlockReader(mem.read, budget=1 << 20))
            tree = r.walk(BASE + start * 8, name)
            assert sum(1 for _ in tree.iter()) <= r.max_nodes + 1


def test_a_pointer_cycle_ends() -> None:
    """A Box<dyn Future> whose data pointer leads back to its owner (whose vtable's poll is
    run's own resume function: debug builds keep it out of line)."""
    inv = _inv("debug")
    run = inv.layouts["tokio_app::run::{async_fn_env#0}"]
    boxed = next(s for s in run.states if s.awaitee and "dyn core::future" in s.awaitee.type_name)
    mem = Mem()
    mem.write(BASE + run.state_offset, bytes([boxed.value]))
    poll = next(f.low_pc for f in inv.resume_fns if f.layout_name == run.type_name)
    vtable = BASE + 0x2000
    mem.write(vtable, (0).to_bytes(8, "little") + (64).to_bytes(8, "little") + (8).to_bytes(8, "little")
              + poll.to_bytes(8, "little"))
    mem.write(BASE + boxed.awaitee.offset, BASE.to_bytes(8, "little") + vtable.to_bytes(8, "little"))
    tree = Reflector(inv, 0, mem.read).walk(BASE, run.type_name)
    assert [n.kind for n in tree.iter()] == ["coroutine", "unreadable"]
    assert "cycle" in tree.children[0].label


def test_paths() -> None:
    assert coroutine_path("a::b::{async_fn_env#0}") == "a::b"
    assert coroutine_path("a::f::{async_fn#0}::{async_block_env#0}") == "a::f::{async_block#0}"
    assert coroutine_path("t::m::{impl#8}::lock::{async_fn_env#0}<u64>") == "t::m::{impl#8}::lock<u64>"


@pytest.mark.parametrize("config", ["debug", "old-release"])
def test_random_bytes_under_the_futures_and_io_describers_never_raise(config: str) -> None:
    """join_all / select / FuturesUnordered / YieldNow / Readiness over random memory."""
    inv = _inv(config, "combinators")
    rnd = random.Random(2)
    mem = Mem()
    for page in range(0x400):
        mem.write(BASE + page * BLOCK, bytes(rnd.randrange(256) for _ in range(BLOCK)))
    names = [n for n in inv.layouts if n.startswith(("combinators::", "core::future::from_generator::GenFuture<comb"))]
    names += [n for n in inv.types if n.startswith(("futures_util::future::join_all::JoinAll<",
                                                      "futures_util::stream::futures_unordered::FuturesUnordered<",
                                                      "tokio::runtime::io::scheduled_io::Readiness"))]
    assert len(names) >= 8, names
    for name in names:
        for start in range(4):
            r = Reflector(inv, 0, BlockReader(mem.read, budget=1 << 20))
            tree = r.walk(BASE + start * 24, name)
            assert sum(1 for _ in tree.iter()) <= r.max_nodes + 1


def test_futures_unordered_list_cycle_ends() -> None:
    """A task list whose next_all points back at its head, with a len_all that says 5."""
    inv = _inv("release", "combinators")
    fu_name = next(n for n in inv.types if n.startswith("futures_util::stream::futures_unordered::FuturesUnordered<"
                                                         "combinators::step"))
    fu = inv.types[fu_name]
    task = inv.types[fu.field("head_all").type_name[len("core::sync::atomic::AtomicPtr<"):-1]]
    head = BASE + 0x1000
    mem = Mem()
    mem.write(BASE, bytes(fu.size))
    mem.write(BASE + fu.field("head_all").offset, head.to_bytes(8, "little"))
    mem.write(head, bytes(task.size))
    mem.write(head + task.field("next_all").offset, head.to_bytes(8, "little"))
    mem.write(head + task.field("len_all").offset, (5).to_bytes(8, "little"))
    tree = Reflector(inv, 0, mem.read).walk(BASE, fu_name)
    assert tree.label == "futures::stream::FuturesUnordered" and tree.detail == "5 futures, 4 not listed", tree
    assert len(tree.children) <= 1
