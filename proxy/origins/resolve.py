"""A spawn record -> the program's spawning line and its backtraces, made when first shown.

The record's stack slice is unwound with the program's CFI (the deferred unwinder
of the uprobe capture), each pc symbolised with its inlined frames. The spawning
line is the first frame, innermost first, in the program's own source: not the
runtime's or the standard library's (``RUNTIME_CRATES``), nor any other crate's
file from a registry (smol's global executor is first spawned from async-lock's
``OnceCell`` initialiser, inside smol's own spawn: not a line of the program).
``tokio::spawn`` and ``JoinSet::spawn`` are inside tokio, the call to them is the
program's. With no such frame, the first frame outside the runtime's crates is
taken (a spawn made by a library on the program's behalf). Results are cached per
record; ``symbolised`` counts the records resolved (none until a command asks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from proxy.analysis.model import Frame, SourceLoc
from proxy.analysis.paths import is_dependency

from .records import SpawnRecord

# crates whose frames are the runtime's or the standard library's, not the program's spawning code
RUNTIME_CRATES = frozenset({
    "tokio", "std", "core", "alloc", "async_task", "async_executor", "async_global_executor", "async_std",
    "smol", "futures_executor", "futures_util", "tracing", "tracing_futures", "console_subscriber",
})


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a task was spawned: the program's line, the physical frames (innermost first)."""

    line: SourceLoc | None
    function: str  # the function of the spawning line
    frames: tuple[Frame, ...]
    full: bool  # the unwind reached the thread's start


def crate_of(name: str) -> str:
    name = name.lstrip("<&*")
    return name.split("::", 1)[0].split("<", 1)[0].strip()


class Resolver:
    """``unwind(record) -> (runtime pcs, full, each pc's frame CFA)`` and ``frames(link pc) ->
    source frames`` come from the capture (its StackUnwinder and the program's line table)."""

    def __init__(self, unwind: Callable[[SpawnRecord], tuple[tuple[int, ...], bool, tuple[int | None, ...]]],
                 frames: Callable[[int], list[Frame]], bias: int) -> None:
        self._unwind = unwind
        self._frames = frames
        self.bias = bias
        self._done: dict[tuple[int, int], Origin] = {}
        self.symbolised = 0

    def frames_at(self, link_pc: int) -> list[Frame]:
        """The source frames at one link-time pc (a waker's caller, shown by ``waits``)."""
        return self._frames(link_pc)

    def _walk(self, rec: SpawnRecord) -> tuple[list[Frame], list[int], Frame | None, bool, tuple[int | None, ...]]:
        """(frames innermost first, each frame's physical frame index, the spawning line's frame,
        full, the physical frames' CFAs)."""
        pcs, full, cfas = self._unwind(rec)
        frames: list[Frame] = []
        where: list[int] = []
        for i, pc in enumerate(pcs):
            # a return address is after its call: the call's line is at pc - 1
            got = self._frames(pc - self.bias - (1 if i else 0))
            frames.extend(got)
            where += [i] * len(got)
        outside = [f for f in frames if crate_of(f.function) not in RUNTIME_CRATES and f.loc is not None]
        own = [f for f in outside if f.loc is not None and not is_dependency(f.loc.file)]
        return frames, where, (own or outside or [None])[0], full, cfas

    def origin(self, rec: SpawnRecord) -> Origin:
        key = (rec.ts, rec.thread)
        got = self._done.get(key)
        if got is not None:
            return got
        self.symbolised += 1
        frames, _where, first, full, _cfas = self._walk(rec)
        line, fn = (first.loc, first.function) if first is not None else (None, "")
        got = Origin(line, fn, tuple(frames), full)
        self._done[key] = got
        return got

    def stack_needed(self, rec: SpawnRecord) -> int | None:
        """The bytes of stack from the record's sp that hold the spawning line's frame whole
        (its CFA: its own return address read too), None: the line is not in this record's
        slice (the unwind did not reach it). Not counted in ``symbolised``: the capture sizes
        a spawning path's later records with it (wakes.py), nothing is shown."""
        frames, where, first, _full, cfas = self._walk(rec)
        if first is None:
            return None
        k = where[next(i for i, f in enumerate(frames) if f is first)]
        cfa = cfas[k] if k < len(cfas) else None
        return cfa - rec.regs["rsp"] if cfa is not None else None
