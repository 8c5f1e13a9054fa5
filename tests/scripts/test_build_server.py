"""bench/server/build_server.py: the sources cargo builds from, shared by checkouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.server import build_server as bs


def _checkout(root: Path, main_rs: str) -> Path:
    here = root / "bench" / "server"
    (here / "src" / "bin").mkdir(parents=True)
    (here / "Cargo.toml").write_text("[package]\nname = 'x'\n")
    (here / "Cargo.lock").write_text("# lock\n")
    (here / "src" / "bin" / "axum_server.rs").write_text(main_rs)
    return here


def test_two_checkouts_of_the_same_sources_build_from_one_path(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Cargo's fingerprints hold the sources' path: each git worktree built the whole
    server again into the shared target dir (4-5 min), replacing the binaries another
    checkout was measuring. The same sources now give the same path."""
    out = tmp_path / "out"
    monkeypatch.setattr(bs, "OUT", out)
    paths = []
    for name, text in (("a", "fn main() {}\n"), ("b", "fn main() {}\n"), ("c", "fn main() { 1; }\n")):
        monkeypatch.setattr(bs, "HERE", _checkout(tmp_path / name, text))
        paths.append(bs.source_copy())
    assert paths[0] == paths[1] and paths[2] != paths[0]
    assert (paths[0] / "src" / "bin" / "axum_server.rs").read_text() == "fn main() {}\n"
    assert (paths[2] / "Cargo.lock").exists() and sorted(p.name for p in (out / "src").iterdir()) == \
        sorted({paths[0].name, paths[2].name})
