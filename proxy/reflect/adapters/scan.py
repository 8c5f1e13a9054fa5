"""One pass over the program's writable memory for every runtime adapter's task headers
(a module below the adapters: each of them, and the package's ``Discovery``, scan with it)."""

from __future__ import annotations

import struct
from typing import Any, Protocol

from ..memory import BLOCK, word_hits
from ..tree import Root
from ..walker import Reflector


class RuntimeAdapter(Protocol):
    name: str
    note: str | None
    targets: dict[int, Any]
    vt_off: int

    def roots(self, r: Reflector, hits: dict[int, Any]) -> list[Root]: ...


SCAN_MAX = 1 << 30  # bytes of writable memory one scan reads at most (the proxy holds what it read)


def _within(ranges: list[tuple[int, int]], most: int) -> list[tuple[int, int]]:
    """The ranges in order, cut where their sizes add up to `most`."""
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if most <= 0:
            break
        out.append((lo, min(hi, lo + most)))
        most -= min(hi, lo + most) - lo
    return out


def scan(r: Reflector, ranges: list[tuple[int, int]], adapters: list[RuntimeAdapter]) -> tuple[list[dict[int, Any]], int]:
    """One pass over ``ranges``: per adapter, header address -> payload; and the bytes read.

    Every block is read first (the session asks the stub for all the blocks not read yet at
    once, ``BlockReader.prefetch``). Then each
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
    # The heap is read whole, and a program's heap may hold more than the walk's budget
    # (BlockReader.budget, 64 MiB: against a runaway walk): hyper's single_threaded, a runtime
    # on each of its threads (each thread its own malloc arena), tripped it in 3 attaches of 11
    # and every command of that stop failed. The scan's own bytes (at most SCAN_MAX) are added to
    # the budget, so the walks after it keep theirs; past SCAN_MAX the rest is not scanned.
    ranges = _within(ranges, SCAN_MAX)
    bases = list(dict.fromkeys(base - base % BLOCK for lo, hi in ranges for base in range(lo, hi, BLOCK)))
    if hasattr(r.mem, "budget"):
        r.mem.budget += len(bases) * BLOCK
    # every block at once (a remote program's: one request for them all, not one a block);
    # a local program's are read here anyway (proxy/host/localmem.py)
    r.mem.prefetch(bases)
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
    for start, blocks in runs:
        data = b"".join(blocks)
        for pat, (i, payload) in words.items():
            at = data.find(pat)
            while at >= 0:
                if at & 7 == 0:
                    hits[i][start + at - adapters[i].vt_off] = payload
                at = data.find(pat, at + 1)
    return hits, scanned
