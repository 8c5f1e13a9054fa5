from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy.analysis.inventory import build_inventory  # noqa: E402
from proxy.analysis.model import Inventory  # noqa: E402


@pytest.fixture(scope="session")
def inventory_of(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Analyse each binary once per test session (a private cache, not the user's)."""
    cache = tmp_path_factory.mktemp("asyncrsp-cache")
    memo: dict[Path, Inventory] = {}

    def get(path: Path) -> Inventory:
        if path not in memo:
            memo[path] = build_inventory(path, cache_dir=cache)
        return memo[path]

    return get
