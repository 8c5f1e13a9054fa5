"""Build a session's ``ReflectSource``: the inventory, the load bias and the helpers.

With a capture backend the engine's catalog already has the inventory and
the bias. Without one (``--mode off``, or a program attached and never
resumed), the program file comes from the session (qXfer:exec-file, or
/proc/PID/exe for a local stub) and the bias from /proc/PID/auxv (AT_ENTRY)
for a local program; a remote one with no capture gets a clear note.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from proxy.analysis.elf import open_elf
from proxy.analysis.errors import AnalysisError
from proxy.analysis.inventory import build_inventory
from proxy.analysis.lines import pc_to_frames
from proxy.analysis.model import Inventory

from . import ReflectSource

if TYPE_CHECKING:
    from typing import TextIO

    from .stacks import StackFinder


def make_source(inventory: Inventory, bias: int, *, local: bool,
                discover: Callable | None = None, note: str | None = None) -> ReflectSource:  # type: ignore[type-arg]
    elf = None
    try:
        elf = open_elf(inventory.path)
    except AnalysisError:
        pass

    def symbol_at(addr: int) -> str | None:
        sym = elf.symbol_at(addr) if elf is not None else None
        return sym.demangled if sym is not None and sym.addr == addr else None

    finder: list[StackFinder | None] = []

    def frames_at(pc: int):  # type: ignore[no-untyped-def]
        if elf is None:
            return []
        # stack discovery's source map when it has one: the units behind the threads'
        # frames are walked there already (its view keeps lexical blocks, variables and
        # template parameters too, which the frames skip)
        sm = finder[0].map if finder and finder[0] is not None else None
        return sm.pc_to_frames(pc) if sm is not None else pc_to_frames(elf, pc)

    def stacks() -> StackFinder | None:
        if not finder:
            # imported here: pyelftools (the unwinder's) after a cold analysis's unit walker started
            from .stacks import StackFinder

            finder.append(StackFinder(elf, inventory, bias) if elf is not None else None)
        return finder[0]

    return ReflectSource(
        inventory, bias, symbol_at=symbol_at, frames_at=frames_at,
        now_ns=(lambda: time.clock_gettime_ns(time.CLOCK_MONOTONIC)) if local else None,
        discover=discover, note=note, stacks=stacks,
    )


def auxv_entry(pid: int) -> int | None:
    """AT_ENTRY of a local process (64-bit)."""
    try:
        with open(f"/proc/{pid}/auxv", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    for i in range(0, len(data) - 15, 16):
        key, value = struct.unpack_from("<QQ", data, i)
        if key == 9:
            return value
        if key == 0:
            break
    return None


def source_without_capture(path: str | None, pid: int | None, local: bool,
                           discover: Callable | None = None,  # type: ignore[type-arg]
                           later: Callable[[Callable[[], object]], None] | None = None,
                           progress: TextIO | None = None,
                           entry: int | None = None) -> ReflectSource | str:
    """The source for a session with no engine, or why there is none. ``later``: where a cold
    analysis's cache write goes, ``progress`` where it shows its progress (``build_inventory``);
    ``entry``: the program's AT_ENTRY from the stub's auxv (qXfer:auxv), for a program of
    another host."""
    if path is None:
        return "reflection: the program's file is unknown (no qXfer:exec-file, not a local stub)"
    try:
        inv = build_inventory(path, later=later, progress=progress)
    except AnalysisError as e:
        return f"reflection: {e}"
    if not inv.layouts:
        return "reflection: no coroutine layouts in the program's DWARF (build with debug=2)"
    bias = 0
    if inv.pie:
        entry = (auxv_entry(pid) if (local and pid) else None) or entry
        if entry is None:
            return ("reflection: position-independent program and neither a local /proc/PID/auxv "
                    "nor the stub's auxv: load bias unknown")
        bias = entry - inv.entry
    return make_source(inv, bias, local=local, discover=discover)
