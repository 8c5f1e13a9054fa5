"""The engine fed with synthetic event sequences (graphfix models the program)."""

from __future__ import annotations

from tests.proxy.graph.graphfix import BIAS, FILE, Script, engine, site

from proxy.analysis.model import SourceLoc
from proxy.graph.engine import Engine
from proxy.graph.events import PollEnter, PollExit, PollResumed
from proxy.graph.model import StateKind

A, B, C = 0x10_0000, 0x10_0040, 0x10_0080  # b and c stored inline in a
S1 = 3  # Suspend0


def loc(line: int) -> SourceLoc:
    return SourceLoc(FILE, line)


def test_serial_a_b_c_backtrace_at_breakpoint_in_c() -> None:
    s = Script()
    s.enter("a", A)
    s.enter("b", B, parent="a")
    s.enter("c", C, parent="b")
    e = engine()
    e.feed_many(s.events)
    bt = e.backtrace(1, pc=0x1020 + BIAS)
    assert [(f.path, f.loc, f.executing) for f in bt] == [
        ("rt::c", loc(2), True),
        ("rt::b", loc(5), False),
        ("rt::a", loc(9), False),
    ]
    a, b, c = (e.task(f"0x{p:x}") for p in (A, B, C))
    assert a is not None and b is not None and c is not None
    assert a.is_root and b.parent == a.id and c.parent == b.id
    assert c.state.kind is StateKind.RUNNING and c.state.thread == 1
    pairs = {(x.parent, x.child, x.callsite) for x in e.edges()}
    assert pairs == {(a.id, b.id, loc(5 + 4)), (b.id, c.id, loc(5))}


def test_suspended_everywhere_after_pending_exits() -> None:
    s = Script()
    s.enter("a", A); s.enter("b", B, parent="a"); s.enter("c", C, parent="b")
    s.exit(S1); s.exit(S1); s.exit(S1)
    e = engine()
    e.feed_many(s.events)
    tasks = {t.path: t for t in e.tasks()}
    assert str(tasks["rt::c"].state) == "suspended at src/main.rs:2" and tasks["rt::c"].state.suspend_index == 0
    assert str(tasks["rt::a"].state) == "suspended at src/main.rs:9" and tasks["rt::a"].state.suspend_index == 0
    assert all(ed.pending for ed in e.edges())
    assert e.backtrace(1) == []
    assert e.edges()[0].await_loc == loc(9)


def test_task_ids_are_stable_and_found_by_label() -> None:
    s = Script()
    s.enter("a", A); s.exit(S1); s.enter("a", A); s.exit(S1)
    e = engine()
    e.feed_many(s.events)
    (t,) = e.tasks()
    assert t.id == 1 and t.polls == 2 and e.task("#1") == t and e.task("1") == t
    assert e.task("#2") is None and e.task("zz") is None and e.task("0xzz") is None


def test_select_only_the_winner_completes_and_the_loser_is_dropped_with_the_parent() -> None:
    P, X, Y = 0x20_0000, 0x20_0100, 0x20_0200
    s = Script()
    s.enter("sel", P)
    s.enter("x", X, parent="sel"); s.exit(S1)
    s.enter("y", Y, parent="sel"); s.exit(1)  # y wins
    e = engine()
    e.feed_many(s.events)
    p, x, y = (e.task(f"0x{a:x}") for a in (P, X, Y))
    assert p and x and y
    done = {ed.child: ed.completed for ed in e.edges(parent=p.id)}
    assert done == {x.id: False, y.id: True}
    s.exit(1)  # select! returns: the parent completes and drops x
    e.feed(s.events[-1])
    ex = {ed.child: ed for ed in e.edges(parent=p.id)}
    assert ex[x.id].dropped and not ex[x.id].completed and ex[y.id].completed
    x2 = e.task(x.id)
    assert x2 is not None and x2.dropped and x2.finished


def test_join_both_children_complete_before_the_parent() -> None:
    P, X, Y = 0x20_0000, 0x20_0100, 0x20_0200
    s = Script()
    s.enter("sel", P)
    s.enter("x", X, parent="sel"); s.exit(S1)
    s.enter("y", Y, parent="sel"); s.exit(1)
    s.exit(S1)
    s.enter("sel", P); s.enter("x", X, parent="sel"); s.exit(1); s.exit(1)
    e = engine()
    e.feed_many(s.events)
    p = e.task(f"0x{P:x}")
    assert p and p.state.kind is StateKind.FINISHED
    assert [ed.completed for ed in e.edges(parent=p.id)] == [True, True]
    assert e.edges(completed=False) == []


def test_spawned_child_is_its_own_root() -> None:
    s = Script()
    s.enter("a", A); s.exit(S1)  # a spawned child and awaits its JoinHandle (a leaf: no event)
    s.enter("child", 0x30_0000, thread=2); s.exit(1, thread=2)
    e = engine()
    e.feed_many(s.events)
    roots = e.roots()
    assert [r.path for r in roots] == ["rt::a", "rt::child"]
    assert e.edges() == []  # the JoinHandle edge is only known through reflection


def test_panic_leaves_no_stale_scope_and_later_polls_are_parented() -> None:
    s = Script()
    s.enter("a", A); s.enter("b", B, parent="a")
    s.exit(None, panicked=True)  # b panics: left through _Unwind_Resume
    s.exit(None, panicked=True)  # and a with it
    s.enter("child", 0x30_0000); s.enter("c", 0x30_0040, parent="b")
    e = engine()
    e.feed_many(s.events)
    a, b = e.task(f"0x{A:x}"), e.task(f"0x{B:x}")
    assert a and b and b.state.kind is StateKind.PANICKED and a.state.kind is StateKind.PANICKED
    ch, c = e.task("0x300000"), e.task("0x300040")
    assert ch and c and ch.is_root and c.parent == ch.id
    assert [sc.task for sc in e.scopes(1)] == [ch.id, c.id]
    assert e.stats().exits_missed == 0


def test_panic_exit_missed_is_recovered_from_sp_and_the_state_read() -> None:
    s = Script()
    s.enter("a", A); s.enter("b", B, parent="a")
    s.drop_open(1, 2)  # the panic unwound both frames; no exit was seen
    s.enter("child", 0x30_0000)  # the executor polls the next task at the same depth
    e = engine()
    e.feed_many(s.events)
    assert e.stats().exits_missed == 2
    ch = e.task("0x300000")
    assert ch and ch.is_root and [sc.task for sc in e.scopes(1)] == [ch.id]
    reads = {r.self_ptr: r for r in e.pending_reads()}
    assert set(reads) == {A, B} and reads[B].addr == B + 8 and reads[B].size == 1
    e.resolve_read(reads[B], b"\x02")
    e.resolve_read(reads[A], b"\x02")
    assert e.task(f"0x{B:x}").state.kind is StateKind.PANICKED  # type: ignore[union-attr]
    assert e.pending_reads() == []


def test_exit_without_state_is_inferred_from_the_next_entry() -> None:
    s = Script()
    s.enter("a", A); s.exit(None)
    e = engine()
    e.feed_many(s.events)
    assert e.task(1).state.kind is StateKind.UNKNOWN  # type: ignore[union-attr]
    assert len(e.pending_reads()) == 1
    e.feed(s.enter("a", A, state=S1))
    assert e.pending_reads() == []
    e.feed(s.exit(None))
    read = e.pending_reads()[0]
    e.resolve_read(read, None)  # the read failed: counted, state stays unknown
    assert e.stats().rejected_reasons == (("state read failed", 1),)


def test_missed_exit_of_an_inner_scope_is_recovered_at_the_outer_exit() -> None:
    s = Script()
    s.enter("a", A); s.enter("b", B, parent="a")
    s.drop_open(1)  # b's exit missed
    s.exit(S1)  # a's exit: sp above b's
    e = engine()
    e.feed_many(s.events)
    assert e.stats().exits_missed == 1 and e.scopes(1) == []
    assert e.task(1).state.kind is StateKind.SUSPENDED  # type: ignore[union-attr]


def test_new_generation_on_address_reuse() -> None:
    s = Script()
    s.enter("c", C, state=0); s.exit(1)  # returns; memory freed
    s.enter("c", C, state=0); s.exit(S1)  # same address, same type, a new object
    s.enter("x", C, state=0)  # another type at the address: c's second life was dropped
    e = engine()
    e.feed_many(s.events)
    t1, t2, t3 = e.tasks()
    assert (t1.generation, t2.generation, t3.generation) == (0, 1, 2)
    assert t1.state.kind is StateKind.FINISHED and t2.dropped and t3.path == "rt::x"
    assert e.task(f"0x{C:x}") == t3


def test_inline_child_at_offset_zero_shares_the_address() -> None:
    s = Script()
    s.enter("a", A); s.enter("b", A, parent="a"); s.exit(S1); s.exit(S1)
    s.enter("a", A); s.enter("b", A, parent="a")
    e = engine()
    e.feed_many(s.events)
    a, b = e.tasks()
    assert b.parent == a.id and b.polls == 2 and not b.dropped and len(e.tasks()) == 2


def test_threads_are_independent() -> None:
    s = Script()
    s.enter("a", A, thread=1); s.enter("x", 0x40_0000, thread=2)
    s.enter("b", B, thread=1, parent="a")
    e = engine()
    e.feed_many(s.events)
    assert e.task("0x400000").is_root  # type: ignore[union-attr]
    assert [f.path for f in e.backtrace(1)] == ["rt::b", "rt::a"]
    assert [f.path for f in e.backtrace(2)] == ["rt::x"]


def test_garbage_and_out_of_order_events_are_counted_not_raised() -> None:
    e = engine()
    e.feed(PollEnter(5, 1, site("a"), A, 0x7000))
    e.feed(PollEnter(5, 1, site("b"), B, 0x6000))  # seq repeated
    e.feed(PollEnter(4, 1, site("b"), B, 0x6000))  # seq going back
    e.feed(PollEnter(6, 1, 0xDEAD, B, 0x6000))  # not a resume fn
    e.feed(PollEnter(7, 1, site("b"), 0, 0x6000))  # null self
    e.feed(PollExit(8, 1, site("a"), 0x7000, state=77))  # no such state
    e.feed(PollExit(9, 3, site("a"), 0x7000, state=1))  # thread never seen
    e.feed("junk")  # type: ignore[arg-type]
    st = e.stats()
    assert st.rejected == 6 and st.unmatched_exits == 1
    assert dict(st.rejected_reasons) == {
        "seq not increasing": 2, "unknown site": 1, "null self pointer": 1,
        "bad __state value": 1, "not an event": 1,
    }
    assert e.task(1).state.kind is StateKind.UNKNOWN  # type: ignore[union-attr]


def test_events_lost_marks_incomplete_until_resync() -> None:
    s = Script()
    s.enter("a", A); s.enter("b", B, parent="a"); s.lost()
    e = engine()
    e.feed_many(s.events)
    assert not e.complete and e.threads_to_resync() == [1]
    a_scope = e.scopes(1)[0]
    e.resync_thread(1, [(a_scope.site, A, a_scope.sp)])  # b is no longer on the stack
    assert e.complete and [sc.task for sc in e.scopes(1)] == [a_scope.task]
    assert e.stats().events_lost == 5 and e.stats().exits_missed == 1


def test_genfuture_wrapper_and_inner_fn_of_the_same_object_are_one_poll() -> None:
    s = Script()
    s.enter("a", A); s.enter("a", A); s.exit(None); s.exit(S1)
    e = engine()
    e.feed_many(s.events)
    (t,) = e.tasks()
    assert t.polls == 1 and t.state.kind is StateKind.SUSPENDED and e.edges() == []


def test_busy_and_idle_time_from_event_times() -> None:
    s = Script()
    s.enter("a", A); s.exit(S1); s.enter("a", A); s.exit(S1)
    e = engine()
    e.feed_many(s.events)
    t = e.task(1)
    assert t and t.busy_ns == 2000 and t.idle_ns == 1000


def test_memory_stays_bounded_with_many_short_lived_tasks() -> None:
    cap = 500
    e = engine(max_completed=cap, max_tasks=2000)
    s = Script()
    biggest = 0
    for i in range(10_000):  # 10,000 tasks x 10 events = 100,000 events
        obj = 0x100_0000 + (i % 3000) * 0x100
        s.enter("sel", 0x50_0000)
        s.enter("x", obj, parent="sel", state=0); s.exit(S1)
        s.exit(S1)
        s.enter("sel", 0x50_0000); s.exit(S1)  # woken by something else
        s.enter("sel", 0x50_0000)
        s.enter("x", obj, parent="sel"); s.exit(1)
        s.exit(S1)
        e.feed_many(s.events)
        s.events.clear()
        biggest = max(biggest, len(e.tasks()) if i % 500 == 0 else e.stats().tasks_retained)
    st = e.stats()
    assert st.events == 100_000
    assert st.tasks_seen == 10_001 and biggest <= cap + 2
    assert st.completed_evicted == 10_000 - st.tasks_retained + 1
    assert st.edges <= cap + 1
    assert st.log_entries <= 100_000


def _b_new_inside_a_repeat_poll_of_a() -> tuple[Engine, int]:
    """`a` polled once (recorded), then again with no event (a repeat poll), `b`
    new inside it naming it; (the engine, a's entry sp)."""
    s = Script()
    s.enter("a", A, state=0)
    s.exit(S1)
    e = engine()
    e.feed_many(s.events)
    sp_a = 0x7FFF_0000 + 0x10_0000
    e.feed(PollEnter(10, 1, site("b"), B, sp_a - 0x100, None, 0, 50_000, (A, site("a"))))
    return e, sp_a


def test_a_parent_named_by_the_backend_links_a_child_polled_inside_a_poll_not_in_the_stream() -> None:
    """Uprobes recording only graph changes: a repeat poll of `a` goes out as no
    event, and `b`, new inside it, names it (PollEnter.parent): the edge a -> b
    is there, and nothing is missed or unmatched."""
    e, sp_a = _b_new_inside_a_repeat_poll_of_a()
    e.feed(PollExit(11, 1, site("b"), sp_a - 0x100, S1, B, None, False, 51_000))
    a, b = e.task(f"0x{A:x}"), e.task(f"0x{B:x}")
    assert a is not None and b is not None
    assert b.parent == a.id and {(x.parent, x.child) for x in e.edges()} == {(a.id, b.id)}
    st = e.stats()
    assert st.exits_missed == 0 and st.unmatched_exits == 0, st


def test_a_poll_resumed_at_a_stop_goes_below_the_polls_entered_after_it() -> None:
    """At a stop, the entry of a poll in progress that went out as no event is fed
    (PollResumed): it takes its place below the polls entered inside it (a
    lower sp), which stay; the backtrace runs through it, and the exits that
    follow the stop match."""
    e, sp_a = _b_new_inside_a_repeat_poll_of_a()
    e.feed(PollResumed(11, 1, site("a"), A, sp_a, None, S1, 40_000, None))
    a, b = e.task(f"0x{A:x}"), e.task(f"0x{B:x}")
    assert a is not None and b is not None
    assert a.state.kind is StateKind.RUNNING and b.state.kind is StateKind.RUNNING
    assert [sc.task for sc in e.scopes(1)] == [a.id, b.id]
    e.feed(PollExit(12, 1, site("b"), sp_a - 0x100, S1, B, None, False, 51_000))
    e.feed(PollExit(13, 1, site("a"), sp_a, S1, A, None, False, 52_000))
    st = e.stats()
    assert st.exits_missed == 0 and st.unmatched_exits == 0 and not e.scopes(1), st
    assert b.parent == a.id


def test_a_child_stored_at_its_named_parents_address_does_not_supersede_it() -> None:
    """An awaitee at offset 0 of its parent has the parent's address: a new life of
    it supersedes the other coroutines there that are not polling, except the
    poll it names as its parent (and that one's ancestors): in progress, with
    no entry in the stream (a repeat poll)."""
    s = Script()
    s.enter("a", A, state=0)
    s.enter("b", A, state=0)
    s.exit(1)
    s.exit(S1)
    e = engine()
    e.feed_many(s.events)
    sp_a = 0x7FFF_0000 + 0x10_0000
    e.feed(PollEnter(10, 1, site("b"), A, sp_a - 0x100, None, 0, 50_000, (A, site("a"))))
    e.feed(PollExit(11, 1, site("b"), sp_a - 0x100, 1, A, None, False, 51_000))
    [a] = [t for t in e.tasks() if t.path == "rt::a"]
    assert a.state.kind is StateKind.SUSPENDED and not a.dropped
    bs = [t for t in e.tasks() if t.path == "rt::b"]
    assert len(bs) == 2 and all(t.parent == a.id for t in bs)


def test_a_poll_inside_one_whose_task_was_evicted_is_a_root() -> None:
    """One coroutine in polls on two threads at once (bad data, or events lost) can
    finish and be evicted while its scope stays on the other thread's stack: a poll
    entered under that scope has no known parent (it raised KeyError)."""
    s = Script()
    s.enter("a", 0xA000, thread=1, state=0)
    s.enter("a", 0xA000, thread=2, state=3)
    s.exit(1, thread=2)  # a returns on thread 2: finished, not running; its scope stays on thread 1
    for i in range(3):  # finished tasks past max_completed: a is evicted
        s.enter("x", 0xB000 + 0x100 * i, thread=3, state=0)
        s.exit(1, thread=3)
    s.enter("c", 0xC000, thread=1, state=0)  # inside a's scope on thread 1
    e = engine(max_completed=1)
    e.feed_many(s.events)
    assert e.task("0xa000") is None
    c = e.task("0xc000")
    assert c is not None and c.parent is None and e.stats().rejected == 0


def test_elided_coroutines_take_ids_past_the_reserved_ones() -> None:
    """Engine.elided skips the ids the snapshot gave to tasks found in memory, as a new task does."""
    for reserved, next_task in (({2, 3, 5}, 7), (set(), 4)):  # elided: 1, 4, 6 (or 1, 2, 3)
        e = engine()
        e.reserve_ids(set(reserved))
        e.elided(3)
        e.elided(0)
        e.elided(-1)
        s = Script()
        s.enter("a", 0xA000, state=0)
        e.feed_many(s.events)
        a = e.task("0xa000")
        assert a is not None and a.id == next_task and e.stats().tasks_seen == 4
