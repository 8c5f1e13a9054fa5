"""The whole corpus under QEMU's user-mode gdbstub against gdbserver, marker by marker.

For every program and `// bp:` marker of the 1.24 corpus (integration/corpus), and each
config and mode asked: stop at the marker through the proxy over qemu-x86_64 and over
gdbserver (the proxy told the stub is remote; the runtime adapters on: their map through
vFile there, from QEMU's own process here, proxy/host/emulator.py), ask `tree`, `bt`, `tasks`, compare them as
integration/test_qemu_corpus.py does (integration/harness/compare.py), and let the program
run on. Prints one line per marker (same / differs / QEMU run did not end) and the diffs.
integration/test_qemu_corpus.py runs a few of these in the test suite.

An AArch64 config (``old-aarch64-debug``, ``old-aarch64-release``: Debian's rustc 1.63,
scripts/arm64-toolchain) runs under qemu-aarch64 with gdb-multiarch and is compared with
the x86-64 build of the same rustc (``old-debug``, ``old-release``) under gdbserver
(integration/test_qemu_aarch64.py runs a few of these in the test suite).
"""

from __future__ import annotations

import argparse
import difflib
import sys
import time
from pathlib import Path

from integration.corpus import build, markers
from integration.harness.compare import ask, comparable, run_session, sections

ROOT = Path(__file__).resolve().parents[1]

QUESTIONS = ("tree", "bt", "tasks")
# the current-thread runtime where a program takes one: QEMU 7.2 stops only the thread
# that trapped (docs/remote.md), so a multi-threaded runtime's other threads move meanwhile
ARGS = {"tokio_app": ["ct"], "nested": ["2"], "tokio_bench": ["5", "ct"], "stuck": ["ct"],
        "deadlock": ["ct"]}
NEVER_ENDS = {"stuck", "deadlock"}


def one(config: str, program: str, marker: str, mode: str) -> tuple[str, str]:
    prog = build.pinned(build.binary(config, program))
    file, line = markers.breakpoint_markers(program)[marker]
    end = ["delete", "continue"] if program not in NEVER_ENDS else ["kill"]
    commands = [f"break {file.name}:{line}", "continue", *ask(*QUESTIONS), *end]
    extra = ["--capture", "breakpoints"] if mode == "full" else ["--mode", "off"]
    if "aarch64" in config:  # no -L for qemu-aarch64: gdb needs the host's multiarch sysroot
        qemu = run_session("qemu-aarch64", prog, ARGS.get(program, []), commands, extra, gdb="gdb-multiarch",
                           setup=("set sysroot /", "maint set target-async off"))
        prog = build.pinned(build.binary(config.replace("aarch64-", ""), program))  # x86-64, same rustc
    else:
        qemu = run_session("qemu", prog, ARGS.get(program, []), commands, extra)
    # gdbserver --remote: the runtime adapters' map read through vFile; QEMU's is its own
    # process's (docs/remote.md)
    gdbs = run_session("gdbserver", prog, ARGS.get(program, []), commands, [*extra, "--remote"])
    got = {k: comparable(v) for k, v in sections(qemu.gdb).items()}
    want = {k: comparable(v) for k, v in sections(gdbs.gdb).items()}
    diffs = []
    for q in QUESTIONS:
        if got.get(q) != want.get(q):
            diffs += difflib.unified_diff((want.get(q) or "").splitlines(), (got.get(q) or "").splitlines(),
                                          f"gdbserver {q}", f"qemu {q}", lineterm="")
    ended = program in NEVER_ENDS or "exited normally" in qemu.gdb
    verdict = ("same" if not diffs else "differs") + ("" if ended else ", QEMU run did not end")
    return verdict, "\n".join(diffs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", default=None, help="debug, release, old-debug, old-aarch64-debug... (default: debug, release)")
    ap.add_argument("--mode", action="append", choices=("full", "off"), default=None)
    ap.add_argument("--program", action="append", default=None)
    a = ap.parse_args()
    bad = 0
    for config in a.config or ["debug", "release"]:
        for program in a.program or list(ARGS):
            for marker in markers.breakpoint_markers(program):
                for mode in a.mode or ["full", "off"]:
                    t0 = time.perf_counter()
                    try:
                        verdict, diff = one(config, program, marker, mode)
                    except Exception as err:  # noqa: BLE001 - one line per marker, go on
                        verdict, diff = f"error: {err!r}"[:200], ""
                    bad += verdict != "same"
                    print(f"{config:10} {program:12} {marker:16} {mode:4}  {verdict}  "
                          f"({time.perf_counter() - t0:.0f} s)", flush=True)
                    if diff:
                        print(diff)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
