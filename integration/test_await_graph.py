"""The live await graph, end to end: real gdb -> asyncrsp -> gdbserver -> corpus programs.

Each test stops the bundled tokio program at a marked line and reads what
`monitor async ...` answers. Expected lines come from the `// await:` and
`// bp:` markers in the corpus sources, not from hard-coded numbers.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from integration.harness import debuggers
from integration.harness.stubs import start_stub

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integration" / "corpus"))

import build  # noqa: E402
import markers  # noqa: E402

SRC = "tokio_app.rs"


def _binary(config: str, program: str) -> Path:
    """The built program's own hard link (build.pinned): one file for the whole test."""
    got = build.build(configs=[config], programs=[program]).get((config, program))
    if not isinstance(got, Path):
        pytest.skip(f"{program} ({config}) not built: {got}")
    return build.pinned(got)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    port = _free_port()
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


@pytest.mark.parametrize("config,rt", CONFIGS)
def test_serial_awaits_backtrace_and_edges(config: str, rt: str) -> None:
    prog = _binary(config, "tokio_app")
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


@pytest.mark.parametrize("config,rt", CONFIGS)
def test_whole_run_graph(config: str, rt: str) -> None:
    """At the end of main: join, select, spawn, Box<dyn Future>, panic."""
    prog = _binary(config, "tokio_app")
    out = session(prog, [rt], [f"break {SRC}:{bp_line('main_done')}", "continue",
                               *ask("tasks --all", "edges --completed", "stats")])
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
    stats = section(out, "stats")
    if not config.startswith("old"):  # 1.63's panic is a missed exit (see above)
        assert re.search(r"exits missed \(recovered by sp\): 0;", stats), stats


def test_locals_match_what_the_program_prints() -> None:
    prog = _binary("debug", "tokio_app")
    # Second stop in c: a is suspended at its .await with x and label live.
    out = session(prog, ["ct"], [f"break {SRC}:{bp_line('c_after_sleep')}", "continue",
                                 *ask("where #2"), "monitor async locals #2", "echo ==end2==\\n"])
    where = section(out, "where #2")
    assert re.match(r"#2 tokio_app::a \(0x[0-9a-f]+\): running on thread \d+ at \S+:\d+$", where), where
    locs = out.split("==end==", 1)[1]
    printed = subprocess.run([str(prog), "ct"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"locals: x=(\d+) label=(\w+)", printed)
    assert m, printed
    assert re.search(rf"\bx\b.*\b{m.group(1)}\b", locs), locs
    assert m.group(2) in locs, locs


def test_program_without_async_code_says_so(tmp_path: Path) -> None:
    src = tmp_path / "plain.c"
    src.write_text("#include <stdio.h>\nint main(void){puts(\"plain\");return 0;}\n")
    prog = tmp_path / "plain"
    subprocess.run(["gcc", "-g", "-O0", "-o", str(prog), str(src)], check=True)
    out = session(prog, [], ["break main", "continue", *ask("tasks"), "next"])
    assert "no async" in section(out, "tasks").lower() or "no coroutine" in section(out, "tasks").lower()
    assert "Breakpoint 1, main" in out


def test_stripped_binary_says_so(tmp_path: Path) -> None:
    prog = tmp_path / "stripped"
    subprocess.run(["strip", "-o", str(prog), str(_binary("debug", "tokio_app"))], check=True)
    # libc's _exit: the stripped program itself has no symbols to break on.
    # A fresh analysis cache: the cache is keyed by build-id, which strip
    # keeps, and would (rightly) answer with the unstripped build's inventory.
    out = session(prog, ["ct"], ["break _exit", "continue", *ask("tasks")],
                  env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    text = section(out, "tasks").lower()
    assert "dwarf" in text or "no async" in text or "debug info" in text, text


def test_many_events_bounded_memory() -> None:
    """100,000+ poll events: completed tasks are evicted, the proxy's RSS stays bounded.
    The engine's bounds do not depend on the backend: the cheapest one that runs here
    (`auto`; uprobes as root, 100k events in seconds instead of ~50 s of hidden stops)."""
    prog = _binary("debug", "tokio_bench")
    start = time.perf_counter()
    out = session(prog, ["900", "ct"], ["break main", "continue", "monitor async stats",
                                        "break _exit", "continue", *ask("stats")],
                  # strict: every poll recorded (under the default catch-up the kernel samples while
                  # the proxy is behind, and a loaded machine then saw 69,098 events, not 100,000+)
                  extra=["--capture", "auto", "--uprobe-strict"])
    rss = [int(x) for x in re.findall(r"proxy RSS: (\d+) MB", out)]
    stats = section(out, "stats")
    events = int(re.search(r"events: (\d+)", stats).group(1))  # type: ignore[union-attr]
    evicted = int(re.search(r"evicted (\d+) completed", stats).group(1))  # type: ignore[union-attr]
    live = int(re.search(r"tasks: (\d+) live, (\d+) retained", stats).group(2))  # type: ignore[union-attr]
    capture = re.search(r"capture: (\S+)", stats)
    print(f"{events} events ({capture and capture.group(1)}), {evicted} evicted, {live} retained in "
          f"{time.perf_counter() - start:.0f} s; proxy RSS {rss[0]} MB at start, {rss[-1]} MB at the end")
    assert len(rss) == 2
    assert events >= 100_000
    assert evicted > 0 and live <= 10_002


def test_mode_and_capture_switch_at_a_stop() -> None:
    """`monitor async mode` and `capture` show and switch the backend at a stop:
    started with nothing planted (mode off), switched to full at main's start,
    the later polls are seen; switched off again, nothing more is counted."""
    prog = _binary("debug", "tokio_app")
    out = session(prog, ["ct"], [
        f"break {SRC}:{bp_line('main_start')}", f"break {SRC}:{bp_line('c_after_sleep')}",
        f"break {SRC}:{bp_line('main_done')}", "continue",
        *ask("mode", "capture", "mode full"), "delete 1", "continue",
        *ask("bt", "mode off"), "delete 2", "continue",
        *ask("stats", "edges --completed")], extra=["--mode", "off"])
    assert "mode: off" in section(out, "mode"), out[-3000:]
    capture = section(out, "capture")
    assert re.search(r"^  breakpoints: available$", capture, re.M), capture
    assert "mode: off -> full" in section(out, "mode full")
    # polls were captured between the switch and the stop in c
    assert re.search(r"^#0\s+tokio_app::c ", section(out, "bt"), re.M), section(out, "bt")
    stats = section(out, "stats")
    assert re.search(r"capture switches: 2", stats), stats
    assert re.search(r"capture: none \(mode off\)", stats), stats
    # the graph survived the switch: the awaits seen while capturing are still there
    assert "tokio_app::c" in section(out, "edges --completed")
    assert "Breakpoint 3, " in out  # the program ran on to main_done: nothing stray was left


def _registers_after_emulated_probes(program: str, args: list[str], op: str, emulate: bool) -> str:
    """Stop right after a probed entry instruction and right after a probed
    ret (through `finish`), and print what the client sees there."""
    from proxy.analysis.elf import open_elf
    from proxy.analysis.inventory import build_inventory
    from proxy.session.emulate import decode

    prog = _binary("debug", program)
    image = open_elf(prog)
    found = [(f, decode(image.read(f.low_pc, 8) or b"")) for f in build_inventory(prog).resume_fns]
    fn, em = next((f, e) for f, e in found if e is not None and e.op == op)
    main_link = next(s.addr for s in image.symbols_named("main"))
    delta = fn.low_pc + em.length - main_link
    show = ["info registers rip rsp rbp eflags rdi rsi rax", "x/4xg $rsp"]
    out = session(prog, args, [
        "break main", "continue",
        f'python gdb.execute("break *%d" % (int(gdb.parse_and_eval("(long)&main")) + {delta}))',
        "continue", "echo ==after-entry==\\n", *show, "delete",
        "finish", "echo ==after-ret==\\n", *show, "echo ==end==\\n",
        *ask("stats")], extra=[] if emulate else ["--step-over-probes"])
    return out


@pytest.mark.parametrize("program,args,op", [("tokio_app", ["ct"], "push"),
                                             ("tokio_bench", ["2", "ct"], "sub_rsp")])
def test_emulated_probes_leave_the_registers_as_a_step_would(program: str, args: list[str], op: str) -> None:
    """The hidden breakpoint at a resume fn's `sub rsp, imm` and at its `ret`
    are emulated (one resume, flags computed); the client must see exactly
    the registers and stack that stepping over them gives."""
    fast = _registers_after_emulated_probes(program, args, op, True)
    slow = _registers_after_emulated_probes(program, args, op, False)
    for part in ("after-entry", "after-ret"):
        a, b = section(fast, part), section(slow, part)
        assert "rsp" in a and "eflags" in a, a
        assert a == b, f"{part} differs:\n--- emulated\n{a}\n--- stepped\n{b}"
    assert re.search(r"emulated\): [1-9]", section(fast, "stats")), section(fast, "stats")
    assert re.search(r"emulated\): 0", section(slow, "stats")), section(slow, "stats")
