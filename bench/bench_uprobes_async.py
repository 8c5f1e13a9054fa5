"""Asynchronous capture holds: event rate, drops, a stalled consumer, unwinding from slices.

    .venv/bin/python -m bench.bench_uprobes_async [--calls 1000000] [--repeat 3]

Two figures of uprobe capture, measured without gdb (the capture
alone on the program, `integration/harness/uprobes.run_captured`):

* **100,000 events per second, < 1% dropped, the program never blocked by a
  slow consumer.** The C `probe_count` program calls `probed()` (entry
  `push %rbp`: emulated by the kernel, ~1 us a hit) from 2 threads. Three
  runs of the same program, same size:
  - ``bare``: no probe (the program's own time);
  - ``consumer``: the proxy's consumer folds every event into the engine as
    the program runs (the default 64 MiB ring, poll every 5 ms): events/s while the
    program ran, events dropped;
  - ``stalled``: the consumer does not read the ring at all until the program
    has exited (a consumer stuck for the whole run, 1 MiB ring): the program
    runs as fast as with the consumer (its time per event is printed for both),
    the ring fills and the rest is dropped - and counted exactly (records +
    drops = hits).
* **>= 90% of poll entries fully unwound (or >= 5 frames) on a release build
  without frame pointers**: `tokio_bench 300 mt` (release, rustc 1.95), every
  entry's 8 KiB slice unwound with the CFI unwinder (the unwinder's queue made
  unbounded for this count), parent check against the engine.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

from integration.corpus import build
from integration.harness import programs as cprogs
from integration.harness.uprobes import c_inventory, run_captured, spawn_stopped
from proxy.analysis.inventory import build_inventory
from proxy.capture.uprobes.capture import UprobeCapture

ROOT = Path(__file__).resolve().parents[1]


def bare(prog: Path, args: list[str]) -> float:
    pid = spawn_stopped([str(prog), *args])
    t0 = time.perf_counter()
    os.kill(pid, signal.SIGCONT)
    os.waitpid(pid, 0)
    return time.perf_counter() - t0


def rate_and_drops(calls: int, repeat: int) -> None:
    prog = cprogs.build("probe_count")
    inv = c_inventory(prog, "probed")
    args = [str(calls), "2"]
    events = 2 * calls
    rows: dict[str, list[tuple[float, int, int]]] = {"bare": [], "consumer": [], "stalled": []}
    for _ in range(repeat):
        rows["bare"].append((bare(prog, args), 0, 0))
        cap, _eng, code = run_captured(prog, args, inv, unwind_share=0.0)  # the default 64 MiB ring
        assert code == 0 and cap.decoder is not None
        rows["consumer"].append((cap.program_wall, cap.decoder.stats.records, cap.lost))  # type: ignore[attr-defined]
        cap, _eng, code = run_captured(prog, args, inv, ring_bytes=1 << 20, unwind_share=0.0, stalled=True)
        assert code == 0 and cap.decoder is not None
        rows["stalled"].append((cap.program_wall, cap.decoder.stats.records, cap.lost))  # type: ignore[attr-defined]
    base = statistics.median(w for w, _, _ in rows["bare"])
    print(f"probe_count {calls} 2 (2 threads, {events:,} poll-like events: entry + ret), "
          f"median of {repeat}; machine load {os.getloadavg()[0]:.1f}")
    print(f"{'run':9} {'wall s':>7} {'events/s':>10} {'us/event':>9} {'recorded':>10} {'dropped':>9} {'drop %':>7}")
    for name, rs in rows.items():
        wall = statistics.median(w for w, _, _ in rs)
        rec = int(statistics.median(r for _, r, _ in rs))
        lost = int(statistics.median(d for _, _, d in rs))
        if name == "bare":
            print(f"{name:9} {wall:7.3f}")
            continue
        assert all(r + d == events for _, r, d in rs), rs  # every event recorded or counted lost
        print(f"{name:9} {wall:7.3f} {events / wall:10,.0f} {(wall - base) / events * 1e6:9.2f} "
              f"{rec:10,} {lost:9,} {100 * lost / events:6.2f}%")
    c = statistics.median(w for w, _, _ in rows["consumer"])
    s = statistics.median(w for w, _, _ in rows["stalled"])
    print(f"program time with a stalled consumer / with a live one: {s / c:.2f} "
          f"(1.0 = the program never waits for the consumer)")


def unwinding() -> None:
    prog = build.binary("release", "tokio_bench")
    inv = build_inventory(str(prog))
    cap, _eng, code = run_captured(prog, [300, "mt"], inv, unwind_share=1.0, unwind_queue=1 << 20,
                                   stop_unwind_s=None)
    assert code == 0 and cap.unwinder is not None
    s = cap.unwinder.stats
    good = s.full + s.five_or_more
    print(f"\nrelease tokio_bench 300 mt (no frame pointers), 8 KiB slices: {s.unwound:,} entries unwound: "
          f"{s.full:,} full, {s.partial:,} partial ({s.five_or_more:,} of them >= 5 frames): "
          f"{100 * good / max(s.unwound, 1):.1f}% full or >= 5 frames (target >= 90%); "
          f"parent check {s.parent_agree:,} agree, {s.parent_disagree:,} disagree, {s.parent_unknown:,} unknown")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=500_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    ok, why = UprobeCapture.available(None)
    if not ok:
        print(f"skipped: {why}")
        return 0
    rate_and_drops(args.calls, args.repeat)
    unwinding()
    return 0


if __name__ == "__main__":
    sys.exit(main())
