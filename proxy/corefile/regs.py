"""A thread's registers from a core (or ptrace) as the proxy's ``g`` block.

The block is the CPU's (proxy/arch/core.py: x86-64's `rsp.regs.AMD64_LINUX_NOXML`,
gdbserver's block without ``xmlRegisters``; AArch64's `rsp.regs.AARCH64_LINUX`, gdb's
core and fpu features): the general registers from ``NT_PRSTATUS`` (or
``PTRACE_GETREGS``), the floating-point and vector registers from ``NT_FPREGSET`` (or
``PTRACE_GETFPREGS``) where the core has it. A register the source lacks is sent as
``xx`` (unavailable), as gdb shows it (`<unavailable>`), never as zero.
"""

from __future__ import annotations

from proxy.arch.core import X86_64_CORE, CoreRegs
from rsp.framing import hex_encode


def g_block(regs: dict[str, int], fpregs: bytes | None, core: CoreRegs = X86_64_CORE) -> bytes:
    """The hex text of a ``g`` reply; registers the source lacks are ``xx``."""
    values = core.values(regs, fpregs)
    out = bytearray()
    for reg in core.layout.registers:
        v = values.get(reg.name)
        if v is None:
            out += b"xx" * reg.size
        elif isinstance(v, bytes):
            out += hex_encode(v[:reg.size].ljust(reg.size, b"\0"))
        else:
            out += hex_encode((v & ((1 << reg.bitsize) - 1)).to_bytes(reg.size, "little"))
    return bytes(out)
