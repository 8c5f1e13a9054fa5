"""Quick runs of every corpus program that check it prints its result.

Each ``SmokeRun`` starts a built program with small arguments and waits for a
line matching ``expect``. Programs that never end by themselves (``stuck``,
``many_tasks`` without ``go``) are killed once their ready line shows.

Usage::

    python -m integration.corpus.smoke [--config NAME ...]   # builds first

and from Python: ``smoke(path, run) -> str | None`` (None when fine, else
what went wrong).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from integration.corpus import build as corpus


@dataclass(frozen=True, slots=True)
class SmokeRun:
    """One quick run: arguments, stdin, the line to wait for, and the exit."""

    program: str
    args: tuple[str, ...]
    expect: str  # a regex searched line by line in stdout
    stdin: str | None = None
    forever: bool = False  # never exits by itself: kill after `expect`


SMOKE_RUNS: tuple[SmokeRun, ...] = (
    SmokeRun("nested", ("2",), r"^nested done total=\d+$"),
    SmokeRun("tokio_app", ("ct",), r"^tokio_app done mode=ct total=84$"),
    SmokeRun("tokio_app", ("mt",), r"^tokio_app done mode=mt total=84$"),
    SmokeRun("tokio_bench", ("55", "mt"), r"^bench done n=55 mode=mt leaves=165 acc=\d+ check=ok$"),
    SmokeRun("tokio_bench", ("20", "ct"), r"^bench done n=20 mode=ct leaves=60 acc=\d+ check=ok$"),
    SmokeRun("stuck", ("mt",), r"^stuck ready pid=\d+$", forever=True),
    SmokeRun("many_tasks", ("1000",), r"^many_tasks done tasks=1000 sum=1000000$", stdin="go\n"),
    SmokeRun("many_tasks", ("50", "ct"), r"^ready tasks=50 pid=\d+$", forever=True),
    SmokeRun("poll_timing", ("5", "1"), r"^timing done polls=5 spin_ms=1 spun=\d+ slept=5 spinner_busy_us=\d+$"),
    SmokeRun("combinators", (), r"^combinators done sum=101$"),
    SmokeRun("http_server", ("0",), r"^server ready port=\d+ pid=\d+$", forever=True),
    SmokeRun("deadlock", ("mt",), r"^deadlock ready pid=\d+$", forever=True),
    SmokeRun("lost_waker", ("ct",), r"^lost_waker ready pid=\d+$", forever=True),
    SmokeRun("first_poll", ("ct",), r"^first_poll done total=10$"),
    SmokeRun("first_poll", ("mt",), r"^first_poll done total=10$"),
)

TIMEOUT_S = 30.0


def _wait_for_line(proc: subprocess.Popen[str], pattern: re.Pattern[str]) -> str | None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if pattern.search(line.rstrip("\n")):
            return line.rstrip("\n")
    return None


def smoke(path: Path, run: SmokeRun) -> str | None:
    """Runs ``path`` as ``run`` says; None when it printed what it should."""
    pattern = re.compile(run.expect)
    proc = subprocess.Popen(
        [str(path), *run.args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdin is not None
    if run.stdin:
        proc.stdin.write(run.stdin)
    proc.stdin.close()
    try:
        found = _wait_for_line(proc, pattern)
        if run.forever:
            proc.kill()
        code = proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if found is None:
        return f"no line matching {run.expect!r} (exit {code})"
    if not run.forever and code != 0:
        return f"exit status {code}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="build and smoke-run the corpus")
    parser.add_argument("--config", action="append", choices=list(corpus.CONFIGS))
    args = parser.parse_args(argv)
    failures = 0
    for config in args.config or list(corpus.CONFIGS):
        skip = corpus.skip_reason(config)
        if skip is not None:
            print(f"{config:14} {skip}")
            continue
        for run in SMOKE_RUNS:
            started = time.monotonic()
            problem = smoke(corpus.binary(config, run.program), run)
            took = time.monotonic() - started
            status = "ok" if problem is None else f"FAIL: {problem}"
            failures += problem is not None
            print(f"{config:14} {run.program:12} {' '.join(run.args):8} {took:5.2f} s {status}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
