"""A stop with an IDE's usual queries, with and without task threads, 10,000 tasks.

The corpus program `many_tasks K mt` parks K tokio tasks (waiter -> chain -> notified)
on one Notify. Each run attaches `gdbserver --attach` on loopback behind
`asyncrsp serve --mode off --tokio-adapter`, once with `--task-threads` (default cap
1024: 1024 task threads and one thread grouping the rest) and once without, and
drives gdb over gdb/MI as an IDE's debug adapter does (cpptools' MIEngine, CLion).
At each stop it sends what such an IDE sends on its own:

* `-thread-info` (the threads pane: every thread's name, details and top frame),
* `-stack-list-frames` for the stopped thread (the call stack pane; VS Code asks the
  other threads' stacks only when the user expands them: microsoft/vscode#3650, #68648),
* `-stack-list-variables --simple-values` in its frame 0 (the variables pane).

Three stops are timed: the first (`-target-select remote`, which includes loading the
program's debug info for reflection, once per session) and two later ones
(`-exec-continue`, then `-exec-interrupt`: from the interrupt to the last reply; gdb
lists the threads before it reports `*stopped`). The first resume opens the program
for the capture, so the first later stop always builds its tasks anew; the next one
may reuse them (proxy/threads/listing.py LastStop: when no byte they were read from
changed); the bench says in how many runs it did.

`--floor` also times the same stops with as many real threads (the C program
`many_threads`), attached through gdbserver alone and through asyncrsp: what gdb
itself pays for listing that many threads (its `Hg`/`g` per thread and the frame it
prints for each), which nothing in the proxy can remove.
Two more figures show what a user's clicks cost with task threads: one task thread's
stack and variables, and every thread's stack (`thread apply all bt` in an IDE).

The ratio is with / without, same run, medians of --runs.

Usage: python -m bench.bench_task_threads [--tasks 10000] [--config release] [--runs 3]
Target: with 10,000 tasks and the default cap, <= 1.5x the stop without task threads.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from integration.corpus import build
from bench.attach import attached
from integration.harness import debuggers, programs

ROOT = Path(__file__).resolve().parents[1]

GDB = debuggers.HOST  # whose gdb (--gdb); gdbserver and the proxy are always the host's


class MI:
    """gdb --interpreter=mi2 driven like an IDE's debug adapter."""

    def __init__(self, prog: Path) -> None:
        self.p = subprocess.Popen(GDB.argv("gdb", "-nx", "-q", "--interpreter=mi2", str(prog)),
                                  stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
                                  errors="replace")  # gdb 18 in a chroot may print non-UTF-8 bytes
        self.token = 100
        self.wait_for(re.compile(r"^\(gdb\)"))

    def wait_for(self, rx: re.Pattern[str], timeout: float = 900) -> list[str]:
        assert self.p.stdout is not None
        lines: list[str] = []
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            line = self.p.stdout.readline()
            if not line:
                raise SystemExit("gdb exited:\n" + "".join(lines[-30:]))
            lines.append(line)
            if rx.search(line):
                return lines
        raise SystemExit("gdb timed out:\n" + "".join(lines[-30:]))

    def cmd(self, text: str) -> str:
        assert self.p.stdin is not None
        self.token += 1
        self.p.stdin.write(f"{self.token}{text}\n")
        got = self.wait_for(re.compile(rf"^{self.token}\^(done|error|running|connected|exit)"))
        if got[-1].startswith(f"{self.token}^error"):
            raise SystemExit(f"{text}: {got[-1]}")
        return "".join(got)

    def close(self) -> None:
        try:
            self.cmd("-target-detach")
            self.cmd("-gdb-exit")
        except SystemExit:
            pass
        self.p.wait(timeout=60)


def ide_stop(mi: MI, thread: int) -> tuple[int, int]:
    """What the IDE sends at a stop: (threads listed, frames of the stopped thread)."""
    info = mi.cmd("-thread-info")
    frames = mi.cmd(f"-stack-list-frames --thread {thread}").count("frame={")
    mi.cmd(f"-stack-list-variables --thread {thread} --frame 0 --simple-values")
    return len(re.findall(r'\{id="\d+"', info)), frames


def split(log: Path, stop: int) -> tuple[float, float, float, float]:
    """(total, gdb, proxy, stub) seconds of the ``stop``-th interrupted stop (1: the later
    one) in a --log-packets file, from the client's interrupt to gdb's first read of a task
    thread's stack (the click after the stop); stop 0: from the connection to the first
    resume. gdb's time is from each reply the proxy sent it to its next packet, the stub's
    from each packet sent to the stub to its answer."""
    lines = log.read_text(errors="replace").splitlines()
    if stop == 0:  # the first: from the connection to the client's first resume
        i = 0
        end = next((j for j, ln in enumerate(lines) if " c> b'$vCont;c" in ln or " c> b'$c#" in ln), len(lines))
    else:
        starts = [i for i, ln in enumerate(lines) if " c> b'\\x03'" in ln]
        i = starts[stop - 1]
        end = next((j for j in range(i, len(lines)) if "m5a5a" in lines[j] or (j > i and " c> b'\\x03'" in lines[j])),
                   len(lines))
    ev = [(float(ln.split()[0]), ln.split()[1]) for ln in lines[i:end]]
    gdb = proxy = stub = 0.0
    for (t0, d0), (t1, d1) in zip(ev, ev[1:]):
        if d0 == "c<" and d1 == "c>":
            gdb += t1 - t0
        elif d0 == "s<":
            stub += t1 - t0
        else:
            proxy += t1 - t0
    return ev[-1][0] - ev[0][0], gdb, proxy, stub


def run_once(prog: Path, args: list[str], task_threads: bool, proxied: bool = True,
             log: Path | None = None, cap: int | None = None) -> dict[str, float]:
    # its own process group: gdbserver interrupts an attached program with kill(-pid, SIGINT)
    p = subprocess.Popen([str(prog), *args], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert "ready" in line, line
        extra = (["--mode", "off", "--tokio-adapter"] + (["--task-threads"] if task_threads else [])
                 + (["--log-packets", str(log)] if log else []))
        with attached(p.pid, extra, proxied=proxied) as at:
            return ide_session(prog, at.address, task_threads, cap)
    finally:
        p.kill()
        p.wait()


def ide_session(prog: Path, address: str, task_threads: bool, cap: int | None) -> dict[str, float]:
    """gdb over MI as an IDE drives it: the stops timed, then a detach."""
    mi = MI(prog)
    out: dict[str, float] = {}
    mi.cmd("-gdb-set pagination off")
    mi.cmd("-gdb-set mi-async on")  # -exec-interrupt while the program runs, as IDEs do
    mi.cmd("-gdb-set remotetimeout 600")
    t0 = time.perf_counter()
    stopped = mi.cmd(f"-target-select remote {address}")
    m = re.search(r'thread-id="(\d+)"', stopped)
    thread = int(m.group(1)) if m else 1
    out["threads"], out["frames"] = ide_stop(mi, thread)
    out["first"] = time.perf_counter() - t0
    if cap is not None:  # the stops after this one list `cap` task threads
        mi.cmd(f'-interpreter-exec console "monitor async threads {cap}"')
    for k in ("later", "next"):
        mi.cmd("-exec-continue")
        time.sleep(0.3)
        t1 = time.perf_counter()  # gdb reads the threads before it reports *stopped: count from the interrupt
        mi.cmd("-exec-interrupt")
        got = "".join(mi.wait_for(re.compile(r"^\*stopped")))
        m = re.search(r'thread-id="(\d+)"', got)
        thread = int(m.group(1)) if m else 1
        ide_stop(mi, thread)
        out[k] = time.perf_counter() - t1
    if task_threads:
        stats = mi.cmd('-interpreter-exec console "monitor async stats --all"')
        m = re.search(r"reused the previous stop's tasks[^:]*: (\d+)", stats)
        out["reused"] = int(m.group(1)) if m else 0
    if task_threads:
        info = mi.cmd("-thread-info")
        ids = [int(x) for x in re.findall(r'\{id="(\d+)",target-id="[^"]*",(?:details="[^"]*",)?name="task #', info)]
        t2 = time.perf_counter()
        out["task_frames"] = mi.cmd(f"-stack-list-frames --thread {ids[0]}").count("frame={")
        mi.cmd(f"-stack-list-variables --thread {ids[0]} --frame 0 --simple-values")
        out["one_task"] = time.perf_counter() - t2
    info = mi.cmd("-thread-info")
    t3 = time.perf_counter()
    for n in re.findall(r'\{id="(\d+)"', info):
        mi.cmd(f"-stack-list-frames --thread {n}")
    out["all_stacks"] = time.perf_counter() - t3
    mi.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--config", default="release")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cap", type=int, default=0,
                    help="also time the later stops with `monitor async threads CAP` sent after the first stop")
    ap.add_argument("--floor", action="store_true",
                    help="also time the same stop with as many real threads (C program many_threads), attached"
                         " through gdbserver alone and through asyncrsp: what gdb itself pays for that many threads")
    ap.add_argument("--gdb", choices=sorted(debuggers.SETS), default="host",
                    help="whose gdb drives the stops: the host's (13) or a newer one from scripts/debuggers-chroot"
                         " (trixie: 16, sid: 18); gdbserver and the proxy stay the host's")
    a = ap.parse_args()
    global GDB
    GDB = debuggers.SETS[a.gdb]
    if why := GDB.missing():
        raise SystemExit(f"bench_task_threads: --gdb {a.gdb}: {why}")
    prog = build.binary(a.config, "many_tasks")
    threads_prog = programs.build("many_threads")
    with_tt, without, floor, floor_proxy, capped = [], [], [], [], []
    for _ in range(a.runs):  # interleaved: the same load for all
        without.append(run_once(prog, [str(a.tasks), "mt"], False))
        with_tt.append(run_once(prog, [str(a.tasks), "mt"], True))
        if a.cap:
            capped.append(run_once(prog, [str(a.tasks), "mt"], True, cap=a.cap))
        if a.floor:
            n = int(with_tt[-1]["threads"])
            floor.append(run_once(threads_prog, [str(n)], False, proxied=False))
            floor_proxy.append(run_once(threads_prog, [str(n)], False))
    if a.floor:
        log = Path(tempfile.mkdtemp()) / "packets.log"
        run_once(prog, [str(a.tasks), "mt"], True, log=log)
        parts = [split(log, k) for k in (0, 1, 2)]

    def med(rs: list[dict[str, float]], k: str) -> float:
        return statistics.median(r[k] for r in rs)

    print(f"gdb {GDB.gdb} ({GDB.name});"
          f" many_tasks {a.tasks} mt ({a.config}), gdbserver --attach on loopback, asyncrsp --mode off"
          f" --tokio-adapter; an IDE's stop over gdb/MI (-thread-info, the stopped thread's"
          f" -stack-list-frames and -stack-list-variables); medians of {a.runs}")
    for label, rs in (("without task threads", without), ("with --task-threads", with_tt)):
        print(f"  {label:22} later stop {med(rs, 'later'):6.3f} s, the next {med(rs, 'next'):6.3f} s,"
              f" first stop (connect) {med(rs, 'first'):6.3f} s;"
              f" {med(rs, 'threads'):.0f} threads; every thread's stack {med(rs, 'all_stacks'):.3f} s")
    print(f"  with: the next stop reused the later stop's tasks (nothing they were read from changed) in"
          f" {sum(1 for r in with_tt if r.get('reused'))} of {len(with_tt)} runs")
    print(f"  with: one task thread's stack ({med(with_tt, 'task_frames'):.0f} frames) and variables"
          f" {med(with_tt, 'one_task'):.3f} s")
    for k, label in (("later", "later stop"), ("next", "the next stop"), ("first", "first stop")):
        ratio = med(with_tt, k) / med(without, k)
        print(f"  ratio with / without, {label}: {ratio:.2f}  (target <= 1.5: {'met' if ratio <= 1.5 else 'NOT met'})")
    if capped:
        print(f"  with `monitor async threads {a.cap}`: later stop {med(capped, 'later'):6.3f} s"
              f" ({med(capped, 'later') / med(without, 'later'):.2f}x without), the next {med(capped, 'next'):6.3f} s"
              f" ({med(capped, 'next') / med(without, 'next'):.2f}x without)")
    if floor:
        print("where a stop with task threads goes (one more run, its packets logged with times; the log slows"
              " the proxy): the first from the connection to the first resume, the later ones from the interrupt to"
              " the first task stack read")
        for (total, gdb_s, proxy_s, stub_s), label in zip(parts, ("first stop", "later stop", "the next")):
            print(f"  {label:10} {total:6.3f} s: gdb {gdb_s:6.3f} s ({gdb_s / total:.0%}), asyncrsp {proxy_s:6.3f} s,"
                  f" gdbserver {stub_s:6.3f} s")
        # What no proxy change can go under: gdb's and gdbserver's own time in the stop with task
        # threads, against the whole stop without them (the logged run is slower, so this is rough).
        for (total, gdb_s, proxy_s, stub_s), k in zip(parts[1:], ("later", "next")):
            print(f"  {k} stop with asyncrsp's own time at zero: >= {(gdb_s + stub_s) / med(without, k):.1f}x"
                  f" the stop without task threads")
        print(f"the floor: many_threads {med(floor, 'threads'):.0f} (as many real threads as the task threads"
              f" run listed), the same IDE stop")
        for label, rs in (("gdbserver alone", floor), ("through asyncrsp", floor_proxy)):
            print(f"  {label:22} later stop {med(rs, 'later'):6.3f} s, the next {med(rs, 'next'):6.3f} s,"
                  f" first stop (connect) {med(rs, 'first'):6.3f} s;"
                  f" {med(rs, 'threads'):.0f} threads; every thread's stack {med(rs, 'all_stacks'):.3f} s")
        for k, label in (("later", "later stop"), ("next", "the next stop"), ("first", "first stop")):
            print(f"  task threads / real threads through gdbserver alone, {label}:"
                  f" {med(with_tt, k) / med(floor, k):.2f}; through asyncrsp: {med(with_tt, k) / med(floor_proxy, k):.2f}")


if __name__ == "__main__":
    main()
