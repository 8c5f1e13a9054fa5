"""Fixtures for the rsp tests."""

from __future__ import annotations

from typing import Any

import pytest

from tests.rsp.rsp_testutil import load_captured


@pytest.fixture(scope="session")
def captured() -> dict[str, Any]:
    return load_captured()
