"""The capped runtime adapters task threads build their snapshot with (pure: a fake reflector)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from proxy.threads.listing import Listing


class Mem:
    def __init__(self) -> None:
        self.missing = False


def reflector() -> Any:
    return SimpleNamespace(mem=Mem(), task_names={})


def test_keeps_the_first_tasks_counts_the_rest_and_scans_once_per_stop() -> None:
    calls = []
    complete = [False]

    def discover(r: Any) -> list[int]:
        calls.append(r)
        r.task_names[7] = "tokio#7 app::f"
        if not complete[0]:
            r.mem.missing = True  # a heap block not read yet: this pass's tasks are not final
        return list(range(10))

    lst = Listing(("stop", 1), keep=4)
    (capped,) = lst.adapters([discover])
    r1 = reflector()
    assert capped(r1) == [0, 1, 2, 3] and lst.unread == 6 and r1.mem.missing
    complete[0] = True
    (capped,) = lst.adapters([discover])  # the next pass of the same stop
    assert capped(reflector()) == [0, 1, 2, 3] and lst.unread == 6
    (capped,) = lst.adapters([discover])
    r3 = reflector()
    assert capped(r3) == [0, 1, 2, 3] and len(calls) == 2  # the complete scan is reused
    assert r3.task_names == {7: "tokio#7 app::f"} and not r3.mem.missing


def test_no_adapter_no_tasks_and_nothing_cut() -> None:
    lst = Listing(("stop", 1), keep=4)
    (capped,) = lst.adapters([lambda r: None])
    assert capped(reflector()) is None and lst.unread == 0


def test_the_full_snapshot_of_the_stop_takes_every_task_found_without_scanning_again() -> None:
    calls = []

    def discover(r: Any) -> list[int]:
        calls.append(r)
        r.task_names[7] = "tokio#7 app::f"
        return list(range(10))

    lst = Listing(("stop", 1), keep=4)
    (capped,) = lst.adapters([discover])
    assert capped(reflector()) == [0, 1, 2, 3]
    (full,) = lst.uncapped([discover])
    r = reflector()
    assert full(r) == list(range(10)) and len(calls) == 1 and r.task_names == {7: "tokio#7 app::f"}
    (full,) = Listing(("stop", 2), keep=4).uncapped([discover])  # nothing found yet: its own discovery
    assert full(reflector()) == list(range(10)) and len(calls) == 2


def test_the_full_build_reads_none_of_what_the_capped_build_read() -> None:
    from proxy.program.taskthreads import remembering, reusing

    asked: list[tuple[int, int]] = []

    def stub(addr: int, size: int) -> bytes | None:
        asked.append((addr, size))
        return None if addr == 0x3000 else bytes([addr >> 12]) * size

    kept: dict[tuple[int, int], bytes] = {}
    capped = remembering(stub, kept)
    assert capped(0x1000, 4096) == b"\x01" * 4096 and capped(0x3000, 4096) is None
    asked.clear()
    full = reusing(stub, kept)
    assert full(0x1000, 4096) == b"\x01" * 4096 and asked == []  # read by the capped build
    assert full(0x2000, 4096) == b"\x02" * 4096 and full(0x3000, 4096) is None  # not read, or missing
    assert asked == [(0x2000, 4096), (0x3000, 4096)]


def test_last_stop_is_reused_only_while_every_field_read_and_input_is_the_same() -> None:
    from proxy.reflect.memory import BlockReader
    from proxy.threads.listing import LastStop

    mem = {0x1000: bytes(range(64)) * 64, 0x3000: bytes(4096)}  # one 4 KiB block each

    def read(addr: int, size: int) -> bytes | None:
        return mem.get(addr, b"")[:size] or None

    last = LastStop()
    assert last.same(("fp",), read) is None  # nothing kept yet
    rec = last.recording(Listing(("stop", 1), keep=4), read)
    r = BlockReader(rec)  # as the snapshot's reflector reads
    assert r.word(0x1008) == int.from_bytes(bytes(range(8, 16)), "little") and r.read(0x2000, 8) is None
    assert set(rec.reads) == {(0x1008, 8), (0x2000, 8)}  # fields, not blocks
    last.keep(("fp",), rec, ["tasks"])
    assert last.same(("fp",), read) == ["tasks"] and last.reused == 1
    assert last.same(("other registers",), read) is None
    mem[0x1000] = mem[0x1000][:0x100] + b"\xff" + mem[0x1000][0x101:]  # a byte no field read: still the same
    assert last.same(("fp",), read) == ["tasks"] and last.reused == 2
    mem[0x2000] = bytes(4096)  # readable now (a new mapping): something changed
    assert last.same(("fp",), read) is None
    del mem[0x2000]
    mem[0x1000] = mem[0x1000][:0x0f] + b"\x00" + mem[0x1000][0x10:]  # one byte of a field read
    assert last.same(("fp",), read) is None and last.reused == 2


def test_the_heap_scan_counts_only_where_the_header_words_lie() -> None:
    """A runtime adapter's scan reads every heap block; the rest of the heap changes whenever
    the program runs, so only the positions of the words it looks for are compared."""
    from types import SimpleNamespace

    from proxy.reflect.adapters import scan
    from proxy.reflect.memory import BlockReader
    from proxy.threads.listing import LastStop

    vt = 0x5555_0000_1230
    heap = bytearray(8192)
    heap[0x40:0x48] = vt.to_bytes(8, "little")

    def read(addr: int, size: int) -> bytes | None:
        return bytes(heap[addr - 0x10000:addr - 0x10000 + size]) if 0x10000 <= addr < 0x12000 else None

    last = LastStop()
    rec = last.recording(Listing(("stop", 1), keep=4), read)
    r = SimpleNamespace(mem=BlockReader(rec), pending=None)
    adapter = SimpleNamespace(targets={vt: "Cell<F>"}, vt_off=0)
    hits, _ = scan(r, [(0x10000, 0x12000)], [adapter])  # type: ignore[arg-type]
    assert hits == [{0x10040: "Cell<F>"}] and not rec.reads and len(rec.scanned) == 2
    last.keep(("fp",), rec, ["tasks"])
    heap[0x1000:0x1008] = b"\x01" * 8  # an unrelated heap word changed
    assert last.same(("fp",), read) == ["tasks"]
    heap[0x1800:0x1808] = vt.to_bytes(8, "little")  # a new task header
    assert last.same(("fp",), read) is None


def test_a_runtime_discovery_makes_only_the_tasks_kept_and_counts_the_rest() -> None:
    """proxy.reflect.adapters.Discovery takes ``keep``: its adapters make the first tasks and
    count the others (no root, no name made for 9,000 tasks nobody lists); the full snapshot
    of the same stop then discovers them all."""

    class Discovery:
        past = 0

        def __init__(self) -> None:
            self.asked: list[int | None] = []

        def discover(self, r: Any, keep: int | None = None) -> list[int]:
            self.asked.append(keep)
            self.past = 0 if keep is None else 10 - keep
            return list(range(10 if keep is None else keep))

    d = Discovery()
    lst = Listing(("stop", 1), keep=4)
    (capped,) = lst.adapters([d.discover])
    assert capped(reflector()) == [0, 1, 2, 3] and lst.unread == 6 and d.asked == [4]
    (capped,) = lst.adapters([d.discover])
    assert capped(reflector()) == [0, 1, 2, 3] and lst.unread == 6 and d.asked == [4]  # once per stop
    (full,) = lst.uncapped([d.discover])
    assert full(reflector()) == list(range(10)) and d.asked == [4, None]
