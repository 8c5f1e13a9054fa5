"""One name and one line per coroutine, whatever found it.

* An async fn is its path: ``tokio_app::c`` (the state machine
  ``tokio_app::c::{async_fn_env#0}``, the resume function
  ``tokio_app::c::{async_fn#0}`` and its legacy ``{{closure}}`` symbol all say
  the same). Generic arguments stay: they tell two instances apart.
* An async block is the block inside its function at its line:
  ``tokio_app::select_join::{async_block@62}`` (its number alone,
  ``{async_block#0}``, says nothing to a reader; the line is the block's
  Unresumed variant's line, where the block starts).
* An await inside ``join!``/``select!`` carries the macro's own file:line in
  DWARF (tokio's ``select.rs:553``); it is shown at the macro's call in the
  coroutine's own file (``user_line``): the one line between the coroutine's
  first line and its closing brace that calls that macro. When the source is
  not readable here, or the call is not unique, the DWARF line stays.
* A parent's line while it polls a child is the user's ``.await``: the
  suspend state of the parent's layout that holds the child's type (the
  awaitee, or a local such as ``join!``'s tuple of ``MaybeDone<child>``), not
  the return address (inside tokio's ``maybe_done.rs`` for ``join!``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

from proxy.analysis.model import Inventory, Layout, SourceLoc

_ENV = re.compile(r"::\{(async_fn|async_block|async_closure|coroutine)(?:_env)?#(\d+)\}")
_CLOSURE = re.compile(r"::\{\{closure\}\}|::\{closure#\d+\}")


@lru_cache(maxsize=1 << 14)  # a few layouts named once each, not once per coroutine
def display_name(name: str, line: int | None = None) -> str:
    """A state-machine type or a resume function's name -> the display name."""
    return _display(name, line, display_name)


def _display(name: str, line: int | None, arg_name: Callable[[str], str]) -> str:
    """The display name; ``arg_name`` names each generic argument of the coroutine's own
    segment (coroutines there are named the same way: ``spawn_and_log_error::{async_block@180}
    <app::connection_loop>``). Only a segment outside ``<..>`` is the coroutine's own: a
    coroutine type among the generic arguments is another (async-std's
    ``spawn_and_log_error::{async_block_env#0}<app::connection_loop::{async_fn_env#0}>``)."""
    if name.startswith("core::future::from_generator::GenFuture<") and name.endswith(">"):
        name = name[len("core::future::from_generator::GenFuture<"):-1]  # rustc 1.63's wrapper
    m = _own_env(name)
    if m is None:  # a wrapper type: the coroutines among its arguments (SupportTaskLocals<F>)
        i = name.find("<")
        if i > 0 and _closes_at_end(name, i) and _ENV.search(name, i):
            return _CLOSURE.sub("", name[:i]) + _display_args(name[i:], arg_name)
        return _CLOSURE.sub("", name)
    head, generics = name[:m.start()], _display_args(name[m.end():], arg_name)
    head = re.sub(r"::\{async_fn#\d+\}", "", head)
    if m.group(1) == "async_fn":
        return head + generics
    where = f"@{line}" if line is not None else f"#{m.group(2)}"
    return f"{head}::{{{m.group(1)}{where}}}{generics}"


def _own_env(name: str) -> re.Match[str] | None:
    """The coroutine's own segment: the last one outside ``<..>``."""
    m = None
    for found in _ENV.finditer(name):
        if _depth(name, found.start()) == 0:
            m = found
    return m


def _depth(name: str, end: int) -> int:
    """How many ``<`` of a type name are open at ``end`` (``->`` is no bracket)."""
    depth = 0
    for i in range(end):
        c = name[i]
        if c == "<":
            depth += 1
        elif c == ">" and (i == 0 or name[i - 1] != "-"):
            depth -= 1
    return depth


def _closes_at_end(name: str, i: int) -> bool:
    """The ``<`` at ``i`` is closed by the name's last character."""
    depth = 0
    for j in range(i, len(name)):
        if name[j] == "<":
            depth += 1
        elif name[j] == ">" and name[j - 1] != "-":
            depth -= 1
            if depth == 0:
                return j == len(name) - 1
    return False


def _display_args(generics: str, arg_name: Callable[[str], str]) -> str:
    """``<A, B>`` (what follows a coroutine's segment) with each argument that names a
    coroutine named by ``arg_name``; anything else as it is."""
    if not (generics.startswith("<") and generics.endswith(">")) or not _ENV.search(generics):
        return generics
    args, depth, start = [], 0, 1
    for i, c in enumerate(generics[1:-1], 1):
        if c == "<":
            depth += 1
        elif c == ">" and generics[i - 1] != "-":
            depth -= 1
        elif c == "," and depth == 0:
            args.append(generics[start:i].strip())
            start = i + 1
    args.append(generics[start:-1].strip())
    return "<" + ", ".join(arg_name(a) if _ENV.search(a) else a for a in args) + ">"


def layout_name(inv: Inventory | None, layout: str) -> str:
    lay = inv.layouts.get(layout) if inv is not None else None
    return _display(_outer_blocks(inv, layout), _start_line(lay),
                    (lambda arg: layout_name(inv, arg)) if inv is not None else display_name)


_OUTER_BLOCK = re.compile(r"::\{async_block#(\d+)\}(?=::)")


def _outer_blocks(inv: Inventory | None, layout: str) -> str:
    """A block inside a block: the outer one by its line too. rustc names a block's state
    machine inside another block ``main::{async_block#0}::{async_block_env#1}`` (the outer
    one's resume function), and a reader knows the outer one (``#[tokio::main]``'s body,
    ``smol::block_on(async { ... })``) by its line: ``main::{async_block@33}::{async_block@60}``.
    The outer one's line is its own layout's (``main::{async_block_env#0}``) first state's."""
    if inv is None or "{async_block#" not in layout:
        return layout
    out, last = [], 0
    for m in _OUTER_BLOCK.finditer(layout):
        line = _start_line(inv.layouts.get(f"{layout[:m.start()]}::{{async_block_env#{m.group(1)}}}"))
        if line is not None:
            out += [layout[last:m.start()], f"::{{async_block@{line}}}"]
            last = m.end()
    return "".join(out) + layout[last:]


def _start_line(lay: Layout | None) -> int | None:
    if lay is None:
        return None
    own = _own_env(lay.type_name)  # an async fn is named by its path, with no line
    if own is not None and own.group(1) == "async_fn":
        return None
    first = lay.state(0)
    return first.loc.line if first is not None and first.loc is not None else None


def await_line_for(inv: Inventory | None, parent: str, child: str) -> SourceLoc | None:
    """The ``.await`` line of ``parent`` (a layout) whose suspend state holds ``child``
    (a layout or type name) as its awaitee or a live local, when exactly one line does."""
    lay = inv.layouts.get(parent) if inv is not None else None
    if lay is None or not child:
        return None
    lines = set()
    for st in lay.states:
        if st.value < 3 or st.loc is None:
            continue
        members = ([st.awaitee] if st.awaitee is not None else []) + list(st.locals)
        if any(m.type_name == child or child in m.type_name for m in members):
            lines.add(st.loc)
    return lines.pop() if len(lines) == 1 else None


_MACRO_CALL = re.compile(r"\b(\w+)!\s*[({\[]")
_SOURCES: dict[str, list[str] | None] = {}


def user_line(inv: Inventory | None, layout: str, loc: SourceLoc | None) -> SourceLoc | None:
    """``loc`` (a suspend state's line) moved to the macro call in the coroutine's own file."""
    lay = inv.layouts.get(layout) if inv is not None else None
    if lay is None or loc is None:
        return loc
    first = lay.state(0)
    if first is None or first.loc is None or loc.file == first.loc.file:
        return loc
    # tokio's join.rs -> join!; futures-util's async_await/join_mod.rs and select_mod.rs -> join!, select!
    macro = loc.file.rsplit("/", 1)[-1].removesuffix(".rs").removesuffix("_mod")
    text = _source(first.loc.file)
    if text is None:
        return loc
    hits = [i + 1 for i in range(first.loc.line - 1, min(_body_end(lay, text), len(text)))
            if any(m.group(1) == macro or m.group(1).endswith("_" + macro) for m in _MACRO_CALL.finditer(text[i]))]
    return SourceLoc(first.loc.file, hits[0]) if len(hits) == 1 else loc


_FN_ITEM = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s")


def _body_end(lay: Layout, text: list[str]) -> int:
    """The last line of a coroutine's body in its own file: its Returned variant's line (the
    closing brace). A block a proc macro made (``#[tokio::main]``'s body, ``#[instrument]``'s)
    has every variant at the attribute's line: then up to the next fn item after its last
    `.await` of its own file (tokio's graceful-shutdown: main's select! at 43, not the one of
    handle_connection at 78 too)."""
    first, last = lay.state(0), lay.state(1)
    assert first is not None and first.loc is not None
    if last is not None and last.loc is not None and last.loc.file == first.loc.file and last.loc.line > first.loc.line:
        return last.loc.line
    own = [st.loc.line for st in lay.states if st.loc is not None and st.loc.file == first.loc.file]
    start = max([first.loc.line, *own])
    for i in range(start, min(start + 2000, len(text))):
        if _FN_ITEM.match(text[i]):
            return i  # the line before the next fn (1-based i is that fn's line)
    return start + 2000


def _source(path: str) -> list[str] | None:
    if path not in _SOURCES:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                _SOURCES[path] = fh.read().splitlines()
        except OSError:
            _SOURCES[path] = None
    return _SOURCES[path]
