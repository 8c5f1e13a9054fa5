"""Core files end to end: the corpus' `stuck` program dumped by gdb's `gcore`
and by the kernel, read by the core reader, served by `asyncrsp serve --core`
to a real gdb, compared with a live session on the same process.

The live session and the gcore look at the same process in the same state
(every task of `stuck` is blocked for good), so addresses, threads, frames
and trees are equal; only a Sleep's time left moves (it is masked).
"""

from __future__ import annotations

import difflib
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from integration.harness.monitor import ask, corpus_binary, section
from integration.harness.stubs import free_port
from integration.harness.serve import finish as _finish, gdb_at as _gdb, serve_core, start_cli as _proxy
from integration.harness.stuck import STUCK_CONFIGS, STUCK_TASKS, gcore, start_stuck

ROOT = Path(__file__).resolve().parents[1]
GDB_COMMANDS = ["info threads", "bt", "thread 2", "bt", *ask("tasks", "tree")]


def live(pid: int, prog: Path, commands: list[str]) -> str:
    """gdbserver --attach behind the proxy (mode off, tokio adapter), then detach."""
    gport = free_port()
    gs = subprocess.Popen(["gdbserver", "--attach", f"127.0.0.1:{gport}", str(pid)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert gs.stderr is not None
    for _ in range(50):
        if "Listening" in gs.stderr.readline():
            break
    proxy, port = _proxy(["--upstream", f"127.0.0.1:{gport}", "--mode", "off", "--tokio-adapter"])
    try:
        return _gdb(port, prog, commands)
    finally:
        _finish(proxy)
        gs.wait(timeout=20)


def normalise(out: str) -> str:
    """What may differ between a live session and its core: a Sleep's time left, gdb's
    chatter about the connection, thread names (a core has none)."""
    keep = []
    for line in out.splitlines():
        if re.match(r"(warning|Remote debugging|Reading|\[Inferior|Detaching|\[New Thread|Download|"
                    r"Ignoring packet error|0x[0-9a-f]+ in )", line):
            continue
        line = re.sub(r"\((\d+\.\d|\d+) (min|h|s|ms) left\)", "(… left)", line)
        line = re.sub(r'Thread (\d+\.\d+|\d+) "[^"]*"', r"Thread \1", line)
        line = re.sub(r"Thread (?:\d+\.)?(\d+)", r"Thread \1", line)
        line = re.sub(r" {2,}", " ", line)  # table columns are as wide as the thread names
        keep.append(line)
    return "\n".join(keep)


def kernel_core_skip() -> str | None:
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith("|") or "/" in pattern:
        return f"core_pattern is {pattern!r}: the kernel does not write cores into the program's directory"
    return None


def kernel_core(p: subprocess.Popen[str], cwd: Path) -> Path:
    """SIGABRT with RLIMIT_CORE unlimited: the kernel writes the core into cwd."""
    p.send_signal(signal.SIGABRT)
    p.wait(timeout=30)
    return kernel_core_wait(cwd)


def kernel_core_wait(cwd: Path) -> Path:
    for _ in range(100):
        cores = [c for c in cwd.iterdir() if c.name.startswith("core")]
        if cores and time.time() - cores[0].stat().st_mtime > 0.2:
            return cores[0]
        time.sleep(0.1)
    raise AssertionError(f"no core in {cwd}: {list(cwd.iterdir())}")


@pytest.mark.parametrize("config", STUCK_CONFIGS)
def test_gcore_served_equals_the_live_session(config: str, tmp_path: Path) -> None:
    """gdb through `serve --core` on a gcore of `stuck` shows what a live session on
    the same process shows: threads, backtraces, tasks, trees, the deadlock."""
    prog = corpus_binary(config, "stuck")
    p = start_stuck(prog, tmp_path)
    try:
        core = gcore(p.pid, tmp_path / "g")
        got_live = live(p.pid, prog, GDB_COMMANDS)
        time.sleep(0.2)
        assert p.poll() is None, "the program died after the live session"
    finally:
        p.kill()
        p.wait()
    got_core = serve_core(core, prog, GDB_COMMANDS)
    tree = section(got_core, "tree")
    assert re.search(r"waits on Mutex 0x[0-9a-f]+, held by task \S+ stuck::lock_ba", tree), got_core
    assert re.search(r"waits on Mutex 0x[0-9a-f]+, held by task \S+ stuck::lock_ab", tree), got_core
    for name in STUCK_TASKS:
        assert f"stuck::{name}" in tree, tree
    # the difference first: a failure's whole outputs are long, and a run's log keeps only its start
    diff = "\n".join(difflib.unified_diff(normalise(got_live).splitlines(), normalise(got_core).splitlines(),
                                         "live", "core", lineterm=""))
    assert not diff, f"{diff}\n--- core:\n{got_core}\n--- live:\n{got_live}"


def test_kernel_core_is_served(tmp_path: Path) -> None:
    """A core the kernel wrote (SIGABRT, RLIMIT_CORE unlimited): it keeps no read-only file
    mappings (the program's code comes from the file NT_FILE names), gdb unwinds every
    thread, the stop names the signal, and the async tree is whole."""
    reason = kernel_core_skip()
    if reason:
        pytest.skip(reason)
    prog = corpus_binary("debug", "stuck")
    p = start_stuck(prog, tmp_path, core_limit=True)
    try:
        core = kernel_core(p, tmp_path)
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
    from proxy.corefile import open_core
    from proxy.corefile.stub import CoreStub

    image = open_core(str(core))
    assert image.fault is not None and image.fault[0] == signal.SIGABRT, image.fault
    assert CoreStub(image).answer(b"?") == b"T%02xthread:%x;" % (signal.SIGABRT, p.pid)
    out = serve_core(core, prog, ["info threads", "bt", *ask("tree")])
    assert re.search(r"in stuck::main \(\) at \S*stuck.rs:\d+", out), out
    tree = section(out, "tree")
    assert re.search(r"waits on Mutex 0x[0-9a-f]+, held by task \S+ stuck::lock_ba", tree), out
    assert "tokio::time::Sleep" in tree and "stuck::oneshot_waiter" in tree, tree


def gcore_of_stuck(prog: Path, tmp_path: Path) -> Path:
    p = start_stuck(prog, tmp_path)
    try:
        return gcore(p.pid, tmp_path / "g")
    finally:
        p.kill()
        p.wait()


@pytest.fixture(scope="module")
def stuck_core(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(program, gcore) of debug `stuck`, shared by the tests that only read it."""
    prog = corpus_binary("debug", "stuck")
    return prog, gcore_of_stuck(prog, tmp_path_factory.mktemp("stuck"))


def test_core_is_read_only(stuck_core: tuple[Path, Path]) -> None:
    """Resume, write and breakpoint get a clear error from the core stub; gdb stays stopped."""
    prog, core = stuck_core
    out = serve_core(core, prog, ["continue", "set var *(char*)$sp = 1", "break stuck::sleeper", "continue",
                                  "info threads"])
    # gdb shows the stub's E.text for a resume; for a write or a breakpoint (Z0 refused, then
    # its own memory write refused) it says it in its own words
    assert out.count("Remote failure reply: E.asyncrsp: a core file is read-only") == 1, out
    assert re.search(r"Cannot access memory at address 0x[0-9a-f]+\n", out), out
    assert "Cannot insert breakpoint 1." in out, out
    assert re.search(r"\* 1 +Thread \d+ +syscall \(\)", out), out  # still where the core left it
    ran = serve_core(core, prog, ["info threads"], ["--", str(prog)], command="run")  # `run --core`: the same
    assert re.search(r"\* 1 +Thread \d+ +syscall \(\)", ran), ran


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "not-core"])
def test_bad_core_is_one_line(damage: str, tmp_path: Path, stuck_core: tuple[Path, Path]) -> None:
    prog, core = stuck_core
    bad = tmp_path / "bad"
    if damage in ("truncate", "garbage"):
        data = core.read_bytes()
        if damage == "truncate":
            data = data[:len(data) // 3]
        else:  # the program headers overwritten
            data = data[:64] + os.urandom(4096) + data[64 + 4096:]
        bad.write_bytes(data)
    elif damage == "empty":
        bad.write_bytes(b"")
    else:
        bad.write_bytes(prog.read_bytes())
    r = subprocess.run([sys.executable, "-m", "proxy", "serve", "--core", str(bad), "--listen", "127.0.0.1:0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("asyncrsp: "), r.stderr
    assert "Traceback" not in r.stderr
    want = {"truncate": "truncated", "garbage": "corrupt", "empty": "empty", "not-core": "not a core"}[damage]
    assert want in lines[0], lines[0]


@pytest.mark.parametrize("config", ["debug", "release"])
@pytest.mark.parametrize("kind, sig", [("segv", signal.SIGSEGV), ("panic", signal.SIGABRT)])
def test_crash_core_gives_the_async_backtrace(kind: str, sig: int, config: str, tmp_path: Path) -> None:
    """A task dies inside a poll (SIGSEGV in `leaf`; a panic that aborts, as panic=abort
    does): the kernel's core gives the crashing thread's logical async backtrace
    leaf <- middle <- outer (release: inlined into one resume function), the other task's
    tree, and gdb through serve --core shows the fault where it happened."""
    reason = kernel_core_skip()
    if reason:
        pytest.skip(reason)
    from integration.corpus import markers

    prog = corpus_binary(config, "crash")

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    r = subprocess.run([str(prog), kind, "mt"], cwd=tmp_path, preexec_fn=limits, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == -sig, r
    core = kernel_core_wait(tmp_path)
    out = subprocess.run([sys.executable, "-m", "proxy", "tree", "--core", str(core)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    at = {m.parent: m.line for m in markers.await_markers("crash")}
    crash_line = markers.breakpoint_markers("crash")[kind][1]
    want = [rf"  #0 crash::leaf at \S+crash.rs:{crash_line}  \(#\d+ crash::outer\)",
            rf"  #1 crash::middle at \S+crash.rs:{at['middle']}  \(#\d+ crash::outer\)",
            rf"  #2 crash::outer at \S+crash.rs:{at['outer']}  \(#\d+ crash::outer\)"]
    lines = out.stdout.splitlines()
    i = next((k for k, line in enumerate(lines) if line.startswith("crashed: thread ")), None)
    assert i is not None, out.stdout
    name = signal.Signals(sig).name
    assert re.fullmatch(rf"crashed: thread \d+, {name}" + (" at address 0x10" if kind == "segv" else ""), lines[i])
    assert lines[i + 1].startswith("async backtrace of thread ")
    for pattern, line in zip(want, lines[i + 2:i + 5]):
        assert re.fullmatch(pattern, line), (pattern, out.stdout)
    assert re.search(r"╼ crash::bystander at \S+crash.rs:\d+\n└╼ tokio::time::Sleep \(60\.0 min left\)",
                     out.stdout), out.stdout
    gdb = serve_core(core, prog, ["bt", *ask("tree")])  # gdb unwinds through libc (abort) to the poll
    assert re.search(rf"crash.rs:{crash_line}\n", gdb), gdb
    assert "crash::bystander" in section(gdb, "tree"), gdb


@pytest.mark.skipif(shutil.which("lldb") is None, reason="lldb not installed (scripts/setup installs it)")
def test_lldb_reads_the_core(stuck_core: tuple[Path, Path]) -> None:
    """lldb over gdb-remote: threads, a backtrace into main, the monitor table (x reads, lldb's form)."""
    prog, core = stuck_core
    proxy, port = _proxy(["--core", str(core)])
    try:
        out = subprocess.run(["lldb", "-b", "-o", f"gdb-remote 127.0.0.1:{port}", "-o", "thread list", "-o", "bt",
                              "-o", "process plugin packet monitor async tasks", str(prog)],
                             capture_output=True, text=True, timeout=180).stdout
    finally:
        _finish(proxy)
    assert len(re.findall(r"^[ *] thread #\d+: tid = \d+", out, re.M)) == 3, out
    assert re.search(r"stuck`stuck::main\S* at stuck.rs:\d+", out), out
    assert re.search(r"#\d+ +0x[0-9a-f]+ +suspended +\S+stuck.rs:\d+ +- +- +tokio runtime +stuck::lock_ab", out), out
