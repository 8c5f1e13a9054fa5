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
  Unwinding out of the function still has its own unwind-exit probes;
* the window may hold a ``call`` (direct, or through a GOT slot the dynamic
  relocations resolve) whose callee provably returns without polling: every
  function it can reach (direct calls and jumps, GOT calls; at most
  ``MAX_CLOSURE`` functions) is no resume function and makes no call or jump
  through a register or memory other than a resolved GOT slot (a ``dyn``
  call could poll anything), but for drop glue (``drop_in_place``, ``Arc``'s
  ``drop_slow``) and
  ``core::fmt::write``: the one assumption, that a destructor or a
  ``Display`` impl called through a vtable does not poll a future (std's TLS
  destructor registration, the case below, drops an ``io::Error`` and
  prints before it aborts on its failure path). The walk stops at the panic machinery (``panicking``
  functions): a callee may panic, then the poll's exit probe is not reached;
  the engine pops the scope at the thread's next entry at or above its sp
  (counted as an exit missed) and the kernel side's root poll restarts there
  too. In tokio's harness that takes a panic in the runtime's own bookkeeping
  (the task-id guard's thread-local), which never happened here. A GOT slot bound to a shared library's
  symbol counts as returning (libc never polls a Rust future). tokio's task
  harness is the case: after the task's root future returns it drops its
  ``TaskIdGuard`` through the GOT, then tests the ``Poll`` result (a ``jcc``).
  rsp is back to the entry's sp + 8 once the callee returned.

The exit record's sp is then rsp - 8 (the site's ``sp_adjust``), the scope
key the same (CFA rule rsp + 0). All-or-nothing per function: mixing ``ret``
and caller probes would count an exit twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from proxy.analysis.elf import ElfImage

from capstone import CS_OP_IMM, CS_OP_MEM, CS_OP_REG  # type: ignore[import-untyped]

from .emulated import _GRP_CALL, _GRP_JUMP, _GRP_RET, _md, branch_targets, emulated

MAX_WINDOW = 6  # instructions after the call looked at, the probe included
MAX_CLOSURE = 48  # functions a call inside the window may reach, at most
_DATA_SECTIONS = (".data.rel.ro", ".data", ".rodata", ".got", ".init_array", ".fini_array", ".rela.dyn",
                  ".data.rel.ro.local", ".tdata")
_WRITES_RSP = {"push", "pop", "leave", "enter", "pushfq", "popfq", "call", "ret"}


FUNCTION_POINTER = "its address is in the program's data (a function pointer)"


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


def caller_exits(elf: ElfImage, fns: list[tuple[int, int]], polls: Iterable[int] = ()
                 ) -> dict[int, list[CallerExit] | str]:
    """For each resume function (low_pc, high_pc): its exits in its callers, or why not.
    `polls`: the start of every resume function (probed or not), which no call
    inside a window may reach."""
    out: dict[int, list[CallerExit] | str] = {}
    calls = _CallCheck(elf, {lo for lo, _ in fns} | set(polls))
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
            out[lo] = FUNCTION_POINTER
            continue
        sites: list[CallerExit] = []
        why = None
        for q in refs.get(lo, []):
            # most hits are four bytes of some other instruction that happen to
            # resolve there: only an instruction whose operand is at q counts
            kind = _reference_at(elf, q, lo, caller_cache)
            if kind is None:
                continue
            got = _exit_after_call(elf, q - 1, caller_cache, calls) if kind == "call" else kind
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


def return_site(elf: ElfImage, ret: int, polls: Iterable[int] = (),
                cache: dict[int, tuple[dict[int, object], set[int]]] | None = None) -> CallerExit | str:
    """The exit probe for the polls that return to `ret` (link-time), learned at
    run time for a function polled through a vtable: the instruction ending at
    `ret` is a call (any: direct or indirect), then the same window as after a
    direct call. The probe serves every callee returning there (uprobes.bpf.c:
    only a poll in progress at that sp whose entry read `ret` is ended by it)."""
    cache = {} if cache is None else cache
    found = _caller(elf, ret - 1, cache)
    calls = [a for a, i in (found[1].items() if found else ())
             if a + i.size == ret and _GRP_CALL in set(i.groups)]  # type: ignore[attr-defined]
    if not calls:
        return f"no call instruction of a known function ends at the return address 0x{ret:x}"
    return _exit_after_call(elf, calls[0], cache, _CallCheck(elf, set(polls)), direct=False)


def _exit_after_call(elf: ElfImage, call: int, cache: dict[int, tuple[dict[int, object], set[int]]],
                     calls: _CallCheck | None = None, direct: bool = True) -> CallerExit | str:
    found = _caller(elf, call, cache)
    if found is None:
        return f"a reference at 0x{call + 1:x} outside any known function"
    _start, insns, landings = found
    i = insns.get(call)
    if i is None or (direct and bytes(i.bytes)[:1] != b"\xe8"):  # type: ignore[attr-defined]
        return f"a reference at 0x{call + 1:x} that is not a direct call"
    pc = call + i.size  # type: ignore[attr-defined]
    for _ in range(MAX_WINDOW):
        if pc in landings:
            return f"a branch lands at 0x{pc:x}, after the call at 0x{call:x}"
        insn = insns.get(pc)
        if insn is None:
            return f"no instruction at 0x{pc:x} after the call at 0x{call:x}"
        if emulated(insn):
            return CallerExit(pc, call)
        groups = set(insn.groups)  # type: ignore[attr-defined]
        if _GRP_CALL in groups and calls is not None:
            why = calls.why_not(insn)
            if why is not None:
                return f"the return path after 0x{call:x} calls {why}"
            pc += insn.size  # type: ignore[attr-defined]
            continue
        _read, written = insn.regs_access()  # type: ignore[attr-defined]
        if groups & {_GRP_JUMP, _GRP_CALL, _GRP_RET} or insn.mnemonic in _WRITES_RSP \
                or any(insn.reg_name(r) in ("rsp", "esp", "sp", "spl") for r in written):  # type: ignore[attr-defined]
            return f"the return path after 0x{call:x} branches or moves rsp before an emulated instruction"
        pc += insn.size  # type: ignore[attr-defined]
    return f"no emulated instruction within {MAX_WINDOW} after the call at 0x{call:x}"


_R_GLOB_DAT, _R_JUMP_SLOT, _R_RELATIVE = 6, 7, 8
# dyn calls that drop or format (a destructor or Display impl does not poll a future)
_NO_POLL_DYN = re.compile(r"drop_in_place|drop_slow|drop\.\.Drop|4drop4Drop|wake|4core3fmt5write|core::fmt::write")
_PANICS = re.compile(r"panicking|rust_panic|rust_oom|alloc_error|_Unwind_RaiseException|8rt_abort|abort_internal")


class _CallCheck:
    """Does a call return without polling? (the window's rule above)"""

    def __init__(self, elf: ElfImage, polls: set[int]) -> None:
        self.elf = elf
        self.polls = polls
        self._got: dict[int, int | None] | None = None  # GOT slot -> internal target (None: a library's)
        self._verdict: dict[int, str | None] = {}

    def got(self) -> dict[int, int | None]:
        if self._got is None:
            self._got = {}
            for name in (".rela.dyn", ".rela.plt"):
                data = self.elf.section_data(name)
                if not data:
                    continue
                rel = np.frombuffer(data[:len(data) // 24 * 24], dtype="<u8").reshape(-1, 3)
                kind = rel[:, 1] & 0xFFFFFFFF
                for off, k, add in zip(rel[:, 0].tolist(), kind.tolist(), rel[:, 2].tolist()):
                    if k == _R_RELATIVE:
                        self._got[off] = add
                    elif k in (_R_GLOB_DAT, _R_JUMP_SLOT):
                        self._got.setdefault(off, None)
        return self._got

    def target(self, insn) -> int | None | str:  # type: ignore[no-untyped-def]
        """A call's or jump's target: an address, None (a shared library's), or why unknown."""
        op = insn.operands[0] if insn.operands else None
        if op is None:
            return "an operand-less branch"
        if op.type == CS_OP_IMM:
            t = int(op.imm)
            return None if self._in_plt(t) else t
        if op.type == CS_OP_MEM and insn.reg_name(op.mem.base) == "rip" and not op.mem.index:
            slot = insn.address + insn.size + op.mem.disp
            got = self.got()
            if slot in got:
                return got[slot]
        return f"through a register or memory at 0x{insn.address:x}"

    def _in_plt(self, addr: int) -> bool:
        """A PLT stub: a shared library's function (``_Unwind_Resume`` of a landing pad)."""
        return any(s[0] <= addr < s[0] + s[2] for n, s in self.elf.sections.items() if n.startswith(".plt"))

    def why_not(self, insn) -> str | None:  # type: ignore[no-untyped-def]
        t = self.target(insn)
        if isinstance(t, str):
            return t
        return None if t is None else self.closure(t)

    def closure(self, start: int) -> str | None:
        """None when every function reachable from `start` returns without polling."""
        if start in self._verdict:
            return self._verdict[start]
        seen: set[int] = set()
        todo = [start]
        why: str | None = None
        while todo and why is None:
            fn = todo.pop()
            if fn in seen:
                continue
            seen.add(fn)
            if fn in self.polls:
                why = f"0x{start:x}, which may poll (reaches a resume function)"
                break
            if len(seen) > MAX_CLOSURE:
                why = f"0x{start:x}, which reaches more than {MAX_CLOSURE} functions"
                break
            sym = self.elf.symbol_at(fn)
            if sym is None or sym.addr != fn or not sym.size:
                why = f"0x{start:x}, which reaches 0x{fn:x}, no known function"
                break
            if _PANICS.search(sym.name):
                continue  # unwinds: the walk ends here (see the module's rules)
            code = self.elf.read(sym.addr, sym.size) or b""
            prev: list = []  # type: ignore[type-arg]
            drop_glue = _NO_POLL_DYN.search(sym.name) is not None
            for i in _md.disasm(code, sym.addr):
                groups = set(i.groups)
                if groups & {_GRP_CALL, _GRP_JUMP}:
                    t = self.target(i)
                    if isinstance(t, str):
                        # a destructor's dyn call (drop glue of a Box<dyn ..>) drops, it does not poll
                        if not (_GRP_JUMP in groups and _table_dispatch(prev, i)) and not drop_glue:
                            why = f"0x{start:x}, which reaches {sym.name[:60]}, which calls or jumps {t}"
                            break
                    elif t is not None and not sym.addr <= t < sym.addr + sym.size:
                        todo.append(t)
                prev = (prev + [i])[-2:]
        self._verdict[start] = why
        return why


def _table_dispatch(prev: list, insn) -> bool:  # type: ignore[no-untyped-def,type-arg]
    """``movsxd r2, [..]; add r1, r2; jmp r1``: rustc's jump-table dispatch, which
    stays inside the function (a tail call through a register has no such lead-in)."""
    op = insn.operands[0]
    if op.type != CS_OP_REG or len(prev) < 2:
        return False
    reg = insn.reg_name(op.reg)
    a, b = prev
    return a.mnemonic == "movsxd" and b.mnemonic == "add" and b.operands[0].type == CS_OP_REG \
        and b.reg_name(b.operands[0].reg) == reg
