"""The proxy's memory reads, cut to what the stub takes in one `m`.

A stub's ``PacketSize`` bounds its replies: an `m` reply is two hex digits a
byte, so a read asks for at most ``(PacketSize - 4) / 2`` bytes (rounded
down to a power of two, so a piece never crosses a page the whole range did
not). Some stubs refuse less than that: QEMU 7.2's gdbstub advertises
``PacketSize=1000`` (4,096 bytes) yet answers ``E22`` to any `m` over 2,048
bytes. An ``E`` reply to a read larger than any the stub has answered is
therefore read again in halves; when a half comes back, the limit is
learned (``ReadLimit.learned``) and kept for the session. A read no larger
than one already answered that fails is unreadable memory, never split.

``read_memory`` is a procedure step (it yields `Exchange`s), sans-IO.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

from rsp.packets.memory import memory_bytes

from proxy.procedure import Exchange

DEFAULT_LIMIT = 4096  # no PacketSize: what reflection's blocks ask for
MIN_SPLIT = 256  # an E for a read this small is unreadable memory


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n > 0 else 0


class ReadLimit:
    """The largest `m` the stub takes, from its PacketSize and what it refused."""

    def __init__(self, packet_size: int | None = None) -> None:
        self.size = DEFAULT_LIMIT
        self.proven = 0  # the largest read the stub answered with data
        self.learned: str | None = None  # why the limit went below PacketSize's
        self.set_packet_size(packet_size)

    def set_packet_size(self, packet_size: int | None) -> None:
        if packet_size is not None and packet_size > 4:
            self.size = max(64, min(DEFAULT_LIMIT, _pow2_floor((packet_size - 4) // 2)))

    def pieces(self, addr: int, size: int) -> list[tuple[int, int]]:
        """``addr, size`` cut at multiples of the limit."""
        out = []
        end = addr + size
        while addr < end:
            stop = min(end, addr - addr % self.size + self.size)
            out.append((addr, stop - addr))
            addr = stop
        return out

    def refused(self, size: int) -> bool:
        """An ``E`` to a read of ``size``: worth reading again in halves?"""
        return size > MIN_SPLIT and size > self.proven

    def answered(self, size: int, parent: int | None) -> None:
        """Data came for a read of ``size``; ``parent``: the size of the refused read it halves."""
        self.proven = max(self.proven, size)
        if parent is not None and size < self.size:
            self.size = size
            self.learned = f"the stub refused a {parent}-byte read: reads of at most {size} bytes from now on"


def read_memory(limit: ReadLimit, ranges: Sequence[tuple[int, int]]
                ) -> Generator[Exchange, list[bytes], list[bytes | None]]:
    """Read each ``(addr, size)``; its bytes (maybe fewer, as the stub answered) or None."""
    cut = [limit.pieces(a, s) if s > 0 else [] for a, s in ranges]
    got: dict[tuple[int, int], bytes | None] = {}
    split: set[tuple[int, int]] = set()
    parents: dict[tuple[int, int], int] = {}
    asks = list(dict.fromkeys(p for pieces in cut for p in pieces))
    while asks:
        replies = yield Exchange(tuple(b"m%x,%x" % p for p in asks))
        again: list[tuple[int, int]] = []
        for (a, s), rep in zip(asks, replies):
            data = memory_bytes(rep)
            if data is None and rep[:1] == b"E" and limit.refused(s):
                split.add((a, s))
                half = s // 2
                for piece in ((a, half), (a + half, s - half)):
                    parents[piece] = s
                    again.append(piece)
                continue
            got[(a, s)] = data
            if data:
                limit.answered(s, parents.get((a, s)))
        asks = again

    def assemble(a: int, s: int) -> bytes | None:
        if (a, s) not in split:
            return got.get((a, s))
        half = s // 2
        left = assemble(a, half)
        if left is None or len(left) < half:
            return left
        return left + (assemble(a + half, s - half) or b"")

    out: list[bytes | None] = []
    for (a, s), pieces in zip(ranges, cut):
        data: bytes | None = b"" if s == 0 else None
        for pa, ps in pieces:
            piece = assemble(pa, ps)
            if piece is None:
                break
            data = (data or b"") + piece
            if len(piece) < ps:
                break  # the stub answered short: the rest is unreadable
        out.append(data)
    return out
