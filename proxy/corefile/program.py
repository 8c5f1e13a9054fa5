"""Reflection over a `ProgramImage`: the program's analysis, its load bias
from the image's auxv, the image's clock, and the tokio adapter scanning the
image's anonymous memory (no /proc: the image may be a core of another host
or of a process long gone)."""

from __future__ import annotations

from typing import TextIO

from proxy.analysis.elf import open_elf
from proxy.analysis.errors import AnalysisError
from proxy.analysis.unwind import Unwinder
from proxy.analysis.inventory import build_inventory
from proxy.analysis.model import Inventory
from proxy.reflect import ReflectSource
from proxy.reflect.source import make_source
from proxy.reflect.adapters import choose

from .image import AT_ENTRY, ProgramImage


def load_inventory(image: ProgramImage, progress: TextIO | None = None) -> Inventory | str:
    """The analysis of the image's program (cached by build-id), or why not; `progress`:
    where a cold analysis shows its progress when it is a terminal."""
    if image.exec_file is None:
        return "the program's file is unknown (pass --elf PROG)"
    try:
        return build_inventory(image.exec_file, progress=progress)
    except AnalysisError as err:
        return f"cannot analyse {image.exec_file}: {err}"


def prepare_source(inv: Inventory, auxv: bytes) -> ReflectSource | str:
    """The reflection source of a program whose auxv is `auxv` (before it is stopped:
    the analysis, the bias, the stack finder's DWARF)."""
    if not inv.layouts:
        return "reflection: no coroutine layouts in the program's DWARF (build with debug=2)"
    bias = 0
    if inv.pie:
        entry = ProgramImage(0, [], lambda a, n: b"", [], auxv).auxv_value(AT_ENTRY)
        if entry is None:
            return "reflection: position-independent program and no AT_ENTRY in its auxv"
        bias = entry - inv.entry
    src = make_source(inv, bias, local=False)
    if src.stacks is not None:
        src.stacks()  # build the stack finder now (DWARF), not while the program waits
    return src


def library_entry(image: ProgramImage):  # type: ignore[no-untyped-def]
    """How a thread stopped in a shared library (libc's futex wait, abort, raise) enters
    the program: unwind the library's frames with the library's own CFI (its file from
    the image's mappings, its load address from its first mapping) until a return
    address into the program."""
    unwinders: dict[str, Unwinder | None] = {}

    def unwinder_for(pc: int) -> Unwinder | None:
        region = next((g for g in image.regions if g.start <= pc < g.end), None)
        if region is None or not region.path.startswith("/"):
            return None
        if region.path not in unwinders:
            base = min((g.start for g in image.regions if g.path == region.path), default=region.start)
            try:
                unwinders[region.path] = Unwinder(open_elf(region.path), base)
            except (AnalysisError, OSError, ValueError):
                unwinders[region.path] = None
        return unwinders[region.path]

    def enter(regs, read, in_program):  # type: ignore[no-untyped-def]
        unw = unwinder_for(regs.get(image.arch.pc, 0))
        if unw is None:
            return None
        for i, frame in enumerate(unw.unwind(regs, read, max_frames=32)):
            if i and in_program(frame.pc, True):
                return dict(frame.regs)
        return None

    return enter


def attach_image(src: ReflectSource, image: ProgramImage) -> ReflectSource:
    """Point a source at one image: its clock, the runtime adapters over its memory,
    the libraries' unwind tables for threads stopped in them."""
    finder = src.stacks() if src.stacks is not None else None
    if finder is not None:
        finder.enter = library_entry(image)
    clock = image.extra.get("clock_ns")
    src.now_ns = (lambda: clock) if isinstance(clock, int) else None
    found = choose(src.inventory, src.bias, None, False, "auto", ranges=image.heap_ranges)
    src.discover = found.discover if found.adapters else None
    src.note = found.note
    return src


def image_source(image: ProgramImage, inv: Inventory | None = None,
                 progress: TextIO | None = None) -> ReflectSource | str:
    """The reflection source for `image` (a string says why there is none)."""
    got = inv if inv is not None else load_inventory(image, progress)
    if isinstance(got, str):
        return f"reflection: {got}"
    src = prepare_source(got, image.auxv)
    return src if isinstance(src, str) else attach_image(src, image)
