"""A program's task threads between stops: what the capped build of a stop read,
its capped runtime adapters, the tasks it made and the previous stop's answer.

Task threads (proxy.threads) list the stop's tasks at the first thread query. Unless
the stop's full snapshot is built already (a monitor command ran) or a filter looks
at every task, they build it with each runtime adapter's tasks cut to the cap
(``proxy.threads.listing.Listing``); the memory that build read is kept
(``capped``), so the full build of the same stop (a monitor command after the IDE
listed the threads) reads none of it again and takes the tasks it found. A later
stop that finds nothing changed answers with the previous stop's tasks
(``proxy.threads.listing.LastStop``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

from .stops import ReadMemory

if TYPE_CHECKING:
    from .program import Program
    from .stops import SessionStop

TaskThreadsAnswer = tuple[list[Any], Any, int, int]  # (tasks, frame shapes, _start's return address, tasks cut)
_NONE: TaskThreadsAnswer = ([], None, 0, 0)


def remembering(read: ReadMemory, kept: dict[tuple[int, int], bytes]) -> ReadMemory:
    """``read``, keeping every answer in ``kept``."""
    def remember(addr: int, size: int) -> bytes | None:
        data = read(addr, size)
        if data is not None:
            kept[(addr, size)] = data
        return data

    def many(keys: list[tuple[int, int]]) -> list[bytes | None]:
        from proxy.reflect.memory import read_many

        got = read_many(read, keys)
        kept.update((k, data) for k, data in zip(keys, got) if data is not None)
        return got

    remember.many = many  # type: ignore[attr-defined]
    return remember


def reusing(read: ReadMemory, kept: dict[tuple[int, int], bytes]) -> ReadMemory:
    """``read``, answering from ``kept`` first."""
    def reuse(addr: int, size: int) -> bytes | None:
        data = kept.get((addr, size))
        return data if data is not None else read(addr, size)

    def many(keys: list[tuple[int, int]]) -> list[bytes | None]:
        from proxy.reflect.memory import read_many

        out = [kept.get(k) for k in keys]
        ask = [k for k, data in zip(keys, out) if data is None]
        got = dict(zip(ask, read_many(read, ask))) if ask else {}
        return [data if data is not None else got[k] for k, data in zip(keys, out)]

    reuse.many = many  # type: ignore[attr-defined]
    return reuse


class TaskThreads:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.capped: tuple[Hashable, dict[tuple[int, int], bytes]] | None = None  # key -> bytes read
        self.listing: Any = None  # proxy.threads.listing.Listing of the stop
        self.source: Any = None  # proxy.threads.adapter.TaskSource
        self.last: Any = None  # proxy.threads.listing.LastStop

    def for_full_build(self, key: Hashable, read: ReadMemory) -> tuple[ReadMemory, Callable[[list[Any]], list[Any]] | None]:
        """The read and adapters of the stop's full build: when task threads built their capped
        snapshot at this stop, the full one reads none of that memory again (each block as it
        got it) and takes the runtime's tasks it found."""
        if self.capped is None or self.capped[0] != key:
            return read, None
        listing = self.listing
        adapters = getattr(listing, "uncapped", None) if getattr(listing, "key", None) == key else None
        return reusing(read, self.capped[1]), adapters

    def full_built(self) -> None:
        self.capped = None

    def lines(self) -> Sequence[str]:
        last = self.last
        if last is None or not getattr(last, "reused", 0):
            return []
        return [f"task threads: stops that reused the previous stop's tasks (nothing they were read from"
                f" changed): {last.reused}"]

    def tasks(self, stop: SessionStop, read: ReadMemory, view: Any,
              origins: Callable[[], Any] | None = None) -> TaskThreadsAnswer:
        """The live tasks at this stop for task threads: the stop's snapshot (the same tasks, names,
        states and logical stacks every command shows) through proxy.threads.adapter; the full
        one when it is built, else one with the runtime's tasks cut to the cap. Also: how many
        tasks were cut. ``origins``: the spawn records' view (proxy.origins.view.Origins) when
        the capture records them: each task's spawn line."""
        from proxy.threads.adapter import TaskSource
        from proxy.threads.listing import SLACK, LastStop, Listing

        program = self.program
        src = program.source(stop)
        if src is None or not src.inventory.layouts:  # no coroutine: no task
            return _NONE
        key = program.key(stop, src)
        snap = program.store.held(key)
        if snap is not None:
            snap.bind(read)
        unread = 0
        last: LastStop | None = None
        if snap is None and (view is None or view.pattern):  # a filter looks at every task
            snap = program.snapshot(stop, read)
        elif snap is None:
            raw = stop.raw_registers()
            if raw is None:  # the threads' registers first: the session reads them and asks again
                return _NONE
            keep = view.cap + SLACK
            last = self.last = self.last if isinstance(self.last, LastStop) else LastStop()
            fingerprint = _task_inputs(stop, src, keep, raw)
            # compared without asking the stub for anything (a remote program's bytes not read
            # yet are "changed": asking would cost passes of the read loop for nothing)
            peek = stop.peek()
            same = last.same(fingerprint, peek) if peek is not None else None
            if same is not None:
                return same  # type: ignore[no-any-return]
            listing = self.listing
            if not isinstance(listing, Listing) or listing.key != key or listing.keep != keep:
                listing = self.listing = Listing(key, keep)
            if self.capped is None or self.capped[0] != key:
                self.capped = (key, {})
            recording = last.recording(listing, remembering(read, self.capped[1]))
            snap = program.build(stop, recording, src, key, adapters=listing.adapters)
            unread = listing.unread
        if snap is None:
            return _NONE
        if not isinstance(self.source, TaskSource) or self.source.src is not src:
            self.source = TaskSource(src)
        spawn_line = origins().spawn_line if origins is not None else None
        result = (*self.source.from_snapshot(snap, spawn_line), unread)
        if last is not None:
            last.keep(fingerprint, recording, result)
        return result  # type: ignore[return-value]


def _task_inputs(stop: SessionStop, src: Any, keep: int, raw: dict[int, bytes]) -> tuple[Any, ...]:
    """What a capped task-threads build depends on besides the bytes it reads
    (proxy.threads.listing.LastStop): the engine's position, the mode, the threads'
    registers and the stop's pcs, the cap, and the ranges the runtime adapters scan
    (/proc/PID/maps of a local program: a new arena holds tasks the last scan never read)."""
    engine = stop.engine
    discovery = getattr(src.discover, "__self__", None)  # proxy.reflect.adapters.Discovery
    ranges = discovery.ranges() if discovery is not None and hasattr(discovery, "ranges") else ()
    return (id(engine), engine.cursor_seq if engine is not None else None, stop.mode, id(src), keep,
            tuple(sorted(raw.items())), tuple(sorted(stop.pcs().items())), tuple(ranges))
