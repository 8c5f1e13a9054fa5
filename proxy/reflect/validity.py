"""Is this memory a live value of that type? Checks for a coroutine found by scanning.

A scanned stack frame offers many places where the ``__state`` byte happens to name a
suspend point. When the awaitee is a zero-sized future (``std::future::pending``), the
walk of such a place reads nothing and is always clean, so the state byte alone decided.
Fact (tk_dump, trixie release, ``run`` parked in ``pending().await`` under
``block_on``): 2 to 12 places in block_on's frame passed, about one attach in eight, and
the root task was left out as ambiguous.

What a live suspended coroutine's saved locals must satisfy, whatever their types:

* a ``NonNull`` (and so every ``Box``, ``Arc``, ``Rc``, ``JoinHandle``, ...) or a thin
  reference is not null and points at readable memory, or is ``NonNull::dangling()``
  (a power of two below a page: an empty ``Vec``'s);
* an ``ArcInner``/``RcInner`` it points at is 8-aligned, with strong and weak counts of
  at least 1;
* a ``bool`` is 0 or 1.

Only struct and tuple fields are followed: an enum's payload depends on its discriminant
(``Option<Arc<_>>`` may be null), and a raw pointer may dangle. The checks for each
(layout, state) are computed once from the inventory's types.

Pure: memory comes from the caller's reader.
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.analysis.model import Inventory, State

NONNULL = ("core::ptr::non_null::NonNull<", "&")
COUNTED = ("alloc::sync::ArcInner<", "alloc::rc::RcInner<", "alloc::rc::RcBox<")
MAX_DEPTH = 8
MAX_CHECKS = 64
MAX_COUNT = 1 << 40  # a reference count past this is not one

Check = tuple[int, str]  # (offset from the coroutine, "bool" | "ptr" | "counted")


class Validity:
    def __init__(self, inv: Inventory) -> None:
        self.inv = inv
        self._checks: dict[tuple[str, int], tuple[Check, ...]] = {}

    def plausible(self, read: Callable[[int, int], int | None], addr: int, layout: str, state: State) -> bool:
        """Do the locals ``state`` keeps across its suspension hold valid values at addr?"""
        key = (layout, state.value)
        checks = self._checks.get(key)
        if checks is None:
            out: list[Check] = []
            for m in state.locals:
                self._collect(m.type_name, m.offset, out, 0)
            checks = self._checks[key] = tuple(out[:MAX_CHECKS])
        return all(_holds(read, addr + off, kind) for off, kind in checks)

    def _collect(self, type_name: str, offset: int, out: list[Check], depth: int) -> None:
        if depth > MAX_DEPTH or len(out) >= MAX_CHECKS:
            return
        if type_name == "bool":
            out.append((offset, "bool"))
            return
        t = self.inv.types.get(type_name)
        if type_name.startswith(NONNULL):
            if t is not None and t.kind == "pointer" and t.size == 8:
                out.append((offset, _pointee_kind(t.pointee)))
            elif t is not None and t.kind == "struct" and t.size == 8 and len(t.fields) == 1:
                # NonNull { pointer: *const T }
                ptr = self.inv.types.get(t.fields[0].type_name)
                if ptr is not None and ptr.kind == "pointer":
                    out.append((offset + t.fields[0].offset, _pointee_kind(ptr.pointee)))
            return
        if t is None or t.kind != "struct":
            return
        for f in t.fields:
            self._collect(f.type_name, offset + f.offset, out, depth + 1)


def _pointee_kind(pointee: str | None) -> str:
    return "counted" if pointee is not None and pointee.startswith(COUNTED) else "ptr"


def _holds(read: Callable[[int, int], int | None], at: int, kind: str) -> bool:
    if kind == "bool":
        return read(at, 1) in (0, 1)
    p = read(at, 8)
    if p is None or p == 0 or p >= 1 << 47:
        return False
    if kind == "ptr":
        if p < 4096:  # NonNull::dangling(): an empty Vec's or a Box<ZST>'s, its alignment
            return p & (p - 1) == 0
        return read(p, 1) is not None
    if p % 8:
        return False
    strong, weak = read(p, 8), read(p + 8, 8)
    return strong is not None and weak is not None and 1 <= strong < MAX_COUNT and 1 <= weak < MAX_COUNT
