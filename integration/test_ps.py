"""`asyncrsp ps` / `asyncrsp tree` on live corpus programs and their cores.

The live process is stopped only while it is copied (ptrace seize, interrupt,
registers, /proc/PID/mem, detach); it must go on and print its own result
afterwards. How long it was stopped is printed (bench/bench_ps.py measures it).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from integration.harness.monitor import corpus_binary
from integration.harness.serve import asyncrsp
from integration.harness.stuck import STUCK_CONFIGS, STUCK_TASKS, gcore, start_stuck


ROOT = Path(__file__).resolve().parents[1]


def rows(text: str) -> list[str]:
    """The table without its header line, a Sleep's time left masked."""
    return [re.sub(r"\(\d+\.\d (min|h|s) left\)", "(… left)", line) for line in text.splitlines()[1:]]


@pytest.mark.parametrize("config", STUCK_CONFIGS)
def test_ps_live_equals_ps_of_its_core(config: str, tmp_path: Path) -> None:
    """ps PID: tasks, what each waits on, the deadlock cycle; the program survives; a gcore
    of the same process gives the same rows through ps --core."""
    prog = corpus_binary(config, "stuck")
    p = start_stuck(prog, tmp_path)
    try:
        live = asyncrsp("ps", str(p.pid))
        core = gcore(p.pid, tmp_path / "g")
        assert p.poll() is None, "the program died"
    finally:
        p.kill()
        p.wait()
    assert live.returncode == 0, live.stderr
    head = live.stdout.splitlines()[0]
    assert re.match(rf"process {p.pid}: \d+ tasks; stopped \d+\.\d ms, \d+\.\d MB copied$", head), head
    cycle = [line for line in live.stdout.splitlines() if line.startswith("cycle: ")]
    assert len(cycle) == 1 and re.fullmatch(
        r"cycle: #\d+ stuck::lock_(ab|ba) -> Mutex 0x[0-9a-f]+ held by #\d+ stuck::lock_(ab|ba) "
        r"-> Mutex 0x[0-9a-f]+ held by #\d+", cycle[0]), live.stdout
    for name in STUCK_TASKS:
        assert re.search(rf"^#\d+ +0x[0-9a-f]+ +suspended +\S+stuck.rs:\d+ .* stuck::{name}$", live.stdout,
                         re.M), live.stdout
    from_core = asyncrsp("ps", "--core", str(core))
    assert from_core.returncode == 0, from_core.stderr
    assert from_core.stdout.splitlines()[0].startswith(f"core file {core} (pid {p.pid}): ")
    assert rows(from_core.stdout) == rows(live.stdout)


def test_ps_many_tasks_program_keeps_running(tmp_path: Path) -> None:
    """1,000 tasks: ps --json and tree list them all; then the program gets its `go` and
    finishes with its own, unchanged result line."""
    prog = corpus_binary("debug", "many_tasks")
    p = subprocess.Popen([str(prog), "1000", "mt"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline().startswith("ready tasks=1000")
        got = asyncrsp("ps", "--json", str(p.pid))
        tree = asyncrsp("tree", str(p.pid))
        p.stdin.write("go\n")
        p.stdin.close()
        assert p.stdout.readline().strip() == "many_tasks done tasks=1000 sum=1000000"
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    waiters = [t for t in doc["tasks"] if t["name"] == "many_tasks::waiter"]
    assert len(waiters) == 1000, [t["name"] for t in doc["tasks"]][:20]
    assert not [f for f in doc["waits"]["findings"] if f["kind"] == "cycle"]
    assert doc["stopped_ms"] is not None and doc["stopped_ms"] > 0
    assert tree.returncode == 0 and tree.stdout.count("╼ many_tasks::waiter at ") == 1000, tree.stdout[-2000:]


@pytest.mark.parametrize("args, message", [
    (["ps", "999999999"], "no process 999999999"),
    (["tree"], "give a PID or --core FILE"),
    (["ps", "--core", "/nonexistent/core"], "No such file"),
    (["tree", "--core", "/etc/hostname"], "not an ELF file"),
])
def test_bad_input_is_one_line(args: list[str], message: str) -> None:
    r = asyncrsp(*args)
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.count("\n") == 1 and message in r.stderr and r.stderr.startswith("asyncrsp: "), r.stderr


def test_ps_on_a_busy_program_leaves_its_result_unchanged() -> None:
    """tokio_bench checks its own result against a synchronous twin (a corrupted register or
    byte shows as check=MISMATCH): `ps` stops it mid-run, as often as it can, and the run
    still ends check=ok."""
    prog = corpus_binary("debug", "tokio_bench")
    p = subprocess.Popen([str(prog), "100000", "mt"], stdout=subprocess.PIPE, text=True)
    looks = 0
    try:
        while p.poll() is None and looks < 3:
            r = asyncrsp("ps", str(p.pid))
            if r.returncode == 0:
                assert re.match(rf"process {p.pid}: \d+ tasks?; stopped \d+\.\d ms", r.stdout), r.stdout
                looks += 1
        out, _ = p.communicate(timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert looks >= 1, "the program ended before ps could look at it"
    assert re.search(r"^bench done n=100000 mode=mt leaves=300000 acc=\d+ check=ok$", out, re.M), out
