"""monitor async ... rendered for a hand-built graph (the rendering is under test)."""

from __future__ import annotations

import struct

import pytest
from tests.proxy.graph.graphfix import BIAS, Script, engine

from proxy.commands.monitor import MonitorContext, MonitorError, parse_monitor, run_monitor
from proxy.graph.engine import Engine
from proxy.snapshot import SnapshotInputs, build_snapshot

A, B, C = 0x100000, 0x100040, 0x100080
SEL, X, Y = 0x200000, 0x200100, 0x200200


def graph() -> Engine:
    """Thread 1 is inside a -> b -> c (a breakpoint in c); thread 2's select! is pending."""
    s = Script()
    s.enter("a", A); s.enter("b", B); s.enter("c", C); s.exit(3); s.exit(3); s.exit(3)
    s.enter("sel", SEL, thread=2)
    s.enter("x", X, thread=2); s.exit(3, thread=2)
    s.enter("y", Y, thread=2); s.exit(3, thread=2)
    s.exit(3, thread=2)
    s.enter("a", A); s.enter("b", B); s.enter("c", C)
    e = engine()
    e.feed_many(s.events)
    return e


MEMORY = {
    X + 16: struct.pack("<I", 42),
    X + 20: b"\x01",
    X + 24: struct.pack("<QQ", 0x9000, 5),
    0x9000: b"hello",
}


def read(addr: int, size: int) -> bytes | None:
    data = MEMORY.get(addr)
    return data[:size] if data is not None and len(data) >= size else None


def ctx(e: Engine | None = None, **kw: object) -> MonitorContext:
    """The engine's graph with no memory walk (rule 9 of proxy.snapshot.build: the tree is
    the engine's pending edges); `locals` still reads memory (the snapshot's read, as the
    session binds it to each command pass)."""
    e = graph() if e is None else e
    base: dict[str, object] = dict(thread=1, pcs={1: 0x1020 + BIAS}, read_memory=read)
    base.update(kw)
    inputs = SnapshotInputs(inventory=e.catalog.inventory, bias=BIAS, engine=e, pcs=base["pcs"],  # type: ignore[arg-type]
                            memory=False)
    return MonitorContext(e, snapshot=lambda: build_snapshot(inputs, base["read_memory"]), **base)  # type: ignore[arg-type]


def run(text: str, c: MonitorContext | None = None) -> str:
    return run_monitor(text, c or ctx())


def test_tasks_table() -> None:
    # One row per live task (a root future), its state, and AT: the line of its innermost
    # coroutine (where it runs, or the .await it waits at). The script's events are 1 µs
    # apart: a's first poll spans entry 1 µs to exit 6 µs (busy 5 µs), its second starts at
    # 13 µs (idle 7 µs); no backend is named, so no capture cost is subtracted.
    assert run("async tasks") == "\n".join([
        "ID  ADDRESS   STATE                AT              POLLS  BUSY  IDLE  LONGEST  THREAD  FOUND BY  ASYNC FN",
        "#1  0x100000  running on thread 1  src/main.rs:2   2      5us   7us   5us      1       observed  rt::a",
        "#4  0x200000  suspended            src/main.rs:13  1      5us   0ns   5us      2       observed  rt::sel",
        "capture cost subtracted: 0ns per event (not known: raw durations)",
    ])


def test_tasks_group_filters_and_limit() -> None:
    assert run("tasks --group") == "\n".join([
        "COUNT  STATE                AT              ASYNC FN         TASKS",
        "1      running on thread 1  src/main.rs:2   rt::a > rt::c    #1",
        "1      suspended            src/main.rs:13  rt::sel > rt::x  #4",
        "2 tasks in 2 groups",
    ])
    assert [line.split()[0] for line in run("tasks --state running").splitlines()[1:-1]] == ["#1"]
    assert [line.split()[0] for line in run("tasks --fn '^rt::s'".replace("'", "")).splitlines()[1:-1]] == ["#4"]
    assert [line.split()[0] for line in run("tasks --fn rt::x").splitlines()[1:-1]] == ["#4"]  # a coroutine in it
    limited = run("tasks --limit 1").splitlines()
    assert limited[2].startswith("... 1 more tasks (2 in all): tasks --limit 0 for all"), limited
    assert run("tasks --state bogus").startswith("asyncrsp: unknown state 'bogus'; one of")
    assert run("tasks --fn (").startswith("asyncrsp: bad --fn regex '('")
    assert run("tasks --limit x") == "asyncrsp: bad limit 'x': give a number"


def test_bt_of_the_current_thread_and_of_another() -> None:
    assert run("async bt") == "\n".join([
        "logical async backtrace of thread 1 (task #1 rt::a):",
        "#0  rt::c (#3) at src/main.rs:2",
        "#1  rt::b (#2) awaiting at src/main.rs:5",
        "#2  rt::a (#1) awaiting at src/main.rs:9",
        "#3  <root: polled by the executor>",
    ])
    assert run("async bt 2") == "thread 2 is not polling any coroutine"
    assert run("async bt two") == "asyncrsp: bad thread 'two': give the thread's LWP id"


def test_tree_pending_only() -> None:
    assert run("async tree") == "\n".join([
        "task #1 0x100000  rt::a::{async_fn_env#0}  (root, thread 1)",
        "╼ rt::a at src/main.rs:9 (running on thread 1)",
        "└╼ rt::b at src/main.rs:5 (running on thread 1)",
        "   └╼ rt::c at src/main.rs:2 (running on thread 1)",
        "task #4 0x200000  rt::sel::{async_fn_env#0}  (root, thread 2)",
        "╼ rt::sel at src/main.rs:20",
        "├╼ rt::x at src/main.rs:13",
        "└╼ rt::y at src/main.rs:16",
    ])
    assert run("async tree #2").splitlines() == [  # a coroutine inside a task: its subtree
        "task #2 0x100040  rt::b::{async_fn_env#0}  (in task #1)",
        "╼ rt::b at src/main.rs:5 (running on thread 1)",
        "└╼ rt::c at src/main.rs:2 (running on thread 1)",
    ]


def test_tree_leaves_out_completed_children_and_nests_with_bars() -> None:
    s = Script()
    s.enter("sel", SEL)
    s.enter("x", X); s.enter("c", C); s.exit(3); s.exit(3)
    s.enter("y", Y); s.exit(1)  # completed: not in the tree
    s.enter("b", B); s.exit(3)
    s.exit(3)
    e = engine()
    e.feed_many(s.events)
    assert run("tree", ctx(e)) == "\n".join([
        "task #1 0x200000  rt::sel::{async_fn_env#0}  (root, thread 1)",
        "╼ rt::sel at src/main.rs:20",
        "├╼ rt::x at src/main.rs:13",
        "│  └╼ rt::c at src/main.rs:2",
        "└╼ rt::b at src/main.rs:5",
    ])


def test_edges_pending_completed_and_by_parent() -> None:
    s = Script()
    s.enter("sel", SEL); s.enter("x", X); s.exit(3); s.enter("y", Y); s.exit(1); s.exit(3)
    e = engine()
    e.feed_many(s.events)
    c = ctx(e)
    assert run("edges", c) == "#1 rt::sel -> #2 rt::x at src/main.rs:21  (pending)"
    assert run("edges --completed", c).splitlines() == [
        "#1 rt::sel -> #2 rt::x at src/main.rs:21  (pending)",
        "#1 rt::sel -> #3 rt::y at src/main.rs:22  (completed)",
    ]
    assert run("edges --parent #2", c) == "no pending edges"
    assert run("edges --parent", c) == "asyncrsp: --parent needs a value"
    assert run("edges --parent #99", c) == "asyncrsp: no task '#99' (see 'monitor async tasks')"


def test_where() -> None:
    assert run("where #5") == "#5 rt::x (0x200100): suspended at src/main.rs:13, suspend index 0"
    assert run("where 0x100000") == "#1 rt::a (0x100000): running on thread 1 at src/main.rs:9"
    assert run("where") == "asyncrsp: usage: where TASK [--stack]"


def test_locals_decoded_from_memory() -> None:
    assert run("locals #5") == "\n".join([
        "#5 rt::x Suspend0 at src/main.rs:13:",
        "  n: u32 = 42",
        "  flag: bool = true",
        '  name: &str = "hello"',
    ])
    assert run("locals #6").splitlines()[1] == "  n: u32 = <unreadable at 0x200210>"
    assert run("locals #5", ctx(read_memory=None)) == "asyncrsp: memory cannot be read in this session"


def test_stats_all_with_proxy_lines() -> None:
    out = run("stats --all", ctx(proxy_lines=["hidden stops: 12", "time in hidden stops: 3.1 ms"]))
    assert out.splitlines()[0] == "events: 15 (enters 9, exits 6, lost 0, rejected 0)"
    assert out.splitlines()[-2:] == ["hidden stops: 12", "time in hidden stops: 3.1 ms"]


def test_stats_summary_is_short() -> None:
    """The capture first, then events and lost, tasks, the session's host and cost lines."""
    summary = ["capture: uprobes (auto: uprobes available)", "program's host: pid 7, proved",
               "proxy's cost: 0.40 s of CPU, RSS 80 MB; the program: 0 hidden stops (0.0 ms)"]
    c = ctx(proxy_lines=["hidden stops: 12"], summary_lines=summary)
    st = c.engine.stats()  # type: ignore[union-attr]
    out = run("stats", c).splitlines()
    assert out == [summary[0], f"events: {st.events} recorded, {st.events_lost} lost",
                   f"tasks: {st.tasks_live} live, {st.tasks_seen} seen", *summary[1:],
                   "(every counter: monitor async stats --all)"]
    assert "hidden stops: 12" not in out
    assert run("stats --verbose") == "asyncrsp: usage: stats [--all]"


def test_help_lists_every_command() -> None:
    out = run("help")
    for name in ("tasks", "tree", "bt", "edges", "where", "locals", "stats", "mode", "capture", "help"):
        assert any(line.split()[0] == name for line in out.splitlines()[1:-1])
    assert run("") == out and run("async") == out


def test_errors_are_one_line() -> None:
    assert run("frobnicate") == "asyncrsp: unknown command 'frobnicate'; try 'monitor async help'"
    assert run("tasks --bogus") == "asyncrsp: unknown option --bogus"
    assert run("tree a b") == "asyncrsp: too many arguments; usage: tree [TASK]"
    assert run("mode") == "asyncrsp: 'mode' is not available in this session"
    assert run("capture tracepoints", ctx(capture=lambda a: f"capture {a}")) == (
        "capture ('tracepoints',)")
    assert run("__import__('os')") .startswith("asyncrsp: unknown command")
    with pytest.raises(MonitorError):
        parse_monitor("async nope")


def test_no_async_code_says_so() -> None:
    c = MonitorContext(None, note="no debug info in /tmp/prog: cannot find coroutines")
    assert run("tasks", c) == "asyncrsp: no debug info in /tmp/prog: cannot find coroutines"
    assert run("help", c).startswith("monitor async COMMAND")


def test_tasks_before_any_poll_and_after_lost_events() -> None:
    e = engine()
    assert run("tasks", ctx(e)) == "no live tasks found"
    s = Script()
    s.enter("a", A); s.lost()
    e.feed_many(s.events)
    assert run("tasks", ctx(e)).splitlines()[0].startswith("warning: poll events were lost")
