"""Resolve `--probe REGEX` patterns to function addresses from the ELF symbol table."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from proxy.session.probes import Probe


class ProbeResolveError(Exception):
    """The program's file could not be read or matched nothing usable."""


def function_symbols(path: str | Path) -> tuple[list[tuple[str, int]], int, bool]:
    """(name, link address) of every defined function, the ELF entry, and PIE-ness."""
    try:
        with open(path, "rb") as fh:
            elf = ELFFile(fh)
            funcs: dict[int, str] = {}
            for name in (".symtab", ".dynsym"):
                sec = elf.get_section_by_name(name)
                if not isinstance(sec, SymbolTableSection):
                    continue
                for sym in sec.iter_symbols():
                    if sym["st_info"]["type"] == "STT_FUNC" and sym["st_value"] and sym["st_shndx"] != "SHN_UNDEF":
                        funcs.setdefault(sym["st_value"], sym.name)
            return [(n, a) for a, n in funcs.items()], elf.header["e_entry"], elf.header["e_type"] == "ET_DYN"
    except FileNotFoundError:
        raise ProbeResolveError(f"no such file: {path}") from None
    except (ELFError, OSError, ValueError) as err:
        raise ProbeResolveError(f"{path}: not a readable ELF file ({err})") from None


def resolve_probes(path: str | None, runtime_entry: int | None, patterns: Sequence[str]) -> list[Probe]:
    if not patterns:
        return []
    if path is None:
        raise ProbeResolveError("the program's file is unknown: pass --elf PATH (the stub has no qXfer:exec-file)")
    funcs, entry, pie = function_symbols(path)
    bias = 0
    if pie:
        if runtime_entry is None:
            raise ProbeResolveError("position-independent program and no auxv from the stub: load bias unknown")
        bias = runtime_entry - entry
    regexes = [re.compile(p) for p in patterns]
    demangled = _demangler()
    out = []
    for name, addr in funcs:
        shown = demangled(name)
        if any(r.search(shown) or r.search(name) for r in regexes):
            out.append(Probe(shown, addr + bias))
    return sorted(out, key=lambda p: p.addr)


def _demangler():  # type: ignore[no-untyped-def]
    try:
        from proxy.analysis.demangle import demangle  # the analysis layer's Rust demangler
    except ImportError:  # pragma: no cover - before the analysis layer lands
        return lambda n: n
    return lambda n: demangle(n) or n
