"""gdb through a fresh proxy on a corpus program, asking `monitor async` commands.

``session`` runs gdb's commands through a proxy over gdbserver and returns gdb's
output; ``ask`` wraps commands in markers that ``section`` cuts out again; the
``// await:`` and ``// bp:`` markers of the corpus sources give the lines
(``await_line``, ``bp_line``). ``check_serial_awaits`` and ``check_whole_run_graph``
are the await-graph checks every debugger set runs (test_await_graph.py with the
host's, test_debuggers.py with the newer ones).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from integration.corpus import build, markers
from integration.harness import debuggers
from integration.harness.stubs import free_port, start_stub

ROOT = Path(__file__).resolve().parents[2]

SRC = "tokio_app.rs"


def corpus_binary(config: str, program: str) -> Path:
    """The built program's own hard link (build.pinned): one file for the whole test."""
    got = build.build(configs=[config], programs=[program]).get((config, program))
    if not isinstance(got, Path):
        pytest.skip(f"{program} ({config}) not built: {got}")
    return build.pinned(got)


def modern_binary(config: str, program: str) -> Path:
    """A program of the modern corpus (Debian trixie's and sid's crates), pinned; skips
    when that config cannot be built here."""
    skip = build.skip_reason(config)
    if skip is not None:
        pytest.skip(str(skip))
    return build.pinned(build.binary(config, program))


def session(prog: Path, args: list[str], commands: list[str], *, extra: list[str] = (),  # type: ignore[assignment]
            env: dict[str, str] | None = None) -> str:
    """Run gdb through a fresh proxy over a spawned gdbserver; return gdb's output.

    These tests pin the hidden-breakpoint backend (the one every stub has);
    the other backends' own tests compare their graphs with it. With a newer
    debugger set in use (integration/harness/debuggers.py: gdb and gdbserver
    of a Debian chroot) the chroot's gdbserver listens on loopback and the
    proxy connects to it, as to any stub it did not start."""
    with contextlib.ExitStack() as stack:
        if debuggers.current().root is None:
            upstream = "|gdbserver --once - " + " ".join([str(prog), *args])
        else:
            upstream = stack.enter_context(start_stub("gdbserver", prog, args)).address
        return _session(upstream, prog, commands, extra, env)


def _session(upstream: str, prog: Path, commands: list[str], extra: list[str],
             env: dict[str, str] | None) -> str:
    port = free_port()
    if not any(a.startswith("--capture") for a in extra):
        extra = [*extra, "--capture", "breakpoints"]
    proxy = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}",
         "--upstream", upstream, *extra],
        cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        env=None if env is None else {**os.environ, **env})
    try:
        assert proxy.stderr is not None
        line = proxy.stderr.readline()
        assert "listening on" in line, line
        # A `monitor async` command answers only when it is done; gdb waits remotetimeout
        # (2 s) three times for the reply, then prints "Ignoring packet error, continuing..."
        # ahead of the output (still printed when it comes). The first reflection of a session
        # reads DWARF (stack discovery) and, under load 5-6 on 2 shared cores, took over 6 s:
        # the flake of test_mode_off_after_a_switch... Speed is measured in bench/, not here.
        gdb = debuggers.argv("gdb", "-nx", "-batch", "-ex", "set pagination off", "-ex", "set remotetimeout 60",
                             "-ex", f"target remote 127.0.0.1:{port}")
        for c in commands:
            gdb += ["-ex", c]
        gdb += ["-ex", "kill", str(prog)]
        # One stream: gdb prints monitor output on stderr, echo on stdout.
        out = subprocess.run(gdb, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=240, check=False)
        return out.stdout
    finally:
        try:
            proxy.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait()


def section(out: str, command: str) -> str:
    """The output printed between `echo ==command==` markers."""
    m = re.search(rf"=={re.escape(command)}==\n(.*?)(?:\n==|\Z)", out, re.S)
    assert m, f"no output for {command!r} in:\n{out[-3000:]}"
    return m.group(1)


def ask(*commands: str) -> list[str]:
    out = []
    for c in commands:
        out += [f"echo =={c}==\\n", f"monitor async {c}"]
    out.append("echo ==end==\\n")
    return out


def await_line(parent: str, child: str) -> int:
    for m in markers.await_markers("tokio_app"):
        if m.parent == parent and m.child == child:
            return m.line
    raise AssertionError(f"no marker {parent} -> {child}")


def bp_line(name: str) -> int:
    return markers.breakpoint_markers("tokio_app")[name][1]


CONFIGS = [("debug", "ct"), ("debug", "mt"), ("old-debug", "ct")]



def check_serial_awaits(config: str, rt: str) -> None:
    """Stopped in c: the async backtrace c <- b <- a <- run at the marked lines, and the edges."""
    prog = corpus_binary(config, "tokio_app")
    out = session(prog, [rt], [f"break {SRC}:{bp_line('c_after_sleep')}", "continue",
                               *ask("bt", "edges")])
    bt = section(out, "bt")
    frames = re.findall(r"^#(\d+)\s+(\S+) .*?(?:at|awaiting at) (\S+):(\d+)", bt, re.M)
    names = [f[1] for f in frames]
    assert names[:4] == ["tokio_app::c", "tokio_app::b", "tokio_app::a", "tokio_app::run"], bt
    lines = [int(f[3]) for f in frames[:4]]
    assert lines == [bp_line("c_after_sleep"), await_line("b", "c"), await_line("a", "b"),
                     await_line("run", "a")], bt
    assert "<root" in bt
    edges = section(out, "edges")
    assert re.search(rf"tokio_app::a -> #\d+ tokio_app::b at \S+:{await_line('a', 'b')}", edges), edges
    assert re.search(rf"tokio_app::b -> #\d+ tokio_app::c at \S+:{await_line('b', 'c')}", edges), edges


def check_whole_run_graph(config: str, rt: str) -> None:
    """At the end of main: join, select, spawn, Box<dyn Future>, panic."""
    prog = corpus_binary(config, "tokio_app")
    out = session(prog, [rt], [f"break {SRC}:{bp_line('main_done')}", "continue",
                               *ask("tasks --all", "edges --completed", "stats --all")])
    tasks = section(out, "tasks --all")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^(#\d+)\s.*$", tasks, re.M)}
    by_fn: dict[str, list[str]] = {}
    for tid, row in rows.items():
        by_fn.setdefault(row.split()[-1], []).append(row)
    # spawn: the spawned tasks are tasks of their own (the table lists tasks, not the
    # coroutines inside them), finished by now
    for spawned in ("tokio_app::worker", "tokio_app::panicker", "tokio_app::select_join"):
        assert spawned in by_fn, tasks
        done = r"\b(finished|panicked|unknown)\b" if config.startswith("old") else r"\b(finished|panicked)\b"
        assert all(re.search(done, r) for r in by_fn[spawned]), by_fn[spawned]  # 1.63: see below
    # the panic in a spawned task: panicked, and later polls still parented right
    if config.startswith("old"):
        # rustc 1.63: the analysis finds no `call _Unwind_Resume` exit in the
        # generator's resume function yet, so the panic is only seen as a
        # missed exit (the task is dropped, not known to have panicked). Known gap.
        assert re.search(r"panicked|finished|unknown", by_fn["tokio_app::panicker"][0])
    else:
        assert "panicked" in by_fn["tokio_app::panicker"][0]
    done = section(out, "edges --completed")
    # join!(c(2), c(3)): two completed edges run -> c
    assert len(re.findall(r"tokio_app::run -> #\d+ tokio_app::c ", done)) >= 2, done
    # select!: the winner c(10) completed
    assert re.search(r"tokio_app::race -> #\d+ tokio_app::c .*\(completed\)", done), done
    # Box<dyn Future>: the boxed coroutine b is run's child, at the .await of the box
    assert re.search(rf"tokio_app::run -> #\d+ tokio_app::b at \S+:{await_line('run', 'boxed')}", done), done
    # after the panic the same thread's polls are parented correctly
    assert re.search(r"tokio_app::select_join::\{async_block@\d+\} -> #\d+ tokio_app::c", done), done
    stats = section(out, "stats --all")
    if not config.startswith("old"):  # 1.63's panic is a missed exit (see above)
        assert re.search(r"exits missed \(recovered by sp\): 0;", stats), stats


def attached(prog: Path, args: list[str], ready: str, commands: list[str], extra: list[str]) -> str:
    """Start the program alone; once it printed `ready`, attach gdbserver (which stops it,
    like a Ctrl-C) behind a proxy, run gdb's commands, detach; the program must survive."""
    p = subprocess.Popen([str(prog), *args], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert ready in line, line
        gport, pport = free_port(), free_port()
        gs = subprocess.Popen(["gdbserver", "--attach", f"127.0.0.1:{gport}", str(p.pid)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert gs.stderr is not None
        for _ in range(50):  # "Listening on port N"
            if "Listening" in gs.stderr.readline():
                break
        proxy = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{pport}",
             "--upstream", f"127.0.0.1:{gport}", *extra],
            cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        try:
            assert proxy.stderr is not None
            assert "listening on" in proxy.stderr.readline()
            gdb = ["gdb", "-nx", "-batch", "-ex", "set pagination off", "-ex", f"target remote 127.0.0.1:{pport}"]
            for c in commands:
                gdb += ["-ex", c]
            gdb += ["-ex", "detach", str(prog)]
            out = subprocess.run(gdb, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 timeout=120, check=False).stdout
        finally:
            for proc in (proxy, gs):
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        time.sleep(0.2)
        assert p.poll() is None, f"the program died after detach:\n{out[-2000:]}"
        return out
    finally:
        p.kill()
        p.wait()

def decode_maint_packet(out: str) -> bytes:
    """The bytes of `maint packet` replies (gdb prints them as C strings), binary-unescaped."""
    data = bytearray()
    for m in re.finditer(r'^received: "(.*)"$', out, re.M):
        body = m.group(1)
        raw = bytearray()
        i = 0
        while i < len(body):
            if body[i] == "\\" and body[i + 1] == "x":
                raw.append(int(body[i + 2:i + 4], 16))
                i += 4
            elif body[i] == "\\":
                raw.append(ord(body[i + 1]))
                i += 2
            else:
                raw.append(ord(body[i]))
                i += 1
        if not raw or raw[:1] not in (b"m", b"l"):
            break
        j = 1
        while j < len(raw):
            if raw[j] == 0x7D:
                data.append(raw[j + 1] ^ 0x20)
                j += 2
            else:
                data.append(raw[j])
                j += 1
        if raw[:1] == b"l":
            break
    return bytes(data)


# The corpus program `deadlock`: a Mutex cycle, a task blocked on the JoinHandle of one in it,
# and one waiting on a Notify only it can reach; the others have a waker.
def findings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith(("  ", "note:", "warning:"))]


def check_deadlocks(text: str) -> None:
    found = findings(text)
    assert len(found) == 3, text
    cyc = next((f for f in found if f.startswith("cycle: ")), "")
    m = re.fullmatch(r"cycle: #(\d+) deadlock::(lock_ab|lock_ba) -> Mutex (0x[0-9a-f]+) held by #(\d+) "
                     r"deadlock::(lock_ab|lock_ba) -> Mutex (0x[0-9a-f]+) held by #(\d+)", cyc)
    assert m and m[1] == m[7] and m[1] != m[4] and {m[2], m[5]} == {"lock_ab", "lock_ba"} and m[3] != m[6], text
    ab = m[1] if m[2] == "lock_ab" else m[4]
    assert re.search(rf"^blocked: #\d+ deadlock::joiner -> JoinHandle 0x[0-9a-f]+ -> #{ab} deadlock::lock_ab "
                     r"\(in a cycle\)$", text, re.M), text
    assert re.search(r"^nothing can wake: #\d+ deadlock::lonely -> Notify 0x[0-9a-f]+$", text, re.M), text
    # each finding carries its evidence
    assert re.search(r"^  #\d+: deadlock::lock_ab awaits Mutex 0x[0-9a-f]+ at \S+deadlock.rs:\d+; held by #\d+: "
                     r"#\d+ holds it \(a live guard in deadlock::lock_ba", text, re.M), text
    assert re.search(r"no other task can reach it$", text, re.M), text
    for name in ("sleeper", "receiver", "once_waiter", "sender_holder", "run"):
        assert f"deadlock::{name}" not in "\n".join(found), (name, text)
