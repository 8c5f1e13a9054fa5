"""The probed-instruction emulator: decoding, flags, and the packets it writes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.session import emulate
from proxy.session.emulate import EFLAGS_OFFSET, OFFSET, RIP_OFFSET, apply, decode, sub_flags


def block(**regs: int) -> bytearray:
    b = bytearray(560)
    for name, value in regs.items():
        if name == "rip":
            b[RIP_OFFSET:RIP_OFFSET + 8] = value.to_bytes(8, "little")
        elif name == "eflags":
            b[EFLAGS_OFFSET:EFLAGS_OFFSET + 4] = value.to_bytes(4, "little")
        else:
            b[OFFSET[name]:OFFSET[name] + 8] = value.to_bytes(8, "little")
    return b


def regs_of(g_packet: bytes) -> bytes:
    assert g_packet.startswith(b"G")
    return bytes.fromhex(g_packet[1:].decode())


def get(b: bytes, name: str) -> int:
    off = {"rip": RIP_OFFSET}.get(name, OFFSET.get(name, 0))
    if name == "eflags":
        return int.from_bytes(b[EFLAGS_OFFSET:EFLAGS_OFFSET + 4], "little")
    return int.from_bytes(b[off:off + 8], "little")


def test_decode_the_forms_rustc_emits_at_probe_sites() -> None:
    # debug resume fns start with sub rsp, imm; release ones with push; exits are ret
    assert decode(bytes.fromhex("4881ec88000000")) == emulate.Emulation("sub_rsp", 7, imm=0x88)
    assert decode(bytes.fromhex("4883ec28")) == emulate.Emulation("sub_rsp", 4, imm=0x28)
    assert decode(bytes.fromhex("4156")) == emulate.Emulation("push", 2, reg="r14")
    assert decode(bytes.fromhex("55")) == emulate.Emulation("push", 1, reg="rbp")
    assert decode(bytes.fromhex("53")) == emulate.Emulation("push", 1, reg="rbx")
    assert decode(b"\xc3") == emulate.Emulation("ret", 1)
    assert decode(bytes.fromhex("4889e5")) == emulate.Emulation("mov_rbp_rsp", 3)
    # anything else steps over
    assert decode(bytes.fromhex("4889f8")) is None  # mov rax, rdi
    assert decode(b"") is None and decode(b"\x48") is None


def test_sub_rsp_moves_rsp_rip_and_sets_flags() -> None:
    b = block(rsp=0x7FFFFFFFD000, rip=0x555555556000, eflags=0x246)
    eff = apply(decode(bytes.fromhex("4881ec88000000")), b.hex().encode())  # type: ignore[arg-type]
    assert eff is not None and len(eff.packets) == 1
    out = regs_of(eff.packets[0])
    assert get(out, "rsp") == 0x7FFFFFFFD000 - 0x88
    assert get(out, "rip") == 0x555555556007 == eff.new_pc
    # 0x7fffffffd000 - 0x88 = ...cf78: no carry/zero/sign/overflow, AF (borrow from bit 4), parity of 0x78 even
    assert get(out, "eflags") == 0x202 | 0x10 | 0x4


def test_push_writes_the_register_below_rsp() -> None:
    b = block(rsp=0x1000, rip=0x2000, r14=0x1122334455667788)
    eff = apply(decode(bytes.fromhex("4156")), b.hex().encode())  # type: ignore[arg-type]
    assert eff is not None
    assert eff.packets[0] == b"M ff8,8:8877665544332211".replace(b" ", b"")
    out = regs_of(eff.packets[1])
    assert get(out, "rsp") == 0xFF8 and get(out, "rip") == 0x2002


def test_ret_pops_the_return_address() -> None:
    b = block(rsp=0x1000, rip=0x2000)
    eff = apply(decode(b"\xc3"), b.hex().encode(), (0x401234).to_bytes(8, "little"))  # type: ignore[arg-type]
    assert eff is not None and eff.new_pc == 0x401234
    out = regs_of(eff.packets[0])
    assert get(out, "rsp") == 0x1008 and get(out, "rip") == 0x401234
    assert apply(decode(b"\xc3"), b.hex().encode(), None) is None  # type: ignore[arg-type]


def test_unreadable_registers_are_never_written_back() -> None:
    b = block(rsp=0x1000).hex().encode()
    assert apply(decode(b"\x55"), b[:100] + b"xxxxxxxx" + b[108:]) is None  # type: ignore[arg-type]
    assert apply(decode(b"\x55"), b"00" * 10) is None  # type: ignore[arg-type]


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_sub_flags_match_the_definition(a: int, b: int) -> None:
    f = sub_flags(a, b, 0x202)
    r = (a - b) % 2**64
    signed = lambda v: v - 2**64 if v >> 63 else v  # noqa: E731
    assert bool(f & 0x1) == (a < b)
    assert bool(f & 0x40) == (r == 0)
    assert bool(f & 0x80) == bool(r >> 63)
    assert bool(f & 0x800) == (not -(2**63) <= signed(a) - signed(b) < 2**63)
    assert bool(f & 0x10) == ((a & 0xF) < (b & 0xF))
    assert bool(f & 0x4) == (bin(r & 0xFF).count("1") % 2 == 0)
    assert f & ~0x8D5 == 0x202
