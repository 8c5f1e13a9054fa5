"""Skip a test with a reason when a real tool is not installed."""

from __future__ import annotations

import shutil

import pytest


def require_tool(*names: str) -> None:
    """Skip the calling test when one of the named executables is missing."""
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (run scripts/setup)")
