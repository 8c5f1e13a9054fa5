"""Cycles and rendering of one-shot snapshots, on hand-made task trees."""

from __future__ import annotations

import json

from proxy.ps.render import render_json, render_ps
from proxy.ps.snapshot import PsSnapshot, PsTask, find_cycles
from proxy.reflect.tree import Root
from proxy.reflect.walker import Node


def task(label: str, name: str, waits: list[int], holds: list[int]) -> PsTask:
    leaf = Node("leaf", "tokio::sync::Semaphore::acquire", 0x10, detail="waits on semaphore")
    tree = Node("coroutine", name, 0x1000, f"{name}::{{async_fn_env#0}}", children=[leaf], holds=holds)
    if waits:
        leaf.waits_on = waits[0]
    return PsTask(label, 0x1000, name, tree.type_name, "suspended", "tokio runtime", "x", waits, holds, tree,
                  Root(0x1000, tree.type_name, label))


def test_two_task_deadlock_is_one_cycle() -> None:
    a, b = task("tokio#3", "lock_ab", [0xB], [0xA]), task("tokio#4", "lock_ba", [0xA], [0xB])
    c = task("tokio#5", "other", [0xB], [])  # blocked behind the cycle, not in it
    cycles = find_cycles([c, b, a])
    assert len(cycles) == 1
    assert cycles[0].text() == ("cycle: tokio#4 lock_ba -> Mutex 0xa held by tokio#3 lock_ab "
                                "-> Mutex 0xb held by tokio#4 lock_ba")


def test_three_cycle_and_no_cycle() -> None:
    ts = [task("t1", "a", [2], [1]), task("t2", "b", [3], [2]), task("t3", "c", [1], [3])]
    assert [[t.label for t in c.tasks] for c in find_cycles(ts)] == [["t1", "t2", "t3"]]
    assert find_cycles([task("t1", "a", [9], [1]), task("t2", "b", [1], [])]) == []


def test_renderers() -> None:
    a, b = task("tokio#3", "lock_ab", [0xB], [0xA]), task("tokio#4", "lock_ba", [0xA], [0xB])
    snap = PsSnapshot("process 42", 42, [a, b], find_cycles([a, b]), ["a note"], stopped_ns=2_500_000,
                      copied=1_700_000)
    text = render_ps(snap).splitlines()
    assert text[0] == "process 42: 2 tasks; stopped 2.5 ms, 1.7 MB copied"
    assert text[1].split() == ["TASK", "ADDRESS", "ASYNC", "FN", "STATE", "AWAITS", "FOUND", "BY"]
    assert text[-2].startswith("cycle: tokio#3 lock_ab -> Mutex 0xb held by tokio#4") and text[-1] == "note: a note"
    doc = json.loads(render_json(snap))
    assert doc["stopped_ms"] == 2.5 and doc["cycles"][0]["tasks"] == ["tokio#3", "tokio#4"]
    assert doc["tasks"][0]["tree"]["children"][0]["waits_on"] == "0xb"
