"""The corpus' `stuck` program (tasks deadlocked on each other, every thread parked):
started and settled, and dumped by gdb's `gcore` (test_corefile.py, test_ps.py)."""

from __future__ import annotations

import resource
import subprocess
import time
from pathlib import Path

# tokio 1.24 (the corpus), 1.43 (trixie) and 1.53 (sid): the same `stuck` source; the modern
# configs skip when their crates were not fetched (scripts/fetch-crates)
STUCK_CONFIGS = ["debug", "release", "trixie-debug", "trixie-release", "sid-debug", "sid-release"]

# stuck's tasks, `run` (block_on's future, found by a stack scan in release builds)
# among them. Fact: about 1 dump in 6 of sid-release held 3 to 6 places in block_on's
# frame that looked like a suspended `run` (`3 candidates ... none taken`); the scan's
# hits are narrowed by their saved locals (proxy/reflect/validity.py), which leaves the
# live one (sid-release: 12 of 12 attaches; before the narrowing 10 of 12).
STUCK_TASKS = ("lock_ab", "lock_ba", "sleeper", "receiver", "oneshot_waiter", "run")


def start_stuck(prog: Path, cwd: Path, core_limit: bool = False) -> subprocess.Popen[str]:
    def limits() -> None:
        if core_limit:
            resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    p = subprocess.Popen([str(prog), "mt"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                         cwd=cwd, preexec_fn=limits)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert "stuck ready" in line, line
    settle(p.pid)
    return p


def settle(pid: int, timeout: float = 20.0) -> None:
    """Wait until every thread of pid sits in the same system call in two looks 0.2 s
    apart. `stuck ready` is printed by the program's last task; under load a runtime
    worker can still be on its way to park then, and a core taken at that moment
    differs from the live session a moment later."""
    def look() -> dict[str, str]:
        got = {}
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                got[task.name] = (task / "syscall").read_text().split(" ")[0]
            except OSError:
                got[task.name] = "gone"
        return got
    deadline = time.monotonic() + timeout
    last = look()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = look()
        if now == last and all(v not in ("running", "-1", "gone") for v in now.values()):
            return
        last = now
    raise AssertionError(f"stuck did not settle in {timeout} s: {last}")


def gcore(pid: int, out: Path) -> Path:
    subprocess.run(["gcore", "-o", str(out), str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=120, check=True)
    # gcore's detach leaves a thread whose futex wait was cut by the attach at its `syscall`
    # instruction, runnable, to restart the call; on a busy machine the next attach can find
    # it there (syscall.S:37 instead of :38, once in a CI run), so wait until it is back in
    settle(pid)
    return Path(f"{out}.{pid}")
