"""A core's registers as the proxy's g block (rsp.regs.AMD64_LINUX_NOXML)."""

from __future__ import annotations

import struct

from proxy.arch.core import X86_64_CORE
from proxy.corefile.regs import g_block

LAYOUT = X86_64_CORE.layout


def fxsave(st: list[bytes], valid: int, top: int) -> bytes:
    fx = bytearray(512)
    struct.pack_into("<HHBxHQQI", fx, 0, 0x37F, top << 11, valid, 0x123, 0x1122334455667788, 0xAABB, 0x1F80)
    for i, v in enumerate(st):
        fx[32 + 16 * i:32 + 16 * i + 10] = v
    fx[160:176] = bytes(range(16))  # xmm0
    return bytes(fx)


def test_general_registers_land_at_their_numbers() -> None:
    regs = {"rax": 1, "rbx": 2, "rsp": 0x7FFF0000, "rip": 0x401000, "eflags": 0x246, "fs_base": 0x7F00}
    g = LAYOUT.decode(g_block(regs, None))
    assert (g["rax"], g["rbx"], g["rsp"], g["rip"], g["eflags"], g["fs_base"]) == (
        1, 2, 0x7FFF0000, 0x401000, 0x246, 0x7F00)
    assert g["xmm0"] is None and g["fctrl"] is None  # no FXSAVE: unavailable ("xx"), not zero


def test_fxsave_fields_as_gdb_reads_them() -> None:
    one = (1 << 63).to_bytes(8, "little") + (0x3FFF).to_bytes(2, "little")  # 1.0: valid
    zero = bytes(10)  # zero
    nan = (3 << 62).to_bytes(8, "little") + (0x7FFF).to_bytes(2, "little")  # special
    # top = 6: st0 is physical 6, st1 physical 7, st2 physical 0; physical 1..5 empty
    fx = fxsave([one, zero, nan], valid=0b11000001, top=6)
    g = LAYOUT.decode(g_block({}, fx))
    assert g["fctrl"] == 0x37F and g["fstat"] == 6 << 11 and g["fop"] == 0x123
    # physical 6 valid (0), 7 zero (1), 0 special (2), others empty (3)
    assert g["ftag"] == (2 << 0) | sum(3 << (2 * i) for i in range(1, 6)) | (0 << 12) | (1 << 14)
    assert (g["fioff"], g["fiseg"], g["fooff"], g["foseg"]) == (0x55667788, 0x11223344, 0xAABB, 0)
    assert g["st0"] == one and g["mxcsr"] == 0x1F80 and g["xmm0"] == bytes(range(16))
