"""AArch64 exits (proxy/analysis/exits_aarch64.py): A64 encodings by hand, and the corpus'
aarch64 build against its own disassembly by binutils (aarch64-linux-gnu-objdump)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from proxy.analysis import exits_aarch64
from proxy.analysis.elf import open_elf
from proxy.analysis.exits import import_sites
from proxy.analysis.inventory import analyse

LOW = 0x1000
CODE = [  # (address, instruction word)
    (0x1000, 0xD503201F),  # nop
    (0x1004, 0x940003FF),  # bl 0x2000          (_Unwind_Resume's PLT stub): other
    (0x1008, 0x140007FE),  # b 0x3000           (a tail call): other
    (0x100C, 0x54FFFFC0),  # b.eq 0x1004        (inside): not an exit
    (0x1010, 0xB4017F80),  # cbz x0, 0x4000     (leaves): other
    (0x1014, 0xD61F0220),  # br x17             (a jump table): not an exit
    (0x1018, 0xD65F03C0),  # ret
    (0x101C, 0xD65F0BFF),  # retaa              (pointer authentication)
]


def test_rets_and_other_exits_from_a64_encodings() -> None:
    code = b"".join(w.to_bytes(4, "little") for _, w in CODE)
    rets, other = exits_aarch64.exits(code, LOW, LOW + len(code), unwind_targets={0x2000})
    assert rets == (0x1018, 0x101C)
    assert other == (0x1004, 0x1008, 0x1010)


def _aarch64_corpus() -> str:
    from integration.corpus.build import ToolchainMissing, binary

    try:
        return str(binary("old-aarch64-debug", "tokio_app"))
    except ToolchainMissing as err:
        pytest.skip(str(err))


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-objdump") is None,
                    reason="binutils-aarch64-linux-gnu not installed (bash scripts/arm64-toolchain)")
def test_the_corpus_resume_functions_rets_and_plt_stub_equal_objdumps() -> None:
    """Every resume function's rets are the `ret`s objdump prints in its range, and
    _Unwind_Resume's PLT stub is objdump's `<_Unwind_Resume@plt>` (before: capstone's x86
    decoder over A64 bytes found 0 rets, and self was taken from rdi)."""
    path = _aarch64_corpus()
    dump = subprocess.run(["aarch64-linux-gnu-objdump", "-d", "--no-show-raw-insn", path],
                          capture_output=True, text=True, check=True).stdout
    rets = {int(m[1], 16) for m in re.finditer(r"^\s+([0-9a-f]+):\s+ret\b", dump, re.M)}
    plt = {int(m[1], 16) for m in re.finditer(r"^([0-9a-f]+) <_Unwind_Resume@plt>:", dump, re.M)}
    inv = analyse(open_elf(path))
    assert len(inv.resume_fns) >= 9
    for fn in inv.resume_fns:
        assert fn.self_in == "x0", fn.name
        assert fn.rets and set(fn.rets) == {r for r in rets if fn.low_pc <= r < fn.high_pc}, fn.name
    targets, slots = import_sites(open_elf(path), "_Unwind_Resume", [])
    assert plt and plt <= targets and slots
