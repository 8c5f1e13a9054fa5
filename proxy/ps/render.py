"""Render a `PsSnapshot`: `ps` (the task table), `tree` (the pending-future
trees), then the deadlock findings (``cycle: ...`` as ``python -m asyncio``
prints them) and the crash; `--json` the graph document plus the one-shot
fields. The tables, trees and findings are the monitor commands' own
renderers (proxy.commands) over the same snapshot. Pure: text in, text out."""

from __future__ import annotations

import json
from typing import Any

from proxy.commands.document import graph_dict
from proxy.commands.tasks import render_tasks
from proxy.commands.tree import render_tree as tree_text
from proxy.commands.waits import render_deadlocks

from .snapshot import PsSnapshot


def header(snap: PsSnapshot) -> str:
    what = f"{snap.origin}" + (f" (pid {snap.pid})" if not snap.origin.startswith("process") else "")
    n = len(snap.snapshot.live())
    line = f"{what}: {n} task{'s' if n != 1 else ''}"
    if snap.stopped_ns is not None:
        copied = f", {snap.copied / 1e6:.1f} MB copied" if snap.copied is not None else ""
        line += f"; stopped {snap.stopped_ns / 1e6:.1f} ms{copied}"
    return line


def _footer(snap: PsSnapshot) -> list[str]:
    findings = render_deadlocks(snap.snapshot) if snap.snapshot.waits.findings else ""
    crash = snap.crash.lines() if snap.crash is not None else []
    return ([findings] if findings else []) + crash


def render_ps(snap: PsSnapshot) -> str:
    live = snap.snapshot.live()
    body = render_tasks(snap.snapshot, live, limit=len(live) + 1) if live else "no tasks found"
    return "\n".join([header(snap), body, *_footer(snap)])


def render_tree(snap: PsSnapshot) -> str:
    body = tree_text(snap.snapshot) if snap.snapshot.live() else "no tasks found"
    return "\n".join([header(snap), body, *_footer(snap)])


def document(snap: PsSnapshot) -> dict[str, Any]:
    doc = graph_dict(snap.snapshot)
    doc.update({
        "origin": snap.origin,
        "pid": snap.pid,
        "stopped_ms": None if snap.stopped_ns is None else round(snap.stopped_ns / 1e6, 3),
        "copied_bytes": snap.copied,
        "crash": None if snap.crash is None else {
            "thread": snap.crash.thread, "signal": snap.crash.signal,
            "address": None if snap.crash.address is None else f"0x{snap.crash.address:x}",
            "async_backtrace": [{"name": n, "location": loc.full if loc else "", "task": task}
                                for n, loc, task in snap.crash.frames],
        },
    })
    return doc


def render_json(snap: PsSnapshot) -> str:
    return json.dumps(document(snap), indent=2)
