"""Expected pending-future trees, kept beside each modern-corpus program (``<program>.tree``).

File format (one block per task, ``#`` starts a comment line)::

    task tk_dump::foo
      tk_dump::foo @ foo -> bar
        tk_dump::bar @ bar -> join
          tokio::join!
            tk_dump::buz @ buz -> baz
              ... tokio::time::Sleep ~ min left

* Two spaces of indent per level: a line is a child of the closest line above
  it with less indent. ``... X`` matches ``X`` anywhere below the parent
  (runtime plumbing between them is allowed: an executor's block, a Mutex's
  ``lock`` coroutines).
* ``NAME`` matches a node whose label, with generic arguments dropped, is NAME
  (``*``: any node).
* ``NAME @ P -> C``: a coroutine suspended at the line of the source's await
  marker ``// await: P -> C`` (the ``.await`` line the tree must show); for a
  ``join``/``select`` marker, a line inside the macro's own source file is
  taken too (``MACRO_FILES``).
* ``NAME ~ TEXT``: the node's detail contains TEXT (``min left``, ``held by``).
* ``task X``: a task whose tree holds a node matching the block's first line
  (named X for the reader and the failure message).

A tree matches when every block's first line matches some node of some
rendered task tree and, below it, each expected child matches a distinct
actual child (descendant for ``...``), recursively. Extra actual nodes are
fine: the file says what must be there, not everything there is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from proxy.reflect.node import short_type


@dataclass
class Actual:
    """One node of a rendered tree (``monitor async tree``)."""

    label: str
    file: str | None
    line: int | None
    detail: str
    text: str
    children: list[Actual] = field(default_factory=list)

    def iter(self):  # type: ignore[no-untyped-def]
        yield self
        for c in self.children:
            yield from c.iter()


@dataclass
class Expected:
    name: str
    lines: tuple[int, ...] | None  # the await marker's lines (None: any)
    marker: str | None
    detail: str | None
    anywhere: bool
    children: list[Expected] = field(default_factory=list)
    text: str = ""


_NODE = re.compile(r"^(?:\[[^\]]*\] )?(?P<label>.+?)(?: at (?P<file>\S+):(?P<line>\d+))?(?: \((?P<detail>.*)\))?"
                   r"(?: \[(?P<status>[^\]]*)\])?$")


def short(label: str) -> str:
    """A label without generic arguments, an async block or closure without its number or
    line: ``tokio::sync::mutex::{impl#10}::lock``, ``axum_svc::run::{async_block}``."""
    return re.sub(r"\{async_(block|closure)[#@]\d+\}", r"{async_\1}", short_type(label))


def parse_rendered(text: str) -> list[tuple[str, Actual]]:
    """(task header line, root node) per task of a rendered tree."""
    tasks: list[tuple[str, Actual]] = []
    stack: list[tuple[int, Actual]] = []
    header = ""
    for raw in text.splitlines():
        if raw.startswith("task "):
            header = raw
            continue
        at = raw.find("╼ ")
        if at < 0:
            continue
        depth = (at + 2) // 3
        m = _NODE.match(raw[at + 2:])
        if m is None:
            continue
        node = Actual(m["label"], m["file"], int(m["line"]) if m["line"] else None, m["detail"] or "", raw)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            stack[-1][1].children.append(node)
        else:
            tasks.append((header, node))
        stack.append((depth, node))
    return tasks


def parse_expected(text: str, await_lines) -> list[tuple[str, Expected]]:  # type: ignore[no-untyped-def]
    """Blocks of a ``.tree`` file; ``await_lines(parent, child)`` -> the marker's lines."""
    blocks: list[tuple[str, Expected]] = []
    stack: list[tuple[int, Expected]] = []
    task = ""
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if raw.startswith("task "):
            task, stack = raw[5:].strip(), []
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        body = raw.strip()
        anywhere = body.startswith("... ")
        body = body[4:] if anywhere else body
        detail = None
        if " ~ " in body:
            body, detail = body.split(" ~ ", 1)
        marker = None
        lines = None
        if " @ " in body:
            body, marker = body.split(" @ ", 1)
            parent, child = (s.strip() for s in marker.split("->"))
            lines = tuple(await_lines(parent, child))
            if not lines:
                raise ValueError(f"no await marker {marker!r} for {body!r}")
        node = Expected(body.strip(), lines, marker, detail, anywhere, text=raw.strip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if stack:
            stack[-1][1].children.append(node)
        else:
            blocks.append((task, node))
        stack.append((indent, node))
    return blocks


# An await inside tokio's/futures' join!/select! macros: DWARF puts the suspend point in
# the macro's own file (tokio's macros/join.rs:162), not the user's line of the macro call.
MACRO_FILES = ("join.rs", "select.rs", "try_join.rs", "join_mod.rs", "select_mod.rs")


def _fits(e: Expected, a: Actual) -> bool:
    if e.name != "*" and short(a.label) != short(e.name):
        return False
    in_macro = a.file is not None and a.file.rsplit("/", 1)[-1] in MACRO_FILES and \
        e.marker is not None and e.marker.split("->")[-1].strip() in ("join", "select")
    if e.lines is not None and a.line not in e.lines and not in_macro:
        return False
    return e.detail is None or e.detail in a.detail


def _match(e: Expected, a: Actual) -> list[str]:
    """Why ``a`` does not match ``e`` (empty: it does), children included."""
    if not _fits(e, a):
        return [f"{e.text!r} != {a.text.strip()!r}"]
    used: set[int] = set()
    misses: list[str] = []
    for ec in e.children:
        pool = [n for n in a.iter() if n is not a] if ec.anywhere else a.children
        found = None
        for n in pool:
            if id(n) in used:
                continue
            if not _match(ec, n):
                found = n
                break
        if found is None:
            best = [why for n in pool if _fits(ec, n) for why in _match(ec, n)]
            misses.append(f"under {a.text.strip()!r}: no {ec.text!r}" + (f" ({best[0]})" if best else ""))
        else:
            used.add(id(found))
    return misses


def missing(expected: list[tuple[str, Expected]], rendered: str) -> list[str]:
    """Every expected block not found in the rendered tree, with the reason."""
    tasks = parse_rendered(rendered)
    out = []
    for name, block in expected:
        candidates = [n for _, root in tasks for n in root.iter() if _fits(block, n)]
        if any(not _match(block, n) for n in candidates):
            continue
        if not candidates:
            out.append(f"task {name}: no node {block.text!r}")
        else:
            out.append(f"task {name}: " + "; ".join(_match(block, candidates[0])))
    return out


def load(path: Path, await_lines) -> list[tuple[str, Expected]]:  # type: ignore[no-untyped-def]
    return parse_expected(path.read_text(), await_lines)
