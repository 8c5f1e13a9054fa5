"""The CFI unwinder on AArch64's columns (proxy/analysis/unwind.py: AARCH64_CFI): the return
address is x30's value (column 30), a leaf's is still in x30, frame records at x29."""

from __future__ import annotations

from proxy.analysis.unwind import AARCH64_CFI, X86_64_CFI, _at_ret_bytes, _Row, _step_cfi, _step_fp

SP, CFA_OFF = 0x5502_97EB00, 48
MEM = {SP + CFA_OFF - 16: 0x5502_97EC00,  # the caller's x29, saved by `stp x29, x30, [sp, #32]`
       SP + CFA_OFF - 8: 0x55_0003_B5C8}  # the return address (x30)


def read(addr: int, size: int) -> bytes | None:
    return MEM[addr].to_bytes(8, "little") if addr in MEM and size == 8 else None


def test_a_frame_that_saved_x30_returns_to_its_value() -> None:
    row = _Row(31, CFA_OFF, False, {29: ("off", -16), 30: ("off", -8)})
    cur = {"pc": 0x55_0003_B8F4, "sp": SP, "x29": SP + 32, "x19": 7, "x0": 1}
    nxt = _step_cfi(row, cur, read, AARCH64_CFI)
    assert nxt is not None
    assert nxt["pc"] == nxt["x30"] == 0x55_0003_B5C8 and nxt["x29"] == 0x5502_97EC00
    assert nxt["sp"] == SP + CFA_OFF  # AArch64's CFA is the caller's sp (no pushed return address)
    assert nxt["x19"] == 7 and "x0" not in nxt  # callee-saved survives, an argument register does not


def test_a_leaf_returns_to_x30_only_as_the_innermost_frame() -> None:
    row = _Row(31, 0, False, {})  # a leaf's CIE row: CFA = sp, nothing saved
    cur = {"pc": 0x55_0002_3BE4, "sp": SP, "x30": 0x55_0003_CADC, "x29": SP + 64}
    nxt = _step_cfi(row, cur, read, AARCH64_CFI, leaf=True)
    assert nxt is not None and nxt["pc"] == 0x55_0003_CADC and nxt["sp"] == SP and nxt["x29"] == SP + 64
    # an outer frame without a rule for x30: its return address is not known (no loop on x30)
    assert _step_cfi(row, cur, read, AARCH64_CFI, leaf=False) is None


def test_frame_records_and_rets() -> None:
    cur = {"pc": 0x7F00_0000_1000, "sp": SP, "x29": SP + 32, "x20": 9}
    nxt = _step_fp(cur, read, AARCH64_CFI)
    assert nxt == {"x29": 0x5502_97EC00, "pc": 0x55_0003_B5C8, "sp": SP + 48, "x20": 9}
    assert _at_ret_bytes(bytes.fromhex("c0035fd6"), AARCH64_CFI)  # ret
    assert not _at_ret_bytes(bytes.fromhex("c0035fd6"), X86_64_CFI)
    assert _at_ret_bytes(b"\xc3", X86_64_CFI) and _at_ret_bytes(b"\xf3\xc3")
