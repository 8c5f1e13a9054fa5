"""Tasks polled unseen (a sampling uprobe capture: the kernel counts every poll, records
some): ``Engine.polled_unseen`` asks their state at the stop; what memory says then decides
whether they are still there (``GraphState.resolve``)."""

from __future__ import annotations

from tests.proxy.graph.graphfix import Script, engine, monitor_context, snapshot

from proxy.commands.monitor import run_monitor as monitor
from proxy.graph.model import StateKind

A, D = 0x10_0000, 0x20_0000
S1 = 3  # Suspend0


def _two_suspended():  # type: ignore[no-untyped-def]
    """a and d (an `x`) each polled once (recorded), both suspended at Suspend0."""
    s = Script()
    s.enter("a", A); s.exit(S1)
    s.enter("x", D); s.exit(S1)
    e = engine()
    e.feed_many(s.events)
    a, d = e.task(f"0x{A:x}"), e.task(f"0x{D:x}")
    assert a and d and a.state.kind is StateKind.SUSPENDED and d.state.kind is StateKind.SUSPENDED
    return e, a.id, d.id


def test_a_task_polled_unseen_that_reads_unresumed_ended_unseen() -> None:
    """Its memory reads Unresumed after it was polled: a coroutine never goes back to its
    first state, so the slot holds another (not polled yet) or other data: the task ended in
    a poll no event told of. It is finished (dropped), not live, in every view: the engine's
    tasks and stats, the snapshot's task list (its POLLS stay), `stats`' line."""
    e, a, d = _two_suspended()
    e.timing.set_totals(a, 7, 700, 0)  # the kernel's exact count
    e.polled_unseen({a: 6, d: 0})
    (read,) = e.pending_reads()
    assert read.task == a and read.addr == A + 8
    e.resolve_read(read, b"\x00")
    t = e.task(a)
    assert t is not None and t.finished and t.dropped
    st = e.stats()
    assert st.tasks_live == 1 and st.ended_unseen == 1 and st.rejected == 0, st
    assert e.finished_count() == 1
    snap = snapshot(e)
    live = {t.id for t in snap.tasks if t.live}
    assert live == {d}, snap.tasks
    (gone,) = [t for t in snap.tasks if t.id == a]
    assert gone.stats is not None and gone.stats.polls == 7
    out = monitor("stats --all", monitor_context(e))
    assert "1 live" in out and "1 ended in a poll not recorded (read at stops)" in out, out
    # a new coroutine's first poll at the address is a new task
    s = Script()
    s.seq = 100
    e.feed(s.enter("a", A, state=0))
    new = e.task(f"0x{A:x}")
    assert new is not None and new.id not in (a, d) and not new.finished


def test_a_task_polled_unseen_that_reads_a_state_it_cannot_hold_or_unmapped_memory_ended() -> None:
    e, a, d = _two_suspended()
    e.polled_unseen({a: 1, d: 1})
    reads = {r.task: r for r in e.pending_reads()}
    e.resolve_read(reads[a], b"\x09")  # not one of its type's states (0-3)
    e.resolve_read(reads[d], None)  # the heap trimmed: the address is not mapped
    assert e.task(a).finished and e.task(d).finished  # type: ignore[union-attr]
    assert e.stats().ended_unseen == 2 and e.stats().tasks_live == 0


def test_a_task_polled_unseen_that_returned_or_still_suspends_is_told_by_its_state() -> None:
    e, a, d = _two_suspended()
    e.polled_unseen({a: 1, d: 1})
    reads = {r.task: r for r in e.pending_reads()}
    e.resolve_read(reads[a], b"\x01")  # Returned: finished, not dropped
    e.resolve_read(reads[d], bytes([S1]))  # still suspended where it was
    ta, td = e.task(a), e.task(d)
    assert ta and ta.finished and not ta.dropped and ta.state.kind is StateKind.FINISHED
    assert td and not td.finished and td.state.kind is StateKind.SUSPENDED
    assert e.stats().ended_unseen == 0 and e.stats().rejected == 0


def test_only_the_tasks_polled_unseen_since_the_last_stop_are_read() -> None:
    """The count is cumulative: a task whose unseen polls did not grow since the last stop
    ended in no unseen poll since (its state is the one known then); a task polling now,
    or already finished, is not read."""
    e, a, d = _two_suspended()
    e.polled_unseen({a: 3, d: 2})
    for r in e.pending_reads():
        e.resolve_read(r, bytes([S1]))
    e.polled_unseen({a: 3, d: 5})
    assert [r.task for r in e.pending_reads()] == [d]
    for r in e.pending_reads():
        e.resolve_read(r, bytes([S1]))
    s = Script()
    s.seq = 100
    e.feed(s.enter("a", A, state=S1))  # a polls now
    e.polled_unseen({a: 9, d: 5})
    assert e.pending_reads() == []


def test_a_failed_read_of_a_task_not_polled_unseen_keeps_it() -> None:
    """The stub's failed read is not taken as the task's end unless the task was polled
    unseen (an exit without its state, read at the stop, stays unknown and counted)."""
    s = Script()
    s.enter("a", A); s.exit(None)
    e = engine()
    e.feed_many(s.events)
    (read,) = e.pending_reads()
    e.resolve_read(read, None)
    t = e.task(f"0x{A:x}")
    assert t is not None and not t.finished
    assert e.stats().rejected_reasons == (("state read failed", 1),) and e.stats().ended_unseen == 0
