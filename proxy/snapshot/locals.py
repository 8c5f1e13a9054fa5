"""A coroutine's live locals at its suspend point, decoded from memory at the stop.

The layout of the coroutine's state machine (the program's inventory; the
engine's when that one has no layout of the type) names the locals each suspend
state keeps; ``values`` decodes each from the coroutine's memory.
"""

from __future__ import annotations

from typing import Any

from .model import FutureNode, Local, Locals
from .values import ReadMemory, decode_value


def locals_of(node: FutureNode, inventory: Any, engine: Any, read: ReadMemory | None) -> Locals:
    """``node``'s locals (raises ``LookupError`` with the reason there are none to show)."""
    if read is None:
        raise LookupError("memory cannot be read in this session")
    inv = inventory
    layouts = getattr(inv, "layouts", {}) if inv is not None else {}
    if engine is not None and node.type_name not in layouts:
        inv = engine.catalog.inventory
        layouts = inv.layouts
    layout = layouts.get(node.type_name)
    if layout is None:
        raise LookupError(f"no layout for {node.name} (no debug info for its type)")
    value = node.state_value
    if value is None or value < 3:
        return Locals("", None, (), suspended=False, why=str(node.state))
    state = layout.state(value)
    if state is None:
        raise LookupError(f"{node.name} has no state {value}")
    types = getattr(inv, "types", None)
    values = tuple(Local(m.name, m.type_name, decode_value(m.type_name, m.size, node.addr + m.offset, read, types))
                   for m in state.locals)
    return Locals(state.name, state.loc, values)
