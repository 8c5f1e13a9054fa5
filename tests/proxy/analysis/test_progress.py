"""Progress lines: only on a terminal, only for work longer than the delay,
throttled, erased at the end."""

from __future__ import annotations

import io

from proxy.analysis.progress import Progress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_long_work_on_a_terminal_is_shown_throttled_and_erased() -> None:
    out, clock = Tty(), Clock()
    p = Progress(out, "asyncrsp: analysing app", delay=0.5, interval=0.1, clock=clock)
    p.step("DWARF units", 0, 100)
    assert out.getvalue() == ""  # before the delay: a short job shows nothing
    clock.now += 0.6
    p.step("DWARF units", 10, 100)
    assert out.getvalue() == "\rasyncrsp: analysing app: DWARF units 10/100 (1 s)"
    clock.now += 0.05
    p.step("DWARF units", 11, 100)  # within the interval: not written
    clock.now += 0.1
    p.step("exits", 3, 4)
    lines = out.getvalue().split("\r")
    first, now = "asyncrsp: analysing app: DWARF units 10/100 (1 s)", "asyncrsp: analysing app: exits 3/4 (1 s)"
    assert lines[-1] == now + " " * (len(first) - len(now))  # the longer line's tail cleared
    p.done()
    assert out.getvalue().endswith("\r" + " " * len(lines[-1]) + "\r")


def test_not_a_terminal_or_short_work_shows_nothing() -> None:
    pipe, clock = io.StringIO(), Clock()
    p = Progress(pipe, "x", clock=clock)
    clock.now += 5
    p.step("DWARF units", 1, 2)
    p.done()
    assert pipe.getvalue() == "" and not p.active
    tty = Tty()
    q = Progress(tty, "x", clock=clock)
    q.step("DWARF units", 1, 2)
    q.done()
    assert tty.getvalue() == ""
    Progress.NONE.step("anything", 1, 2)
    Progress.NONE.done()


def test_the_delay_comes_from_the_environment_when_not_given(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """ASYNCRSP_PROGRESS_DELAY (seconds; the integration tests set 0); unreadable: 0.5."""
    for value, shown_at_once in (("0", True), ("2", False), ("soon", False)):
        monkeypatch.setenv("ASYNCRSP_PROGRESS_DELAY", value)
        out, clock = Tty(), Clock()
        p = Progress(out, "asyncrsp: analysing app", clock=clock)
        p.step("DWARF units", 1, 10)
        assert (out.getvalue() != "") is shown_at_once, value
        clock.now += 0.6
        p.step("DWARF units", 2, 10)
        assert (out.getvalue() != "") is (value != "2"), value  # 0.5 s when unreadable
