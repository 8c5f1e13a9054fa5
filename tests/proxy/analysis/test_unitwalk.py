"""The units' walks made by a second process (proxy.analysis.unitwalk) against the
same walks made here: the same four arrays (and the same sieve's picks,
proxy.analysis.sieve) for every unit, when the child walks them,
when this process claims the units after the one it waits for (the child seen as never
ready: it skips them), when the claims reach the child too late (it walks them too: its
walks are dropped), when the child is killed half-way (the rest are walked here), and
when the sieve's symbol tables come late (the units walked before go unsieved: this
process sieves them)."""

from __future__ import annotations

import time

import pytest

from tests.proxy.analysis.corpus_util import corpus_binary
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


@pytest.mark.parametrize("way", ["child", "steal", "late", "kill", "slow-sieve"])
def test_child_walks_match(way: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kill_after = 2 if way == "kill" else None
    monkeypatch.setattr(unitwalk, "MIN_BYTES", 0)  # a small binary's units too
    # "steal", "late": the child never seen ready (this process claims and walks the units
    # after the one it waits for); else: always (this process waits for each reply)
    monkeypatch.setattr(unitwalk.Prefetch, "_waiting", lambda self: way not in ("steal", "late"))
    if way == "late":  # the claims never reach the child: it walks every unit
        tell = unitwalk.Prefetch._tell
        monkeypatch.setattr(unitwalk.Prefetch, "_tell",
                            lambda self, msg: None if msg & unitwalk._CLAIM else tell(self, msg))
    monkeypatch.setenv("ASYNCRSP_WALK_PROCESS", "1")
    elf = open_elf(corpus_binary("debug", "nested"))
    here, there = DwarfView.open(elf, []), DwarfView.open(elf, [])
    assert here is not None and there is not None
    units = select_units(elf, there)
    assert len(units) > 3
    symbols = _symbol_sieve(elf)

    def tables() -> object:
        if way == "slow-sieve":
            time.sleep(1.0)  # the child walks the first units meanwhile
        return symbols

    there.prefetch(units, sieve=tables)
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
    if way == "child":
        assert sieved > len(units) // 2  # (the first ones unsieved only if the tables came late)
    elif way == "slow-sieve":
        assert sieved < len(units)
    stolen = there._prefetch.stolen
    there.end_prefetch()
    assert (stolen > 0) == (way in ("steal", "late"))
    if kill_after is None:
        assert 0 < unitwalk.last_peak_kb < 200_000  # the child's own peak, reported at its end
