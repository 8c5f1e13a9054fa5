"""Combinators and leaf futures the walker knows by type name (a few lines each).

A describer is ``fn(reflector, addr, type_name, depth, seen) -> Node | None``
registered under a type-name prefix in ``DESCRIBERS`` (first match wins;
None falls through to the generic walk). Field offsets always come from the
DWARF ``TypeInfo`` of the binary at hand, never from constants: a describer
that does not find the fields it needs returns None (the type is then shown
by name) rather than guessing.

Shapes checked on the corpus (tokio 1.24, rustc 1.95 and 1.63):

* ``join!`` awaits ``PollFn<closure>`` whose env holds ``futures: &mut (MaybeDone<A>,
  MaybeDone<B>, ..)``; ``MaybeDone`` is an enum ``Future(F) | Done(T) | Gone``.
* ``select!`` awaits ``PollFn<closure>`` whose env holds ``disabled: &mut u8``
  (bit i: branch i finished or failed its pattern) and ``futures: &mut &mut (A, B, ..)``
  (rustc 1.95 names captured references ``_ref__disabled`` / ``_ref__futures``).
* ``Sleep { entry, inner: Inner { deadline: Instant } }``; tokio's ``Instant`` wraps
  std's, which wraps a ``Timespec { tv_sec, tv_nsec }`` of CLOCK_MONOTONIC.
* ``JoinHandle { raw: RawTask { ptr: NonNull<Header> } }``; ``Header.vtable`` points
  at a ``Vtable`` whose ``poll`` is ``tokio::runtime::task::raw::poll<T, S>`` (T: the
  spawned future) and whose ``id_offset`` locates the task id in the cell.
* ``Acquire { semaphore: &Semaphore }`` (a ``Mutex``'s semaphore is its first field),
  ``Notified { notify: &Notify }``, ``oneshot::Receiver { inner: Option<Arc<Inner>> }``,
  ``mpsc::Receiver { chan: Rx { inner: Arc<Chan> } }``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from proxy.analysis.model import Field

from .node import Node, short_type, missing_or_unreadable, type_fact

if TYPE_CHECKING:
    from .walker import Reflector

Describer = Callable[["Reflector", int, str, int, frozenset], "Node | None"]


def _path(r: Reflector, addr: int, type_name: str, *names: str) -> int | None:
    """Follow fields by name, by value only: the address of the last one."""
    for n in names:
        t = r.type(type_name)
        f = t.field(n) if t is not None else None
        if f is None:
            return None
        addr, type_name = addr + f.offset, f.type_name
    return addr


def _field(r: Reflector, type_name: str, suffix: str):  # type: ignore[no-untyped-def]
    t = r.type(type_name)
    for f in t.fields if t is not None else ():
        if f.name == suffix or f.name.endswith("__" + suffix):
            return f
    return None


def _held_type(r: Reflector, type_name: str) -> str:
    """The future a ``Pin<&mut F>`` / ``&mut F`` / ``Box<F>`` stands for, by type alone: F."""
    from .node import _pointee

    for _ in range(4):
        t = r.type(type_name)
        if t is None:
            break
        if type_name.startswith("core::pin::Pin<") and t.fields:
            type_name = t.fields[0].type_name
        elif t.kind == "pointer" and t.pointee and type_name.startswith("&"):
            type_name = t.pointee
        elif type_name.startswith("alloc::boxed::Box<") and t.fields and (p := _pointee(r, r.type(t.fields[0].type_name))):
            type_name = p
        else:
            break
    return type_name


def _deref_chain(r: Reflector, addr: int, type_name: str) -> tuple[int, str] | None:
    """Follow ``&mut &mut T`` to (address of T, T)."""
    for _ in range(4):
        t = r.type(type_name)
        if t is None or t.kind != "pointer" or not t.pointee:
            return addr, type_name
        nxt = r.mem.word(addr)
        if nxt is None:
            return None
        addr, type_name = nxt, t.pointee
    return addr, type_name


# -- combinators -------------------------------------------------------------------------


def poll_fn(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """``PollFn<closure>`` (tokio's own before 1.30-ish, ``core::future::poll_fn`` after): what the
    closure captured decides, not the version. ``futures`` (by ``&mut``, one or two levels, the
    name bare or ``_ref__futures``) is a tuple of ``join!``/``try_join!``'s ``MaybeDone``s, or of
    ``select!``'s branches when ``disabled`` is captured too; any other capture is a reference
    to the object the closure polls (``recv``: ``&mut chan::Rx``; ``JoinSet::join_next``:
    ``&mut JoinSet``), shown as a leaf named after the closure's function."""
    f = _field(r, type_name, "f") or _closure_field(r, type_name)
    if f is None:
        return None
    env_addr, env = addr + f.offset, f.type_name
    futs = _field(r, env, "futures")
    if futs is None:
        return _poll_fn_leaf(r, addr, type_name, env_addr, env, depth, seen)
    got = _deref_chain(r, env_addr + futs.offset, futs.type_name)
    if got is None:
        return missing_or_unreadable(r, addr, type_name, "join!/select! futures")
    taddr, ttype = got
    tup = r.type(ttype)
    if tup is None:
        return Node("leaf", "PollFn", addr, type_name, detail=short_type(ttype))
    dis = _field(r, env, "disabled")
    select = dis is not None
    mask = 0
    if select:
        p = r.mem.word(env_addr + dis.offset)
        m = r.mem.u(p, 1) if p is not None else None
        if m is None:
            return missing_or_unreadable(r, addr, type_name, "select! state")
        mask = m
    macro = "select!" if select else "join!"
    node = Node("combinator", f"tokio::{macro}", addr, type_name)
    for i, el in enumerate(tup.fields):
        if select and mask & (1 << i):
            child = Node("leaf", _label_of(r, el.type_name), taddr + el.offset, el.type_name, status="completed")
        else:
            child = r.child(taddr + el.offset, el.type_name, depth, seen)
            if select and child.kind == "leaf" and child.detail.startswith(NOTHING_IN_FLIGHT):
                # select! has not seen it finish: name the branch by the future it holds (axum's
                # `conn.as_mut()`: hyper-util's connection, not hyper's dispatcher inside it)
                child = Node("leaf", short_type(_held_type(r, el.type_name)), taddr + el.offset, el.type_name,
                             detail=f"pending; inside, {child.label} has {child.detail}")
        child.branch = f"branch {i}"
        node.children.append(child)
    return node


# A crate's own poll_fn: `PollFn<F>`, the type's last segment before its generics (h2's
# `struct PollFn<F>(F)`, futures-lite's `PollFn { f }`), polled like core's.
_ANY_POLL_FN = re.compile(r"^[A-Za-z0-9_:]*::PollFn<")


def _closure_field(r: Reflector, type_name: str):  # type: ignore[no-untyped-def]
    """The one field of a tuple-struct poll_fn (``__0``) when it holds a closure."""
    t = r.type(type_name)
    if t is None or len(t.fields) != 1 or "{closure_env#" not in t.fields[0].type_name:
        return None
    return t.fields[0]


def any_poll_fn(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """Another crate's ``PollFn<F>`` around a closure (h2's ``RecvStream::data`` and
    ``Connection::accept`` await one): read as core's, the leaf named after the closure's fn
    (was: a bare ``h2::PollFn``)."""
    return poll_fn(r, addr, type_name, depth, seen) if _ANY_POLL_FN.match(type_name) else None


_CLOSURE_OF = re.compile(r"^(.*?)::\{async_fn#\d+\}::\{closure_env#\d+\}(<.*>)?$")


def _poll_fn_leaf(r: Reflector, addr: int, type_name: str, env_addr: int, env: str, depth: int,
                  seen: frozenset) -> Node:
    """A closure polled by ``poll_fn`` without tokio's ``futures`` tuple: futures' ``join!``
    captures each ``MaybeDone`` as ``_fut0``, ``_fut1``.. (``Pin<&mut ..>``), its ``select!``
    each branch by ``&mut`` (``_ref__rx``): captured futures are branches; otherwise the
    closure polls an object (a channel end, a JoinSet): a leaf that names it."""
    t = r.type(env)
    futs = [f for f in (t.fields if t is not None else ()) if _futurish(r, f.type_name)]
    if futs:
        joined = all(re.fullmatch(r"_fut\d+", f.name) for f in futs)
        node = Node("combinator", "futures::join!" if joined else "futures::select!", addr, type_name)
        for i, f in enumerate(futs):
            c = r.child(env_addr + f.offset, f.type_name, depth, seen)
            c.branch = f"branch {i}" if joined else f.name.removeprefix("_ref__")
            node.children.append(c)
        return node
    m = _CLOSURE_OF.match(env)
    label = f"{m.group(1)}::poll_fn" if m else "poll_fn"
    node = Node("leaf", label, addr, type_name)
    t = r.type(env)
    for cap in t.fields if t is not None else ():
        got = _deref_chain(r, env_addr + cap.offset, cap.type_name)
        if got is None:
            return missing_or_unreadable(r, addr, type_name, label)
        detail = object_detail(r, *got)
        if detail:
            node.detail = detail
            break
    else:  # a closure polling an I/O handle's readiness (async-io's `optimistic`)
        node.detail = io_detail(r, env_addr, env) or ""
    return node


# -- what a leaf waits on: the object a reference points at, by type ----------------------


def _arc_target(r: Reflector, addr: int, type_name: str, *names: str) -> int | None:
    """The heap address of the ``Arc`` reached by following ``names`` (its first word)."""
    at = _path(r, addr, type_name, *names)
    return r.mem.word(at) if at is not None else None


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


# channel ends of OBJECTS that are futures themselves (awaited directly)
FUTURE_OBJECTS = ("futures_channel::oneshot::Receiver<",)


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


def maybe_done(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    t = r.type(type_name)
    if t is None or t.discr is None:
        return None
    value = r.mem.u(addr + t.discr.offset, t.discr.size)
    if value is None:
        return missing_or_unreadable(r, addr, type_name, "MaybeDone")
    v = t.variant_for(value)
    inner = re.match(r"[\w:]*MaybeDone<(.*)>$", type_name)
    label = _label_of(r, inner.group(1)) if inner else "MaybeDone"
    if v is None:
        return missing_or_unreadable(r, addr, type_name, f"MaybeDone tag {value}")
    if v.name == "Future" and v.fields:
        return r.child(addr + v.fields[0].offset, v.fields[0].type_name, depth, seen)
    return Node("leaf", label, addr, type_name, status="completed" if v.name == "Done" else "gone")


def _branches(label: str, *fields: tuple[str, str]) -> Describer:
    """A combinator over named fields, each a branch: ``(field, branch name)``."""

    def describe(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
        found = [(_field(r, type_name, f), name) for f, name in fields]
        if any(f is None for f, _ in found):
            return None
        node = Node("combinator", label, addr, type_name)
        for f, name in found:
            c = r.child(addr + f.offset, f.type_name, depth, seen)
            c.branch = name
            node.children.append(c)
        return node

    return describe


timeout = _branches("tokio::time::Timeout", ("value", "value"), ("delay", "deadline"))


def _label_of(r: Reflector, type_name: str) -> str:
    from .node import coroutine_path

    m = re.match(r"core::future::from_generator::GenFuture<(.*)>$", type_name)  # rustc 1.63
    if m and m.group(1) in r.inv.layouts:
        type_name = m.group(1)
    if type_name in r.inv.layouts:
        return coroutine_path(type_name)
    return short_type(type_name)


# -- leaves ------------------------------------------------------------------------------


def sleep(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """tokio's ``Sleep``: its deadline is a field named ``deadline`` (``inner.deadline`` in 1.24,
    ``entry.deadline`` of the ``TimerEntry`` in 1.43 and 1.53), an ``Instant`` that wraps std's,
    which wraps a ``Timespec { tv_sec, tv_nsec }`` of CLOCK_MONOTONIC: found by name."""
    node = Node("leaf", "tokio::time::Sleep", addr, type_name)
    found = _find_field(r, type_name, "deadline")
    if found is None:
        return node
    return _deadline(r, node, addr + found[0], found[1]) or missing_or_unreadable(r, addr, type_name,
                                                                                    "Sleep deadline")


def _find_field(r: Reflector, type_name: str, name: str, max_depth: int = 4) -> tuple[int, str] | None:
    """(offset, type) of the first field called ``name`` inside ``type_name``, by value only
    (breadth first, ``max_depth`` levels of nested structs)."""
    level = [(0, type_name)]
    for _ in range(max_depth):
        nxt = []
        for off, tn in level:
            t = r.type(tn)
            if t is None or t.kind != "struct":
                continue
            for f in t.fields:
                if f.name == name:
                    return off + f.offset, f.type_name
                nxt.append((off + f.offset, f.type_name))
        level = nxt
    return None


def _timespec(r: Reflector, type_name: str) -> tuple[int, int, int] | None:
    """(offset, tv_sec field offset, tv_nsec field offset) of the Timespec inside an Instant."""
    off = 0
    for _ in range(6):
        t = r.type(type_name)
        if t is None or t.kind != "struct" or not t.fields:
            return None
        sec, nsec = t.field("tv_sec"), t.field("tv_nsec")
        if sec is not None and nsec is not None:
            return off, sec.offset, nsec.offset
        f = t.fields[0] if len(t.fields) == 1 else (t.field("std") or t.field("t") or t.field("__0"))
        if f is None:
            return None
        off, type_name = off + f.offset, f.type_name
    return None


def _deadline(r: Reflector, node: Node, at: int, instant: str) -> Node | None:
    """Sets ``node.detail`` to the time left until the Instant at ``at``; None: unreadable."""
    ts = _timespec(r, instant)
    if ts is None:
        return node
    off, sec_off, nsec_off = ts
    sec = r.mem.u(at + off + sec_off, 8)
    nsec = r.mem.u(at + off + nsec_off, 4)
    if sec is None or nsec is None:
        return None
    deadline = sec * 1_000_000_000 + nsec
    if r.now_ns is not None:
        left = deadline - r.now_ns
        node.detail = f"{_dur(left)} left" if left > 0 else f"expired {_dur(-left)} ago"
    else:
        node.detail = f"deadline {sec}.{nsec:09d} s (CLOCK_MONOTONIC)"
    return node


def _dur(ns: int) -> str:
    if ns >= 3_600_000_000_000:
        return f"{ns / 3.6e12:.1f} h"
    if ns >= 60_000_000_000:
        return f"{ns / 6e10:.1f} min"
    if ns >= 1_000_000_000:
        return f"{ns / 1e9:.1f} s"
    return f"{ns // 1_000_000} ms"


def join_handle(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    ptr_at = _path(r, addr, type_name, "raw", "ptr", "pointer")
    node = Node("leaf", "tokio::task::JoinHandle", addr, type_name)
    if ptr_at is None:
        return node
    header = r.mem.word(ptr_at)
    if header is None:
        return missing_or_unreadable(r, addr, type_name, "JoinHandle")
    desc = describe_task_header(r, header)
    node.detail = desc if desc else f"task header 0x{header:x}"
    return node


def describe_task_header(r: Reflector, header: int) -> str | None:
    """``task 0x.. (tokio id N) path`` from a tokio task header."""
    h = r.type("tokio::runtime::task::core::Header")
    vf = h.field("vtable") if h else None
    if vf is None:
        return None
    vt = r.mem.word(header + vf.offset)
    vtype = r.type("tokio::runtime::task::raw::Vtable")
    if vt is None or vtype is None:
        return None
    poll_f, id_f = vtype.field("poll"), vtype.field("id_offset")
    poll = r.mem.word(vt + poll_f.offset) if poll_f else None
    id_off = r.mem.word(vt + id_f.offset) if id_f else None
    tid = r.mem.word(header + id_off) if id_off is not None and id_off < 1 << 16 else None
    what = spawned_type(r, poll)
    known = r.task_names.get(header)
    parts = [f"task 0x{header:x}"]
    if tid is not None:
        parts.append(f"(tokio id {tid})")
    if known:
        parts.append(known)
    elif what:
        parts.append(_label_of(r, what))
    return " ".join(parts)


def spawned_type(r: Reflector, poll: int | None) -> str | None:
    """T of ``tokio::runtime::task::raw::poll<T, S>`` at runtime address ``poll``."""
    if poll is None or r.symbol_at is None or poll <= r.bias:
        return None
    name = r.symbol_at(poll - r.bias) or ""
    m = re.match(r"tokio::runtime::task::raw::poll<(.*)>$", name)
    if not m:
        return None
    args = _split_generics(m.group(1))
    return args[0] if args else None


def _split_generics(s: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if cur:
        out.append("".join(cur).strip())
    return out


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


# -- futures-util (0.3.21) ---------------------------------------------------------------

MAX_LISTED = 64  # children of one JoinAll / FuturesUnordered shown (the rest are counted)


def _enum_variant(r: Reflector, addr: int, type_name: str):  # type: ignore[no-untyped-def]
    """(variant, readable) of an enum value; (None, True) when DWARF does not describe it."""
    t = r.type(type_name)
    if t is None or t.discr is None:
        return None, True
    value = r.mem.u(addr + t.discr.offset, t.discr.size)
    if value is None:
        return None, False
    return t.variant_for(value), True


def join_all(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """``JoinAll { kind: Small { elems: Pin<Box<[MaybeDone<F>]>> } | Big { fut: Collect<
    FuturesOrdered<F>, Vec<_>> } }`` (Big above 30 futures)."""
    kind = _field(r, type_name, "kind")
    if kind is None:
        return None
    v, ok = _enum_variant(r, addr + kind.offset, kind.type_name)
    if not ok:
        return missing_or_unreadable(r, addr, type_name, "JoinAll")
    node = Node("combinator", "futures::future::join_all", addr, type_name)
    if v is None or not v.fields:
        return None
    f = v.fields[0]
    at = addr + kind.offset + f.offset
    if v.name == "Big":  # Collect { stream: FuturesOrdered { in_progress_queue, .. }, .. }
        q = _path(r, at, f.type_name, "stream", "in_progress_queue")
        sq = _field(r, _field(r, f.type_name, "stream").type_name, "in_progress_queue") if q is not None else None
        if q is None or sq is None:
            node.detail = "more than 30 futures"
            return node
        inner = r.child(q, sq.type_name, depth, seen)
        node.detail = inner.detail
        node.children = inner.children
        return node
    box = _path(r, at, f.type_name, "pointer")  # Pin<Box<[T]>>: the Box's (data_ptr, length)
    bt = _field(r, f.type_name, "pointer")
    dp, ln = (_field(r, bt.type_name, "data_ptr"), _field(r, bt.type_name, "length")) if bt else (None, None)
    if box is None or dp is None or ln is None:
        return node
    data, n = r.mem.word(box + dp.offset), r.mem.word(box + ln.offset)
    el_name = re.match(r"core::pin::Pin<alloc::boxed::Box<\[(.*)\],", f.type_name)
    el = r.type(el_name.group(1)) if el_name else None
    if data is None or n is None or n > 1 << 20:
        return missing_or_unreadable(r, addr, type_name, "JoinAll elements")
    if el is None or el.size <= 0:
        node.detail = f"{n} futures"
        return node
    done = 0
    for i in range(n):
        c = r.child(data + i * el.size, el.name, depth, seen)
        done += c.status in ("completed", "gone")
        if i < MAX_LISTED:
            c.branch = f"{i}"
            node.children.append(c)
    node.detail = f"{n} futures, {done} done" + (f", {n - MAX_LISTED} not listed" if n > MAX_LISTED else "")
    return node


_MAYBE_DONE = re.compile(r"(?:tokio::future::maybe_done::|futures_util::future::(?:try_)?maybe_done::)(?:Try)?MaybeDone<")


def joined(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """A struct of two or more ``MaybeDone`` slots and nothing else is a join that polls
    every slot: futures' ``Join { Fut1: MaybeDone<Fut1>, Fut2: MaybeDone<Fut2> }`` (its
    ``join``; ``Join3``..``Join5``, ``TryJoin*`` of ``TryMaybeDone``s), whatever library
    joins so. One branch per slot, named by its field; a slot done is ``[completed]``.
    Found by layout (several futures in one struct are otherwise no wrapper: a leaf)."""
    t = r.type(type_name)
    if t is None or t.kind != "struct" or len(t.fields) < 2 \
            or not all(_MAYBE_DONE.match(f.type_name) for f in t.fields):
        return None
    node = Node("combinator", short_type(type_name), addr, type_name)
    for f in t.fields:
        c = r.child(addr + f.offset, f.type_name, depth, seen)
        c.branch = f.name
        node.children.append(c)
    return node


def select(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """``Select { inner: Option<(A, B)> }``: None once it returned."""
    inner = _field(r, type_name, "inner")
    if inner is None:
        return None
    v, ok = _enum_variant(r, addr + inner.offset, inner.type_name)
    if not ok:
        return missing_or_unreadable(r, addr, type_name, "Select")
    if v is None:
        return None
    node = Node("combinator", "futures::future::select", addr, type_name)
    if v.name == "None" or not v.fields:
        node.status = "completed"
        return node
    pair = v.fields[0]
    tup = r.type(pair.type_name)
    for i, el in enumerate(tup.fields if tup is not None else ()):
        c = r.child(addr + inner.offset + pair.offset + el.offset, el.type_name, depth, seen)
        c.branch = "left" if i == 0 else "right"
        node.children.append(c)
    return node


def futures_unordered(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """``FuturesUnordered { head_all: AtomicPtr<Task<F>>, .. }``: a list of the futures not
    finished yet (a finished one is unlinked at once); ``Task { future: UnsafeCell<Option<F>>,
    next_all, len_all, .. }``, the head's ``len_all`` counts them all."""
    head_f = _field(r, type_name, "head_all")
    if head_f is None:
        return None
    m = re.match(r"core::sync::atomic::AtomicPtr<(.*)>$", head_f.type_name)
    task = r.type(m.group(1)) if m else None
    node = Node("combinator", "futures::stream::FuturesUnordered", addr, type_name)
    head = r.mem.word(addr + head_f.offset)
    if head is None:
        return missing_or_unreadable(r, addr, type_name, "FuturesUnordered")
    if head == 0:
        node.detail = "empty"
        return node
    if task is None:
        return node
    fut, nxt, ln = task.field("future"), task.field("next_all"), task.field("len_all")
    if fut is None or nxt is None or ln is None:
        return node
    n = r.mem.word(head + ln.offset)
    if n is None or n > 1 << 20:
        return missing_or_unreadable(r, head, task.name, "FuturesUnordered task")
    opt = _field(r, fut.type_name, "value")  # UnsafeCell<Option<F>>
    p: int | None = head
    listed = 0
    walked: set[int] = set()
    while p and p not in walked and len(walked) < min(n, MAX_LISTED):
        walked.add(p)
        v, ok = _enum_variant(r, p + fut.offset, opt.type_name) if opt else (None, True)
        if not ok:
            node.children.append(missing_or_unreadable(r, p, task.name, "FuturesUnordered task"))
            break
        if v is not None and v.name == "Some" and v.fields:
            c = r.child(p + fut.offset + v.fields[0].offset, v.fields[0].type_name, depth, seen)
            c.branch = f"{listed}"
            node.children.append(c)
            listed += 1
        p = r.mem.word(p + nxt.offset)
    node.detail = f"{n} futures" + (f", {n - len(walked)} not listed" if n > len(walked) else "")
    return node


def order_wrapper(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    f = _field(r, type_name, "data")  # FuturesOrdered's OrderWrapper { data: F, index }
    return r.child(addr + f.offset, f.type_name, depth - 1, seen) if f is not None else None


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


def _vec_items(r: Reflector, addr: int, type_name: str):  # type: ignore[no-untyped-def]
    """(data pointer, length, element TypeInfo or None) of a ``Vec<T>`` (std 1.8x's ``buf:
    RawVec { inner: RawVecInner { ptr, .. } }``, ``len``); None when unreadable."""
    length = _path(r, addr, type_name, "len")
    found = _find_field(r, type_name, "ptr", max_depth=6)
    if length is None or found is None:
        return None
    data, n = r.mem.word(addr + found[0]), r.mem.word(length)
    if data is None or n is None or n > 1 << 20:
        return None
    args = _split_generics(type_name[type_name.index("<") + 1:-1]) if "<" in type_name else []
    return data, n, (r.type(args[0]) if args else None)


# -- tokio: yield_now, I/O readiness -----------------------------------------------------


def yield_now(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """``YieldNow { yielded: bool }`` (local to ``yield_now``'s body)."""
    f = _field(r, type_name, "yielded")
    if f is None:
        return None
    y = r.mem.u(addr + f.offset, 1)
    if y is None or y > 1:
        return missing_or_unreadable(r, addr, type_name, "YieldNow")
    return Node("leaf", "tokio::task::yield_now", addr, type_name,
                detail="yielded, rescheduled" if y else "not polled yet")


_INTEREST = ((1, "READABLE"), (2, "WRITABLE"), (4, "AIO"), (8, "LIO"), (16, "PRIORITY"))  # mio 0.8
_READY = ((1, "readable"), (2, "writable"), (4, "read closed"), (8, "write closed"))  # tokio 1.24


def readiness(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """``Readiness { scheduled_io: &ScheduledIo, state: Init|Waiting|Done, waiter:
    UnsafeCell<Waiter { interest, .. }> }``.

    The fd is not in the Readiness: ``ScheduledIo`` is the I/O driver's slab entry (readiness
    bits and waiters; mio identifies it by a token, not by fd). It is in the handle the
    enclosing coroutine borrows as ``self`` (``TcpStream::ready(&self)`` ->
    ``PollEvented -> mio TcpStream -> .. -> OwnedFd``): the walker keeps that as
    ``io_handle`` (``Inventory.fd_offsets``). A Readiness awaited with no such coroutine
    around it (a hand-written future polling ``Registration`` directly) has no fd to show."""
    sio = _field(r, type_name, "scheduled_io")
    if sio is None:
        return None
    node = Node("leaf", "tokio::io::Readiness", addr, type_name)
    ptr = r.mem.word(addr + sio.offset)
    if ptr is None:
        return missing_or_unreadable(r, addr, type_name, "Readiness")
    at = _path(r, addr, type_name, "waiter", "value", "interest")
    bits = r.mem.u(at, 1) if at is not None else None
    what = "|".join(n for b, n in _INTEREST if bits & b) if bits else "readiness"
    if r.io_handle is not None:
        fd, handle = r.io_handle
        what += f" on fd {fd} ({handle})" if fd >= 0 else f" on a closed {handle}"
    st = _field(r, type_name, "state")
    state = r.mem.u(addr + st.offset, 1) if st is not None else None
    node.detail = f"{'waits for' if state in (None, 0, 1) else 'got'} {what}, ScheduledIo 0x{ptr:x}{_ready_now(r, ptr)}"
    return node


def _ready_now(r: Reflector, sio: int) -> str:
    ready = r.mem.word(sio)  # ScheduledIo { readiness: AtomicUsize, .. }: bits 0..16
    return "" if ready is None else ", ready now: " + (", ".join(n for b, n in _READY if ready & b) or "none")


_WAKER_SLOTS = (("reader", "READABLE"), ("writer", "WRITABLE"))  # ScheduledIo's Waiters


def io_borrow(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """A leaf future that borrows an I/O handle and polls it (tokio's ``io::util`` futures:
    ``Read { reader: &mut TcpStream, .. }``, ``WriteAll``, ``ReadLine``...): no ``Readiness``
    future in memory, the handle's own ``poll_read``/``poll_write`` registers the task's waker
    in the ``ScheduledIo`` its ``Registration`` shares with the I/O driver, in the slot of its
    direction (``Waiters { reader, writer }``; the driver takes it out when it wakes). The set
    slots say what the task waits for; the fd is behind the pointer field
    (``Inventory.fd_offsets``)."""
    t = r.type(type_name)
    if t is None or t.kind != "struct" or not any(f.type_name in r.inv.fd_offsets for f in t.fields):
        return None
    if any(_futurish(r, f.type_name) for f in t.fields):
        return None  # it holds a future of its own: what it awaits is that one's (the walk goes on)
    for f in t.fields:
        fd_off = r.inv.fd_offsets.get(f.type_name)
        if fd_off is None:
            continue
        handle = r.mem.word(addr + f.offset)
        pointee = r.type(f.type_name)
        if not handle or pointee is None or not pointee.pointee:
            return missing_or_unreadable(r, addr, type_name, short_type(type_name))
        sio = _scheduled_io(r, handle, pointee.pointee)
        if sio is None:
            return None
        fd = r.mem.u(handle + fd_off, 4)
        on = "" if fd is None else f" on fd {fd - (1 << 32) if fd >= 1 << 31 else fd} ({short_type(pointee.pointee)})"
        slots = _waker_slots(r, sio)
        what = f"waits for {'|'.join(slots)}" if slots else "no waker registered (woken)"
        return Node("leaf", short_type(type_name), addr, type_name,
                    detail=f"{what}{on}, ScheduledIo 0x{sio[0]:x}{_ready_now(r, sio[0])}")
    return None


def _scheduled_io(r: Reflector, handle: int, type_name: str) -> tuple[int, str] | None:
    """(address, type) of the ``ScheduledIo`` an I/O handle's ``Registration { shared: Arc<..> }``
    points at."""
    found = _find_field(r, type_name, "registration")
    shared = _path(r, handle + found[0], found[1], "shared", "ptr") if found is not None else None
    arc = r.mem.word(shared) if shared is not None else None
    inner = _arc_inner_type(r, found[1]) if found is not None else None
    data = _field(r, inner, "data") if inner is not None else None
    if not arc or data is None:
        return None
    return arc + data.offset, data.type_name


def _arc_inner_type(r: Reflector, registration: str) -> str | None:
    t = r.type(registration)
    shared = t.field("shared") if t is not None else None
    return shared_inner_type(r, shared.type_name) if shared is not None else None


def shared_inner_type(r: Reflector, rc: str) -> str | None:
    """An ``Arc<T>``'s ``ArcInner<T>`` type (an ``Rc<T>``'s ``RcInner<T>``): the pointee of
    its ``ptr: NonNull<..>``."""
    arc = r.type(rc)
    ptr = arc.field("ptr") if arc is not None else None
    nn = r.type(ptr.type_name) if ptr is not None else None
    raw = r.type(nn.fields[0].type_name) if nn is not None and nn.fields else None
    return raw.pointee if raw is not None and raw.pointee else None


def _waker_slots(r: Reflector, sio: tuple[int, str]) -> list[str]:
    out = []
    for slot, what in _WAKER_SLOTS:
        found = _find_field(r, sio[1], slot, max_depth=6)
        if found is None:
            continue
        v, ok = _enum_variant(r, sio[0] + found[0], found[1])
        if ok and v is not None and v.name == "Some":
            out.append(what)
    return out


# -- async-io, async-channel, async-lock (smol 2.0, async-std 1.13) ----------------------


def async_io_timer(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """``async_io::Timer { when: Option<Instant>, id_and_waker, period }``: time left."""
    f = _field(r, type_name, "when")
    if f is None:
        return None
    node = Node("leaf", "async_io::Timer", addr, type_name)
    v, ok = _enum_variant(r, addr + f.offset, f.type_name)
    if not ok:
        return missing_or_unreadable(r, addr, type_name, "Timer")
    if v is None:
        return node
    if v.name == "None" or not v.fields:
        node.detail = "never fires"
        return node
    return _deadline(r, node, addr + f.offset + v.fields[0].offset, v.fields[0].type_name) or \
        missing_or_unreadable(r, addr, type_name, "Timer deadline")


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


# -- one-field wrappers ------------------------------------------------------------------

_NOT_WRAPPERS = ("core::pin::Pin<", "alloc::boxed::Box<", "core::future::from_generator::GenFuture<")
NOTHING_IN_FLIGHT = "nothing in flight"  # the detail of a holder whose sub-future slot is empty


def wrapper(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """A future that wraps exactly one other future is shown as that future: tokio's task-dump
    ``trace::Root<F>``, ``coop::Coop<F>``, tracing's ``Instrumented<F>``, ``AssertUnwindSafe<F>``,
    futures' ``Fuse``/``Map``/``Then`` (enums: the variant in memory decides), whatever a
    runtime or library adds. Found by layout: a struct (or the enum's current variant) with
    exactly one field whose type leads to a future (a coroutine, a known combinator or
    leaf, or such a wrapper, by value or behind ``&``/``Box``/``Pin``). An enum variant with
    none (``Map::Complete``, ``Option::None`` of a ``Fuse``) is a finished future."""
    if type_name.startswith(_NOT_WRAPPERS):
        return None
    t = r.type(type_name)
    if t is None or t.kind not in ("struct", "enum"):
        return None
    if t.kind == "struct":
        if {f.name for f in t.fields} >= {"pointer", "vtable"}:
            return None  # Box<dyn Future>: the walker follows its vtable
        if (polled := _polled_channel(r, addr, t.fields, depth, seen)) is not None:
            return polled
        futs = [f for f in t.fields if _futurish(r, f.type_name)]
        if len(futs) > 1 and "::{closure_env#" in type_name:  # futures' join!: the closure is awaited
            return _poll_fn_leaf(r, addr, type_name, addr, type_name, depth, seen)
        if len(futs) != 1:
            return None
        child = r.child(addr + futs[0].offset, futs[0].type_name, depth - 1, seen)
        if len(t.fields) > 1 and child.kind == "leaf" and child.status == "completed" and \
                child.type_name.startswith("core::option::Option<"):
            # A holder, not a wrapper: a future with state of its own around an Option slot for
            # a sub-future (hyper's HTTP/1 dispatcher: `in_flight: Option<service future>`, None
            # between requests; an Option is no future, so its None is no future's end). Nothing
            # in flight, not the holder finished: shown as the holder, not as a finished `Option
            # (None)` (which also left the connection task waiting on its other select! branch
            # alone: "nothing can wake"). A one-field holder (futures' Fuse) stays finished.
            return Node("leaf", short_type(type_name), addr, type_name,
                        detail=f"{NOTHING_IN_FLIGHT}: its {futs[0].name} is {child.detail}")
        return child
    if not _futurish(r, type_name):
        return None
    v, ok = _enum_variant(r, addr, type_name)
    if not ok:
        return missing_or_unreadable(r, addr, type_name, short_type(type_name))
    if v is None:
        return None
    if (polled := _polled_channel(r, addr, v.fields, depth, seen)) is not None:
        return polled
    futs = [f for f in v.fields if _futurish(r, f.type_name)]
    if len(futs) == 1:
        return r.child(addr + futs[0].offset, futs[0].type_name, depth - 1, seen)
    if not futs:
        return Node("leaf", short_type(type_name), addr, type_name, status="completed", detail=v.name)
    return None


def unwrap(r: Reflector, addr: int, type_name: str) -> tuple[int, str]:
    """The future inside one-field wrapper structs (``trace::Root<F>``...), by value: where a
    runtime adapter's task root really starts (its header then names the user's future)."""
    for _ in range(4):
        t = r.type(type_name)
        if type_name in r.inv.layouts or t is None or t.kind != "struct" or type_name.startswith(_NOT_WRAPPERS):
            break
        futs = [f for f in t.fields if _futurish(r, f.type_name)]
        if len(futs) != 1 or r.type(futs[0].type_name) is not None and r.type(futs[0].type_name).kind == "pointer":
            break
        addr, type_name = addr + futs[0].offset, futs[0].type_name
    return addr, type_name


def _futurish(r: Reflector, type_name: str) -> bool:
    return type_fact(r, "_reflect_futurish", type_name, lambda: _is_futurish(r, type_name))


def _is_futurish(r: Reflector, type_name: str) -> bool:
    if type_name in r.inv.layouts:
        return True
    if any(type_name.startswith(prefix) for prefix, _ in DESCRIBERS if prefix) or type_name.startswith(FUTURE_OBJECTS):
        return True
    t = r.type(type_name)
    if t is None:
        return False
    if t.kind == "pointer":
        # references and Box (DWARF names a Box a pointer type); never raw pointers (an Arc's inner)
        return type_name.startswith(("&", "alloc::boxed::Box<")) and bool(t.pointee) and _futurish(r, t.pointee or "")
    if t.kind == "struct" and {f.name for f in t.fields} >= {"pointer", "vtable"}:
        # a dyn Future, not any dyn naming one (tower's boxed Service: `dyn CloneService<...,
        # Future=Pin<Box<dyn Future...>>>` is a service; axum's Router holds them)
        at = type_name.find("dyn ")
        return at >= 0 and type_name.startswith("core::future::future::Future<", at + 4)
    if type_name.startswith("alloc::boxed::Box<") and t.fields:
        from .node import _pointee

        pointee = _pointee(r, r.type(t.fields[0].type_name))
        return bool(pointee) and _futurish(r, pointee or "")
    if type_name.startswith("core::pin::Pin<") and t.fields:
        return _futurish(r, t.fields[0].type_name)
    if t.kind == "struct":
        return any(_futurish(r, f.type_name) for f in t.fields)
    if t.kind == "enum":
        return any(_futurish(r, f.type_name) for v in t.variants for f in v.fields)
    return False


def blocking_task(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """tokio's ``BlockingTask<F>``: a closure run on the blocking pool (``spawn_blocking``, or
    a multi-thread runtime's own worker threads), not a future: named after the closure."""
    m = re.match(r"tokio::runtime::blocking::task::BlockingTask<(.*)>$", type_name)
    closure = re.sub(r"::\{closure_env#\d+\}.*$", "", m.group(1)) if m else ""
    worker = "::worker::" in closure and closure.endswith("::launch")
    what = "runtime worker" if worker else closure or "?"
    # func is taken out (None) when a pool thread starts the closure: it runs, or ran, there
    t = r.type(type_name)
    f = t.field("func") if t is not None else None
    opt = r.type(f.type_name) if f is not None else None
    started = None
    if opt is not None and opt.kind == "enum" and opt.discr is not None:
        v = r.mem.u(addr + f.offset + opt.discr.offset, opt.discr.size)  # type: ignore[union-attr]
        variant = opt.variant_for(v) if v is not None else None
        started = variant.name == "None" if variant is not None else None
    detail = {True: "running on the blocking pool", False: "queued for the blocking pool"}.get(started, "")
    # The closure taken out means it runs: a BlockingTask that returned is dropped with its task.
    # Which pool thread runs it is not in tokio's memory (a stack scan could tell; not done).
    status = {True: "running", False: "not yet polled"}.get(started, "pending")
    return Node("leaf", f"tokio::task::spawn_blocking({what})", addr, type_name, status=status, detail=detail)


def pending(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    return Node("leaf", "core::future::pending", addr, type_name, detail="never completes")


# -- leaves that poll an I/O handle themselves ------------------------------------------------
# What a stream or leaf future that reads an I/O handle itself waits for.
#
# Such a leaf keeps no readiness future in memory: the handle's own ``poll_read`` /
# ``poll_write`` (or ``poll_readable``) registers the task's waker in the entry the handle
# shares with the runtime's I/O driver, and the driver takes it out when it wakes:
#
# * tokio: ``ScheduledIo { waiters: Mutex<Waiters { reader, writer, .. }> }``, behind the
#   handle's ``Registration { shared: Arc<ScheduledIo> }``;
# * async-io (smol, async-std): ``Source { registration: Registration { raw: fd }, state:
#   Mutex<[Direction; 2]> }`` (0 read, 1 write), behind ``Async { source: Arc<Source> }``;
#   ``Direction { waker }`` is what ``poll_readable`` stores, ``wakers`` (a slab) what the
#   ``readable()`` futures store.
#
# Met as: async-std's ``Lines<BufReader<&TcpStream>>`` (a connection's ``lines.next()``),
# tokio-tungstenite's ``SplitStream<WebSocketStream<TcpStream>>`` (behind futures' ``BiLock``,
# its ``AllowStd`` registering a waker proxy of its own) and its handshake's ``MidHandshake``.
#
# The entry is found in the leaf's memory: its fields by value and its references, Boxes and
# Arcs, only into types that can reach an entry (judged once per type, from the DWARF types);
# exactly one entry, or nothing is said (a leaf holding two sockets, or a socket and a channel
# end, waits on one of them, and memory does not say which).

TOKIO_ENTRY = "tokio::runtime::io::scheduled_io::ScheduledIo"
ASYNC_IO_ENTRY = "async_io::reactor::Source"
_DIRECTIONS = ("READABLE", "WRITABLE")  # async-io's Source.state, by index
MAX_VISITS = 400  # (address, type) pairs one search reads at most
MAX_POINTERS = 6  # pointers followed on one path
MAX_SLAB = 64  # a Direction's `wakers` entries read


def io_leaf(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """A leaf that polls an I/O handle it holds (by value or behind references): the set
    waker slots of the driver's entry say what its task waits for."""

    t = r.type(type_name)
    if t is None or t.kind not in ("struct", "enum") or type_name.startswith(_NOT_WRAPPERS) \
            or not reaches(r, type_name):
        return None  # a Pin or Box: the walker goes through it to what it holds
    if any(_futurish(r, f.type_name) for f in t.fields) or any(
            _futurish(r, f.type_name) for v in t.variants for f in v.fields):
        return None  # it holds a future of its own: what it awaits is that one's (the walk goes on)
    detail = io_detail(r, addr, type_name)
    return None if detail is None else Node("leaf", short_type(type_name), addr, type_name, detail=detail)


def io_detail(r: Reflector, addr: int, type_name: str) -> str | None:
    """What the one driver entry a value leads to says its task waits for (None: no entry,
    several, or one whose layout is not known). Also asked of a ``poll_fn`` closure's
    captures (async-io's ``optimistic``: ``&mut Pin<&mut Readable>``, an accept's wait)."""
    if not reaches(r, type_name):
        return None
    found = find_entries(r, addr, type_name)
    if len(found) != 1:
        return None
    (entry, etype), fd = next(iter(found.items()))
    if _other_wait(etype):
        return None  # a channel end: what it waits on is said where the walk meets it
    slots = waker_slots(r, entry, etype)
    if slots is None:
        return None
    what = f"waits for {'|'.join(slots)}" if slots else "no waker registered (woken)"
    on = "" if fd is None else f" on fd {fd}"
    kind = "ScheduledIo" if etype.startswith(TOKIO_ENTRY) else "async-io Source"
    return f"{what}{on}, {kind} 0x{entry:x}"


def reaches(r: Reflector, type_name: str) -> bool:
    """Whether a value of this type can lead to an I/O driver entry (by type alone)."""
    return type_fact(r, "_reflect_io_reach", type_name, lambda: type_name.startswith((TOKIO_ENTRY, ASYNC_IO_ENTRY))
                     or _other_wait(type_name) or any(reaches(r, n) for _, n in _next_types(r, type_name)))


def _other_wait(type_name: str) -> bool:
    """A channel end (describers.OBJECTS): a value holding one may wait there, not on its socket."""

    return type_name.startswith(tuple(p for p, _ in OBJECTS))


def _next_types(r: Reflector, type_name: str) -> list[tuple[int | None, str]]:
    """(offset, type) of what a value leads to: its fields (every variant's, for an enum) by
    value, or (None, pointee) for a reference, a Box or an Arc's pointer."""
    t = r.type(type_name)
    if t is None:
        return []
    if t.kind == "pointer":
        if t.pointee and (type_name.startswith(("&", "alloc::boxed::Box<"))
                          or t.pointee.startswith("alloc::sync::ArcInner<")):
            return [(None, t.pointee)]
        return []
    out = [(f.offset, f.type_name) for f in t.fields]
    for v in t.variants:
        out += [(f.offset, f.type_name) for f in v.fields]
    return out


def find_entries(r: Reflector, addr: int, type_name: str) -> dict[tuple[int, str], int | None]:
    """The driver entries reachable in memory from a value -> the fd of each when found."""

    out: dict[tuple[int, str], int | None] = {}
    fd: int | None = None
    stack = [(addr, type_name, 0)]
    visited: set[tuple[int, str]] = set()
    while stack and len(visited) < MAX_VISITS:
        at, tn, hops = stack.pop()
        if (at, tn) in visited or not reaches(r, tn):
            continue
        visited.add((at, tn))
        handle_fd = _fd(r, at, tn)
        fd = handle_fd if handle_fd is not None else fd
        if _other_wait(tn):
            out[(at, tn)] = None
            continue
        if tn.startswith((TOKIO_ENTRY, ASYNC_IO_ENTRY)):
            out[(at, tn)] = _source_fd(r, at, tn) if tn.startswith(ASYNC_IO_ENTRY) else fd
            continue
        t = r.type(tn)
        if t is None:
            continue
        if t.kind == "pointer":
            if hops < MAX_POINTERS and (p := r.mem.word(at)) and p < 1 << 47:
                stack += [(p, n, hops + 1) for _, n in _next_types(r, tn)]
            continue
        fields = list(t.fields)
        if t.kind == "enum":  # only the variant in memory
            v, ok = _enum_variant(r, at, tn)
            fields += list(v.fields) if ok and v is not None else []
        stack += [(at + f.offset, f.type_name, hops) for f in reversed(fields)]
    return out


def _fd(r: Reflector, addr: int, type_name: str) -> int | None:
    """The OS fd of a tokio I/O handle met by value (``Inventory.fd_offsets`` of ``&T``)."""
    off = r.inv.fd_offsets.get("&" + type_name)
    fd = r.mem.u(addr + off, 4) if off is not None else None
    return None if fd is None or fd >= 1 << 31 else fd


def _source_fd(r: Reflector, addr: int, type_name: str) -> int | None:

    at = _path(r, addr, type_name, "registration", "raw")
    fd = r.mem.u(at, 4) if at is not None else None
    return None if fd is None or fd >= 1 << 31 else fd


def waker_slots(r: Reflector, addr: int, type_name: str) -> list[str] | None:
    """The directions whose waker is set in a driver entry; None: its layout is not known."""

    if type_name.startswith(TOKIO_ENTRY):
        return _waker_slots(r, (addr, type_name))
    return _async_io_slots(r, addr, type_name)


def _async_io_slots(r: Reflector, addr: int, type_name: str) -> list[str] | None:

    found = _find_field(r, type_name, "state")
    arr = _find_field(r, found[1], "value", max_depth=3) if found is not None else None
    at = r.type(arr[1]) if arr is not None else None
    d = r.type(at.pointee or "") if at is not None and at.kind == "array" else None
    if found is None or arr is None or d is None or d.size <= 0:
        return None
    out = []
    for i, what in enumerate(_DIRECTIONS):
        base = addr + found[0] + arr[0] + i * d.size
        waker = d.field("waker")
        v, ok = _enum_variant(r, base + waker.offset, waker.type_name) if waker is not None else (None, False)
        set_ = ok and v is not None and v.name == "Some"
        wakers = d.field("wakers")
        entries = _find_field(r, wakers.type_name, "entries") if wakers is not None and not set_ else None
        items = _vec_items(r, base + wakers.offset + entries[0], entries[1]) if entries is not None else None
        if items is not None and items[2] is not None:
            data, n, el = items
            for k in range(min(n, MAX_SLAB)):
                e, ok = _enum_variant(r, data + k * el.size, el.name)
                slot = e.fields[0] if ok and e is not None and e.name == "Occupied" and e.fields else None
                w, ok = _enum_variant(r, data + k * el.size + slot.offset, slot.type_name) if slot else (None, False)
                if ok and w is not None and w.name == "Some":
                    set_ = True
                    break
        if set_:
            out.append(what)
    return out


DESCRIBERS: list[tuple[str, Describer]] = [
    ("tokio::future::poll_fn::PollFn<", poll_fn),
    ("core::future::poll_fn::PollFn<", poll_fn),
    ("futures_util::future::poll_fn::PollFn<", poll_fn),
    ("tokio::future::maybe_done::MaybeDone<", maybe_done),
    ("futures_util::future::maybe_done::MaybeDone<", maybe_done),
    ("futures_util::future::try_maybe_done::TryMaybeDone<", maybe_done),
    ("tokio::time::timeout::Timeout<", timeout),
    ("tokio::time::sleep::Sleep", sleep),
    ("tokio::runtime::task::join::JoinHandle<", join_handle),
    ("tokio::sync::batch_semaphore::Acquire", _pointer_field("tokio::sync::Semaphore::acquire", "semaphore",
                                                              "semaphore")),
    ("tokio::sync::notify::Notified", _pointer_field("tokio::sync::Notify::notified", "notify", "Notify")),
    ("tokio::sync::oneshot::Receiver<", oneshot_receiver),
    ("core::future::pending::Pending<", pending),
    ("futures_util::future::pending::Pending<", pending),
    ("futures_util::future::join_all::JoinAll<", join_all),
    ("futures_util::future::select::Select<", select),
    ("futures_util::stream::futures_unordered::FuturesUnordered<", futures_unordered),
    ("futures_util::stream::futures_ordered::OrderWrapper<", order_wrapper),
    ("futures_util::stream::stream::next::Next<", stream_next),
    ("futures_util::stream::stream::collect::Collect<", stream_next),
    ("tokio::task::yield_now::", yield_now),  # the YieldNow struct local to yield_now's body
    ("tokio::runtime::io::scheduled_io::Readiness", readiness),
    ("tokio_stream::stream_ext::next::Next<", stream_next),
    ("async_std::stream::stream::next::NextFuture<", stream_next),
    ("tokio_stream::stream_map::StreamMap<", stream_map),
    ("tokio::sync::broadcast::Recv<", broadcast_recv),
    ("tokio::runtime::blocking::task::BlockingTask<", blocking_task),
    ("async_io::Timer", async_io_timer),
    ("async_std::io::timeout::Timeout<", _branches("async_std::io::timeout", ("future", "value"), ("timeout", "deadline"))),
    ("async_std::future::timeout::TimeoutFuture<",
     _branches("async_std::future::timeout", ("future", "value"), ("delay", "deadline"))),
    ("futures_lite::future::Or<", _branches("futures_lite::future::or", ("future1", "first"), ("future2", "second"))),
    ("async_channel::Recv<", _by_ref("receiver", "async_channel::Receiver::recv", "channel")),
    ("async_channel::Send<", _by_ref("sender", "async_channel::Sender::send", "channel")),
    ("async_lock::mutex::Lock<", _by_ref("mutex", "async_lock::Mutex::lock", "Mutex", link=True)),
    ("async_lock::rwlock::futures::Read<", _by_ref("lock", "async_lock::RwLock::read", "RwLock")),
    ("async_lock::rwlock::futures::Write<", _by_ref("lock", "async_lock::RwLock::write", "RwLock")),
    ("", any_poll_fn),  # another crate's PollFn<closure> (h2's)
    ("", joined),  # a struct of MaybeDone slots (futures' Join, Join3.., TryJoin..)
    ("", io_borrow),  # a leaf future borrowing an I/O handle (tokio's io::util futures)
    ("", objects),  # channel ends met as leaves (not futures: not in _is_futurish)
    ("", stream_field),  # a future or stream polling the stream in its `stream` field
    ("", io_leaf),  # a leaf polling an I/O handle it holds: the driver entry's wakers
    ("", wrapper),  # last: any one-field wrapper future
]
