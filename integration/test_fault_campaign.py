"""A short run of the fault campaign (integration/harness/faults.py; the long
one is `scripts/fault-campaign`): gdbserver attached to the multi-thread
tokio benchmark, the proxy in front; the proxy SIGKILLed at a random moment
(breakpoint capture: the proxy's keeper, proxy/shell/keeper.py, takes its
int3s out and detaches - gdbserver 13.1 left the program to die when its
client vanished; uprobes: taken out by the kernel with the proxy's links),
then the client killed: the program runs to its normal exit with its right result
and no int3 left in its code. Then the stub killed: the proxy exits saying
so (the program's fate is gdbserver's; a program gdbserver's death left
stopped is not waited for, faults._left_stopped)."""

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
    _one(backend, victim)


@pytest.mark.timeout(300)
def test_a_killed_stub_ends_the_proxy_with_its_reason() -> None:
    o = _one("breakpoints", "stub")
    assert "session ended: stub disconnected" in o.proxy_said


def _one(backend: str, victim: str) -> faults.Outcome:
    require_tool("gdbserver")
    from integration.corpus import build

    prog = build.pinned(build.build(configs=["debug"], programs=["tokio_bench"])[("debug", "tokio_bench")])
    if backend == "uprobes":
        from types import SimpleNamespace

        from proxy.capture.uprobes.capture import UprobeCapture

        ok, why = UprobeCapture.available(SimpleNamespace(local=True))
        if not ok:
            pytest.skip(why)
    o = faults.one(prog, backend, victim, random.Random(5))
    assert o.ok, faults.summary([o])
    return o


def test_a_program_left_stopped_is_told_from_a_running_one() -> None:
    """A SIGKILLed gdbserver can leave its program group-stopped with no
    tracer (a SIGSTOP of gdbserver's delivered once nobody traces it): a run
    does not wait 120 s for it to end (faults._wait_exit_or_stop)."""
    import os
    import signal
    import subprocess

    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert not faults._left_stopped(proc.pid)
        os.kill(proc.pid, signal.SIGSTOP)
        assert faults._wait_exit_or_stop(proc, 10, settle=0.2)
        os.kill(proc.pid, signal.SIGCONT)
        assert not faults._wait_exit_or_stop(proc, 0.5)
    finally:
        proc.kill()
        proc.wait()
