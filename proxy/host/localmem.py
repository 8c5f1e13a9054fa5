"""Read a stopped local program's data memory through /proc/PID/mem.

Reflection at a stop (monitor commands, task threads) reads the program's heap
and stacks: thousands of 4 KiB blocks for 10,000 tasks. Through the stub each
block is an ``m`` packet (8 KiB of hex, run-length encoded, decoded in Python)
and each pointer hop one more pass of the session's read loop
(``Queries.with_reads``), in which the whole snapshot is built again.

For a program that is proven to be a process of this host (proxy/host/identity.py:
the stub's auxv and AT_RANDOM bytes against /proc, the build-id; the same
checks the uprobes capture and the heap-scanning runtime adapters rely on),
the proxy reads those bytes itself: read only, one ``pread`` per block, all in
the first pass (gdbserver itself reads memory with a ``pread`` of the same file). The program is stopped by its stub (all-stop), so the bytes
are the ones ``m`` would return, with one exception: **code**. gdbserver keeps
its breakpoints (the client's ``Z0``, its own thread-event and shared-library
breakpoints, the proxy's hidden probes) inserted while the program is stopped
and hides them from ``m`` only (it puts the shadowed bytes back in ``m``
replies). /proc/PID/mem shows the ``0xcc``. So only mappings without execute
permission are read here: every breakpoint lives in an executable mapping.
Anything else (code, a range outside the maps read at this stop, a range
across two mappings, a failed or short read) returns None, and the caller
reads it through the stub as before.

A remote or unproven program never gets here (``open_local`` is only called
with a host pid that identity proved; ``--remote`` proves nothing).
"""

from __future__ import annotations

import bisect
import os

from proxy.host.procmem import read_maps


class LocalMemory:
    """One stop's reads of process ``pid``'s non-executable mappings."""

    def __init__(self, pid: int, fd: int, spans: list[tuple[int, int]], mapped: list[tuple[int, int]]) -> None:
        self.pid = pid
        self._fd = fd
        self._starts = [lo for lo, _ in spans]
        self._spans = spans
        self._mapped_starts = [lo for lo, _ in mapped]
        self._mapped = mapped
        self.bytes_read = 0
        self.refused = 0  # reads left to the stub (code, unmapped, failed)

    def read(self, addr: int, size: int) -> bytes | None:
        """The bytes, or None: not a readable data range here (the stub is asked)."""
        i = bisect.bisect_right(self._starts, addr) - 1
        if size <= 0 or i < 0 or addr + size > self._spans[i][1]:
            self.refused += 1
            return None
        try:
            data = os.pread(self._fd, size, addr)
        except (OSError, OverflowError):
            data = b""
        if len(data) != size:
            self.refused += 1
            return None
        self.bytes_read += size
        return data

    def unmapped(self, addr: int) -> bool:
        """No mapping holds ``addr``: the stub cannot read it either (gdbserver reads the
        same /proc/PID/mem), so nobody needs to ask it. A stack walk's blocks past the top
        of ``[stack]`` are such reads; asking them cost a pass of the read loop."""
        i = bisect.bisect_right(self._mapped_starts, addr) - 1
        return i < 0 or addr >= self._mapped[i][1]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def spans_of(pid: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(non-executable mappings, every mapping) of ``pid``, sorted, adjacent ones merged.
    A ``---p`` guard page is read here too: gdbserver reads memory with the same
    ``pread`` of /proc/PID/mem (its ``m`` gets what this gets; a stack scan that reaches a
    thread's guard page cost one more pass of the read loop when it was left to the stub).
    ``[vvar]``/``[vsyscall]`` are not data: the kernel's pages, not the program's."""
    data: list[tuple[int, int]] = []
    mapped: list[tuple[int, int]] = []
    for m in read_maps(pid):
        _add(mapped, m.start, m.end)
        if "x" not in m.perms and m.path not in ("[vvar]", "[vvar_vclock]", "[vsyscall]"):
            _add(data, m.start, m.end)
    return data, mapped


def _add(spans: list[tuple[int, int]], lo: int, hi: int) -> None:
    if spans and spans[-1][1] == lo:
        spans[-1] = (spans[-1][0], hi)
    else:
        spans.append((lo, hi))


def open_local(pid: int) -> LocalMemory | None:
    """A reader for this stop, or None when /proc/PID/mem or its maps cannot be read
    (another user's process, a ptrace_scope that forbids it, the process gone)."""
    try:
        data, mapped = spans_of(pid)
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except (OSError, ValueError, IndexError):
        return None
    return LocalMemory(pid, fd, data, mapped)


# x86-64's software breakpoint: what gdbserver's Z0 (and a uprobe) writes into code
_INT3 = b"\xcc"
_EM_X86_64 = 62


class LiveMemory:
    """A stopped local program's memory as the stub's ``m`` shows it, where that is sure.

    The same pread of /proc/PID/mem gdbserver answers ``m`` with; its one difference
    is a breakpoint: gdbserver shows the original bytes of the ``int3``s it inserted
    (and the uprobes capture masks its own), memory holds ``0xcc``. So a read that holds
    a ``0xcc`` byte anywhere is not answered here (None: the stub is asked), nor one that
    fails or comes short (unmapped, the kernel's pages, a process gone). No maps are
    read: every mapping is read alike, and what cannot be told goes to the stub."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def read(self, addr: int, size: int) -> bytes | None:
        try:
            data = os.pread(self._fd, size, addr)
        except (OSError, OverflowError, ValueError):
            return None
        if len(data) != size or _INT3 in data:
            return None
        return data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_live(pid: int) -> LiveMemory | None:
    """The memory of host process ``pid`` (an x86-64 program: its breakpoint byte is
    known), or None: not x86-64, or /proc/PID/mem cannot be opened."""
    try:
        with open(f"/proc/{pid}/exe", "rb") as f:
            head = f.read(20)
        if len(head) < 20 or head[:4] != b"\x7fELF" or int.from_bytes(head[18:20], "little") != _EM_X86_64:
            return None
        return LiveMemory(os.open(f"/proc/{pid}/mem", os.O_RDONLY))
    except OSError:
        return None
