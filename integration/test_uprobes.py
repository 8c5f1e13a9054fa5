"""Uprobe capture, for real: the kernel's uprobes on real programs, real gdb and gdbserver.

Needs root and a kernel with BPF uprobe_multi links (Linux >= 6.6): every
test skips with the exact reason otherwise.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any
from types import SimpleNamespace

import pytest

from integration.corpus import build, markers
from integration.harness import programs as cprogs
from integration.harness.monitor import ask, corpus_binary, section, session
from integration.harness.normalise import mask_timing
from proxy.analysis.elf import open_elf
from proxy.analysis.inventory import build_inventory
from proxy.capture.uprobes.caller_exits import caller_exits
from proxy.analysis.model import Inventory
from proxy.capture.uprobes.capture import UprobeCapture
from proxy.graph.catalog import Catalog
from proxy.graph.engine import Engine
from proxy.graph.events import PollEnter

from integration.harness.uprobes import (AVAILABLE, BIAS, STATS, WHY, EntryCounting, c_inventory, children_of,
                                         file_bytes, http_server_session, proc_mem, run_captured, same_transcript,
                                         spawn_stopped, symbol_addr)

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY)


# ---------------------------------------------------------------- without gdb

@pytest.mark.parametrize("calls,threads", [(1000, 1), (20000, 4), (5000, 8)])
def test_exact_counts_on_the_c_probe_program(calls: int, threads: int) -> None:
    prog = cprogs.build("probe_count")
    inv = c_inventory(prog, "probed")
    cap, eng, code = run_captured(prog, [calls, threads], inv, unwind_share=0.0)
    assert code == 0
    assert cap.decoder is not None
    d = cap.decoder.stats
    assert (d.entries, d.exits, d.bad) == (calls, calls, 0), cap.stats_lines()
    assert cap.lost == 0
    # probed(0) has a null "self": the engine rejects that one entry, nothing else
    st = eng.stats()
    assert st.exits_missed == 0 and st.rejected == 1 and st.rejected_reasons == (("null self pointer", 1),)
    assert st.unmatched_exits == 1  # the exit of that rejected entry
    assert not st.log_kept and st.log_entries == 0  # nothing rewinds a uprobe capture: no event log


def test_a_binary_replaced_between_the_attach_and_the_exec_is_run_unprobed_unless_pinned(tmp_path: Path) -> None:
    """Another checkout's build() renames a new file over the shared corpus binary (same
    bytes or not) after a test attached its probes through the path and before the program's
    exec: the probes sit on the old file (a uprobe belongs to an inode), the program runs
    the new one and records nothing (a suite flake: 0 entries). A test's own hard link of
    the binary (build.pinned, what _binary gives) is one file throughout."""
    import shutil

    shared = tmp_path / "corpus" / "tokio_bench"  # stands for integration/build/corpus/release/...
    shared.parent.mkdir()
    shutil.copy2(corpus_binary("release", "tokio_bench"), shared)
    pin = build.pinned(shared, tmp_path / "pins")
    inv = build_inventory(str(pin))

    def install() -> None:  # as build.py's _install: a copy renamed over the path
        shutil.copy2(shared, tmp_path / "next")
        os.replace(tmp_path / "next", shared)

    def entries(prog: Path, before_exec: Callable[[], None] = lambda: None) -> int:
        cap, _, code = run_captured(prog, [300, "ct"], inv, unwind_share=0.0, catch_up=False,
                                    before_exec=before_exec)
        assert code == 0 and cap.decoder is not None
        return cap.decoder.stats.entries

    polls = entries(pin)
    assert polls > 0
    assert entries(shared, install) == 0  # the kernel fact: probes on the old file
    assert entries(pin, install) == polls  # the pinned link: still the file probed


def test_release_build_without_frame_pointers_unwinds_from_the_slice() -> None:
    prog = corpus_binary("release", "tokio_bench")
    inv = build_inventory(str(prog))
    # catch_up=False: every poll recorded with its slice (sampling while the proxy is behind, on
    # a loaded machine, took half the entries' slices away: 745 unwound in one CI run)
    cap, eng, code = run_captured(prog, [300, "mt"], inv, unwind_share=1.0, unwind_queue=1 << 20,
                                  stop_unwind_s=None, catch_up=False)
    assert code == 0
    u = cap.unwinder
    assert u is not None
    s = u.stats
    cap.fold.drop_unwind_queue()
    print("\n".join(cap.stats_lines()))
    assert s.unwound > 1000, s
    good = s.full + s.five_or_more
    assert good >= 0.9 * s.unwound, s
    assert s.full + s.partial == s.unwound  # the rest are marked partial
    assert s.parent_disagree == 0, s


def test_sigkill_of_the_capturing_process_leaves_the_program_running() -> None:
    """A separate Python process attaches, then dies by SIGKILL: the kernel takes the probes out."""
    prog = cprogs.build("probe_count")
    pid = spawn_stopped([str(prog), "300000", "2"])
    code = f"""
import time
from types import SimpleNamespace
from integration.harness.uprobes import c_inventory
from proxy.capture.uprobes.capture import UprobeCapture
from proxy.graph.catalog import Catalog
from proxy.graph.engine import Engine
from pathlib import Path
inv = c_inventory(Path({str(prog)!r}), "probed")
eng = Engine(Catalog(inv, 0x555555554000 if inv.pie else 0), keep_log=False)
t = SimpleNamespace(path={str(prog)!r}, pid={pid}, local=True, inventory=inv, bias=eng.catalog.load_bias,
                    engine=eng, note=None, extra={{}})
cap = UprobeCapture(unwind_share=0.0)
cap.plan(t); cap.install()
print("attached" if cap.attached else cap.note, flush=True)
while True:
    cap.poll(); time.sleep(0.005)
"""
    loader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert loader.stdout is not None
        assert loader.stdout.readline().strip() == "attached"
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.3)  # the program is mid-run, its calls probed
        loader.send_signal(signal.SIGKILL)
        loader.wait()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        if loader.poll() is None:
            loader.kill()


def test_high_event_rate_drops_under_one_percent() -> None:
    """The tokio benchmark (~25k events/s here: its debug entries are single-stepped sites),
    every poll recorded (the rate is the point: `catch_up` off, or a consumer short of CPU
    would have the kernel sample, catchup.py)."""
    prog = corpus_binary("debug", "tokio_bench")
    inv = build_inventory(str(prog))
    cap, eng, code = run_captured(prog, [900, "ct"], inv, record_changes=False, catch_up=False)
    wall = cap.program_wall  # type: ignore[attr-defined]
    assert code == 0
    st = eng.stats()
    rate = st.events / wall
    print(f"\n{st.events} events while the program ran {wall:.2f} s ({rate:,.0f}/s); lost {cap.lost}")
    assert st.events > 100_000
    assert cap.lost < 0.01 * (st.events + cap.lost), cap.stats_lines()


# ---------------------------------------------------------------- through gdb

def _norm(text: str, polls: bool) -> str:
    """Thread ids differ between two runs: every tid becomes TID. With `polls`
    False the POLLS column is masked too: at the end of the run the number of
    times `run` found a tokio timer still Pending depends on how fast the
    program ran, and breakpoint capture slows it ~100 times. Poll times are masked.

    A tid is the number after ``thread `` (bt, STATE, tree) and the tasks
    table's THREAD cell (the one before PARENT: ``root`` or ``#N``). This
    machine's ``pid_max`` is 32768: once pids wrap, the kernel hands out 300
    and up again, so a tid may have 3 digits. The mask used to be any number of
    4-7 digits, which left such a tid in place, and the two runs then differed
    ("Running on thread 812" against "thread TID"). A tid falls in 300-999
    about 2% of the time (700 of 32,468 pids), so about one case in 25 failed,
    and a run of the 8 cases failed about once in 3-4 - whenever other suites
    had just made the pids wrap (checked by test_norm_masks_every_thread_id)."""
    text = re.sub(r"\bthread \d+\b", "thread TID", mask_timing(text))
    text = re.sub(r"(?<= )\d+(?= (?:root|#\d+) )", "TID", text)
    # the tasks table of one row per task: the THREAD cell before FOUND BY
    text = re.sub(r"(?<= )\d+(?=\s+(?:observed|stack|tokio runtime|join handle|seen before)\b)", "TID", text)
    if not polls:
        text = re.sub(r"^(#\d+\s+\S+\s+\S+(?: on thread TID)?\s+)\d+", r"\1N", text, flags=re.M)
    if re.search(r"(?m)^ID .*SPAWNED AT$", text):
        # uprobes' spawn records (docs/wakes.md): a last column the other backends do not have
        text = re.sub(r"(?m)^(ID .*?)\s+SPAWNED AT$", r"\1", text)
        text = re.sub(r"(?m)^(#\d+ .*?)\s+\S+$", r"\1", text)
    text = re.sub(r"(?m)^(task #\d+ .*); spawned at \S+\)$", r"\1)", text)  # the tree's heading, likewise
    return text


_SLOW = pytest.mark.slow  # the same comparison at more markers: bash scripts/test-long
SAME_GRAPH = [
    ("debug", "tokio_app", ["ct"], "tokio_app.rs", "c_after_sleep"),
    pytest.param("debug", "tokio_app", ["ct"], "tokio_app.rs", "main_done", marks=_SLOW),
    ("debug", "tokio_app", ["mt"], "tokio_app.rs", "c_after_sleep"),
    ("old-debug", "tokio_app", ["ct"], "tokio_app.rs", "c_after_sleep"),
    pytest.param("old-debug", "tokio_app", ["ct"], "tokio_app.rs", "main_done", marks=_SLOW),
    ("debug", "nested", [], "main.rs", "c_after_yield"),
    pytest.param("debug", "nested", [], "main.rs", "main_done", marks=_SLOW),
    pytest.param("old-debug", "nested", [], "main.rs", "c_after_yield", marks=_SLOW),
]


@pytest.mark.parametrize("config,program,args,src,bp", SAME_GRAPH)
def test_same_graph_as_breakpoint_capture(config: str, program: str, args: list[str], src: str, bp: str) -> None:
    prog = corpus_binary(config, program)
    line = markers.breakpoint_markers(program)[bp][1]
    got = {}
    for capture, extra in (("breakpoints", []), ("uprobes", []), ("uprobes-changes", ["--uprobe-changes"])):
        out = session(prog, args, [f"break {src}:{line}", "continue", *ask("bt", "edges", "tasks", "tree", "stats --all")],
                         extra=["--capture", capture.split("-")[0], *extra])
        stats = section(out, "stats --all")
        assert f"capture: {capture.split('-')[0]}" in stats, stats
        # uprobes record only the polls that change the graph (the repeat ones counted in the
        # kernel); the tasks table then says that its LONGEST comes from the recorded ones
        got[capture] = {s: _norm(re.sub(r"(?m)^only the polls that changed the graph recorded .*\n?", "",
                                        section(out, s)), bp != "main_done")
                        for s in ("bt", "edges", "tasks", "tree")}
    for s in ("bt", "edges", "tasks", "tree"):
        assert got["uprobes"][s] == got["breakpoints"][s], (s, got)
        assert got["uprobes-changes"][s] == got["breakpoints"][s], (s, got)


def test_norm_masks_every_thread_id() -> None:
    """Pure: tids of 3 to 7 digits (pids wrap at pid_max, here 32768) are masked,
    line numbers, poll counts and task ids are kept."""
    def table(tid: int, polls: int, line: int) -> str:
        return (f"logical async backtrace of thread {tid}:\n"
                f"#0 tokio_app::c (#4) at src/bin/tokio_app.rs:{line}\n"
                "ID  ADDRESS         STATE                   POLLS  BUSY  IDLE  LONGEST  THREAD  PARENT  ASYNC FN\n"
                f"#1  0x7fffffffc080  Running on thread {tid}  {polls}      3us   1ms   2us      {tid}   root    run\n"
                f"#4  0x7fffffffc100/2  Suspended  {polls}      3us   1ms   2us      {tid}   #3    c\n"
                f"task #1 0x7fffffffc080 run (root, thread {tid})")
    assert _norm(table(812, 2, 34), True) == _norm(table(1234567, 2, 34), True) == _norm(table(31914, 2, 34), True)
    assert "812" not in _norm(table(812, 2, 34), True)
    assert _norm(table(812, 2, 34), True) != _norm(table(812, 3, 34), True)  # polls compared
    assert _norm(table(812, 2, 34), False) == _norm(table(812, 3, 34), False)  # unless masked
    assert _norm(table(812, 2, 34), True) != _norm(table(812, 2, 35), True)  # lines compared
    assert _norm(table(812, 2, 134), True) != _norm(table(812, 2, 135), True)
    row = "#1  0x7fffffffc080  running on thread {0}  src/bin/tokio_app.rs:34  2  3us  1ms  2us  {0}   observed, stack  run"
    assert _norm(row.format(812), True) == _norm(row.format(31914), True)


@pytest.mark.slow  # a stress run: bash scripts/test-long
def test_c_program_near_100k_events_per_second_counts_every_drop() -> None:
    """probe_count -O0: `probed` starts with an emulated `push %rbp`, so it runs at ~90k events/s here.

    Every event is either recorded or counted as lost, exactly. The drop
    *rate* (< 1% at ~100k events/s on an idle machine) is a speed figure:
    it depends on how busy the CPUs are, so it is printed here and measured
    by bench/bench_capture.py, not asserted (this failed at 2.8% with four
    test suites sharing the 2 cores)."""
    prog = cprogs.build("probe_count")
    cap, eng, code = run_captured(prog, [500000, 2], c_inventory(prog, "probed"))
    assert code == 0 and cap.decoder is not None
    n = cap.decoder.stats.records
    print(f"\n{n} events while the program ran {cap.program_wall:.2f} s "  # type: ignore[attr-defined]
          f"({n / cap.program_wall:,.0f}/s); lost {cap.lost}")  # type: ignore[attr-defined]
    assert n + cap.lost == 1_000_000
    assert n > 0


def test_a_full_ring_loses_records_without_room_and_says_so() -> None:
    """The program tells a full ring's losses from others (`lost with room`: a
    reservation that failed twice with the ring at most half full right after,
    which stats prints). A stalled consumer with a 64 KiB ring: every loss is a full
    ring, none is counted with room, and every hit is a record or a drop. Losses
    with the ring far from full were reported on the axum benchmark (1 in some 5 s
    rounds, 5 of 3 M in 30 s): the counter says how many were not a full ring."""
    prog = cprogs.build("probe_count")
    cap, _eng, code = run_captured(prog, [100000, 2], c_inventory(prog, "probed"), stalled=True,
                                   ring_bytes=1 << 16)
    assert code == 0
    c = cap.counters()
    assert "lost with room" in c, c  # the committed object counts them
    assert c["drops"] > 100_000 and c["lost with room"] == 0, c
    assert c["records"] + c["drops"] == c["hits"] == 200_000, c
    assert any(f"dropped: {c['drops']} " in ln for ln in cap.stats_lines()), cap.stats_lines()


def test_a_stop_reads_the_instances_map_in_batches() -> None:
    """Full mode reads the kernel's `instances` map at every stop: in batches of
    INST_BATCH (BPF_MAP_LOOKUP_BATCH), the same answer as two syscalls an instance
    (1,000 live instances: 1.2 ms against 18 ms; 10,000: 23 against 166, docs/history/2026-speed.md)."""
    import ctypes

    from proxy.capture.uprobes import bpf as B

    prog = B.Program.open(ring_bytes=1 << 16, max_sites=1)
    try:
        assert prog.instances() == {}
        fd, lib = prog.fds["instances"], prog._lib.lib
        n = B.INST_BATCH + 904  # more than one batch
        for i in range(n):
            k = ctypes.create_string_buffer(B.INST_KEY.pack(0x7F0000000000 + 64 * i, i % 7, 0), B.INST_KEY.size)
            # polls i: the first is an emptied instance (an elided coroutine's), left out
            v = ctypes.create_string_buffer(B.INST_STATS.pack(i, 2 * i, 3, 1, 0, 0, 0, 0), B.INST_STATS.size)
            assert lib.bpf_map_update_elem(fd, k, v, 0) == 0
        got = prog.instances()
        assert len(got) == n - 1 and got == prog._instances_one_by_one()
        assert got[(0x7F0000000000 + 64 * 5, 5)] == (5, 10, 3, 1)
        assert (0x7F0000000000, 0) not in got
    finally:
        prog.close()


# ---------------------------------------------------------------- the client's view with --probe served by uprobes
#
# `--capture uprobes --probe REGEX`: the named C functions get a counting
# uprobe (no record, no stop) under the client's breakpoints, steps and
# reads. Each test runs the same gdb session straight against gdbserver and
# through the proxy, and compares the transcripts.

from integration.harness.gdb import gdb_cli  # noqa: E402
from integration.harness.stubs import become_subreaper, pid_alive, start_proxy, start_stub, wait_orphan  # noqa: E402

def _xb(out: str) -> bytes:
    """gdb's `x/Nxb` output -> the bytes."""
    return bytes(int(h, 16) for h in re.findall(r"\b0x([0-9a-f]{2})\b", out.split(":", 1)[1] if ":" in out else out))


def _gdb_run(prog: Path, args: list[str], steps: list[object], probes: list[str], route: str,
             capture: str = "uprobes") -> tuple[list[tuple[str, str]], list[str], int | None]:
    """Run `steps` in an interactive gdb (a step is a command, or a callable (con, stub, route) -> None
    for checks between commands); (transcript without stats, stats outputs, program pid)."""
    transcript: list[tuple[str, str]] = []
    stats: list[str] = []
    with start_stub("gdbserver", prog, args) as stub:
        pid = stub.find_inferior()
        px_cm = start_proxy(stub.address, probes, ["--capture", capture]) if route == "proxy" else None
        px = px_cm.__enter__() if px_cm is not None else None
        try:
            con = gdb_cli(prog)
            try:
                con.cmd(f"target remote {px.address if px else stub.address}")
                for st in steps:
                    if callable(st):
                        st(con, stub, route)
                    elif st == STATS:
                        if route == "proxy":
                            stats.append(con.cmd(STATS))
                    else:
                        transcript.append((str(st), con.cmd(str(st))))
            finally:
                con.close()
        finally:
            if px_cm is not None:
                px_cm.__exit__(None, None, None)
    return transcript, stats, pid


def _hits(stats: str, fn: str) -> int:
    m = re.search(rf"^\s*{fn}: (\d+)", stats, re.M)
    assert m, stats
    return int(m.group(1))


def test_client_breakpoint_step_and_reads_over_a_probed_entry() -> None:
    """`spin` calls probed() in a loop. Under the client's `break *probed`, `stepi`, `finish`,
    `x/`: the same transcript as without the proxy, the uprobe in memory the whole time, the
    reads showing the file's bytes, and every call counted exactly once."""
    prog = cprogs.build("spin")
    site = symbol_addr(prog, "probed")
    orig = file_bytes(prog, "probed", 8)
    seen: dict[str, object] = {}

    def armed(con: object, stub: Any, route: str) -> None:
        seen[f"{route} mem"] = proc_mem(stub.find_inferior(), site, 1)

    steps = ["break main", "continue", armed, "x/8xb probed", "x/2i probed",
             "break *probed", "continue", "print calls", STATS, "stepi", "print calls", STATS,
             "x/8xb probed", "continue", "finish", "next", "step", "until", "until", "print calls",
             STATS, "delete", "set var keep_going = 0", "continue"]
    direct, _, _ = _gdb_run(prog, ["20"], steps, [], "direct")
    proxied, stats, _ = _gdb_run(prog, ["20"], steps, ["^probed$"], "proxy")
    same_transcript(direct, proxied)
    out = dict(proxied)
    # the kernel's int3 is really in the program, and the client reads the file's bytes
    assert seen["proxy mem"] == b"\xcc" and seen["direct mem"] == orig[:1]
    assert _xb(out["x/8xb probed"]) == orig
    assert re.search(r"capture: uprobes \([^)]*, attached\)", stats[0]) and "hidden stops: 0" in stats[-1]
    # at the stop the call has not run its first instruction yet: counted when it does
    calls = [int(re.search(r"= (\d+)", o).group(1)) for lbl, o in proxied if lbl == "print calls"]  # type: ignore[union-attr]
    assert _hits(stats[0], "probed") == calls[0] - 1
    assert _hits(stats[1], "probed") == calls[1] == calls[0]
    assert _hits(stats[2], "probed") in (calls[2], calls[2] - 1)  # the last until may stop on the call's line
    assert "Breakpoint 2, probed" in proxied[5][1] and "exited normally" in proxied[-1][1]


def _detach_and_check(steps_before: list[object], capture: str = "uprobes", wait_armed: bool = False) -> None:
    """spin with the probe on `probed`: `steps_before`, a look at the probe's bytes (0xcc: probed),
    gdb's `detach`, then the program's memory (the file's bytes back) and its exit (0, after 3 s)."""
    prog = cprogs.build("spin")
    site = symbol_addr(prog, "probed")
    orig = file_bytes(prog, "probed", 4)
    seen: dict[str, object] = {}
    become_subreaper()  # once gdbserver lets it go, the program is our child: its status is ours

    def before(con: object, stub: Any, route: str) -> None:
        pid = stub.find_inferior()
        until = time.monotonic() + (5 if wait_armed else 0)
        while proc_mem(pid, site, 1) != b"\xcc" and time.monotonic() < until:
            time.sleep(0.01)  # an attach in its thread (install_early) may still be on its way
        seen["before"] = proc_mem(pid, site, 4)

    def after(con: object, stub: Any, route: str) -> None:
        pid = stub.find_inferior()
        seen["alive"] = pid_alive(pid)
        seen["after"] = proc_mem(pid, site, 4)
        # its status: ours as subreaper once gdbserver is gone, or gdbserver's line if it reaped
        # it (gdbserver, still alive after a detach, may reap it silently: then its last line)
        code = wait_orphan(pid, timeout=20)
        m = re.search(r"Child exited with status (\d+)", stub.output_text())
        seen["exit"] = code if code is not None else (int(m.group(1)) if m else None)
        seen["output"] = stub.output_text()

    _gdb_run(prog, ["3"], [*steps_before, before, "detach", after], ["^probed$"], "proxy", capture=capture)
    assert seen["before"][:1] == b"\xcc"  # probed while gdb held the program  # type: ignore[index]
    assert seen["alive"], "the program ended before it could be checked"
    assert seen["after"] == orig  # the links closed before the stub let it go
    # spin ran its 3 s and returned 0 (it prints "spun ok" just before)
    assert seen["exit"] == 0 or (seen["exit"] is None and "spun ok" in str(seen["output"])), seen


def test_detach_leaves_the_file_bytes_and_the_program_runs_to_its_exit() -> None:
    _detach_and_check(["break main", "continue", "delete"])


def test_detach_before_the_first_resume_takes_the_early_uprobes_out() -> None:
    """`--probe` under the default auto: the count uprobe is attached from gdb's `target
    remote` on (the client's first stop, in a thread), before the program ever ran. A detach
    right then: the link is closed before the stub lets the program go, which runs to its
    exit with the file's bytes at the probe (no int3 of a link left behind)."""
    _detach_and_check([], capture="auto", wait_armed=True)


def test_more_client_breakpoints_at_probe_sites_than_debug_registers_hands_over() -> None:
    """4 debug registers: `break *f6`, then `*f1`..`*f4` (a fifth breakpoint at a uprobe site).
    The session hands over to breakpoint capture (the links close, the Z1s go back to Z0s, the
    count probes become hidden breakpoints) and the client sees no difference; the counts made
    by the uprobes before the switch are kept: every function counts N calls at `done`."""
    prog = cprogs.build("sites")
    n = 60
    steps = ["break main", "continue", "break *f6", "continue", "continue", STATS,
             "break *f1", "break *f2", "break *f3", "break *f4",
             "continue", "continue", "continue", "continue", "continue", STATS,
             "delete", "break done", "continue", STATS, "continue"]
    direct, _, _ = _gdb_run(prog, [str(n)], steps, [], "direct")
    proxied, stats, _ = _gdb_run(prog, [str(n)], steps, ["^f[1-6]$"], "proxy")
    same_transcript(direct, proxied)
    assert "exited normally" in proxied[-1][1]
    # two calls of each ran under uprobes (f6's second is at the stop), no stop hidden
    first = stats[0]
    assert re.search(r"capture: uprobes \([^)]*, attached\)", first) and "hidden stops: 0" in first
    assert [_hits(first, f"f{i}") for i in range(1, 7)] == [2, 2, 2, 2, 2, 1]
    second = stats[1]
    assert "capture switches: 1" in second and "capture: breakpoints" in second, second
    assert "capture errors: 0" in stats[2]
    assert [_hits(stats[2], f"f{i}") for i in range(1, 7)] == [n] * 6, stats[2]


# ---------------------------------------------------------------- fork and exec

def test_kernel_fact_a_forked_child_keeps_the_int3s_and_is_not_recorded() -> None:
    """What the backend has to handle (Linux 6.18, uprobe_multi filtered by pid): the child
    of a probed process inherits the int3s (the kernel copies the code pages with them) and
    the link neither records it nor takes them out. No proxy here, no gdb: the capture alone."""
    prog = cprogs.build("forker")
    n = 200
    inv = c_inventory(prog, "probed")
    eng = Engine(Catalog(inv, BIAS), keep_log=False)
    pid = spawn_stopped([str(prog), str(n), "fork"])
    target = SimpleNamespace(path=str(prog), pid=pid, local=True, inventory=inv, bias=BIAS, engine=eng,
                             note=None, extra={})
    cap = UprobeCapture(unwind_share=0.0)
    cap.plan(target)  # type: ignore[arg-type]
    cap.install()
    assert cap.attached, cap.note
    os.kill(pid, signal.SIGCONT)
    child_mem = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        cap.poll()
        kids = children_of(pid)
        if kids:
            time.sleep(0.3)  # the child is in its 1.5 s of calls
            child_mem = proc_mem(kids[0], symbol_addr(prog, "probed"), 1)
            break
        time.sleep(0.002)
    _, status = os.waitpid(pid, 0)
    cap.sync()
    cap.uninstall()
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_mem == b"\xcc"
    assert cap.decoder is not None and cap.decoder.stats.entries == 2 * n  # the parent's calls only


def _forker_session(mode: str, seen: dict[str, object]) -> tuple[list[tuple[str, str]], list[str]]:
    prog = cprogs.build("forker")
    n = 50
    site = symbol_addr(prog, "probed")

    def look(con: object, stub: Any, route: str) -> None:
        pid = stub.find_inferior()
        seen[f"{route} parent"] = proc_mem(pid, site, 1)
        kids = [k for k in children_of(pid)]
        if kids:
            seen[f"{route} child"] = proc_mem(kids[0], site, 4)

    def output(con: object, stub: Any, route: str) -> None:
        time.sleep(0.2)
        seen[f"{route} output"] = stub.output_text()

    steps = [f"catch {mode}", "continue", look, STATS, "continue", output]
    direct, _, _ = _gdb_run(prog, [str(n), mode], steps, [], "direct")
    proxied, stats, _ = _gdb_run(prog, [str(n), mode], steps, ["^probed$"], "proxy")
    same_transcript(direct, proxied)
    seen["orig"] = file_bytes(prog, "probed", 4)
    seen["n"] = n
    return proxied, stats


def test_a_forked_child_is_cleaned_of_the_probes() -> None:
    """gdb asks for fork events: at the fork report (the child stopped under gdbserver) the
    proxy writes the file's bytes over the child's copies of the int3s; the parent stays
    probed and counted, the child runs to its exit 0."""
    seen: dict[str, object] = {}
    proxied, stats = _forker_session("fork", seen)
    assert "Catchpoint 1 (forked process" in proxied[1][1]
    assert seen["proxy child"] == seen["orig"]
    assert seen["proxy parent"] == b"\xcc"  # the capture stays with the parent
    assert _hits(stats[0], "probed") == seen["n"]
    assert "forked children cleaned of the probes: 1" in stats[0]
    assert "exited normally" in proxied[-1][1] and "forker child=0 " in str(seen["proxy output"])


def test_exec_closes_the_probes_and_says_so() -> None:
    """An exec of the same file (the case where the kernel would keep probing the new image):
    the links close at the exec report, the new image has the file's bytes, `stats` says why
    capture stopped, and the program runs on to its exit."""
    seen: dict[str, object] = {}
    proxied, stats = _forker_session("exec", seen)
    assert "Catchpoint 1 (exec'd" in proxied[1][1]
    assert seen["proxy parent"] == seen["orig"][:1]
    assert "the program called exec: capture stopped" in stats[0], stats[0]
    assert _hits(stats[0], "probed") == seen["n"]
    assert "exited normally" in proxied[-1][1] and "forker exec'd" in str(seen["proxy output"])


def _step_follower_off(con: Any, stub: object, route: str) -> None:
    if route == "proxy":
        assert "async step: off" in con.cmd("monitor async step off")


def test_client_stepping_over_poll_sites_of_a_rust_program() -> None:
    """The poll capture's own sites (every resume function's entry and `ret`s) under the
    client: `break` on a resume function's entry, `x/` there, `stepi`, a breakpoint on one
    of its `ret`s and `stepi` through it, `finish`, `next`, `step`, `until`: the same
    transcript as straight against gdbserver, and the capture saw every poll. (The step
    follower is off: its `finish` from a suspended coroutine waits for the task's next
    poll, which gdbserver alone cannot; integration/test_stepping.py tests it. A `stepi` is
    never followed: that is checked here with it on.)"""
    prog = corpus_binary("debug", "nested")
    inv = build_inventory(str(prog))
    [c] = [f for f in inv.resume_fns if f.name.endswith("c::{async_fn#0}") and "nested" in f.name]
    entry, ret = c.low_pc + BIAS, c.rets[0] + BIAS
    orig = open_elf(prog).read(c.low_pc, 8)
    steps = [f"break *{entry:#x}", "continue", "x/8xb $pc", "x/2i $pc", "stepi", "stepi", "bt 3",
             f"tbreak *{ret:#x}", "continue", f"x/1xb {ret:#x}", "x/i $pc", "stepi", "bt 2",
             _step_follower_off, "finish", STATS, "next", "step", "until", "until", STATS, "delete", "continue"]
    direct, _, _ = _gdb_run(prog, [], steps, [], "direct")
    proxied, stats, _ = _gdb_run(prog, [], steps, [], "proxy")
    same_transcript(direct, proxied)
    out = dict(proxied)
    assert _xb(out["x/8xb $pc"]) == orig
    assert "ret" in out["x/i $pc"] and _xb(out[f"x/1xb {ret:#x}"]) == b"\xc3"
    assert "exited normally" in proxied[-1][1]
    # the first poll of c, stopped at: the polls of main's block, a, b and c entered, c's
    # `ret` stepped through and b's run by `finish`: each seen exactly once. b's exit is
    # probed in its caller, a few instructions after the call, when every return of b goes
    # there (caller_exits.py): `finish` stops at the return address, before that probe,
    # and b's exit is counted when a goes on (the next `next`)
    [b] = [f for f in inv.resume_fns if f.name.endswith("b::{async_fn#0}") and "nested" in f.name]
    b_in_caller = isinstance(caller_exits(open_elf(prog), [(b.low_pc, b.high_pc)])[b.low_pc], list)
    want = "events: 5 (enters 4, exits 1," if b_in_caller else "events: 6 (enters 4, exits 2,"
    assert want + " lost 0, rejected 0)" in stats[0], stats[0]
    s = stats[1]
    assert re.search(r"capture: uprobes \([^)]*, attached\)", s) and "hidden stops: 0" in s, s
    m = re.search(r"events: (\d+) \(enters (\d+), exits (\d+), lost 0, rejected 0\)", s)
    assert m and int(m.group(1)) > 6, s  # the stepping went on through more poll exits


def _enters(stats: str) -> int:
    m = re.search(r"events: \d+ \(enters (\d+), exits \d+, lost 0, rejected 0\)", stats)
    assert m, stats
    return int(m.group(1))


def test_client_at_an_entry_probe_moved_past_the_prologue() -> None:
    """rustc 1.63 debug: a resume function starts `sub rsp; mov [rsp+d],reg x3; call`,
    and its entry probe stands on the `call` (emulated by the kernel: ~1 us instead of
    ~10 us for the single-stepped `sub`). The client sees nothing of it: `break` on the
    entry, `x/` over the probed call, a breakpoint on the call itself (made hardware),
    `stepi` into the callee, `finish`: the same transcript as against gdbserver alone.
    The poll is recorded when the call runs, exactly once: not at the stop on the entry,
    not at the stop on the call, and after the `stepi` that runs it."""
    from proxy.capture.uprobes.emulated import MovedEntry, moved_entry

    prog = corpus_binary("old-debug", "nested")
    inv = build_inventory(str(prog))
    elf = open_elf(prog)
    [c] = [f for f in inv.resume_fns if f.name.endswith("c::{async_fn#0}") and "nested" in f.name]
    moved = moved_entry(elf.read(c.low_pc, c.high_pc - c.low_pc) or b"", c.low_pc, c.high_pc, c.self_in, elf.read)
    assert isinstance(moved, MovedEntry) and moved.addr > c.low_pc, moved
    entry, site = c.low_pc + BIAS, moved.addr + BIAS
    orig = elf.read(moved.addr, 8)
    steps = [f"break *{entry:#x}", "continue", STATS, f"x/8xb {site:#x}", f"x/2i {site:#x}",
             f"break *{site:#x}", "continue", "x/8xb $pc", STATS, "stepi", "bt 1", STATS,
             "finish", "delete", "continue"]
    direct, _, _ = _gdb_run(prog, [], steps, [], "direct")
    proxied, stats, _ = _gdb_run(prog, [], steps, [], "proxy")
    same_transcript(direct, proxied)
    out = dict(proxied)
    assert _xb(out[f"x/8xb {site:#x}"]) == orig and _xb(out["x/8xb $pc"]) == orig
    assert "call" in out[f"x/2i {site:#x}"]
    assert "exited normally" in proxied[-1][1]
    assert "entry probes moved past their prologue" in stats[0], stats[0]
    assert _enters(stats[1]) == _enters(stats[0])  # stopped on the call: not run yet
    assert _enters(stats[2]) == _enters(stats[1]) + 1  # the stepi ran it: c's poll entered
    assert re.search(r"capture: uprobes \([^)]*, attached\)", stats[2]) and "hidden stops: 0" in stats[2]


def test_a_program_whose_file_was_replaced_is_still_probed(tmp_path: Path) -> None:
    """The 'silent link': a rebuild replaces the program's file by rename while it runs
    (integration/corpus/build.py does). A uprobe is keyed by inode: a link attached by
    path probes the new file and records nothing in the running process. The capture
    attaches through /proc/PID/exe then, and says so."""
    import shutil

    from proxy.capture.uprobes import bpf as B
    from proxy.capture.uprobes.sites import file_offset

    src = cprogs.build("spin")
    prog = tmp_path / "spin"
    shutil.copy2(src, prog)
    # 60 s, killed at the end: a CI run at load 5 took more than 4 s to reach the
    # capture's attach, and the program had exited (/proc/PID/exe: ENOENT)
    proc = subprocess.Popen([str(prog), "60"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.2)
        shutil.copy2(src, tmp_path / "spin.new")
        os.replace(tmp_path / "spin.new", prog)  # same bytes, a new inode
        # the kernel fact: attached by path, nothing is hit
        elf = open_elf(prog)
        [sym] = [s for s in elf.symbols if s.name == "probed"]
        off = file_offset(elf, sym.addr)
        assert off is not None
        bare = B.Program.open(ring_bytes=1 << 16, max_sites=1)
        try:
            bare.set_config(proc.pid, 0, 0)
            bare.set_sites([B.SiteSpec(B.KIND_COUNT)])
            bare.attach(str(prog), [off], proc.pid)
            time.sleep(0.2)
            assert bare.site_hits([0])[0] == 0
        finally:
            bare.close()
        # the capture
        inv = c_inventory(prog, "probed")
        with open(f"/proc/{proc.pid}/maps") as maps:  # run without gdbserver: ASLR is on
            bias = int(maps.read().split("-", 1)[0], 16) if inv.pie else 0
        eng = Engine(Catalog(inv, bias), keep_log=False)
        cap = UprobeCapture(unwind_share=0.0)
        cap.plan(SimpleNamespace(path=str(prog), pid=proc.pid, local=True, inventory=inv,  # type: ignore[arg-type]
                                 bias=bias, engine=eng, note=None, extra={}))
        cap.install()
        assert cap.attached, cap.note
        time.sleep(0.2)
        cap.sync()
        lines = cap.stats_lines()
        cap.uninstall()
        assert cap.decoder is not None and cap.decoder.stats.entries > 1000, lines
        assert any("was replaced after the program started" in ln for ln in lines), lines
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("config", ["debug", "release"])
def test_sampling_records_a_sample_and_counts_every_poll(config: str) -> None:
    """--sample N: the kernel folds every poll into its instance's totals and
    records one root poll in N (new instances always). The same current-thread
    run (deterministic) fully recorded and sampled: far fewer records, the
    same number of polls counted (live instances' totals read at the end plus
    the totals of instances whose address started a new life), the same hits."""
    prog = corpus_binary(config, "tokio_bench")
    inv = build_inventory(str(prog))
    full, _eng, code = run_captured(prog, [60, "ct"], inv, unwind_share=0.0, record_changes=False)
    assert code == 0 and full.decoder is not None
    polls = full.decoder.stats.entries
    sampled, eng, code = run_captured(prog, [60, "ct"], inv, unwind_share=0.0, sample_every=16)
    assert code == 0 and sampled.decoder is not None and sampled.totals.kernel is not None
    _n, live_polls, recorded, _unseen = sampled.totals.kernel
    assert live_polls + sampled.totals.closed_polls == polls
    assert sampled.decoder.stats.entries < polls / 2, (sampled.decoder.stats.entries, polls)
    assert recorded <= sampled.decoder.stats.entries
    assert eng.timing.sampled and "exact" in eng.timing.sampled
    lines = sampled.stats_lines()
    assert any(ln.startswith("sampling: one root poll in 16") for ln in lines), lines


@pytest.mark.parametrize("config", ["debug", "release"])
def test_exits_in_the_callers_count_every_poll_once(config: str) -> None:
    """Exit probes moved from the rets to the emulated instruction after each call
    (caller_exits.py), where every return of the function goes: the same
    current-thread run with and without them, entries = exits exactly, the
    same counts, every exit matched to its entry by sp."""
    prog = corpus_binary(config, "tokio_bench")
    inv = build_inventory(str(prog))
    counts = []
    for move in (False, True):
        cap, eng, code = run_captured(prog, [60, "ct"], inv, unwind_share=0.0, move_exits=move)
        assert code == 0 and cap.decoder is not None and cap.plan_ is not None
        d = cap.decoder.stats
        st = eng.stats()
        assert d.entries == d.exits + d.unwinds and st.exits_missed == 0 and st.unmatched_exits == 0, \
            (move, d, st)
        moved = [s for s in cap.plan_.sites if s.name.endswith("(return to caller)")]
        assert bool(moved) == move, [s.name for s in cap.plan_.sites]
        counts.append((d.entries, d.exits))
    assert counts[0] == counts[1]


from bench.server import build_server  # noqa: E402

_AXUM = build_server.binary("bare")


@pytest.mark.skipif(build_server.missing("bare") is not None, reason=str(build_server.missing("bare")))
def test_task_root_exits_in_tokios_harness_count_every_poll_once() -> None:
    """tokio 1.53's harness drops its TaskIdGuard through the GOT between the task
    root's return and the `jcc` on its Poll (caller_exits.py: a call in the
    window that provably does not poll). The axum service's connection task
    then has its exits there: every entry of it meets exactly one exit, under
    real HTTP requests, and nothing is left unmatched."""
    import urllib.request

    from integration.harness.stubs import free_port, port_listening

    inv = build_inventory(str(_AXUM))
    bias = 0x555555554000 if inv.pie else 0
    eng = Engine(Catalog(inv, bias), keep_log=False)
    port = free_port()
    pid = spawn_stopped([str(_AXUM), str(port)])
    cap = UprobeCapture(unwind_share=0.0)
    try:
        cap.plan(SimpleNamespace(path=str(_AXUM), pid=pid, local=True, inventory=inv,  # type: ignore[arg-type]
                                 bias=bias, engine=eng, note=None, extra={}))
        assert cap.plan_ is not None
        conn = [s for s in cap.plan_.sites if "handle_connection" in s.name]
        assert any(s.name.endswith("(return to caller)") for s in conn), [s.name for s in conn]
        assert not any(s.name.endswith("(ret)") for s in conn), [s.name for s in conn]
        assert cap.install() is None and cap.attached, cap.note
        os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while not port_listening(port) and time.monotonic() < deadline:
            time.sleep(0.01)
        for _ in range(200):
            assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).read()
            cap.poll()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/quit", timeout=30).read()
        except OSError:
            pass  # the server may close the connection as it ends
        _, status = os.waitpid(pid, 0)
        pid = 0
        cap.sync()
        hits = cap._prog.site_hits(list(range(len(cap.plan_.sites)))) if cap._prog else {}
        cap.uninstall()
        d, st = cap.decoder.stats, eng.stats()  # type: ignore[union-attr]
        assert d.entries == d.exits + d.unwinds and st.exits_missed == 0 and st.unmatched_exits == 0, (d, st)
        idx = {s.addr: i for i, s in enumerate(cap.plan_.sites)}
        conn_in = sum(hits.get(idx[s.addr], 0) for s in conn if s.spec.kind == 0)
        conn_out = sum(hits.get(idx[s.addr], 0) for s in conn if s.spec.kind != 0)
        assert conn_in >= 200 and conn_in == conn_out, (conn_in, conn_out)
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        cap.uninstall()


def test_time_slices_take_the_probes_out_and_keep_the_graph_sound() -> None:
    """--sample-time: the probes are in for a slice, then out (the links closed:
    the program's memory holds the file's bytes again), again and again. The
    coroutines the sliced run takes for roots (tasks) are roots in the fully
    recorded run of the same program too: a slice that began inside a task's
    poll fed nothing of it. Entries without exits at a slice end are dropped,
    never paired with a later exit."""
    prog = corpus_binary("release", "tokio_bench")
    inv = build_inventory(str(prog))
    bias = 0x555555554000 if inv.pie else 0

    def watched(fed_at_root: set[int]) -> Engine:
        """An engine that notes the site of every entry fed on a thread with no poll open."""
        e = Engine(Catalog(inv, bias), keep_log=False)
        feed = e.feed

        def watched_feed(ev: Any) -> None:
            if isinstance(ev, PollEnter) and e.current_scope(ev.thread) is None:
                fed_at_root.add(ev.site)
            feed(ev)

        e.feed = watched_feed  # type: ignore[method-assign]
        return e

    full_roots: set[int] = set()
    _full, _feng, code = run_captured(prog, [1000, "ct"], inv, unwind_share=0.0, eng=watched(full_roots))
    assert code == 0
    fed_at_root: set[int] = set()
    eng = watched(fed_at_root)
    pid = spawn_stopped([str(prog), "600000", "ct"])
    cap = UprobeCapture(unwind_share=0.0, slice_duty=0.5, slice_on_s=0.002)
    cap.plan(SimpleNamespace(path=str(prog), pid=pid, local=True, inventory=inv, bias=bias,  # type: ignore[arg-type]
                             engine=eng, note=None, extra={}))
    assert cap.install() is None and cap.attached, cap.note
    assert cap.plan_ is not None
    site = cap.plan_.sites[0]
    out_bytes: list[bytes] = []
    os.kill(pid, signal.SIGCONT)
    status = 0
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        cap.poll()
        if cap._sliced_out and cap._closing is not None and not out_bytes:
            cap._closing.join()
            try:
                with open(f"/proc/{pid}/mem", "rb") as mem:
                    mem.seek(site.addr)
                    out_bytes.append(mem.read(len(site.original)))
            except OSError:
                pass
        time.sleep(0.002)
    cap.sync()
    lines = cap.stats_lines()
    cap.uninstall()
    assert os.waitstatus_to_exitcode(status) == 0
    assert cap.slicing.count >= 2, lines
    assert out_bytes == [site.original], (out_bytes, site.original)
    assert fed_at_root and fed_at_root <= full_roots, (fed_at_root - full_roots, full_roots)
    assert any(ln.startswith("time-sliced: probes in 50%") and "not exact" in ln for ln in lines), lines
    assert eng.timing.sampled and eng.timing.sampled.startswith("time-sliced")


def test_time_slices_wait_for_the_cpu_budget() -> None:
    """--sample-time under the watcher's CPU budget (`--uprobe-budget`): a slice
    begins only once the proxy's CPU since the last one began is within the
    budget of the time since (slices.py `_slice_step`). tokio_bench polls in a
    tight loop: at 50% duty the proxy folds far more than 10% of a core's worth.
    The same run with the budget and without (2,000,000 iterations: 0.51-0.58 of
    a core and 41-42% of the time in slices without it; 0.10-0.11 and 1-3% with
    a 10% budget): with it, slices are held back,
    the probes are in a smaller share of the time, the proxy's CPU over the run
    stays near the budget, and stats says so."""
    prog = corpus_binary("release", "tokio_bench")
    inv = build_inventory(str(prog))
    bias = 0x555555554000 if inv.pie else 0
    got = {}
    for budget in (None, 0.1):
        pid = spawn_stopped([str(prog), "2000000", "ct"])
        cap = UprobeCapture(unwind_share=0.0, slice_duty=0.5, slice_on_s=0.01, cpu_budget=budget)
        cap.plan(SimpleNamespace(path=str(prog), pid=pid, local=True, inventory=inv,  # type: ignore[arg-type]
                                 bias=bias, engine=Engine(Catalog(inv, bias), keep_log=False), note=None, extra={}))
        assert cap.install() is None and cap.attached, cap.note
        os.kill(pid, signal.SIGCONT)
        t0, c0 = time.monotonic(), time.process_time()
        while not os.waitpid(pid, os.WNOHANG)[0]:
            cap.poll()
            time.sleep(0.005)
        cpu = (time.process_time() - c0) / (time.monotonic() - t0)
        cap.sync()
        line = cap.slicing.line() or ""
        cap.uninstall()
        share = re.search(r"= ([\d.]+)%\)", line)
        assert share and cap.slicing.count >= 1, line
        got[budget] = (float(share.group(1)) / 100, cpu, cap.slicing.held, line)
    (share0, cpu0, held0, line0), (share1, cpu1, held1, line1) = got[None], got[0.1]
    assert held0 == 0 and "no CPU budget" in line0, line0
    # the premise: unbounded, folding the slices takes well over the budget (0.51-0.58 of a core
    # on the quiet machine, 0.22 at load 6-7, where the proxy gets what the others leave)
    if cpu0 <= 0.1 * 1.5:
        # a loaded machine gives the unbounded proxy too little CPU to exceed the budget (0.12 of a
        # core in one CI run): the budget then holds nothing back and there is nothing to compare
        pytest.skip(f"the premise does not hold on this loaded machine: unbounded, the proxy got only "
                    f"{cpu0:.2f} of a core (the budget is 0.10)")
    assert held1 >= 1 and "the CPU budget (10% of a core" in line1 and "held" in line1, line1
    assert share1 < share0 * 0.75, got
    assert cpu1 < 0.1 * 1.6, got  # the fold of the slice under way runs past the check


def test_tasks_mode_keeps_the_tasks_probes_and_counts_them_exactly() -> None:
    """--mode tasks: the resume functions seen polled only inside other polls are
    taken out of the link (swapped for a new one, no poll unseen in between);
    the ones polled at a thread's root (tasks) stay, and the kernel counts
    every one of their polls: the same deterministic current-thread run gives
    them the same counts as a run with every function probed."""
    prog = corpus_binary("release", "tokio_bench")
    inv = build_inventory(str(prog))
    ref, _e, code = run_captured(prog, [4000, "ct"], inv, unwind_share=0.0, sample_every=16)
    assert code == 0
    # learn_s=0: the swap comes at the first poll after 100 entries were seen.
    # With a time window (it was 0.05 s) the swap also needed the program to be
    # still running at the first poll after the window ended. The program's
    # first polls come ~50 ms after the start (its exec and runtime), about when
    # the window ends, and the test's consumer polls were up to 66 ms apart at
    # load 5: a fast machine runs the 4000 requests (96,000 hits) within that,
    # and CI once saw no swap at all (43,454 records: every probe's, as in the
    # run without --mode tasks). Here the program takes 0.8 s at load 5.
    cap, _eng, code = run_captured(prog, [4000, "ct"], inv, unwind_share=0.0, sample_every=16, tasks_only=True,
                                   learn_s=0.0, learn_entries=100)
    assert code == 0
    lines = cap.stats_lines()
    assert cap.tasks.swaps >= 1 and cap.tasks.tasks_left_out, lines
    assert any(ln.startswith("tasks mode: ") and "left out" in ln for ln in lines), lines
    kept = {st.spec.fn for st in cap._kept_sites() if st.spec.kind == 0}
    left = {st.spec.fn for st in cap._att_sites if st.spec.kind == 0} - kept
    assert kept and left, (kept, left)

    def polls(c: UprobeCapture, fn: int) -> int:
        return c.totals.polls_by_fn.get(fn, 0) + c.totals.live_polls_by_fn.get(fn, 0)

    for fn in kept:
        assert polls(cap, fn) == polls(ref, fn), (fn, polls(cap, fn), polls(ref, fn))
    for fn in left:
        assert polls(cap, fn) < polls(ref, fn), (fn, polls(cap, fn), polls(ref, fn))


def test_exits_at_learned_return_sites_count_every_poll_once() -> None:
    """A resume function polled through a vtable (its address in the program's
    data: no direct caller to put its exit probes after) starts with its rets
    probed while its entries note their return addresses; the proxy checks each
    (a call ends there, then a straight window to an emulated instruction) and
    probes it, and the rets' link is closed (returns.py ``_returns_step``). The
    same current-thread run with its rets probed all along: the same entries,
    entries = exits + the polls that returned to an address not probed yet
    (counted at their entry), and nothing unmatched."""
    prog = corpus_binary("release", "tokio_bench")
    inv = build_inventory(str(prog))
    runs = []
    for learn in (False, True):
        # Learning needs a consumer poll while the program runs, after its first
        # polls through a vtable. With 300 iterations the program ran 0.22-0.27 s
        # at load 10 while the consumer's polls were up to 190-215 ms apart: 2 of 4
        # runs had one such poll only, and once in a loaded suite run none came
        # (no return site learned). 3000 iterations: 1.5-1.6 s, 6-7 polls after the
        # first return address. Without catch-up: every poll recorded in both runs
        # (with it the proxy, behind, had the kernel sample: 18,776 of 36,000).
        cap, eng, code = run_captured(prog, [3000, "ct"], inv, unwind_share=0.0, learn_returns=learn, learn_s=0.02,
                                      catch_up=False)
        assert code == 0 and cap.decoder is not None
        d, st, c = cap.decoder.stats, eng.stats(), cap.counters()
        uncovered = c.get("uncovered", 0)
        assert d.bad == 0 and st.unmatched_exits == 0, (learn, d, st)
        assert d.entries == d.exits + d.unwinds + uncovered and st.exits_missed <= uncovered, (learn, d, st, c)
        assert bool(cap.returns.sites) == learn, cap.stats_lines()
        if learn:
            line = cap.returns.line() or ""
            assert "with their exits at" in line and not cap.returns.given_up, line
            assert uncovered <= d.entries // 100, line  # learned early: at most the first step's stragglers
        runs.append(d.entries)
    assert runs[0] == runs[1]


class _CountingEngine(Engine):
    """An engine that counts the entries it is fed, per resume function (runtime low_pc)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.entries_by_site: dict[int, int] = {}

    def feed(self, ev: Any) -> Any:
        if type(ev) is PollEnter:
            self.entries_by_site[ev.site] = self.entries_by_site.get(ev.site, 0) + 1
        return super().feed(ev)


@pytest.mark.parametrize("config", ["debug", "release"])
def test_only_graph_changes_recorded_and_every_poll_counted(config: str) -> None:
    """--uprobe-changes records only the polls that change the graph (uprobes.bpf.c
    CFG_CHANGES): a repeat poll (a known instance, polled in the state its last
    poll left, from the same parent, on the same thread, leaving that state)
    writes no record and is counted in the kernel. The same current-thread run
    with every poll recorded is the reference: the same polls per resume
    function, exactly (the live instances' totals read at the end plus those
    carried by completions and new lives), and the same tasks in the graph.
    (Here every poll changes a state: what is folded is in the next test.)"""
    prog = corpus_binary(config, "tokio_bench")
    inv = build_inventory(str(prog))
    bias = 0x555555554000 if inv.pie else 0
    ref_eng = _CountingEngine(Catalog(inv, bias), keep_log=False)
    every, _eng, code = run_captured(prog, [60, "ct"], inv, eng=ref_eng, unwind_share=0.0, record_changes=False)
    assert code == 0 and every.decoder is not None and not every.changes
    d = every.decoder.stats
    assert d.entries == d.exits + d.unwinds, d
    changes, eng, code = run_captured(prog, [60, "ct"], inv, unwind_share=0.0, record_changes=True)
    assert code == 0 and changes.decoder is not None and changes.changes
    c = changes.counters()
    assert c.get("drops", 0) == 0 and c.get("scope misses", 0) == 0, c
    counted: dict[int, int] = {}
    for by_fn in (changes.totals.polls_by_fn, changes.totals.live_polls_by_fn):
        for fn, n in by_fn.items():
            site = changes._fn_site[fn]
            counted[site] = counted.get(site, 0) + n
    assert {s: n for s, n in counted.items() if n} == ref_eng.entries_by_site
    # every poll of this program changes its coroutine's state (each pends once): all recorded
    assert changes.decoder.stats.entries <= d.entries, (changes.decoder.stats.entries, d.entries)
    st, ref_st = eng.stats(), ref_eng.stats()
    assert st.tasks_seen == ref_st.tasks_seen and st.unmatched_exits == 0, (st, ref_st)
    lines = changes.stats_lines()
    assert any(ln.startswith("recorded: only the polls that changed the graph") for ln in lines), lines


def _http_server_run(prog: Path, inv: Inventory, eng: Engine, cap: UprobeCapture,
                     at_stop: Callable[[], None] | None = None,
                     poll_every: int = 50,
                     late_conn_at: int | None = None) -> tuple[str, dict[int, int], dict[str, int], list[str]]:
    """The keep-alive http_server under `cap`: 400 requests on 2 connections (and one
    more request on a third connection opened after request `late_conn_at`, left open), then
    `at_stop` with the server stopped (SIGSTOP) and everything folded (`cap.sync`),
    then /quit; `cap` synced after the exit and uninstalled. The server's output,
    and after its exit the hits per site, the counters and the stats lines."""
    import http.client

    def drive(pid: int, port: int) -> list[Any]:
        conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(2)]
        for i in range(400):
            c = conns[i % 2]
            c.request("GET", "/")
            assert c.getresponse().read()
            if i % poll_every == 0:
                cap.poll()
            if i == late_conn_at:
                conns.append(http.client.HTTPConnection("127.0.0.1", port, timeout=30))
                conns[-1].request("GET", "/")
                assert conns[-1].getresponse().read()
        if at_stop is not None:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.2)
            cap.sync()
            at_stop()
            os.kill(pid, signal.SIGCONT)
        return conns

    def after() -> tuple[dict[int, int], dict[str, int], list[str]]:
        assert cap._prog is not None and cap.plan_ is not None
        return cap._prog.site_hits(list(range(len(cap.plan_.sites)))), cap.counters(), cap.stats_lines()

    out, got = http_server_session(prog, inv, eng, cap, drive, after)
    return (out, *got)


def test_repeat_polls_folded_and_counted_against_the_servers_own_count() -> None:
    """The corpus' keep-alive http_server under --uprobe-changes: a connection's
    future is polled again and again in the same state (waiting for the next
    request), which writes no record; its polls are counted in the kernel and
    equal the server's own count exactly (`conn_polls`: the `Timed` wrapper
    `conn_task` polls once per poll of its own; `connection` is inlined in the
    release build), and so do the kernel's totals and the entry probes' hits
    of every resume function."""
    from proxy.capture.uprobes import bpf as B

    prog = corpus_binary("release", "http_server")
    inv = build_inventory(str(prog))
    bias = 0x555555554000 if inv.pie else 0
    eng = Engine(Catalog(inv, bias), keep_log=False)
    cap = UprobeCapture(unwind_share=0.0, record_changes=True)
    out, hits, counters, _lines = _http_server_run(prog, inv, eng, cap)
    assert cap.changes and cap.plan_ is not None
    assert counters.get("drops", 0) == 0 and counters.get("scope misses", 0) == 0, counters
    kernel: dict[int, int] = {}
    for by_fn in (cap.totals.polls_by_fn, cap.totals.live_polls_by_fn):
        for fn, n in by_fn.items():
            kernel[fn] = kernel.get(fn, 0) + n
    entries: dict[int, int] = {}
    for i, s in enumerate(cap.plan_.sites):
        if s.spec.kind == B.KIND_ENTRY:
            entries[s.spec.fn] = entries.get(s.spec.fn, 0) + hits.get(i, 0)
    assert {fn: n for fn, n in kernel.items() if n} == {fn: n for fn, n in entries.items() if n}
    conn = {s.spec.fn for s in cap.plan_.sites if s.spec.kind == B.KIND_ENTRY and re.search(r"::conn_task\b", s.name)}
    assert len(conn) == 1, [s.name for s in cap.plan_.sites]
    [fn] = conn
    assert kernel[fn] >= 800, kernel[fn]  # two polls a request at least
    own = re.search(r"server done requests=(\d+) connections=\d+ conn_polls=(\d+)", out)
    assert own and int(own.group(1)) == 401, own
    assert kernel[fn] == int(own.group(2)), (kernel[fn], own.group(0))
    d = cap.decoder.stats  # type: ignore[union-attr]
    polls = sum(kernel.values())
    # the connections' polls after their first ones repeat (the `ready` futures inside are
    # new ones, recorded, naming their parent): a few of them recorded, no more
    assert d.entries <= polls - kernel[fn] + 8 and d.entries == d.exits + d.unwinds, (d, polls, kernel[fn])
    assert eng.stats().unmatched_exits == 0 and eng.stats().exits_missed == 0, eng.stats()
    conn_ids = [t.id for t in eng.tasks() if t.parent is None and "conn_task" in (t.path or "")]
    assert conn_ids and sum(eng.timing.of(i).polls for i in conn_ids if eng.timing.of(i)) == kernel[fn]


@pytest.mark.parametrize("config", ["debug", "release"])
def test_nested_coroutines_done_in_one_poll_counted_not_recorded(config: str) -> None:
    """Full mode (every poll recorded) elides the coroutines created and completed
    inside one poll of their parent (uprobes.bpf.c CFG_ELIDE): in the keep-alive
    http_server, the socket's `ready` future inside `write_all` (writable at once;
    release) or the Mutex's `lock` (free; debug) writes no record.
    Checked with the program stopped mid-run: every entry probe's hits = the
    entries the engine got (recorded, sent late, or read at the stop) + the polls
    elided in the kernel, per resume function, exactly; the engine took the elided
    coroutines as finished tasks; then at the end the connection tasks' polls in
    the graph equal the server's own count (`conn_polls`)."""
    from proxy.capture.uprobes import bpf as B

    prog = corpus_binary(config, "http_server")
    inv = build_inventory(str(prog))
    bias = 0x555555554000 if inv.pie else 0
    eng = EntryCounting(Catalog(inv, bias), keep_log=False)
    cap = UprobeCapture(unwind_share=0.0)
    seen: dict[str, Any] = {}

    def at_stop() -> None:  # everything folded, the held-back entries and elided counts read
        assert cap._prog is not None and cap.plan_ is not None
        seen.update(hits=cap._prog.site_hits(list(range(len(cap.plan_.sites)))), counters=cap.counters(),
                    elided=cap.totals.elided_by_fn(), entries=dict(eng.entries_by_site), eng_elided=eng._g.c.elided)

    out, _hits, _counters, lines = _http_server_run(prog, inv, eng, cap, at_stop)
    assert cap.elide and not cap.changes and cap.plan_ is not None
    hits, counters, elided = seen["hits"], seen["counters"], seen["elided"]
    assert counters.get("drops", 0) == 0 and counters.get("scope misses", 0) == 0, counters
    assert counters.get("elided", 0) >= 300, counters  # about once a request at least
    by_site: dict[int, int] = {}
    for i, s in enumerate(cap.plan_.sites):
        if s.spec.kind == B.KIND_ENTRY:
            by_site[s.info.site] = by_site.get(s.info.site, 0) + hits.get(i, 0)
    got = dict(seen["entries"])
    for site, n in elided.items():
        got[site] = got.get(site, 0) + n
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in by_site.items() if v}, (got, by_site, elided)
    # nested coroutines only (release: the socket's `ready` inside the inlined write_all;
    # debug: the Mutex's lock and acquire, ...), never a task's root
    roots = {s.info.site for s in cap.plan_.sites if re.search(r"::(conn_task|backend|serve)\b", s.name)}
    assert elided and not set(elided) & roots, (elided, roots)
    assert 0 < seen["eng_elided"] <= counters["elided"], (seen["eng_elided"], counters)
    own = re.search(r"server done requests=(\d+) connections=\d+ conn_polls=(\d+)", out)
    assert own and int(own.group(1)) == 401, own
    conn_ids = [t.id for t in eng.tasks() if t.parent is None and "conn_task" in (t.path or "")]
    assert conn_ids and sum(eng.timing.of(i).polls for i in conn_ids if eng.timing.of(i)) == int(own.group(2))
    assert eng.stats().unmatched_exits == 0 and eng.stats().exits_missed == 0, eng.stats()
    assert any(ln.startswith("recorded: every poll, but for coroutines created and completed") for ln in lines), lines


@pytest.mark.parametrize("config", ["debug", "release"])
def test_catch_up_samples_while_behind_and_counts_stay_exact(config: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Full mode samples while the proxy is behind (catchup.py, uprobes.bpf.c
    CFG_ADAPT): a fold of 32-64 records a poll (the proxy short of CPU) and low marks
    (200 unread records up, 150 down; a poll every 10 requests) make the capture switch the kernel to
    sampling and back several times over the keep-alive http_server's 400
    requests; the connection tasks live across every switch. At a stop mid-run
    the connection tasks' polls in the graph (and the one in progress, if any:
    counted at its exit) equal the hits of their entry probe
    (every poll, recorded or folded: none counted twice, none missed), the
    recording is back to every poll, and top says what was sampled; after /quit
    they equal the server's own count (`conn_polls`). Nested one-poll coroutines
    are still elided in the recorded root polls."""
    from proxy.capture.uprobes import bpf as B
    from proxy.capture.uprobes import fold as F

    # With no time budget a poll folds one batch: a proxy short of CPU. The debug build's
    # requests each start a `backend` task (held back while sampling, CFG_HOLD_NEW, and
    # elided: done in its first poll; before that hold-back, ~3 records a request): its
    # proxy gets a bigger batch than the release build's.
    monkeypatch.setattr(F, "BATCH", 64 if config == "debug" else 32)
    prog = corpus_binary(config, "http_server")
    inv = build_inventory(str(prog))
    bias = 0x555555554000 if inv.pie else 0
    eng = Engine(Catalog(inv, bias), keep_log=False)
    cap = UprobeCapture(unwind_share=0.0, poll_budget_s=0.0, catchup_marks=(200, 150))
    assert cap.catchup is not None and cap.elide
    seen: dict[str, Any] = {}

    def conn_polls() -> int:
        ids = [t.id for t in eng.tasks() if t.parent is None and "conn_task" in (t.path or "")]
        return sum(eng.timing.of(i).polls for i in ids if eng.timing.of(i))

    def at_stop() -> None:
        assert cap._prog is not None and cap.plan_ is not None and cap.catchup is not None
        hits = cap._prog.site_hits(list(range(len(cap.plan_.sites))))
        conn = [i for i, s in enumerate(cap.plan_.sites)
                if s.spec.kind == B.KIND_ENTRY and re.search(r"::conn_task\b", s.name)]
        assert conn, [s.name for s in cap.plan_.sites]
        ids = {t.id for t in eng.tasks() if t.parent is None and "conn_task" in (t.path or "")}
        running = sum(1 for th in eng.threads() for sc in eng.scopes(th) if sc.task in ids and not sc.nested)
        seen.update(graph=conn_polls() + running, hits=sum(hits.get(i, 0) for i in conn), switches=cap.catchup.switches,
                    sampling=cap.catchup.sampling, every=cap._prog._config[2], note=eng.timing.sampled)

    out, _hits, counters, lines = _http_server_run(prog, inv, eng, cap, at_stop, poll_every=10)
    assert seen["switches"] >= 2, (seen["switches"], lines)
    assert not seen["sampling"] and seen["every"] == 1  # a stop: all folded, every poll recorded again
    assert seen["graph"] == seen["hits"] >= 800, seen
    assert seen["note"] and "sampled while the proxy was behind" in seen["note"], seen["note"]
    assert counters.get("drops", 0) == 0 and counters.get("scope misses", 0) == 0, counters
    assert counters.get("skipped", 0) > counters.get("elided", 0), counters  # some polls only counted
    assert counters.get("elided", 0) >= 30, counters  # in the recorded root polls
    own = re.search(r"server done requests=(\d+) connections=\d+ conn_polls=(\d+)", out)
    assert own and int(own.group(1)) == 401, own
    assert conn_polls() == int(own.group(2)), (conn_polls(), own.group(0))
    assert eng.stats().unmatched_exits == 0 and eng.stats().exits_missed == 0, eng.stats()
    assert any(ln.startswith("catch-up: ") and " sampled " in ln for ln in lines), lines


@pytest.mark.parametrize("config", ["debug", "release"])
def test_catch_up_within_a_cpu_budget_holds_back_new_tasks(config: str) -> None:
    """The proxy's CPU budget (catchup.py; `--uprobe-budget`): a budget of 0.1% of a
    core (the test's own CPU is the proxy process's here) leaves the fold held at every
    poll, so the unread records pass the high mark and the kernel samples until the stop.
    While sampling, a new task's first poll is held back (uprobes.bpf.c CFG_HOLD_NEW):
    the http_server's `backend` task (debug build), spawned per request and done in its first poll,
    writes no record (without the hold-back every one of them went out whole: 0 elided
    at its site); a connection opened while sampling suspends in its first poll, so its
    entry goes out late and it is in the graph at the stop. Exact all the same: at the
    stop the backend probe's hits = the backend entries the engine got + the polls
    elided there, the 3 connection tasks' polls = their entry probe's hits; after
    /quit = the server's own `conn_polls`."""
    from proxy.capture.uprobes import bpf as B

    prog = corpus_binary(config, "http_server")
    inv = build_inventory(str(prog))
    bias = 0x555555554000 if inv.pie else 0
    eng = EntryCounting(Catalog(inv, bias), keep_log=False)
    # the nested probes stay in (nested_out=False): this test is of the hold-back; with
    # the nested link switching, 2 of ~10 runs had exits without their entry (1 and 17:
    # nested polls in progress across a switch; test_nested_probes_follow_the_budget
    # covers the link and does not count them)
    cap = UprobeCapture(unwind_share=0.0, catchup_marks=(200, 150), cpu_budget=0.001, nested_out=False)
    assert cap.catchup is not None and cap.elide and cap.catchup.budget == 0.001 and cap.nested is None
    seen: dict[str, Any] = {}

    def conn_ids() -> list[int]:
        return [t.id for t in eng.tasks() if t.parent is None and "conn_task" in (t.path or "")]

    def conn_polls() -> int:
        return sum(eng.timing.of(i).polls for i in conn_ids() if eng.timing.of(i))

    def at_stop() -> None:
        assert cap._prog is not None and cap.plan_ is not None and cap.catchup is not None
        ids = set(conn_ids())
        running = sum(1 for th in eng.threads() for sc in eng.scopes(th) if sc.task in ids and not sc.nested)
        seen.update(hits=cap._prog.site_hits(list(range(len(cap.plan_.sites)))), elided=cap.totals.elided_by_fn(),
                    entries=dict(eng.entries_by_site), conns=len(ids), graph=conn_polls() + running,
                    switches=cap.catchup.switches, held=cap.catchup.held, counters=cap.counters())

    out, _hits, counters, lines = _http_server_run(prog, inv, eng, cap, at_stop, poll_every=5, late_conn_at=300)
    assert cap.plan_ is not None
    assert seen["switches"] >= 1 and seen["held"] >= 50, seen
    assert counters.get("drops", 0) == 0 and counters.get("scope misses", 0) == 0, counters
    by_site: dict[int, int] = {}
    conn_hits = 0
    for i, s in enumerate(cap.plan_.sites):
        if s.spec.kind == B.KIND_ENTRY:
            by_site[s.info.site] = by_site.get(s.info.site, 0) + seen["hits"].get(i, 0)
            if re.search(r"::conn_task\b", s.name):
                conn_hits += seen["hits"].get(i, 0)
    # every backend task is new, so its one poll is recorded or held back even while
    # sampling: recorded + elided = its probe's hits (other polls were sampled out);
    # in the release build `backend` is inlined into tokio's harness (no resume function)
    backend = {s.info.site for s in cap.plan_.sites if re.search(r"::backend\b", s.name)}
    assert bool(backend) == (config == "debug"), backend
    for b in backend:
        assert seen["entries"].get(b, 0) + seen["elided"].get(b, 0) == by_site[b] >= 401, (b, seen, by_site)
        assert seen["elided"].get(b, 0) >= 50, (seen["elided"], b)
    assert seen["conns"] == 3 and seen["graph"] == conn_hits >= 800, seen
    own = re.search(r"server done requests=(\d+) connections=\d+ conn_polls=(\d+)", out)
    assert own and int(own.group(1)) == 402, own
    assert conn_polls() == int(own.group(2)), (conn_polls(), own.group(0))
    assert eng.stats().unmatched_exits == 0 and eng.stats().exits_missed == 0, eng.stats()
    assert any(ln.startswith("catch-up: ") and "CPU budget 0.1% of a core" in ln and "held back" in ln
               for ln in lines), lines


@pytest.mark.parametrize("config", ["debug", "release"])
def test_nested_probes_follow_the_budget(config: str) -> None:
    """Full mode under a CPU budget takes the probes of the coroutines polled only
    inside other polls out while the kernel samples (nested.py `_nested_step`,
    catchup.py NestedProbes); the tasks' probes stay in. The keep-alive http_server
    under a 0.1% budget (the fold held: the kernel samples, the nested link goes
    out), two stops, the nested probes back in at each resume and out again. At
    each stop: the nested link is out and its sites hold the file's bytes (the
    tasks' sites the kernel's int3), the connection tasks' polls in the graph (+ the
    one in progress) = their entry probe's hits, every task the graph shows at a
    thread's root is one the program spawned (a task function, never a nested
    one), and no nested coroutine is shown live unless it polls now (what the graph
    knew of them went stale while out: forgotten, the tree under a task comes from
    memory); between the stops the nested coroutines were seen again. After /quit
    the connections' polls = the server's own `conn_polls`."""
    from proxy.capture.uprobes import bpf as B

    prog = corpus_binary(config, "http_server")
    inv = build_inventory(str(prog))
    bias = 0x555555554000 if inv.pie else 0
    eng = EntryCounting(Catalog(inv, bias), keep_log=False)
    cap = UprobeCapture(unwind_share=0.0, catchup_marks=(200, 150), cpu_budget=0.001)
    assert cap.nested is not None
    cap.nested.min_out_s = 0.0
    stops: list[dict[str, Any]] = []

    def conn_ids() -> list[int]:
        return [t.id for t in eng.tasks() if t.parent is None and "conn_task" in (t.path or "")]

    def conn_polls() -> int:
        return sum(eng.timing.of(i).polls for i in conn_ids() if eng.timing.of(i))

    def at_stop(pid: int) -> None:
        assert cap._prog is not None and cap.plan_ is not None and cap.nested is not None
        ids = set(conn_ids())
        running = sum(1 for th in eng.threads() for sc in eng.scopes(th) if sc.task in ids and not sc.nested)
        hits = cap._prog.site_hits(list(range(len(cap._att_sites))))
        conn = [i for i, s in enumerate(cap._att_sites)
                if s.spec.kind == B.KIND_ENTRY and re.search(r"::conn_task\b", s.name)]
        inner = set(cap.nested_links.cookies)
        with open(f"/proc/{pid}/mem", "rb") as mem:
            def now_bytes(s: Any) -> bytes:
                mem.seek(s.addr)
                return mem.read(len(s.original))
            out_sites = [s for i, s in enumerate(cap._att_sites) if i in inner]
            out_bytes = [(now_bytes(s), s.original) for s in out_sites]
            in_bytes = [now_bytes(s)[:1] for i, s in enumerate(cap._att_sites) if i in conn]
        running_tasks = {sc.task for th in eng.threads() for sc in eng.scopes(th)}
        stops.append(dict(
            out=cap.nested.out, split=cap.nested_links.split_done, link=cap.nested_links.link,
            inner=set(cap.nested_links.inner_sites),
            graph=conn_polls() + running, conn_hits=sum(hits.get(i, 0) for i in conn), conns=len(ids),
            out_bytes=out_bytes, in_bytes=in_bytes,
            roots={t.path for t in eng.tasks() if t.parent is None and not t.finished},
            stale=[t for t in eng.tasks() if not t.finished and t.id not in running_tasks
                   and t.site in cap.nested_links.inner_sites],
            entries=dict(eng.entries_by_site), elided=cap.totals.elided_by_fn(), forgotten=cap.nested_links.forgotten))

    out, counters, lines = _http_server_stops(prog, inv, eng, cap, at_stop, [300, 150])
    assert len(stops) == 2, stops
    for st in stops:
        assert st["split"] and st["out"] and st["link"] is None and st["inner"], (st["out"], lines)
        assert st["out_bytes"] and all(now == orig for now, orig in st["out_bytes"]), st["out_bytes"]
        assert st["in_bytes"] and set(st["in_bytes"]) == {b"\xcc"}, st["in_bytes"]
        assert st["graph"] == st["conn_hits"] >= 300, st
        # the program's own tasks only: connections, the accept loop, main's block, backends
        assert all(re.search(r"::(conn_task|serve|main|backend)\b", p or "") for p in st["roots"]), st["roots"]
        assert not st["stale"], st["stale"]
    # between the stops the nested probes were back in: nested coroutines recorded or elided again
    inner_seen = [sum(st["entries"].get(s, 0) + st["elided"].get(s, 0) for s in stops[0]["inner"]) for st in stops]
    assert inner_seen[1] > inner_seen[0], inner_seen
    assert cap.nested.outs >= 2, cap.nested.outs
    own = re.search(r"server done requests=(\d+) connections=\d+ conn_polls=(\d+)", out)
    assert own and int(own.group(1)) == 451, own
    assert conn_polls() == int(own.group(2)), (conn_polls(), own.group(0))
    assert counters.get("drops", 0) == 0, counters
    assert any(ln.startswith("nested probes out ") and "tasks' POLLS and BUSY exact" in ln for ln in lines), lines


def test_nested_return_sites_go_out_with_the_nested_probes() -> None:
    """A return site learned for a resume function polled through a vtable and
    only inside other polls belongs to the nested probes: out with them. Before,
    one learned after the nested probes' first split stayed in a link of its own
    for good and trapped for every call returning there while the nested probes
    were out (the axum benchmark: ~1.9 traps a request, 420,421 'return-site hits
    of other calls' in 5 s, full mode 0.49x bare instead of 0.56x). tokio_bench
    (release, current thread) under a 0.1% CPU budget: the kernel samples, the
    nested probes go out and come back (no minimum out time) while the return
    sites are learned. Every learned return site serving only nested functions
    is a nested site, and those sites trap (almost) only while their functions
    are probed: the return-site hits matching no poll of theirs stay under 3% of
    all the probes' hits (8,419-8,666 of ~52,000 before, 240-700 after)."""
    from proxy.capture.uprobes import bpf as B

    prog = corpus_binary("release", "tokio_bench")
    inv = build_inventory(str(prog))
    seen: dict[str, Any] = {}

    class Capture(UprobeCapture):
        def sync(self) -> Any:  # the state at the program's exit, before the links close
            if self._prog is not None:
                served: dict[int, set[int]] = {}  # return address -> the functions seen returning there
                for ret, fn in self._prog.rets_seen():
                    served.setdefault(ret, set()).add(fn)
                seen.update(inner=self.nested_links.inner_only, split=self.nested_links.split_done,
                            outs=self.nested and self.nested.outs,
                            rets={c: served.get(self.returns.retsite_ret.get(c, -1), set())
                                  for c, st in enumerate(self._att_sites) if st.spec.kind == B.KIND_RETSITE},
                            nested=set(self.nested_links.cookies))
            return super().sync()

    mine = Capture(unwind_share=0.0, learn_s=0.02, catchup_marks=(200, 150), cpu_budget=0.001)
    assert mine.nested is not None
    mine.nested.min_out_s = 0.0
    cap, _eng, code = run_captured(prog, [3000, "ct"], inv, cap=mine)
    assert code == 0 and cap.decoder is not None
    assert seen["split"] and seen["outs"] >= 1, seen
    inner_rets = {c for c, fns in seen["rets"].items() if fns and fns <= seen["inner"]}
    assert inner_rets, seen  # the test's premise: a nested function polled through a vtable, its return site learned
    assert inner_rets <= seen["nested"], seen
    c = cap.counters()
    # the windows of the nested link's switches (as often as it can here: no minimum out time)
    # leave some: 240-700 of ~55,000 at load 1-3
    assert c.get("retsite other", 0) <= c["hits"] * 3 // 100, (c, cap.returns.line())
    # and the nested functions' rets went when their entries did (learned at the
    # take-out): no stream of exits without their entry (3,818-4,571 before, 0 after)
    assert c.get("scope misses", 0) <= c["hits"] // 100, c


def _http_server_stops(prog: Path, inv: Inventory, eng: Engine, cap: UprobeCapture,
                       at_stop: Callable[[int], None], requests: list[int]) -> tuple[str, dict[str, int], list[str]]:
    """The keep-alive http_server under `cap` (`http_server_session`): for each n in
    `requests`, n requests on 2 connections (polling the capture every 5), then a stop
    (SIGSTOP, `cap.sync`, `at_stop(pid)`, `cap.before_resume`); then /quit. The server's
    output, and after its exit the counters and the stats lines."""
    import http.client

    def drive(pid: int, port: int) -> list[Any]:
        conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(2)]
        for n in requests:
            for i in range(n):
                c = conns[i % 2]
                c.request("GET", "/")
                assert c.getresponse().read()
                if i % 5 == 0:
                    cap.poll()
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.2)
            cap.sync()
            at_stop(pid)
            cap.before_resume()
            os.kill(pid, signal.SIGCONT)
        return conns

    out, (counters, lines) = http_server_session(prog, inv, eng, cap, drive,
                                                  lambda: (cap.counters(), cap.stats_lines()))
    return out, counters, lines
