"""What a live snapshot copies while the program is stopped (the rest is read from files)."""

from __future__ import annotations

from proxy.corefile.live import Mapping, to_copy


def test_copies_what_may_differ_from_the_files() -> None:
    maps = [
        Mapping(0x1000, 0x2000, "r--p", 0, "/bin/prog"),  # ELF header, rodata of loaded code: copied (relocations)
        Mapping(0x2000, 0x5000, "r-xp", 0x1000, "/bin/prog"),  # code: from the file
        Mapping(0x5000, 0x6000, "rw-p", 0x4000, "/bin/prog"),  # data
        Mapping(0x7000, 0x9000, "rw-p", 0, "[heap]"),
        Mapping(0x9000, 0x100000, "---p", 0, ""),  # a reservation: unreadable
        Mapping(0x100000, 0x200000, "rw-p", 0, ""),  # an arena, a thread stack
        Mapping(0x200000, 0x300000, "r--p", 0, "/usr/lib/locale/locale-archive"),  # a data file: from the file
        Mapping(0x300000, 0x301000, "r--p", 0, "/usr/lib/libc.so.6"),
        Mapping(0x301000, 0x302000, "r-xp", 0x1000, "/usr/lib/libc.so.6"),
        Mapping(0x400000, 0x401000, "r--p", 0, "[vvar]"),
        Mapping(0x401000, 0x402000, "r-xp", 0, "[vdso]"),
    ]
    got = [(m.start, m.path) for m in to_copy(maps)]
    assert got == [(0x1000, "/bin/prog"), (0x5000, "/bin/prog"), (0x7000, "[heap]"), (0x100000, ""),
                   (0x300000, "/usr/lib/libc.so.6"), (0x401000, "[vdso]")]
