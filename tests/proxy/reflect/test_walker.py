"""The reflection walker on real corpus layouts over synthetic memory (sans-IO).

Memory is a dict of pages; the layouts are the debug/release tokio_app's own
DWARF (built by integration/corpus/build.py), so the offsets are the
compiler's, not the test's.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from integration.corpus import build

from proxy.analysis.inventory import build_inventory
from proxy.reflect.memory import BLOCK, BlockReader
from proxy.reflect.walker import Reflector, coroutine_path

ROOT = Path(__file__).resolve().parents[3]


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


@pytest.mark.parametrize("config", ["debug", pytest.param("old-release", marks=pytest.mark.slow)])
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


def _io_util_leaf(inv, name: str, slot: str | None) -> Mem:  # type: ignore[no-untyped-def]
    """A tokio ``io::util`` future at BASE borrowing a TcpStream (fd 42) whose ScheduledIo has
    the waker ``slot`` ("reader", "writer") set, the compiler's own offsets throughout."""
    from proxy.reflect.describers.fields import _find_field

    fut = inv.types[name]
    ptr = next(f for f in fut.fields if f.type_name in inv.fd_offsets)
    stream_t = inv.types[ptr.type_name].pointee
    r = Reflector(inv, 0, Mem().read)
    reg = _find_field(r, stream_t, "registration")
    assert reg is not None
    shared = inv.types[reg[1]].field("shared").offset
    inner_name = next(n for n in inv.types if n.startswith("alloc::sync::ArcInner<tokio::runtime::io::scheduled_io::"))
    data = inv.types[inner_name].field("data")
    stream, arc = BASE + 0x1000, BASE + 0x2000
    mem = Mem()
    mem.write(BASE, bytes(fut.size))
    mem.write(BASE + ptr.offset, stream.to_bytes(8, "little"))
    mem.write(stream, bytes(256))
    mem.write(stream + inv.fd_offsets[ptr.type_name], (42).to_bytes(4, "little"))
    mem.write(stream + reg[0] + shared, arc.to_bytes(8, "little"))
    mem.write(arc, bytes(data.offset + 256))
    if slot is not None:
        at = _find_field(r, data.type_name, slot, max_depth=6)
        assert at is not None
        # Option<Waker>: Some is any non-null vtable pointer (its niche)
        mem.write(arc + data.offset + at[0], (BASE + 0x3000).to_bytes(8, "little") * 2)
    return mem


@pytest.mark.parametrize("config", ["realworld-debug", "realworld-release"])
def test_an_io_util_future_says_which_readiness_its_task_waits_for(config: str) -> None:
    """tokio's echo-tcp: each connection's task awaits `socket.read(&mut buf)`, a `Read { reader:
    &mut TcpStream, .. }` leaf that polls the stream itself (no `Readiness` future in memory):
    what it waits for is the waker slot its task set in the stream's ScheduledIo (`reader` for
    AsyncRead, `writer` for AsyncWrite), its fd behind `reader`. Shown as nothing before."""
    inv = _inv(config, "tokio_echo_tcp")
    read = "tokio::io::util::read::Read<tokio::net::tcp::stream::TcpStream>"
    write = "tokio::io::util::write_all::WriteAll<tokio::net::tcp::stream::TcpStream>"
    for name, slot, want in ((read, "reader", "waits for READABLE on fd 42"),
                             (write, "writer", "waits for WRITABLE on fd 42"),
                             (read, None, "no waker registered (woken) on fd 42")):
        tree = Reflector(inv, 0, _io_util_leaf(inv, name, slot).read).walk(BASE, name)
        assert tree.kind == "leaf" and tree.detail.startswith(want), (name, slot, tree)
        inner = next(n for n in inv.types if n.startswith("alloc::sync::ArcInner<tokio::runtime::io::scheduled_io::"))
        sio = BASE + 0x2000 + inv.types[inner].field("data").offset
        assert f"(tokio::net::tcp::stream::TcpStream), ScheduledIo 0x{sio:x}" in tree.detail, tree


def test_a_future_that_borrows_an_io_handle_and_holds_a_future_is_walked_into() -> None:
    """A struct with an I/O handle's pointer field and a future of its own (a hand-written
    future around a coroutine) waits where that future waits: not drawn as an io::util leaf."""
    from proxy.analysis.model import Field, TypeInfo

    inv = _inv("realworld-debug", "tokio_echo_tcp")
    conn = next(n for n in inv.layouts if n.startswith("tokio_echo_tcp::main::{async_block#0}::{async_block_env#"))
    holder = TypeInfo("test::Holder", "struct", 8 + inv.layouts[conn].size,
                      (Field("reader", 0, 8, "&mut tokio::net::tcp::stream::TcpStream"), Field("inner", 8, 8, conn)))
    inv.types[holder.name] = holder
    try:
        mem = _io_util_leaf(inv, "tokio::io::util::read::Read<tokio::net::tcp::stream::TcpStream>", "reader")
        tree = Reflector(inv, 0, mem.read).walk(BASE, holder.name)
        assert tree.kind == "coroutine" and "waits for" not in tree.detail, tree
    finally:
        del inv.types[holder.name]


@pytest.mark.parametrize("waker_in", ["data", "trailers", None])
def test_of_two_futures_channel_ends_the_one_holding_the_waker_is_waited_on(waker_in: str | None) -> None:
    """hyper's request body holds a data `futures::mpsc::Receiver` and a trailers
    `futures::oneshot::Receiver` side by side and polls the data first (Pending there): the
    task's waker sits in the data channel's `recv_task`. The oneshot alone is a future, so by
    layout the body looked like a one-field wrapper of it (hyper's echo mid-body: drawn as
    the trailers' oneshot). The end whose waker slot is set is the leaf; with none set, as
    before. The compiler's own types and offsets (hyper's echo)."""
    from proxy.analysis.model import Field, TypeInfo

    inv = _inv("realworld-debug", "hyper_echo")
    data_t = next(n for n in inv.types if n.startswith("futures_channel::mpsc::Receiver<core::result::Result<bytes"))
    trail_t = next(n for n in inv.types if n.startswith("futures_channel::oneshot::Receiver<http::header::map::HeaderMap"))
    body = TypeInfo("test::Body", "struct", 16, (Field("data_rx", 0, 8, data_t), Field("trailers_rx", 8, 8, trail_t)))
    inv.types[body.name] = body
    r = Reflector(inv, 0, Mem().read)
    mem = Mem()
    mem.write(BASE, bytes(16))
    for i, (name, (prefix, inner, path)) in enumerate(zip(("data", "trailers"), (
            ("futures_channel::mpsc::Receiver<", "futures_channel::mpsc::BoundedInner<", ("recv_task", "waker")),
            ("futures_channel::oneshot::Receiver<", "futures_channel::oneshot::Inner<", ("rx_task", "data"))))):
        t = data_t if i == 0 else trail_t
        shared = f"alloc::sync::ArcInner<{inner}{t[len(prefix):-1]}>>"
        arc = BASE + 0x1000 * (i + 1)
        mem.write(BASE + 8 * i, arc.to_bytes(8, "little"))
        mem.write(arc, bytes(inv.types[shared].size))
        from proxy.reflect.describers.fields import _path

        slot = _path(r, arc, shared, "data", *path, "value")
        assert slot is not None, shared
        mem.write(slot, (0x7777_0000_1000 if name == waker_in else 0).to_bytes(8, "little") * 2)
    try:
        tree = Reflector(inv, 0, mem.read).walk(BASE, body.name)
    finally:
        del inv.types[body.name]
    if waker_in == "data":
        assert tree.kind == "leaf" and tree.detail == f"waits on mpsc channel 0x{BASE + 0x1000:x}", tree
    else:  # the trailers' end holds it, or neither does: the oneshot, the one future among them
        assert tree.kind == "leaf" and tree.detail == f"waits on oneshot channel 0x{BASE + 0x2000:x}", tree


@pytest.mark.parametrize("second", ["pending", "done"])
def test_a_struct_of_maybe_done_slots_is_a_join_of_its_branches(second: str) -> None:
    """hyper's multi_server awaits futures' `join(srv1, srv2)`: `Join { Fut1: MaybeDone<A>,
    Fut2: MaybeDone<B> }`, two futures in one struct, so no wrapper: it was drawn as a leaf
    and the task's two accept loops were missing. A struct of MaybeDone slots and nothing else
    is a join: one branch per slot, named by its field, a slot done `[completed]`. The
    compiler's own types and offsets."""
    inv = _inv("realworld-debug", "hyper_multi_server")
    name = next(n for n in inv.types if n.startswith("futures_util::future::join::Join<hyper_multi_server::"))
    join = inv.types[name]
    mem = Mem()
    mem.write(BASE, bytes(join.size))
    lines = []
    for i, f in enumerate(join.fields):
        slot = inv.types[f.type_name]
        variant = slot.variants[0] if i == 0 or second == "pending" else next(v for v in slot.variants if v.name == "Done")
        assert slot.discr is not None and variant.discr is not None
        mem.write(BASE + f.offset + slot.discr.offset, variant.discr.to_bytes(slot.discr.size, "little"))
        if variant.name == "Future":
            lay = inv.layouts[variant.fields[0].type_name]
            at = BASE + f.offset + variant.fields[0].offset + lay.state_offset
            mem.write(at, (4).to_bytes(lay.state_size, "little"))  # Suspend1: the loop's accept
            lines.append(lay.state(4).loc.line)
    tree = Reflector(inv, 0, mem.read).walk(BASE, name)
    assert tree.kind == "combinator" and tree.label == "futures_util::future::join::Join", tree
    assert [c.branch for c in tree.children] == ["Fut1", "Fut2"]
    assert [c.kind for c in tree.children] == ["coroutine", "coroutine" if second == "pending" else "leaf"]
    assert [c.loc.line for c in tree.children if c.kind == "coroutine"] == lines
    if second == "done":
        assert tree.children[1].status == "completed"
    assert lines[0] == 39  # `let (stream, _) = listener.accept().await.unwrap();` in srv1
