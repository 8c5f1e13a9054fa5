"""Reflection end to end: real gdb -> asyncrsp -> gdbserver -> corpus programs.

`monitor async tree` reads every task's pending-future tree from memory
(proxy.reflect). The release, LTO and rustc 1.63 builds inline most resume
functions, so poll observation alone sees a different, shorter graph; the
tree read from memory must be the same as the debug build's. Expected lines
come from the `// await:` / `// bp:` markers of the corpus sources.
"""

from __future__ import annotations

import ast
import random
import re
from pathlib import Path

import pytest

from integration.corpus import markers
from integration.harness.monitor import ask, attached, corpus_binary, section, session

ROOT = Path(__file__).resolve().parents[1]


SRC = "tokio_app.rs"


def await_line(program: str, parent: str, child: str) -> list[int]:
    return [m.line for m in markers.await_markers(program) if m.parent == parent and m.child == child]


def bp_line(name: str, program: str = "tokio_app") -> int:
    return markers.breakpoint_markers(program)[name][1]


def tree_body(text: str) -> list[str]:
    """The tree lines without task headers, with paths reduced to file names."""
    out = []
    for line in text.splitlines():
        if line.startswith(("task ", "note: ")) or not line.strip():
            continue
        line = re.sub(r"/\S*/([^/\s]+:\d+)", r"\1", line)
        line = re.sub(r"thread \d+", "thread N", line)
        line = re.sub(r"0x[0-9a-f]+", "0xADDR", line)
        out.append(line)
    return out


def tree_at(config: str, hits: int = 1, rt: str = "ct") -> str:
    prog = corpus_binary(config, "tokio_app")
    cmds = [f"break {SRC}:{bp_line('c_after_sleep')}"]
    if hits > 1:
        cmds.append(f"ignore 1 {hits - 1}")
    out = session(prog, [rt], cmds + ["continue", *ask("tree")])
    return section(out, "tree")


def test_debug_tree_is_the_serial_chain() -> None:
    tree = tree_at("debug")
    body = tree_body(tree)
    want = [
        (r"tokio_app::run at tokio_app.rs:(\d+)", await_line("tokio_app", "run", "a")),
        (r"tokio_app::a at tokio_app.rs:(\d+)", await_line("tokio_app", "a", "b")),
        (r"tokio_app::b at tokio_app.rs:(\d+)", await_line("tokio_app", "b", "c")),
        (r"tokio_app::c at tokio_app.rs:(\d+) \(running on thread N\)", [bp_line("c_after_sleep")]),
    ]
    assert len(body) == len(want), tree
    for line, (pattern, lines) in zip(body, want):
        m = re.search(pattern, line)
        assert m and int(m.group(1)) in lines, (line, pattern, lines, tree)


@pytest.mark.parametrize("config", ["release", "lto", "old-release"])
def test_optimised_builds_show_the_debug_tree(config: str) -> None:
    """Inlined coroutines (a, b, run in one resume function) are their own frames."""
    want = tree_body(tree_at("debug"))
    got = tree_at(config)
    assert tree_body(got) == want, f"{config}:\n{got}\n--- debug:\n" + "\n".join(want)


@pytest.mark.parametrize("config", ["debug", "release"])
def test_join_inside_select_inside_spawned_task(config: str) -> None:
    """10th stop in c: select_join's join!(c(20), c(21)) with c(20) done, c(21) running."""
    tree = tree_at(config, hits=10)
    lines = tree.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("task") and "select_join" in line)
    block = "\n".join(lines[start:start + 8])
    body = tree_body(block)
    # the select!/join! awaits at their lines in the program (DWARF says tokio's select.rs/join.rs)
    sel = await_line("tokio_app", "select_join", "select")[0]
    join = await_line("tokio_app", "select_join::{async_block}", "join")[0]
    assert re.match(rf"╼ tokio_app::select_join at tokio_app.rs:{sel}\b", body[0]), block
    assert body[1] == "└╼ tokio::select!", block
    assert re.match(rf"   ├╼ \[branch 0\] tokio_app::select_join::\{{async_block@{sel + 1}\}} at tokio_app.rs:{join}\b",
                    body[2]), block
    assert body[3] == "   │  └╼ tokio::join!", block
    # join! rotates which branch it polls first: one c is Done, the other is running
    running = rf"tokio_app::c at tokio_app.rs:{bp_line('c_after_sleep')} \(running on thread N\)"
    done = r"tokio_app::c \[completed\]"
    b0, b1 = body[4][len("   │     ├╼ [branch 0] "):], body[5][len("   │     └╼ [branch 1] "):]
    assert body[4].startswith("   │     ├╼ [branch 0] ") and body[5].startswith("   │     └╼ [branch 1] "), block
    assert {bool(re.fullmatch(running, b)) for b in (b0, b1)} == {True, False}, block
    assert {bool(re.fullmatch(done, b)) for b in (b0, b1)} == {True, False}, block
    assert re.match(r"   └╼ \[branch 1\] tokio::time::Sleep \((59\.\d|60\.0) min left\)", body[6]), block


def _layout(config: str, name: str):  # type: ignore[no-untyped-def]
    from proxy.analysis.inventory import build_inventory

    inv = build_inventory(corpus_binary(config, "tokio_app"))
    return inv.layouts[name]


def test_garbage_in_a_state_machine_is_an_unreadable_node() -> None:
    """Random bytes over b's state machine (and a __state no layout has): a marked node, no error.

    gdb's own Python finds b's address in `monitor async tasks` and writes the bytes
    (M packets through the proxy), all in one session: stack addresses differ between runs.
    """
    prog = corpus_binary("debug", "tokio_app")
    lay = _layout("debug", "tokio_app::b::{async_fn_env#0}")
    rnd = random.Random(5)
    noise = bytes(rnd.randrange(256) for _ in range(16))
    bad = next(v for v in range(3, 256) if lay.state(v) is None)
    script = (
        "python\n"
        "import re\n"
        "where = gdb.execute('monitor async where #3', to_string=True)\n"
        "b = int(re.search(r'^#3 tokio_app::b \\(0x([0-9a-f]+)\\)', where, re.M).group(1), 16)\n"
        "inf = gdb.selected_inferior()\n"
        f"inf.write_memory(b + {lay.state_offset - 8}, {noise!r})\n"
        f"inf.write_memory(b + {lay.state_offset}, bytes([{bad}]))\n"
        "print('==b==0x%x' % b)\n"
    )
    out = session(prog, ["ct"], [f"break {SRC}:{bp_line('c_after_sleep')}", "continue", script,
                                 *ask("tree", "tasks")])
    m = re.search(r"==b==0x([0-9a-f]+)", out)
    assert m, out[-3000:]
    tree = section(out, "tree")
    assert "internal error" not in out and "Traceback" not in out, out[-3000:]
    assert re.search(rf"<unreadable tokio_app::b: __state {bad} is not a state at 0x{m.group(1)}>", tree), tree
    assert "tokio_app::a at" in tree, tree  # the healthy part of the tree is still there


@pytest.mark.parametrize("config,mode", [("debug", "full"), ("release", "off")])
def test_tasks_seen_before_that_are_gone_are_not_garbage(config: str, mode: str) -> None:
    """Every stop at c, each asking `tree`: tasks found at earlier stops (the spawned worker,
    c futures on the stack) complete, their heap slots are reused and their stack frames
    return. Nothing at the later stop says they exist, so reading their old address is not
    corruption: they were shown as `<unreadable ...: __state N is not a state>` roots (seen
    at the 7th stop in debug, full mode); now they are left out like completed tasks. The
    corruption test above keeps the marked node for a task that is alive at the stop."""
    prog = corpus_binary(config, "tokio_app")
    script = (
        "python\n"
        "for i in range(30):\n"
        "    if gdb.selected_inferior().pid == 0:\n"
        "        break\n"
        "    print('==stop %d==' % i)\n"
        "    print(gdb.execute('monitor async tree', to_string=True))\n"
        "    gdb.execute('continue', to_string=True)\n"
        "print('==stops done==')\n"
    )
    out = session(prog, ["ct"], [f"break {SRC}:{bp_line('c_after_sleep')}", "continue", script],
                  extra=["--mode", mode])
    assert "==stops done==" in out and "Traceback" not in out, out[-3000:]
    stops = re.split(r"==stop \d+==\n", out.split("==stops done==")[0])[1:]
    assert len(stops) >= 8, out[-3000:]  # the worker finishes before the last stops
    running = rf"tokio_app::c at \S+tokio_app.rs:{bp_line('c_after_sleep')} \(running on thread \d+\)"
    for i, tree in enumerate(stops):
        assert "<unreadable" not in tree, f"stop {i}:\n{tree}"
        assert re.search(running, tree), f"stop {i}:\n{tree}"


@pytest.mark.parametrize("line_text,child", [("let mut acc = 0;", "looped"), ("let square = Square { side: 4 };",
                                                                          "shapes")])
def test_a_running_parent_shows_the_await_it_runs_not_its_last_suspend(line_text: str, child: str) -> None:
    """nested's `run` suspended in `a(i).await` (its `__state` says so), then went on to
    `looped().await` / `shapes().await` without suspending: at the child's first poll the
    stack shows run polling it; run's line must be that await (its frame's line, like gdb's
    bt), not the stale state's `a(i).await`."""
    prog = corpus_binary("debug", "nested")
    src = markers.program_sources("nested")[0]
    line = next(i for i, text in enumerate(src.read_text().splitlines(), 1) if line_text in text)
    out = session(prog, [], [f"break main.rs:{line}", "continue", *ask("tree")], extra=["--mode", "off"])
    tree = section(out, "tree")
    m = re.search(rf"╼ nested::run at \S+main.rs:(\d+) \(running on thread \d+\)\n└╼ nested::{child} at \S+main.rs:"
                  rf"{line} \(running on thread \d+\)", tree)
    assert m, tree
    assert int(m.group(1)) in await_line("nested", "run", child), tree
    assert int(m.group(1)) not in await_line("nested", "run", "a"), tree


@pytest.mark.parametrize("config", ["debug", "release", "old-release"])
def test_stuck_runtime_attached_mode_off(config: str) -> None:
    """Every task stuck before the proxy came; nothing planted (--mode off): the tokio
    adapter finds the tasks, reflection says what each waits on and where."""
    prog = corpus_binary(config, "stuck")
    out = attached(prog, ["mt"], "stuck ready", ask("tasks", "tree"), ["--mode", "off", "--tokio-adapter"])
    tree = section(out, "tree")
    tasks: dict[str, str] = {}
    for block in re.split(r"\n(?=task )", tree):
        m = re.match(r"task (?:\S+ )?0x[0-9a-f]+\s+(?:core::future::from_generator::GenFuture<)?stuck::(\w+)::", block)
        if m:
            tasks[m.group(1)] = block
    # the five spawned tasks from tokio's heap, `run` (block_on's future) from the main thread's
    # stack (a DWARF location in debug and 1.63 release; 1.95 release finds it by a scan, whose
    # hits are narrowed by their saved locals: 116 attaches in a row found it, so it is asserted
    # in release too).
    assert set(tasks) >= {"lock_ab", "lock_ba", "sleeper", "receiver", "oneshot_waiter"}, tree
    assert "run" in tasks and "(on the stack of thread" in tasks["run"], tree

    def waits_at(name: str, child: str) -> None:
        lines = await_line("stuck", name, child)
        m = re.search(rf"╼ stuck::{name} at \S+stuck.rs:(\d+)", tasks[name])
        assert m and int(m.group(1)) in lines, (name, lines, tasks[name])

    for name, child in (("lock_ab", "lock"), ("lock_ba", "lock"), ("sleeper", "sleep"),
                        ("receiver", "recv"), ("oneshot_waiter", "oneshot"), ("run", "pending")):
        if name in tasks:
            waits_at(name, child)
    # the deadlock: each waits on the Mutex the other holds
    ab = re.search(r"waits on Mutex (0x[0-9a-f]+), held by task \S+ stuck::lock_ba", tasks["lock_ab"])
    ba = re.search(r"waits on Mutex (0x[0-9a-f]+), held by task \S+ stuck::lock_ab", tasks["lock_ba"])
    assert ab and ba and ab.group(1) != ba.group(1), tree
    assert re.search(r"tokio::time::Sleep \((59\.\d|60\.0) min left\)", tasks["sleeper"]), tasks["sleeper"]
    assert "waits on mpsc channel 0x" in tasks["receiver"], tasks["receiver"]
    assert "waits on oneshot channel 0x" in tasks["oneshot_waiter"], tasks["oneshot_waiter"]
    assert "tokio runtime" in section(out, "tasks")


@pytest.mark.parametrize("config", ["debug", "release", "old-release"])  # release: 20 of 20 attaches found it
def test_stack_discovery_finds_block_on_future_without_adapter(config: str) -> None:
    """With the runtime adapters off (--adapters off), mode off on an attached program: the threads' stacks give
    `run`, the future `block_on` polls (its pinned `f`: a DWARF location in debug builds,
    optimized out in release ones, where the frame is scanned); spawned tasks parked in
    tokio's heap are on no stack and are not found."""
    prog = corpus_binary(config, "stuck")
    out = attached(prog, ["mt"], "stuck ready", ask("tasks", "tree"), ["--mode", "off", "--adapters", "off"])
    tree = section(out, "tree")
    heads = [line for line in tree.splitlines() if line.startswith("task ")]
    assert len(heads) == 1 and "stuck::run::{async_fn_env#0}" in heads[0], tree
    assert re.search(r"\(on the stack of thread \d+, in tokio::runtime::park::CachedParkThread::block_on", heads[0]), tree
    m = re.search(r"╼ stuck::run at \S+stuck.rs:(\d+)\n└╼ core::future::pending \(never completes\)", tree)
    assert m and int(m.group(1)) in await_line("stuck", "run", "pending"), tree
    assert re.search(r"^#\d+\s+0x[0-9a-f]+\s+suspended\s+\S+stuck.rs:\d+\s+-\s+-\s+stack\s+stuck::run$",
                     section(out, "tasks"), re.M), section(out, "tasks")


def test_release_mode_off_finds_the_observed_tasks() -> None:
    """At a user breakpoint in c (release: c inlined into b's resume function), mode off
    (nothing planted, nothing observed) reads the same tree from b's frame on the stack
    (its self in a callee-saved register, from the location list) as the observed graph."""
    prog = corpus_binary("release", "tokio_app")
    trees = {}
    for mode in ("full", "off"):
        out = session(prog, ["ct"], [f"break {SRC}:{bp_line('c_after_sleep')}", "continue", *ask("tree")],
                      extra=["--mode", mode])
        trees[mode] = section(out, "tree")
    assert "on the stack of thread" in trees["off"], trees["off"]
    assert tree_body(trees["off"]) == tree_body(trees["full"]), trees
    assert len(tree_body(trees["off"])) == 4, trees["off"]  # run -> a -> b -> c


def test_release_bt_shows_inlined_frames() -> None:
    """Like gdb's bt: c is inlined into b's resume function, b is the observed frame."""
    prog = corpus_binary("release", "tokio_app")
    out = session(prog, ["ct"], [f"break {SRC}:{bp_line('c_after_sleep')}", "continue", *ask("bt")])
    bt = section(out, "bt")
    assert re.search(rf"^#0  tokio_app::c \[inlined\] at \S+tokio_app.rs:{bp_line('c_after_sleep')}$", bt, re.M), bt
    m = re.search(r"^#1  tokio_app::b \(#\d+\) awaiting at \S+tokio_app.rs:(\d+)$", bt, re.M)
    assert m and int(m.group(1)) in await_line("tokio_app", "b", "c"), bt
    # a and run hold b inline; their resume functions are inlined into block_on's
    for level, name, child in ((2, "a", "b"), (3, "run", "a")):
        m = re.search(rf"^#{level}  tokio_app::{name} \[inlined\] awaiting at \S+tokio_app.rs:(\d+)$", bt, re.M)
        assert m and int(m.group(1)) in await_line("tokio_app", name, child), bt
    assert bt.rstrip().endswith("#4  <root: polled by the executor>"), bt


def test_mode_off_after_a_switch_merges_seen_tasks_with_reflected_ones() -> None:
    """Observed in full mode at c's first stop, switched off, stopped at c again (now inside
    the spawned worker): `tasks` reads memory (worker found on the stack, with c running in
    its tree) and keeps the tasks seen before, marked so."""
    prog = corpus_binary("debug", "tokio_app")
    out = session(prog, ["ct"], [f"break {SRC}:{bp_line('c_after_sleep')}", "continue", *ask("mode off"),
                                 "continue", *ask("tasks", "tree")])
    tasks = section(out, "tasks")
    assert tasks.startswith("note: mode off:"), tasks
    # worker, found on the stack, runs c (AT: c's line); run, observed before the switch, is kept
    # as seen before (a, b and c of the first stop finished: they are not tasks, they were run's)
    assert re.search(rf"^#\d+\s+0x[0-9a-f]+\s+running on thread \d+\s+\S+tokio_app.rs:{bp_line('c_after_sleep')}\s+.*"
                     r"\s+stack\s+tokio_app::worker$", tasks, re.M), tasks
    assert re.search(r"^#1\s+0x[0-9a-f]+\s+suspended\s+.*\s+seen before\s+tokio_app::run$", tasks, re.M), tasks
    tree = section(out, "tree")
    # (the tokio adapter, on by default, finds the same task in the heap: its id is added)
    m = re.search(r"\(on the stack of thread \d+, in tokio_app::worker::\S+?(?:, tokio#\d+)?\)\n╼ tokio_app::worker at \S+:(\d+)"
                  r" \(running on thread \d+\)\n"
                  r"└╼ tokio_app::c at \S+:(\d+) \(running on thread \d+\)", tree)
    assert m and int(m.group(1)) in await_line("tokio_app", "worker", "c"), tree
    assert int(m.group(2)) == bp_line("c_after_sleep"), tree


def _blocks(tree: str, program: str) -> dict[str, str]:
    """Task blocks of a tree by the task's async fn name (`combinators::gather` -> gather)."""
    out: dict[str, str] = {}
    for block in re.split(r"\n(?=task )", tree):
        m = re.match(rf"task (?:\S+ )?0x[0-9a-f]+\s+(?:core::future::from_generator::GenFuture<)?{program}::(\w+)::",
                     block)
        if m:
            out[m.group(1)] = block
    return out


@pytest.mark.parametrize("config,mode", [("debug", "off"), ("debug", "full"), ("release", "off"),
                                         ("old-release", "off")])
def test_futures_combinators_yield_and_io_readiness(config: str, mode: str) -> None:
    """futures' join_all / select / FuturesUnordered, tokio's yield_now and a TcpStream's
    readiness wait, read from memory at a user breakpoint (current-thread runtime: the
    spawned tasks are parked in tokio's heap, found by the adapter). The fd the Readiness
    names must be one of the program's sockets (gdb's Python reads /proc/PID/fd)."""
    prog = corpus_binary(config, "combinators")
    bp = markers.breakpoint_markers("combinators")["checkpoint"][1]
    fds = ("python\nimport os\npid = gdb.selected_inferior().pid\n"
           "print('==fds==', {int(f): os.readlink('/proc/%d/fd/%s' % (pid, f)) for f in os.listdir('/proc/%d/fd' % pid)})\n")
    out = session(prog, [], [f"break combinators.rs:{bp}", "continue", *ask("tree"), fds],
                  extra=["--mode", mode, "--tokio-adapter"])
    tree = section(out, "tree")
    tasks = _blocks(tree, "combinators")
    assert set(tasks) >= {"gather", "race", "pool", "spinner", "reader"}, tree
    step = await_line("combinators", "step", "oneshot")

    def body(name: str) -> list[str]:
        return tree_body(tasks[name])

    def pending_step(line: str, prefix: str) -> None:
        assert re.fullmatch(rf"{re.escape(prefix)}combinators::step at combinators.rs:(\d+)", line) and \
            int(line.rsplit(":", 1)[1]) in step, (line, tree)

    def head(name: str, child: str) -> None:
        m = re.fullmatch(rf"╼ combinators::{name} at combinators.rs:(\d+)", body(name)[0])
        assert m and int(m.group(1)) in await_line("combinators", name, child), (name, tasks[name])

    # join_all of three steps: step 0 got its value before the breakpoint
    b = body("gather")
    head("gather", "join_all")
    assert b[1] == "└╼ futures::future::join_all (3 futures, 1 done)", tasks["gather"]
    assert b[2] == "   ├╼ [0] combinators::step [completed]", tasks["gather"]
    pending_step(b[3], "   ├╼ [1] ")
    assert b[4].startswith("   │  └╼ tokio::sync::oneshot::Receiver (waits on oneshot channel"), tasks["gather"]
    pending_step(b[5], "   └╼ [2] ")
    # select of two boxed steps, both pending
    b = body("race")
    head("race", "select")
    assert b[1] == "└╼ futures::future::select", tasks["race"]
    pending_step(b[2], "   ├╼ [left] ")
    pending_step(b[4], "   └╼ [right] ")
    # FuturesUnordered of three steps: step 20 finished and left the set, two are listed
    b = body("pool")
    head("pool", "next")
    assert b[1:3] == ["└╼ futures::stream::next", "   └╼ futures::stream::FuturesUnordered (2 futures)"], tasks["pool"]
    pending_step(b[3], "      ├╼ [0] ")
    pending_step(b[5], "      └╼ [1] ")
    assert len(b) == 7, tasks["pool"]
    # yield_now: the spinner yielded and is queued again
    b = body("spinner")
    head("spinner", "yield")
    assert b[-1].endswith("└╼ tokio::task::yield_now (yielded, rescheduled)"), tasks["spinner"]
    # readable(): TcpStream::ready -> Registration::readiness -> ScheduledIo::readiness -> Readiness
    b = body("reader")
    head("reader", "readable")
    m = re.search(r"└╼ tokio::io::Readiness \(waits for READABLE on fd (\d+) \(tokio::net::tcp::stream::TcpStream\), "
                  r"ScheduledIo 0xADDR, ready now: writable\)$", b[-1])
    assert m, tasks["reader"]
    fdmap = re.search(r"==fds== (\{.*\})", out)
    assert fdmap, out[-2000:]
    assert ast.literal_eval(fdmap.group(1)).get(int(m.group(1)), "").startswith("socket:["), (m.group(1), fdmap.group(1))


@pytest.mark.parametrize("config", ["release", "old-release", "lto"])
def test_bt_shows_coroutines_inlined_into_outer_frames(config: str) -> None:
    """`outer -> middle -> probe`, probe behind a `Pin<Box<dyn Future>>` (its resume function
    out of line, observed), middle inlined into outer's resume function (release, 1.63
    release) or both inlined into tokio's task poll (LTO): like gdb's bt, middle (and, in LTO,
    outer) is its own frame, with the .await line its state machine records."""
    prog = corpus_binary(config, "combinators")
    bp = markers.breakpoint_markers("combinators")["probe"][1]
    out = session(prog, [], [f"break combinators.rs:{bp}", "continue", *ask("bt")])
    bt = [re.sub(r"/\S*/([^/\s]+:\d+)", r"\1", line) for line in section(out, "bt").splitlines()]
    assert re.fullmatch(rf"#0  combinators::probe \(#\d+\) at combinators.rs:{bp}", bt[1]), bt
    m = re.fullmatch(r"#1  combinators::middle \[inlined\] awaiting at combinators.rs:(\d+)", bt[2])
    assert m and int(m.group(1)) in await_line("combinators", "middle", "probe"), bt
    m = re.fullmatch(r"#2  combinators::outer (\(#\d+\)|\[inlined\]) awaiting at combinators.rs:(\d+)", bt[3])
    assert m and int(m.group(2)) in await_line("combinators", "outer", "middle"), bt
    assert (m.group(1) == "[inlined]") == (config == "lto"), bt  # LTO inlines outer into tokio's poll too
    assert bt[4:] == ["#3  <root: polled by the executor>"], bt
