"""One scenario of the transparency matrix, straight and through the proxy, compared.

``check_transparent`` runs the client straight against the stub and through the
proxy, and requires equal transcripts after harness.normalise, the scenario's
evidence in the direct run (so two equally broken runs cannot pass) and the
proxy's probe really hit where the program calls it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from integration.harness.normalise import normalise_transcript
from integration.harness.scenarios import PROBES, Scenario, SessionRun, run_session
from integration.harness.stubs import STUB_TOOLS, pid_alive
from integration.harness.tools import require_tool

CLIENT_TOOLS = {"gdb": "gdb", "mi": "gdb", "lldb": "lldb"}
PROBE_HITS = re.compile(r"\bprobe hits: (\d+)")  # not "uprobe hits:"
# scenarios whose program calls probed() before the session ends
CALLS_PROBED = {"inspect", "threads", "signals", "interrupt", "kill"}


def _direct(client: str, stub: str, sc: Scenario, programs: dict[str, Path]) -> SessionRun:
    """The run straight against the stub, checked. Run again for each capture, not shared:
    the program's stack addresses depend on its environment, which holds the test's id
    (PYTEST_CURRENT_TEST), so only runs of the same test compare equal."""
    run = run_session(client, stub, sc, "direct", programs)
    _check_direct(sc, client, stub, run)
    return run


def _diff(direct: list[tuple[str, str]], proxied: list[tuple[str, str]]) -> str:
    for i, (d, p) in enumerate(zip(direct, proxied)):
        if d != p:
            return f"step {i} {d[0]!r}:\n--- direct\n{d[1]}\n--- proxy\n{p[1]}"
    return f"lengths differ: direct {len(direct)} steps, proxy {len(proxied)} steps"


def _check_program(sc: Scenario, client: str, stub: str, run: SessionRun, route: str) -> None:
    if sc.name == "detach":
        # the exit status is read as subreaper when we can get it (gdbserver's
        # detached child may be reaped out of our sight); else the output line,
        # printed only after the last call of probed, has to be there
        seen = run.text() + run.program_output
        assert run.program_exit == 0 or (
            run.program_exit is None and sc.program_output and re.search(sc.program_output, seen)), \
            f"{route}: program after detach: status {run.program_exit}, output {run.program_output!r}"
    # a pair with limited evidence stops early (see matrix): no output to check
    if sc.program_output and stub not in sc.output_lost_on and (client, stub) not in sc.evidence_limited:
        assert re.search(sc.program_output, run.text() + run.program_output), \
            f"{route}: program output {run.program_output!r}"


def _check_direct(sc: Scenario, client: str, stub: str, run: SessionRun) -> None:
    text = run.text()
    for pattern in sc.evidence_for(client, stub):
        assert re.search(pattern, text), f"direct run lacks {pattern!r}:\n{text}"
    _check_program(sc, client, stub, run, "direct")


# Known proxy gaps, each seen in a packet log and written in the README's
# known limits; not strict, so a fix shows up as XPASS.
KNOWN_PROXY_GAPS = {
    # Packet logs: QEMU 7.2 user mode blocks every thread that hits a breakpoint
    # in its own gdbstub loop, each sending a stop reply and reading the one
    # socket. The proxy now drops the extra stop replies the way gdb does
    # (rsp/connection.py drop_before_ack), but a step of one stopped thread is
    # then read by another thread's loop and never answered. gdb alone fails
    # the same way once two threads hit `break probed` at once ("The current
    # thread has terminated"); the proxy's hidden probe on probed() is such a
    # breakpoint, so this scenario meets it where the direct session does not.
    ("threads", "qemu"): "QEMU 7.2 user mode: threads hitting breakpoints at once each run their own "
                         "gdbstub loop on one socket; gdb alone fails the same way with two such threads",
    ("inspect", "qemu"): "same QEMU multi-thread breakpoint behaviour as the threads scenario",
}


def check_transparent(sc: Scenario, client: str, stub: str, programs: dict[str, Path],
                      request: pytest.FixtureRequest, probes: tuple[str, ...] = PROBES,
                      proxy_extra: tuple[str, ...] = ()) -> None:
    """Direct and proxied transcripts equal; the proxy's probe (a hidden
    breakpoint, a uprobe with --capture uprobes, or a tracepoint with
    --trace-probe) really fired."""
    require_tool(CLIENT_TOOLS[client], STUB_TOOLS[stub])
    extra = list(proxy_extra)
    capture = extra[extra.index("--capture") + 1] if "--capture" in extra[:-1] else "auto"
    if capture == "uprobes":
        from proxy.capture.uprobes import available

        why = available(None)
        if why is not None:
            pytest.skip(why)
    gap = KNOWN_PROXY_GAPS.get((sc.name, stub))
    if gap is not None:
        # Not run: the session races QEMU's per-thread gdbstub loops, fails or passes
        # by timing (2 of 6 passed in a CI run) and cost ~3 minutes of the suite in
        # gdb's timeouts; the packet logs behind the reason are in the README.
        pytest.xfail(f"not run: {gap}")
    direct = _direct(client, stub, sc, programs)
    proxied = run_session(client, stub, sc, "proxy", programs, probes, proxy_extra)

    d, p = normalise_transcript(direct.steps), normalise_transcript(proxied.steps)
    assert d == p, _diff(d, p) + f"\nproxy stderr:\n{proxied.proxy_stderr}"
    _check_program(sc, client, stub, proxied, "proxy")
    if sc.name in CALLS_PROBED:
        hits = [int(m) for s in proxied.stats for m in PROBE_HITS.findall(s)]
        assert hits and hits[-1] > 0, f"the proxy's probe never fired: {proxied.stats!r}"
    if capture == "uprobes" and proxied.stats:
        # the probe really was a uprobe: attached, and no hidden stop at all
        assert re.search(r"capture: uprobes \([^)]*, attached\)", proxied.stats[-1]), proxied.stats[-1]
        assert "hidden stops: 0" in proxied.stats[-1], proxied.stats[-1]
    assert proxied.proxy_exit == 0, f"proxy exit {proxied.proxy_exit}: {proxied.proxy_stderr}"
    if sc.name == "kill":
        assert direct.inferior_pid and not pid_alive(direct.inferior_pid)
        assert proxied.inferior_pid and not pid_alive(proxied.inferior_pid)


# What each broken entry shows when run straight against the stub.
BROKEN_SIGNS = {
    "lldb-server": r"Remote register badly formatted|unknown architecture",
    "gdbserver": r"stop reason = signal SIGTRAP",
    "interrupt": r"NO SIGNAL STOP|NO \*stopped|NO STOP|exited-normally|exited normally",
}
