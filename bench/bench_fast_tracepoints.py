"""Where a fast tracepoint's time goes: probe_count (non-PIE, 1 thread) per call.

    nice .venv/bin/python -m bench.bench_fast_tracepoints SMALL LARGE REPEAT [VARIANT ...]

Each variant runs gdb -> asyncrsp -> gdbserver on `probe_count N 1` to its
exit; the slope between N=SMALL and N=LARGE (median of REPEAT) is µs per
call of `probed` (one entry and one ret event per call):
base-noagent / base-agent (no tracepoints; without / with the in-process
agent preloaded), trap-noagent / trap-agent (trap tracepoints at the entry
and the ret), fast-agent (--inproc: the entry fast, the 1-byte ret a trap).
The last column is the ratio to trap-noagent measured in the same run.
"""
import sys, time, statistics
from integration.harness.gdb import gdb_batch
from integration.harness.stubs import start_proxy, start_stub
from integration.harness import programs as cprogs
prog = cprogs.build("probe_count", nopie=True)
TR = ["--capture", "tracepoints"]
COUNT = [*TR, "--trace-probe", "^probed$"]  # a tracepoint on probed's entry and ret
V = {
 "base-noagent": ("gdbserver", TR),
 "base-agent": ("gdbserver-inproc", TR),
 "trap-noagent": ("gdbserver", [*COUNT]),
 "trap-agent": ("gdbserver-inproc", [*COUNT]),
 "fast-agent": ("gdbserver-inproc", [*COUNT, "--inproc"]),
}
def one(name, n):
    kind, extra = V[name]
    with start_stub(kind, prog, [str(n), "1"]) as stub, start_proxy(stub.address, extra=extra) as px:
        t0 = time.monotonic()
        run = gdb_batch(prog, [f"target remote {px.address}", "continue"], timeout=600)
        el = time.monotonic() - t0
        px.wait(timeout=30); stub.wait(timeout=10)
        ok = f"sum={n*n} calls={n}" in stub.output_text()
    return el, ok
small, large = int(sys.argv[1]), int(sys.argv[2]); rep = int(sys.argv[3])
names = sys.argv[4:] or list(V)
res = {}
for name in names:
    slopes = []
    for _ in range(rep):
        a, oka = one(name, small); b, okb = one(name, large)
        slopes.append((b - a) / (large - small) * 1e6)
    res[name] = statistics.median(slopes)
    ratio = f"  x{res[name] / res['trap-noagent']:.2f} of trap-noagent" if res.get("trap-noagent") else ""
    print(f"{name:14s} µs/call {res[name]:7.1f}  runs {[round(s, 1) for s in slopes]} ok={oka and okb}{ratio}", flush=True)
