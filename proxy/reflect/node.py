"""The nodes of a future tree, and the small helpers the walker and the describers share
(a module below both: the walker runs the describers, the describers make nodes)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

from proxy.analysis.model import SourceLoc, TypeInfo

if TYPE_CHECKING:
    from .walker import Reflector

_ENV_RE = re.compile(r"::\{(async_fn|async_block|async_closure|coroutine)_env#(\d+)\}")


@dataclass(slots=True)
class Node:
    kind: str  # coroutine | combinator | leaf | unreadable | missing | truncated
    label: str  # what the tree prints: "tokio_app::a", "tokio::join!", "tokio::time::Sleep"
    addr: int
    type_name: str = ""
    loc: SourceLoc | None = None  # a coroutine: the .await it is suspended at
    status: str = "pending"  # pending | completed | gone | not yet polled | panicked | running
    detail: str = ""  # leaf description ("50 ms left", "task #3")
    children: list[Node] = field(default_factory=list)
    state: str | None = None  # a coroutine's variant name ("Suspend0")
    branch: str | None = None  # inside a combinator: "branch 0", "fast" ...
    holds: tuple[int, ...] = ()  # Mutexes whose guard is a live local (most nodes: none, no list each)
    waits_on: int | None = None  # the Mutex a `lock().await` waits for
    value: int | None = None  # a coroutine's raw __state as read (3 + N for SuspendN)

    def iter(self):  # type: ignore[no-untyped-def]
        """Every node, preorder (one loop, not a generator per level)."""
        stack = [self]
        while stack:
            n = stack.pop()
            yield n
            if n.children:
                stack.extend(reversed(n.children))


@lru_cache(maxsize=1 << 14)  # a few layouts, met once per coroutine of every task
def coroutine_path(layout_name: str) -> str:
    """``a::b::{async_fn_env#0}<T>`` -> ``a::b``; blocks keep ``::{async_block#N}``."""
    m = _ENV_RE.search(layout_name)
    if m is None:
        return layout_name
    head = layout_name[: m.start()]
    generics = layout_name[m.end():]
    head = re.sub(r"::\{async_fn#\d+\}", "", head)  # a block inside an async fn: fn::{async_block#0}
    if m.group(1) == "async_fn":
        return head + generics
    return f"{head}::{{{m.group(1)}#{m.group(2)}}}{generics}"


def _pointee(r: Reflector, ptr: TypeInfo | None) -> str | None:
    for _ in range(4):  # NonNull<T> -> *const T -> T, Unique<T> -> NonNull<T> ...
        if ptr is None:
            return None
        if ptr.kind == "pointer":
            return ptr.pointee
        if not ptr.fields:
            return None
        ptr = r.type(ptr.fields[0].type_name)
    return None


def short_type(type_name: str) -> str:
    """Drop generic arguments for display: ``tokio::time::sleep::Sleep``."""
    depth = 0
    out = []
    for i, ch in enumerate(type_name):
        if ch == "<":
            depth += 1
        elif ch == ">" and type_name[i - 1:i] != "-":  # `fn(A) -> B` among the arguments
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out) or type_name


def type_fact(r: Reflector, memo: str, type_name: str, compute: Callable[[], bool]) -> bool:
    """A yes/no fact about a type of the program, computed once (kept on the inventory under
    ``memo``: its types are the program's); a recursive type is False by way of itself."""
    cache = getattr(r.inv, memo, None)
    if cache is None:
        cache = {}
        try:
            setattr(r.inv, memo, cache)
        except AttributeError:
            cache = r.__dict__.setdefault(memo, cache)
    got = cache.get(type_name)
    if got is None:
        cache[type_name] = False
        got = cache[type_name] = compute()
    return got  # type: ignore[no-any-return]


def unreadable(addr: int, type_name: str, why: str) -> Node:
    return Node("unreadable", f"<unreadable {why} at 0x{addr:x}>", addr, type_name)


def missing_or_unreadable(r: Reflector, addr: int, type_name: str, what: str) -> Node:
    return Node("unreadable", f"<unreadable {what} at 0x{addr:x}>", addr, type_name)
