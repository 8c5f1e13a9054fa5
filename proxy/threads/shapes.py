"""Frame shapes of resume functions: the CFI row and where DWARF looks for ``self``.

``ShapeReader.shape(link_pc)`` answers, for a pc in a resume function,
the CFA rule and saved-register slots of its ``.eh_frame`` row
(``proxy.analysis.unwind``), and every place the function's variables in
scope at that pc read the coroutine's address from:

* the ``self`` parameter (``Pin<&mut ENV>``, no name): ``DW_OP_fbreg N`` (a
  stack slot holding the pointer), ``DW_OP_bregR N``, or ``DW_OP_regR``;
* the coroutine's locals, which rustc describes as ``DW_OP_fbreg N;
  DW_OP_deref; DW_OP_plus_uconst OFF``: a spilled copy of ``self`` at fbreg N
  (checked on rustc 1.95 debug: lock_ab's locals deref fbreg 0x360 while its
  ``self`` parameter sits at fbreg 0x358).

Both slots receive the coroutine's address in the synthetic frame. Memoized
per pc; the DWARF comes from the reflection source's ``StackFinder``.
"""

from __future__ import annotations

from proxy.analysis import dies as D
from proxy.analysis.unwind import DWARF_REGS
from proxy.reflect.stacks import StackFinder, _variables

from .stack import FrameShape


def _base_of(expr: bytes) -> str | None:
    """A frame base expression -> the register (or "cfa") it names."""
    if len(expr) == 1 and 0x50 <= expr[0] <= 0x50 + 16:
        return DWARF_REGS[expr[0] - 0x50]
    if expr == b"\x9c":
        return "cfa"
    return None


def slot_of(expr: bytes, fbase: str | None) -> tuple[str, tuple[str, int] | None, bool]:
    """A location expression's first step: ("slot", (base, offset), deref follows),
    ("reg", (name, 0), False), or ("", None, False) when it is neither."""
    if not expr:
        return "", None, False
    op = expr[0]
    if 0x50 <= op <= 0x6F:
        n = op - 0x50
        return ("reg", (DWARF_REGS[n], 0), False) if n < len(DWARF_REGS) else ("", None, False)
    try:
        if op == 0x91 and fbase is not None:
            off, pos = D._sleb(expr, 1)
            return "slot", (fbase, off), expr[pos:pos + 1] == b"\x06"
        if 0x70 <= op <= 0x8F and op - 0x70 < len(DWARF_REGS):
            off, pos = D._sleb(expr, 1)
            return "slot", (DWARF_REGS[op - 0x70], off), expr[pos:pos + 1] == b"\x06"
    except IndexError:
        pass
    return "", None, False


class ShapeReader:
    def __init__(self, finder: StackFinder) -> None:
        self.finder = finder
        self._memo: dict[int, FrameShape | None] = {}

    def shape(self, pc: int) -> FrameShape | None:
        if pc not in self._memo:
            try:
                self._memo[pc] = self._read(pc)
            except Exception:  # noqa: BLE001 - odd CFI or DWARF: this frame ends the stack
                self._memo[pc] = None
        return self._memo[pc]

    def _read(self, pc: int) -> FrameShape | None:
        f = self.finder
        row = f.unwinder.row_for(pc)
        if row is None or row.cfa_expr or row.cfa_reg >= len(DWARF_REGS):
            return None
        saved = tuple((DWARF_REGS[num], n) for num, (kind, n) in sorted(row.rules.items())
                      if kind == "off" and num < len(DWARF_REGS))
        slots: list[tuple[str, int]] = []
        regs: list[str] = []
        resume = f.inv.resume_fn_at(pc)
        chain = f.map._die_chain(pc) if f.map is not None and f.dwarf is not None else []
        if chain and resume is not None:
            fb = chain[0][1].get(D.AT_FRAME_BASE)
            fbase = _base_of(fb) if isinstance(fb, bytes) else None
            for unit, die in chain:
                for var in _variables(f.dwarf, unit, die, pc):  # type: ignore[arg-type]
                    expr = f._location(unit, var, pc)
                    if expr is None:
                        continue
                    kind, where, deref = slot_of(expr, fbase)
                    if where is None:
                        continue
                    is_self = False
                    if var.tag == D.TAG_FORMAL_PARAMETER:
                        ft = f._future_type(var)
                        is_self = ft is not None and ft[0] == "pointer" and ft[1] == resume.layout_name
                    if kind == "reg" and is_self:
                        regs.append(where[0])
                    elif kind == "slot" and (deref or is_self) and where[0] in ("rsp", "rbp", "cfa"):
                        slots.append(where)
        return FrameShape(DWARF_REGS[row.cfa_reg], row.cfa_off, saved, tuple(dict.fromkeys(slots)),
                          tuple(dict.fromkeys(regs)))
