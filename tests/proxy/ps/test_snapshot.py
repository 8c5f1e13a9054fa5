"""What a one-shot look adds to the snapshot: the crash lines and the header."""

from __future__ import annotations

import pytest

from proxy.corefile.image import ImageThread, ProgramImage
from proxy.ps.render import header
from proxy.ps.snapshot import Crash, PsSnapshot, crash_of


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


class _Stacks:
    tasks: tuple[()] = ()

    def thread_stack(self, tid: int) -> tuple[()]:
        return ()


@pytest.mark.parametrize("signals, fault, want", [
    ((11, 0), (11, 1, 0x10), ("SIGSEGV", 0x10)),  # the kernel's: NT_SIGINFO gives the address
    ((6, 0), (6, 0, 0), ("SIGABRT", None)),
    ((11, 0), None, ("SIGSEGV", None)),  # qemu-user's: no NT_SIGINFO, pr_cursig alone
    ((0, 6), None, ("SIGABRT", None)),  # the first thread with a signal
    ((19, 0), (19, 0, 0), None),  # gcore: SIGSTOP, the program did not die
    ((19, 0), None, None),
    ((0, 0), None, None),
])
def test_crash_of(signals: tuple[int, int], fault: tuple[int, int, int] | None,
                  want: tuple[str, int | None] | None) -> None:
    threads = [ImageThread(100 + i, s, {}, b"") for i, s in enumerate(signals)]
    image = ProgramImage(100, threads, lambda a, n: b"", [], fault=fault)
    got = crash_of(image, _Stacks())  # type: ignore[arg-type]
    assert ((got.signal, got.address) if got is not None else None) == want
