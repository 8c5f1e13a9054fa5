"""Render a `PsSnapshot`: `ps` (a table), `tree` (the pending-future trees),
the cycles (``cycle: A -> Mutex .. held by B -> ...``, as ``python -m asyncio``
prints them) and the JSON document. Pure: text in, text out."""

from __future__ import annotations

import json
from typing import Any

from proxy.reflect import table
from proxy.reflect.walker import Node

from .snapshot import PsSnapshot

COLUMNS = ("TASK", "ADDRESS", "ASYNC FN", "STATE", "AWAITS", "FOUND BY")


def header(snap: PsSnapshot) -> str:
    what = f"{snap.origin}" + (f" (pid {snap.pid})" if not snap.origin.startswith("process") else "")
    line = f"{what}: {len(snap.tasks)} task{'s' if len(snap.tasks) != 1 else ''}"
    if snap.stopped_ns is not None:
        copied = f", {snap.copied / 1e6:.1f} MB copied" if snap.copied is not None else ""
        line += f"; stopped {snap.stopped_ns / 1e6:.1f} ms{copied}"
    return line


def _footer(snap: PsSnapshot) -> list[str]:
    crash = snap.crash.lines() if snap.crash is not None else []
    return crash + [c.text() for c in snap.cycles] + [f"note: {n}" for n in snap.notes]


def render_ps(snap: PsSnapshot) -> str:
    rows = [(t.label, f"0x{t.addr:x}", t.name, t.state, t.awaits, t.found_by) for t in snap.tasks]
    body = table([COLUMNS, *rows]) if rows else "no tasks found"
    return "\n".join([header(snap), body, *_footer(snap)])


def render_tree(snap: PsSnapshot) -> str:
    lines = snap.tree_lines() or ["no tasks found"]
    return "\n".join([header(snap), *lines, *_footer(snap)])


def _node(n: Node) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": n.kind, "label": n.label, "address": f"0x{n.addr:x}"}
    if n.type_name:
        out["type"] = n.type_name
    if n.kind == "coroutine":
        out["status"] = n.status
    if n.loc is not None:
        out["location"] = str(n.loc)
    for key, value in (("detail", n.detail), ("branch", n.branch)):
        if value:
            out[key] = value
    if n.waits_on is not None:
        out["waits_on"] = f"0x{n.waits_on:x}"
    if n.holds:
        out["holds"] = [f"0x{m:x}" for m in n.holds]
    out["children"] = [_node(c) for c in n.children]
    return out


def document(snap: PsSnapshot) -> dict[str, Any]:
    return {
        "origin": snap.origin,
        "pid": snap.pid,
        "stopped_ms": None if snap.stopped_ns is None else round(snap.stopped_ns / 1e6, 3),
        "copied_bytes": snap.copied,
        "tasks": [{
            "task": t.label, "address": f"0x{t.addr:x}", "name": t.name, "type": t.type_name,
            "state": t.state, "awaits": t.awaits, "found_by": t.found_by, "tree": _node(t.tree),
        } for t in snap.tasks],
        "cycles": [{
            "tasks": [t.label if t.label != "-" else f"0x{t.addr:x}" for t in c.tasks],
            "names": [t.name for t in c.tasks],
            "resources": [f"0x{m:x}" for m in c.resources],
            "text": c.text(),
        } for c in snap.cycles],
        "crash": None if snap.crash is None else {
            "thread": snap.crash.thread, "signal": snap.crash.signal,
            "address": None if snap.crash.address is None else f"0x{snap.crash.address:x}",
            "async_backtrace": [{"name": n, "location": loc, "task": task} for n, loc, task in snap.crash.frames],
        },
        "notes": snap.notes,
    }


def render_json(snap: PsSnapshot) -> str:
    return json.dumps(document(snap), indent=2)
