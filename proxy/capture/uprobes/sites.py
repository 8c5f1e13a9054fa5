"""Where the probes go: resume-function entries, rets and unwind exits -> uprobe sites (pure).

For each resume function kept by the filters: its entry (``low_pc``), each
``ret`` and each unwind exit (``call _Unwind_Resume`` after the landing pad
wrote ``__state = Panicked``). A site carries what the BPF side needs
(``SiteSpec``: where self is, where ``__state`` is, the CFA rule at an
unwind exit), what the decoder needs (``SiteInfo``: the runtime ``low_pc``),
the file offset to attach at, and the file's bytes of the whole probed
instruction: memory replies over a site show those bytes (a uprobe writes
``int3``; on a 5-byte NOP the kernel rewrites all 5 bytes into a ``call``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from proxy.analysis.elf import ElfImage
from proxy.analysis.model import Inventory, ResumeFn

from .bpf import (KIND_COUNT, KIND_ENTRY, KIND_EXIT, KIND_RETSITE, KIND_UNWIND, REG_LEARN, REG_RBP, REG_RDI,
                  REG_RSI, REG_RSP, SiteSpec)
from .decode import SiteInfo
from .caller_exits import FUNCTION_POINTER, CallerExit, caller_exits
from .emulated import MovedEntry, moved_entries

_DWARF_RSP, _DWARF_RBP = 7, 6


@dataclass(frozen=True, slots=True)
class Site:
    name: str
    addr: int  # runtime address of the probed instruction
    file_offset: int
    original: bytes  # the file's bytes of the whole instruction
    spec: SiteSpec
    info: SiteInfo
    # 0: the main link; fn index + 1: the rets of a function polled through a
    # vtable, in a link of their own (closed once its return sites are probed)
    group: int = 0


@dataclass(slots=True)
class SitePlan:
    sites: list[Site]
    notes: list[str]

    def by_addr(self) -> dict[int, Site]:
        return {s.addr: s for s in self.sites}


def file_offset(elf: ElfImage, vaddr: int) -> int | None:
    """vaddr - p_vaddr + p_offset of the PT_LOAD segment that holds it."""
    for seg in elf.segments:
        if seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
            return vaddr - seg.vaddr + seg.offset
    return None


_DISASM: list[object] = []  # one capstone handle (making one cost ~0.15 ms a site)


def insn_length(elf: ElfImage, vaddr: int) -> int:
    code = elf.read(vaddr, 16) or elf.read(vaddr, 1)
    if not code:
        return 1
    try:
        if not _DISASM:
            import capstone

            _DISASM.append(capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64))
        md: Any = _DISASM[0]
        for insn in md.disasm(code, vaddr, 1):
            return int(insn.size)
    except Exception:  # noqa: BLE001 - one byte is what an int3 covers
        pass
    return 1


def plan_sites(
    elf: ElfImage,
    inventory: Inventory,
    bias: int,
    *,
    only: str | None = None,
    exclude: str | None = None,
    entry_only: bool = False,
    cfa_at: "callable[[int], tuple[int, int] | None] | None" = None,  # type: ignore[valid-type]
    move_entries: bool = True,
    move_exits: bool = True,
    learn_returns: bool = False,
) -> SitePlan:
    """``cfa_at(link pc) -> (DWARF cfa register, offset)`` gives unwind exits their entry sp.
    ``move_entries``: an entry probe stands on the first instruction the kernel
    emulates when the poll is still fully known there (emulated.py).
    ``move_exits``: a function's exit probes stand in its callers, on the first
    emulated instruction after each call, when every return goes there
    (caller_exits.py); its ``ret``s are then not probed.
    ``learn_returns``: a function polled through a vtable (its address in the
    program's data) has its entries learn its return addresses (REG_LEARN) and
    its rets in a group of their own, which the capture replaces by probes at
    the learned return sites (``retsite_sites``)."""
    only_re = re.compile(only) if only else None
    exclude_re = re.compile(exclude) if exclude else None
    sites: list[Site] = []
    notes: list[str] = []
    skipped_unwind = 0
    n_moved = 0
    n_dispatch = 0

    def add(fn: ResumeFn, name: str, link: int, kind: int, spec: SiteSpec, adjust: int = 0, group: int = 0) -> None:
        off = file_offset(elf, link)
        if off is None:
            notes.append(f"{name}: 0x{link:x} is not in the file")
            return
        n = insn_length(elf, link)
        original = elf.read(link, n) or b""
        sites.append(Site(name, link + bias, off, original, spec,
                          SiteInfo(kind, fn.low_pc + bias, link + bias, adjust), group))

    chosen = [fn for fn in inventory.resume_fns if fn.low_pc
              and (only_re is None or only_re.search(fn.name)) and not (exclude_re and exclude_re.search(fn.name))]
    in_callers: dict[int, list] = {}  # type: ignore[type-arg]
    vtable: set[int] = set()  # polled through a vtable: return sites learned at run time
    if move_exits and not entry_only and chosen:
        starts = {fn.low_pc for fn in inventory.resume_fns}
        found = caller_exits(elf, [(fn.low_pc, fn.high_pc) for fn in chosen], polls=starts)
        if learn_returns:
            vtable = {lo for lo, got in found.items() if got == FUNCTION_POINTER}
        taken: set[int] = set()
        for lo, got in found.items():
            if isinstance(got, list) and got and not any(c.addr in starts or c.addr in taken for c in got):
                in_callers[lo] = got
                taken.update(c.addr for c in got)
    n_caller_exits = 0
    for fn_index, fn in enumerate(inventory.resume_fns):
        if not fn.low_pc:
            continue
        if only_re is not None and not only_re.search(fn.name):
            continue
        if exclude_re is not None and exclude_re.search(fn.name):
            continue
        layout = inventory.layouts.get(fn.layout_name) if fn.layout_name else None
        st_off = layout.state_offset if layout is not None else 0
        st_size = layout.state_size if layout is not None else 0
        self_reg = {"rdi": REG_RDI, "rsi": REG_RSI}.get(fn.self_in, REG_RDI)
        entries = [MovedEntry(fn.low_pc, 0)]
        if move_entries and not fn.wrapper:  # a wrapper's poll: its window starts at its entry
            code = elf.read(fn.low_pc, fn.high_pc - fn.low_pc) if fn.high_pc > fn.low_pc else None
            n_states = max((st.value for st in layout.states), default=-1) + 1 if layout is not None else 0
            moved = moved_entries(code, fn.low_pc, fn.high_pc, fn.self_in, elf.read, n_states) if code else "no code"
            if isinstance(moved, list):
                entries = moved
                if len(moved) > 1:
                    n_dispatch += 1
                elif moved[0].addr != fn.low_pc:
                    n_moved += 1
        learn = fn.low_pc in vtable
        for e in entries:
            add(fn, fn.name, e.addr, KIND_ENTRY, SiteSpec(KIND_ENTRY, self_reg, st_off, st_size,
                                                            cfa_reg=REG_LEARN if learn else REG_RSP,
                                                            sp_adjust=e.adjust, fn=fn_index),
                e.adjust)
        if entry_only:
            continue
        if fn.low_pc in in_callers:
            # rsp there is the entry's sp + 8 (the return address popped): scope key rsp + 0 - 8
            n_caller_exits += 1
            for c in in_callers[fn.low_pc]:
                add(fn, fn.name + " (return to caller)", c.addr, KIND_EXIT,
                    SiteSpec(KIND_EXIT, self_reg, st_off, st_size, REG_RSP, 0, -8, fn=fn_index), -8)
        else:
            for r in fn.rets:
                add(fn, fn.name + " (ret)", r, KIND_EXIT, SiteSpec(KIND_EXIT, self_reg, st_off, st_size, fn=fn_index),
                    group=fn_index + 1 if learn else 0)
        for x in fn.other_exits:
            rule = cfa_at(x) if cfa_at is not None else None
            if rule is None or rule[0] not in (_DWARF_RSP, _DWARF_RBP):
                skipped_unwind += 1
                continue
            reg = REG_RSP if rule[0] == _DWARF_RSP else REG_RBP
            add(fn, fn.name + " (unwind)", x, KIND_UNWIND,
                SiteSpec(KIND_UNWIND, self_reg, st_off, st_size, reg, rule[1], fn=fn_index))
    if n_caller_exits:
        notes.append(f"{n_caller_exits} resume functions' exits probed in their callers, on the instruction "
                     "the kernel emulates after each call (every return goes there), not on their rets")
    if n_moved:
        notes.append(f"{n_moved} entry probes moved past their prologue to an instruction the kernel emulates")
    if n_dispatch:
        notes.append(f"{n_dispatch} resume functions probed after their state dispatch, one entry probe per state "
                     "block (on its first emulated instruction where it has one)")
    if skipped_unwind:
        notes.append(f"{skipped_unwind} unwind exits without a CFA rule on rsp/rbp: not probed")
    return SitePlan(sites, notes)


def retsite_site(elf: ElfImage, exit_: CallerExit, ret: int, bias: int) -> Site | None:
    """The probe after a learned return address `ret` (link-time; ``return_site``):
    rsp there is the entry's sp + 8, as after a direct call; the function, the
    state's layout and self come from the poll's scope (uprobes.bpf.c)."""
    off = file_offset(elf, exit_.addr)
    if off is None:
        return None
    original = elf.read(exit_.addr, insn_length(elf, exit_.addr)) or b""
    return Site(f"return site 0x{ret:x}", exit_.addr + bias, off, original,
                SiteSpec(KIND_RETSITE, cfa_reg=REG_RSP, cfa_off=0, sp_adjust=-8, ret_back=exit_.addr - ret),
                SiteInfo(KIND_EXIT, 0, exit_.addr + bias, -8))


def count_site(elf: ElfImage, name: str, addr: int, bias: int) -> Site | None:
    """A site that only counts its hits (the user's ``--probe`` function at runtime `addr`)."""
    link = addr - bias
    off = file_offset(elf, link)
    if off is None:
        return None
    original = elf.read(link, insn_length(elf, link)) or b""
    return Site(name, addr, off, original, SiteSpec(KIND_COUNT), SiteInfo(KIND_COUNT, addr, addr))
