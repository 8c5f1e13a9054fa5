"""Emulating the probed instruction instead of stepping over it.

Theory of operation: a hidden breakpoint normally costs two resumes of the
program (rule 2: `z0`, `vCont;s`, `Z0`, then the client's resume). The
instructions the capture probes are few and simple: the first instruction
of a resume function (`sub rsp, imm` in debug builds, `push reg` in release
builds) and its `ret`s. With the registers that the capture reads anyway
(`g`) and, for `ret`, the 8 bytes at rsp, the proxy computes exactly what
the instruction would do and writes it back (`M` for a push's store, `G`
for the registers, flags included), then resumes the program once: the
breakpoint never leaves the code and no single step is needed.

Only the forms below are emulated; anything else (or a `g` block with
unavailable registers, `xx`) takes the step-over path. The `g` block is
gdb's amd64 order (rax rbx rcx rdx rsi rdi rbp rsp r8..r15 rip eflags ...),
which gdbserver sends when asked without `xmlRegisters` (rule 11).
"""

from __future__ import annotations

from dataclasses import dataclass

# gdb's amd64 register order in the `g` block: offsets of the 64-bit GPRs.
GPR = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp",
       "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")
OFFSET = {name: 8 * i for i, name in enumerate(GPR)}
RIP_OFFSET = 128
EFLAGS_OFFSET = 136  # 4 bytes
MIN_BLOCK = 140
# x86 encoding order of the low 3 bits of a register number (+8 with REX.B).
_ENCODED = ("rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
            "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")
_ARITH_FLAGS = 0x8D5  # CF PF AF ZF SF OF
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Emulation:
    op: str  # "sub_rsp" | "push" | "ret" | "mov_rbp_rsp" | "nop"
    length: int
    imm: int = 0
    reg: str = ""

    @property
    def needs_stack_word(self) -> bool:
        """`ret` needs the 8 bytes at rsp (its return address)."""
        return self.op == "ret"


@dataclass(frozen=True, slots=True)
class Effect:
    """What to send before the resume: memory writes then the new registers."""

    packets: tuple[bytes, ...]
    new_pc: int


def decode(code: bytes) -> Emulation | None:
    """The emulation for the instruction at the start of `code`, if supported."""
    if code[:1] == b"\xc3":
        return Emulation("ret", 1)
    if code[:4] == b"\xf3\x0f\x1e\xfa":  # endbr64
        return Emulation("nop", 4)
    if len(code) >= 1 and 0x50 <= code[0] <= 0x57:
        return Emulation("push", 1, reg=_ENCODED[code[0] - 0x50])
    if len(code) >= 2 and code[0] == 0x41 and 0x50 <= code[1] <= 0x57:
        return Emulation("push", 2, reg=_ENCODED[8 + code[1] - 0x50])
    if code[:3] == b"\x48\x89\xe5":
        return Emulation("mov_rbp_rsp", 3)
    if len(code) >= 4 and code[:3] == b"\x48\x83\xec":
        return Emulation("sub_rsp", 4, imm=int.from_bytes(code[3:4], "little", signed=True) & _MASK64)
    if len(code) >= 7 and code[:3] == b"\x48\x81\xec":
        return Emulation("sub_rsp", 7, imm=int.from_bytes(code[3:7], "little", signed=True) & _MASK64)
    return None


def sub_flags(a: int, b: int, old: int) -> int:
    """eflags after `sub` of 64-bit `b` from `a`; the other bits from `old`."""
    r = (a - b) & _MASK64
    flags = old & ~_ARITH_FLAGS
    if a < b:
        flags |= 0x1  # CF
    if bin(r & 0xFF).count("1") % 2 == 0:
        flags |= 0x4  # PF
    if (a ^ b ^ r) & 0x10:
        flags |= 0x10  # AF
    if r == 0:
        flags |= 0x40  # ZF
    if r >> 63:
        flags |= 0x80  # SF
    if ((a ^ b) & (a ^ r)) >> 63:
        flags |= 0x800  # OF
    return flags


def apply(em: Emulation, regs_hex: bytes, stack_word: bytes | None = None) -> Effect | None:
    """The packets that make the stopped thread look as if it had executed
    the instruction; None when it cannot be done exactly."""
    if b"x" in regs_hex or len(regs_hex) < 2 * MIN_BLOCK:
        return None  # a register the stub cannot read cannot be written back
    try:
        block = bytearray(bytes.fromhex(regs_hex.decode("ascii")))
    except ValueError:
        return None

    def get(off: int, size: int = 8) -> int:
        return int.from_bytes(block[off:off + size], "little")

    def put(off: int, value: int, size: int = 8) -> None:
        block[off:off + size] = (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")

    rsp, rip = get(OFFSET["rsp"]), get(RIP_OFFSET)
    writes: list[bytes] = []
    new_pc = rip + em.length
    if em.op == "sub_rsp":
        put(EFLAGS_OFFSET, sub_flags(rsp, em.imm, get(EFLAGS_OFFSET, 4)), 4)
        put(OFFSET["rsp"], rsp - em.imm)
    elif em.op == "push":
        value = get(OFFSET[em.reg])
        new_sp = (rsp - 8) & _MASK64
        writes.append(b"M%x,8:%s" % (new_sp, value.to_bytes(8, "little").hex().encode()))
        put(OFFSET["rsp"], new_sp)
    elif em.op == "mov_rbp_rsp":
        put(OFFSET["rbp"], rsp)
    elif em.op == "ret":
        if stack_word is None or len(stack_word) != 8:
            return None
        new_pc = int.from_bytes(stack_word, "little")
        put(OFFSET["rsp"], rsp + 8)
    elif em.op != "nop":
        return None
    put(RIP_OFFSET, new_pc)
    return Effect(tuple(writes) + (b"G" + block.hex().encode(),), new_pc)


__all__ = ["Effect", "Emulation", "apply", "decode", "sub_flags"]
