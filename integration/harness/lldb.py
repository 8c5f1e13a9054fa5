"""Drive Debian's lldb 14 in batch mode.

``lldb --batch`` runs ``-o`` commands one after another and waits for each
``continue``/``step`` to stop, which makes sessions deterministic. The output
echoes every command as ``(lldb) CMD``; :func:`split_transcript` cuts it
there.

Two findings on this machine:

* lldb's embedded Python is broken as packaged: ``lldb -P`` says
  ``/usr/lib/local/lib/python3.11/dist-packages`` (does not exist), and
  python3-lldb-14 splits its package between
  ``/usr/lib/llvm-14/lib/python3/dist-packages/lldb`` (only ``_lldb.so``)
  and ``/usr/lib/llvm-14/lib/python3.11/dist-packages/lldb`` (the ``.py``
  files), so ``import lldb.embedded_interpreter`` fails even with
  python3-lldb-14 installed. :func:`lldb_python_dir` assembles one package
  from symlinks to both halves in a temp dir and points PYTHONPATH at it.
* In batch mode a SIGINT to lldb interrupts lldb's command, not the
  program, so the "Ctrl-C" of an lldb session is done the way lldb's driver
  does it on a terminal: ``SBProcess.SendAsyncInterrupt()`` from a
  thread (lldb then sends the RSP 0x03 byte).
* In batch mode lldb stops running ``-o`` commands after a stop it treats
  as a crash (any signal stop other than the ones set to no-stop), so
  sessions set ``process handle`` for the signals they expect.
"""

from __future__ import annotations

import base64
import inspect
import os
import re
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import debuggers, running

LLDB_PY_HALVES = (Path("/usr/lib/llvm-14/lib/python3.11/dist-packages/lldb"),
                  Path("/usr/lib/llvm-14/lib/python3/dist-packages/lldb"))
INIT = ("settings set use-color false", "settings set auto-confirm true",
        "settings set stop-disassembly-display never")


def lldb_python_dir() -> Path | None:
    """A directory holding a complete ``lldb`` Python package, or None."""
    if not all(h.is_dir() for h in LLDB_PY_HALVES):
        return None
    root = Path(tempfile.gettempdir()) / f"asyncrsp-lldbpy-{os.getuid()}"
    pkg = root / "lldb"
    pkg.mkdir(parents=True, exist_ok=True)
    for half in LLDB_PY_HALVES:
        for item in half.iterdir():
            link = pkg / item.name
            if not link.exists() and not link.is_symlink():
                try:
                    link.symlink_to(item)
                except FileExistsError:  # a parallel test made it
                    pass
    return root


def lldb_env() -> dict[str, str]:
    env = dict(os.environ)
    if debuggers.current().root is not None:
        return env  # a chroot's lldb finds its own Python; the host's halves are lldb 14's
    py = lldb_python_dir()
    if py is not None:
        env["PYTHONPATH"] = str(py)
    return env


def interrupt_when_running(pid: int | None) -> str:
    """An lldb command that interrupts the running process once it has run
    (:func:`running.wait_until_running`, executed inside lldb's Python from
    that module's source: one condition for every client)."""
    # base64: lldb would evaluate the source's `backquoted` text as expressions
    source = base64.b64encode(inspect.getsource(running).encode()).decode()
    return ("script import base64, threading; exec(base64.b64decode('%s').decode()); "
            "threading.Thread(target=lambda p=lldb.process: (wait_until_running(%r), "
            "p.SendAsyncInterrupt()), daemon=True).start()" % (source, pid))


@dataclass(frozen=True)
class LldbRun:
    returncode: int
    output: str

    def steps(self) -> list[tuple[str, str]]:
        return split_transcript(self.output)


def lldb_batch(program: Path, commands: Sequence[str], timeout: float = 60.0) -> LldbRun:
    argv = debuggers.argv("lldb", "-x", "--no-use-colors", "--batch")
    for c in (*INIT, *commands):
        argv += ["-o", c]
    res = subprocess.run([*argv, str(program)], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=timeout, env=lldb_env(), check=False)
    return LldbRun(res.returncode, res.stdout + res.stderr)


ECHO = re.compile(r"^\(lldb\) (.*)$", re.M)


def split_transcript(output: str) -> list[tuple[str, str]]:
    """Cut batch output into (command, output) pairs at each ``(lldb) CMD`` echo."""
    marks = list(ECHO.finditer(output))
    out = [("<start>", output[: marks[0].start()] if marks else output)]
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(output)
        out.append((m.group(1), output[m.end() + 1: end]))
    return out
