"""Unit tests of the corpus build script's pure parts (no cargo run here;
integration/corpus/test_corpus.py builds and runs the real programs)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from integration.corpus import build as corpus

TOOLS = corpus.Toolchain(Path("/x/bin/cargo"), Path("/x/bin/rustc"), (1, 95))


def test_lock_file_stays_readable_by_debian_cargo_1_65() -> None:
    # cargo 1.65 (old-* configs) cannot read lock format 4; cargo 1.95 keeps 3.
    lock = (corpus.CORPUS_DIR / "Cargo.lock").read_text()
    assert "\nversion = 3\n" in lock


def test_every_config_has_its_own_target_dir_and_profile() -> None:
    for name, config in corpus.CONFIGS.items():
        command = corpus._cargo_command(config, TOOLS, ["nested"])
        assert command[command.index("--target-dir") + 1].endswith(f"cargo-target/{name}")
        assert ("--release" in command) == config.release


def test_cargo_env_drops_outer_flags_and_sets_the_config_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUSTFLAGS", "-C opt-level=3")
    monkeypatch.setenv("CARGO_PROFILE_RELEASE_LTO", "thin")
    env = corpus._cargo_env(corpus.CONFIGS["release-lines"], TOOLS)
    assert env["RUSTFLAGS"] == "" and "CARGO_PROFILE_RELEASE_LTO" not in env
    assert env["CARGO_PROFILE_RELEASE_DEBUG"] == "line-tables-only"
    assert env["RUSTC"] == "/x/bin/rustc"
    assert corpus._cargo_env(corpus.CONFIGS["old-debug"], TOOLS)["RUSTFLAGS"] == "--cfg old_rustc"


def test_output_path_layout() -> None:
    assert corpus.output_path("lto", "stuck") == corpus.REPO_DIR / "integration/build/corpus/lto/stuck"


def test_bad_names_are_clear_errors() -> None:
    with pytest.raises(corpus.CorpusError, match="unknown config 'fast'"):
        corpus.build_config("fast")
    with pytest.raises(corpus.CorpusError, match="unknown program"):
        corpus.build_config("debug", ["nope"])


def test_missing_old_toolchain_is_a_skip_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "OLD_RUSTC", Path(__file__))  # exists: only cargo is missing
    monkeypatch.setattr(corpus, "OLD_CARGO", Path("/nonexistent/cargo"))
    corpus.toolchain.cache_clear()
    try:
        skip = corpus.build_config("old-debug")
        assert isinstance(skip, corpus.SkipReason)
        assert "apt-get install cargo" in str(skip) and skip.config == "old-debug"
    finally:
        corpus.toolchain.cache_clear()


def test_modern_config_without_fetched_crates_says_to_fetch_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "CRATES_DIR", Path("/nonexistent/crates"))
    skip = corpus.build_config("sid-debug")
    assert isinstance(skip, corpus.SkipReason)
    assert "bash scripts/fetch-crates sid" in str(skip) and skip.config == "sid-debug"
    assert corpus.skip_reason("trixie-dump-release") is not None


def test_modern_configs_build_their_own_package() -> None:
    dump = corpus.CONFIGS["trixie-dump-debug"]
    assert dump.package_dir == corpus.MODERN_DIR / "trixie" and "tk_dump" in dump.programs
    assert corpus._cargo_env(dump, TOOLS)["RUSTFLAGS"] == "--cfg tokio_unstable --cfg tokio_taskdump"
    assert corpus.CONFIGS["sid-release"].release and "axum_svc" in corpus.CONFIGS["sid-release"].programs
    with pytest.raises(corpus.CorpusError, match="unknown program"):
        corpus.build_config("sid-debug", ["astd"])


def _cargo_output(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, data: bytes) -> Path:
    monkeypatch.setattr(corpus, "TARGET_ROOT", tmp_path / "target")
    monkeypatch.setattr(corpus, "OUT_DIR", tmp_path / "out")
    built = tmp_path / "target" / "debug" / "debug" / "nested"
    built.parent.mkdir(parents=True, exist_ok=True)
    tmp = built.with_name("next")
    tmp.write_bytes(data)
    os.replace(tmp, built)  # as the linker: a new file
    return built


def test_a_no_op_build_keeps_the_installed_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A new file at the shared path on every build() made probes attached to the old one
    miss the program (pinned()): only a changed build is installed again."""
    config = corpus.CONFIGS["debug"]
    _cargo_output(monkeypatch, tmp_path, b"build 1")
    first = corpus._install(config, "nested")
    ino = first.stat().st_ino
    assert corpus._install(config, "nested").stat().st_ino == ino  # cargo's no-op
    built = _cargo_output(monkeypatch, tmp_path, b"build 2")  # a relink: the same size here,
    mtime = first.stat().st_mtime_ns + 1000  # a later mtime (the clock's tick may be coarser)
    os.utime(built, ns=(mtime, mtime))
    again = corpus._install(config, "nested")
    assert again.stat().st_ino != ino and again.read_bytes() == b"build 2"


def test_a_pinned_binary_is_the_file_as_it_was(tmp_path: Path) -> None:
    shared = tmp_path / "corpus" / "nested"
    shared.parent.mkdir()
    shared.write_bytes(b"one")
    pin = corpus.pinned(shared, tmp_path / "pins")
    assert pin.name == "nested" and pin.stat().st_ino == shared.stat().st_ino  # a link, no copy
    assert corpus.pinned(shared, tmp_path / "pins") == pin  # the same file: the same name
    (tmp_path / "next").write_bytes(b"two")
    os.replace(tmp_path / "next", shared)  # another checkout's build (_install)
    assert pin.read_bytes() == b"one"
    other = corpus.pinned(shared, tmp_path / "pins")
    assert other != pin and other.read_bytes() == b"two"


def test_the_default_pins_are_the_processes_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Under PINNED_DIR/<pid>, removed at exit; a killed process' directory is removed by
    the next process that pins."""
    monkeypatch.setattr(corpus, "PINNED_DIR", tmp_path / "pinned")
    monkeypatch.setattr(corpus, "_pin_dir", None)
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / "pinned" / str(gone.pid) / "1-2").mkdir(parents=True)
    (tmp_path / "file").write_bytes(b"x")
    pin = corpus.pinned(tmp_path / "file")
    assert pin.parent.parent == tmp_path / "pinned" / str(os.getpid())
    assert sorted(p.name for p in (tmp_path / "pinned").iterdir()) == [str(os.getpid())]
    corpus._remove_pin_dir(tmp_path / "pinned" / str(os.getpid()), os.getpid() + 1)  # a forked child's exit
    assert pin.exists()
