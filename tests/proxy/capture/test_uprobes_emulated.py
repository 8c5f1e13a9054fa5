"""Where an entry probe may stand: the first kernel-emulated instruction after a safe prologue."""

from __future__ import annotations

import struct

import capstone
import pytest

from proxy.capture.uprobes.emulated import MovedEntry, branch_targets, emulated, moved_entry

LOW = 0x1000
SUB = bytes.fromhex("4883ec68")  # sub rsp, 0x68
ST_RSI = bytes.fromhex("4889742410")  # mov [rsp+0x10], rsi
ST_RDI = bytes.fromhex("48897c2448")  # mov [rsp+0x48], rdi
CALL = bytes.fromhex("e800010000")  # call rel32
RET = b"\xc3"


def _no_memory(addr: int, n: int) -> bytes | None:
    return None


def _moved(code: bytes, self_reg: str = "rdi", read=_no_memory) -> MovedEntry | str:  # type: ignore[no-untyped-def]
    return moved_entry(code, LOW, LOW + len(code), self_reg, read)


def test_rustc_163_prologue_moves_to_the_call() -> None:
    code = SUB + ST_RSI + ST_RDI + CALL + RET
    assert _moved(code) == MovedEntry(LOW + 4 + 5 + 5, 0x68)


def test_an_emulated_first_instruction_stays_at_the_entry() -> None:
    assert _moved(b"\x55" + SUB + RET) == MovedEntry(LOW, 0)  # push rbp


@pytest.mark.parametrize("bad,why", [
    (bytes.fromhex("4889c7"), "writes the self register"),  # mov rdi, rax
    (bytes.fromhex("89c7"), "writes the self register"),  # mov edi, eax
    (bytes.fromhex("48897c2468"), "outside the new frame"),  # mov [rsp+0x68], rdi: the return address
    (bytes.fromhex("48894708"), "outside the new frame"),  # mov [rdi+8], rax: through self
    (bytes.fromhex("4889c4"), "moves rsp by an unknown amount"),  # mov rsp, rax
    (bytes.fromhex("ffe0"), "single-stepped"),  # jmp rax (rustc 1.95's state dispatch)
    (RET, "single-stepped"),
])
def test_an_unsafe_prologue_keeps_the_entry(bad: bytes, why: str) -> None:
    got = _moved(SUB + bad + CALL + RET)
    assert isinstance(got, str) and why in got, got


def test_the_self_register_is_the_sites_own() -> None:
    """An sret resume function has self in rsi: rdi may be written on the way."""
    code = SUB + bytes.fromhex("4889c7") + CALL + RET  # mov rdi, rax
    assert _moved(code, "rsi") == MovedEntry(LOW + 7, 0x68)
    assert isinstance(_moved(code, "rdi"), str)


def test_a_branch_into_the_prologue_keeps_the_entry() -> None:
    code = SUB + ST_RSI + CALL
    back = LOW + 4 - (LOW + len(code) + 5)  # jmp rel32 to the store
    got = _moved(code + b"\xe9" + struct.pack("<i", back) + RET)
    assert isinstance(got, str) and "lands at 0x1004" in got


def test_a_jump_table_entry_into_the_prologue_keeps_the_entry() -> None:
    """rustc's dispatch: lea rax,[rip+T]; ... jmp rax. T lies outside the function."""
    code = SUB + ST_RSI + CALL
    lea_at = LOW + len(code)
    table = 0x9000
    lea = b"\x48\x8d\x05" + struct.pack("<i", table - (lea_at + 7))
    code += lea + RET
    end = LOW + len(code)
    ok = struct.pack("<ii", (end - 1) - table, (LOW + 9) - table)  # ret; then the call itself

    def read(addr: int, n: int) -> bytes | None:
        off = addr - table
        return ok[off:off + n] if 0 <= off < len(ok) else None

    assert branch_targets(code, LOW, end, read) >= {end - 1, LOW + 9}
    got = _moved(code, read=read)
    assert isinstance(got, str) and "lands at 0x1009" in got
    # the same table landing after the site only: the move stands
    ok = struct.pack("<i", (end - 1) - table)
    assert _moved(code, read=read) == MovedEntry(LOW + 9, 0x68)


@pytest.mark.parametrize("hexcode,emu", [
    ("55", True), ("4155", True), ("e800000000", True), ("eb00", True), ("7400", True),
    ("0f8400000000", True), ("90", True), ("c3", False), ("4883ec08", False), ("ffe0", False),
    ("ffd0", False), ("0f1f440000", False), ("6a01", False), ("e300", False), ("66e900000000", False),
    ("e866000000", True),  # a 0x66 in the displacement is not a prefix
])
def test_what_the_kernel_emulates(hexcode: str, emu: bool) -> None:
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    [insn] = list(md.disasm(bytes.fromhex(hexcode), 0x1000))
    assert emulated(insn) is emu
