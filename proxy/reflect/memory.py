"""Bounded, block-cached reads for a reflection walk.

A monitor command reads target memory through ``read(addr, size) -> bytes |
None`` where None means "not read (yet)": the session reads every range a
pass asked for and runs the command again (``Session._proc_monitor``). To
keep the number of passes equal to the number of *pointer hops* (not of
fields), every read is widened to aligned ``BLOCK``-byte blocks: a coroutine
and everything stored inline in it (its awaitee, the awaitee's awaitee...)
come from the same blocks, read in the same pass. A block never crosses a
page, so an unmapped page fails alone. A stub may answer a block short
(packet size): the bytes it gave are used, the rest is unreadable.

``budget`` bounds the bytes one walk may touch (garbage pointers into huge
arrays cannot make the proxy read the whole address space).
"""

from __future__ import annotations

from collections.abc import Callable

ReadMemory = Callable[[int, int], "bytes | None"]

BLOCK = 4096
MAX_ADDR = 1 << 47  # user space on x86-64


class Budget(Exception):
    """The walk touched more memory than allowed."""


class BlockReader:
    def __init__(self, read: ReadMemory, budget: int = 64 << 20) -> None:
        self._read = read
        self._blocks: dict[int, bytes | None] = {}
        self.budget = budget
        self.missing = False  # a read returned None this pass (maybe read next pass); callers may reset it

    def read(self, addr: int, size: int) -> bytes | None:
        if size < 0 or addr <= 0 or addr + size > MAX_ADDR or size > 1 << 20:
            return None
        if size == 0:
            return b""
        first = addr - addr % BLOCK
        if addr + size <= first + BLOCK:  # within one block: most reads (a field, a word)
            blk = self._blocks.get(first, _UNREAD)
            if blk is _UNREAD or blk is None:
                blk = self._block(first)
                if blk is None:
                    return None
            lo = addr - first
            return blk[lo:lo + size] if len(blk) >= lo + size else None
        out = bytearray()
        for base in range(first, addr + size, BLOCK):
            blk = self._block(base)
            if blk is None:
                return None
            lo = max(addr, base) - base
            hi = min(addr + size, base + BLOCK) - base
            if len(blk) < hi:
                return None
            out += blk[lo:hi]
        return bytes(out)

    def rebind(self, read: ReadMemory) -> None:
        """Read through ``read`` from now on (a later pass of the session's read loop): the blocks
        read are kept, the ones not read yet are asked for again."""
        self._read = read
        self._blocks = {k: v for k, v in self._blocks.items() if v is not None}
        self.missing = False

    def _block(self, base: int) -> bytes | None:
        if base in self._blocks:
            got = self._blocks[base]
            if got is None:
                self.missing = True
            return got
        if len(self._blocks) * BLOCK >= self.budget:
            raise Budget(f"more than {self.budget >> 20} MiB read")
        got = self._read(base, BLOCK)
        if got is None:
            self.missing = True
        self._blocks[base] = got
        return got

    def u(self, addr: int, size: int) -> int | None:
        data = self.read(addr, size)
        return None if data is None else int.from_bytes(data, "little")

    def word(self, addr: int) -> int | None:
        return self.u(addr, 8)


_UNREAD = object()
