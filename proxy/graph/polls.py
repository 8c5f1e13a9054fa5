"""The polls recorded with both timestamps, and the stops, for the poll timeline.

Theory of operation (pure, no clock): the graph state hands every poll whose
entry and exit both carry a timestamp to ``PollLog.add`` when the poll ends
(the same place ``PollTiming.poll`` is fed), with the coroutine's id, the OS
thread, the resume function (its runtime low_pc: the coroutine's name even
after the engine forgot the coroutine), its address and the entry and exit
sequence numbers. The log keeps the last ``MAX_POLLS`` polls; older ones fall
off the front (``dropped`` counts them). A refold after a rewind hands the same
polls again: exits at or below the highest sequence number kept are ignored,
so nothing is recorded twice.

``stop`` marks a stop the client saw (its serial, the time on the captures'
clock, CLOCK_MONOTONIC, and the reporting thread): every backend stamps with
that clock (uprobes: the kernel's ktime; tracepoints: gdbserver's trace
timestamp; breakpoints: the proxy's clock when it handles the hit), so the
stops fall between the polls on one time axis.

Wakes are not in this log: uprobe capture keeps each runtime task's newest
wakes in the kernel (``proxy.origins``), and the timeline reads them there.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

MAX_POLLS = 100_000  # ~120 bytes each: ~12 MB at most
MAX_STOPS = 1_000


class Poll(NamedTuple):
    """One recorded poll: times in ns on the capture's clock (CLOCK_MONOTONIC)."""

    coroutine: int  # the engine's id of the coroutine polled
    thread: int  # OS thread (LWP)
    site: int  # runtime low_pc of the resume function
    self_ptr: int
    enter_seq: int
    exit_seq: int
    enter_ns: int
    exit_ns: int


class StopMark(NamedTuple):
    serial: int
    time_ns: int
    thread: int | None


class PollLog:
    """``add`` is on the capture's hot path (once per poll): it keeps a plain tuple (a
    NamedTuple's ``__new__`` cost ~10x a tuple display: ~0.4 µs a poll); ``polls``
    makes the ``Poll`` values when the timeline is written."""

    def __init__(self, max_polls: int = MAX_POLLS) -> None:
        self._ring: deque[tuple[int, int, int, int, int, int, int, int]] = deque(maxlen=max_polls)
        self.stops: deque[StopMark] = deque(maxlen=MAX_STOPS)
        self.recorded = 0  # polls added since the start (kept or dropped)
        self._high = -1

    @property
    def polls(self) -> list[Poll]:
        """The polls kept, oldest first."""
        return [Poll._make(t) for t in self._ring]

    @property
    def dropped(self) -> int:
        """Polls recorded but no longer kept (the oldest first)."""
        return self.recorded - len(self._ring)

    def add(self, coroutine: int, thread: int, site: int, self_ptr: int, enter_seq: int, exit_seq: int,
            enter_ns: int, exit_ns: int) -> None:
        if exit_seq <= self._high:
            return  # refolded after a rewind: recorded already
        self._high = exit_seq
        self.recorded += 1
        self._ring.append((coroutine, thread, site, self_ptr, enter_seq, exit_seq, enter_ns, exit_ns))

    def stop(self, serial: int, time_ns: int, thread: int | None) -> None:
        """A stop the client saw (the same serial twice is one stop)."""
        if self.stops and self.stops[-1].serial == serial:
            return
        self.stops.append(StopMark(serial, time_ns, thread))
