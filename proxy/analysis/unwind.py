"""A sans-IO stack unwinder for x86-64 and AArch64 over the CFI of ``.eh_frame`` (and ``.debug_frame``).

Theory of operation: ``Unwinder(elf, bias)`` finds the FDE for a pc through
the binary-search table of ``.eh_frame_hdr`` and lets pyelftools parse that
one entry (parsing all of ``.eh_frame`` takes over a second on a debug tokio
binary); without the table it parses every entry once. The call-frame
instructions are interpreted here, not with pyelftools' ``get_decoded()``:
pyelftools 0.33 raises on ``DW_CFA_GNU_args_size``, which rustc emits. The CFA
rule may use any register (r11 during the stack probes of large frames, rbp
with frame pointers). Where no FDE covers a pc (another object, a
hand-written stub), the frame is unwound through the rbp chain and marked
``method="fp"``. Memory comes from the caller's ``read_memory(addr, size)``
(None when unreadable); nothing here does I/O.

The CPU's side is a ``CfiRegs`` chosen by the ELF's machine: DWARF's register numbering,
the return-address column, the callee-saved set. On x86-64 the return-address column is
rip's own (16: the word at CFA - 8). On AArch64 it is x30, the link register: the caller's
pc is x30's value as the row recovers it, or, in a leaf frame that saved nothing (no rule
for x30 at frame 0), x30 itself; the frame record (``stp x29, x30``) is where x29 points:
the caller's x29 at [x29], its pc at [x29 + 8], its sp x29 + 16, the same shape as rbp's.
"""

from __future__ import annotations

import io
import struct
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elftools.dwarf.callframe import CIE, FDE, CallFrameInfo
from elftools.dwarf.structs import DWARFStructs
from elftools.elf.elffile import ELFFile

from .elf import ElfImage

ReadMemory = Callable[[int, int], "bytes | None"]

# DWARF register numbers of x86-64 (SysV psABI)
DWARF_REGS = ("rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp",
              "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "rip")
_RA = 16
_RSP = 7
_RBP = 6


@dataclass(frozen=True, slots=True)
class CfiRegs:
    """One CPU's registers as its CFI names them (see the module docstring)."""

    names: tuple[str, ...]  # DWARF register number -> name
    pc: str
    sp: str
    fp: str
    ra: int  # the return-address column
    callee_saved: tuple[str, ...]
    ra_in_register: bool  # the return address is a register's value (AArch64's x30), not rip's column
    rets: tuple[bytes, ...]  # the encodings of a plain return (the epilogue rule below)


X86_64_CFI = CfiRegs(DWARF_REGS, "rip", "rsp", "rbp", _RA, ("rbx", "rbp", "r12", "r13", "r14", "r15"),
                     False, (b"\xc3", b"\xf3\xc3"))
# DWARF for the Arm 64-bit architecture: x0-x30 = 0-30, sp = 31; AAPCS64: x19-x29 callee-saved
AARCH64_CFI = CfiRegs(tuple(f"x{i}" for i in range(31)) + ("sp",), "pc", "sp", "x29", 30,
                      tuple(f"x{i}" for i in range(19, 30)), True, (bytes.fromhex("c0035fd6"),))
CFI_REGS = {"EM_X86_64": X86_64_CFI, "EM_AARCH64": AARCH64_CFI}


@dataclass(frozen=True, slots=True)
class UnwoundFrame:
    pc: int  # runtime address (frame 0: the current pc; others: the return address)
    cfa: int | None  # the canonical frame address of this frame (None when unknown)
    sp: int  # the stack pointer in this frame
    method: str = "cfi"  # "cfi", "fp" (rbp chain, no CFI for pc), or "none" (last frame)
    # the registers known in this frame (frame 0: all given; callers: callee-saved ones,
    # rsp, rip): for DWARF locations of the frame's variables (proxy.reflect.stacks)
    regs: tuple[tuple[str, int], ...] = field(default=(), compare=False)


@dataclass(slots=True)
class _Row:
    cfa_reg: int
    cfa_off: int
    cfa_expr: bool
    rules: dict[int, tuple[str, int]]  # reg -> ("off", n) | ("val", n) | ("reg", r) | ("undef", 0) | ("same", 0)


class CfiError(Exception):
    pass


class Unwinder:
    def __init__(self, elf: ElfImage, bias: int = 0) -> None:
        self.elf = elf
        self.bias = bias
        self._pyelf = ELFFile(elf.stream())
        self._dwarf_info: Any = None  # _dwarf: made only when .eh_frame_hdr does not answer
        self._hdr = _eh_frame_hdr_table(elf)
        self._all: list[tuple[int, int, FDE]] | None = None
        self._starts: list[int] = []
        self._cache: dict[int, FDE | None] = {}
        self.regs = CFI_REGS.get(elf.machine, X86_64_CFI)

    # -- FDE lookup -----------------------------------------------------------------------------
    def fde_for(self, pc: int) -> FDE | None:
        """The FDE covering a link-time pc."""
        if self._hdr is not None:
            starts, offsets = self._hdr
            i = bisect_right(starts, pc) - 1
            if i >= 0:
                fde = self._fde_at(offsets[i])
                if fde is not None and _covers(fde, pc):
                    return fde
            return self._debug_frame_fde(pc)
        return self._linear_fde(pc)

    def _fde_at(self, offset: int) -> FDE | None:
        if offset not in self._cache:
            try:
                cfi = self._eh_cfi()
                entry = cfi._parse_entry_at(offset)  # one entry, not the whole section
                self._cache[offset] = entry if isinstance(entry, FDE) else None
            except Exception:  # noqa: BLE001 - pyelftools raises many kinds on bad CFI
                self._cache[offset] = None
        return self._cache[offset]

    @property
    def _dwarf(self) -> Any:
        """pyelftools' DWARFInfo, for the linear search of every CFI entry: it copies
        every debug section (+70 MB on an 80 MB debug build), so only when the
        ``.eh_frame_hdr`` table does not answer."""
        if self._dwarf_info is None:
            self._dwarf_info = self._pyelf.get_dwarf_info(relocate_dwarf_sections=False)
        return self._dwarf_info

    def _eh_cfi(self) -> CallFrameInfo:
        return self._cfi_cached()

    def _cfi_cached(self) -> CallFrameInfo:
        if not hasattr(self, "_cfi_obj"):
            sec = self._pyelf.get_section_by_name(".eh_frame")
            from elftools.dwarf.dwarfinfo import DebugSectionDescriptor

            desc = DebugSectionDescriptor(
                stream=io.BytesIO(sec.data()), name=".eh_frame", global_offset=sec["sh_offset"],
                size=sec["sh_size"], address=sec["sh_addr"],
            )
            self._cfi_obj = CallFrameInfo(
                stream=desc.stream, size=desc.size, address=desc.address,
                # what DWARFInfo.structs would be (32-bit DWARF, little-endian, 8-byte addresses)
                base_structs=DWARFStructs(little_endian=True, dwarf_format=32, address_size=8), for_eh_frame=True,
            )
        return self._cfi_obj

    def _linear_fde(self, pc: int) -> FDE | None:
        if self._all is None:
            entries: list[tuple[int, int, FDE]] = []
            for getter in ("EH_CFI_entries", "CFI_entries"):
                try:
                    if getter == "EH_CFI_entries" and not self._dwarf.has_EH_CFI():
                        continue
                    if getter == "CFI_entries" and not self._dwarf.has_CFI():
                        continue
                    for e in getattr(self._dwarf, getter)():
                        if isinstance(e, FDE):
                            lo = e.header["initial_location"]
                            entries.append((lo, lo + e.header["address_range"], e))
                except Exception:  # noqa: BLE001
                    continue
            entries.sort(key=lambda t: t[0])
            self._all = entries
            self._starts = [t[0] for t in entries]
        i = bisect_right(self._starts, pc) - 1
        if i >= 0 and self._all[i][0] <= pc < self._all[i][1]:
            return self._all[i][2]
        return None

    def _debug_frame_fde(self, pc: int) -> FDE | None:
        if not self.elf.has_section(".debug_frame"):
            return None
        return self._linear_fde(pc)

    # -- rows -----------------------------------------------------------------------------------
    def row_for(self, pc: int) -> _Row | None:
        fde = self.fde_for(pc)
        if fde is None:
            return None
        return execute(fde, pc)

    def _at_ret(self, pc: int) -> bool:
        return _at_ret_bytes(self.elf.read(pc, 4) or self.elf.read(pc, 2), self.regs)

    # -- unwinding ------------------------------------------------------------------------------
    def unwind(self, regs: dict[str, int], read_memory: ReadMemory, *, max_frames: int = 64) -> list[UnwoundFrame]:
        R = self.regs
        cur = {k: v for k, v in regs.items() if k in R.names or k == R.pc}
        frames: list[UnwoundFrame] = []
        for depth in range(max_frames):
            pc = cur.get(R.pc)
            sp = cur.get(R.sp)
            if pc is None or sp is None or pc == 0:
                break
            # a return address points after the call: look up the call itself
            lookup = pc - self.bias - (1 if depth else 0)
            row = self.row_for(lookup)
            if row is not None and not row.cfa_expr:
                nxt = _step_cfi(row, cur, read_memory, R, leaf=depth == 0)
                if depth == 0 and nxt is not None and self._at_ret(pc - self.bias):
                    # LLVM's epilogue CFI tracks the CFA but not the pops: at the ret every
                    # callee-saved register already holds the caller's value (gdb agrees)
                    for r in R.callee_saved:
                        if r in cur:
                            nxt[r] = cur[r]
                cfa = cur.get(R.names[row.cfa_reg]) if row.cfa_reg < len(R.names) else None
                cfa = cfa + row.cfa_off if cfa is not None else None
                frames.append(UnwoundFrame(pc, cfa, sp, "cfi", tuple(cur.items())))
            else:
                nxt = _step_fp(cur, read_memory, R)
                fp = cur.get(R.fp)
                frames.append(UnwoundFrame(pc, fp + 16 if fp else None, sp, "fp", tuple(cur.items())))
            if nxt is None or nxt.get(R.pc, 0) == 0:
                break
            if nxt[R.sp] <= sp and depth:  # the stack must grow towards the caller
                break
            cur = nxt
        return frames


def _at_ret_bytes(code: bytes | None, regs: CfiRegs = X86_64_CFI) -> bool:
    return code is not None and any(code.startswith(r) for r in regs.rets)


def unwind(
    elf: ElfImage, regs: dict[str, int], read_memory: ReadMemory, *, bias: int = 0, max_frames: int = 64
) -> list[UnwoundFrame]:
    return Unwinder(elf, bias).unwind(regs, read_memory, max_frames=max_frames)


def _covers(fde: FDE, pc: int) -> bool:
    lo = fde.header["initial_location"]
    return bool(lo <= pc < lo + fde.header["address_range"])


def _read_u64(read_memory: ReadMemory, addr: int) -> int | None:
    b = read_memory(addr, 8)
    if b is None or len(b) != 8:
        return None
    return int(struct.unpack("<Q", b)[0])


def _step_cfi(row: _Row, cur: dict[str, int], read_memory: ReadMemory, R: CfiRegs = X86_64_CFI,
              leaf: bool = False) -> dict[str, int] | None:
    """The caller's registers. ``leaf``: the frame is the innermost one, where a CPU whose
    return address is a register's (AArch64's x30) may not have saved it yet."""
    base = cur.get(R.names[row.cfa_reg]) if row.cfa_reg < len(R.names) else None
    if base is None:
        return None
    cfa = base + row.cfa_off
    ra_rule = row.rules.get(R.ra)
    if ra_rule is None and R.ra_in_register and leaf:
        ra_rule = ("same", 0)  # a leaf's return address is still in the link register
    if ra_rule is None or ra_rule[0] == "undef":
        return None  # the outermost frame (_start) says so
    nxt: dict[str, int] = {}
    for num, name in enumerate(R.names):
        rule = ra_rule if num == R.ra else row.rules.get(num)
        if rule is None:
            # callee-saved registers survive; caller-saved ones are unknown in the caller
            if name in R.callee_saved and name in cur:
                nxt[name] = cur[name]
            continue
        kind, n = rule
        if kind == "off":
            v = _read_u64(read_memory, cfa + n)
            if v is None:
                if num == R.ra:
                    return None
                continue
            nxt[name] = v
        elif kind == "val":
            nxt[name] = cfa + n
        elif kind == "reg" and n < len(R.names) and R.names[n] in cur:
            nxt[name] = cur[R.names[n]]
        elif kind == "same" and name in cur:
            nxt[name] = cur[name]
    if R.ra_in_register:
        ra = nxt.get(R.names[R.ra])
        if ra is None:
            return None
        nxt[R.pc] = ra
    nxt[R.sp] = cfa
    return nxt


def _step_fp(cur: dict[str, int], read_memory: ReadMemory, R: CfiRegs = X86_64_CFI) -> dict[str, int] | None:
    fp = cur.get(R.fp)
    if not fp or fp < cur.get(R.sp, 0):
        return None
    saved = _read_u64(read_memory, fp)
    ra = _read_u64(read_memory, fp + 8)
    if saved is None or ra is None:
        return None
    out = {k: v for k, v in cur.items() if k in R.callee_saved and k != R.fp}
    out.update({R.fp: saved, R.pc: ra, R.sp: fp + 16})
    return out


# -- CFA instruction interpreter ---------------------------------------------------------------

def execute(fde: FDE, pc: int) -> _Row:
    """The CFI row in effect at pc (link-time), from the CIE's and the FDE's instructions."""
    cie: CIE = fde.cie
    caf = cie.header["code_alignment_factor"]
    daf = cie.header["data_alignment_factor"]
    row = _Row(_RSP, 8, False, {})
    _run(cie.instructions, row, None, caf, daf, None, None)
    initial = _Row(row.cfa_reg, row.cfa_off, row.cfa_expr, dict(row.rules))
    _run(fde.instructions, row, initial, caf, daf, fde.header["initial_location"], pc)
    return row


def _run(insns: list[Any], row: _Row, initial: _Row | None, caf: int, daf: int,
         loc: int | None, pc: int | None) -> None:
    stack: list[_Row] = []
    for ins in insns:
        name = _opname(ins.opcode)
        a = ins.args
        if name.startswith("DW_CFA_advance_loc") or name == "DW_CFA_set_loc":
            if loc is None or pc is None:
                continue
            new = a[0] if name == "DW_CFA_set_loc" else loc + a[0] * caf
            if new > pc:
                return
            loc = new
        elif name == "DW_CFA_def_cfa":
            row.cfa_reg, row.cfa_off, row.cfa_expr = a[0], a[1], False
        elif name == "DW_CFA_def_cfa_sf":
            row.cfa_reg, row.cfa_off, row.cfa_expr = a[0], a[1] * daf, False
        elif name == "DW_CFA_def_cfa_register":
            row.cfa_reg, row.cfa_expr = a[0], False
        elif name == "DW_CFA_def_cfa_offset":
            row.cfa_off = a[0]
        elif name == "DW_CFA_def_cfa_offset_sf":
            row.cfa_off = a[0] * daf
        elif name == "DW_CFA_def_cfa_expression":
            row.cfa_expr = True
        elif name in ("DW_CFA_offset", "DW_CFA_offset_extended", "DW_CFA_offset_extended_sf"):
            row.rules[a[0]] = ("off", a[1] * daf)
        elif name in ("DW_CFA_val_offset", "DW_CFA_val_offset_sf"):
            row.rules[a[0]] = ("val", a[1] * daf)
        elif name in ("DW_CFA_restore", "DW_CFA_restore_extended"):
            if initial is not None and a[0] in initial.rules:
                row.rules[a[0]] = initial.rules[a[0]]
            else:
                row.rules.pop(a[0], None)
        elif name == "DW_CFA_undefined":
            row.rules[a[0]] = ("undef", 0)
        elif name == "DW_CFA_same_value":
            row.rules[a[0]] = ("same", 0)
        elif name == "DW_CFA_register":
            row.rules[a[0]] = ("reg", a[1])
        elif name in ("DW_CFA_expression", "DW_CFA_val_expression"):
            row.rules[a[0]] = ("undef", 0)  # not evaluated: treat as unknown
        elif name == "DW_CFA_remember_state":
            stack.append(_Row(row.cfa_reg, row.cfa_off, row.cfa_expr, dict(row.rules)))
        elif name == "DW_CFA_restore_state":
            if stack:
                s = stack.pop()
                row.cfa_reg, row.cfa_off, row.cfa_expr, row.rules = s.cfa_reg, s.cfa_off, s.cfa_expr, s.rules
        # DW_CFA_nop, DW_CFA_GNU_args_size (what breaks pyelftools' get_decoded): no effect on rows


_OPNAMES: dict[int, str] = {}


def _opname(opcode: int) -> str:
    if not _OPNAMES:
        from elftools.dwarf import constants

        for k in dir(constants):
            if k.startswith("DW_CFA_"):
                v = getattr(constants, k)
                if isinstance(v, int):
                    _OPNAMES.setdefault(v, k)
    return _OPNAMES.get(int(opcode), f"op{int(opcode):#x}")


# -- .eh_frame_hdr -----------------------------------------------------------------------------

def _eh_frame_hdr_table(elf: ElfImage) -> tuple[list[int], list[int]] | None:
    """(initial locations, FDE offsets within .eh_frame) from the binary-search table."""
    hdr = elf.sections.get(".eh_frame_hdr")
    eh = elf.sections.get(".eh_frame")
    if hdr is None or eh is None:
        return None
    data = elf.data[hdr[1] : hdr[1] + hdr[2]]
    if len(data) < 12 or data[0] != 1 or data[3] != 0x3B:  # datarel|sdata4, what ld writes
        return None
    count_enc = data[2]
    if count_enc != 0x03:  # udata4
        return None
    (count,) = struct.unpack_from("<I", data, 8)
    pairs = struct.unpack_from(f"<{2 * count}i", data, 12)
    base = hdr[0]
    starts = [base + pairs[2 * i] for i in range(count)]
    offsets = [base + pairs[2 * i + 1] - eh[0] for i in range(count)]
    return starts, offsets
