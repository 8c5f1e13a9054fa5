"""A client that does not ask for fork events, a program that forks: the child must live.

gdb with ``set remote fork-event-feature-packet off`` (or any client whose
qSupported lacks ``fork-events+``) is not told of forks, and gdbserver then
lets the child go with every int3 in its copy of the code. Before the proxy
handled this, the `forker` child died of SIGTRAP at the proxy's first hidden
breakpoint under breakpoint capture (``forker child=133``); under uprobe
capture it ran with the kernel's int3s (each call a trap for nothing). The
proxy now asks gdbserver for the fork reports itself, cleans the child as
for a reported fork, detaches it (``D;pid``) and resumes the program, hidden.
(lldb 14 asks for fork-events+ itself: it takes the reported-fork path.)
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from integration.harness import programs as cprogs
from integration.harness.gdb import gdb_cli
from integration.harness.stubs import start_proxy, start_stub
from integration.harness.uprobes import STATS, children_of, file_bytes, proc_mem, same_transcript, symbol_addr
from proxy.capture.uprobes.capture import UprobeCapture

_UPROBES, _WHY = UprobeCapture.available(None)


def _printf_line(prog_src: Path) -> int:
    for i, line in enumerate(prog_src.read_text().splitlines(), 1):
        if 'printf("forker child=' in line:
            return i
    raise AssertionError("forker.c changed")


def _run(prog: Path, capture: str | None, seen: dict[str, object]) -> list[tuple[str, str]]:
    site = symbol_addr(prog, "probed")
    line = _printf_line(Path(__file__).parent / "programs" / "forker.c")
    out: list[tuple[str, str]] = []
    with start_stub("gdbserver", prog, ["50", "fork"]) as stub:
        pid = stub.find_inferior()
        px_cm = start_proxy(stub.address, ["^probed$"], ["--capture", capture]) if capture else None
        px = px_cm.__enter__() if px_cm is not None else None

        def watch() -> None:  # the child's code while it runs its 1.5 s of calls
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    kids = children_of(pid)
                except OSError:
                    return
                if kids:
                    time.sleep(0.3)
                    try:
                        seen["child"] = proc_mem(kids[0], site, 4)
                    except OSError as err:
                        seen["child"] = f"gone: {err}"
                    return
                time.sleep(0.002)

        try:
            con = gdb_cli(prog)
            try:
                for c in ("set remote fork-event-feature-packet off", "set remote vfork-event-feature-packet off"):
                    con.cmd(c)
                con.cmd(f"target remote {px.address if px else stub.address}")
                out.append(("break", con.cmd(f"break forker.c:{line}")))
                th = threading.Thread(target=watch)
                th.start()
                out.append(("continue", con.cmd("continue")))
                th.join()
                if px is not None:
                    seen["stats"] = con.cmd(STATS)
                out.append(("next", con.cmd("next")))
                out.append(("continue", con.cmd("continue")))
            finally:
                con.close()
        finally:
            if px_cm is not None:
                px_cm.__exit__(None, None, None)
        time.sleep(0.2)
        seen["output"] = stub.output_text()
    return out


@pytest.mark.parametrize("capture", ["breakpoints", "uprobes"])
def test_fork_child_is_cleaned_for_a_client_without_fork_events(capture: str) -> None:
    if capture == "uprobes" and not _UPROBES:
        pytest.skip(_WHY)
    prog = cprogs.build("forker")
    direct: dict[str, object] = {}
    proxied: dict[str, object] = {}
    d = _run(prog, None, direct)
    p = _run(prog, capture, proxied)
    same_transcript(d, p)
    assert "forker child=0 " in str(proxied["output"]), proxied["output"]
    assert proxied["child"] == file_bytes(prog, "probed", 4)  # no int3 left in the child
    stats = str(proxied["stats"])
    assert "forks hidden from the client (children cleaned and detached): 1" in stats, stats
    m = re.search(r"^\s*probed: (\d+)", stats, re.M)
    assert m and int(m.group(1)) == 100, stats  # the parent's calls: 50 before the fork, 50 after
