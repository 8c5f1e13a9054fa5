"""Register safety on a real program: the multi-thread tokio benchmark
(corpus `tokio_bench 55 mt`: 2 worker threads, ~4,000 stops on the resume
functions) ends with no crash and the right result through asyncrsp with
hidden probes, run after run.  The same runs straight against gdbserver
(a client that sends `xmlRegisters=i386` and steps over its breakpoints the
way gdb does) report their failure rate: measured and printed, not asserted
(it depends on the CPU; ~6% here at 4,000 stops, research §2.4).

The proxy runs are parametrized by capture: ``breakpoints`` (every probe a
hidden stop: the register-safety case) and ``uprobes`` (the kernel
observes every poll, the probes are counting uprobes; no stop at all).

Run count: ASYNCRSP_REGSAFETY_RUNS (default 100) per capture; the report-only
xmlRegisters=i386 half of the straight runs: ASYNCRSP_REGSAFETY_REPORT_RUNS
(default the same).  Probe regex:
ASYNCRSP_REGSAFETY_PROBE (default: the bench's coroutine resume functions).
Captures: ASYNCRSP_REGSAFETY_CAPTURES (default "breakpoints,uprobes").
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from integration.harness import regsafety as h
from integration.harness.rspdriver import breakpoint_cycle

RUNS = int(os.environ.get("ASYNCRSP_REGSAFETY_RUNS", "100"))
ITERATIONS = "55"
PROBE = os.environ.get("ASYNCRSP_REGSAFETY_PROBE",
                       r"^tokio_bench::.*\{(async_fn|async_block|closure)")
DONE = re.compile(r"bench done n=\d+ mode=mt leaves=\d+ acc=\d+ check=ok")
CAPTURES = os.environ.get("ASYNCRSP_REGSAFETY_CAPTURES", "breakpoints,uprobes").split(",")

pytestmark = [pytest.mark.timeout(RUNS * 40 + 120),  # ~6-15 s a run under load
              pytest.mark.skipif(not h.have("gdbserver"), reason="needs gdbserver")]


@pytest.fixture(scope="module")
def bench() -> Path:
    from integration.corpus import build

    reason = build.skip_reason("debug")
    if reason is not None:
        pytest.skip(str(reason))
    return build.pinned(build.binary("debug", "tokio_bench"))  # one file for the module's runs


def resume_addresses(prog: Path) -> list[int]:
    """Entry addresses of the functions the probe regex names (demangled)."""
    nm = subprocess.run(["nm", "-C", "--defined-only", str(prog)], capture_output=True,
                        text=True, check=True).stdout
    regex = re.compile(PROBE)
    addresses = sorted({int(m.group(1), 16) for m in re.finditer(r"^([0-9a-f]+) [Tt] (.*)$", nm, re.M)
                        if regex.search(m.group(2))})
    assert addresses, f"no function matches {PROBE!r}"
    return [a + load_bias(prog) for a in addresses]


PIE_BASE_WITHOUT_ASLR = 0x555555554000  # where Linux loads a PIE when gdbserver disables ASLR


def load_bias(prog: Path) -> int:
    with prog.open("rb") as f:
        header = f.read(18)
    return PIE_BASE_WITHOUT_ASLR if header[16:18] == b"\x03\x00" else 0  # e_type ET_DYN


def _uprobes_reason() -> str | None:
    from proxy.capture.uprobes import available

    return available(None)


@pytest.mark.parametrize("capture", CAPTURES)
def test_bench_through_proxy_never_breaks(bench: Path, capture: str) -> None:
    if capture == "uprobes" and (why := _uprobes_reason()) is not None:
        pytest.skip(why)
    failures: list[str] = []
    hits: list[int] = []
    # stop once at the program's exit: `stats` says the capture really ran and counted
    commands = ["break _exit", "continue", "monitor async stats --all", "continue"]
    for run in range(RUNS):
        with h.ProxyProcess(h.gdbserver_upstream([str(bench), ITERATIONS, "mt"]),
                            ["--probe", PROBE, "--capture", capture]) as proxy:
            out = h.run_gdb(bench, f"127.0.0.1:{proxy.port}", commands, timeout=600)
        text = out + proxy.output()
        m = re.search(r"\bprobe hits: (\d+)", out)
        if m:
            hits.append(int(m.group(1)))
        if ("exited normally" not in out or not DONE.search(text) or not m or int(m.group(1)) == 0
                or f"capture: {capture} (" not in out):
            failures.append(f"run {run}: " + text)
    print(f"\nthrough asyncrsp (default register mode, --probe, --capture {capture}): "
          f"{len(failures)}/{RUNS} failed; probe hits per run {min(hits, default=0)}..{max(hits, default=0)}")
    assert not failures, "\n\n".join(failures[:5])


# The xmlRegisters=i386 half only reports (CPU-dependent, research §2.4): it
# runs ASYNCRSP_REGSAFETY_REPORT_RUNS times (default RUNS; scripts/test: 3).
REPORT_RUNS = int(os.environ.get("ASYNCRSP_REGSAFETY_REPORT_RUNS", str(RUNS)))


@pytest.mark.slow  # a report, nothing asserted about the proxy: bash scripts/test-long
def test_bench_straight_against_gdbserver_reports_failure_rate(bench: Path) -> None:
    addresses = resume_addresses(bench)
    rates = {}
    for xml in (True, False):
        failed, stops = 0, []
        runs = REPORT_RUNS if xml else RUNS
        for _ in range(runs):
            result = breakpoint_cycle([str(bench), ITERATIONS, "mt"], addresses, xml_registers=xml)
            stops.append(result.stops)
            if not re.match(rb"W0+(;|$)", result.final) or not DONE.search(result.output):
                failed += 1
        rates[xml] = failed
        print(f"\nstraight against gdbserver, {len(addresses)} breakpoints, "
              f"xmlRegisters={'i386' if xml else 'absent'}: {failed}/{runs} failed, "
              f"median {sorted(stops)[len(stops) // 2]} stops/run")
    # Reported, not asserted for the XML case (CPU-dependent); without
    # xmlRegisters no run may fail.
    assert rates[False] == 0


# ---------------------------------------------------------------- tracepoints
HASH_PROBE = r"^tokio_bench::Block::hash$"  # 6 calls an iteration: 3 leaves + 3 in the synchronous twin
DERIVE_CALLS = 12  # Block::derive an iteration: 2 per top() (workers) + 2 per top_sync (main thread), 3 each
TRACE_STATS = re.compile(r"capture: tracepoints \((\d+) poll events\)")


def test_bench_under_tracepoints_never_breaks(bench: Path) -> None:
    """Safe with several threads: the multi-thread bench under
    tracepoint capture of every resume function plus ``--trace-probe`` counting
    Block::hash inside gdbserver, while the client's own breakpoint on
    Block::derive fires on the worker threads (commands: silent, continue).
    Every run: the right result, exact counts (hash entries and rets, the
    client's hits), nothing lost, every poll exit paired with its entry;
    gdbserver's
    ``select_event_lwp`` spurious stops at tracepoint addresses are hidden
    and recorded by the proxy (their number is printed)."""
    n = int(ITERATIONS)
    failures: list[str] = []
    unpaired: list[str] = []  # runs whose engine saw exits it could not pair at once
    spurious = events = 0
    lost_runs: list[str] = []  # runs with the one hit gdbserver lost (docstring)
    script = ["break tokio_bench::Block::derive", "commands", "silent", "continue", "end",
              "break _exit", "continue", "monitor async stats --all", "info breakpoints", "continue"]
    for run in range(RUNS):
        with h.ProxyProcess(h.gdbserver_upstream([str(bench), ITERATIONS, "mt"]),
                            ["--capture", "tracepoints", "--trace-probe", HASH_PROBE]) as proxy:
            out = h.run_gdb(bench, f"127.0.0.1:{proxy.port}", script, timeout=600)
        text = out + proxy.output()
        problems: list[str] = []
        one_lost: list[str] = []  # gdbserver's lost hit (docstring): one missing count, nothing else
        if "exited normally" not in out or not DONE.search(text):
            problems.append("crashed or wrong result")
        m = TRACE_STATS.search(out)
        if not m:
            problems.append("no tracepoint stats")
        else:
            events += int(m.group(1))
        hits = re.findall(r"tokio_bench::Block::hash(?: \(ret\))?: (\d+)", out)
        if hits != [str(6 * n), str(6 * n)]:
            short = sorted(hits) == [str(6 * n - 1), str(6 * n)]
            (one_lost if short else problems).append(f"hash entries/rets {hits}, want {6 * n} each")
        derive = re.search(r"breakpoint already hit (\d+) time", out)
        if not derive or int(derive.group(1)) != DERIVE_CALLS * n:
            problems.append(f"client breakpoint hits {derive and derive.group(1)}, want {DERIVE_CALLS * n}")
        if not re.search(r"events lost: 0\b", out):
            problems.append("events lost")
        ee = re.search(r"\(enters (\d+), exits (\d+), lost 0, rejected 0\)", out)
        if not ee or ee.group(1) != ee.group(2):
            short = ee is not None and abs(int(ee.group(1)) - int(ee.group(2))) == 1
            (one_lost if short else problems).append(f"poll entries/exits {ee and ee.groups()}, want as many")
        mu = re.search(r"exits missed \(recovered by sp\): (\d+); unmatched exits: (\d+)", out)
        if not mu:
            problems.append("no engine stats")
        elif mu.group(1) != "0" or mu.group(2) != "0":
            pair = f"run {run}: {mu.group(1)} exits missed, {mu.group(2)} unmatched"
            # a lost entry leaves its exit unmatched: part of the same lost hit
            lost_entry = ((mu.group(1), mu.group(2)) in (("0", "1"), ("1", "0"))
                          and any("entries/exits" in x for x in one_lost))
            (one_lost if lost_entry else unpaired).append(pair)
        sp = re.search(r"spurious stops recorded by the proxy: (\d+)", out)
        spurious += int(sp.group(1)) if sp else 0
        if len(one_lost) > 1 + any("unmatched" in x for x in one_lost):
            problems += one_lost  # more than one hit lost in a run: not the race above
        elif one_lost and not problems:
            lost_runs.append(f"run {run}: {'; '.join(one_lost)}")
        if problems:
            failures.append(f"run {run}: {'; '.join(problems)}\n" + "\n".join(text.splitlines()[-12:]))
    print(f"\nunder tracepoints: {len(failures)}/{RUNS} failed; {events} poll events, "
          f"{spurious} spurious stops hidden and recorded by the proxy; "
          f"runs with unpaired exits: {len(unpaired)} {unpaired[:5]}; "
          f"runs with one hit lost by gdbserver: {len(lost_runs)} {lost_runs[:5]}")
    assert not failures, "\n\n".join(failures[:5])
    assert len(lost_runs) <= max(1, RUNS // 20), lost_runs
    # 6 runs in 100 had some before exited threads' tids were read signed
    assert not unpaired, unpaired
