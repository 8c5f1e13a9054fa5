"""The synthetic stack walks back, frame by frame, with the CFI rules it was laid out from."""

from __future__ import annotations

import struct

from proxy.threads.model import REGION_BASE, REGION_STRIDE, tid_of_region, TID_BASE, region_of
from proxy.threads.stack import FrameShape, lay_out

RSP_FRAME = FrameShape("rsp", 944, (("rip", -8),), (("rsp", 864), ("rsp", 856)))  # lock_ab, rustc 1.95 debug
RBP_FRAME = FrameShape("rbp", 16, (("rbp", -16), ("rip", -8)), (("rsp", 1488), ("rsp", 1472)))  # sleeper
SAVES_RBX = FrameShape("rsp", 48, (("rbx", -16), ("rip", -8)), (), ("rbx",))  # self in a register


def word(st, addr: int) -> int:  # type: ignore[no-untyped-def]
    data = st.read(addr, 8)
    assert data is not None
    return int(struct.unpack("<Q", data)[0])


def unwind(st, shapes: list[FrameShape]) -> list[dict[str, int]]:  # type: ignore[no-untyped-def]
    """What a DWARF unwinder computes from the laid-out registers and memory."""
    regs = dict(st.regs)
    out = []
    for shape in shapes:
        out.append(dict(regs))
        cfa = regs[shape.cfa_reg] + shape.cfa_off
        nxt = {r: v for r, v in regs.items() if r in ("rbx", "rbp", "r12", "r13", "r14", "r15")}
        for r, off in shape.saved:
            nxt[r] = word(st, cfa + off)
        nxt["rsp"] = cfa
        regs = nxt
    out.append(regs)
    return out


def test_each_frame_unwinds_to_the_next_coroutine_with_self_in_its_slots() -> None:
    base = region_of(TID_BASE + 3)
    frames = [(0x1000, 0xAAA0, RSP_FRAME), (0x2001, 0xBBB0, RBP_FRAME), (0x3001, 0xCCC0, RSP_FRAME)]
    st = lay_out(frames, base)
    assert st.depth == 3
    walked = unwind(st, [RSP_FRAME, RBP_FRAME, RSP_FRAME])
    assert [w["rip"] for w in walked] == [0x1000, 0x2001, 0x3001, 0]  # the outermost returns to 0
    for regs, (_, self_addr, shape) in zip(walked, frames):
        fbase = {"rsp": regs["rsp"], "rbp": regs.get("rbp", 0)}
        for b, off in shape.self_slots:
            assert word(st, fbase[b] + off) == self_addr
    assert all(base <= w["rsp"] < base + REGION_STRIDE for w in walked)


def test_self_in_a_callee_saved_register_reaches_the_outer_frame() -> None:
    st = lay_out([(0x1000, 0xAAA0, SAVES_RBX), (0x2001, 0xBBB0, SAVES_RBX)], REGION_BASE)
    walked = unwind(st, [SAVES_RBX, SAVES_RBX])
    assert walked[0]["rbx"] == 0xAAA0 and walked[1]["rbx"] == 0xBBB0


def test_the_outermost_frame_returns_where_it_is_told() -> None:
    st = lay_out([(0x1000, 1, RSP_FRAME), (0x2001, 2, RSP_FRAME)], REGION_BASE, end_ra=0x4005)
    assert [w["rip"] for w in unwind(st, [RSP_FRAME, RSP_FRAME])] == [0x1000, 0x2001, 0x4005]


def test_unknown_shape_ends_the_stack_there() -> None:
    st = lay_out([(0x1000, 1, RSP_FRAME), (0x2001, 2, None), (0x3001, 3, RSP_FRAME)], REGION_BASE)
    assert st.depth == 1
    assert unwind(st, [RSP_FRAME])[1]["rip"] == 0


def test_region_reads_are_zero_filled_and_bounded() -> None:
    st = lay_out([(0x1000, 1, RSP_FRAME)], REGION_BASE)
    assert st.read(REGION_BASE + REGION_STRIDE - 8, 8) == bytes(8)
    assert st.read(REGION_BASE + REGION_STRIDE - 4, 8) is None
    assert st.read(REGION_BASE - 8, 8) is None


def test_region_addresses_map_back_to_their_thread() -> None:
    for tid in (TID_BASE + 1, TID_BASE + 10_000):
        assert tid_of_region(region_of(tid) + 123) == tid
    assert tid_of_region(0x7FFF_FFFF_F000) is None
    # non-canonical on x86-64: bits 47..63 differ, so no process maps it
    assert (REGION_BASE >> 47) not in (0, (1 << 17) - 1)
