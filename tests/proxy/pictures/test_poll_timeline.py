"""The poll timeline (proxy.graph.polls + proxy.pictures.timeline) for a hand-built event stream.

The expected slices are computed here from the events fed (each entry paired with the exit
of the same frame, by thread and stack pointer), not from the engine's state."""

from __future__ import annotations

import json

from proxy.graph.events import PollEnter, PollExit
from proxy.pictures import timeline
from proxy.pictures.files import trace_of
from tests.proxy.graph.graphfix import Script, engine, site


def _events() -> Script:
    s = Script()
    s.enter("a", 0xA0); s.enter("b", 0xB0); s.enter("c", 0xC0); s.exit(3); s.exit(3); s.exit(3)
    s.enter("sel", 0x50, thread=2)
    s.enter("x", 0x60, thread=2); s.exit(3, thread=2)
    s.enter("y", 0x70, thread=2); s.exit(3, thread=2)
    s.exit(3, thread=2)
    s.enter("child", 0xD0, thread=2); s.exit(3, thread=2)
    s.enter("a", 0xA0); s.enter("b", 0xB0); s.exit(3); s.exit(3)
    return s


def expected(events: list[object]) -> list[tuple[int, int, int, int, int]]:
    """(thread, self, enter ns, exit ns, the outermost self around it) of every poll."""
    open_: dict[int, list[PollEnter]] = {}
    out = []
    for ev in events:
        if isinstance(ev, PollEnter):
            open_.setdefault(ev.thread, []).append(ev)
        elif isinstance(ev, PollExit):
            stack = open_[ev.thread]
            i = max(k for k, e in enumerate(stack) if e.sp == ev.sp and e.site == ev.site)
            e = stack.pop(i)
            out.append((ev.thread, e.self_ptr, e.time_ns, ev.time_ns, (stack[0] if stack else e).self_ptr))
    return out


def test_one_complete_slice_per_poll_on_its_task_and_thread_tracks() -> None:
    s = _events()
    e = engine()
    e.feed_many(s.events)
    e.polls.stop(1, s.time + 500, 1)
    doc = trace_of(e, None)
    assert doc is not None
    json.dumps(doc)  # a JSON document
    ev = doc["traceEvents"]
    want = expected(s.events)
    assert len(want) == 9
    tasks = [x for x in ev if x["ph"] == "X" and x["pid"] == timeline.TASKS_PID]
    threads = [x for x in ev if x["ph"] == "X" and x["pid"] == timeline.THREADS_PID]
    assert len(tasks) == len(threads) == len(want)
    got = sorted((sl["tid"], int(sl["args"]["self"], 16), round(sl["ts"] * 1000), round((sl["ts"] + sl["dur"]) * 1000))
                 for sl in threads)
    assert got == sorted((t, sp, a, b) for t, sp, a, b, _ in want)
    # the task track of each slice is the outermost poll around it: its track is named by that coroutine
    names = {x["tid"]: x["args"]["name"] for x in ev if x["ph"] == "M" and x["pid"] == timeline.TASKS_PID
             and x["name"] == "thread_name"}
    by_self = {}
    for sl in tasks:
        by_self.setdefault(int(sl["args"]["self"], 16), set()).add(names[sl["tid"]].split()[2])
    outer = {"0xa0": "rt::a", "0x50": "rt::sel", "0xd0": "rt::child"}
    for _, self_ptr, _, _, root in want:
        assert by_self[self_ptr] == {outer[hex(root)]}
    assert {sl["name"] for sl in tasks} == {"rt::a", "rt::b", "rt::c", "rt::sel", "rt::x", "rt::y", "rt::child"}
    assert all(sl["dur"] >= 0 for sl in tasks)


def test_await_edges_are_flows_and_stops_are_instants() -> None:
    s = _events()
    e = engine()
    e.feed_many(s.events)
    e.polls.stop(7, s.time + 500, 1)
    e.polls.stop(7, s.time + 900, 1)  # the same stop again: one mark
    doc = trace_of(e, None)
    assert doc is not None
    ev = doc["traceEvents"]
    starts = [x for x in ev if x["ph"] == "s"]
    ends = {x["id"]: x for x in ev if x["ph"] == "f"}
    assert len(starts) == 4  # a->b, b->c, sel->x, sel->y: once each
    for st in starts:
        assert ends[st["id"]]["ts"] >= st["ts"] and ends[st["id"]]["bp"] == "e"
    stops = [x for x in ev if x["ph"] == "i"]
    assert [(x["name"], x["s"], x["ts"]) for x in stops] == [("stop 7", "g", (s.time + 500) / 1000)]


def test_the_log_is_bounded_and_a_refold_records_nothing_twice() -> None:
    s = _events()
    e = engine(checkpoint_every=4)
    e.feed_many(s.events)
    n = len(e.polls.polls)
    e.rewind_to(5)
    e.forward_to(10_000)
    assert len(e.polls.polls) == n == 9
    from proxy.graph.polls import PollLog

    log = PollLog(max_polls=3)
    for i in range(5):
        log.add(1, 1, site("a"), 0xA0, 2 * i, 2 * i + 1, i, i + 1)
    assert len(log.polls) == 3 and log.dropped == 2 and log.polls[0].enter_seq == 4


def test_recorded_wakes_are_instants_on_the_woken_tasks_track_and_flows_from_the_waker() -> None:
    """uprobe capture keeps each runtime task's newest wakes (proxy.origins.records.WakeStats):
    task `child` (0xD0, polled at t=13 µs) woken at t=11.5 µs by the task whose poll runs `sel`
    (0x50), and once from outside the tasks."""
    from proxy.origins.records import Wake, WakeStats

    s = _events()
    e = engine()
    e.feed_many(s.events)

    def stats(header: int, future: int, last: tuple[Wake, ...]) -> WakeStats:
        return WakeStats(header, len(last), 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, future, (), last)

    wakes = [stats(0x1D0, 0xD0, (Wake(11_500, 0x150, 0, 2, False), Wake(2_000, 0, 0, 2, True))),
             stats(0x150, 0x50, ())]
    doc = trace_of(e, None, wakes=wakes)
    assert doc is not None
    ev = doc["traceEvents"]
    tracks = {x["args"]["name"].split()[2]: x["tid"] for x in ev if x["ph"] == "M" and x["pid"] == 1
              and x["name"] == "thread_name"}
    woken = [x for x in ev if x["ph"] == "i" and x["cat"] == "wake"]
    assert [(x["tid"], x["ts"], x["args"]["by"]) for x in woken] == [
        (tracks["rt::child"], 11.5, f"task #{tracks['rt::sel']}"), (tracks["rt::child"], 2.0, "outside the tasks")]
    flows = [x for x in ev if x.get("cat") == "wake" and x["ph"] in "sf"]
    child_poll = next(x for x in ev if x["ph"] == "X" and x["pid"] == 1 and x["name"] == "rt::child")
    assert [(x["ph"], x["tid"], x["ts"]) for x in flows] == [
        ("s", tracks["rt::sel"], 11.5), ("f", tracks["rt::child"], child_poll["ts"])]
    assert "wakes: the newest of each task" in doc["otherData"]["note"]
