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
    from proxy.app import _remembering, _reusing

    asked: list[tuple[int, int]] = []

    def stub(addr: int, size: int) -> bytes | None:
        asked.append((addr, size))
        return None if addr == 0x3000 else bytes([addr >> 12]) * size

    kept: dict[tuple[int, int], bytes] = {}
    capped = _remembering(stub, kept)
    assert capped(0x1000, 4096) == b"\x01" * 4096 and capped(0x3000, 4096) is None
    asked.clear()
    full = _reusing(stub, kept)
    assert full(0x1000, 4096) == b"\x01" * 4096 and asked == []  # read by the capped build
    assert full(0x2000, 4096) == b"\x02" * 4096 and full(0x3000, 4096) is None  # not read, or missing
    assert asked == [(0x2000, 4096), (0x3000, 4096)]
