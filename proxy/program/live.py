"""Where a live session's reflection source comes from (``SessionStop.find_source``).

With a capture, the target's inventory and load bias; attached and never resumed
(no target yet), the program's file from the session (qXfer:exec-file, or
/proc/PID/exe of a process proven to be this host's) analysed here. Then the
runtime adapters the command line asked for (``--adapters``, ``--tokio-adapter``).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any


def find_source(session: Any, current: Any, adapters: str) -> Any:
    """The session's reflection source: ``current`` while it fits the target's inventory,
    else a new one (or a string saying why there is none)."""
    from proxy.reflect.source import make_source, source_without_capture

    target = session.target
    inv = getattr(target, "inventory", None)
    if current is not None and (inv is None or getattr(current, "inventory", None) is inv):
        return current
    # host-side reads (/proc/PID/exe, auxv, maps) only for a process proven to be the program's
    ident = session.identity
    local = ident.local and session.config.local_exe is not None
    if inv is not None and (target.bias or not inv.pie):
        src = make_source(inv, target.bias, local=bool(target.local))
    else:  # attached and never resumed: no target yet
        pid = ident.host_pid if local else None
        path = session.exec_file if ident.exe is None else ident.exe
        path = path or (session.config.local_exe(pid) if local and pid else None)
        # a cold analysis's cache write once the answer is out (session.after_answer)
        src = source_without_capture(path, pid, local, later=session.after_answer.append,
                                     progress=sys.stderr,  # the proxy's terminal, if it has one
                                     entry=session.lifecycle.entry)
        # What the analysis made (the image's symbols, the inventory, the walks handed to
        # stack discovery: ~110,000 objects on the axum debug build) lives as long as the
        # session: kept out of later collections (settle_heap's reason). Without this, the
        # collection the command's end let through (snapshot.build.paused_gc) walked all of
        # it before the answer went out (0.03-0.1 s). No gc.collect() first (settle_heap's):
        # the cyclic garbage made so far stays (import-time objects and pyelftools' parse
        # structures, ~1,100 objects once).
        gc.freeze()
    if adapters != "off" and not isinstance(src, str):
        from proxy.reflect.adapters import choose

        pid = getattr(target, "pid", None) if target is not None and target.local else ident.host_pid
        local = bool(target.local) if target is not None else local
        ranges, why = remote_ranges(session, local)
        found = choose(src.inventory, src.bias, pid, local, adapters, ranges, why)
        src.discover = found.discover if found.adapters else None
        src.note = found.note
    return src


def remote_ranges(session: Any, local: bool) -> tuple[Callable[[], list[tuple[int, int]]] | None, str | None]:
    """What the runtime adapters scan in a program of another host: its /proc/PID/maps as the
    stub read it at this stop (session.queries.remote_maps, read through vFile), or why there is none."""
    if local:
        return None, None
    if session.queries.remote_maps is None:
        why = session.queries.remote_maps_why or "the program is not this host's"
        return None, f"{why}: only the tasks on the threads' stacks are found"
    from proxy.host.procmem import parse_maps
    from proxy.reflect.tokio_adapter import heap_ranges_of

    return (lambda: heap_ranges_of(parse_maps(session.queries.remote_maps or ""))), None
