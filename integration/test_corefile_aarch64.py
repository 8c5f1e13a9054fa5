"""Cores of AArch64 programs: the corpus' `stuck` and `crash` built for aarch64 (Debian's
rustc 1.63), run under qemu-aarch64 7.2 (user mode) and killed by a signal, so that
QEMU writes the guest's core (``qemu_PROG_DATE_PID.core`` in the cwd) as the kernel
writes an x86-64 program's (integration/test_corefile.py).

Outside truth: the x86-64 build of the same source by the same rustc (``old-debug``,
``old-release``), dumped at the same point, gives the same `ps` rows and trees
(addresses, thread ids and a Sleep's time left masked); the source's ``// await:``
markers give each task's line; gdb-multiarch reading the core by itself gives the pc
and sp the core reader gives.

What qemu-aarch64 7.2 writes, found here (and by proxy/corefile/elfcore.py's docstring):
* ``NT_PRSTATUS`` per guest thread (QEMU's own RCU thread is not one), ``NT_PRPSINFO``
  and ``NT_AUXV``; no ``NT_FPREGSET`` (pr_fpvalid 0: gdb shows v0-v31, fpsr and fpcr
  as unavailable), no ``NT_SIGINFO`` (the fatal signal is the first thread's
  pr_cursig and a SIGSEGV's address is unknown), no ``NT_FILE``: the executable
  mappings of files have no bytes in the core (``p_filesz`` 0) and nothing says which
  file they map (proxy/corefile/linkmap.py finds them through the dynamic linker's
  list, as gdb does);
* with RLIMIT_CORE unlimited QEMU also re-raises the signal on itself, and the kernel
  writes QEMU's own core (x86-64, ``core`` with this machine's core_pattern) beside the
  guest's.
"""

from __future__ import annotations

import re
import resource
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

from integration.corpus import markers
from integration.harness.monitor import ask, corpus_binary, section
from integration.harness.serve import asyncrsp, serve_core
from integration.harness.stuck import STUCK_TASKS, gcore, settle, start_stuck

pytestmark = [
    pytest.mark.skipif(shutil.which("qemu-aarch64") is None,
                       reason="qemu-aarch64 not installed (scripts/setup installs qemu-user)"),
    pytest.mark.skipif(shutil.which("gdb-multiarch") is None,
                       reason="gdb-multiarch not installed (bash scripts/arm64-toolchain)"),
]

GDB_SETUP = ("set sysroot /",)  # QEMU ran the program with no -L: the host's arm64 multiarch libraries
CONFIGS = ["old-aarch64-debug", "old-aarch64-release"]
NT_PRSTATUS, NT_FPREGSET, NT_PRPSINFO, NT_AUXV, NT_SIGINFO, NT_FILE = 1, 2, 3, 6, 0x53494749, 0x46494C45


def _unlimited_cores() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def guest_core(cwd: Path, prog: Path) -> Path:
    """The core QEMU wrote for the guest, once it is whole."""
    for _ in range(300):
        cores = list(cwd.glob(f"qemu_{prog.name}_*.core"))
        if cores and time.time() - cores[0].stat().st_mtime > 0.2:
            return cores[0]
        time.sleep(0.1)
    raise AssertionError(f"qemu-aarch64 wrote no core in {cwd}: {sorted(p.name for p in cwd.iterdir())}")


def note_types(core: Path) -> list[int]:
    """The types of the core's notes, in order (read here, not by the reader under test)."""
    from proxy.analysis.elf import iter_notes

    data = core.read_bytes()
    (phoff,), (phnum,) = struct.unpack_from("<Q", data, 32), struct.unpack_from("<H", data, 56)
    out = []
    for i in range(phnum):
        p_type, _flags, off, _vaddr, _paddr, size = struct.unpack_from("<IIQQQQ", data, phoff + 56 * i)
        if p_type == 4:  # PT_NOTE
            out += [t for _, t, _ in iter_notes(data[off:off + size])]
    return out


def stuck_under_qemu(prog: Path, cwd: Path) -> tuple[Path, int]:
    """`stuck mt` under qemu-aarch64, settled, then SIGABRT: (the guest's core, pid)."""
    p = subprocess.Popen(["qemu-aarch64", str(prog), "mt"], cwd=cwd, stdout=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True, preexec_fn=_unlimited_cores)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert "stuck ready" in line, line
        settle(p.pid)
        p.send_signal(signal.SIGABRT)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == -signal.SIGABRT, p.returncode
    return guest_core(cwd, prog), p.pid


def masked(text: str) -> list[str]:
    """Lines with what differs between two builds and two runs masked: addresses, thread
    ids, a Sleep's time left, column padding."""
    out = []
    for line in text.splitlines():
        line = re.sub(r"0x[0-9a-f]+", "0x…", line)
        line = re.sub(r"\bthread \d+", "thread N", line)
        line = re.sub(r"\((expired )?(\d+\.\d|\d+) (min|h|s|ms) (left|ago)\)", "(…)", line)
        out.append(re.sub(r" {2,}", "  ", line))
    return out


def program_tasks(lines: list[str]) -> list[str]:
    """`tree` lines without the blocks of the runtime's own blocking-pool tasks (tokio's
    multi-thread workers are launched as `BlockingTask`s): how many of them exist at a crash,
    and whether each is running or still queued, is the scheduler's timing, not the program's
    (once in a CI run the x86-64 core had a third, queued). Task numbers masked with them."""
    out, skipping = [], False
    for line in lines:
        if line.startswith("task #") or not line.startswith(("╼", "└╼", " ")):
            skipping = line.startswith("task #") and "tokio::runtime::blocking::task::BlockingTask<" in line
        if not skipping:
            out.append(re.sub(r"#\d+", "#N", line))
    return out


def numbered(rows: list[str]) -> list[str]:
    return sorted(re.sub(r"#\d+", "#N", row) for row in rows)


def last_await(program: str, parent: str) -> int:
    return max(m.line for m in markers.await_markers(program) if m.parent == parent)


@pytest.fixture(scope="module")
def x86_stuck_rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """The x86-64 build's `ps --core` rows (gcore of the same program in the same state), per build kind."""
    out = {}
    for kind in ("debug", "release"):
        prog = corpus_binary(f"old-{kind}", "stuck")
        cwd = tmp_path_factory.mktemp(f"x86-{kind}")
        p = start_stuck(prog, cwd)
        try:
            core = gcore(p.pid, cwd / "g")
        finally:
            p.kill()
            p.wait()
        r = asyncrsp("ps", "--core", str(core))
        assert r.returncode == 0, r.stderr
        out[kind] = masked("\n".join(r.stdout.splitlines()[1:]))
    return out


@pytest.mark.parametrize("config", CONFIGS)
def test_ps_of_a_qemu_aarch64_core_names_every_task(config: str, tmp_path: Path,
                                                     x86_stuck_rows: dict[str, list[str]]) -> None:
    """`asyncrsp ps --core` of the core qemu-aarch64 wrote for `stuck` (no --elf: the
    program's path is AT_EXECFN's): every task at its last `.await`, the deadlock cycle,
    the rows of the x86-64 build's core; gdb-multiarch reads the same pc and sp."""
    prog = corpus_binary(config, "stuck")
    core, pid = stuck_under_qemu(prog, tmp_path)
    types = note_types(core)
    assert types.count(NT_PRSTATUS) == 3, types  # main and the 2 runtime workers: the x86-64 core's 3
    assert {NT_PRPSINFO, NT_AUXV} <= set(types) and not {NT_FPREGSET, NT_SIGINFO, NT_FILE} & set(types), types
    host = tmp_path / "core"  # QEMU's own core (the kernel's, when core_pattern writes into the cwd)
    if host.exists():
        assert host.read_bytes()[18:20] == (62).to_bytes(2, "little")  # x86-64: QEMU's, not the guest's

    r = asyncrsp("ps", "--core", str(core))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"core file {core} (pid {pid}): 8 tasks", lines[0]
    for name in STUCK_TASKS:
        line = last_await("stuck", name)
        assert re.search(rf"^#\d+ +0x[0-9a-f]+ +suspended +\S+stuck\.rs:{line} .* stuck::{name}$", r.stdout,
                         re.M), r.stdout
    assert re.search(r"^cycle: #\d+ stuck::lock_(ab|ba) -> Mutex 0x[0-9a-f]+ held by #\d+ stuck::lock_(ab|ba) ",
                     r.stdout, re.M), r.stdout
    # the crash footer is the signal QEMU was sent (the x86-64 gcore has none: SIGSTOP)
    rows = masked("\n".join(lines[1:]))
    crash = next(i for i, line in enumerate(rows) if line.startswith("crashed: "))
    assert rows[crash] == "crashed: thread N, SIGABRT", rows[crash:]
    # the same rows (task ids masked, in any order: the order of the tasks found in the heap
    # is the allocator's, which differs between the two release builds)
    assert numbered(rows[:crash]) == numbered(x86_stuck_rows[config.removeprefix("old-aarch64-")]), "\n".join(rows)

    from proxy.corefile import open_core

    image = open_core(str(core))
    gdb = subprocess.run(["gdb-multiarch", "-nx", "-batch", *[a for c in GDB_SETUP for a in ("-ex", c)],
                          "-ex", "thread apply all info registers pc sp", str(prog), str(core)],
                         capture_output=True, text=True, timeout=180).stdout
    seen = {int(m[1]): (int(m[2], 16), int(m[3], 16)) for m in re.finditer(
        r"^Thread \d+ \(LWP (\d+)\):\npc +(0x[0-9a-f]+) .*\nsp +(0x[0-9a-f]+)", gdb, re.M)}
    assert seen == {t.tid: (t.pc, t.sp) for t in image.threads}, gdb


def test_gdb_multiarch_through_serve_core(tmp_path: Path) -> None:
    """gdb-multiarch through `serve --core` on the qemu-aarch64 core: the threads, a
    backtrace from libc's syscall into the program (code and libraries found without
    NT_FILE), the registers the core has (and unavailable FP ones), the tasks and the
    trees `tree --core` gives."""
    prog = corpus_binary("old-aarch64-debug", "stuck")
    core, pid = stuck_under_qemu(prog, tmp_path)
    out = serve_core(core, prog, ["info threads", "bt", "info registers pc sp fpsr", "info sharedlibrary",
                                  *ask("tasks", "tree")], gdb_path="gdb-multiarch", setup=GDB_SETUP)
    threads = re.findall(r"^[ *] +\d+ +Thread (\d+) +0x[0-9a-f]+ in syscall \(\) from \S+libc\.so\.6$", out, re.M)
    assert len(threads) == 3 and int(threads[0]) == pid, out
    assert re.search(r" in stuck::main \(\) at \S*stuck\.rs:\d+$", out, re.M), out
    assert re.search(r"^fpsr +<unavailable>", out, re.M), out  # no NT_FPREGSET in QEMU's core
    assert re.search(r"Yes .*/libc\.so\.6$", out, re.M), out
    tasks = section(out, "tasks")
    for name in STUCK_TASKS:
        assert re.search(rf"stuck\.rs:{last_await('stuck', name)} .* stuck::{name}$", tasks, re.M), tasks
    tree = asyncrsp("tree", "--core", str(core)).stdout
    served = [line for line in masked(section(out, "tree")) if not line.startswith("note: ")]
    want = masked(tree)[1:len(served) + 1]
    assert served == want, "\n".join(served) + "\n--- tree --core:\n" + tree


def x86_crash(config: str, kind: str, cwd: Path) -> list[str] | None:
    """`tree --core` of the x86-64 build's kernel core of the same crash (None: the kernel
    does not write cores into the cwd here)."""
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith("|") or "/" in pattern:
        return None
    prog = corpus_binary(config.replace("aarch64-", ""), "crash")
    subprocess.run([str(prog), kind, "mt"], cwd=cwd, preexec_fn=_unlimited_cores, capture_output=True, timeout=60)
    for _ in range(100):
        cores = [c for c in cwd.iterdir() if c.name.startswith("core")]
        if cores and time.time() - cores[0].stat().st_mtime > 0.2:
            r = asyncrsp("tree", "--core", str(cores[0]))
            assert r.returncode == 0, r.stderr
            return masked(r.stdout)
        time.sleep(0.1)
    raise AssertionError(f"no core in {cwd}")


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("kind, sig", [("segv", signal.SIGSEGV), ("panic", signal.SIGABRT)])
def test_crash_core_gives_the_async_backtrace(kind: str, sig: int, config: str, tmp_path: Path) -> None:
    """A task dies inside a poll under qemu-aarch64: `tree --core` names the thread that took
    the signal (no address: no NT_SIGINFO) with its logical async backtrace leaf <- middle
    <- outer, the other task's tree, as the x86-64 build's kernel core does; gdb-multiarch
    through serve --core unwinds the faulting thread (from libc's abort for a panic) to the
    marked line."""
    prog = corpus_binary(config, "crash")
    (tmp_path / "a64").mkdir()
    r = subprocess.run(["qemu-aarch64", str(prog), kind, "mt"], cwd=tmp_path / "a64", preexec_fn=_unlimited_cores,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -sig, r
    core = guest_core(tmp_path / "a64", prog)
    out = asyncrsp("tree", "--core", str(core))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    i = next((k for k, line in enumerate(lines) if line.startswith("crashed: thread ")), None)
    assert i is not None, out.stdout
    assert re.fullmatch(rf"crashed: thread \d+, {signal.Signals(sig).name}", lines[i]), lines[i]
    assert lines[i + 1] == f"async backtrace of thread {lines[i].split()[2].rstrip(',')}:", out.stdout
    frames = [re.fullmatch(r"  #\d+ (crash::\w+) at \S+:\d+  \(#\d+ crash::outer\)", line) for line in lines[i + 2:]]
    assert [m[1] if m else line for m, line in zip(frames, lines[i + 2:])] == \
        ["crash::leaf", "crash::middle", "crash::outer"], out.stdout
    assert re.search(r"╼ crash::bystander at \S+crash.rs:\d+\n└╼ tokio::time::Sleep \(60\.0 min left\)",
                     out.stdout), out.stdout
    (tmp_path / "x86").mkdir()
    want = x86_crash(config, kind, tmp_path / "x86")
    if want is not None:  # the same, but for the address the kernel's NT_SIGINFO gives
        want = [re.sub(r"(crashed: thread N, SIGSEGV) at address 0x…$", r"\1", line) for line in want]
        assert program_tasks(masked(out.stdout)[1:]) == program_tasks(want[1:]), out.stdout + "\n--- x86-64:\n" + "\n".join(want)
    # QEMU, as the kernel, writes the thread that took the signal first: the stop is its
    crash_line = markers.breakpoint_markers("crash")[kind][1]
    gdb = serve_core(core, prog, ["bt", *ask("tree", "bt")], gdb_path="gdb-multiarch", setup=GDB_SETUP)
    assert re.search(rf"crash\.rs:{crash_line}\n", gdb), gdb
    assert "crash::bystander" in section(gdb, "tree"), gdb
    # monitor async bt of the stopped thread: each coroutine at its `.await` (debug: leaf's
    # state is still its sleep's, a coroutine's state changes only when its poll returns;
    # release: leaf is inlined into outer's resume and its line is the line table's at the
    # frame's pc, the line `tree --core` gives it, the x86-64 build's above)
    at = {m.parent: m.line for m in markers.await_markers("crash")}
    if config.endswith("release"):
        at["leaf"] = int(re.search(r"╼ crash::leaf at \S+crash\.rs:(\d+) \(running on thread", out.stdout)[1])
    bt = [(m[1], int(m[2])) for m in re.finditer(r"^#\d+ +(crash::\w+) .*at \S+crash\.rs:(\d+)$", section(gdb, "bt"),
                                                 re.M)]
    assert bt == [("crash::leaf", at["leaf"]), ("crash::middle", at["middle"]), ("crash::outer", at["outer"])], gdb
