from __future__ import annotations

import struct
import subprocess
import shutil

import pytest

from corpus_util import corpus_binary
from proxy.analysis.elf import AT_ENTRY, AT_PHDR, load_bias, load_bias_from_auxv, open_elf, parse_auxv
from proxy.analysis.errors import AnalysisError


def _auxv(pairs: list[tuple[int, int]]) -> bytes:
    return b"".join(struct.pack("<QQ", k, v) for k, v in pairs + [(0, 0)])


def test_load_bias_from_entry_and_auxv() -> None:
    elf = open_elf(corpus_binary("debug", "nested"))
    assert elf.pie
    bias = 0x555555554000
    assert load_bias(elf, elf.entry + bias) == bias
    assert load_bias_from_auxv(elf, _auxv([(6, 4096), (AT_ENTRY, elf.entry + bias)])) == bias
    phdr = next(s.vaddr + elf.phoff - s.offset for s in elf.segments if s.offset <= elf.phoff < s.offset + s.filesz)
    assert load_bias_from_auxv(elf, _auxv([(AT_PHDR, phdr + bias)])) == bias
    with pytest.raises(AnalysisError):
        load_bias_from_auxv(elf, _auxv([(6, 4096)]))
    assert parse_auxv(b"\x01") == {}


@pytest.mark.skipif(shutil.which("readelf") is None, reason="binutils readelf is not installed")
def test_build_id_and_entry_match_readelf() -> None:
    path = corpus_binary("debug", "nested")
    elf = open_elf(path)
    notes = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True).stdout
    assert elf.build_id and f"Build ID: {elf.build_id}" in notes
    hdr = subprocess.run(["readelf", "-h", str(path)], capture_output=True, text=True).stdout
    assert f"Entry point address:               {elf.entry:#x}" in hdr


def test_symbol_lookup_by_address() -> None:
    elf = open_elf(corpus_binary("debug", "nested"))
    main = [s for s in elf.symbols if s.name == "main"][0]
    assert elf.symbol_at(main.addr + 1) == main
    assert elf.read(main.addr, 4) is not None
