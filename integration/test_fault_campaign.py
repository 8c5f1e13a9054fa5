"""A short run of the fault campaign (integration/harness/faults.py; the long
one is `scripts/fault-campaign`): gdbserver attached to the multi-thread
tokio benchmark, the proxy in front; the proxy SIGKILLed at a random moment
(breakpoint capture: the proxy's keeper, proxy/shell/keeper.py, takes its
int3s out and detaches - gdbserver 13.1 left the program to die when its
client vanished; uprobes: taken out by the kernel with the proxy's links),
then the client killed: the program runs to its normal exit with its right result
and no int3 left in its code."""

from __future__ import annotations

import random

import pytest

from integration.harness import faults
from integration.harness.tools import require_tool


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("backend", "victim"), [
    ("breakpoints", "proxy"),
    ("uprobes", "proxy"),
    ("breakpoints", "client"),
])
def test_a_killed_proxy_or_client_leaves_the_program_whole(backend: str, victim: str) -> None:
    require_tool("gdbserver")
    import sys

    sys.path.insert(0, "integration/corpus")
    import build  # type: ignore[import-not-found]

    prog = build.build(configs=["debug"], programs=["tokio_bench"])[("debug", "tokio_bench")]
    if backend == "uprobes":
        from types import SimpleNamespace

        from proxy.capture.uprobes.capture import UprobeCapture

        ok, why = UprobeCapture.available(SimpleNamespace(local=True))
        if not ok:
            pytest.skip(why)
    o = faults.one(prog, backend, victim, random.Random(5))
    assert o.ok, faults.summary([o])
