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

import struct
from collections.abc import Callable
from typing import Any, Protocol

from proxy.analysis.model import Inventory

from ..memory import BLOCK, word_hits
from ..tree import Root
from ..walker import Reflector

NAMES = ("tokio", "async-task", "futures-executor")


class RuntimeAdapter(Protocol):
    name: str
    note: str | None
    targets: dict[int, Any]
    vt_off: int

    def roots(self, r: Reflector, hits: dict[int, Any]) -> list[Root]: ...


def scan(r: Reflector, ranges: list[tuple[int, int]], adapters: list[RuntimeAdapter]) -> tuple[list[dict[int, Any]], int]:
    """One pass over ``ranges``: per adapter, header address -> payload; and the bytes read.

    Every block is read first (a pass of the session's read loop asks for all the blocks it
    has not read yet at once); when a read of this pass is still unanswered
    (``Reflector.pending``) nothing is searched: the next pass searches it all. Then each
    vtable's 8 bytes are searched with ``bytes.find`` over each run of blocks read (C speed: a
    few dozen vtables against millions of words; unpacking every word in Python was the
    scan's cost at 100,000 tasks); a hit counts only at a word-aligned offset."""
    words: dict[bytes, tuple[int, Any]] = {}
    for i, a in enumerate(adapters):
        for vt, payload in a.targets.items():
            words[struct.pack("<Q", vt)] = (i, payload)
    hits: list[dict[int, Any]] = [{} for _ in adapters]
    scanned = 0
    runs: list[tuple[int, list[bytes]]] = []  # (start, blocks read back to back from it)
    rec = getattr(r.mem, "recording", None)
    pats = tuple(words)
    for lo, hi in ranges:
        run: list[bytes] = []
        for base in range(lo, hi, BLOCK):
            key = (base, min(BLOCK, hi - base))
            fresh = rec is not None and key not in rec.reads
            data = r.mem.read(*key)
            if fresh:  # what this scan depends on in the block: where the words lie (LastStop)
                rec.reads.pop(key, None)
                rec.scanned[key] = (pats, word_hits(data, pats) if data is not None else None)
            if data is None:
                run = []
                continue
            if not run:
                runs.append((base, run))
            run.append(data[:len(data) & ~7])
            scanned += len(data)
            if len(data) < BLOCK:  # a short block ends the run: the next one does not follow it
                run = []
    if r.pending is not None and r.pending():
        return hits, scanned
    for start, blocks in runs:
        data = b"".join(blocks)
        for pat, (i, payload) in words.items():
            at = data.find(pat)
            while at >= 0:
                if at & 7 == 0:
                    hits[i][start + at - adapters[i].vt_off] = payload
                at = data.find(pat, at + 1)
    return hits, scanned


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
        if r.pending is not None and r.pending():  # the heap is not all read yet (the session reads
            return None  # it and runs the command again): its tasks are made in the pass that has it
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
           ranges: Callable[[], list[tuple[int, int]]] | None = None) -> Discovery:
    """The adapters ``wanted`` ("auto", "off", or names joined by commas) for this program."""
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
                notes.append("runtime adapters scan /proc/PID/maps: they need a local program")
            found = []
            ranges = lambda: []  # noqa: E731
    return Discovery(found, ranges, notes)
