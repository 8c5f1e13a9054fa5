"""scripts/gdb_testsuite.py --report: which stored run gives each file's figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts import gdb_testsuite as gts


def _store(cache: Path, label: str, stamp: str, tests: list[str], secs: float, chosen: bool | None) -> None:
    d = cache / "runs" / label / stamp
    d.mkdir(parents=True)
    rec = {"way": label, "tests": tests, "time": secs * len(tests), "files": {t: secs for t in tests},
           "results": [["PASS", t, "x"] for t in tests]}
    if chosen is not None:
        rec["chosen_files"] = chosen
    (d / "result.json").write_text(json.dumps(rec))


def test_a_later_single_file_run_does_not_replace_the_parts_figures(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A file rerun alone later (another hour, another load) stood in --report
    beside the other ways' part figures and skewed the ratio of one way."""
    monkeypatch.setattr(gts, "CACHE", tmp_path)
    part = [f"gdb.base/t{i}.exp" for i in range(6)]
    _store(tmp_path, "proxy", "20261128-090000", part, 2.0, False)
    _store(tmp_path, "proxy", "20261128-100000", part[:1], 9.0, True)  # a check of one file, later
    _store(tmp_path, "proxy", "20261128-110000", ["gdb.base/other.exp"], 5.0, True)  # in no part
    rec = gts.stored("proxy", [*part, "gdb.base/other.exp"])
    assert rec["files"][part[0]] == 2.0 and rec["files"]["gdb.base/other.exp"] == 5.0
    assert rec["time"] == 6 * 2.0 + 5.0
    # a later part run still replaces an older one; a report of named files takes the newest run
    _store(tmp_path, "proxy", "20261128-120000", part, 3.0, False)
    assert gts.stored("proxy", part)["files"][part[0]] == 3.0
    _store(tmp_path, "proxy", "20261128-130000", part[:1], 7.0, True)
    assert gts.stored("proxy", part[:1], prefer_parts=False)["files"][part[0]] == 7.0
    assert gts.stored("proxy", part[:1])["files"][part[0]] == 3.0


def test_records_from_before_the_mark_count_few_files_as_named(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gts, "CACHE", tmp_path)
    part = [f"gdb.base/t{i}.exp" for i in range(6)]
    _store(tmp_path, "straight", "20261128-090000", part, 2.0, None)
    _store(tmp_path, "straight", "20261128-100000", part[:2], 8.0, None)
    assert gts.stored("straight", part)["files"][part[1]] == 2.0
