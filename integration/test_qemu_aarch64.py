"""An AArch64 program under QEMU's user-mode gdbstub (qemu-aarch64 -g), through the proxy,
driven by gdb-multiarch.

The program is the corpus' tokio_app built for aarch64 by Debian's rustc 1.63
(integration/corpus/build.py's ``old-aarch64-debug``; scripts/arm64-toolchain installs the
arm64 std, the cross linker and gdb-multiarch). The proxy reads the program's CPU from its
ELF header (proxy/arch): pc at byte 256 of QEMU's 268-byte `g` block (x16 sits at amd64's
128), sp at 248, self in x0, the return address in x30, rets decoded as A64
(proxy/analysis/exits_aarch64.py), breakpoints of gdb's aarch64 kind 4.

Outside truth: the corpus' ``// bp:`` and ``// await:`` markers in tokio_app.rs (the lines
of c's stop and of each ``.await``), gdb's own stop line, and the program's own last line
(``tokio_app done mode=... total=84``: it ran to its normal end with the proxy's
breakpoints planted and taken out).

QEMU set-up facts (see integration/harness/stubs.py's ``_start_qemu_aarch64``): no ``-L``,
so gdb needs ``set sysroot /``; gdb-multiarch 13's batch-mode ``continue`` returns early on
QEMU's thread events unless ``maint set target-async off``.
"""

from __future__ import annotations

import re
import shutil

import pytest

from integration.corpus import markers
from integration.harness.compare import comparable, run_session, sections
from integration.harness.gdb import MiSession
from integration.harness.stubs import start_proxy, start_stub
from integration.harness.monitor import ask, corpus_binary

pytestmark = [
    pytest.mark.skipif(shutil.which("qemu-aarch64") is None,
                       reason="qemu-aarch64 not installed (scripts/setup installs qemu-user)"),
    pytest.mark.skipif(shutil.which("gdb-multiarch") is None,
                       reason="gdb-multiarch not installed (bash scripts/arm64-toolchain)"),
]

GDB_SETUP = ("set sysroot /", "maint set target-async off")
QUESTIONS = ("tree", "bt", "edges", "tasks")


def _await_line(parent: str, child: str) -> int:
    found = [m.line for m in markers.await_markers("tokio_app") if (m.parent, m.child) == (parent, child)]
    assert found, f"no // await: marker {parent} -> {child}"
    return found[0]


def _commands(end: str) -> list[str]:
    file, line = markers.breakpoint_markers("tokio_app")["c_after_sleep"]
    return [f"break {file.name}:{line}", "continue", *ask(*QUESTIONS), "echo ==gdb bt==\\n", "bt 8",
            "echo ==end==\\n", "delete", end]


def _at_c_after_sleep(config: str, rt: str, end: str = "continue",
                      extra: tuple[str, ...] = ()) -> tuple[dict[str, str], str, str, str]:
    """Stop at the c_after_sleep marker, ask the questions and gdb's own bt, then ``end``
    (continue: the program runs to its end): (the answers, gdb's output, the program's
    output, the proxy's stderr)."""
    prog = corpus_binary(config, "tokio_app")
    run = run_session("qemu-aarch64", prog, [rt], _commands(end), list(extra), gdb="gdb-multiarch", timeout=120,
                      setup=GDB_SETUP)
    return sections(run.gdb), run.gdb, run.program, run.proxy


def _x86_64_under_gdbserver(config: str, rt: str, extra: tuple[str, ...]) -> dict[str, str]:
    """The same questions on the x86-64 build by the same rustc (1.63), under gdbserver told
    the stub is remote, the runtime adapters on (the map through vFile; QEMU's from its own
    process: proxy/host/emulator.py)."""
    prog = corpus_binary(config, "tokio_app")
    run = run_session("gdbserver", prog, [rt], _commands("continue"), ["--remote", *extra])
    return {k: comparable(v) for k, v in sections(run.gdb).items()}


def _assert_emulator_map(proxy: str) -> None:
    """The runtime adapters' map came from qemu-aarch64's process, guest base 0."""
    assert re.search(r"program's memory map: the emulator's process \d+ \(qemu-aarch64\) on this host, the peer of "
                     r"the stub's TCP connection \(socket \d+\), proven by the AT_RANDOM bytes at guest base 0x0",
                     proxy), proxy[-3000:]


def _check_chain(got: dict[str, str], gdb: str, edges: bool = True) -> None:
    """The tree and bt at c_after_sleep: c at its marker, each parent at its `.await`'s
    marker; the edges too (``edges``: not when a coroutine was inlined into its parent,
    release's a into run, whose edge then goes to b at a's line; nor in mode off, which
    observed no poll)."""
    stop = markers.breakpoint_markers("tokio_app")["c_after_sleep"][1]
    want = [("tokio_app::c", stop), ("tokio_app::b", _await_line("b", "c")),
            ("tokio_app::a", _await_line("a", "b")), ("tokio_app::run", _await_line("run", "a"))]
    assert re.search(rf"Breakpoint 1, tokio_app::c::.* at src/bin/tokio_app\.rs:{stop}\b", gdb), gdb[-3000:]
    tree = [(m[1], int(m[2])) for m in re.finditer(r"╼ (tokio_app::\w+) at \S+:(\d+)", got["tree"])]
    assert tree == list(reversed(want)), got["tree"]
    bt = [(m[1], int(m[2])) for m in re.finditer(r"^#\d+\s+(\S+) .*?at \S+:(\d+)$", got["bt"], re.M)]
    assert bt == want and "<root" in got["bt"], got["bt"]
    for (child, _), (parent, line) in zip(want, want[1:] if edges else []):
        assert re.search(rf"{parent} -> #\d+ {child} at \S+:{line}\b", got["edges"]), got["edges"]
    assert re.search(rf"^#1\s.*running on thread \d+\s+\S+tokio_app\.rs:{stop}\s.*(observed|stack)\s+tokio_app::run$",
                     got["tasks"], re.M), got["tasks"]
    # gdb's own backtrace through the proxy: c, its GenFuture poll, b (QEMU's unwinding, untouched)
    frames = re.findall(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(\S+?)(?:::\{| \()", got["gdb bt"], re.M)
    assert [f for f in frames if f.startswith("tokio_app")][:3] == ["tokio_app::c", "tokio_app::b", "tokio_app::a"], \
        got["gdb bt"]


@pytest.mark.parametrize(("config", "mode"), [("old-aarch64-debug", "full"), ("old-aarch64-release", "full"),
                                           ("old-aarch64-debug", "off")])
def test_qemu_aarch64_current_thread(config: str, mode: str) -> None:
    """An aarch64 program (the current-thread runtime), debug and release, with hidden
    breakpoints (mode full) and with stack discovery alone (mode off: the CFI unwinder on
    AArch64's columns, x30 and the frame records): the tree, bt, edges and tasks at
    c_after_sleep are the source's and equal the x86-64 build's under gdbserver, and the
    program prints its result."""
    extra = ("--mode", mode)
    got, gdb, printed, proxy = _at_c_after_sleep(config, "ct", extra=extra)
    if mode == "full":
        # an entry, the rets and the unwind exits of every resume function (debug: 9 entries, 9 rets)
        assert int(re.search(r"planted (\d+) probe", proxy)[1]) >= 14, proxy
    assert "SIGTRAP" not in gdb, gdb[-3000:]  # no stop of the proxy's reached the client
    assert "registers: full (the program is aarch64: gdbserver 13's XSAVE bug is x86-64's)" in proxy, proxy
    _check_chain(got, gdb, edges=config.endswith("debug") and mode == "full")
    _assert_emulator_map(proxy)
    # the x86-64 build of the same source by the same rustc: the same answers
    want = _x86_64_under_gdbserver(config.replace("aarch64-", ""), "ct", extra)
    for q in QUESTIONS:
        assert comparable(got[q]) == want[q], f"{q}:\n--- aarch64 under qemu\n{got[q]}\n--- x86-64\n{want[q]}"
    assert "exited normally" in gdb, gdb[-3000:] + proxy[-2000:]
    assert "tokio_app done mode=ct total=84" in printed, printed[-2000:]


def test_capture_through_qemu_aarch64_multi_threaded() -> None:
    """The multi-threaded runtime with hidden breakpoints: the first stop's tree, bt, edges
    and tasks are the source's, and the program runs on to its end. QEMU 7.2 user mode lets
    every thread that traps report on its own and stops only that one: the threads left in
    its stub are released (proxy/session/pacing.py; before that, gdb's continue never
    returned in 1 run of 2 here) and the capture stays on; no stop of the proxy's reaches
    the client."""
    got, gdb, printed, proxy = _at_c_after_sleep("old-aarch64-debug", "mt")
    _check_chain(got, gdb)
    assert "SIGTRAP" not in gdb, gdb[-3000:]
    assert "exited normally" in gdb, gdb[-3000:] + proxy[-2000:]
    assert "tokio_app done mode=mt total=84" in printed, printed[-2000:]


def test_mode_off_multi_threaded_runs_to_its_end() -> None:
    """The multi-threaded runtime in mode off (as integration/test_qemu_corpus.py runs the
    x86-64 one): the stopped thread's chain is found on its stack, the program runs to its
    end. QEMU stops only the thread that trapped: what the others show varies by run."""
    got, gdb, printed, proxy = _at_c_after_sleep("old-aarch64-debug", "mt", extra=("--mode", "off"))
    chain = [m[1] for m in re.finditer(r"╼ (tokio_app::\w+) at", got["tree"])]
    assert chain[:4] == ["tokio_app::run", "tokio_app::a", "tokio_app::b", "tokio_app::c"], got["tree"]
    assert "exited normally" in gdb, gdb[-3000:] + proxy[-2000:]
    assert "tokio_app done mode=mt total=84" in printed, printed[-2000:]


def test_gdb_mi_through_qemu_aarch64() -> None:
    """gdb-multiarch's MI (what IDEs drive): the breakpoint's `*stopped` at the marker, the
    tree and bt through ``monitor`` at the marked lines, the program run to its end. Task
    threads (asked for) say they are x86-64's only; gdb sees the program's own threads."""
    prog = corpus_binary("old-aarch64-debug", "tokio_app")
    file, stop = markers.breakpoint_markers("tokio_app")["c_after_sleep"]
    with start_stub("qemu-aarch64", prog, ["ct"]) as st, start_proxy(st.address, extra=["--elf", str(prog), "--task-threads"]) as px, \
            MiSession(prog, gdb="gdb-multiarch", timeout=60) as mi:
        mi.cmd("-gdb-set mi-async off")  # QEMU's gdbstub ignores interrupts: nothing to interrupt
        assert mi.cmd(f"-target-select remote {px.address}")[-1].cls == "connected"
        mi.cmd(f"-break-insert {file.name}:{stop}")
        mi.cmd("-exec-continue")
        stopped = mi.wait_stopped(timeout=60)
        assert stopped.results.get("reason") == "breakpoint-hit", stopped.raw
        frame = stopped.results["frame"]
        assert isinstance(frame, dict) and frame.get("line") == str(stop), stopped.raw
        tree = mi.console("monitor async tree")
        bt = mi.console("monitor async bt")
        threads = mi.console("monitor async threads on")
        listed = mi.cmd("-thread-info")[-1].results.get("threads")
        mi.cmd("-break-delete")
        mi.cmd("-exec-continue")
        ended = mi.wait_stopped(timeout=60)
    # (MI's C strings carry the tree's glyphs as octal escapes: the names and lines alone)
    chain = [(m[1], int(m[2])) for m in re.finditer(r"(tokio_app::\w+) at \S+:(\d+)", tree)]
    want = [("tokio_app::run", _await_line("run", "a")), ("tokio_app::a", _await_line("a", "b")),
            ("tokio_app::b", _await_line("b", "c")), ("tokio_app::c", stop)]
    assert chain == want, tree
    assert [(m[1], int(m[2])) for m in re.finditer(r"^#\d+\s+(\S+) .*?at \S+:(\d+)$", bt, re.M)] == want[::-1], bt
    assert "task threads: x86-64 only so far; this program is aarch64 (EM_AARCH64)" in threads, threads
    assert isinstance(listed, list) and len(listed) == 1, listed  # the program's one thread (ct), no task
    assert ended.results.get("reason") == "exited-normally", ended.raw
    assert "tokio_app done mode=ct total=84" in st.output_text(), st.output_text()[-2000:]


def _stuck_tasks(stub: str, config: str, rt: str, extra: list[str], **kw: object) -> tuple[dict[str, str], str]:
    """`tasks` and `tree` of the corpus' stuck in mode off at its ready line, where every task
    the source spawns is parked in the runtime; the program is killed (it never ends)."""
    file, line = markers.breakpoint_markers("stuck")["stuck_ready"]
    run = run_session(stub, corpus_binary(config, "stuck"), [rt],
                      [f"break {file.name}:{line}", "continue", *ask("tasks", "tree"), "kill"],
                      ["--mode", "off", *extra], timeout=120, **kw)  # type: ignore[arg-type]
    assert re.search(rf"Breakpoint 1, .* at src/bin/stuck\.rs:{line}\b", run.gdb), run.gdb[-3000:] + run.proxy
    return sections(run.gdb), run.proxy


@pytest.mark.parametrize("rt", ["ct", "mt"])
def test_parked_tasks_of_an_aarch64_program(rt: str) -> None:
    """The tasks parked in the runtime (a lock, a timer, channels) are found by the runtime
    adapters in qemu-aarch64's own map of the program (proxy/host/emulator.py): every task
    stuck.rs hands to tokio::spawn; with the current-thread runtime `tasks` and `tree` equal
    the x86-64 build's (same rustc) under gdbserver with the adapters on."""
    text = "".join(p.read_text() for p in markers.program_sources("stuck"))
    spawned = {f"stuck::{n}" for n in re.findall(r"tokio::spawn\((\w+)\(", text)}
    assert len(spawned) == 5, spawned
    got, proxy = _stuck_tasks("qemu-aarch64", "old-aarch64-debug", rt, [], gdb="gdb-multiarch", setup=GDB_SETUP)
    _assert_emulator_map(proxy)
    found = {m[1] for m in re.finditer(r"^#\d+\s.*\stokio runtime\s+(\S+)$", got["tasks"], re.M)}
    assert found == spawned, got["tasks"]
    if rt == "ct":
        want, _ = _stuck_tasks("gdbserver", "old-debug", rt, ["--remote"])
        for q in ("tasks", "tree"):
            assert comparable(got[q]) == comparable(want[q]), f"{q}:\n--- aarch64\n{got[q]}\n--- x86-64\n{want[q]}"
