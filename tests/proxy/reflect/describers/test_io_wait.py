"""What a leaf that polls an I/O handle itself waits for (proxy/reflect/describers/io.py), and the
streams a future polls (describers.stream_field / stream_next), on the compiler's own types
of two programs nobody on the project wrote (the gauntlet's debug builds: async-std's a-chat
and tokio-tungstenite's WebSocket server), over synthetic memory (sans-IO).

Before: a-chat's connections (`lines.next().await` on `Lines<BufReader<&TcpStream>>`) and
accept loop (`incoming.next().await`: a boxed `dyn Stream`, async-io's `unfold` of `accept`)
ended in a bare `NextFuture`; its broker and writers (futures' `select!` of two
`next()`s on `UnboundedReceiver`s) in a bare `poll_fn`; tokio-tungstenite's connection task
(`future::select` of a `try_for_each` on the socket's `SplitStream` and a receiver
`forward`ed into the socket) in two bare leaves; its handshake in a bare `MidHandshake`."""

from __future__ import annotations

import pytest

from proxy.analysis.inventory import build_inventory
from proxy.reflect.walker import Reflector
from tests.proxy.analysis.corpus_util import corpus_binary
from tests.proxy.reflect.test_walker import BASE, Mem

LINES = "async_std::io::buf_read::lines::Lines<async_std::io::buf_reader::BufReader<&async_std::net::tcp::stream::TcpStream>>"
ALLOW_STD = "tokio_tungstenite::compat::AllowStd<tokio::net::tcp::stream::TcpStream>"
SOME = (BASE + 0x7_0000).to_bytes(8, "little") * 2  # an Option<Waker>'s Some: a non-null vtable (its niche)


@pytest.fixture(scope="module")
def chat(tmp_path_factory):  # type: ignore[no-untyped-def]
    return build_inventory(corpus_binary("realworld-debug", "async_std_a_chat"), cache_dir=tmp_path_factory.mktemp("inv"))


@pytest.fixture(scope="module")
def ws(tmp_path_factory):  # type: ignore[no-untyped-def]
    return build_inventory(corpus_binary("realworld-debug", "tungstenite_server"), cache_dir=tmp_path_factory.mktemp("inv"))


class Heap:
    """Values laid out by the compiler's types: ``at(addr, type, path)`` follows field names
    by value and ``*`` through a pointer (a fresh block of the pointee's size)."""

    def __init__(self, inv) -> None:  # type: ignore[no-untyped-def]
        self.inv, self.mem, self.next = inv, Mem(), BASE + 0x10_0000

    def new(self, type_name: str) -> int:
        addr, self.next = self.next, self.next + 0x1_0000
        self.mem.write(addr, bytes(max(self.inv.types[type_name].size, 64)))
        return addr

    def at(self, addr: int, type_name: str, path: list[str]) -> tuple[int, str]:
        for step in path:
            t = self.inv.types[type_name]
            if step == "*":
                target = self.new(t.pointee)
                self.mem.write(addr, target.to_bytes(8, "little"))
                addr, type_name = target, t.pointee
            else:
                f = t.field(step)
                assert f is not None, (type_name, step, [g.name for g in t.fields])
                addr, type_name = addr + f.offset, f.type_name
        return addr, type_name

    def walk(self, addr: int, type_name: str):  # type: ignore[no-untyped-def]
        return Reflector(self.inv, 0, self.mem.read).walk(addr, type_name)


ARC = ["ptr", "pointer", "*", "data"]


def _async_io_source(h: Heap, lines: int, fd: int) -> tuple[int, str]:
    """A Lines at ``lines`` reading a TcpStream whose async-io Source has fd ``fd``."""
    src, st = h.at(lines, LINES, ["reader", "inner", "*", "watcher", *ARC, "source", *ARC])
    raw, _ = h.at(src, st, ["registration", "raw"])
    h.mem.write(raw, fd.to_bytes(4, "little"))
    return src, st


def _direction(h: Heap, src: int, st: str, i: int) -> tuple[int, str]:
    value, arr = h.at(src, st, ["state", "data", "value"])
    d = h.inv.types[h.inv.types[arr].pointee]
    return value + i * d.size, d.name


def test_an_async_io_stream_says_its_sockets_direction(chat) -> None:  # type: ignore[no-untyped-def]
    """async-io's Source: `poll_readable`'s waker (`Direction.waker`) or a `readable()` future's
    (an occupied `wakers` slab entry), in the read (0) or write (1) direction; the fd is the
    Source's registration's."""
    for i, how, want in ((0, "waker", "waits for READABLE on fd 42"), (1, "waker", "waits for WRITABLE on fd 42"),
                         (0, "slab", "waits for READABLE on fd 42"), (0, None, "no waker registered (woken) on fd 42")):
        h = Heap(chat)
        h.mem.write(BASE, bytes(h.inv.types[LINES].size))
        src, st = _async_io_source(h, BASE, 42)
        d, dt = _direction(h, src, st, i)
        if how == "waker":
            h.mem.write(h.at(d, dt, ["waker"])[0], SOME)
        elif how == "slab":
            entries, vec = h.at(d, dt, ["wakers", "entries"])
            entry_t = next(n for n in chat.types if n.startswith("slab::Entry<core::option::Option<core::task::wake::Waker>>"))
            e = chat.types[entry_t]
            data = h.new(entry_t)
            occupied = next(v for v in e.variants if v.name == "Occupied")
            assert e.discr is not None and occupied.discr is not None
            h.mem.write(data + e.discr.offset, occupied.discr.to_bytes(e.discr.size, "little"))
            h.mem.write(data + occupied.fields[0].offset, SOME)
            from proxy.reflect.describers.fields import _find_field, _path

            r = Reflector(chat, 0, h.mem.read)
            ptr, ln = _find_field(r, vec, "ptr", max_depth=6), _path(r, entries, vec, "len")
            assert ptr is not None and ln is not None
            h.mem.write(entries + ptr[0], data.to_bytes(8, "little"))
            h.mem.write(ln, (1).to_bytes(8, "little"))
        tree = h.walk(BASE, LINES)
        assert tree.kind == "leaf" and tree.detail == f"{want}, async-io Source 0x{src:x}", (i, how, tree)


def test_a_tokio_handle_held_by_value_behind_references(ws) -> None:  # type: ignore[no-untyped-def]
    """tokio-tungstenite's AllowStd holds the TcpStream by value (the waker it registers is its
    own proxy's): the ScheduledIo behind the stream's registration, the fd by the stream's
    place (Inventory.fd_offsets of `&TcpStream`)."""
    from proxy.reflect.describers.fields import _find_field

    h = Heap(ws)
    h.mem.write(BASE, bytes(ws.types[ALLOW_STD].size))
    stream, st = h.at(BASE, ALLOW_STD, ["inner"])
    r = Reflector(ws, 0, h.mem.read)
    reg = _find_field(r, st, "registration")
    assert reg is not None
    sio, sio_t = h.at(stream + reg[0], reg[1], ["shared", *ARC])
    h.mem.write(stream + ws.fd_offsets["&" + st], (9).to_bytes(4, "little"))
    reader = _find_field(r, sio_t, "reader", max_depth=6)
    assert reader is not None
    h.mem.write(sio + reader[0], SOME)
    tree = h.walk(BASE, ALLOW_STD)
    assert tree.kind == "leaf" and tree.detail == f"waits for READABLE on fd 9, ScheduledIo 0x{sio:x}", tree


def test_two_sockets_or_a_socket_and_a_channel_say_nothing(chat) -> None:  # type: ignore[no-untyped-def]
    """A value that leads to two driver entries, or to one and a channel end, waits on one of
    them: memory does not say which, so nothing is said (never the wrong one)."""
    from proxy.analysis.model import Field, TypeInfo

    rx = next(n for n in chat.types if n.startswith("futures_channel::mpsc::UnboundedReceiver<"))
    size = chat.types[LINES].size
    for second in (LINES, rx):
        pair = TypeInfo("test::Pair", "struct", 2 * size, (Field("a", 0, size, LINES), Field("b", size, 8, second)))
        chat.types[pair.name] = pair
        try:
            h = Heap(chat)
            h.mem.write(BASE, bytes(2 * size))
            _async_io_source(h, BASE, 7)
            if second == LINES:
                _async_io_source(h, BASE + size, 8)
            else:
                h.mem.write(BASE + size, (BASE + 0x8_0000).to_bytes(8, "little"))  # the receiver's Arc
            tree = h.walk(BASE, pair.name)
            assert "waits for" not in tree.detail and not any("waits for" in n.detail for n in tree.iter()), tree
        finally:
            del chat.types[pair.name]
            getattr(chat, "_reflect_io_reach", {}).clear()


def test_a_forward_waits_on_its_stream_not_on_its_sink(ws) -> None:  # type: ignore[no-untyped-def]
    """futures' Forward (a receiver `.map(Ok).forward(socket)`) polls its stream (behind its
    `inner` and a Fuse and a Map): the channel, though its sink leads to a socket."""
    fwd = next(n for n in ws.types if n.startswith("futures_util::stream::stream::Forward<futures_util::stream::stream::map::"
                                                   "Map<futures_channel::mpsc::UnboundedReceiver<"))
    h = Heap(ws)
    h.mem.write(BASE, bytes(ws.types[fwd].size))
    rx, _ = h.at(BASE, fwd, ["inner", "stream", "stream", "stream", "inner"])
    h.mem.write(rx, (BASE + 0x8_0000).to_bytes(8, "little"))
    tree = h.walk(BASE, fwd)
    leaf = list(tree.iter())[-1]
    assert tree.kind == "combinator" and leaf.detail == f"waits on mpsc channel 0x{BASE + 0x8_0000:x}", tree


def test_a_stream_behind_a_boxed_dyn_stream_is_followed(chat) -> None:  # type: ignore[no-untyped-def]
    """async-std's `Incoming { incoming: Pin<Box<dyn Stream>> }`: the concrete stream (async-io's
    `unfold` of `accept`) by the vtable's `poll_next` (Inventory.future_polls; its unit is read
    for that symbol), not a `dyn` leaf."""
    incoming = "async_std::net::tcp::listener::Incoming"
    poll, unfold = next((a, n) for a, n in chat.future_polls.items() if n.startswith("futures_lite::stream::Unfold<"))
    h = Heap(chat)
    data, vtable = h.new(unfold), h.new(unfold)
    h.mem.write(vtable + 24, poll.to_bytes(8, "little"))  # [drop, size, align, poll_next]
    h.mem.write(BASE, data.to_bytes(8, "little") + vtable.to_bytes(8, "little"))
    tree = h.walk(BASE, incoming)
    assert tree.kind == "combinator" and tree.children, tree
    assert "dyn" not in tree.children[0].detail and tree.children[0].addr == data, tree


def test_futures_select_of_async_std_nexts_on_channels(chat) -> None:  # type: ignore[no-untyped-def]
    """a-chat's broker: futures' `select!` captures `&mut Fuse<NextFuture<UnboundedReceiver>>`
    per branch; async-std's `NextFuture { stream: &mut S }` is a future (`next()`), so each
    branch is walked down to the channel it waits on (was: a bare `broker_loop::poll_fn`)."""
    pf = next(n for n in chat.types if n.startswith("futures_util::future::poll_fn::PollFn<async_std_a_chat::server::broker_loop::"))
    h = Heap(chat)
    h.mem.write(BASE, bytes(64))
    env = chat.types[pf].fields[0]
    for i, cap in enumerate(chat.types[env.type_name].fields):
        # Fuse { inner: Option<NextFuture { stream: &mut rx }> }: Some is the non-null reference
        nxt, _ = h.at(BASE + env.offset + cap.offset, cap.type_name, ["*", "inner"])
        rx_t = next(n for n in chat.types if n.startswith("futures_channel::mpsc::UnboundedReceiver<")
                    and cap.type_name.endswith(f"NextFuture<{n}>>"))
        rx = h.new(rx_t)
        h.mem.write(nxt, rx.to_bytes(8, "little"))
        arc, _ = h.at(rx, rx_t, ["inner"])
        h.mem.write(arc, (BASE + 0x8_0000 + i * 0x100).to_bytes(8, "little"))  # the receiver's Arc
    tree = h.walk(BASE, pf)
    leaves = [n for n in tree.iter() if not n.children]
    assert tree.label == "futures::select!" and [n.detail for n in leaves] == [
        f"waits on mpsc channel 0x{BASE + 0x8_0000 + i * 0x100:x}" for i in range(2)], tree


def test_a_poll_fn_closure_polling_a_readable(chat) -> None:  # type: ignore[no-untyped-def]
    """async-io's `optimistic(readable())` (an accept's wait): a `poll_fn` closure capturing
    `&mut Pin<&mut Readable>`, whose `Ready` registered in the Source's `wakers` slab or
    waker: the closure's leaf says the socket's direction (was: a bare `poll_fn`)."""
    pf = next(n for n in chat.types if n.startswith("core::future::poll_fn::PollFn<async_io::optimistic::")
              and "Readable<std::net::tcp::TcpListener>" in n)
    h = Heap(chat)
    h.mem.write(BASE, bytes(64))
    env = chat.types[pf].fields[0]
    cap = next(f for f in chat.types[env.type_name].fields if "Readable" in f.type_name)
    src, st = h.at(BASE + env.offset + cap.offset, cap.type_name,
                   ["*", "pointer", "*", "__0", "handle", "*", "source", *ARC])
    h.mem.write(h.at(src, st, ["registration", "raw"])[0], (3).to_bytes(4, "little"))
    d, dt = _direction(h, src, st, 0)
    h.mem.write(h.at(d, dt, ["waker"])[0], SOME)
    tree = h.walk(BASE, pf)
    assert tree.kind == "leaf" and tree.detail == f"waits for READABLE on fd 3, async-io Source 0x{src:x}", tree


@pytest.fixture(scope="module")
def h2(tmp_path_factory):  # type: ignore[no-untyped-def]
    return build_inventory(corpus_binary("realworld-debug", "h2_server"), cache_dir=tmp_path_factory.mktemp("inv"))


@pytest.mark.parametrize("fn", ["h2::share::{impl#3}::data", "h2::server::{impl#1}::accept"])
def test_another_crates_poll_fn_is_a_poll_fn(h2, fn: str) -> None:  # type: ignore[no-untyped-def]
    """h2's `struct PollFn<F>(F)` (its `RecvStream::data` and `Connection::accept` await one,
    h2's examples/server.rs): a tuple struct around a closure, read as core's `poll_fn`, its
    leaf named after the closure's fn (was: a bare `h2::PollFn`, by the one-field wrapper
    rule and the I/O leaf rule)."""
    pf = next(n for n in h2.types if n.startswith(f"h2::PollFn<{fn}::{{async_fn#0}}::{{closure_env#0}}"))
    h = Heap(h2)
    h.mem.write(BASE, bytes(64))
    env = h2.types[pf].fields[0]
    assert env.name == "__0"
    for cap in h2.types[env.type_name].fields:  # each capture a reference to a zeroed object
        if h2.types[cap.type_name].kind == "pointer":
            h.at(BASE + env.offset + cap.offset, cap.type_name, ["*"])
    tree = h.walk(BASE, pf)
    assert tree.kind == "leaf" and tree.label == f"{fn}::poll_fn", tree
