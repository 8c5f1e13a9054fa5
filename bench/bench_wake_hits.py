"""Where `--wakes` spends its hits on the axum server: each spawn and wake site's hits a request.

    .venv/bin/python -m bench.bench_wake_hits [--duration 3] [--connections 16] [--without | --lost-wakers]

The capture runs inside this process with no gdb (as bench_bpf_cost.py): full mode with
`--wakes`, the axum service of `bench/server` under `wrk`. Prints requests/s, the server's CPU
µs a request and, per spawn or wake site (grouped by the operation: spawn, wake, wake by
reference, clone, drop, task poll), its hits a request; then the poll sites' hits a request for
comparison. docs/wakes.md, "Cost", has the figures.
"""

from __future__ import annotations

import argparse
import os
import sys

from bench.bench_bpf_cost import serving
from bench.bench_server import Server, ensure_wrk, wrk_timed

OP_NAMES = {0: "wake", 1: "wake by ref", 2: "clone", 3: "drop", 4: "task poll"}


def run(server: Server, wrk: str, duration: float, conns: int, spawns: bool = True, wakers: bool = False) -> None:
    from proxy.capture.uprobes import bpf as B
    from proxy.capture.uprobes.capture import UprobeCapture

    with serving(server, lambda: UprobeCapture(spawns=spawns, wakers=wakers, catchup_marks=(1 << 40, 1 << 39))) as (cap, pid, port):
        sites = cap._att_sites  # a site's cookie is its index here
        cookies = list(range(len(sites)))
        h0 = cap._prog.site_hits(cookies)
        t = wrk_timed(wrk, conns, duration, port, pid, poll=cap.poll)
        h1 = cap._prog.site_hits(cookies)
        req = max(t.requests, 1)
        groups: dict[str, int] = {}
        for i, s in enumerate(sites):
            n = h1.get(i, 0) - h0.get(i, 0)
            if s.spec.kind == B.KIND_SPAWN:
                key = "spawn"
            elif s.spec.kind == B.KIND_WAKE:
                key = OP_NAMES.get(s.spec.state_off, "?")
            else:
                key = "poll sites"
            groups[key] = groups.get(key, 0) + n
        print(f"{t.rps:,.0f} req/s; server {t.per_request_us(t.server_s):.1f} us/req; proxy "
              f"{t.per_request_us(t.own_s):.1f} us/req; {t.requests:,} requests")
        for key, n in sorted(groups.items(), key=lambda kv: -kv[1]):
            print(f"  {key:12} {n / req:8.2f} hits/req")
        for line in cap.origins.lines() if cap.origins is not None else []:
            print("  " + line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--without", action="store_true", help="the same capture without --wakes, for comparison")
    ap.add_argument("--lost-wakers", action="store_true", help="the waker clone and drop sites too")
    args = ap.parse_args()
    wrk = ensure_wrk()
    server = Server("axum", "release")
    print(f"server {server.prog}; wrk -c{args.connections} -d{args.duration:g}s; load {os.getloadavg()[0]:.1f}")
    run(server, wrk, args.duration, args.connections, not args.without, args.lost_wakers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
