"""`monitor async warnings` against tokio-console's own warnings for the very same tasks, in
the same run, through real gdb, gdbserver and the proxy with `--capture uprobes --wakes --lost-wakers`.

bench/server's `console_lints` (built with console-subscriber 0.5 and `tokio_unstable`, as a
tokio-console user builds) spawns a task of each kind console warns about, and two that are
healthy. console-subscriber records its event stream (`TOKIO_CONSOLE_RECORD_PATH`); the
recording carries no warning (tokio-console's UI computes them), so console's lints are
computed from it with console's own rules (bench/console_record.py, `console_warnings`, each
rule with its source lines). Outside truth twice over: console's rules on console's data, and
the source, which says which task should set off which warning. The run stops while the
`hog` task's first poll still blocks its worker, as a user looking at console would see it.

Tasks are matched by tokio's id: the recording's `task.id` (it carries no spawn location), in
spawn order (one thread spawns them, in the source's order, from tokio's one counter), to the
source's `tokio::spawn(NAME(` lines; ours by the task's async fn, each warning naming its
spawn line, which must be the source's.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.console_record import console_warnings, fold
from bench.server import build_server
from integration.harness.stubs import free_port
from integration.harness.uprobes import stopped_under_wakes
from proxy.capture.uprobes.capture import UprobeCapture

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "bench" / "server" / "src" / "bin" / "console_lints.rs"
PROG = build_server.binary("console", "release", "console_lints")
_OK, _WHY = UprobeCapture.available(SimpleNamespace(local=True))
_MISSING = build_server.missing("console", names=("console_lints",))
pytestmark = [pytest.mark.skipif(not _OK, reason=_WHY),
              pytest.mark.skipif(_MISSING is not None, reason=str(_MISSING))]

# What the source sets off on purpose: the task spawned by `tokio::spawn(NAME(` -> its warning.
MEANT = {"forgetful": "lost waker", "self_waker": "self-wakes", "hog": "never yielded", "big": "large future",
         "huge": "auto-boxed future"}
# and asyncrsp's own, not console's: `late_hog` yielded, then one poll blocked 1.2 s
OWN = {"late_hog": "long poll"}
_OURS = re.compile(r"^(lost waker|self-wakes|never yielded|large future|auto-boxed future|long poll): "
                   r"#\d+ (.*?) \(at .*, spawned at (\S+)\): ")


def _spawns() -> list[tuple[int, str]]:
    """(line, spawned function) of each `tokio::spawn(` in the source, in order."""
    out = []
    for i, text in enumerate(SOURCE.read_text().splitlines(), 1):
        m = re.search(r"tokio::spawn\((\w+)\(", text)
        if m:
            out.append((i, m.group(1)))
    return out


@pytest.mark.timeout(600)
def test_warnings_are_tokio_consoles_for_the_same_tasks(tmp_path: Path, monkeypatch: Any) -> None:
    record = tmp_path / "console.rec"
    monkeypatch.setenv("TOKIO_CONSOLE_RECORD_PATH", str(record))
    monkeypatch.setenv("TOKIO_CONSOLE_BIND", f"127.0.0.1:{free_port()}")  # console's gRPC port, not 6669
    spawns = _spawns()
    stopped_at: list[int] = []

    def ready(stub: Any) -> None:
        assert stub.output.wait_for(re.compile(rb"console_lints ready"), 120), stub.output_text()[-2000:]
        stopped_at.append(time.time_ns())  # console's `SystemTime::now()` as it looks at the stop

    with stopped_under_wakes(PROG, [], ready, extra=("--lost-wakers",)) as (mi, _stop):  # console's lost waker
        from integration.realworld import gauntlet

        text = gauntlet._console(mi, "monitor async warnings")
        ours = set()
        line_of_fn = {fn: line for line, fn in spawns}
        for row in text.splitlines()[1:]:
            m = _OURS.match(row)
            assert m is not None, (row, text)
            fn = re.search(r"\bconsole_lints::(\w+)", m.group(2))
            if fn is None:
                continue  # console-subscriber's own tasks (its aggregator, its gRPC server)
            ours.add((fn.group(1), m.group(1)))
            # spawned at the source's line: the capture's, else tokio's own (`huge`: its 20 KB
            # copies on the spawning stack put the program's frame past the kept 16 KiB)
            at = re.fullmatch(r"(?:runtime@)?(\S+?):(\d+)(?::\d+)?", m.group(3))
            assert at is not None and Path(at.group(1)).name == SOURCE.name and \
                int(at.group(2)) == line_of_fn[fn.group(1)], row
        tasks = fold(record)  # flushed by console's recorder after each batch: all but the stop's last
    by_id = sorted((int(t.task_id), t) for t in tasks.values())
    assert len(by_id) == len(spawns), ([(i, t.polls) for i, t in by_id], spawns)
    fn_of = {t.id: fn for (_, t), (_line, fn) in zip(by_id, spawns)}
    console = {(fn_of[tid], kind) for tid, kind in console_warnings(tasks, stopped_at[0])}
    meant = set(MEANT.items())
    own = set(OWN.items())
    assert console == meant, (sorted(console), sorted(meant))  # console sees what the source meant
    assert {w for w in ours if w[1] != "long poll"} == console, (sorted(ours), sorted(console), text)
    assert {w for w in ours if w[1] == "long poll"} == own, (sorted(ours), text)
