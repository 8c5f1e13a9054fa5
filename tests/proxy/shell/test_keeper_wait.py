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


def _frame(body: bytes) -> bytes:
    return b"$" + body + b"#%02x" % (sum(body) & 0xFF)


def test_a_remote_programs_sigint_is_read_through_the_stub() -> None:
    """With `--remote` the keeper has no host pid: it reads the stub's own
    /proc/PID/status through vFile, run-length encoded as gdbserver sends it
    (`0*+2`: fifteen zeros and a 2, a pending SIGINT). Unread, the SIGINT of
    its 0x03 to a program in a hidden stop killed 7 of 15 programs after the
    detach (fault campaign, proxy killed, breakpoint capture, `--remote`)."""
    import threading

    status = b"Name:\ttokio_bench\nSigPnd:\t0*+0\nShdPnd:\t0*+2\n"
    replies = {b"vFile:open:": b"F3", b"vFile:pread:": b"F%x;" % len(status) + status, b"vFile:close:": b"F0"}
    a, b = socket.socketpair()
    asked: list[bytes] = []

    def stub() -> None:
        buf = b""
        while len(asked) < 3:
            buf += b.recv(4096)
            while b"#" in buf and len(buf) >= buf.index(b"#") + 3:
                body = buf[buf.index(b"$") + 1:buf.index(b"#")]
                buf = buf[buf.index(b"#") + 3:]
                asked.append(body)
                b.sendall(_frame(next(r for k, r in replies.items() if body.startswith(k))))

    t = threading.Thread(target=stub, daemon=True)
    t.start()
    assert keeper._sigint_waiting(keeper._Wire(a, True), None, 0x3C4E)
    t.join(5)
    assert asked[0] == b"vFile:open:" + b"/proc/15438/status".hex().encode() + b",0,0"
    assert asked[1:] == [b"vFile:pread:3,1000,0", b"vFile:close:3"]
