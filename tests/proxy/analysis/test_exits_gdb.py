"""Every resume function's exits, checked on a real run under gdb: a
breakpoint at each entry and at each exit the inventory found (every `ret`
from capstone's return group, every `call _Unwind_Resume`); over the whole
run, entries == exit hits for every function, so nothing returns elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.proxy.analysis.corpus_util import corpus_binary

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")

PANICS_ONCE = {"nested": "boom", "tokio_app": "panicker"}
FAST = [("debug", "nested"), ("release", "nested"), ("old-debug", "nested"), ("old-release", "nested")]
SLOW = [(c, p) for c in ("debug", "release", "release-fp", "lto", "old-debug", "old-release")
        for p in ("tokio_app",)] + [("release-fp", "nested"), ("lto", "nested")]


def _run(config: str, program: str, inventory_of, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = corpus_binary(config, program)
    inv = inventory_of(path)
    assert inv.resume_fns, "the program has resume functions as code"
    spec = {"entry": inv.entry, "entries": {}, "exits": {}}
    for i, f in enumerate(inv.resume_fns):
        spec["entries"][str(f.low_pc)] = i
        for a in f.rets + f.other_exits:
            spec["exits"][str(a)] = i
    (tmp_path / "in.json").write_text(json.dumps(spec))
    env = dict(os.environ, ASYNCRSP_EXITS_IN=str(tmp_path / "in.json"), ASYNCRSP_EXITS_OUT=str(tmp_path / "out.json"))
    subprocess.run(["gdb", "-nx", "-batch", "-x", str(HERE / "gdb_count_exits.py"), str(path)],
                   env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    counts = json.loads((tmp_path / "out.json").read_text())
    entries = {int(k): v for k, v in counts["entries"].items()}
    exits = {int(k): v for k, v in counts["exits"].items()}
    assert sum(entries.values()) > 0, "the run polled some coroutines"
    wrong = []
    for i, n in entries.items():
        f, seen = inv.resume_fns[i], exits.get(i, 0)
        # each corpus program below panics once inside one coroutine (caught by catch_unwind
        # or by tokio): a resume fn with no landing pad (rustc 1.63 debug GenFuture::poll) is
        # left by that unwinding without running any of its instructions
        panicky = PANICS_ONCE.get(program)
        if seen == n or (f.panics_unseen and panicky and f"::{panicky}::" in f.name and n - seen == 1):
            continue
        wrong.append((f.name, n, seen))
    assert not wrong, f"entries != exits (name, entries, exits): {wrong}"


@pytest.mark.parametrize("config,program", FAST)
def test_exits_catch_every_return(config: str, program: str, inventory_of, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _run(config, program, inventory_of, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("config,program", SLOW)
def test_exits_catch_every_return_slow(config: str, program: str, inventory_of, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _run(config, program, inventory_of, tmp_path)


def test_exit_verdicts_without_the_detailed_decode_match_capstone_groups() -> None:
    """``ExitFinder.exits`` judges plain rets, immediate calls and jumps, register-indirect
    ones and rip-relative slots from ``disasm_lite``'s text; every verdict must be what
    capstone's detailed decode (its RET / CALL / JUMP groups and operands) gives."""
    import capstone

    from proxy.analysis.exits import ExitFinder

    low = 0x1000
    code = bytes.fromhex(
        "c3"              # ret
        "c20800"          # ret 8
        "f2c3"            # bnd ret
        "e8fb0f0000"      # call 0x2006 (an unwind target here)
        "e800000000"      # call the next instruction
        "ff15f00f0000"    # call [rip + 0xff0] (an unwind slot here)
        "ff15f0ffffff"    # call [rip - 0x10]
        "ff1500000000"    # call [rip]
        "ffd0"            # call rax
        "ff10"            # call [rax]
        "ffe0"            # jmp rax
        "ff24c500000000"  # jmp [rax*8] (a jump table)
        "ff2500010000"    # jmp [rip + 0x100]: leaves
        "7400"            # je the next instruction
        "0f8400100000"    # je outside
        "e2fe"            # loop to itself
        "e900200000"      # jmp outside
        "eb00"            # jmp the next instruction
        "f00fb10a"        # lock cmpxchg [rdx], ecx
        "f3c3"            # repz ret
        "90"              # nop
    )
    high = low + len(code)

    class Elf:
        def read(self, addr: int, n: int) -> bytes:
            return code[addr - low:addr - low + n]

    finder = ExitFinder.__new__(ExitFinder)
    finder.elf, finder.warnings = Elf(), []
    finder.cs = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    finder.cs.detail = True
    finder.lite = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    call_rip = low + code.index(bytes.fromhex("ff15f00f0000"))
    finder.unwind_targets, finder.unwind_slots = {0x2006}, {call_rip + 6 + 0xFF0}

    # the reference: every instruction through the detailed decode
    kinds = [(insn.address, finder.exit_kind(insn, low, high)) for insn in finder.cs.disasm(code, low)]
    rets = [a for a, k in kinds if k == "ret"]
    other = [a for a, k in kinds if k == "other"]
    assert len(rets) == 4 and len(other) == 5, (rets, other)
    assert finder.exits(low, high) == (tuple(rets), tuple(other))
