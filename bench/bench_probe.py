"""Cost of one hidden probe stop, next to a gdb Python breakpoint whose
``stop()`` returns False, through the same gdbserver, in the same run.

    .venv/bin/python -m bench.bench_probe [--calls N] [--repeat R]

The program is integration/programs/probe_count (N calls of ``probed``, one
thread). Each method runs the program from ``main`` to the ``printf`` after
the last call, timed inside gdb (``time.perf_counter`` around ``continue``):

* bare:   gdb -> gdbserver, no breakpoint on ``probed`` (the floor of the run)
* gdb-py: gdb -> gdbserver, a ``gdb.Breakpoint`` at ``*probed`` whose
          ``stop()`` counts and returns False
* proxy:  gdb -> asyncrsp --probe ^probed$ --capture breakpoints -> gdbserver (hidden stops)

µs per event = (method time - bare time) / events. Prints the medians of R
runs, the event counts (the gdb-py counter, the proxy's probe hits and hidden
stops) and the ratio proxy / gdb-py.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

from integration.harness.gdb import gdb_batch
from integration.harness.programs import SOURCES, build
from integration.harness.stubs import start_proxy, start_stub

REPO = Path(__file__).resolve().parents[1]

PY_BP = """python
class CountingBreakpoint(gdb.Breakpoint):
    hits = 0
    def stop(self):
        CountingBreakpoint.hits += 1
        return False
CountingBreakpoint("*probed", internal=False)
end"""


def printf_line() -> int:
    for no, line in enumerate((SOURCES / "probe_count.c").read_text().splitlines(), 1):
        if 'printf("sum=' in line:
            return no
    raise SystemExit("probe_count.c has no printf line")


def timed_session(address: str, prog: Path, setup: list[str], after: list[str]) -> str:
    cmds = [f"target remote {address}", "break main", "continue", *setup,
            f"break probe_count.c:{printf_line()}",
            "python import time; _t0 = time.perf_counter()", "continue",
            "python print('ELAPSED %.6f' % (time.perf_counter() - _t0))", *after, "kill"]
    # gdb -batch reads `python ... end` blocks only from a file
    script = Path(f"/tmp/bench_probe_{id(cmds)}.gdb")
    script.write_text("\n".join(cmds) + "\n")
    try:
        return gdb_batch(prog, [f"source {script}"], timeout=600).output
    finally:
        script.unlink(missing_ok=True)


def elapsed(out: str) -> float:
    m = re.search(r"ELAPSED ([\d.]+)", out)
    if not m:
        raise SystemExit(f"a session did not reach the printf:\n{out}")
    return float(m.group(1))


def run_bare(prog: Path, calls: int) -> float:
    with start_stub("gdbserver", prog, [str(calls)]) as stub:
        return elapsed(timed_session(stub.address, prog, [], []))


def run_gdb_py(prog: Path, calls: int) -> tuple[float, int]:
    with start_stub("gdbserver", prog, [str(calls)]) as stub:
        out = timed_session(stub.address, prog, [PY_BP], ["python print('HITS', CountingBreakpoint.hits)"])
    hits = re.search(r"HITS (\d+)", out)
    return elapsed(out), int(hits.group(1)) if hits else -1


def run_proxy(prog: Path, calls: int) -> tuple[float, int, int]:
    with start_stub("gdbserver", prog, [str(calls)]) as stub, \
            start_proxy(stub.address, probes=["^probed$"], extra=["--capture", "breakpoints"]) as px:
        out = timed_session(px.address, prog, [], ["monitor async stats --all"])
    hits = re.search(r"probe hits: (\d+)", out)
    hidden = re.search(r"hidden stops: (\d+)", out)
    return elapsed(out), int(hits.group(1)) if hits else -1, int(hidden.group(1)) if hidden else -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    prog = build("probe_count")
    bare, py, px = [], [], []
    counts: dict[str, int] = {}
    for _ in range(args.repeat):  # interleaved, so drift hits every method alike
        bare.append(run_bare(prog, args.calls))
        t, counts["gdb-py breakpoint stops"] = run_gdb_py(prog, args.calls)
        py.append(t)
        t, counts["proxy probe hits"], counts["proxy hidden stops"] = run_proxy(prog, args.calls)
        px.append(t)
    b, p, x = statistics.median(bare), statistics.median(py), statistics.median(px)
    per_py = (p - b) / args.calls * 1e6
    per_px = (x - b) / args.calls * 1e6
    print(f"calls of probed: {args.calls}, runs per method: {args.repeat} (medians)")
    print(f"bare run, no breakpoint:              {b * 1e3:9.1f} ms")
    print(f"gdb Python breakpoint, stop()=False:  {p * 1e3:9.1f} ms  {per_py:8.1f} us/event")
    print(f"asyncrsp hidden probe:                {x * 1e3:9.1f} ms  {per_px:8.1f} us/event")
    print(f"ratio proxy / gdb-python:             {per_px / per_py:9.2f}")
    for k, v in counts.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
