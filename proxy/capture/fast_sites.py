"""Where a fast tracepoint can stand in for a function's entry or a `ret`.

Theory of operation (pure, no I/O): a fast tracepoint writes a 5-byte
``jmp rel32`` over one instruction, so it needs an instruction of five
bytes or more that `proxy.capture.relocate` can move into the jump pad, and
the pad must be within ±2 GiB of it. libinproctrace allocates its pads with
``MAP_32BIT`` (gdbserver ``linux-amd64-ipa.cc`` ``alloc_jump_pad_buffer``):
below 2 GiB. A program that is not position-independent is linked at
0x400000, in reach; a PIE is loaded at 0x55..... (~85 TB away): gdbserver
refuses every site ("Jump pad too far from tracepoint"). So fast sites are
planned only for an ``ET_EXEC`` program.

Entry: walk the function from its first instruction while the
instructions only set the frame up - ``push reg``, ``sub $imm,%rsp``,
``mov reg,reg`` (not into the self register or rsp), ``endbr64`` and nops -
and take the first one of five bytes or more (it may be any relocatable
instruction: the pad runs before it). The collection then reads self from
its register, and the entry stack pointer is ``rsp + adjust`` (what the
pushes and the ``sub`` took so far). A store below rsp before the site
(a leaf's red zone, ``mov %edi,-0x4(%rbp)`` after ``mov %rsp,%rbp``) ends
the walk: the pad pushes the registers right below rsp and would overwrite
it. No direct branch of the function may land between the entry and the
site (the site would be skipped or run twice).

Exit: at a ``ret``, walk back through the epilogue - ``pop reg`` (not rax/
rdx, which carry the ``Poll``), ``add $imm,%rsp``, ``lea``-free - to the
earliest instruction of five bytes or more (in practice ``add $imm32,%rsp``
of a frame over 127 bytes); no branch may land after it, before the ``ret``.
The sp at the ``ret`` is ``rsp + adjust`` there too. The walk back uses the
function's linear disassembly (Rust functions have no data in ``.text``).
"""

from __future__ import annotations

from dataclasses import dataclass

from capstone import CS_ARCH_X86, CS_MODE_64, Cs
from capstone.x86 import X86_OP_IMM, X86_OP_REG

from proxy.capture.relocate import Refused, relocate

JUMP_LEN = 5
_md = Cs(CS_ARCH_X86, CS_MODE_64)
_md.detail = True
_GRP_JUMP, _GRP_CALL, _GRP_RET, _GRP_BRANCH_RELATIVE = 1, 2, 3, 7
PAD_PROBE = 0x40000000  # a jump pad address for checking relocatability at plan time


@dataclass(frozen=True, slots=True)
class FastSite:
    """A fast tracepoint for an entry or a ret: at `addr` (link-time), `length`
    bytes long; the entry sp / the ret's sp is ``rsp + adjust`` there."""

    addr: int
    length: int
    adjust: int


def _insns(code: bytes, addr: int) -> list:  # type: ignore[type-arg]
    return list(_md.disasm(code, addr))


def _branch_targets(insns: list, indirect_ok: bool = False) -> set[int] | None:  # type: ignore[type-arg]
    """Direct branch targets inside the function; None when an indirect jump
    (a jump table) could land anywhere."""
    out: set[int] = set()
    for i in insns:
        g = set(i.groups)
        if _GRP_JUMP in g:
            if _GRP_BRANCH_RELATIVE in g and i.operands and i.operands[0].type == X86_OP_IMM:
                out.add(i.operands[0].imm)
            elif not indirect_ok:
                return None
    return out


def _reg(i, n: int) -> str | None:  # type: ignore[no-untyped-def]
    op = i.operands[n]
    return i.reg_name(op.reg) if op.type == X86_OP_REG else None


def _imm(i, n: int) -> int | None:  # type: ignore[no-untyped-def]
    op = i.operands[n]
    return op.imm if op.type == X86_OP_IMM else None


def _relocatable(code: bytes, addr: int) -> str | None:
    try:
        relocate(code, addr, PAD_PROBE)
    except Refused as err:
        return str(err)
    return None


def entry_site(code: bytes, low_pc: int, self_reg: str | None) -> FastSite | str:
    """The entry's fast site, or why there is none."""
    insns = _insns(code, low_pc)
    if not insns:
        return "undecodable entry"
    # A jump table (rustc's state dispatch: ``jmp *%rax``) lands on the
    # states' blocks, after the frame setup; only direct branches are checked
    # against the prologue.
    targets = _branch_targets(insns, indirect_ok=True) or set()
    adjust = 0
    for i in insns:
        if i.address != low_pc and i.address in targets:
            return f"a branch lands at {i.address:#x} before any instruction of {JUMP_LEN}+ bytes"
        if i.size >= JUMP_LEN:
            why = _relocatable(bytes(i.bytes), i.address)
            if why:
                return why
            return FastSite(i.address, i.size, adjust)
        m = i.mnemonic
        if m == "push" and _reg(i, 0):
            adjust += 8
        elif m == "sub" and _reg(i, 0) == "rsp" and _imm(i, 1) is not None:
            adjust += _imm(i, 1)  # type: ignore[operator]
        elif m == "mov" and _reg(i, 0) and _reg(i, 1) and _reg(i, 0) not in (self_reg, "rsp", _low32(self_reg)):
            pass
        elif m in ("endbr64", "nop"):
            pass
        else:
            return f"no instruction of {JUMP_LEN}+ bytes before '{m} {i.op_str}' at {i.address:#x}"
    return "the function ends before an instruction of 5+ bytes"


def _low32(reg: str | None) -> str | None:
    return {"rdi": "edi", "rsi": "esi", "rax": "eax", "rdx": "edx"}.get(reg or "")


def exit_sites(code: bytes, low_pc: int, rets: tuple[int, ...]) -> dict[int, FastSite | str]:
    """For each ret (link-time address): its fast site in the epilogue, or why none."""
    insns = _insns(code, low_pc)
    index = {i.address: n for n, i in enumerate(insns)}
    targets = _branch_targets(insns)
    out: dict[int, FastSite | str] = {}
    for r in rets:
        n = index.get(r)
        if n is None:
            out[r] = "the ret is not on the function's linear disassembly"
            continue
        if targets is None:
            out[r] = "an indirect jump could land in the epilogue"
            continue
        adjust = 0
        best: FastSite | str = "no instruction of 5+ bytes in the epilogue (a ret is 1 byte)"
        k = n
        while k > 0:
            if insns[k].address in targets:
                break  # a branch lands here: earlier instructions are not on every path to the ret
            i = insns[k - 1]
            m = i.mnemonic
            if m == "pop" and _reg(i, 0) and _reg(i, 0) not in ("rax", "rdx", "rsp"):
                step = 8
            elif m == "add" and _reg(i, 0) == "rsp" and _imm(i, 1) is not None:
                step = _imm(i, 1)  # type: ignore[assignment]
            else:
                break
            adjust += step  # the pad runs before i: sp at the ret is rsp + everything from i on
            k -= 1
            if i.size >= JUMP_LEN:
                why = _relocatable(bytes(i.bytes), i.address)
                if not why:
                    best = FastSite(i.address, i.size, adjust)
                elif isinstance(best, str):
                    best = why
        out[r] = best
    return out


__all__ = ["FastSite", "entry_site", "exit_sites", "JUMP_LEN"]
