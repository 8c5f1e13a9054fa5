"""A stub taken for another host (`--remote`): a late attach finds what a local one does.

gdbserver attaches to the corpus `stuck` and `deadlock` programs after they printed their
`ready` line (every task already parked); the proxy is told the stub is remote, so nothing
of this host is used: the load bias comes from the stub's auxv (qXfer:auxv), the memory map
the runtime adapters scan from /proc/PID/maps read through the stub (vFile), every byte of
memory through `m`. The findings are the ones the local attach tests assert
(integration/test_reflection.py, integration/test_snapshot.py): every spawned task, the
block_on future on the main thread's stack, and the Mutex cycle. What needs this host says
so: tokio's Sleep deadline is given as a CLOCK_MONOTONIC time (the program's clock is not
the proxy's), and a stub without vFile (QEMU) says the adapters cannot scan.
"""

from __future__ import annotations

import re

import pytest

from integration.harness.monitor import ask, attached, check_deadlocks, corpus_binary, section

# Every byte goes through `m` (1,200 reads for the first answer): gdb's default 2 s wait for
# a reply is not enough on a loaded machine ("Ignoring packet error, continuing..." ahead of
# the output). Speed is measured in bench/, not here.
PATIENT = ["set remotetimeout 60"]
STUCK_TASKS = {"run", "lock_ab", "lock_ba", "sleeper", "receiver", "oneshot_waiter"}


@pytest.mark.parametrize("config", ["debug", "release"])
def test_stuck_attached_through_a_remote_stub(config: str) -> None:
    out = attached(corpus_binary(config, "stuck"), ["mt"], "stuck ready", PATIENT + ask("tasks", "tree", "deadlocks", "stats"),
                   ["--remote"])
    assert "program's host: remote" in section(out, "stats"), section(out, "stats")
    tasks = section(out, "tasks")
    found = set(re.findall(r"(?:tokio runtime|stack)\s+stuck::(\w+)$", tasks, re.M))
    assert found == STUCK_TASKS, tasks
    assert re.search(r"^#\d+ .*\bstack\s+stuck::run$", tasks, re.M), tasks
    tree = section(out, "tree")
    assert "waits on Mutex" in tree and "held by task" in tree, tree
    assert re.search(r"tokio::time::Sleep \(deadline \d+\.\d+ s \(CLOCK_MONOTONIC\)\)", tree), tree
    cycle = re.search(r"^cycle: #\d+ stuck::(lock_ab|lock_ba) -> Mutex 0x[0-9a-f]+ held by #\d+ "
                      r"stuck::(lock_ab|lock_ba) -> Mutex 0x[0-9a-f]+ held by #\d+$", section(out, "deadlocks"), re.M)
    assert cycle and {cycle[1], cycle[2]} == {"lock_ab", "lock_ba"}, section(out, "deadlocks")


@pytest.mark.parametrize("config", ["debug", "release"])
def test_deadlock_attached_through_a_remote_stub(config: str) -> None:
    out = attached(corpus_binary(config, "deadlock"), ["mt"], "deadlock ready", PATIENT + ask("deadlocks", "tasks"), ["--remote"])
    check_deadlocks(section(out, "deadlocks"))
    assert "tokio runtime" in section(out, "tasks"), section(out, "tasks")
