"""Tasks as futures meet them: a JoinHandle's task (its header, the future it runs) and tokio's
BlockingTask (a closure on the blocking pool)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..node import missing_or_unreadable, Node
from .fields import _label_of, _path, _split_generics

if TYPE_CHECKING:
    from ..walker import Reflector


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
