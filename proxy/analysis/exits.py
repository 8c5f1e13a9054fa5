"""Where a resume function returns or leaves, decoded with capstone (the inventory's step 4):
instructions in ``CS_GRP_RET``, calls to ``_Unwind_Resume`` (direct, through its PLT stub or
its GOT slot), and direct jumps that leave the function (tail jumps). Register-indirect jumps
are jump tables inside the function and are not exits. x86-64 here; A64 in exits_aarch64.py.

capstone, numpy and pyelftools are imported where they are used: a program without a
coroutine never gets here, and a cold analysis imports them after its unit walker started.
"""

from __future__ import annotations

import re
import struct
from typing import TYPE_CHECKING

from . import exits_aarch64
from .elf import ElfImage

if TYPE_CHECKING:
    import capstone
    from elftools.elf.elffile import ELFFile
    from elftools.elf.relocation import RelocationSection


# mnemonics of x86 instructions in capstone's RET, CALL or JUMP group (jcc, jmp, ljmp,
# j*cxz, loop*, call, lcall, ret, retf, iret*, sysret, xbegin)
_BRANCHY = ("j", "call", "ret", "loop", "ljmp", "lcall", "iret", "sysret", "xbegin")
_RIP_SLOT = re.compile(r"^qword ptr \[rip ([+-]) (0x[0-9a-f]+)\]$")
# the x86 jumps to a relative (immediate) target: capstone's JUMP group, no RET or CALL
_IMM_JUMPS = frozenset({"jmp", "jo", "jno", "jb", "jae", "je", "jne", "jbe", "ja", "js", "jns", "jp", "jnp",
                        "jl", "jge", "jle", "jg", "jcxz", "jecxz", "jrcxz", "loop", "loope", "loopne"})


class ExitFinder:
    aarch64 = False  # the ELF is AArch64's: exits_aarch64.py decodes A64

    def __init__(self, elf: ElfImage, warnings: list[str]) -> None:
        import capstone

        self.elf = elf
        self.warnings = warnings
        self.aarch64 = elf.machine == "EM_AARCH64"
        self.cs = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        self.cs.detail = True
        self.lite = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        self.unwind_targets, self.unwind_slots = _unwind_resume_sites(elf, warnings)

    def exits(self, low: int, high: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        code = self.elf.read(low, high - low)
        if code is None:
            self.warnings.append(f"no code bytes for {low:#x}..{high:#x}")
            return (), ()
        if self.aarch64:
            return exits_aarch64.exits(code, low, high, self.unwind_targets)
        rets: list[int] = []
        other: list[int] = []
        unwind = self.unwind_targets
        for addr, size, mnemonic, ops in self.lite.disasm_lite(code, low):
            # the detailed decode (~50 µs an instruction) only for what can be a ret, a
            # call or a jump: the mnemonic tells (prefixed forms: "bnd jmp", "notrack call")
            if not (mnemonic.startswith(_BRANCHY) or " " in mnemonic):
                continue
            # the common forms without it (a debug build's function holds hundreds): a plain
            # ret, a call or a jump (jmp, jcc, loop*, j*cxz) to an immediate address, printed
            # "0x..." by capstone; the same verdicts as the detailed decode's groups below
            if mnemonic == "ret":
                rets.append(addr)
                continue
            if ops.startswith("0x") and (mnemonic == "call" or mnemonic in _IMM_JUMPS):
                target = int(ops, 16)
                if (target in unwind) if mnemonic == "call" else not (low <= target < high):
                    other.append(addr)
                continue
            if mnemonic == "call" or mnemonic == "jmp":
                if ops.isalnum():  # through a register: no target known (a jump table's jmp)
                    continue
                m = _RIP_SLOT.match(ops)
                if m is not None:  # through a slot at rip + disp (a GOT entry): always leaves
                    slot = addr + size + (int(m[2], 16) if m[1] == "+" else -int(m[2], 16))
                    if mnemonic == "jmp" or slot in self.unwind_slots:
                        other.append(addr)
                    continue
            elif mnemonic.startswith("lock "):  # lock prefixes no branch
                continue
            insn = next(self.cs.disasm(code[addr - low : addr - low + size], addr), None)
            kind = self.exit_kind(insn, low, high) if insn is not None else None
            if kind == "ret":
                rets.append(addr)
            elif kind == "other":
                other.append(addr)
        return tuple(rets), tuple(other)

    def exit_kind(self, insn: capstone.CsInsn, low: int, high: int) -> str | None:
        """From the detailed decode: "ret" (capstone's RET group), "other" (a call to
        _Unwind_Resume, a jump that leaves the function) or None."""
        import capstone

        if insn.group(capstone.CS_GRP_RET):
            return "ret"
        if insn.group(capstone.CS_GRP_CALL):
            return "other" if self._calls_unwind(insn) else None
        if insn.group(capstone.CS_GRP_JUMP) and self._leaves(insn, low, high):
            return "other"
        return None

    def _target(self, insn: capstone.CsInsn) -> tuple[str, int] | None:
        from capstone import x86 as cs_x86

        if not insn.operands:
            return None
        op = insn.operands[0]
        if op.type == cs_x86.X86_OP_IMM:
            return "imm", int(op.imm)
        if op.type == cs_x86.X86_OP_MEM and op.mem.base == cs_x86.X86_REG_RIP and op.mem.index == 0:
            return "mem", insn.address + insn.size + int(op.mem.disp)
        return None

    def _calls_unwind(self, insn: capstone.CsInsn) -> bool:
        t = self._target(insn)
        if t is None:
            return False
        kind, addr = t
        return addr in (self.unwind_targets if kind == "imm" else self.unwind_slots)

    def _leaves(self, insn: capstone.CsInsn, low: int, high: int) -> bool:
        t = self._target(insn)
        if t is None:
            return False  # register-indirect: a jump table inside the function
        kind, addr = t
        return kind == "mem" or not (low <= addr < high)


def _unwind_resume_sites(elf: ElfImage, warnings: list[str]) -> tuple[set[int], set[int]]:
    """Addresses a call to _Unwind_Resume can target: the function or PLT stub, and GOT slots."""
    return import_sites(elf, "_Unwind_Resume", warnings, "panic exits through the PLT are not found")


def import_sites(elf: ElfImage, name: str, warnings: list[str], consequence: str = "") -> tuple[set[int], set[int]]:
    """Where a call to function `name` can go in `elf` (link-time addresses):
    the function itself when defined here, or its PLT stub; and the GOT slots
    that hold its address."""

    import numpy as np
    from elftools.common.exceptions import ELFError, ELFParseError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.relocation import RelocationSection

    targets = {s.addr for s in elf.symbols if s.name.split("@", 1)[0] == name}
    slots: set[int] = set()
    try:
        ef = ELFFile(elf.stream())
        for sec in ef.iter_sections():
            if not isinstance(sec, RelocationSection) or sec.name not in elf.sections:
                continue
            if not sec.is_RELA() or sec["sh_entsize"] != 24 or ef.elfclass != 64:
                slots |= _reloc_slots_slow(ef, sec, name)
                continue
            symtab = ef.get_section(sec["sh_link"])
            idx = _symbol_indices(symtab.data(), ef.get_section(symtab["sh_link"]).data(), name)
            if not idx:
                continue
            rel = np.frombuffer(sec.data(), dtype=np.dtype([("off", "<u8"), ("info", "<u8"), ("add", "<i8")]))
            hit = np.isin(rel["info"] >> np.uint64(32), np.array(sorted(idx), dtype=np.uint64))
            slots.update(int(o) for o in rel["off"][hit])
    except (ELFError, ELFParseError, struct.error, ValueError, AttributeError) as e:
        warnings.append(f"relocations unreadable ({e})" + (f": {consequence}" if consequence else ""))
    targets |= _plt_stubs_for(elf, slots)
    return targets, slots


def _symbol_indices(symtab: bytes, strtab: bytes, name: str) -> set[int]:
    """Indices of the ELF64 symbols whose name, up to an ``@version``, is ``name``:
    the name's occurrences in the string table (a merged table can point into the tail
    of a longer string), then the symbols naming one of them."""

    want = name.encode()
    offs: list[int] = []
    p = strtab.find(want)
    while p >= 0:
        if strtab[p + len(want):p + len(want) + 1] in (b"\0", b"@"):
            offs.append(p)
        p = strtab.find(want, p + 1)
    if not offs:
        return set()
    import numpy as np

    syms = np.frombuffer(symtab, dtype=np.dtype([("name", "<u4"), ("rest", "V20")]), count=len(symtab) // 24)
    return {int(i) for i in np.nonzero(np.isin(syms["name"], np.array(offs, dtype=np.uint32)))[0] if i}


def _reloc_slots_slow(ef: ELFFile, sec: RelocationSection, name: str) -> set[int]:
    symtab = ef.get_section(sec["sh_link"])
    out: set[int] = set()
    for r in sec.iter_relocations():
        sym = symtab.get_symbol(r["r_info_sym"]) if r["r_info_sym"] else None
        if sym is not None and sym.name.split("@", 1)[0] == name:
            out.add(r["r_offset"])
    return out


def _plt_stubs_for(elf: ElfImage, slots: set[int]) -> set[int]:
    import capstone
    from capstone import x86 as cs_x86

    if elf.machine == "EM_AARCH64":
        return exits_aarch64.plt_stubs_for(elf, slots)
    out: set[int] = set()
    if not slots:
        return out
    cs = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    cs.detail = True
    for name in (".plt", ".plt.sec", ".plt.got"):
        sec = elf.sections.get(name)
        if sec is None:
            continue
        addr, off, size = sec
        for insn in cs.disasm(elf.data[off : off + size], addr):
            if insn.group(capstone.CS_GRP_JUMP) and insn.operands:
                op = insn.operands[0]
                if op.type == cs_x86.X86_OP_MEM and op.mem.base == cs_x86.X86_REG_RIP:
                    if insn.address + insn.size + op.mem.disp in slots:
                        out.add(addr + ((insn.address - addr) & ~0xF))
    return out
