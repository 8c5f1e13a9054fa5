"""The prebuilt BPF object the package ships: the build of the committed
source, named by its source's hash, refused by the loader when it is another
version's."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from proxy.capture.uprobes import bpf, build, prebuilt

REBUILD = "rebuild with `python -m proxy.capture.uprobes.build` after editing uprobes.bpf.c"


def test_record_names_the_committed_source_and_object() -> None:
    assert build.source_hash() == prebuilt.SOURCE_SHA256, REBUILD
    assert prebuilt.OBJECT_NAME == build.object_name(prebuilt.SOURCE_SHA256)
    assert hashlib.sha256(bpf.OBJECT.read_bytes()).hexdigest() == prebuilt.OBJECT_SHA256, REBUILD
    # one object only: the package data glob would ship a stale one too
    assert sorted(p.name for p in build.HERE.glob(build.OBJECT_GLOB)) == [prebuilt.OBJECT_NAME]
    assert bpf.object_problem() is None


def test_committed_object_is_the_build_of_the_committed_source(tmp_path: Path) -> None:
    """The build is reproducible (no checkout path in the object): the same
    clang on the same source gives the committed bytes."""
    have = build.clang_version()
    if have is None:
        pytest.skip("clang is not installed (scripts/setup installs it)")
    if have != prebuilt.CLANG:
        pytest.skip(f"the object was built by {prebuilt.CLANG!r}, this host has {have!r}: bytes differ by compiler")
    src = tmp_path / "elsewhere" / build.SOURCE.name  # another directory: its path must not leak in
    src.parent.mkdir()
    shutil.copy(build.SOURCE, src)
    out = build.compile_to(tmp_path / "out.o", src)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == prebuilt.OBJECT_SHA256, REBUILD


def test_loader_refuses_another_versions_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An object under this version's name with other bytes (left by another
    install), or only another version's object: refused with what to do."""
    here = tmp_path / "uprobes"
    here.mkdir()
    mine = here / prebuilt.OBJECT_NAME
    monkeypatch.setattr(bpf, "OBJECT", mine)
    (here / "uprobes-0123456789ab.bpf.o").write_bytes(b"\x7fELF other")
    why = bpf.object_problem(mine)
    assert why is not None and "missing" in why and "uprobes-0123456789ab.bpf.o" in why and "reinstall" in why
    mine.write_bytes(b"\x7fELF not this one")
    why = bpf.object_problem(mine)
    assert why is not None and "not the one this asyncrsp was built with" in why
    with pytest.raises(bpf.BpfError, match="not the one"):
        bpf.Program.open(path=mine)
    shutil.copy(build.HERE / prebuilt.OBJECT_NAME, mine)
    assert bpf.object_problem(mine) is None
