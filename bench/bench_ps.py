"""How long `asyncrsp ps PID` stops a program with 1,000 tasks.

The corpus program `many_tasks K mt` parks K tokio tasks on one Notify and
waits for `go` on stdin. The benchmark runs the `ps` pipeline in-process
(proxy.ps.main.snapshot_live: analysis before the stop, then ptrace seize +
interrupt of every thread, registers, a copy of the memory the analysis
reads, detach; the trees are walked in the copy afterwards) and reports:

* the stopped time (first interrupt to last detach), median and worst of N runs,
  with the bytes copied;
* the whole command's wall time (analysis cached by build-id, walk of every tree);
* the same-run baseline: gdb's `gcore` on the same process (attach, dump,
  detach: how long the standard tool stops it to look at it), its wall time.

At the end the program gets `go` and must print its normal result line.

Usage: python -m bench.bench_ps [--tasks 1000] [--config debug|release] [--runs 5]
Target: stopped <= 1 s with 1,000 tasks.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from integration.corpus import build
from proxy.ps.main import snapshot_live

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--config", default="debug")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    prog = build.binary(args.config, "many_tasks")
    p = subprocess.Popen([str(prog), str(args.tasks), "mt"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None and p.stdin is not None
    ready = p.stdout.readline()
    assert ready.startswith(f"ready tasks={args.tasks}"), ready
    stops, walls, copied, found = [], [], 0, 0
    for _ in range(args.runs):
        t = time.perf_counter()
        snap = snapshot_live(p.pid)
        walls.append(time.perf_counter() - t)
        stops.append((snap.stopped_ns or 0) / 1e6)
        copied = snap.copied or 0
        found = sum(1 for task in snap.snapshot.tasks if task.name == "many_tasks::waiter")
    gcores = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(min(args.runs, 3)):
            t = time.perf_counter()
            subprocess.run(["gcore", "-o", f"{tmp}/g{i}", str(p.pid)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=True)
            gcores.append((time.perf_counter() - t) * 1e3)
    p.stdin.write("go\n")
    p.stdin.close()
    result = p.stdout.readline().strip()
    p.wait(timeout=60)
    med = statistics.median(stops)
    print(f"many_tasks {args.tasks} mt ({args.config}), {args.runs} runs of `asyncrsp ps`:")
    print(f"  tasks found: {found} waiters")
    print(f"  stopped: median {med:.1f} ms, worst {max(stops):.1f} ms ({copied / 1e6:.1f} MB copied)")
    print(f"  whole command (analysis cached, every tree walked): median {statistics.median(walls):.2f} s")
    print(f"  baseline gcore (attach, dump, detach) wall: median {statistics.median(gcores):.0f} ms"
          f" -> ps stops the program {statistics.median(gcores) / med:.0f}x shorter")
    print(f"  program afterwards: {result}")
    return 0 if result == f"many_tasks done tasks={args.tasks} sum={args.tasks * args.tasks}" else 1


if __name__ == "__main__":
    sys.exit(main())
