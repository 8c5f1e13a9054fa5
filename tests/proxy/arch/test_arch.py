"""Architecture facts (proxy/arch) against the layouts stubs describe."""

from __future__ import annotations

from pathlib import Path

from proxy.arch import AARCH64, X86_64, for_layout, for_machine, machine_of
from rsp.regs import AMD64_LINUX_NOXML, AMD64_PC_REGNUM, AMD64_SP_REGNUM, RegisterLayout

# gdb's aarch64-core.xml as QEMU 7.2's gdbstub serves it (its `g` block is 268 bytes:
# x0-x30, sp, pc and a 32-bit cpsr)
AARCH64_CORE = """<?xml version="1.0"?>
<!DOCTYPE target SYSTEM "gdb-target.dtd">
<target><architecture>aarch64</architecture><feature name="org.gnu.gdb.aarch64.core">
""" + "".join(f'<reg name="x{i}" bitsize="64"/>' for i in range(31)) + """
<reg name="sp" bitsize="64" type="data_ptr"/><reg name="pc" bitsize="64" type="code_ptr"/>
<reg name="cpsr" bitsize="32"/></feature></target>"""


def test_x86_64_facts_match_gdbs_amd64_layout() -> None:
    assert X86_64.regnum("rip") == AMD64_PC_REGNUM and X86_64.regnum("rsp") == AMD64_SP_REGNUM
    for name, num, off in X86_64.regs:
        assert AMD64_LINUX_NOXML.regnum_of(name) == num and AMD64_LINUX_NOXML.offset_of(name) == off
    assert X86_64.dwarf[X86_64.ra_column] == "rip" and X86_64.dwarf[7] == "rsp"
    assert for_layout(AMD64_LINUX_NOXML) == X86_64


def test_aarch64_from_the_stubs_target_xml() -> None:
    layout = RegisterLayout.from_target_xml(AARCH64_CORE)
    assert layout.size == 268
    arch = for_layout(layout)
    assert arch is not None and arch.name == "aarch64"
    assert (arch.regnum("pc"), arch.g_offset("pc")) == (32, 256)  # x16 sits at amd64's rip offset 128
    assert (arch.regnum("sp"), arch.g_offset("sp")) == (31, 248)
    assert arch.g_offset("x30") == 240 and arch == AARCH64
    g = bytes(range(256)) + (0x5500001234).to_bytes(8, "little") + bytes(4)
    assert arch.read_g(g, "pc") == 0x5500001234


def test_calling_convention_and_dwarf() -> None:
    # SysV: an sret pointer goes first and pushes self to rsi; AAPCS64 passes it in x8
    assert X86_64.self_register(sret=True) == "rsi" and X86_64.self_register(sret=False) == "rdi"
    assert AARCH64.self_register(sret=True) == "x0"
    assert AARCH64.dwarf[31] == "sp" and AARCH64.dwarf[AARCH64.ra_column] == AARCH64.lr == "x30"
    assert AARCH64.bp_insn == (0xD4200000).to_bytes(4, "little")  # brk #0


def test_machine_from_the_elf_header(tmp_path: Path) -> None:
    assert for_machine(machine_of("/bin/true")) == X86_64
    fake = tmp_path / "a64"
    fake.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x03\x00" + (183).to_bytes(2, "little") + bytes(44))
    assert for_machine(machine_of(str(fake))) == AARCH64
    assert machine_of(str(tmp_path / "missing")) is None
    assert AARCH64.unsupported("hidden breakpoints").endswith("this program is aarch64 (EM_AARCH64)")


def test_capture_is_refused_on_a_cpu_whose_code_is_not_analysed(tmp_path: Path) -> None:
    """A program of a CPU whose code the analysis does not decode would trap at the proxy's
    own breakpoints forever (pc read at another CPU's offset, rets not found): the session
    runs it in mode off and says why (proxy/session/lifecycle.py). AArch64's code is
    decoded (analysis/exits_aarch64.py): its capture runs, with its pc, sp and kind."""
    from proxy.session.lifecycle import _program_arch

    def elf(machine: int) -> str:
        fake = tmp_path / f"m{machine}"
        fake.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x03\x00" + machine.to_bytes(2, "little") + bytes(44))
        return str(fake)

    assert _program_arch("/bin/true") == (X86_64, None) and _program_arch(None) == (None, None)
    assert _program_arch(elf(183)) == (AARCH64, None)
    arch, refused = _program_arch(elf(0x9999))
    assert arch is None and refused == "hidden breakpoints and probes: x86-64 only so far; this program is EM_39321"
