"""Runtime adapters: every spawned task of a runtime, found in the program's memory.

An adapter knows where one runtime keeps its tasks. It needs no runtime
cooperation (works when the runtime is wedged, in a program stuck before the
proxy came, in a core file): every task allocation starts with a header that
points at a static vtable the analysis found next to the runtime's task
functions (``Inventory.task_vtables``: tokio; ``Inventory.task_run_slots``:
async-task, under smol's async-executor and async-std), or holds a static function
pointer (``Inventory.future_obj_drops``: futures' LocalPool). One pass over the
program's writable anonymous memory (``heap_ranges``) finds the words equal to
any adapter's vtables; each adapter turns its hits into ``Root``s.

Adapters are chosen by layout, not version (``choose``): ``auto`` takes every
adapter whose types and functions are in the program (several runtimes in one
program: all of them), ``off`` none; naming adapters forces them (an adapter
whose layout is missing then says why in a note).

Interface (``RuntimeAdapter``): ``name``; ``note`` (None, or why it finds
nothing); ``targets`` (runtime vtable address -> payload); ``vt_off`` (where
the vtable word sits in a task header); ``roots(r, hits)`` (header address ->
payload, to ``Root``s).
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.analysis.model import Inventory

from ..tree import Root
from ..walker import Reflector
from .scan import RuntimeAdapter, scan

__all__ = ["NAMES", "Discovery", "RuntimeAdapter", "choose", "scan"]

NAMES = ("tokio", "async-task", "futures-executor")


class Discovery:
    """The adapters of one program, as ``ReflectSource.discover``: ``discover(r)``."""

    def __init__(self, adapters: list[RuntimeAdapter], ranges: Callable[[], list[tuple[int, int]]],
                 notes: list[str]) -> None:
        self.adapters = [a for a in adapters if a.note is None]
        self.ranges = ranges
        self.notes = notes + [f"{a.name} adapter off: {a.note}" for a in adapters if a.note is not None]
        self.scanned = 0  # bytes, last discovery
        self.past = 0  # tasks counted, not made, past a discovery's ``keep``

    @property
    def note(self) -> str | None:
        return "; ".join(self.notes) or None

    def discover(self, r: Reflector, keep: int | None = None) -> list[Root] | None:
        """Every task the adapters find; ``keep``: an adapter that can (``roots_upto``) makes
        only its first ``keep`` and counts the rest in ``self.past``."""
        self.past = 0
        if not self.adapters:
            return None
        hits, self.scanned = scan(r, self.ranges(), self.adapters)
        roots: list[Root] = []
        for a, h in zip(self.adapters, hits):
            upto = getattr(a, "roots_upto", None)
            if keep is not None and upto is not None:
                got, more = upto(r, h, keep)
                roots += got
                self.past += more
            else:
                roots += a.roots(r, h)
        return roots


def choose(inv: Inventory, bias: int, pid: int | None, local: bool, wanted: str = "auto",
           ranges: Callable[[], list[tuple[int, int]]] | None = None, why: str | None = None) -> Discovery:
    """The adapters ``wanted`` ("auto", "off", or names joined by commas) for this program.
    ``ranges``: the memory to scan when the program is not a local process (a core, a
    remote program's maps read through the stub); ``why``: why there are none."""
    from ..tokio_adapter import TokioAdapter, heap_ranges
    from .async_task import AsyncTaskAdapter
    from .future_obj import FutureObjAdapter

    kinds: dict[str, Callable[[], RuntimeAdapter]] = {
        "tokio": lambda: TokioAdapter(inv, bias, pid, local, ranges=ranges or (lambda: [])),
        "async-task": lambda: AsyncTaskAdapter(inv, bias),
        "futures-executor": lambda: FutureObjAdapter(inv, bias),
    }
    names = [n.strip() for n in wanted.split(",") if n.strip()]
    if names in (["off"], []):
        return Discovery([], lambda: [], [])
    auto = names == ["auto"]
    unknown = [n for n in names if n not in kinds and not auto]
    if unknown:
        raise ValueError(f"unknown runtime adapter(s) {', '.join(unknown)}; known: auto, off, {', '.join(NAMES)}")
    found = [kinds[n]() for n in (NAMES if auto else names)]
    notes: list[str] = []
    if auto:
        found = [a for a in found if a.note is None]  # auto: only the runtimes this program has
    if ranges is None:
        if local and pid:
            ranges = lambda: heap_ranges(pid)  # noqa: E731
        else:
            if found:
                notes.append(f"runtime adapters scan the program's memory map: {why}" if why else
                             "runtime adapters scan /proc/PID/maps: they need a local program")
            found = []
            ranges = lambda: []  # noqa: E731
    return Discovery(found, ranges, notes)
