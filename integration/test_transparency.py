"""The transparency matrix, with each capture (hidden breakpoints, uprobes).

Each scenario of harness.matrix runs once with the client straight against
the stub and once through ``python -m proxy serve --probe ^probed$
--capture C`` for each capture of ``matrix.CAPTURES``: with ``breakpoints``
the proxy really stops, hides and resumes while the client works; with
``uprobes`` a kernel uprobe sits on ``probed`` (an ``int3`` under the
client's reads, breakpoints and steps) and counts it. The two
transcripts must be equal after harness.normalise; the direct one must also
show the scenario's evidence (so two equally broken runs cannot pass), and
the proxy must really have hit its probe where the program calls it.

Client/stub pairs that fail even without the proxy are skipped with the
reason, and test_pair_fails_directly proves each such pair still fails.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from integration.harness import matrix
from integration.harness.normalise import normalise_transcript
from integration.harness.scenarios import Scenario, run_session
from integration.harness.stubs import STUB_TOOLS
from integration.harness.tools import require_tool
from integration.harness.transparency import BROKEN_SIGNS, CLIENT_TOOLS, check_transparent

def _pairs() -> list[object]:
    out = []
    for capture in matrix.CAPTURES:
        for sc in matrix.SCENARIOS:
            for client in matrix.CLIENTS:
                for stub in matrix.STUBS:
                    reason = matrix.broken_reason(client, stub, sc.name)
                    if reason:
                        reason = f"does not work without the proxy either: {reason}"
                    elif matrix.capture_reason(capture, client, stub):
                        continue  # not a pair this capture runs with (matrix.capture_reason)
                    marks = [pytest.mark.skip(reason=reason)] if reason else []
                    if reason and capture != matrix.CAPTURES[0]:
                        continue  # one skip per broken pair is enough
                    out.append(pytest.param(sc, client, stub, capture,
                                            id=f"{sc.name}-{client}-{stub}-{capture}", marks=marks))
    return out


@pytest.mark.parametrize(("sc", "client", "stub", "capture"), _pairs())
def test_transparent(sc: Scenario, client: str, stub: str, capture: str, programs: dict[str, Path],
                     request: pytest.FixtureRequest) -> None:
    check_transparent(sc, client, stub, programs, request, proxy_extra=("--capture", capture))


@pytest.mark.parametrize(("client", "stub", "scenario"), sorted(matrix.BROKEN_DIRECT))
def test_fails_directly(client: str, stub: str, scenario: str, programs: dict[str, Path]) -> None:
    """Each entry skipped in the matrix really fails without the proxy."""
    require_tool(CLIENT_TOOLS[client], STUB_TOOLS[stub])
    if scenario == "interrupt":  # a short spin: the interrupt never lands, the program ends
        sc = dataclasses.replace(matrix.INTERRUPTS, args=("3",))
        sign, good = BROKEN_SIGNS["interrupt"], matrix.INTERRUPTS.evidence[client][0]
    else:
        sc, sign, good = matrix.EXITCODE, BROKEN_SIGNS[stub], matrix.EXITCODE.evidence[client][0]
    text = run_session(client, stub, sc, "direct", programs).text()
    assert re.search(sign, text), f"{client}/{stub}/{scenario} seems to work directly now:\n{text}"
    assert not re.search(good, text), text


def test_thread_table_widths_do_not_count() -> None:
    """Pure check of normalise rule 7, with the lines of a CI failure: the proxied
    run's pid had a digit more (pid_max 32768 wraps), so gdb padded the Target Id
    column one blank wider; everything but the width still compares."""
    direct = ('  Id   Target Id                 Frame \n'
              '* 1    Thread 9876.9876 "threads"  parked (id=0) at threads.c:17\n'
              '  2    Thread 9876.9880 "worker-1" 0x00007ffff7ea4545 in __GI___clock_nanosleep ()')
    proxied = ('  Id   Target Id                  Frame \n'
               '* 1    Thread 10001.10001 "threads"   parked (id=0) at threads.c:17\n'
               '  2    Thread 10001.10005 "worker-1" 0x00007ffff7ea4545 in __GI___clock_nanosleep ()')
    d = normalise_transcript([("info threads", direct)])
    p = normalise_transcript([("info threads", proxied)])
    assert d == p, (d, p)
    other = normalise_transcript([("info threads", proxied.replace("parked (id=0)", "parked (id=1)"))])
    assert other != d  # a real difference in a row still shows
