"""What a `Program` is told of the stop it is looked at: the stop's facts.

A live session (``SessionStop``) and a program that does not run (``ImageStop``: a
core file, a copy of a stopped process) give the same facts, so one builder makes
the snapshot of both: the stop's key, the engine and its origin words, the threads'
registers and pcs, and where the reflection source comes from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

ReadMemory = Callable[[int, int], "bytes | None"]


class Stop(Protocol):
    """The facts of one stop a ``Program`` builds its snapshot from."""

    serial: int | None  # the stop's key (a new one after any write: proxy.session.state.Stopped)
    engine: Any  # proxy.graph.engine.Engine | None
    mode: str  # the capture mode ("off": the engine holds only what was seen before)

    def pcs(self) -> Mapping[int, int]: ...

    def registers(self) -> Mapping[int, dict[str, int]] | None:
        """LWP -> registers; None: not known yet (asked for: the reader reads them and asks again)."""

    def peek(self) -> ReadMemory | None:
        """A read that never asks the stub (None: not available)."""

    def find_source(self, current: Any, adapters: str) -> Any:
        """The reflection source (proxy.reflect.ReflectSource) to use now: ``current`` while
        it fits, a new one, a string saying why there is none, or None."""


class ImageStop:
    """A program that does not run: every fact is in the image (proxy.corefile.image)."""

    mode = "image"  # nothing observes it: no engine, no capture mode
    engine = None

    def __init__(self, image: Any) -> None:
        self.image = image
        self.serial: int | None = 0

    def pcs(self) -> Mapping[int, int]:
        return {t.tid: t.pc for t in self.image.threads}

    def registers(self) -> Mapping[int, dict[str, int]]:
        return {t.tid: dict(t.regs) for t in self.image.threads}

    def peek(self) -> ReadMemory | None:
        return self.image.read  # type: ignore[no-any-return]

    def find_source(self, current: Any, adapters: str) -> Any:
        return current  # made with the image (proxy.corefile.program.image_source)


class SessionStop:
    """A live session's current stop (proxy.session.core.Session), read through its narrow
    side: the stop serial, the engine, the mode, the stop's pcs, the read loop's state."""

    def __init__(self, session: Any) -> None:
        self.session = session
        stopped = getattr(session, "stopped", None)
        self.serial = getattr(stopped, "serial", None)
        self.engine = session.engine
        self.mode: str = session.mode

    def pcs(self) -> Mapping[int, int]:
        return self.session.stop_pcs()  # type: ignore[no-any-return]

    def raw_registers(self) -> dict[int, bytes] | None:
        fn = self.session.queries.monitor_threads
        return fn() if fn is not None else None

    def registers(self) -> Mapping[int, dict[str, int]] | None:
        from proxy.reflect import thread_regs

        return thread_regs(dict(self.raw_registers() or {}), getattr(self.session, "arch", None))

    def peek(self) -> ReadMemory | None:
        return self.session.queries.monitor_peek  # type: ignore[no-any-return]

    def find_source(self, current: Any, adapters: str) -> Any:
        from .live import find_source

        return find_source(self.session, current, adapters)
