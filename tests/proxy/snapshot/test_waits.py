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


class _Mem:
    """Process memory as words (8-byte little endian); a word never written is unreadable."""

    def __init__(self, words: dict[int, int]) -> None:
        self.words = words

    def word(self, addr: int) -> int | None:
        return self.words.get(addr)

    def read(self, addr: int, size: int) -> bytes | None:
        return None


class _Reader:
    def __init__(self, words: dict[int, int]) -> None:
        self.mem = _Mem(words)


# tokio's watch channel: Arc<Shared<T>>; tokio 1.53's Shared<()> (the bench server's axum, release,
# read from its DWARF): notify_rx: BigNotify ([Notify; 8], 256 bytes) at 0, notify_tx: Notify at
# 0x100, then value, state, ref_count_rx, ref_count_tx. Sender::closed() waits on notify_tx, far into
# the Arc's data: the 16 bytes before it are the end of notify_rx's last Notify (its waiter list's
# head and tail, null when nobody waits), not an ArcInner's counts.
WATCH_ARC = 0x10000
NOTIFY_TX = WATCH_ARC + 0x10 + 0x100
WATCH_WORDS = {WATCH_ARC: 2, WATCH_ARC + 8: 1, NOTIFY_TX - 16: 0, NOTIFY_TX - 8: 0, NOTIFY_TX: 0}


def test_a_notify_inside_a_watch_channels_shared_is_not_read_as_an_arc() -> None:
    """axum's connection task waits on `watch::Sender::closed()`: reading notify_tx's preceding word
    as a strong count gave 0 and "nothing can wake"; a live Arc's counts are >= 1: unknown."""
    t = task(1, "axum::serve::handle_connection",
             [leaf("tokio::sync::Notify::notified", Resource("Notify", NOTIFY_TX))])
    graph, _ = analyse([t], _Reader(WATCH_WORDS), inventory("axum::serve::handle_connection"), 0)
    assert graph.findings == ()
    [w] = graph.waits
    assert w.wakers is None and "no live Arc header" in w.evidence and "unknown" in w.evidence, w.evidence
    # absurd counts are no Arc header either (a pointer where the strong count would be)
    huge = {**WATCH_WORDS, NOTIFY_TX - 16: 0x7f00_0000_1000, NOTIFY_TX - 8: 0x7f00_0000_2000}
    graph, _ = analyse([t], _Reader(huge), inventory("axum::serve::handle_connection"), 0)
    assert graph.findings == () and graph.waits[0].wakers is None, graph.waits


def test_a_real_arc_header_is_still_read() -> None:
    """The counts check keeps what a real ArcInner says: an mpsc receiver's Arc, strong 1 (its
    own handle) and weak 1: every sender is dropped, the receive ends."""
    t = task(4, "app::d", [leaf("tokio::sync::mpsc::Receiver::recv", Resource("mpsc", 0x4000))])
    graph, _ = analyse([t], _Reader({0x4000: 1, 0x4008: 1}), inventory("app::d"), 0)
    assert graph.findings == ()
    [w] = graph.waits
    assert w.wakers == () and w.external and "every sender is dropped" in w.evidence, w.evidence
