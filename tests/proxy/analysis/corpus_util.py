"""Shared helpers of the analysis tests: corpus binaries (skipped with the
corpus builder's reason when a toolchain is missing) and marker matching."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from integration.corpus import build as corpus_build
from integration.corpus import markers as corpus_markers

REPO = Path(__file__).resolve().parents[3]

CONFIGS = ("debug", "release", "release-fp", "release-lines", "lto", "old-debug", "old-release")
PROGRAMS = ("nested", "tokio_app", "tokio_bench", "stuck", "many_tasks")
OLD = {"old-debug", "old-release"}


def corpus_binary(config: str, program: str) -> Path:
    reason = corpus_build.skip_reason(config)
    if reason is not None:
        pytest.skip(f"corpus config {config} cannot be built here: {reason}")
    try:
        return corpus_build.binary(config, program)
    except corpus_build.CorpusError as e:  # a missing toolchain or a failed build
        pytest.skip(f"corpus {config}/{program} unavailable: {e}")


def split_path(name: str) -> list[str]:
    """Split a Rust path on '::' outside <...>."""
    out, depth, cur = [], 0, ""
    i = 0
    while i < len(name):
        c = name[i]
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        if depth == 0 and name.startswith("::", i):
            out.append(cur)
            cur = ""
            i += 2
            continue
        cur += c
        i += 1
    out.append(cur)
    return out


_ENV = re.compile(r"^\{(async_fn|async_block|async_closure)(?:_env)?#\d+\}")


def marker_name(layout_name: str) -> str:
    """The name a corpus marker uses for a coroutine: "a", "main::{async_block}"."""
    segs = split_path(layout_name)
    m = _ENV.match(segs[-1])
    kind = m.group(1) if m else "async_fn"
    base = ""
    impl = ""
    for s in segs[:-1]:
        q = re.match(r"^<(?:.*::)?(\w+)(?:<.*>)? as .*>$", s)
        if q:  # a trait impl: markers say "Type::method"
            impl = q.group(1) + "::"
        elif re.match(r"^\{impl#\d+\}$", s):  # DWARF names an impl block, not its type
            impl = "{impl}::"
        elif not s.startswith("{") and not s.startswith("<"):
            base = impl + re.sub(r"<.*$", "", s)
            impl = ""
    return base if kind == "async_fn" else f"{base}::{{{kind}}}"


def names_match(marker: str, layout_name: str) -> bool:
    """Does a marker's coroutine name denote this layout? ``{impl}`` stands for any type."""
    ours = marker_name(layout_name)
    if ours == marker:
        return True
    if ours.startswith("{impl}::"):
        rest = ours[len("{impl}::"):]
        return marker == rest or ("::" in marker and marker.split("::", 1)[1] == rest)
    return False
