"""Today's Rust: the modern corpus (tokio 1.43 / 1.53, hyper, axum, async-std, smol, futures'
executor; integration/corpus_modern) through real gdb -> asyncrsp -> gdbserver.

For each program at its marker, `monitor async tree` must name every pending future its
source says is there, down to the leaf, with `.await` lines: the expected tree kept beside
the source (`<program>.tree`, format in integration/harness/expected_tree.py). Two ways:

* capture on (observed polls; the gdbserver runs the program from the start);
* attach: the program runs alone until it is parked, then gdbserver attaches (the proxy
  came late, nothing planted: `--mode off`), and the runtime adapters chosen by layout find
  the spawned tasks in memory.

The default run covers each program in debug + current-thread with capture on and in
release + multi-thread attached; ASYNCRSP_MODERN_FULL=1 runs every combination (debug and
release, ct and mt, both ways). The crates come from Debian trixie / sid
(`bash scripts/fetch-crates trixie|sid`): without them the tests skip, saying so.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from integration.corpus import build, markers
from integration.harness import expected_tree
from integration.harness.monitor import ask, attached, modern_binary, section, session

ROOT = Path(__file__).resolve().parents[1]


MARKER = {"stuck": "stuck_ready", "tk_dump": "dumped", "tk_sync": "parked", "hyper_svc": "requested", "axum_svc": "requested",
          "astd": "parked", "smol_app": "parked", "fut_exec": "parked", "tk_join3": "dumped",
          "tk_streams": "parked", "deadlock": "ready", "lost_waker": "ready"}
ONE_FLAVOUR = {"astd", "fut_exec"}  # async-std's global executor; LocalPool: one thread only
FULL = os.environ.get("ASYNCRSP_MODERN_FULL") == "1"


def _cases() -> list:  # type: ignore[type-arg]
    out = []
    for rel in ("trixie", "sid"):
        for program in build.MODERN_PROGRAMS[rel]:
            for kind in ("debug", "release"):
                for rt in ("ct",) if program in ONE_FLAVOUR else ("ct", "mt"):
                    for how in ("capture", "attach"):
                        default = (kind, rt, how) in (("debug", "ct", "capture"), ("release", "mt", "attach")) or (
                            program in ONE_FLAVOUR and (kind, how) == ("release", "attach")) or (
                            # a thread in one block's poll marks no other parked block of its fn
                            f"{rel}-{program}" == "trixie-tk_sync" and (kind, rt, how) == ("release", "mt", "capture"))
                        if FULL or default:
                            out.append(pytest.param(f"{rel}-{kind}", program, rt, how,
                                                    id=f"{rel}-{kind}-{program}-{rt}-{how}"))
    return out


def expected(program: str) -> list:  # type: ignore[type-arg]
    src = markers.program_sources(program)[0]

    def lines(parent: str, child: str) -> list[int]:
        return [m.line for m in markers.await_markers(program) if m.parent == parent and m.child == child]

    return expected_tree.load(src.with_suffix(".tree"), lines)


def tree_of(config: str, program: str, rt: str, how: str) -> str:
    prog = modern_binary(config, program)
    if how == "capture":
        path, line = markers.breakpoint_markers(program)[MARKER[program]]
        out = session(prog, [rt], [f"break {path.name}:{line}", "continue", *ask("tree")])
    else:
        out = attached(prog, [rt], f"{program} ready", ask("tree"), ["--mode", "off"])
    return section(out, "tree")


@pytest.mark.parametrize("config,program,rt,how", _cases())
def test_tree_names_every_pending_future(config: str, program: str, rt: str, how: str) -> None:
    want = expected(program)
    tree = tree_of(config, program, rt, how)
    missing = expected_tree.missing(want, tree)
    assert not missing, "\n".join(missing) + "\n--- tree:\n" + tree


def test_spawn_location_where_tokio_records_it() -> None:
    """tokio >= 1.46 built with tokio_unstable keeps each task's spawn location in its
    Core (`spawned_at`): the adapter's task line shows it (tokio 1.53, attached late)."""
    prog = modern_binary("sid-unstable-debug", "tk_dump")
    src = markers.program_sources("tk_dump")[0]
    line = next(i for i, text in enumerate(src.read_text().splitlines(), 1) if "tokio::spawn(foo())" in text)
    out = attached(prog, ["ct"], "tk_dump ready", ask("tree"), ["--mode", "off"])
    tree = section(out, "tree")
    head = next((h for h in tree.splitlines() if h.startswith("task ") and "tk_dump::foo" in h), "")
    assert re.search(rf"spawned at \S*tk_dump\.rs:{line}:\d+", head), tree
    # without tokio_unstable (the same tokio) nothing is recorded, nothing is shown
    out = attached(modern_binary("sid-debug", "tk_dump"), ["ct"], "tk_dump ready", ask("tree"), ["--mode", "off"])
    assert "spawned at" not in section(out, "tree")


@pytest.mark.parametrize("program", ["smol_app", "astd"])
def test_ps_tree_of_a_running_async_task_program(program: str) -> None:
    """`asyncrsp tree PID` (the program copied while stopped, no debugger) finds async-task's
    tasks through the same adapters: the expected tree of a smol / async-std program."""
    import subprocess

    prog = modern_binary("trixie-debug", program)
    p = subprocess.Popen([str(prog)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert p.stdout is not None and f"{program} ready" in p.stdout.readline()
        out = subprocess.run([sys.executable, "-m", "proxy", "tree", str(p.pid)], cwd=ROOT, capture_output=True,
                             text=True, timeout=300, check=False)
    finally:
        p.kill()
        p.wait()
    missing = expected_tree.missing(expected(program), out.stdout)
    assert not missing, "\n".join(missing) + "\n--- tree:\n" + out.stdout + out.stderr
