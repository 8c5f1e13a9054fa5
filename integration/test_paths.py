"""`--paths`: what the commands print for a registry crate's file, against the
binary's own DWARF (read back with --json, which keeps the full path) and
the file on disk."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from integration.corpus import build
from integration.harness.stubs import venv_python

ROOT = Path(__file__).resolve().parents[1]


def _inspect(prog: Path, *args: str) -> str:
    return subprocess.run([venv_python(), "-m", "proxy", "inspect", *args, str(prog)], cwd=ROOT, check=True,
                          capture_output=True, text=True, timeout=300).stdout


def test_inspect_shows_registry_crates_from_their_directory() -> None:
    got = build.build(configs=["debug"], programs=["tokio_app"]).get(("debug", "tokio_app"))
    if not isinstance(got, Path):
        pytest.skip(f"tokio_app (debug) not built: {got}")
    doc = json.loads(_inspect(got, "--json"))
    full = sorted({st["loc"] for co in doc["coroutines"] for st in co["states"]
                   if st["loc"] and re.search(r"/tokio-\d+\.\d+\.\d+/", st["loc"])})
    assert full, "no state of tokio's own coroutines in the JSON document"
    for loc in full[:5]:
        assert os.path.isfile(loc.rsplit(":", 1)[0]), loc  # the JSON's is the file's real path
    short_text, full_text = _inspect(got), _inspect(got, "--paths", "full")
    for loc in full:
        crate_dir = re.search(r"/(tokio-\d+\.\d+\.\d+/.*)$", loc).group(1)  # type: ignore[union-attr]
        assert re.search(rf" at {re.escape(crate_dir)}\b", short_text), crate_dir
        assert f" at {loc}" not in short_text
        assert f" at {loc}" in full_text
