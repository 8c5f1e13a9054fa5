"""The compact unit reader (proxy.analysis.dies: a walk into arrays, DIEs decoded on
first use, attributes peeked) against pyelftools' full decode of the same units: the
same kept DIEs, tags, kept parents and children, and the same values whichever way an
attribute is read (decoded or ``peek``)."""

from __future__ import annotations

import pytest
from elftools.elf.elffile import ELFFile

from tests.proxy.analysis.corpus_util import corpus_binary
from proxy.analysis import dies as D
from proxy.analysis.dwarf import KEEP_TAGS, DwarfView
from proxy.analysis.elf import open_elf

_TAGS = {v: k for k, v in vars(D).items() if k.startswith("TAG_")}
ATTRS = (D.AT_NAME, D.AT_LOW_PC, D.AT_ABSTRACT_ORIGIN, D.AT_SPECIFICATION, D.AT_TYPE, D.AT_BYTE_SIZE)


def _expected(cu) -> dict[int, tuple[int, int | None, list[int]]]:  # type: ignore[no-untyped-def]
    """offset -> (tag, kept parent, kept children), from pyelftools' tree."""
    out: dict[int, tuple[int, int | None, list[int]]] = {}

    def walk(die, kept_parent):  # type: ignore[no-untyped-def]
        tag = die.abbrev_code and _tag_code(die.tag)
        keep = tag in KEEP_TAGS
        if keep:
            out[die.offset] = (tag, kept_parent, [])
            if kept_parent is not None:
                out[kept_parent][2].append(die.offset)
        for child in die.iter_children():
            walk(child, die.offset if keep else kept_parent)

    walk(cu.get_top_DIE(), None)
    return out


def _tag_code(name: str) -> int:
    from elftools.dwarf.enums import ENUM_DW_TAG

    return int(ENUM_DW_TAG[name])


@pytest.mark.parametrize("config", ["debug", "release"])
def test_lazy_units_match_pyelftools(config: str) -> None:
    path = corpus_binary(config, "nested")
    elf = open_elf(path)
    view = DwarfView.open(elf, [])
    assert view is not None
    with open(path, "rb") as f:
        dwarf = ELFFile(f).get_dwarf_info(relocate_dwarf_sections=False)
        cus = sorted(dwarf.iter_CUs(), key=lambda cu: cu.cu_die_offset - cu.cu_offset + cu["unit_length"])
        # the smallest units and one of the program's own (the crate's coroutines)
        picked = cus[:3] + [cu for cu in cus if b"nested" in (cu.get_top_DIE().attributes["DW_AT_name"].value)][:1]
        assert len(picked) >= 4
        for cu in picked:
            unit = view.unit(cu.cu_offset)
            assert unit is not None
            dies = unit.dies
            assert isinstance(dies, D.Dies)
            want = _expected(cu)
            assert list(dies) == sorted(want)
            for off, (tag, parent, children) in want.items():
                die = dies[off]
                assert (die.tag, die.parent, die.children) == (tag, parent, children), hex(off)
            # peeked and decoded values agree (a fresh unit: nothing decoded yet)
            view._units.pop(cu.cu_offset)
            fresh = view.unit(cu.cu_offset)
            assert fresh is not None and isinstance(fresh.dies, D.Dies)
            checked = 0
            for off in want:
                i = fresh.dies.index(off)
                peeked = [fresh.dies.peek(i, attr) for attr in ATTRS]
                die = fresh.dies[off]
                assert peeked == [die.get(attr) for attr in ATTRS], hex(off)
                checked += sum(v is not None for v in peeked)
            assert checked > 0
