from __future__ import annotations

from typing import Any

import pytest
from tests.rsp.rsp_testutil import wire

from rsp.framing import hex_decode, rle_expand
from rsp.packets.stop import parse_stop_reply
from rsp.regs import (
    AMD64_LINUX_NOXML,
    AMD64_PC_REGNUM,
    RegisterLayout,
    TargetDescriptionError,
    amd64_linux_target_xml,
    check_layout,
)

L = AMD64_LINUX_NOXML


def test_amd64_noxml_layout_matches_gdbserver_13() -> None:
    # gdb 13.1 'maint print remote-registers' against gdbserver 13.1 without
    # xmlRegisters=i386 (and research/gdbserver-xsave-corruption.md §2.3).
    assert L.size == 560 and len(L.registers) == 60
    expected = {"rax": (0, 0), "rsp": (7, 56), "rip": (16, 128), "eflags": (17, 136),
                "cs": (18, 140), "gs": (23, 160), "st0": (24, 164), "st7": (31, 234),
                "fctrl": (32, 244), "fop": (39, 272), "xmm0": (40, 276), "xmm15": (55, 516),
                "mxcsr": (56, 532), "orig_rax": (57, 536), "fs_base": (58, 544),
                "gs_base": (59, 552)}  # fmt: skip
    for name, (regnum, offset) in expected.items():
        assert (L.regnum_of(name), L.offset_of(name)) == (regnum, offset), name


def test_generated_target_xml_describes_the_same_block() -> None:
    files = amd64_linux_target_xml()
    layout = RegisterLayout.from_target_xml(files["target.xml"], files)
    assert check_layout(layout, L) == []
    assert layout.architecture == "i386:x86-64"
    assert layout.register("orig_rax").feature == "org.gnu.gdb.i386.linux"
    assert layout.register("fs_base").feature == "org.gnu.gdb.i386.segments"


def test_decode_captured_g_reply(captured: dict[str, Any]) -> None:
    body = wire(captured["g_reply_noxml_rle"])
    regs = L.decode(body)
    # the same stop's T reply expedited rip and rsp: they must agree
    stop = parse_stop_reply(wire(captured["stop_swbreak_rle"]))
    assert regs["rip"] == L.read(body, "rip")
    assert regs["cs"] == 0x33 and regs["ss"] == 0x2B
    assert isinstance(regs["xmm0"], bytes) and len(regs["xmm0"]) == 16
    assert isinstance(regs["st0"], bytes) and len(regs["st0"]) == 10
    assert regs["fs_base"] == L.read(body, "fs_base") and regs["fs_base"] != 0
    assert stop.pc(AMD64_PC_REGNUM) is not None
    raw = hex_decode(rle_expand(body))
    assert L.decode(raw) == regs  # raw block of exactly `size` bytes


def test_g_agrees_with_the_stop_reply_of_the_same_stop(captured: dict[str, Any]) -> None:
    session = [(d, wire(b)) for d, b in captured["session_bodies"]]
    g_at = next(i for i, (d, b) in enumerate(session) if d == "c2s" and b == b"g")
    stop = next(b for d, b in reversed(session[:g_at]) if d == "s2c" and b.startswith(b"T05"))
    reply = parse_stop_reply(stop)
    regs = L.decode(session[g_at + 1][1])
    for name in ("rbp", "rsp", "rip"):
        assert regs[name] == reply.register_value(L.regnum_of(name)), name
    assert regs["rip"] == 0x555555555151  # the breakpoint on work()


def test_breakpoint_stop_rip_matches_g() -> None:
    # Same stop, same numbers: T reply register 16 and g offset 128.
    g = bytearray(560)
    g[128:136] = (0x555555555151).to_bytes(8, "little")
    assert L.read(g.hex(), "rip") == 0x555555555151


def test_unavailable_registers_decode_to_none() -> None:
    text = bytearray(b"00" * 560)
    off = L.offset_of("fs_base") * 2
    text[off : off + 16] = b"x" * 16
    regs = L.decode(bytes(text))
    assert regs["fs_base"] is None and regs["gs_base"] == 0
    assert L.read(bytes(text), "fs_base") is None


def test_short_block_leaves_the_rest_none() -> None:
    regs = L.decode(b"11" * 136)  # only rax..rip
    assert regs["rip"] == 0x1111111111111111 and regs["eflags"] is None


def test_regnum_attribute_moves_the_counter() -> None:
    xml = """<target><feature name="x">
      <reg name="a" bitsize="32"/><reg name="b" bitsize="64" regnum="5"/><reg name="c" bitsize="8"/>
    </feature></target>"""
    layout = RegisterLayout.from_target_xml(xml)
    assert [(r.name, r.regnum, r.offset) for r in layout.registers] == [("a", 0, 0), ("b", 5, 4), ("c", 6, 12)]


@pytest.mark.parametrize(
    "xml",
    ["<target>", '<target><xi:include xmlns:xi="http://www.w3.org/2001/XInclude" href="nope.xml"/></target>',
     '<target><feature><reg name="a"/></feature></target>',
     '<target><feature><reg name="a" bitsize="8" regnum="1"/><reg name="b" bitsize="8" regnum="1"/></feature></target>'],
)
def test_bad_descriptions(xml: str) -> None:
    with pytest.raises(TargetDescriptionError):
        RegisterLayout.from_target_xml(xml)
