"""`asyncrsp resident` and `serve --resident`: a session forked from one
interpreter that imported the proxy once (proxy/shell/resident.py). The
`resident` fixture is in conftest.py; test_listen.py runs a whole session
(output, exit status, inherited socket, directory) both ways."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.shell.resident import ResidentError, listen_fds, request, split_resident

ROOT = Path(__file__).resolve().parents[3]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def test_the_resident_option_is_taken_out_before_the_programs_arguments() -> None:
    assert split_resident(["serve", "--resident", "/s", "--once", "--upstream", "h:1"]) == (
        "/s", ["serve", "--once", "--upstream", "h:1"])
    assert split_resident(["run", "--resident=/s", "--", "./app", "--resident", "x"]) == (
        "/s", ["run", "--", "./app", "--resident", "x"])
    assert split_resident(["serve", "--upstream", "h:1"]) == (None, ["serve", "--upstream", "h:1"])
    assert listen_fds(["serve", "--listen", "fd:7", "--upstream", "h:1"]) == [7]
    assert listen_fds(["serve", "--listen=fd:9"]) == [9]
    assert listen_fds(["serve", "--listen", "127.0.0.1:0"]) == []
    assert listen_fds(["run", "--", "./app", "--listen", "fd:3"]) == []


def test_no_resident_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ResidentError, match="is `asyncrsp resident --socket .*` running"):
        request(str(tmp_path / "none.sock"), ["serve"])
    proc = subprocess.run([sys.executable, "-m", "proxy.cli", "serve", "--resident", str(tmp_path / "none.sock"),
                           "--upstream", "127.0.0.1:1"], env=ENV, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("asyncrsp: --resident ") and proc.stderr.count("\n") == 1


def test_a_bad_command_line_is_the_sessions_usage_error(resident: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "proxy.cli", "serve", "--resident", resident, "--no-such-option"],
                          env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "asyncrsp serve: error: " in proc.stderr


def test_the_callers_sigterm_reaches_the_session(resident: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--resident", resident,
                             "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1"],
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("asyncrsp: listening on 127.0.0.1:")
        port = int(line.rsplit(":", 1)[1])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the session itself is gone: its port is free
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except ConnectionRefusedError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the session still listens after its caller's SIGTERM")
    finally:
        proc.kill()
        proc.wait()


def test_a_resident_that_is_there_already_is_not_replaced(resident: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "proxy.cli", "resident", "--socket", resident],
                          env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "a resident already listens there" in proc.stderr


def test_a_signal_at_once_after_the_pid_reaches_the_session_not_the_resident(resident: str) -> None:
    """The caller may signal the session the moment it has its pid, before
    the child has put its own handlers in place: the signals are blocked
    across the fork, so the resident's (SIGTERM: stop the loop) never run in
    the child. Seen: a session that lived on after such a SIGTERM."""
    from proxy.shell.resident import wait_status

    for _ in range(5):
        pid, conn = request(resident, ["serve", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1"],
                            fds=[0, 1, 2])
        os.kill(pid, signal.SIGTERM)
        conn.settimeout(30)
        assert wait_status(pid, conn) == 128 + signal.SIGTERM


def _pending(pid: int, sig: int) -> bool:
    """`sig` is pending (blocked, not yet taken) in process `pid`."""
    bit = 1 << (sig - 1)
    with open(f"/proc/{pid}/status") as f:
        return any(int(line.split()[1], 16) & bit for line in f if line.startswith(("SigPnd:", "ShdPnd:")))


@contextlib.contextmanager
def _stand_in(tmp_path: Path, *argv: str) -> Iterator[tuple[subprocess.Popen[bytes], socket.socket]]:
    """`asyncrsp serve --resident SOCK ARGV` against a resident stand-in the
    test answers for: (the caller, its connection once its request is in)."""
    path = str(tmp_path / "stand-in.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    srv.settimeout(60)
    caller = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--resident", path, *argv],
                              env=ENV, cwd=ROOT)
    try:
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(60)
            msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 16)
            for fd in fds:
                os.close(fd)
            assert b'"serve"' in msg
            yield caller, conn
    finally:
        srv.close()
        caller.kill()
        caller.wait()


def _send(conn: socket.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:
        pass  # the caller is gone already: its status says so


def test_a_sigterm_before_the_residents_answer_reaches_the_session(tmp_path: Path) -> None:
    """The caller's SIGTERM may come after its request went out and before the
    resident's answer (the session's pid) came back: the session exists and
    may already listen. A resident stand-in holds the answer back until the
    signal has been sent; the caller must pass it on once it has the pid, not
    die of it. Seen under load (test_the_callers_sigterm_reaches_the_session,
    2 of 25 runs beside 4 busy loops): the caller died of the SIGTERM and the
    session lived on."""
    session = subprocess.Popen(["sleep", "60"])  # stands for the session the resident forked
    try:
        with _stand_in(tmp_path, "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1") as (caller, conn):
            caller.send_signal(signal.SIGTERM)  # the request is in: the caller waits for the pid
            deadline = time.monotonic() + 30
            while caller.poll() is None and not _pending(caller.pid, signal.SIGTERM):
                assert time.monotonic() < deadline, "the SIGTERM neither taken nor pending"
                time.sleep(0.01)
            _send(conn, b"pid %d\n" % session.pid)
            deadline = time.monotonic() + 30
            while session.poll() is None and caller.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert session.poll() == -signal.SIGTERM, f"the session did not get the SIGTERM (caller: {caller.poll()})"
            _send(conn, b"exit %d\n" % (128 + signal.SIGTERM))  # what the resident says then
            assert caller.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        session.kill()
        session.wait()


def test_the_pid_and_the_exit_status_in_one_read(tmp_path: Path) -> None:
    """A session that ends at once (a usage error) has its exit status sent
    right behind its pid: the caller may read both lines at once. Seen under
    load (test_a_bad_command_line_is_the_sessions_usage_error, 2 of 5 runs
    at load 5.8): `int(b'26507\\nexit 2\\n')` failed, status 1 for 2."""
    with _stand_in(tmp_path, "--no-such-option") as (caller, conn):
        conn.sendall(b"pid %d\nexit 2\n" % os.getpid())  # no signal is passed on to it here
        assert caller.wait(timeout=30) == 2
