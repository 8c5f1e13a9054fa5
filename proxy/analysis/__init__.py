"""Binary analysis: ELF symbols, DWARF coroutine layouts, exits, lines, CFI unwinding, cache.

Entry points: ``inventory.build_inventory(path)``, ``lines.SourceMap(elf)``,
``unwind.Unwinder(elf, bias)``, ``elf.open_elf``/``load_bias``,
``report.inspect_main``. Everything returned is a ``model`` object.
"""

from .errors import AnalysisError

__all__ = ["AnalysisError"]
