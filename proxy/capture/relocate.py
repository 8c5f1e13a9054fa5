"""Relocating one x86-64 instruction into gdbserver's fast-tracepoint jump pad.

Theory of operation (pure, no I/O): a fast tracepoint replaces the
instruction at the tracepoint with a ``jmp rel32`` to a jump pad that the
in-process agent (libinproctrace) allocated; the pad saves the registers,
calls the collector, restores them, then runs a copy of the replaced
instruction and jumps back after it. gdbserver does not copy that
instruction itself: while it handles ``QTStart`` it asks its client with
``qRelocInsn:FROM;TO`` (gdbserver ``remote-utils.cc`` ``relocate_instruction``;
gdb answers in ``remote.c`` ``remote_get_noisy_reply``). The client writes
the relocated instruction at TO with ``M``/``X`` packets (the only packets
gdbserver serves while it waits: ``m``/``M``/``X``) and answers
``qRelocInsn:<bytes written, hex>``, or ``E01`` to refuse (gdbserver then
fails the whole ``QTStart``).

`relocate(code, src, dst)` returns the bytes to write at `dst` for the
instruction `code` that lives at `src`:

* an instruction with a RIP-relative memory operand keeps its encoding and
  gets its 32-bit displacement moved by ``src - dst`` (RIP is the end of the
  instruction in both places: the length does not change);
* ``jmp rel8/rel32`` becomes ``jmp rel32``, ``jcc rel8/rel32`` becomes
  ``jcc rel32`` (``0f 8x``), pointing at the original target;
* anything else without a PC-relative part is copied as is.

It refuses (`Refused`, with the reason) what it cannot move faithfully:
calls (the pushed return address would point into the pad), ``loop``/
``jrcxz`` (rel8 only), ``xbegin``, interrupts and privileged instructions,
undecodable bytes, and any displacement or branch that does not reach from
`dst` (the pad must lie within ±2 GiB of the code: that is why fast
tracepoints need a program that is not position-independent, see
`proxy.capture.fast_sites`).
"""

from __future__ import annotations

from capstone import CS_ARCH_X86, CS_MODE_64, Cs
from capstone.x86 import X86_OP_MEM, X86_REG_RIP

_GRP_JUMP, _GRP_CALL, _GRP_RET, _GRP_INT, _GRP_IRET, _GRP_PRIVILEGE, _GRP_BRANCH_RELATIVE = 1, 2, 3, 4, 5, 6, 7
_INT32 = (-(1 << 31), (1 << 31) - 1)

_md = Cs(CS_ARCH_X86, CS_MODE_64)
_md.detail = True


class Refused(Exception):
    """The instruction cannot run from the jump pad; str() says why."""


def _fits32(v: int) -> bool:
    return _INT32[0] <= v <= _INT32[1]


def decode(code: bytes, addr: int):  # type: ignore[no-untyped-def]
    """The first instruction of `code` at `addr` (capstone, with detail), or Refused."""
    insn = next(_md.disasm(code, addr, 1), None)
    if insn is None:
        raise Refused(f"undecodable bytes {code[:8].hex()} at {addr:#x}")
    return insn


def relocate(code: bytes, src: int, dst: int) -> bytes:
    """The instruction at the start of `code` (located at `src`), rewritten to run at `dst`."""
    insn = decode(code, src)
    raw = bytes(insn.bytes)
    groups = set(insn.groups)
    name = insn.mnemonic
    if groups & {_GRP_CALL}:
        raise Refused(f"{name} at {src:#x}: a call would push a return address inside the jump pad")
    if groups & {_GRP_INT, _GRP_IRET, _GRP_PRIVILEGE} or name in ("syscall", "sysenter", "ud2", "hlt"):
        raise Refused(f"{name} at {src:#x}: traps or privileged instructions are not moved")
    if name.startswith(("xbegin", "loop", "jrcxz", "jecxz", "jcxz")):
        raise Refused(f"{name} at {src:#x}: only a short (rel8/rel16) form exists")
    if _GRP_BRANCH_RELATIVE in groups:
        target = insn.operands[0].imm
        if name == "jmp":
            rel = target - (dst + 5)
            if not _fits32(rel):
                raise Refused(f"jmp at {src:#x}: target {target:#x} out of rel32 reach from {dst:#x}")
            return b"\xe9" + rel.to_bytes(4, "little", signed=True)
        if _GRP_JUMP in groups and name.startswith("j"):
            # jcc: 7x rel8 or 0f 8x rel32 (prefixes such as 2e/3e branch hints are dropped)
            op = raw[insn.imm_offset - 1]
            cc = op & 0x0F
            if not (0x70 <= op <= 0x7F or (0x80 <= op <= 0x8F and raw[insn.imm_offset - 2] == 0x0F)):
                raise Refused(f"{name} at {src:#x}: unexpected encoding {raw.hex()}")
            rel = target - (dst + 6)
            if not _fits32(rel):
                raise Refused(f"{name} at {src:#x}: target {target:#x} out of rel32 reach from {dst:#x}")
            return bytes((0x0F, 0x80 | cc)) + rel.to_bytes(4, "little", signed=True)
        raise Refused(f"{name} at {src:#x}: a relative branch of an unknown kind")
    if groups & {_GRP_RET}:
        return raw  # a ret reads the stack only
    rip_mem = [op for op in insn.operands if op.type == X86_OP_MEM and op.mem.base == X86_REG_RIP]
    if rip_mem:
        # RIP-relative displacements are always 32 bits in 64-bit mode.
        # capstone 5.0 reports disp_size 2 after an operand-size prefix
        # (``66 83 3d ...`` cmpw): check the bytes instead of disp_size.
        off = insn.disp_offset
        if not off or int.from_bytes(raw[off:off + 4], "little", signed=True) != insn.disp:
            raise Refused(f"{name} at {src:#x}: RIP-relative operand without a 32-bit displacement")
        disp = insn.disp + (src - dst)
        if not _fits32(disp):
            raise Refused(f"{name} at {src:#x}: its RIP-relative operand ({src + len(raw) + insn.disp:#x}) "
                          f"is out of reach from {dst:#x}")
        return raw[:off] + disp.to_bytes(4, "little", signed=True) + raw[off + 4:]
    return raw


def answer(code: bytes, src: int, dst: int) -> tuple[bytes, int] | str:
    """(bytes to write at `dst`, their length) or the reason for refusing."""
    try:
        out = relocate(code, src, dst)
    except Refused as err:
        return str(err)
    return out, len(out)


__all__ = ["Refused", "answer", "decode", "relocate"]
