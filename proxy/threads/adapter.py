"""The one place that turns what the monitor knows into task threads.

``from_snapshot`` takes the stop's snapshot (``proxy.snapshot``: the one model of
tasks, states and logical stacks every command renders) and returns one
``TaskThread`` per live task: its name, what it waits on (and who holds it), and
its logical stack as (pc at the suspend point, coroutine address) pairs,
innermost first.

The pc of a coroutine suspended at an ``.await`` on line L is the return
address of a call on line L in its resume function (the poll of the
awaitee), so that a debugger, which looks up ``pc - 1`` for an outer frame,
finds line L and the lexical scopes live at that await. (The first address
of line L is no good: in debug builds it is where the state dispatch jumps
on resume, and the byte before it belongs to the function's first line: gdb
showed lock_ba's frame at stuck.rs:32, its ``fn`` line, for the await at 36.)
Without such a call the first address of line L is taken, and an outer
frame's return address is one past it. A coroutine whose resume function was
inlined into its parent's (release builds) takes a pc in the inlined range and
shares the parent's physical frame.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.analysis.model import Inventory, ResumeFn, SourceLoc

from .model import TaskFrame, TaskThread


class SuspendPoints:
    """(layout, state value) -> link-time pc of the suspend point in its resume function."""

    def __init__(self, inv: Inventory, line_to_pcs: Callable[[str, int, int], list[int]],
                 code: Callable[[int, int], bytes | None],
                 pc_to_line: Callable[[int], SourceLoc | None] | None = None) -> None:
        self.inv = inv
        self.pc_to_line = pc_to_line
        self.line_to_pcs = line_to_pcs
        self.code = code
        self._by_layout: dict[str, ResumeFn] = {}
        for f in inv.resume_fns:
            if f.layout_name is not None:
                self._by_layout.setdefault(f.layout_name, f)
        self._memo: dict[tuple[str, int], tuple[int, int] | None] = {}
        self._code: dict[str, list[tuple[int, int]]] = {}

    def pc(self, layout_name: str, state_value: int) -> tuple[int, int] | None:
        """(pc for the innermost frame, return address for an outer one), link-time."""
        key = (layout_name, state_value)
        if key not in self._memo:
            self._memo[key] = self._find(layout_name, state_value)
        return self._memo[key]

    def resume_fn(self, layout_name: str) -> ResumeFn | None:
        return self._by_layout.get(layout_name)

    def code_ranges(self, layout_name: str) -> list[tuple[int, int]]:
        """Every range of the coroutine's resume code, link-time: its out-of-line function
        and each copy a release build inlined into another function."""
        got = self._code.get(layout_name)
        if got is None:
            fn = self._by_layout.get(layout_name)
            got = [(fn.low_pc, fn.high_pc)] if fn is not None else []
            got += [r for c in self.inv.inlined if c.layout_name == layout_name for r in c.ranges]
            self._code[layout_name] = got
        return got

    def _ranges(self, layout_name: str) -> list[tuple[int, int]]:
        """Where the coroutine's resume code is: its out-of-line function, else the ranges
        where a release build inlined it into another one (gdb and lldb then show it as an
        inlined frame at that pc)."""
        fn = self._by_layout.get(layout_name)
        if fn is not None:
            return [(fn.low_pc + 1, fn.high_pc)]
        return [r for c in self.inv.inlined if c.layout_name == layout_name for r in c.ranges]

    def _find(self, layout_name: str, state_value: int) -> tuple[int, int] | None:
        ranges = self._ranges(layout_name)
        lay = self.inv.layouts.get(layout_name)
        st = lay.state(state_value) if lay is not None else None
        if not ranges or st is None or st.loc is None:
            return None
        rows = sorted({p for lo0, _ in ranges for p in self.line_to_pcs(st.loc.file, st.loc.line, lo0)
                       if any(lo <= p < hi for lo, hi in ranges)})
        line = st.loc.line
        after_call = [p for p in rows if self._after_call(p) and self._line(p - 1) == line]
        if after_call:
            return after_call[0], after_call[0]
        if rows:
            return rows[0], rows[0] + 1
        # No row of the .await's file:line in the function: the awaits inside join!/select!
        # carry the macro's own file:line (tokio 1.43's tk_dump: bar's join! state names
        # macros/join.rs). The frame still belongs on the stack (its locals, its place
        # between caller and callee): at the function's first line.
        lo = ranges[0][0]
        return lo, lo + 1

    def _line(self, pc: int) -> int | None:
        loc = self.pc_to_line(pc) if self.pc_to_line is not None else None
        return loc.line if loc is not None else None

    def _after_call(self, p: int) -> bool:
        code = self.code(p - 7, 7)
        return code is not None and len(code) == 7 and (code[2] == 0xE8 or code[5] == 0xFF or code[4] == 0xFF
                                                         or code[1] == 0xFF)


def _short(loc: SourceLoc | None) -> str:
    return "?" if loc is None else f"{loc.file.rsplit('/', 1)[-1]}:{loc.line}"


def task_frames(coroutines: list[tuple[str, int, int, str]], points: SuspendPoints,
                bias: int) -> tuple[TaskFrame, ...]:
    """coroutines: (layout, __state, address, name), innermost first. A coroutine inlined
    into the next outer one's resume function (release builds) shares that function's
    physical frame: the debugger shows it as an inlined frame at the pc, and the frame's
    ``self`` is the outer coroutine's."""
    frames: list[TaskFrame] = []
    for layout, state, addr, name in coroutines:
        at = frames[-1].pc - bias - (1 if len(frames) > 1 else 0) if frames else None
        if at is not None and any(lo <= at < hi for lo, hi in points.code_ranges(layout)):
            # the inner one runs inlined in it: in its out-of-line resume function, or in a
            # copy of its resume code inlined elsewhere (tk_dump release: baz inlined into buz,
            # buz into tokio's MaybeDone::poll<buz>; a frame of its own showed buz twice)
            frames[-1] = TaskFrame(frames[-1].pc, addr, name)
            continue
        got = points.pc(layout, state)
        if got is None:
            continue
        frames.append(TaskFrame((got[1] if frames else got[0]) + bias, addr, name))
    return tuple(frames)


def from_snapshot(snapshot: Any, points: SuspendPoints, bias: int,
                  spawned: Callable[[Any], str] | None = None) -> list[TaskThread]:
    """The live tasks of a ``proxy.snapshot.Snapshot`` (the one model of tasks, states and
    logical stacks) as task threads: the same names, states and stacks every command prints.
    ``spawned``: a task's spawning line ("-": none known; proxy.origins), after its state."""
    holders = {h.resource.addr: h.task for h in getattr(snapshot.waits, "holds", ())}
    out = []
    for t in snapshot.live():
        kind = getattr(t.state.kind, "value", t.state.kind)
        if not t.stack and (kind == "unknown" or (kind == "running" and t.state.thread is None
                                                  and t.tree.kind == "leaf")):
            # nothing to show (tokio's spawn_blocking tasks: their pool thread is the stack). A
            # coroutine marked running with no thread named is listed, as before.
            continue
        running = t.state.thread if kind == "running" else None
        if running is not None:
            extra = f"running on thread {running}"
        elif kind == "suspended":
            extra = f"suspended at {_short(getattr(t, 'location', None) or t.state.loc)}"
        else:
            extra = str(t.state)
        for w in t.waits:
            held = holders.get(w.resource.addr)
            extra += f", waits on {w.resource}" + (f" held by #{held}" if held is not None and held != t.id else "")
        if not t.waits:  # what it waits on, as the tree's leaf says it (a Sleep, a channel...)
            leaf = next((n for n in t.tree.iter() if n.kind == "leaf"), None) if t.tree is not None else None
            if leaf is not None:
                extra += f", {leaf.name}" + (f": {leaf.detail}" if leaf.detail else "")
        at = spawned(t) if spawned is not None else "-"
        if at != "-":
            extra += f", spawned at {at.rsplit('/', 1)[-1]}"  # the file's name, as the state's
        coroutines = [(f.type_name, f.state_value, f.addr, f.name) for f in t.stack if f.state_value is not None]
        frames = () if running is not None else task_frames(coroutines, points, bias)
        out.append(TaskThread((t.addr, t.type_name), f"task {t.label} {t.name}", extra, frames, running))
    return out


class TaskSource:
    """The reflection source's parts task threads need, built once per program."""

    def __init__(self, src: Any) -> None:
        from .shapes import ShapeReader

        self.src = src
        finder = src.stacks() if src.stacks is not None else None
        self.shapes = ShapeReader(finder) if finder is not None and finder.map is not None else None
        self.points = (SuspendPoints(src.inventory, finder.map.line_to_pcs, finder.unwinder.elf.read,
                                     finder.map.pc_to_line)
                       if self.shapes is not None else None)
        self.end_ra = _outermost_return(finder, src.bias) if finder is not None else 0

    def from_snapshot(self, snapshot: Any, spawned: Callable[[Any], str] | None = None,
                      ) -> tuple[list[TaskThread], Callable[[int, bool], Any] | None, int]:
        if self.points is None or self.shapes is None:
            return [], None, 0
        shapes, bias = self.shapes, self.src.bias
        return (from_snapshot(snapshot, self.points, bias, spawned), lambda pc, outer: shapes.shape(pc - bias),
                self.end_ra)


def _outermost_return(finder: Any, bias: int) -> int:
    """A return address in the program's ``_start`` whose CFI row says the return address
    is undefined (the outermost frame), or 0 when there is none such."""
    elf = finder.unwinder.elf
    for sym in elf.symbols_named("_start"):
        row = finder.unwinder.row_for(sym.addr + 4)
        code = elf.read(sym.addr, 5)
        # xor ebp,ebp (2 bytes); mov r9,rdx (3 bytes): +5 is the third instruction
        if row is not None and row.rules.get(16, ("", 0))[0] == "undef" and code == bytes.fromhex("31ed4989d1"):
            return sym.addr + 5 + bias
    return 0
