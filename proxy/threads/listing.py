"""How many of the runtime's tasks a stop reads for task threads.

An IDE lists the threads at every stop, and the stop without task threads reads
nothing. Reading every one of 10,000 tasks (future trees, states, the wait-for
graph) to show the first 1024 cost 9.9x that stop (bench/bench_task_threads.py).
So, unless the stop's full snapshot is already built (a monitor command ran) or
a filter has to look at every task, task threads build their snapshot with the
same builder and inputs, but with each runtime adapter's tasks cut to the first
``keep`` (by header address: the same tasks at every stop while they live).
Tasks found otherwise (observed polls, the threads' stacks, earlier stops) are
all kept. The tasks cut are only counted: they make the "N more tasks" thread.

One adapter discovery per stop: the heap scan is complete once a pass read every
block it touched; later passes of the same stop reuse its tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

# Slack over the cap: tasks running on a real thread, or held inside another task's
# tree, are read but not listed as task threads of their own.
SLACK = 16


class Listing:
    """The capped runtime adapters of one stop (``adapters`` for the snapshot builder)."""

    def __init__(self, key: Hashable, keep: int) -> None:
        self.key = key
        self.keep = keep
        self.unread = 0  # tasks the adapters found past ``keep``
        self._found: dict[int, tuple[list[Any], dict[int, str]]] = {}

    def adapters(self, adapters: list[Callable[[Any], list[Any] | None]]) -> list[Callable[[Any], list[Any] | None]]:
        self.unread = 0
        return [self._capped(i, a) for i, a in enumerate(adapters)]

    def uncapped(self, adapters: list[Callable[[Any], list[Any] | None]]) -> list[Callable[[Any], list[Any] | None]]:
        """The adapters for the full snapshot of the same stop: every task each one found
        (its discovery not made again), or its own discovery when it found none yet."""
        return [self._all(i, a) for i, a in enumerate(adapters)]

    def _all(self, i: int, discover: Callable[[Any], list[Any] | None]) -> Callable[[Any], list[Any] | None]:
        def found(r: Any) -> list[Any] | None:
            got = self._found.get(i)
            if got is None:
                return discover(r)
            r.task_names.update(got[1])
            return got[0]
        return found

    def _capped(self, i: int, discover: Callable[[Any], list[Any] | None]) -> Callable[[Any], list[Any] | None]:
        def capped(r: Any) -> list[Any] | None:
            got = self._found.get(i)
            if got is None:
                before, r.mem.missing = r.mem.missing, False
                roots = discover(r)
                complete = not r.mem.missing
                r.mem.missing = before or r.mem.missing
                if roots is None:
                    return None
                got = (roots, dict(r.task_names))
                if complete:
                    self._found[i] = got
            roots, names = got
            r.task_names.update(names)
            self.unread += max(0, len(roots) - self.keep)
            return roots[:self.keep]
        return capped
