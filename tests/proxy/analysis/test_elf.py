from __future__ import annotations

import struct
import subprocess
import shutil

import pytest

from tests.proxy.analysis.corpus_util import corpus_binary
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


def _pyelftools_view(path: str) -> dict:
    """What pyelftools reads of the headers, in ElfImage's terms."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        data = f.read()
        elf = ELFFile(f)
        segs = tuple((s.header.p_vaddr, s.header.p_memsz, s.header.p_offset, s.header.p_filesz, s.header.p_flags)
                     for s in elf.iter_segments() if s["p_type"] == "PT_LOAD")
        secs = {sec.name: (sec["sh_addr"], sec["sh_offset"], sec["sh_size"]) for sec in elf.iter_sections()
                if sec["sh_type"] != "SHT_NOBITS" and sec.name and sec["sh_offset"] + sec["sh_size"] <= len(data)}
        ids = [str(n["n_desc"]) for sec in elf.iter_sections() if sec["sh_type"] == "SHT_NOTE"
               for n in sec.iter_notes() if n["n_type"] == "NT_GNU_BUILD_ID"]
        return {"machine": elf["e_machine"], "pie": elf["e_type"] == "ET_DYN", "entry": elf["e_entry"],
                "phoff": elf["e_phoff"], "segments": segs, "sections": secs, "build_id": ids[0] if ids else None}


@pytest.mark.parametrize("which", ["rust", "c", "libc"])
def test_header_reader_agrees_with_pyelftools(which: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    if which == "rust":
        path = str(corpus_binary("debug", "nested"))
    elif which == "c":
        if shutil.which("gcc") is None:
            pytest.skip("gcc is not installed")
        (tmp_path / "p.c").write_text("int main(void) { return 0; }\n")
        path = str(tmp_path / "p")
        subprocess.run(["gcc", "-g", "-o", path, str(tmp_path / "p.c")], check=True)
    else:
        path = "/lib/x86_64-linux-gnu/libc.so.6"
    from proxy.analysis.elf import _open_elf

    img = _open_elf(path)
    mine = {"machine": img.machine, "pie": img.pie, "entry": img.entry, "phoff": img.phoff,
            "segments": tuple((s.vaddr, s.memsz, s.offset, s.filesz, s.flags) for s in img.segments),
            "sections": img.sections, "build_id": img.build_id}
    assert mine == _pyelftools_view(path)
    assert img.symbols and not img.warnings


@pytest.mark.parametrize("config", ["debug", "release", "old-debug", "sid-release"])
def test_function_addresses_before_the_symbol_list(config: str) -> None:
    """``function_addresses`` asks only the names holding one of its parts, without making
    the symbol list (the inventory's unit selection, before its unit walker starts): the
    same addresses as asking every function symbol of the list."""
    from proxy.analysis.elf import _open_elf
    from proxy.analysis.inventory import CANDIDATE_PARTS, candidate_symbol

    image = _open_elf(corpus_binary(config, "tk_sync" if config == "sid-release" else "nested"))
    fast = image.function_addresses(candidate_symbol, CANDIDATE_PARTS)
    assert image.symbol_list is None  # not made
    every = {s.addr for s in image.symbols if s.is_func and candidate_symbol(s.name)}
    assert fast == every and every
    assert image.function_addresses(candidate_symbol, CANDIDATE_PARTS) == every  # from the list now
