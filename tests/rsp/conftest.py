"""Fixtures for the rsp tests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from rsp_testutil import load_captured  # noqa: E402


@pytest.fixture(scope="session")
def captured() -> dict[str, Any]:
    return load_captured()
