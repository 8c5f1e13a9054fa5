"""`asyncrsp ps|tree PID` and `--core FILE`: gather once, print once.

A live process: everything that needs no stop comes first (the program's
analysis, cached by build-id; its maps and auxv; the stack finder), then the
process is stopped only while its threads' registers and its memory are
copied (`proxy.corefile.live`), and the trees are walked in the copy while it
runs on. The stopped time is part of the output.
"""

from __future__ import annotations

import sys
from typing import TextIO

from proxy.corefile import CoreError, open_core
from proxy.corefile.image import ProgramImage
from proxy.corefile.live import LiveError, LiveProcess
from proxy.corefile.program import attach_image, image_source, prepare_source
from proxy.analysis.errors import AnalysisError
from proxy.analysis.inventory import build_inventory

from .render import header, render_json, render_ps, render_tree
from .snapshot import PsSnapshot, take


class PsError(Exception):
    """One line for the user."""


def snapshot_live(pid: int) -> PsSnapshot:
    proc = LiveProcess(pid)
    try:
        try:
            inv = build_inventory(proc.exe, progress=sys.stderr)  # before the program is stopped
        except AnalysisError as err:
            raise PsError(f"cannot analyse {proc.exe}: {err}") from None
        src = prepare_source(inv, proc.auxv)
        if isinstance(src, str):
            raise PsError(src)
        image = proc.snapshot()
    finally:
        proc.close()
    return take(image, attach_image(src, image))


def snapshot_core(path: str, elf: str | None) -> PsSnapshot:
    image: ProgramImage = open_core(path, elf)
    src = image_source(image, progress=sys.stderr)
    if isinstance(src, str):
        raise PsError(src)
    return take(image, src)


def main(command: str, pid: int | None, core: str | None, elf: str | None, as_json: bool,
         out: TextIO = sys.stdout, *, html: str | None = None) -> int:
    try:
        if core is not None:
            snap = snapshot_core(core, elf)
        elif pid is not None:
            snap = snapshot_live(pid)
        else:
            raise PsError(f"{command}: give a PID or --core FILE")
    except (PsError, CoreError, LiveError) as err:
        print(f"asyncrsp: {err}", file=sys.stderr)
        return 2
    if html is not None:
        return _write_html(html, snap)
    render = render_json if as_json else (render_tree if command == "tree" else render_ps)
    try:
        print(render(snap), file=out, flush=True)
    except BrokenPipeError:  # `asyncrsp ps PID | head`: the reader left, nothing to report
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _write_html(path: str, snap: PsSnapshot) -> int:
    """`--html FILE`: the report page of this one look (no polls: no timeline)."""
    from proxy.pictures.files import PictureError, write_report

    subtitle = "; ".join([*(snap.crash.lines() if snap.crash is not None else []), *snap.notes])
    try:
        line = write_report(path, snap.snapshot, None, title=f"asyncrsp: {header(snap)}", subtitle=subtitle)
    except PictureError as err:
        print(f"asyncrsp: {err}", file=sys.stderr)
        return 2
    print(f"asyncrsp: {line}", file=sys.stderr)
    return 0
