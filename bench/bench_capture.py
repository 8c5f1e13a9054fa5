"""Cost of one poll event for every way of watching polls, in the same run.

    .venv/bin/python -m bench.bench_capture [--sizes 3 30] [--method-sizes uprobes=30,400 ...]
                                            [--configs debug release]
                                            [--modes ct mt] [--repeat 1] [--only M ...]
    .venv/bin/python -m bench.bench_capture --timing [--repeat 3]

Program: the corpus `tokio_bench` (rustc 1.95; `debug`, and `release` with
debug info), current-thread (`ct`) and 2-worker multi-thread (`mt`) tokio
runtimes. Every method watches the same addresses - the entry, each `ret`
and each unwind exit of every coroutine resume function (the tracepoint
program's addresses, `trace_program.build_program`) - through the same
gdbserver binary (`gdbserver --once` on TCP, one per run). uprobes watches
the same polls, but may stand an entry's probe on a later instruction that
every call passes exactly once before anything else happens (the first
emulated one of the prologue, or one per state block after rustc's
dispatch: proxy/capture/uprobes/emulated.py), and leaves out unwind exits
without a CFA rule on rsp/rbp (none runs here: no poll panics); the event
counts printed are the same as the floor's:

* ``bare``        gdb -> gdbserver, no breakpoint: the baseline of the run;
* ``floor``       a raw RSP client (no ``xmlRegisters``) plants
                  ``Z0,addr,1;X..`` whose agent expression counts the hit in
                  a trace state variable and evaluates to 0: gdbserver
                  evaluates it and steps over by itself - the cheapest
                  ptrace stop there is (count read back with ``qTV``);
* ``tracepoints`` gdb -> asyncrsp --capture tracepoints -> gdbserver;
* ``fast-tracepoints`` the same with --inproc, gdbserver starting the program
                  with its in-process agent preloaded: fast tracepoints where
                  a site has 5+ bytes (a non-PIE build: --configs debug-nopie);
* ``breakpoints`` gdb -> asyncrsp --capture breakpoints (probed instruction
                  emulated, one resume per event);
* ``bp-step``     the same with --step-over-probes (two resumes per event);
* ``uprobes``     gdb -> asyncrsp --capture uprobes (skipped, with the
                  reason, when BPF is not available);
* ``gdb-python``  gdb -> gdbserver with a ``gdb.Breakpoint`` per address whose
                  ``stop()`` counts and returns False: the cheapest script,
                  which records nothing;
* ``gdb-collect`` the same breakpoints, whose ``stop()`` records what the
                  tracepoint at that address collects (entry: self from its
                  register, the state bytes at self, sp, the return address,
                  fs_base, a timestamp; exit: sp, the Poll discriminant from
                  rax:rdx or the return slot, fs_base, a timestamp) into a
                  list and returns False: the script a user would write to get
                  the events the proxy gets.

Each run is timed inside gdb (or the raw client) from ``main`` to ``_exit``,
including the ``monitor async stats --all`` that makes the proxy drain and count.
The slope between two sizes cancels start-up and the final drain's fixed
part: µs/event = (Δt(method) - Δt(bare)) / Δevents, with ``bare`` run at the
method's own two sizes in the same run (``--method-sizes``: the floor and
uprobes run at larger sizes than the default so that each run lasts about 1 s;
each run's own slope is printed next to the median, for the spread); the slowdown is the
program's time per iteration under the method, Δt(method) / ΔN, against its
time per iteration under plain gdbserver, t(bare) / N at the larger size
(gdbserver without breakpoints runs the program at native speed). Every run checks the program's own result line
(``check=ok``): a crash or a wrong result is printed, never averaged in.
Stock gdb sends ``xmlRegisters=i386``, so ``bare`` and ``gdb-python`` run
with gdbserver 13.1's AVX-512 write-back (research/gdbserver-xsave-corruption.md;
a multi-thread run may then fail), the proxy and the floor client without.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

from integration.corpus import build
from integration.harness.gdb import gdb_batch
from integration.harness.rspdriver import GDB_FEATURES, RspClient, StopReply
from integration.harness.stubs import start_proxy, start_stub
from proxy.analysis.inventory import build_inventory
from proxy.capture.trace_program import build_program, state_window
from rsp.agent import Op, Opcode, assemble

ROOT = Path(__file__).resolve().parents[1]

PIE_BASE = 0x555555554000  # gdbserver disables address randomisation by default
DONE = re.compile(r"bench done n=\d+ mode=\w+ leaves=\d+ acc=\d+ check=(\w+)")
FLOOR_TSV = 0x7F00  # the floor's hit counter
DEFAULT_SIZES = {"debug": (3, 30), "release": (5, 70)}
# uprobes cost ~15-30 µs an event: at the default sizes its runs last 0.05-0.1 s
# (~3,500 events), below the noise of start-up and of the final fold. These
# make each run last about 1 s (debug ~118 events an iteration, release ~24-31),
# the floor's too (its runs at the default sizes: 0.3-0.8 s, slopes 80-430 µs).
METHOD_SIZES = {("uprobes", "debug"): (30, 400), ("uprobes", "release"): (200, 3000),
                ("floor", "debug"): (3, 60), ("floor", "release"): (5, 200)}


@dataclass
class Run:
    seconds: float
    events: int
    ok: bool
    note: str = ""


@dataclass
class Case:
    """One program binary and runtime, the addresses every method watches."""

    prog: Path
    mode: str
    addrs: list[int]
    # per address, what its tracepoint collects (gdb-collect's script): ("entry",
    # self register, state offset, state size) or ("exit", poll_pending, in_memory)
    collect: list[tuple[Any, ...]] = field(default_factory=list)


# ------------------------------------------------------------ gdb sessions
def _gdb_timed(address: str, prog: Path, setup: list[str], after: list[str]) -> str:
    """main -> _exit under gdb, timed inside gdb around the continue and `after`."""
    cmds = [f"target remote {address}", "break main", "continue", *setup, "break _exit",
            "python import time; _t0 = time.perf_counter()", "continue", *after,
            "python print('ELAPSED %.6f' % (time.perf_counter() - _t0))", "kill"]
    with tempfile.NamedTemporaryFile("w", suffix=".gdb", delete=False) as f:
        f.write("\n".join(cmds) + "\n")  # gdb -batch reads `python ... end` only from files
    try:
        return gdb_batch(prog, [f"source {f.name}"], timeout=1800).output
    finally:
        Path(f.name).unlink(missing_ok=True)


def _result(out: str, program_out: str, events: int, note: str = "") -> Run:
    m = re.search(r"ELAPSED ([\d.]+)", out)
    done = DONE.search(program_out)
    ok = m is not None and done is not None and done.group(1) == "ok"
    if not ok:
        tail = " | ".join((out + program_out).strip().splitlines()[-4:])
        note = (note + " " if note else "") + ("wrong result" if done else "crashed or stuck") + f": {tail[:300]}"
    return Run(float(m.group(1)) if m else float("nan"), events, ok, note)


def run_bare(case: Case, n: int) -> Run:
    with start_stub("gdbserver", case.prog, [str(n), case.mode]) as stub:
        out = _gdb_timed(stub.address, case.prog, [], [])
        return _result(out, stub.output_text(), 0)


def _proxy(capture: str, extra: list[str], stub_kind: str = "gdbserver") -> Callable[[Case, int], Run]:
    def run(case: Case, n: int) -> Run:
        with start_stub(stub_kind, case.prog, [str(n), case.mode]) as stub, \
                start_proxy(stub.address, extra=["--capture", capture, *extra]) as px:
            out = _gdb_timed(px.address, case.prog, [], ["monitor async stats --all"])
            program_out = stub.output_text()
        m = re.search(r"capture: (\S+) \((\d+) poll events", out)
        note = ""
        if m is None or m.group(1) != capture:
            note = "capture not in use: " + " | ".join(ln for ln in out.splitlines() if "capture" in ln)[:200]
        fast = re.search(r"fast tracepoints: (\d+) \((in use|[^)]*)", out)
        if "--inproc" in extra:
            note += f" fast {fast.group(1)} ({fast.group(2)})" if fast else " no fast tracepoints"
        lost = re.search(r"events lost: (\d+)", out)
        if lost and int(lost.group(1)):
            note += f" lost {lost.group(1)}"
        return _result(out, program_out, int(m.group(2)) if m else 0, note.strip())
    return run


PY_BREAKPOINTS = """import gdb
class _Count(gdb.Breakpoint):
    hits = 0
    def stop(self):
        _Count.hits += 1
        return False
for _a in ADDRS:
    _Count('*0x%x' % _a, internal=True)
"""


def _gdb_script(case: Case, n: int, script: str, hits: str) -> Run:
    """gdb -> gdbserver with a Python script sourced at main; `hits` is the
    Python expression that counts its breakpoint hits at _exit."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
    try:
        with start_stub("gdbserver", case.prog, [str(n), case.mode]) as stub:
            out = _gdb_timed(stub.address, case.prog, [f"source {f.name}"], [f"python print('HITS', {hits})"])
            program_out = stub.output_text()
    finally:
        Path(f.name).unlink(missing_ok=True)
    m = re.search(r"HITS (\d+)", out)
    return _result(out, program_out, int(m.group(1)) if m else 0)


def run_gdb_python(case: Case, n: int) -> Run:
    return _gdb_script(case, n, PY_BREAKPOINTS.replace("ADDRS", repr(case.addrs)), "_Count.hits")


GDB_COLLECT = """import gdb, time
_inf = gdb.selected_inferior()
_LOG = []
class _Collect(gdb.Breakpoint):
    def __init__(self, addr, spec):
        super().__init__('*0x%x' % addr, internal=True)
        self.spec = spec
    def stop(self):
        f = gdb.selected_frame()
        sp = int(f.read_register('rsp'))
        if self.spec[0] == 'entry':
            _, reg, off, size = self.spec
            s = int(f.read_register(reg))
            rec = (self.number, s, bytes(_inf.read_memory(s + off, size)), sp, bytes(_inf.read_memory(sp, 8)))
        else:
            _, pending, in_mem = self.spec
            rax = int(f.read_register('rax'))
            if pending is None:
                res = None
            elif in_mem:
                res = bytes(_inf.read_memory(rax + pending[0], pending[1]))
            else:
                res = (rax, int(f.read_register('rdx')))
            rec = (self.number, sp, res)
        _LOG.append(rec + (int(f.read_register('fs_base')), time.monotonic_ns()))
        return False
for _a, _s in POINTS:
    _Collect(_a, _s)
"""


def run_gdb_collect(case: Case, n: int) -> Run:
    return _gdb_script(case, n, GDB_COLLECT.replace("POINTS", repr(list(zip(case.addrs, case.collect)))), "len(_LOG)")


def floor_condition() -> bytes:
    """getv C; +1; setv C; 0: counts the hit, never true."""
    return assemble([Op(Opcode.getv, FLOOR_TSV), Op(Opcode.const8, 1), Opcode.add, Op(Opcode.setv, FLOOR_TSV),
                     Op(Opcode.const8, 0), Opcode.end])


def run_floor(case: Case, n: int) -> Run:
    cond = floor_condition()
    with start_stub("gdbserver", case.prog, [str(n), case.mode]) as stub:
        sock = socket.create_connection(("127.0.0.1", stub.port), timeout=1800)
        try:
            c = RspClient(sock.makefile("rb"), sock.makefile("wb"))
            c.handshake(GDB_FEATURES)  # no xmlRegisters=i386 (research: XSAVE write-back)
            c.request(b"?")
            # qTV answers U for every variable until a trace run has been: an
            # empty run (no tracepoint, nothing inserted) makes the counter readable.
            for body in (b"QTDV:%x:0:0:%s" % (FLOOR_TSV, b"floor".hex().encode()), b"QTStart", b"QTStop"):
                if (r := c.request(body)) != b"OK":
                    return Run(float("nan"), 0, False, f"{body!r} -> {r!r}")
            x = b"X%x,%s" % (len(cond), cond.hex().encode())
            for a in case.addrs:
                if (r := c.request(b"Z0,%x,1;%s" % (a, x))) != b"OK":
                    return Run(float("nan"), 0, False, f"Z0 {a:#x} with a condition -> {r!r}")
            t0 = time.perf_counter()
            stop = StopReply(c.request(b"vCont;c"))
            seconds = time.perf_counter() - t0
            hits = c.request(b"qTV:%x" % FLOOR_TSV)  # still answered after the exit (research §4)
        finally:
            sock.close()
        # gdbserver evaluates a Z0 condition twice per hit: to decide whether to
        # report it, and again in thread_needs_step_over (counted: 712 for
        # the 356 hits gdb-python and the proxy see in `debug ct` N=3).
        events = int(hits[1:], 16) // 2 if hits.startswith(b"V") else 0
        time.sleep(0.05)
        out = f"ELAPSED {seconds:.6f}" if stop.kind == "W" else f"stopped: {stop.body[:80]!r}"
        return _result(out, stub.output_text(), events)


def uprobes_unavailable() -> str | None:
    from proxy.capture.uprobes.capture import UprobeCapture

    ok, why = UprobeCapture.available(None)
    return None if ok else why


METHODS: dict[str, Callable[[Case, int], Run]] = {
    "bare": run_bare,
    "floor": run_floor,
    "tracepoints": _proxy("tracepoints", []),
    # gdbserver starting the program with its in-process agent (asyncrsp run
    # --inproc): fast tracepoints where the build allows (--configs debug-nopie)
    "fast-tracepoints": _proxy("tracepoints", ["--inproc"], "gdbserver-inproc"),
    "breakpoints": _proxy("breakpoints", []),
    "bp-step": _proxy("breakpoints", ["--step-over-probes"]),
    "uprobes": _proxy("uprobes", []),
    "gdb-python": run_gdb_python,
    "gdb-collect": run_gdb_collect,
}
SKIP: dict[str, Callable[[], str | None]] = {"uprobes": uprobes_unavailable}
RATIOS = (  # (numerator, denominator, target text)
    ("tracepoints", "floor", "<= 1.2"),
    ("fast-tracepoints", "floor", "< 1 (the issue: ~12 us a hit, 17x cheaper than a trap)"),
    ("fast-tracepoints", "tracepoints", "< 1"),
    ("gdb-collect", "tracepoints", ">= 4 (the same events recorded)"),
    ("gdb-python", "tracepoints", ">= 4 (against a script that records nothing)"),
    ("uprobes", "floor", "<= 0.1"),
    ("breakpoints", "gdb-python", "< 1"),
)


def make_case(config: str, mode: str) -> Case:
    prog = Path(build.binary(config, "tokio_bench"))
    inv = build_inventory(prog)  # warm the analysis cache: start-up is not what is measured
    bias = PIE_BASE if inv.pie else 0
    points = build_program(inv, bias).points
    fns = {fn.low_pc + bias: fn for fn in inv.resume_fns if fn.low_pc}
    collect: list[tuple[Any, ...]] = []
    for p in points:  # the same choices as build_program's expressions
        fn = fns[p.site]
        if p.kind == "entry":
            collect.append(("entry", fn.self_in, *state_window(inv, fn)))
        else:
            collect.append(("exit", fn.poll_pending, fn.self_in == "rsi"))
    return Case(prog, mode, [p.addr for p in points], collect)


def measure(case: Case, sizes: dict[str, tuple[int, int]], methods: list[str],
            repeat: int) -> dict[str, dict[str, Any]]:
    """Per method: the slope (s, events) between its two sizes, median of `repeat`.

    `sizes` gives each method its pair (a cheap method needs many more events
    for its slope to stand out of the noise); ``bare`` runs at every pair in
    use, and a method's µs/event subtracts the bare slope at its own pair."""
    pairs_used = sorted({sizes[m] for m in methods if m != "bare"} or {sizes["bare"]})
    runs: dict[tuple[str, tuple[int, int]], list[tuple[Run, Run]]] = {}
    for _ in range(repeat):  # interleaved, so drift hits every method alike
        for m in methods:
            for sz in (pairs_used if m == "bare" else [sizes[m]]):
                runs.setdefault((m, sz), []).append((METHODS[m](case, sz[0]), METHODS[m](case, sz[1])))
    out: dict[str, dict[str, Any]] = {}
    bare: dict[tuple[int, int], dict[str, Any]] = {}
    for (m, sz), pairs in runs.items():
        good = [(a, b) for a, b in pairs if a.ok and b.ok]
        notes = [r.note for p in pairs for r in p if r.note]
        if not good:
            r = {"dt": float("nan"), "t": float("nan"), "events": (0, 0), "failed": len(pairs), "notes": notes,
                 "dts": []}
        else:
            r = {"dt": statistics.median(b.seconds - a.seconds for a, b in good),
                 "t": statistics.median(b.seconds for _, b in good),
                 "events": (good[-1][0].events, good[-1][1].events),
                 "failed": len(pairs) - len(good), "notes": notes,
                 "dts": [b.seconds - a.seconds for a, b in good]}
        r["sizes"] = sz
        if m == "bare":
            bare[sz] = r
            out["bare" if "bare" not in out else f"bare {sz[0]}-{sz[1]}"] = r  # one row per pair
        else:
            out[m] = r
    for m, r in out.items():
        base = bare.get(r["sizes"], {"dt": 0.0, "t": float("nan")})
        e0, e1 = r["events"]
        span = e1 - e0
        r["us"] = (r["dt"] - base["dt"]) / span * 1e6 if span > 0 else float("nan")
        # run-to-run spread: each run's slope against the bare median of its pair
        r["us_runs"] = [(d - base["dt"]) / span * 1e6 for d in r["dts"]] if span > 0 else []
        n0, n1 = r["sizes"]
        r["slowdown"] = 1.0 if m.startswith("bare") else r["dt"] / (base["t"] * (n1 - n0) / n1)
    return out


def _sizes(args: argparse.Namespace, method: str, config: str) -> tuple[int, int]:
    for spec in args.method_sizes or []:
        name, _, pair = spec.partition("=")
        if name == method:
            a, b = pair.split(",")
            return int(a), int(b)
    if args.sizes:
        return tuple(args.sizes)  # type: ignore[return-value]
    return METHOD_SIZES.get((method, config.removeprefix("old-")), DEFAULT_SIZES.get(config, (3, 30)))


TIMING_BACKENDS = ("tracepoints", "uprobes", "breakpoints")


def timing_accuracy(polls: int, spin_ms: int, repeat: int) -> None:
    """`monitor async top`'s busy time of poll_timing's spinner against the
    spinner's own measure (wall clock from its resumption to its `.await`,
    summed over its polls): the error left after the capture's cost per event
    is subtracted, per backend."""
    prog = Path(build.binary("debug", "poll_timing"))
    print(f"\npoll timing accuracy: poll_timing {polls} {spin_ms} (debug), spinner's busy time, "
          f"asyncrsp / the program's own clock, {repeat} run(s) each")
    for cap in TIMING_BACKENDS:
        if cap in SKIP and (why := SKIP[cap]()):
            print(f"{cap:12} skipped: {why}")
            continue
        ratios, costs = [], []
        for _ in range(repeat):
            with start_stub("gdbserver", prog, [str(polls), str(spin_ms)]) as stub, \
                    start_proxy(stub.address, extra=["--capture", cap]) as px:
                out = gdb_batch(prog, [f"target remote {px.address}", "break _exit", "continue",
                                       "monitor async top 3", "kill"], timeout=600).output
                program_out = stub.output_text()
            own = re.search(r"spinner_busy_us=(\d+)", program_out)
            row = re.search(r"^#\d+\s+(\S+)\s.*poll_timing::spinner", out, re.M)
            cost = re.search(r"capture cost subtracted: (\S+) per event", out)
            if not own or not row:
                print(f"{cap:12} failed run: {' | '.join(out.splitlines()[-3:])[:200]}")
                continue
            ratios.append(_ns(row.group(1)) / (int(own.group(1)) * 1000))
            costs.append(cost.group(1) if cost else "?")
        if ratios:
            print(f"{cap:12} reported / own: median {statistics.median(ratios):.2f} "
                  f"(runs: {', '.join(f'{r:.2f}' for r in ratios)}); cost subtracted: {', '.join(costs)}")


def _ns(cell: str) -> float:
    m = re.fullmatch(r"([\d.]+)(ns|us|ms|s)", cell)
    return float(m.group(1)) * {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[m.group(2)] if m else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs=2, metavar=("SMALL", "LARGE"),
                    help="tokio_bench iterations for every config (default: debug 3 30, release 5 70: "
                         "about 3,000 events apart; debug polls ~118 events an iteration, release ~31)")
    ap.add_argument("--method-sizes", nargs="+", metavar="METHOD=SMALL,LARGE",
                    help="sizes for one method (bare also runs at them); defaults: uprobes debug 30,400 / "
                         "release 200,3000, floor debug 3,60 / release 5,200 (runs of ~1 s); "
                         "--sizes sets every method")
    ap.add_argument("--configs", nargs="+", default=["debug", "release"])
    ap.add_argument("--modes", nargs="+", default=["ct", "mt"])
    ap.add_argument("--repeat", type=int, default=1, help="runs per size and method (median of the slopes)")
    ap.add_argument("--only", nargs="+", choices=list(METHODS), help="methods to run (bare always runs)")
    ap.add_argument("--timing", action="store_true",
                    help="instead: the accuracy of poll timing (poll_timing's spinner, every backend)")
    args = ap.parse_args()
    if args.timing:
        timing_accuracy(20, 2, args.repeat)
        return 0
    methods = [m for m in METHODS if args.only is None or m in args.only or m == "bare"]
    skipped = {}
    for m in list(methods):
        why = SKIP[m]() if m in SKIP else None
        if why:
            skipped[m] = why
            methods.remove(m)
    t_start = time.monotonic()
    for config in args.configs:
        for mode in args.modes:
            case = make_case(config, mode)
            sizes = {m: _sizes(args, m, config) for m in methods}
            res = measure(case, sizes, methods, args.repeat)
            print(f"\ntokio_bench {config} {mode}, {len(case.addrs)} addresses, repeat {args.repeat}, "
                  f"load {os.getloadavg()[0]:.2f}")
            print(f"{'method':12} {'N':>10} {'t s':>7} {'dt s':>7} {'events':>13} {'us/event':>9} {'slowdown':>9}"
                  f"  runs (us/event); notes")
            for m, r in res.items():
                e0, e1 = r["events"]
                fail = f"{r['failed']} failed run pair(s); " if r["failed"] else ""
                n = "%d-%d" % r["sizes"]
                spread = ", ".join(f"{u:.1f}" for u in r["us_runs"]) if not m.startswith("bare") else ""
                print(f"{m:12} {n:>10} {r['t']:7.3f} {r['dt']:7.3f} {e0:6d} {e1:6d} {r['us']:9.1f} "
                      f"{r['slowdown']:8.1f}x  [{spread}] {fail}{'; '.join(r['notes'])[:300]}")
            for m, why in skipped.items():
                print(f"{m:12} skipped: {why}")
            for a, b, target in RATIOS:
                if a in res and b in res:
                    print(f"ratio {a}/{b}: {res[a]['us'] / res[b]['us']:.2f} (target {target})")
                else:
                    print(f"ratio {a}/{b}: not measured ({'; '.join(skipped.get(x, 'not run') for x in (a, b) if x not in res)})")
            sys.stdout.flush()
    print(f"\ntotal {time.monotonic() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
