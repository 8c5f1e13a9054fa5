"""Errors of the analysis layer.

``AnalysisError`` means the file cannot be analysed at all (not an ELF, the
header is cut off). Anything less (no DWARF, a corrupt unit, a cut-off
section) is not an exception: it becomes a line in ``Inventory.warnings``
next to a partial result.
"""

from __future__ import annotations


class AnalysisError(Exception):
    """The binary cannot be analysed; the message says why, for a user."""
