"""Deferred unwinding of uprobe entries: the native stack at each poll, from the captured slice.

Theory of operation: an entry record carries the registers the CFI needs
(rip = the probed instruction: the resume function's low_pc, or the first
emulated instruction after its prologue (emulated.py); rsp there, rbp, rbx,
r12-r15) and the first bytes of the stack from rsp. ``proxy.analysis.unwind.Unwinder`` walks it
with the program's ``.eh_frame``, reading memory from the slice only. The
walk is:

* **full** when it reaches a return address outside the program's own code
  (libc's ``__libc_start_call_main`` or ``start_thread``: where every thread
  of a Rust program starts) or a frame whose CFI says it is the outermost;
* **partial** when it needs a stack word past the end of the slice or meets
  a pc of the program that has no CFI. Nothing past that point is guessed:
  the rbp-chain fallback of the analysis unwinder is not used here (without
  frame pointers rbp is just another register).

Results are cached by a hash of (registers, stack bytes): a loop that polls
the same future from the same place produces the same slice.

The frames of resume functions above the entry give a second, independent
source for the poll's parent: the nearest one is the poll that called this
one, identified by (site, sp at its entry = its CFA - 8). The engine's own
answer (the innermost scope on the thread before the entry) is compared
with it: ``agree``/``disagree``, or ``unknown`` when the stack is partial
below any resume frame.

Pure: memory is the captured bytes; no I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass

from proxy.analysis.elf import ElfImage
from proxy.analysis.model import Inventory
from proxy.analysis.unwind import Unwinder, _Row

from .decode import EntryCapture

_CACHE_MAX = 8192


@dataclass(frozen=True, slots=True)
class Unwound:
    pcs: tuple[int, ...]  # runtime pcs, frame 0 = the probed instruction of the resume function
    full: bool
    # (site, sp at entry) of each enclosing resume function's frame, innermost first
    resume_frames: tuple[tuple[int, int], ...]
    covered_sp: int  # every frame with an entry sp below this was examined
    cfas: tuple[int | None, ...] = ()  # each of pcs' frames' CFA (None: not known)


@dataclass(slots=True)
class UnwindStats:
    unwound: int = 0
    full: int = 0
    partial: int = 0
    five_or_more: int = 0  # partial but with at least 5 frames
    cache_hits: int = 0
    parent_agree: int = 0
    parent_disagree: int = 0
    parent_unknown: int = 0
    skipped: int = 0  # entries not unwound (over the budget, dropped from the queue)

    def lines(self) -> list[str]:
        if not self.unwound and not self.skipped:
            return []
        return [
            f"unwound entries: {self.unwound} ({self.full} full, {self.partial} partial, "
            f"{self.five_or_more} of them >= 5 frames; cache hits {self.cache_hits}; "
            f"skipped {self.skipped})",
            f"parent check (stack vs engine): {self.parent_agree} agree, "
            f"{self.parent_disagree} disagree, {self.parent_unknown} unknown",
        ]


class _CachedUnwinder(Unwinder):
    """The analysis unwinder with its CFI rows memoised per pc (the hot path here)."""

    def __init__(self, elf: ElfImage, bias: int) -> None:
        super().__init__(elf, bias)
        self._rows: dict[int, _Row | None] = {}

    def row_for(self, pc: int) -> _Row | None:
        rows = self._rows
        if pc in rows:
            return rows[pc]
        row = super().row_for(pc)
        if len(rows) > 65536:
            rows.clear()
        rows[pc] = row
        return row


class _Past(Exception):
    """A read past the captured slice."""


class StackUnwinder:
    def __init__(self, elf: ElfImage, inventory: Inventory, bias: int, *, max_frames: int = 64) -> None:
        self.bias = bias
        self.max_frames = max_frames
        self._u = _CachedUnwinder(elf, bias)
        lo_hi = sorted((f.low_pc + bias, f.high_pc + bias) for f in inventory.resume_fns if f.low_pc)
        self._lows = [a for a, _ in lo_hi]
        self._highs = [b for _, b in lo_hi]
        text = [(s.vaddr + bias, s.vaddr + s.memsz + bias) for s in elf.segments if s.flags & 1]
        self._code = text or ([(elf.text_range[0] + bias, elf.text_range[1] + bias)] if elf.text_range else [])
        self._cache: OrderedDict[int, Unwound] = OrderedDict()
        self.stats = UnwindStats()

    def resume_site_at(self, pc: int) -> int | None:
        i = bisect_right(self._lows, pc) - 1
        if i >= 0 and pc < self._highs[i]:
            return self._lows[i]
        return None

    def cfa_at(self, link_pc: int) -> tuple[int, int] | None:
        """(DWARF register, offset) of the CFA at a link-time pc, None: no rule or an expression."""
        row = self._u.row_for(link_pc)
        if row is None or row.cfa_expr:
            return None
        return row.cfa_reg, row.cfa_off

    def _in_program(self, pc: int) -> bool:
        return any(lo <= pc < hi for lo, hi in self._code)

    def unwind(self, cap: EntryCapture) -> Unwound:
        key = hash((tuple(sorted(cap.regs.items())), cap.stack))
        hit = self._cache.get(key)
        if hit is not None:
            self.stats.cache_hits += 1
            self._cache.move_to_end(key)
            return hit
        res = self._walk(cap)
        self._cache[key] = res
        if len(self._cache) > _CACHE_MAX:
            self._cache.popitem(last=False)
        return res

    def _walk(self, cap: EntryCapture) -> Unwound:
        past = [False]

        def read(addr: int, size: int) -> bytes | None:
            data = cap.read(addr, size)
            if data is None:
                past[0] = True
            return data

        frames = self._u.unwind(dict(cap.regs), read, max_frames=self.max_frames)
        pcs: list[int] = []
        cfas: list[int | None] = []
        resume: list[tuple[int, int]] = []
        full = False
        covered = cap.regs["rsp"]
        for i, fr in enumerate(frames):
            if i and not self._in_program(fr.pc):
                full = True  # the caller is libc's thread/process start: the whole program stack
                pcs.append(fr.pc)
                cfas.append(fr.cfa)
                break
            if fr.method != "cfi":
                break  # no CFI for a pc of the program: stop here, never guess
            pcs.append(fr.pc)
            cfas.append(fr.cfa)
            if i and fr.cfa is not None:
                site = self.resume_site_at(fr.pc - 1)
                if site is not None:
                    resume.append((site, fr.cfa - 8))
            if fr.cfa is not None:
                covered = fr.cfa
        else:
            # the walk ended by itself: the outermost frame (RA undefined), unless a read
            # past the slice stopped it
            full = bool(frames) and not past[0] and len(frames) < self.max_frames
        return Unwound(tuple(pcs), full, tuple(resume), covered, tuple(cfas))

    # -- what the backend does with an entry
    def check(self, cap: EntryCapture) -> Unwound:
        """Unwind one entry, count it, and compare its parent with the engine's."""
        res = self.unwind(cap)
        st = self.stats
        st.unwound += 1
        if res.full:
            st.full += 1
        else:
            st.partial += 1
            if len(res.pcs) >= 5:
                st.five_or_more += 1
        nearest = res.resume_frames[0] if res.resume_frames else None
        if nearest is not None:
            if cap.parent == nearest:
                st.parent_agree += 1
            else:
                st.parent_disagree += 1
        elif res.full:
            if cap.parent is None:
                st.parent_agree += 1
            else:
                st.parent_disagree += 1
        else:
            st.parent_unknown += 1
        return res

    def resync_frames(self, cap: EntryCapture, engine_scopes: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
        """(site, 0, sp) of the resume frames that enclose this entry, for ``Engine.resync_thread``.

        Scopes the engine has above the part of the stack the slice covered can be
        neither confirmed nor denied: they are kept as they are.
        """
        res = self.unwind(cap)
        frames = [(site, 0, sp) for site, sp in res.resume_frames]
        if not res.full:
            frames += [(site, 0, sp) for site, sp in engine_scopes if sp >= res.covered_sp]
        return frames
