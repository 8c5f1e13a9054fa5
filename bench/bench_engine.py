"""µs per ``Engine.feed()`` on a synthetic tokio-like stream (the capture hot path).

Each iteration polls a root that awaits a chain of 3 inline coroutines (8
events), and every 10th iteration the chain finishes and a new task takes
its place, so creation, edge completion and eviction are all exercised.
Prints µs per event with the event log on (the default) and off, off without
the poll log the timeline reads (``proxy.graph.polls``: every poll with both
timestamps, one record a poll, here one poll per two events) too, and the
same-run baseline of a bare loop over the events (the floor of any feed).

    .venv/bin/python -m bench.bench_engine [EVENTS]
"""

from __future__ import annotations

import sys
import time

from proxy.analysis.model import CoroutineKind, Era, Inventory, Layout, ResumeFn, SourceLoc, State
from proxy.graph.engine import Catalog, Engine
from proxy.graph.events import PollEnter, PollEvent, PollExit

NAMES = ["root", "a", "b", "c"]


def catalog() -> Catalog:
    inv = Inventory(build_id=None, path="bench", pie=False, entry=0)
    for i, name in enumerate(NAMES):
        low = 0x1000 * (i + 1)
        states = tuple(State(v, f"S{v}", SourceLoc("src/main.rs", 10 * i + v)) for v in range(5))
        inv.layouts[name] = Layout(name, 64, 8, 1, states)
        inv.resume_fns.append(ResumeFn(low, low + 0x100, "", name, name, CoroutineKind.ASYNC_FN,
                                       Era.MODERN, None, (low + 0xf0,), layout_name=name))
    return Catalog(inv, 0, lambda pc: SourceLoc("src/main.rs", pc & 0xFF))


def stream(n_events: int) -> list[PollEvent]:
    events: list[PollEvent] = []
    seq = 0
    it = 0
    while len(events) < n_events:
        base = 0x10_0000 + (it // 10 % 500) * 0x1000  # a new task every 10 iterations
        done = it % 10 == 9
        sp = 0x7FFF_F000
        for depth, name in enumerate(NAMES):
            seq += 1
            events.append(PollEnter(seq, 1 + it % 2, 0x1000 * (depth + 1), base + depth * 0x40,
                                    sp - depth * 0x100, 0x1000 * depth + 0x40, None, seq * 100))
        for depth in reversed(range(len(NAMES))):
            seq += 1
            events.append(PollExit(seq, 1 + it % 2, 0x1000 * (depth + 1), sp - depth * 0x100,
                                   1 if done else 3, None, None, False, seq * 100))
        it += 1
    return events[:n_events]


def per_event_us(events: list[PollEvent], polls: bool = True, **kw: int | bool) -> float:
    e = Engine(catalog(), **kw)  # type: ignore[arg-type]
    if not polls:
        e._g.polls = None  # noqa: SLF001 - the cost of the timeline's poll log, measured by leaving it out
    t0 = time.perf_counter()
    for ev in events:
        e.feed(ev)
    dt = time.perf_counter() - t0
    assert e.stats().rejected == 0, e.stats()
    return dt / len(events) * 1e6


def floor_us(events: list[PollEvent]) -> float:
    sink = []
    t0 = time.perf_counter()
    for ev in events:
        sink.append(ev.seq)
    return (time.perf_counter() - t0) / len(events) * 1e6


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    events = stream(n)
    with_log = min(per_event_us(events) for _ in range(3))
    no_log = min(per_event_us(events, keep_log=False) for _ in range(3))
    no_polls = min(per_event_us(events, polls=False, keep_log=False) for _ in range(3))
    floor = min(floor_us(events) for _ in range(3))
    print(f"events: {n}")
    print(f"feed() with event log : {with_log:.2f} us/event")
    print(f"feed() without log    : {no_log:.2f} us/event")
    print(f"  ... nor the poll log: {no_polls:.2f} us/event  (the timeline's poll log: "
          f"{(no_log - no_polls) * 1000:+.0f} ns/event, {no_log / no_polls:.3f}x)")
    print(f"bare loop (baseline)  : {floor:.3f} us/event  (feed = {with_log / floor:.0f}x the loop)")


if __name__ == "__main__":
    main()
