"""Tracepoint capture end to end: real gdb -> asyncrsp --capture tracepoints -> gdbserver 13.1.

* the same await graph as hidden breakpoints (tasks, edges, bt, tree) on the
  corpus tokio program and the std-only nested program (rustc 1.95 debug and
  Debian's rustc 1.63 debug);
* exact counts on the C probe program (``--trace-probe``: N entries and N
  rets), one and four threads, with the client's own breakpoint on the same
  function (the ``select_event_lwp`` spurious stops are recorded by the
  proxy), and while the client single-steps;
* the client's own trace experiment works (``trace``/``tstart``/``tfind``/
  ``tstatus``) and the proxy hands tracing over to it;
* nothing left behind: after detach the code bytes at every tracepoint are
  the file's (``/proc/PID/mem``) and the program runs to a normal exit;
* a 64 KiB buffer with 100,000 events: hidden drains, nothing lost.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from integration.harness.gdb import gdb_batch
from integration.harness.monitor import ask, corpus_binary, section, session
from integration.harness.normalise import mask_timing
from integration.harness.stubs import become_subreaper, pid_alive, start_proxy, start_stub
from integration.harness.tools import require_tool

ROOT = Path(__file__).resolve().parents[1]


TRACE = ["--capture", "tracepoints"]
COUNT = [*TRACE, "--trace-probe", "^probed$"]


def _printf_line() -> int:
    src = ROOT / "integration" / "programs" / "probe_count.c"
    for no, line in enumerate(src.read_text().splitlines(), 1):
        if 'printf("sum=' in line:
            return no
    raise AssertionError("probe_count.c has no printf line")


# ------------------------------------------------------------ the same graph
def _normal(text: str) -> str:
    """Drop what depends on timing or on the run: poll counts, thread ids, poll times."""
    out = []
    for line in mask_timing(text).splitlines():
        line = re.sub(r"\b(thread|THREAD)\s+\d+", r"\1 N", line)
        line = re.sub(r"^(#\d+\s+\S+\s+.*?)\s+\d+(?: D D D)?\s+\d+\s+(root|#\d+)\s", r"\1 P T \2 ", line)
        # `tasks` (one row per task): the THREAD column before FOUND BY
        line = re.sub(r"\s\d+(\s+(?:observed|stack|tokio runtime|join handle|seen before)\b)", r" T\1", line)
        out.append(line.rstrip())
    return "\n".join(out)


GRAPH_CASES = [("debug", "tokio_app", "c_after_sleep", ["ct"]),
               ("old-debug", "tokio_app", "c_after_sleep", ["ct"]),
               ("debug", "nested", "c_after_yield", []),
               ("old-debug", "nested", "c_after_yield", [])]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("config,program,bp,args", GRAPH_CASES)
def test_same_graph_as_breakpoints(config: str, program: str, bp: str, args: list[str]) -> None:
    prog = corpus_binary(config, program)
    from integration.corpus import markers

    file, line = markers.breakpoint_markers(program)[bp]
    cmds = [f"break {file.name}:{line}", "continue", *ask("tasks", "edges --completed", "bt", "tree", "stats --all")]
    got = {}
    for cap in ("breakpoints", "tracepoints"):
        out = session(prog, args, cmds, extra=["--capture", cap])
        got[cap] = {c: _normal(section(out, c)) for c in ("tasks", "edges --completed", "bt", "tree")}
        stats = section(out, "stats --all")
        assert f"capture: {cap}" in stats and "events lost: 0" in stats or cap == "breakpoints", stats
    for c in got["breakpoints"]:
        assert got["breakpoints"][c] == got["tracepoints"][c], (
            f"{c} differs\n--- breakpoints\n{got['breakpoints'][c]}\n--- tracepoints\n{got['tracepoints'][c]}")
    assert "#1" in got["tracepoints"]["tasks"]


# ------------------------------------------------------------ transparency
def _gdb_pairs() -> list[object]:
    from integration.harness import matrix

    return [pytest.param(sc, client, id=f"{sc.name}-{client}") for sc in matrix.SCENARIOS
            for client in ("gdb", "mi") if not matrix.broken_reason(client, "gdbserver", sc.name)]


@pytest.mark.parametrize(("sc", "client"), _gdb_pairs())
def test_transparent_with_tracepoints(sc: object, client: str, programs: dict[str, Path],
                                      request: pytest.FixtureRequest) -> None:
    """The transparency matrix, gdb CLI and MI against gdbserver, with the
    proxy tracing probed() inside gdbserver instead of stopping on it."""
    from integration.harness.transparency import check_transparent

    check_transparent(sc, client, "gdbserver", programs, request,  # type: ignore[arg-type]
                      probes=(), proxy_extra=(*TRACE, "--trace-probe", "^probed$"))


# ------------------------------------------------------------ exact counts
def _count_run(prog: Path, n: int, threads: int, cmds: list[str], extra: list[str] = COUNT,
               timeout: float = 120) -> str:
    with start_stub("gdbserver", prog, [str(n), str(threads)]) as stub, \
            start_proxy(stub.address, extra=extra) as px:
        run = gdb_batch(prog, [f"target remote {px.address}", *cmds,
                               f"break probe_count.c:{_printf_line()}", "continue",
                               "monitor async stats --all", "continue"], timeout=timeout)
        assert px.wait(timeout=30) == 0, px.stderr_text()
        stub.wait(timeout=10)
        assert f"sum={n * n} calls={n}" in stub.output_text(), stub.output_text()
    assert "exited normally" in run.output, run.output
    return run.output


def _counts(out: str) -> tuple[int, int]:
    entry = re.search(r"^\s*probed: (\d+)", out, re.M)
    ret = re.search(r"^\s*probed \(ret\): (\d+)", out, re.M)
    assert entry and ret, out
    return int(entry.group(1)), int(ret.group(1))


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("client_bp", [False, True], ids=["proxy-only", "client-breakpoint"])
def test_exact_counts(threads: int, client_bp: bool, programs: dict[str, Path]) -> None:
    require_tool("gdb", "gdbserver")
    n = 400
    cmds = ["break probed", *["continue"] * 20, "delete"] if client_bp else []
    out = _count_run(programs["probe_count"], n, threads, cmds)
    assert _counts(out) == (n, n), out
    assert "capture: tracepoints" in out and "events lost: 0" in out, out


def test_exact_counts_while_stepping(programs: dict[str, Path]) -> None:
    require_tool("gdb", "gdbserver")
    n = 50
    cmds = ["break probed", "continue", "stepi", "stepi", "stepi", "stepi", "stepi", "stepi", "continue",
            "next", "next", "finish", "step", "step", "delete"]
    out = _count_run(programs["probe_count"], n, 1, cmds)
    assert _counts(out) == (n, n), out


def test_count_is_zero_without_calls(programs: dict[str, Path]) -> None:
    require_tool("gdb", "gdbserver")
    out = _count_run(programs["probe_count"], 0, 1, [])
    assert _counts(out) == (0, 0), out


def test_packet_log_accounts_for_every_hit(programs: dict[str, Path], tmp_path: Path) -> None:
    """scripts/packet-log on the proxy's ``--log-packets`` file: the frames of
    the stub's trace buffer plus its stops at tracepoint addresses are every
    hit, against the program's own count (400 calls, 4 threads): the entry
    tracepoint 400, the rets together 400, as the proxy's stats say."""
    from integration.harness import packetlog

    require_tool("gdb", "gdbserver")
    n, log = 400, tmp_path / "packets.log"
    out = _count_run(programs["probe_count"], n, 4, [], extra=[*COUNT, "--log-packets", str(log)])
    assert _counts(out) == (n, n), out
    with log.open(encoding="latin-1") as fh:
        hits = packetlog.trace_hits(packetlog.read_log(fh))
    table = hits.table()
    assert len(hits.tracepoints) == len(_code_sites(programs["probe_count"])), table
    entry, *rets = sorted(hits.tracepoints, key=hits.tracepoints.__getitem__)
    assert hits.hits(entry) == n, table
    assert sum(hits.hits(r) for r in rets) == n, table
    assert hits.drains >= 1, table


# ----------------------------------------------------- the client's own tracing
def test_client_runs_its_own_trace_experiment(programs: dict[str, Path]) -> None:
    require_tool("gdb", "gdbserver")
    prog = programs["probe_count"]
    with start_stub("gdbserver", prog, ["20"]) as stub, start_proxy(stub.address, extra=COUNT) as px:
        run = gdb_batch(prog, [f"target remote {px.address}", "break main", "continue",
                               "tstatus", "info tracepoints",
                               "trace probed",
                               "tstart", f"break probe_count.c:{_printf_line()}", "continue",
                               "tstop", "tstatus", "tfind start", "tfind end",
                               "monitor async stats --all", "continue"], timeout=120)
        assert px.wait(timeout=30) == 0, px.stderr_text()
    out = run.output
    # before: the proxy's experiment is invisible
    assert "No trace has been run on the target" in out, out
    assert "No tracepoints." in out, out
    # the client's experiment works as without the proxy
    assert re.search(r"Collected 20 trace frames", out), out
    assert re.search(r"Found trace frame 0, tracepoint \d+", out), out
    # and the proxy switched to breakpoints, saying why
    assert re.search(r"capture: breakpoints", out), out
    assert "exited normally" in out, out


# ------------------------------------------------------- nothing left behind
def _code_sites(prog: Path) -> list[int]:
    """Link-time addresses of probed's entry and rets (what --trace-probe plants)."""
    from proxy.analysis.elf import open_elf
    from proxy.analysis.exits import ExitFinder

    elf = open_elf(str(prog))
    (sym,) = [s for s in elf.symbols if s.name == "probed"]
    rets, _ = ExitFinder(elf, []).exits(sym.addr, sym.addr + sym.size)
    return [sym.addr, *rets]


def _mem_equals_file(pid: int, prog: Path) -> None:
    from proxy.analysis.elf import open_elf

    elf = open_elf(str(prog))
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    base = min(int(line.split("-")[0], 16) for line in maps if line.endswith(str(prog)))
    bias = base if elf.pie else 0
    with open(f"/proc/{pid}/mem", "rb") as mem:
        for addr in _code_sites(prog):
            mem.seek(addr + bias)
            assert mem.read(1) == elf.read(addr, 1), f"int3 left at {addr + bias:#x}"


@pytest.mark.parametrize("how", ["detach", "hangup"])
def test_nothing_left_behind(how: str, programs: dict[str, Path]) -> None:
    """An attached program (spin: calls probed() in a loop for 8 s of wall
    time): after detach, or the client hanging up while it runs, every code
    byte is the file's and it runs on to a normal exit, still calling probed."""
    require_tool("gdb", "gdbserver")
    become_subreaper()
    prog = programs["spin"]
    # its own process group: gdbserver interrupts an attached program by
    # signalling its group (kill(-pid)), which fails for a non-leader
    child = subprocess.Popen([str(prog), "8"], stdout=subprocess.PIPE, start_new_session=True)
    try:
        time.sleep(0.3)
        with start_stub("gdbserver", prog, [], attach=child.pid) as stub, \
                start_proxy(stub.address, extra=[*TRACE, "--trace-probe", "^probed$"]) as px:
            if how == "detach":
                cmds = ["break probed", "continue", "continue", "delete", "monitor async stats --all", "detach"]
                run = gdb_batch(prog, [f"target remote {px.address}", *cmds], timeout=60)
                hits = re.search(r"traced probe hits: (\d+)", run.output)
                assert hits and int(hits.group(1)) > 0, run.output
            else:
                gdb = subprocess.Popen(["gdb", "-nx", "-batch", "-ex", f"target remote {px.address}",
                                        "-ex", "continue", str(prog)],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                time.sleep(3)
                gdb.kill()  # the client vanishes while the program runs
                gdb.wait()
            px.wait(timeout=30)
            stub.wait(timeout=30)
        assert pid_alive(child.pid), "the program died after the proxy left"
        _mem_equals_file(child.pid, prog)
        code = child.wait(timeout=60)
        assert code == 0, f"exit status {code}"
        assert child.stdout is not None and b"spun ok" in child.stdout.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# ------------------------------------------------------------ no silent loss
@pytest.mark.timeout(300)
@pytest.mark.slow  # a stress run: bash scripts/test-long
def test_small_buffer_many_events_nothing_lost(programs: dict[str, Path]) -> None:
    require_tool("gdb", "gdbserver")
    n = 50_000  # 100,000 events through a 64 KiB buffer (32-byte frames: ~50 buffers full)
    out = _count_run(programs["probe_count"], n, 2, [], extra=[*COUNT, "--trace-buffer", "64K"], timeout=280)
    drains = re.search(r"trace drains: (\d+)", out)
    assert drains and int(drains.group(1)) > 20, out
    lost = re.search(r"events lost: (\d+)", out)
    assert lost, out
    if int(lost.group(1)) == 0:
        assert _counts(out) == (n, n), out
    else:  # a loss is never silent: counted, and the counts fall short by at least that much
        e, r = _counts(out)
        assert 2 * n - (e + r) >= int(lost.group(1)), out


# ------------------------------------------------------------ poll timing
@pytest.mark.timeout(300)
def test_top_ranks_a_spinning_task_above_a_sleeping_one() -> None:
    """poll_timing: `spinner` busy-loops 3 ms in each of its 10 polls, `sleeper`
    sleeps 6 ms between 10 polls that do nothing. With the timestamps
    gdbserver records, `top` puts the spinner first; its busy time is at
    least the spinning (timing accuracy is measured, not asserted: README)."""
    require_tool("gdb", "gdbserver")
    polls, spin_ms = 10, 3
    prog = corpus_binary("debug", "poll_timing")
    hist_of_spinner = ("python import re; gdb.execute('monitor async top ' + re.search(r'^(#\\d+)\\s.*spinner', "
                       "gdb.execute('monitor async top', to_string=True), re.M).group(1))")
    out = session(prog, [str(polls), str(spin_ms)],
                        ["break _exit", "continue", *ask("top", "stats --all"), "echo ==hist==\\n", hist_of_spinner,
                         "echo ==end==\\n"], extra=TRACE)
    stats = section(out, "stats --all")
    assert "capture: tracepoints" in stats and "events lost: 0" in stats, stats
    top = section(out, "top").splitlines()
    assert top[0].startswith("capture cost subtracted: ") and "calibrated" in top[0], top
    rows = [line.split() for line in top[2:] if line.startswith("#")]
    names = [r[-1] for r in rows]
    spinner = next(i for i, n in enumerate(names) if n.startswith("poll_timing::spinner"))
    sleeper = next(i for i, n in enumerate(names) if n.startswith("poll_timing::sleeper"))
    assert spinner < sleeper, top
    # the spinner's busy time is at least what it spun; the sleeper's is tiny
    busy = _ns(rows[spinner][1])
    assert busy >= 0.5 * polls * spin_ms * 1e6, top
    assert _ns(rows[sleeper][1]) < busy / 10, top
    hist = section(out, "hist")
    assert hist.startswith(f"{rows[spinner][0]} poll_timing::spinner"), hist
    assert "poll durations" in hist and re.search(r"\d+ #+$", hist, re.M), hist
    print("\n" + "\n".join(top) + "\n" + hist)


def _ns(cell: str) -> float:
    m = re.fullmatch(r"([\d.]+)(ns|us|ms|s)", cell)
    assert m, cell
    return float(m.group(1)) * {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[m.group(2)]


# ------------------------------------------------------------ program exit
def _stats_counts(out: str) -> tuple[int, int, int]:
    m = re.search(r"events: (\d+) \(enters (\d+), exits (\d+), lost (\d+)", out)
    assert m, out[-3000:]
    assert m.group(4) == "0", out[-3000:]
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


@pytest.mark.timeout(300)
def test_exit_while_tracing_drains_the_last_frames() -> None:
    """The program runs to its exit with no stop in between: every frame is
    still in gdbserver's buffer at the `W`. The proxy drains it before the
    client sees the exit (gdbserver answers qTStatus/qTBuffer after the
    process is gone) - the same events as a run that stops at `_exit`."""
    require_tool("gdb", "gdbserver")
    prog = corpus_binary("debug", "tokio_bench")
    got = {}
    for how, cmds in (("exit", ["continue"]), ("_exit", ["break _exit", "continue"])):
        with start_stub("gdbserver", prog, ["5", "ct"]) as stub, start_proxy(stub.address, extra=TRACE) as px:
            # extended-remote: gdb stays connected after the exit and can still ask
            run = gdb_batch(prog, [f"target extended-remote {px.address}", *cmds, "monitor async stats --all", "kill"],
                            timeout=240)
            assert "check=ok" in stub.output_text(), stub.output_text()
        if how == "exit":
            assert "exited normally" in run.output, run.output
            assert "trace drains after the program exited: 1" in run.output, run.output
        events, enters, exits = _stats_counts(run.output)
        assert enters == exits and events == enters + exits, run.output
        got[how] = events
    assert got["exit"] == got["_exit"] > 500, got


# ------------------------------------------------------------ fork
def _probed_to_exit(name: str, args: list[str], extra: list[str] = (), timeout: float = 120) -> tuple[str, str]:  # type: ignore[assignment]
    """The C program ``name args`` under gdbserver and the proxy with tracepoints on
    `probed`, gdb run to its `_exit`, the stats asked, run to the end: (gdb's output, the
    program's)."""
    require_tool("gdb", "gdbserver")
    from integration.harness import programs as cprogs

    prog = cprogs.build(name)
    with start_stub("gdbserver", prog, args) as stub, \
            start_proxy(stub.address, extra=[*TRACE, "--trace-probe", "^probed$", *extra]) as px:
        run = gdb_batch(prog, [f"target remote {px.address}", "break _exit", "continue",
                               "monitor async stats --all", "continue"], timeout=timeout)
        assert px.wait(timeout=30) == 0, px.stderr_text()
        stub.wait(timeout=10)
        program_out = stub.output_text()
    return run.output, program_out


@pytest.mark.timeout(300)
def test_the_captures_drains_do_not_signal_the_programs_children() -> None:
    """forker 20000 fork under a 64 KiB trace buffer: the parent's 20,000 calls after the fork
    (40,000 frames) need hidden drains while the child (untraced once gdb detached it, in the
    program's process group) runs its 1.5 s. A drain's interrupt is a SIGINT to the program's
    process alone: a 0x03 made gdbserver signal the whole group, and the child died of it
    (`forker child=130`)."""
    out, program_out = _probed_to_exit("forker", ["20000", "fork"], ["--trace-buffer", "64K"], timeout=240)
    drains = re.search(r"hidden interrupts \(capture drains\): (\d+)", out)
    assert drains and int(drains.group(1)) >= 2, out
    assert "forker child=0 " in program_out, program_out + out


@pytest.mark.timeout(300)
def test_fork_child_survives_and_the_parent_keeps_recording() -> None:
    """forker 5 fork: `probed` 5 times, fork, then parent and child 5 more
    each (the child keeps calling it ~1.5 s). The child gets copies of the
    tracepoints' int3s; the proxy writes the file's bytes back into it at the
    fork report, and restarts the experiment gdbserver stops when gdb
    detaches the child: the child exits 0 and the parent's 10 calls are all
    counted, entries and rets."""
    out, program_out = _probed_to_exit("forker", ["5", "fork"])
    assert "forker child=0 " in program_out, program_out + out
    assert "fork children cleaned of the tracepoints' int3s: 1; experiment restarted after a child's detach: 1" in out, out
    assert re.search(r"^\s*probed: 10$", out, re.M) and re.search(r"^\s*probed \(ret\): 10$", out, re.M), out
    assert "exited normally" in out, out


@pytest.mark.timeout(300)
def test_exec_while_tracing_stops_the_experiment_cleanly() -> None:
    """forker 5 exec: `probed` 5 times, then the program execs itself and
    calls it 5 more times. At the exec report the proxy drains what the old
    image recorded, then `QTStop; QTinit` (gdbserver freed the tracepoints'
    breakpoints but would still report a running experiment); the session
    stops capturing. The new image runs to a normal exit and the client sees
    no running trace experiment."""
    require_tool("gdb", "gdbserver")
    from integration.harness import programs as cprogs

    prog = cprogs.build("forker")
    script = ["catch exec", "continue", "tstatus", "continue"]
    with start_stub("gdbserver", prog, ["5", "exec"]) as stub:  # what gdb says without the proxy
        direct = gdb_batch(prog, [f"target remote {stub.address}", *script], timeout=120).output
    with start_stub("gdbserver", prog, ["5", "exec"]) as stub, \
            start_proxy(stub.address, extra=[*TRACE, "--trace-probe", "^probed$"]) as px:
        run = gdb_batch(prog, [f"target remote {px.address}", *script], timeout=120)
        px.wait(timeout=30)
        stub.wait(timeout=10)
        program_out = stub.output_text()
    out = run.output
    assert "forker exec'd sum=" in program_out, program_out + out
    assert "exited normally" in out, out
    assert "process" in out and "is executing new program" in out, out
    # After the proxy's QTStop, gdbserver reports a stopped experiment (gdb said
    # "Trace stopped by a tstop command"): the dropped capture's veil answers
    # `tstatus` as if no experiment ever ran, which is what gdb says directly.
    def tstatus(text: str) -> str:
        m = re.search(r"is executing new program.*?\n(.*?)(?:\n\[Inferior|\Z)", text, re.S)
        assert m, text
        return "\n".join(ln for ln in m.group(1).splitlines() if "Catchpoint" not in ln and "in _start" not in ln
                         and not ln.startswith(("0x", "Reading", "warning")))

    assert "Trace is running" not in out and "tracepoint" not in out.lower(), out
    assert "Trace stopped" not in out, out
    assert tstatus(out) == tstatus(direct), (out, direct)


@pytest.mark.timeout(300)
def test_vfork_child_survives_and_the_restart_waits_for_vforkdone() -> None:
    """vforker 5: `probed` 5 times, vfork (the child execs /bin/true), 5 more
    after a pause. The child shares the parent's memory until its exec:
    gdbserver's stop at gdb's `D;child` takes the int3s out of both, the
    proxy clears the drained buffer without restarting, and restarts at a
    hidden stop after `vforkdone`; the window is said (graph incomplete),
    and here nothing fell in it: 10 entries and 10 rets."""
    require_tool("gdb", "gdbserver")
    from integration.harness import programs as cprogs

    prog = cprogs.build("vforker")
    with start_stub("gdbserver", prog, ["5"]) as stub, \
            start_proxy(stub.address, extra=[*TRACE, "--trace-probe", "^probed$"]) as px:
        run = gdb_batch(prog, [f"target remote {px.address}", "break _exit", "continue",
                               "monitor async stats --all", "continue"], timeout=120)
        px.wait(timeout=30)
        stub.wait(timeout=10)
        program_out = stub.output_text()
    out = run.output
    assert "vforker child=0 sum=50" in program_out, program_out + out
    assert "experiment restarted after a child's detach: 1" in out and "graph: incomplete" in out, out
    assert re.search(r"^\s*probed: 10$", out, re.M) and re.search(r"^\s*probed \(ret\): 10$", out, re.M), out


# ------------------------------------------------------------ fast tracepoints
FAST = [*COUNT, "--inproc"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("threads", [1, 4])
def test_fast_tracepoints_exact_counts_on_the_probe_program(threads: int) -> None:
    """probe_count built non-PIE (a 5-byte nop at each entry), started by
    gdbserver with its in-process agent: `probed`'s entry becomes a fast
    tracepoint (gdbserver asks the proxy to relocate the nop: qRelocInsn),
    its 1-byte ret stays a trap tracepoint (said in stats). N calls give N
    entries and N rets, the program's result is right, and the client sees
    the normal exit (the proxy's guard on libc's _exit stops the experiment
    while the process lives: gdbserver 13.1 with its agent dies on the
    proxy's drain after the exit, and gdb saw "Remote connection closed").
    Four threads: gdbserver 13.1 asserts (lwp->suspended == 0) when a
    reported stop finds a thread in a jump pad and another with a trap
    pending; the proxy's guard on pthread_create puts the trap tracepoints
    back before the second thread exists (the fast entries recorded before
    count), and stats say why."""
    require_tool("gdb", "gdbserver")
    from integration.harness import programs as cprogs

    if not os.path.exists("/usr/lib/libinproctrace.so"):
        pytest.skip("no /usr/lib/libinproctrace.so (gdbserver's in-process agent)")
    prog = cprogs.build("probe_count", nopie=True)
    n = 3000
    with start_stub("gdbserver-inproc", prog, [str(n), str(threads)]) as stub, \
            start_proxy(stub.address, extra=FAST) as px:
        run = gdb_batch(prog, [f"target remote {px.address}", f"break probe_count.c:{_printf_line()}", "continue",
                               "monitor async stats --all", "continue"], timeout=240)
        assert px.wait(timeout=30) == 0, px.stderr_text()
        stub.wait(timeout=10)
        assert f"sum={n * n} calls={n}" in stub.output_text(), stub.output_text()
        stub_out = stub.output_text()
    out = run.output
    assert "A problem internal to GDBserver" not in stub_out, stub_out
    assert "exited normally" in out and "Remote connection closed" not in out, out + stub_out
    assert _counts(out) == (n, n), out
    if threads == 1:
        assert "fast tracepoints: 1 (in use); 1 site(s) kept a trap" in out, out
    else:
        assert "fast tracepoints: 0 (replaced by trap tracepoints)" in out, out
        assert "fast tracepoints taken out: the program starts a second thread (pthread_create)" in out, out
    assert "probed (ret 0x" in out and "a ret is 1 byte" in out, out
    assert re.search(r"instructions relocated for gdbserver \(qRelocInsn\): [1-9]", out), out
    assert "events lost: 0" in out, out


@pytest.mark.timeout(300)
def test_fast_tracepoints_say_why_not_for_a_pie() -> None:
    """The same with a position-independent build: trap tracepoints, and stats say why."""
    require_tool("gdb", "gdbserver")
    from integration.harness import programs as cprogs

    if not os.path.exists("/usr/lib/libinproctrace.so"):
        pytest.skip("no /usr/lib/libinproctrace.so (gdbserver's in-process agent)")
    prog = cprogs.build("probe_count")
    with start_stub("gdbserver-inproc", prog, ["50", "1"]) as stub, start_proxy(stub.address, extra=FAST) as px:
        run = gdb_batch(prog, [f"target remote {px.address}", f"break probe_count.c:{_printf_line()}", "continue",
                               "monitor async stats --all", "continue"], timeout=120)
        px.wait(timeout=30)
    out = run.output
    assert _counts(out) == (50, 50), out
    assert "fast tracepoints: not used: the program is position-independent" in out, out


def test_program_file_replaced_before_the_capture_starts(tmp_path: Path) -> None:
    """gdbserver's qXfer:exec-file answers "PATH (deleted)" once a rebuild has renamed a
    new file over the running program's (seen when a corpus rebuild ran beside a
    benchmark: "capture tracepoints: cannot analyse ... (deleted)"). On the program's
    host the proxy analyses the running file through /proc/PID/exe instead."""
    import shutil

    src = corpus_binary("debug", "tokio_app")
    prog, for_gdb = tmp_path / "tokio_app", tmp_path / "tokio_app.gdb"
    shutil.copy2(src, prog)
    shutil.copy2(src, for_gdb)
    from integration.corpus import markers

    file, line = markers.breakpoint_markers("tokio_app")["c_after_sleep"]
    # after gdbserver started the program, before the first resume (when the proxy plants)
    replace = f"shell rm {prog} && cp /bin/true {prog}"
    out = session(prog, ["ct"], [replace, f"break {file.name}:{line}", "continue",
                                        *ask("stats --all", "tasks")], extra=TRACE)
    stats = section(out, "stats --all")
    assert "capture: tracepoints" in stats and "cannot analyse" not in stats, stats
    assert re.search(r"capture: tracepoints \([1-9]\d* poll events", stats), stats
    assert "tokio_app::" in section(out, "tasks"), out[-3000:]
