"""Where a describer finds what it reads: fields and paths by name in the binary's DWARF types,
enum variants, vectors, generic arguments; and whether a type is a future (`_futurish`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..node import short_type, type_fact

if TYPE_CHECKING:
    from ..walker import Reflector


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
    from ..node import _pointee

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


def _arc_target(r: Reflector, addr: int, type_name: str, *names: str) -> int | None:
    """The heap address of the ``Arc`` reached by following ``names`` (its first word)."""
    at = _path(r, addr, type_name, *names)
    return r.mem.word(at) if at is not None else None


# channel ends of OBJECTS that are futures themselves (awaited directly)
FUTURE_OBJECTS = ("futures_channel::oneshot::Receiver<",)


def _label_of(r: Reflector, type_name: str) -> str:
    from ..node import coroutine_path

    m = re.match(r"core::future::from_generator::GenFuture<(.*)>$", type_name)  # rustc 1.63
    if m and m.group(1) in r.inv.layouts:
        type_name = m.group(1)
    if type_name in r.inv.layouts:
        return coroutine_path(type_name)
    return short_type(type_name)


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


_NOT_WRAPPERS = ("core::pin::Pin<", "alloc::boxed::Box<", "core::future::from_generator::GenFuture<")


def _futurish(r: Reflector, type_name: str) -> bool:
    return type_fact(r, "_reflect_futurish", type_name, lambda: _is_futurish(r, type_name))


def _is_futurish(r: Reflector, type_name: str) -> bool:
    if type_name in r.inv.layouts:
        return True
    if any(type_name.startswith(prefix) for prefix, _ in r.describers if prefix) or type_name.startswith(FUTURE_OBJECTS):
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
        from ..node import _pointee

        pointee = _pointee(r, r.type(t.fields[0].type_name))
        return bool(pointee) and _futurish(r, pointee or "")
    if type_name.startswith("core::pin::Pin<") and t.fields:
        return _futurish(r, t.fields[0].type_name)
    if t.kind == "struct":
        return any(_futurish(r, f.type_name) for f in t.fields)
    if t.kind == "enum":
        return any(_futurish(r, f.type_name) for v in t.variants for f in v.fields)
    return False
