"""The stop's snapshot at scale: `tasks --group`, `deadlocks` and `tree TASK` with 10,000 and
100,000 live tasks.

The corpus program `many_tasks K mt` parks K tokio tasks (waiter -> chain -> notified) on
one Notify. The benchmark attaches `gdbserver --attach` on loopback behind
`asyncrsp serve --mode off --tokio-adapter` (nothing planted: the tasks are found in
tokio's heap), then times inside gdb (Python `time.perf_counter` around `gdb.execute`):

* each command as the FIRST one at a stop: the snapshot of that stop is built (the heap
  scan for task headers, every task's tree, the threads' stacks, the wait-for graph), then
  rendered. Between two commands the client writes one byte of the stack back unchanged
  (what any `set var` does): the snapshot of the stop is stale and built again;
* each command again at the same stop: rendered from the stop's snapshot;
* the proxy's CPU time (user + system, /proc/PID/stat) for each first command: the
  proxy's own work, which a loaded machine does not stretch the way it stretches wall time;
* the same-run baseline: gdb itself reading the memory the adapter scans
  (`inferior.read_memory` over the program's writable anonymous mappings, through the
  same proxy and gdbserver).

The proxy's peak memory is its VmHWM (/proc/PID/status) at the end of the run.

Usage: python -m bench.bench_snapshot [--tasks 10000 100000] [--config release] [--runs 1]
Target: each command <= 2 s at the stop with 10,000 tasks, <= 10 s with 100,000.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

from integration.corpus import build
from bench.attach import attached
from proxy.reflect.tokio_adapter import heap_ranges

ROOT = Path(__file__).resolve().parents[1]

GDB_SCRIPT = """
import os, re, time
def cpu():  # the proxy's CPU seconds (user + system): its own work, whatever else loads the machine
    with open("/proc/%d/stat" % PROXY) as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
CPU = {}
def timed(cmd, key=None):
    t, c = time.perf_counter(), cpu()
    out = gdb.execute(cmd, to_string=True)
    if key:
        CPU[key] = cpu() - c
    return time.perf_counter() - t, out
def stale():  # one byte of the stack written back unchanged: the stop's snapshot is stale
    inf = gdb.selected_inferior()
    sp = int(gdb.parse_and_eval("$sp"))
    inf.write_memory(sp, bytes(inf.read_memory(sp, 1)))
res = {}
res["first"], out = timed("monitor async tasks --group")  # the session's first: analysis cache, DWARF
m = re.search(r"^(\\d+) tasks in", out, re.M)
res["tasks"] = int(m.group(1)) if m else -1
stale()
res["group"], out = timed("monitor async tasks --group", "group")
res["group_again"], _ = timed("monitor async tasks --group")
stale()
res["deadlocks"], dl = timed("monitor async deadlocks", "deadlocks")
res["deadlocks_again"], _ = timed("monitor async deadlocks")
_, one = timed("monitor async tasks --limit 1 --fn waiter")
tid = re.search(r"^(#\\d+)\\s", one, re.M).group(1)
stale()
res["tree"], tree = timed("monitor async tree " + tid, "tree")
res["tree_again"], _ = timed("monitor async tree " + tid)
inf = gdb.selected_inferior()
t = time.perf_counter()
n = 0
for lo, hi in RANGES:
    for a in range(lo, hi, 0x4000):
        n += len(inf.read_memory(a, min(0x4000, hi - a)))
res["read"] = time.perf_counter() - t
res["bytes"] = n
print("GROUP " + out.replace("\\n", "\\nGROUP "))
print("DEADLOCKS " + dl.replace("\\n", "\\nDEADLOCKS "))
print("TREE " + tree.replace("\\n", "\\nTREE "))
res.update({k + "_cpu": v for k, v in CPU.items()})
print("RESULT " + " ".join("%s=%s" % kv for kv in res.items()))
"""


def _hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return -1.0


def run_once(prog: Path, tasks: int, show: bool, profile: str | None = None) -> dict[str, float]:
    p = subprocess.Popen([str(prog), str(tasks), "mt"], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert "ready" in line, line
        ranges = heap_ranges(p.pid, limit=1 << 40)
        hwm = -1.0
        with attached(p.pid, ["--mode", "off", "--tokio-adapter"], profile) as at:
            script = Path("/tmp") / f"bench_snapshot_{p.pid}.py"
            script.write_text(f"RANGES = {ranges!r}\nPROXY = {at.proxy_pid}\n" + GDB_SCRIPT)
            gdb = subprocess.Popen(["gdb", "-nx", "-batch", "-ex", "set pagination off", "-ex", "set remotetimeout 600",
                                    "-ex", f"target remote {at.address}", "-ex", f"source {script}",
                                    "-ex", "detach", str(prog)],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            while gdb.poll() is None:  # the proxy's peak, sampled until gdb detaches (its VmHWM is kept)
                try:
                    hwm = max(hwm, _hwm_mb(at.proxy_pid))
                except OSError:
                    break
                time.sleep(0.2)
            out = gdb.communicate(timeout=600)[0]
            script.unlink()
        m = re.search(r"RESULT (.*)", out)
        if not m:
            raise SystemExit(f"no result:\n{out[-3000:]}")
        if show:
            for tag in ("GROUP", "DEADLOCKS", "TREE"):
                print("\n".join(line[len(tag) + 1:] for line in out.splitlines() if line.startswith(tag + " "))[:1500])
        got = {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
        got["hwm_mb"] = hwm
        return got
    finally:
        p.kill()
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--config", default="release")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--show", action="store_true", help="print the commands' output too")
    ap.add_argument("--profile", metavar="PREFIX", help="run the proxy under cProfile, writing PREFIX.<pid> per run")
    a = ap.parse_args()
    prog = build.binary(a.config, "many_tasks")
    for k in a.tasks:
        results = [run_once(prog, k, a.show, a.profile) for _ in range(a.runs)]
        med = {key: statistics.median(r[key] for r in results) for key in results[0]}
        limit = 2.0 if k <= 10_000 else 10.0
        print(f"many_tasks {k} mt ({a.config}), gdbserver --attach on loopback, asyncrsp --mode off --tokio-adapter;"
              f" medians of {a.runs}; {med['tasks']:.0f} tasks found")
        for cmd, key in (("tasks --group", "group"), ("deadlocks", "deadlocks"), ("tree TASK", "tree")):
            verdict = "met" if med[key] <= limit else "NOT met"
            print(f"  {cmd:<14} first at a stop {med[key]:7.2f} s (proxy CPU {med[key + '_cpu']:5.2f} s)"
                  f"   again at the stop {med[key + '_again']:6.3f} s   (target <= {limit:.0f} s: {verdict})")
        print(f"  the session's first command (analysis and DWARF caches loaded): {med['first']:.2f} s")
        print(f"  baseline, gdb read_memory of the scanned memory: {med['read']:.2f} s ({med['bytes'] / 1e6:.1f} MB);"
              f" ratio snapshot build / that read: {med['group'] / med['read']:.2f}")
        print(f"  proxy peak memory (VmHWM): {med['hwm_mb']:.0f} MB; machine load average at the end:"
              f" {os.getloadavg()[0]:.1f} (wall times stretch with it; the proxy CPU times do not)")


if __name__ == "__main__":
    main()
