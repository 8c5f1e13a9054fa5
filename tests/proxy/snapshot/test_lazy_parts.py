"""A task's tree, stack and wait-for graph are made on demand by the snapshot's parts, once,
and a later question at the same stop reads through its own read what the last one could not."""

from __future__ import annotations

from typing import Any

from proxy.snapshot.model import Frame, FutureNode, Hold, Resource, Snapshot, StateKind, Task, TaskState, WaitGraph

SUSP = TaskState(StateKind.SUSPENDED)
M = Resource("Mutex", 0x1000)


class Parts:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.complete = False

    def tree_of(self, raw: Any) -> FutureNode:
        self.calls.append(f"tree {raw}")
        return FutureNode("coroutine", f"app::{raw}", 0x100, "t", SUSP)

    def stack_of(self, raw: Any) -> tuple[Frame, ...]:
        self.calls.append(f"stack {raw}")
        return (Frame(0, f"app::{raw}", 0x100, "t", None, False),)

    def graph(self) -> Any:
        self.calls.append("graph")
        hold = Hold(1, M, "a live guard")
        return WaitGraph(holds=(hold,)), {1: ((hold,), ())}

    def coroutines(self) -> Any:
        return {}


def test_made_when_first_asked_and_kept() -> None:
    parts = Parts()
    t = Task(1, 0x100, "t", "app::a", SUSP, parts=parts, raw="a")  # type: ignore[arg-type]
    assert parts.calls == []
    assert t.frame is not None and t.frame.name == "app::a" and parts.calls == ["stack a"]
    assert t.tree.name == "app::a" and t.tree is t.tree
    assert parts.calls == ["stack a", "tree a"]  # (the stack was made: not again)
    assert t._raw is None  # both made: the merged tree is let go
    assert [h.resource for h in t.holds] == [M] and t.waits == ()
    other = t.replace(name="app::b")
    assert other.tree is t.tree and other.name == "app::b" and parts.calls.count("tree a") == 1


def test_a_snapshot_without_parts_holds_its_values() -> None:
    tree = FutureNode("coroutine", "app::a", 0x100, "t", SUSP)
    t = Task(1, 0x100, "t", "app::a", SUSP, tree)
    snap = Snapshot(stop=1, tasks=(t,))
    assert t.stack == () and t.holds == () and t.waits == () and snap.waits == WaitGraph()
    assert snap.coroutines == {} and snap.task("#1") is t
    snap.bind(lambda addr, size: None)  # nothing made on demand: nothing to rebind


def test_a_later_pass_reads_again_what_was_not_read_and_keeps_the_rest() -> None:
    from proxy.reflect.memory import BlockReader

    answered: dict[int, bytes] = {}
    reader = BlockReader(lambda addr, size: answered.get(addr))
    assert reader.read(0x1008, 8) is None and reader.missing
    answered[0x1000] = bytes(range(256)) * 16
    reader.rebind(lambda addr, size: answered.get(addr))  # the next pass: asked again
    assert not reader.missing and reader.read(0x1008, 2) == b"\x08\x09"
