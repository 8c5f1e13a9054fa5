"""Tasks as threads end to end: real gdb (CLI and MI) and lldb -> asyncrsp --task-threads
-> gdbserver --attach -> the corpus's `stuck` program (every task stuck: a Mutex deadlock,
a sleep, an mpsc and a oneshot receive, and `run` pending forever).

Each live task must be listed as a thread with its name; `bt` of a task thread must
walk the task's logical stack with the `.await` line of each coroutine (the `// await:`
markers of stuck.rs, as `monitor async tree` prints them); `info locals` / `frame
variable` in a coroutine's frame must show its live locals with their values (the
MutexGuard `held` of lock_ab guards the Mutex the program created with 1, lock_ba's
the one created with 2); stepping a task thread is refused; the program survives.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from integration.corpus import markers
from integration.harness.lldb import lldb_batch
from integration.harness.monitor import SRC, bp_line, corpus_binary, session
from integration.harness.transparency import check_transparent
from proxy.threads.model import REGION_BASE, REGION_STRIDE, TID_BASE

ROOT = Path(__file__).resolve().parents[1]


TASKS = ("lock_ab", "lock_ba", "sleeper", "receiver", "oneshot_waiter")
PROXY_ARGS = ["--mode", "off", "--tokio-adapter", "--task-threads"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def await_lines(parent: str, child: str) -> list[int]:
    return [m.line for m in markers.await_markers("stuck") if m.parent == parent and m.child == child]


@contextmanager
def stuck_behind_proxy(config: str, program: str = "stuck") -> Iterator[tuple[Path, int, int]]:
    """(program, its pid, the proxy's port): `stuck mt` attached by gdbserver behind
    asyncrsp --task-threads; after the client detached, the program must still run."""
    prog = corpus_binary(config, program)
    p = subprocess.Popen([str(prog), "mt"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    procs: list[subprocess.Popen[str]] = []
    try:
        assert p.stdout is not None and f"{program} ready" in p.stdout.readline()
        gport, pport = _free_port(), _free_port()
        gs = subprocess.Popen(["gdbserver", "--attach", f"127.0.0.1:{gport}", str(p.pid)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(gs)
        assert gs.stderr is not None
        for _ in range(50):
            if "Listening" in gs.stderr.readline():
                break
        proxy = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{pport}",
                                  "--upstream", f"127.0.0.1:{gport}", *PROXY_ARGS],
                                 cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        procs.append(proxy)
        assert proxy.stderr is not None and "listening on" in proxy.stderr.readline()
        yield prog, p.pid, pport
        for proc in procs:
            proc.wait(timeout=30)
        time.sleep(0.2)
        assert p.poll() is None, "the program died after detach"
    finally:
        for proc in (*procs, p):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def gdb(prog: Path, port: int, commands: list[str], mi: bool = False) -> str:
    # The first thread query of a session reads DWARF (reflection, frame facts): under
    # load that takes seconds, more than gdb's default 2 s remote timeout.
    argv = ["gdb", "-nx", "-batch", *(["--interpreter=mi"] if mi else []), "-ex", "set pagination off",
            "-ex", "set remotetimeout 60", "-ex", f"target remote 127.0.0.1:{port}"]
    for c in commands:
        argv += ["-ex", c]
    argv += ["-ex", "detach", str(prog)]
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180,
                          check=False).stdout


def select(task: str, frame_fn: str | None = None) -> list[str]:
    """gdb commands selecting the task's thread (by its name) and the frame of a function."""
    cmds = [f"python [t for t in gdb.selected_inferior().threads() if (t.name or '').endswith('stuck::{task}')]"
            "[0].switch()"]
    if frame_fn:
        cmds.append(f"python f = gdb.newest_frame()\nwhile f and '{frame_fn}' not in (f.name() or ''): f = f.older()\n"
                    "f.select()")
    return cmds


def echo(tag: str) -> str:
    return f"echo =={tag}==\\n"


def part(out: str, tag: str) -> str:
    m = re.search(rf"=={tag}==\n(.*?)(?=\n==|\Z)", out, re.S)
    assert m, f"no {tag} in:\n{out[-4000:]}"
    return m.group(1)


def bt_blocks(text: str) -> dict[str, list[str]]:
    """thread apply all bt -> task name -> its frames' 'function at file:line' texts."""
    out = {}
    for block in re.split(r"\n(?=Thread \d+ )", text):
        m = re.match(r'Thread \d+ \(Thread \d+\.(\d+) "task (?:\S+ )?stuck::(\w+)"', block)
        if m and int(m.group(1)) >= TID_BASE:
            out[m.group(2)] = re.findall(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(\S+) \(.*?\) at (\S+):(\d+)", block, re.M)
    return out


@pytest.mark.parametrize("config", ["debug", "release"])
def test_gdb_threads_stacks_and_locals_of_tasks(config: str) -> None:
    with stuck_behind_proxy(config) as (prog, pid, port):
        with open(f"/proc/{pid}/maps") as fh:  # the synthetic region is nowhere in the program
            for line in fh:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                assert hi <= REGION_BASE or lo >= REGION_BASE + (1 << 40) * REGION_STRIDE
        out = gdb(prog, port, [
            echo("threads"), "info threads", echo("tree"), "monitor async tree", echo("all"), "thread apply all bt",
            *select("lock_ba", "lock_ba"), echo("locals_ba"), "info locals", "print held.lock.c.value",
            *select("lock_ab", "lock_ab"), echo("locals_ab"), "print held.lock.c.value",
            echo("step"), "stepi", echo("stats"), "monitor async stats --all", echo("end")])
    threads = part(out, "threads")
    for name in (*TASKS, "run"):
        assert re.search(rf'Thread {pid}\.\d+ "task (\S+ )?stuck::{name}" \((suspended at|running)', threads), threads
    tree = part(out, "tree")
    stacks = bt_blocks(part(out, "all"))
    assert set(stacks) >= set(TASKS), part(out, "all")
    for name in TASKS:
        # the program's own frames, with the .await lines monitor async tree prints
        ours = [(fn, int(line)) for fn, file, line in stacks[name] if fn.startswith("stuck::")]
        assert ours and ours[-1][0] == f"stuck::{name}::{{async_fn#0}}", stacks[name]
        m = re.search(rf"╼ stuck::{name} at \S*stuck.rs:(\d+)", tree)
        assert m and ours[-1][1] == int(m.group(1)), (name, stacks[name], tree)
        assert ours[-1][1] in [ln for child in ("lock", "sleep", "recv", "oneshot")
                               for ln in await_lines(name, child)], (name, ours)
    for name in ("lock_ab", "lock_ba"):  # waiting in Mutex::lock, below their own frame
        assert any("mutex" in fn and "lock" in fn for fn, _, _ in stacks[name]), stacks[name]
    if config == "debug":
        assert re.search(r"^held = tokio::sync::mutex::MutexGuard<u64> \{lock: 0x[0-9a-f]+\}",
                         part(out, "locals_ba"), re.M), out
        assert re.search(r"^\$\d+ = 2$", part(out, "locals_ba"), re.M), part(out, "locals_ba")
        assert re.search(r"^\$\d+ = 1$", part(out, "locals_ab"), re.M), part(out, "locals_ab")
    else:
        # Release: rustc gives `held` (and the inner scope's `first`) no DW_AT_location at all,
        # only the state machine's variant member (offset 0x30): gdb prints <optimized out>,
        # whatever the frame's registers. The outer scope's `first` has one (through the
        # coroutine's address in the frame's `self` slot): the Arc of the Mutex lock_ba waits on.
        assert re.search(r"^held = <optimized out>$", part(out, "locals_ba"), re.M), part(out, "locals_ba")
        arc = re.search(r"^first = alloc::sync::Arc<tokio::sync::mutex::Mutex<u64>.*\{pointer: (0x[0-9a-f]+)\}",
                        part(out, "locals_ba"), re.M)
        waits = re.search(r'"task (?:\S+ )?stuck::lock_ba" \(suspended at stuck.rs:\d+, waits on Mutex (0x[0-9a-f]+)',
                          threads)
        assert arc and waits, (part(out, "locals_ba"), threads)
        assert int(arc.group(1), 16) + 16 == int(waits.group(1), 16)  # ArcInner {strong, weak, data: Mutex}
    assert "a task thread cannot be stepped" in part(out, "step"), part(out, "step")
    # the program is this host's (proved): its data pages were read through /proc/PID/mem, not `m`
    assert re.search(r"through /proc/PID/mem .*: [1-9]\d* bytes", part(out, "stats")), part(out, "stats")


@pytest.mark.parametrize("config", ["debug", "release"])
def test_gdb_mi_thread_info_frames_and_variables(config: str) -> None:
    """What cpptools and CLion send: -thread-info, then per thread -stack-list-frames and
    -stack-list-variables."""
    with stuck_behind_proxy(config) as (prog, _pid, port):
        out = gdb(prog, port, [
            'interpreter-exec mi "-thread-info"',
            *select("lock_ba"),
            'interpreter-exec mi "-stack-list-frames"',
            'interpreter-exec mi "-stack-select-frame 2"',
            'interpreter-exec mi "-stack-list-variables --simple-values"'], mi=True)
    info = re.search(r"\^done,threads=\[(.*)\],current-thread-id", out)
    assert info, out[-3000:]
    names = re.findall(r'name="task (?:\S+ )?stuck::(\w+)"', info.group(1))
    assert set(names) >= {*TASKS, "run"}, info.group(1)
    assert re.search(r'details="suspended at stuck.rs:\d+, waits on oneshot 0x[0-9a-f]+"', info.group(1)), info.group(1)
    assert re.search(r'details="suspended at stuck.rs:\d+, waits on Mutex 0x[0-9a-f]+ held by #\d+"', info.group(1))
    frames = re.search(r"\^done,stack=\[(.*?)\]\n", out)
    assert frames, out[-3000:]
    funcs = re.findall(r'func="([^"]+)"', frames.group(1))
    lines = re.findall(r'line="(\d+)"', frames.group(1))
    assert funcs[2] == "stuck::lock_ba::{async_fn#0}" and int(lines[2]) in await_lines("lock_ba", "lock"), frames
    variables = re.search(r"\^done,variables=\[(.*?)\]\n", out)
    if config == "release":  # the guard lives in a register without a DWARF location there
        return
    assert variables and '{name="held",type="tokio::sync::mutex::MutexGuard<u64>"' in variables.group(1), out[-3000:]


@pytest.mark.parametrize("config", ["debug", "release"])
def test_lldb_thread_list_backtraces_and_frame_variables(config: str) -> None:
    with stuck_behind_proxy(config) as (prog, _pid, port):
        run = lldb_batch(prog, ["settings set plugin.process.gdb-remote.packet-timeout 60",
                                f"gdb-remote 127.0.0.1:{port}", "thread list", "bt all",
                                "script lldb.process.SetSelectedThread([t for t in lldb.process "
                                "if (t.GetName() or '').endswith('stuck::lock_ba')][0])",
                                "frame select 2", "frame variable held", "frame variable held.lock->c.value",
                                "process detach"], timeout=180)
    steps = dict(run.steps())
    listing = steps["thread list"]
    for name in (*TASKS, "run"):
        assert re.search(rf"tid = \d+, .*name = 'task (\S+ )?stuck::{name}'", listing), listing
    bt = steps["bt all"]
    assert re.search(r"stuck`stuck::lock_ba::_\$u7b\$\$u7b\$closure\$u7d\$\$u7d\$::h[0-9a-f]+\(.*\) at stuck.rs:(\d+)",
                     bt), bt[-3000:]
    frame = steps["frame select 2"]
    m = re.search(r"at stuck.rs:(\d+)", frame)
    assert m and int(m.group(1)) in await_lines("lock_ba", "lock"), frame
    if config == "release":
        return
    assert re.search(r"\(tokio::sync::mutex::MutexGuard<unsigned long>\) held = \{\s*lock = 0x[0-9a-f]+",
                     steps["frame variable held"]), steps["frame variable held"]
    assert re.search(r"= 2$", steps["frame variable held.lock->c.value"].strip()), steps["frame variable held.lock->c.value"]


TK_TASKS = ("foo", "holder", "receiver", "oneshot_waiter", "waiter", "run")
TK_FOO_STACK = ["tk_dump::baz", "tk_dump::buz", "tk_dump::bar", "tk_dump::foo"]


def test_gdb_tokio_143_task_dump_program() -> None:
    """tokio 1.43 (the modern corpus' tk_dump): foo -> bar -> join!(buz -> baz -> sleep, fiz)
    is one task thread whose stack is baz, buz, bar, foo. bar's state names join!'s own
    file:line (no row of it in bar's function): its frame is at bar's first line. holder's
    live MutexGuard `guard` guards the Mutex run created with 7."""
    with stuck_behind_proxy("trixie-debug", "tk_dump") as (prog, _pid, port):
        out = gdb(prog, port, [echo("threads"), "info threads", echo("all"), "thread apply all bt",
                               *select_tk("holder", "holder"), echo("locals"), "info locals",
                               "print guard.lock.c.value", echo("end")])
    threads = part(out, "threads")
    for name in TK_TASKS:
        assert re.search(rf'"task (\S+ )?tk_dump::{name}" \(suspended at', threads), threads
    assert re.search(r'"task (\S+ )?tk_dump::waiter" \(suspended at tk_dump.rs:\d+, waits on Mutex 0x[0-9a-f]+ held by #',
                     threads), threads
    block = re.search(r'Thread \d+ \(Thread \d+\.\d+ "task \S+ tk_dump::foo".*?(?=\n\n|\Z)', part(out, "all"), re.S)
    assert block, part(out, "all")
    fns = re.findall(r"in (tk_dump::\w+)::\{async_fn#0\}|^#0\s+(tk_dump::\w+)::", block.group(0), re.M)
    assert [a or b for a, b in fns] == TK_FOO_STACK, block.group(0)
    locals_ = part(out, "locals")
    assert re.search(r"^guard = tokio::sync::mutex::MutexGuard<u64>", locals_, re.M), locals_
    assert re.search(r"^\$\d+ = 7$", locals_, re.M), locals_


def select_tk(task: str, frame_fn: str) -> list[str]:
    return [f"python [t for t in gdb.selected_inferior().threads() if (t.name or '').endswith('tk_dump::{task}')]"
            "[0].switch()",
            f"python f = gdb.newest_frame()\nwhile f and '{frame_fn}' not in (f.name() or ''): f = f.older()\n"
            "f.select()"]


@pytest.mark.parametrize("config", ["trixie-debug", "trixie-release"])
def test_gdb_mi_tokio_143_task_dump_program(config: str) -> None:
    """tk_dump through gdb/MI as cpptools and CLion ask: names and details of every task,
    foo's stack, holder's variables. Release: rustc gives `guard` no DW_AT_location (as
    stuck's `held`); holder's `lock` (the Arc) has one: the Mutex's value, 7, through it."""
    with stuck_behind_proxy(config, "tk_dump") as (prog, _pid, port):
        out = gdb(prog, port, [
            'interpreter-exec mi "-thread-info"',
            *select_tk("foo", "foo"), 'interpreter-exec mi "-stack-list-frames"',
            *select_tk("holder", "holder"), 'interpreter-exec mi "-stack-list-variables --simple-values"',
            'interpreter-exec mi "-data-evaluate-expression lock.ptr.pointer.data.c.value"'], mi=True)
    info = re.search(r"\^done,threads=\[(.*)\],current-thread-id", out)
    assert info, out[-3000:]
    assert set(re.findall(r'name="task (?:\S+ )?tk_dump::(\w+)"', info.group(1))) >= set(TK_TASKS), info.group(1)
    assert re.search(r'details="suspended at tk_dump.rs:\d+, waits on Mutex 0x[0-9a-f]+ held by #\d+"', info.group(1))
    frames = re.search(r"\^done,stack=\[(.*?)\]\n", out)
    assert frames, out[-3000:]
    funcs = [f.split("::{")[0] for f in re.findall(r'func="(tk_dump::[^"]+)"', frames.group(1))]
    assert funcs == TK_FOO_STACK, frames.group(1)
    variables = re.search(r"\^done,variables=\[(.*?)\]\n", out)
    assert variables, out[-3000:]
    if config == "trixie-debug":
        assert '{name="guard",type="tokio::sync::mutex::MutexGuard<u64>"' in variables.group(1), variables.group(1)
    else:
        assert '{name="lock",type="alloc::sync::Arc<tokio::sync::mutex::Mutex<u64>' in variables.group(1), \
            variables.group(1)
    assert '^done,value="7"' in out, out[-3000:]  # the value run created the Mutex with


@pytest.mark.parametrize("config", ["trixie-debug", "trixie-release"])
def test_lldb_tokio_143_task_dump_program(config: str) -> None:
    """tk_dump through lldb: thread list names, foo's stack in bt all, holder's guard
    (release: no location for it, the Mutex's value through `lock`)."""
    with stuck_behind_proxy(config, "tk_dump") as (prog, _pid, port):
        run = lldb_batch(prog, ["settings set plugin.process.gdb-remote.packet-timeout 60",
                                f"gdb-remote 127.0.0.1:{port}", "thread list", "bt all",
                                "script lldb.process.SetSelectedThread([t for t in lldb.process "
                                "if (t.GetName() or '').endswith('tk_dump::holder')][0])",
                                "script t = lldb.process.GetSelectedThread(); t.SetSelectedFrame("
                                "[i for i in range(t.GetNumFrames()) if 'holder' in (t.GetFrameAtIndex(i)"
                                ".GetFunctionName() or '')][0])",
                                "frame variable guard", "frame variable guard.lock->c.value",
                                "frame variable lock.ptr.pointer->data.c.value",
                                "process detach"], timeout=180)
    steps = dict(run.steps())
    listing = steps["thread list"]
    for name in TK_TASKS:
        assert re.search(rf"tid = \d+, .*name = 'task (\S+ )?tk_dump::{name}'", listing), listing
    blocks = re.split(r"\n(?=\s*\*?\s*thread #)", steps["bt all"])
    foo = next((b for b in blocks if "tk_dump::foo'" in b), None)
    assert foo, steps["bt all"][-3000:]
    # each frame's function: the innermost on its line (release: `physical [inlined] coroutine`)
    fns = [found[-1] for line in foo.splitlines() if line.strip().startswith("frame #")
           for found in [re.findall(r"tk_dump::(\w+)::_\$u7b\$\$u7b\$closure", line)] if found]
    assert ["tk_dump::" + f for f in fns] == TK_FOO_STACK, foo
    if config == "trixie-debug":
        assert re.search(r"\(tokio::sync::mutex::MutexGuard<unsigned long>\) guard = \{\s*lock = 0x[0-9a-f]+",
                         steps["frame variable guard"]), steps["frame variable guard"]
        assert re.search(r"= 7$", steps["frame variable guard.lock->c.value"].strip()), \
            steps["frame variable guard.lock->c.value"]
    else:
        assert "guard = <no location" in steps["frame variable guard"], steps["frame variable guard"]
    assert re.search(r"= 7$", steps["frame variable lock.ptr.pointer->data.c.value"].strip()), \
        steps["frame variable lock.ptr.pointer->data.c.value"]


def test_continue_with_a_task_thread_selected_stops_as_before() -> None:
    """tokio_app: break in c, continue, select a task thread, continue: the program runs
    and the next stop is the same as without task threads."""
    prog = corpus_binary("debug", "tokio_app")
    cmds = [f"break {SRC}:{bp_line('c_after_sleep')}", "continue", "continue", echo("threads"), "info threads",
            "python [t for t in gdb.selected_inferior().threads() if (t.name or '').startswith('task ')][0].switch()",
            echo("selected"), "thread", echo("go"), "continue", echo("stop"), "bt 1", echo("end")]
    with_tt = session(prog, ["ct"], cmds, extra=["--task-threads"])
    without = session(prog, ["ct"], cmds)
    assert re.search(r'Thread \d+\.\d+ "task #\d+ tokio_app::run" \(suspended at', part(with_tt, "threads")), with_tt
    assert re.search(rf"Thread \d+\.{TID_BASE + 1:d}|\(Thread \d+\.\d{{10}}\)", part(with_tt, "selected")), with_tt
    stop_with = re.sub(r"Thread \d+ \"[^\"]*\"", "Thread N", part(with_tt, "go"))  # the name gains the task
    stop_without = re.sub(r"Thread \d+ \"[^\"]*\"", "Thread N", part(without, "go"))
    assert re.search(r"Breakpoint 1, tokio_app::c::\{async_fn#0\}", stop_with), with_tt
    assert stop_with.splitlines()[-1] == stop_without.splitlines()[-1], (stop_with, stop_without)
    assert part(with_tt, "stop").splitlines()[0] == part(without, "stop").splitlines()[0]


def _matrix_pairs() -> list[object]:
    from integration.harness import matrix

    out = []
    for sc in matrix.SCENARIOS:
        for client in matrix.CLIENTS:
            for stub in ("gdbserver", "lldb-server"):
                if stub in matrix.STUBS and not matrix.broken_reason(client, stub, sc.name) \
                        and not matrix.capture_reason("breakpoints", client, stub):
                    out.append(pytest.param(sc, client, stub, id=f"{sc.name}-{client}-{stub}"))
    return out


@pytest.mark.parametrize(("sc", "client", "stub"), _matrix_pairs())
def test_transparent_with_task_threads(sc, client: str, stub: str, programs, request) -> None:  # type: ignore[no-untyped-def]
    """The transparency matrix (C programs, no tasks) with --task-threads on: every
    transcript as without the proxy."""
    check_transparent(sc, client, stub, programs, request, proxy_extra=("--capture", "breakpoints", "--task-threads"))
