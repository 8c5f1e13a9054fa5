"""The fast-tracepoint instruction relocator: what the moved instruction does
is checked by decoding it at its new address (capstone), not by comparing
with hand-written bytes."""

from __future__ import annotations

import pytest
from capstone import CS_ARCH_X86, CS_MODE_64, Cs
from capstone.x86 import X86_OP_MEM, X86_REG_RIP
from hypothesis import given
from hypothesis import strategies as st

from proxy.capture.relocate import Refused, answer, relocate

SRC = 0x401186
PAD = 0x40000000  # a MAP_32BIT jump pad, as libinproctrace allocates it

_md = Cs(CS_ARCH_X86, CS_MODE_64)
_md.detail = True


def _one(code: bytes, addr: int):  # type: ignore[no-untyped-def]
    insn = next(_md.disasm(code, addr, 1))
    assert insn.size == len(code), (code.hex(), insn.size)
    return insn


def _rip_target(code: bytes, addr: int) -> int:
    insn = _one(code, addr)
    (mem,) = [op for op in insn.operands if op.type == X86_OP_MEM and op.mem.base == X86_REG_RIP]
    return addr + insn.size + mem.mem.disp


def _branch_target(code: bytes, addr: int) -> int:
    return _one(code, addr).operands[0].imm


@pytest.mark.parametrize("hexcode", [
    "0f1f440000",              # nopl 0(%rax,%rax,1): the -mnop-mcount entry nop
    "4881ecd0000000",          # sub $0xd0,%rsp
    "48897c2408",              # mov %rdi,8(%rsp)
    "48b8efcdab8967452301",    # movabs $imm64,%rax
])
def test_position_independent_instructions_are_copied(hexcode: str) -> None:
    code = bytes.fromhex(hexcode)
    assert relocate(code, SRC, PAD) == code


@pytest.mark.parametrize("hexcode", [
    "488b0510000000",          # mov 0x10(%rip),%rax
    "488d3d00100000",          # lea 0x1000(%rip),%rdi
    "c7050800000001000000",    # movl $1,8(%rip): an immediate after the displacement
    "ff2510000000",            # jmp *0x10(%rip): the pointer's address moves, not the target
    "66833d1000000005",        # cmpw $5,0x10(%rip): operand-size prefix
])
def test_rip_relative_operands_keep_their_address(hexcode: str) -> None:
    code = bytes.fromhex(hexcode)
    out = relocate(code, SRC, PAD)
    assert len(out) == len(code)
    assert _rip_target(out, PAD) == _rip_target(code, SRC)


@pytest.mark.parametrize("hexcode,new_len", [
    ("eb10", 5), ("e900010000", 5),        # jmp rel8 -> rel32, jmp rel32
    ("7410", 6), ("0f8410000000", 6),      # je rel8 -> rel32, je rel32
    ("7ff0", 6),                            # jg backwards
])
def test_relative_branches_keep_their_target(hexcode: str, new_len: int) -> None:
    code = bytes.fromhex(hexcode)
    out = relocate(code, SRC, PAD)
    assert len(out) == new_len
    assert _one(out, PAD).mnemonic == _one(code, SRC).mnemonic
    assert _branch_target(out, PAD) == _branch_target(code, SRC)


@pytest.mark.parametrize("hexcode,why", [
    ("e800000000", "call"),                 # call rel32: return address inside the pad
    ("ff1510000000", "call"),               # call *0x10(%rip)
    ("e2fe", "short"),                      # loop
    ("e3fe", "short"),                      # jrcxz
    ("cc", "trap"),                         # int3
    ("0f05", "trap"),                       # syscall
    ("c7f800000000", "short"),              # xbegin
    ("06", "undecodable"),                  # push %es: invalid in 64-bit mode
])
def test_refuses_what_it_cannot_move(hexcode: str, why: str) -> None:
    with pytest.raises(Refused, match=why):
        relocate(bytes.fromhex(hexcode), SRC, PAD)
    assert isinstance(answer(bytes.fromhex(hexcode), SRC, PAD), str)


def test_refuses_a_pad_out_of_reach() -> None:
    """A PIE program lies at 0x55... : a MAP_32BIT pad is ~85 TB away."""
    pie = 0x555555555186
    with pytest.raises(Refused, match="out of reach"):
        relocate(bytes.fromhex("488b0510000000"), pie, PAD)
    with pytest.raises(Refused, match="rel32 reach"):
        relocate(bytes.fromhex("7410"), pie, PAD)
    # without a PC-relative part, the distance does not matter
    assert relocate(bytes.fromhex("4881ecd0000000"), pie, PAD) == bytes.fromhex("4881ecd0000000")


@given(disp=st.integers(-(1 << 31), (1 << 31) - 1), dst=st.integers(0x1000, 0x7FFF0000))
def test_rip_relative_round_trip(disp: int, dst: int) -> None:
    code = bytes.fromhex("488b05") + disp.to_bytes(4, "little", signed=True)
    target = SRC + 7 + disp
    res = answer(code, SRC, dst)
    if isinstance(res, str):
        assert not -(1 << 31) <= target - (dst + 7) < 1 << 31
    else:
        out, n = res
        assert n == 7 and _rip_target(out, dst) == target
