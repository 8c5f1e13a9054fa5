"""The sieve (proxy.analysis.sieve) only saves work: the inventory it gives is the one
made by scanning every structure, subprogram and inlined subroutine of every unit; and
it does pass over most of them."""

from __future__ import annotations

import pytest

from tests.proxy.analysis.corpus_util import corpus_binary
from proxy.analysis import dies as D
from proxy.analysis import sieve as S
from proxy.analysis.inventory import analyse
from proxy.analysis.elf import open_elf


@pytest.mark.parametrize("config,program", [("debug", "nested"), ("old-debug", "nested"), ("debug", "tokio_app"),
                                            ("release", "nested")])
def test_sieve_changes_nothing(config: str, program: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCRSP_WALK_PROCESS", "0")
    path = corpus_binary(config, program)
    counts = [0, 0]
    real = D.Dies.sieve

    def counted(self: D.Dies, sieve: S.Sieve, end: int) -> list[int]:
        got = real(self, sieve, end)
        counts[0] += len(got)
        counts[1] += len(every(self, sieve, end))
        return got

    def every(self: D.Dies, sieve: S.Sieve, end: int) -> list[int]:
        tags = {code for code, ab in self._abbrevs.items() if ab.tag in S.SCAN_TAGS}
        return [i for i, code in enumerate(self._codes) if code in tags]

    monkeypatch.setattr(D.Dies, "sieve", counted)
    sieved = analyse(open_elf(path))
    monkeypatch.setattr(D.Dies, "sieve", every)
    scanned = analyse(open_elf(path))
    assert sieved == scanned
    assert sieved.layouts
    assert counts[0] * 5 < counts[1], counts  # it passes over most of them
