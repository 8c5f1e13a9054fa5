"""Bounded, block-cached reads for a reflection walk.

A question at a stop reads target memory through ``read(addr, size) -> bytes |
None`` where None means "not readable" (the session asks the stub as the
question reads: proxy/session/reader.py). To keep the number of exchanges
near the number of *pointer hops* (not of fields), every read is widened to
aligned ``BLOCK``-byte blocks: a coroutine and everything stored inline in it
(its awaitee, the awaitee's awaitee...) come from the same blocks. A block never crosses a
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


class Recording:
    """A ``read`` whose BlockReader notes every read it answers, ``(addr, size) -> bytes or
    None`` in ``reads``: all a walk depended on (proxy/threads/listing.py LastStop compares
    them at the next stop). Field by field, not by block: a block holds other bytes too
    (a thread's TLS at the top of its stack page changes whenever it runs)."""

    def __init__(self, read: ReadMemory) -> None:
        self._read = read
        self.reads: dict[tuple[int, int], bytes | None] = {}
        # blocks a runtime adapter's heap scan read (adapters.scan): only where the words it
        # looks for lie counts, not the rest of the heap (it changes whenever the program runs)
        self.scanned: dict[tuple[int, int], tuple[tuple[bytes, ...], tuple[int, ...] | None]] = {}

    def __call__(self, addr: int, size: int) -> bytes | None:
        return self._read(addr, size)

    def many(self, keys: list[tuple[int, int]]) -> list[bytes | None]:
        return read_many(self._read, keys)

    def using(self, read: ReadMemory) -> None:
        """Read through ``read`` from now on (the next question at the same stop)."""
        self._read = read


class BlockReader:
    def __init__(self, read: ReadMemory, budget: int = 64 << 20) -> None:
        self._read = read
        self._blocks: dict[int, bytes | None] = {}
        self.budget = budget
        self.missing = False  # a read returned None (maybe read by a later question); callers may reset it
        self.recording = read if isinstance(read, Recording) else None
        if self.recording is not None:  # only then: the plain read stays one call (the hot path)
            self.read = self._recorded(self.recording.reads)  # type: ignore[method-assign]

    def _recorded(self, reads: dict[tuple[int, int], bytes | None]) -> ReadMemory:
        plain = self.read

        def read(addr: int, size: int) -> bytes | None:
            data = plain(addr, size)
            reads[(addr, size)] = data
            return data

        return read

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

    def prefetch(self, bases: list[int]) -> None:
        """Read the blocks at ``bases`` (aligned) that are not read yet, all at once when the
        read can (``read_many``: the session asks the stub for them back to back), as far as
        the budget goes (the reads after it raise ``Budget`` as they would)."""
        room = max(0, (self.budget - len(self._blocks) * BLOCK) // BLOCK)
        todo = [b for b in dict.fromkeys(bases) if b not in self._blocks][:room]
        if len(todo) > 1:
            for base, got in zip(todo, read_many(self._read, [(b, BLOCK) for b in todo])):
                self._blocks[base] = got
                if got is None:
                    self.missing = True

    def rebind(self, read: ReadMemory) -> None:
        """Read through ``read`` from now on (a later question at the same stop): the blocks
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


def read_many(read: ReadMemory, keys: list[tuple[int, int]]) -> list[bytes | None]:
    """``read`` of each of ``keys``, through its ``many`` when it has one (one request for
    all of them: proxy/session/queries.py), else one by one."""
    many = getattr(read, "many", None)
    return list(many(keys)) if many is not None else [read(addr, size) for addr, size in keys]


def word_hits(data: bytes, words: tuple[bytes, ...]) -> tuple[int, ...]:
    """The 8-aligned offsets in ``data`` where any of the 8-byte ``words`` lies, sorted."""
    out = []
    for pat in words:
        at = data.find(pat)
        while at >= 0:
            if at & 7 == 0:
                out.append(at)
            at = data.find(pat, at + 1)
    return tuple(sorted(out))
