"""The BPF program's cost a hit on the axum server, by mode and by program variant.

    .venv/bin/python -m bench.bench_bpf_cost [--duration 4] [--rounds 2]
                                             [--modes catchup strict] [--object NAME=PATH ...]

The capture runs inside this process with no gdb (as `bench_server.py
--split`'s `consumer` row): the axum service of `bench/server` under `wrk`,
the consumer folding the records as the server runs. Per run: requests/s, the
server's CPU µs a request, the BPF program's ns a run (the kernel's
`run_time_ns / run_cnt`, kernel.bpf_stats_enabled) and, a hit, what it did
(the program's counters: records, skipped, elided, flushed, return-site hits of
another callee...; entries written with a stack slice). Modes: `catchup` (full
mode, the default: every poll folded into `instances`, sampling while behind),
`full` (the same while the proxy keeps up: the catch-up marks out of reach, never
sampling; `full-nostats`: the same with kernel.bpf_stats_enabled off, so the
server's CPU a request without the stats' own two clock reads a run; `slices`:
the same with a stack slice at every entry, as while threads wait for a resync),
`strict` (`--uprobe-strict`: every poll recorded, nothing folded), `empty` (the
program returns at once: the floor of a run). `--object NAME=PATH` adds a
variant of the program (an object built from an edited copy of uprobes.bpf.c,
e.g. one helper call left out) to compare with the committed one in the same
rounds, interleaved. docs/history/2026-speed.md, "The BPF program's cost a hit", has the
figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.bench_server import (BPF_STATS, Server, capture_target, ensure_wrk, learn_return_sites,
                          resume_listening, wrk_timed)
from integration.harness.uprobes import spawn_stopped

ROOT = Path(__file__).resolve().parent


@contextlib.contextmanager
def serving(server: Server, make_cap: Callable[[], Any]) -> Iterator[tuple[Any, int, int]]:
    """The server started stopped, `make_cap()`'s capture planned and installed, the server
    listening and its return sites learnt: (capture, pid, port); then all undone."""
    from integration.harness.stubs import free_port

    port = free_port()
    pid = spawn_stopped([str(server.prog), str(port)])
    cap = None
    try:
        target = capture_target(server, pid)
        cap = make_cap()
        cap.plan(target)
        cap.install()
        if not cap.attached or cap._prog is None:
            raise SystemExit(f"not attached: {cap.note}")
        resume_listening(pid, port)
        learn_return_sites(cap, port)
        cap.poll()
        yield cap, pid, port
    finally:
        if cap is not None:
            cap.uninstall()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def run(server: Server, wrk: str, duration: float, conns: int, mode: str, obj: str | None) -> dict[str, float]:
    from proxy.capture.uprobes.capture import UprobeCapture

    def make() -> Any:
        marks = {"catchup_marks": (1 << 40, 1 << 39)} if mode.startswith(("full", "slices")) else {}  # full: catch-up never samples
        cap = UprobeCapture(catch_up=mode != "strict", **marks, **({"object_path": Path(obj)} if obj else {}))
        if mode == "slices":  # every entry with its stack slice (as while threads wait for a resync)
            cap.fold.credits_wanted = lambda: 1 << 62  # type: ignore[method-assign]
        return cap

    out: dict[str, float] = {}
    with serving(server, make) as (cap, pid, port):
        if mode == "empty":
            cap._prog.set_off(True)
        if mode.endswith("-nostats"):
            BPF_STATS.write_text("0")
        c0 = cap._prog.counters()
        u0 = cap.unwinder.stats.unwound + len(cap.fold.unwind_q) if cap.unwinder else 0
        t = wrk_timed(wrk, conns, duration, port, pid, poll=cap.poll)
        BPF_STATS.write_text("1")
        out["rps"] = t.rps
        out["server us/req"] = t.per_request_us(t.server_s)
        out["proxy us/req"] = t.per_request_us(t.own_s)
        runs = t.bpf[1]
        out["runs/req"] = runs / max(t.requests, 1)
        out["ns/run"] = t.bpf[0] / max(runs, 1)
        c1 = cap._prog.counters()
        hits = max(c1.get("hits", 0) - c0.get("hits", 0), 1)
        for k in ("records", "skipped", "elided", "flushed", "retsite other", "drops", "lost with room", "retries",
                  "scope misses"):
            out[k + "/hit"] = (c1.get(k, 0) - c0.get(k, 0)) / hits
        if "slices" in c1:
            out["slices/hit"] = (c1["slices"] - c0.get("slices", 0)) / hits
        elif cap.unwinder is not None:  # entries kept for the unwinder (those with a slice, at most)
            out["slices/hit"] = (cap.unwinder.stats.unwound + len(cap.fold.unwind_q) - u0) / hits
        out["lost"] = c1.get("drops", 0) - c0.get("drops", 0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--modes", nargs="+", default=["empty", "catchup", "strict"],
                    choices=["empty", "full", "full-nostats", "slices", "catchup", "strict"])
    ap.add_argument("--object", action="append", default=[], metavar="NAME=PATH",
                    help="a variant of the BPF object, run in every mode beside the committed one")
    ap.add_argument("--no-committed", action="store_true", help="only the --object variants")
    args = ap.parse_args()
    wrk = ensure_wrk()
    server = Server("axum", "release")
    objects: list[tuple[str, str | None]] = [] if args.no_committed else [("committed", None)]
    objects += [tuple(o.split("=", 1)) for o in args.object]  # type: ignore[misc]
    rows = [(mode, name, obj) for mode in args.modes for name, obj in objects
            if not (mode == "empty" and name != objects[0][0])]
    print(f"server {server.prog}; wrk -c{args.connections} -d{args.duration:g}s; {args.rounds} rounds; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    was = BPF_STATS.read_text().strip()
    BPF_STATS.write_text("1")
    results: dict[tuple[str, str], list[dict[str, float]]] = {(m, n): [] for m, n, _ in rows}
    try:
        for rnd in range(args.rounds):
            for mode, name, obj in rows:
                r = run(server, wrk, args.duration, args.connections, mode, obj)
                results[(mode, name)].append(r)
                print(f"round {rnd + 1} {mode:8} {name:12} {r['rps']:>9,.0f} req/s  {r['ns/run']:6.0f} ns/run  "
                      f"server {r['server us/req']:5.1f} us/req  load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        if was != "1":
            BPF_STATS.write_text(was)
    keys = list(next(iter(results.values()))[0].keys())
    print("\nmedians of the rounds:")
    print(f"{'mode':8} {'object':12} " + " ".join(f"{k:>14}" for k in keys))
    for (mode, name), rs in results.items():
        print(f"{mode:8} {name:12} " + " ".join(
            f"{statistics.median(r[k] for r in rs):>14.3f}" for k in keys))
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
