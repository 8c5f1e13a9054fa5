"""Exit probes in the callers, on an instruction the kernel emulates (pure).

Theory of operation: a resume function's exits are its ``ret``s, which the
kernel single-steps out of line (~10 µs a hit here, more under load; an
emulated ``jcc``/``jmp``/``push``/``call`` costs ~1 µs). A poll also ends
where its caller goes on: after the ``call`` of the resume function. When
every way back from the function leads to one of a few known places, the
exit probes can stand there instead, on the first emulated instruction after
each ``call`` (typically the conditional jump on the ``Poll`` result). The
rules, all checked or the function keeps its ``ret`` probes:

* every reference to the function in the binary is a direct ``call rel32``
  at an instruction boundary of a known function: no ``jmp`` to it (a tail
  call returns elsewhere), no rip-relative ``lea`` or other displacement
  resolving to it, and its address in no data section and no dynamic
  relocation's addend (a function pointer or vtable: an indirect call from
  anywhere);
* after each ``call``, the instructions up to the probe are a straight line
  of at most ``MAX_WINDOW`` instructions that neither branch nor move rsp
  (so rsp at the probe is the entry's sp + 8, the return address popped),
  the probe's instruction is emulated, and no branch of the caller (direct
  targets and the entries of its jump tables) lands on any of them or on the
  probe itself: the probe runs exactly once per return, and only then;
* landing pads (the unwinding path) are blocks of their own reached through
  the caller's LSDA, never the fall-through after a ``call`` (they receive
  the exception in rax; the normal return does not): they are not looked up.
  Unwinding out of the function still has its own unwind-exit probes.

The exit record's sp is then rsp - 8 (the site's ``sp_adjust``), the scope
key the same (CFA rule rsp + 0). All-or-nothing per function: mixing ``ret``
and caller probes would count an exit twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from proxy.analysis.elf import ElfImage

from capstone import CS_OP_MEM  # type: ignore[import-untyped]

from .emulated import _GRP_CALL, _GRP_JUMP, _GRP_RET, _md, branch_targets, emulated

MAX_WINDOW = 6  # instructions after the call looked at, the probe included
_DATA_SECTIONS = (".data.rel.ro", ".data", ".rodata", ".got", ".init_array", ".fini_array", ".rela.dyn",
                  ".data.rel.ro.local", ".tdata")
_WRITES_RSP = {"push", "pop", "leave", "enter", "pushfq", "popfq", "call", "ret"}


@dataclass(frozen=True, slots=True)
class CallerExit:
    addr: int  # link-time address of the emulated instruction after the call
    call: int  # the call instruction's address


def _rel32_hits(text: bytes, text_addr: int, targets: np.ndarray) -> dict[int, list[int]]:
    """Positions q in `text` whose int32 at q resolves (q + 4 + v) to one of
    `targets`: every rel32 displacement that may point at them. -> target: [q]."""
    n = len(text) - 3
    if n <= 0:
        return {}
    buf = np.frombuffer(text, dtype=np.uint8)
    out: dict[int, list[int]] = {}
    for shift in range(4):
        m = (n - shift) // 4
        if m <= 0:
            continue
        vals = np.frombuffer(buf[shift:shift + 4 * m].tobytes(), dtype="<i4").astype(np.int64)
        pos = text_addr + shift + 4 * np.arange(m, dtype=np.int64)
        dest = pos + 4 + vals
        hit = np.nonzero(np.isin(dest, targets))[0]
        for i in hit:
            out.setdefault(int(dest[i]), []).append(int(pos[i]))
    return out


def _absolute_refs(elf: ElfImage, targets: Iterable[int]) -> set[int]:
    """Targets whose 8-byte address appears in a data section or a relocation (unaligned too)."""
    want = np.array(sorted(set(targets)), dtype=np.uint64)
    found: set[int] = set()
    for name in _DATA_SECTIONS:
        data = elf.section_data(name)
        if not data or len(data) < 8:
            continue
        buf = np.frombuffer(data, dtype=np.uint8)
        for shift in range(8):
            m = (len(data) - shift) // 8
            if m <= 0:
                continue
            vals = np.frombuffer(buf[shift:shift + 8 * m].tobytes(), dtype="<u8")
            found.update(int(v) for v in np.unique(vals[np.isin(vals, want)]))
    return found


def caller_exits(elf: ElfImage, fns: list[tuple[int, int]]) -> dict[int, list[CallerExit] | str]:
    """For each resume function (low_pc, high_pc): its exits in its callers, or why not."""
    out: dict[int, list[CallerExit] | str] = {}
    rng = elf.text_range
    text = elf.section_data(".text")
    if rng is None or text is None or ".text" not in elf.sections or not fns:
        return {lo: "no .text" for lo, _ in fns}
    text_addr = elf.sections[".text"][0]
    targets = np.array(sorted({lo for lo, _ in fns}), dtype=np.int64)
    refs = _rel32_hits(text, text_addr, targets)
    absolute = _absolute_refs(elf, (lo for lo, _ in fns))
    caller_cache: dict[int, tuple[dict[int, object], set[int]]] = {}
    for lo, _hi in fns:
        if lo in absolute:
            out[lo] = "its address is in the program's data (a function pointer)"
            continue
        sites: list[CallerExit] = []
        why = None
        for q in refs.get(lo, []):
            # most hits are four bytes of some other instruction that happen to
            # resolve there: only an instruction whose operand is at q counts
            kind = _reference_at(elf, q, lo, caller_cache)
            if kind is None:
                continue
            got = _exit_after_call(elf, q - 1, caller_cache) if kind == "call" else kind
            if isinstance(got, str):
                why = got
                break
            sites.append(got)
        if why is None and not sites:
            why = "no direct call of it"
        out[lo] = why if why is not None else sites
    return out


def _caller(elf: ElfImage, addr: int, cache: dict[int, tuple[dict[int, object], set[int]]]
            ) -> tuple[int, dict[int, object], set[int]] | None:
    sym = elf.symbol_at(addr)
    if sym is None or not sym.size:
        return None
    got = cache.get(sym.addr)
    if got is None:
        code = elf.read(sym.addr, sym.size) or b""
        insns = {i.address: i for i in _md.disasm(code, sym.addr)}
        landings = branch_targets(code, sym.addr, sym.addr + sym.size, elf.read)
        got = cache[sym.addr] = (insns, landings)
    return (sym.addr, *got)


def _reference_at(elf: ElfImage, q: int, target: int,
                  cache: dict[int, tuple[dict[int, object], set[int]]]) -> str | None:
    """What the four bytes at `q` are: "call" (a direct call's rel32), why the
    function cannot use caller exits (a jump to it, its address taken), or None
    (part of an instruction that does not refer to it)."""
    found = _caller(elf, q, cache)
    if found is None:
        return f"a possible reference at 0x{q:x} outside any known function"
    _start, insns, _landings = found
    for back in range(1, 16):
        i = insns.get(q - back)
        if i is None:
            continue
        end = i.address + i.size  # type: ignore[attr-defined]
        if end < q + 4:
            return None  # the instruction before q ends before the four bytes: no operand there
        b = bytes(i.bytes)  # type: ignore[attr-defined]
        if back == 1 and b[:1] == b"\xe8":
            return "call"
        groups = set(i.groups)  # type: ignore[attr-defined]
        if groups & {_GRP_JUMP, _GRP_CALL} and i.operands and i.operands[0].imm == target:  # type: ignore[attr-defined]
            return f"a jump to it at 0x{i.address:x} (a tail call)"  # type: ignore[attr-defined]
        for op in i.operands:  # type: ignore[attr-defined]
            if op.type == CS_OP_MEM and i.reg_name(op.mem.base) == "rip" and end + op.mem.disp == target:  # type: ignore[attr-defined]
                return f"its address taken at 0x{i.address:x}"  # type: ignore[attr-defined]
        return None
    return None


def _exit_after_call(elf: ElfImage, call: int, cache: dict[int, tuple[dict[int, object], set[int]]]
                     ) -> CallerExit | str:
    found = _caller(elf, call, cache)
    if found is None:
        return f"a reference at 0x{call + 1:x} outside any known function"
    _start, insns, landings = found
    i = insns.get(call)
    if i is None or bytes(i.bytes)[:1] != b"\xe8":  # type: ignore[attr-defined]
        return f"a reference at 0x{call + 1:x} that is not a direct call"
    pc = call + 5
    for _ in range(MAX_WINDOW):
        if pc in landings:
            return f"a branch lands at 0x{pc:x}, after the call at 0x{call:x}"
        insn = insns.get(pc)
        if insn is None:
            return f"no instruction at 0x{pc:x} after the call at 0x{call:x}"
        if emulated(insn):
            return CallerExit(pc, call)
        groups = set(insn.groups)  # type: ignore[attr-defined]
        _read, written = insn.regs_access()  # type: ignore[attr-defined]
        if groups & {_GRP_JUMP, _GRP_CALL, _GRP_RET} or insn.mnemonic in _WRITES_RSP \
                or any(insn.reg_name(r) in ("rsp", "esp", "sp", "spl") for r in written):  # type: ignore[attr-defined]
            return f"the return path after 0x{call:x} branches or moves rsp before an emulated instruction"
        pc += insn.size  # type: ignore[attr-defined]
    return f"no emulated instruction within {MAX_WINDOW} after the call at 0x{call:x}"
