"""Resolve `--probe REGEX` patterns to function addresses from the ELF symbol table."""

from __future__ import annotations

import re
from collections.abc import Sequence

from proxy.analysis.elf import load_bias, open_elf
from proxy.analysis.errors import AnalysisError
from proxy.probes import Probe


class ProbeResolveError(Exception):
    """The program's file could not be read or matched nothing usable."""


def resolve_probes(path: str | None, runtime_entry: int | None, patterns: Sequence[str]) -> list[Probe]:
    """Every defined function whose demangled (or raw) name matches a pattern."""
    if not patterns:
        return []
    if path is None:
        raise ProbeResolveError("the program's file is unknown: pass --elf PATH (the stub has no qXfer:exec-file)")
    try:
        elf = open_elf(path)
    except (AnalysisError, OSError) as err:
        raise ProbeResolveError(str(err)) from None
    bias = 0
    if elf.pie:
        if runtime_entry is None:
            raise ProbeResolveError("position-independent program and no auxv from the stub: load bias unknown")
        bias = load_bias(elf, runtime_entry)
    regexes = [re.compile(p) for p in patterns]
    seen: dict[int, Probe] = {}
    for sym in elf.symbols:
        if not sym.is_func or not sym.addr or sym.addr in seen:
            continue
        shown = sym.demangled
        if any(r.search(shown) or r.search(sym.name) for r in regexes):
            # The first instruction's bytes let a hidden stop emulate it and
            # resume once: the breakpoint never leaves the code. In non-stop
            # mode a step over it would leave it out while other threads run
            # by uncounted (emulate.py; a call to an unknown form still steps).
            try:
                code = elf.read(sym.addr, 8) or b""
            except AnalysisError:
                code = b""
            seen[sym.addr] = Probe(shown, sym.addr + bias, code=code)
    return sorted(seen.values(), key=lambda p: p.addr)
