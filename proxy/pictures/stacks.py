"""Parallel stacks: every live task's logical stack merged into one graph (pure).

As Visual Studio's Parallel Stacks window draws threads and tasks: the tasks'
logical stacks (``Task.stack``, outermost coroutine first here) are merged into
a tree by their frames, a frame being the coroutine's name and the line it
runs or waits at, so a frame shared by many tasks is drawn once. A run of
frames that the same tasks pass through is one box; its header says how many
tasks go through it (and which, when few). The box where a task's stack ends
says what the task waits on (``Task.waits``) or the thread it runs on. The
tasks of each cycle from ``deadlocks`` (``WaitGraph.findings``) are drawn in
red, with a red edge from each waiting task's box to the box of the task
holding what it waits on.

Ten thousand tasks stay readable: tasks with the same stack are one path (the
groups ``tasks --group`` prints: the same coroutines at the same lines), and
past ``MAX_STACKS`` different stacks the least shared are folded into one box
that counts them.
"""

from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass, field

from proxy.snapshot.model import Snapshot, StateKind, Task

MAX_STACKS = 40  # different stacks drawn; the rest folded into one box
MAX_IDS = 4  # task ids listed in a box's header
MAX_WAITS = 4  # lines of what a box's tasks wait on
MAX_NAME = 90  # characters of a coroutine's name
RED = "#d62728"
ORANGE = "#e07000"

FrameKey = tuple[str, str]  # (coroutine name, "file:line" or "")


@dataclass(slots=True)
class Box:
    """A run of frames the same tasks pass through (outermost first)."""

    frames: list[FrameKey]
    tasks: list[Task] = field(default_factory=list)  # every task through this box
    ending: list[Task] = field(default_factory=list)  # the tasks whose stack ends here
    children: list[Box] = field(default_factory=list)
    id: str = ""


def short_loc(loc: object) -> str:
    """``file.rs:12`` (the last two parts of the path): the picture's lines stay short."""
    if loc is None:
        return ""
    text = str(loc)
    path, _, line = text.rpartition(":")
    parts = path.split("/")
    return f"{'/'.join(parts[-2:])}:{line}" if path else text


def task_frames(t: Task) -> tuple[FrameKey, ...]:
    """The task's logical stack, outermost first; a task with no stack (not yet polled)
    is its own name."""
    if t.stack:
        return tuple((f.name, short_loc(f.loc)) for f in reversed(t.stack))
    return ((t.name, short_loc(t.location)),)


@dataclass(slots=True)
class _Trie:
    tasks: list[Task] = field(default_factory=list)
    ending: list[Task] = field(default_factory=list)
    kids: dict[FrameKey, _Trie] = field(default_factory=dict)


def merge(tasks: list[Task], max_stacks: int = MAX_STACKS) -> tuple[list[Box], Box | None]:
    """The roots of the merged stacks, and the box of the folded ones (None: none folded)."""
    by_stack: dict[tuple[FrameKey, ...], list[Task]] = {}
    for t in tasks:
        by_stack.setdefault(task_frames(t), []).append(t)
    ordered = sorted(by_stack.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    kept, rest = ordered[:max_stacks], ordered[max_stacks:]
    root = _Trie()
    for frames, members in kept:
        node = root
        for key in frames:
            node = node.kids.setdefault(key, _Trie())
            node.tasks.extend(members)
        node.ending.extend(members)
    boxes = [_compress(key, node) for key, node in root.kids.items()]
    folded = None
    if rest:
        members = [t for _, ms in rest for t in ms]
        folded = Box([(f"{len(rest)} more stacks", "")], members, members)
    _number(boxes + ([folded] if folded else []))
    return boxes, folded


def _compress(key: FrameKey, node: _Trie) -> Box:
    """A box from ``node`` down while one child carries every task and none ends."""
    box = Box([key], node.tasks, node.ending)
    while not node.ending and len(node.kids) == 1:
        (k, only), = node.kids.items()
        if len(only.tasks) != len(node.tasks):
            break
        box.frames.append(k)
        node = only
        box.ending = node.ending
    box.children = [_compress(k, kid) for k, kid in node.kids.items()]
    return box


def _number(boxes: list[Box]) -> None:
    stack = list(reversed(boxes))
    n = 0
    while stack:
        b = stack.pop()
        n += 1
        b.id = f"s{n}"
        stack.extend(reversed(b.children))


def _walk(boxes: list[Box]) -> list[Box]:
    out, stack = [], list(reversed(boxes))
    while stack:
        b = stack.pop()
        out.append(b)
        stack.extend(reversed(b.children))
    return out


def cycles(snap: Snapshot) -> list[tuple[int, ...]]:
    return [f.tasks for f in snap.waits.findings if f.kind == "cycle"]


def to_dot(snap: Snapshot, *, max_stacks: int = MAX_STACKS, title: str = "") -> str:
    """The parallel stacks of the stop's live tasks as Graphviz DOT text: the executor
    on the left, each task's outermost coroutine next, the innermost on the right."""
    live = snap.live()
    roots, folded = merge(live, max_stacks)
    every = _walk(roots) + ([folded] if folded else [])
    red = {t for c in cycles(snap) for t in c}
    ends: dict[int, Box] = {t.id: b for b in every for t in b.ending}
    lines = ["digraph parallel_stacks {",
             '  graph [rankdir=LR, nodesep=0.2, ranksep=0.4, fontname="DejaVu Sans", fontsize=11'
             + (f', label="{_dot_str(title)}", labelloc=t' if title else "") + "];",
             '  node [shape=plain, fontname="DejaVu Sans", fontsize=10];',
             '  edge [color="#666666", arrowsize=0.6, fontname="DejaVu Sans", fontsize=9];',
             f'  executor [shape=box, style="rounded,filled", fillcolor="#eeeeee", color="#888888", '
             f'label="{len(live)} live task{"s" if len(live) != 1 else ""}\npolled by the executor"];']
    for b in every:
        lines.append(f"  {b.id} [label=<{_label(b, red)}>];")
    for b in roots + ([folded] if folded else []):
        lines.append(f"  executor -> {b.id};")
    for b in _walk(roots):
        for c in b.children:
            lines.append(f"  {b.id} -> {c.id};")
    lines += _wait_edges(snap, ends)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _wait_edges(snap: Snapshot, ends: dict[int, Box]) -> list[str]:
    """A red edge for each wait of a cycle (from the waiting task's box to the holder's),
    an orange dashed one from a task blocked behind another to that task's box."""
    out = []
    byid = {t.id: t for t in snap.live()}
    for cyc in cycles(snap):
        for i, a in enumerate(cyc):
            b = cyc[(i + 1) % len(cyc)]
            if a not in ends or b not in ends:
                continue
            waits = byid[a].waits if a in byid else ()
            what = str(waits[0].resource) if waits else "waits"
            out.append(f'  {ends[a].id} -> {ends[b].id} [color="{RED}", fontcolor="{RED}", penwidth=2, '
                       f'constraint=false, taillabel="#{a} waits: {_dot_str(what)}", labeldistance=6, labelangle=20];')
    for f in snap.waits.findings:
        if f.kind != "blocked" or f.tasks[0] not in byid:
            continue
        a = f.tasks[0]
        behind = sorted({k for w in byid[a].waits for k in (w.wakers or ()) if k != a})
        for b in behind[:3]:
            if a not in ends or b not in ends or ends[a] is ends[b]:
                continue
            out.append(f'  {ends[a].id} -> {ends[b].id} [color="{ORANGE}", fontcolor="{ORANGE}", style=dashed, '
                       f'constraint=false, label="#{a} blocked behind #{b}"];')
    return out


def _label(b: Box, red: set[int]) -> str:
    hot = any(t.id in red for t in b.ending)
    border = RED if hot else "#4a6a8a"
    head_bg = "#f6cccc" if hot else "#dbe5f0"
    n = len(b.tasks)
    ids = " ".join(f"#{t.id}" for t in b.tasks[:MAX_IDS]) + (" …" if n > MAX_IDS else "")
    rows = [f'<tr><td bgcolor="{head_bg}" align="left"><b>{n} task{"s" if n != 1 else ""}</b>'
            f'  <font point-size="9">{_esc(ids)}</font></td></tr>']
    for name, loc in b.frames:
        at = f' <font color="#555555">{_esc(loc)}</font>' if loc else ""
        rows.append(f'<tr><td align="left">{_esc(_cut(name))}{at}</td></tr>')
    for text, hot_line in _ending_lines(b.ending, red):
        color = RED if hot_line else "#7a4a00"
        rows.append(f'<tr><td align="left"><font color="{color}">{_esc(text)}</font></td></tr>')
    return (f'<table border="{2 if hot else 1}" color="{border}" cellborder="0" cellspacing="0" cellpadding="2">'
            + "".join(rows) + "</table>")


def _ending_lines(ending: list[Task], red: set[int]) -> list[tuple[str, bool]]:
    """What the tasks ending in a box wait on (or where they run), most shared first."""
    counts: Counter[tuple[str, bool]] = Counter()
    for t in ending:
        counts[(_waits_text(t), t.id in red)] += 1
    out = []
    for (text, hot), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_WAITS]:
        out.append((f"{n} × {text}" if n > 1 else text, hot))
    if len(counts) > MAX_WAITS:
        out.append((f"… {len(counts) - MAX_WAITS} more", False))
    return out


def _waits_text(t: Task) -> str:
    if t.state.kind is StateKind.RUNNING:
        return f"running on thread {t.state.thread}" if t.state.thread is not None else "running"
    if t.state.kind is StateKind.UNRESUMED:
        return "not yet polled"
    if t.waits:
        w = t.waits[0]
        many = len(t.waits) > 1
        # the address shown only with one task: many tasks each waiting on their own
        # resource are one line per kind
        return f"waits on {w.resource.kind}" + (f" (+{len(t.waits) - 1})" if many else "")
    leaf = _innermost_leaf(t)
    return f"awaits {leaf}" if leaf else t.state.word


def _innermost_leaf(t: Task) -> str | None:
    """The name of the deepest leaf future of the task's tree (a timer, a socket read): what a
    task that waits on no resource memory shows is waiting for."""
    best: tuple[int, str] | None = None
    stack = [(t.tree, 0)]
    while stack:
        n, depth = stack.pop()
        if n.kind == "leaf" and (best is None or depth > best[0]):
            best = (depth, n.name)
        stack.extend((c, depth + 1) for c in n.children)
    return best[1] if best is not None else None


def _cut(name: str) -> str:
    return name if len(name) <= MAX_NAME else name[:MAX_NAME - 1] + "…"


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _dot_str(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
