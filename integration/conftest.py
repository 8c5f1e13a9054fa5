"""Fixtures for the integration tests: the C programs (built once per
session), a per-test hard timeout, and skip-with-reason when a real tool
(gdb, gdbserver, lldb, lldb-server, qemu-x86_64, gcc) is missing.

The suite runs with ``--import-mode=importlib`` and ``pythonpath = ["."]``:
tests import the drivers as ``integration.harness.*``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from integration.harness import programs as cprogs
from integration.harness.tools import require_tool

HARD_TIMEOUT = 120  # seconds per integration test (pytest-timeout, overridable per test)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(HARD_TIMEOUT))


@pytest.fixture(scope="session")
def programs() -> dict[str, Path]:
    """name -> path of every C program of integration/programs (gcc -g -O0)."""
    require_tool("gcc")
    return cprogs.build_all()
