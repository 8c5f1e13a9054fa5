"""The wait-for graph (proxy.snapshot.waits) on hand-built tasks: cycles, tasks blocked behind
them, tasks nothing can wake, and "unknown" where memory does not tell."""

from __future__ import annotations

from proxy.analysis.model import Inventory, Layout, State
from proxy.snapshot.model import FutureNode, Resource, StateKind, Task, TaskState
from proxy.snapshot.waits import analyse

SUSP = TaskState(StateKind.SUSPENDED)
M1, M2 = Resource("Mutex", 0x1000), Resource("Mutex", 0x2000)


def task(tid: int, name: str, leaves: list[FutureNode], holds: tuple[Resource, ...] = (), header: str = "",
         addr: int | None = None) -> Task:
    root = FutureNode("coroutine", name, addr or tid * 0x100, f"{name}::{{async_fn_env#0}}", SUSP,
                      children=tuple(leaves), holds=holds)
    return Task(tid, root.addr, root.type_name, name, SUSP, root, header=header)


def lock(res: Resource) -> FutureNode:
    return FutureNode("coroutine", "tokio::sync::mutex::lock", 0x9000 + res.addr, "lock", SUSP, waits=res)


def leaf(name: str, waits: Resource | None = None, addr: int = 0x7000) -> FutureNode:
    return FutureNode("leaf", name, addr, name, waits=waits)


def inventory(*names: str) -> Inventory:
    inv = Inventory(build_id=None, path="/p", pie=True, entry=0)
    for n in names:
        t = f"{n}::{{async_fn_env#0}}"
        inv.layouts[t] = Layout(t, 0x80, 0x70, 1, (State(0, "Unresumed", None),))
    return inv


def test_cycle_blocked_behind_it_and_nothing_can_wake() -> None:
    tasks = [
        task(3, "app::lock_ab", [lock(M2)], holds=(M1,)),
        task(4, "app::lock_ba", [lock(M1)], holds=(M2,)),
        task(5, "app::joiner", [leaf("tokio::task::JoinHandle", Resource("JoinHandle", 0x2c8))]),
        task(6, "app::lonely", [leaf("tokio::sync::Notify::notified", Resource("Notify", 0x610))]),
        task(7, "app::sleeper", [leaf("tokio::time::Sleep")]),  # a timer: not stuck
    ]
    tasks[0] = Task(3, 0x300, tasks[0].type_name, "app::lock_ab", SUSP, tasks[0].tree, header="header 0x2c8")
    graph, out = analyse(tasks, None, inventory("app::lonely"), 0)
    text = [f.text for f in graph.findings]
    assert text == [
        "cycle: #3 app::lock_ab -> Mutex 0x2000 held by #4 app::lock_ba -> Mutex 0x1000 held by #3",
        "blocked: #5 app::joiner -> JoinHandle 0x2c8 -> #3 app::lock_ab (in a cycle)",
        "nothing can wake: #6 app::lonely -> Notify 0x610",
    ]
    assert "no other task can reach it" in graph.findings[2].evidence[0]
    assert [w.resource for w in out[0].waits] == [M2] and [h.resource for h in out[0].holds] == [M1]


def test_unknown_where_memory_does_not_tell() -> None:
    tasks = [
        task(1, "app::a", [lock(M1)]),  # nobody's guard holds it: a holder outside the tasks?
        task(2, "app::b", [leaf("tokio::sync::Semaphore::acquire", Resource("Semaphore", 0x3000))]),
        task(3, "app::c", [leaf("tokio::sync::Notify::notified", Resource("Notify", 0x9999))]),  # not inside c
        task(4, "app::d", [leaf("tokio::sync::mpsc::Receiver::recv", Resource("mpsc", 0x4000))]),  # memory not read
    ]
    graph, _ = analyse(tasks, None, inventory("app::c"), 0)
    assert graph.findings == ()
    assert all(w.wakers is None for w in graph.waits), graph.waits


def test_a_task_with_one_wakeable_branch_is_not_stuck() -> None:
    """join!(notified on its own Notify, sleep): the sleep ends, the task runs on."""
    t = task(6, "app::lonely", [leaf("tokio::sync::Notify::notified", Resource("Notify", 0x610)),
                                leaf("tokio::time::Sleep", addr=0x620)])
    graph, _ = analyse([t], None, inventory("app::lonely"), 0)
    assert graph.findings == ()


def test_running_and_finished_tasks_wait_on_nothing() -> None:
    running = TaskState(StateKind.RUNNING, thread=7)
    t = task(1, "app::a", [lock(M1)])
    t = Task(1, t.addr, t.type_name, t.name, running, t.tree)
    graph, _ = analyse([t], None, inventory(), 0)
    assert graph.waits == () and graph.findings == ()
