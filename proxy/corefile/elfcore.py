"""Parse an ELF core file (x86-64 or AArch64 Linux) from bytes: segments and notes.

Sans-IO: `parse_core(buf)` takes any buffer (bytes, mmap) and returns a
`CoreFile`; nothing here opens a file. Problems raise `CoreError` with one
line for the user (not an ELF file, not a core, truncated, a corrupt note).

What is read (checked on cores written by gdb 13.1's `gcore` and by the
Linux kernel on this machine):

* ``PT_LOAD`` segments: the bytes the core holds (``p_filesz``) and the size
  of the mapping (``p_memsz``). The kernel writes ``p_filesz = 0`` for a
  file-backed read-only mapping (the file has the bytes) and for ``PROT_NONE``
  reservations, and only the first page of a mapping that starts with an ELF
  header (its build-id); gdb's `gcore` writes those reservations in full.
* ``NT_PRSTATUS`` (one per thread, the first is the thread that took the
  signal), ``NT_FPREGSET`` (x86-64's FXSAVE, AArch64's FPSIMD registers) and
  ``NT_X86_XSTATE`` following it, ``NT_PRPSINFO``, ``NT_AUXV``, ``NT_SIGINFO``,
  ``NT_FILE``. Where the registers are in them is the CPU's (the core's
  ``e_machine``: proxy/arch/core.py).
* What qemu-aarch64 7.2 (user mode) writes for a guest killed by a signal
  (``qemu_PROG_DATE_PID.core`` in the cwd): ``NT_PRSTATUS`` for each guest
  thread (pr_cursig and pr_info's si_signo in the first only, pr_fpvalid 0),
  ``NT_PRPSINFO`` (pid and args; pr_state and pr_sname 0) and ``NT_AUXV``;
  no ``NT_FPREGSET``, ``NT_SIGINFO`` or ``NT_FILE``, and no bytes for the
  executable mappings of files (code comes from the files:
  proxy/corefile/linkmap.py finds which).
* More than 65,534 program headers (``PN_XNUM``): the real count is in
  section header 0's ``sh_info``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from proxy.analysis.elf import NoteOverrun, Segment, iter_notes  # one segment type, one note reader
from proxy.arch import ARCHES, X86_64, Arch, for_e_machine

ET_CORE = 4
PT_LOAD, PT_NOTE = 1, 4
PF_X, PF_W, PF_R = 1, 2, 4
PN_XNUM = 0xFFFF

NT_PRSTATUS, NT_FPREGSET, NT_PRPSINFO, NT_AUXV = 1, 2, 3, 6
NT_X86_XSTATE = 0x202
NT_SIGINFO = 0x53494749
NT_FILE = 0x46494C45

PR_REG_OFFSET = 112  # struct elf_prstatus's pr_reg, on every 64-bit Linux
PRPSINFO_SIZE = 136


_KNOWN = " and ".join(f"{a.name} ({a.core.e_machine})" for a in ARCHES)


class CoreError(Exception):
    """The core file cannot be used; the message is one line for the user."""


def perms(seg: Segment) -> str:
    """"rw-"-style permissions of a segment."""
    return "".join(c if seg.flags & bit else "-" for c, bit in (("r", PF_R), ("w", PF_W), ("x", PF_X)))


@dataclass(frozen=True, slots=True)
class MappedFile:
    """One NT_FILE entry: [start, end) maps `path` from byte `offset`."""

    start: int
    end: int
    offset: int
    path: str


@dataclass(slots=True)
class CoreThread:
    tid: int
    signal: int  # pr_cursig: the signal being delivered (0 when none)
    regs: dict[str, int]
    fpregs: bytes | None = None  # NT_FPREGSET (x86-64: the 512-byte FXSAVE area; AArch64: FPSIMD)
    xstate: bytes | None = None


@dataclass(slots=True)
class ProcessInfo:
    pid: int
    ppid: int
    uid: int
    state: str
    fname: str
    args: str


@dataclass(slots=True)
class CoreFile:
    size: int
    segments: list[Segment]
    threads: list[CoreThread]
    arch: Arch = X86_64  # the CPU (e_machine)
    auxv: bytes = b""
    files: list[MappedFile] = field(default_factory=list)
    process: ProcessInfo | None = None
    siginfo: tuple[int, int, int] | None = None  # (signo, code, fault address) of the dumping signal

    @property
    def pid(self) -> int | None:
        if self.process is not None and self.process.pid > 0:
            return self.process.pid
        return self.threads[0].tid if self.threads else None

    def auxv_value(self, key: int) -> int | None:
        for i in range(0, len(self.auxv) - 15, 16):
            k, v = struct.unpack_from("<QQ", self.auxv, i)
            if k == key:
                return v
            if k == 0:
                break
        return None


def parse_core(buf: bytes | memoryview, name: str = "core") -> CoreFile:
    """Parse the core in `buf`; `name` is only used in error messages."""
    size = len(buf)
    if size < 64 or bytes(buf[:4]) != b"\x7fELF":
        raise CoreError(f"{name}: not an ELF file")
    if buf[4] != 2 or buf[5] != 1:
        raise CoreError(f"{name}: not a 64-bit little-endian ELF file (only {_KNOWN} cores are supported)")
    e_type, e_machine = struct.unpack_from("<HH", buf, 16)
    if e_type != ET_CORE:
        raise CoreError(f"{name}: an ELF file but not a core dump (e_type {e_type}); give the program with --elf")
    arch = for_e_machine(e_machine)
    if arch is None:
        raise CoreError(f"{name}: a core of machine {e_machine}, only {_KNOWN} cores are supported")
    phoff, shoff = struct.unpack_from("<QQ", buf, 32)
    phentsize, phnum = struct.unpack_from("<HH", buf, 54)
    if phnum == PN_XNUM:
        if shoff == 0 or shoff + 64 > size:
            raise CoreError(f"{name}: corrupt: extended program header count, no section header 0")
        (phnum,) = struct.unpack_from("<I", buf, shoff + 44)
    if phentsize != 56 or phnum == 0:
        raise CoreError(f"{name}: corrupt: program headers of size {phentsize}, count {phnum}")
    if phoff + phnum * 56 > size:
        raise CoreError(f"{name}: truncated: {size} bytes, the program headers end at {phoff + phnum * 56}")
    segments: list[Segment] = []
    notes: list[tuple[int, int]] = []
    needed = 0
    for i in range(phnum):
        p_type, p_flags, p_offset, p_vaddr, _paddr, p_filesz, p_memsz, _align = struct.unpack_from(
            "<IIQQQQQQ", buf, phoff + i * 56)
        if p_type == PT_LOAD:
            if p_filesz > p_memsz:
                raise CoreError(f"{name}: corrupt: segment at 0x{p_vaddr:x} holds more bytes than it maps")
            segments.append(Segment(p_vaddr, p_memsz, p_offset, p_filesz, p_flags))
        elif p_type == PT_NOTE:
            notes.append((p_offset, p_filesz))
        else:
            continue
        needed = max(needed, p_offset + p_filesz)
    if needed > size:
        raise CoreError(f"{name}: truncated: {size:,} of {needed:,} bytes "
                        f"({100 * size // needed}%; the dump was cut short, e.g. by ulimit -c or a full disk)")
    if not notes:
        raise CoreError(f"{name}: corrupt: no PT_NOTE segment (no threads, no registers)")
    segments.sort(key=lambda s: s.vaddr)
    core = CoreFile(size, segments, [], arch)
    for off, length in notes:
        _parse_notes(core, bytes(buf[off:off + length]), name)
    if not core.threads:
        raise CoreError(f"{name}: corrupt: no NT_PRSTATUS note (no threads)")
    return core


def _iter_notes(data: bytes, name: str):  # type: ignore[no-untyped-def]
    try:
        yield from iter_notes(data)
    except NoteOverrun as e:
        raise CoreError(f"{name}: corrupt: note {e.kind:#x} runs past its segment") from e


def _parse_notes(core: CoreFile, data: bytes, name: str) -> None:
    for owner, ntype, desc in _iter_notes(data, name):
        if owner not in (b"CORE", b"LINUX"):
            continue  # e.g. gdb's own "GDB" target description note
        if ntype == NT_PRSTATUS and owner == b"CORE":
            core.threads.append(_prstatus(desc, name, core.arch))
        elif (ntype == NT_FPREGSET and owner == b"CORE" and core.threads
              and len(desc) >= core.arch.core.fpregs_size):
            core.threads[-1].fpregs = desc[:core.arch.core.fpregs_size]
        elif ntype == NT_X86_XSTATE and core.threads:
            core.threads[-1].xstate = desc
        elif ntype == NT_PRPSINFO and owner == b"CORE" and len(desc) >= PRPSINFO_SIZE:
            core.process = _prpsinfo(desc)
        elif ntype == NT_AUXV:
            core.auxv = desc
        elif ntype == NT_SIGINFO and len(desc) >= 24 and core.siginfo is None:
            signo, _errno, code = struct.unpack_from("<iii", desc, 0)
            core.siginfo = (signo, code, struct.unpack_from("<Q", desc, 16)[0])
        elif ntype == NT_FILE:
            core.files = _nt_file(desc, name)


def _prstatus(desc: bytes, name: str, arch: Arch) -> CoreThread:
    want, gregs = arch.core.prstatus_size, arch.core.gregs
    if len(desc) < want:
        raise CoreError(f"{name}: corrupt: NT_PRSTATUS of {len(desc)} bytes ({arch.name} has {want})")
    (cursig,) = struct.unpack_from("<h", desc, 12)
    (pid,) = struct.unpack_from("<i", desc, 32)
    values = struct.unpack_from(f"<{len(gregs)}Q", desc, PR_REG_OFFSET)
    return CoreThread(pid, cursig, dict(zip(gregs, values)))


def _prpsinfo(desc: bytes) -> ProcessInfo:
    state = desc[1:2].decode("latin-1")
    uid, _gid, pid, ppid = struct.unpack_from("<IIii", desc, 16)
    fname = desc[40:56].split(b"\0", 1)[0].decode(errors="replace")
    args = desc[56:136].split(b"\0", 1)[0].decode(errors="replace").strip()
    return ProcessInfo(pid, ppid, uid, state, fname, args)


def _nt_file(desc: bytes, name: str) -> list[MappedFile]:
    if len(desc) < 16:
        raise CoreError(f"{name}: corrupt: NT_FILE note of {len(desc)} bytes")
    count, page = struct.unpack_from("<QQ", desc, 0)
    names_at = 16 + 24 * count
    if names_at > len(desc):
        raise CoreError(f"{name}: corrupt: NT_FILE note lists {count} files in {len(desc)} bytes")
    paths = desc[names_at:].split(b"\0")
    if len(paths) < count:
        raise CoreError(f"{name}: corrupt: NT_FILE note has {len(paths)} names for {count} files")
    out = []
    for i in range(count):
        start, end, pgoff = struct.unpack_from("<QQQ", desc, 16 + 24 * i)
        out.append(MappedFile(start, end, pgoff * page, paths[i].decode(errors="replace")))
    return out
