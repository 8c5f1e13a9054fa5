"""A short run of the seeded fuzzing client (integration/harness/fuzzclient.py;
the long campaign is `scripts/fuzz-client`): through the proxy in front of
real gdbserver, the multi-thread tokio benchmark survives 500 packets of
every family (mutants, framing faults, interrupts), then runs to its normal
exit with its right result and no int3 left; straight against gdbserver the
same stream kills it."""

from __future__ import annotations

import pytest

from integration.harness import fuzzclient
from integration.harness.tools import require_tool


@pytest.mark.timeout(240)
def test_fuzz_client_through_the_proxy_the_program_survives() -> None:
    require_tool("gdbserver")
    res = fuzzclient.run(500, seed=11, timeout=30)
    report = fuzzclient.report(res, 11, False)
    assert res.ok, report
    assert res.figures.refused_ok == res.figures.refused_expected > 0, report
    assert res.detach_reply == b"OK" and not res.stray, report


@pytest.mark.timeout(240)
def test_fuzz_client_straight_kills_gdbserver() -> None:
    require_tool("gdbserver")
    res = fuzzclient.run(500, seed=11, straight=True, timeout=30)
    report = fuzzclient.report(res, 11, True)
    assert not res.ok, report
    assert res.figures.crash is not None and "check=ok" not in res.program_output, report
