"""The repository's shape: tests/ mirrors the source tree folder for folder, nothing
reaches a module by editing the import path, and no module imports an integration test
module (what tests share lives in integration/harness).

A test for ``proxy/shell/link.py`` lives in ``tests/proxy/shell/``; a folder of tests
whose source folder is gone (moved or renamed) is a test left behind. Tests, bench and
scripts import the harness as the package ``integration.harness`` (pytest puts the
repository root on the path; bench and scripts run as modules from it,
``python -m bench.bench_exchange``), so no file needs ``sys.path`` edits.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

# Folders under tests/ that hold data, not tests (recorded packet captures).
DATA = {"fixtures"}
# Built or fetched things, not the repository's code: build outputs (the corpus, GDB's
# testsuite unpacked with its own Python), cargo targets, caches.
SKIPPED = {"build", "target", "__pycache__", ".venv", ".hypothesis"}

# An import of an integration test module (integration/test_*.py, integration/*/test_*.py):
# what tests share lives in integration/harness.
TEST_MODULE_IMPORT = re.compile(r"^\s*(from\s+integration(\.\w+)*\.test_\w+\s+import|from\s+integration(\.\w+)*\s+import\s+"
                                r"[^#]*\btest_\w+|import\s+integration(\.\w+)*\.test_\w+|from\s+test_\w+\s+import|import\s+test_\w+)")

# An assignment to sys.path or a call that changes it, in Python or in a shell
# script's inline Python.
PATH_EDIT = re.compile(r"\bsys\s*\.\s*path\s*(\.\s*(insert|append|extend|remove|pop)\b|\[[^\]]*\]\s*=|\+=|=[^=])")


def test_finds_a_path_edit() -> None:
    """The pattern itself: each way of changing the path matches, reading it does not."""
    edits = ["sys.path.insert(0, root)", "sys.path.append(p)", "sys.path[:0] = [p]",
             "sys.path += [p]", "sys.path = [p]", "sys.path.extend(ps)"]
    reads = ["if p in sys.path:", "print(sys.path)", "sys.path == before"]
    assert all(PATH_EDIT.search(e) for e in edits)
    assert not any(PATH_EDIT.search(r) for r in reads)


def _test_folders() -> list[Path]:
    return sorted(d for d in TESTS.rglob("*")
                  if d.is_dir() and d.name != "__pycache__" and d.name not in DATA
                  and any(d.glob("*.py")))


def test_every_test_folder_has_its_source_folder() -> None:
    folders = _test_folders()
    assert TESTS / "proxy" / "shell" in folders  # the walk sees the tree
    orphans = [d.relative_to(TESTS) for d in folders if not (ROOT / d.relative_to(TESTS)).is_dir()]
    assert orphans == [], f"test folders without a source folder of the same path: {orphans}"


def test_every_source_folder_has_its_test_folder() -> None:
    """The other way: each package of proxy/ and rsp/ is tested in the folder of its path."""
    packages = sorted(d for top in ("proxy", "rsp") for d in [ROOT / top, *(ROOT / top).rglob("*")]
                      if d.is_dir() and (d / "__init__.py").is_file() and not SKIPPED.intersection(d.parts))
    assert ROOT / "proxy" / "program" in packages  # the walk sees the tree
    untested = [d.relative_to(ROOT) for d in packages if not (TESTS / d.relative_to(ROOT)).is_dir()]
    assert untested == [], f"source folders without a test folder of the same path: {untested}"


def _sources() -> list[Path]:
    files: list[Path] = []
    for top in ("bench", "scripts", "tests", "integration"):
        for path in (ROOT / top).rglob("*"):
            if not path.is_file() or SKIPPED.intersection(path.relative_to(ROOT).parts):
                continue
            if path.suffix == ".py" or (top == "scripts" and path.suffix == ""):
                files.append(path)
    return files


def _lines_matching(files: list[Path], pattern: re.Pattern[str]) -> list[str]:
    """`path:line: text` of every line of `files` (this file left out) that `pattern` finds."""
    me = Path(__file__).resolve()
    return [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
            for path in files if path != me
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
            if pattern.search(line)]


def test_no_file_edits_the_import_path() -> None:
    files = _sources()
    assert ROOT / "bench" / "bench_exchange.py" in files and ROOT / "scripts" / "demo" in files
    edits = _lines_matching(files, PATH_EDIT)
    assert edits == [], "import path edits:\n" + "\n".join(edits)


def test_no_module_imports_an_integration_test_module() -> None:
    files = [f for f in _sources() if f.suffix == ".py"]
    assert TEST_MODULE_IMPORT.search("from integration.test_await_graph import session")
    assert TEST_MODULE_IMPORT.search("    from integration import test_uprobes as tu")
    assert not TEST_MODULE_IMPORT.search("from integration.harness.monitor import session")
    found = _lines_matching(files, TEST_MODULE_IMPORT)
    assert found == [], "imports of test modules (move what they share into integration/harness):\n" + "\n".join(found)
