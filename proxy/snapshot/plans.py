"""Values derived once per program (its ``Inventory``), not once per node or per stop.

At 100,000 tasks the same few state-machine layouts are met hundreds of
thousands of times: what a layout implies (its resume functions, the parents
that store it inline, the live locals of each of its states) is computed once
and looked up after. An ``Inventory`` takes no attributes (slots), so the
values are kept here, keyed by the inventory object itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.analysis.model import Inventory

_PER_INVENTORY: dict[tuple[str, int], tuple[Inventory, Any]] = {}  # (what, id(inv)) -> (inv, value)


def per_inventory(what: str, inv: Inventory, make: Callable[[Inventory], Any]) -> Any:
    """``make(inv)``, made once per inventory (an id reused by a new inventory makes it again)."""
    got = _PER_INVENTORY.get((what, id(inv)))
    if got is None or got[0] is not inv:
        got = _PER_INVENTORY[what, id(inv)] = (inv, make(inv))
    return got[1]


def memo(what: str, inv: Inventory) -> dict[Any, Any]:
    """A dict kept per inventory, for values filled in as their keys are met."""
    return per_inventory("memo:" + what, inv, lambda _inv: {})  # type: ignore[no-any-return]


MAX_LOCAL = 256  # bytes of one live local searched for pointers (the wait-for graph)


def local_spans(inv: Inventory, layout: str, value: int | None) -> tuple[tuple[int, int], ...]:
    """(offset, bytes) of the live locals of ``layout`` in state ``value``: whole words, at most
    ``MAX_LOCAL`` each (one plan per (layout, state), not one per coroutine)."""
    spans = memo("local_spans", inv)
    key = (layout, value)
    got = spans.get(key)
    if got is None:
        lay = inv.layouts.get(layout)
        st = lay.state(value) if lay is not None and value is not None else None
        got = spans[key] = tuple((m.offset, min(m.size, MAX_LOCAL) // 8 * 8)
                                 for m in (st.locals if st is not None else ()) if m.size >= 8)
    return got


def resume_fns(inv: Inventory | None) -> dict[str, list[tuple[int, int]]]:
    """layout -> the (low, high) link-time ranges of its out-of-line resume functions."""
    if inv is None:
        return {}

    def make(inv: Inventory) -> dict[str, list[tuple[int, int]]]:
        got: dict[str, list[tuple[int, int]]] = {}
        for f in inv.resume_fns:
            if f.layout_name and f.low_pc:
                got.setdefault(f.layout_name, []).append((f.low_pc, f.high_pc))
        return got

    return per_inventory("resume", inv, make)  # type: ignore[no-any-return]


def parents_index(inv: Inventory) -> dict[str, list[tuple[str, int, int]]]:
    """child layout -> [(parent layout, state value, child offset in parent)] for inline awaits."""

    def make(inv: Inventory) -> dict[str, list[tuple[str, int, int]]]:
        idx: dict[str, list[tuple[str, int, int]]] = {}
        for lay in inv.layouts.values():
            for st in lay.states:
                a = st.awaitee
                if a is None:
                    continue
                child, off = a.type_name, a.offset
                t = inv.types.get(child)
                if child not in inv.layouts and t is not None and child.startswith(
                        "core::future::from_generator::GenFuture<") and t.fields:
                    child, off = t.fields[0].type_name, off + t.fields[0].offset  # rustc 1.63
                if child in inv.layouts:
                    idx.setdefault(child, []).append((lay.type_name, st.value, off))
        return idx

    return per_inventory("parents", inv, make)  # type: ignore[no-any-return]
