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

from proxy.reflect.memory import BlockReader, Recording, word_hits

# Slack over the cap: tasks running on a real thread, or held inside another task's
# tree, are read but not listed as task threads of their own.
SLACK = 16


class Listing:
    """The capped runtime adapters of one stop (``adapters`` for the snapshot builder)."""

    def __init__(self, key: Hashable, keep: int) -> None:
        self.key = key
        self.keep = keep
        self.unread = 0  # tasks the adapters found past ``keep``
        self.recording: Recording | None = None  # what this stop's builds read (LastStop)
        # adapter -> (roots, task names, tasks counted but not made past ``keep``)
        self._found: dict[int, tuple[list[Any], dict[int, str], int]] = {}

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
            if got is None or got[2]:  # none found yet, or the capped one made only the first
                return discover(r)
            r.task_names.update(got[1])
            return got[0]
        return found

    def _capped(self, i: int, discover: Callable[[Any], list[Any] | None]) -> Callable[[Any], list[Any] | None]:
        def capped(r: Any) -> list[Any] | None:
            got = self._found.get(i)
            if got is None:
                before, r.mem.missing = r.mem.missing, False
                # a runtime discovery (proxy.reflect.adapters.Discovery) makes only the tasks
                # kept and counts the rest; any other adapter gives all and is cut here
                owner = getattr(discover, "__self__", None)
                counts = hasattr(owner, "past")
                roots = discover(r, keep=self.keep) if counts else discover(r)  # type: ignore[call-arg]
                complete = not r.mem.missing
                r.mem.missing = before or r.mem.missing
                if roots is None:
                    return None
                got = (roots, dict(r.task_names), owner.past if counts else 0)  # type: ignore[union-attr]
                if complete:
                    self._found[i] = got
            roots, names, past = got
            r.task_names.update(names)
            self.unread += max(0, len(roots) - self.keep) + past
            return roots[:self.keep]
        return capped


class LastStop:
    """The previous stop's task threads, reused while nothing they were built from changed.

    A later stop of an IDE session often finds the program as it left it: thousands of
    tasks parked, the same few running. Building the capped snapshot again (walks, waits,
    conversion, logical stacks: ~0.3 s for 1,040 tasks) then gives the same answer. The
    build is a function of the bytes it read, the threads' registers and pcs, the heap's
    ranges and the engine's position; ``fingerprint`` holds all but the bytes, ``reads``
    the bytes (every field the last complete build's reflector read, with what it got:
    ``Recording``; of the blocks a runtime adapter scanned, only where the task-header
    words lie: the rest of the heap changes whenever the program runs). At the next stop
    the same fields are read again, through the same block cache, and compared (for a
    local program: preads of /proc/PID/mem, ~1,700 blocks for 10,000 tasks' heap): one
    byte different, or anything else, and the snapshot is built again. The comparison never asks the stub (``Queries.monitor_peek``):
    bytes not known without it (a remote program's) count as changed.
    """

    def __init__(self) -> None:
        self.fingerprint: Hashable | None = None
        self.reads: dict[tuple[int, int], bytes | None] = {}
        self.scanned: dict[tuple[int, int], tuple[tuple[bytes, ...], tuple[int, ...] | None]] = {}
        self.result: Any = None
        self.reused = 0  # stops answered from the previous one (tests, stats)

    def recording(self, listing: Listing, read: Callable[[int, int], bytes | None]) -> Recording:
        """``read`` for this pass's build, noting what its reflector reads (proxy.reflect.memory).
        One record for all the passes of a stop (``listing``'s): the heap scan and the task
        headers are read in the pass that completes the scan, later passes reuse them."""
        if listing.recording is None:
            listing.recording = Recording(read)
        listing.recording.using(read)
        return listing.recording

    def same(self, fingerprint: Hashable, read: Callable[[int, int], bytes | None]) -> Any:
        """The previous result when nothing it was built from changed, else None."""
        if self.result is None or fingerprint != self.fingerprint:
            return None
        mem = BlockReader(read)  # the same block reads the build made, each block read once
        for (addr, size), data in self.reads.items():
            if mem.read(addr, size) != data:
                return None
        for (addr, size), (words, hits) in self.scanned.items():
            data = mem.read(addr, size)
            if (word_hits(data, words) if data is not None else None) != hits:
                return None
        self.reused += 1
        return self.result

    def keep(self, fingerprint: Hashable, recording: Recording, result: Any) -> None:
        self.fingerprint, self.reads, self.scanned, self.result = \
            fingerprint, recording.reads, recording.scanned, result
