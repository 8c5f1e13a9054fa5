"""`monitor async tree` on a program with 1,000 live tasks, read by reflection.

The corpus program `many_tasks K mt` parks K tokio tasks (waiter -> chain ->
notified) on one Notify. The benchmark attaches `gdbserver --attach` on
loopback behind `asyncrsp serve --mode off --tokio-adapter` (nothing planted,
no poll ever observed), then times inside gdb (Python `time.perf_counter`
around `gdb.execute`):

* `monitor async tree` (the heap scan for task headers + every task's tree),
* the same-run baseline: gdb itself reading the program's writable anonymous
  memory (the bytes the adapter scans, from /proc/PID/maps) through the same
  proxy and gdbserver with `inferior.read_memory`, and `info threads`.

The first `tree` of a session reads the DWARF behind the threads' frames unless the
frame facts of this binary are on disk (proxy/reflect/framecache.py, by build-id, like
the inventory): `--frames cold` deletes that file before every run (each run pays the
DWARF reading), `warm` (default) keeps it (the first run writes it if missing).

Usage: python -m bench.bench_reflect [--tasks 1000] [--config release] [--runs 3] [--frames cold|warm]
Target: tree under 2 s for 1,000 tasks.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
from pathlib import Path

from integration.corpus import build
from bench.attach import attached
from proxy.analysis.elf import open_elf
from proxy.reflect import framecache
from proxy.reflect.tokio_adapter import heap_ranges

ROOT = Path(__file__).resolve().parents[1]

GDB_SCRIPT = """
import time
def timed(cmd):
    t = time.perf_counter()
    out = gdb.execute(cmd, to_string=True)
    return time.perf_counter() - t, out
tree_t, tree = timed("monitor async tree")
tree2_t, _ = timed("monitor async tree")
inf = gdb.selected_inferior()
t = time.perf_counter()
n = 0
for lo, hi in RANGES:
    for a in range(lo, hi, 0x4000):
        n += len(inf.read_memory(a, min(0x4000, hi - a)))
read_t = time.perf_counter() - t
thr_t, _ = timed("info threads")
print("RESULT tree=%.3f tree_again=%.3f read=%.3f bytes=%d threads=%.3f tasks=%d" % (
    tree_t, tree2_t, read_t, n, thr_t, tree.count("stuck") + tree.count("many_tasks::waiter at")))
"""


def run_once(prog: Path, tasks: int, profile: str | None = None) -> dict[str, float]:
    p = subprocess.Popen([str(prog), str(tasks), "mt"], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert "ready" in line, line
        ranges = heap_ranges(p.pid)
        with attached(p.pid, ["--mode", "off", "--tokio-adapter"], profile) as at:
            script = Path("/tmp") / f"bench_reflect_{p.pid}.py"
            script.write_text(f"RANGES = {ranges!r}\n" + GDB_SCRIPT)
            out = subprocess.run(["gdb", "-nx", "-batch", "-ex", "set pagination off",
                                  "-ex", f"target remote {at.address}", "-ex", f"source {script}",
                                  "-ex", "detach", str(prog)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600).stdout
            script.unlink()
        m = re.search(r"RESULT (.*)", out)
        if not m:
            raise SystemExit(f"no result:\n{out[-3000:]}")
        return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
    finally:
        p.kill()
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--config", default="release")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--frames", choices=("cold", "warm"), default="warm",
                    help="cold: delete the binary's frame-facts cache before every run")
    ap.add_argument("--profile", metavar="PREFIX", help="run the proxy under cProfile, writing PREFIX.<pid> per run")
    a = ap.parse_args()
    prog = build.binary(a.config, "many_tasks")
    build_id = open_elf(prog).build_id
    facts = framecache.path(build_id) if build_id else None
    results = []
    for _ in range(a.runs):
        if a.frames == "cold" and facts is not None:
            facts.unlink(missing_ok=True)
        results.append(run_once(prog, a.tasks, a.profile))
    med = {k: statistics.median(r[k] for r in results) for k in results[0]}
    print(f"many_tasks {a.tasks} mt ({a.config}), gdbserver --attach on loopback, asyncrsp --mode off"
          f" --tokio-adapter; frame facts {a.frames}; medians of {a.runs}")
    print(f"  monitor async tree:         {med['tree']:.3f} s  (second call {med['tree_again']:.3f} s;"
          f" {med['tasks']:.0f} waiter trees)")
    print(f"  baseline, gdb read_memory:  {med['read']:.3f} s  ({med['bytes'] / 1e6:.1f} MB: the memory the"
          f" adapter scans)")
    print(f"  baseline, info threads:     {med['threads']:.3f} s")
    print(f"  ratio tree / gdb reading the same memory: {med['tree'] / med['read']:.2f}")
    print(f"  target: tree < 2 s -> {'met' if med['tree'] < 2 else 'NOT met'}")


if __name__ == "__main__":
    main()
