"""The stop's tasks with where they came from and who wakes them, in words.

A snapshot task is the coroutine its runtime task polls first; the kernel names
that coroutine in the task's wake statistics (``WakeStats.future``), so a task's
runtime header is the statistics' key. Its spawn record is found by the
runtime's task id, read from the task's cell (tokio's ``Core.task_id``, through
the cell's layout in the program's DWARF), or by the header's address itself
(async-task: the record carries the new task's pointer). A task whose spawn was not recorded
was spawned before the capture began: it falls back to the runtime's own
location where it keeps one (tokio >= 1.46 with ``tokio_unstable``:
``spawned at`` in the task's header line).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Any

from .records import SpawnRecord, WakeStats
from .resolve import RUNTIME_CRATES, Origin, crate_of

ReadMemory = Callable[[int, int], "bytes | None"]
_COROUTINE = re.compile(r"::\{\{closure\}\}|::\{async_fn#\d+\}|::\{async_block#\d+\}|::\{closure#\d+\}")
_SPAWNED_AT = re.compile(r"spawned at (\S+)")
HEADER = "tokio::runtime::task::core::Header"


def short(name: str) -> str:
    """A coroutine's function name without its resume-function suffix."""
    return _COROUTINE.sub("", name)


class Origins:
    """Answers for one stop. ``sw`` is the capture's ``SpawnsAndWakes``; ``inv`` the
    program's inventory, ``bias`` its load bias; ``read`` the stop's memory."""

    def __init__(self, sw: Any, inv: Any, bias: int, read: ReadMemory | None) -> None:
        self.sw = sw
        self.inv = inv
        self.bias = bias
        self.read = read
        self._by_future: dict[int, WakeStats] | None = None
        self._reflector: Any = None  # made once per stop, for the runtime's spawn locations

    # ---- matching ---------------------------------------------------------------------------
    def wakes_by_future(self) -> dict[int, WakeStats]:
        if self._by_future is None:
            self._by_future = {w.future: w for w in self.sw.wakes().values() if w.future}
        return self._by_future

    def wakes_of(self, task: Any) -> WakeStats | None:
        """By the coroutine the task's poll polls first, else by the header the runtime adapter
        found it in (an executor's own block around the future: async-std's task locals)."""
        w = self.wakes_by_future().get(task.addr)
        if w is None:
            header = _header_in(task)
            w = self.sw.wakes().get(header) if header is not None else None
        return w

    def header_of(self, task: Any) -> int | None:
        w = self.wakes_of(task)
        return w.task if w is not None else _header_in(task)

    def _cell_of(self, header: int) -> Any:
        """The type of tokio's cell at `header`, found by the header's vtable (the inventory's
        task vtables); None when it is not one."""
        inv, read = self.inv, self.read
        if inv is None or read is None:
            return None
        h = inv.types.get(HEADER)
        f = h.field("vtable") if h is not None else None
        raw = read(header + (f.offset if f is not None else 16), 8)
        if raw is None or len(raw) < 8:
            return None
        cell = inv.task_vtables.get(struct.unpack("<Q", raw)[0] - self.bias)
        return inv.types.get(cell) if cell else None

    def _core_of(self, header: int) -> tuple[int, Any] | None:
        """(offset from the header, type) of the ``core`` of tokio's cell at `header`."""
        c = self._cell_of(header)
        core = c.field("core") if c is not None else None
        core_t = self.inv.types.get(core.type_name) if core is not None else None
        return (core.offset, core_t) if core is not None and core_t is not None else None

    def future_size(self, task: Any) -> tuple[int, bool] | None:
        """(bytes, boxed) of the future the task runs: its type's size (the program's DWARF) and
        whether it lies outside the task's cell (tokio boxes a future too large to move: over
        its BOX_FUTURE_THRESHOLD); None when the type's size or the task's cell is unknown."""
        lay = self.inv.layouts.get(task.type_name) if self.inv is not None else None
        t = self.inv.types.get(task.type_name) if self.inv is not None and lay is None else None
        size = lay.size if lay is not None else t.size if t is not None else None
        header = self.header_of(task)
        cell = self._cell_of(header) if header is not None else None
        if size is None or cell is None or not cell.size:
            return None
        return size, not header <= task.addr < header + cell.size  # type: ignore[operator]

    def task_id_of(self, header: int) -> int | None:
        """tokio's id of the task at `header` (its cell's ``core.task_id``)."""
        core = self._core_of(header)
        tid = core[1].field("task_id") if core is not None else None
        if tid is None or self.read is None:
            return None
        raw = self.read(header + core[0] + tid.offset, 8)  # type: ignore[index]
        return struct.unpack("<Q", raw)[0] if raw is not None and len(raw) == 8 else None

    def runtime_location(self, task: Any) -> str | None:
        """``file:line:col`` the runtime itself recorded for the task's spawn (tokio >= 1.46
        with ``tokio_unstable``: ``Core.spawned_at``), else None: from the adapter's words
        when the task was found in its header, else read from the cell of the header the
        capture learnt (a task the capture observed: its words are the capture's)."""
        at = _SPAWNED_AT.search(getattr(task, "header", "") or "")
        if at is not None:
            return at.group(1)
        header = self.header_of(task)
        core = self._core_of(header) if header is not None else None
        if core is None or core[1].field("spawned_at") is None or self.read is None:
            return None
        from proxy.reflect.tokio_adapter import spawn_location
        from proxy.reflect.walker import Reflector

        if self._reflector is None:
            self._reflector = Reflector(self.inv, self.bias, self.read)
        return spawn_location(self._reflector, header + core[0], core[1].name)  # type: ignore[operator]

    def spawn_of(self, task: Any) -> SpawnRecord | None:
        """The task's spawn record: by its address (async-task's records carry the new task's
        pointer, which is the header's), else by the runtime's id read from its cell (tokio)."""
        header = self.header_of(task)
        if header is None:
            return None
        rec = self.sw.log.of_task(header)
        return rec if rec is not None else self.sw.log.get(self.task_id_of(header))

    def origin(self, rec: SpawnRecord) -> Origin | None:
        r = self.sw.resolver
        return r.origin(rec) if r is not None else None

    def place(self, pc: int) -> str:
        """The program's function and line of a runtime return address (the call before it)."""
        r = self.sw.resolver
        frames = r.frames_at(pc - self.bias - 1) if r is not None and pc else []
        outer = [f for f in frames if crate_of(f.function) not in RUNTIME_CRATES] or frames
        f = outer[0] if outer else None
        if f is None:
            return f"0x{pc:x}"
        return short(f.function) + (f" at {f.loc}" if f.loc else "")

    def wake_words(self, snap: Any) -> WakeWords:
        import time

        return WakeWords(self, snap, time.monotonic_ns(), self.place)

    # ---- words ------------------------------------------------------------------------------
    def spawn_line(self, task: Any) -> str:
        """The `tasks` column: the program's spawning line, or why there is none."""
        rec = self.spawn_of(task)
        if rec is None:
            at = self.runtime_location(task)
            return f"runtime@{at}" if at else "-"  # (a cell without spaces)
        o = self.origin(rec)
        if o is not None and o.line is not None:
            return str(o.line)
        # Recorded but the program's frame is not in the kept slice (a future of over ~16 KiB
        # copied on the spawning stack, console_lints' `huge`): the runtime's word, if it has one.
        at = self.runtime_location(task)
        return f"runtime@{at}" if at else "?"

    def spawned_text(self, task: Any, snap: Any, physical: bool = False) -> list[str]:
        """`where`: how the task was spawned, by whom, and (``physical``) the thread's frames."""
        rec = self.spawn_of(task)
        at = self.runtime_location(task)
        if rec is None:
            why = "its spawn was not recorded (spawned before the capture began, or not by a probed runtime)"
            return [f"  {why}" + (f"; the runtime says: spawned at {at}" if at else "")]
        o = self.origin(rec)
        line = str(o.line) if o is not None and o.line is not None else "an unknown line"
        logical = self._logical(o) if o is not None else []
        spawner = self._spawner(rec, snap)
        out = [f"  spawned at {line}" + (f" by {spawner}" if spawner else "") + f" on thread {rec.thread}"]
        if logical:
            out.append("  spawned by " + " <- ".join(logical))
        if at:
            out.append(f"  the runtime says: spawned at {at}")
        if physical and o is not None:
            out.append("  spawning thread's stack" + ("" if o.full else " (partial: the kept slice ended)") + ":")
            out += [f"    #{i} {f.function}" + (f" at {f.loc}" if f.loc else "") + (" [inlined]" if f.inlined else "")
                    for i, f in enumerate(o.frames)]
        return out

    def document_fields(self, task: Any, snap: Any) -> dict[str, object]:
        """The JSON document's ``spawn`` and ``wakes`` of a task (proxy/commands/document.py)."""
        rec = self.spawn_of(task)
        o = self.origin(rec) if rec is not None else None
        spawn = None
        if rec is not None:
            spawn = {"file": o.line.file if o is not None and o.line else None,
                     "line": o.line.line if o is not None and o.line else None,
                     "by": self._spawner(rec, snap) or None, "thread": rec.thread,
                     "logical": self._logical(o) if o is not None else [],
                     "frames": [{"name": f.function, "file": f.loc.file if f.loc else None,
                                 "line": f.loc.line if f.loc else None, "inlined": f.inlined}
                                for f in (o.frames if o is not None else ())]}
            spawn["runtime"] = self.runtime_location(task)
        w = self.wakes_of(task)
        wakes = None
        if w is not None:
            by_header = {x.task: t.id for t in snap.tasks if (x := self.wakes_of(t)) is not None}
            wakes = {"wakes": w.wakes, "self_wakes": w.self_wakes, "sched_ns": w.sched_ns, "sched_max_ns": w.sched_max,
                     "clones": w.clones, "drops": w.drops, "polls": w.polls,
                     "last": [{"ns": x.ts, "waker": by_header.get(x.waker), "thread": x.thread} for x in w.last]}
        return {"spawn": spawn, "wakes": wakes}

    def _logical(self, o: Origin) -> list[str]:
        """The coroutines on the spawning thread's stack, innermost first, each at its line."""
        out = []
        for f in o.frames:
            if _COROUTINE.search(f.function) and crate_of(f.function) not in RUNTIME_CRATES:
                out.append(f"{short(f.function)}" + (f" at {f.loc}" if f.loc else ""))
        return out

    def _spawner(self, rec: SpawnRecord, snap: Any) -> str:
        """The task that spawned it: the runtime task polled on the thread, else the outermost
        coroutine polled there (a block_on future)."""
        if rec.spawner:
            for t in snap.tasks:
                if self.header_of(t) == rec.spawner:
                    return f"{t.label} {t.name}"
        root = rec.chain[-1][0] if rec.chain and rec.depth <= len(rec.chain) else None
        for t in snap.tasks:
            if root is not None and t.addr == root:
                return f"{t.label} {t.name}"
        return ""


def _header_in(task: Any) -> int | None:
    """The runtime header a snapshot task was found in (its adapter's words), None: not one."""
    m = re.search(r"header 0x([0-9a-f]+)", getattr(task, "header", "") or "")
    return int(m.group(1), 16) if m else None


def _ago(ns: int, now: int) -> str:
    from proxy.graph.timing import fmt_ns

    return f"{fmt_ns(max(now - ns, 0))} before this stop"


class WakeWords:
    """Observed wakes as evidence for ``waits`` and ``deadlocks`` (``Origins`` at one stop)."""

    def __init__(self, org: Origins, snap: Any, now_ns: int, where: Callable[[int], str]) -> None:
        self.org, self.snap, self.now = org, snap, now_ns
        self.where = where  # runtime pc -> "fn at file:line" (the waker function's caller)
        self._by_header = {w.task: t for t in snap.tasks if (w := org.wakes_of(t)) is not None}
        inv = org.inv
        self.fn_name = lambda fn: short(inv.resume_fns[fn].name) if inv is not None and fn < len(inv.resume_fns) else None

    def lost(self, task: Any) -> bool:
        """Pending, polled, every waker it handed out dropped (tokio-console's lost waker)."""
        w = self.org.wakes_of(task)
        return (w is not None and task.live and w.polls > 0 and w.clones > 0 and w.wakers <= 0
                and not w.woken_at and getattr(task.state, "thread", None) is None)

    def last_woken(self, task: Any) -> str | None:
        w = self.org.wakes_of(task)
        if w is None or not w.last:
            return None
        x = w.last[0]
        by = self._by_header.get(x.waker)
        who = f"{by.label} {by.name}" if by is not None else f"thread {x.thread} (no task polled there)"
        inside = self.fn_name(x.fn) if x.fn is not None else None
        return (f"last woken by {who} {_ago(x.ts, self.now)} (from {self.where(x.ret)}"
                + (f", inside {inside}'s poll" if inside else "") + f"); {w.wakes} wakes observed")

    def evidence(self, task: Any) -> str | None:
        if task is None:
            return None
        if self.lost(task):
            return "no waker alive (every waker it handed out was dropped): nothing can wake it (lost waker)"
        return self.last_woken(task)
