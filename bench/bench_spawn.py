"""What spawn and wake capture cost a spawn-heavy program, against the same capture without them.

The corpus program ``many_tasks K ct`` spawns K tasks that each wait on one
``Notify``, then wakes them all and joins them: K spawns, K wakes, ~3K polls.
Each round runs it under uprobe capture in full mode, in turns: with the
spawn (and wake) probes of ``--wakes`` in several variants and without them,
and prints the program's wall time, the spawns the kernel recorded, and the
difference per spawn against the capture without spawns, for spawn records
that keep a fixed 8 KiB of stack, none, or the slice each spawning path's first
record showed it needs (the default), and the default with the wake probes too
(clone, wake, drop, the task's poll function). Printed, never asserted.

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


def run_once(prog: Path, tasks: int, spawns: bool, wakes: bool = True, stack: int | None = None,
             learn: bool = True) -> tuple[float, int, int]:
    """(the program's wall time from its start to its exit, spawns recorded, ns the BPF program
    ran: 0 unless kernel.bpf_stats_enabled). `stack`: the bytes
    a spawning path's first record keeps (None: the default); `learn`: its later records keep
    what its first one showed they need (False: every record keeps `stack`)."""
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
    if cap.origins is not None:
        cap.origins.learn = learn
        if stack is not None:
            cap.origins.spawn_stack = stack
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
    bpf_ns = _run_time_ns(cap._prog.prog_fd) if cap._prog is not None else 0
    cap.uninstall()
    seen = cap.origins.log.seen if cap.origins is not None else 0
    return wall, seen, bpf_ns


def _run_time_ns(prog_fd: int) -> int:
    """The BPF program's run time so far (its fd's fdinfo; counted while kernel.bpf_stats_enabled)."""
    for line in Path(f"/proc/self/fdinfo/{prog_fd}").read_text().splitlines():
        if line.startswith("run_time_ns:"):
            return int(line.split()[1])
    return 0


STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


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
    # the variants, run in turns each round: spawn records with a fixed 8 KiB slice (every record),
    # with no stack (the trap and the record alone), with each path's slice learnt from its first
    # record (the default), and the default with the wake probes too
    variants = {"without": dict(spawns=False), "fixed 8 KiB": dict(spawns=True, wakes=False, stack=8192, learn=False),
                "no stack": dict(spawns=True, wakes=False, stack=0, learn=False),
                "learnt": dict(spawns=True, wakes=False), "learnt, wakes": dict(spawns=True)}
    walls: dict[str, list[float]] = {k: [] for k in variants}
    bpf: dict[str, list[float]] = {k: [] for k in variants}  # the BPF program's ns a spawn over without's
    seen: dict[str, int] = {}
    # the kernel's own account of the BPF program's run time (the stack copy is in it; the trap is
    # not): far less noisy than the wall time on a loaded machine; set back as it was after
    was = STATS.read_text().strip() if STATS.exists() else None
    if was is not None:
        STATS.write_text("1")
    try:
        for r in range(a.rounds):
            for name, kw in variants.items():
                w, n, ns = run_once(prog, a.tasks, **kw)  # type: ignore[arg-type]
                walls[name].append(w)
                bpf[name].append(ns)
                seen[name] = n
            w0, b0 = walls["without"][-1], bpf["without"][-1]
            print(f"round {r + 1}: " + "; ".join(
                f"{k} {v[-1]:.3f} s ({1e6 * (v[-1] - w0) / max(a.tasks, 1):+.2f} us a spawn"
                + (f", BPF {(bpf[k][-1] - b0) / max(a.tasks, 1):+.0f} ns a spawn, {seen[k]} recorded)"
                   if k != "without" else ")") for k, v in walls.items()))
    finally:
        if was is not None:
            STATS.write_text(was)
    med = {k: statistics.median(v) for k, v in walls.items()}
    b = {k: statistics.median(v) for k, v in bpf.items()}
    m0 = med["without"]
    print("median: " + "; ".join(f"{k} {m:.3f} s (x{m / m0:.3f} of without, {1e6 * (m - m0) / max(a.tasks, 1):+.2f} us "
                                 f"a spawn; BPF {(b[k] - b['without']) / max(a.tasks, 1):+.0f} ns a spawn)"
                                 for k, m in med.items() if k != "without")
          + f"; learnt / fixed 8 KiB: wall x{med['learnt'] / med['fixed 8 KiB']:.3f}, BPF time over without x"
          + f"{(b['learnt'] - b['without']) / max(b['fixed 8 KiB'] - b['without'], 1):.3f}; load {os.getloadavg()}")


if __name__ == "__main__":
    main()
