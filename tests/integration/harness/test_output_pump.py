"""integration/harness/stubs.py's OutputPump: a read holds everything the
stub and its program wrote before it (the detach tests read the program's
last line once the program is gone, with no exit status to go by)."""

from __future__ import annotations

import subprocess

from integration.harness.stubs import OutputPump


def test_a_read_holds_what_was_written_before_it_in_order() -> None:
    """The writer has exited: its output is all in the pipe. With the thread
    alone reading, 162 of 200 such reads at load 7 lacked it (the thread had
    not run yet); one of 20 here was enough to fail."""
    want = "".join(f"{i}\n" for i in range(1, 30001)).encode()  # > 64 KiB: several reads, in order
    for _ in range(20):
        proc = subprocess.Popen(["seq", "1", "30000"], stdout=subprocess.PIPE)
        pump = OutputPump(proc.stdout)
        proc.wait()
        assert pump.data() == want
        pump.join()
        assert not pump._thread.is_alive()  # the thread ends at the pipe's end
        assert proc.stdout is not None
        proc.stdout.close()
