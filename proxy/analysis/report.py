"""``asyncrsp inspect PROGRAM [--json] [--tree]``: a program's async structure, without running it.

Text output: one block per coroutine layout (async fn / block / closure),
its resume function if one survives as code, and its states with the
``.await`` lines. ``--tree`` prints the static await tree instead: which
coroutine awaits which, read from the ``__awaitee`` types (a ``GenFuture<ENV>``
awaitee of rustc 1.63 counts as ENV).

JSON output (``--json``), stable shape, version 1::

    {
      "format": "asyncrsp-inventory", "version": 1,
      "path": str, "build_id": str | null, "pie": bool, "entry": int,
      "warnings": [str],
      "coroutines": [                       # sorted by layout name
        {
          "name": str,                      # e.g. "nested::c::{async_fn#0}"
          "layout": str | null,             # e.g. "nested::c::{async_fn_env#0}"
          "size": int | null, "state_offset": int | null, "state_size": int | null,
          "states": [{"value": int, "name": str, "loc": "file:line" | null,
                      "awaitee": {"name", "offset", "size", "type"} | null,
                      "locals": [{"name", "offset", "size", "type"}]}],
          "resume_fns": [{"low_pc": int, "high_pc": int, "symbol": str, "kind": str,
                          "era": str, "decl": "file:line" | null, "rets": [int],
                          "other_exits": [int], "self_in": str}],
          "inlined": [{"parent_low_pc": int, "call_loc": "file:line" | null,
                       "ranges": [[int, int]]}]
        }
      ],
      "await_edges": [{"parent": str, "child": str, "state": str, "loc": "file:line" | null}]
    }

Addresses are link-time integers. With ``--json --tree`` the document is the same.
"""

from __future__ import annotations

import json
import re
from typing import Any, TextIO

from .errors import AnalysisError
from .inventory import build_inventory
from .model import Inventory, Layout, Member, State

FORMAT_VERSION = 1
_GENFUTURE = re.compile(r"^(?:core::future::from_generator::)?GenFuture<(.*)>$")


def inspect_main(path: str, *, as_json: bool, tree: bool, out: TextIO, progress: TextIO | None = None) -> int:
    """`progress`: where a cold analysis shows its progress, when it is a terminal."""
    try:
        inv = build_inventory(path, progress=progress)
    except AnalysisError as e:
        out.write(f"asyncrsp inspect: {e}\n")
        return 1
    if as_json:
        json.dump(to_json(inv), out, indent=2, sort_keys=False)
        out.write("\n")
    elif tree:
        out.write(render_tree(inv))
    else:
        out.write(render_text(inv))
    return 0


def coroutine_name(layout_name: str) -> str:
    return layout_name.replace("_env#", "#")


def awaitee_layout(inv: Inventory, m: Member | None) -> str | None:
    """The layout an awaitee is, when it is a known coroutine (through GenFuture too)."""
    if m is None:
        return None
    t = m.type_name
    g = _GENFUTURE.match(t)
    if g:
        t = g.group(1)
    return t if t in inv.layouts else None


def await_edges(inv: Inventory) -> list[tuple[str, str, State]]:
    edges = []
    for name, layout in sorted(inv.layouts.items()):
        for st in layout.states:
            child = awaitee_layout(inv, st.awaitee)
            if child is not None:
                edges.append((name, child, st))
    return edges


# -- text --------------------------------------------------------------------------------------

def render_text(inv: Inventory) -> str:
    lines = [f"{inv.path}: {len(inv.layouts)} coroutine layouts, {len(inv.resume_fns)} resume functions"
             f" as code, {len(inv.inlined)} inlined"]
    lines += [f"warning: {w}" for w in inv.warnings]
    fns_by_layout: dict[str | None, list[Any]] = {}
    for f in inv.resume_fns:
        fns_by_layout.setdefault(f.layout_name, []).append(f)
    for name, layout in sorted(inv.layouts.items()):
        lines.append("")
        lines.append(f"{coroutine_name(name)}  ({layout.size} bytes, state u{8 * layout.state_size} at +{layout.state_offset})")
        for f in fns_by_layout.get(name, []):
            lines.append(f"  resume {f.low_pc:#x}..{f.high_pc:#x} {f.era.value}, {len(f.rets)} ret(s),"
                         f" {len(f.other_exits)} other exit(s), self in {f.self_in}")
        if name not in fns_by_layout:
            lines.append("  (no resume function as code: inlined)")
        lines += _state_lines(layout)
    no_layout = fns_by_layout.get(None, [])
    if no_layout:
        lines.append("")
        lines.append("resume functions without a layout (no type information):")
        lines += [f"  {f.name} {f.low_pc:#x}..{f.high_pc:#x}, {len(f.rets)} ret(s)" for f in no_layout]
    return "\n".join(lines) + "\n"


def _state_lines(layout: Layout) -> list[str]:
    out = []
    for st in layout.states:
        loc = f" at {st.loc}" if st.loc else ""
        aw = f"  awaits {st.awaitee.type_name} @+{st.awaitee.offset}" if st.awaitee else ""
        out.append(f"  {st.value:>3} {st.name}{loc}{aw}")
        for m in st.locals if st.suspend_index is not None else ():
            out.append(f"        {m.name}: {m.type_name} @+{m.offset} ({m.size} bytes)")
    return out


def render_tree(inv: Inventory) -> str:
    edges = await_edges(inv)
    children: dict[str, list[tuple[str, State]]] = {}
    awaited: set[str] = set()
    for parent, child, st in edges:
        children.setdefault(parent, []).append((child, st))
        awaited.add(child)
    roots = sorted(n for n in inv.layouts if n not in awaited)
    lines: list[str] = []
    for r in roots:
        lines.append(coroutine_name(r))
        _tree_lines(r, children, "", lines, {r})
    return "\n".join(lines) + "\n"


def _tree_lines(node: str, children: dict[str, list[tuple[str, State]]], prefix: str,
                lines: list[str], path: set[str]) -> None:
    kids = children.get(node, [])
    for i, (child, st) in enumerate(kids):
        last = i == len(kids) - 1
        loc = f" at {st.loc}" if st.loc else ""
        cyc = " (recursive)" if child in path else ""
        lines.append(f"{prefix}{'└╼' if last else '├╼'} {coroutine_name(child)}{loc} [{st.name}]{cyc}")
        if not cyc:
            _tree_lines(child, children, prefix + ("   " if last else "│  "), lines, path | {child})


# -- JSON ----------------------------------------------------------------------------------------

def _member_json(m: Member) -> dict[str, Any]:
    return {"name": m.name, "offset": m.offset, "size": m.size, "type": m.type_name}


def to_json(inv: Inventory) -> dict[str, Any]:
    coroutines: dict[str, dict[str, Any]] = {}

    def entry(layout_name: str | None, name: str) -> dict[str, Any]:
        key = layout_name or name
        if key not in coroutines:
            lay = inv.layouts.get(layout_name) if layout_name else None
            coroutines[key] = {
                "name": coroutine_name(layout_name) if layout_name else name,
                "layout": layout_name,
                "size": lay.size if lay else None,
                "state_offset": lay.state_offset if lay else None,
                "state_size": lay.state_size if lay else None,
                "states": [_state_json(s) for s in lay.states] if lay else [],
                "resume_fns": [],
                "inlined": [],
            }
        return coroutines[key]

    for name in inv.layouts:
        entry(name, coroutine_name(name))
    for f in inv.resume_fns:
        entry(f.layout_name, f.name)["resume_fns"].append({
            "low_pc": f.low_pc, "high_pc": f.high_pc, "symbol": f.symbol, "kind": f.kind.value,
            "era": f.era.value, "decl": f.decl.full if f.decl else None, "rets": list(f.rets),
            "other_exits": list(f.other_exits), "self_in": f.self_in,
        })
    for c in inv.inlined:
        entry(c.layout_name, c.name)["inlined"].append({
            "parent_low_pc": c.parent_low_pc, "call_loc": c.call_loc.full if c.call_loc else None,
            "ranges": [list(r) for r in c.ranges],
        })
    return {
        "format": "asyncrsp-inventory",
        "version": FORMAT_VERSION,
        "path": inv.path,
        "build_id": inv.build_id,
        "pie": inv.pie,
        "entry": inv.entry,
        "warnings": list(inv.warnings),
        "coroutines": [coroutines[k] for k in sorted(coroutines)],
        "await_edges": [
            {"parent": coroutine_name(p), "child": coroutine_name(c), "state": st.name,
             "loc": st.loc.full if st.loc else None}
            for p, c, st in await_edges(inv)
        ],
    }


def _state_json(s: State) -> dict[str, Any]:
    return {
        "value": s.value, "name": s.name, "loc": s.loc.full if s.loc else None,
        "awaitee": _member_json(s.awaitee) if s.awaitee else None,
        "locals": [_member_json(m) for m in s.locals],
    }
