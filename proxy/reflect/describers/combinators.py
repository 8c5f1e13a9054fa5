"""Futures made of futures: `poll_fn` closures (join!, select!), MaybeDone slots, join_all,
futures' Select and FuturesUnordered, timeouts, one-field wrappers; and the leaves that
wait for nothing of their own (pending, yield_now)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..node import missing_or_unreadable, Node, short_type
from .fields import (
    _deref_chain, Describer, _enum_variant, _field, _futurish, _held_type, _label_of, MAX_LISTED,
    _NOT_WRAPPERS, _path,
)
from .io import io_detail
from .objects import object_detail, _polled_channel

if TYPE_CHECKING:
    from ..walker import Reflector


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


def pending(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    return Node("leaf", "core::future::pending", addr, type_name, detail="never completes")
