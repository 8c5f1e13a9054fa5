"""The keeper's wait for a stop (proxy/shell/keeper.py `_wait_stop`): a
program that is stopped already (the proxy died in a hidden stop) answers
neither the 0x03 nor a SIGINT; the keeper takes it for stopped once every
thread stays stopped with a SIGINT pending that nobody takes, instead of
waiting out 2 s and 8 s (the program stood still 10 s after the proxy's
death in most fault-campaign proxy kills under breakpoint capture)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from proxy.shell import keeper

BLOCKS_SIGINT = "import signal, time; signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT]); time.sleep(30)"


def _pending_sigint_process() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", BLOCKS_SIGINT])
    time.sleep(0.5)  # the mask is set
    os.kill(proc.pid, signal.SIGINT)
    return proc


def test_a_running_program_with_a_sigint_pending_is_not_held() -> None:
    proc = _pending_sigint_process()
    try:
        assert not keeper._held(proc.pid)  # sleeping (S), not stopped
        a, b = socket.socketpair()
        t0 = time.monotonic()
        assert keeper._wait_stop(keeper._Wire(a, False), proc.pid, 1.0) == (None, False)
        assert time.monotonic() - t0 >= 1.0
    finally:
        proc.kill()
        proc.wait()


def test_a_stopped_program_with_a_sigint_nobody_takes_is_held() -> None:
    proc = _pending_sigint_process()
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.2)
        assert keeper._held(proc.pid)
        a, b = socket.socketpair()
        t0 = time.monotonic()
        assert keeper._wait_stop(keeper._Wire(a, False), proc.pid, 8.0) == (None, True)
        assert time.monotonic() - t0 < 2.0
    finally:
        proc.kill()
        proc.wait()


def test_a_stop_reply_ends_the_wait() -> None:
    a, b = socket.socketpair()
    b.sendall(b"$T02thread:p1.1;#" + b"%02x" % (sum(b"T02thread:p1.1;") & 0xFF))
    assert keeper._wait_stop(keeper._Wire(a, True), None, 2.0) == (b"T02thread:p1.1;", False)
