"""Reflection: read every task's pending-future tree from memory at a stop.

Observed polls see only coroutines that exist as code and run while the
proxy watches; reflection reads the state machines themselves (DESIGN.md §4),
so it also works for release builds (coroutines inlined into their parent),
for tasks stuck since before the proxy attached, and with no probe planted
(``--mode off``). Pure: memory comes from the monitor's ``read`` callable
(None = not read yet; the session reads and runs the command again).

Reflection is an input of the snapshot (``proxy.snapshot``), which merges it
with the observed polls, the threads' stacks and the runtime adapters; it
answers no question by itself.

* ``walker``: ``Reflector.walk(addr, type) -> Node``, bounded.
* ``describers``: combinators (join!/select!/MaybeDone/Timeout, futures' join_all/
  select/FuturesUnordered) and leaves (Sleep, JoinHandle, Mutex/semaphore, Notify,
  oneshot, mpsc, pending, yield_now, I/O Readiness with its fd).
* ``tree``: ``Root`` (where a task was found) and the overlay of the coroutines
  inlined at a thread's pc.
* ``stacks``: futures found on the threads' stacks; ``tokio_adapter``: tokio's tasks.
* ``source``: the ``ReflectSource`` of a session or a one-shot reader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxy.analysis.model import Frame, Inventory

from .tree import Root
from .walker import Node, Reflector, coroutine_path

if TYPE_CHECKING:
    from .stacks import StackFinder

__all__ = ["ReflectSource", "Node", "Reflector", "Root", "coroutine_path", "thread_regs", "table"]


@dataclass(slots=True)
class ReflectSource:
    """What reflection needs about the program (one per ``proxy.program.Program``)."""

    inventory: Inventory
    bias: int
    symbol_at: Callable[[int], str | None] | None = None  # link-time addr -> demangled name
    frames_at: Callable[[int], list[Frame]] | None = None  # link-time pc -> frames, inlined first
    now_ns: Callable[[], int] | None = None  # the target host's CLOCK_MONOTONIC (local targets)
    discover: Callable[[Reflector], "list[Root] | None"] | None = None  # runtime adapter
    note: str | None = None  # e.g. why the adapter is off
    stacks: Callable[[], "StackFinder | None"] | None = None  # built on first use (stacks.py)


def thread_regs(raw: dict[int, bytes] | None, arch: Any = None) -> dict[int, dict[str, int]]:
    """The session's `g` replies per thread -> register dicts (unparsable ones left out), in
    the order of ``arch`` (proxy.arch.Arch; None: x86-64's)."""
    from .stacks import parse_g  # stacks needs pyelftools: imported when used

    out = {}
    for tid, reply in (raw or {}).items():
        regs = parse_g(reply) if arch is None else parse_g(reply, arch)
        if regs is not None:
            out[tid] = regs
    return out


def table(rows: list[tuple[str, ...]]) -> str:
    """Rows as aligned columns (the first row is the header)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
