"""Futures that poll a stream: `next()` and `collect()` of futures, tokio-stream and async-std,
a `stream` field, and tokio-stream's StreamMap."""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.analysis.model import Field

from ..node import missing_or_unreadable, Node, short_type
from .fields import _field, _find_field, _futurish, MAX_LISTED, _NOT_WRAPPERS, _vec_items

if TYPE_CHECKING:
    from ..walker import Reflector


def stream_next(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """``StreamExt::next()``: ``Next { stream: &mut St }`` (async-std's ``NextFuture``);
    ``collect()``: ``Collect { stream: St, .. }``."""
    f = _field(r, type_name, "stream")
    if f is None:
        return None
    crate = next((c for p, c in _STREAM_CRATES if type_name.startswith(p)), "futures::stream")
    label = f"{crate}::next" if "::next::Next" in type_name else f"{crate}::collect"
    return _stream_child(r, Node("combinator", label, addr, type_name), addr, f, depth, seen)


_STREAM_CRATES = (("tokio_stream::", "tokio_stream"), ("async_std::", "async_std::stream"))


_DYN_STREAM = "(dyn futures_core::stream::Stream<"


def stream_field(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """A future or stream that polls the stream it holds in a field named ``stream`` and
    holds no future of its own: futures' ``TryForEach``, ``ForEach``, ``Forward`` (a receiver
    forwarded into a sink), its stream ``Map`` and ``Fuse``: what it waits on is that stream's
    (a channel end, a socket: tokio-tungstenite's server example selects on both). Or a
    stream whose one field is a boxed ``dyn Stream`` (async-std's ``Incoming``, around
    async-io's ``unfold`` of ``accept``): followed through its vtable's ``poll_next``."""
    t = r.type(type_name)
    if t is None or t.kind != "struct" or type_name.startswith(_NOT_WRAPPERS) or \
            any(_futurish(r, g.type_name) for g in t.fields):
        return None
    found = _find_field(r, type_name, "stream", max_depth=2)  # futures' Forward: in its `inner`
    f = Field("stream", found[0], 0, found[1]) if found is not None else None
    if f is None and len(t.fields) == 1 and _DYN_STREAM in t.fields[0].type_name \
            and t.fields[0].type_name.startswith(("core::pin::Pin<alloc::boxed::Box<", "alloc::boxed::Box<")):
        f = t.fields[0]
    if f is None:
        return None
    return _stream_child(r, Node("combinator", short_type(type_name), addr, type_name), addr, f, depth, seen)


def _stream_child(r: Reflector, node: Node, addr: int, f, depth: int, seen: frozenset) -> Node:  # type: ignore[no-untyped-def]
    t = r.type(f.type_name)
    if t is not None and t.kind == "pointer":
        p = r.mem.word(addr + f.offset)
        if p is None:
            return missing_or_unreadable(r, addr, node.type_name, node.label)
        node.children.append(r.child(p, t.pointee or "", depth, seen))
    else:
        node.children.append(r.child(addr + f.offset, f.type_name, depth, seen))
    return node


def stream_map(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """tokio-stream's ``StreamMap<K, V> { entries: Vec<(K, V)> }``: every stream it polls, in
    order (a connection's per-room ``stream!`` generators or ``unfold`` blocks behind a
    ``Pin<Box<dyn Stream>>``: the walker follows the vtable's ``poll_next``). Each shown
    below it, branch = its index."""
    f = _field(r, type_name, "entries")
    if f is None:
        return None
    node = Node("combinator", "tokio_stream::StreamMap", addr, type_name)
    items = _vec_items(r, addr + f.offset, f.type_name)
    if items is None:
        return missing_or_unreadable(r, addr, type_name, "StreamMap entries")
    data, n, el = items
    value = el.field("__1") if el is not None else None
    if value is None:
        node.detail = f"{n} streams"
        return node
    for i in range(min(n, MAX_LISTED)):
        c = r.child(data + i * el.size + value.offset, value.type_name, depth, seen)
        c.branch = f"{i}"
        node.children.append(c)
    node.detail = f"{n} streams" + (f", {n - MAX_LISTED} not listed" if n > MAX_LISTED else "")
    return node
