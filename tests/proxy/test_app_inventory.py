"""The session's inventory loader (proxy.app.load_inventory): a program without
Rust code gets the empty inventory the analysis would find, without running it
(GDB's own testsuite's C programs: each session paid the analysis' imports)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from proxy.analysis.elf import open_elf
from proxy.analysis.inventory import analyse
from proxy.app import load_inventory

C_PROGRAM = "int tick(int x) { return x + 1; }\nint main(void) { return tick(0) - 1; }\n"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_a_c_program_gets_what_the_analysis_finds(tmp_path: Path) -> None:
    src = tmp_path / "p.c"
    src.write_text(C_PROGRAM)
    prog = tmp_path / "p"
    subprocess.run(["gcc", "-g", "-O0", "-o", str(prog), str(src)], check=True)
    assert not open_elf(prog).has_rust_symbols()
    assert load_inventory(str(prog)) == analyse(open_elf(prog))


def test_rust_mangled_names_are_rust() -> None:
    from proxy.analysis.elf import ElfImage, Symbol

    def image(*names: str) -> ElfImage:
        syms = [Symbol(n, 0x1000 + i, 1, True) for i, n in enumerate(names)]
        return ElfImage("p", b"", "EM_X86_64", True, 0, None, 0, (), {}, syms)

    assert image("main", "_ZN8tokio_app4main17h0123456789abcdefE").has_rust_symbols()
    assert image("_RNvCs1234_7mycrate4main").has_rust_symbols()
    assert not image("main", "tick", "_start").has_rust_symbols()
