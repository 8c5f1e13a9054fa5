"""What watching a busy server costs: requests/s under wrk, bare against each way of watching it.

    .venv/bin/python -m bench.bench_server [--duration 8] [--rounds 3] [--connections 16]
                                           [--server corpus|axum] [--config release|debug]
                                           [--only bare gdb uprobes ...]
    .venv/bin/python -m bench.bench_server --split [--rounds 3] ...
                                           [--stats-window 2]

The server: the corpus' `http_server` (tokio 1.24, current-thread runtime;
`--server corpus`, the default) or the axum 0.8 / tokio 1.53 service of
`bench/server` (`--server axum`, built from Debian sid's crates by
`scripts/fetch-crates sid`; its `console` build is the same service with
tokio-console's instrumentation). Every connection is a spawned task; each
request locks a tokio Mutex, spawns a backend task and awaits its answer on
a oneshot. Load: Debian's `wrk -t1 -cC -dDs` on loopback (installed with
apt-get when missing). Ways of watching, run one after the other inside each
round, rounds interleaved so that every ratio compares runs minutes apart at
most:

* ``bare``          the server alone;
* ``console``       (axum only) the same service rebuilt with
                    `--cfg tokio_unstable` and `console_subscriber::init()`:
                    what a tokio-console user pays;
* ``gdb``           gdb -> gdbserver, continuing: a debugger attached, nothing
                    watched;
* ``uprobes``       gdb -> asyncrsp --capture uprobes (--mode full) -> gdbserver;
* ``uprobes-wakes`` the same with --wakes: spawn and wake probes too
                    (docs/wakes.md);
* ``uprobes-strict`` the same with --uprobe-strict: every poll recorded even
                    when the proxy falls behind (by default the kernel then
                    samples until it caught up);
* ``uprobes-nobudget`` the same with --uprobe-budget 0: the proxy folds
                    whenever records are unread (by default it takes 10% of
                    a core at most while the program runs);
* ``uprobes-every`` the same with --uprobe-every: the coroutines created and
                    completed inside one poll of their parent recorded too
                    (by default they are counted in the kernel only);
* ``uprobes-changes`` the same with --uprobe-changes: only the polls that
                    change the graph recorded, every poll counted in the kernel;
* ``uprobes-rets``  the same with --uprobe-rets: the exits of resume functions
                    polled through a vtable stay on their single-stepped
                    rets (as before their return sites were learned);
                    ``uprobes-sampled-rets``: --sample N --uprobe-rets;
* ``uprobes-tasks`` the same with --mode tasks: after 0.5 s only the resume
                    functions polled as tasks' roots stay probed, their
                    counts and times folded in the kernel (exact);
* ``uprobes-sampled`` the same with --sample N (`--sample`, 64): one root poll
                    in N per coroutine instance recorded, poll counts and busy
                    times exact (folded in the kernel);
* ``uprobes-sliced`` the same with --sample-time PCT (`--sample-time`, 10):
                    the probes in for PCT% of the time in 50 ms slices, out
                    (the program bare) for the rest; figures from the slices;
* ``uprobes-tasks-sliced`` --mode tasks inside --sample-time slices;
* ``uprobes-entry`` the same with --mode entry (exits inferred);
* ``console-uprobes`` / ``console-tasks`` (axum only) the console build
                    watched by asyncrsp (--mode full / --mode tasks) while
                    console-subscriber runs in it: top's figures against
                    console's for the very same tasks, in the same run (the
                    "same tasks, same run" table, tasks paired by poll count);
* ``console-breakpoints`` / ``console-tracepoints`` (axum, --only) the same
                    with the other captures (the wrapper polls they probe too:
                    polls exact, BUSY dominated by each capture's cost a hit);
* ``tracepoints``   gdb -> asyncrsp --capture tracepoints -> gdbserver;
* ``breakpoints``   gdb -> asyncrsp --capture breakpoints -> gdbserver.

`--split` says where uprobe capture's cost goes, without gdb or gdbserver
(the capture runs inside the benchmark's own process, as in
`integration/harness/uprobes.run_captured`), rounds interleaved the same way:
``bare``; ``traps`` (every site planted, each only counting its hits: the
kernel's cost of the probed instructions); ``traps-rets`` (the same with the
exits on the functions' ``ret``s, not in their callers nor at learned return
sites); ``empty`` (every site
planted, the BPF program returning at once: the traps alone, the floor of
any uprobe capture at these sites); ``empty-rets`` (the same with the exits of
functions polled through a vtable on their rets, as with ``--uprobe-rets``);
``empty-norets`` (the same without the
exit probes that stand on a ``ret``, which the kernel single-steps: the
difference is what those cost); ``records`` (the records written,
nobody reading them: a 512 MiB ring); ``records-changes`` (the same with
only graph changes recorded, as under ``uprobes-changes``); ``consumer`` /
``consumer-changes`` (the proxy's consumer
folding every record into an engine as the server runs; its CPU time per
event is printed). Each with requests/s, the ratio to bare and the events.

The kernel's BPF stats are off in every timed run. With kernel.bpf_stats_enabled the kernel
reads its clock twice around each run of a BPF program (~100 ns a hit here, ~1 µs a request in full
mode; docs/history/2026-speed.md "Bench rows without the BPF stats' own cost"), which no user pays. The BPF
program's ns a hit comes from one more run of each row whose watcher runs one (uprobes), after the
rounds: `--stats-window` seconds (2) of wrk with the stats on, its throughput not reported. A row
named ``X+stats`` (`--only uprobes uprobes+stats`) is X with the stats on while timed, interleaved
with the others in every round: what the stats cost, in the same run.

Each run: start, wait for `server ready`, `wrk` for D seconds, `GET /quit`;
under gdb the program then stops at `_exit`, where gdb asks the proxy for
`monitor async top 64` and `monitor async stats --all`. Printed per way: requests/s
of each round, the median, and the ratio to the bare run of the same round
(median and range). Accuracy check: the connection tasks' polls and busy time
from `top` (summed over every `conn_task` task it lists: the task each connection is spawned as) against the
server's own count (a wrapper future around each connection future counts
its polls and the wall-clock time inside them: `server done ... conn_polls=
conn_busy_us=`), and under `console` console-subscriber's own figures for
the same tasks. asyncrsp's event count and lost events come from `stats`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from integration.corpus import build
from integration.harness.stubs import OutputPump, kill_tree, start_proxy, start_stub

ROOT = Path(__file__).resolve().parents[1]

READY = re.compile(rb"server ready port=(\d+)")
DONE = re.compile(r"server done requests=(\d+)(?: connections=(\d+) conn_polls=(\d+) conn_busy_us=(\d+))?")
WRK_RPS = re.compile(r"Requests/sec:\s+([\d.]+)")
WRK_REQUESTS = re.compile(r"(\d+) requests in")
# axum 0.8's serve spawns each connection as an async block of its serve module;
# console-subscriber names the task by its spawn location (axum's serve.rs)
# (not serve's accept loop, into_future's block); the console build's task is named by its path
# alone when the exit stop's snapshot is over budget ("axum::serve::handle_connection [in ...]")
CONN_FN_AXUM = r"axum::serve::handle_connection(::|\s|$)"
# (axum 0.8.9's serve/mod.rs:389, the `{async_block@389}` of handle_connection; its
# serve/mod.rs:276 is another spawn, 1 poll, no connection)
CONN_LOC_AXUM = re.compile(r"axum-[\d.]+/src/serve/mod\.rs:389$")
CAPTURES = {"uprobes": ["--capture", "uprobes", "--mode", "full"],
            "uprobes-wakes": ["--capture", "uprobes", "--mode", "full", "--wakes"],
            "uprobes-rets": ["--capture", "uprobes", "--mode", "full", "--uprobe-rets"],
            "uprobes-changes": ["--capture", "uprobes", "--mode", "full", "--uprobe-changes"],
            "uprobes-every": ["--capture", "uprobes", "--mode", "full", "--uprobe-every"],
            "uprobes-strict": ["--capture", "uprobes", "--mode", "full", "--uprobe-strict"],
            "uprobes-nobudget": ["--capture", "uprobes", "--mode", "full", "--uprobe-budget", "0"],
            "uprobes-sampled-rets": ["--capture", "uprobes", "--sample", "64", "--uprobe-rets"],
            "uprobes-entry": ["--capture", "uprobes", "--mode", "entry"],
            "uprobes-sampled": ["--capture", "uprobes", "--sample", "64"],
            "uprobes-sliced": ["--capture", "uprobes", "--sample-time", "10"],
            "uprobes-tasks": ["--capture", "uprobes", "--mode", "tasks"],
            "uprobes-tasks-sliced": ["--capture", "uprobes", "--mode", "tasks", "--sample-time", "10"],
            "console-uprobes": ["--capture", "uprobes", "--mode", "full", "--wakes"],
            "console-tasks": ["--capture", "uprobes", "--mode", "tasks"],
            "console-breakpoints": ["--capture", "breakpoints"],
            "console-tracepoints": ["--capture", "tracepoints"],
            "tracepoints": ["--capture", "tracepoints"],
            "breakpoints": ["--capture", "breakpoints"]}
ORDER = ["bare", "console", "gdb", "uprobes", "uprobes-wakes", "uprobes-strict", "uprobes-nobudget", "uprobes-every", "uprobes-changes", "uprobes-rets", "uprobes-tasks", "uprobes-sampled",
         "uprobes-sampled-rets", "uprobes-sliced",
         "uprobes-tasks-sliced", "uprobes-entry", "console-uprobes", "console-tasks", "tracepoints", "breakpoints"]


@dataclass
class Run:
    how: str
    rps: float = float("nan")
    ok: bool = False
    note: str = ""
    own: tuple[int, int] | None = None  # the server's own (conn polls, conn busy µs)
    requests: int = 0  # the server's own count of requests served
    cpu_us: tuple[float, float] | None = None  # CPU µs per request while wrk ran: (server, watcher)
    top: tuple[int, float] | None = None  # top's (polls, busy µs) summed over connection tasks
    events: int | None = None
    lost: int = 0
    bpf: tuple[int, int] | None = None  # the BPF program's (run ns, runs) while wrk ran (the stats on: X+stats)
    extra: dict[str, str] = field(default_factory=dict)
    after_us: float | None = None  # the proxy's CPU a request after wrk (the records it had not folded yet)
    stop_s: tuple[float | None, float | None] = (None, None)  # the client's wait for a stop: (mid-wrk, exit)
    # console-*: the connection tasks, each (id, polls, busy µs): top's and console-subscriber's of the same run
    same: tuple[list[tuple[str, int, float]], list[tuple[str, int, float]]] | None = None


def ensure_wrk() -> str:
    wrk = shutil.which("wrk")
    if wrk is None:
        print("wrk missing: apt-get install -y wrk", flush=True)
        subprocess.run(["apt-get", "install", "-y", "wrk"], check=True, stdout=subprocess.DEVNULL)
        wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("bench_server: wrk is not installed and apt-get could not install it")
    return wrk


def cpu_s(pids: list[int]) -> float:
    """user + system CPU seconds of the processes so far (/proc/PID/stat), 0 for a gone one."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
STATS = "+stats"  # a row's suffix: the same way of watching, the BPF stats on while timed


@contextlib.contextmanager
def bpf_stats(on: bool) -> Iterator[bool]:
    """kernel.bpf_stats_enabled set to `on` inside, put back after; yields whether it could be
    set (root only)."""
    want = "1" if on else "0"
    try:
        was: str | None = BPF_STATS.read_text().strip()
        BPF_STATS.write_text(want)
    except OSError:
        was = None
    try:
        yield was is not None
    finally:
        if was is not None and was != want:
            BPF_STATS.write_text(was)


def runs_bpf(how: str) -> bool:
    """Whether the row's watcher runs a BPF program (the uprobe capture, in or out of process)."""
    how = how.removesuffix(STATS)
    return "uprobes" in CAPTURES.get(how, ()) or (how in SPLIT and how != "bare")


def bpf_runs(pids: list[int]) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over the BPF programs the processes hold
    (their /proc/PID/fdinfo; counted while kernel.bpf_stats_enabled is 1)."""
    ns = cnt = 0
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fdinfo")
        except OSError:
            continue
        for fd in fds:
            try:
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    text = f.read()
            except OSError:
                continue
            if "run_cnt:" in text and "prog_type:" in text:
                info = dict(ln.split(":", 1) for ln in text.splitlines() if ":" in ln)
                ns += int(info.get("run_time_ns", "0"))
                cnt += int(info.get("run_cnt", "0"))
    return ns, cnt


def load(wrk: str, port: int, duration: float, connections: int, run: Run | None = None,
         server_pids: list[int] = (), watcher_pids: list[int] = ()) -> tuple[float, str]:  # type: ignore[assignment]
    """wrk's requests/s; with `run`: the CPU the server and the watcher (gdb,
    gdbserver, the proxy) took per request while wrk ran, which a loaded
    machine disturbs far less than the throughput, and what the watcher's BPF
    program took a run."""
    s0, w0 = cpu_s(list(server_pids)), cpu_s(list(watcher_pids))
    b0 = bpf_runs(list(watcher_pids))
    res = subprocess.run([wrk, "-t1", f"-c{connections}", f"-d{duration:g}s", f"http://127.0.0.1:{port}/"],
                         capture_output=True, text=True, timeout=duration + 60, check=False)
    m = WRK_RPS.search(res.stdout)
    n = WRK_REQUESTS.search(res.stdout)
    if run is not None and n and int(n.group(1)):
        req = int(n.group(1))
        run.cpu_us = ((cpu_s(list(server_pids)) - s0) / req * 1e6, (cpu_s(list(watcher_pids)) - w0) / req * 1e6)
        b1 = bpf_runs(list(watcher_pids))
        if b1[1] > b0[1]:
            run.bpf = (b1[0] - b0[0], b1[1] - b0[1])
    return (float(m.group(1)) if m else float("nan")), res.stdout + res.stderr


def quit_server(port: int) -> None:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/quit", timeout=60).read()
    except OSError:
        pass  # the server may close the connection as it ends


def _own(text: str, run: Run) -> None:
    m = DONE.search(text)
    if m:
        run.own = (int(m.group(3)), int(m.group(4))) if m.group(3) else None
        run.requests = int(m.group(1))
        run.ok = True
    elif not run.note:
        run.note = "no 'server done' line: " + " | ".join(text.strip().splitlines()[-3:])[:200]


def _us(cell: str) -> float:
    m = re.fullmatch(r"([\d.]+)(ns|us|ms|s)", cell)
    return float(m.group(1)) * {"ns": 1e-3, "us": 1, "ms": 1e3, "s": 1e6}[m.group(2)] if m else float("nan")


def top_rows(out: str, fn: str = "conn_task") -> list[tuple[str, int, float]]:
    """(task id, polls, busy µs) of each row of `top` whose async fn matches `fn`
    (a regex: `::conn_task`, the corpus server's connection tasks; axum's
    connection task is the async block its `serve` spawns per connection)."""
    rows = []
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 7 and cols[0].startswith("#") and cols[2].isdigit() and re.search(fn, " ".join(cols[6:])):
            rows.append((cols[0], int(cols[2]), _us(cols[1])))
    return rows


def top_wake_rows(out: str, fn: str = "conn_task") -> list[tuple[str, int, float, int, int]]:
    """(task id, polls, SCHED µs, WAKES, SELF) of each row of `top` whose async fn matches `fn`,
    when top has the wake columns (docs/wakes.md)."""
    rows = []
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 11 and cols[0].startswith("#") and cols[2].isdigit() and cols[8].isdigit() \
                and cols[9].isdigit() and re.search(fn, " ".join(cols[10:])):
            rows.append((cols[0], int(cols[2]), _us(cols[6]), int(cols[8]), int(cols[9])))
    return rows


def wake_pairs(out: str, fn: str, record: Path) -> str:
    """top's SCHED, WAKES and SELF against console-subscriber's (its recording) for the same
    connection tasks, paired by poll count: one line with the sums and ratios."""
    from bench.console_record import fold

    ours = top_wake_rows(out, fn)
    con = list(fold(record).values())  # every task: ours are the connection tasks, paired by polls
    con.sort(key=lambda t: t.polls)
    left = list(con)
    pairs = []
    for o in sorted(ours, key=lambda r: r[1]):
        c = next((t for t in left if t.polls - int(t.closed) == o[1] or t.polls == o[1]), None)
        if c is not None:
            left.remove(c)
            pairs.append((o, c))
    if not pairs:
        return f"wakes: no pair (ours {len(ours)} rows, console {len(con)} tasks)"
    ow, cw = sum(o[3] for o, _ in pairs), sum(c.wakes for _, c in pairs)
    osw, csw = sum(o[4] for o, _ in pairs), sum(c.self_wakes for _, c in pairs)
    osch, csch = sum(o[2] for o, _ in pairs), sum(c.sched_ns for _, c in pairs) / 1e3
    per = sorted(round(o[3] / c.wakes, 3) for o, c in pairs if c.wakes)
    worst = min(pairs, key=lambda p: p[0][3] / p[1].wakes if p[1].wakes else 1.0)
    off = (f"; the farthest pair: ours {worst[0][0]} polls={worst[0][1]} wakes={worst[0][3]}, console "
           f"id={worst[1].task_id} polls={worst[1].polls} wakes={worst[1].wakes}")
    return (f"wakes: {len(pairs)} pairs; WAKES ours {ow:,} console {cw:,} ({ow / max(cw, 1):.3f}x, per task "
            f"{per[0] if per else '-'}..{per[-1] if per else '-'}); SELF ours {osw:,} console {csw:,}; "
            f"SCHED ours {osch / 1e3:.1f} ms console {csch / 1e3:.1f} ms ({osch / max(csch, 1e-9):.3f}x){off}")


def parse_top(out: str, fn: str = "conn_task") -> tuple[int, float] | None:
    """(polls, busy µs) summed over `top_rows`; None when there is none."""
    rows = top_rows(out, fn)
    return (sum(p for _, p, _ in rows), sum(b for _, _, b in rows)) if rows else None


def console_rows(text: str) -> list[tuple[str, int, float]]:
    """(console's task id, polls, busy µs) of each connection task in `console_stats` output.
    A dropped task's polls are console's count less one: console-subscriber counts every enter
    of the task's span, and tracing's ``Instrumented<F>`` (0.1.38+) enters it once more to drop
    the future (its ``PinnedDrop``), after the last poll. Its busy keeps that drop's time."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"task id=(\d+) loc=(\S+) polls=(\d+) busy_ns=(\d+)(?: dropped=(\d))?", line)
        if m and CONN_LOC_AXUM.search(m.group(2)):
            rows.append((m.group(1), int(m.group(3)) - (m.group(5) == "1"), int(m.group(4)) / 1000))
    return rows


@dataclass
class Match:
    """Our connection tasks paired with console-subscriber's: by poll count, the
    one figure both count exactly and independently (console's task ids are its
    span ids, ours the engine's; neither sees the other's). Tasks with the same
    count pair in order of busy time: within such a group the pairing is a
    guess, the group's sums are not."""
    pairs: list[tuple[tuple[str, int, float], tuple[str, int, float]]]
    ours_left: list[tuple[str, int, float]]
    console_left: list[tuple[str, int, float]]
    ambiguous: int  # tasks in groups of 2+ with one count


def match_tasks(ours: list[tuple[str, int, float]], console: list[tuple[str, int, float]]) -> Match:
    by: dict[int, tuple[list[tuple[str, int, float]], list[tuple[str, int, float]]]] = {}
    for r in ours:
        by.setdefault(r[1], ([], []))[0].append(r)
    for r in console:
        by.setdefault(r[1], ([], []))[1].append(r)
    m = Match([], [], [], 0)
    for _, (a, b) in sorted(by.items()):
        a.sort(key=lambda r: r[2])
        b.sort(key=lambda r: r[2])
        k = min(len(a), len(b))
        m.pairs += list(zip(a[:k], b[:k]))
        m.ambiguous += k if k > 1 else 0
        m.ours_left += a[k:]
        m.console_left += b[k:]
    return m


def same_sums(m: Match) -> tuple[int, int, float, float, list[float]]:
    """(our polls, console's, our busy µs, console's, the per-pair busy ratios sorted) over the pairs."""
    op, cp = sum(a[1] for a, _ in m.pairs), sum(b[1] for _, b in m.pairs)
    ob, cb = sum(a[2] for a, _ in m.pairs), sum(b[2] for _, b in m.pairs)
    return op, cp, ob, cb, sorted(a[2] / b[2] for a, b in m.pairs if b[2] > 0)


class Server:
    """Where the program comes from and how each way of watching starts it."""

    def __init__(self, kind: str, config: str) -> None:
        self.kind = kind
        self.config = config
        if kind == "corpus":
            self.prog = Path(build.binary(config, "http_server"))
            self.console_prog: Path | None = None
            self.conn_fn = r"::conn_task\b"
        else:
            from bench.server import build_server

            self.prog, self.console_prog = build_server.build_server(config)
            self.conn_fn = CONN_FN_AXUM
        self.args = ["0"]


def run_bare(server: Server, wrk: str, duration: float, conns: int, how: str = "bare") -> Run:
    prog = server.console_prog if how == "console" else server.prog
    run = Run(how)
    assert prog is not None
    bind = console_bind()
    proc = subprocess.Popen([str(prog), *server.args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "TOKIO_CONSOLE_BIND": bind})
    out = OutputPump(proc.stdout)
    try:
        m = out.wait_for(READY, 30)
        if not m:
            run.note = "server did not start: " + out.text()[-200:]
            return run
        port = int(m.group(1))
        run.rps, _ = load(wrk, port, duration, conns, run, [proc.pid])
        if how == "console":
            run.extra["console"] = console_figures(server, port, f"http://{bind}")
        quit_server(port)
        proc.wait(timeout=30)
        out.join()
        _own(out.text(), run)
        if how == "console":
            cf = re.search(r"console conn_polls=(\d+) conn_busy_us=(\d+)", out.text() + run.extra["console"])
            if cf:
                run.top = (int(cf.group(1)), float(cf.group(2)))
        return run
    finally:
        kill_tree(proc)


def console_bind() -> str:
    """Where console-subscriber serves its gRPC API (TOKIO_CONSOLE_BIND): a free
    port, not its default 6669, which another run on the machine may hold."""
    from integration.harness.stubs import free_port

    return f"127.0.0.1:{free_port()}"


def console_figures(server: Server, port: int, addr: str = "http://127.0.0.1:6669") -> str:
    """console-subscriber's own figures for the connection tasks, summed:
    `console conn_polls=P conn_busy_us=B tasks=N` plus its raw lines."""
    # the console_stats built beside the console server (Server built both): calling
    # build_server.console_stats would run cargo again, which rebuilds the shared target
    # when the last build came from another worktree (minutes, in the middle of a run)
    assert server.console_prog is not None
    res = subprocess.run([str(server.console_prog.parent / "console_stats"), addr], capture_output=True,
                         text=True, timeout=60, check=False)
    text = res.stdout + (f"console_stats failed: {res.stderr.strip()[:400]}" if res.returncode else "")
    rows = console_rows(text)
    polls, busy = sum(p for _, p, _ in rows), sum(b for _, _, b in rows)
    return (f"console conn_polls={polls} conn_busy_us={busy:.0f} tasks={len(rows)} (a dropped task's polls less "
            f"the span enter at its drop)\n{text}")


# SIGPIPE: console-subscriber's gRPC server writes to console_stats's closed connection; a
# stop there would take `top` at it and leave the server stopped (no 'server done' line)
GDB_SCRIPT = """set pagination off
set confirm off
set breakpoint pending on
handle SIGPIPE nostop noprint pass
target remote {address}
break _exit
continue
{after}
kill
"""
# --stop-at: gdb is interrupted while wrk runs (SIGINT: a ^C to the stub), then goes on to _exit
GDB_STOP_SCRIPT = GDB_SCRIPT.replace("continue\n", "continue\nmonitor async stats --all\ncontinue\n", 1)
STOP_AT: list[float] = []  # --stop-at F: the fraction of wrk's time at which gdb is interrupted
INTERRUPTED = re.compile(r"received signal SIGINT")
AT_EXIT = re.compile(r"Breakpoint [\d.]+, .*_exit")


def _wait_for_text(gdb: subprocess.Popen[bytes], pump: OutputPump, pattern: re.Pattern[str], t0: float,
                   limit_s: float = 300.0) -> float | None:
    """Seconds from `t0` until `pattern` shows in gdb's output (None: gdb ended
    without it, or not within `limit_s`)."""
    while time.monotonic() - t0 < limit_s:
        if pattern.search(pump.text()):
            return time.monotonic() - t0
        if gdb.poll() is not None:
            return None
        time.sleep(0.005)
    return None


def _interrupt_later(gdb: subprocess.Popen[bytes], pump: OutputPump, delay: float, run: Run) -> Any:
    """SIGINT to gdb after `delay` s (wrk still running); the client's wait for the stop into `run`."""
    import threading

    def go() -> None:
        time.sleep(delay)
        t0 = time.monotonic()
        try:
            os.kill(gdb.pid, signal.SIGINT)
        except OSError:
            return
        run.stop_s = (_wait_for_text(gdb, pump, INTERRUPTED, t0, 120.0), run.stop_s[1])

    th = threading.Thread(target=go, daemon=True)
    th.start()
    return th


@contextlib.contextmanager
def _stub_in_env(prog: Path, args: list[str], env: dict[str, str]) -> Iterator[Any]:
    """gdbserver started with `env` added to this process's environment (which it
    gives the program): set while it starts, not after (start_stub is a context
    manager: nothing starts until it is entered)."""
    was = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    cm = start_stub("gdbserver", prog, args)
    try:
        stub = cm.__enter__()
    finally:
        for k, v in was.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield stub
    finally:
        cm.__exit__(None, None, None)


def run_gdb(server: Server, wrk: str, duration: float, conns: int, how: str) -> Run:
    run = Run(how)
    after = "" if how == "gdb" else "monitor async top 64\nmonitor async stats --all"
    # console-*: the console build, console-subscriber and asyncrsp watching the same tasks
    same = how.startswith("console-")
    prog = server.console_prog if same else server.prog
    assert prog is not None
    bind = console_bind()
    env = {"TOKIO_CONSOLE_BIND": bind}
    record = Path(tempfile.mkdtemp(prefix="asyncrsp-console-")) / "record.json" if same else None
    if record is not None:  # console-subscriber's own wake figures (console_record.py)
        env["TOKIO_CONSOLE_RECORD_PATH"] = str(record)
    with _stub_in_env(prog, server.args, env) as stub:
        px_cm = start_proxy(stub.address, extra=CAPTURES[how]) if how in CAPTURES else None
        px = px_cm.__enter__() if px_cm else None
        try:
            address = px.address if px else stub.address
            stop_at = STOP_AT[0] if STOP_AT and how != "gdb" else None
            with tempfile.NamedTemporaryFile("w", suffix=".gdb", delete=False) as f:
                f.write((GDB_STOP_SCRIPT if stop_at else GDB_SCRIPT).format(address=address, after=after))
            gdb = subprocess.Popen(["gdb", "-nx", "-batch", "-x", f.name, str(prog)],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True)
            gout = OutputPump(gdb.stdout)
            try:
                m = stub.output.wait_for(READY, 120)
                if not m:
                    run.note = "server did not start: " + (stub.output_text() + gout.text())[-300:]
                    return run
                port = int(m.group(1))
                inferior = stub.find_inferior()
                watchers = [gdb.pid, stub.proc.pid] + ([px.proc.pid] if px else [])
                stopper = _interrupt_later(gdb, gout, stop_at * duration, run) if stop_at else None
                run.rps, _ = load(wrk, port, duration, conns, run, [inferior] if inferior else [], watchers)
                px_wrk = cpu_s([px.proc.pid]) if px else 0.0
                console = ""
                if same:
                    # wrk's connections closed: their tasks end within ms (console
                    # keeps a dropped task's figures). Read before /quit, whose own
                    # connection only asyncrsp then sees (it is left unmatched).
                    time.sleep(0.5)
                    console = console_figures(server, port, f"http://{bind}")
                if stopper is not None:
                    stopper.join(timeout=130)
                t_quit = time.monotonic()
                quit_server(port)
                run.stop_s = (run.stop_s[0], _wait_for_text(gdb, gout, AT_EXIT, t_quit))
                try:
                    gdb.wait(timeout=300)
                except subprocess.TimeoutExpired:
                    run.note = "gdb did not finish"
                px_end = cpu_s([px.proc.pid]) if px else 0.0
                gout.join()
                text = gout.text()
                if os.environ.get("BENCH_SERVER_SHOW"):
                    print(text)
                _own(stub.output_text(), run)
                if px and run.requests and px_end >= px_wrk:  # (0: the proxy had exited)
                    # what the CPU figures "while wrk ran" leave out: records the proxy folds
                    # after wrk (at the exit stop), and top/stats
                    after = px_end - px_wrk
                    run.after_us = 1e6 * after / run.requests
                    run.extra["after wrk"] = (f"the proxy's CPU after wrk (what was left to fold, the exit "
                                              f"stop, top, stats): {after:.2f} s, {1e6 * after / run.requests:.1f} "
                                              "us a request")
                if how in CAPTURES:
                    cap = re.search(r"capture: (\S+) \((\d+) poll events", text)
                    want = CAPTURES[how][1]
                    if cap is None or cap.group(1) != want:
                        run.ok = False
                        run.note = "capture not in use: " + " | ".join(
                            ln for ln in text.splitlines() if "capture" in ln)[:200]
                    else:
                        run.events = int(cap.group(2))
                    # stats: "events: N (enters .., exits .., lost L, ...)" and the ring's "dropped: D"
                    lost = re.search(r"^events: \d+ \(.*?lost (\d+)", text, re.M)
                    dropped = re.search(r"; dropped: (\d+)", text)
                    run.lost = max(int(lost.group(1)) if lost else 0, int(dropped.group(1)) if dropped else 0)
                    room = re.search(r"lost with the ring at most half full: \d+", text)  # not a full ring
                    if room:
                        run.extra["lost with room"] = room.group(0)
                    run.top = parse_top(text, server.conn_fn)
                    if same:
                        run.same = (top_rows(text, server.conn_fn), console_rows(console))
                        run.extra["console"] = console.split("\n", 1)[0]
                        if record is not None and record.exists():
                            run.extra["wakes"] = wake_pairs(text, server.conn_fn, record)
                        if os.environ.get("BENCH_SERVER_SHOW"):
                            print(console)
                        run.extra["console dropped"] = " ".join(re.findall(r"console dropped_events=\d+", console))
                        cost = re.search(r"capture cost subtracted: .*", text)
                        if cost:
                            run.extra["cost"] = cost.group(0)
                    for line in re.findall(r"^(?:sampl|time-sliced|tasks mode|catch-up).*$", text, re.M):
                        run.extra[line.split(":")[0]] = line
                return run
            finally:
                kill_tree(gdb)
                Path(f.name).unlink(missing_ok=True)
        finally:
            if px_cm:
                px_cm.__exit__(None, None, None)


SPLIT = ["bare", "empty", "empty-rets", "empty-norets", "traps-rets", "traps", "records", "records-changes", "consumer",
         "consumer-changes"]


def capture_target(server: Server, pid: int) -> Any:
    """What an in-process UprobeCapture plans against: the server's inventory (built
    once per Server) and a fresh engine, the process spawned stopped with ASLR off
    (spawn_stopped, as gdbserver does)."""
    from types import SimpleNamespace

    from proxy.analysis.inventory import build_inventory
    from proxy.graph.catalog import Catalog
    from proxy.graph.engine import Engine

    inv = server.__dict__.setdefault("inventory", build_inventory(str(server.prog)))
    bias = 0x555555554000 if inv.pie else 0
    return SimpleNamespace(path=str(server.prog), pid=pid, local=True, inventory=inv, bias=bias,
                           engine=Engine(Catalog(inv, bias)), note=None, extra={})


def resume_listening(pid: int, port: int) -> None:
    """Continue the server spawned stopped and wait (30 s at most) for it to listen."""
    from integration.harness.stubs import port_listening

    os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while not port_listening(port) and time.monotonic() < deadline:
        time.sleep(0.01)


def learn_return_sites(cap: Any, port: int) -> None:
    """Warm-up: the return sites of the polls made through vtables are learned and
    probed (returns.py _returns_step), as the proxy does in its first 0.5 s."""
    for _ in range(50):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).read()
    cap.returns.step(force=True)
    for th in cap.returns.closing:
        th.join()  # the rets' link closed: the int3s are out


@dataclass
class WrkTimed:
    """One wrk run against the server, with the CPU around it: this process's
    (the consumer's, when it folds), the server's and the BPF programs' this
    process holds."""
    text: str
    requests: int
    rps: float
    own_s: float
    server_s: float
    bpf: tuple[int, int]  # (run_time_ns, run_cnt) during the run

    def per_request_us(self, seconds: float) -> float:
        return seconds / max(self.requests, 1) * 1e6


def wrk_timed(wrk: str, conns: int, duration: float, port: int, pid: int,
              poll: Callable[[], Any] | None = None) -> WrkTimed:
    """wrk -t1 against the server on `port` (pid `pid`), calling `poll` every 5 ms meanwhile."""
    import resource

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    srv0 = cpu_s([pid])
    b0 = bpf_runs([os.getpid()])
    w = subprocess.Popen([wrk, "-t1", f"-c{conns}", f"-d{duration:g}s", f"http://127.0.0.1:{port}/"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while w.poll() is None:
        if poll is not None:
            poll()
        time.sleep(0.005)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    srv1 = cpu_s([pid])
    b1 = bpf_runs([os.getpid()])
    text = w.stdout.read() if w.stdout else ""
    m, req = WRK_RPS.search(text), WRK_REQUESTS.search(text)
    return WrkTimed(text=text, requests=int(req.group(1)) if req else 0,
                    rps=float(m.group(1)) if m else float("nan"),
                    own_s=(cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
                    server_s=srv1 - srv0, bpf=(b1[0] - b0[0], b1[1] - b0[1]))


def run_split(server: Server, wrk: str, duration: float, conns: int, how: str) -> Run:
    """The server under uprobe capture alone (no gdb): see `--split`."""
    import signal

    from integration.harness.stubs import free_port
    from integration.harness.uprobes import spawn_stopped

    from proxy.capture.uprobes import bpf as B
    from proxy.capture.uprobes.capture import UprobeCapture

    run = Run(how)
    port = free_port()
    pid = spawn_stopped([str(server.prog), str(port)])
    cap = None
    try:
        if how != "bare":
            target = capture_target(server, pid)
            cap = UprobeCapture(ring_bytes=(512 << 20) if how.startswith("records") else 64 << 20,
                                move_exits=how != "traps-rets", learn_returns=how not in ("traps-rets", "empty-rets"),
                                record_changes=how.endswith("-changes"))
            cap.plan(target)  # type: ignore[arg-type]
            if how == "empty-norets" and cap.plan_ is not None:
                cap.plan_.sites = [st for st in cap.plan_.sites if not (
                    st.spec.kind == B.KIND_EXIT and st.original[:1] in (b"\xc3", b"\xc2"))]
            cap.install()
            if not cap.attached:
                run.note = f"not attached: {cap.note}"
                return run
        resume_listening(pid, port)
        if cap is not None and cap._prog is not None:
            learn_return_sites(cap, port)
            if how.startswith("traps"):
                cap._prog.set_sites([B.SiteSpec(B.KIND_COUNT)] * len(cap._att_sites))
            if how.startswith("empty"):
                cap._prog.set_off(True)
        t = wrk_timed(wrk, conns, duration, port, pid,
                      poll=cap.poll if how.startswith("consumer") and cap is not None else None)
        if t.bpf[1] > 0:
            run.bpf = t.bpf
        run.rps = t.rps
        run.ok = WRK_RPS.search(t.text) is not None
        if t.requests:
            # the server's CPU, and this process's (the consumer's, when it folds) per request
            run.cpu_us = (t.per_request_us(t.server_s), t.per_request_us(t.own_s))
        if cap is not None and cap._prog is not None:
            c = cap._prog.counters()
            hits = sum(cap._prog.site_hits(list(range(len(cap.plan_.sites)))).values()) if cap.plan_ else 0
            run.events = hits
            run.lost = c.get("drops", 0)
            if how.startswith(("records", "consumer")):
                run.extra["records"] = f"records {c.get('records', 0):,} ({c.get('records', 0) / max(hits, 1):.2f} a hit)"
            if how.startswith("consumer") and cap.decoder is not None:
                folded = cap.decoder.stats.records
                used = t.own_s
                run.extra["consumer"] = (f"{folded:,} records folded while running, consumer CPU "
                                         f"{used:.2f} s = {used / max(folded, 1) * 1e6:.2f} us/record")
        return run
    finally:
        if cap is not None:
            cap.uninstall()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


RUNNERS: dict[str, Callable[[Server, str, float, int, str], Run]] = {
    "bare": run_bare, "console": run_bare, "gdb": run_gdb, "traps": run_split, "traps-rets": run_split,
    "empty": run_split, "empty-rets": run_split, "empty-norets": run_split, "records": run_split,
    "records-changes": run_split, "consumer-changes": run_split,
    "consumer": run_split,
    **{k: run_gdb for k in CAPTURES}}


def _stops(s: tuple[float | None, float | None]) -> str:
    """The client's waits for a stop reply: under wrk (--stop-at) / at the exit after wrk."""
    mid, end = s
    return (f"{mid:.2f} mid-wrk / " if mid is not None else ("- mid-wrk / " if STOP_AT else "")) + \
        (f"{end:.2f} exit" if end is not None else "- exit")


def _extra(key: str, value: str) -> str:
    return value if value.startswith(key) else f"{key}: {value}"


def _fmt_rps(v: float) -> str:
    return "-" if v != v else f"{v:,.0f}"


def report(runs: dict[str, list[Run]], rounds: int, hit: dict[str, Run] | None = None,
           window: float = 0.0) -> None:
    bare = runs.get("bare", [])
    print(f"\n{'how':14} {'requests/s per round':>36} {'median':>9} {'vs bare (range)':>20}  notes")
    for how, rs in runs.items():
        rps = [r.rps if r.ok else float("nan") for r in rs]
        good = [v for v in rps if v == v]
        med = statistics.median(good) if good else float("nan")
        ratios = [r.rps / b.rps for r, b in zip(rs, bare) if r.ok and b.ok and b.rps > 0]
        ratio = (f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})" if ratios else "-")
        notes = sorted({r.note for r in rs if r.note})
        print(f"{how:14} {' '.join(f'{_fmt_rps(v):>11}' for v in rps):>36} {_fmt_rps(med):>9} {ratio:>20}  "
              + "; ".join(n[:160] for n in notes))
    print("\nCPU per request while wrk ran (µs; server | watcher: gdb + gdbserver + proxy), median of the "
          "rounds; the ratio of the total to bare's: what watching costs in CPU, far steadier than "
          "requests/s on a loaded machine; 'proxy after wrk': the proxy's CPU a request after wrk ended "
          "(the records it had not folded yet, at the exit stop: the watcher's figure leaves it out)")
    base = [r.cpu_us for r in bare if r.cpu_us]
    base_total = statistics.median(a + b for a, b in base) if base else float("nan")
    for how, rs in runs.items():
        cs = [r.cpu_us for r in rs if r.cpu_us and r.ok]
        if not cs:
            continue
        srv = statistics.median(a for a, _ in cs)
        wat = statistics.median(b for _, b in cs)
        tot = [a + b for a, b in cs]
        bpf = [r.bpf[0] / r.bpf[1] for r in rs if r.bpf and r.ok]
        h = (hit or {}).get(how)
        hit_s = (f"  BPF ns/run {h.bpf[0] / h.bpf[1]:.0f} (the {window:g} s run with the stats on, after the rounds)"
                 if h is not None and h.bpf else "")
        after = [r.after_us for r in rs if r.after_us is not None and r.ok]
        stops = [r.stop_s for r in rs if r.ok and r.stop_s != (None, None)]
        print(f"{how:16} server {srv:8.1f}  watcher {wat:8.1f}  total {statistics.median(tot):8.1f}  "
              f"x bare {statistics.median(tot) / base_total:6.2f} (rounds: {', '.join(f'{t:.1f}' for t in tot)})"
              + (f"  BPF ns/run {statistics.median(bpf):.0f} ({', '.join(f'{b:.0f}' for b in bpf)}; the stats on "
                 "while timed)" if bpf else hit_s)
              + (f"  proxy after wrk {statistics.median(after):.1f}" if after else "")
              + (f"  stop waits (s): {', '.join(_stops(s) for s in stops)}" if stops else ""))
    print("\naccuracy (the connection tasks, summed): the tool's polls and busy time against the reference "
          "of the same round (corpus: the server's own count in the same run; axum: console-subscriber's "
          "own figures in the console run), per request and per poll (runs differ in requests)")
    print(f"{'how':16} {'round':>5} {'requests':>9} {'polls':>9} {'polls/req':>9} {'ref':>9} {'ratio':>6} "
          f"{'busy/poll':>10} {'ref':>10} {'ratio':>6} {'events':>11} {'lost':>5}")
    console = runs.get("console", [])
    for how, rs in runs.items():
        for i, r in enumerate(rs):
            if how.removesuffix(STATS) in SPLIT[1:]:
                print(f"{how:16} {i + 1:5} events {r.events or 0:,} lost {r.lost:,} "
                      + "; ".join(r.extra.values()))
                continue
            if how == "console" and r.top is not None and r.requests:
                p, b = r.top
                print(f"{how:16} {i + 1:5} {r.requests:9,} {p:9,} {p / r.requests:9.3f} {'(the reference)':>16} "
                      f"{b / p if p else 0:8.2f}us")
                continue
            if r.same is not None:
                continue  # in the same-run table below
            ref: tuple[int, float] | None = r.own
            ref_req = r.requests
            if ref is None and i < len(console) and console[i].top is not None:
                ref, ref_req = console[i].top, console[i].requests
            if r.top is None or ref is None or not r.requests or not ref_req:
                if how not in ("bare", "gdb") and r.ok:
                    ev = f"{r.events:,}" if r.events is not None else "-"
                    print(f"{how:16} {i + 1:5} {r.requests:9,} {'(no figures to compare)':>30} events {ev} lost {r.lost:,}")
                    for k, v in r.extra.items():
                        print(f"{'':16} {_extra(k, v)}")
                continue
            (tp, tb), (op, ob) = r.top, ref
            t_pr, o_pr = tp / r.requests, op / ref_req
            t_bp, o_bp = (tb / tp if tp else 0.0), (ob / op if op else 0.0)
            ev = f"{r.events:,}" if r.events is not None else "-"
            print(f"{how:16} {i + 1:5} {r.requests:9,} {tp:9,} {t_pr:9.3f} {o_pr:9.3f} {t_pr / o_pr if o_pr else 0:6.3f} "
                  f"{t_bp:8.2f}us {o_bp:8.2f}us {t_bp / o_bp if o_bp else 0:6.3f} {ev:>11} {r.lost:5}")
            for k, v in r.extra.items():
                if k not in ("console",):
                    print(f"{'':16} {_extra(k, v)}")


def report_same(runs: dict[str, list[Run]]) -> None:
    """console-*: top's figures against console-subscriber's for the very same tasks and polls."""
    rows = [(how, i, r) for how, rs in runs.items() for i, r in enumerate(rs) if r.same is not None]
    if not rows:
        return
    print("\nsame tasks, same run (console-*: the console build, console-subscriber and asyncrsp both watching): "
          "the connection tasks paired by poll count (exact in both); polls and busy summed over the pairs, "
          "busy/poll ratio ours/console, and per pair (min / median / max). console's busy: from its span's "
          "enter to its exit (tracing's dispatch and the subscriber's callbacks inside, and our probes' whole "
          "cost); ours: the resume function's entry probe to its exit probe, the capture cost subtracted")
    print(f"{'how':16} {'round':>5} {'tasks us/con':>12} {'paired':>6} {'ambig':>5} {'polls us':>9} {'con':>9} "
          f"{'busy/poll us':>12} {'con':>9} {'ratio':>6} {'per pair':>18}")
    for how, i, r in rows:
        assert r.same is not None
        ours, con = r.same
        m = match_tasks(ours, con)
        op, cp, ob, cb, per = same_sums(m)
        per_s = (f"{per[0]:.2f}/{statistics.median(per):.2f}/{per[-1]:.2f}" if per else "-")
        print(f"{how:16} {i + 1:5} {len(ours):>5}/{len(con):<6} {len(m.pairs):6} {m.ambiguous:5} {op:9,} {cp:9,} "
              f"{ob / op if op else 0:10.2f}us {cb / cp if cp else 0:7.2f}us {ob / cb if cb else 0:6.3f} {per_s:>18}")
        for what, left in (("ours", m.ours_left), ("console's", m.console_left)):
            if left:
                print(f"{'':16} unpaired {what}: " + ", ".join(f"{t} polls={p} busy={b:.0f}us" for t, p, b in left))
        for k in ("cost", "console", "console dropped", "wakes"):
            if r.extra.get(k):
                print(f"{'':16} {r.extra[k]}")
        if how.removesuffix(STATS) == "console-uprobes":
            print(f"{'':16} (full mode: console's window also holds our probes inside the task's poll, whose cost "
                  "top subtracts: bench/bench_console_window.py measures them)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=8.0, help="wrk's -d, seconds (8)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=16, help="wrk's -c (16)")
    ap.add_argument("--server", choices=["corpus", "axum"], default="corpus")
    ap.add_argument("--config", choices=["release", "debug"], default="release")
    hows_known = ORDER + SPLIT + ["console-breakpoints", "console-tracepoints"]
    ap.add_argument("--only", nargs="+", metavar="HOW", choices=hows_known + [h + STATS for h in hows_known if runs_bpf(h)],
                    help=f"ways of watching (default: all that apply); X{STATS}: X with the BPF stats on while timed")
    ap.add_argument("--stats-window", type=float, default=2.0, metavar="S",
                    help="after the rounds, each uprobes row once more for S s with the BPF stats on, for the "
                         "BPF program's ns a hit (2; 0: not run)")
    ap.add_argument("--sample", type=int, default=64, help="uprobes-sampled: --sample N (64)")
    ap.add_argument("--sample-time", type=int, default=10, help="uprobes-sliced: --sample-time PCT (10)")
    ap.add_argument("--split", action="store_true", help="where uprobe capture's cost goes (no gdb)")
    ap.add_argument("--stop-at", type=float, metavar="F",
                    help="interrupt gdb at F x --duration into wrk (e.g. 0.8) and time the client's wait for "
                         "the stop under load (printed with the exit stop's wait, after /quit)")
    args = ap.parse_args()
    if args.stop_at:
        STOP_AT.append(args.stop_at)
    wrk = ensure_wrk()
    CAPTURES["uprobes-sampled"][-1] = str(args.sample)
    CAPTURES["uprobes-sampled-rets"][-2] = str(args.sample)
    CAPTURES["uprobes-sliced"][-1] = str(args.sample_time)
    CAPTURES["uprobes-tasks-sliced"][-1] = str(args.sample_time)
    server = Server(args.server, args.config)
    hows = [h for h in (args.only or (SPLIT if args.split else ORDER))
            if not h.startswith("console") or server.console_prog is not None]
    if "bare" not in hows:
        hows.insert(0, "bare")
    print(f"server: {server.prog} ({args.server}, {args.config}); wrk -t1 -c{args.connections} "
          f"-d{args.duration:g}s; {args.rounds} interleaved rounds; load average "
          f"{os.getloadavg()[0]:.1f} at the start", flush=True)
    runs: dict[str, list[Run]] = {h: [] for h in hows}
    with bpf_stats(False) as can:  # every timed run without the stats' own cost
        if not can:
            print("note: kernel.bpf_stats_enabled cannot be set (not root): as it is, no BPF ns a hit", flush=True)
        run_rounds(server, wrk, args, hows, runs)
        hit = hit_cost_runs(server, wrk, args, hows) if can and args.stats_window > 0 else {}
    report(runs, args.rounds, hit, args.stats_window)
    report_same(runs)
    print(f"load average at the end {os.getloadavg()[0]:.1f} (2 cores)")
    return 0


def run_one(server: Server, wrk: str, duration: float, conns: int, how: str) -> Run:
    """One run of a row; X+stats: X with the BPF stats on while it runs."""
    base = how.removesuffix(STATS)
    with bpf_stats(how.endswith(STATS)):
        r = RUNNERS[base](server, wrk, duration, conns, base)
    r.how = how
    return r


def hit_cost_runs(server: Server, wrk: str, args: argparse.Namespace, hows: list[str]) -> dict[str, Run]:
    """The BPF program's ns a hit of each row that runs one (not X+stats, whose timed runs have it):
    one more run, `--stats-window` s, with the stats on; its throughput is not reported."""
    out = {}
    for how in hows:
        if how.endswith(STATS) or not runs_bpf(how):
            continue
        r = run_one(server, wrk, args.stats_window, args.connections, how + STATS)
        out[how] = r
        ns = f"{r.bpf[0] / r.bpf[1]:.0f} ns/run over {r.bpf[1]:,} runs" if r.bpf else "no BPF runs counted"
        print(f"stats on, {args.stats_window:g} s: {how:14} {ns}{' ' + r.note if r.note else ''}", flush=True)
    return out


def run_rounds(server: Server, wrk: str, args: argparse.Namespace, hows: list[str],
               runs: dict[str, list[Run]]) -> None:
    for rnd in range(args.rounds):
        for how in hows:
            t0 = time.monotonic()
            r = run_one(server, wrk, args.duration, args.connections, how)
            runs[how].append(r)
            print(f"round {rnd + 1} {how:14} {_fmt_rps(r.rps):>10} req/s "
                  f"({time.monotonic() - t0:.0f} s, load {os.getloadavg()[0]:.1f}){' ' + r.note if r.note else ''}",
                  flush=True)


if __name__ == "__main__":
    sys.exit(main())
