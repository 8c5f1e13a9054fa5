"""The kernel's spawn records and wake statistics, decoded from bytes laid out as uprobes.bpf.c writes them."""

from __future__ import annotations

import struct

from proxy.capture.uprobes.bpf import WAKE_STATS_SIZE
from proxy.origins.log import SpawnLog
from proxy.origins.records import KEY_ID, KEY_NONE, KEY_TASK, SPAWN_HEAD, WAKE_HEAD, WAKE_LAST, decode_spawn, decode_wakes
from proxy.origins.resolve import Resolver, crate_of
from proxy.analysis.model import Frame, SourceLoc


def _spawn(task_id: int, stack: bytes = b"\x01" * 16, key: int = KEY_ID, ts: int = 5) -> bytes:
    chain = [0x1000, 0x2000] + [0] * 6
    fns = [3, 4] + [0] * 6
    head = SPAWN_HEAD.pack(6, 2, key, 0, 77, len(stack), ts, 0x55aa, 0x7ff0, task_id, 0xabc,
                           1, 2, 3, 4, 5, 6, *chain, *fns, b"p" * 16)
    return head + stack


def test_a_spawn_record_decodes_with_its_chain_and_stack() -> None:
    raw = b"\0" * 8 + _spawn(12)
    rec = decode_spawn(raw, 8, len(raw) - 8)
    assert rec is not None
    assert (rec.thread, rec.task_id, rec.spawner, rec.depth) == (77, 12, 0xabc, 2)
    assert rec.chain == ((0x1000, 3), (0x2000, 4))
    assert rec.regs["rip"] == 0x55aa and rec.regs["rsp"] == 0x7ff0 and rec.regs["r15"] == 6
    assert rec.read(0x7ff0, 4) == b"\x01" * 4 and rec.read(0x7ff0 + 16, 1) is None
    assert decode_spawn(raw, 8, 100) is None  # short


def test_the_wake_statistics_decode_newest_wake_first() -> None:
    assert WAKE_HEAD.size + 4 * WAKE_LAST.size == WAKE_STATS_SIZE
    head = WAKE_HEAD.pack(5, 2, 1, 3, 4, 6, 0, 900, 500, 5, 7, 1, 0x4000, *([0] * 19 + [1]), 6, 0)
    lasts = b"".join(WAKE_LAST.pack(ts, 0x10 * ts, 0x99, 1, ts % 2) for ts in (5, 6, 3, 4))  # ring of 4, 6 written
    w = decode_wakes(0xfeed, head + lasts)
    assert (w.wakes, w.self_wakes, w.polls, w.sched_max, w.future, w.wakers) == (5, 1, 6, 500, 0x4000, -1)
    assert [x.ts for x in w.last] == [6, 5, 4, 3]
    assert w.hist[-1] == 1


def test_the_log_keeps_the_newest_by_task_id() -> None:
    log = SpawnLog(keep=2)
    for i in (1, 2, 3):
        raw = _spawn(i)
        log.add(decode_spawn(raw, 0, len(raw)))  # type: ignore[arg-type]
    assert list(log.by_id) == [2, 3] and log.forgotten == 1 and log.get(1) is None


def test_an_async_task_record_is_kept_by_the_tasks_address_the_newest_first() -> None:
    """async-task's records carry the new task's pointer (KEY_TASK), not an id: an allocator
    gives an ended task's memory to a later one, whose record then replaces the older."""
    log = SpawnLog(keep=3)
    for ts, (ptr, key) in enumerate([(0x5000, KEY_TASK), (0x6000, KEY_TASK), (0x5000, KEY_TASK), (0, KEY_NONE),
                                     (7, KEY_ID)], 1):
        raw = _spawn(ptr, key=key, ts=ts)
        log.add(decode_spawn(raw, 0, len(raw)))  # type: ignore[arg-type]
    got = log.of_task(0x5000)
    assert got is not None and got.ts == 3 and got.task_id == 0 and got.task == 0x5000
    assert log.get(0x5000) is None and log.of_task(7) is None and log.get(7) is not None  # two key spaces
    assert len(log.unkeyed) == 1 and log.forgotten == 0
    raw = _spawn(0x7000, key=KEY_TASK, ts=9)
    log.add(decode_spawn(raw, 0, len(raw)))  # type: ignore[arg-type]
    assert log.of_task(0x6000) is None and log.forgotten == 1  # the oldest of both tables went


def test_the_spawning_line_is_the_first_frame_outside_the_runtime() -> None:
    frames = {0x100: [Frame("tokio::runtime::task::id::Id::next", SourceLoc("id.rs", 76))],
              0x1ff: [Frame("tokio::task::spawn::spawn_inner", SourceLoc("spawn.rs", 182)),
                      Frame("tokio::task::spawn::spawn<F>", SourceLoc("spawn.rs", 171), inlined=True)],
              0x2ff: [Frame("app::run::{{closure}}", SourceLoc("app.rs", 12))]}
    raw = _spawn(1)
    rec = decode_spawn(raw, 0, len(raw))
    assert rec is not None
    r = Resolver(lambda _: ((0x100, 0x200, 0x300), True, ()), lambda pc: frames.get(pc, []), 0)
    assert r.symbolised == 0
    o = r.origin(rec)
    assert str(o.line) == "app.rs:12" and o.function == "app::run::{{closure}}" and r.symbolised == 1
    r.origin(rec)
    assert r.symbolised == 1  # kept
    assert crate_of("<tokio::task::JoinSet<T> as Foo>::spawn") == "tokio"
