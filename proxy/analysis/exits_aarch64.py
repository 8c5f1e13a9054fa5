"""A resume function's exits on AArch64: where the breakpoint capture plants its exit probes.

The x86-64 finder (exits.ExitFinder) decodes x86; this one reads A64 with capstone's
ARM64 mode (every instruction 4 bytes, so ``disasm_lite`` alone tells each one):

* rets: capstone's RET group, by mnemonic: ``ret`` (through x30, or another register),
  ``retaa``/``retab`` (pointer authentication);
* other exits: a ``bl`` to ``_Unwind_Resume`` (its PLT stub, or the function in a static
  build), and a direct branch that leaves the function (``b``, ``b.cond``, ``cbz``/``cbnz``,
  ``tbz``/``tbnz`` to a target outside it: a tail call). ``br`` through a register is a
  jump table inside the function (as x86's register-indirect ``jmp``);
* PLT stubs: ``adrp x16, PAGE; ldr x17, [x16, #OFF]; add x16, x16, #OFF; br x17`` loads
  the GOT slot ``PAGE + OFF`` (the stub starts at its ``adrp``).

Facts checked on Debian's rustc 1.63 aarch64 build of the corpus (tokio_app): every
resume function has one ``ret``; ``_Unwind_Resume`` is reached through the PLT.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .elf import ElfImage

RETS = frozenset({"ret", "retaa", "retab"})
# A64's direct branches whose last operand is the target, printed "#0x..." by capstone
_DIRECT = ("b", "cbz", "cbnz", "tbz", "tbnz")
_IMM = re.compile(r"#(0x[0-9a-f]+|\d+)$")


def _disasm(code: bytes, addr: int) -> Iterable[tuple[int, int, str, str]]:
    import capstone

    cs = capstone.Cs(capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)
    return cs.disasm_lite(code, addr)


def _target(ops: str) -> int | None:
    m = _IMM.search(ops)
    return int(m[1], 0) if m is not None else None


def exits(code: bytes, low: int, high: int, unwind_targets: set[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(rets, other exits) of the function ``[low, high)`` whose bytes are ``code``."""
    rets: list[int] = []
    other: list[int] = []
    for addr, _size, mnemonic, ops in _disasm(code, low):
        if mnemonic in RETS:
            rets.append(addr)
        elif mnemonic == "bl":
            if _target(ops) in unwind_targets:
                other.append(addr)
        elif mnemonic.split(".", 1)[0] in _DIRECT:
            target = _target(ops)
            if target is not None and not low <= target < high:
                other.append(addr)
    return tuple(rets), tuple(other)


def plt_stubs_for(elf: ElfImage, slots: set[int]) -> set[int]:
    """The PLT stubs that jump through one of the GOT ``slots`` (link-time addresses)."""
    out: set[int] = set()
    sec = elf.sections.get(".plt")
    if sec is None or not slots:
        return out
    addr, off, size = sec
    page: int | None = None
    start = 0
    for at, _size, mnemonic, ops in _disasm(elf.data[off:off + size], addr):
        if mnemonic == "adrp" and ops.startswith("x16,"):
            page, start = _target(ops), at
        elif mnemonic == "ldr" and ops.startswith("x17, [x16") and page is not None:
            m = re.search(r"#(0x[0-9a-f]+|\d+)\]$", ops)
            if page + (int(m[1], 0) if m else 0) in slots:
                out.add(start)
            page = None
    return out
