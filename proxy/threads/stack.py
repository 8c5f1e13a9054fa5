"""A synthetic stack that a debugger's own unwinder walks, one frame per coroutine.

Theory of operation: a task thread has no stack of its own (its coroutines
are suspended, their state lives in the heap). To let gdb's and lldb's
unwinders show its logical stack, the proxy lays out, in a region no process
can map (``model.REGION_BASE``), the frames the resume functions *would*
have if each polled the next one at its ``.await``:

* frame i's registers: ``rip`` = the suspend point's pc in coroutine i's
  resume function (frame 0) or the return address into it (outer frames),
  ``rsp`` = where frame i starts, and ``rbp`` where that function's CFI
  computes the CFA from rbp;
* the CFA of frame i comes from that function's CFI row at the pc (``.eh_frame``:
  ``rsp+N`` or ``rbp+16``); the caller's ``rsp`` is that CFA, and the slots
  the row names (the return address at CFA-8, a saved rbp, saved callee-saved
  registers) hold the caller's values, so the unwinder restores them;
* each frame's ``self`` lies where that function's DWARF looks for it: the
  stack slots its variables' locations name (``DW_OP_fbreg N`` of the
  ``self`` parameter, and the slots that coroutine locals dereference, a
  spilled copy of ``self``), or a register.

The outermost frame returns into the program's ``_start`` (``end_ra``), whose
CFI marks the return address undefined: gdb and lldb end the backtrace there,
as they do for a real thread. (With a zero return address gdb showed a
``0x0 in ?? ()`` frame and, for each task thread, read the program headers
through the stub looking for a dynamic-linker trampoline at pc 0.) Pure:
shapes come from the caller (``FrameShape``), nothing is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .model import REGION_STRIDE

CALLEE_SAVED = ("rbx", "rbp", "r12", "r13", "r14", "r15")
_START = 0x100  # the first frame's sp, from the region's base
_M = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class FrameShape:
    """What a resume function's CFI and DWARF say about its frame at one pc."""

    cfa_reg: str  # "rsp" or "rbp" (other CFA rules end the synthetic stack)
    cfa_off: int
    saved: tuple[tuple[str, int], ...]  # register -> offset from the CFA ("rip": the return address)
    self_slots: tuple[tuple[str, int], ...] = ()  # (base "rsp" | "rbp" | "cfa", offset): hold self
    self_regs: tuple[str, ...] = ()  # registers that hold self


@dataclass(slots=True)
class SyntheticStack:
    base: int
    regs: dict[str, int]
    data: bytearray = field(default_factory=bytearray)
    depth: int = 0  # frames laid out

    def read(self, addr: int, size: int) -> bytes | None:
        """Bytes of the region (zeros where nothing was laid out); None outside it."""
        off = addr - self.base
        if off < 0 or off + size > REGION_STRIDE or size < 0:
            return None
        chunk = bytes(self.data[off:off + size])
        return chunk + bytes(size - len(chunk))

    def _put(self, addr: int, value: int) -> None:
        off = addr - self.base
        if 0 <= off <= REGION_STRIDE - 8:
            if len(self.data) < off + 8:
                self.data.extend(bytes(off + 8 - len(self.data)))
            self.data[off:off + 8] = (value & _M).to_bytes(8, "little")


def _align16(v: int) -> int:
    return (v + 15) & ~15


def lay_out(frames: Sequence[tuple[int, int, FrameShape | None]], base: int, end_ra: int = 0) -> SyntheticStack:
    """frames: innermost first, (runtime pc, self address, shape at that pc). A frame
    whose shape is unknown, or that does not fit the region, ends the stack."""
    rsp: list[int] = []
    cfa: list[int] = []
    own_rbp: list[int | None] = []
    shapes: list[FrameShape] = []
    sp = base + _START
    for _pc, _self, shape in frames:
        if shape is None or shape.cfa_reg not in ("rsp", "rbp") or shape.cfa_off <= 0:
            break
        need = max([off + 8 for b, off in shape.self_slots if b == "rsp"] + [16])
        if shape.cfa_reg == "rsp":
            rbp = None
            top = sp + shape.cfa_off
        else:
            below = max([-off for b, off in shape.self_slots if b == "rbp"] + [0])
            rbp = _align16(sp + max(need, below + 8))
            top = rbp + shape.cfa_off
        if top - base + 64 > REGION_STRIDE:
            break
        rsp.append(sp)
        own_rbp.append(rbp)
        cfa.append(top)
        shapes.append(shape)
        sp = top
    n = len(shapes)
    pcs = [f[0] for f in frames[:n]]
    selfs = [f[1] for f in frames[:n]]
    # each callee-saved register's value in each frame, from the outermost inwards: a frame
    # that does not save a register passes its own value up unchanged, so it must already
    # hold what its caller needs
    vals: list[dict[str, int]] = [dict() for _ in range(n + 1)]
    for i in reversed(range(n)):
        saved = {r for r, _ in shapes[i].saved}
        for r in CALLEE_SAVED:
            if r == "rbp" and own_rbp[i] is not None:
                vals[i][r] = own_rbp[i]  # type: ignore[assignment]
            elif r in shapes[i].self_regs:
                vals[i][r] = selfs[i]
            elif r in saved:
                vals[i][r] = 0
            else:
                vals[i][r] = vals[i + 1].get(r, 0)
    # no frame at all (the group of tasks past the cap, a task with no resume code of its
    # own): the thread sits where a stack ends, in _start
    regs = {"rip": pcs[0] if n else end_ra, "rsp": rsp[0] if n else base + _START}
    if n:
        regs.update(vals[0])
        for r in shapes[0].self_regs:
            regs[r] = selfs[0]
    out = SyntheticStack(base, regs, depth=n)
    for i in range(n):
        for r, off in shapes[i].saved:
            if r == "rip":
                out._put(cfa[i] + off, pcs[i + 1] if i + 1 < n else end_ra)
            elif r in CALLEE_SAVED:
                out._put(cfa[i] + off, vals[i + 1].get(r, 0))
        bases = {"rsp": rsp[i], "rbp": vals[i].get("rbp", 0), "cfa": cfa[i]}
        for b, off in shapes[i].self_slots:
            out._put(bases[b] + off, selfs[i])
    return out
