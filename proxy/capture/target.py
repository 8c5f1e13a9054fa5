"""The program as the session finds it at the first resume.

Theory of operation: before the program first runs under the proxy, the
session learns the program's file (`qXfer:exec-file`, `--elf`, or
`/proc/PID/exe`), its pid and its PIE load bias (AT_ENTRY from auxv). From
that it opens one `Target`: the inventory, the bias and the one await-graph
`Engine`. Every capture backend feeds that engine; switching backends (or
modes) keeps it, so the graph survives `monitor async capture ...`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.analysis.model import Inventory, SourceLoc
from proxy.arch import X86_64, Arch, for_machine, machine_of
from proxy.graph.catalog import Catalog
from proxy.graph.engine import Engine


@dataclass(slots=True)
class Target:
    path: str | None
    pid: int | None
    local: bool  # the program runs on the proxy's host (its /proc is ours)
    stub_features: frozenset[str] = frozenset()
    inventory: Inventory | None = None
    bias: int = 0
    engine: Engine | None = None
    note: str | None = None  # why there is no graph, if so
    extra: dict[str, object] = field(default_factory=dict)  # backend-private facts
    # proxy.host.identity.Identity: `pid` is the host's pid when local; host_pid_of(stub pid)
    # gives a fork child's host pid (None: not this host's, never touched)
    identity: Any = None
    arch: Arch = X86_64  # the program's CPU (its ELF header): where the capture's registers are


def open_target(
    path: str | None,
    runtime_entry: int | None,
    pid: int | None,
    *,
    local: bool,
    stub_features: frozenset[str],
    load_inventory: Callable[[str], Inventory],
) -> Target:
    """Build the target; problems with the file come back in `note`."""
    t = Target(path, pid, local, stub_features)
    if path is None:
        t.note = "the program's file is unknown (pass --elf)"
        return t
    t.arch = for_machine(machine_of(path)) or X86_64
    try:
        inv = load_inventory(path)
    except Exception as err:  # noqa: BLE001 - a file problem is an answer, not a crash
        t.note = f"cannot analyse {path}: {err}"
        return t
    t.inventory = inv
    if inv.pie:
        if runtime_entry is None:
            t.note = "position-independent program and no auxv from the stub: load bias unknown"
            return t
        t.bias = runtime_entry - inv.entry
    t.engine = Engine(Catalog(inv, t.bias, line_lookup(path)))
    if not inv.resume_fns:
        t.note = "no async resume functions found" + (
            f" ({'; '.join(inv.warnings)})" if inv.warnings else ""
        )
    return t


def line_lookup(path: str) -> Callable[[int], SourceLoc | None] | None:
    """link-time pc -> source line, from the analysis' line tables. Built at
    the first lookup: the line tables' reader (pyelftools' DWARF) is not
    imported by a session that never names a source line (a C program's)."""
    lookup: list[Callable[[int], SourceLoc | None] | None] = []

    def first(pc: int) -> SourceLoc | None:
        if not lookup:
            try:
                from proxy.analysis.elf import open_elf
                from proxy.analysis.lines import SourceMap

                lookup.append(SourceMap(open_elf(path)).pc_to_line)
            except Exception:  # noqa: BLE001 - no lines is a degraded answer, not an error
                lookup.append(None)
        fn = lookup[0]
        return fn(pc) if fn is not None else None

    return first
