"""What the picture commands write: the pure parts put together, Graphviz run, one file.

Used by ``monitor async report|timeline|stacks FILE`` (the proxy writes the
file on its own host, a relative path from its working directory) and by
``asyncrsp ps|tree ... --html FILE``. Each returns the one line the user reads
(the file's absolute path and what is in it); a file that cannot be written is
a ``PictureError`` with the reason, and nothing else changes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from proxy.pictures import graphviz, report, stacks, timeline, waitgraph
from proxy.snapshot.model import Snapshot
from proxy.snapshot.names import layout_name

REPORT_POLLS = 20_000  # the newest polls the page's timeline draws (the JSON file has every one kept)


class PictureError(ValueError):
    """One line for the user."""


def _write(path: str, data: bytes) -> Path:
    target = Path(path).expanduser()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(target)  # a reader never sees half a file
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise PictureError(f"cannot write {target}: {err.strerror or err}") from None
    return target.resolve()


def trace_of(engine: Any, snap: Snapshot | None, last: int | None = None, wakes: Any = ()) -> dict[str, Any] | None:
    """The Chrome trace of the engine's recorded polls (None: no engine), with the capture's
    wake statistics where it records them (``wakes``: ``WakeStats`` values)."""
    log = getattr(engine, "polls", None)
    if log is None:
        return None
    inv = engine.catalog.inventory
    polls = log.polls
    dropped = log.dropped
    if last is not None and len(polls) > last:
        dropped += len(polls) - last
        polls = polls[-last:]

    def name_of(site: int) -> str:
        return layout_name(inv, engine.catalog.type_key(site))

    names = {t.id: t.name for t in snap.tasks} if snap is not None else {}
    addrs = {t.addr: t.id for t in snap.tasks} if snap is not None else {}
    return timeline.trace(polls, list(log.stops), name_of, names, dropped=dropped, wakes=wakes, task_addrs=addrs)


def write_timeline(path: str, engine: Any, snap: Snapshot | None, wakes: Any = ()) -> str:
    doc = trace_of(engine, snap, wakes=wakes)
    if doc is None:
        raise PictureError("no polls recorded: the program has not run under a capture in this session")
    where = _write(path, json.dumps(doc, separators=(",", ":")).encode())
    polls = doc["otherData"]["polls"]
    tracks = sum(1 for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 1)
    return (f"wrote {where}: {polls} polls on {tracks} task tracks (Chrome trace JSON: open it in "
            "Perfetto's UI or chrome://tracing)")


def write_stacks(path: str, snap: Snapshot, title: str = "") -> str:
    """The parallel stacks: FILE.dot is the DOT text, any other suffix (svg, png, pdf) is dot's output."""
    text = stacks.to_dot(snap, title=title)
    fmt = Path(path).suffix.lstrip(".").lower() or "svg"
    if fmt in ("dot", "gv"):
        data = text.encode()
    else:
        try:
            data = graphviz.render(text, fmt)
        except (graphviz.GraphvizMissing, graphviz.GraphvizFailed) as err:
            raise PictureError(f"{err} (FILE.dot writes the DOT text without it)") from None
    where = _write(path, data)
    return f"wrote {where}: the parallel stacks of {len(snap.live())} live tasks"


def figures(snap: Snapshot, engine: Any, wakes: Any = ()) -> report.Figures:
    svg, note = graphviz.svg_or_note(stacks.to_dot(snap))
    wsvg, wnote = (svg, note) if svg is None and note and "not on PATH" in note else \
        graphviz.svg_or_note(waitgraph.to_dot(snap))
    trace = trace_of(engine, snap, last=REPORT_POLLS, wakes=wakes)
    tnote = None
    if trace is None:
        tnote = ("no polls recorded: a one-shot look records none; `monitor async report` in a session under "
                 "capture has them")
    elif trace["otherData"]["dropped"]:
        tnote = f"the newest {trace['otherData']['polls']} polls ({trace['otherData']['dropped']} older ones not drawn)"
    return report.Figures(svg, note, wsvg, wnote, trace, tnote)


def write_report(path: str, snap: Snapshot, engine: Any, *, title: str, subtitle: str = "", wakes: Any = ()) -> str:
    figs = figures(snap, engine, wakes)
    where = _write(path, report.page(snap, figs, title=title, subtitle=subtitle).encode())
    missing = [n for n in (figs.stacks_note, figs.waits_note) if n]
    tail = f" ({missing[0]})" if missing else ""
    polls = figs.trace["otherData"]["polls"] if figs.trace is not None else 0
    return f"wrote {where}: {len(snap.live())} live tasks, {polls} polls on the timeline{tail}"
