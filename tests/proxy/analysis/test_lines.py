"""pc -> frames (with inlined frames) against binutils' addr2line -i, and line -> pcs back."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.proxy.analysis.corpus_util import corpus_binary, corpus_build
from proxy.analysis.elf import open_elf
from proxy.analysis.lines import SourceMap


@pytest.mark.skipif(shutil.which("addr2line") is None, reason="binutils addr2line is not installed")
@pytest.mark.parametrize("config", ["debug", "release"])
def test_frames_match_addr2line(config: str, inventory_of, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = corpus_build.pinned(corpus_binary(config, "nested"), tmp_path)  # three readers of one file
    inv = inventory_of(path)
    elf = open_elf(path)
    sm = SourceMap(elf)
    pcs = sorted({f.low_pc + 4 for f in inv.resume_fns} | {lo + 1 for c in inv.inlined for lo, _ in c.ranges[:2]})[:40]
    assert pcs
    ref = subprocess.run(["addr2line", "-i", "-f", "-C", "-e", str(path)] + [hex(p) for p in pcs],
                         capture_output=True, text=True, check=True).stdout
    # addr2line prints (function, file:line) pairs per pc, inlined ones first; split per pc with a marker run
    per_pc = []
    for p in pcs:
        one = subprocess.run(["addr2line", "-i", "-f", "-C", "-e", str(path), hex(p)],
                             capture_output=True, text=True, check=True).stdout.splitlines()
        per_pc.append([(one[i], one[i + 1]) for i in range(0, len(one), 2)])
    assert ref
    inlined_seen = False
    for p, theirs in zip(pcs, per_pc):
        ours = sm.pc_to_frames(p)
        assert [f.function for f in ours] == [t[0] for t in theirs], hex(p)
        for f, (_, loc) in zip(ours, theirs):
            if loc.endswith(":?") or loc.startswith("??"):
                continue
            assert f.loc is not None and f.loc.full == loc.split(" ")[0], hex(p)
        inlined_seen |= any(f.inlined for f in ours)
    assert inlined_seen or config == "debug"


def test_line_to_pcs_round_trip(inventory_of, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = corpus_build.pinned(corpus_binary("debug", "nested"), tmp_path)
    sm = SourceMap(open_elf(path))
    inv = inventory_of(path)
    c = next(l for n, l in inv.layouts.items() if n == "nested::c::{async_fn_env#0}")
    loc = c.state(3).loc  # the .await of c
    pcs = sm.line_to_pcs(loc.file, loc.line)
    assert pcs
    assert all(sm.pc_to_line(p).line == loc.line for p in pcs)
    assert sm.line_to_pcs("no/such/file.rs", 1) == []


@pytest.mark.parametrize("config", ["debug", "release", "old-debug"])
def test_line_rows_decoded_here_match_pyelftools(config: str) -> None:
    """Every unit's line program decoded by ``_v4_line_rows`` gives pyelftools' rows and
    files."""
    sm = SourceMap(open_elf(corpus_binary(config, "nested")))
    assert sm.dwarf is not None
    here = 0
    for uo in sm.dwarf.unit_offsets:
        ours, theirs = sm._v4_rows(uo), sm._pyelf_rows(uo)
        if ours is None:
            continue
        here += 1
        assert theirs is not None
        assert (ours.rows(), ours.files, ours.version) == (theirs.rows(), theirs.files, theirs.version), hex(uo)
    assert here == len(sm.dwarf.unit_offsets)


def test_inventory_of_follows_a_replaced_binary(inventory_of, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The session's memo is of the file, not of its path: a binary replaced under the same path
    (another checkout's build of the shared corpus) is analysed again."""
    path = tmp_path / "prog"
    shutil.copy2(corpus_binary("debug", "nested"), path)
    first = inventory_of(path)
    shutil.copy2(corpus_binary("debug", "nested"), tmp_path / "next")
    os.replace(tmp_path / "next", path)  # as build.py's _install does
    assert inventory_of(path) is not first
