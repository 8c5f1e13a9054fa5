"""The benches' one way to put a running program behind gdbserver and the proxy.

`gdbserver --once --attach` on loopback (the test harness's starter, so the benches and
the tests start stubs alike), and `asyncrsp serve` in front of it unless `proxied` is
False. The client detaching ends both; leaving the block waits for the proxy's own
exit first (a `cProfile` run writes its profile only then), then ends whatever is left.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from integration.harness.stubs import start_proxy, start_stub


@dataclass
class Attached:
    address: str      # where the client connects: the proxy, or gdbserver itself
    proxy_pid: int | None


@contextlib.contextmanager
def attached(pid: int, extra: Sequence[str] = (), profile: str | None = None,
             proxied: bool = True) -> Iterator[Attached]:
    """``with attached(p.pid, ["--mode", "off"]) as at: gdb ... target remote {at.address}``.
    `profile`: run the proxy under cProfile, writing ``PROFILE.<pid>``."""
    with start_stub("gdbserver", Path(f"/proc/{pid}/exe"), attach=pid) as stub:
        if not proxied:
            yield Attached(stub.address, None)
            return
        interp = ["-m", "cProfile", "-o", f"{profile}.{pid}"] if profile else []
        with start_proxy(stub.address, extra=extra, interp=interp) as px:
            yield Attached(px.address, px.proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                px.wait(timeout=60)
