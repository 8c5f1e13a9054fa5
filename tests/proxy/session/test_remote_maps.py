"""A remote program's memory map through the stub (vFile) for the runtime adapters.

gdbserver answers vFile:open/pread/close for files of its own host; /proc files say size 0,
so the whole file is read until a read comes back empty. QEMU's gdbstub has no vFile (an
empty reply): the adapters then say why they find nothing. integration/test_remote_attach.py
runs the real stub."""

from __future__ import annotations

from proxy.host.procmem import parse_maps
from proxy.reflect.tokio_adapter import heap_ranges_of
from proxy.session.wire import stub_file_whole

MAPS = b"""55a0c0000000-55a0c0010000 r-xp 00000000 08:01 123 /usr/bin/prog
55a0c2000000-55a0c2100000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000001000 ---p 00000000 00:00 0
7f0000001000-7f0000801000 rw-p 00000000 00:00 0
7f1000000000-7f1000400000 rw-p 00000000 00:00 0
garbage line
"""


def _drive(replies: dict[bytes, bytes]) -> tuple[object, list[bytes]]:
    steps = stub_file_whole(b"/proc/7/maps")
    sent: list[bytes] = []
    try:
        bodies = next(steps)
        while True:
            sent += bodies
            bodies = steps.send([replies.get(b.split(b":")[1], b"") for b in bodies])
    except StopIteration as done:
        return done.value, sent


def test_a_proc_file_is_read_until_an_empty_read() -> None:
    chunks = iter([b"F%x;" % len(MAPS) + MAPS, b"F0;"])

    class Replies(dict):  # type: ignore[type-arg]
        def get(self, key: bytes, default: bytes = b"") -> bytes:  # type: ignore[override]
            return {b"open": b"F5", b"close": b"F0"}.get(key) or next(chunks)

    got, sent = _drive(Replies())
    assert got == MAPS
    assert sent[0].startswith(b"vFile:open:" + b"/proc/7/maps".hex().encode())
    assert sent[-1] == b"vFile:close:5" and sum(s.startswith(b"vFile:pread:5,") for s in sent) == 2


def test_a_stub_without_vfile_is_told_apart_from_an_unreadable_file() -> None:
    assert _drive({})[0] is False  # QEMU: an empty reply to vFile:open
    assert _drive({b"open": b"F-1,2"})[0] is None  # ENOENT


def test_heap_ranges_of_a_maps_text_skip_code_stacks_and_garbage() -> None:
    ranges = heap_ranges_of(parse_maps(MAPS.decode()))
    # [heap] and the arena; the mapping right above a ---p guard is a thread's stack
    assert ranges == [(0x55A0C2000000, 0x55A0C2100000), (0x7F1000000000, 0x7F1000400000)]
