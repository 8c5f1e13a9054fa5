"""Stepping across `.await` end to end (docs/stepping.md): real gdb (CLI and MI) ->
asyncrsp -> gdbserver -> the corpus's `tokio_app` (a -> b -> c, c awaits a 1 ms sleep).

Stopped in `c` on its `sleep(...).await` line, gdb's own `next` must end on the
following line of the same coroutine instance (its `x` unchanged, the frame `c`),
whichever thread polls it again; `finish` must end in `b` on `c(doubled).await`
with `c`'s `Ready` value. Straight against gdbserver the same commands end in
tokio's scheduler and `finish` returns `Pending`: each test records where, so
the difference is shown in its output.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from integration.corpus import markers
from integration.harness import debuggers
from integration.harness.console import ConsoleTimeout
from integration.harness.gdb import MiSession, gdb_cli
from integration.harness.lldb import lldb_batch, split_transcript
from integration.harness.monitor import await_line, corpus_binary, session
from integration.harness.stubs import start_proxy

ROOT = Path(__file__).resolve().parents[1]
SRC = "tokio_app.rs"
SLEEP = await_line("c", "sleep")  # c's `tokio::time::sleep(...).await;`
B_AWAIT = await_line("b", "c")  # b's `c(doubled).await + 1`
ROUNDS = 3  # instances of `c` stepped over in one session


def _next_rounds(rounds: int) -> list[str]:
    """Stop in c on the sleep line, `next` until the line changes, `print x` before and after."""
    cmds: list[str] = []
    for i in range(rounds):
        cmds += [f"break {SRC}:{SLEEP}", "continue", "delete", f"echo ==before {i}==\\n", "print x", "thread",
                 "next", "next", f"echo ==after {i}==\\n", "print x", "thread", "frame"]
    return cmds + ["echo ==end==\\n"]


def _rounds(out: str, rounds: int) -> list[tuple[str, str]]:
    got = []
    for i in range(rounds):
        m = re.search(rf"==before {i}==\n(.*?)==after {i}==\n(.*?)(?===)", out, re.S)
        assert m, f"round {i} missing:\n{out[-4000:]}"
        got.append((m.group(1), m.group(2)))
    return got


def _value(text: str) -> str | None:
    m = re.search(r"^\$\d+ = (\S+)", text, re.M)
    return m.group(1) if m else None


def _thread(text: str) -> str | None:
    m = re.search(r"\[Current thread is (\d+)", text)
    return m.group(1) if m else None


def _straight(prog: Path, args: list[str], commands: list[str]) -> str:
    gdb = debuggers.argv("gdb", "-nx", "-batch", "-ex", "set pagination off", "-ex", "set remotetimeout 60",
                         "-ex", "target remote | gdbserver --once - " + " ".join([str(prog), *args]))
    for c in commands:
        gdb += ["-ex", c]
    gdb += ["-ex", "kill", str(prog)]
    return subprocess.run(gdb, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=240, check=False).stdout


@pytest.mark.parametrize("rt", ["ct", "mt"])
def test_next_over_await_ends_in_the_same_instance(rt: str) -> None:
    prog = corpus_binary("debug", "tokio_app")
    out = session(prog, [rt], _next_rounds(ROUNDS), extra=["--capture", "breakpoints"])
    assert "SIGTRAP" not in out and "received signal" not in out, out[-3000:]
    switched = 0
    for before, after in _rounds(out, ROUNDS):
        assert _value(before) is not None, before
        assert _value(after) == _value(before), (before, after)  # the same coroutine instance
        assert re.search(rf"^{SLEEP + 1}\s+x \+ 1", after, re.M), after  # the line after the .await
        assert "tokio_app::c::{async_fn#0}" in after, after
        if _thread(before) != _thread(after):
            switched += 1
            # ended on another worker: shown as a plain stop of that thread
            # (the `next`'s own output is in `before`)
            assert re.search(r'Thread \d+ "[^"]*" stopped\.', before) and "Switching to" in before, before
    print(f"{rt}: {ROUNDS} steps over the sleep's .await, {switched} resumed on another thread")
    # straight, the same steps follow the thread out of c; on a loaded machine gdb's single steps over
    # the sleep line can outlast its 1 ms, the .await is ready at once and straight ends on the next
    # line too: up to 3 runs, one must end elsewhere
    for _ in range(3):
        straight = _straight(prog, [rt], _next_rounds(1))
        before, after = _rounds(straight, 1)[0]
        where = re.findall(r"^(?:\S+ .* at )?(\S+):(\d+)$", after, re.M) or after.strip().splitlines()[-3:]
        print(f"straight gdbserver: the same `next next` ended at {where}")
        if not re.search(rf"^{SLEEP + 1}\s+x \+ 1", after, re.M):
            break
    else:
        raise AssertionError(f"straight gdbserver ended on the next line 3 times: {after}")


def test_finish_ends_in_the_awaiter_with_the_value() -> None:
    prog = corpus_binary("debug", "tokio_app")
    cmds = [f"break {SRC}:{SLEEP}", "continue", "delete", "print x", "echo ==finish==\\n", "finish",
            "echo ==end==\\n"]
    out = session(prog, ["ct"], cmds, extra=["--capture", "breakpoints"])
    fin = out.split("==finish==", 1)[1]
    x = _value(out.split("==finish==", 1)[0])
    assert x is not None
    assert f"Poll<u64>::Ready({int(x) + 1})" in fin, fin  # c returns x + 1
    assert re.search(rf"tokio_app::b::{{async_fn#0}} \(\) at \S+:{B_AWAIT}", fin), fin
    straight = _straight(prog, ["ct"], cmds)
    sfin = straight.split("==finish==", 1)[1]
    print("straight gdbserver: finish gave", re.findall(r"Value returned is .*", sfin))
    assert "Pending" in sfin, sfin


def test_step_off_leaves_gdb_alone() -> None:
    """`monitor async step off`: gdb's next follows the thread into the executor, as straight."""
    prog = corpus_binary("debug", "tokio_app")
    cmds = ["monitor async step off", *_next_rounds(1)]
    out = session(prog, ["ct"], cmds, extra=["--capture", "breakpoints"])
    assert "async step: off" in out, out[-2000:]
    _, after = _rounds(out, 1)[0]
    assert not re.search(rf"^{SLEEP + 1}\s+x \+ 1", after, re.M), after


def test_next_over_await_with_the_default_capture() -> None:
    """The default capture (uprobes where they run): the proxy's breakpoint is a Z1."""
    prog = corpus_binary("debug", "tokio_app")
    out = session(prog, ["ct"], _next_rounds(2), extra=["--capture", "auto"])
    for before, after in _rounds(out, 2):
        assert _value(after) == _value(before), (before, after)
        assert re.search(rf"^{SLEEP + 1}\s+x \+ 1", after, re.M), after


def test_mi_exec_step_next_and_finish() -> None:
    """gdb/MI (what an IDE sends): -exec-step enters the awaited async fn; -exec-next ends
    with end-stepping-range (same thread) or a stop of the resuming thread, on the next
    line, with the instance's x; -exec-finish returns Ready."""
    prog = corpus_binary("debug", "tokio_app")
    with start_proxy(f"|gdbserver --once - {prog} ct", extra=["--capture", "breakpoints"]) as px:
        with MiSession(prog) as mi:
            mi.cmd("-gdb-set remotetimeout 60")
            mi.cmd(f"-target-select remote {px.address}", timeout=120)
            mi.cmd(f"-break-insert {SRC}:{B_AWAIT}")
            mi.cmd("-exec-continue")
            mi.wait_stopped(timeout=120)
            mi.cmd("-break-delete")
            mi.cmd("-exec-step")  # an IDE's Step Into on b's `c(doubled).await`
            stop = mi.wait_stopped(timeout=120)
            frame = stop.results.get("frame", {})
            assert frame.get("func") == "tokio_app::c::{async_fn#0}" and frame.get("line") == str(SLEEP - 1), stop
            mi.cmd(f"-break-insert {SRC}:{SLEEP}")
            mi.cmd("-exec-continue")
            stop = mi.wait_stopped(timeout=120)
            assert stop.results.get("reason") == "breakpoint-hit", stop
            mi.cmd("-break-delete")
            x0 = mi.cmd('-data-evaluate-expression x')[-1].results.get("value")
            lines = []
            for _ in range(2):
                mi.cmd("-exec-next")
                stop = mi.wait_stopped(timeout=120)
                lines.append(stop.results.get("frame", {}).get("line"))
            assert lines[-1] == str(SLEEP + 1), (lines, stop)
            assert stop.results.get("reason") in ("end-stepping-range", "signal-received"), stop
            assert mi.cmd('-data-evaluate-expression x')[-1].results.get("value") == x0
            mi.cmd(f"-break-insert {SRC}:{SLEEP}")  # the next instance, at its .await
            mi.cmd("-exec-continue")
            mi.wait_stopped(timeout=120)
            mi.cmd("-break-delete")
            mi.cmd("-exec-finish")
            stop = mi.wait_stopped(timeout=120)
            assert stop.results.get("reason") == "function-finished", stop
            assert "Ready" in str(stop.results.get("return-value")), stop


def test_mi_exec_next_on_the_multi_thread_runtime() -> None:
    """gdb/MI's -exec-next over c's sleep `.await` on the multi-thread runtime, ROUNDS + 2
    instances: each ends on the next line with the instance's x, with end-stepping-range on
    the stepped thread or, where the task went on in another worker, as a stop of that thread
    (signal-received, signal 0: gdb ends a step only in the thread it stepped), which MI's
    record names; the runs that moved are counted."""
    prog = corpus_binary("debug", "tokio_app")
    rounds, switched = ROUNDS + 2, 0
    with start_proxy(f"|gdbserver --once - {prog} mt", extra=["--capture", "breakpoints"]) as px:
        with MiSession(prog) as mi:
            mi.cmd("-gdb-set remotetimeout 60")
            mi.cmd(f"-target-select remote {px.address}", timeout=120)
            for _ in range(rounds):
                mi.cmd(f"-break-insert {SRC}:{SLEEP}")
                mi.cmd("-exec-continue")
                hit = mi.wait_stopped(timeout=120)
                mi.cmd("-break-delete")
                x0 = mi.cmd("-data-evaluate-expression x")[-1].results.get("value")
                stop = hit
                for _ in range(3):  # the call of sleep(), then the .await (or the line after, ready)
                    if stop.results.get("frame", {}).get("line") == str(SLEEP + 1):
                        break
                    mi.cmd("-exec-next")
                    stop = mi.wait_stopped(timeout=120)
                assert stop.results.get("frame", {}).get("line") == str(SLEEP + 1), stop
                assert mi.cmd("-data-evaluate-expression x")[-1].results.get("value") == x0, stop
                if stop.results.get("thread-id") != hit.results.get("thread-id"):
                    switched += 1
                    assert stop.results.get("reason") == "signal-received", stop
                    assert stop.results.get("signal-name") == "0", stop
                else:
                    assert stop.results.get("reason") == "end-stepping-range", stop
    print(f"MI mt: {rounds} steps over the sleep's .await, {switched} resumed on another thread")


def test_lldb_step_over_and_step_out() -> None:
    """lldb's `thread step-over` (single steps, a breakpoint on each branch) ends on the
    next line of the same instance; `thread step-out` (a breakpoint at the return address
    and a continue) ends in b once c completed: the proxy says it took both over."""
    prog = corpus_binary("debug", "tokio_app")
    cmds = [f"breakpoint set -f {SRC} -l {SLEEP}", "continue", "breakpoint delete -f", "frame variable x",
            "thread step-over", "frame variable x",
            f"breakpoint set -f {SRC} -l {SLEEP}", "continue", "breakpoint delete -f", "frame variable x",
            "thread step-out", "process plugin packet monitor async step", "kill"]
    with start_proxy(f"|gdbserver --once - {prog} ct", extra=["--capture", "breakpoints"]) as px:
        out = lldb_batch(prog, [f"gdb-remote {px.address}", *cmds], timeout=300).output
    parts = split_transcript(out)
    xs = [re.search(r"x = (\d+)", o) for c, o in parts if c == "frame variable x"]
    assert all(xs) and len(xs) == 3, out[-3000:]
    over = next(o for c, o in parts if c == "thread step-over")
    assert xs[0].group(1) == xs[1].group(1), out[-3000:]  # type: ignore[union-attr]
    assert re.search(rf"tokio_app::c::.* at {SRC}:{SLEEP + 1}:", over), over
    step_out = next(o for c, o in parts if c == "thread step-out")
    assert re.search(rf"tokio_app::b::.* at {SRC}:{B_AWAIT}:", step_out) or \
        re.search(rf"tokio_app::worker::.* at {SRC}:{await_line('worker', 'c')}:", step_out), step_out
    stats = next(o for c, o in parts if c == "process plugin packet monitor async step")
    # lldb single-steps the sleep line: on a loaded machine its 5 ms may pass before the
    # first poll, the .await is ready and the step over is lldb's own (the line and `x`
    # above still hold); the step out always waits
    assert re.search(r"steps taken over: [12],", stats), stats


def test_lldb_step_over_on_the_multi_thread_runtime() -> None:
    """lldb's `thread step-over` over c's sleep `.await` on tokio's multi-thread runtime,
    ROUNDS + 2 instances: each ends either on the next line in the same instance (the same
    `x`), or, where the task went on in another worker, in a stop of lldb's own thread whose
    reason names that thread's tid, and `thread list` shows that thread on the next line of
    c. (lldb suspends its other threads while it steps and ignores their stops: reported
    as gdb gets it, the step never ended.)"""
    prog = corpus_binary("debug", "tokio_app")
    rounds = ROUNDS + 2
    cmds: list[str] = []
    for _ in range(rounds):
        cmds += [f"breakpoint set -f {SRC} -l {SLEEP}", "continue", "breakpoint delete -f", "frame variable x",
                 "thread step-over", "frame variable x", "thread list"]
    with start_proxy(f"|gdbserver --once - {prog} mt", extra=["--capture", "breakpoints"]) as px:
        out = lldb_batch(prog, [f"gdb-remote {px.address}", *cmds, "process plugin packet monitor async step",
                                "kill"], timeout=300).output
    parts = split_transcript(out)
    overs = [o for c, o in parts if c == "thread step-over"]
    xs = [re.search(r"x = (\d+)", o) for c, o in parts if c == "frame variable x"]
    lists = [o for c, o in parts if c == "thread list"]
    assert len(overs) == rounds and len(lists) == rounds, out[-3000:]
    switched = 0
    for i, over in enumerate(overs):
        moved = re.search(r"stop reason = async step: tokio_app::c resumed on the thread with tid (\d+)", over)
        if moved is None:
            assert "stop reason = step over" in over and re.search(rf"at {SRC}:{SLEEP + 1}:", over), over
            assert xs[2 * i] and xs[2 * i + 1] and xs[2 * i].group(1) == xs[2 * i + 1].group(1), out[-3000:]
            continue
        switched += 1
        there = re.search(rf"^.*tid = {moved.group(1)}, .*$", lists[i], re.M)
        assert there and f"at {SRC}:{SLEEP + 1}:" in there.group(0), lists[i]
    stats = next(o for c, o in parts if c == "process plugin packet monitor async step")
    m = re.search(r"steps taken over: (\d+), ended on another thread: (\d+)\)", stats)
    assert m and int(m.group(2)) == switched, stats
    # a step whose sleep was ready at once (its 5 ms passed while lldb single-stepped the
    # line, on a loaded machine) is lldb's own: every other one was taken over
    assert switched <= int(m.group(1)) <= rounds and int(m.group(1)) >= 1, stats
    print(f"lldb mt: {rounds} steps over the sleep's .await, {switched} resumed on another thread")


def test_step_enters_the_awaited_async_fn() -> None:
    """`step` on b's `c(doubled).await` enters c's body (its resume function, at c's first
    line), not c's constructor, `into_future` or `Pin::new_unchecked` on the way; straight,
    gdb's `step` stops in the constructor `tokio_app::c (x=4)`."""
    prog = corpus_binary("debug", "tokio_app")
    c_line = SLEEP - 1  # `async fn c(x: u64) -> u64 {`
    cmds = [f"break {SRC}:{B_AWAIT}", "continue", "delete", "echo ==step==\\n", "step", "echo ==next==\\n",
            "next", "next", "next", "print x", "echo ==end==\\n"]
    out = session(prog, ["ct"], cmds, extra=["--capture", "breakpoints"])
    step = out.split("==step==", 1)[1].split("==next==", 1)[0]
    assert re.search(rf"tokio_app::c::{{async_fn#0}} \(\) at \S+:{c_line}\n", step), step
    after = out.split("==next==", 1)[1]
    assert re.search(rf"^{SLEEP + 1}\s+x \+ 1", after, re.M) and "$1 = 4" in after, after  # b(1): c(4)
    straight = _straight(prog, ["ct"], cmds)
    sstep = straight.split("==step==", 1)[1].split("==next==", 1)[0]
    print("straight gdbserver: step entered", re.findall(r"^(\S+.*) at (\S+:\d+)$", sstep, re.M))
    assert "{async_fn#0}" not in sstep, sstep


def test_ctrl_c_while_the_step_waits_is_the_clients() -> None:
    """A `next` over the corpus `stuck`'s one-hour sleep waits for a poll that will not come
    for an hour: the user's Ctrl-C stops the program as usual (SIGINT), the proxy says why
    the step ended, takes its breakpoint out, and the session goes on."""
    prog = corpus_binary("debug", "stuck")
    line = markers.await_markers("stuck")
    sleep_line = next(m.line for m in line if m.parent == "sleeper" and m.child == "sleep")
    with start_proxy(f"|gdbserver --once - {prog} ct", extra=["--capture", "breakpoints"]) as px:
        with gdb_cli(prog, init=("set remotetimeout 60",), timeout=120) as g:
            g.cmd(f"target remote {px.address}")
            g.cmd(f"break stuck.rs:{sleep_line}")
            g.cmd("continue")
            g.cmd("delete")
            # the .await: waits for the next poll of sleeper (a `next` first if the breakpoint
            # was on the call of sleep(), which ends at once)
            for _ in range(2):
                g.start("next")
                try:
                    g.wait_prompt(timeout=8)
                except ConsoleTimeout:
                    break
            else:
                raise AssertionError(f"no next waited: {g.transcript}")
            out = g.interrupt()
            assert "SIGINT" in out, out
            assert "the step ended before stuck::sleeper" in out and "interrupt" in out, out
            stats = g.cmd("monitor async step")
            assert "steps taken over: 1" in stats, stats
            g.cmd("kill")


@pytest.mark.parametrize("rt", ["ct", "mt"])
def test_release_next_over_await_stays_in_the_async_fns(rt: str) -> None:
    """Release build: `c` is inlined into `b` (one resume function). gdb's own `next` from
    c's sleep line leaves the inlined frame on the suspension path; the proxy follows b
    across the suspension and the step ends once c completed, on the next line gdb can
    show (b's closing line: c's `x + 1` has no code of its own there), not in tokio."""
    prog = corpus_binary("release", "tokio_app")
    cmds = [f"break {SRC}:{SLEEP}", "continue", "delete", "echo ==next==\\n", "next", "echo ==stats==\\n",
            "monitor async step", "echo ==end==\\n"]
    out = session(prog, [rt], cmds, extra=["--capture", "breakpoints"])
    nxt = out.split("==next==", 1)[1].split("==stats==", 1)[0]
    # the instance the breakpoint stops in first depends on the scheduling (mt: c inlined
    # into worker too): the step ends in one of the program's async fns, never in tokio
    assert re.search(r"^\d+\t", nxt, re.M) and not re.search(r"tokio-1\.|/rustc/|\bcore::|tokio::", nxt), nxt
    assert "SIGTRAP" not in nxt, nxt
    stats = out.split("==stats==", 1)[1]
    if rt == "ct":
        assert "steps taken over: 1" in stats, out[-2000:]
    else:
        # the multi-thread runtime's timer may have fired by the time the breakpoint's
        # line runs (a worker ran meanwhile): then the .await is ready and the next is gdb's own
        assert re.search(r"steps taken over: [01],", stats), stats
    straight = _straight(prog, [rt], cmds)
    snxt = straight.split("==next==", 1)[1].split("==stats==", 1)[0]
    print(f"release {rt}: next ended {nxt.strip().splitlines()[-1]!r}; straight: {snxt.strip().splitlines()[-2:]}")


def test_next_of_a_task_thread_follows_its_task() -> None:
    """--task-threads: `next` on the thread of the suspended task `run` (at
    `handle.await`) waits for the task's next poll and ends on run's next line, as a stop
    of the OS thread that polled it."""
    prog = corpus_binary("debug", "tokio_app")
    handle_line = await_line("run", "handle")
    extra = ["--capture", "breakpoints", "--task-threads"]
    with start_proxy(f"|gdbserver --once - {prog} mt", extra=extra) as px:
        with gdb_cli(prog, init=("set remotetimeout 60",), timeout=120) as g:
            g.cmd(f"target remote {px.address}")
            g.cmd(f"break {SRC}:{SLEEP + 1} if x == 2")  # in worker's last c: run waits on its handle
            g.cmd("continue")
            g.cmd("delete")
            threads = g.cmd("info threads")
            m = re.search(rf"^\s+(\d+)\s+Thread \S+ \"task #\d+ tokio_app::run\".*:{handle_line}$", threads, re.M)
            if m is None:
                g.cmd("kill")
                pytest.skip(f"run was not suspended at handle.await at that stop (scheduling): {threads}")
            g.cmd(f"thread {m.group(1)}")
            nxt = g.cmd("next")
            stats = g.cmd("monitor async step")
            g.cmd("kill")
    assert re.search(rf"tokio_app::run::{{async_fn#0}} \(\) at \S+:{handle_line + 1}\n", nxt), nxt
    assert re.search(r'Thread \d+ "[^"]*" stopped\.', nxt), nxt
    assert "steps taken over: 1" in stats, stats
