"""Write small x86-64 and AArch64 ELF core files in memory, for the reader's unit tests
(the real gcore, kernel and qemu-aarch64 cores are in integration/test_corefile.py)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from proxy.arch import X86_64, Arch


def note(owner: bytes, ntype: int, desc: bytes) -> bytes:
    name = owner + b"\0"
    pad = lambda b: b + b"\0" * (-len(b) % 4)  # noqa: E731
    return struct.pack("<III", len(name), len(desc), ntype) + pad(name) + pad(desc)


def prstatus(tid: int, regs: dict[str, int], signal: int = 0, arch: Arch = X86_64) -> bytes:
    """struct elf_prstatus: pr_cursig at 12, pr_pid at 32, pr_reg at 112 (the CPU's registers)."""
    gregs = arch.core.gregs
    d = bytearray(arch.core.prstatus_size)
    struct.pack_into("<h", d, 12, signal)
    struct.pack_into("<i", d, 32, tid)
    struct.pack_into(f"<{len(gregs)}Q", d, 112, *(regs.get(n, 0) for n in gregs))
    return bytes(d)


def prpsinfo(pid: int, fname: str, args: str) -> bytes:
    d = bytearray(136)
    d[1:2] = b"R"
    struct.pack_into("<IIii", d, 16, 0, 0, pid, 1)
    d[40:40 + len(fname)] = fname.encode()
    d[56:56 + len(args)] = args.encode()
    return bytes(d)


def nt_file(entries: list[tuple[int, int, int, str]], page: int = 4096) -> bytes:
    out = struct.pack("<QQ", len(entries), page)
    for start, end, off, _ in entries:
        out += struct.pack("<QQQ", start, end, off // page)
    return out + b"".join(p.encode() + b"\0" for _, _, _, p in entries)


@dataclass
class CoreSpec:
    segments: list[tuple[int, int, bytes, int]] = field(default_factory=list)  # vaddr, memsz, data, flags
    notes: list[bytes] = field(default_factory=list)
    e_type: int = 4
    e_machine: int = 62

    def build(self) -> bytes:
        phnum = 1 + len(self.segments)
        notes = b"".join(self.notes)
        off = 64 + 56 * phnum
        phdrs = struct.pack("<IIQQQQQQ", 4, 0, off, 0, 0, len(notes), 0, 4)
        body = notes
        pos = off + len(notes)
        for vaddr, memsz, data, flags in self.segments:
            phdrs += struct.pack("<IIQQQQQQ", 1, flags, pos, vaddr, 0, len(data), memsz, 4096)
            body += data
            pos += len(data)
        ident = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
        ehdr = ident + struct.pack("<HHIQQQIHHHHHH", self.e_type, self.e_machine, 1, 0, 64, 0, 0, 64, 56, phnum, 64, 0, 0)
        return ehdr + phdrs + body
