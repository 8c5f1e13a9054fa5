"""A thread's registers from a core (or ptrace) as the proxy's ``g`` block.

The block is `rsp.regs.AMD64_LINUX_NOXML` (gdbserver's x86-64 block without
``xmlRegisters``, the layout `amd64_linux_target_xml` describes): general
registers from ``user_regs_struct`` (NT_PRSTATUS / PTRACE_GETREGS), x87 and
SSE from the 512-byte FXSAVE area (NT_FPREGSET / PTRACE_GETFPREGS), laid
out the way gdb's ``amd64_supply_fxsave`` reads them:

* ``ftag`` is the full two-bit-per-register tag word, rebuilt from FXSAVE's
  abridged one-bit tags and each register's value (empty 3, zero 1,
  special 2, valid 0); FXSAVE stores st(i) in stack order, tags by
  physical register, ``top`` is bits 11-13 of ``fstat``;
* ``fioff``/``fooff`` are the low 32 bits of the 64-bit FPU instruction and
  operand pointers, ``fiseg``/``foseg`` their high 32 bits; ``fop`` is 11 bits.
"""

from __future__ import annotations

import struct

from rsp.framing import hex_encode
from rsp.regs import AMD64_LINUX_NOXML, RegisterLayout

LAYOUT: RegisterLayout = AMD64_LINUX_NOXML


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


def fxsave_values(fx: bytes) -> dict[str, int | bytes]:
    cwd, swd, _ftw, fop, fip, fdp, mxcsr = struct.unpack_from("<HHHHQQI", fx, 0)
    out: dict[str, int | bytes] = {
        "fctrl": cwd, "fstat": swd, "ftag": _full_tag(fx), "fop": fop & 0x7FF,
        "fioff": fip & 0xFFFFFFFF, "fiseg": fip >> 32, "fooff": fdp & 0xFFFFFFFF, "foseg": fdp >> 32,
        "mxcsr": mxcsr,
    }
    for i in range(8):
        out[f"st{i}"] = fx[32 + 16 * i:32 + 16 * i + 10]
    for i in range(16):
        out[f"xmm{i}"] = fx[160 + 16 * i:176 + 16 * i]
    return out


def g_block(regs: dict[str, int], fpregs: bytes | None) -> bytes:
    """The hex text of a ``g`` reply; registers the source lacks are ``xx``."""
    values: dict[str, int | bytes] = {k: v for k, v in regs.items()}
    if fpregs is not None and len(fpregs) >= 512:
        values.update(fxsave_values(fpregs))
    out = bytearray()
    for reg in LAYOUT.registers:
        v = values.get(reg.name)
        if v is None:
            out += b"xx" * reg.size
        elif isinstance(v, bytes):
            out += hex_encode(v[:reg.size].ljust(reg.size, b"\0"))
        else:
            out += hex_encode((v & ((1 << reg.bitsize) - 1)).to_bytes(reg.size, "little"))
    return bytes(out)
