"""Run one gdb session through the proxy over a given stub, and compare what
`monitor async ...` answers across stubs.

Two stubs run the same program differently in ways that are not the proxy's
business: QEMU's user mode loads a PIE at 0x4000000000 (gdbserver at
0x555555554000) and its heap and stacks elsewhere, and names threads by host
tids. ``comparable`` removes exactly that: hexadecimal addresses become
``ADDR``, thread numbers ordinals by first appearance and tokio Sleep
deadlines (CLOCK_MONOTONIC times of the run) ``T``; timing columns of
`tasks` are dropped. Names, source lines, states, tree shape and the FOUND
BY column stay, and must be equal.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from integration.harness import debuggers
from integration.harness.monitor import ask  # noqa: F401  (re-exported for the QEMU comparisons)
from integration.harness.stubs import start_stub

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    gdb: str  # gdb's whole output (monitor output included)
    program: str  # the program's own output (QEMU: its stdout; gdbserver: the stub's)
    proxy: str  # the proxy's stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reap(proc: subprocess.Popen, kill: bool) -> None:  # type: ignore[type-arg]
    """Wait up to 30 s for ``proc`` to end; then kill it (``kill``) or leave it."""
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        if kill:
            proc.kill()
            proc.wait()


def run_session(stub: str, prog: Path, args: list[str], commands: list[str], extra: list[str],
                gdb: str = "gdb", timeout: float = 240, setup: Sequence[str] = ()) -> Run:
    """``commands`` in gdb (batch) through a fresh proxy in front of ``stub`` (a kind of
    integration/harness/stubs.py) running ``prog args``; the proxy gets ``--elf prog``;
    ``setup``: gdb commands before it connects."""
    with start_stub(stub, prog, args) as st:
        port = _free_port()
        proxy = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--once", "--listen", f"127.0.0.1:{port}",
             "--upstream", st.address, "--elf", str(prog), *extra],
            cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        try:
            assert proxy.stderr is not None
            line = proxy.stderr.readline()
            assert "listening on" in line, line
            argv = debuggers.argv(gdb, "-nx", "-batch", "-ex", "set pagination off",
                                  "-ex", "set remotetimeout 60", *(w for c in setup for w in ("-ex", c)),
                                  "-ex", f"target remote 127.0.0.1:{port}")
            for c in commands:
                argv += ["-ex", c]
            out = subprocess.run([*argv, str(prog)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, timeout=timeout, check=False).stdout
        finally:
            _reap(proxy, kill=True)
        _reap(st.proc, kill=False)  # the program's end (start_stub's exit kills what is left)
        err = proxy.stderr.read() if proxy.stderr is not None else ""
        return Run(out, st.output_text(), line + err)


def sections(out: str) -> dict[str, str]:
    """``echo ==NAME==`` sections of gdb's output, numbered from the second time a name
    repeats (``tree``, ``tree#2``, ...)."""
    found: dict[str, str] = {}
    for m in re.finditer(r"^==(.+?)==\n(.*?)(?=^==|\Z)", out, re.S | re.M):
        name = m.group(1)
        key, n = name, 1
        while key in found:
            n += 1
            key = f"{name}#{n}"
        found[key] = m.group(2)
    return found


_HEX = re.compile(r"\b0x[0-9a-f]+\b")
_DEADLINE = re.compile(r"deadline \d+\.\d+ s")
_THREAD = re.compile(r"\b(thread|THREAD) (\d+)\b")
_TASKS_HEAD = re.compile(r"^ID\s+ADDRESS\s+STATE")
_TIMING_COLUMNS = ("POLLS", "BUSY", "IDLE", "LONGEST")


def _tasks_table(text: str) -> str:
    """`tasks` rows without the timing columns (the columns are split at the header's)."""
    lines = text.splitlines()
    out = []
    cols: list[tuple[str, int]] | None = None
    for line in lines:
        if _TASKS_HEAD.match(line):
            cols = [(m.group(0), m.start()) for m in re.finditer(r"\S+(?: BY| FN)?", line)]
            out.append(" | ".join(c for c, _ in cols if c not in _TIMING_COLUMNS))
            continue
        if cols is None or not re.match(r"#\d+\s", line):
            if not line.startswith("capture cost"):
                out.append(line)
            continue
        cells = []
        for i, (name, start) in enumerate(cols):
            end = cols[i + 1][1] if i + 1 < len(cols) else None
            cell = line[start:end].strip()
            if name == "THREAD" and cell.isdigit():
                cell = f"thread {cell}"
            if name not in _TIMING_COLUMNS:
                cells.append(cell)
        out.append(" | ".join(cells))
    return "\n".join(out)


def comparable(text: str) -> str:
    """``text`` with what differs between stubs by right removed (module doc)."""
    text = _tasks_table(text)
    text = _HEX.sub("ADDR", text)
    text = _DEADLINE.sub("deadline T s", text)  # a remote Sleep's absolute deadline: the run's clock
    seen: dict[str, int] = {}

    def thread(m: re.Match[str]) -> str:
        n = seen.setdefault(m.group(2), len(seen) + 1)
        return f"{m.group(1)} T{n}"

    text = _THREAD.sub(thread, text)
    return "\n".join(line.rstrip() for line in text.splitlines() if "runtime adapters" not in line)
