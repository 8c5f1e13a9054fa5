"""What spawn and wake capture cost a spawn-heavy program, against the same capture without them.

The corpus program ``many_tasks K ct`` spawns K tasks that each wait on one
``Notify``, then wakes them all and joins them: K spawns, K wakes, ~3K polls.
Each round runs it under uprobe capture in full mode twice, in turns: with the
spawn and wake probes (``--wakes``) and without them (the default),
and prints the program's wall time, the spawns the kernel recorded, and the
difference per spawn (a spawn's probe, its 8 KiB stack copy and its wake-side
probes: clone, wake, drop, the task's poll function). Printed, never asserted.

    .venv/bin/python -m bench.bench_spawn --tasks 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from integration.corpus import build

from proxy.analysis.inventory import build_inventory
from proxy.capture.uprobes.capture import UprobeCapture
from proxy.graph.catalog import Catalog
from proxy.graph.engine import Engine

ROOT = Path(__file__).resolve().parents[1]


def run_once(prog: Path, tasks: int, spawns: bool, wakes: bool = True) -> tuple[float, int]:
    """(the program's wall time from its start to its exit, spawns recorded)."""
    inv = build_inventory(str(prog))
    bias = 0x555555554000 if inv.pie else 0
    eng = Engine(Catalog(inv, bias), keep_log=False)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            import ctypes

            ctypes.CDLL(None).personality(0x0040000)
            os.dup2(rfd, 0)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            os.kill(os.getpid(), signal.SIGSTOP)
            os.execv(str(prog), [str(prog), str(tasks), "ct"])
        finally:
            os._exit(127)
    os.close(rfd)
    os.waitpid(pid, os.WUNTRACED)
    cap = UprobeCapture(spawns=spawns, wakes=wakes)
    cap.plan(SimpleNamespace(path=str(prog), pid=pid, local=True, inventory=inv, bias=bias, engine=eng,  # type: ignore[arg-type]
                             note=None, extra={}))
    assert cap.install() is None and cap.attached, cap.note
    os.write(wfd, b"go\n")
    os.close(wfd)
    t0 = time.perf_counter()
    os.kill(pid, signal.SIGCONT)
    while True:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        cap.poll()
        time.sleep(0.005)
    wall = time.perf_counter() - t0
    cap.sync()
    cap.uninstall()
    seen = cap.origins.log.seen if cap.origins is not None else 0
    return wall, seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--config", default="debug")
    a = ap.parse_args()
    got = build.build(configs=[a.config], programs=["many_tasks"]).get((a.config, "many_tasks"))
    if not isinstance(got, Path):
        sys.exit(f"many_tasks ({a.config}) not built: {got}")
    prog = build.pinned(got)
    print(f"many_tasks {a.tasks} ct ({a.config}), full mode, {a.rounds} rounds; load {os.getloadavg()}")
    with_, spawns_only, without, seen = [], [], [], 0
    for r in range(a.rounds):
        w0, _ = run_once(prog, a.tasks, False)
        ws, seen_s = run_once(prog, a.tasks, True, wakes=False)
        w1, seen = run_once(prog, a.tasks, True)
        without.append(w0)
        spawns_only.append(ws)
        with_.append(w1)
        print(f"round {r + 1}: without {w0:.3f} s; spawns only {ws:.3f} s ({seen_s} spawns recorded, "
              f"{1e6 * (ws - w0) / max(a.tasks, 1):+.2f} us a spawn); spawns and wakes {w1:.3f} s ({seen} recorded, "
              f"{1e6 * (w1 - w0) / max(a.tasks, 1):+.2f} us a task)")
    m0, ms, m1 = statistics.median(without), statistics.median(spawns_only), statistics.median(with_)
    print(f"median: without {m0:.3f} s; spawns only {ms:.3f} s (ratio {ms / m0:.3f}, "
          f"{1e6 * (ms - m0) / max(a.tasks, 1):+.2f} us a spawn); spawns and wakes {m1:.3f} s (ratio {m1 / m0:.3f}, "
          f"{1e6 * (m1 - m0) / max(a.tasks, 1):+.2f} us a task: its spawn, wakes, waker clones and drops, polls); "
          f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
