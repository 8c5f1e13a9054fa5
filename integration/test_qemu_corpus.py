"""The Rust corpus under QEMU's user-mode gdbstub (qemu-x86_64 -g), through the proxy.

QEMU's stub is a stub as it is: it offers no no-ack mode and, after each reply, reads one
byte and resends unless it is `+` (so the proxy sends it one packet at a time,
proxy/session/pacing.py); it refuses any `m` over 2,048 bytes with E22 while advertising
PacketSize=1000 (reads cut to the limit, proxy/session/reads.py); its stop replies carry no
registers (pc and sp read from `g`). Each test stops the program at a `// bp:` marker, asks
`tree`, `bt` and `tasks`, lets it run to its end, and compares with the same session over
gdbserver (the proxy told the stub is remote, as QEMU's is, its runtime adapters off: the
same sources of tasks).
QEMU 7.2 also lets every trapping thread report a stop and read the socket on its own
(proxy/session/pacing.py), and stops only the thread that trapped: the comparisons run the
current-thread runtime; the multi-threaded one is run to its end in mode off.
Addresses and thread numbers differ by right between the stubs (integration/harness/
compare.py). scripts/qemu-corpus runs every program and marker the same way.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from integration.corpus import markers
from integration.harness.compare import comparable, run_session, sections
from integration.harness.monitor import ask, corpus_binary

pytestmark = pytest.mark.skipif(shutil.which("qemu-x86_64") is None,
                                reason="qemu-x86_64 not installed (scripts/setup installs qemu-user)")

QUESTIONS = ("tree", "bt", "tasks")


def compare_at_marker(config: str, program: str, args: list[str], marker: str,
                      extra: list[str]) -> tuple[dict[str, str], dict[str, str], str]:
    """The questions' answers at ``marker`` over QEMU and over gdbserver, and QEMU's run's
    program output (the program ran on to its end after the questions)."""
    prog = corpus_binary(config, program)
    file, line = markers.breakpoint_markers(program)[marker]
    commands = [f"break {file.name}:{line}", "continue", *ask(*QUESTIONS), "delete", "continue"]
    qemu = run_session("qemu", prog, args, commands, extra)
    # the same sources of tasks: QEMU has no vFile, so no runtime adapter scans its heap;
    # gdbserver --remote reads /proc/PID/maps through vFile (integration/test_remote_attach.py)
    gdbserver = run_session("gdbserver", prog, args, commands, [*extra, "--remote", "--adapters", "off"])
    assert "exited normally" in qemu.gdb, qemu.gdb[-3000:] + qemu.proxy[-2000:]
    got = {k: comparable(v) for k, v in sections(qemu.gdb).items()}
    want = {k: comparable(v) for k, v in sections(gdbserver.gdb).items()}
    # what cannot be done through QEMU says so: no memory map for the runtime adapters (QEMU
    # reports no pid of the program's host, and has no vFile to read it with)
    assert re.search(r"runtime adapters scan the program's memory map: .*: only the tasks on the "
                     r"threads' stacks are found", qemu.gdb), qemu.gdb[-3000:]
    return got, want, qemu.program


def _assert_same(got: dict[str, str], want: dict[str, str]) -> None:
    for q in QUESTIONS:
        assert "tokio_app::" in want[q], want[q]
        assert got[q] == want[q], f"{q}:\n--- qemu\n{got[q]}\n--- gdbserver\n{want[q]}"


@pytest.mark.parametrize("config", ["debug", "release"])
def test_capture_under_qemu_equals_gdbserver(config: str) -> None:
    """Hidden breakpoints through QEMU (one packet at a time, pc and sp read from `g`):
    the current-thread runtime, where one thread polls every coroutine."""
    got, want, printed = compare_at_marker(config, "tokio_app", ["ct"], "c_after_sleep",
                                           ["--capture", "breakpoints"])
    assert "tokio_app done mode=ct total=84" in printed, printed[-2000:]
    _assert_same(got, want)


def test_mode_off_under_qemu_equals_gdbserver() -> None:
    """Reflection only (stack discovery) through QEMU, reads cut to 1,024 bytes."""
    got, want, printed = compare_at_marker("debug", "tokio_app", ["ct"], "c_after_sleep", ["--mode", "off"])
    assert "tokio_app done mode=ct total=84" in printed, printed[-2000:]
    _assert_same(got, want)


def test_a_multi_threaded_runtime_runs_to_its_end() -> None:
    """The multi-threaded runtime through QEMU, in mode off: QEMU 7.2's user mode stops only
    the thread that trapped (the others run on while the proxy reads memory, so what a
    stop's reflection finds of them varies from run to run) and lets every thread that traps
    report and read the stub's socket on its own (proxy/session/pacing.py). The program runs
    to its end and the stopped thread's chain is found."""
    prog = corpus_binary("debug", "tokio_app")
    file, line = markers.breakpoint_markers("tokio_app")["c_after_sleep"]
    run = run_session("qemu", prog, ["mt"], [f"break {file.name}:{line}", "continue", *ask("tree"),
                                             "delete", "continue"], ["--mode", "off"])
    assert "exited normally" in run.gdb, run.gdb[-3000:] + run.proxy[-2000:]
    assert "tokio_app done mode=mt total=84" in run.program, run.program[-2000:]
    tree = sections(run.gdb)["tree"]
    chain = [m.group(1) for m in re.finditer(r"╼ (tokio_app::\w+) at", tree)]
    assert chain[:4] == ["tokio_app::run", "tokio_app::a", "tokio_app::b", "tokio_app::c"], tree
