"""Thread queries answered for task threads (the view), packet by packet."""

from __future__ import annotations

import json
import re

import pytest

from proxy.threads.model import TID_BASE, TaskFrame, TaskThread, region_of
from proxy.threads.stack import FrameShape
from proxy.threads.view import STEP_REFUSED, WRITE_REFUSED, TaskThreadView
from rsp.framing import unescape_binary
from rsp.packets.resume import parse_resume

SHAPE = FrameShape("rsp", 64, (("rip", -8),), (("rsp", 16),))
G = b"00" * (17 * 8 + 4 * 7)  # a real thread's block: its size and the non-GPR tail


def task(n: int, name: str | None = None, running_on: int | None = None) -> TaskThread:
    frames = (TaskFrame(0x5000 + n, 0xA000 + n), TaskFrame(0x6001, 0xB000 + n))
    return TaskThread((0xA000 + n, "t"), name or f"task #{n} app::f{n}", f"suspended at app.rs:{n}", frames,
                      running_on)


def view(tasks: list[TaskThread], cap: int = 1024, pattern: str | None = None) -> TaskThreadView:
    v = TaskThreadView(cap=cap, pattern=pattern)
    v.set_tasks(tasks, G, lambda pc, outer: SHAPE)
    return v


def test_ids_are_stable_across_stops_and_above_any_lwp() -> None:
    v = view([task(1), task(2)])
    first = dict(v.tasks)
    v.stale()
    v.set_tasks([task(3), task(2)], G, None)
    assert {t.key: tid for tid, t in v.tasks.items()}[(0xA002, "t")] == \
        {t.key: tid for tid, t in first.items()}[(0xA002, "t")]
    assert all(tid > 1 << 22 for tid in v.tasks)  # PID_MAX_LIMIT
    assert len(set(v.tasks) | set(first)) == 3


def test_thread_list_pages_follow_the_stub_ids() -> None:
    v = view([task(i) for i in range(300)])
    v.learn_format([b"p10.10", b"p10.11"])
    first = v.thread_pages([b"p10.10", b"p10.11"])[0]
    ids = first[1:].split(b",")
    pages = [first]
    while pages[-1] != b"l":
        pages.append(v.next_page())
    ids = [i for p in pages[:-1] for i in p[1:].split(b",")]
    assert ids[:2] == [b"p10.10", b"p10.11"] and len(ids) == 302
    assert ids[2] == b"p10.%x" % (TID_BASE + 1)


def test_threads_xml_adds_one_thread_per_task_and_names_the_running_one() -> None:
    v = view([task(1), task(2, running_on=0x11)])
    doc = v.threads_xml(b'<threads>\n<thread id="p10.10" core="0" name="app"/>\n'
                        b'<thread id="p10.11" core="1" name="worker"/>\n</threads>\n')
    text = doc.decode()
    assert 'name="worker [task #2 app::f2]"' in text
    assert re.search(rf'<thread id="p10.{TID_BASE + 1:x}" name="task #1 app::f1">suspended at app.rs:1</thread>',
                     text), text
    assert text.count("<thread ") == 3  # the running task keeps its real thread


def test_cap_groups_the_rest_and_filter_keeps_matches() -> None:
    v = view([task(i) for i in range(10)], cap=4)
    assert len(v.tasks) == 4 and v.hidden == 6 and v.group_tid is not None
    assert bytes.fromhex(v.answer(b"qThreadExtraInfo,%x" % v.group_tid).decode()).startswith(b"6 tasks past")
    counted = TaskThreadView(cap=4)
    counted.set_tasks([task(i) for i in range(5)], G, None, unread=100)  # cut before reading (listing.py)
    assert len(counted.tasks) == 4 and counted.hidden == 101
    f = view([task(1), task(2, name="task #2 app::locker")], pattern="locker")
    assert [t.name for t in f.tasks.values()] == ["task #2 app::locker"]


def test_registers_and_stack_of_a_task_thread() -> None:
    v = view([task(1)])
    tid = next(iter(v.tasks))
    assert v.answer(b"Hgp10.%x" % tid) == b"OK"
    g = bytes.fromhex(v.answer(b"g").decode())
    assert len(g) == len(G) // 2
    rip, rsp = int.from_bytes(g[16 * 8:17 * 8], "little"), int.from_bytes(g[7 * 8:8 * 8], "little")
    assert rip == 0x5001 and region_of(tid) <= rsp < region_of(tid) + (1 << 20)
    assert v.answer(b"p10") == g[16 * 8:17 * 8].hex().encode()
    slot = bytes.fromhex(v.answer(b"m%x,8" % (rsp + 16)).decode())
    assert int.from_bytes(slot, "little") == 0xA001  # self where DWARF looks
    ra = bytes.fromhex(v.answer(b"m%x,8" % (rsp + 64 - 8)).decode())
    assert int.from_bytes(ra, "little") == 0x6001  # the next coroutine's frame
    assert v.answer(b"G" + b"00" * 10) == WRITE_REFUSED
    assert v.answer(b"P10=0000000000000000") == WRITE_REFUSED
    assert v.answer(b"M%x,1:00" % rsp) == WRITE_REFUSED
    assert v.answer(b"m1000,8") is None  # the program's memory: the stub's
    assert v.answer(b"Hgp10.10") is None and v.answer(b"g") is None  # a real thread again


def test_unknown_task_ids_are_errors_never_forwarded() -> None:
    v = view([task(1)])
    gone = TID_BASE + 999
    assert v.answer(b"Hgp10.%x" % gone) == b"E01"
    assert v.answer(b"T%x" % gone) == b"E01"
    assert v.answer(b"T%x" % (TID_BASE + 1)) == b"OK"
    assert v.answer(b"T10") is None


@pytest.mark.parametrize("packet,verdict", [
    (b"vCont;c", ("same", b"")),
    (b"vCont;c:p10.%x;c" % (TID_BASE + 1), ("forward", b"vCont;c")),
    (b"vCont;c:p10.%x" % (TID_BASE + 1), ("forward", b"vCont;c")),
    (b"vCont;s:p10.%x;c" % (TID_BASE + 1), ("refuse", STEP_REFUSED)),
    (b"vCont;r1000,2000:p10.%x;c" % (TID_BASE + 1), ("refuse", STEP_REFUSED)),
    (b"vCont;s:p10.10;c", ("same", b"")),
])
def test_resume_actions_for_task_threads(packet: bytes, verdict: tuple[str, bytes]) -> None:
    v = view([task(1)])
    resume = parse_resume(packet)
    assert resume is not None
    assert v.resume(resume, hc_task=False) == verdict


def test_legacy_step_with_a_task_selected_for_resume_is_refused() -> None:
    v = view([task(1)])
    assert v.resume(parse_resume(b"s"), hc_task=True) == ("refuse", STEP_REFUSED)  # type: ignore[arg-type]
    assert v.resume(parse_resume(b"c"), hc_task=True) == ("same", b"")  # type: ignore[arg-type]


def test_lldb_gets_names_from_stop_info_and_jthreadsinfo() -> None:
    v = view([task(1)])
    tid = TID_BASE + 1
    stop = v.answer(b"qThreadStopInfo%x" % tid)
    assert stop == b"T00thread:%x;hexname:%b;" % (tid, b"task #1 app::f1".hex().encode())
    doc = v.threads_json(b"")
    assert b"#" not in doc and b"}" + bytes([ord("#") ^ 0x20]) in doc  # escaped for the wire
    assert json.loads(unescape_binary(doc)) == [{"tid": tid, "name": "task #1 app::f1", "reason": "none"}]
    merged = json.loads(unescape_binary(v.threads_json(b'[{"tid":16,"reason":"signal","signal":5}]')))
    assert [t["tid"] for t in merged] == [16, tid]
