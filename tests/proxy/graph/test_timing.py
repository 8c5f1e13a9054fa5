"""Poll timing (proxy/graph/timing.py) and `monitor async top`, on recorded events.

The events model a capture whose every event stalls the program for COST ns
(the Script advances its clock by 1 µs per event) on top of the work the
script adds between events: subtracting the calibrated cost must give the
work back exactly.
"""

from __future__ import annotations

import pytest
from tests.proxy.graph.graphfix import Script, engine, monitor_context

from proxy.commands.monitor import run_monitor
from proxy.commands.top import fmt_ns
from proxy.graph.engine import Engine
from proxy.graph.timing import MAX_TASKS, MIN_LEAVES, PollTiming, histogram

COST = 1000  # ns: the Script's clock step per event
SPIN, NAP = 0x300000, 0x300100


def spinner_and_sleeper(polls: int = 10, spin_us: int = 2000) -> Engine:
    """Task a ("spinner") works spin_us in each poll, with a child c polled inside
    (work 5 µs); task x ("sleeper") works 0 in each poll and sleeps 3 ms between."""
    s = Script()
    for i in range(polls):
        s.enter("a", SPIN, state=0 if i == 0 else 3)
        s.time += spin_us * 1000 // 2
        s.enter("c", SPIN + 0x40, state=0 if i == 0 else 3)
        s.time += 5_000
        s.exit(3)
        s.time += spin_us * 1000 // 2
        s.exit(3)
        s.enter("x", NAP, thread=2, state=0 if i == 0 else 3)
        s.exit(3, thread=2)
        s.time += 3_000_000
    e = engine()
    e.feed_many(s.events)
    return e


def task_id(e: Engine, path: str) -> int:
    (t,) = [t for t in e.tasks() if t.path == path]
    return t.id


def test_calibrated_cost_gives_the_work_back() -> None:
    e = spinner_and_sleeper()
    cost, source = e.timing.cost()
    # c and x are leaves (no event between entry and exit): 20 polls, x's 10
    # took one event's cost plus no work, c's 10 5 µs more: the lower
    # quartile is exactly COST.
    assert cost == COST and "calibrated" in source and "20 polls" in source
    a, c, x = (task_id(e, p) for p in ("rt::a", "rt::c", "rt::x"))
    assert e.timing.busy_ns(a) == 10 * (2_000_000 + 5_000)  # inclusive: c's work inside a's polls
    assert e.timing.busy_ns(c) == 10 * 5_000
    assert e.timing.busy_ns(x) == 0
    assert e.timing.longest_ns(a) == 2_005_000
    assert e.timing.of(a).polls == 10  # type: ignore[union-attr]
    # raw, without subtraction, each poll of a is 3 events' cost longer
    assert e.timing.of(a).raw_ns == 10 * (2_005_000 + 3 * COST)  # type: ignore[union-attr]


def test_backend_figure_until_enough_leaves() -> None:
    e = spinner_and_sleeper(polls=MIN_LEAVES // 2 - 1)
    e.timing.set_backend("tracepoints")
    cost, source = e.timing.cost()
    assert cost == 150_000 and "tracepoints" in source and "bench_capture" in source
    # busy never goes negative: x's polls are shorter than the assumed cost
    assert e.timing.busy_ns(task_id(e, "rt::x")) == 0
    e.timing.set_backend("no-such-backend")
    assert e.timing.cost() == (0, "not known: raw durations")


def test_rewind_and_refold_count_nothing_twice() -> None:
    e = spinner_and_sleeper()
    a = task_id(e, "rt::a")
    before = (e.timing.of(a).polls, e.timing.busy_ns(a))  # type: ignore[union-attr]
    last = e.cursor_seq
    assert last is not None
    e.rewind_to(last // 2)
    e.forward_to(last)
    assert (e.timing.of(a).polls, e.timing.busy_ns(a)) == before  # type: ignore[union-attr]


def test_top_ranks_by_busy_time_and_shows_a_histogram() -> None:
    e = spinner_and_sleeper()
    ctx = monitor_context(e)
    out = run_monitor("async top", ctx).splitlines()
    assert out[0] == "capture cost subtracted: 1us per event (calibrated: the lower quartile of 20 polls with no event inside)"
    assert out[1].split() == ["ID", "BUSY", "POLLS", "MEAN", "LONGEST", "IDLE", "ASYNC", "FN"]
    ranked = [line.split()[-1] for line in out[2:]]
    assert ranked == ["rt::a", "rt::c", "rt::x"]
    assert out[2].split()[1:5] == ["20.1ms", "10", "2ms", "2ms"]  # 3 significant digits
    assert run_monitor("async top 1", ctx).splitlines()[-1] == "... 2 more (monitor async top N)"
    hist = run_monitor(f"async top #{task_id(e, 'rt::a')}", ctx).splitlines()
    assert hist[0].startswith("#1 rt::a: 10 polls, busy 20.1ms, longest 2ms")
    assert hist[3].split() == ["1.02ms", "..", "2.05ms", "10", "#" * 40]
    assert run_monitor("async top #99", ctx) == "asyncrsp: no task '#99' (see 'monitor async tasks')"
    assert run_monitor("async top 1 2", ctx) == "asyncrsp: usage: top [N | TASK]"


def test_events_without_time_give_no_timing() -> None:
    s = Script()
    s.enter("a", SPIN)
    s.exit(3)
    e = engine()
    e.feed_many([type(ev)(**{**{f: getattr(ev, f) for f in ev.__slots__}, "time_ns": None})  # type: ignore[attr-defined]
                 for ev in s.events])
    out = run_monitor("async tasks", monitor_context(e))
    assert "BUSY" not in out and "capture cost" not in out
    assert run_monitor("async top", monitor_context(e)).startswith("no timed polls yet")


def test_histogram_buckets_and_formatting() -> None:
    assert histogram([]) == []
    assert histogram([500, 1_500, 3_000, 3_500, 9_000]) == [
        (0, 1000, 1), (1000, 2000, 1), (2000, 4000, 2), (4000, 8000, 0), (8000, 16000, 1)]
    assert [fmt_ns(v) for v in (999, 1_000, 12_345, 2_500_000, 3_000_000_000)] == [
        "999ns", "1us", "12.3us", "2.5ms", "3s"]


def test_long_lived_tasks_keep_their_counts_past_the_task_limit() -> None:
    """A server: a few connection tasks polled all along while more short tasks
    than MAX_TASKS pass by (one per request). The least recently polled timing
    goes first, so the connections' counts stay exact."""
    t = PollTiming()
    seq = 0
    for req in range(MAX_TASKS + 5_000):
        conn = req % 4
        for task in (conn, 1_000 + req):  # the connection's poll, then its short task's
            seq += 2
            t.poll(task, seq - 1, seq, seq * 10, seq * 10 + 5)
    assert [t.of(c).polls for c in range(4)] == [(MAX_TASKS + 5_000) // 4] * 4  # type: ignore[union-attr]
    assert len(t.tasks) == MAX_TASKS
    assert t.of(1_000) is None  # the first short task is forgotten


def test_the_last_samples_are_kept_as_a_bounded_window() -> None:
    """A task's samples (a list trimmed by halves, not a deque) are the last SAMPLES
    polls; past SAMPLES polls busy time is the sum less the cost, not the clamped
    samples (which no longer cover every poll)."""
    from proxy.graph.timing import SAMPLES

    t = PollTiming()
    t.set_backend("uprobes")
    seq = 0
    for i in range(2 * SAMPLES + 5):
        seq += 2
        t.poll(1, seq - 1, seq, 0, 1000 + i)  # a leaf poll each (hits 1)
        tt = t.of(1)
        assert tt is not None
        kept = list(tt.samples)
        assert len(kept) == min(i + 1, SAMPLES) and kept[-1] == (1000 + i, 1) and kept[0] == (1000 + i + 1 - len(kept), 1)
    assert tt.polls == 2 * SAMPLES + 5 and tt.longest == (1000 + 2 * SAMPLES + 4, 1)
    c, _ = t.cost()
    assert t.busy_ns(1) == max(tt.raw_ns - tt.events * c, 0)
    assert t.durations(1) == [max(r - c, 0) for r, _ in kept]


def test_top_answers_when_the_snapshot_reads_past_its_budget() -> None:
    """The axum console build at its exit stop (bench_server console-uprobes): the
    snapshot's walk read more than 64 MiB; top still gives the engine's figures."""
    from dataclasses import replace

    from proxy.reflect.memory import Budget

    def over() -> None:
        raise Budget("more than 64 MiB read")

    e = spinner_and_sleeper()
    ctx = replace(monitor_context(e), snapshot=over)
    out = run_monitor("async top", ctx).splitlines()
    assert out[0].startswith("note: the snapshot was not built (more than 64 MiB read)")
    assert [line.split()[-1] for line in out[3:]] == ["rt::a", "rt::c", "rt::x"]
    assert out[3].split()[1:3] == ["20.1ms", "10"]
    with pytest.raises(Budget):  # the other commands need the snapshot: still an error (the session says so)
        run_monitor("async tree", ctx)


def test_top_says_a_wrappers_window_is_measured() -> None:
    """A coroutine probed through its wrapper's poll (tracing's Instrumented<F>, its own poll
    inlined there): top marks the row and says once what the window holds."""
    from dataclasses import replace

    from proxy.commands.top import render_top, window_mark
    from proxy.snapshot.timing import StopTiming

    e = spinner_and_sleeper()
    a = e.task(f"#{task_id(e, 'rt::a')}")
    assert a is not None and window_mark(a) == ""
    orig = e.tasks

    def tasks() -> list:  # type: ignore[type-arg]
        return [replace(t, type_name="tracing::instrument::Instrumented<rt::a::{async_fn_env#0}>")
                if t.path == "rt::a" else t for t in orig()]

    e.tasks = tasks  # type: ignore[method-assign]
    out = render_top(StopTiming(e), ()).splitlines()
    assert out[2].endswith("rt::a [in Instrumented::poll]") and not out[3].endswith("]")
    (note,) = [ln for ln in out if ln.startswith("[in Instrumented::poll]:")]
    assert "span's enter and exit included" in note
