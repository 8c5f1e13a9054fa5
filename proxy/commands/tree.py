"""The pending-future tree of each task, in the style of tokio's task dumps.

    task #1 0x7ffff7c0a010  rt::a::{async_fn_env#0}  (root, thread 2)
    ╼ rt::a at src/main.rs:9
    └╼ rt::b at src/main.rs:5
       ├╼ rt::c at src/main.rs:2
       └╼ rt::d (running on thread 2)

Only pending futures are shown: finished tasks and completed or dropped
edges are left out (DESIGN.md §4, a tasktrace). A subtree deeper than
``MAX_DEPTH`` or a cycle (possible only with corrupt input) ends in `...`.
"""

from __future__ import annotations

from proxy.analysis.model import SourceLoc
from proxy.graph.engine import Engine
from proxy.graph.model import StateKind, Task

MAX_DEPTH = 64


def render_tree(engine: Engine, task: Task | None = None) -> str:
    if task is not None:
        tops = [task]
    else:
        tops = [t for t in engine.roots() if not t.finished]
    if not tops:
        return "no pending tasks"
    return "\n".join(_render_one(engine, t) for t in tops)


def _render_one(engine: Engine, top: Task) -> str:
    lines = [_header(top), f"╼ {_node(engine, top)}"]
    _children(engine, top, "", lines, {top.id}, 1)
    return "\n".join(lines)


def _header(t: Task) -> str:
    where = "root" if t.is_root else f"child of #{t.parent}"
    thread = f", thread {t.last_thread}" if t.last_thread is not None else ""
    gen = f" (generation {t.generation})" if t.generation else ""
    return f"task #{t.id} 0x{t.self_ptr:x}{gen}  {t.type_name}  ({where}{thread})"


def _node(engine: Engine, t: Task) -> str:
    kind = t.state.kind
    if kind is StateKind.RUNNING:
        loc = _running_await(engine, t)
        at = f" at {loc}" if loc is not None else ""
        return f"{t.path}{at} (running on thread {t.state.thread})"
    if kind is StateKind.UNRESUMED:
        return f"{t.path} not yet polled"
    loc = t.state.loc if kind is StateKind.SUSPENDED else None
    if loc is None:
        return f"{t.path} at ?" if kind is not StateKind.SUSPENDED else f"{t.path} suspended"
    return f"{t.path} at {loc}"


def _running_await(engine: Engine, t: Task) -> SourceLoc | None:
    """A running parent is at the .await of the child it is polling right now."""
    for edge in engine.children(t.id):
        child = engine.task(edge.child)
        if child is not None and child.state.kind is StateKind.RUNNING and edge.pending:
            return edge.loc
    return None


def _pending_children(engine: Engine, t: Task) -> list[Task]:
    out = []
    for edge in engine.children(t.id):
        child = engine.task(edge.child) if edge.pending else None
        if child is not None and not child.finished and child.parent == t.id:
            out.append(child)
    return out


def _children(engine: Engine, t: Task, prefix: str, lines: list[str], seen: set[int],
              depth: int) -> None:
    kids = _pending_children(engine, t)
    for i, child in enumerate(kids):
        last = i == len(kids) - 1
        branch = "└╼ " if last else "├╼ "
        if child.id in seen or depth >= MAX_DEPTH:
            lines.append(f"{prefix}{branch}{child.path} ...")
            continue
        lines.append(f"{prefix}{branch}{_node(engine, child)}")
        _children(engine, child, prefix + ("   " if last else "│  "), lines, seen | {child.id},
                  depth + 1)
