"""Render reflected trees, with the threads' running coroutines overlaid.

A coroutine's ``__state`` is only written when it suspends or returns, so a
coroutine that is running right now still shows its last suspend point. The
``Running`` overlay fixes that: for each stopped thread, the source frames at
its pc (inlined frames included: in release builds the running coroutine is
usually inlined into its parent's resume function) name a chain of async
functions; the matching chain of nodes in a tree is marked running, and the
innermost one shows the thread's current line instead of stale children.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.analysis.model import Frame, SourceLoc

from .walker import Node

_CLOSURE_SEG = re.compile(r"::\{[^{}]*\}+|::\{\{closure\}\}")


@dataclass(frozen=True, slots=True)
class Root:
    """A task to reflect: where its future is and what type it has."""

    addr: int
    type_name: str
    label: str = ""  # "#3" when the engine knows it
    origin: str = "observed"  # observed | stack | tokio runtime | join handle
    thread: int | None = None
    header: str = ""  # the task line: extra words ("root, thread 2")
    # the executor whose own list holds the task, when it runs on one thread (a tokio
    # LocalSet's shared state): the task lives on the thread that runs that executor
    owner: int | None = None


@dataclass(frozen=True, slots=True)
class Running:
    thread: int
    chain: tuple[str, ...]  # normalised async fn paths, outermost first
    loc: SourceLoc | None  # the innermost frame's line
    addr: int | None = None  # the outermost's self pointer, when the engine knows it
    fns: tuple[str, ...] = ()  # ``ident`` of each chain entry's function ("" unknown), same order


_GENERICS = re.compile(r"<[^<>]*>")
_NUMBERED = re.compile(r"::\{(async_fn|async_block|async_closure|coroutine)(?:_env)?#(\d+)\}")


def ident(name: str) -> str:
    """The one coroutine a resume function or a state machine is, "" when the name does not
    say: ``a::run::{async_fn#0}::{async_block#1}`` (the function) and
    ``a::run::{async_fn#0}::{async_block_env#1}`` (its type) are the same; generics dropped.
    ``norm`` says only which fn a coroutine belongs to: every async block of ``run`` norms
    to ``a::run``, so a thread inside one block's poll must not mark another block running
    (tk_sync: the block spawned at line 132, parked, was drawn running the block at 149)."""
    prev = None
    while prev != name:
        prev, name = name, _GENERICS.sub("", name)
    if _NUMBERED.search(name) is None:
        return ""
    return _NUMBERED.sub(lambda m: f"::{{{m.group(1)}#{m.group(2)}}}", name)


def is_coroutine(n: Node, name: str, fn: str = "") -> bool:
    """``n`` is the coroutine a chain entry names: its fn (``norm``) and, when both names carry
    it, its number (``ident``)."""
    if n.kind != "coroutine" or not same_fn(norm(n.label), name):
        return False
    own = ident(n.type_name) if fn else ""
    return not own or own == fn


_IMPL = re.compile(r"^\{impl#\d+\}$")


def same_fn(a: str, b: str) -> bool:
    """Two paths of one fn, ``{impl#N}`` (DWARF's name of an impl block) standing for the one
    segment a symbol's demangled name gives there (the impl's self type). Fact (axum's chat,
    release): the frame a pc is in, out of line, is named by its symbol,
    ``axum::extract::ws::WebSocketUpgrade<F>::on_upgrade::{{closure}}``; the coroutine by its
    DWARF type, ``axum::extract::ws::{impl#1}::on_upgrade::{async_block#0}<..>``."""
    if a == b:
        return True
    sa, sb = _segments(a), _segments(b)
    return len(sa) == len(sb) and all(x == y or _IMPL.match(x) or _IMPL.match(y) for x, y in zip(sa, sb))


def _segments(path: str) -> list[str]:
    """``a::T<U::V>::f`` -> ``[a, T<U::V>, f]``: split at the ``::`` outside generics."""
    out, depth, cur = [], 0, 0
    i = 0
    while i < len(path):
        c = path[i]
        depth += (c == "<") - (c == ">")
        if depth == 0 and path.startswith("::", i):
            out.append(path[cur:i])
            cur = i + 2
            i += 2
            continue
        i += 1
    out.append(path[cur:])
    return out


def norm(path: str) -> str:
    """``a::b::{async_block#0}<T>`` and ``a::b::{{closure}}`` -> ``a::b`` (generics dropped)."""
    s = re.sub(r"<.*>$", "", path)
    prev = None
    while prev != s:
        prev = s
        s = re.sub(r"::\{[^{}]*\}$|::\{\{[^{}]*\}\}$", "", s)
    return s


def running_from_frames(thread: int, frames: list[Frame], addr: int | None = None,
                        coroutines: list[bool] | None = None) -> Running | None:
    """The async frames at a pc (innermost first, from ``pc_to_frames``). ``coroutines``: which
    frames are coroutines, when the inventory says (``coroutine_frames``); else a closure's
    name is taken for one."""
    chain: list[str] = []
    fns: list[str] = []
    loc = None
    for i, f in enumerate(frames):
        sync = coroutines is not None and i < len(coroutines) and not coroutines[i]
        if "{" not in f.function or " as " in f.function or sync:  # not a coroutine
            if chain:
                break
            continue
        if not chain:
            loc = f.loc
        chain.append(norm(f.function))
        fns.append(ident(f.function))
        if not f.inlined:
            break  # only this physical frame's inlined chain is known from the pc
    if not chain:
        return None
    return Running(thread, tuple(reversed(chain)), loc, addr, tuple(reversed(fns)))


def coroutine_frames(frames: list[Frame], in_resume: bool, inlined_here: list[str]) -> list[bool]:
    """Which of the frames at a pc (innermost first) are coroutines: the physical one when the
    pc is in a resume function, an inlined one when an inlined coroutine of its fn holds the pc
    (``inlined_here``: their names; matched from the outermost frame in, a closure polled by a
    coroutine being inside it). Names cannot say: a legacy symbol names a closure inside an
    async fn ``f::{{closure}}::{{closure}}``, as it names an async block there. A plain closure
    is a sync function: tokio-tungstenite's server stopped in its `try_for_each` closure (at
    52), called from handle_connection's select at 69, showed handle_connection at 52."""
    out = [False] * len(frames)
    left = [norm(n) for n in inlined_here]
    for i in reversed(range(len(frames))):
        f = frames[i]
        if not f.inlined:
            out[i] = in_resume
            continue
        own = norm(f.function)
        hit = next((k for k, n in enumerate(left) if same_fn(n, own)), None)
        if hit is not None and "{" in f.function:
            out[i] = True
            del left[hit]
    return out


def _fn(run: Running, i: int) -> str:
    return run.fns[i] if i < len(run.fns) else ""


def overlay_matches(tree: Node, run: Running) -> list[tuple[Node, Node]]:
    """Every (start, innermost) where the chain of ``run`` is found in ``tree``."""
    starts = [n for n in tree.iter() if is_coroutine(n, run.chain[0], _fn(run, 0))
              and (run.addr is None or n.addr == run.addr)]
    out = []
    for start in starts:
        node: Node | None = start
        for i, name in enumerate(run.chain[1:], 1):
            node = _first_coroutine_below(node, name, _fn(run, i))
            if node is None:
                break
        if node is not None:
            out.append((start, node))
    return out


def mark_running(node: Node, run: Running) -> None:
    """The innermost coroutine at the pc: running there, at the pc's line; its state's
    awaitee is stale."""
    node.status = "running"
    node.detail = f"running on thread {run.thread}"
    node.loc = run.loc
    node.children = []


def _first_coroutine_below(node: Node, name: str, fn: str = "") -> Node | None:
    """The first pending coroutine of that name below node, else the first completed one:
    the thread's pc is in its code, so it runs; release builds store ``Returned`` into
    ``__state`` ahead of the last line's code (tokio_app's ``c`` inlined into ``worker``
    reads ``Returned`` at its last line, ``x + 1``)."""
    done = None
    stack = list(node.children)
    while stack:
        n = stack.pop(0)
        if n.kind == "coroutine":
            if is_coroutine(n, name, fn):
                if n.status != "completed":
                    return n
                done = done or n
            continue
        stack.extend(n.children)
    return done


def render(root: Root, tree: Node, show_completed: bool = True) -> list[str]:
    head = f"task {root.label + ' ' if root.label else ''}0x{root.addr:x}  {root.type_name}"
    extra = root.header or root.origin
    lines = [f"{head}  ({extra})", f"╼ {_line(tree)}"]
    _kids(tree, "", lines, show_completed)
    return lines


def _line(n: Node) -> str:
    text = n.label
    if n.branch and n.kind != "combinator":
        text = f"[{n.branch}] {text}"
    if n.kind == "coroutine" and n.status in ("pending", "running") and n.loc is not None:
        text += f" at {n.loc}"
    if n.detail:
        text += f" ({n.detail})"
    if n.status not in ("pending", "running"):
        text += f" [{n.status}]"
    return text


def _kids(n: Node, prefix: str, lines: list[str], show_completed: bool) -> None:
    kids = n.children
    for i, c in enumerate(kids):
        last = i == len(kids) - 1
        lines.append(f"{prefix}{'└╼ ' if last else '├╼ '}{_line(c)}")
        _kids(c, prefix + ("   " if last else "│  "), lines, show_completed)
