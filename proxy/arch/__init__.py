"""Architecture facts: everything the proxy assumes of a target's CPU, in one object.

An `Arch` says where the registers the proxy reads are (gdb's register numbers and their
offsets in the `g` block), which registers a call passes `self` and arguments in, DWARF's
register numbering (the CFI unwinder's columns), the callee-saved set, the return-address
column, the software breakpoint (the `Z0` kind and the instruction the stub writes), the
highest user-space address, how its cores hold registers (``core``: core.py), and whether
the proxy's code analysis (capstone over the resume functions: rets, unwind exits, PLT
slots, emulated prologues) and stack unwinding know this CPU yet.

Which `Arch` a program has comes from its ELF header (``for_machine``: ``e_machine``) or
from the stub's target description (``for_layout``: rsp/regs.py's RegisterLayout parsed from
``target.xml``, whose register names tell the CPU; offsets are then the stub's own).

Facts checked here: x86-64 against gdb 13's amd64 layout (rsp/regs.py AMD64_LINUX_NOXML);
AArch64 against QEMU 7.2's ``g`` block (268 bytes: x0-x30, sp, pc, cpsr; research notes
in docs/remote.md), AAPCS64 (self and the first argument in x0, an sret pointer in x8,
x19-x29 callee-saved, the return address in x30), DWARF for AArch64 (x0-x30 = 0-30, sp
= 31) and gdb's aarch64 breakpoint (kind 4, ``brk #0`` = d4200000).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rsp.regs import RegisterLayout

from .core import AARCH64_CORE, X86_64_CORE, CoreRegs


@dataclass(frozen=True, slots=True)
class Arch:
    name: str  # "x86-64", "aarch64"
    machine: str  # the ELF e_machine name (proxy.analysis.elf)
    pc: str
    sp: str
    fp: str
    lr: str | None  # the link register (None: the return address is on the stack)
    args: tuple[str, ...]  # integer argument registers, in order (self is args[0] unless sret)
    sret: str | None  # where a large return value's pointer goes (None: args[0], shifting self)
    dwarf: tuple[str, ...]  # DWARF register number -> name, the CFI unwinder's columns
    ra_column: int  # the CFI return-address column
    callee_saved: frozenset[str]
    bp_kind: int  # the Z0 kind gdb sends
    bp_insn: bytes  # the instruction a stub writes for it
    user_limit: int  # the first address above user space
    regs: tuple[tuple[str, int, int], ...]  # (name, gdb regnum, g offset) of the registers above
    code_analysis: bool  # rets/exits/prologues are decoded for this CPU
    unwinding: bool  # the CFI unwinder and stack discovery read this CPU's frames
    core: CoreRegs  # its ELF cores' register notes and the `g` block they are served in (core.py)
    # the session's instruction-level helpers decode this CPU: emulated prologues
    # (session/emulate.py, its `G` writes) and the step follower (session/stepping.py)
    emulates: bool = False
    _by_name: dict[str, tuple[int, int]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update({n: (num, off) for n, num, off in self.regs})

    def regnum(self, name: str) -> int:
        return self._by_name[name][0]

    def g_offset(self, name: str) -> int:
        return self._by_name[name][1]

    def read_g(self, data: bytes, name: str) -> int | None:
        """Register ``name`` (64-bit) from a decoded `g` block; None when it is short."""
        off = self.g_offset(name)
        return int.from_bytes(data[off:off + 8], "little") if len(data) >= off + 8 else None

    def self_register(self, sret: bool) -> str:
        """Where `self` (the first argument) is at a function's entry; ``sret``: the function
        returns through a pointer (x86-64 passes that pointer first, AArch64 in x8)."""
        return self.args[1] if sret and self.sret is None else self.args[0]

    def unsupported(self, feature: str) -> str:
        """The line a feature this CPU does not have yet says instead of misbehaving."""
        return f"{feature}: x86-64 only so far; this program is {self.name} ({self.machine})"


_X86_GPRS = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp") + tuple(f"r{i}" for i in range(8, 16))

X86_64 = Arch(
    name="x86-64", machine="EM_X86_64", pc="rip", sp="rsp", fp="rbp", lr=None,
    args=("rdi", "rsi", "rdx", "rcx", "r8", "r9"), sret=None,
    dwarf=("rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11", "r12", "r13",
           "r14", "r15", "rip"),
    ra_column=16,
    callee_saved=frozenset({"rbx", "rbp", "r12", "r13", "r14", "r15"}),
    bp_kind=1, bp_insn=b"\xcc", user_limit=1 << 47,
    regs=tuple((n, i, 8 * i) for i, n in enumerate(_X86_GPRS)) + (("rip", 16, 128),),
    code_analysis=True, unwinding=True, core=X86_64_CORE, emulates=True,
)

AARCH64 = Arch(
    name="aarch64", machine="EM_AARCH64", pc="pc", sp="sp", fp="x29", lr="x30",
    args=tuple(f"x{i}" for i in range(8)), sret="x8",
    dwarf=tuple(f"x{i}" for i in range(31)) + ("sp",),
    ra_column=30,
    callee_saved=frozenset(f"x{i}" for i in range(19, 30)),
    bp_kind=4, bp_insn=bytes.fromhex("000020d4"), user_limit=1 << 48,
    regs=tuple((f"x{i}", i, 8 * i) for i in range(31)) + (("sp", 31, 248), ("pc", 32, 256)),
    code_analysis=True, unwinding=True, core=AARCH64_CORE,
)

ARCHES = (X86_64, AARCH64)


def for_machine(machine: str | None) -> Arch | None:
    """The Arch of an ELF ``e_machine`` name ("EM_X86_64", ...); None for a CPU not known."""
    return next((a for a in ARCHES if a.machine == machine), None)


def for_e_machine(e_machine: int) -> Arch | None:
    """The Arch of an ELF header's ``e_machine`` number (62, 183); None for another CPU."""
    return next((a for a in ARCHES if a.core.e_machine == e_machine), None)


def machine_of(path: str) -> str | None:
    """The ELF ``e_machine`` name of the file at ``path`` (its header only), or None."""
    from proxy.analysis.elf import _MACHINES

    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError:
        return None
    if head[:4] != b"\x7fELF" or len(head) < 20:
        return None
    e_machine = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    return _MACHINES.get(e_machine, f"EM_{e_machine}")


def for_layout(layout: RegisterLayout) -> Arch | None:
    """The Arch a stub's register description names (rip: x86-64; x30 and pc: AArch64), with
    the offsets of that description (a stub may order or size its `g` block its own way)."""
    names = set(layout.names)
    arch = X86_64 if "rip" in names else AARCH64 if {"x30", "pc", "sp"} <= names else None
    if arch is None:
        return None
    regs = tuple((n, layout.regnum_of(n), layout.offset_of(n)) for n, _, _ in arch.regs if n in names)
    return Arch(**{f: getattr(arch, f) for f in arch.__dataclass_fields__ if f not in ("regs", "_by_name")},
                regs=regs)
