"""A binary truncated in place while the proxy has it open (``cp`` over it) gives one
line of error, not a crash: the file is read with pread, never mapped (a mapped page
past the new end faults with SIGBUS, which Python cannot catch)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.proxy.analysis.corpus_util import REPO, corpus_binary

SCRIPT = r"""
import os, sys
from proxy.analysis.elf import open_elf
from proxy.analysis.errors import AnalysisError
from proxy.analysis.inventory import analyse
from proxy.analysis.lines import SourceMap

path = sys.argv[1]
elf = open_elf(path)                    # opened, symbols read: a session holds it
lines = SourceMap(elf)                  # the line tables, read when asked
text = next(s for s in elf.symbols if s.is_func and s.size > 16)
os.truncate(path, os.path.getsize(path) // 3)   # in place: same inode, a third left
for what, ask in (("lines", lambda: lines.pc_to_line(text.addr)), ("analysis", lambda: analyse(elf)),
                  ("code", lambda: elf.read(text.addr, 16))):
    try:
        ask()
        print(what, "answered")
    except AnalysisError as e:
        print(what, "error:", e)
"""


def test_truncated_in_place_while_open(tmp_path: Path) -> None:
    copy = tmp_path / "nested"
    shutil.copy(corpus_binary("debug", "nested"), copy)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(copy)], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, f"crashed ({r.returncode}): {r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr, r.stderr
    out = r.stdout.splitlines()
    assert len(out) == 3, out
    for line in out:  # each question: one line, the file named and what happened to it
        assert "error:" in line and f"{copy}: the file changed on disk while in use" in line, line
