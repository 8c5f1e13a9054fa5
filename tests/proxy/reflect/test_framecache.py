"""Stack discovery's DWARF facts per pc, cached on disk by build-id (proxy/reflect/framecache.py),
on real corpus binaries: a new session reads no DWARF for pcs seen before; the cache follows
the build-id, not the path; a broken file is ignored. (The end-to-end figures are in
bench/bench_reflect.py --frames cold|warm.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from integration.corpus import build

from proxy.analysis.elf import open_elf
from proxy.analysis.inventory import build_inventory
from proxy.reflect import framecache
from proxy.reflect.stacks import StackFinder

ROOT = Path(__file__).resolve().parents[3]


def _binary(config: str) -> Path:
    got = build.build(configs=[config], programs=["tokio_app"]).get((config, "tokio_app"))
    if not isinstance(got, Path):
        pytest.skip(f"tokio_app ({config}) not built: {got}")
    return got


def _pcs(inv) -> list[int]:  # type: ignore[no-untyped-def]
    """Pcs inside every out-of-line resume function (their self is a located coroutine
    pointer) and the task poll functions (executor frames)."""
    out = []
    for fn in inv.resume_fns:
        out += list(range(fn.low_pc, fn.high_pc, max(1, (fn.high_pc - fn.low_pc) // 8)))
    return out


def _finder(path: Path, cache_dir: Path) -> StackFinder:
    return StackFinder(open_elf(path), build_inventory(path), 0, cache_dir=cache_dir)


def test_facts_survive_the_session_and_follow_the_build_id(tmp_path: Path) -> None:
    path = _binary("release")
    cold = _finder(path, tmp_path)
    pcs = _pcs(cold.inv)
    want = {pc: cold.facts(pc) for pc in pcs}
    assert any(f is not None and any(s.variables for s in f.scopes) for f in want.values()), \
        "no resume function's self located: nothing to cache"
    assert cold.dwarf is not None and cold.dwarf._units  # the cold finder read DWARF units
    cold.save_facts()
    stored = framecache.path(cold.inv.build_id or "", tmp_path)
    assert stored is not None and stored.is_file()

    # another session of the same binary (a second instance, or attached again): no unit read
    warm = _finder(path, tmp_path)
    assert {pc: warm.facts(pc) for pc in pcs} == want
    assert warm.dwarf is not None and not warm.dwarf._units

    # the same bytes at another path: the same build-id, the same facts
    copy = tmp_path / "elsewhere" / path.name
    copy.parent.mkdir()
    shutil.copy2(path, copy)
    moved = _finder(copy, tmp_path)
    assert moved.facts(pcs[0]) == want[pcs[0]] and moved.dwarf is not None and not moved.dwarf._units

    # a replaced binary (another build of the program) has another build-id: nothing is reused
    other = _binary("debug")
    shutil.copy2(other, copy)  # replaced in place, same path
    fresh = _finder(copy, tmp_path)
    assert fresh.inv.build_id != cold.inv.build_id
    assert not fresh._facts
    got = {pc: fresh.facts(pc) for pc in _pcs(fresh.inv)}
    assert fresh.dwarf is not None and fresh.dwarf._units
    assert any(f is not None for f in got.values())


def test_a_broken_cache_file_is_ignored_and_rewritten(tmp_path: Path) -> None:
    path = _binary("release")
    first = _finder(path, tmp_path)
    pcs = _pcs(first.inv)[:20]
    want = {pc: first.facts(pc) for pc in pcs}
    first.save_facts()
    stored = framecache.path(first.inv.build_id or "", tmp_path)
    assert stored is not None
    for junk in (b"not a pickle", b"\x80\x05]\x94."):  # garbage; a pickled list, not a dict
        stored.write_bytes(junk)
        again = _finder(path, tmp_path)
        assert not again._facts
        assert {pc: again.facts(pc) for pc in pcs} == want
        again.save_facts()
        assert set(framecache.load(first.inv.build_id or "", tmp_path)) == set(pcs)


@pytest.mark.parametrize("config", ["release", "debug"])
def test_std_units_are_skipped_without_losing_anything(config: str, tmp_path: Path) -> None:
    """Frames in the precompiled std's own units (a parked thread's condvar wait, thread start,
    `lang_start`) hold no coroutine of the program: they are answered without reading the
    unit, and reading it anyway finds nothing at the same pcs."""
    path = _binary(config)
    finder = StackFinder(open_elf(path), build_inventory(path), 0, use_cache=False)
    assert finder.dwarf is not None
    aranges = finder.dwarf._get_aranges()
    assert aranges is not None
    std = [uo for uo in finder.dwarf.unit_offsets if finder._sysroot_unit(uo)]
    assert std, "no unit of the precompiled std (DW_AT_comp_dir /rustc/...)"
    pcs = [lo + (hi - lo) // 2 for lo, hi, uo in zip(*aranges) if uo in std][::7][:150]
    assert len(pcs) >= 20
    assert all(finder.facts(pc) is None for pc in pcs)
    assert not set(std) & set(finder.dwarf._units)  # not read
    full = StackFinder(open_elf(path), finder.inv, 0, use_cache=False)
    full._sysroot = dict.fromkeys(std, False)  # read them: the same answer
    assert [full.facts(pc) for pc in pcs] == [None] * len(pcs)
    assert set(std) & set(full.dwarf._units)  # type: ignore[union-attr]
