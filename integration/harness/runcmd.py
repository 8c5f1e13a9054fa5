"""`asyncrsp run` as a user types it, driven by a real gdb: start the command,
read the port it printed, run gdb's commands through it, collect both sides."""

from __future__ import annotations

import os
import pty
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .stubs import OutputPump, kill_tree

LISTENING = re.compile(rb"asyncrsp: listening on 127\.0\.0\.1:(\d+)")


@dataclass(frozen=True)
class RunResult:
    gdb: str  # gdb's stdout and stderr (monitor output comes on stderr)
    proxy: str  # the proxy's stderr
    proxy_code: int | None  # None: it was killed after gdb left


def monitor(*commands: str) -> list[str]:
    """gdb commands printing ``==CMD==`` before each ``monitor async CMD``'s answer."""
    out: list[str] = []
    for c in commands:
        out += [f"echo =={c}==\\n", f"monitor async {c}"]
    return [*out, "echo ==end==\\n"]


def section(out: str, command: str) -> str:
    m = re.search(rf"=={re.escape(command)}==\n(.*?)(?:\n==|\Z)", out, re.S)
    assert m, f"no output for {command!r} in:\n{out[-3000:]}"
    return m.group(1)


def run_session(asyncrsp: Sequence[str], program: Sequence[str], commands: Sequence[str], *,
                run_args: Sequence[str] = (), env: Mapping[str, str] | None = None, cwd: Path | None = None,
                gdb_prefix: Sequence[str] = (), timeout: float = 120.0, stderr_tty: bool = False) -> RunResult:
    """``<asyncrsp> run --listen 127.0.0.1:0 <run_args> -- <program>``, then ``gdb -batch``
    with `commands` through it, then ``kill``. `asyncrsp` is the command's argv
    (an installed script, or an interpreter and ``-m proxy``). `stderr_tty`: the
    proxy's stderr is a pty (a user's terminal), read from its master side."""
    argv = [*asyncrsp, "run", "--listen", "127.0.0.1:0", *run_args, "--", *program]
    master, slave = pty.openpty() if stderr_tty else (-1, -1)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=slave if stderr_tty else subprocess.PIPE,
                            env=None if env is None else dict(env), cwd=cwd, start_new_session=True)
    if stderr_tty:
        os.close(slave)
    err = OutputPump(os.fdopen(master, "rb", buffering=0) if stderr_tty else proc.stderr)
    try:
        m = err.wait_for(LISTENING, 30.0)
        if m is None:
            kill_tree(proc)
            return RunResult("", err.text(), proc.wait(timeout=10))
        gdb = [*gdb_prefix, "gdb", "-nx", "-batch", "-ex", "set pagination off", "-ex", "set remotetimeout 60",
               "-ex", f"target remote 127.0.0.1:{int(m.group(1))}"]
        for c in commands:
            gdb += ["-ex", c]
        gdb += ["-ex", "kill", program[0]]
        out = subprocess.run(gdb, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=timeout, check=False).stdout
        try:
            code: int | None = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            code = None
        return RunResult(out, err.text(), code)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
        err.join()
