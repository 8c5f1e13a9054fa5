"""Copy a live process while it is stopped for as short a time as possible.

Theory of operation
-------------------
`LiveProcess(pid)` does everything that needs no stop first: it reads
``/proc/PID/maps`` (what to copy), ``/proc/PID/auxv`` and the program's path,
and opens ``/proc/PID/mem``. `snapshot()` then stops every thread with
``PTRACE_SEIZE`` + ``PTRACE_INTERRUPT`` (no signal is sent: nothing of the
program's own signal state changes; threads born meanwhile are seized too),
reads each thread's registers (``PTRACE_GETREGS``, ``PTRACE_GETFPREGS``),
copies the memory the analysis will read, and detaches every thread
(``PTRACE_DETACH``); the time between the first interrupt and the last
detach is the stopped time. Should this process die in between, the kernel
detaches its tracees and they run on: a seize leaves nothing behind.

What is copied (the same as what a kernel core keeps, by the same rules):
every readable mapping that is writable or private and not executable,
except file mappings of files that are not loaded code (locale archives,
data files: their bytes are the file's); a thread's stack only from its
stack pointer (minus the red zone) up. Executable and read-only code
mappings are read from their files afterwards. The result is a
`ProgramImage` whose memory is the copy: everything after the stop
(reflection, the tokio adapter's heap scan, stack discovery) reads the copy
while the program runs on.
"""

from __future__ import annotations

import ctypes
import os
import struct
import time

from proxy.analysis.elf import Segment

from proxy.arch.core import USER_REGS  # this host's CPU: x86-64 (PTRACE_GETREGS; AArch64 has only GETREGSET)

from .elfcore import MappedFile
from .image import CoreMemory, ImageThread, ProgramImage, Region
from .load import map_file
from proxy.host.procmem import Mapping, read_maps  # noqa: F401  (read_maps: the one /proc/PID/maps reader)

from .regs import g_block

PTRACE_GETREGS, PTRACE_GETFPREGS, PTRACE_DETACH = 12, 14, 17
PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4206, 0x4207
WALL = 0x40000000  # __WALL: wait for any child, thread or not
RED_ZONE = 128
MAX_COPY = 1 << 30


class LiveError(Exception):
    """The process cannot be snapshotted; one line for the user."""


def to_copy(maps: list[Mapping]) -> list[Mapping]:
    """The mappings whose bytes may differ from their file (see the module docstring)."""
    code_files = {m.path for m in maps if "x" in m.perms and m.path.startswith("/")}
    out = []
    for m in maps:
        if m.perms[0] != "r" or m.path in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
            continue
        if "x" in m.perms and m.path.startswith("/"):
            continue  # code: from the file
        if m.path.startswith("/") and "w" not in m.perms and m.path not in code_files:
            continue  # a read-only data file: its bytes are the file's
        out.append(m)
    return out


class _Ptrace:
    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fn = libc.ptrace
        self.fn.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        self.fn.restype = ctypes.c_long

    def __call__(self, req: int, tid: int, addr: int = 0, data: object = None) -> None:
        if self.fn(req, tid, addr, data) == -1:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))


class LiveProcess:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self.exe = os.readlink(f"/proc/{pid}/exe")
            with open(f"/proc/{pid}/auxv", "rb") as fh:
                self.auxv = fh.read()
            self.maps = read_maps(pid)
            self.mem_fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        except FileNotFoundError:
            raise LiveError(f"no process {pid}") from None
        except PermissionError:
            raise LiveError(f"process {pid}: permission denied (run as its user or root)") from None
        if self.exe.endswith(" (deleted)"):
            self.exe = f"/proc/{pid}/exe"
        self.copy = to_copy(self.maps)
        self.ptrace = _Ptrace()

    def close(self) -> None:
        os.close(self.mem_fd)

    def snapshot(self) -> ProgramImage:
        """Stop, read, detach (see the module docstring)."""
        seized: list[int] = []
        regs: dict[int, tuple[dict[str, int], bytes | None]] = {}
        t0 = time.monotonic_ns()
        try:
            self._stop_all(seized)
            stopped_at = time.monotonic_ns()
            for tid in list(seized):
                try:
                    regs[tid] = self._registers(tid)
                except OSError:  # exited while stopped (a thread killed by another)
                    seized.remove(tid)
            segments, buf = self._copy(sp for r, _ in regs.values() for sp in [r["rsp"]])
        finally:
            for tid in seized:
                try:
                    self.ptrace(PTRACE_DETACH, tid, 0, None)
                except OSError:
                    pass  # it exited meanwhile
            t1 = time.monotonic_ns()
        if not seized:
            raise LiveError(f"process {self.pid}: no thread could be stopped")
        return self._image(seized, regs, segments, buf, stopped_ns=t1 - t0, clock_ns=stopped_at)

    def _stop_all(self, seized: list[int]) -> None:
        done: set[int] = set()
        while True:
            try:
                tids = sorted(int(t) for t in os.listdir(f"/proc/{self.pid}/task"))
            except FileNotFoundError:
                raise LiveError(f"process {self.pid} exited") from None
            new = [t for t in tids if t not in done]
            if not new:
                return
            for tid in new:
                done.add(tid)
                try:
                    self.ptrace(PTRACE_SEIZE, tid, 0, None)
                except OSError as err:
                    if err.errno == 3:  # ESRCH: the thread exited
                        continue
                    if err.errno == 1:
                        raise LiveError(f"process {self.pid}: ptrace not permitted (another debugger attached, "
                                        "or /proc/sys/kernel/yama/ptrace_scope forbids it)") from None
                    raise LiveError(f"process {self.pid}: ptrace: {err.strerror}") from None
                seized.append(tid)
                try:
                    self.ptrace(PTRACE_INTERRUPT, tid, 0, None)
                except OSError:  # it exited between the seize and the interrupt
                    seized.remove(tid)
            for tid in new:
                if tid in seized:
                    try:
                        os.waitpid(tid, WALL)
                    except ChildProcessError:  # it exited before it stopped
                        seized.remove(tid)

    def _registers(self, tid: int) -> tuple[dict[str, int], bytes | None]:
        gp = ctypes.create_string_buffer(8 * len(USER_REGS))
        self.ptrace(PTRACE_GETREGS, tid, 0, gp)
        fp = ctypes.create_string_buffer(512)
        try:
            self.ptrace(PTRACE_GETFPREGS, tid, 0, fp)
            fx: bytes | None = fp.raw
        except OSError:
            fx = None
        return dict(zip(USER_REGS, struct.unpack(f"<{len(USER_REGS)}Q", gp.raw))), fx

    def _copy(self, sps) -> tuple[list[Segment], bytearray]:  # type: ignore[no-untyped-def]
        sps = list(sps)
        buf = bytearray()
        segments = []
        for m in self.copy:
            lo = m.start
            for sp in sps:
                if m.start <= sp < m.end:
                    lo = max(m.start, (sp - RED_ZONE) & ~0xFFF)
            size = m.end - lo
            if len(buf) + size > MAX_COPY:
                continue
            try:
                data = os.pread(self.mem_fd, size, lo)
            except OSError:
                continue
            segments.append(Segment(lo, m.end - lo, len(buf), len(data), _flags(m.perms)))
            buf += data
        return segments, buf

    def _image(self, tids: list[int], regs: dict[int, tuple[dict[str, int], bytes | None]],
               segments: list[Segment], buf: bytearray, *, stopped_ns: int, clock_ns: int) -> ProgramImage:
        files = [MappedFile(m.start, m.end, m.offset, m.path) for m in self.maps if m.path.startswith("/")]
        mem = CoreMemory(memoryview(bytes(buf)), sorted(segments, key=lambda s: s.vaddr), files, map_file)
        main = tids[0] if self.pid not in tids else self.pid
        order = [main, *[t for t in tids if t != main]]
        threads = [ImageThread(t, 0, regs[t][0], g_block(*regs[t])) for t in order]
        regions = [Region(m.start, m.end, m.perms[:3], m.path) for m in self.maps]
        image = ProgramImage(self.pid, threads, mem.read, regions, self.auxv, self.exe, f"process {self.pid}")
        image.extra.update(clock_ns=clock_ns, stopped_ns=stopped_ns, copied=len(buf), copied_regions=len(segments))
        return image


def _flags(perms: str) -> int:
    return (4 if "r" in perms else 0) | (2 if "w" in perms else 0) | (1 if "x" in perms else 0)
