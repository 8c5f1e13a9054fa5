"""One model per stop (proxy.snapshot), end to end: real gdb -> asyncrsp -> gdbserver.

* Agreement: at a stop, `bt`, `tree`, `tasks`, `where` and the JSON document
  (qXfer:asyncrsp.graph, read with gdb's `maint packet`) say the same name,
  state and line for every coroutine. The scenario of `first_poll`: a
  breakpoint in the leaf `c` during its first poll, reached from a spawned `a`
  through `join!(b(1), b(2))` and `b(1)`: every `__state` on the way still
  reads Unresumed, yet all of them run on the thread, and `a`'s line is the
  `join!` in the program, not tokio's `maybe_done.rs`.
* The wait-for graph: on `deadlock`, `monitor async deadlocks` names exactly
  the two-task Mutex cycle, the task awaiting the JoinHandle of one of them
  and the task waiting on a Notify only it can reach; live (every poll
  observed) and attached with nothing planted (`--mode off`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from integration.corpus import markers
from integration.harness.monitor import ask, attached, check_deadlocks, corpus_binary, decode_maint_packet, section, session

ROOT = Path(__file__).resolve().parents[1]


def await_lines(program: str, parent: str, child: str) -> set[int]:
    return {m.line for m in markers.await_markers(program) if m.parent == parent and m.child == child}


def bp_line(program: str, name: str) -> int:
    return markers.breakpoint_markers(program)[name][1]


# ---- reading the commands' output --------------------------------------------------

LOC = r"(?P<file>\S+?):(?P<line>\d+)"


def bt_frames(text: str) -> list[tuple[str, str, str, int]]:
    """(name, task id or '', 'running'|'awaiting', line) per frame, innermost first."""
    out = []
    for m in re.finditer(r"^#\d+  (?P<name>\S+) (?:\(#(?P<id>\d+)\)|\[inlined\]|\(no id\)) "
                         rf"(?P<verb>at|awaiting at) {LOC}$", text, re.M):
        out.append((m["name"], m["id"] or "", "running" if m["verb"] == "at" else "awaiting", int(m["line"])))
    return out


def tree_coroutines(text: str) -> list[tuple[str, str, int | None]]:
    """(name, state, line) of every coroutine line of a tree: state is 'running',
    'suspended' or the bracketed tag."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^[ │├└╼─]*(?:\[[^]]+\] )?(?P<name>[\w:<>{}@#, ]+?)(?: at " + LOC + r")?"
                     r"(?P<rest>(?: \(.*\))?(?: \[(?P<tag>[^]]+)\])?)$", line)
        if not m or not line.lstrip(" │├└").startswith("╼") and not line.startswith("╼"):
            continue
        name = m["name"]
        if "::" not in name or name.startswith("tokio::") and "!" in name:
            continue
        state = "running" if "(running on thread" in m["rest"] else m["tag"] or ("suspended" if m["line"] else "?")
        out.append((name, state, int(m["line"]) if m["line"] else None))
    return out



def read_json(chunks: int = 48, size: int = 0x800) -> list[str]:
    return ["echo ==json==\\n"] + [f"maint packet qXfer:asyncrsp.graph:read::{i * size:x},{size:x}"
                                   for i in range(chunks)] + ["echo ==end==\\n"]


def json_coroutines(doc: dict) -> dict[int, tuple[str, str, int | None]]:  # type: ignore[type-arg]
    out = {}

    def walk(n: dict) -> None:  # type: ignore[type-arg]
        if n["kind"] == "coroutine" and n["id"] is not None:
            st = n["state"]
            out[n["id"]] = (n["name"], st["kind"], st["line"])
        for c in n["children"]:
            walk(c)

    for t in doc["tasks"]:
        walk(t["tree"])
    return out


def _agree(out: str, program: str) -> dict[str, tuple[str, int | None]]:
    """Check that bt, tree, tasks, where and the JSON agree; return {name: (state, line)} of the
    running chain (bt's frames)."""
    bt = bt_frames(section(out, "bt"))
    assert bt, section(out, "bt")
    tree = tree_coroutines(section(out, "tree"))
    by_name: dict[str, list[tuple[str, int | None]]] = {}
    for name, state, line in tree:
        by_name.setdefault(name, []).append((state, line))
    doc = json.loads(decode_maint_packet(section(out, "json")))
    assert doc["schema"] == "asyncrsp.graph" and doc["version"] == 2
    jc = json_coroutines(doc)
    chain = {}
    for name, tid, verb, line in bt:
        # tree: the same coroutine, running, at the same line
        assert ("running", line) in by_name.get(name, []), (name, line, section(out, "tree"), section(out, "bt"))
        chain[name] = ("running", line)
        if tid:
            where = section(out, f"where #{tid}")
            assert re.match(rf"#{tid} {re.escape(name)} \(0x[0-9a-f]+\): running on thread \d+ at \S+:{line}$",
                            where), (where, name, line)
            assert jc[int(tid)] == (name, "running", line), (jc.get(int(tid)), name, line)
    # tasks: the task running on the thread (the outermost bt frame's task) is running, and AT
    # is the line of its innermost coroutine of the program's crate; both in the tree
    tasks = section(out, "tasks")
    outer_name = bt[-1][0]  # (with several worker threads, another task may be in a poll too)
    runs = [r for r in tasks.splitlines() if re.match(r"^#\d+\s+0x[0-9a-f]+\s+running on thread", r)
            and r.split()[-1] == outer_name]
    assert len(runs) == 1, tasks
    row = runs[0].split()
    inner = next(f for f in bt if f[0].startswith(program + "::"))
    assert row[6].endswith(f":{inner[3]}"), (row, inner)
    return chain


def _stop(prog: Path, args: list[str], bp: str, extra: list[str] = ()) -> str:  # type: ignore[assignment]
    """One session: bt, tree, tasks, `where` for the first task ids (bt names some of
    them), and the JSON document, all at the one stop."""
    wheres = [c for k in range(1, 25) for c in ask(f"where #{k}")]
    return session(prog, args, [f"break {bp}", "continue", *ask("bt", "tree", "tasks"), *wheres, *read_json()],
                   extra=[*extra])


@pytest.mark.parametrize("config,rt,extra", [
    ("debug", "ct", []), ("debug", "mt", []), ("release", "ct", ["--tokio-adapter"]),
    ("release", "mt", ["--tokio-adapter"]),
])
def test_first_poll_every_command_agrees(config: str, rt: str, extra: list[str]) -> None:
    """The issue's stop: c's first poll, reached through a spawned a, join! and b(1)."""
    prog = corpus_binary(config, "first_poll")
    out = _stop(prog, [rt], f"first_poll.rs:{bp_line('first_poll', 'c_first_poll')}", extra)
    chain = _agree(out, "first_poll")
    assert chain["first_poll::c"] == ("running", bp_line("first_poll", "c_first_poll")), chain
    assert chain["first_poll::b"][1] in await_lines("first_poll", "b", "c"), chain
    # a's line is the join! in the program (its __state is Unresumed: no state line exists)
    assert chain["first_poll::a"][1] in await_lines("first_poll", "a", "join"), chain
    assert "maybe_done.rs" not in section(out, "bt") + section(out, "tree"), out
    # The program's own tasks (a, b, c are all in a poll at this stop). A runtime task may
    # honestly show "[not yet polled]": under the multi-thread runtime tokio queues one
    # BlockingTask per worker launch, and the fresh-clone suite once stopped before the
    # blocking pool had picked up the second one.
    program_blocks = [b for b in section(out, "tree").split("task #") if "first_poll::" in b.split("\n", 1)[0]]
    assert program_blocks and not [b for b in program_blocks if "[not yet polled]" in b], section(out, "tree")
    assert "{async_fn#0}" not in section(out, "bt") + section(out, "tree") + section(out, "tasks")


@pytest.mark.parametrize("config", ["debug", "release"])
def test_tokio_app_every_command_agrees(config: str) -> None:
    """tokio_app's c after its sleep: run -> a -> b -> c, the same in every command."""
    prog = corpus_binary(config, "tokio_app")
    out = _stop(prog, ["ct"], f"tokio_app.rs:{bp_line('tokio_app', 'c_after_sleep')}")
    chain = _agree(out, "tokio_app")
    assert [n for n in chain] == ["tokio_app::c", "tokio_app::b", "tokio_app::a", "tokio_app::run"], chain


# ---- the wait-for graph -------------------------------------------------------------------


@pytest.mark.parametrize("config,rt", [("debug", "mt"), ("debug", "ct"), ("release", "mt")])
def test_deadlocks_live(config: str, rt: str) -> None:
    prog = corpus_binary(config, "deadlock")
    out = session(prog, [rt], [f"break deadlock.rs:{bp_line('deadlock', 'ready')}", "continue",
                               *ask("deadlocks", "waits")])
    check_deadlocks(section(out, "deadlocks"))
    waits = section(out, "waits")
    # the tasks that are not stuck: who wakes them
    assert re.search(r"deadlock::receiver  waits on mpsc 0x[0-9a-f]+: .*\[woken by #\d+ deadlock::sender_holder\]$",
                     waits, re.M), waits
    assert re.search(r"deadlock::once_waiter  waits on oneshot 0x[0-9a-f]+: .*\[woken by #\d+ "
                     r"deadlock::sender_holder\]$", waits, re.M), waits


@pytest.mark.parametrize("config", ["debug", "release"])
def test_deadlocks_attached_mode_off(config: str) -> None:
    """Stuck before the proxy came, nothing planted: the tokio adapter finds the tasks,
    memory alone gives the same findings."""
    prog = corpus_binary(config, "deadlock")
    locals_ = [f"locals #{n}" for n in range(1, 21)]  # ids are given in discovery order; the cycle's are among these
    out = attached(prog, ["mt"], "deadlock ready", ask("deadlocks", "tree", "waits", "tasks", *locals_),
                   ["--mode", "off", "--tokio-adapter"])
    check_deadlocks(section(out, "deadlocks"))
    # the tree names a Mutex's holder by the id every command shows, not by the runtime's own
    # task id (tokio's ids are other numbers: the tree said "held by task tokio#3" for #4)
    ids = dict((name, tid) for tid, name in re.findall(r"#(\d+) deadlock::(lock_ab|lock_ba) ->", section(out, "deadlocks")))
    held = re.findall(r"held by task (\S+) deadlock::(lock_ab|lock_ba)\)", section(out, "tree"))
    assert held and all(tid == f"#{ids[name]}" for tid, name in held), (ids, section(out, "tree"))
    # a multi-thread runtime's workers are blocking-pool tasks: named as such, not by their closure's type,
    # and started (their closure taken out of the task), so running on the pool
    tasks = section(out, "tasks")
    assert "BlockingTask<" not in tasks and "spawn_blocking(runtime worker)" in tasks, tasks
    assert "spawn_blocking(runtime worker) (running on the blocking pool)" in section(out, "tree"), section(out, "tree")
    # ... and `tasks` says so in its STATE column ("running", no thread: tokio does not record which
    # pool thread took it), not "unknown"
    workers = [row for row in tasks.splitlines() if "spawn_blocking(runtime worker)" in row]
    assert workers and all(re.match(r"#\d+\s+0x[0-9a-f]+\s+running\s", row) for row in workers), tasks
    # `locals` shows each guard as the Mutex it holds, the same address `waits` names
    waits = section(out, "waits")
    for name, tid in ids.items():
        holds = re.search(rf"^#{tid} deadlock::{name}  holds Mutex (0x[0-9a-f]+)", waits, re.M)
        guard = re.search(r"^  held: tokio::sync::mutex::MutexGuard<u64> = \{lock: (0x[0-9a-f]+)\}$",
                          section(out, f"locals #{tid}"), re.M)
        assert holds and guard and holds[1] == guard[1], (name, waits, section(out, f"locals #{tid}"))
