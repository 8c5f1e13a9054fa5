"""The demangler against binutils' c++filt (libiberty's Rust demangler) on every
Rust symbol of real binaries, legacy and v0 (rustup's std is v0 even in a legacy build)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.proxy.analysis.corpus_util import corpus_binary
from proxy.analysis.demangle import demangle
from proxy.analysis.elf import open_elf

CASES = [
    ("_ZN6nested1c28_$u7b$$u7b$closure$u7d$$u7d$17h82b65977f5bac134E", "nested::c::{{closure}}"),
    ("_RNCNvCsdU9GKqzCIzp_6nested1a0B3_", "nested::a::{closure#0}"),
    ("_RINvCsdU9GKqzCIzp_6nested8block_onNCNvB2_1a0EB2_", "nested::block_on::<nested::a::{closure#0}>"),
    ("_ZN3foo3barE", None),  # C++, not Rust
    ("main", None),
    ("_RNvC", None),  # truncated
]


@pytest.mark.parametrize("sym,expected", CASES)
def test_cases(sym: str, expected: str | None) -> None:
    assert demangle(sym) == expected


def _normalise(cxxfilt: str) -> str:
    out = re.sub(r"(?<=\w)\[[0-9a-f]+\]", "", cxxfilt)  # crate disambiguators
    return re.sub(r"::h[0-9a-f]{16}$", "", out)  # the legacy hash


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="binutils c++filt is not installed")
@pytest.mark.parametrize("config", ["debug", "old-release"])
def test_against_cxxfilt(config: str) -> None:
    elf = open_elf(corpus_binary(config, "nested"))
    syms = sorted({s.name for s in elf.symbols if s.name.startswith(("_R", "_ZN"))})
    assert len(syms) > 500
    ref = subprocess.run(["c++filt"], input="\n".join(syms), capture_output=True, text=True, check=True)
    bad = []
    for sym, theirs in zip(syms, ref.stdout.splitlines()):
        want = None if theirs == sym else _normalise(theirs)
        if demangle(sym) != want:
            bad.append((sym, demangle(sym), want))
    assert not bad, bad[:5]
    assert any(s.startswith("_R") for s in syms) or config.startswith("old")
