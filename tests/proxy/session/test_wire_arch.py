"""pc and sp from a `g` block in the program's architecture's order (proxy/session/wire.py)."""

from __future__ import annotations

from rsp.packets.stop import parse_stop_reply

from proxy.arch import AARCH64, X86_64
from proxy.session.wire import expedite_from_g, pc_from_g, stopped_pc_from_g

PC, SP = 0x5500023BE4, 0x550297EB60


def aarch64_g() -> bytes:
    """QEMU 7.2's aarch64 `g` reply: x0-x30, sp, pc (8 bytes each), cpsr (4): 268 bytes."""
    regs = [0x1000 + i for i in range(31)] + [SP, PC]
    return (b"".join(r.to_bytes(8, "little") for r in regs) + bytes(4)).hex().encode()


def test_aarch64_pc_is_at_byte_256_not_amd64s_128() -> None:
    g = aarch64_g()
    assert pc_from_g(g, AARCH64) == PC
    assert pc_from_g(g) == 0x1000 + 16  # x16: what the amd64 offset reads there
    assert stopped_pc_from_g(g, AARCH64) == PC


def test_a_stop_without_registers_gets_aarch64s_pc_and_sp() -> None:
    """QEMU's stop replies expedite nothing: `T05thread:p01.5ef3;`."""
    sr = expedite_from_g(parse_stop_reply(b"T05thread:p01.5ef3;"), aarch64_g(), AARCH64)
    assert sr.pc(AARCH64.regnum("pc")) == PC and sr.register_value(AARCH64.regnum("sp")) == SP


def test_amd64_unchanged() -> None:
    regs = [0x10 * i for i in range(16)] + [0x401000]
    g = b"".join(r.to_bytes(8, "little") for r in regs).hex().encode()
    assert pc_from_g(g) == pc_from_g(g, X86_64) == 0x401000
    sr = expedite_from_g(parse_stop_reply(b"T05thread:p01.5ef3;"), g)
    assert sr.pc(16) == 0x401000 and sr.register_value(7) == 0x70
    assert stopped_pc_from_g(b"xx" * 128 + b"x" * 16) is None
