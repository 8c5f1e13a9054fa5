"""The units' walks made by a second process (proxy.analysis.unitwalk) against the
same walks made here: the same four arrays (and the same sieve's picks,
proxy.analysis.sieve) for every unit, when the child walks them,
when this process takes units from the end (the child seen as never ready), and when
the child is killed half-way (the rest are walked here)."""

from __future__ import annotations

import pytest

from corpus_util import corpus_binary
from proxy.analysis import dies as D
from proxy.analysis import unitwalk
from proxy.analysis.dwarf import DwarfView
from proxy.analysis.elf import open_elf
from proxy.analysis import sieve as S
from proxy.analysis.inventory import _symbol_sieve, select_units


def _arrays(unit: D.Unit) -> tuple[list[int], ...]:
    d = unit.dies
    assert isinstance(d, D.Dies)
    return tuple(list(a) for a in (d._offs, d._codes, d._pars, d._ends))


@pytest.mark.parametrize("way", ["child", "steal", "kill"])
def test_child_walks_match(way: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kill_after = 2 if way == "kill" else None
    monkeypatch.setattr(unitwalk, "MIN_BYTES", 0)  # a small binary's units too
    # "steal": the child never seen ready (this process walks from the end what it can);
    # else: always (this process waits for each reply)
    monkeypatch.setattr(unitwalk.Prefetch, "_waiting", lambda self: way != "steal")
    monkeypatch.setenv("ASYNCRSP_WALK_PROCESS", "1")
    elf = open_elf(corpus_binary("debug", "nested"))
    here, there = DwarfView.open(elf, []), DwarfView.open(elf, [])
    assert here is not None and there is not None
    units = select_units(elf, there)
    assert len(units) > 3
    symbols = _symbol_sieve(elf)
    there.prefetch(units, sieve=lambda: symbols)
    assert there._prefetch is not None, "the child did not start"
    sieve = S.Sieve(here.reader.string_prefix, S.named_by_symbols(*symbols))
    sieved = 0
    for k, uo in enumerate(units):
        if k == kill_after:
            there._prefetch._proc.kill()  # the rest: walked here
        a, b = here.reader.read_unit(uo, here.keep_tags), there.unit(uo)
        assert b is not None
        assert _arrays(a) == _arrays(b)
        assert dict(a.top_die.attrs) == dict(b.top_die.attrs)
        assert isinstance(a.dies, D.Dies) and isinstance(b.dies, D.Dies)
        if b.dies.picked is not None:  # the child's sieve: what this process's makes
            sieved += 1
            assert b.dies.picked == a.dies.sieve(sieve, a.end)
    assert (sieved == len(units)) == (way == "child")
    stolen = there._prefetch.stolen
    there.end_prefetch()
    assert (stolen > 0) == (way == "steal")
    if kill_after is None:
        assert 0 < unitwalk.last_peak_kb < 200_000  # the child's own peak, reported at its end
