"""Progress of long work on a terminal: one line on stderr, rewritten in place.

A cold analysis of a large binary (tens of MB of DWARF) takes seconds; on a
terminal the user sees what it is doing (``analysing /path/app: DWARF unit
412/1630``). Nothing is printed when the stream is not a terminal (a pipe, a
log file, a test's capture) or when the work ends before ``delay`` (a cached
or small binary): the line appears only for work long enough to wonder
about, and is erased when the work ends. Updates are throttled (at most one a
``interval``) so the work does not pay for its own reporting.

``Progress.NONE`` reports nothing (the default of every function that takes one).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    """Steps of one piece of work, shown on `stream` when it is a terminal."""

    NONE: Progress

    def __init__(self, stream: TextIO | None, what: str, *, delay: float | None = None, interval: float = 0.1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream if stream is not None and _is_tty(stream) else None
        self._what = what
        self._delay = delay if delay is not None else _default_delay()
        self._interval, self._clock = interval, clock
        self._start = clock()
        self._last = float("-inf")
        self._shown = 0  # the length of the line on the terminal (0: nothing shown)

    @property
    def active(self) -> bool:
        return self._stream is not None

    def step(self, phase: str, done: int | None = None, total: int | None = None) -> None:
        """`phase` (``DWARF unit``), `done` of `total` so far."""
        if self._stream is None:
            return
        now = self._clock()
        if now - self._start < self._delay or now - self._last < self._interval:
            return
        self._last = now
        count = f" {done}/{total}" if done is not None and total else ""
        self._write(f"{self._what}: {phase}{count} ({now - self._start:.0f} s)")

    def done(self) -> None:
        """Erase the line (the work's own output follows on a clean line)."""
        if self._stream is not None and self._shown:
            self._stream.write("\r" + " " * self._shown + "\r")
            self._stream.flush()
            self._shown = 0

    def _write(self, text: str) -> None:
        assert self._stream is not None
        text = text[:max(_columns(self._stream) - 1, 20)]  # one line: \r rewrites it
        pad = " " * max(self._shown - len(text), 0)
        self._stream.write("\r" + text + pad)
        self._stream.flush()
        self._shown = len(text) + len(pad)  # the columns written: done() blanks them all


def _columns(stream: TextIO) -> int:
    """The terminal's width (80 when it does not say: a new pty says 0)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def _default_delay() -> float:
    """Seconds of work before the line shows: 0.5, or ``ASYNCRSP_PROGRESS_DELAY`` (the
    integration tests set 0: how long a cold analysis takes depends on the CPU)."""
    try:
        return max(0.0, float(os.environ.get("ASYNCRSP_PROGRESS_DELAY", "0.5")))
    except ValueError:
        return 0.5


Progress.NONE = Progress(None, "")
