"""`asyncrsp inspect` on broken copies of a debug corpus binary (truncated,
bit-flipped in the ELF header, the header tables, DWARF, CFI and line
sections, fields set huge, sections zeroed): a report, or one line saying
what is wrong, never an exception. The mutants come from
integration/harness/fuzzbinaries.py; `scripts/fuzz-binaries` runs the long
campaign (in child processes, with time and memory limits).

Cases per suite run: 6 mutants of `nested` (debug), seeds 0-5.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest

from tests.proxy.analysis.corpus_util import corpus_binary
from integration.harness.fuzzbinaries import mutate
from proxy.analysis.report import inspect_main


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a mutant keeps the build-id: a shared cache would answer with the intact inventory
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ASYNCRSP_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("seed", range(6))
def test_a_broken_binary_gets_a_report_or_one_line(tmp_path: Path, seed: int) -> None:
    data = Path(corpus_binary("debug", "nested")).read_bytes()
    mutant, what = mutate(data, random.Random(seed))
    path = tmp_path / "mutant"
    path.write_bytes(mutant)
    out = io.StringIO()
    code = inspect_main(str(path), as_json=False, tree=False, out=out)
    text = out.getvalue()
    if code != 0:
        assert code == 1, (what, text)
        assert text.count("\n") == 1 and text.startswith("asyncrsp inspect: "), (what, text)
