"""The runtime adapters' heap scan and the block reader it reads through (pure, hand-made memory).

The scan looks for each task vtable's 8 bytes with ``bytes.find`` over whole
blocks: a hit counts only at a word-aligned offset (the same bytes at an odd
offset are the tail of one word and the head of the next, not a pointer).
"""

from __future__ import annotations

import struct

from proxy.analysis.model import Inventory
from proxy.reflect.adapters import Discovery, scan
from proxy.reflect.memory import BLOCK, BlockReader
from proxy.reflect.tree import Root
from proxy.reflect.walker import Reflector

BASE = 0x7000_0000
VT = 0x5555_1234_5678


class Fake:
    name = "fake"
    note = None
    vt_off = 16
    targets = {VT: "Cell<F>"}

    def roots(self, r: Reflector, hits: dict[int, str]) -> list[Root]:
        return [Root(h + 0x40, cell, "", "fake runtime") for h, cell in sorted(hits.items())]


def _memory(words: dict[int, int], size: int = 3 * BLOCK, odd: tuple[int, ...] = ()) -> bytes:
    buf = bytearray(size)
    for off, w in words.items():
        buf[off:off + 8] = struct.pack("<Q", w)
    for off in odd:  # the vtable's bytes at an offset that is not a word's
        buf[off:off + 8] = struct.pack("<Q", VT)
    return bytes(buf)


def _reflector(data: bytes) -> Reflector:
    def read(addr: int, size: int) -> bytes | None:
        if not BASE <= addr < BASE + len(data):
            return None
        return data[addr - BASE:addr - BASE + size]

    return Reflector(Inventory("", "", False, 0), 0, BlockReader(read))


def test_scan_counts_aligned_words_only() -> None:
    data = _memory({0x18: VT, BLOCK + 0x100: VT, 2 * BLOCK - 8: VT}, odd=(0x203, BLOCK - 4))
    hits, scanned = scan(_reflector(data), [(BASE, BASE + len(data))], [Fake()])
    assert scanned == len(data)
    assert sorted(hits[0]) == [BASE + 0x18 - 16, BASE + BLOCK + 0x100 - 16, BASE + 2 * BLOCK - 8 - 16]


def test_discovery_makes_a_root_per_header_found() -> None:
    data = _memory({0x18: VT, 2 * BLOCK + 0x30: VT})
    d = Discovery([Fake()], lambda: [(BASE, BASE + len(data))], [])
    assert [x.addr for x in d.discover(_reflector(data)) or []] == \
        [BASE + 0x18 - 16 + 0x40, BASE + 2 * BLOCK + 0x30 - 16 + 0x40]


def test_block_reader_within_and_across_blocks() -> None:
    data = bytes(range(256)) * (3 * BLOCK // 256)
    mem = BlockReader(lambda a, n: data[a - BASE:a - BASE + n] if BASE <= a < BASE + len(data) else None)
    assert mem.read(BASE + 10, 4) == data[10:14]
    assert mem.read(BASE + BLOCK - 3, 6) == data[BLOCK - 3:BLOCK + 3]  # across two blocks
    assert mem.word(BASE + 8) == int.from_bytes(data[8:16], "little")
    assert mem.read(BASE + 3 * BLOCK - 2, 4) is None and mem.missing  # past the mapped end
    short = BlockReader(lambda a, n: b"\x01" * 100)  # a stub that answers a block short
    assert short.read(BASE + 96, 4) == b"\x01" * 4 and short.read(BASE + 98, 4) is None


def test_prefetch_reads_the_blocks_not_read_yet_in_one_request() -> None:
    """A read with ``many`` (the session's: one exchange for all) gets every block the scan
    needs at once; the blocks read before are not asked again, nor past the budget."""
    from proxy.reflect.memory import BLOCK, BlockReader

    asked: list[list[tuple[int, int]]] = []

    def read(addr: int, size: int) -> bytes | None:
        asked.append([(addr, size)])
        return bytes(size)

    def many(keys: list[tuple[int, int]]) -> list[bytes | None]:
        asked.append(list(keys))
        return [bytes(size) if addr != 0x3000 else None for addr, size in keys]

    read.many = many  # type: ignore[attr-defined]
    mem = BlockReader(read, budget=4 * BLOCK)
    assert mem.read(0x1000, 8) == bytes(8)
    mem.prefetch([0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000])
    assert asked == [[(0x1000, BLOCK)], [(0x2000, BLOCK), (0x3000, BLOCK), (0x4000, BLOCK)]]
    assert mem.read(0x2008, 8) == bytes(8) and mem.read(0x3000, 8) is None and mem.missing
    assert len(asked) == 2


def test_a_heap_larger_than_the_walk_budget_is_scanned_and_the_walk_keeps_its_budget() -> None:
    """A heap of 8 blocks against a budget of 4 (hyper's single_threaded: its threads' malloc arenas
    over the 64 MiB budget failed every command of the stop): the scan reads it all, and
    the walk after it still has its own 4 blocks."""
    from proxy.reflect.memory import Budget

    data = _memory({7 * BLOCK + 0x18: VT}, size=8 * BLOCK)
    more = bytes(6 * BLOCK)

    def read(addr: int, size: int) -> bytes | None:
        if BASE <= addr < BASE + len(data):
            return data[addr - BASE:addr - BASE + size]
        at = addr - (BASE + 0x100000)
        return more[at:at + size] if 0 <= at < len(more) else None

    r = Reflector(Inventory("", "", False, 0), 0, BlockReader(read, budget=4 * BLOCK))
    hits, scanned = scan(r, [(BASE, BASE + len(data))], [Fake()])
    assert scanned == len(data) and sorted(hits[0]) == [BASE + 7 * BLOCK + 0x18 - 16]
    for i in range(4):  # the walk's own budget, whole
        assert r.mem.read(BASE + 0x100000 + i * BLOCK, 8) == bytes(8)
    try:
        r.mem.read(BASE + 0x100000 + 5 * BLOCK, 8)
    except Budget:
        pass
    else:
        raise AssertionError("a walk past its own budget must stop")
