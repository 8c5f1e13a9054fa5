"""A hand-built snapshot of a server for the picture tests: N connection tasks in
`serve -> handle -> read` (most waiting on their socket, a few at `write`), two tasks in a
Mutex cycle, one blocked on the JoinHandle of one of them."""

from __future__ import annotations

from proxy.analysis.model import SourceLoc
from proxy.snapshot.model import (
    Finding,
    Frame,
    FutureNode,
    Hold,
    Resource,
    Snapshot,
    StateKind,
    Task,
    TaskState,
    Wait,
    WaitGraph,
)

M1, M2, JH = Resource("Mutex", 0x1000), Resource("Mutex", 0x2000), Resource("JoinHandle", 0x3000)


def task(tid: int, frames: list[tuple[str, int]], waits: tuple[Wait, ...] = (), holds: tuple[Hold, ...] = (),
         state: StateKind = StateKind.SUSPENDED) -> Task:
    """frames: (name, line) outermost first; the stack is innermost first, as Task.stack."""
    stack = tuple(Frame(level, name, 0x9000 + tid * 0x100 + level, name + "::{env}", SourceLoc(f"/src/app/{name.split('::')[-1]}.rs", line),
                        level == 0 and state is StateKind.RUNNING)
                  for level, (name, line) in enumerate(reversed(frames)))
    root = FutureNode("coroutine", frames[0][0], 0x9000 + tid * 0x100, frames[0][0] + "::{env}",
                      TaskState(state, loc=SourceLoc("/src/app/x.rs", frames[0][1])))
    return Task(tid, root.addr, root.type_name, frames[0][0], TaskState(state, thread=7 if state is StateKind.RUNNING else None),
                tree=root, stack=stack, waits=waits, holds=holds)


def server(n: int, *, distinct: int = 0) -> Snapshot:
    tasks = []
    for i in range(n):
        leaf = ("app::write", 40) if i % 10 == 0 else ("app::read", 30 + (i % distinct if distinct else 0))
        tasks.append(task(100 + i, [("app::serve", 10), ("app::handle", 20), leaf],
                          waits=(Wait(100 + i, Resource("socket", 0x50000 + i), "io"),)))
    w_ab = Wait(1, M2, "lock_ab awaits m2", wakers=(2,))
    w_ba = Wait(2, M1, "lock_ba awaits m1", wakers=(1,))
    w_j = Wait(3, JH, "joiner awaits the JoinHandle of #1", wakers=(1,))
    tasks += [task(1, [("app::lock_ab", 33), ("tokio::sync::mutex::lock", 359)], waits=(w_ab,), holds=(Hold(1, M1, "guard"),)),
              task(2, [("app::lock_ba", 41), ("tokio::sync::mutex::lock", 359)], waits=(w_ba,), holds=(Hold(2, M2, "guard"),)),
              task(3, [("app::joiner", 47)], waits=(w_j,)),
              task(4, [("app::main", 5)], state=StateKind.RUNNING)]
    graph = WaitGraph(holds=(Hold(1, M1, "guard"), Hold(2, M2, "guard")), waits=(w_ab, w_ba, w_j),
                      findings=(Finding("cycle", (1, 2), "cycle: #1 -> Mutex -> #2 -> Mutex -> #1"),
                                Finding("blocked", (3,), "blocked: #3 -> JoinHandle -> #1")))
    return Snapshot(9, tuple(tasks), waits=graph)
