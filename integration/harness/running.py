"""When a program under a debugger has really run: the interrupt scenario's wait.

Self-contained (standard library only, no package imports): lldb sessions run
this module's source inside lldb's own Python (:func:`lldb.interrupt_when_running`),
so the gdb, MI and lldb interrupts wait on the same condition.
"""

import time

INTERRUPT_DELAY = 1.0
RUN_BEFORE_INTERRUPT = 10.0  # at most this much more for the program to start running
RAN_TICKS = 5  # 50 ms of CPU: the program is past the dynamic loader, in its own loop


def cpu_ticks(pid: int | None) -> int:
    """utime + stime of ``pid`` in clock ticks (0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def wait_until_running(pid: int | None, delay: float = INTERRUPT_DELAY,
                       limit: float = RUN_BEFORE_INTERRUPT) -> None:
    """Sleep ``delay``, then until the program ``pid`` has used some CPU (at
    most ``limit`` more; no wait for an unknown pid).

    A fixed delay is not enough. With uprobe capture the proxy holds the first
    resume while it attaches (BPF, a 128 MB ring); at load 13-15 on 2 cores that
    took over a second. lldb stops at the dynamic loader's breakpoint and reads
    the libraries before the program goes on; through the proxy at load 10 that
    was still going on 1 s after ``process continue``. Either way the interrupt
    landed before ``main`` and the program, told to stop, printed "spun none"
    (or lldb, interrupted inside its own step over the loader's breakpoint,
    reported "stop reason = trace" and the SIGSTOP at the next continue)."""
    time.sleep(delay)
    deadline = time.monotonic() + limit
    while pid and cpu_ticks(pid) < RAN_TICKS and time.monotonic() < deadline:
        time.sleep(0.05)
