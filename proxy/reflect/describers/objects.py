"""Objects a future waits on, met as leaves: channel ends, JoinSets, broadcast receivers,
oneshot receivers, and futures that hold a reference to one (a Semaphore, a Notify, a lock)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..node import missing_or_unreadable, Node, short_type
from .fields import _arc_target, _deref_chain, Describer, _enum_variant, _field, _find_field, _path

if TYPE_CHECKING:
    from ..walker import Reflector


def _chan_detail(kind: str, *names: str):  # type: ignore[no-untyped-def]
    def detail(r: Reflector, addr: int, type_name: str) -> str | None:
        p = _arc_target(r, addr, type_name, *names)
        return f"waits on {kind} 0x{p:x}" if p else None
    return detail


def _join_set_detail(r: Reflector, addr: int, type_name: str) -> str | None:
    at = _path(r, addr, type_name, "inner", "length")
    n = r.mem.word(at) if at is not None else None
    return f"JoinSet of {n} tasks" if n is not None and n < 1 << 32 else None


# type prefix -> detail of a leaf that waits on such an object (follows field names; a layout
# without them gives no detail, never a guess)
OBJECTS: list[tuple[str, Callable[["Reflector", int, str], "str | None"]]] = [
    ("tokio::sync::mpsc::chan::Rx<", _chan_detail("mpsc channel", "inner")),
    ("tokio::sync::mpsc::bounded::Receiver<", _chan_detail("mpsc channel", "chan", "inner")),
    ("tokio::sync::mpsc::unbounded::UnboundedReceiver<", _chan_detail("mpsc channel", "chan", "inner")),
    ("tokio::sync::broadcast::Receiver<", _chan_detail("broadcast channel", "shared")),
    ("tokio::sync::watch::Receiver<", _chan_detail("watch channel", "shared")),
    ("tokio::task::join_set::JoinSet<", _join_set_detail),
    ("futures_channel::oneshot::Receiver<", _chan_detail("oneshot channel", "inner")),
    ("futures_channel::mpsc::Receiver<", _chan_detail("mpsc channel", "inner")),
    ("futures_channel::mpsc::UnboundedReceiver<", _chan_detail("mpsc channel", "inner")),
    ("tokio_stream::wrappers::mpsc_bounded::ReceiverStream<", _chan_detail("mpsc channel", "inner", "chan", "inner")),
    ("tokio_stream::wrappers::mpsc_unbounded::UnboundedReceiverStream<",
     _chan_detail("mpsc channel", "inner", "chan", "inner")),
]


def objects(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """A channel end or set met as a leaf (a stream polled by ``next()``): what it waits on."""
    for prefix, fn in OBJECTS:
        if type_name.startswith(prefix):
            return Node("leaf", short_type(type_name), addr, type_name, detail=fn(r, addr, type_name) or "")
    return None


def broadcast_recv(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """``broadcast::Recv { receiver: &mut Receiver, waiter }``."""
    f = _field(r, type_name, "receiver")
    if f is None:
        return None
    node = Node("leaf", "tokio::sync::broadcast::Receiver::recv", addr, type_name)
    got = _deref_chain(r, addr + f.offset, f.type_name)
    if got is None:
        return missing_or_unreadable(r, addr, type_name, node.label)
    node.detail = object_detail(r, *got) or ""
    return node


def object_detail(r: Reflector, addr: int, type_name: str) -> str | None:
    for prefix, fn in OBJECTS:
        if type_name.startswith(prefix):
            return fn(r, addr, type_name)
    return None


# futures' channel ends: where the receiving task's waker sits in the state their Arc shares
# (``AtomicWaker { waker: UnsafeCell<Option<Waker>> }``, ``Lock { data: UnsafeCell<..> }``)
_RX_WAKERS = (
    ("futures_channel::mpsc::Receiver<", "futures_channel::mpsc::BoundedInner<", ("recv_task", "waker")),
    ("futures_channel::mpsc::UnboundedReceiver<", "futures_channel::mpsc::UnboundedInner<", ("recv_task", "waker")),
    ("futures_channel::oneshot::Receiver<", "futures_channel::oneshot::Inner<", ("rx_task", "data")),
)


def rx_waker_set(r: Reflector, addr: int, type_name: str) -> bool | None:
    """Whether a futures channel end holds its task's waker: the end it polled Pending on
    (None: not such an end, or its state is not described or readable)."""
    for prefix, inner, names in _RX_WAKERS:
        if type_name.startswith(prefix) and type_name.endswith(">"):
            arc = _arc_target(r, addr, type_name, "inner")
            shared = f"alloc::sync::ArcInner<{inner}{type_name[len(prefix):-1]}>>"
            at = _path(r, arc, shared, "data", *names, "value") if arc else None
            if at is None:
                return None
            v, ok = _enum_variant(r, at, "core::option::Option<core::task::wake::Waker>")
            return v.name == "Some" if ok and v is not None else None
    return None


def _polled_channel(r: Reflector, addr: int, fields: list, depth: int, seen: frozenset) -> Node | None:  # type: ignore[type-arg]
    """Of several futures channel ends held side by side (hyper's body: a data ``mpsc`` and a
    trailers ``oneshot``), the one holding the task's waker: a body polls its data first and
    returns Pending there, so only that end can wake it. The oneshot alone is a future and
    the mpsc a stream, so by layout alone the holder looked like a wrapper of the oneshot."""
    chans = [f for f in fields if f.type_name.startswith(tuple(p for p, _, _ in _RX_WAKERS))]
    if len(chans) < 2:
        return None
    set_ = [f for f in chans if rx_waker_set(r, addr + f.offset, f.type_name)]
    if len(set_) != 1:
        return None
    return objects(r, addr + set_[0].offset, set_[0].type_name, depth - 1, seen)


def _pointer_field(label: str, field: str, what: str) -> Describer:
    """A leaf that waits on the object a pointer field points at."""

    def describe(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
        f = _field(r, type_name, field)
        node = Node("leaf", label, addr, type_name)
        if f is None:
            return node
        got = _deref_chain(r, addr + f.offset, f.type_name)
        if got is None:
            return missing_or_unreadable(r, addr, type_name, label)
        node.detail = f"waits on {what} 0x{got[0]:x}"
        return node

    return describe


def oneshot_receiver(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    inner = r.mem.word(addr)  # Option<Arc<Inner>>: the Arc's pointer, 0 = None (niche)
    node = Node("leaf", "tokio::sync::oneshot::Receiver", addr, type_name)
    if inner is None:
        return missing_or_unreadable(r, addr, type_name, "oneshot::Receiver")
    node.detail = "closed (no channel)" if inner == 0 else f"waits on oneshot channel 0x{inner:x}"
    return node


def _by_ref(field: str, label: str, what: str, link: bool = False) -> Describer:
    """A leaf whose future holds ``field: &Object`` somewhere inside (by value, behind
    event-listener-strategy's ``FutureWrapper``): names the object (its address, or the
    Arc its first field holds when ``what`` ends in "channel")."""

    def describe(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
        found = _find_field(r, type_name, field)
        if found is None:
            return None
        node = Node("leaf", label, addr, type_name)
        p = r.mem.word(addr + found[0])
        obj = r.mem.word(p) if p and what.endswith("channel") else p
        if obj is None:
            return missing_or_unreadable(r, addr, type_name, label)
        node.detail = f"waits on {what} 0x{obj:x}"
        if link:
            node.waits_on = obj
        return node

    return describe
