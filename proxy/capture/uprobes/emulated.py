"""Moving an entry probe to the first instruction the kernel emulates (pure).

Theory of operation: a uprobe costs what the kernel does with the probed
instruction. It emulates ``push reg``, ``call rel32``, ``jmp rel``, ``jcc
rel`` and ``nop`` (0.7-0.9 us a hit here) and single-steps everything else
out of line (10-13 us: ``sub rsp``, ``mov``, ``ret``, ``jmp *%rax`` -
measured on this kernel, README "Uprobe capture"). An entry probe may stand
on a later instruction when the poll is still fully known there:

* the instructions before it are one straight line from the entry: no
  branch, call or return, and no branch of the function lands on any of
  them or on the site itself (direct targets and the entries of every
  jump table a rip-relative ``lea`` of the function points at), so the
  site runs exactly once per call, and only through the entry;
* the self register is not written on the way;
* rsp moves only by ``sub/add rsp, imm`` and ``push reg`` (``adjust``: the
  entry's sp is rsp + adjust at the site, the return address is there);
* memory is written only inside the new frame (``[rsp + d]`` with the
  store inside the bytes the prologue took), so neither the return address
  nor the coroutine's ``__state`` change.

The stack slice and the CFI unwinder then start at the site (rip = the
site, rsp = the real one), and the record's sp is the entry's.

Where it applies: rustc 1.63 debug builds (``sub rsp; mov [rsp+d],reg x3;
call``: the call is the site, 10 us less per entry). rustc 1.95 debug
entries end their straight line in the state dispatch's ``jmp *%rax`` (not
emulated): ``moved_entries`` then puts one site in each block of the jump
table (the layout's state count bounds it) - a Suspend block's ``jmp`` after
two loads, the resumed-after-completion blocks' ``jne`` (a loop on a
constant-false condition), and the Unresumed block's first instruction (its
first call is an indirect one through the GOT: single-stepped, but only on a
task's first poll): tokio_bench debug ct 10.4-14.0 -> 7.2-7.6 us of kernel
time per event. Release entries start with ``push`` already. Landing pads
are assumed not to fall inside the prologue (they are blocks of their own
after a call; the prologue has none before the site).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from capstone import CS_ARCH_X86, CS_MODE_64, CS_OP_IMM, CS_OP_MEM, CS_OP_REG, Cs  # type: ignore[import-untyped]

_md = Cs(CS_ARCH_X86, CS_MODE_64)
_md.detail = True
_GRP_JUMP, _GRP_CALL, _GRP_RET, _GRP_INT, _GRP_IRET, _GRP_BRANCH_RELATIVE = 1, 2, 3, 4, 5, 7

_ALIASES = {
    "rdi": {"rdi", "edi", "di", "dil"},
    "rsi": {"rsi", "esi", "si", "sil"},
    "rsp": {"rsp", "esp", "sp", "spl"},
}
_PUSH_REGS = {"rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp",
              "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"}
MAX_PROLOGUE = 32  # instructions looked at before giving up
# Prefixes with which the kernel probes no instruction (arch/x86/kernel/uprobes.c is_prefix_bad:
# ES, CS, SS, DS segment overrides and LOCK; uprobe_init_insn answers ENOTSUPP, and a
# uprobe_multi link with one such site fails whole: error 524). rustc pads with
# ``nop word ptr cs:[rax+rax]`` (66 2e 0f 1f 84 ..): a moved entry must not stand there
# (tokio's wake_by_ref in the axum service's release build did: every probe lost).
BAD_PREFIXES = frozenset({0x26, 0x2E, 0x36, 0x3E, 0xF0})


@dataclass(frozen=True, slots=True)
class MovedEntry:
    addr: int  # link-time address of the emulated instruction
    adjust: int  # entry sp = rsp at the site + adjust


def emulated(insn) -> bool:  # type: ignore[no-untyped-def]
    """Does the kernel emulate this instruction (arch/x86/kernel/uprobes.c
    branch_setup_xol_ops / push_setup_xol_ops), instead of stepping it out of line?"""
    b = bytes(insn.bytes)
    if BAD_PREFIXES & set(insn.prefix):
        return False  # the kernel refuses to probe it at all (see BAD_PREFIXES)
    if 0x66 in insn.prefix and insn.mnemonic != "nop":
        return False  # an operand-size prefix: the kernel refuses to emulate it
    m = insn.mnemonic
    if m == "nop":
        return len(b) != 5  # a 5-byte nop is rewritten into a call: memory shows other bytes
    if m == "push":
        return len(insn.operands) == 1 and insn.operands[0].type == CS_OP_REG \
            and insn.reg_name(insn.operands[0].reg) in _PUSH_REGS
    groups = set(insn.groups)
    if m == "call":
        return b[0] == 0xE8
    if _GRP_JUMP in groups:
        return _GRP_BRANCH_RELATIVE in groups and insn.operands and insn.operands[0].type == CS_OP_IMM \
            and not m.startswith(("jrcxz", "jecxz", "loop"))
    return False


def branch_targets(code: bytes, low_pc: int, high_pc: int,
                   read: Callable[[int, int], bytes | None], skip_table: int | None = None) -> set[int]:
    """Every address in the function a branch may land on: direct jump and call
    targets, and the entries of the jump tables its rip-relative `lea`s point at
    (rustc's ``lea rax,[rip+T]; movsxd rcx,[rax+rcx*4]; add rax,rcx; jmp rax``),
    but for the table at `skip_table` (its entries are known exactly elsewhere)."""
    out: set[int] = set()
    for i in _md.disasm(code, low_pc):
        groups = set(i.groups)
        if (_GRP_JUMP in groups or _GRP_CALL in groups) and i.operands and i.operands[0].type == CS_OP_IMM:
            out.add(i.operands[0].imm)
        if i.mnemonic == "lea" and len(i.operands) == 2 and i.operands[1].type == CS_OP_MEM:
            mem = i.operands[1].mem
            if i.reg_name(mem.base) != "rip" or mem.index:
                continue
            table = i.address + i.size + mem.disp
            if low_pc <= table < high_pc or table == skip_table:
                continue  # code, not a table; or the dispatch's own
            for k in range(4096):
                raw = read(table + 4 * k, 4)
                if raw is None or len(raw) < 4:
                    break
                (d,) = struct.unpack("<i", raw)
                t = table + d
                if not low_pc <= t < high_pc:
                    break
                out.add(t)
    return out


def moved_entry(code: bytes, low_pc: int, high_pc: int, self_reg: str,
                read: Callable[[int, int], bytes | None]) -> MovedEntry | str:
    """The first emulated instruction every call reaches with the poll still
    known (see the module docstring), or why there is none. At the entry
    itself when the first instruction is emulated (adjust 0)."""
    got = moved_entries(code, low_pc, high_pc, self_reg, read)
    return got[0] if isinstance(got, list) else got


def moved_entries(code: bytes, low_pc: int, high_pc: int, self_reg: str,
                  read: Callable[[int, int], bytes | None], n_states: int | None = None) -> list[MovedEntry] | str:
    """Where the entry probe(s) of a call may stand, or why only the entry will do.

    One site: the first emulated instruction of the straight line from the
    entry. Or, when that line ends in rustc's state dispatch (``lea rax,[rip+T];
    movsxd rcx,[rax+rcx*4]; add rax,rcx; jmp rax``, `n_states` entries in T:
    the layout's ``__state`` values), one site in each block the table leads
    to: every call takes exactly one entry of the table, so every call passes
    exactly one of them. A block's site is its first emulated instruction, or
    the block's first instruction when a call or a branch comes first (single-
    stepped, as the entry was, but only on that state's polls). Each block must
    be entered only through the table: no fall-through from the instruction
    before it, and no branch landing on it or before its site (a branch that
    can never be taken does not count: rustc's resumed-after-completion blocks
    loop on ``xor eax,eax; test al,1; jne <block>``)."""
    insns = list(_md.disasm(code, low_pc))
    at = {i.address: n for n, i in enumerate(insns)}
    self_names = _ALIASES.get(self_reg, {self_reg})
    walked = _walk(insns, 0, 0, self_names)
    if isinstance(walked, str):
        return walked
    kind, k, adjust, table = walked
    site = insns[k]
    if kind == "site":
        if site.address == low_pc:
            return [MovedEntry(low_pc, 0)]
        landing = {t for t in branch_targets(code, low_pc, high_pc, read) if low_pc < t <= site.address}
        if landing:
            return f"a branch lands at {min(landing):#x}, inside the prologue"
        return [MovedEntry(site.address, adjust)]
    # the state dispatch
    why = f"'{site.mnemonic} {site.op_str}' at {site.address:#x} is single-stepped and ends the straight line"
    if table is None or not n_states:
        return why
    targets = []
    for v in range(n_states):
        raw = read(table + 4 * v, 4)
        if raw is None or len(raw) < 4:
            return why + " (its jump table is unreadable)"
        t = table + struct.unpack("<i", raw)[0]
        if t not in at:
            return why + f" (table entry {v} -> {t:#x} is not an instruction of the function)"
        targets.append(t)
    landing = _direct_landings(insns) | branch_targets(code, low_pc, high_pc, read, skip_table=table)
    if any(low_pc < t <= site.address for t in landing):
        return f"a branch lands at {min(t for t in landing if low_pc < t <= site.address):#x}, inside the prologue"
    out: list[MovedEntry] = []
    for t in sorted(set(targets)):
        n = at[t]
        if n == 0 or not _ends_flow(insns[n - 1]):
            return f"the dispatch target {t:#x} is also reached by falling through"
        got = _walk(insns, n, adjust, self_names, budget=MAX_PROLOGUE)
        if isinstance(got, str) or got[0] != "site":
            k, block_adjust = n, adjust  # a call or branch first: the block's first instruction
        else:
            k, block_adjust = got[1], got[2]
        end = insns[k].address
        if any(t <= x <= end for x in landing if not _never_taken_to(insns, x)) \
                or any(t < u <= end for u in targets):
            return f"a branch lands inside the dispatch target {t:#x} before its site"
        out.append(MovedEntry(end, block_adjust))
    return out


def _walk(insns: list, n: int, adjust: int, self_names: set[str],  # type: ignore[type-arg]
          budget: int = MAX_PROLOGUE) -> tuple[str, int, int, int | None] | str:
    """From insns[n] on, with rsp `adjust` below the entry's: ("site", index, adjust,
    None) at the first emulated instruction, ("dispatch", index of the jmp,
    adjust, table) at rustc's jump-table dispatch, or why the line is unsafe."""
    table = None
    for k in range(n, min(len(insns), n + budget)):
        i = insns[k]
        if emulated(i):
            return "site", k, adjust, None
        groups = set(i.groups)
        if groups & {_GRP_JUMP, _GRP_CALL, _GRP_RET, _GRP_INT, _GRP_IRET}:
            if i.mnemonic == "jmp" and i.operands and i.operands[0].type == CS_OP_REG and table is not None:
                return "dispatch", k, adjust, table
            return f"'{i.mnemonic} {i.op_str}' at {i.address:#x} is single-stepped and ends the straight line"
        _regs_read, regs_write = i.regs_access()
        written = {i.reg_name(r) for r in regs_write}
        if written & self_names:
            return f"'{i.mnemonic} {i.op_str}' at {i.address:#x} writes the self register"
        if written & _ALIASES["rsp"]:
            imm = i.operands[1].imm if len(i.operands) == 2 and i.operands[1].type == CS_OP_IMM else None
            dst = i.reg_name(i.operands[0].reg) if i.operands and i.operands[0].type == CS_OP_REG else None
            if dst != "rsp" or imm is None or i.mnemonic not in ("sub", "add"):
                return f"'{i.mnemonic} {i.op_str}' at {i.address:#x} moves rsp by an unknown amount"
            adjust += imm if i.mnemonic == "sub" else -imm
            if adjust < 0:
                return f"rsp above the entry's at {i.address:#x}"
        if i.operands and i.operands[0].type == CS_OP_MEM and _writes_first_operand(i):
            mem = i.operands[0].mem
            base = i.reg_name(mem.base) if mem.base else None
            if base != "rsp" or mem.index or mem.disp < 0 or mem.disp + i.operands[0].size > adjust:
                return f"'{i.mnemonic} {i.op_str}' at {i.address:#x} writes memory outside the new frame"
        if i.mnemonic == "lea" and len(i.operands) == 2 and i.operands[1].type == CS_OP_MEM:
            mem = i.operands[1].mem
            if i.reg_name(mem.base) == "rip" and not mem.index:
                table = i.address + i.size + mem.disp
    if n + budget < len(insns):
        return f"no emulated instruction in the first {budget}"
    return "the function ends before an emulated instruction"


def _direct_landings(insns: list) -> set[int]:  # type: ignore[type-arg]
    out = set()
    for i in insns:
        groups = set(i.groups)
        if (_GRP_JUMP in groups or _GRP_CALL in groups) and i.operands and i.operands[0].type == CS_OP_IMM:
            out.add(i.operands[0].imm)
    return out


def _ends_flow(i) -> bool:  # type: ignore[no-untyped-def]
    """No fall-through past this instruction: jmp (any), ret, ud2, int3."""
    return i.mnemonic in ("jmp", "ret", "ud2", "int3")


def _never_taken_to(insns: list, target: int) -> bool:  # type: ignore[type-arg]
    """Every branch to `target` (inside [lo, hi]) is rustc's constant-false loop
    ``xor eax,eax; test al,1; jne target`` (al is 0: ZF set, jne never jumps)."""
    found = False
    for k, i in enumerate(insns):
        if not (i.operands and i.operands[0].type == CS_OP_IMM and i.operands[0].imm == target):
            continue
        groups = set(i.groups)
        if not (_GRP_JUMP in groups or _GRP_CALL in groups):
            continue
        if not (i.mnemonic in ("jne", "jnz") and k >= 2 and _is_xor_eax(insns[k - 2])
                and insns[k - 1].mnemonic == "test" and insns[k - 1].op_str.replace(" ", "") in ("al,1", "al,0x1")):
            return False
        found = True
    return found


def _is_xor_eax(i) -> bool:  # type: ignore[no-untyped-def]
    return i.mnemonic == "xor" and i.op_str.replace(" ", "") in ("eax,eax", "rax,rax")


def _writes_first_operand(i) -> bool:  # type: ignore[no-untyped-def]
    """A store: capstone's access flag for the destination operand (cmp/test only read it)."""
    access = getattr(i.operands[0], "access", 0)
    return bool(access & 2)  # CS_AC_WRITE
