"""The pending-future tree of each task, in the style of tokio's task dumps.

    task #1 0x7ffff7c0a010  rt::a::{async_fn_env#0}  (root, thread 2)
    ╼ rt::a at src/main.rs:9
    └╼ rt::b at src/main.rs:5 (running on thread 2)
       └╼ rt::c at src/main.rs:2 (running on thread 2)

Rendered from the stop's snapshot (proxy.snapshot): the same names, states and
lines as ``bt``, ``tasks``, ``where`` and the JSON document. Only pending
futures are drawn; a completed branch of a combinator shows ``[completed]``.
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.snapshot.model import FutureNode, Snapshot, StateKind, Task


def render_tree(snap: Snapshot, task: Task | None = None, spawned: Callable[[Task], str] | None = None) -> str:
    """``spawned``: a task's spawning line ("-": none known), put in its heading."""
    tops = [task] if task is not None else snap.live()
    if not tops:
        return "no pending tasks"
    lines: list[str] = []
    for t in tops:
        lines += render_task(t, spawned)
    return "\n".join(lines)


def render_task(t: Task, spawned: Callable[[Task], str] | None = None) -> list[str]:
    at = spawned(t) if spawned is not None else "-"
    head = t.header + (f"; spawned at {at}" if at != "-" else "")
    lines = [f"task {t.label} 0x{t.addr:x}  {t.type_name}  ({head})", f"╼ {node_line(t.tree)}"]
    _kids(t.tree, "", lines)
    return lines


def node_line(n: FutureNode) -> str:
    text = n.name
    if n.branch and n.kind != "combinator":
        text = f"[{n.branch}] {text}"
    st = n.state
    if st is not None:
        if st.kind in (StateKind.RUNNING, StateKind.SUSPENDED) and st.loc is not None:
            text += f" at {st.loc}"
        if st.kind is StateKind.RUNNING:
            text += f" (running on thread {st.thread})" if st.thread is not None else " (running)"
    if n.detail:
        text += f" ({n.detail})"
    if st is not None and st.kind not in (StateKind.RUNNING, StateKind.SUSPENDED):
        text += " [completed]" if st.kind is StateKind.FINISHED else f" [{st.kind.value}]"
    return text


def _kids(n: FutureNode, prefix: str, lines: list[str]) -> None:
    kids = n.children
    for i, c in enumerate(kids):
        last = i == len(kids) - 1
        lines.append(f"{prefix}{'└╼ ' if last else '├╼ '}{node_line(c)}")
        _kids(c, prefix + ("   " if last else "│  "), lines)
