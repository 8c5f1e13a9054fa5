"""Acceptance, issue 2, bullet 1: the transparency matrix.

Each scenario of harness.matrix runs once with the client straight against
the stub and once through ``python -m proxy serve --probe ^probed$`` (so the
proxy really stops, hides and resumes while the client works). The two
transcripts must be equal after harness.normalise; the direct one must also
show the scenario's evidence (so two equally broken runs cannot pass), and
the proxy must really have hit its probe where the program calls it.

Client/stub pairs that fail even without the proxy are skipped with the
reason, and test_pair_fails_directly proves each such pair still fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from integration.harness import matrix
from integration.harness.normalise import normalise_transcript
from integration.harness.scenarios import Scenario, SessionRun, run_session
from integration.harness.stubs import STUB_TOOLS, pid_alive
from integration.harness.tools import require_tool

CLIENT_TOOLS = {"gdb": "gdb", "mi": "gdb", "lldb": "lldb"}
PROBE_HITS = re.compile(r"probe hits: (\d+)")
# scenarios whose program calls probed() before the session ends
CALLS_PROBED = {"inspect", "threads", "signals", "interrupt", "kill"}


def _pairs() -> list[object]:
    out = []
    for sc in matrix.SCENARIOS:
        for client in matrix.CLIENTS:
            for stub in matrix.STUBS:
                marks = []
                reason = matrix.BROKEN_DIRECT.get((client, stub))
                if reason:
                    marks.append(pytest.mark.skip(reason=f"does not work without the proxy either: {reason}"))
                out.append(pytest.param(sc, client, stub, id=f"{sc.name}-{client}-{stub}", marks=marks))
    return out


def _diff(direct: list[tuple[str, str]], proxied: list[tuple[str, str]]) -> str:
    for i, (d, p) in enumerate(zip(direct, proxied)):
        if d != p:
            return f"step {i} {d[0]!r}:\n--- direct\n{d[1]}\n--- proxy\n{p[1]}"
    return f"lengths differ: direct {len(direct)} steps, proxy {len(proxied)} steps"


def _check_direct(sc: Scenario, client: str, run: SessionRun) -> None:
    text = run.text()
    for pattern in sc.evidence[client]:
        assert re.search(pattern, text), f"direct run lacks {pattern!r}:\n{text}"
    if sc.program_output:
        assert re.search(sc.program_output, text + run.program_output), run.program_output


@pytest.mark.parametrize(("sc", "client", "stub"), _pairs())
def test_transparent(sc: Scenario, client: str, stub: str, programs: dict[str, Path]) -> None:
    require_tool(CLIENT_TOOLS[client], STUB_TOOLS[stub])
    direct = run_session(client, stub, sc, "direct", programs)
    _check_direct(sc, client, direct)
    proxied = run_session(client, stub, sc, "proxy", programs)

    d, p = normalise_transcript(direct.steps), normalise_transcript(proxied.steps)
    assert d == p, _diff(d, p) + f"\nproxy stderr:\n{proxied.proxy_stderr}"
    if sc.program_output:
        assert re.search(sc.program_output, proxied.text() + proxied.program_output), \
            f"program output through the proxy: {proxied.program_output!r}"
    if sc.name in CALLS_PROBED:
        hits = [int(m) for s in proxied.stats for m in PROBE_HITS.findall(s)]
        assert hits and hits[-1] > 0, f"the proxy's probe never fired: {proxied.stats!r}"
    assert proxied.proxy_exit == 0, f"proxy exit {proxied.proxy_exit}: {proxied.proxy_stderr}"
    if sc.name == "kill":
        assert direct.inferior_pid and not pid_alive(direct.inferior_pid)
        assert proxied.inferior_pid and not pid_alive(proxied.inferior_pid)


# What each broken pair prints when run straight against the stub.
BROKEN_SIGNS = {
    ("gdb", "lldb-server"): r"Remote register badly formatted|unknown architecture",
    ("mi", "lldb-server"): r"Remote register badly formatted|unknown architecture",
    ("lldb", "gdbserver"): r"stop reason = signal SIGTRAP",
}


@pytest.mark.parametrize(("client", "stub"), sorted(matrix.BROKEN_DIRECT))
def test_pair_fails_directly(client: str, stub: str, programs: dict[str, Path]) -> None:
    """Each pair skipped in the matrix really fails without the proxy."""
    require_tool(CLIENT_TOOLS[client], STUB_TOOLS[stub])
    run = run_session(client, stub, matrix.EXITCODE, "direct", programs)
    text = run.text()
    assert re.search(BROKEN_SIGNS[(client, stub)], text), \
        f"{client} with {stub} seems to work directly now; un-skip it:\n{text}"
    assert not re.search(matrix.EXITCODE.evidence[client][0], text)
