"""One async snapshot of a `ProgramImage`, for the one-shot commands.

`take` is the only place `asyncrsp ps`/`tree` gather facts: it asks the
image's `proxy.program.Program` for its `proxy.snapshot.Snapshot` (the same merge, waits and
deadlock findings every monitor command renders: the tokio adapter over the
image's heap, the threads' stacks), like CPython's ``asyncio.tools`` builds
its await graph once. What only a one-shot look adds is kept beside it: the
stopped time, and for a program killed by a signal its crashing thread's
logical async backtrace (the snapshot's stack of that thread). The renderers
only format what it returns.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from proxy.analysis.model import SourceLoc
from proxy.corefile.image import ProgramImage
from proxy.reflect import ReflectSource
from proxy.snapshot.model import Snapshot


@dataclass(slots=True)
class Crash:
    """The thread that took the signal that ended the program, and its async frames."""

    thread: int
    signal: str  # "SIGSEGV"
    address: int | None  # the faulting address (SIGSEGV, SIGBUS)
    frames: list[tuple[str, SourceLoc | None, str]]  # innermost first: (coroutine, where, task title)

    def lines(self) -> list[str]:
        at = f" at address 0x{self.address:x}" if self.address is not None else ""
        out = [f"crashed: thread {self.thread}, {self.signal}{at}"]
        if not self.frames:
            return out + ["  no async frame on its stack"]
        out.append(f"async backtrace of thread {self.thread}:")
        for i, (name, loc, task) in enumerate(self.frames):
            out.append(f"  #{i} {name}" + (f" at {loc}" if loc else "") + (f"  ({task})" if task else ""))
        return out


@dataclass(slots=True)
class PsSnapshot:
    """The program's `Snapshot` (proxy.snapshot: the same as every monitor command
    renders) and what only a one-shot look adds: where it came from, how long the
    program was stopped, the crash."""

    origin: str
    pid: int
    snapshot: Snapshot
    stopped_ns: int | None = None  # live processes: how long the program was stopped
    copied: int | None = None  # bytes copied while stopped
    crash: Crash | None = None  # a core of a program killed by a signal
    notes: list[str] = field(default_factory=list)


def take(image: ProgramImage, src: ReflectSource) -> PsSnapshot:
    """The snapshot of `image` (see the module docstring)."""
    from proxy.program import ImageStop, Program

    snap = Program(source=src).snapshot(ImageStop(image), image.read)
    assert snap is not None  # a source: always a snapshot
    stopped = image.extra.get("stopped_ns")
    copied = image.extra.get("copied")
    return PsSnapshot(image.origin, image.pid, snap,
                      stopped if isinstance(stopped, int) else None, copied if isinstance(copied, int) else None,
                      crash_of(image, snap))


def crash_of(image: ProgramImage, snap: Snapshot) -> Crash | None:
    fault = image.fault
    thread = next((t for t in image.threads if t.signal), None)
    if thread is None or thread.signal == signal.SIGSTOP or (fault is not None and fault[0] in (signal.SIGSTOP, 0)):
        return None  # gcore writes SIGSTOP: the program did not die
    # no NT_SIGINFO (qemu-user's cores): the signal is the thread's pr_cursig, the address unknown
    try:
        name = signal.Signals(thread.signal).name
    except ValueError:
        name = f"signal {thread.signal}"
    faulted = fault is not None and fault[0] in (signal.SIGSEGV, signal.SIGBUS) and fault[0] == thread.signal
    address = fault[2] if faulted and fault is not None else None
    owner = {}
    for t in snap.tasks:
        for n in t.tree.iter():
            owner.setdefault((n.addr, n.type_name), f"{t.label} {t.name}")
    frames = [(fn, loc, owner.get(key, "")) for fn, loc, key in snap.thread_stack(thread.tid)]
    return Crash(thread.tid, name, address, frames)
