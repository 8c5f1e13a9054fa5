"""Broken or unusual binaries give a clear message and a partial result, never a traceback."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.proxy.analysis.corpus_util import corpus_binary
from proxy.analysis.elf import open_elf
from proxy.analysis.errors import AnalysisError
from proxy.analysis.inventory import build_inventory
from proxy.analysis.report import inspect_main


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # strip keeps the build-id: a warm shared cache would rightly answer with the
    # unstripped build's inventory, so `inspect` of a stripped copy needs its own cache
    monkeypatch.setenv("ASYNCRSP_CACHE_DIR", str(tmp_path / "cache"))


def _copy(tmp_path: Path, name: str = "prog") -> Path:
    dst = tmp_path / name
    shutil.copy(corpus_binary("debug", "nested"), dst)
    return dst


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The inventory cache is keyed by build-id, which strip keeps: a cached
    # inventory of the unstripped corpus binary would answer for the copy.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _inspect_ok(path: Path) -> str:
    out = io.StringIO()
    assert inspect_main(str(path), as_json=False, tree=False, out=out) in (0, 1)
    return out.getvalue()


@pytest.mark.skipif(shutil.which("strip") is None, reason="binutils strip is not installed")
def test_without_dwarf(tmp_path: Path) -> None:
    p = _copy(tmp_path)
    subprocess.run(["strip", "--strip-debug", str(p)], check=True)
    inv = build_inventory(p, use_cache=False)
    assert not inv.resume_fns and any("no DWARF" in w for w in inv.warnings)
    assert inv.build_id and inv.pie
    assert "no DWARF" in _inspect_ok(p)


@pytest.mark.skipif(shutil.which("strip") is None, reason="binutils strip is not installed")
def test_stripped(tmp_path: Path) -> None:
    p = _copy(tmp_path)
    subprocess.run(["strip", "-s", str(p)], check=True)
    inv = build_inventory(p, use_cache=False)
    assert any("no DWARF" in w for w in inv.warnings)
    elf = open_elf(p)
    assert elf.build_id and elf.entry  # the header facts survive; .dynsym has only imports
    assert not inv.resume_fns and not inv.layouts
    assert "no DWARF" in _inspect_ok(p)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_c_program(tmp_path: Path) -> None:
    src = tmp_path / "c.c"
    src.write_text("int f(int x) { return x + 1; }\nint main(void) { return f(1) - 2; }\n")
    exe = tmp_path / "c"
    subprocess.run(["gcc", "-g", "-O1", "-o", str(exe), str(src)], check=True)
    inv = build_inventory(exe, use_cache=False)
    assert inv.resume_fns == [] and inv.layouts == {}
    assert "0 coroutine layouts" in _inspect_ok(exe)


def test_truncated_header(tmp_path: Path) -> None:
    p = _copy(tmp_path)
    p.write_bytes(p.read_bytes()[:40])
    with pytest.raises(AnalysisError, match="truncated|unreadable"):
        build_inventory(p, use_cache=False)
    out = _inspect_ok(p)
    assert out.startswith("asyncrsp inspect:")


def test_truncated_in_the_middle(tmp_path: Path) -> None:
    p = _copy(tmp_path)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    try:
        inv = build_inventory(p, use_cache=False)
    except AnalysisError as e:  # the section headers live at the end of the file
        assert "truncated" in str(e) or "unreadable" in str(e)
    else:
        assert inv.warnings


def test_not_an_elf(tmp_path: Path) -> None:
    p = tmp_path / "x"
    p.write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(AnalysisError, match="not an ELF"):
        build_inventory(p, use_cache=False)
    with pytest.raises(AnalysisError, match="cannot read"):
        build_inventory(tmp_path / "missing", use_cache=False)


def test_corrupt_debug_info(tmp_path: Path) -> None:
    p = _copy(tmp_path)
    elf = open_elf(p)
    _, off, size = elf.sections[".debug_info"]
    data = bytearray(p.read_bytes())
    # garbage over the second half of .debug_info: the units there cannot be read
    for i in range(off + size // 2, off + size - 16, 7):
        data[i] = 0xFF
    p.write_bytes(bytes(data))
    inv = build_inventory(p, use_cache=False)
    assert any("corrupt" in w or "unknown" in w or "overrun" in w for w in inv.warnings), inv.warnings
    assert inv.layouts, "units before the damage still give layouts"
    _inspect_ok(p)
