"""The `resident` fixture: an `asyncrsp resident` for the test (test_resident.py, test_listen.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def resident(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "resident.sock")
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "resident", "--socket", path],
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith(f"asyncrsp: resident on {path} ")
        yield path
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    assert not os.path.exists(path)  # it takes its socket file with it
