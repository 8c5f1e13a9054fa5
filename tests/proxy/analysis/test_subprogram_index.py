"""The per-unit table of subprograms with code that stack discovery searches by pc
(``SourceMap._index_subprograms``): made from the unit's arrays (few DIEs decoded)
against the walk of the unit's tree (every namespace, type and subprogram decoded):
the same (low, high, document order, DIE) entries."""

from __future__ import annotations

import pytest

from tests.proxy.analysis.corpus_util import corpus_binary
from proxy.analysis.dwarf import DwarfView
from proxy.analysis.elf import open_elf
from proxy.analysis.lines import SourceMap
from proxy.reflect.stacks import STACK_TAGS


@pytest.mark.parametrize("config", ["debug", "release"])
def test_subprograms_from_arrays_match_the_walk(config: str) -> None:
    elf = open_elf(corpus_binary(config, "nested"))
    view = DwarfView.open(elf, [], STACK_TAGS)
    assert view is not None
    sm = SourceMap(elf, [], view)
    seen = 0
    for uo in view.unit_offsets:
        unit = view.unit(uo)
        if unit is None:
            continue
        fast = [(lo, hi, order, unit.dies.at(i).offset) for lo, hi, order, i in sm._subprograms_with_code(unit)]
        walked = [(lo, hi, order, d.offset) for lo, hi, order, d in sm._subprograms_walked(unit)]
        assert fast == walked, f"unit {uo:#x}"
        seen += len(fast)
    assert seen > 20
