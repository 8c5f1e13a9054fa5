"""The core reader on small cores written in memory (real cores: integration/test_corefile.py)."""

from __future__ import annotations

import struct

import pytest

from proxy.corefile.elfcore import (
    NT_AUXV, NT_FILE, NT_FPREGSET, NT_PRPSINFO, NT_PRSTATUS, NT_SIGINFO, PF_R, PF_W, CoreError, parse_core,
)
from proxy.corefile.image import core_image
from tests.proxy.corefile.corebuild import CoreSpec, note, nt_file, prpsinfo, prstatus

PROG = "/bin/prog"
TEXT = bytes(range(256)) * 64  # the program's "file": 16 KiB


def spec() -> CoreSpec:
    regs = {"rip": 0x401010, "rsp": 0x7FF000, "rax": 0x1122334455667788, "fs_base": 0x7F0000001000}
    auxv = struct.pack("<8Q", 3, 0x400040, 9, 0x401000, 31, 0x7FFF00, 0, 0)
    siginfo = struct.pack("<iiiiQ", 11, 0, 1, 0, 0xDEAD) + b"\0" * 104
    return CoreSpec(
        segments=[
            (0x400000, 0x4000, TEXT[:4096], PF_R),  # first page only, like the kernel
            (0x404000, 0x1000, b"\xaa" * 0x1000, PF_R | PF_W),
            (0x7FE000, 0x2000, b"\x55" * 0x2000, PF_R | PF_W),
        ],
        notes=[
            note(b"CORE", NT_PRSTATUS, prstatus(100, regs, signal=11)),
            note(b"CORE", NT_FPREGSET, bytes(512)),
            note(b"CORE", NT_PRSTATUS, prstatus(101, {"rip": 0x401020})),
            note(b"CORE", NT_PRPSINFO, prpsinfo(100, "prog", "prog --flag")),
            note(b"CORE", NT_AUXV, auxv),
            note(b"CORE", NT_SIGINFO, siginfo),
            note(b"CORE", NT_FILE, nt_file([(0x400000, 0x404000, 0, PROG)])),
        ],
    )


def test_threads_registers_and_notes() -> None:
    core = parse_core(spec().build())
    assert [t.tid for t in core.threads] == [100, 101]
    assert core.threads[0].signal == 11 and core.threads[0].regs["rip"] == 0x401010
    assert core.threads[0].fpregs == bytes(512) and core.threads[1].fpregs is None
    assert core.process is not None and (core.process.pid, core.process.fname, core.process.args) == (
        100, "prog", "prog --flag")
    assert core.auxv_value(9) == 0x401000 and core.siginfo == (11, 1, 0xDEAD)
    assert [(f.start, f.end, f.offset, f.path) for f in core.files] == [(0x400000, 0x404000, 0, PROG)]


def test_memory_from_segments_then_the_mapped_file() -> None:
    data = spec().build()
    opened: list[str] = []

    def open_file(path: str) -> bytes | None:
        opened.append(path)
        return TEXT if path == PROG else None

    image = core_image(parse_core(data), data, open_file)
    assert image.exec_file == PROG and image.pid == 100
    assert image.read(0x400010, 4) == TEXT[16:20]  # in the core
    assert image.read(0x401ffe, 4) == TEXT[0x1ffe:0x2002]  # past the dumped page: from the file
    assert image.read_raw(0x403ffe, 4) == TEXT[0x3ffe:0x4000] + b"\xaa\xaa"
    assert image.read_raw(0x800000 - 2, 8) == b"\x55\x55"  # a partial read ends at the hole
    assert image.read_raw(0x900000, 8) == b""
    assert opened == [PROG]  # opened once
    assert image.heap_ranges() == [(0x404000, 0x405000)]  # the stack (rsp inside) is skipped


def test_elf_replaces_the_program_file() -> None:
    data = spec().build()
    image = core_image(parse_core(data), data, lambda p: TEXT[::-1] if p == "/other" else None, elf="/other")
    assert image.exec_file == "/other" and image.read(0x401000, 2) == TEXT[::-1][0x1000:0x1002]


@pytest.mark.parametrize("cut, message", [
    (lambda d: d[:len(d) - 100], "truncated"),
    (lambda d: d[:40], "not an ELF file"),
    (lambda d: b"\x7fELF" + d[4:16] + struct.pack("<H", 2) + d[18:], "not a core dump"),
    (lambda d: d[:18] + struct.pack("<H", 40) + d[20:], "a core of machine 40, only x86-64 (62) and aarch64 (183)"),
    (lambda d: b"garbage" * 20, "not an ELF file"),
    (lambda d: d[:64] + b"\xff" * 56 + d[120:], "corrupt: no PT_NOTE"),
])
def test_bad_cores_are_one_line(cut, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CoreError) as err:
        parse_core(cut(spec().build()), "x.core")
    text = str(err.value)
    assert message in text and "\n" not in text and text.startswith("x.core: ")


def test_a_note_running_past_its_segment_is_corrupt() -> None:
    s = spec()
    s.notes = [note(b"CORE", NT_PRSTATUS, prstatus(1, {}))[:-40]]
    with pytest.raises(CoreError, match="corrupt"):
        parse_core(s.build())


def test_no_threads_is_corrupt() -> None:
    s = spec()
    s.notes = [note(b"CORE", NT_AUXV, b"\0" * 16)]
    with pytest.raises(CoreError, match="no NT_PRSTATUS"):
        parse_core(s.build())
