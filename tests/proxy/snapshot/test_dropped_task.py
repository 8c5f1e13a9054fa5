"""Rule 7 of proxy.snapshot.build for an observed task: a task the engine saw poll and never
return, whose memory now holds a value that is none of its coroutine's states, was dropped
unfinished (its slot freed and reused) and is no live task. Fact (hyper's single_threaded,
release, capture on): each client thread's connection task, pending when its LocalSet was
dropped with the thread's runtime, was shown alive, state "unknown", its tree unreadable."""

from __future__ import annotations

import pytest
from tests.proxy.graph.graphfix import BIAS, Script, engine

from proxy.snapshot import SnapshotInputs, build_snapshot

CHILD = 0x300000
STATE_AT = CHILD + 8  # graphfix's layouts: the state byte at offset 8


@pytest.mark.parametrize(("value", "live"), [(3, True), (115, False), (None, True)])
def test_an_observed_task_whose_slot_holds_no_state_is_gone(value: int | None, live: bool) -> None:
    s = Script()
    s.enter("child", CHILD)
    s.exit(3)  # suspended at its .await: the engine counts it alive until it returns
    e = engine()
    e.feed_many(s.events)

    def read(addr: int, size: int) -> bytes | None:
        if value is None:
            return None  # not read: that says nothing of the task
        data = bytearray(size)
        if addr <= STATE_AT < addr + size:
            data[STATE_AT - addr] = value
        return bytes(data)

    snap = build_snapshot(SnapshotInputs(inventory=e.catalog.inventory, bias=BIAS, engine=e), read)
    assert [t.name for t in snap.live()] == (["rt::child"] if live else [])
