"""Where an entry probe may stand: the first kernel-emulated instruction after a safe prologue."""

from __future__ import annotations

import struct

import capstone
import pytest

from proxy.capture.uprobes.emulated import MovedEntry, branch_targets, emulated, moved_entries, moved_entry

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


# ---- rustc 1.95 debug: the prologue ends in the state dispatch (jmp rax through a jump table)

MOVZX = bytes.fromhex("0fb687d2000000")  # movzx eax, byte [rdi+0xd2]: __state
MOVSXD = bytes.fromhex("48630c88")  # movsxd rcx, dword [rax+rcx*4]
ADD = bytes.fromhex("4801c8")  # add rax, rcx
JMP_RAX = bytes.fromhex("ffe0")
UD2 = bytes.fromhex("0f0b")
LD = bytes.fromhex("488b442420")  # mov rax, [rsp+0x20]
ST = bytes.fromhex("4889442430")  # mov [rsp+0x30], rax
TABLE = 0x9000
CALL_GOT = bytes.fromhex("ff1500010000")  # call [rip+0x100]


def _dispatch(blocks: list[bytes]) -> tuple[bytes, list[int]]:
    """SUB; store self; load __state; lea rax,[rip+TABLE]; movsxd; add; jmp rax; ud2;
    then the blocks, each after the previous one's jmp/ud2. Returns (code, block addresses)."""
    head = SUB + ST_RDI + MOVZX
    lea_at = LOW + len(head)
    head += b"\x48\x8d\x05" + struct.pack("<i", TABLE - (lea_at + 7)) + MOVSXD + ADD + JMP_RAX + UD2
    code, addrs = head, []
    for b in blocks:
        addrs.append(LOW + len(code))
        code += b
    return code, addrs


def _jmp_to(src: int, dst: int) -> bytes:
    return b"\xe9" + struct.pack("<i", dst - (src + 5))


def _table_reader(targets: list[int]) -> "object":
    raw = b"".join(struct.pack("<i", t - TABLE) for t in targets) + struct.pack("<i", -0x100000)

    def read(addr: int, n: int) -> bytes | None:
        off = addr - TABLE
        return raw[off:off + n] if 0 <= off < len(raw) else None
    return read


def _rustc_195_like() -> tuple[bytes, list[int], int]:
    """Unresumed: a call first; Returned: the constant-false panic loop; Suspend0: loads, then a jmp."""
    code, _ = _dispatch([b""])
    end_guess = LOW + len(code)
    b0 = LD + CALL_GOT + UD2  # Unresumed: mov, call through the GOT (single-stepped)
    b1_at = end_guess + len(b0)
    b1 = bytes.fromhex("31c0a801") + b"\x75" + struct.pack("<b", -(4 + 2)) + UD2  # xor eax,eax; test al,1; jne b1
    b2 = LD + ST  # Suspend0: mov, mov, then jmp back to b0's ud2 (any join point)
    b2_at = b1_at + len(b1)
    b2 += _jmp_to(b2_at + len(b2), end_guess + len(LD) + len(CALL_GOT))
    code, addrs = _dispatch([b0, b1, b2])
    assert addrs == [end_guess, b1_at, b2_at]
    return code + RET, addrs, LOW + len(code)


def test_after_the_state_dispatch_one_probe_per_state_block() -> None:
    code, (b0, b1, b2), end = _rustc_195_like()
    read = _table_reader([b0, b1, b1, b2])  # Unresumed, Returned, Panicked, Suspend0
    got = moved_entries(code, LOW, end + 1, "rdi", read, n_states=4)
    assert got == [
        MovedEntry(b0, 0x68),  # an indirect call comes first: the block's own first instruction
        MovedEntry(b1 + 4, 0x68),  # the jne of the loop that is never taken
        MovedEntry(b2 + 10, 0x68),  # the jmp after two loads/stores inside the frame
    ]
    # without the state count the table's length is unknown: the entry stays
    assert isinstance(moved_entries(code, LOW, end + 1, "rdi", read), str)
    assert isinstance(moved_entry(code, LOW, end + 1, "rdi", read), str)


def test_a_state_block_reached_another_way_keeps_the_entry() -> None:
    code, (b0, b1, b2), end = _rustc_195_like()
    read = _table_reader([b0, b1, b1, b2])
    # a direct jump to Suspend0's block (after the final ret): its site could run twice
    extra = _jmp_to(end + 1, b2)
    got = moved_entries(code + extra, LOW, end + 1 + len(extra), "rdi", read, n_states=4)
    assert isinstance(got, str) and f"{b2:#x}" in got
    # a table entry into the middle of another state's straight line
    got = moved_entries(code, LOW, end + 1, "rdi", _table_reader([b0, b1, b1, b2 + 5]), n_states=4)
    assert isinstance(got, str)


def test_a_state_block_entered_by_falling_through_keeps_the_entry() -> None:
    code, (b0, b1, b2), end = _rustc_195_like()
    # Suspend0's block starts right after the panic loop's ud2; point the table one
    # instruction later instead: the instruction before it (a load) falls through
    got = moved_entries(code, LOW, end + 1, "rdi", _table_reader([b0, b1, b1, b2 + 5]), n_states=4)
    assert isinstance(got, str)
    got = moved_entries(code, LOW, end + 1, "rdi", _table_reader([b0 + 5, b1, b1, b2]), n_states=4)
    assert isinstance(got, str) and "falling through" in got


def test_a_taken_loop_to_a_state_block_keeps_the_entry() -> None:
    """`jne` back to the block without the constant-false `xor eax,eax; test al,1` before it."""
    code, (b0, b1, b2), end = _rustc_195_like()
    loop = bytearray(code)
    loop[b1 - LOW:b1 - LOW + 2] = bytes.fromhex("85c0")  # test eax, eax instead of xor eax,eax
    got = moved_entries(bytes(loop), LOW, end + 1, "rdi", _table_reader([b0, b1, b1, b2]), n_states=4)
    assert isinstance(got, str) and f"{b1:#x}" in got


def test_a_segment_prefixed_nop_is_not_a_site() -> None:
    """rustc's padding ``nop word ptr cs:[rax+rax]`` carries a CS override: the kernel refuses
    to probe it (is_prefix_bad: ENOTSUPP, the whole uprobe_multi link fails with 524)."""
    from capstone import CS_ARCH_X86, CS_MODE_64, Cs

    from proxy.capture.uprobes.emulated import emulated

    md = Cs(CS_ARCH_X86, CS_MODE_64)
    md.detail = True
    cs_nop = next(md.disasm(bytes.fromhex("662e0f1f840000000000"), 0x1000))
    plain_nop = next(md.disasm(bytes.fromhex("0f1f4000"), 0x1000))
    assert not emulated(cs_nop)
    assert emulated(plain_nop)
