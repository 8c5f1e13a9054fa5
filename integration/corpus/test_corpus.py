"""Integration checks of the corpus: it builds, every program prints its
result, and gdb stops at every `// bp:` line.

Real parts only: cargo (offline), the built programs, gdb 13. The debug and
old-debug configs run by default; the optimised configs are marked slow
(each costs 15-100 s of a cold build on 2 cores).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from integration.corpus import build as corpus
from integration.corpus import markers
from integration.corpus.smoke import SMOKE_RUNS, SmokeRun, smoke

FAST_CONFIGS = ("debug", "old-debug")
# The 1.24 corpus' configs only: the modern corpus (tokio 1.43/1.53 crates) builds
# other programs, checked by integration/test_modern_corpus.py.
SLOW_CONFIGS = tuple(c for c, cfg in corpus.CONFIGS.items()
                     if c not in FAST_CONFIGS and cfg.crates is None)

CONFIG_PARAMS = [pytest.param(c) for c in FAST_CONFIGS] + [
    pytest.param(c, marks=pytest.mark.slow) for c in SLOW_CONFIGS
]

# Arguments for a run that reaches every breakpoint marker of the program.
GDB_RUN_ARGS = {
    "nested": "2",
    "tokio_app": "mt",
    "tokio_bench": "5 mt",
    "stuck": "mt",
    "deadlock": "mt",
    "lost_waker": "ct",
    "many_tasks": "10 < {go}",  # `go` on stdin wakes the tasks (task_woken)
}


def _binary_or_skip(config: str, program: str) -> Path:
    reason = corpus.skip_reason(config)
    if reason is not None:
        pytest.skip(str(reason))
    return corpus.binary(config, program)


@pytest.mark.parametrize("config", CONFIG_PARAMS)
@pytest.mark.parametrize("run", SMOKE_RUNS, ids=lambda r: f"{r.program}-{'-'.join(r.args)}")
def test_program_prints_its_result(config: str, run: SmokeRun) -> None:
    assert smoke(_binary_or_skip(config, run.program), run) is None


def _bp_params() -> list[tuple[str, str]]:
    return [(p, name) for p in GDB_RUN_ARGS for name in markers.breakpoint_markers(p)]


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed (scripts/setup installs it)")
@pytest.mark.parametrize("config", FAST_CONFIGS)
@pytest.mark.parametrize(("program", "bp"), _bp_params())
def test_gdb_stops_at_breakpoint_marker(config: str, program: str, bp: str, tmp_path: Path) -> None:
    path = _binary_or_skip(config, program)
    file, line = markers.breakpoint_markers(program)[bp]
    (tmp_path / "go").write_text("go\n")
    args = GDB_RUN_ARGS[program].format(go=tmp_path / "go")
    out = subprocess.run(
        ["gdb", "-batch", "-nx", "-ex", f"break {file.name}:{line}", "-ex", f"run {args}", str(path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL,
    ).stdout
    # "Breakpoint 1, f (..) at src/x.rs:7" or "Thread 1 "x" hit Breakpoint 1.1, f () at src/x.rs:7"
    hit = re.compile(rf"(^|hit )Breakpoint 1(\.\d+)?, .* at \S*{re.escape(file.name)}:{line}$", re.M)
    assert hit.search(out), out[-2000:]


def test_unknown_config_and_program_are_clear_errors() -> None:
    with pytest.raises(corpus.CorpusError, match="unknown config 'nope'"):
        corpus.build(configs=["nope"])
    with pytest.raises(corpus.CorpusError, match="unknown program"):
        corpus.build(configs=["debug"], programs=["nope"])
