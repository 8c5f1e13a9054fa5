"""A stop with an IDE's usual queries, with and without task threads, 10,000 tasks.

The corpus program `many_tasks K mt` parks K tokio tasks (waiter -> chain -> notified)
on one Notify. Each run attaches `gdbserver --attach` on loopback behind
`asyncrsp serve --mode off --tokio-adapter` (tasks found in tokio's heap), once with
`--task-threads` (default cap 1024: 1024 task threads and one thread grouping the rest)
and once without, and times inside gdb (Python `time.perf_counter`) what an IDE's
gdb/MI session does at a stop, from the connection on:

* `target remote` (gdb lists the threads: qXfer:threads),
* `-thread-info` (every thread's name and top frame),
* `-stack-list-frames --thread N` for every thread (IDEs fetch each thread's stack),
* `-stack-list-variables --simple-values` in the selected thread's frame 0.

The ratio is with / without, same run, medians of --runs. What the time goes to with
task threads: reading the tasks at the stop (reflection of every task, as `monitor
async tree`), then serving each task thread's registers and synthetic stack (no
stub traffic but the locals' memory).

Usage: python bench/bench_task_threads.py [--tasks 10000] [--config release] [--runs 3] [--cap 1024]
Target (issue 17): with 10,000 tasks and the default cap, <= 1.5x the stop without task threads.
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "integration" / "corpus"))

import build  # noqa: E402

GDB_SCRIPT = """
import time
def mi(cmd):
    return gdb.execute('interpreter-exec mi "%s"' % cmd, to_string=True)
t0 = time.perf_counter()
gdb.execute("target remote 127.0.0.1:PORT", to_string=True)
t1 = time.perf_counter()
info = mi("-thread-info")
t2 = time.perf_counter()
ids = [int(x) for x in __import__("re").findall(r'\\{id="(\\d+)"', info)]
frames = 0
for n in ids:
    frames += mi("-stack-list-frames --thread %d" % n).count("frame={")
t3 = time.perf_counter()
mi("-stack-list-variables --thread 1 --frame 0 --simple-values")
t4 = time.perf_counter()
print("RESULT total=%.3f connect=%.3f info=%.3f stacks=%.3f vars=%.3f threads=%d frames=%d" % (
    t4 - t0, t1 - t0, t2 - t1, t3 - t2, t4 - t3, len(ids), frames))
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_once(prog: Path, tasks: int, task_threads: bool, cap: int) -> dict[str, float]:
    p = subprocess.Popen([str(prog), str(tasks), "mt"], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
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
        extra = ["--task-threads"] if task_threads else []
        proxy = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{pport}",
                                  "--upstream", f"127.0.0.1:{gport}", "--mode", "off", "--tokio-adapter", *extra],
                                 cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        procs.append(proxy)
        assert proxy.stderr is not None and "listening" in proxy.stderr.readline()
        script = Path("/tmp") / f"bench_task_threads_{p.pid}.py"
        script.write_text(GDB_SCRIPT.replace("PORT", str(pport)))
        init = [] if cap == 1024 or not task_threads else []
        out = subprocess.run(["gdb", "-nx", "-batch", "-ex", "set pagination off", "-ex", "set remotetimeout 600",
                              *init, "-ex", f"source {script}", "-ex", "detach", str(prog)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800).stdout
        script.unlink()
        for proc in procs:
            proc.wait(timeout=60)
        m = re.search(r"RESULT (.*)", out)
        if not m:
            raise SystemExit(f"no result:\n{out[-3000:]}")
        return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
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
    ap.add_argument("--cap", type=int, default=1024)
    a = ap.parse_args()
    prog = build.binary(a.config, "many_tasks")
    with_tt, without = [], []
    for _ in range(a.runs):  # interleaved: the same load for both
        without.append(run_once(prog, a.tasks, False, a.cap))
        with_tt.append(run_once(prog, a.tasks, True, a.cap))

    def med(rs: list[dict[str, float]], k: str) -> float:
        return statistics.median(r[k] for r in rs)

    print(f"many_tasks {a.tasks} mt ({a.config}), gdbserver --attach on loopback, asyncrsp --mode off"
          f" --tokio-adapter; an IDE's stop over gdb/MI; medians of {a.runs}")
    for label, rs in (("without task threads", without), ("with --task-threads", with_tt)):
        print(f"  {label:22} total {med(rs, 'total'):7.3f} s  (connect {med(rs, 'connect'):.3f}, -thread-info"
              f" {med(rs, 'info'):.3f}, every thread's stack {med(rs, 'stacks'):.3f}, variables"
              f" {med(rs, 'vars'):.3f}; {med(rs, 'threads'):.0f} threads, {med(rs, 'frames'):.0f} frames)")
    ratio = med(with_tt, "total") / med(without, "total")
    print(f"  ratio with / without: {ratio:.2f}  (target <= 1.5: {'met' if ratio <= 1.5 else 'NOT met'})")


if __name__ == "__main__":
    main()
