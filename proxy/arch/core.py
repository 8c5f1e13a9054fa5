"""How a Linux ELF core of each CPU holds a thread's registers, and the `g` block the
core stub serves them in (proxy/corefile reads cores through these facts only).

A `CoreRegs` says which ``e_machine`` it is, the general registers of ``NT_PRSTATUS``
(``struct elf_prstatus``: its ``pr_reg`` at byte 112 on every 64-bit Linux, then
``pr_fpvalid``), the ``NT_FPREGSET`` note and how its bytes become registers of the
block, and the block (`rsp.regs.RegisterLayout`) with the target description that
describes it to a client.

x86-64: ``pr_reg`` is ``user_regs_struct`` (27 words, asm/ptrace.h), ``elf_prstatus``
336 bytes; ``NT_FPREGSET`` the 512-byte FXSAVE area, read the way gdb's
``amd64_supply_fxsave`` does:

* ``ftag`` is the full two-bit-per-register tag word, rebuilt from FXSAVE's
  abridged one-bit tags and each register's value (empty 3, zero 1,
  special 2, valid 0); FXSAVE stores st(i) in stack order, tags by
  physical register, ``top`` is bits 11-13 of ``fstat``;
* ``fioff``/``fooff`` are the low 32 bits of the 64-bit FPU instruction and
  operand pointers, ``fiseg``/``foseg`` their high 32 bits; ``fop`` is 11 bits.

The block is `rsp.regs.AMD64_LINUX_NOXML` (gdbserver 13.1's without ``xmlRegisters``).

AArch64: ``pr_reg`` is ``user_pt_regs`` (x0-x30, sp, pc, pstate: 34 words),
``elf_prstatus`` 392 bytes (``pr_fpvalid`` at 384); ``NT_FPREGSET`` is
``user_fpsimd_state``: v0-v31 (16 bytes each), fpsr, fpcr (then 8 reserved bytes:
528). Sizes and offsets checked with Debian's aarch64-linux-gnu glibc 2.36 headers
(``sizeof``/``offsetof`` of a program built by aarch64-linux-gnu-gcc, run under
qemu-aarch64) and on cores qemu-aarch64 7.2 wrote. The block is
`rsp.regs.AARCH64_LINUX` (gdb's aarch64 core and fpu features); ``pstate`` is named
gdb's way, ``cpsr`` (32 bits in the block).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from rsp.regs import AARCH64_LINUX, AMD64_LINUX_NOXML, RegisterLayout, aarch64_linux_target_xml, \
    amd64_linux_target_xml

RegValues = dict[str, int | bytes]


@dataclass(frozen=True, slots=True)
class CoreRegs:
    e_machine: int  # the core's ELF header says this CPU
    gregs: tuple[str, ...]  # NT_PRSTATUS pr_reg, in order (8 bytes each)
    prstatus_size: int  # sizeof(struct elf_prstatus)
    fpregs_size: int  # NT_FPREGSET's bytes
    fp_values: Callable[[bytes], RegValues]  # NT_FPREGSET -> registers of `layout`
    layout: RegisterLayout  # the `g` block served
    target_xml: Callable[[], dict[str, str]]  # its description (annex name -> text)

    def values(self, regs: dict[str, int], fpregs: bytes | None) -> RegValues:
        """The block's registers from a thread's general registers and its FP note."""
        out: RegValues = dict(regs)
        if fpregs is not None and len(fpregs) >= self.fpregs_size:
            out.update(self.fp_values(fpregs))
        return out


# -- x86-64 ------------------------------------------------------------------

USER_REGS = ("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx",
             "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base",
             "gs_base", "ds", "es", "fs", "gs")


def _full_tag(fx: bytes) -> int:
    swd, ftw = struct.unpack_from("<HB", fx, 2)
    top = (swd >> 11) & 7
    tag = 0
    for phys in range(8):
        if not ftw & (1 << phys):
            t = 3
        else:
            raw = fx[32 + 16 * ((phys - top) & 7):][:10]
            mant, exp = struct.unpack_from("<QH", raw)
            exp &= 0x7FFF
            if exp == 0x7FFF:
                t = 2
            elif exp == 0:
                t = 1 if mant == 0 else 2
            else:
                t = 0 if mant >> 63 else 2
        tag |= t << (2 * phys)
    return tag


def fxsave_values(fx: bytes) -> RegValues:
    cwd, swd, _ftw, fop, fip, fdp, mxcsr = struct.unpack_from("<HHHHQQI", fx, 0)
    out: RegValues = {
        "fctrl": cwd, "fstat": swd, "ftag": _full_tag(fx), "fop": fop & 0x7FF,
        "fioff": fip & 0xFFFFFFFF, "fiseg": fip >> 32, "fooff": fdp & 0xFFFFFFFF, "foseg": fdp >> 32,
        "mxcsr": mxcsr,
    }
    for i in range(8):
        out[f"st{i}"] = fx[32 + 16 * i:32 + 16 * i + 10]
    for i in range(16):
        out[f"xmm{i}"] = fx[160 + 16 * i:176 + 16 * i]
    return out


X86_64_CORE = CoreRegs(62, USER_REGS, 336, 512, fxsave_values, AMD64_LINUX_NOXML, amd64_linux_target_xml)


# -- AArch64 -----------------------------------------------------------------

def fpsimd_values(fp: bytes) -> RegValues:
    """``user_fpsimd_state``: v0-v31, fpsr, fpcr."""
    out: RegValues = {f"v{i}": fp[16 * i:16 * i + 16] for i in range(32)}
    out["fpsr"], out["fpcr"] = struct.unpack_from("<II", fp, 512)
    return out


# pstate under gdb's name, cpsr
AARCH64_CORE = CoreRegs(183, tuple(f"x{i}" for i in range(31)) + ("sp", "pc", "cpsr"), 392, 528,
                        fpsimd_values, AARCH64_LINUX, aarch64_linux_target_xml)
