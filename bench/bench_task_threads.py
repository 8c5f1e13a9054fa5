"""A stop with an IDE's usual queries, with and without task threads, 10,000 tasks.

The corpus program `many_tasks K mt` parks K tokio tasks (waiter -> chain -> notified)
on one Notify. Each run attaches `gdbserver --attach` on loopback behind
`asyncrsp serve --mode off --tokio-adapter`, once with `--task-threads` (default cap
1024: 1024 task threads and one thread grouping the rest) and once without, and
drives gdb over gdb/MI as an IDE's debug adapter does (cpptools' MIEngine, CLion).
At each stop it sends what such an IDE sends on its own:

* `-thread-info` (the threads pane: every thread's name, details and top frame),
* `-stack-list-frames` for the stopped thread (the call stack pane; VS Code asks the
  other threads' stacks only when the user expands them: microsoft/vscode#3650, #68648),
* `-stack-list-variables --simple-values` in its frame 0 (the variables pane).

Two stops are timed: the first (`-target-select remote`, which includes loading the
program's debug info for reflection, once per session) and a later one
(`-exec-continue`, then `-exec-interrupt`: from the interrupt to the last reply; gdb
lists the threads before it reports `*stopped`).
Two more figures show what a user's clicks cost with task threads: one task thread's
stack and variables, and every thread's stack (`thread apply all bt` in an IDE).

The ratio is with / without, same run, medians of --runs.

Usage: python bench/bench_task_threads.py [--tasks 10000] [--config release] [--runs 3]
Target (issue 17): with 10,000 tasks and the default cap, <= 1.5x the stop without task threads.
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "integration" / "corpus"))

import build  # noqa: E402
from integration.harness import programs  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MI:
    """gdb --interpreter=mi2 driven like an IDE's debug adapter."""

    def __init__(self, prog: Path) -> None:
        self.p = subprocess.Popen(["gdb", "-nx", "-q", "--interpreter=mi2", str(prog)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.token = 100
        self.wait_for(re.compile(r"^\(gdb\)"))

    def wait_for(self, rx: re.Pattern[str], timeout: float = 900) -> list[str]:
        assert self.p.stdout is not None
        lines: list[str] = []
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            line = self.p.stdout.readline()
            if not line:
                raise SystemExit("gdb exited:\n" + "".join(lines[-30:]))
            lines.append(line)
            if rx.search(line):
                return lines
        raise SystemExit("gdb timed out:\n" + "".join(lines[-30:]))

    def cmd(self, text: str) -> str:
        assert self.p.stdin is not None
        self.token += 1
        self.p.stdin.write(f"{self.token}{text}\n")
        got = self.wait_for(re.compile(rf"^{self.token}\^(done|error|running|connected|exit)"))
        if got[-1].startswith(f"{self.token}^error"):
            raise SystemExit(f"{text}: {got[-1]}")
        return "".join(got)

    def close(self) -> None:
        try:
            self.cmd("-target-detach")
            self.cmd("-gdb-exit")
        except SystemExit:
            pass
        self.p.wait(timeout=60)


def ide_stop(mi: MI, thread: int) -> tuple[int, int]:
    """What the IDE sends at a stop: (threads listed, frames of the stopped thread)."""
    info = mi.cmd("-thread-info")
    frames = mi.cmd(f"-stack-list-frames --thread {thread}").count("frame={")
    mi.cmd(f"-stack-list-variables --thread {thread} --frame 0 --simple-values")
    return len(re.findall(r'\{id="\d+"', info)), frames


def run_once(prog: Path, args: list[str], task_threads: bool, proxied: bool = True) -> dict[str, float]:
    # its own process group: gdbserver interrupts an attached program with kill(-pid, SIGINT)
    p = subprocess.Popen([str(prog), *args], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
                         start_new_session=True)
    procs: list[subprocess.Popen[str]] = []
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert "ready" in line, line
        gport, pport = _port(), _port()
        gs = subprocess.Popen(["gdbserver", "--attach", f"127.0.0.1:{gport}", str(p.pid)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(gs)
        assert gs.stderr is not None
        while "Listening" not in gs.stderr.readline():
            pass
        if proxied:
            extra = ["--task-threads"] if task_threads else []
            proxy = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{pport}",
                                      "--upstream", f"127.0.0.1:{gport}", "--mode", "off", "--tokio-adapter",
                                      *extra], cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
            procs.append(proxy)
            assert proxy.stderr is not None and "listening" in proxy.stderr.readline()
        else:
            pport = gport
        mi = MI(prog)
        out: dict[str, float] = {}
        mi.cmd("-gdb-set pagination off")
        mi.cmd("-gdb-set mi-async on")  # -exec-interrupt while the program runs, as IDEs do
        mi.cmd("-gdb-set remotetimeout 600")
        t0 = time.perf_counter()
        stopped = mi.cmd(f"-target-select remote 127.0.0.1:{pport}")
        m = re.search(r'thread-id="(\d+)"', stopped)
        thread = int(m.group(1)) if m else 1
        out["threads"], out["frames"] = ide_stop(mi, thread)
        out["first"] = time.perf_counter() - t0
        mi.cmd("-exec-continue")
        time.sleep(0.3)
        t1 = time.perf_counter()  # gdb reads the threads before it reports *stopped: count from the interrupt
        mi.cmd("-exec-interrupt")
        got = "".join(mi.wait_for(re.compile(r"^\*stopped")))
        m = re.search(r'thread-id="(\d+)"', got)
        thread = int(m.group(1)) if m else 1
        ide_stop(mi, thread)
        out["later"] = time.perf_counter() - t1
        if task_threads:
            info = mi.cmd("-thread-info")
            ids = [int(x) for x in re.findall(r'\{id="(\d+)",target-id="[^"]*",(?:details="[^"]*",)?name="task #', info)]
            t2 = time.perf_counter()
            out["task_frames"] = mi.cmd(f"-stack-list-frames --thread {ids[0]}").count("frame={")
            mi.cmd(f"-stack-list-variables --thread {ids[0]} --frame 0 --simple-values")
            out["one_task"] = time.perf_counter() - t2
        info = mi.cmd("-thread-info")
        t3 = time.perf_counter()
        for n in re.findall(r'\{id="(\d+)"', info):
            mi.cmd(f"-stack-list-frames --thread {n}")
        out["all_stacks"] = time.perf_counter() - t3
        mi.close()
        for proc in procs:
            proc.wait(timeout=60)
        return out
    finally:
        for proc in (*procs, p):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--config", default="release")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--floor", action="store_true",
                    help="also time the same stop with as many real threads (C program many_threads), attached"
                         " through gdbserver alone and through asyncrsp: what gdb itself pays for that many threads")
    a = ap.parse_args()
    prog = build.binary(a.config, "many_tasks")
    threads_prog = programs.build("many_threads")
    with_tt, without, floor, floor_proxy = [], [], [], []
    for _ in range(a.runs):  # interleaved: the same load for all
        without.append(run_once(prog, [str(a.tasks), "mt"], False))
        with_tt.append(run_once(prog, [str(a.tasks), "mt"], True))
        if a.floor:
            n = int(with_tt[-1]["threads"])
            floor.append(run_once(threads_prog, [str(n)], False, proxied=False))
            floor_proxy.append(run_once(threads_prog, [str(n)], False))

    def med(rs: list[dict[str, float]], k: str) -> float:
        return statistics.median(r[k] for r in rs)

    print(f"many_tasks {a.tasks} mt ({a.config}), gdbserver --attach on loopback, asyncrsp --mode off"
          f" --tokio-adapter; an IDE's stop over gdb/MI (-thread-info, the stopped thread's"
          f" -stack-list-frames and -stack-list-variables); medians of {a.runs}")
    for label, rs in (("without task threads", without), ("with --task-threads", with_tt)):
        print(f"  {label:22} later stop {med(rs, 'later'):6.3f} s, first stop (connect) {med(rs, 'first'):6.3f} s;"
              f" {med(rs, 'threads'):.0f} threads; every thread's stack {med(rs, 'all_stacks'):.3f} s")
    print(f"  with: one task thread's stack ({med(with_tt, 'task_frames'):.0f} frames) and variables"
          f" {med(with_tt, 'one_task'):.3f} s")
    for k, label in (("later", "later stop"), ("first", "first stop")):
        ratio = med(with_tt, k) / med(without, k)
        print(f"  ratio with / without, {label}: {ratio:.2f}  (target <= 1.5: {'met' if ratio <= 1.5 else 'NOT met'})")
    if floor:
        print(f"the floor: many_threads {med(floor, 'threads'):.0f} (as many real threads as the task threads"
              f" run listed), the same IDE stop")
        for label, rs in (("gdbserver alone", floor), ("through asyncrsp", floor_proxy)):
            print(f"  {label:22} later stop {med(rs, 'later'):6.3f} s, first stop (connect) {med(rs, 'first'):6.3f} s;"
                  f" {med(rs, 'threads'):.0f} threads; every thread's stack {med(rs, 'all_stacks'):.3f} s")
        for k, label in (("later", "later stop"), ("first", "first stop")):
            print(f"  task threads / real threads through gdbserver alone, {label}:"
                  f" {med(with_tt, k) / med(floor, k):.2f}; through asyncrsp: {med(with_tt, k) / med(floor_proxy, k):.2f}")


if __name__ == "__main__":
    main()
