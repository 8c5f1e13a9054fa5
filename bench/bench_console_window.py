"""Why full mode's BUSY is below console-subscriber's for the same tasks: the probes inside the window.

    python -m bench.bench_console_window [--strict] [--duration S]

The server benchmark's axum console build (bench/server, console-subscriber inside) under
uprobe capture in full mode, in this process (no gdb: the engine's per-task figures are
read directly), `wrk -c16` for S seconds, then console-subscriber's own figures
(`console_stats`) and `/quit`. For the connection tasks, paired by poll count with
console's (bench_server.match_tasks), it prints our BUSY a poll (top's figure: the raw window
less (events inside + 1) x the calibrated cost per event), console's, the raw window, the
capture events inside each poll, and the raw window less only the poll's own entry and exit
(1 x the cost): what console's window holds, our probes inside it included. Take
`flock /work/coord/bench.lock` around it on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from bench import bench_server as bs
from proxy.analysis.inventory import build_inventory
from proxy.capture.uprobes.capture import UprobeCapture
from proxy.graph.catalog import Catalog
from proxy.graph.engine import Engine
from integration.harness.uprobes import spawn_stopped  # as bench_server's --split does
from bench.server import build_server

ROOT = Path(__file__).resolve().parents[1]

PROG = build_server.binary("console")
BIAS = 0x555555554000  # ASLR off, as gdbserver runs it


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strict", action="store_true", help="--uprobe-strict: every poll recorded, no catch-up")
    ap.add_argument("--duration", type=float, default=3.0)
    args = ap.parse_args()
    inv = build_inventory(str(PROG))
    eng = Engine(Catalog(inv, BIAS), keep_log=False)
    bind = bs.console_bind()
    os.environ["TOKIO_CONSOLE_BIND"] = bind
    r, w = os.pipe()
    pid = spawn_stopped([str(PROG), "0"], stdout=w)  # ASLR off, as gdbserver runs it
    target = SimpleNamespace(path=str(PROG), pid=pid, local=True, inventory=inv, bias=BIAS, engine=eng, note=None,
                             extra={})
    cap = UprobeCapture(unwind_share=0.0, **({"catchup_marks": None} if args.strict else {}))  # type: ignore[arg-type]
    cap.plan(target)  # type: ignore[arg-type]
    if cap.install() is not None or not cap.attached:
        print(f"bench_console_window: uprobes not attached: {cap.note}")
        return 1
    os.kill(pid, signal.SIGCONT)
    out = b""
    while b"server ready" not in out:
        out += os.read(r, 4096)
    m = re.search(rb"port=(\d+)", out)
    assert m
    port = int(m.group(1))
    wrk = threading.Thread(target=subprocess.run, args=(["wrk", "-t1", "-c16", f"-d{args.duration:g}s",
                                                         f"http://127.0.0.1:{port}/"],),
                           kwargs={"capture_output": True})
    wrk.start()
    while wrk.is_alive():
        cap.poll()
        time.sleep(0.005)
    time.sleep(0.5)
    cap.poll()
    res = subprocess.run([str(PROG.parent / "console_stats"), f"http://{bind}"], capture_output=True, text=True,
                         timeout=60, check=False)
    con = bs.console_rows(res.stdout)
    bs.quit_server(port)
    while not os.waitpid(pid, os.WNOHANG)[0]:
        cap.poll()
        time.sleep(0.005)
    cap.sync()
    cap.uninstall()
    cost, source = eng.timing.cost()
    rows = []
    for t in eng.tasks():
        tt = eng.timing.of(t.id)
        if re.search(bs.CONN_FN_AXUM, t.path or "") and t.parent is None and tt is not None and tt.polls > 10:
            rows.append((t.label, tt.polls, eng.timing.busy_ns(t.id) / 1000, tt.raw_ns / 1000, tt.events))
    match = bs.match_tasks([(i, p, b) for i, p, b, _, _ in rows], con)
    op, cp, ob, cb, _ = bs.same_sums(match)
    polls, raw, events = sum(x[1] for x in rows), sum(x[3] for x in rows), sum(x[4] for x in rows)
    print(f"{'strict' if args.strict else 'catch-up'}; cost {cost / 1000:.2f} us an event ({source})")
    print(f"pairs {len(match.pairs)} of {len(con)} console tasks; polls ours {op:,} console {cp:,}")
    if not op or not cb:
        return 1
    print(f"busy a poll: ours (top) {ob / op:.2f} us, console {cb / cp:.2f} us: {ob / cb:.3f}")
    edges = (raw - polls * cost / 1000) / polls
    print(f"raw window a poll {raw / polls:.2f} us; capture events a poll {events / polls:.2f} (its own entry/exit "
          f"counted as 1); raw less 1 x cost: {edges:.2f} us = {edges / (cb / cp):.3f} x console's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
