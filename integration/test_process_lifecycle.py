"""A program killed from outside while gdb holds it stopped: the same end as straight.

gdb removes its breakpoints at every stop; the proxy keeps a remove in gdbserver until
the next packet that is not a read (proxy/session/breakpoints.py: gdb's removes and
re-inserts around each step then cost nothing). A program killed in that moment made
the kept remove reach gdbserver after the death: gdbserver 13.1 answered it E01 and
then failed an assertion at gdb's `continue` (linux-low.cc:3977, resume_one_lwp_throw:
"Remote connection closed"), where straight gdb sees the program end with SIGKILL
(GDB's own gdb.threads/killed-outside.exp, through the proxy). The proxy now sends the
kept removes once the client is quiet for a moment (proxy/shell/link.py, LINGER_IDLE).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from integration.harness import programs as cprogs
from integration.harness.gdb import gdb_cli
from integration.harness.stubs import start_proxy, start_stub
from integration.harness.uprobes import same_transcript


def _run(prog: Path, through_proxy: bool) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    with start_stub("gdbserver", prog) as stub:
        pid = stub.find_inferior()
        assert pid is not None
        cm = start_proxy(stub.address, [], ["--capture", "breakpoints"]) if through_proxy else None
        px = cm.__enter__() if cm is not None else None
        try:
            with gdb_cli(prog) as con:
                con.cmd(f"target remote {px.address if px is not None else stub.address}")
                out.append(("break", con.cmd("break parked")))
                out.append(("continue", con.cmd("continue")))
                out.append(("delete", con.cmd("delete breakpoints")))  # removed at the stop, as always
                out.append(("print", con.cmd("print release")))
                time.sleep(0.2)  # a person at the prompt
                os.kill(pid, signal.SIGKILL)
                time.sleep(0.2)
                out.append(("continue", con.cmd("continue", timeout=20)))
        finally:
            if cm is not None:
                cm.__exit__(None, None, None)
    return out


def test_a_program_killed_at_a_stop_ends_as_it_does_straight() -> None:
    prog = cprogs.build("threads")
    direct = _run(prog, through_proxy=False)
    assert "SIGKILL" in direct[-1][1], direct[-1][1]  # what gdb shows straight
    proxied = _run(prog, through_proxy=True)
    same_transcript(direct, proxied)
