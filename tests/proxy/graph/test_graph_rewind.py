"""Rewinding: the graph at seq N is the engine fed only the events up to N."""

from __future__ import annotations

import pytest
from tests.proxy.graph.graphfix import Script, engine
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.graph.engine import Engine, RewindUnavailable
from proxy.graph.events import PollEvent

NAMES = ["a", "b", "c", "x", "y"]
OBJS = [0x1000, 0x1040, 0x2000, 0x2040, 0x3000]
STATES = [None, 1, 2, 3, 0]


def view(e: Engine) -> object:
    threads = sorted(set(e.threads()) | {1, 2})
    return (
        e.tasks(), e.edges(), [e.scopes(t) for t in threads],
        [e.backtrace(t) for t in threads], e.pending_reads(), e.complete,
    )


ops = st.lists(
    st.tuples(
        st.sampled_from(["enter", "enter", "exit", "panic", "miss", "lost"]),
        st.sampled_from([1, 2]),
        st.integers(0, 4),
        st.sampled_from(STATES),
    ),
    max_size=60,
)


def build(program: list[tuple[str, int, int, int | None]]) -> list[PollEvent]:
    s = Script()
    for op, thread, k, state in program:
        depth = len(s.open.get(thread, []))
        if op == "enter" and depth < 6:
            s.enter(NAMES[k], OBJS[k] + thread * 0x10_000, thread=thread,
                    state=state if state in (0, 3) else None)
        elif op in ("exit", "panic") and depth:
            s.exit(state if state else None, thread=thread, panicked=op == "panic")
        elif op == "miss" and depth:
            s.drop_open(thread)
        elif op == "lost":
            s.lost()
    return s.events


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(0, 70), st.sampled_from([1, 3, 50]))
def test_rewind_equals_the_engine_fed_up_to_seq(program: list[tuple[str, int, int, int | None]],
                                                 cut: int, every: int) -> None:
    events = build(program)
    full = engine(checkpoint_every=every, max_checkpoints=1000)
    full.feed_many(events)
    end = view(full)
    ref = engine()
    ref.feed_many(e for e in events if e.seq <= cut)
    full.rewind_to(cut)
    assert view(full) == view(ref)
    full.forward_to(10**9)  # the same history again
    assert view(full) == end
    full.rewind_to(cut)
    full.feed_many(e for e in events if e.seq > cut)  # replaying the logged events
    assert view(full) == end


def test_a_new_history_after_rewind_truncates_the_log() -> None:
    s = Script()
    s.enter("a", 0x1000); s.exit(3); s.enter("a", 0x1000); s.exit(1)
    e = engine(checkpoint_every=1)
    e.feed_many(s.events)
    e.rewind_to(2)
    other = Script(seq=2)
    other.enter("b", 0x5000)
    e.feed_many(other.events)
    assert [t.path for t in e.tasks()] == ["rt::a", "rt::b"]
    e.forward_to(10**9)  # nothing left of the old future
    assert [t.polls for t in e.tasks()] == [1, 1]


def test_rewind_past_the_bounded_log_is_refused() -> None:
    s = Script()
    for _ in range(20):
        s.enter("a", 0x1000); s.exit(3)
    e = engine(checkpoint_every=5, max_checkpoints=2)
    e.feed_many(s.events)
    # checkpoints at 5, 10, ... 40 entries; the newest two are kept
    assert e.stats().log_entries <= 10 and e.oldest_rewind_seq == 35
    with pytest.raises(RewindUnavailable):
        e.rewind_to(34)
    e.rewind_to(35)
    assert e.task(1).polls == 18  # type: ignore[union-attr]


@settings(max_examples=100, deadline=None)
@given(ops, st.integers(0, 70))
def test_log_stopped_midway_keeps_the_graph_of_the_engine_without_log(
        program: list[tuple[str, int, int, int | None]], cut: int) -> None:
    """Engine.stop_log (uprobe capture: nothing can rewind it): the graph is the
    one an engine without a log folds; the log and its checkpoints are gone."""
    events = build(program)
    plain = engine(keep_log=False)
    plain.feed_many(events)
    e = engine(checkpoint_every=3)
    e.feed_many(events[:cut])
    e.stop_log()
    e.feed_many(events[cut:])
    assert view(e) == view(plain)
    st_ = e.stats()
    assert st_.log_entries == 0 and not st_.log_kept and len(e._cps) == 1
    with pytest.raises(RewindUnavailable):
        e.rewind_to(0)
