"""Where a frame's DWARF reads `self` from: location expressions as rustc 1.95 writes them."""

from __future__ import annotations

from proxy.threads.shapes import _base_of, slot_of


def test_frame_bases() -> None:
    assert _base_of(b"W") == "rsp" and _base_of(b"V") == "rbp" and _base_of(b"\x9c") == "cfa"
    assert _base_of(b"\x91\x00") is None


def test_self_slots_and_deref_slots() -> None:
    assert slot_of(b"\x91\xd8\x06", "rsp") == ("slot", ("rsp", 856), False)  # lock_ab's self: fbreg 0x358
    assert slot_of(b"\x91\xe0\x06\x06#@", "rsp") == ("slot", ("rsp", 864), True)  # a local through self's copy
    assert slot_of(b"w\xa8%", "rbp") == ("slot", ("rsp", 4776), False)  # breg7: rsp-based whatever the base
    assert slot_of(b"S", "rsp") == ("reg", ("rbx", 0), False)  # DW_OP_reg3
    assert slot_of(b"\x91\x10", None) == ("", None, False)  # fbreg without a known frame base
    assert slot_of(b"", "rsp") == ("", None, False)
    assert slot_of(b"\x91", "rsp") == ("", None, False)  # truncated
