"""Faults at any moment (scripts/fault-campaign, integration/test_fault_campaign.py).

The multi-thread tokio benchmark runs on its own; gdbserver attaches to it
(``--once --attach``), the proxy sits in front with one capture backend, and
a raw client lets the program run (``vCont;c``) - or asks for a stop and a
`monitor async tasks` now and then. At a random moment one of the three is
SIGKILLed:

* the proxy: gdbserver loses its client and detaches, taking its
  breakpoints and trace points out; the kernel takes the uprobes out with the
  proxy's links. The program must run to its normal exit with its right
  result, with no int3 left in its code;
* the client: the proxy takes its probes out, says why it ends, and exits;
  the program runs to its normal exit, no int3 left;
* the stub: the proxy says the stub is gone and exits (the program's fate is
  gdbserver's: reported, not judged). A SIGKILLed gdbserver can leave the
  program group-stopped (state T, no tracer): a SIGSTOP gdbserver had sent
  to stop a thread, or the one of its attach, is delivered once no tracer
  takes it. A run does not wait for such a program (it never ends on its
  own): its int3s are read while it is stopped, then a SIGCONT shows how it
  would end (reported as `stopped`).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from integration.harness.fuzzclient import Link, Gone, Hang, stray_int3
from integration.harness.stubs import OutputPump, kill_tree, spawn_proxy

AT_ENTRY = 9


def _bias(pid: int, prog: Path) -> int:
    from elftools.elf.elffile import ELFFile

    data = Path(f"/proc/{pid}/auxv").read_bytes()
    entry = next(int.from_bytes(data[i + 8:i + 16], "little") for i in range(0, len(data) - 15, 16)
                 if int.from_bytes(data[i:i + 8], "little") == AT_ENTRY)
    with open(prog, "rb") as fh:
        return entry - ELFFile(fh).header["e_entry"]


@dataclass
class Outcome:
    backend: str
    victim: str
    delay: float
    program_exit: int | None
    program_ok: bool
    stray: int
    proxy_exit: int | None
    proxy_said: str
    note: str = ""
    stopped: bool = False  # left group-stopped (T) with no tracer; its exit is the one after a SIGCONT
    elapsed: float = 0.0
    straight: bool = False  # no proxy: a baseline, reported, never failed

    def line(self) -> str:
        return (f"  {self.backend} {self.victim}{' straight' if self.straight else ''} at {self.delay:.2f} s: {'ok' if self.ok else 'FAILED'} "
                f"(program exit {self.program_exit}{' check=ok' if self.program_ok else ''}, stray {self.stray}"
                f"{', left stopped' if self.stopped else ''}; {self.elapsed:.1f} s){self.note}")

    @property
    def ok(self) -> bool:
        if self.straight:
            return True
        if self.victim == "stub":
            return self.proxy_exit is not None and "stub" in self.proxy_said
        clean_proxy = self.victim == "proxy" or (self.proxy_exit is not None and "Traceback" not in self.proxy_said)
        return (self.program_exit == 0 and self.program_ok and self.stray == 0 and clean_proxy
                and not self.stopped)


def _left_stopped(pid: int) -> bool:
    """Every thread of ``pid`` in a group stop (``T``, not a tracing stop
    ``t``) and no tracer: nobody will ever resume it."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        if "\nTracerPid:\t0\n" not in status:
            return False
        states = [Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0]
                  for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return False
    return bool(states) and all(s == "T" for s in states)


def _wait_exit_or_stop(proc: subprocess.Popen[bytes], timeout: float, settle: float = 1.0) -> bool:
    """Wait until ``proc`` exits (False) or stays left stopped for ``settle``
    seconds (True); False on timeout too (the caller's wait tells)."""
    deadline = time.monotonic() + timeout
    since = None
    while time.monotonic() < deadline and proc.poll() is None:
        if _left_stopped(proc.pid):
            since = since or time.monotonic()
            if time.monotonic() - since >= settle:
                return True
        else:
            since = None
        time.sleep(0.05)
    return False


def breakpoint_sites(prog: Path) -> list[int]:
    """The file addresses where the breakpoint capture plants its probes
    (proxy/capture/breakpoints.py `plan`: every resume function's entry, rets
    and unwind exits)."""
    from proxy.analysis.inventory import build_inventory

    return sorted({a for fn in build_inventory(prog).resume_fns if fn.low_pc
                   for a in (fn.low_pc, *fn.rets, *fn.other_exits)})


def _straight(link: Link, backend: str, sites: list[int], bias: int, deadline: float) -> None:
    """No proxy: the client plants `Z0`s (or plain trap tracepoints) at
    `sites` itself and continues after each hit until `deadline` (a baseline
    of what gdbserver's own death does to the program)."""
    if backend == "tracepoints" and sites:
        link.request(b"QTinit")
        for n, a in enumerate(sites, 1):
            link.request(b"QTDP:%x:%x:E:0:0" % (n, a + bias))
        link.request(b"QTStart")
    else:
        for a in sites:
            link.request(b"Z0,%x,1" % (a + bias))
    link.send(b"vCont;c")
    while time.monotonic() < deadline:
        try:
            stop = link.read_packet(patience=max(0.01, min(0.1, deadline - time.monotonic())))
        except Hang:
            continue
        if stop[:1] in (b"T", b"S"):
            link.send(b"vCont;c")


def _run_until(link: Link, rng: random.Random, deadline: float) -> None:
    """Let the program run through the proxy until `deadline`, with now and
    then a stop, a graph question and a continue."""
    link.send(b"vCont;c")
    while time.monotonic() < deadline:
        time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))
        if rng.random() < 0.3 and time.monotonic() < deadline:
            link.send_raw(b"\x03")
            link.read_packet()
            link.request(b"qRcmd," + b"async tasks".hex().encode())
            link.send(b"vCont;c")


def one(prog: Path, backend: str, victim: str, rng: random.Random, iterations: int = 20000,
        straight: bool = False, proxy_args: tuple[str, ...] = ()) -> Outcome:
    """One run. `straight`: no proxy (`victim` must be "stub"); the client
    plants the breakpoint capture's sites itself, as `Z0`s ("breakpoints")
    or as gdbserver's plain trap tracepoints ("tracepoints"), or nothing
    ("none")."""
    # Its own process group, as a shell job has: gdbserver 13.1 interrupts
    # (0x03) with a kill of the program's process group, and an attached
    # program that leads none never stops ("Sending SIGINT to process group of
    # pid N failed": the raw client waited 30 s for a stop with uprobes, the
    # one backend without stops of its own to end the wait).
    bench = subprocess.Popen([str(prog), str(iterations), "mt"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    out = OutputPump(bench.stdout)
    gs = subprocess.Popen(["gdbserver", "--once", "--attach", "127.0.0.1:0", str(bench.pid)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          start_new_session=True)
    gout = OutputPump(gs.stdout)
    px = None
    link = None
    delay = rng.uniform(0.05, 2.0)
    note = ""
    try:
        m = gout.wait_for(re.compile(rb"Listening on port (\d+)"), 15)
        if not m:
            raise RuntimeError(f"gdbserver did not attach: {gout.text()!r}")
        stub_address = f"127.0.0.1:{m.group(1).decode()}"
        if not straight:
            px = spawn_proxy(stub_address, extra=["--capture", backend, *proxy_args])
        link = Link(px.address if px is not None else stub_address, 30)
        link.request(b"qSupported:multiprocess+;swbreak+;hwbreak+;fork-events+;vContSupported+")
        link.request(b"?")
        if straight:
            sites = breakpoint_sites(prog) if backend != "none" else []
            _straight(link, backend, sites, _bias(bench.pid, prog), time.monotonic() + delay)
        else:
            _run_until(link, rng, time.monotonic() + delay)
    except (Gone, Hang, RuntimeError, OSError) as err:
        note = f"before the fault: {err}"
    try:
        if victim == "proxy" and px is not None:
            os.killpg(px.proc.pid, signal.SIGKILL)
        elif victim == "client" and link is not None:
            link.close()
        elif victim == "stub":
            os.killpg(gs.pid, signal.SIGKILL)
    except OSError:
        pass
    proxy_exit = None
    if px is not None:
        try:
            proxy_exit = px.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            note += " the proxy did not exit"
    try:
        gs.wait(timeout=30)
    except subprocess.TimeoutExpired:
        note += " gdbserver did not exit"
    stray = 0

    def read_stray() -> int:
        if bench.poll() is None:
            try:
                return len(stray_int3(bench.pid, prog, _bias(bench.pid, prog)))
            except (OSError, StopIteration):
                pass
        return 0

    stray = read_stray()
    stopped = _wait_exit_or_stop(bench, 120)
    if stopped:
        stray = max(stray, read_stray())
        note += " left stopped (T, no tracer); exit after a SIGCONT"
        with contextlib.suppress(OSError):
            os.kill(bench.pid, signal.SIGCONT)
    try:
        code = bench.wait(timeout=120)
    except subprocess.TimeoutExpired:
        code = None
        bench.kill()
    out.join(5)
    said = ""
    if px is not None:
        px.close()
        said = px.stderr_text()
    kill_tree(gs)
    ok = "check=ok" in out.text()
    return Outcome(backend, victim, delay, code, ok, stray, proxy_exit, said, note, stopped, straight=straight)


def campaign(prog: Path, backends: list[str], victims: list[str], runs: int, seed: int,
             progress=None, straight: bool = False,
             proxy_args: tuple[str, ...] = ()) -> list[Outcome]:  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    out = []
    for backend in backends:
        for victim in victims:
            for _ in range(runs):
                t0 = time.monotonic()
                o = one(prog, backend, victim, rng, straight=straight, proxy_args=proxy_args)
                o.elapsed = time.monotonic() - t0
                out.append(o)
                if progress is not None:
                    progress(o)
    return out


def summary(outcomes: list[Outcome]) -> str:
    lines = []
    keys = sorted({(o.backend, o.victim) for o in outcomes})
    for b, v in keys:
        group = [o for o in outcomes if (o.backend, o.victim) == (b, v)]
        bad = [o for o in group if not o.ok]
        exits = sum(o.program_exit == 0 and o.program_ok for o in group)
        strays = sum(o.stray for o in group)
        stopped = sum(o.stopped for o in group)
        where = " (straight, no proxy)" if group[0].straight else ""
        lines.append(f"  {b:12s} {v:6s} kill{where}: {len(group)} runs, {len(bad)} failed; program exit 0 with check=ok "
                     f"in {exits}; stray int3 {strays}" + (f"; left stopped {stopped}" if stopped else ""))
        for o in bad[:3]:
            said = o.proxy_said.strip().splitlines()[-1:] if o.proxy_said else []
            lines.append(f"    FAILED at {o.delay:.2f} s: program exit {o.program_exit} ok={o.program_ok} "
                         f"stray={o.stray} proxy exit {o.proxy_exit} {said} {o.note}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:  # pragma: no cover - scripts/fault-campaign
    import argparse

    from integration.corpus import build

    ap = argparse.ArgumentParser(prog="fault-campaign")
    ap.add_argument("--runs", type=int, default=10, help="runs per backend and victim")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--backends", default="breakpoints,tracepoints,uprobes")
    ap.add_argument("--victims", default="proxy,client,stub")
    ap.add_argument("--straight", action="store_true",
                    help="no proxy, the stub killed: the client plants the breakpoint capture's sites itself "
                         "as Z0s (--backends breakpoints), as trap tracepoints (tracepoints) or nothing "
                         "(none); a baseline")
    ap.add_argument("--proxy-arg", action="append", default=[],
                    help="one more argument for the proxy (e.g. --proxy-arg=--remote); repeatable")
    a = ap.parse_args(argv)
    if a.straight:
        a.victims = "stub"
        if a.backends == ap.get_default("backends"):
            a.backends = "none,breakpoints,tracepoints"

    prog = build.pinned(build.build(configs=["debug"], programs=["tokio_bench"])[("debug", "tokio_bench")])
    t0 = time.monotonic()
    res = campaign(prog, a.backends.split(","), a.victims.split(","), a.runs, a.seed,
                   progress=lambda o: print(o.line(), flush=True), straight=a.straight,
                   proxy_args=tuple(a.proxy_arg))
    bad = sum(not o.ok for o in res)
    print(f"fault-campaign seed={a.seed}: {len(res)} runs in {time.monotonic() - t0:.0f} s, {bad} failed")
    print(summary(res))
    return 1 if bad else 0
