"""The wait-for graph of the stop as DOT text (pure): what ``monitor async waits`` prints.

A task waits on a resource (an edge task -> resource) that another task holds
(resource -> task); a resource nobody in the program holds but that some tasks
can wake names them (dashed). The tasks of a cycle from ``deadlocks``, and the
edges between them, are red; a task nothing can wake is orange. At most
``MAX_WAITS`` waits are drawn (the findings' first), the rest counted.
"""

from __future__ import annotations

import re

from proxy.pictures.stacks import ORANGE, RED, _dot_str, cycles
from proxy.snapshot.model import Resource, Snapshot

MAX_WAITS = 150
MAX_WAKERS = 3


def to_dot(snap: Snapshot) -> str:
    g = snap.waits
    names = {t.id: t.name for t in snap.tasks}
    red = {t for c in cycles(snap) for t in c}
    stuck = {t for f in g.findings if f.kind == "unwakeable" for t in f.tasks}
    flagged = {t for f in g.findings for t in f.tasks}
    waits = sorted(g.waits, key=lambda w: (w.task not in flagged, w.task))
    shown, rest = waits[:MAX_WAITS], waits[MAX_WAITS:]
    res = {w.resource for w in shown}
    holds = [h for h in g.holds if h.resource in res]
    tasks = {w.task for w in shown} | {h.task for h in holds}
    tasks |= {k for w in shown for k in [k for k in (w.wakers or ()) if k != w.task][:MAX_WAKERS]}
    lines = ["digraph waits {",
             '  graph [rankdir=LR, nodesep=0.25, ranksep=0.5, fontname="DejaVu Sans", fontsize=11];',
             '  node [fontname="DejaVu Sans", fontsize=10];',
             '  edge [fontname="DejaVu Sans", fontsize=9, color="#666666", arrowsize=0.6];']
    if not shown:
        lines.append('  empty [shape=box, label="no task waits on anything memory shows"];')
    for t in sorted(tasks):
        color = RED if t in red else ORANGE if t in stuck else "#4a6a8a"
        width = 2 if t in red else 1
        lines.append(f'  t{t} [shape=box, style="rounded", color="{color}", fontcolor="{color}", '
                     f'penwidth={width}, label="#{t} {_dot_str(names.get(t, "?"))}"];')
    for r in sorted(res, key=lambda r: (r.kind, r.addr)):
        lines.append(f'  {_rid(r)} [shape=ellipse, color="#888888", label="{_dot_str(str(r))}"];')
    for w in shown:
        hot = w.task in red
        attrs = f'color="{RED}", penwidth=2, ' if hot else ""
        lines.append(f'  t{w.task} -> {_rid(w.resource)} [{attrs}label="waits"];')
    holders: dict[Resource, set[int]] = {}
    for h in holds:
        holders.setdefault(h.resource, set()).add(h.task)
        hot = h.task in red and any(w.task in red and w.resource == h.resource for w in shown)
        attrs = f'color="{RED}", penwidth=2, ' if hot else ""
        lines.append(f'  {_rid(h.resource)} -> t{h.task} [{attrs}label="held by"];')
    woken: set[tuple[Resource, int]] = set()
    for w in shown:
        wakers = [k for k in (w.wakers or ()) if k != w.task and k in tasks and k not in holders.get(w.resource, ())]
        for k in wakers[:MAX_WAKERS]:
            if (w.resource, k) not in woken:
                woken.add((w.resource, k))
                lines.append(f'  {_rid(w.resource)} -> t{k} [style=dashed, label="woken by"];')
    if rest:
        lines.append(f'  more [shape=plaintext, label="... {len(rest)} more waits (monitor async waits)"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _rid(r: Resource) -> str:
    return f"r{re.sub(r'[^A-Za-z0-9]', '_', r.kind)}_{r.addr:x}"
