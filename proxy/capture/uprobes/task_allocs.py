"""async-task's spawns where the new task's pointer is known: found in the binary (pure).

Theory of operation. async-task makes every task in ``RawTask<F, T, S, M>::allocate``:
it allocates the task (``alloc::alloc::alloc(layout)``), then writes the task's
header, whose ``vtable`` field is ``&Self::TASK_VTABLE``, a static of its own per
task type. Its entry knows nothing of the task; its allocation's return value is
the task's pointer, which the runtime adapter keys the task by (the header's
address; the wakes map too). A release build inlines ``allocate`` (and
``spawn_unchecked``) into the executor's spawn (smol's ``Executor::spawn``), so
the sites come from the code, not from a function's name:

* the statics are the ``TaskVTable``s whose ``run`` slot the analysis knows
  (``Inventory.task_run_slots``, the adapter's own: one per task type);
* each ``lea reg, [rip + d]`` (or, in a PIE, ``mov reg, [rip + d]`` from a GOT
  slot holding it) that resolves to one is the header's write in a spawn path
  (a byte search of the code, then the containing function disassembled);
* the allocation is the ``call`` whose return value (rax, then the registers it
  is copied to) is the base of the vtable's store ``mov [base + vtable's
  offset], reg`` (optimised code: ``call __rust_alloc; test rax, rax; je
  abort; mov r14, rax; lea rax, [rip + VT]; mov [r14], rax``). A debug build
  builds the header on its stack and copies it, so no register links them:
  there the allocation is the last call before the ``lea`` to one of the
  standard library's allocation functions (``ALLOCATORS``);
* the probe stands on the first instruction the kernel emulates after that
  call (the null check's ``je``, a debug build's ``jmp``) when the way there
  is straight, no branch lands on it, and rax is not written: the record
  carries rax, the task's pointer (``REG_RAX``). A null rax (the allocation
  failed: async-task aborts) keys nothing.

A spawn path found here replaces ``allocate``'s entry probe in the function it
lies in (its records had no key); an ``allocate`` whose path is not found keeps
its entry probe, and the plan says why.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from proxy.analysis.elf import ElfImage
from proxy.analysis.model import Inventory

from .bpf import KIND_SPAWN, REG_RAX, SiteSpec
from .decode import SiteInfo
from .sites import Site, file_offset, insn_length

WINDOW = 6  # instructions after the allocation's call looked at, the probe included
STORE_REACH = 48  # instructions after the lea within which the vtable's store is looked for
# the standard library's allocation functions (a debug build calls alloc::alloc::alloc)
ALLOCATORS = re.compile(r"^(?:alloc::alloc::(?:alloc|Global::alloc_impl)|__rust_alloc|__rustc::__rust_alloc"
                        r"|__rdl_alloc|__rg_alloc|malloc)$")
# lea/mov reg, qword ptr [rip + disp32]: REX.W(+R) 8D/8B modrm(mod 00, rm 101)
_RIP_OPERAND = re.compile(rb"[\x48\x4c][\x8d\x8b][\x05\x0d\x15\x1d\x25\x2d\x35\x3d]", re.S)
_CALLER_SAVED = ("rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11")


@dataclass(frozen=True, slots=True)
class AllocSite:
    site: int  # link address of the probed instruction (rax: the task)
    call: int  # the allocation's call
    vtable: int  # the TaskVTable stored into the task's header
    how: str  # "data flow" / "nearest allocator call"


def task_vtables(inv: Inventory) -> dict[int, str]:
    """Link address of each async-task ``TaskVTable`` static -> its future's type."""
    from proxy.reflect.adapters.async_task import VTABLE

    vt = inv.types.get(VTABLE)
    run = vt.field("run") if vt is not None else None
    if run is None:
        return {}
    return {slot - run.offset: fut for slot, fut in inv.task_run_slots.items()}


def header_vtable_offset(inv: Inventory) -> int | None:
    from proxy.reflect.adapters.async_task import header_type

    h = header_type(inv)
    f = h.field("vtable") if h is not None else None
    return f.offset if f is not None else None


def find_alloc_sites(elf: ElfImage, inv: Inventory) -> tuple[list[AllocSite], list[str]]:
    """Every spawn path's allocation site (see the module's doc), and why some were not found."""
    from .emulated import _md

    vts = task_vtables(inv)
    vt_off = header_vtable_offset(inv)
    if not vts or vt_off is None:
        return [], []
    slots = got_slots(elf, set(vts))
    refs: list[tuple[int, int]] = []  # (instruction address, vtable)
    for seg in elf.segments:
        if not seg.flags & 1 or not seg.filesz:
            continue
        code = elf.read(seg.vaddr, seg.filesz) or b""
        for m in _RIP_OPERAND.finditer(code):
            end = seg.vaddr + m.start() + 7
            dest = end + struct.unpack_from("<i", code, m.start() + 3)[0]
            if code[m.start() + 1] == 0x8D and dest in vts:
                refs.append((end - 7, dest))
            elif code[m.start() + 1] == 0x8B and dest in slots:
                refs.append((end - 7, slots[dest]))
    out: dict[int, AllocSite] = {}
    notes: list[str] = []
    funcs: dict[int, list] = {}  # type: ignore[type-arg]
    for at, vt in refs:
        sym = elf.symbol_at(at)
        if sym is None or not sym.size:
            continue
        insns = funcs.get(sym.addr)
        if insns is None:
            insns = funcs[sym.addr] = list(_md.disasm(elf.read(sym.addr, sym.size) or b"", sym.addr))
        idx = next((k for k, i in enumerate(insns) if i.address == at), None)
        if idx is None:
            continue  # the bytes were inside another instruction
        got = _alloc_of(elf, insns, idx, vt_off)
        if isinstance(got, str):
            notes.append(f"async-task spawn in {sym.demangled[:80]}: {got}")
            continue
        call_k, how = got
        site = _site_after(elf, insns, call_k, sym.addr, sym.addr + sym.size)
        if isinstance(site, str):
            notes.append(f"async-task spawn in {sym.demangled[:80]}: {site}")
            continue
        out.setdefault(site, AllocSite(site, insns[call_k].address, vt, how))
    return sorted(out.values(), key=lambda a: a.site), notes


def alloc_spawn_sites(elf: ElfImage, inv: Inventory, bias: int) -> tuple[list[Site], list[str]]:
    sites = []
    found, notes = find_alloc_sites(elf, inv)
    for a in found:
        off = file_offset(elf, a.site)
        if off is None:
            continue
        sym = elf.symbol_at(a.site)
        name = f"async-task allocation in {sym.demangled if sym is not None else hex(a.site)}"[:200]
        original = elf.read(a.site, insn_length(elf, a.site)) or b""
        sites.append(Site(name, a.site + bias, off, original, SiteSpec(KIND_SPAWN, REG_RAX),
                          SiteInfo(KIND_SPAWN, a.site + bias, a.site + bias)))
    return sites, notes


_SUB = {f"{p}{x}": f"r{p}x" for p in "abcd" for x in ("x", "l", "h")}
_SUB.update({f"e{p}x": f"r{p}x" for p in "abcd"})
_SUB.update({n: f"r{b}" for b in ("si", "di", "sp", "bp") for n in (b, f"e{b}", f"{b}l")})


def _reg64(name: str) -> str:
    """The 64-bit register a capstone register name is part of (eax, al -> rax; r14d -> r14)."""
    if name.startswith("r") and name[1:2].isdigit():
        return name.rstrip("dwb")
    return _SUB.get(name, name)


def _alloc_of(elf: ElfImage, insns: list, idx: int, vt_off: int) -> tuple[int, str] | str:  # type: ignore[type-arg]
    """(index of the allocation's call, how it was found) for the lea at insns[idx]."""
    from capstone import CS_OP_MEM, CS_OP_REG  # type: ignore[import-untyped]

    lea = insns[idx]
    holds_vt = {_reg64(lea.reg_name(lea.operands[0].reg))}
    base = None
    for i in insns[idx + 1:idx + 1 + STORE_REACH]:
        ops = i.operands
        if i.mnemonic == "mov" and len(ops) == 2 and ops[0].type == CS_OP_MEM and ops[1].type == CS_OP_REG \
                and _reg64(i.reg_name(ops[1].reg)) in holds_vt and ops[0].mem.disp == vt_off \
                and not ops[0].mem.index:
            base = _reg64(i.reg_name(ops[0].mem.base))
            break
        if i.mnemonic == "mov" and len(ops) == 2 and ops[0].type == CS_OP_REG and ops[1].type == CS_OP_REG \
                and _reg64(i.reg_name(ops[1].reg)) in holds_vt:
            holds_vt.add(_reg64(i.reg_name(ops[0].reg)))
            continue
        _r, written = i.regs_access()
        holds_vt -= {_reg64(i.reg_name(r)) for r in written}
        if not holds_vt or i.mnemonic.startswith(("ret", "jmp")):
            break
    if base is not None and base not in ("rsp", "rbp"):
        origin = _origins_at(insns, idx, base)
        if origin is not None:
            return origin, "data flow"
    # a debug build: the header is built on the stack; the nearest allocation call before
    for k in range(idx - 1, -1, -1):
        name = _callee_name(elf, insns[k])
        if name is not None and ALLOCATORS.match(name):
            return k, "nearest allocator call"
    return "no allocation call whose result the task's vtable is stored into"


def _origins_at(insns: list, idx: int, base: str) -> int | None:  # type: ignore[type-arg]
    """Index of the call whose return value `base` holds at insns[idx] (one pass in address
    order from the function's start: rax after a call, copies by ``mov reg, reg``)."""
    from capstone import CS_OP_REG  # type: ignore[import-untyped]

    from .emulated import _GRP_CALL

    held: dict[str, int] = {}
    for k, i in enumerate(insns[:idx]):
        if _GRP_CALL in set(i.groups):
            for r in _CALLER_SAVED:
                held.pop(r, None)
            held["rax"] = k
            continue
        ops = i.operands
        if i.mnemonic == "mov" and len(ops) == 2 and ops[0].type == CS_OP_REG and ops[1].type == CS_OP_REG \
                and i.reg_name(ops[0].reg).startswith("r") and not i.reg_name(ops[0].reg).endswith(("d", "w", "b")):
            src = _reg64(i.reg_name(ops[1].reg))
            dst = _reg64(i.reg_name(ops[0].reg))
            if src in held:
                held[dst] = held[src]
            else:
                held.pop(dst, None)
            continue
        _r, written = i.regs_access()
        for r in written:
            held.pop(_reg64(i.reg_name(r)), None)
    return held.get(base)


def _callee_name(elf: ElfImage, insn) -> str | None:  # type: ignore[no-untyped-def]
    """The demangled name of a call's target (direct, or through a GOT slot), None: not a call."""
    from capstone import CS_OP_IMM, CS_OP_MEM  # type: ignore[import-untyped]

    from proxy.analysis.demangle import demangle_or_raw

    from .emulated import _GRP_CALL

    if _GRP_CALL not in set(insn.groups) or not insn.operands:
        return None
    op = insn.operands[0]
    target = None
    if op.type == CS_OP_IMM:
        target = int(op.imm)
    elif op.type == CS_OP_MEM and insn.reg_name(op.mem.base) == "rip" and not op.mem.index:
        raw = elf.read(insn.address + insn.size + op.mem.disp, 8)
        target = struct.unpack("<Q", raw)[0] if raw and len(raw) == 8 else None
    sym = elf.symbol_at(target) if target else None
    if sym is None or sym.addr != target:
        return None
    return demangle_or_raw(sym.name)


def _site_after(elf: ElfImage, insns: list, call_k: int, low: int, high: int) -> int | str:  # type: ignore[type-arg]
    """The first emulated instruction after the call at insns[call_k] on a straight line that
    keeps rax and that no branch lands on."""
    from .emulated import _GRP_CALL, _GRP_JUMP, _GRP_RET, branch_targets, emulated

    code = elf.read(low, high - low) or b""
    landings = branch_targets(code, low, high, elf.read)
    call = insns[call_k]
    for i in insns[call_k + 1:call_k + 1 + WINDOW]:
        if i.address in landings:
            return f"a branch lands at 0x{i.address:x}, after the allocation's call at 0x{call.address:x}"
        if emulated(i):
            return int(i.address)
        _r, written = i.regs_access()
        if set(i.groups) & {_GRP_JUMP, _GRP_CALL, _GRP_RET} or "rax" in {_reg64(i.reg_name(r)) for r in written}:
            return f"the way from the allocation's call at 0x{call.address:x} branches or writes rax first"
    return f"no emulated instruction within {WINDOW} after the allocation's call at 0x{call.address:x}"


def got_slots(elf: ElfImage, targets: set[int]) -> dict[int, int]:
    """GOT slot -> the target it holds (R_X86_64_RELATIVE relocations whose addend is one)."""
    rela = elf.section_data(".rela.dyn") or b""
    out = {}
    for off in range(0, len(rela) - 23, 24):
        r_off, info, add = struct.unpack_from("<QQq", rela, off)
        if info & 0xffffffff == 8 and add in targets:  # R_X86_64_RELATIVE
            out[r_off] = add
    return out
