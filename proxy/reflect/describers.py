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

from .walker import Node, _short, missing_or_unreadable

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
    f = _field(r, type_name, "f")
    if f is None:
        return None
    env_addr, env = addr + f.offset, f.type_name
    futs = _field(r, env, "futures")
    if futs is None:
        return Node("leaf", "PollFn", addr, type_name, detail=_short(env))
    got = _deref_chain(r, env_addr + futs.offset, futs.type_name)
    if got is None:
        return missing_or_unreadable(r, addr, type_name, "join!/select! futures")
    taddr, ttype = got
    tup = r.type(ttype)
    if tup is None:
        return Node("leaf", "PollFn", addr, type_name, detail=_short(ttype))
    dis = _field(r, env, "disabled")
    select = dis is not None
    mask = 0
    if select:
        p = r.mem.word(env_addr + dis.offset)
        m = r.mem.u(p, 1) if p is not None else None
        if m is None:
            return missing_or_unreadable(r, addr, type_name, "select! state")
        mask = m
    node = Node("combinator", "tokio::select!" if select else "tokio::join!", addr, type_name)
    for i, el in enumerate(tup.fields):
        if select and mask & (1 << i):
            child = Node("leaf", _label_of(r, el.type_name), taddr + el.offset, el.type_name, status="completed")
        else:
            child = r.child(taddr + el.offset, el.type_name, depth, seen)
        child.branch = f"branch {i}"
        node.children.append(child)
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


def timeout(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    value, delay = _field(r, type_name, "value"), _field(r, type_name, "delay")
    if value is None or delay is None:
        return None
    node = Node("combinator", "tokio::time::Timeout", addr, type_name)
    for f, name in ((value, "value"), (delay, "deadline")):
        c = r.child(addr + f.offset, f.type_name, depth, seen)
        c.branch = name
        node.children.append(c)
    return node


def _label_of(r: Reflector, type_name: str) -> str:
    from .walker import coroutine_path

    if type_name in r.inv.layouts:
        return coroutine_path(type_name)
    return _short(type_name)


# -- leaves ------------------------------------------------------------------------------


def sleep(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    at = _path(r, addr, type_name, "inner", "deadline", "std", "__0", "t")
    ts = r.type("std::sys::pal::unix::time::Timespec") or r.type("std::sys::unix::time::Timespec")
    node = Node("leaf", "tokio::time::Sleep", addr, type_name)
    if at is None or ts is None:
        return node
    sec_f, nsec_f = ts.field("tv_sec"), ts.field("tv_nsec")
    sec = r.mem.u(at + sec_f.offset, 8) if sec_f else None
    nsec = r.mem.u(at + nsec_f.offset, 4) if nsec_f else None
    if sec is None or nsec is None:
        return missing_or_unreadable(r, addr, type_name, "Sleep deadline")
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


def mpsc_recv(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """``recv``'s PollFn closure holds ``&mut &mut Receiver``: name the channel."""
    f = _field(r, type_name, "f")
    env = f.type_name if f else ""
    sf = _field(r, env, "self")
    if f is None or sf is None:
        return None
    got = _deref_chain(r, addr + f.offset + sf.offset, sf.type_name)
    if got is None:
        return missing_or_unreadable(r, addr, type_name, "mpsc recv")
    chan = r.mem.word(got[0])  # Receiver { chan: Rx { inner: Arc<Chan> } }: one pointer
    node = Node("leaf", "tokio::sync::mpsc::Receiver::recv", addr, type_name)
    if chan is None:
        return missing_or_unreadable(r, addr, type_name, "mpsc Receiver")
    node.detail = f"waits on mpsc channel 0x{chan:x}"
    return node


def pending(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    return Node("leaf", "core::future::pending", addr, type_name, detail="never completes")


DESCRIBERS: list[tuple[str, Describer]] = [
    ("tokio::future::poll_fn::PollFn<tokio::sync::mpsc::", mpsc_recv),
    ("tokio::future::poll_fn::PollFn<", poll_fn),
    ("tokio::future::maybe_done::MaybeDone<", maybe_done),
    ("futures_util::future::maybe_done::MaybeDone<", maybe_done),
    ("tokio::time::timeout::Timeout<", timeout),
    ("tokio::time::sleep::Sleep", sleep),
    ("tokio::runtime::task::join::JoinHandle<", join_handle),
    ("tokio::sync::batch_semaphore::Acquire", _pointer_field("tokio::sync::Semaphore::acquire", "semaphore",
                                                              "semaphore")),
    ("tokio::sync::notify::Notified", _pointer_field("tokio::sync::Notify::notified", "notify", "Notify")),
    ("tokio::sync::oneshot::Receiver<", oneshot_receiver),
    ("core::future::pending::Pending<", pending),
]
