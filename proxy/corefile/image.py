"""A stopped program as data: threads, registers, memory, auxv, files.

`ProgramImage` is the one interface the core stub and the one-shot commands
read a program through, whether it came from a core file (`core_image`) or
from a live process copied while it was stopped (`proxy.corefile.live`):
the drgn idea of one program object, live or dead.

Memory of a core: the bytes the core holds for each ``PT_LOAD`` segment,
then, for what it left out (read-only file mappings, the kernel keeps only
their first page), the mapped file itself at the offset ``NT_FILE`` gives
(a core without ``NT_FILE``, qemu-user's: the mappings the program's headers
and the dynamic linker's list give, linkmap.py). Files are opened through an
injected `open_file(path) -> buffer | None`, so this module does no I/O of
its own.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.arch import X86_64, Arch

from .elfcore import CoreFile, MappedFile, Segment, perms
from .linkmap import mapped_files
from .regs import g_block

Buffer = bytes | memoryview
OpenFile = Callable[[str], "Buffer | None"]

AT_PHDR, AT_ENTRY, AT_EXECFN = 3, 9, 31
MAX_HEAP_SCAN = 64 << 20  # as proxy.reflect.tokio_adapter.MAX_SCAN


@dataclass(slots=True)
class ImageThread:
    tid: int
    signal: int
    regs: dict[str, int]
    g: bytes  # hex text of the `g` block (the CPU's: arch.core.layout)
    arch: Arch = X86_64

    @property
    def pc(self) -> int:
        return self.regs.get(self.arch.pc, 0)

    @property
    def sp(self) -> int:
        return self.regs.get(self.arch.sp, 0)


@dataclass(slots=True)
class Region:
    """One piece of the address space: [start, end), perms like "rw-", its file if any."""

    start: int
    end: int
    perms: str
    path: str = ""


@dataclass(slots=True)
class ProgramImage:
    pid: int
    threads: list[ImageThread]
    read_raw: Callable[[int, int], bytes]  # the longest readable prefix (b"" when none)
    regions: list[Region]
    auxv: bytes = b""
    exec_file: str | None = None
    origin: str = ""  # "core file PATH" / "process PID"
    fault: tuple[int, int, int] | None = None  # (signo, code, address) that ended the program
    extra: dict[str, object] = field(default_factory=dict)
    arch: Arch = X86_64  # the CPU: its registers' names, its `g` block

    def read(self, addr: int, size: int) -> bytes | None:
        """Exactly `size` bytes at `addr`, or None."""
        data = self.read_raw(addr, size)
        return data if len(data) == size else None

    def thread(self, tid: int) -> ImageThread | None:
        return next((t for t in self.threads if t.tid == tid), None)

    def auxv_value(self, key: int) -> int | None:
        for i in range(0, len(self.auxv) - 15, 16):
            k = int.from_bytes(self.auxv[i:i + 8], "little")
            if k == key:
                return int.from_bytes(self.auxv[i + 8:i + 16], "little")
            if k == 0:
                break
        return None

    def heap_ranges(self, limit: int = MAX_HEAP_SCAN) -> list[tuple[int, int]]:
        """Writable anonymous memory that is not a thread's stack (where tokio's
        task cells live), at most `limit` bytes: the tokio adapter's scan."""
        stacks = [t.sp for t in self.threads]
        out: list[tuple[int, int]] = []
        total = 0
        for r in self.regions:
            if r.perms[:2] != "rw" or (r.path and r.path != "[heap]"):
                continue
            if any(r.start <= sp < r.end for sp in stacks):
                continue
            size = min(r.end - r.start, limit - total)
            if size <= 0:
                break
            out.append((r.start, r.start + size))
            total += size
        return out


def _file_at(files: list[MappedFile], addr: int) -> MappedFile | None:
    for f in files:
        if f.start <= addr < f.end:
            return f
    return None


class CoreMemory:
    """Reads of a core's address space (see the module docstring)."""

    def __init__(self, buf: Buffer, segments: list[Segment], files: list[MappedFile],
                 open_file: OpenFile) -> None:
        self.buf = buf
        self.segments = segments
        self.starts = [s.vaddr for s in segments]
        self.files = sorted(files, key=lambda f: f.start)
        self.open_file = open_file
        self._opened: dict[str, Buffer | None] = {}

    def read(self, addr: int, size: int) -> bytes:
        out = bytearray()
        while size > 0:
            piece = self._piece(addr, size)
            if not piece:
                break
            out += piece
            addr += len(piece)
            size -= len(piece)
        return bytes(out)

    def _piece(self, addr: int, size: int) -> bytes:
        i = bisect.bisect_right(self.starts, addr) - 1
        seg = self.segments[i] if i >= 0 else None
        if seg is not None and addr < seg.vaddr + seg.memsz:
            rel = addr - seg.vaddr
            if rel < seg.filesz:
                n = min(size, seg.filesz - rel)
                return bytes(self.buf[seg.offset + rel:seg.offset + rel + n])
            limit = seg.vaddr + seg.memsz - addr
        else:
            nxt = self.starts[i + 1] if i + 1 < len(self.starts) else None
            limit = (nxt - addr) if nxt is not None else size
        f = _file_at(self.files, addr)
        if f is None:
            return b""
        data = self._file(f.path)
        if data is None:
            return b""
        n = min(size, limit, f.end - addr)
        pos = f.offset + addr - f.start
        return bytes(data[pos:pos + n])

    def _file(self, path: str) -> Buffer | None:
        if path not in self._opened:
            self._opened[path] = self.open_file(path)
        return self._opened[path]


def main_program(core: CoreFile) -> str | None:
    """The program's path: the NT_FILE mapping that holds AT_ENTRY (or AT_PHDR)."""
    for key in (AT_ENTRY, AT_PHDR):
        addr = core.auxv_value(key)
        f = _file_at(core.files, addr) if addr else None
        if f is not None:
            return f.path
    return None


def core_regions(core: CoreFile, files: list[MappedFile] | None = None) -> list[Region]:
    """The address space by segment, with the file each one maps (if any; ``files``:
    NT_FILE's unless given)."""
    files = core.files if files is None else files
    out = []
    for s in core.segments:
        f = _file_at(files, s.vaddr)
        out.append(Region(s.vaddr, s.vaddr + s.memsz, perms(s), f.path if f is not None else ""))
    return out


def core_image(core: CoreFile, buf: Buffer, open_file: OpenFile, *, elf: str | None = None,
               origin: str = "core file") -> ProgramImage:
    """The program image of a parsed core; `elf` replaces the program's own file."""
    if core.files:
        program = main_program(core)
        files = core.files
        if elf is not None and program is not None:
            files = [MappedFile(f.start, f.end, f.offset, elf) if f.path == program else f for f in files]
    else:  # no NT_FILE (qemu-user): the program's headers and the dynamic linker's list say
        program, files = mapped_files(core.auxv, lambda known: CoreMemory(buf, core.segments, known, open_file).read,
                                      open_file, elf)
    mem = CoreMemory(buf, core.segments, files, open_file)
    arch = core.arch
    threads = [ImageThread(t.tid, t.signal, t.regs, g_block(t.regs, t.fpregs, arch.core), arch)
               for t in core.threads]
    exec_file = elf or program or (core.process.fname if core.process else None)
    image = ProgramImage(core.pid or 0, threads, mem.read, core_regions(core, files), core.auxv, exec_file,
                         origin, core.siginfo, arch=arch)
    image.extra["process"] = core.process
    return image
