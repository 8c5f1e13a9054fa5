"""AArch64 cores: NT_PRSTATUS (user_pt_regs), NT_FPREGSET (user_fpsimd_state), the `g`
block they are served in (rsp.regs.AARCH64_LINUX), and the file mappings of a core
without NT_FILE (qemu-aarch64 7.2 writes none: proxy/corefile/linkmap.py).

These cores are written here, so every field has a known value; what qemu-aarch64
really writes is checked on a real core in integration/test_corefile.py (where
gdb-multiarch reads the same core and must show the same pc and sp).
"""

from __future__ import annotations

import struct

import pytest

from proxy.arch import AARCH64, X86_64
from proxy.corefile.elfcore import (
    NT_AUXV, NT_FPREGSET, NT_PRPSINFO, NT_PRSTATUS, PF_R, PF_W, PF_X, CoreError, parse_core,
)
from proxy.corefile.image import core_image
from proxy.corefile.stub import CoreStub
from rsp.regs import AARCH64_LINUX, RegisterLayout
from tests.proxy.corefile.corebuild import CoreSpec, note, prpsinfo, prstatus
from tests.proxy.corefile.test_stub import ask

# user_pt_regs: x0-x30, sp, pc, pstate, 8 bytes each from pr_reg (byte 112 of elf_prstatus);
# each gets a value that tells it apart
REGS = {**{f"x{i}": 0x1000 + i for i in range(31)}, "sp": 0x55_0000_F000, "pc": 0x55_0000_1234,
        "cpsr": 0x6000_0000}


def fpsimd(fpsr: int = 0x8000_0010, fpcr: int = 0x0300_0000) -> bytes:
    """user_fpsimd_state: v0-v31 (16 bytes each), fpsr, fpcr, 8 reserved bytes."""
    return b"".join(bytes([i]) * 16 for i in range(32)) + struct.pack("<II", fpsr, fpcr) + bytes(8)


def a64_spec(notes: list[bytes], segments: list[tuple[int, int, bytes, int]] | None = None) -> CoreSpec:
    return CoreSpec(segments=segments or [(0x55_0000_E000, 0x2000, b"\x55" * 0x2000, PF_R | PF_W)],
                    notes=notes, e_machine=183)


def test_the_sizes_are_the_kernels() -> None:
    # sizeof/offsetof from Debian's aarch64-linux-gnu glibc 2.36 headers (a program built with
    # aarch64-linux-gnu-gcc, run under qemu-aarch64): elf_prstatus 392 (pr_reg 112,
    # pr_fpvalid 384), elf_fpregset_t 528; x86-64's 336 and 512
    assert (AARCH64.core.prstatus_size, AARCH64.core.fpregs_size, len(AARCH64.core.gregs)) == (392, 528, 34)
    assert 112 + 8 * len(AARCH64.core.gregs) == 384
    assert (X86_64.core.prstatus_size, X86_64.core.fpregs_size, len(X86_64.core.gregs)) == (336, 512, 27)
    assert len(fpsimd()) == AARCH64.core.fpregs_size


@pytest.mark.parametrize("name, at", [
    ("x0", 112), ("x19", 264), ("x29", 344), ("x30", 352), ("sp", 360), ("pc", 368), ("cpsr", 376),
])
def test_user_pt_regs_in_elf_prstatus(name: str, at: int) -> None:
    """Each register read from its byte in elf_prstatus (asm/ptrace.h's user_pt_regs at
    pr_reg, 112), written here by offset, not through the reader's own list."""
    desc = bytearray(392)
    struct.pack_into("<i", desc, 32, 7)  # pr_pid
    struct.pack_into("<Q", desc, at, 0xA5A5_0000_0000 + at)
    core = parse_core(a64_spec([note(b"CORE", NT_PRSTATUS, bytes(desc))]).build())
    assert {k: v for k, v in core.threads[0].regs.items() if v} == {name: 0xA5A5_0000_0000 + at}


@pytest.mark.parametrize("name, regnum, offset", [
    ("x0", 0, 0), ("x8", 8, 64), ("x29", 29, 232), ("x30", 30, 240), ("sp", 31, 248), ("pc", 32, 256),
    ("cpsr", 33, 264), ("v0", 34, 268), ("v31", 65, 764), ("fpsr", 66, 780), ("fpcr", 67, 784),
])
def test_gdbs_aarch64_block(name: str, regnum: int, offset: int) -> None:
    """gdb's numbering and `g` offsets of the aarch64 core and fpu features, and the live
    path's (proxy/arch: QEMU's 268-byte block) for x0-pc."""
    reg = AARCH64_LINUX.register(name)
    assert (reg.regnum, reg.offset) == (regnum, offset)
    if name in dict((n, 0) for n, _, _ in AARCH64.regs):
        assert (AARCH64.regnum(name), AARCH64.g_offset(name)) == (regnum, offset)


def test_target_description_describes_the_block() -> None:
    files = AARCH64.core.target_xml()
    layout = RegisterLayout.from_target_xml(files["target.xml"], files)
    assert layout.architecture == "aarch64" and layout.size == AARCH64_LINUX.size == 788
    assert [(r.name, r.regnum, r.offset, r.bitsize) for r in layout.registers] == \
        [(r.name, r.regnum, r.offset, r.bitsize) for r in AARCH64_LINUX.registers]
    assert 'name="org.gnu.gdb.aarch64.core"' in files["aarch64-core.xml"]
    assert 'name="org.gnu.gdb.aarch64.fpu"' in files["aarch64-fpu.xml"]


@pytest.mark.parametrize("fp", [True, False])
def test_registers_from_the_notes(fp: bool) -> None:
    notes = [note(b"CORE", NT_PRSTATUS, prstatus(7, REGS, signal=6, arch=AARCH64))]
    if fp:
        notes.append(note(b"CORE", NT_FPREGSET, fpsimd()))
    notes.append(note(b"CORE", NT_PRSTATUS, prstatus(8, {"pc": 0x55_0000_2000, "sp": 0x55_0000_E800},
                                                     arch=AARCH64)))
    data = a64_spec(notes).build()
    core = parse_core(data)
    assert core.arch is AARCH64 and [t.tid for t in core.threads] == [7, 8]
    assert core.threads[0].regs == REGS and core.threads[0].signal == 6
    assert (core.threads[0].fpregs is not None) == fp and core.threads[1].fpregs is None
    image = core_image(core, data, lambda p: None)
    t = image.threads[0]
    assert (t.pc, t.sp, image.threads[1].pc) == (REGS["pc"], REGS["sp"], 0x55_0000_2000)
    g = AARCH64_LINUX.decode(t.g)
    assert {n: g[n] for n in REGS} == REGS
    if fp:
        assert g["v0"] == bytes(16) and g["v31"] == bytes([31]) * 16
        assert (g["fpsr"], g["fpcr"]) == (0x8000_0010, 0x0300_0000)
    else:  # no NT_FPREGSET (qemu-aarch64's cores): unavailable, as gdb shows it, never zero
        assert g["v0"] is None and g["fpsr"] is None and g["fpcr"] is None
    assert AARCH64_LINUX.decode(image.threads[1].g)["v0"] is None


def test_the_stub_serves_the_aarch64_block() -> None:
    notes = [note(b"CORE", NT_PRSTATUS, prstatus(7, REGS, signal=6, arch=AARCH64)),
             note(b"CORE", NT_FPREGSET, fpsimd())]
    data = a64_spec(notes).build()
    stub = CoreStub(core_image(parse_core(data), data, lambda p: None))
    assert ask(stub, b"?") == b"T06thread:7;"
    assert AARCH64_LINUX.decode(ask(stub, b"g"))["pc"] == REGS["pc"]
    assert ask(stub, b"p20") == REGS["pc"].to_bytes(8, "little").hex().encode()  # pc is register 32
    assert ask(stub, b"p21") == b"00000060"  # cpsr, 32 bits
    assert ask(stub, b"p42") == b"10000080"  # fpsr is register 66
    xml = ask(stub, b"qXfer:features:read:target.xml:0,fff")
    assert b"<architecture>aarch64</architecture>" in xml and b"aarch64-fpu.xml" in xml


@pytest.mark.parametrize("desc, message", [
    (bytes(336), "NT_PRSTATUS of 336 bytes (aarch64 has 392)"),  # an x86-64 prstatus in an aarch64 core
    (bytes(100), "NT_PRSTATUS of 100 bytes (aarch64 has 392)"),
])
def test_short_prstatus_is_corrupt(desc: bytes, message: str) -> None:
    with pytest.raises(CoreError) as err:
        parse_core(a64_spec([note(b"CORE", NT_PRSTATUS, desc)]).build(), "a.core")
    assert str(err.value) == f"a.core: corrupt: {message}"


def test_a_short_fpregset_is_left_out() -> None:
    notes = [note(b"CORE", NT_PRSTATUS, prstatus(7, REGS, arch=AARCH64)),
             note(b"CORE", NT_FPREGSET, bytes(512))]  # FXSAVE's size: not user_fpsimd_state
    assert parse_core(a64_spec(notes).build()).threads[0].fpregs is None


# -- a core without NT_FILE (qemu-aarch64's) -------------------------------------------

BIAS, LIB_BIAS, STACK = 0x55_0000_0000, 0x55_0200_0000, 0x55_0300_0000
PROG, LIB = "/work/prog", "/lib/ld-linux-aarch64.so.1"
INTERP_AT = 0x1800  # the program's PT_INTERP string, in its code segment (not in the core)


def elf(loads: list[tuple[int, int, int, int]], dynamic: int | None, size: int) -> bytearray:
    """A 64-bit little-endian AArch64 ELF file of ``size`` bytes: PT_PHDR, PT_LOADs
    (vaddr, offset, filesz, flags), PT_DYNAMIC; every other byte a function of its offset."""
    phdrs = [(6, PF_R, 64, 64, 56 * 8)] + [(1, f, o, v, n) for v, o, n, f in loads]
    if dynamic is not None:
        phdrs.append((2, PF_R | PF_W, dynamic - 0x1000, dynamic, 0x40))
    data = bytearray((i * 7) & 0xFF for i in range(size))
    data[:64] = (b"\x7fELF\x02\x01\x01" + bytes(9)
                 + struct.pack("<HHIQQQIHHHHHH", 3, 183, 1, 0x400, 64, 0, 0, 64, 56, len(phdrs), 64, 0, 0))
    for i, (t, f, o, v, n) in enumerate(phdrs):
        struct.pack_into("<IIQQQQQQ", data, 64 + 56 * i, t, f, o, v, v, n, n, 0x1000)
    return data


def linked_core() -> tuple[bytes, dict[str, bytes]]:
    prog = elf([(0, 0, 0x2000, PF_R | PF_X), (0x3000, 0x2000, 0x1000, PF_R | PF_W)], 0x3000, 0x3000)
    prog[INTERP_AT:INTERP_AT + len(LIB) + 1] = LIB.encode() + b"\0"
    lib = elf([(0, 0, 0x1000, PF_R | PF_X)], None, 0x1000)
    # the program's writable segment (in the core): .dynamic, r_debug, two link_maps
    rw = bytearray(0x1000)
    r_debug, lm1, lm2, empty = BIAS + 0x3100, BIAS + 0x3200, BIAS + 0x3300, BIAS + 0x3400
    struct.pack_into("<QQQQ", rw, 0, 21, r_debug, 0, 0)  # DT_DEBUG, DT_NULL
    struct.pack_into("<iiQ", rw, 0x100, 1, 0, lm1)  # r_version, r_map
    struct.pack_into("<QQQQQ", rw, 0x200, BIAS, empty, 0, lm2, 0)  # the program: no name
    struct.pack_into("<QQQQQ", rw, 0x300, LIB_BIAS, BIAS + INTERP_AT, 0, 0, lm1)  # ld.so: named by PT_INTERP
    stack = bytearray(0x1000)
    stack[0x800:0x800 + len(PROG) + 1] = PROG.encode() + b"\0"
    auxv = struct.pack("<10Q", 3, BIAS + 64, 6, 0x1000, 9, BIAS + 0x400, 31, STACK + 0x800, 0, 0)
    spec = a64_spec(
        [note(b"CORE", NT_PRSTATUS, prstatus(7, {"pc": LIB_BIAS + 0x10, "sp": STACK + 0x100}, 6, AARCH64)),
         note(b"CORE", NT_PRPSINFO, prpsinfo(7, "prog", "prog mt")), note(b"CORE", NT_AUXV, auxv)],
        # as qemu-aarch64 writes them: no bytes for the files' code, the writable ones whole
        [(BIAS, 0x2000, b"", PF_R | PF_X), (BIAS + 0x3000, 0x1000, bytes(rw), PF_R | PF_W),
         (LIB_BIAS, 0x1000, b"", PF_R | PF_X), (STACK, 0x1000, bytes(stack), PF_R | PF_W)])
    return spec.build(), {PROG: bytes(prog), LIB: bytes(lib)}


def test_mappings_from_the_dynamic_linkers_list() -> None:
    """No NT_FILE: the program from AT_EXECFN and AT_PHDR, the libraries from the program's
    DT_DEBUG -> r_debug -> link_map chain; the dynamic linker's own name is its PT_INTERP
    string, in the program's code, which only the program's file holds."""
    data, files = linked_core()
    image = core_image(parse_core(data), data, files.get)
    assert image.exec_file == PROG
    assert [(r.start, r.end, r.perms, r.path) for r in image.regions] == [
        (BIAS, BIAS + 0x2000, "r-x", PROG), (BIAS + 0x3000, BIAS + 0x4000, "rw-", PROG),
        (LIB_BIAS, LIB_BIAS + 0x1000, "r-x", LIB), (STACK, STACK + 0x1000, "rw-", "")]
    assert image.read(BIAS + 0x1000, 16) == files[PROG][0x1000:0x1010]  # code: from the file
    assert image.read(LIB_BIAS + 0x10, 4) == files[LIB][0x10:0x14]
    assert image.read(BIAS + 0x3000, 8) == (21).to_bytes(8, "little")  # the core's bytes first


def test_elf_replaces_the_program_and_missing_files_are_left_out() -> None:
    data, files = linked_core()
    image = core_image(parse_core(data), data, {"/other": files[PROG]}.get, elf="/other")
    assert image.exec_file == "/other"
    assert [r.path for r in image.regions] == ["/other", "/other", "", ""]  # the library is not here
    assert image.read(LIB_BIAS + 0x10, 4) is None
    nothing = core_image(parse_core(data), data, lambda p: None)
    assert nothing.exec_file == PROG and {r.path for r in nothing.regions} == {""}


def test_a_link_map_cycle_ends() -> None:
    data, files = linked_core()
    bad = bytearray(data)
    at = bad.find(struct.pack("<QQ", LIB_BIAS, BIAS + INTERP_AT))
    struct.pack_into("<Q", bad, at + 24, BIAS + 0x3200)  # ld.so's l_next back to the program
    image = core_image(parse_core(bytes(bad)), bytes(bad), files.get)
    assert [r.path for r in image.regions].count(LIB) == 1
