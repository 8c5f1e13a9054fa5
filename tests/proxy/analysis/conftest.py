from __future__ import annotations

from pathlib import Path

import pytest

from proxy.analysis.inventory import build_inventory
from proxy.analysis.model import Inventory


@pytest.fixture(scope="session")
def inventory_of(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Analyse each binary once per test session (a private cache, not the user's)."""
    cache = tmp_path_factory.mktemp("asyncrsp-cache")
    # keyed by the file, not its path: the corpus in integration/build is shared by every
    # checkout, and another checkout's build replaces a binary (atomic rename, its own source
    # paths inside) while this session runs; a memo by path then paired the old binary's
    # inventory with the new file a test opens (test_line_to_pcs_round_trip: no such file)
    memo: dict[tuple[Path, int, int], Inventory] = {}

    def get(path: Path) -> Inventory:
        st = path.stat()
        key = (path, st.st_ino, st.st_mtime_ns)
        if key not in memo:
            memo[key] = build_inventory(path, cache_dir=cache)
        return memo[key]

    return get
