"""What a one-shot look adds to the snapshot: the crash lines and the header."""

from __future__ import annotations

from proxy.ps.render import header
from proxy.ps.snapshot import Crash, PsSnapshot


class _Snap:
    def __init__(self, n: int) -> None:
        self.n = n

    def live(self) -> list[int]:
        return list(range(self.n))


def test_crash_lines() -> None:
    c = Crash(7, "SIGSEGV", 0x10, [("a::leaf", "a.rs:3", "#2 a::outer"), ("a::outer", "", "")])
    assert c.lines() == ["crashed: thread 7, SIGSEGV at address 0x10", "async backtrace of thread 7:",
                         "  #0 a::leaf at a.rs:3  (#2 a::outer)", "  #1 a::outer"]
    assert Crash(7, "SIGABRT", None, []).lines() == ["crashed: thread 7, SIGABRT", "  no async frame on its stack"]


def test_header() -> None:
    live = PsSnapshot("process 42", 42, _Snap(2), stopped_ns=2_500_000, copied=1_700_000)  # type: ignore[arg-type]
    assert header(live) == "process 42: 2 tasks; stopped 2.5 ms, 1.7 MB copied"
    core = PsSnapshot("core file c", 42, _Snap(1))  # type: ignore[arg-type]
    assert header(core) == "core file c (pid 42): 1 task"
