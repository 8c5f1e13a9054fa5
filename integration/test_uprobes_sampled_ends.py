"""Tasks that end in a poll the sampling kernel does not record (uprobe capture).

While the kernel samples (catchup.py: one root poll in N recorded; `--sample`), the
poll a task completes in is most often not recorded: the engine never sees it end.
At the stop its memory no longer holds it (freed, or a new task not yet polled at
its address), and the snapshot showed it as a live task `not yet polled` with the
POLLS of the task that was there: a ghost, until a new task's first poll at the
address superseded it.
"""

from __future__ import annotations

import http.client
import os
import signal
import time
from typing import Any

import pytest

from integration.harness.monitor import corpus_binary
from integration.harness.uprobes import AVAILABLE, WHY, EntryCounting, http_server_session
from proxy.analysis.inventory import build_inventory
from proxy.capture.uprobes.capture import UprobeCapture
from proxy.graph.catalog import Catalog
from proxy.snapshot import SnapshotInputs, build_snapshot

pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY)


@pytest.mark.parametrize("config", ["debug", "release"])
def test_connections_closed_while_sampled_are_not_shown_live(config: str) -> None:
    """The keep-alive http_server under a 0.1% CPU budget (the fold held: the kernel
    samples one root poll in 64): 2 connections kept open, 24 more that each make a
    few requests and close while the kernel samples. At the stop (the closes served,
    SIGSTOP, `sync`, the engine's state reads answered from memory as the session
    does) the program has 2 connections: the snapshot's live `conn_task`s are those 2,
    none of them `not yet polled` (a task the kernel counted polls of), and the other
    24 are finished. Before, ~20 of the closed ones were shown live and `not yet
    polled`, with the POLLS of the connection that had been there."""
    prog = corpus_binary(config, "http_server")
    inv = build_inventory(str(prog))
    bias = 0x555555554000 if inv.pie else 0
    eng = EntryCounting(Catalog(inv, bias), keep_log=False)
    cap = UprobeCapture(unwind_share=0.0, catchup_marks=(200, 150), cpu_budget=0.001)
    seen: dict[str, Any] = {}

    def drive(pid: int, port: int) -> list[Any]:
        keep = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(2)]
        for i in range(200):  # the unread records pass the high mark: the kernel samples
            keep[i % 2].request("GET", "/")
            assert keep[i % 2].getresponse().read()
            if i % 5 == 0:
                cap.poll()
        short = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(24)]
        for i in range(12):  # open at once: their tasks at 24 addresses
            for j, c in enumerate(short):
                c.request("GET", "/")
                assert c.getresponse().read()
                if j % 5 == 0:
                    cap.poll()
        for c in short:
            c.close()
        time.sleep(0.5)  # the server sees the closes: those connections' tasks end
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.2)
        cap.sync()
        with open(f"/proc/{pid}/mem", "rb") as f:
            def read(addr: int, size: int) -> bytes | None:
                try:
                    f.seek(addr)
                    return f.read(size)
                except OSError:
                    return None

            for _ in range(8):  # the session's deferred state reads (queries.py), 512 at a time
                reads = eng.pending_reads()[:512]
                if not reads:
                    break
                for r in reads:
                    eng.resolve_read(r, read(r.addr, r.size))
            snap = build_snapshot(SnapshotInputs(inventory=inv, bias=bias, engine=eng), read)
        conns = [t for t in snap.tasks if "conn_task" in t.name]
        seen.update(
            live=[(t.id, str(t.state), t.stats.polls if t.stats else None, t.found_by) for t in conns if t.live],
            finished=sum(1 for t in conns if not t.live),
            engine_live=sum(1 for t in eng.tasks() if t.parent is None and not t.finished
                            and "conn_task" in (t.path or "")),
            sampling=cap.catchup is not None and cap.catchup.switches,
            lines=cap.stats_lines())
        os.kill(pid, signal.SIGCONT)
        return keep

    out, _ = http_server_session(prog, inv, eng, cap, drive, lambda: None)
    assert "server done requests=" in out, out
    assert seen["sampling"], seen  # the test's premise: the kernel sampled
    assert len(seen["live"]) == 2 and seen["engine_live"] == 2, seen
    assert not [t for t in seen["live"] if "not yet polled" in t[1]], seen
    assert seen["finished"] >= 1, seen
